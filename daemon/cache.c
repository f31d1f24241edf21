/* cache — the single-file dataset cache: one packed file instead of many small ones.
 *
 * A dataset of many small files costs an open, a stat and a read per sample, every
 * epoch. cache_build() reads every sample once (through the kind's read_raw) and
 * writes one file: a header page, the samples back to back at 64-byte aligned
 * offsets, an index (offset, length, label, checksum per sample) and a footer. The
 * daemon then serves later epochs, streams and runs from it with cache_sample(): a
 * pointer into a read-only shared mapping, no system call per sample, and
 * cache_advise() turns the sampler's known future order into madvise(WILLNEED) so
 * the kernel reads the next batches' pages before the workers touch them. A cache
 * larger than memory works: nothing is read whole at open except the index.
 *
 * Safety: a build writes a temporary file in the cache's directory, fsyncs it and
 * renames it over the cache, then fsyncs the directory; the rename is the only step
 * that changes what `path` names, and it is atomic, so a crash leaves either the old
 * state or the whole new file. cache_open() still trusts nothing: a chain of
 * checksums (footer -> header, index; index -> each sample) and consistency checks
 * on every offset mean that a torn, truncated or flipped file is refused with a
 * specific message, and that a pointer cache_sample() hands out always lies inside
 * the mapping. Sample bytes are checked by cache_verify() and, on request, by
 * cache_read(). The format is in cache.h and docs/cache-format.md. */
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
/* Sample checksums are computed when a sample is served: the dispatching variant uses
 * AVX2 or AVX-512 where the CPU has them (3-5x the SSE2 build's speed), same result. */
#define sample_hash XXH3_64bits_dispatch
#else
#define sample_hash XXH3_64bits
#endif

#include "log.h"
#include "mapguard.h"
#include "sweep.h"

/* Writes go out in pieces of this size: few system calls, and little memory. */
#define BUILD_DATA_BUF (8u << 20)
#define BUILD_INDEX_ENTRIES 8192u              /* 256 KiB of index per write */
/* Advised ranges closer than this are merged: reading a few pages more costs less
 * than another system call, and the kernel reads around a range anyway. */
#define ADVISE_GAP (64u << 10)
/* cache_verify() keeps this much ahead of itself asked for. */
#define VERIFY_AHEAD (32u << 20)
#define TEMP_INFIX ".tmp."
#define TEMP_RAND_DIGITS 16

struct cache {
    char *path;
    const uint8_t *map;             /* the whole file, PROT_READ, MAP_SHARED */
    size_t map_len;
    size_t page;
    const struct cache_header *hdr;
    const struct cache_index_entry *index;
    struct cache_meta meta;
    atomic_uint_fast64_t hit_samples;
    atomic_uint_fast64_t hit_bytes;
    dev_t dev;                      /* the file mapped, to set aside only that one */
    ino_t ino;
    /* The first failure found while serving (cache_read): CACHE_BAD_*, and the sample. */
    atomic_int bad;
    _Atomic uint64_t bad_index;
};

/* ---- helpers ------------------------------------------------------------------------ */

