/* source_manifest — a `files` dataset whose samples a manifest lists (`manifest:`).
 *
 * Instead of walking a tree and naming classes after folders, the dataset reads a CSV
 * or JSONL file (manifest.c) with one row per sample, in the manifest's order, and the
 * config's `columns:` says which column becomes which field, in that order:
 *
 *   file     a path, relative to the dataset's `path`: the file's bytes (uint8; a fixed
 *            row when every file of the column has one size, ragged otherwise);
 *   npy      a path to a .npy array: a typed field (npy.c), the layout of the first
 *            readable file of the column; another layout is a bad sample;
 *   label    the sample's class, served as the int64 field "label": integers as they
 *            are, or class names, numbered in sorted (bytewise) order;
 *   int64, float32   a number, served as a scalar field of that type.
 *
 * So one sample may carry an image, its target array and a label. The first column is a
 * file or npy column: it names the sample in messages, and it is what the single-file
 * cache holds, which is why only a dataset of one file column and a label can be cached.
 * Paths are opened beneath the dataset's root like every `files` sample (beneath.c); a
 * row whose number does not parse is refused at start with its manifest line; a file
 * missing at start is a bad sample (on_error: replace) or refuses the start (fail),
 * naming its line too. Everything read() touches is immutable after open(). */
#include "dataset.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "beneath.h"
#include "log.h"
#include "manifest.h"
#include "npy.h"

/* A file the open found missing (its reads fail: a bad sample). */
#define MANIFEST_MISSING UINT64_MAX
/* How many rows open() tries for an npy column's layout. */
#define MANIFEST_NPY_PROBE 16

struct manifest_dataset {
    struct dataset base;            /* first: a manifest_dataset is a dataset */
    struct beneath root;
    manifest *m;
    int types[LD_MAX_FIELDS];       /* CONFIG_COLUMN_* per field (= per manifest column) */
    struct npy_header npy[LD_MAX_FIELDS];
    int n_files;                    /* file and npy columns: their sizes are kept */
    int file_slot[LD_MAX_FIELDS];   /* field -> index among the file columns, or -1 */
    uint64_t *sizes;                /* count * n_files: bytes at open, or MANIFEST_MISSING */
    int n_values;                   /* label and number columns: their values are kept */
    int value_slot[LD_MAX_FIELDS];  /* field -> index among the value columns, or -1 */
    uint64_t *values;               /* count * n_values: label and numbers, as served (8 bytes each) */
};

/* Where sample i's value of a label or number field is kept. */
static uint64_t *md_value(const struct manifest_dataset *md, uint64_t i, int field)
{
    return &md->values[i * (uint64_t)md->n_values + (uint64_t)md->value_slot[field]];
}

static void manifest_ds_free(dataset *d)
{
    struct manifest_dataset *md = (struct manifest_dataset *)d;
    if (!md)
        return;
    beneath_root_close(&md->root);
    manifest_free(md->m);
    for (size_t k = 0; md->base.class_names && k < md->base.n_classes; k++)
        free(md->base.class_names[k]);
    free(md->base.class_names);
    free(md->sizes);
    free(md->values);
    free(md);
}

static const char *manifest_ds_sample_name(const dataset *d, uint64_t index)
{
    const struct manifest_dataset *md = (const struct manifest_dataset *)d;
    return index < d->count ? manifest_cell(md->m, index, 0) : NULL;
}

/* "train.csv:42" for messages. */
static const char *row_at(const struct manifest_dataset *md, uint64_t row, char *buf, size_t size)
{
    snprintf(buf, size, "%s:%" PRIu64, manifest_path(md->m), manifest_line(md->m, row));
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool parse_int64(const char *s, int64_t *ret)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || end == s || (*s != '-' && (*s < '0' || *s > '9')))
        return false;
    *ret = v;
    return true;
}

