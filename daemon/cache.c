/* cache — reading the single-file dataset cache: open it, check it, serve samples.
 *
 * A dataset of many small files costs an open, a stat and a read per sample, every
 * epoch. Once cache_build() (cache_build.c) has packed them into one file, the daemon
 * serves later epochs, streams and runs from it with cache_sample(): a pointer into a
 * read-only shared mapping, no system call per sample, and cache_advise() turns the
 * sampler's known future order into madvise(WILLNEED) so the kernel reads the next
 * batches' pages before the workers touch them. A cache larger than memory works:
 * nothing is read whole at open except the index.
 *
 * cache_open() trusts nothing: a chain of checksums (footer -> header, index; index ->
 * each sample) and consistency checks on every offset mean that a torn, truncated or
 * flipped file is refused with a specific message, and that a pointer cache_sample()
 * hands out always lies inside the mapping. Sample bytes are checked by cache_verify()
 * and, on request, by cache_read(). The format is in cache.h and
 * docs/cache-format.md; cache_report.c shows an open cache as JSON. */
#include "cache_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mapguard.h"

/* Advised ranges closer than this are merged: reading a few pages more costs less
 * than another system call, and the kernel reads around a range anyway. */
#define ADVISE_GAP (64u << 10)
/* cache_verify() keeps this much ahead of itself asked for. */
#define VERIFY_AHEAD (32u << 20)

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

