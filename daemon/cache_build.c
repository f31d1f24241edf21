/* cache_build — writing a dataset's cache file, and the two ways files leave the cache
 * directory: the sweep of temporary files whose builder died, and setting aside a file
 * that failed its checks. Reading is cache.c; the format is cache.h and
 * docs/cache-format.md.
 *
 * cache_build() reads every sample once (through the kind's read_raw) and writes one
 * file: a header page, the samples back to back at 64-byte aligned offsets, an index
 * (offset, length, label, checksum per sample) and a footer. The header is planned
 * from raw_bytes first, so every offset is known before the first byte is written, and
 * writes go out in large buffered pieces.
 *
 * Safety: a build writes a temporary file in the cache's directory, fsyncs it and
 * renames it over the cache, then fsyncs the directory; the rename is the only step
 * that changes what `path` names, and it is atomic, so a crash leaves either the old
 * state or the whole new file. The temporary file's name carries the builder's pid, so
 * cache_sweep_temps() can tell a dead builder's leftovers from a live one's work. */
#include "cache_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sweep.h"

/* Writes go out in pieces of this size: few system calls, and little memory. */
#define BUILD_DATA_BUF (8u << 20)
#define BUILD_INDEX_ENTRIES 8192u              /* 256 KiB of index per write */
#define TEMP_INFIX ".tmp."
#define TEMP_RAND_DIGITS 16

/* ---- helpers ------------------------------------------------------------------------ */

/* The directory part of path ("." when there is none), for messages and fsync. */
static void path_dir(const char *path, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(buf, size, ".");
        return;
    }
    size_t len = (size_t)(slash - path);
    if (len == 0)
        len = 1;                    /* "/x": the root */
    if (len >= size)
        len = size - 1;
    memcpy(buf, path, len);
    buf[len] = '\0';
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ld_from_errno(errno);
        }
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

/* fsyncs a directory so that a rename in it survives a power cut. */
static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ld_from_errno(errno);
    int r = 0;
    if (fsync(fd) < 0 && errno != EINVAL)   /* some file systems cannot sync a directory */
        r = ld_from_errno(errno);
    close(fd);
    return r;
}

/* Copies a string into a zeroed, fixed-size header slot, cut to fit: the slots are
 * informative, and a cut path is better than no cache. */
