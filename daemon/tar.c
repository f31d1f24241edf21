/* tar — the member list of a tar archive, from its headers alone. See tar.h.
 *
 * A tar archive is a sequence of 512-byte header blocks, each followed by its member's
 * data rounded up to whole blocks. The ustar header carries the name (100 bytes, plus a
 * 155-byte prefix), the size in octal (or base-256 for large members: GNU and star), a
 * type and a checksum (the byte sum of the header with the checksum field read as
 * spaces). Longer names and sizes travel in a preceding entry: a pax extended header
 * ('x': "LEN key=value\n" records) or a GNU long name ('L': the name as data). A pax
 * global header ('g') and everything that is not a regular file is stepped over.
 *
 * Headers are read through a window of WINDOW bytes, so an archive of small members
 * (token files, labels) is read with few system calls; a window never reaches past the
 * file's size, and no offset is formed before it has been checked not to overflow. */
#include "tar.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ld_error.h"

#define WINDOW (64u * 1024u)

struct tar_reader {
    int fd;
    uint64_t file_size;
    uint8_t *buf;                   /* WINDOW bytes */
    uint64_t buf_off, buf_len;      /* what buf holds */
};

/* Reads exactly len bytes at off into dst (the caller checked off + len <= file size). */
static int tar_pread(int fd, void *dst, uint64_t len, uint64_t off)
{
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pread(fd, (uint8_t *)dst + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ld_from_errno(errno);
        if (n == 0)
            return LD_EDATASET; /* the file shrank while we read it */
        done += (uint64_t)n;
    }
    return 0;
}

/* The header block at off, from the window (refilled from off when it does not hold it). */
static int tar_block(struct tar_reader *r, uint64_t off, const uint8_t **ret)
{
    if (off < r->buf_off || off + TAR_BLOCK > r->buf_off + r->buf_len) {
        uint64_t len = r->file_size - off < WINDOW ? r->file_size - off : WINDOW;
        int rc = tar_pread(r->fd, r->buf, len, off);
        if (rc < 0)
            return rc;
        r->buf_off = off;
        r->buf_len = len;
    }
    *ret = r->buf + (off - r->buf_off);
    return 0;
}

/* An octal field (leading spaces, digits, then NUL or space to the end), or GNU's
 * base-256 (top bit of the first byte set, big-endian, positive only). */
static bool tar_number(const uint8_t *p, size_t len, uint64_t *ret)
{
    uint64_t v = 0;
    if (p[0] & 0x80) {
        if (p[0] != 0x80)
            return false; /* negative, or more than 63 bits */
        for (size_t i = 1; i < len; i++) {
            if (v >> 55)
                return false;
            v = v << 8 | p[i];
        }
        *ret = v;
        return v <= (uint64_t)INT64_MAX;
    }
    size_t i = 0;
    while (i < len && p[i] == ' ')
        i++;
    size_t digits = 0;
    for (; i < len && p[i] >= '0' && p[i] <= '7'; i++, digits++) {
        if (v >> 60)
            return false;
        v = v << 3 | (uint64_t)(p[i] - '0');
    }
    for (; i < len; i++)
        if (p[i] != ' ' && p[i] != '\0')
            return false;
    *ret = v;
    return digits > 0;
}

static bool tar_zero(const uint8_t *b)
{
    for (size_t i = 0; i < TAR_BLOCK; i++)
        if (b[i])
            return false;
    return true;
}

/* The checksum: unsigned byte sum with the field as spaces; some old tars summed
 * signed bytes, which is accepted too. */
static bool tar_checksum_ok(const uint8_t *b)
{
    uint64_t want;
    if (!tar_number(b + 148, 8, &want))
        return false;
    uint64_t u = 0;
    int64_t s = 0;
    for (size_t i = 0; i < TAR_BLOCK; i++) {
        uint8_t c = i >= 148 && i < 156 ? ' ' : b[i];
        u += c;
        s += (int8_t)c;
    }
    return u == want || (uint64_t)s == want;
}

/* A field of at most len bytes that is NUL-terminated only when shorter. */
static size_t tar_strnlen(const uint8_t *p, size_t len)
{
    const uint8_t *z = memchr(p, 0, len);
    return z ? (size_t)(z - p) : len;
}

