/* tar_s3 — copies the shards of a `tar_shards` dataset at an s3:// location into a folder
 * on this node (tar_s3.h says why whole copies).
 *
 * The folder holds the copies under the shards' names and `.listing`, one line per copy
 * ("<size> <etag> <name>"), written (a temporary name, then a rename) after the copies
 * it names are complete: a copy is reused only while the store lists its shard with the
 * same size and ETag and the file still has that size. Before any copy is replaced the
 * listing is rewritten without it, so a fetch cut short (a crash, the store gone) leaves
 * copies that the next open fetches again, never a copy taken for a shard it is not.
 *
 * A download goes to ".NAME.part" (space reserved first: a full disk is an error, not
 * a SIGBUS in the middle of a mapping), is written by the ranged GETs straight into a
 * shared mapping of that file, is flushed to disk and only then renamed to NAME. Several
 * shards are fetched together so that small shards do not cost a round trip each. */
#include "tar_s3.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "dataset.h"
#include "log.h"
#include "s3.h"

#define TAR_S3_LISTING ".listing"
/* One round of downloads maps at most this many bytes (at least one shard) and shards. */
#define TAR_S3_ROUND_BYTES (1ull << 30)
#define TAR_S3_ROUND_SHARDS 64u
#define TAR_S3_ETAG_MAX 128u

struct tar_s3_shard {
    char *name;                     /* relative to the prefix; no '/' */
    uint64_t size;
    char etag[TAR_S3_ETAG_MAX];
    bool have;                      /* a copy as listed is in the folder */
};

struct tar_s3_scan {
    const char *prefix;
    size_t prefix_len;
    const char *pattern;
    struct tar_s3_shard *shards;
    size_t n, cap;
    size_t odd;                     /* names a copy could not carry ('\n', too long an ETag) */
};

char *tar_s3_local_dir(const struct config_dataset *cfg)
{
    const char *base = cfg->index_path ? cfg->index_path : cfg->cache_path;
    char *dir;
    if (!base || asprintf(&dir, "%s.shards", base) < 0)
        return NULL;
    return dir;
}

static int tar_s3_object(void *ctx, const char *key, uint64_t size, const char *etag, const char *mod)
{
    struct tar_s3_scan *s = ctx;
    (void)mod;
    if (strncmp(key, s->prefix, s->prefix_len) != 0)
        return 0;
    const char *rel = key + s->prefix_len;
    /* The shards of a folder: its own files, not those of folders below, not hidden. */
    if (!*rel || strchr(rel, '/') || rel[0] == '.' || fnmatch(s->pattern, rel, FNM_PERIOD) != 0)
        return 0;
    if (strchr(rel, '\n') || strlen(etag) >= TAR_S3_ETAG_MAX || strchr(etag, ' ') || strchr(etag, '\n')) {
        s->odd++;
        return 0;
    }
    if (arena_grow((void **)&s->shards, &s->cap, s->n + 1, sizeof *s->shards) < 0)
        return LD_ENOMEM;
    struct tar_s3_shard *sh = &s->shards[s->n];
    *sh = (struct tar_s3_shard){.size = size};
    if (!(sh->name = strdup(rel)))
        return LD_ENOMEM;
    snprintf(sh->etag, sizeof sh->etag, "%s", etag);
    s->n++;
    return 0;
}

static int tar_s3_cmp(const void *a, const void *b)
{
    return strcmp(((const struct tar_s3_shard *)a)->name, ((const struct tar_s3_shard *)b)->name);
}