int cache_fail(char *errbuf, int code, const char *path, const char *fmt, ...)
{
    char msg[LD_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ld_errorf(errbuf, "cache '%s': %s", path, msg);
    return code;
}

static bool has_nul(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

/* ---- opening ------------------------------------------------------------------------ */

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

/* cache_open and cache_open_at once the file is open (fd, or -1 with errno e): the
 * checks, the mapping. Takes fd. */
static int cache_open_fd(int fd, int open_errno, const char *path, uint64_t expected_fingerprint, cache **ret_cache,
                         char *errbuf)
{
    struct cache *c = NULL;
    char ebuf[128];
    int r;

    if (fd < 0) {
        if (open_errno == ELOOP)
            r = cache_fail(errbuf, LD_ECACHE, path, "is a symbolic link, which a cache written beneath its "
                           "directory never is: not followed");
        else
            r = cache_fail(errbuf, ld_from_errno(open_errno), path, "cannot open: %s",
                           cache_errno_text(open_errno, ebuf, sizeof ebuf));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        r = cache_fail(errbuf, ld_from_errno(e), path, "cannot stat: %s",
                       cache_errno_text(e, ebuf, sizeof ebuf));
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
                       cache_errno_text(e, ebuf, sizeof ebuf));
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

int cache_open(const char *path, uint64_t expected_fingerprint, cache **ret_cache, char *errbuf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    return cache_open_fd(fd, fd < 0 ? errno : 0, path, expected_fingerprint, ret_cache, errbuf);
}

int cache_open_at(int dirfd, const char *name, const char *shown, uint64_t expected_fingerprint,
                  cache **ret_cache, char *errbuf)
{
    /* O_NONBLOCK: a FIFO in its place must not hang the opener (it is refused as not a
     * regular file); it changes nothing for the mapping of a regular file. */
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
    return cache_open_fd(fd, fd < 0 ? errno : 0, shown, expected_fingerprint, ret_cache, errbuf);
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

/* ---- serving ------------------------------------------------------------------------ */

static void count_hit(cache *c, uint64_t bytes)
{
    atomic_fetch_add_explicit(&c->hit_samples, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->hit_bytes, bytes, memory_order_relaxed);
}

/* Sample i's index entry, read under the guard and checked against the mapping: the
 * index was checked at open (its checksum), but a file rewritten in place after that
 * must not send a read outside the mapping, where the guard would not help. LD_EIO when
 * the entry's page is gone (the file shrank), LD_ECACHE when it points outside the
 * file. */
static int entry_at(const struct cache *c, uint64_t i, struct cache_index_entry *ret)
{
    if (mapguard_copy(ret, &c->index[i], sizeof *ret) < 0)
        return LD_EIO;
    if (ret->offset > c->map_len || ret->length > c->map_len - ret->offset)
        return LD_ECACHE;
    return 0;
}

/* The message for an entry entry_at found outside the file. */
static int entry_outside(const struct cache *c, uint64_t i, const struct cache_index_entry *e, char *errbuf)
{
    return cache_fail(errbuf, LD_ECACHE, c->path, "sample %" PRIu64 ": its index entry (offset %"
                      PRIu64 ", %" PRIu64 " bytes) lies outside the file's %" PRIu64
                      " bytes: the file was changed in place (data corrupt)", i, e->offset,
                      e->length, c->map_len);
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
    int r = entry_at(c, index, &e);
    if (r < 0) {
        mark_bad(c, r == LD_EIO ? CACHE_BAD_TRUNCATED : CACHE_BAD_INDEX, index);
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
    struct cache_tally t = {0, 0};
    int rc = cache_read_tally(c, index, dst, cap, ret_len, ret_label, verify, &t, errbuf);
    cache_count_tally(c, &t);
    return rc;
}

void cache_count_tally(cache *c, struct cache_tally *tally)
{
    if (tally->samples) {
        atomic_fetch_add_explicit(&c->hit_samples, tally->samples, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->hit_bytes, tally->bytes, memory_order_relaxed);
    }
    *tally = (struct cache_tally){0, 0};
}

int cache_read_tally(cache *c, uint64_t index, void *dst, uint64_t cap, uint64_t *ret_len,
                     int64_t *ret_label, bool verify, struct cache_tally *tally, char *errbuf)
{
    if (index >= c->meta.count)
        return cache_fail(errbuf, LD_ERANGE, c->path, "sample %" PRIu64 " out of range (%"
                          PRIu64 " samples)", index, c->meta.count);
    struct cache_index_entry e;
    int r = entry_at(c, index, &e);
    if (r == LD_ECACHE) {
        mark_bad(c, CACHE_BAD_INDEX, index);
        return entry_outside(c, index, &e, errbuf);
    }
    if (r < 0)
        goto truncated;
    if (e.length > cap)
        return cache_fail(errbuf, LD_ERANGE, c->path, "sample %" PRIu64 " has %" PRIu64
                          " bytes, the buffer %" PRIu64, index, e.length, cap);
    if (mapguard_copy(dst, c->map + e.offset, (size_t)e.length) < 0)
        goto truncated;
    /* The copy is checked, not the mapping: what is served is what was verified, and
     * the bytes are still in this core's cache. */
    if (verify && cache_hash_sample(dst, (size_t)e.length) != e.checksum) {
        mark_bad(c, CACHE_BAD_CHECKSUM, index);
        return cache_fail(errbuf, LD_ECACHE, c->path, "sample %" PRIu64 " (offset %" PRIu64
                          ", %" PRIu64 " bytes): checksum mismatch (data corrupt)", index,
                          e.offset, e.length);
    }
    tally->samples++;
    tally->bytes += e.length;
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

/* ---- read-ahead --------------------------------------------------------------------- */

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
        struct advise_range rg = {e.offset / page * page, cache_align_up(e.offset + e.length, page)};
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

struct prefetch_job {
    const cache *c;
    const uint64_t *indices;
    size_t n;
};

/* Under the guard: reads each entry (in the CPU's cache by now, or on its way) and
 * prefetches its data's lines. */
static int prefetch_data(void *arg)
{
    const struct prefetch_job *j = arg;
    for (size_t k = 0; k < j->n; k++) {
        if (j->indices[k] >= j->c->meta.count)
            continue;
        const struct cache_index_entry *e = &j->c->index[j->indices[k]];
        uint64_t off = e->offset;
        uint64_t end = off + (e->length < DATASET_PREFETCH_BYTES ? e->length : DATASET_PREFETCH_BYTES);
        if (end > j->c->map_len)
            end = j->c->map_len;
        for (uint64_t at = off; at < end; at += 64)
            __builtin_prefetch(j->c->map + at);
    }
    return 0;
}

void cache_prefetch(const cache *c, const uint64_t *indices, size_t n)
{
    /* A prefetch never faults: the entries need no guard, their contents do. */
    for (size_t k = 0; k < n; k++)
        if (indices[k] < c->meta.count)
            __builtin_prefetch(&c->index[indices[k]]);
    struct prefetch_job j = {c, indices, n};
    (void)mapguard_run(prefetch_data, &j);
}

/* ---- verifying ---------------------------------------------------------------------- */

struct hash_job {
    const void *p;
    size_t n;
    uint64_t hash;
};

static int hash_guarded(void *arg)
{
    struct hash_job *j = arg;
    j->hash = cache_hash_sample(j->p, j->n);
    return 0;
}

int cache_verify(const cache *c, cache_progress_fn cb, void *ctx, const atomic_int *cancel,
                 char *errbuf)
{
    const uint64_t count = c->meta.count;
    uint64_t advised = 0;
    unsigned last_pct = UINT_MAX;

    cache_report_percent(cb, ctx, CACHE_STAGE_VERIFY, 0, count, &last_pct);
    for (uint64_t i = 0; i < count; i++) {
        if (cache_stop_requested(cancel))
            return cache_fail(errbuf, LD_ECANCELED, c->path, "verify canceled at sample %"
                              PRIu64 " of %" PRIu64, i, count);
        struct cache_index_entry ent;
        const struct cache_index_entry *e = &ent;
        int r = entry_at(c, i, &ent);
        if (r == LD_ECACHE)
            return entry_outside(c, i, &ent, errbuf);
        if (r < 0)
            return cache_fail(errbuf, LD_ECACHE, c->path, "truncated while being verified");
        /* Keep the kernel reading ahead of us, in large ranges. */
        if (e->offset + e->length > advised) {
            uint64_t start = e->offset / c->page * c->page;
            uint64_t end = cache_align_up(e->offset + e->length + VERIFY_AHEAD, c->page);
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
        cache_report_percent(cb, ctx, CACHE_STAGE_VERIFY, i + 1, count, &last_pct);
    }
    return 0;
}

/* ---- accessors ---------------------------------------------------------------------- */

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