static void copy_str(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- the writer --------------------------------------------------------------------- */

struct build {
    const dataset *d;
    const char *path;
    char *errbuf;
    int fd;
    uint8_t *data;                  /* samples waiting to be written */
    size_t data_cap, data_fill;
    uint64_t data_pos;              /* file offset of data[0] */
    struct cache_index_entry *index;/* entries waiting to be written */
    size_t index_fill;
    uint64_t index_pos;
    XXH3_state_t *index_hash;
    char tmp[PATH_MAX];
    char dir[PATH_MAX];
};

static int build_write_error(struct build *b, int r)
{
    char ebuf[128];
    if (r == LD_ENOSPC)
        return cache_fail(b->errbuf, r, b->path, "no space left in directory '%s'", b->dir);
    return cache_fail(b->errbuf, r, b->path, "cannot write '%s': %s", b->tmp,
                      cache_errno_text(-r, ebuf, sizeof ebuf));
}

static int build_flush_data(struct build *b)
{
    int r = pwrite_all(b->fd, b->data, b->data_fill, b->data_pos);
    if (r < 0)
        return build_write_error(b, r);
    b->data_pos += b->data_fill;
    b->data_fill = 0;
    return 0;
}

static int build_flush_index(struct build *b)
{
    size_t bytes = b->index_fill * sizeof *b->index;
    int r = pwrite_all(b->fd, b->index, bytes, b->index_pos);
    if (r < 0)
        return build_write_error(b, r);
    XXH3_64bits_update(b->index_hash, b->index, bytes);
    b->index_pos += bytes;
    b->index_fill = 0;
    return 0;
}

/* Fills the header from the dataset: its layout and, from raw_bytes, the sections'
 * sizes, so every offset is known before the first byte is written. */
static int build_plan(const dataset *d, const char *path, uint64_t fingerprint,
                      struct cache_header *h, char *errbuf)
{
    memset(h, 0, sizeof *h);
    if (d->n_fields < 1 || d->n_fields > LD_MAX_FIELDS)
        return cache_fail(errbuf, LD_EINVAL, path, "dataset '%s' has %d fields", d->name,
                          d->n_fields);

    /* A kind that transforms its raw bytes (read_ctx: image_folder decodes and
     * augments the encoded file) serves field 0 in another shape than it stores it:
     * the cache holds the raw bytes, so its field 0 is ragged bytes whatever the
     * served layout is. Otherwise the raw bytes are field 0 verbatim. */
    const bool raw_ragged = d->fields[0].ragged || d->ops->read_ctx != NULL;
    const struct dataset_field *f0 = &d->fields[0];
    uint64_t row = raw_ragged ? 0 : dataset_row_bytes(d, 0);
    uint64_t data_bytes = 0, sample_bytes = 0, max_len = 0;
    const uint64_t limit = UINT64_MAX / 2;   /* far beyond any file; keeps the sums exact */
    for (uint64_t i = 0; i < d->count; i++) {
        uint64_t len = d->ops->raw_bytes(d, i);
        if (!raw_ragged && len != row)
            return cache_fail(errbuf, LD_EDATASET, path,
                              "dataset '%s': sample %" PRIu64 " has %" PRIu64
                              " bytes, its fixed field '%s' has %" PRIu64, d->name, i, len,
                              f0->name, row);
        if (len > limit || data_bytes > limit - cache_align_up(len, CACHE_ALIGN))
            return cache_fail(errbuf, LD_EFBIG, path, "dataset '%s' is too large to cache",
                              d->name);
        data_bytes += cache_align_up(len, CACHE_ALIGN);
        sample_bytes += len;
        if (len > max_len)
            max_len = len;
    }
    if (d->count > limit / CACHE_INDEX_ENTRY_SIZE ||
        data_bytes > limit - d->count * CACHE_INDEX_ENTRY_SIZE)
        return cache_fail(errbuf, LD_EFBIG, path, "dataset '%s' is too large to cache", d->name);

    memcpy(h->magic, CACHE_MAGIC, sizeof h->magic);
    h->version = CACHE_VERSION;
    h->flags = raw_ragged ? CACHE_FLAG_RAGGED : 0;
    h->count = d->count;
    h->fingerprint = fingerprint;
    h->data_offset = CACHE_HEADER_SIZE;
    h->data_bytes = data_bytes;
    h->index_offset = h->data_offset + data_bytes;
    h->index_bytes = d->count * CACHE_INDEX_ENTRY_SIZE;
    h->file_size = h->index_offset + h->index_bytes + CACHE_FOOTER_SIZE;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    h->build_time_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    h->sample_bytes = sample_bytes;
    h->max_sample_bytes = max_len;
    h->n_fields = (uint32_t)d->n_fields;
    /* Field 0 is the cached bytes, so a label is one of the others. */
    const int label = dataset_label_field(d);
    h->label_field = label > 0 ? (uint32_t)label : CACHE_NO_LABEL;
    h->align = CACHE_ALIGN;
    copy_str(h->kind, sizeof h->kind, dataset_kind(d));
    copy_str(h->name, sizeof h->name, d->name);
    copy_str(h->source, sizeof h->source, d->source);
    for (int k = 0; k < d->n_fields; k++) {
        const struct dataset_field *f = &d->fields[k];
        struct cache_field *cf = &h->fields[k];
        copy_str(cf->name, sizeof cf->name, f->name);
        if (k == 0 && raw_ragged && !f->ragged) {
            /* The raw bytes (an encoded image), described as what they are. */
            cf->dtype = LD_DTYPE_UINT8;
            cf->ragged = 1;
            cf->max_item_bytes = max_len;
            continue;
        }
        cf->dtype = (uint32_t)f->dtype;
        cf->ndim = (uint32_t)f->ndim;
        for (int j = 0; j < f->ndim && j < LD_MAX_DIMS; j++)
            cf->shape[j] = f->shape[j];
        cf->ragged = f->ragged;
        cf->max_item_bytes = f->ragged ? f->max_item_bytes : 0;
    }
    h->header_checksum = XXH3_64bits(h, offsetof(struct cache_header, header_checksum));
    return 0;
}

int cache_plan_bytes(const dataset *d, uint64_t *ret_bytes, char *errbuf)
{
    if (!d->ops->raw_bytes || !d->ops->read_raw)
        return cache_fail(errbuf, LD_ENOTSUP, d->name, "dataset '%s' of kind '%s' cannot be cached", d->name,
                          dataset_kind(d));
    struct cache_header *h = aligned_alloc(CACHE_HEADER_SIZE, sizeof *h);
    if (!h)
        return cache_fail(errbuf, LD_ENOMEM, d->name, "out of memory");
    int r = build_plan(d, d->name, 0, h, errbuf);
    if (r == 0)
        *ret_bytes = h->file_size;
    free(h);
    return r;
}

static void build_report(cache_progress_fn cb, void *ctx, enum cache_stage stage, uint64_t n)
{
    if (cb)
        cb(ctx, stage, n, n);
}

int cache_build(const dataset *d, const char *path, uint64_t fingerprint,
                cache_progress_fn cb, void *ctx, const atomic_int *cancel, char *errbuf)
{
    return cache_build_mode(d, path, fingerprint, 0644, cb, ctx, cancel, errbuf);
}

int cache_build_mode(const dataset *d, const char *path, uint64_t fingerprint, unsigned mode,
                     cache_progress_fn cb, void *ctx, const atomic_int *cancel, char *errbuf)
{
    struct build b = {.d = d, .path = path, .errbuf = errbuf, .fd = -1};
    struct cache_header *h = NULL;
    bool created = false;
    char ebuf[128];
    unsigned last_pct = UINT_MAX;
    int r;

    if (!d->ops->raw_bytes || !d->ops->read_raw) {
        r = cache_fail(errbuf, LD_ENOTSUP, path, "dataset '%s' of kind '%s' cannot be cached",
                       d->name, dataset_kind(d));
        goto out;
    }
    if (d->count == 0) {
        r = cache_fail(errbuf, LD_EINVAL, path, "dataset '%s' has no samples: nothing to cache",
                       d->name);
        goto out;
    }
    path_dir(path, b.dir, sizeof b.dir);

    h = aligned_alloc(CACHE_HEADER_SIZE, sizeof *h);
    b.index = malloc(BUILD_INDEX_ENTRIES * sizeof *b.index);
    b.index_hash = XXH3_createState();
    if (!h || !b.index || !b.index_hash) {
        r = cache_fail(errbuf, LD_ENOMEM, path, "out of memory");
        goto out;
    }
    r = build_plan(d, path, fingerprint, h, errbuf);
    if (r < 0)
        goto out;
    /* One buffer holds the largest sample, so read_raw always reads straight into it. */
    b.data_cap = BUILD_DATA_BUF;
    if (cache_align_up(h->max_sample_bytes, CACHE_ALIGN) > b.data_cap)
        b.data_cap = (size_t)cache_align_up(h->max_sample_bytes, 4096);
    b.data = aligned_alloc(4096, b.data_cap);
    if (!b.data) {
        r = cache_fail(errbuf, LD_ENOMEM, path, "out of memory for a %zu-byte buffer", b.data_cap);
        goto out;
    }

    /* The random part keeps two builders of one path, even in one process, apart. */
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rnd = XXH3_64bits(&ts, sizeof ts) ^ (uint64_t)(uintptr_t)&b;
    }
    int n = snprintf(b.tmp, sizeof b.tmp, "%s" TEMP_INFIX "%ld.%016" PRIx64, path,
                     (long)getpid(), rnd);
    if (n < 0 || (size_t)n >= sizeof b.tmp) {
        r = cache_fail(errbuf, LD_ENAMETOOLONG, path, "path too long");
        goto out;
    }
    b.fd = open(b.tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, (mode_t)mode);
    if (b.fd < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path,
                       "cannot create a file in directory '%s': %s", b.dir,
                       cache_errno_text(e, ebuf, sizeof ebuf));
        goto out;
    }
    created = true;
    /* Reserve the whole size now: a full disk fails here, not hours into the build.
     * File systems without fallocate() are simply written. */
    if (fallocate(b.fd, 0, 0, (off_t)h->file_size) < 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS && errno != EINVAL) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path,
                       "cannot reserve %" PRIu64 " bytes in directory '%s': %s", h->file_size,
                       b.dir, cache_errno_text(e, ebuf, sizeof ebuf));
        goto out;
    }
    r = pwrite_all(b.fd, h, sizeof *h, 0);
    if (r < 0) {
        r = build_write_error(&b, r);
        goto out;
    }

    b.data_pos = h->data_offset;
    b.index_pos = h->index_offset;
    XXH3_64bits_reset(b.index_hash);
    cache_report_percent(cb, ctx, CACHE_STAGE_READ, 0, d->count, &last_pct);
    for (uint64_t i = 0; i < d->count; i++) {
        if (cache_stop_requested(cancel)) {
            r = cache_fail(errbuf, LD_ECANCELED, path, "build canceled at sample %" PRIu64
                           " of %" PRIu64, i, d->count);
            goto out;
        }
        uint64_t want = d->ops->raw_bytes(d, i);
        uint64_t padded = cache_align_up(want, CACHE_ALIGN);
        if (padded > b.data_cap - b.data_fill) {
            r = build_flush_data(&b);
            if (r < 0)
                goto out;
            if (padded > b.data_cap) {
                r = cache_fail(errbuf, LD_EDATASET, path, "sample %" PRIu64
                               " has grown to %" PRIu64 " bytes during the build", i, want);
                goto out;
            }
        }
        uint8_t *dst = b.data + b.data_fill;
        uint64_t got = 0;
        int64_t label = -1;
        char serr[LD_ERRMSG_MAX] = "";
        r = d->ops->read_raw(d, i, dst, want, &got, &label, serr);
        if (r < 0) {
            r = cache_fail(errbuf, r, path, "dataset '%s': %s", d->name, serr);
            goto out;
        }
        if (got != want) {
            r = cache_fail(errbuf, LD_EDATASET, path, "sample %" PRIu64 " read %" PRIu64
                           " bytes, expected %" PRIu64, i, got, want);
            goto out;
        }
        memset(dst + got, 0, (size_t)(padded - got));
        b.index[b.index_fill++] = (struct cache_index_entry){
            .offset = b.data_pos + b.data_fill,
            .length = got,
            .label = label,
            .checksum = cache_hash_sample(dst, (size_t)got),
        };
        b.data_fill += (size_t)padded;
        if (b.index_fill == BUILD_INDEX_ENTRIES) {
            r = build_flush_index(&b);
            if (r < 0)
                goto out;
        }
        cache_report_percent(cb, ctx, CACHE_STAGE_READ, i + 1, d->count, &last_pct);
    }
    r = build_flush_data(&b);
    if (r == 0)
        r = build_flush_index(&b);
    if (r < 0)
        goto out;
    if (b.data_pos != h->index_offset || b.index_pos != h->index_offset + h->index_bytes) {
        r = cache_fail(errbuf, LD_EDATASET, path, "sample sizes changed during the build");
        goto out;
    }

    struct cache_footer foot = {
        .count = h->count,
        .fingerprint = h->fingerprint,
        .index_offset = h->index_offset,
        .index_checksum = XXH3_64bits_digest(b.index_hash),
        .header_checksum = h->header_checksum,
        .file_size = h->file_size,
    };
    memcpy(foot.magic, CACHE_FOOTER_MAGIC, sizeof foot.magic);
    foot.footer_checksum = XXH3_64bits(&foot, offsetof(struct cache_footer, footer_checksum));
    r = pwrite_all(b.fd, &foot, sizeof foot, b.index_pos);
    if (r < 0) {
        r = build_write_error(&b, r);
        goto out;
    }

    /* Durable before visible: the rename must never expose bytes still in flight. */
    build_report(cb, ctx, CACHE_STAGE_SYNC, d->count);
    if (fsync(b.fd) < 0) {
        r = build_write_error(&b, ld_from_errno(errno));
        goto out;
    }
    int fd = b.fd;
    b.fd = -1;
    if (close(fd) < 0) {
        r = build_write_error(&b, ld_from_errno(errno));
        goto out;
    }
    if (cache_stop_requested(cancel)) {
        r = cache_fail(errbuf, LD_ECANCELED, path, "build canceled before the rename");
        goto out;
    }
    build_report(cb, ctx, CACHE_STAGE_RENAME, d->count);
    if (rename(b.tmp, path) < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot rename '%s' to it: %s", b.tmp,
                       cache_errno_text(e, ebuf, sizeof ebuf));
        goto out;
    }
    created = false;
    build_report(cb, ctx, CACHE_STAGE_RENAMED, d->count);
    /* The cache is whole and in place; only its survival of a power cut is in doubt. */
    int sr = sync_dir(b.dir);
    if (sr < 0)
        ld_log(LD_LOG_WARN, "cache '%s': cannot fsync directory '%s': %s", path, b.dir,
               cache_errno_text(-sr, ebuf, sizeof ebuf));
    ld_log(LD_LOG_DEBUG, "cache '%s': built %" PRIu64 " samples of dataset '%s', %" PRIu64
           " bytes", path, h->count, d->name, h->file_size);
    build_report(cb, ctx, CACHE_STAGE_DONE, d->count);
    r = 0;