/* The copies `.listing` names, as shards (have = false); none when it is absent. */
static int tar_s3_read_listing(int dirfd, struct tar_s3_shard **ret, size_t *ret_n)
{
    struct tar_s3_shard *v = NULL;
    size_t n = 0, cap = 0;
    int fd = openat(dirfd, TAR_S3_LISTING, O_RDONLY | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    int r = 0;
    if (!f) {
        if (fd >= 0)
            close(fd);
        *ret = NULL;
        *ret_n = 0;
        return 0;
    }
    while ((len = getline(&line, &line_cap, f)) > 0) {
        if (line[len - 1] == '\n')
            line[--len] = '\0';
        char *etag = strchr(line, ' '), *name = etag ? strchr(etag + 1, ' ') : NULL;
        if (!name || (size_t)(name - etag - 1) >= TAR_S3_ETAG_MAX || !name[1] || name[1] == '.' ||
            strchr(name + 1, '/'))
            continue;                   /* not a line this module wrote: that copy is fetched again */
        if (arena_grow((void **)&v, &cap, n + 1, sizeof *v) < 0) {
            r = LD_ENOMEM;
            break;
        }
        v[n] = (struct tar_s3_shard){.size = strtoull(line, NULL, 10)};
        memcpy(v[n].etag, etag + 1, (size_t)(name - etag - 1));
        if (!(v[n].name = strdup(name + 1))) {
            r = LD_ENOMEM;
            break;
        }
        n++;
    }
    free(line);
    fclose(f);
    if (r < 0) {
        for (size_t i = 0; i < n; i++)
            free(v[i].name);
        free(v);
        return r;
    }
    *ret = v;
    *ret_n = n;
    return 0;
}

/* Writes `.listing` with the shards that have a copy. */
static int tar_s3_write_listing(int dirfd, const struct tar_s3_shard *v, size_t n, char *why, size_t why_len)
{
    static const char tmp[] = TAR_S3_LISTING ".tmp";
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(why, why_len, "cannot write %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return ld_from_errno(errno);
    }
    for (size_t i = 0; i < n; i++)
        if (v[i].have)
            fprintf(f, "%" PRIu64 " %s %s\n", v[i].size, v[i].etag, v[i].name);
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && renameat(dirfd, tmp, dirfd, TAR_S3_LISTING) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        snprintf(why, why_len, "cannot write %s: %s", TAR_S3_LISTING, strerror(e));
        unlinkat(dirfd, tmp, 0);
        return ld_from_errno(e);
    }
    return 0;
}

/* One shard being fetched. */
struct tar_s3_dl {
    struct tar_s3_shard *sh;
    int fd;
    void *map;
    char part[PATH_MAX];
    char key[1100];
    char err[LD_ERRMSG_MAX];
};

/* Fetches shards[0..n) (none of them copied) into the folder, renaming each copy into
 * place once it is complete and on disk. The first failure's message is in errbuf. */