/* The pax records of one extended header (len bytes at p): `path` and `size`. */
static int tar_pax(const uint8_t *p, uint64_t len, uint64_t at, char *path, bool *has_path, uint64_t *size,
                   bool *has_size, char *errbuf)
{
    uint64_t i = 0;
    while (i < len) {
        /* A run of NULs pads the last block of some writers' headers. */
        if (p[i] == '\0')
            break;
        uint64_t rec = 0, j = i;
        while (j < len && p[j] >= '0' && p[j] <= '9' && j - i < 10)
            rec = rec * 10 + (uint64_t)(p[j++] - '0');
        if (j == i || j >= len || p[j] != ' ' || rec < (j - i) + 3 || rec > len - i || p[i + rec - 1] != '\n') {
            ld_errorf(errbuf, "offset %" PRIu64 ": malformed pax extended header record at byte %" PRIu64, at, i);
            return LD_EDATASET;
        }
        const uint8_t *kv = p + j + 1, *end = p + i + rec - 1;
        const uint8_t *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq) {
            ld_errorf(errbuf, "offset %" PRIu64 ": pax extended header record without '=' at byte %" PRIu64, at, i);
            return LD_EDATASET;
        }
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            if (vlen == 0 || vlen >= TAR_NAME_MAX || memchr(eq + 1, 0, vlen)) {
                ld_errorf(errbuf, "offset %" PRIu64 ": pax path of %zu bytes (1 to %u, no NUL)", at, vlen,
                          TAR_NAME_MAX - 1);
                return LD_EDATASET;
            }
            memcpy(path, eq + 1, vlen);
            path[vlen] = '\0';
            *has_path = true;
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            bool ok = vlen > 0 && vlen <= 19;
            for (size_t k = 0; ok && k < vlen; k++) {
                ok = eq[1 + k] >= '0' && eq[1 + k] <= '9';
                v = v * 10 + (uint64_t)(eq[1 + k] - '0');
            }
            if (!ok) {
                ld_errorf(errbuf, "offset %" PRIu64 ": pax size '%.*s' is not a decimal number", at,
                          (int)(vlen < 40 ? vlen : 40), (const char *)eq + 1);
                return LD_EDATASET;
            }
            *size = v;
            *has_size = true;
        }
        i += rec;
    }
    return 0;
}