/* Formats "cache 'PATH': MESSAGE" into errbuf and returns code. */
__attribute__((format(printf, 4, 5)))
static int cache_fail(char *errbuf, int code, const char *path, const char *fmt, ...)
{
    char msg[LD_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ld_errorf(errbuf, "cache '%s': %s", path, msg);
    return code;
}

static const char *errno_text(int e, char *buf, size_t size)
{
    return strerror_r(e, buf, size);
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

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

static bool has_nul(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

static bool stop_requested(const atomic_int *cancel)
{
    return cancel && atomic_load_explicit(cancel, memory_order_relaxed) != 0;
}

/* Calls cb with READ/VERIFY progress when the whole percent changes (and at the end). */
static void report_percent(cache_progress_fn cb, void *ctx, enum cache_stage stage,
                           uint64_t done, uint64_t total, unsigned *last)
{
    if (!cb)
        return;
    unsigned pct = (unsigned)(total ? (unsigned __int128)done * 100 / total : 100);
    if (pct != *last) {
        *last = pct;
        cb(ctx, stage, done, total);
    }
}

/* ---- building ----------------------------------------------------------------------- */

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
                      errno_text(-r, ebuf, sizeof ebuf));
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
        if (len > limit || data_bytes > limit - align_up(len, CACHE_ALIGN))
            return cache_fail(errbuf, LD_EFBIG, path, "dataset '%s' is too large to cache",
                              d->name);
        data_bytes += align_up(len, CACHE_ALIGN);
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
    h->label_field = CACHE_NO_LABEL;
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
        if (k > 0 && h->label_field == CACHE_NO_LABEL && strcmp(f->name, "label") == 0 &&
            f->dtype == LD_DTYPE_INT64 && f->ndim == 0 && !f->ragged)
            h->label_field = (uint32_t)k;
    }
    h->header_checksum = XXH3_64bits(h, offsetof(struct cache_header, header_checksum));
    return 0;
}

static void build_report(cache_progress_fn cb, void *ctx, enum cache_stage stage, uint64_t n)
{
    if (cb)
        cb(ctx, stage, n, n);
}

int cache_build(const dataset *d, const char *path, uint64_t fingerprint,
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
    if (align_up(h->max_sample_bytes, CACHE_ALIGN) > b.data_cap)
        b.data_cap = (size_t)align_up(h->max_sample_bytes, 4096);
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
    b.fd = open(b.tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644);
    if (b.fd < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path,
                       "cannot create a file in directory '%s': %s", b.dir,
                       errno_text(e, ebuf, sizeof ebuf));
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
                       b.dir, errno_text(e, ebuf, sizeof ebuf));
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
    report_percent(cb, ctx, CACHE_STAGE_READ, 0, d->count, &last_pct);
    for (uint64_t i = 0; i < d->count; i++) {
        if (stop_requested(cancel)) {
            r = cache_fail(errbuf, LD_ECANCELED, path, "build canceled at sample %" PRIu64
                           " of %" PRIu64, i, d->count);
            goto out;
        }
        uint64_t want = d->ops->raw_bytes(d, i);
        uint64_t padded = align_up(want, CACHE_ALIGN);
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
            .checksum = sample_hash(dst, (size_t)got),
        };
        b.data_fill += (size_t)padded;
        if (b.index_fill == BUILD_INDEX_ENTRIES) {
            r = build_flush_index(&b);
            if (r < 0)
                goto out;
        }
        report_percent(cb, ctx, CACHE_STAGE_READ, i + 1, d->count, &last_pct);
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
    if (stop_requested(cancel)) {
        r = cache_fail(errbuf, LD_ECANCELED, path, "build canceled before the rename");
        goto out;
    }
    build_report(cb, ctx, CACHE_STAGE_RENAME, d->count);
    if (rename(b.tmp, path) < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot rename '%s' to it: %s", b.tmp,
                       errno_text(e, ebuf, sizeof ebuf));
        goto out;
    }
    created = false;
    build_report(cb, ctx, CACHE_STAGE_RENAMED, d->count);
    /* The cache is whole and in place; only its survival of a power cut is in doubt. */
    int sr = sync_dir(b.dir);
    if (sr < 0)
        ld_log(LD_LOG_WARN, "cache '%s': cannot fsync directory '%s': %s", path, b.dir,
               errno_text(-sr, ebuf, sizeof ebuf));
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
                          errno_text(e, ebuf, sizeof ebuf));
    }
    /* The reason beside it is for whoever inspects the file; losing it loses nothing. */
    FILE *f = fopen(why, "we");
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

/* ---- reading ------------------------------------------------------------------------ */

/* The bytes of one row of a fixed field; UINT64_MAX when that overflows. */
static uint64_t fixed_row_bytes(const struct cache_field *f)
{
    uint64_t bytes = proto_dtype_size((int)f->dtype);
    for (uint32_t j = 0; j < f->ndim && j < CACHE_MAX_DIMS; j++)
        if (f->shape[j] < 0 || __builtin_mul_overflow(bytes, (uint64_t)f->shape[j], &bytes))
            return UINT64_MAX;
    return bytes;
}