/* The label column: integers when every row holds one, else class names by rank. */
static int manifest_labels(struct manifest_dataset *md, int field, char *errbuf)
{
    dataset *d = &md->base;
    bool numeric = true;
    int64_t v;
    for (uint64_t i = 0; i < d->count && numeric; i++)
        numeric = parse_int64(manifest_cell(md->m, i, (size_t)field), &v);
    if (numeric) {
        for (uint64_t i = 0; i < d->count; i++) {
            parse_int64(manifest_cell(md->m, i, (size_t)field), &v);
            *md_value(md, i, field) = (uint64_t)v;
        }
        return 0;
    }
    const char **names = malloc(d->count * sizeof *names);
    if (!names)
        goto oom;
    for (uint64_t i = 0; i < d->count; i++)
        names[i] = manifest_cell(md->m, i, (size_t)field);
    qsort(names, d->count, sizeof *names, cmp_str);
    size_t n = 0;
    for (uint64_t i = 0; i < d->count; i++)
        if (n == 0 || strcmp(names[n - 1], names[i]) != 0)
            names[n++] = names[i];
    d->class_names = calloc(n, sizeof *d->class_names);
    if (!d->class_names) {
        free(names);
        goto oom;
    }
    d->n_classes = n;
    for (size_t k = 0; k < n; k++)
        if (!(d->class_names[k] = strdup(names[k]))) {
            free(names);
            goto oom;
        }
    for (uint64_t i = 0; i < d->count; i++) {
        const char *key = manifest_cell(md->m, i, (size_t)field);
        const char **hit = bsearch(&key, names, n, sizeof *names, cmp_str);
        *md_value(md, i, field) = (uint64_t)(hit - names);
    }
    free(names);
    return 0;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
    return LD_ENOMEM;
}

/* An int64 or float32 column: every row must hold a number of that type. */
static int manifest_numbers(struct manifest_dataset *md, int field, const char *column, char *errbuf)
{
    dataset *d = &md->base;
    char at[LD_ERRMSG_MAX];
    for (uint64_t i = 0; i < d->count; i++) {
        const char *s = manifest_cell(md->m, i, (size_t)field);
        uint64_t *out = md_value(md, i, field);
        if (md->types[field] == CONFIG_COLUMN_INT64) {
            int64_t v;
            if (!parse_int64(s, &v)) {
                ld_errorf(errbuf, "dataset '%s': %s: column '%s': '%.60s' is not an integer", d->name,
                          row_at(md, i, at, sizeof at), column, s);
                return LD_EDATASET;
            }
            *out = (uint64_t)v;
        } else {
            char *end;
            errno = 0;
            float f = strtof(s, &end);
            if (!*s || *end || !isfinite(f) || errno == ERANGE) {
                ld_errorf(errbuf, "dataset '%s': %s: column '%s': '%.60s' is not a finite float32", d->name,
                          row_at(md, i, at, sizeof at), column, s);
                return LD_EDATASET;
            }
            *out = 0;
            memcpy(out, &f, sizeof f);
        }
    }
    return 0;
}

/* A file column: every file's size (missing ones per on_error), and the field's layout:
 * raw bytes (fixed or ragged) or, for npy, the first readable array's. */
