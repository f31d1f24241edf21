/* dataset — the one door to every kind of source.
 *
 * The daemon opens each configured dataset through dataset_open(), which picks the
 * kind's ops table (source_files.c, source_tokens.c, source_packed.c) from the config; from then on
 * streams and workers call through d->ops and never ask which kind they hold. The
 * helpers here derive what every kind shares: the kind's name for `loaderctl
 * datasets`, and the byte length of one row of a fixed field for laying out slots. */
#include "dataset.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "ld_mix.h"
#include "log.h"
#include "s3.h"

static int over_bound(const dataset *d, uint64_t index);

/* Applies max_sample_bytes: says at start how many samples it keeps out, and refuses a
 * bound that keeps out every sample. */
static int dataset_bound(dataset *d, uint64_t bound, char *errbuf)
{
    bool ragged = false;
    for (int f = 0; f < d->n_fields; f++)
        ragged |= d->fields[f].ragged;
    if (!bound || !ragged)
        return 0;
    d->max_sample_bytes = bound;
    uint64_t over = 0;
    for (uint64_t i = 0; i < d->count; i++)
        over += over_bound(d, i) >= 0;
    if (over == d->count) {
        ld_errorf(errbuf, "dataset '%s': every one of its %" PRIu64 " samples is larger than max_sample_bytes (%" PRIu64
                  " bytes): raise it", d->name, d->count, bound);
        return LD_EDATASET;
    }
    if (over)
        ld_log(LD_LOG_WARN, "dataset '%s': %" PRIu64 " of %" PRIu64 " samples are larger than max_sample_bytes (%" PRIu64
               " bytes): %s", d->name, over, d->count, bound,
               d->on_error == CONFIG_ON_ERROR_REPLACE ? "each is replaced by another sample (on_error: replace)"
                                                      : "a batch that holds one fails (on_error: fail)");
    return 0;
}

/* Datasets opened and not yet freed (dataset_live_count). */
static _Atomic uint32_t dataset_live;

int dataset_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    const struct dataset_ops *ops;

    switch (cfg->kind) {
    case CONFIG_DATASET_FILES:
        ops = cfg->manifest_path ? &source_manifest_ops : s3_is_url(cfg->path) ? &source_s3_ops : &source_files_ops;
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
    case CONFIG_DATASET_SQL:
        ops = &source_sql_ops;
        break;
    case CONFIG_DATASET_TAR_SHARDS:
        ops = &source_tar_ops;
        break;
    default:
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': unknown kind %d",
                 cfg->name ? cfg->name : "?", cfg->kind);
        return LD_EINVAL;
    }
    dataset *d = NULL;
    int rc = dataset_deadline_start();
    if (rc < 0) {
        ld_errorf(errbuf, "dataset '%s': cannot start the read watcher: %s", cfg->name, ld_strerror(rc));
        return rc;
    }
    rc = ops->open(cfg, &d, errbuf);
    if (rc < 0) {
        dataset_deadline_stop();
        return rc;
    }
    atomic_fetch_add(&dataset_live, 1); /* dataset_free takes it back */
    d->on_error = cfg->on_error;
    d->warn_fraction = cfg->on_error_warn_fraction;
    d->weight = cfg->weight ? cfg->weight : 1;
    d->max_share = cfg->max_share > 0 ? cfg->max_share : 1;
    if (pthread_mutex_init(&d->tally_lock, NULL) == 0)
        d->tally_ready = true;
    d->read_timeout_ns = (uint64_t)cfg->read_timeout * 1000000000u;
    d->bad_seen = calloc(d->count / 64 + 1, sizeof *d->bad_seen);
    if (!d->bad_seen) {
        dataset_free(d);
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    rc = dataset_bound(d, cfg->max_sample_bytes, errbuf);
    if (rc < 0) {
        dataset_free(d);
        return rc;
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
    struct config *owned = d->owned_config;
    d->ops->free(d);
    config_free(owned);
    dataset_deadline_stop();
    atomic_fetch_sub(&dataset_live, 1);
}

uint32_t dataset_live_count(void)
{
    return atomic_load(&dataset_live);
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
    /* Asked for every sample read from a cache: memcmp of the name's array, which the
     * compiler turns into two loads, rather than a call to strcmp. */
    for (int f = 0; f < d->n_fields; f++)
        if (d->fields[f].dtype == LD_DTYPE_INT64 && d->fields[f].ndim == 0 &&
            memcmp(d->fields[f].name, "label", sizeof "label") == 0)
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
        int rc = ctx->tally ? cache_read_tally(c, index, dst[0], want, &len, &label, true, ctx->tally, cerr)
                            : cache_read(c, index, dst[0], want, &len, &label, true, cerr);
        if (rc == 0 && len == want) {
            int lf = dataset_label_field(d);
            if (lf > 0)
                memcpy(dst[lf], &label, sizeof label);
            return 0;
        }
    }
    return d->ops->read(d, index, dst, errbuf);
}