/* The header's promises about itself, checked once its checksum has matched. */
static int check_header(const struct cache_header *h, const char *path, char *errbuf)
{
    if (h->flags & ~CACHE_FLAGS_KNOWN)
        return cache_fail(errbuf, LD_ECACHEVERSION, path,
                          "uses flags 0x%x that this build does not know", h->flags);
#define BAD(...) return cache_fail(errbuf, LD_ECACHE, path, "header inconsistent: " __VA_ARGS__)
    if (h->count == 0)
        BAD("0 samples");
    if (h->align != CACHE_ALIGN || h->data_offset != CACHE_HEADER_SIZE)
        BAD("alignment %u, data offset %" PRIu64, h->align, h->data_offset);
    if (h->count > UINT64_MAX / CACHE_INDEX_ENTRY_SIZE ||
        h->index_bytes != h->count * CACHE_INDEX_ENTRY_SIZE)
        BAD("index of %" PRIu64 " bytes for %" PRIu64 " samples", h->index_bytes, h->count);
    if (h->data_bytes % CACHE_ALIGN || h->data_bytes > UINT64_MAX / 4 ||
        h->index_offset != h->data_offset + h->data_bytes)
        BAD("index offset %" PRIu64 " after %" PRIu64 " data bytes", h->index_offset,
            h->data_bytes);
    if (h->index_bytes > UINT64_MAX / 4 ||
        h->file_size != h->index_offset + h->index_bytes + CACHE_FOOTER_SIZE)
        BAD("file size %" PRIu64 " does not add up", h->file_size);
    if (h->sample_bytes > h->data_bytes || h->max_sample_bytes > h->sample_bytes)
        BAD("sample bytes %" PRIu64 " (max %" PRIu64 ") in %" PRIu64 " data bytes",
            h->sample_bytes, h->max_sample_bytes, h->data_bytes);
    if (!has_nul(h->kind, sizeof h->kind) || !has_nul(h->name, sizeof h->name) ||
        !has_nul(h->source, sizeof h->source))
        BAD("unterminated name");
    if (h->n_fields < 1 || h->n_fields > LD_MAX_FIELDS)
        BAD("%u fields", h->n_fields);
    for (uint32_t k = 0; k < h->n_fields; k++) {
        const struct cache_field *f = &h->fields[k];
        if (!has_nul(f->name, sizeof f->name) || proto_dtype_size((int)f->dtype) == 0 ||
            f->ndim > LD_MAX_DIMS || f->ragged > 1 ||
            (f->ragged && (f->ndim != 0 || f->dtype != LD_DTYPE_UINT8)))
            BAD("field %u", k);
        for (uint32_t j = 0; j < f->ndim; j++)
            if (f->shape[j] <= 0 || f->shape[j] > (int64_t)1 << 40)
                BAD("field %u has dimension %" PRId64, k, f->shape[j]);
    }
    if (!h->fields[0].ragged != !(h->flags & CACHE_FLAG_RAGGED))
        BAD("flags and field 0 disagree on raggedness");
    if (!h->fields[0].ragged && fixed_row_bytes(&h->fields[0]) != h->max_sample_bytes)
        BAD("field 0 has rows of %" PRIu64 " bytes, samples of %" PRIu64,
            fixed_row_bytes(&h->fields[0]), h->max_sample_bytes);
    if (h->label_field != CACHE_NO_LABEL &&
        (h->label_field == 0 || h->label_field >= h->n_fields ||
         h->fields[h->label_field].dtype != LD_DTYPE_INT64 || h->fields[h->label_field].ndim))
        BAD("label field %u", h->label_field);
#undef BAD
    return 0;
}

/* Every entry must point inside the data section: then no pointer we hand out can
 * leave the mapping, whatever the file says. */
