/* source_tar — the `tar_shards` dataset kind: WebDataset tar shards.
 *
 * Which sample and which field each member is follows webdataset's rules (tar_group.h:
 * samples by key, fields by suffix, or as `fields:` says): .jpg/.jpeg/.png become the
 * field "image", decoded and augmented by the dataset's `transforms:`; .cls the int64
 * "label"; .npy a typed field (npy.c, the layout of the first sample's array); other
 * suffixes their bytes.
 *
 * At open every shard (the `pattern` matches in `path`, sorted; or `path` itself when it
 * is one file) is indexed (tar_index.h: member offsets, kept next to the cache and
 * reused while a shard keeps its size and modification time), and each sample's fields
 * are located: a read is one pread per field at the member's offset, on a descriptor
 * of the shard kept open. So samples are addressed by index like any other kind's, and
 * the sampler's permutation, ranks and resume work unchanged. A shard rewritten under
 * the daemon is detected at each read (its size or time no longer those indexed): the
 * read fails with LD_EDATASET naming the shard, and the next stream opened on the
 * dataset indexes it again (dataset_watch.c watches the shards). A sample that lacks a
 * field, or whose label does not parse, is a bad sample (on_error). The cache holds the
 * first field's bytes (an image's encoded bytes) and the label, so a dataset whose
 * fields are one image or bytes field and at most a label can be cached. Everything
 * read() touches is immutable after open(). */
#include "dataset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "beneath.h"
#include "cache.h"
#include "image_scratch.h"
#include "log.h"
#include "npy.h"
#include "s3.h"
#include "tar.h"
#include "tar_group.h"
#include "tar_index.h"
#include "tar_s3.h"
#include "transform.h"

#define TAR_MISSING TAR_GROUP_MISSING
#define TAR_IMAGE_MAX (256u << 20)      /* larger encoded images are refused, not read */

struct tar_ds {
    dataset base;                   /* first: a tar_ds is a dataset */
    struct beneath root;
    struct tar_shard_index *ix;     /* per shard: name, size and mtime as indexed; the members */
    int *fds;                       /* per shard: open for the reads */
    size_t n_shards;
    struct tar_group g;             /* the fields and the samples */
    struct npy_header npy[LD_MAX_FIELDS];
    transform_pipeline *pipeline;   /* when a field is an image */
};

static void tar_ds_free(dataset *d)
{
    struct tar_ds *t = (struct tar_ds *)d;
    if (!t)
        return;
    for (size_t i = 0; t->fds && i < t->n_shards; i++)
        if (t->fds[i] >= 0)
            close(t->fds[i]);
    free(t->fds);
    tar_index_free(t->ix, t->n_shards);
    tar_group_free(&t->g);
    transform_pipeline_free(t->pipeline);
    beneath_root_close(&t->root);
    free(t);
}

static const char *tar_ds_sample_name(const dataset *d, uint64_t index)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    return index < d->count ? tar_group_name(&t->g, index) : NULL;
}

static const struct tar_loc *tar_loc(const struct tar_ds *t, uint64_t index, int field)
{
    return tar_group_loc(&t->g, index, field);
}

/* ---- the shards ------------------------------------------------------------------ */

static int tar_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards' names: the regular files of the root that match the pattern, sorted, or
 * `only` (the path was one file). */
static int tar_list_shards(struct tar_ds *t, const struct config_dataset *cfg, const char *only, char ***ret,
                           size_t *ret_n, char *errbuf)
{
    char **names = NULL, ebuf[128];
    size_t n = 0, cap = 0;
    int r = 0, fd = -1;
    DIR *dir = NULL;
    if (only) {
        if (!(names = calloc(1, sizeof *names)) || !(names[0] = strdup(only)))
            goto oom;
        n = 1;
        goto done;
    }
    if ((r = beneath_open_dir(&t->root, "", &fd)) < 0 || !(dir = fdopendir(fd))) {
        r = r < 0 ? r : ld_from_errno(errno);
        ld_errorf(errbuf, "dataset '%s': cannot list '%s': %s", cfg->name, cfg->path, strerror_r(-r, ebuf, sizeof ebuf));
        if (fd >= 0)
            close(fd);
        return r;
    }
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] == '.' || fnmatch(cfg->pattern, de->d_name, FNM_PERIOD) != 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (arena_grow((void **)&names, &cap, n + 1, sizeof *names) < 0 || !(names[n] = strdup(de->d_name)))
            goto oom;
        n++;
    }
    closedir(dir);
    dir = NULL;
    if (n == 0) {
        ld_errorf(errbuf, "dataset '%s': no shard matches '%s' in '%s'", cfg->name, cfg->pattern, cfg->path);
        free(names);
        return LD_EDATASET;
    }
    qsort(names, n, sizeof *names, tar_cmp_str);