static int manifest_files(struct manifest_dataset *md, const struct config_dataset *cfg, int field, char *errbuf)
{
    dataset *d = &md->base;
    struct dataset_field *fl = &d->fields[field];
    int slot = md->file_slot[field];
    uint64_t max = 0, missing = 0;
    bool same = true;
    char at[LD_ERRMSG_MAX], ebuf[128];

    for (uint64_t i = 0; i < d->count; i++) {
        const char *rel = manifest_cell(md->m, i, (size_t)field);
        uint64_t *size = &md->sizes[i * (uint64_t)md->n_files + (uint64_t)slot];
        struct stat st;
        /* Most rows name a plain file: one openat2 without links, then, only where a link
         * is met, the walk that follows it (a /proc lookup more) by the same rules. */
        int fd = -1, r = *rel ? beneath_open(&md->root, rel, BENEATH_PATH, &fd, &st) : LD_ENOENT;
        if (r == -ELOOP)
            r = beneath_open(&md->root, rel, BENEATH_LINK | BENEATH_PATH, &fd, &st);
        if (fd >= 0)
            close(fd);
        if (r < 0) {
            if (cfg->on_error == CONFIG_ON_ERROR_FAIL || dataset_resource_error(r)) {
                ld_errorf(errbuf, "dataset '%s': %s: column '%s': '%s': %s", d->name, row_at(md, i, at, sizeof at),
                          cfg->columns[field].name, rel, *rel ? beneath_strerror(r, ebuf, sizeof ebuf) : "empty path");
                return r == LD_ENOENT || r == BENEATH_ENOTREG || r == -EXDEV || r == -ELOOP ? LD_EDATASET : r;
            }
            if (missing++ == 0)
                ld_log(LD_LOG_WARN, "dataset '%s': %s: column '%s': '%s': %s; the sample is replaced (on_error: "
                       "replace)", d->name, row_at(md, i, at, sizeof at), cfg->columns[field].name, rel,
                       *rel ? beneath_strerror(r, ebuf, sizeof ebuf) : "empty path");
            *size = MANIFEST_MISSING;
            continue;
        }
        *size = (uint64_t)st.st_size;
        if (max && *size != max)
            same = false;
        if (*size > max)
            max = *size;
    }
    if (missing > 1)
        ld_log(LD_LOG_WARN, "dataset '%s': column '%s': %" PRIu64 " of %" PRIu64 " files are missing",
               d->name, cfg->columns[field].name, missing, d->count);
    if (missing == d->count) {
        ld_errorf(errbuf, "dataset '%s': column '%s': none of the %" PRIu64 " files the manifest '%s' lists is "
                  "under '%s'", d->name, cfg->columns[field].name, d->count, manifest_path(md->m), cfg->path);
        return LD_EDATASET;
    }
    fl->dtype = LD_DTYPE_UINT8;
    if (md->types[field] == CONFIG_COLUMN_FILE) {
        if (max == 0) {
            ld_errorf(errbuf, "dataset '%s': column '%s': every file is empty", d->name, cfg->columns[field].name);
            return LD_EDATASET;
        }
        fl->max_item_bytes = max;
        fl->ragged = !same;
        fl->ndim = same ? 1 : 0;
        fl->shape[0] = same ? (int64_t)max : 0;
        return 0;
    }
    char first[LD_ERRMSG_MAX] = "", reason[LD_ERRMSG_MAX];
    for (uint64_t i = 0, tried = 0; i < d->count && tried < MANIFEST_NPY_PROBE; i++) {
        uint64_t size = md->sizes[i * (uint64_t)md->n_files + (uint64_t)slot];
        if (size == MANIFEST_MISSING)
            continue;
        tried++;
        const char *rel = manifest_cell(md->m, i, (size_t)field);
        struct npy_header h;
        int fd = -1, r = beneath_open(&md->root, rel, BENEATH_LINK, &fd, NULL);
        if (r < 0) {
            beneath_strerror(r, reason, sizeof reason);
        } else {
            r = npy_read_header(fd, size, &h, reason);
            close(fd);
        }
        if (r == 0 && h.data_bytes == 0) {
            ld_errorf(reason, ".npy array %s holds no element", npy_describe(&h, ebuf, sizeof ebuf));
            r = LD_ESAMPLE;
        }
        if (r == 0) {
            md->npy[field] = h;
            fl->dtype = h.dtype;
            fl->ndim = h.ndim;
            memcpy(fl->shape, h.shape, sizeof fl->shape);
            fl->max_item_bytes = h.data_bytes;
            return 0;
        }
        if (!first[0])
            ld_errorf(first, "%s: '%s': %s", row_at(md, i, at, sizeof at), rel, reason);
    }
    ld_errorf(errbuf, "dataset '%s': column '%s' (npy): no .npy array among its first files to take the layout "
              "from; the first: %s", d->name, cfg->columns[field].name, first);
    return LD_EDATASET;
}

