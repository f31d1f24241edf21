/* dataset_watch — rescanning a folder dataset when its folders change, and the life of
 * a dataset replaced while streams still read it. See dataset_watch.h.
 *
 * A change of a folder's entries (a file created, removed or renamed in it) moves its
 * modification time; a change of a file's content does not, and is the cache
 * fingerprint's business (a resized or rewritten sample). So the watch stats folders,
 * never files: the folders that hold samples, found from the samples' relative names,
 * and the root (a new class folder appears there). */
#include "dataset_watch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <uv.h>

#include "log.h"
#include "s3.h"

struct watched {
    char *path;                     /* absolute */
    struct timespec mtime;
    ino_t ino;
    bool present;
};

struct dataset_watch {
    const struct config_dataset *cfg;
    struct watched *dirs;
    size_t n_dirs;
};

static void watched_stat(struct watched *w)
{
    struct stat st;
    w->present = stat(w->path, &st) == 0;
    w->mtime = w->present ? st.st_mtim : (struct timespec){0};
    w->ino = w->present ? st.st_ino : 0;
}

static bool watched_changed(const struct watched *w)
{
    struct stat st;
    bool present = stat(w->path, &st) == 0;
    if (present != w->present)
        return true;
    return present && (st.st_ino != w->ino || st.st_mtim.tv_sec != w->mtime.tv_sec ||
                       st.st_mtim.tv_nsec != w->mtime.tv_nsec);
}

static void dirs_free(struct watched *dirs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(dirs[i].path);
    free(dirs);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The root and every folder that holds a sample of d, with their times now. */
static int snapshot(const struct config_dataset *cfg, const dataset *d, struct watched **ret_dirs,
                    size_t *ret_n)
{
    char **rel = NULL;
    size_t n = 0, cap = 0;
    struct watched *dirs = NULL;
    int r = LD_ENOMEM;
    const char *prev = NULL;
    size_t prev_len = 0;
    for (uint64_t i = 0; i < d->count; i++) {
        const char *name = dataset_sample_name(d, i);
        /* A tar_shards sample's "folder" is its shard: the first component of
         * "SHARD/KEY" (a key may hold slashes). */
        const char *slash = cfg->kind == CONFIG_DATASET_TAR_SHARDS ? strchr(name, '/') : strrchr(name, '/');
        if (!slash)
            continue; /* in the root */
        size_t len = (size_t)(slash - name);
        if (prev && len == prev_len && memcmp(name, prev, len) == 0)
            continue; /* sorted names: a folder's files mostly come together */
        prev = name;
        prev_len = len;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            char **p = realloc(rel, nc * sizeof *p);
            if (!p)
                goto out;
            rel = p;
            cap = nc;
        }
        if (!(rel[n] = strndup(name, len)))
            goto out;
        n++;
    }
    if (n)
        qsort(rel, n, sizeof *rel, str_cmp);
    dirs = calloc(n + 1, sizeof *dirs);
    if (!dirs || !(dirs[0].path = strdup(cfg->path)))
        goto out;
    size_t m = 1;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(rel[i], rel[i - 1]) == 0)
            continue;
        size_t len = strlen(cfg->path) + 1 + strlen(rel[i]) + 1;
        if (!(dirs[m].path = malloc(len)))
            goto out;
        snprintf(dirs[m].path, len, "%s/%s", cfg->path, rel[i]);
        m++;
    }
    for (size_t i = 0; i < m; i++)
        watched_stat(&dirs[i]);
    *ret_dirs = dirs;
    *ret_n = m;
    dirs = NULL;
    r = 0;
out:
    if (dirs)
        dirs_free(dirs, n + 1);
    for (size_t i = 0; i < n; i++)
        free(rel[i]);
    free(rel);
    return r;
}

int dataset_watch_new(const struct config_dataset *cfg, const dataset *d, dataset_watch **ret_watch, char *errbuf)
{
    dataset_watch *w = calloc(1, sizeof *w);
    if (!w) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    w->cfg = cfg;
    /* A tar_shards sample is named "SHARD/KEY", so its "folder" is the shard file itself:
     * a shard rewritten (new size, time or inode) or one added to the root is seen. A
     * bucket (an s3:// path) has no folder to stat. */
    bool folder = (cfg->kind == CONFIG_DATASET_FILES || cfg->kind == CONFIG_DATASET_IMAGE_FOLDER ||
                   cfg->kind == CONFIG_DATASET_TAR_SHARDS) && !s3_is_url(cfg->path);
    if (folder && d->ops->sample_name && snapshot(cfg, d, &w->dirs, &w->n_dirs) < 0) {
        free(w);
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    *ret_watch = w;
    return 0;
}

void dataset_watch_free(dataset_watch *w)
{
    if (!w)
        return;
    dirs_free(w->dirs, w->n_dirs);
    free(w);
}

static bool same_samples(const dataset *a, const dataset *b)
{
    /* A rewritten shard may keep its sample names and move their members. */
    if (strcmp(dataset_kind(a), "tar_shards") == 0)
        return false;
    if (a->count != b->count || a->n_fields != b->n_fields)
        return false;
    for (uint64_t i = 0; i < a->count; i++)
        if (strcmp(dataset_sample_name(a, i), dataset_sample_name(b, i)) != 0)
            return false;
    return memcmp(a->fields, b->fields, sizeof a->fields) == 0;
}

int dataset_watch_refresh(dataset_watch *w, dataset **pd, char *errbuf)
{
    bool changed = false;
    for (size_t i = 0; i < w->n_dirs && !changed; i++)
        changed = watched_changed(&w->dirs[i]);
    if (!changed)
        return 0;
    dataset *old = *pd, *fresh = NULL;
    char err[LD_ERRMSG_MAX];
    uint64_t t0 = uv_hrtime();
    int r = dataset_open(w->cfg, &fresh, err);
    if (r < 0) {
        ld_errorf(errbuf, "the folder of dataset '%s' changed and cannot be scanned again: %s", old->name, err);
        return r;
    }
    struct watched *dirs;
    size_t n;
    if (snapshot(w->cfg, fresh, &dirs, &n) < 0) {
        dataset_free(fresh);
        ld_errorf(errbuf, "dataset '%s': out of memory", old->name);
        return LD_ENOMEM;
    }
    dirs_free(w->dirs, w->n_dirs);
    w->dirs = dirs;
    w->n_dirs = n;
    if (same_samples(old, fresh)) {
        dataset_free(fresh); /* a folder was touched, the samples are the same */
        return 0;
    }
    ld_log(LD_LOG_INFO, "dataset '%s': the folder changed: %" PRIu64 " samples now (were %" PRIu64
           "), scanned again in %.1f ms; streams opened from now on read them", old->name, fresh->count,
           old->count, (double)(uv_hrtime() - t0) / 1e6);
    atomic_store(&fresh->bad_samples, atomic_load(&old->bad_samples));
    atomic_store(&fresh->replaced_samples, atomic_load(&old->replaced_samples));
    fresh->keeper = old->keeper;
    *pd = fresh;
    old->retired = true;
    if (old->holders == 0)
        dataset_free(old);
    return 1;
}

void dataset_hold(dataset *d)
{
    d->holders++;
}

void dataset_release(dataset *d)
{
    ld_require(d->holders > 0); /* else more releases than holds */
    if (--d->holders == 0 && d->retired)
        dataset_free(d);
}