done:
    *ret = names;
    *ret_n = n;
    return 0;
oom:
    if (dir)
        closedir(dir);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
    return LD_ENOMEM;
}

/* A shard as messages name it: its name, or its object's s3://bucket/key. */
static const char *tar_shown(const struct config_dataset *cfg, const char *name, char *buf, size_t size)
{
    if (!s3_is_url(cfg->path))
        return name;
    size_t n = strlen(cfg->path);
    snprintf(buf, size, "%s%s%s", cfg->path, n && cfg->path[n - 1] != '/' ? "/" : "", name);
    return buf;
}

/* Opens and indexes every shard: from the saved index when a shard is as it was, else
 * by a scan; saves the index again when a scan was needed. */
static int tar_open_shards(struct tar_ds *t, const struct config_dataset *cfg, char **names, size_t n, char *errbuf)
{
    char ebuf[LD_ERRMSG_MAX], shown[1200], *ixpath = NULL;
    struct tar_shard_index *old = NULL;
    size_t n_old = 0, reused = 0;
    int r = 0;
    if (cfg->index_path || cfg->cache_path) {
        if ((cfg->index_path && !(ixpath = strdup(cfg->index_path))) ||
            (!cfg->index_path && asprintf(&ixpath, "%s.tarindex", cfg->cache_path) < 0)) {
            ixpath = NULL;
            r = LD_ENOMEM;
            goto oom;
        }
        if ((r = tar_index_load(ixpath, &old, &n_old, ebuf)) < 0)
            goto oom;
        if (ebuf[0])
            ld_log(LD_LOG_DEBUG, "dataset '%s': the shards are indexed anew: %s", cfg->name, ebuf);
    }
    if (!(t->ix = calloc(n, sizeof *t->ix)) || !(t->fds = malloc(n * sizeof *t->fds)))
        goto oom;
    for (size_t i = 0; i < n; i++)
        t->fds[i] = -1;
    t->n_shards = n;
    for (size_t i = 0; i < n; i++) {
        struct tar_shard_index *ix = &t->ix[i];
        struct stat st;
        r = beneath_open(&t->root, names[i], 0, &t->fds[i], &st);
        if (r < 0) {
            ld_errorf(errbuf, "dataset '%s': shard '%s': %s", cfg->name, tar_shown(cfg, names[i], shown, sizeof shown),
                      beneath_strerror(r, ebuf, 128));
            goto out;
        }
        /* The descriptor was opened non-blocking (beneath.h); reads of a regular file
         * do not care, but a later fcntl would. */
        const struct tar_shard_index *prev = NULL;
        for (size_t k = 0; k < n_old && !prev; k++)
            if (old[k].name && strcmp(old[k].name, names[i]) == 0 && old[k].size == (uint64_t)st.st_size &&
                old[k].mtime.tv_sec == st.st_mtim.tv_sec && old[k].mtime.tv_nsec == st.st_mtim.tv_nsec)
                prev = &old[k];
        if (prev) {
            *ix = *prev;
            memset((void *)prev, 0, sizeof *prev);
            reused++;
            continue;
        }
        if (!(ix->name = strdup(names[i])))
            goto oom;
        ix->size = (uint64_t)st.st_size;
        ix->mtime = st.st_mtim;
        r = tar_index_scan(t->fds[i], ix->size, ix, ebuf);
        if (r < 0) {
            ld_errorf(errbuf, "dataset '%s': shard '%s': %s", cfg->name, tar_shown(cfg, names[i], shown, sizeof shown),
                      ebuf);
            goto out;
        }
    }
    if (ixpath && (reused < n || n_old != n)) {
        r = tar_index_save(ixpath, t->ix, n, ebuf);
        if (r < 0)
            ld_log(LD_LOG_WARN, "dataset '%s': the shards' index is not kept: %s", cfg->name, ebuf);
    }
    ld_log(LD_LOG_DEBUG, "dataset '%s': %zu shards, %zu indexed before, %zu scanned", cfg->name, n, reused,
           n - reused);
    r = 0;
    goto out;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
    r = LD_ENOMEM;
out:
    tar_index_free(old, n_old);
    free(ixpath);
    return r;
}