extern const struct dataset_ops source_manifest_multi_ops;

static int manifest_ds_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct manifest_dataset *md = calloc(1, sizeof *md);
    const char *names[LD_MAX_FIELDS];
    char ebuf[128];
    int r;

    if (!md) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    md->root.rootfd = -1;
    dataset *d = &md->base;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->manifest_path);
    d->n_fields = (int)cfg->n_columns;
    bool cacheable = true;
    for (int f = 0; f < d->n_fields; f++) {
        names[f] = cfg->columns[f].name;
        md->types[f] = cfg->columns[f].type;
        bool file = md->types[f] == CONFIG_COLUMN_FILE || md->types[f] == CONFIG_COLUMN_NPY;
        md->file_slot[f] = file ? md->n_files++ : -1;
        md->value_slot[f] = file ? -1 : md->n_values++;
        cacheable &= f == 0 ? file : md->types[f] == CONFIG_COLUMN_LABEL;
        struct dataset_field *fl = &d->fields[f];
        snprintf(fl->name, sizeof fl->name, "%s", md->types[f] == CONFIG_COLUMN_LABEL ? "label" : names[f]);
        fl->dtype = md->types[f] == CONFIG_COLUMN_FLOAT32 ? LD_DTYPE_FLOAT32 : LD_DTYPE_INT64;
    }
    d->ops = cacheable ? &source_manifest_ops : &source_manifest_multi_ops;
    if (cfg->cache_path && !cacheable) {
        ld_errorf(errbuf, "dataset '%s': a cache holds one file column and a label; this manifest's columns are "
                  "more: remove `cache:`", cfg->name);
        r = LD_EDATASET;
        goto fail;
    }
    r = beneath_root_open(cfg->path, cfg->follow_links == CONFIG_FOLLOW_LINKS_OUTSIDE ? BENEATH_LINKS_OUTSIDE
                                                                                   : BENEATH_LINKS_INSIDE,
                          getenv("LOADERD_NO_OPENAT2") ? BENEATH_ROOT_NO_OPENAT2 : 0, &md->root);
    if (r < 0) {
        ld_errorf(errbuf, "dataset '%s': cannot open directory '%s': %s", cfg->name, cfg->path,
                  strerror_r(-r, ebuf, sizeof ebuf));
        goto fail;
    }
    if ((r = manifest_open(cfg->manifest_path, cfg->manifest_format, names, cfg->n_columns, &md->m, errbuf)) < 0) {
        char msg[LD_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", errbuf);
        ld_errorf(errbuf, "dataset '%s': %s", cfg->name, msg);
        goto fail;
    }
    d->count = manifest_rows(md->m);
    d->sample_overhead = 16 * 1024 * (uint64_t)md->n_files;
    md->sizes = calloc(d->count * (uint64_t)md->n_files, sizeof *md->sizes);
    md->values = calloc(d->count * (uint64_t)md->n_values + 1, sizeof *md->values);
    if (!md->sizes || !md->values) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        r = LD_ENOMEM;
        goto fail;
    }
    for (int f = 0; f < d->n_fields; f++) {
        switch (md->types[f]) {
        case CONFIG_COLUMN_FILE:
        case CONFIG_COLUMN_NPY:
            r = manifest_files(md, cfg, f, errbuf);
            break;
        case CONFIG_COLUMN_LABEL:
            r = manifest_labels(md, f, errbuf);
            break;
        default:
            r = manifest_numbers(md, f, names[f], errbuf);
            break;
        }
        if (r < 0)
            goto fail;
    }
    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " samples listed by '%s'", d->name, d->count, cfg->manifest_path);
    *ret_dataset = d;
    return 0;