static int check_index(const struct cache *c, char *errbuf)
{
    const struct cache_header *h = c->hdr;
    const uint64_t data_end = h->data_offset + h->data_bytes;
    const uint64_t row = h->fields[0].ragged ? 0 : fixed_row_bytes(&h->fields[0]);
    uint64_t total = 0;

    for (uint64_t i = 0; i < h->count; i++) {
        const struct cache_index_entry *e = &c->index[i];
        if (e->offset % CACHE_ALIGN || e->offset < h->data_offset || e->offset > data_end ||
            e->length > data_end - e->offset || e->length > h->max_sample_bytes ||
            (!h->fields[0].ragged && e->length != row))
            return cache_fail(errbuf, LD_ECACHE, c->path,
                              "index entry %" PRIu64 " (offset %" PRIu64 ", %" PRIu64
                              " bytes) lies outside the data section", i, e->offset, e->length);
        total += e->length;
    }
    if (total != h->sample_bytes)
        return cache_fail(errbuf, LD_ECACHE, c->path, "index holds %" PRIu64
                          " sample bytes, header says %" PRIu64, total, h->sample_bytes);
    return 0;
}

static void fill_meta(struct cache *c)
{
    const struct cache_header *h = c->hdr;
    struct cache_meta *m = &c->meta;
    m->version = h->version;
    m->flags = h->flags;
    m->count = h->count;
    m->fingerprint = h->fingerprint;
    m->file_size = h->file_size;
    m->data_bytes = h->data_bytes;
    m->sample_bytes = h->sample_bytes;
    m->max_sample_bytes = h->max_sample_bytes;
    m->build_time_ns = h->build_time_ns;
    memcpy(m->kind, h->kind, sizeof m->kind);
    memcpy(m->name, h->name, sizeof m->name);
    memcpy(m->source, h->source, sizeof m->source);
    m->n_fields = (int)h->n_fields;
    m->label_field = h->label_field == CACHE_NO_LABEL ? -1 : (int)h->label_field;
    for (int k = 0; k < m->n_fields; k++) {
        const struct cache_field *cf = &h->fields[k];
        struct dataset_field *f = &m->fields[k];
        snprintf(f->name, sizeof f->name, "%s", cf->name);
        f->dtype = (int)cf->dtype;
        f->ndim = (int)cf->ndim;
        for (uint32_t j = 0; j < cf->ndim; j++)
            f->shape[j] = cf->shape[j];
        f->ragged = cf->ragged;
        f->max_item_bytes = k == 0 ? h->max_sample_bytes : cf->max_item_bytes;
    }
}

struct open_checks {
    struct cache *c;
    uint64_t size, expected;
    char *errbuf;
};

static int open_checks(void *arg);

int cache_open(const char *path, uint64_t expected_fingerprint, cache **ret_cache, char *errbuf)
{
    struct cache *c = NULL;
    char ebuf[128];
    int fd = -1, r;

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot open: %s",
                       errno_text(e, ebuf, sizeof ebuf));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot stat: %s",
                       errno_text(e, ebuf, sizeof ebuf));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        r = cache_fail(errbuf, LD_EINVAL, path, "not a regular file");
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < CACHE_HEADER_SIZE + CACHE_FOOTER_SIZE) {
        r = cache_fail(errbuf, LD_ECACHE, path, "truncated: %" PRIu64
                       " bytes, less than a header and a footer", size);
        goto fail;
    }
#if SIZE_MAX < UINT64_MAX
    if (size > SIZE_MAX) {
        r = cache_fail(errbuf, LD_EFBIG, path, "too large to map");
        goto fail;
    }