/* Reads len bytes of the member at loc (from byte `at` of it) of sample index. */
static int tar_pread(const struct tar_ds *t, uint64_t index, const struct tar_loc *loc, uint64_t at, void *dst,
                     uint64_t len, char *errbuf)
{
    uint32_t sh = t->g.shard_of[index];
    char ebuf[128];
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pread(t->fds[sh], (uint8_t *)dst + done, len - done, (off_t)(loc->offset + at + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = errno;
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): shard '%s', offset %" PRIu64 ": %s", index,
                      dataset_sample_name(&t->base, index), t->ix[sh].name, loc->offset + at + done,
                      n < 0 ? strerror_r(e, ebuf, sizeof ebuf) : "the shard ends there (it shrank)");
            return n < 0 ? ld_from_errno(e) : LD_EDATASET;
        }
        done += (uint64_t)n;
    }
    return 0;
}

/* A shard rewritten since it was indexed: its offsets no longer hold (LD_EDATASET). */
static int tar_check_shard(const struct tar_ds *t, uint64_t index, char *errbuf)
{
    uint32_t sh = t->g.shard_of[index];
    const struct tar_shard_index *ix = &t->ix[sh];
    struct stat st;
    if (fstat(t->fds[sh], &st) < 0)
        return ld_from_errno(errno);
    if ((uint64_t)st.st_size == ix->size && st.st_mtim.tv_sec == ix->mtime.tv_sec &&
        st.st_mtim.tv_nsec == ix->mtime.tv_nsec)
        return 0;
    ld_errorf(errbuf, "dataset '%s': shard '%s' changed since it was indexed (%" PRIu64 " bytes then, %" PRIu64
              " now, or a new modification time): streams opened from now on index it again", t->base.name,
              ix->name, ix->size, (uint64_t)st.st_size);
    return LD_EDATASET;
}

/* The .npy header of a member (at most NPY_HEADER_MAX bytes are read). */
static int tar_npy_header(const struct tar_ds *t, uint64_t index, const struct tar_loc *loc,
                          struct npy_header *ret, char *errbuf)
{
    uint8_t prefix[NPY_PREFIX_MAX];
    uint64_t total, n = loc->size < NPY_PREFIX_MAX ? loc->size : NPY_PREFIX_MAX;
    char why[LD_ERRMSG_MAX];
    int r = tar_pread(t, index, loc, 0, prefix, n, errbuf);
    if (r < 0)
        return r;
    if ((r = npy_header_length(prefix, (size_t)n, &total, why)) == 0 && total > loc->size) {
        ld_errorf(why, "the .npy header claims %" PRIu64 " bytes, the member has %" PRIu64, total, loc->size);
        r = LD_ESAMPLE;
    }
    if (r == 0) {
        uint8_t *buf = malloc(total);
        if (!buf) {
            ld_errorf(errbuf, "out of memory");
            return LD_ENOMEM;
        }
        if ((r = tar_pread(t, index, loc, 0, buf, total, errbuf)) < 0) {
            free(buf);
            return r;
        }
        r = npy_parse(buf, (size_t)total, ret, why);
        free(buf);
    }
    if (r == 0 && ret->data_offset + ret->data_bytes != loc->size) {
        ld_errorf(why, "the .npy member has %" PRIu64 " bytes, its header describes %" PRIu64, loc->size,
                  ret->data_offset + ret->data_bytes);
        r = LD_ESAMPLE;
    }
    if (r < 0)
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s", index, dataset_sample_name(&t->base, index), why);
    return r;
}