static int tar_s3_download(const struct config_dataset *cfg, s3_client *client, const char *bucket, const char *prefix,
                           int dirfd,
                           struct tar_s3_shard **todo, size_t n, char *errbuf)
{
    struct tar_s3_dl *dl = calloc(n ? n : 1, sizeof *dl);
    struct s3_get *gets = calloc(n ? n : 1, sizeof *gets);
    int r = 0;
    if (!dl || !gets) {
        free(dl);
        free(gets);
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        dl[i].fd = -1;
    for (size_t i = 0; i < n; i++) {
        struct tar_s3_dl *x = &dl[i];
        x->sh = todo[i];
        snprintf(x->part, sizeof x->part, ".%s.part", x->sh->name);
        snprintf(x->key, sizeof x->key, "%s%s", prefix, x->sh->name);
        x->fd = openat(dirfd, x->part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int e = x->fd < 0 ? errno : x->sh->size ? posix_fallocate(x->fd, 0, (off_t)x->sh->size) : 0;
        if (e == 0 && x->sh->size) {
            x->map = mmap(NULL, x->sh->size, PROT_READ | PROT_WRITE, MAP_SHARED, x->fd, 0);
            if (x->map == MAP_FAILED) {
                x->map = NULL;
                e = errno;
            }
        }
        if (e) {
            ld_errorf(errbuf, "dataset '%s': cannot write the copy of s3://%s/%s (%" PRIu64 " bytes) into '%s': %s",
                      cfg->name, bucket, x->key, x->sh->size, x->part, strerror(e));
            r = ld_from_errno(e);
            goto out;
        }
        gets[i] = (struct s3_get){.key = x->key, .len = x->sh->size, .dst = x->map, .errmsg = x->err};
    }
    /* An empty object has nothing to get (it is copied as an empty file). */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (gets[i].len)
            gets[k++] = gets[i];
    if (k)
        s3_get_many(client, gets, k);   /* each read's outcome is in its rc */
    for (size_t i = 0, g = 0; i < n; i++) {
        struct tar_s3_dl *x = &dl[i];
        int rc = 0;
        if (x->sh->size) {
            rc = gets[g].rc;
            if (rc < 0 && r == 0)
                ld_errorf(errbuf, "dataset '%s': shard %s", cfg->name, x->err);
            g++;
        }
        if (x->map) {
            if (rc == 0 && msync(x->map, x->sh->size, MS_SYNC) != 0)
                rc = ld_from_errno(errno);
            munmap(x->map, x->sh->size);
            x->map = NULL;
        }
        if (rc == 0 && fsync(x->fd) != 0)
            rc = ld_from_errno(errno);
        if (rc == 0 && renameat(dirfd, x->part, dirfd, x->sh->name) != 0)
            rc = ld_from_errno(errno);
        if (rc < 0 && r == 0 && !errbuf[0])
            ld_errorf(errbuf, "dataset '%s': cannot keep the copy of s3://%s/%s in '%s': %s", cfg->name,
                      bucket, x->key, x->sh->name, ld_strerror(rc));
        if (rc < 0) {
            unlinkat(dirfd, x->part, 0);
            r = r < 0 ? r : LD_EDATASET;
        } else {
            x->sh->have = true;
        }
        close(x->fd);
        x->fd = -1;
    }
out:
    for (size_t i = 0; i < n; i++) {
        if (dl[i].map)
            munmap(dl[i].map, dl[i].sh->size);
        if (dl[i].fd >= 0) {
            close(dl[i].fd);
            unlinkat(dirfd, dl[i].part, 0);
        }
    }
    free(dl);
    free(gets);
    return r == LD_ENOMEM ? r : r < 0 ? LD_EDATASET : 0;
}

int tar_s3_fetch(const struct config_dataset *cfg, const char *local, char ***ret_names, size_t *ret_n,
                 char *errbuf)
{
    struct tar_s3_scan scan = {.pattern = cfg->pattern ? cfg->pattern : "*.tar"};
    struct tar_s3_shard *old = NULL, **todo = NULL;
    size_t n_old = 0, n_todo = 0;
    s3_client *client = NULL;
    char bucket[64], what[LD_NAME_MAX + 16], err[LD_ERRMSG_MAX] = "", *prefix = NULL, **names = NULL;
    const char *p;
    int r, dirfd = -1;

    errbuf[0] = '\0';
    snprintf(what, sizeof what, "dataset '%s'", cfg->name);
    if ((r = s3_url_split(cfg->path, bucket, sizeof bucket, &p, errbuf)) < 0)
        return r;
    size_t plen = strlen(p);
    if (asprintf(&prefix, "%s%s", p, plen && p[plen - 1] != '/' ? "/" : "") < 0) {
        prefix = NULL;
        goto oom;
    }
    scan.prefix = prefix;
    scan.prefix_len = strlen(prefix);
    struct s3_options opt;
    source_s3_options(cfg, &opt);
    if ((r = s3_client_new(what, bucket, &opt, &client, errbuf)) < 0)
        goto out;
    if ((r = s3_list(client, prefix, tar_s3_object, &scan, err)) < 0) {
        if (r == LD_ENOMEM)
            goto oom;
        ld_errorf(errbuf, "dataset '%s': %s", cfg->name, err);
        r = LD_EDATASET;
        goto out;
    }
    if (scan.n == 0) {
        ld_errorf(errbuf, "dataset '%s': no shard matches '%s' under s3://%s/%s%s", cfg->name, scan.pattern, bucket,
                  prefix, scan.odd ? " (some names hold a newline, which a copy cannot carry)" : "");
        r = LD_EDATASET;
        goto out;
    }
    qsort(scan.shards, scan.n, sizeof *scan.shards, tar_s3_cmp);

    if (mkdir(local, 0755) != 0 && errno != EEXIST) {
        ld_errorf(errbuf, "dataset '%s': cannot make the folder '%s' for the shards' copies: %s", cfg->name, local,
                  strerror(errno));
        r = LD_EDATASET;
        goto out;
    }
    if ((dirfd = open(local, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        ld_errorf(errbuf, "dataset '%s': cannot open the folder '%s' for the shards' copies: %s", cfg->name, local,
                  strerror(errno));
        r = LD_EDATASET;
        goto out;
    }
    if ((r = tar_s3_read_listing(dirfd, &old, &n_old)) < 0)
        goto oom;
    if (!(todo = calloc(scan.n, sizeof *todo)))
        goto oom;
    for (size_t i = 0; i < scan.n; i++) {
        struct tar_s3_shard *sh = &scan.shards[i];
        struct stat st;
        for (size_t k = 0; k < n_old && !sh->have; k++)
            sh->have = !strcmp(old[k].name, sh->name) && old[k].size == sh->size && !strcmp(old[k].etag, sh->etag) &&
                       fstatat(dirfd, sh->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
                       (uint64_t)st.st_size == sh->size;
        if (!sh->have)
            todo[n_todo++] = sh;
    }
    /* The copies of shards that left the store, or that are about to be replaced, are
     * no longer vouched for. */
    if (n_todo || n_old != scan.n - n_todo) {
        if ((r = tar_s3_write_listing(dirfd, scan.shards, scan.n, err, sizeof err)) < 0) {
            ld_errorf(errbuf, "dataset '%s': the folder '%s': %s", cfg->name, local, err);
            r = LD_EDATASET;
            goto out;
        }
        for (size_t k = 0; k < n_old; k++) {
            bool listed = false;
            for (size_t i = 0; i < scan.n && !listed; i++)
                listed = !strcmp(old[k].name, scan.shards[i].name);
            if (!listed && unlinkat(dirfd, old[k].name, 0) == 0)
                ld_log(LD_LOG_INFO, "dataset '%s': removed the copy of '%s', no longer in the store", cfg->name,
                       old[k].name);
        }
    }
    uint64_t fetched = 0;
    for (size_t i = 0; i < n_todo;) {
        size_t m = 0;
        uint64_t bytes = 0;
        while (i + m < n_todo && m < TAR_S3_ROUND_SHARDS && (m == 0 || bytes + todo[i + m]->size <= TAR_S3_ROUND_BYTES))
            bytes += todo[i + m++]->size;
        r = tar_s3_download(cfg, client, bucket, prefix, dirfd, todo + i, m, errbuf);
        /* What did arrive is kept and vouched for, even when another shard failed. */
        int w = tar_s3_write_listing(dirfd, scan.shards, scan.n, err, sizeof err);
        if (r < 0)
            goto out;
        if (w < 0) {
            ld_errorf(errbuf, "dataset '%s': the folder '%s': %s", cfg->name, local, err);
            r = LD_EDATASET;
            goto out;
        }
        fetched += bytes;
        i += m;
    }
    if (n_todo)
        ld_log(LD_LOG_INFO, "dataset '%s': fetched %zu of %zu shards (%" PRIu64 " bytes) from %s into '%s'",
               cfg->name, n_todo, scan.n, fetched, cfg->path, local);
    if (!(names = calloc(scan.n, sizeof *names)))
        goto oom;
    for (size_t i = 0; i < scan.n; i++) {
        names[i] = scan.shards[i].name;
        scan.shards[i].name = NULL;
    }
    *ret_names = names;
    *ret_n = scan.n;
    r = 0;
    goto out;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
    r = LD_ENOMEM;
out:
    for (size_t i = 0; i < scan.n; i++)
        free(scan.shards[i].name);
    free(scan.shards);
    for (size_t k = 0; k < n_old; k++)
        free(old[k].name);
    free(old);
    free(todo);
    free(prefix);
    if (dirfd >= 0)
        close(dirfd);
    s3_client_free(client);
    return r;
}