#endif

    c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        r = cache_fail(errbuf, LD_ENOMEM, path, "out of memory");
        goto fail;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot map %" PRIu64 " bytes: %s", size,
                       errno_text(e, ebuf, sizeof ebuf));
        goto fail;
    }
    close(fd);                      /* the mapping keeps the file */
    fd = -1;
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    c->map = map;
    c->map_len = (size_t)size;
    long page = sysconf(_SC_PAGESIZE);
    c->page = page > 0 ? (size_t)page : 4096;
    c->hdr = (const struct cache_header *)c->map;
    /* The file may be cut short by someone else while we read it: the checks run
     * under the SIGBUS guard, and a fault reads as a truncated file. */
    struct open_checks oc = {.c = c, .size = size, .expected = expected_fingerprint, .errbuf = errbuf};
    r = mapguard_init();
    if (r == 0)
        r = mapguard_run(open_checks, &oc);
    if (r == LD_EIO)
        r = cache_fail(errbuf, LD_ECACHE, path, "truncated while being opened");
    if (r < 0)
        goto fail;
    atomic_init(&c->hit_samples, 0);
    atomic_init(&c->hit_bytes, 0);
    atomic_init(&c->bad, 0);
    atomic_init(&c->bad_index, 0);
    *ret_cache = c;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    cache_free(c);
    return r;
}

static int open_checks(void *arg)
{
    struct open_checks *oc = arg;
    struct cache *c = oc->c;
    const char *path = c->path;
    const uint64_t size = oc->size, expected_fingerprint = oc->expected;
    char *errbuf = oc->errbuf;
    const struct cache_header *h = c->hdr;
    int r;

    /* Magic and version first: a later version may lay out the rest differently. */
    if (memcmp(h->magic, CACHE_MAGIC, sizeof h->magic) != 0) {
        r = cache_fail(errbuf, LD_ECACHE, path, "not a loaderd cache file (bad magic)");
        return r;
    }
    if (h->version != CACHE_VERSION) {
        r = cache_fail(errbuf, LD_ECACHEVERSION, path,
                       "format version %u, this build reads version %u", h->version,
                       CACHE_VERSION);
        return r;
    }
    if (XXH3_64bits(h, offsetof(struct cache_header, header_checksum)) != h->header_checksum) {
        r = cache_fail(errbuf, LD_ECACHE, path, "header checksum mismatch (header corrupt)");
        return r;
    }
    r = check_header(h, path, errbuf);
    if (r < 0)
        return r;
    if (size != h->file_size) {
        if (size < h->file_size)
            r = cache_fail(errbuf, LD_ECACHE, path, "truncated: %" PRIu64
                           " bytes, the header says %" PRIu64, size, h->file_size);
        else
            r = cache_fail(errbuf, LD_ECACHE, path, "%" PRIu64
                           " bytes, longer than the %" PRIu64 " the header says", size,
                           h->file_size);
        return r;
    }

    const struct cache_footer *f = (const struct cache_footer *)(c->map + size - CACHE_FOOTER_SIZE);
    if (memcmp(f->magic, CACHE_FOOTER_MAGIC, sizeof f->magic) != 0) {
        r = cache_fail(errbuf, LD_ECACHE, path, "footer corrupt (bad magic)");
        return r;
    }
    if (XXH3_64bits(f, offsetof(struct cache_footer, footer_checksum)) != f->footer_checksum) {
        r = cache_fail(errbuf, LD_ECACHE, path, "footer checksum mismatch (footer corrupt)");
        return r;
    }
    if (f->count != h->count || f->fingerprint != h->fingerprint ||
        f->index_offset != h->index_offset || f->header_checksum != h->header_checksum ||
        f->file_size != h->file_size) {
        r = cache_fail(errbuf, LD_ECACHE, path, "footer does not match the header");
        return r;
    }
    /* Stale before the index: no need to read a whole index to learn that. */
    if (expected_fingerprint && h->fingerprint != expected_fingerprint) {
        r = cache_fail(errbuf, LD_ECACHESTALE, path,
                       "stale: built from source fingerprint %016" PRIx64
                       ", the source's is now %016" PRIx64, h->fingerprint,
                       expected_fingerprint);
        return r;
    }
    c->index = (const struct cache_index_entry *)(c->map + h->index_offset);
    if (XXH3_64bits(c->index, (size_t)h->index_bytes) != f->index_checksum) {
        r = cache_fail(errbuf, LD_ECACHE, path, "index checksum mismatch (index corrupt)");
        return r;
    }
    r = check_index(c, errbuf);
    if (r == 0)
        fill_meta(c);
    return r;
}