out:
    if (b.fd >= 0)
        close(b.fd);
    if (created)
        unlink(b.tmp);
    free(h);
    free(b.data);
    free(b.index);
    XXH3_freeState(b.index_hash);
    return r;
}

/* ---- leaving the directory: dead builders' temporary files, bad files set aside ----- */

/* Parses NAME.tmp.<pid>.<16 hex>; the pid in *ret_pid. */
static bool temp_name_pid(const char *name, long *ret_pid)
{
    const char *infix = NULL;
    for (const char *p = strstr(name, TEMP_INFIX); p; p = strstr(p + 1, TEMP_INFIX))
        infix = p;
    if (!infix || infix == name)
        return false;
    const char *p = infix + strlen(TEMP_INFIX);
    long pid = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (digits >= 10)
            return false;
        pid = pid * 10 + (*p - '0');
    }
    if (digits == 0 || pid <= 0 || pid > INT_MAX || *p != '.')
        return false;
    p++;
    for (digits = 0; p[digits]; digits++)
        if (!((p[digits] >= '0' && p[digits] <= '9') || (p[digits] >= 'a' && p[digits] <= 'f')))
            return false;
    if (digits != TEMP_RAND_DIGITS)
        return false;
    *ret_pid = pid;
    return true;
}

static pid_t temp_owner(const char *name, void *ctx)
{
    long pid;
    return temp_name_pid(name, &pid) ? (pid_t)pid : 0;
}