fail:
    manifest_ds_free(d);
    return r;
}

static uint64_t manifest_ds_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct manifest_dataset *md = (const struct manifest_dataset *)d;
    if (index >= d->count || field < 0 || field >= d->n_fields)
        return 0;
    if (md->types[field] == CONFIG_COLUMN_NPY)
        return md->npy[field].data_bytes;
    if (md->types[field] != CONFIG_COLUMN_FILE)
        return md->types[field] == CONFIG_COLUMN_FLOAT32 ? 4 : 8;
    uint64_t size = md->sizes[index * (uint64_t)md->n_files + (uint64_t)md->file_slot[field]];
    return size == MANIFEST_MISSING ? 0 : size;
}

/* Reads field `field` (a file or npy column) of sample `index` into dst. */
static int manifest_read_file(const struct manifest_dataset *md, uint64_t index, int field, void *dst, char *errbuf)
{
    const dataset *d = &md->base;
    const char *rel = manifest_cell(md->m, index, (size_t)field);
    uint64_t size = md->sizes[index * (uint64_t)md->n_files + (uint64_t)md->file_slot[field]];
    char at[LD_ERRMSG_MAX], ebuf[128], reason[LD_ERRMSG_MAX];
    int fd = -1, r;

    if (size == MANIFEST_MISSING) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s: '%s' was missing at start", index, rel,
                  row_at(md, index, at, sizeof at), rel);
        return LD_ESAMPLE;
    }
    r = beneath_open(&md->root, rel, BENEATH_LINK, &fd, NULL);
    if (r < 0) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s: %s", index, rel, row_at(md, index, at, sizeof at),
                  beneath_strerror(r, ebuf, sizeof ebuf));
        return dataset_resource_error(r) ? r : LD_ESAMPLE;
    }
    if (md->types[field] == CONFIG_COLUMN_NPY) {
        r = npy_read(fd, size, &md->npy[field], dst, reason);
        if (r < 0)
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s: %s", index, rel, row_at(md, index, at, sizeof at), reason);
        goto out;
    }
    for (uint64_t done = 0; done < size;) {
        ssize_t n = pread(fd, (uint8_t *)dst + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = n < 0 ? ld_from_errno(errno) : LD_ESAMPLE;
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s: %s", index, rel, row_at(md, index, at, sizeof at),
                      n < 0 ? strerror_r(errno, ebuf, sizeof ebuf) : "the file shrank since the start");
            goto out;
        }
        done += (uint64_t)n;
    }
    r = 0;
out:
    close(fd);
    (void)d;
    return r < 0 && !dataset_resource_error(r) ? LD_ESAMPLE : r;
}

static int manifest_ds_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct manifest_dataset *md = (const struct manifest_dataset *)d;
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name,
                  d->count);
        return LD_EINVAL;
    }
    for (int f = 0; f < d->n_fields; f++) {
        if (md->file_slot[f] >= 0) {
            int r = manifest_read_file(md, index, f, dst[f], errbuf);
            if (r < 0)
                return r;
        } else {
            memcpy(dst[f], md_value(md, index, f),
                   md->types[f] == CONFIG_COLUMN_FLOAT32 ? 4 : 8);
        }
    }
    return 0;
}

/* ---- the cache (one file column and a label) -------------------------------------- */

static uint64_t manifest_ds_raw_bytes(const dataset *d, uint64_t index)
{
    return manifest_ds_item_bytes(d, index, 0);
}