void cache_free(cache *c)
{
    if (!c)
        return;
    if (c->map)
        munmap((void *)c->map, c->map_len);
    free(c->path);
    free(c);
}

static void count_hit(cache *c, uint64_t bytes)
{
    atomic_fetch_add_explicit(&c->hit_samples, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->hit_bytes, bytes, memory_order_relaxed);
}

/* Index entry i, copied out under the guard: the index lives in the mapping too. */
static int entry_at(const struct cache *c, uint64_t i, struct cache_index_entry *ret)
{
    return mapguard_copy(ret, &c->index[i], sizeof *ret);
}

/* Remembers the first failure found while serving; the keeper asks cache_bad(). */
static void mark_bad(struct cache *c, int why, uint64_t index)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->bad, &expected, why))
        atomic_store(&c->bad_index, index);
}

int cache_sample(cache *c, uint64_t index, const void **ret_ptr, uint64_t *ret_len,
                 int64_t *ret_label)
{
    if (index >= c->meta.count)
        return LD_ERANGE;
    struct cache_index_entry e;
    if (entry_at(c, index, &e) < 0) {
        mark_bad(c, CACHE_BAD_TRUNCATED, index);
        return LD_ECACHE;
    }
    count_hit(c, e.length);
    *ret_ptr = c->map + e.offset;
    *ret_len = e.length;
    *ret_label = e.label;
    return 0;
}

int cache_read(cache *c, uint64_t index, void *dst, uint64_t cap, uint64_t *ret_len,
               int64_t *ret_label, bool verify, char *errbuf)
{
    if (index >= c->meta.count)
        return cache_fail(errbuf, LD_ERANGE, c->path, "sample %" PRIu64 " out of range (%"
                          PRIu64 " samples)", index, c->meta.count);
    struct cache_index_entry e;
    if (entry_at(c, index, &e) < 0)
        goto truncated;
    if (e.length > cap)
        return cache_fail(errbuf, LD_ERANGE, c->path, "sample %" PRIu64 " has %" PRIu64
                          " bytes, the buffer %" PRIu64, index, e.length, cap);
    if (mapguard_copy(dst, c->map + e.offset, (size_t)e.length) < 0)
        goto truncated;
    /* The copy is checked, not the mapping: what is served is what was verified, and
     * the bytes are still in this core's cache. */
    if (verify && sample_hash(dst, (size_t)e.length) != e.checksum) {
        mark_bad(c, CACHE_BAD_CHECKSUM, index);
        return cache_fail(errbuf, LD_ECACHE, c->path, "sample %" PRIu64 " (offset %" PRIu64
                          ", %" PRIu64 " bytes): checksum mismatch (data corrupt)", index,
                          e.offset, e.length);
    }
    count_hit(c, e.length);
    *ret_len = e.length;
    *ret_label = e.label;
    return 0;

truncated:
    mark_bad(c, CACHE_BAD_TRUNCATED, index);
    return cache_fail(errbuf, LD_EIO, c->path, "sample %" PRIu64
                      ": the file was truncated while being read", index);
}

int cache_bad(const cache *c, uint64_t *ret_index)
{
    struct cache *m = (struct cache *)c; /* atomics only */
    int why = atomic_load(&m->bad);
    if (why && ret_index)
        *ret_index = atomic_load(&m->bad_index);
    return why;
}

int cache_set_aside_file(const cache *c, const char *reason, char *errbuf)
{
    struct stat st;
    if (stat(c->path, &st) < 0 || st.st_dev != c->dev || st.st_ino != c->ino)
        return cache_fail(errbuf, LD_ENOENT, c->path, "already replaced; nothing to set aside");
    return cache_set_aside(c->path, reason, errbuf);
}