/* Each field's layout: the image pipeline's output, the label, bytes (fixed when every
 * member has one size), npy from the first sample that has one. */
static int tar_layout(struct tar_ds *t, const struct config_dataset *cfg, const struct transform_output *out,
                      char *errbuf)
{
    dataset *d = &t->base;
    for (int f = 0; f < d->n_fields; f++) {
        struct dataset_field *fl = &d->fields[f];
        switch (t->g.types[f]) {
        case CONFIG_COLUMN_IMAGE:
            fl->dtype = out->dtype;
            fl->ndim = 3;
            for (int i = 0; i < 3; i++)
                fl->shape[i] = out->shape[i];
            break;
        case CONFIG_COLUMN_LABEL:
            fl->dtype = LD_DTYPE_INT64;
            fl->ndim = 0;
            break;
        case CONFIG_COLUMN_BYTES: {
            uint64_t max = 0;
            bool same = true;
            for (uint64_t i = 0; i < d->count; i++) {
                const struct tar_loc *l = tar_loc(t, i, f);
                if (l->offset == TAR_MISSING)
                    continue;
                if (max && l->size != max)
                    same = false;
                if (l->size > max)
                    max = l->size;
            }
            if (max == 0) {
                ld_errorf(errbuf, "dataset '%s': field '%s': every member is empty", cfg->name, fl->name);
                return LD_EDATASET;
            }
            fl->dtype = LD_DTYPE_UINT8;
            fl->max_item_bytes = max;
            fl->ragged = !same;
            fl->ndim = same ? 1 : 0;
            fl->shape[0] = same ? (int64_t)max : 0;
            break;
        }
        case CONFIG_COLUMN_NPY: {
            char first[LD_ERRMSG_MAX] = "", later[LD_ERRMSG_MAX];
            int r = LD_EDATASET;
            for (uint64_t i = 0, tried = 0; i < d->count && tried < 16 && r < 0; i++) {
                const struct tar_loc *l = tar_loc(t, i, f);
                if (l->offset == TAR_MISSING)
                    continue;
                tried++;
                r = tar_npy_header(t, i, l, &t->npy[f], first[0] ? later : first);
                if (r == LD_ENOMEM)
                    return r;
                if (r == 0 && t->npy[f].data_bytes == 0) {
                    ld_errorf(first, "sample %" PRIu64 ": the array holds no element", i);
                    r = LD_ESAMPLE;
                }
            }
            if (r < 0) {
                ld_errorf(errbuf, "dataset '%s': field '%s' (npy): no .npy array among its first members to take "
                          "the layout from; the first: %s", cfg->name, fl->name, first);
                return LD_EDATASET;
            }
            fl->dtype = t->npy[f].dtype;
            fl->ndim = t->npy[f].ndim;
            memcpy(fl->shape, t->npy[f].shape, sizeof fl->shape);
            fl->max_item_bytes = t->npy[f].data_bytes;
            break;
        }
        }
    }
    return 0;
}

extern const struct dataset_ops source_tar_plain_ops;