int cache_sweep_temps(const char *dir, char *errbuf)
{
    return sweep_dead_owners(dir, temp_owner, NULL, "cache directory", errbuf);
}

int cache_set_aside(const char *path, const char *reason, char *errbuf)
{
    char bad[PATH_MAX], why[PATH_MAX], dir[PATH_MAX], ebuf[128];
    int n1 = snprintf(bad, sizeof bad, "%s.bad", path);
    int n2 = snprintf(why, sizeof why, "%s.bad.reason", path);
    if (n1 < 0 || n2 < 0 || (size_t)n2 >= sizeof why)
        return cache_fail(errbuf, LD_ENAMETOOLONG, path, "path too long");
    if (rename(path, bad) < 0) {
        int e = errno;
        return cache_fail(errbuf, ld_from_errno(e), path, "cannot rename it to '%s': %s", bad,
                          cache_errno_text(e, ebuf, sizeof ebuf));
    }
    /* The reason beside it is for whoever inspects the file; losing it loses nothing. */
    /* Never through a link planted under that name. */
    int wfd = open(why, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
    FILE *f = wfd >= 0 ? fdopen(wfd, "w") : NULL;
    if (!f && wfd >= 0)
        close(wfd);
    if (f) {
        struct timespec now;
        struct tm tm;
        char when[64] = "";
        clock_gettime(CLOCK_REALTIME, &now);
        if (gmtime_r(&now.tv_sec, &tm))
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        fprintf(f, "%s set aside %s: %s\n", path, when, reason ? reason : "");
        fclose(f);
    }
    path_dir(path, dir, sizeof dir);
    sync_dir(dir);
    return 0;
}