struct advise_range {
    uint64_t start, end;
};

static int range_cmp(const void *a, const void *b)
{
    const struct advise_range *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

static int advise(const cache *c, uint64_t start, uint64_t end)
{
    /* Advice only: a failure costs speed, never correctness, so it is not reported. */
    madvise((void *)(c->map + start), (size_t)(end - start), MADV_WILLNEED);
    return 1;
}

int cache_advise(const cache *c, const uint64_t *indices, size_t n)
{
    const uint64_t page = c->page;
    int calls = 0;
    if (n == 0 || !indices)
        return 0;

    struct advise_range *rs = n <= SIZE_MAX / sizeof *rs ? malloc(n * sizeof *rs) : NULL;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (indices[k] >= c->meta.count)
            continue;
        struct cache_index_entry e;
        if (entry_at(c, indices[k], &e) < 0 || e.length == 0)
            continue;
        struct advise_range rg = {e.offset / page * page, align_up(e.offset + e.length, page)};
        if (rg.end > c->map_len)
            rg.end = c->map_len;
        if (rs)
            rs[m++] = rg;
        else
            calls += advise(c, rg.start, rg.end);   /* no memory: one call per sample */
    }
    if (!rs)
        return calls;
    qsort(rs, m, sizeof *rs, range_cmp);
    for (size_t k = 0; k < m;) {
        struct advise_range cur = rs[k++];
        while (k < m && rs[k].start <= cur.end + ADVISE_GAP) {
            if (rs[k].end > cur.end)
                cur.end = rs[k].end;
            k++;
        }
        calls += advise(c, cur.start, cur.end);
    }
    free(rs);
    return calls;
}

struct hash_job {
    const void *p;
    size_t n;
    uint64_t hash;
};

static int hash_guarded(void *arg)
{
    struct hash_job *j = arg;
    j->hash = sample_hash(j->p, j->n);
    return 0;
}

int cache_verify(const cache *c, cache_progress_fn cb, void *ctx, const atomic_int *cancel,
                 char *errbuf)
{
    const uint64_t count = c->meta.count;
    uint64_t advised = 0;
    unsigned last_pct = UINT_MAX;

    report_percent(cb, ctx, CACHE_STAGE_VERIFY, 0, count, &last_pct);
    for (uint64_t i = 0; i < count; i++) {
        if (stop_requested(cancel))
            return cache_fail(errbuf, LD_ECANCELED, c->path, "verify canceled at sample %"
                              PRIu64 " of %" PRIu64, i, count);
        struct cache_index_entry ent;
        const struct cache_index_entry *e = &ent;
        if (entry_at(c, i, &ent) < 0)
            return cache_fail(errbuf, LD_ECACHE, c->path, "truncated while being verified");
        /* Keep the kernel reading ahead of us, in large ranges. */
        if (e->offset + e->length > advised) {
            uint64_t start = e->offset / c->page * c->page;
            uint64_t end = align_up(e->offset + e->length + VERIFY_AHEAD, c->page);
            if (end > c->map_len)
                end = c->map_len;
            if (end > start)
                advise(c, start, end);
            advised = end;
        }
        struct hash_job hj = {c->map + e->offset, (size_t)e->length, 0};
        if (mapguard_run(hash_guarded, &hj) < 0)
            return cache_fail(errbuf, LD_ECACHE, c->path, "sample %" PRIu64
                              ": the file was truncated while being verified", i);
        if (hj.hash != e->checksum)
            return cache_fail(errbuf, LD_ECACHE, c->path, "sample %" PRIu64 " (offset %" PRIu64
                              ", %" PRIu64 " bytes): checksum mismatch (data corrupt)", i,
                              e->offset, e->length);
        report_percent(cb, ctx, CACHE_STAGE_VERIFY, i + 1, count, &last_pct);
    }
    return 0;
}

const struct cache_meta *cache_meta(const cache *c)
{
    return &c->meta;
}

const char *cache_path(const cache *c)
{
    return c->path;
}