static int tar_ds_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    char ebuf[LD_ERRMSG_MAX], **names = NULL, *dir = NULL;
    const char *only = NULL;
    size_t n_names = 0;
    struct transform_output out = {0};
    int r;
    struct tar_ds *t = calloc(1, sizeof *t);
    if (!t) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    t->root.rootfd = -1;
    dataset *d = &t->base;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    if (cfg->n_transforms &&
        (r = transform_pipeline_new(cfg->transforms, cfg->n_transforms, &t->pipeline, &out, ebuf)) < 0) {
        ld_errorf(errbuf, "dataset '%s': %s", cfg->name, ebuf);
        goto fail;
    }
    /* `path` is the directory of shards, or one shard, or an s3:// folder whose shards
     * are copied into a local one (tar_s3.h) and read from there. */
    struct stat st;
    const char *rootpath = cfg->path;
    if (s3_is_url(cfg->path)) {
        if (!(dir = tar_s3_local_dir(cfg))) {
            r = LD_ENOMEM;
            ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
            goto fail;
        }
        if ((r = tar_s3_fetch(cfg, dir, &names, &n_names, errbuf)) < 0)
            goto fail;
        rootpath = dir;
    } else if (stat(cfg->path, &st) == 0 && S_ISREG(st.st_mode)) {
        const char *slash = strrchr(cfg->path, '/');
        if (!(dir = slash ? strndup(cfg->path, (size_t)(slash - cfg->path) + (slash == cfg->path)) : strdup("."))) {
            r = LD_ENOMEM;
            ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
            goto fail;
        }
        rootpath = dir;
        only = slash ? slash + 1 : cfg->path;
    }
    r = beneath_root_open(rootpath, BENEATH_LINKS_INSIDE, getenv("LOADERD_NO_OPENAT2") ? BENEATH_ROOT_NO_OPENAT2 : 0,
                          &t->root);
    if (r < 0) {
        ld_errorf(errbuf, "dataset '%s': cannot open directory '%s': %s", cfg->name, rootpath,
                  strerror_r(-r, ebuf, sizeof ebuf));
        goto fail;
    }
    if (!names && (r = tar_list_shards(t, cfg, only, &names, &n_names, errbuf)) < 0)
        goto fail;
    if ((r = tar_open_shards(t, cfg, names, n_names, errbuf)) < 0)
        goto fail;
    if ((r = tar_group_map(&t->g, cfg, t->ix, t->n_shards, errbuf)) < 0 ||
        (r = tar_group_samples(&t->g, cfg, t->ix, t->n_shards, errbuf)) < 0)
        goto fail;
    d->count = t->g.count;
    d->n_fields = t->g.n_fields;
    for (int f = 0; f < d->n_fields; f++)
        memcpy(d->fields[f].name, t->g.field[f], sizeof d->fields[f].name);
    if ((r = tar_layout(t, cfg, &out, errbuf)) < 0)
        goto fail;
    bool cacheable = (t->g.types[0] == CONFIG_COLUMN_IMAGE || t->g.types[0] == CONFIG_COLUMN_BYTES);
    for (int f = 1; f < d->n_fields; f++)
        cacheable &= t->g.types[f] == CONFIG_COLUMN_LABEL;
    if (cfg->cache_path && !cacheable) {
        ld_errorf(errbuf, "dataset '%s': a cache holds one image or bytes field and a label; this dataset's fields "
                  "are others: remove `cache:` or name fewer fields with `fields:`", cfg->name);
        r = LD_EDATASET;
        goto fail;
    }
    d->ops = cacheable ? &source_tar_ops : &source_tar_plain_ops;
    d->sample_overhead = t->pipeline ? 1u << 20 : 16 * 1024 * (uint64_t)d->n_fields;
    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " samples in %zu shards", d->name, d->count, t->n_shards);
    for (size_t i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    free(dir);
    *ret_dataset = d;
    return 0;
fail:
    for (size_t i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    free(dir);
    tar_ds_free(d);
    return r;
}

static uint64_t tar_ds_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    if (index >= d->count || field < 0 || field >= d->n_fields || t->g.types[field] != CONFIG_COLUMN_BYTES)
        return 0;
    const struct tar_loc *l = tar_loc(t, index, field);
    return l->offset == TAR_MISSING ? 0 : l->size;
}

/* The member of field f, or LD_ESAMPLE naming what is missing. */
static int tar_member(const struct tar_ds *t, uint64_t index, int f, const struct tar_loc **ret, char *errbuf)
{
    const struct tar_loc *l = tar_loc(t, index, f);
    if (l->offset != TAR_MISSING) {
        *ret = l;
        return 0;
    }
    ld_errorf(errbuf, "sample %" PRIu64 " (%s): field '%s': %s", index, dataset_sample_name(&t->base, index),
              t->base.fields[f].name, t->g.types[f] == CONFIG_COLUMN_LABEL ? "no label member, or one that is not an "
              "integer" : "no member for it");
    return LD_ESAMPLE;
}

