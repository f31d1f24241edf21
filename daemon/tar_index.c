/* tar_index — scanning shards into member indexes, and the index file. See tar_index.h.
 *
 * The file is written whole (it is small next to the shards: some 40 bytes per member)
 * to a temporary name in the same directory and renamed over the old one, so a reader
 * sees an old index or a new one, never half of one; the trailing hash catches the rest
 * (a disk that lost a block, a file from another build). Loading checks every length
 * against the bytes left before it is used. */
#include "tar_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena.h"
#include "ld_error.h"
#include "ld_wire.h"
#include "tar.h"

static const char tar_index_magic[8] = "LDTARIX1";
/* The largest index file read (a corrupt length never makes us allocate more). */
#define TAR_INDEX_FILE_MAX (UINT64_C(1) << 34)

void tar_shard_index_clear(struct tar_shard_index *s)
{
    if (!s)
        return;
    free(s->name);
    free(s->entries);
    free(s->pool);
    memset(s, 0, sizeof *s);
}

void tar_index_free(struct tar_shard_index *shards, size_t n)
{
    for (size_t i = 0; shards && i < n; i++)
        tar_shard_index_clear(&shards[i]);
    free(shards);
}

/* Adds one member (its name, and its bytes when given) to s. */
static int tar_index_add(struct tar_shard_index *s, const char *name, size_t name_len, uint64_t offset,
                         uint64_t size, const void *data)
{
    uint64_t off, doff = TAR_INDEX_NONE;
    if (arena_grow((void **)&s->entries, &s->cap_entries, s->n_entries + 1, sizeof *s->entries) < 0 ||
        arena_push(&s->pool, &s->pool_len, &s->pool_cap, name, name_len, &off) < 0 ||
        (data && arena_push(&s->pool, &s->pool_len, &s->pool_cap, data, (size_t)size, &doff) < 0))
        return LD_ENOMEM;
    if (s->pool_len > UINT32_MAX)
        return LD_ELIMIT;
    s->entries[s->n_entries++] = (struct tar_entry){offset, size, (uint32_t)off, (uint32_t)doff};
    return 0;
}

struct scan_ctx {
    int fd;
    struct tar_shard_index *s;
    char *errbuf;
};

static int tar_index_member(void *arg, const struct tar_member *m)
{
    struct scan_ctx *c = arg;
    uint8_t small[TAR_INDEX_INLINE];
    bool keep = m->size <= TAR_INDEX_INLINE;
    for (uint64_t done = 0; keep && done < m->size;) {
        ssize_t n = pread(c->fd, small + done, m->size - done, (off_t)(m->offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ld_errorf(c->errbuf, "offset %" PRIu64 ": cannot read member '%s': %s", m->header_offset, m->name,
                      n < 0 ? strerror(errno) : "the file shrank");
            return n < 0 ? ld_from_errno(errno) : LD_EDATASET;
        }
        done += (uint64_t)n;
    }
    int r = tar_index_add(c->s, m->name, strlen(m->name), m->offset, m->size, keep ? small : NULL);
    if (r < 0)
        ld_errorf(c->errbuf, "offset %" PRIu64 ": %s", m->header_offset,
                  r == LD_ELIMIT ? "more than 4 GiB of member names in one shard" : "out of memory");
    return r;
}

int tar_index_scan(int fd, uint64_t size, struct tar_shard_index *s, char *errbuf)
{
    struct scan_ctx c = {fd, s, errbuf};
    return tar_walk(fd, size, tar_index_member, &c, errbuf);
}

/* ---- the file ------------------------------------------------------------------ */

struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};

static void put(struct wbuf *w, const void *v, size_t n)
{
    if (w->oom || arena_grow((void **)&w->p, &w->cap, w->len + n, 1) < 0) {
        w->oom = true;
        return;
    }
    memcpy(w->p + w->len, v, n);
    w->len += n;
}

static void put_u32(struct wbuf *w, uint32_t v)
{
    put(w, &v, sizeof v);
}

static void put_u64(struct wbuf *w, uint64_t v)
{
    put(w, &v, sizeof v);
}