int tar_walk(int fd, uint64_t file_size, tar_member_fn fn, void *ctx, char *errbuf)
{
    struct tar_reader r = {.fd = fd, .file_size = file_size, .buf = malloc(WINDOW)};
    char *path = malloc(TAR_NAME_MAX), *name = malloc(TAR_NAME_MAX);
    uint8_t *ext = NULL;
    bool has_path = false, has_size = false;
    uint64_t pax_size = 0, first = 0, off = 0;
    int rc = 0;

    if (!r.buf || !path || !name) {
        ld_errorf(errbuf, "out of memory");
        rc = LD_ENOMEM;
        goto out;
    }
    for (;;) {
        if (off == file_size)
            break; /* no end marker: accepted, as GNU tar does */
        if (file_size - off < TAR_BLOCK) {
            ld_errorf(errbuf, "offset %" PRIu64 ": truncated: %" PRIu64 " bytes where a 512-byte header should be",
                      off, file_size - off);
            rc = LD_EDATASET;
            goto out;
        }
        const uint8_t *b;
        if ((rc = tar_block(&r, off, &b)) < 0) {
            ld_errorf(errbuf, "offset %" PRIu64 ": cannot read a header: %s", off, ld_strerror(rc));
            goto out;
        }
        if (tar_zero(b))
            break; /* the end marker */
        if (!tar_checksum_ok(b)) {
            ld_errorf(errbuf, "offset %" PRIu64 ": not a tar header (bad checksum)", off);
            rc = LD_EDATASET;
            goto out;
        }
        uint64_t size;
        if (!tar_number(b + 124, 12, &size)) {
            ld_errorf(errbuf, "offset %" PRIu64 ": bad size field in the header", off);
            rc = LD_EDATASET;
            goto out;
        }
        char type = (char)b[156];
        if (type == '0' || type == '\0' || type == '7') {
            if (has_size)
                size = pax_size;
        } else if (type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6') {
            size = 0; /* links, devices, directories and FIFOs have no data in the archive */
        }
        uint64_t data = off + TAR_BLOCK;
        if (size > file_size - data) {
            ld_errorf(errbuf, "offset %" PRIu64 ": truncated: the member claims %" PRIu64 " bytes, the file has %"
                      PRIu64 " left", off, size, file_size - data);
            rc = LD_EDATASET;
            goto out;
        }
        uint64_t padded = size + (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK;
        uint64_t next = data + (padded <= file_size - data ? padded : file_size - data);
        if (!has_path && !has_size && !ext)
            first = off;
        if (type == 'x' || type == 'L') {
            if (size > (type == 'x' ? TAR_PAX_MAX : TAR_NAME_MAX - 1)) {
                ld_errorf(errbuf, "offset %" PRIu64 ": %s of %" PRIu64 " bytes (at most %u)", off,
                          type == 'x' ? "pax extended header" : "GNU long name", size,
                          type == 'x' ? TAR_PAX_MAX : TAR_NAME_MAX - 1);
                rc = LD_EDATASET;
                goto out;
            }
            uint8_t *p = malloc(size ? size : 1);
            if (!p) {
                ld_errorf(errbuf, "out of memory");
                rc = LD_ENOMEM;
                goto out;
            }
            free(ext);
            ext = p;
            if ((rc = tar_pread(fd, p, size, data)) < 0) {
                ld_errorf(errbuf, "offset %" PRIu64 ": cannot read an extended header: %s", off, ld_strerror(rc));
                goto out;
            }
            if (type == 'x') {
                rc = tar_pax(p, size, off, path, &has_path, &pax_size, &has_size, errbuf);
                if (rc < 0)
                    goto out;
            } else {
                size_t n = tar_strnlen(p, (size_t)size);
                if (n == 0) {
                    ld_errorf(errbuf, "offset %" PRIu64 ": empty GNU long name", off);
                    rc = LD_EDATASET;
                    goto out;
                }
                memcpy(path, p, n);
                path[n] = '\0';
                has_path = true;
            }
            off = next;
            continue;
        }
        if (type == '0' || type == '\0' || type == '7') {
            const char *full = path;
            if (!has_path) {
                size_t nl = tar_strnlen(b, 100), pl = 0;
                /* The prefix is ustar's ("ustar\0"); GNU's "ustar  " header keeps other
                 * data there. */
                if (memcmp(b + 257, "ustar\0", 6) == 0)
                    pl = tar_strnlen(b + 345, 155);
                if (pl) {
                    memcpy(name, b + 345, pl);
                    name[pl] = '/';
                    memcpy(name + pl + 1, b, nl);
                    name[pl + 1 + nl] = '\0';
                } else {
                    memcpy(name, b, nl);
                    name[nl] = '\0';
                }
                full = name;
            }
            if (!full[0]) {
                ld_errorf(errbuf, "offset %" PRIu64 ": a member with an empty name", off);
                rc = LD_EDATASET;
                goto out;
            }
            struct tar_member m = {.name = full, .header_offset = first, .offset = data, .size = size};
            if ((rc = fn(ctx, &m)) < 0)
                goto out;
        }
        /* A global pax header ('g'), a directory, a link...: stepped over; what a
         * preceding pax header or long name said applied to this entry only. */
        has_path = has_size = false;
        free(ext);
        ext = NULL;
        if (padded > file_size - data) {
            ld_errorf(errbuf, "offset %" PRIu64 ": truncated: the member's last block is cut short", off);
            rc = LD_EDATASET;
            goto out;
        }
        off = next;
    }
    if (has_path || has_size) {
        ld_errorf(errbuf, "offset %" PRIu64 ": the archive ends after an extended header, without its member", off);
        rc = LD_EDATASET;
    }
out:
    free(ext);
    free(r.buf);
    free(path);
    free(name);
    return rc;
}