static int tar_read_field(const struct tar_ds *t, uint64_t index, int f, const struct dataset_read_ctx *ctx,
                          void *dst, bool *from_cache, int64_t *cached_label, char *errbuf)
{
    const struct tar_loc *l;
    int r = tar_member(t, index, f, &l, errbuf);
    if (r < 0)
        return r;
    switch (t->g.types[f]) {
    case CONFIG_COLUMN_LABEL:
        memcpy(dst, *from_cache ? cached_label : &t->g.labels[index], sizeof(int64_t));
        return 0;
    case CONFIG_COLUMN_BYTES: {
        uint64_t len;
        char cerr[LD_ERRMSG_MAX];
        if (f == 0 && ctx && ctx->cache &&
            cache_read(ctx->cache, index, dst, l->size, &len, cached_label, true, cerr) == 0 && len == l->size) {
            *from_cache = true;
            return 0;
        }
        return tar_pread(t, index, l, 0, dst, l->size, errbuf);
    }
    case CONFIG_COLUMN_NPY: {
        struct npy_header h;
        char desc[2][96];
        if ((r = tar_npy_header(t, index, l, &h, errbuf)) < 0)
            return r == LD_ENOMEM || r == LD_EDATASET || dataset_resource_error(r) ? r : LD_ESAMPLE;
        if (!npy_same(&h, &t->npy[f])) {
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): field '%s': a .npy array %s where the field is %s", index,
                      dataset_sample_name(&t->base, index), t->base.fields[f].name,
                      npy_describe(&h, desc[0], sizeof desc[0]), npy_describe(&t->npy[f], desc[1], sizeof desc[1]));
            return LD_ESAMPLE;
        }
        return tar_pread(t, index, l, h.data_offset, dst, h.data_bytes, errbuf);
    }
    case CONFIG_COLUMN_IMAGE: {
        char err[LD_ERRMSG_MAX];
        uint64_t len = 0;
        if (l->size > TAR_IMAGE_MAX) {
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64 " bytes, more than an image may have (%u MiB)",
                      index, dataset_sample_name(&t->base, index), l->size, TAR_IMAGE_MAX >> 20);
            return LD_ESAMPLE;
        }
        struct image_scratch *sc = image_scratch_get(l->size);
        if (!sc) {
            ld_errorf(errbuf, "out of memory");
            return LD_ENOMEM;
        }
        /* From the cache when the batch may read it, checked against the sample's
         * checksum before the decoder sees it; else from the shard. */
        if (!(f == 0 && ctx && ctx->cache &&
              cache_read(ctx->cache, index, sc->raw, sc->raw_cap, &len, cached_label, true, err) == 0 &&
              len == l->size)) {
            if ((r = tar_pread(t, index, l, 0, sc->raw, l->size, errbuf)) < 0)
                return r;
        } else {
            *from_cache = true;
        }
        r = transform_apply(t->pipeline, sc->raw, l->size, ctx ? ctx->seed : 0, ctx ? ctx->epoch : 0, index, dst,
                            &sc->img, err);
        if (r < 0) {
            ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s", index, dataset_sample_name(&t->base, index), err);
            return r == LD_ENOMEM ? r : LD_ESAMPLE;
        }
        return 0;
    }
    }
    return LD_EINVAL;
}

static int tar_ds_read_ctx(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                           char *errbuf)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name, d->count);
        return LD_EINVAL;
    }
    int r = tar_check_shard(t, index, errbuf);
    if (r < 0)
        return r;
    bool from_cache = false;
    int64_t cached_label = -1;
    for (int f = 0; f < d->n_fields; f++) {
        r = tar_read_field(t, index, f, ctx, dst[f], &from_cache, &cached_label, errbuf);
        if (r < 0)
            return r;
    }
    /* A read that raced a rewrite of the shard may have read anything: say so instead. */
    return from_cache ? 0 : tar_check_shard(t, index, errbuf);
}

/* ---- the cache (one image or bytes field and a label) ------------------------------ */

static uint64_t tar_ds_raw_bytes(const dataset *d, uint64_t index)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    const struct tar_loc *l = index < d->count ? tar_loc(t, index, 0) : NULL;
    return l && l->offset != TAR_MISSING ? l->size : 0;
}

