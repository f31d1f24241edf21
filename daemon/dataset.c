/* dataset — the one door to every kind of source.
 *
 * The daemon opens each configured dataset through dataset_open(), which picks the
 * kind's ops table (source_files.c, source_tokens.c, source_packed.c) from the config; from then on
 * streams and workers call through d->ops and never ask which kind they hold. The
 * helpers here derive what every kind shares: the kind's name for `loaderctl
 * datasets`, and the byte length of one row of a fixed field for laying out slots. */
#include "dataset.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "log.h"

#include <stdlib.h>

int dataset_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    const struct dataset_ops *ops;

    switch (cfg->kind) {
    case CONFIG_DATASET_FILES:
        ops = &source_files_ops;
        break;
    case CONFIG_DATASET_TOKEN_WINDOWS:
        ops = &source_tokens_ops;
        break;
    case CONFIG_DATASET_PACKED:
        ops = &source_packed_ops;
        break;
    case CONFIG_DATASET_IMAGE_FOLDER:
        ops = &source_images_ops;
        break;
    default:
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': unknown kind %d",
                 cfg->name ? cfg->name : "?", cfg->kind);
        return LD_EINVAL;
    }
    dataset *d = NULL;
    int rc = ops->open(cfg, &d, errbuf);
    if (rc < 0)
        return rc;
    d->on_error = cfg->on_error;
    d->warn_fraction = cfg->on_error_warn_fraction;
    if (pthread_mutex_init(&d->tally_lock, NULL) == 0)
        d->tally_ready = true;
    d->bad_seen = calloc(d->count / 64 + 1, sizeof *d->bad_seen);
    if (!d->bad_seen) {
        dataset_free(d);
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    *ret_dataset = d;
    return 0;
}

void dataset_free(dataset *d)
{
    if (!d)
        return;
    free((void *)d->bad_seen);
    if (d->tally_ready)
        pthread_mutex_destroy(&d->tally_lock);
    d->ops->free(d);
}

const char *dataset_kind(const dataset *d)
{
    return d->ops->kind;
}

/* A ragged field has no fixed row: the stream sizes it per sample with item_bytes, so
 * asking for its row is a caller's mistake that we answer with 0 rather than a guess. */
uint64_t dataset_row_bytes(const dataset *d, int field)
{
    if (field < 0 || field >= d->n_fields)
        return 0;
    const struct dataset_field *f = &d->fields[field];
    if (f->ragged)
        return 0;
    uint64_t bytes = proto_dtype_size(f->dtype);
    for (int i = 0; i < f->ndim; i++)
        bytes *= (uint64_t)f->shape[i];
    return bytes;
}

int dataset_label_field(const dataset *d)
{
    for (int f = 0; f < d->n_fields; f++)
        if (d->fields[f].dtype == LD_DTYPE_INT64 && d->fields[f].ndim == 0 && strcmp(d->fields[f].name, "label") == 0)
            return f;
    return -1;
}

/* The cache holds field 0's bytes and the label of every sample, checked against the
 * source's fingerprint before the stream was given it. A sample that fails its checksum
 * or lies past a truncation (cache_read marks the cache bad, and the keeper sets it
 * aside) and a length that disagrees with what the slot expects fall back to the
 * source, which has the right bytes. */
static int read_once(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                     char *errbuf)
{
    if (d->ops->read_ctx)
        return d->ops->read_ctx(d, index, ctx, dst, errbuf);
    cache *c = ctx ? ctx->cache : NULL;
    if (c) {
        uint64_t len;
        int64_t label;
        uint64_t want = d->fields[0].ragged ? d->ops->item_bytes(d, index, 0) : dataset_row_bytes(d, 0);
        char cerr[LD_ERRMSG_MAX];
        if (cache_read(c, index, dst[0], want, &len, &label, true, cerr) == 0 && len == want) {
            int lf = dataset_label_field(d);
            if (lf > 0)
                memcpy(dst[lf], &label, sizeof label);
            return 0;
        }
    }
    return d->ops->read(d, index, dst, errbuf);
}

#define REPLACE_TRIES 64

/* Logs a bad sample the first time it is seen, and counts it. */
static void note_bad(const dataset *d, uint64_t index, const char *msg)
{
    dataset *m = (dataset *)d; /* the counters and the log bitmap are atomics */
    atomic_fetch_add_explicit(&m->bad_samples, 1, memory_order_relaxed);
    uint64_t bit = UINT64_C(1) << (index % 64);
    if (m->bad_seen && !(atomic_fetch_or(&m->bad_seen[index / 64], bit) & bit))
        ld_log(LD_LOG_WARN, "dataset '%s': %s%s", d->name, msg,
               d->on_error == CONFIG_ON_ERROR_REPLACE ? " (replaced by another sample)" : "");
}

/* Counts a replacement in `epoch`; the first one over the dataset's warn_fraction in
 * that epoch logs a warning with the count and `why` (the failed sample and its error):
 * the per-file warnings are logged once per run, and a folder whose JPEGs all fail
 * while its PNGs decode must not pass for a dataset that trains. */
static void note_replaced(const dataset *d, uint64_t epoch, const char *why)
{
    dataset *m = (dataset *)d; /* the counters and the tally are guarded */
    atomic_fetch_add_explicit(&m->replaced_samples, 1, memory_order_relaxed);
    if (!m->tally_ready)
        return;
    uint64_t limit = (uint64_t)(m->warn_fraction * (double)d->count);
    pthread_mutex_lock(&m->tally_lock);
    struct dataset_tally *t = &m->tally[epoch % (sizeof m->tally / sizeof m->tally[0])];
    if (!t->used || t->epoch != epoch)
        *t = (struct dataset_tally){.epoch = epoch, .used = true};
    uint64_t count = ++t->count;
    bool warn = !t->warned && count > limit;
    t->warned |= warn;
    pthread_mutex_unlock(&m->tally_lock);
    if (warn)
        ld_log(LD_LOG_WARN, "dataset '%s': epoch %" PRIu64 ": %" PRIu64 " samples replaced so far, more than "
               "on_error_warn_fraction %g of %" PRIu64 " samples: batches repeat other samples in their "
               "place (this one: %s)", d->name, epoch, count, m->warn_fraction, d->count, why);
}

int dataset_read(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                 char *errbuf)
{
    int rc = read_once(d, index, ctx, dst, errbuf);
    if (rc == 0 || rc == LD_ENOMEM || rc == LD_EDATASET)
        return rc; /* not this sample's fault: another one would not do better */
    note_bad(d, index, errbuf);
    if (d->on_error != CONFIG_ON_ERROR_REPLACE || d->count < 2)
        return rc;
    bool ragged = d->fields[0].ragged;
    uint64_t need = ragged ? d->ops->item_bytes(d, index, 0) : 0;
    char err[LD_ERRMSG_MAX];
    for (uint64_t attempt = 1; attempt <= REPLACE_TRIES; attempt++) {
        /* A substitute from the index alone: batches stay bit-identical. */
        uint64_t z = (index + attempt * UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        uint64_t sub = (z ^ (z >> 31)) % d->count;
        if (sub == index || (ragged && d->ops->item_bytes(d, sub, 0) != need))
            continue;
        if (read_once(d, sub, ctx, dst, err) == 0) {
            note_replaced(d, ctx ? ctx->epoch : 0, errbuf);
            return 0;
        }
        note_bad(d, sub, err);
    }
    return rc; /* errbuf still names the original sample */
}

const char *dataset_sample_name(const dataset *d, uint64_t index)
{
    const char *name = d->ops->sample_name ? d->ops->sample_name(d, index) : NULL;
    return name ? name : "?";
}
