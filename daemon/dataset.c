/* dataset — the one door to every kind of source.
 *
 * The daemon opens each configured dataset through dataset_open(), which picks the
 * kind's ops table (source_files.c, source_tokens.c, source_packed.c) from the config; from then on
 * streams and workers call through d->ops and never ask which kind they hold. The
 * helpers here derive what every kind shares: the kind's name for `loaderctl
 * datasets`, and the byte length of one row of a fixed field for laying out slots. */
#include "dataset.h"

#include <stdio.h>
#include <string.h>

#include "cache.h"

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
    default:
        snprintf(errbuf, LD_ERRMSG_MAX, "dataset '%s': unknown kind %d",
                 cfg->name ? cfg->name : "?", cfg->kind);
        return LD_EINVAL;
    }
    return ops->open(cfg, ret_dataset, errbuf);
}

void dataset_free(dataset *d)
{
    if (d)
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
 * source's fingerprint when it was attached; a length that still disagrees with what the
 * slot expects (which would mean a bug, not a changed source) falls back to the source. */
int dataset_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    cache *c = atomic_load_explicit(&d->cached, memory_order_acquire);
    if (c) {
        const void *p;
        uint64_t len;
        int64_t label;
        uint64_t want = d->fields[0].ragged ? d->ops->item_bytes(d, index, 0) : dataset_row_bytes(d, 0);
        if (cache_sample(c, index, &p, &len, &label) == 0 && len == want) {
            memcpy(dst[0], p, len);
            int lf = dataset_label_field(d);
            if (lf > 0)
                memcpy(dst[lf], &label, sizeof label);
            return 0;
        }
    }
    return d->ops->read(d, index, dst, errbuf);
}