#define REPLACE_TRIES 64
#define NO_SAMPLE UINT64_MAX

static bool is_bad(const dataset *d, uint64_t index)
{
    uint64_t bit = UINT64_C(1) << (index % 64);
    return d->bad_seen && (atomic_load_explicit(&d->bad_seen[index / 64], memory_order_relaxed) & bit);
}

/* The first ragged field whose bytes exceed max_sample_bytes, or -1. */
static int over_bound(const dataset *d, uint64_t index)
{
    if (!d->max_sample_bytes || !d->ops->item_bytes)
        return -1;
    for (int f = 0; f < d->n_fields; f++)
        if (d->fields[f].ragged && d->ops->item_bytes(d, index, f) > d->max_sample_bytes)
            return f;
    return -1;
}

/* Marks a sample bad: counted and logged the first time only. */
static void note_bad(const dataset *d, uint64_t index, const char *msg)
{
    dataset *m = (dataset *)d; /* the counters and the bitmap are atomics */
    uint64_t bit = UINT64_C(1) << (index % 64);
    if (!m->bad_seen || (atomic_fetch_or(&m->bad_seen[index / 64], bit) & bit))
        return;
    atomic_fetch_add_explicit(&m->bad_samples, 1, memory_order_relaxed);
    ld_log(LD_LOG_WARN, "dataset '%s': %s; %s", d->name, msg,
           d->on_error == CONFIG_ON_ERROR_REPLACE ? "another sample takes its place from now on (on_error: replace)"
                                                  : "a batch that holds it fails (on_error: fail)");
}

/* Candidate `attempt` (1, 2, ...) to stand in for `index`: from the index alone, so
 * batches stay bit-identical whatever the workers or the timing. */
static uint64_t candidate(const dataset *d, uint64_t index, uint64_t attempt)
{
    return ld_mix64(index + attempt * LD_MIX_GOLDEN) % d->count;
}

/* The sample served for `index`: itself, unless under on_error: replace it is known bad
 * or too large; then the first candidate that is neither (NO_SAMPLE: none of 64). */
static uint64_t resolve(const dataset *d, uint64_t index)
{
    if (d->on_error != CONFIG_ON_ERROR_REPLACE || (!is_bad(d, index) && over_bound(d, index) < 0))
        return index;
    if (d->count < 2)
        return NO_SAMPLE;
    for (uint64_t attempt = 1; attempt <= REPLACE_TRIES; attempt++) {
        uint64_t sub = candidate(d, index, attempt);
        if (sub != index && !is_bad(d, sub) && over_bound(d, sub) < 0)
            return sub;
    }
    return NO_SAMPLE;
}

uint64_t dataset_item_bytes(const dataset *d, uint64_t index, int field)
{
    uint64_t r = resolve(d, index);
    if (r == NO_SAMPLE || over_bound(d, r) >= 0)
        return 0; /* nothing will be written: the read fails */
    return d->ops->item_bytes(d, r, field);
}

uint64_t dataset_slot_item_bytes(const dataset *d, int field)
{
    if (field < 0 || field >= d->n_fields || !d->fields[field].ragged)
        return 0;
    uint64_t m = d->fields[field].max_item_bytes;
    return d->max_sample_bytes && d->max_sample_bytes < m ? d->max_sample_bytes : m;
}

bool dataset_sample_error(int rc)
{
    return !dataset_resource_error(rc) && rc != LD_ETIMEDOUT && rc != LD_EDATASET;
}