void cache_hits(const cache *c, uint64_t *ret_samples, uint64_t *ret_bytes)
{
    /* The counters are only ever added to; a reader of a const cache may load them. */
    struct cache *m = (struct cache *)c;
    if (ret_samples)
        *ret_samples = atomic_load_explicit(&m->hit_samples, memory_order_relaxed);
    if (ret_bytes)
        *ret_bytes = atomic_load_explicit(&m->hit_bytes, memory_order_relaxed);
}

int cache_info(const cache *c, cJSON *out)
{
    const struct cache_meta *m = &c->meta;
    char hex[17], when[64] = "";
    uint64_t hits, hit_bytes;
    struct tm tm;
    time_t sec = (time_t)(m->build_time_ns / 1000000000u);

    snprintf(hex, sizeof hex, "%016" PRIx64, m->fingerprint);
    if (gmtime_r(&sec, &tm)) {
        size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof when - n, ".%09" PRIu64 "Z", m->build_time_ns % 1000000000u);
    }
    cache_hits(c, &hits, &hit_bytes);

    cJSON *fields = cJSON_CreateArray();
    if (!fields)
        return LD_ENOMEM;
    for (int k = 0; k < m->n_fields; k++) {
        const struct dataset_field *f = &m->fields[k];
        cJSON *jf = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        if (!jf || !shape) {
            cJSON_Delete(jf);
            cJSON_Delete(shape);
            cJSON_Delete(fields);
            return LD_ENOMEM;
        }
        cJSON_AddItemToArray(fields, jf);
        cJSON_AddItemToObject(jf, "shape", shape);
        for (int j = 0; j < f->ndim; j++)
            if (!cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)f->shape[j]))) {
                cJSON_Delete(fields);
                return LD_ENOMEM;
            }
        const char *dtype = proto_dtype_name(f->dtype);
        if (!cJSON_AddStringToObject(jf, "name", f->name) ||
            !cJSON_AddStringToObject(jf, "dtype", dtype ? dtype : "?") ||
            !cJSON_AddBoolToObject(jf, "ragged", f->ragged) ||
            !cJSON_AddNumberToObject(jf, "max_item_bytes", (double)f->max_item_bytes)) {
            cJSON_Delete(fields);
            return LD_ENOMEM;
        }
    }
    if (!cJSON_AddItemToObject(out, "fields", fields)) {
        cJSON_Delete(fields);
        return LD_ENOMEM;
    }
    /* Sizes and counts stay far below 2^53; the fingerprint does not, hence hex. */
    if (!cJSON_AddStringToObject(out, "path", c->path) ||
        !cJSON_AddNumberToObject(out, "version", m->version) ||
        !cJSON_AddNumberToObject(out, "flags", m->flags) ||
        !cJSON_AddNumberToObject(out, "count", (double)m->count) ||
        !cJSON_AddStringToObject(out, "fingerprint", hex) ||
        !cJSON_AddStringToObject(out, "kind", m->kind) ||
        !cJSON_AddStringToObject(out, "name", m->name) ||
        !cJSON_AddStringToObject(out, "source", m->source) ||
        !cJSON_AddNumberToObject(out, "label_field", m->label_field) ||
        !cJSON_AddStringToObject(out, "build_time", when) ||
        !cJSON_AddNumberToObject(out, "build_time_unix", (double)sec) ||
        !cJSON_AddNumberToObject(out, "file_size", (double)m->file_size) ||
        !cJSON_AddNumberToObject(out, "data_bytes", (double)m->data_bytes) ||
        !cJSON_AddNumberToObject(out, "sample_bytes", (double)m->sample_bytes) ||
        !cJSON_AddNumberToObject(out, "max_sample_bytes", (double)m->max_sample_bytes) ||
        !cJSON_AddNumberToObject(out, "hits", (double)hits) ||
        !cJSON_AddNumberToObject(out, "hit_bytes", (double)hit_bytes))
        return LD_ENOMEM;
    return 0;
}
