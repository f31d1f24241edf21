/* source_packed — the `packed` dataset kind: a cache file built elsewhere (by
 * `loaderctl cache build` or another daemon) and shipped, served on its own.
 *
 * The file carries its layout (fields, dtypes, shapes, the label field) in its header,
 * so nothing of the original source is needed: field 0 comes from each sample's bytes
 * and the label field from the index. The file is checked at open (magic, version,
 * footer, header and index checksums) but not against any fingerprint: there is no
 * source to compare with. Each sample's bytes are checked against their checksum
 * when served (packed_read), and the whole file by `loaderctl cache verify`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "dataset.h"

struct packed {
    dataset base; /* first: the daemon holds a dataset * */
    cache *c;
    int label_field;
};

static void packed_free(dataset *d)
{
    struct packed *p = (struct packed *)d;
    if (!p)
        return;
    cache_free(p->c);
    free(p);
}

static int packed_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct packed *p = calloc(1, sizeof *p);
    char err[LD_ERRMSG_MAX];
    if (!p) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    int rc = cache_open(cfg->path, 0, &p->c, err);
    if (rc < 0) {
        ld_errorf(errbuf, "dataset '%s': %s", cfg->name, err);
        free(p);
        return rc;
    }
    const struct cache_meta *m = cache_meta(p->c);
    dataset *d = &p->base;
    d->ops = &source_packed_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->count = m->count;
    d->n_fields = m->n_fields;
    memcpy(d->fields, m->fields, sizeof d->fields);
    p->label_field = m->label_field;
    *ret_dataset = d;
    return 0;
}

static uint64_t packed_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct packed *p = (const struct packed *)d;
    const void *ptr;
    uint64_t len = 0;
    int64_t label;
    if (field != 0 || cache_sample(p->c, index, &ptr, &len, &label) < 0)
        return 0;
    return len;
}

/* Each sample is checked against its checksum as it is copied out: a flipped byte
 * is a bad sample (on_error decides), a file cut short under us fails the stream
 * (LD_EDATASET: every later sample would fail too). */
static int packed_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct packed *p = (const struct packed *)d;
    uint64_t len, want = d->fields[0].ragged ? packed_item_bytes(d, index, 0) : dataset_row_bytes(d, 0);
    int64_t label;
    char err[LD_ERRMSG_MAX];
    int rc = cache_read(p->c, index, dst[0], want, &len, &label, true, err);
    if (rc == LD_EIO) {
        ld_errorf(errbuf, "dataset '%s': %s; restart loaderd once the file is whole again", d->name, err);
        return LD_EDATASET;
    }
    if (rc < 0 || len != want) {
        ld_errorf(errbuf, "dataset '%s': %s", d->name, rc < 0 ? err : "sample length changed");
        return LD_ESAMPLE;
    }
    if (p->label_field > 0)
        memcpy(dst[p->label_field], &label, sizeof label);
    return 0;
}

static void packed_prefetch(const dataset *d, const uint64_t *idx, size_t n)
{
    cache_prefetch(((const struct packed *)d)->c, idx, n);
}

const struct dataset_ops source_packed_ops = {
    .kind = "packed",
    .open = packed_open,
    .free = packed_free,
    .item_bytes = packed_item_bytes,
    .read = packed_read,
    .prefetch = packed_prefetch,
};