static int manifest_ds_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                                int64_t *ret_label, char *errbuf)
{
    const struct manifest_dataset *md = (const struct manifest_dataset *)d;
    uint64_t len = manifest_ds_item_bytes(d, index, 0);
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range", index);
        return LD_EINVAL;
    }
    if (len > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64 " bytes do not fit a buffer of %" PRIu64, index,
                  manifest_cell(md->m, index, 0), len, cap);
        return LD_ERANGE;
    }
    int r = manifest_read_file(md, index, 0, buf, errbuf);
    if (r < 0)
        return r;
    int lf = dataset_label_field(d);
    *ret_len = len;
    *ret_label = lf > 0 ? (int64_t)*md_value(md, index, lf) : -1;
    return 0;
}

/* The manifest's bytes (paths, labels, order) and, per sample, the first column's file
 * as the `files` kind hashes it: its stat (or, in content mode, its bytes). */
static int manifest_ds_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    const struct manifest_dataset *md = (const struct manifest_dataset *)d;
    static const char tag[] = "loaderd manifest fingerprint v1";
    char ebuf[128];
    uint8_t *buf = NULL;
    int r = 0;
    XXH3_state_t *st = XXH3_createState();
    if (!st || (mode == DATASET_FINGERPRINT_CONTENT && !(buf = malloc(1u << 20)))) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        r = LD_ENOMEM;
        goto out;
    }
    XXH3_64bits_reset(st);
    uint64_t head[3] = {(uint64_t)mode, manifest_hash(md->m), (uint64_t)md->types[0]};
    XXH3_64bits_update(st, tag, sizeof tag);
    XXH3_64bits_update(st, head, sizeof head);
    for (uint64_t i = 0; i < d->count; i++) {
        const char *rel = manifest_cell(md->m, i, 0);
        struct stat sb;
        uint64_t rec[4] = {0};
        if (fstatat(md->root.rootfd, rel, &sb, 0) < 0) {
            rec[0] = UINT64_MAX;
        } else {
            rec[0] = (uint64_t)sb.st_size;
            if (mode == DATASET_FINGERPRINT_STAT) {
                rec[1] = (uint64_t)sb.st_mtim.tv_sec;
                rec[2] = (uint64_t)sb.st_mtim.tv_nsec;
            } else {
                int fd = -1;
                r = beneath_open(&md->root, rel, BENEATH_LINK, &fd, NULL);
                XXH3_state_t *cs = r == 0 ? XXH3_createState() : NULL;
                if (cs) {
                    XXH3_64bits_reset(cs);
                    ssize_t n;
                    while ((n = read(fd, buf, 1u << 20)) > 0)
                        XXH3_64bits_update(cs, buf, (size_t)n);
                    rec[3] = n < 0 ? UINT64_MAX : XXH3_64bits_digest(cs);
                    XXH3_freeState(cs);
                }
                if (fd >= 0)
                    close(fd);
                if (r < 0) {
                    ld_errorf(errbuf, "dataset '%s': cannot read '%s' for its fingerprint: %s", d->name, rel,
                              beneath_strerror(r, ebuf, sizeof ebuf));
                    goto out;
                }
            }
        }
        XXH3_64bits_update(st, rec, sizeof rec);
    }
    uint64_t h = XXH3_64bits_digest(st);
    *ret_fingerprint = h ? h : 1;
out:
    XXH3_freeState(st);
    free(buf);
    return r;
}

const struct dataset_ops source_manifest_ops = {
    .kind = "files",
    .open = manifest_ds_open,
    .free = manifest_ds_free,
    .item_bytes = manifest_ds_item_bytes,
    .read = manifest_ds_read,
    .sample_name = manifest_ds_sample_name,
    .fingerprint = manifest_ds_fingerprint,
    .raw_bytes = manifest_ds_raw_bytes,
    .read_raw = manifest_ds_read_raw,
};

/* Fields beyond one file column and a label: the cache could not hold them. */
const struct dataset_ops source_manifest_multi_ops = {
    .kind = "files",
    .open = manifest_ds_open,
    .free = manifest_ds_free,
    .item_bytes = manifest_ds_item_bytes,
    .read = manifest_ds_read,
    .sample_name = manifest_ds_sample_name,
};