static int tar_ds_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                           int64_t *ret_label, char *errbuf)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    const struct tar_loc *l;
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range", index);
        return LD_EINVAL;
    }
    int r = tar_check_shard(t, index, errbuf);
    if (r < 0 || (r = tar_member(t, index, 0, &l, errbuf)) < 0)
        return r;
    int lf = d->n_fields > 1 ? 1 : -1;
    const struct tar_loc *ll = NULL;
    if (lf > 0 && (r = tar_member(t, index, lf, &ll, errbuf)) < 0)
        return r;
    if (l->size > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64 " bytes do not fit a buffer of %" PRIu64, index,
                  dataset_sample_name(d, index), l->size, cap);
        return LD_ERANGE;
    }
    if ((r = tar_pread(t, index, l, 0, buf, l->size, errbuf)) < 0 || (r = tar_check_shard(t, index, errbuf)) < 0)
        return r;
    *ret_len = l->size;
    *ret_label = lf > 0 ? t->g.labels[index] : -1;
    return 0;
}

/* The shards (names, sizes and times, or contents) and the mapping: the cache holds
 * field 0's bytes and the label of each sample index, which all of these decide. */
static int tar_ds_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    const struct tar_ds *t = (const struct tar_ds *)d;
    static const char tag[] = "loaderd tar_shards fingerprint v1";
    uint8_t *buf = NULL;
    int r = 0;
    XXH3_state_t *st = XXH3_createState();
    if (!st || (mode == DATASET_FINGERPRINT_CONTENT && !(buf = malloc(1u << 20)))) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        r = LD_ENOMEM;
        goto out;
    }
    XXH3_64bits_reset(st);
    uint64_t head[3] = {(uint64_t)mode, d->count, (uint64_t)d->n_fields};
    XXH3_64bits_update(st, tag, sizeof tag);
    XXH3_64bits_update(st, head, sizeof head);
    XXH3_64bits_update(st, t->g.types, sizeof t->g.types);
    for (size_t i = 0; i < t->g.n_suffixes; i++) {
        XXH3_64bits_update(st, t->g.suffix[i], strlen(t->g.suffix[i]) + 1);
        XXH3_64bits_update(st, &t->g.suffix_field[i], sizeof t->g.suffix_field[i]);
    }
    for (size_t i = 0; i < t->n_shards; i++) {
        struct stat sb;
        uint64_t rec[4] = {0};
        XXH3_64bits_update(st, t->ix[i].name, strlen(t->ix[i].name) + 1);
        if (fstat(t->fds[i], &sb) < 0) {
            rec[0] = UINT64_MAX;
        } else if (mode == DATASET_FINGERPRINT_STAT) {
            rec[0] = (uint64_t)sb.st_size;
            rec[1] = (uint64_t)sb.st_mtim.tv_sec;
            rec[2] = (uint64_t)sb.st_mtim.tv_nsec;
        } else {
            XXH3_state_t *cs = XXH3_createState();
            if (!cs) {
                ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
                r = LD_ENOMEM;
                goto out;
            }
            XXH3_64bits_reset(cs);
            ssize_t n;
            off_t at = 0;
            while ((n = pread(t->fds[i], buf, 1u << 20, at)) > 0) {
                XXH3_64bits_update(cs, buf, (size_t)n);
                at += n;
            }
            rec[0] = (uint64_t)sb.st_size;
            rec[3] = n < 0 ? UINT64_MAX : XXH3_64bits_digest(cs);
            XXH3_freeState(cs);
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

const struct dataset_ops source_tar_ops = {
    .kind = "tar_shards",
    .open = tar_ds_open,
    .free = tar_ds_free,
    .item_bytes = tar_ds_item_bytes,
    .read_ctx = tar_ds_read_ctx,
    .sample_name = tar_ds_sample_name,
    .fingerprint = tar_ds_fingerprint,
    .raw_bytes = tar_ds_raw_bytes,
    .read_raw = tar_ds_read_raw,
};

/* Fields beyond one image or bytes field and a label: the cache could not hold them. */
const struct dataset_ops source_tar_plain_ops = {
    .kind = "tar_shards",
    .open = tar_ds_open,
    .free = tar_ds_free,
    .item_bytes = tar_ds_item_bytes,
    .read_ctx = tar_ds_read_ctx,
    .sample_name = tar_ds_sample_name,
};