int tar_index_save(const char *path, const struct tar_shard_index *shards, size_t n, char *errbuf)
{
    struct wbuf w = {0};
    char *tmp = NULL;
    int fd = -1, r = 0;
    put(&w, tar_index_magic, sizeof tar_index_magic);
    put_u32(&w, TAR_INDEX_VERSION);
    put_u32(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct tar_shard_index *s = &shards[i];
        put_u32(&w, (uint32_t)strlen(s->name));
        put(&w, s->name, strlen(s->name));
        put_u64(&w, s->size);
        put_u64(&w, (uint64_t)s->mtime.tv_sec);
        put_u64(&w, (uint64_t)s->mtime.tv_nsec);
        put_u64(&w, s->n_entries);
        for (size_t k = 0; k < s->n_entries; k++) {
            const struct tar_entry *e = &s->entries[k];
            const char *name = s->pool + e->name_off;
            put_u64(&w, e->offset);
            put_u64(&w, e->size);
            put_u32(&w, (uint32_t)strlen(name));
            put(&w, name, strlen(name));
            if (e->size <= TAR_INDEX_INLINE)
                put(&w, s->pool + e->data_off, (size_t)e->size);
        }
    }
    put_u64(&w, w.oom ? 0 : XXH3_64bits(w.p, w.len));
    if (w.oom || asprintf(&tmp, "%s.tmp.%d", path, (int)getpid()) < 0) {
        tmp = NULL;
        ld_errorf(errbuf, "out of memory");
        r = LD_ENOMEM;
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = ld_from_errno(errno);
        ld_errorf(errbuf, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    for (size_t done = 0; done < w.len;) {
        ssize_t k = write(fd, w.p + done, w.len - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            r = ld_from_errno(errno);
            ld_errorf(errbuf, "cannot write '%s': %s", tmp, strerror(errno));
            goto out;
        }
        done += (size_t)k;
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        fd = -1;
        r = ld_from_errno(errno);
        ld_errorf(errbuf, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        r = ld_from_errno(errno);
        ld_errorf(errbuf, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    }
out:
    if (fd >= 0)
        close(fd);
    if (r < 0 && tmp)
        unlink(tmp);
    free(tmp);
    free(w.p);
    return r;
}

struct rbuf {
    const uint8_t *p;
    size_t len, at;
};

static bool take(struct rbuf *b, void *dst, size_t n)
{
    if (n > b->len - b->at)
        return false;
    memcpy(dst, b->p + b->at, n);
    b->at += n;
    return true;
}

static bool take_u32(struct rbuf *b, uint32_t *v)
{
    return take(b, v, sizeof *v);
}

static bool take_u64(struct rbuf *b, uint64_t *v)
{
    return take(b, v, sizeof *v);
}

/* A length-prefixed string: a pointer into the buffer and its length. */
static bool take_str(struct rbuf *b, const char **s, uint32_t *len)
{
    if (!take_u32(b, len) || *len == 0 || *len > b->len - b->at || memchr(b->p + b->at, 0, *len))
        return false;
    *s = (const char *)b->p + b->at;
    b->at += *len;
    return true;
}

/* Parses the file's bytes; false for anything malformed (*ret holds what was read). */
static int tar_index_parse(struct rbuf *b, struct tar_shard_index **ret, size_t *ret_n, char *errbuf)
{
    char magic[8];
    uint32_t version, n;
    if (!take(b, magic, sizeof magic) || memcmp(magic, tar_index_magic, sizeof magic) != 0 || !take_u32(b, &version) ||
        version != TAR_INDEX_VERSION || !take_u32(b, &n)) {
        ld_errorf(errbuf, "not an index of version %u", TAR_INDEX_VERSION);
        return LD_EDATASET;
    }
    if (n > b->len / 16) {
        ld_errorf(errbuf, "corrupt: %u shards", n);
        return LD_EDATASET;
    }
    struct tar_shard_index *shards = calloc(n ? n : 1, sizeof *shards);
    if (!shards)
        return LD_ENOMEM;
    *ret = shards;
    for (uint32_t i = 0; i < n; i++) {
        struct tar_shard_index *s = &shards[i];
        const char *name;
        uint32_t nl;
        uint64_t sec, nsec, count;
        *ret_n = i + 1;
        if (!take_str(b, &name, &nl) || !take_u64(b, &s->size) || !take_u64(b, &sec) || !take_u64(b, &nsec) ||
            !take_u64(b, &count) || count > (b->len - b->at) / 20)
            goto corrupt;
        if (!(s->name = strndup(name, nl)))
            return LD_ENOMEM;
        s->mtime.tv_sec = (time_t)sec;
        s->mtime.tv_nsec = (long)nsec;
        for (uint64_t k = 0; k < count; k++) {
            uint64_t off, size;
            const char *mn;
            uint32_t ml;
            if (!take_u64(b, &off) || !take_u64(b, &size) || !take_str(b, &mn, &ml) || off > s->size ||
                size > s->size - off)
                goto corrupt;
            const void *data = NULL;
            if (size <= TAR_INDEX_INLINE) {
                if (size > b->len - b->at)
                    goto corrupt;
                data = b->p + b->at;
                b->at += (size_t)size;
            }
            int r = tar_index_add(s, mn, ml, off, size, data);
            if (r < 0)
                return r;
        }
    }
    if (b->at != b->len) {
        ld_errorf(errbuf, "corrupt: %zu bytes after the last shard", b->len - b->at);
        return LD_EDATASET;
    }
    return 0;
corrupt:
    ld_errorf(errbuf, "corrupt at byte %zu", b->at);
    return LD_EDATASET;
}

int tar_index_load(const char *path, struct tar_shard_index **ret_shards, size_t *ret_n, char *errbuf)
{
    struct tar_shard_index *shards = NULL;
    size_t n = 0;
    uint8_t *buf = NULL;
    int r = 0;
    errbuf[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        ld_errorf(errbuf, "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
    if ((uint64_t)st.st_size < 32 || (uint64_t)st.st_size > TAR_INDEX_FILE_MAX) {
        ld_errorf(errbuf, "'%s': %lld bytes is not the size of an index", path, (long long)st.st_size);
        goto out;
    }
    size_t len = (size_t)st.st_size;
    if (!(buf = malloc(len))) {
        r = LD_ENOMEM;
        goto out;
    }
    for (size_t done = 0; done < len;) {
        ssize_t k = pread(fd, buf + done, len - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            ld_errorf(errbuf, "cannot read '%s': %s", path, k < 0 ? strerror(errno) : "it shrank");
            goto out;
        }
        done += (size_t)k;
    }
    uint64_t sum;
    memcpy(&sum, buf + len - sizeof sum, sizeof sum);
    if (XXH3_64bits(buf, len - sizeof sum) != sum) {
        ld_errorf(errbuf, "'%s': the checksum does not match", path);
        goto out;
    }
    struct rbuf b = {buf, len - sizeof sum, 0};
    char why[LD_ERRMSG_MAX];
    r = tar_index_parse(&b, &shards, &n, why);
    if (r == LD_EDATASET) {
        ld_errorf(errbuf, "'%s': %s", path, why);
        r = 0;
        tar_index_free(shards, n);
        shards = NULL;
        n = 0;
    }
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    if (r < 0) {
        tar_index_free(shards, n);
        return r;
    }
    *ret_shards = shards;
    *ret_n = n;
    return 0;
}
