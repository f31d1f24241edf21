/* dataset — the one door to every kind of source.
 *
 * The daemon opens each configured dataset through dataset_open(), which picks the
 * kind's ops table (source_files.c, source_tokens.c) from the config; from then on
 * streams and workers call through d->ops and never ask which kind they hold. The
 * helpers here derive what every kind shares: the kind's name for `loaderctl
 * datasets`, and the byte length of one row of a fixed field for laying out slots. */
#include "dataset.h"

#include <stdio.h>

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