bool dataset_resource_error(int rc)
{
    return rc == LD_EMFILE || rc == -ENFILE || rc == LD_ENOMEM || rc == LD_EAGAIN || rc == -ENOBUFS;
}

void dataset_note_resource(const dataset *d, const char *msg)
{
    dataset *m = (dataset *)d;
    uint64_t n = atomic_fetch_add_explicit(&m->resource_retries, 1, memory_order_relaxed) + 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    uint64_t last = atomic_load_explicit(&m->resource_logged_ns, memory_order_relaxed);
    if (last && now - last < UINT64_C(10000000000))
        return;
    if (!atomic_compare_exchange_strong(&m->resource_logged_ns, &last, now))
        return; /* another thread logs this round */
    ld_log(LD_LOG_WARN, "dataset '%s': %s: the system is short of a resource, not the sample at fault; "
           "retrying (%" PRIu64 " retries so far; raise the open-file limit or lower workers and clients)",
           d->name, msg, n);
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
                 const uint64_t lens[], char *errbuf)
{
    if (atomic_load_explicit(&d->stalled_reads, memory_order_relaxed)) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): not read: a read of dataset '%s' has not returned for more than "
                  "%" PRIu64 " s (read_timeout); its storage is not answering", index, dataset_sample_name(d, index),
                  d->name, d->read_timeout_ns / 1000000000u);
        return LD_ETIMEDOUT;
    }
    uint64_t want[LD_MAX_FIELDS] = {0};
    bool ragged = false;
    for (int f = 0; f < d->n_fields; f++) {
        if (!d->fields[f].ragged)
            continue;
        ragged = true;
        want[f] = lens ? lens[f] : dataset_item_bytes(d, index, f);
    }
    /* Each round either serves a sample or marks one more bad, so 64 candidates plus
     * the sample itself bound the loop. */
    for (int round = 0; round <= REPLACE_TRIES + 1; round++) {
        uint64_t r = resolve(d, index);
        if (r == NO_SAMPLE) {
            ld_errorf(errbuf, "sample %" PRIu64 " (%s) cannot be served and none of %d candidates to replace it "
                      "can be read either", index, dataset_sample_name(d, index), REPLACE_TRIES);
            return LD_ESAMPLE;
        }
        int big = over_bound(d, r);
        if (big >= 0) { /* on_error: fail (replace resolved it away) */
            ld_errorf(errbuf, "sample %" PRIu64 " (%s) has %" PRIu64 " bytes, more than max_sample_bytes (%" PRIu64
                      "): raise datasets.%s.max_sample_bytes, or set on_error: replace to skip it",
                      r, dataset_sample_name(d, r), d->ops->item_bytes(d, r, big), d->max_sample_bytes, d->name);
            note_bad(d, r, errbuf);
            return LD_ESAMPLE;
        }
        for (int f = 0; ragged && f < d->n_fields; f++)
            if (d->fields[f].ragged && d->ops->item_bytes(d, r, f) != want[f])
                return LD_ESTALE; /* laid out for another sample: lay it out again */
        uint64_t token = dataset_deadline_begin(d, r);
        int rc = read_once(d, r, ctx, dst, errbuf);
        dataset_deadline_end(d, token);
        if (rc == 0) {
            if (r != index) {
                char why[LD_ERRMSG_MAX];
                snprintf(why, sizeof why, "sample %" PRIu64 " (%s) replaced by sample %" PRIu64 " (%s)", index,
                         dataset_sample_name(d, index), r, dataset_sample_name(d, r));
                note_replaced(d, ctx ? ctx->epoch : 0, why);
            }
            return 0;
        }
        if (dataset_resource_error(rc) || rc == LD_EDATASET)
            return rc; /* not the sample's fault: never marked bad, another would not do better */
        note_bad(d, r, errbuf);
        if (d->on_error != CONFIG_ON_ERROR_REPLACE)
            return rc;
    }
    ld_errorf(errbuf, "sample %" PRIu64 " (%s): no readable substitute", index, dataset_sample_name(d, index));
    return LD_ESAMPLE;
}

const char *dataset_sample_name(const dataset *d, uint64_t index)
{
    const char *name = d->ops->sample_name ? d->ops->sample_name(d, index) : NULL;
    return name ? name : "?";
}
