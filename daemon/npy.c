/* npy — reads numpy's .npy header and the array after it (npy.h).
 *
 * The `files` kind with `format: npy` serves each file's array as a typed field instead
 * of its raw bytes; this module is the only one that knows the file format. The header
 * is a Python dict literal, which we do not evaluate: a small scanner accepts the three
 * keys numpy writes ('descr', 'fortran_order', 'shape'), each once, with single- or
 * double-quoted strings, True/False and a tuple of integers, and refuses everything
 * else. Lengths read from the file are bounded (NPY_HEADER_MAX, NPY_DATA_MAX) and
 * checked against the bytes there before anything is read from them, because the
 * files come from users and a header that lies must cost an error, not memory. */
#include "npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ld_error.h"
#include "proto.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* Our dtypes are little-endian in memory, as numpy's '<' data is on this host. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy data is served as it lies in the file");

int npy_header_length(const void *buf, size_t len, uint64_t *ret_total, char *errbuf)
{
    const uint8_t *b = buf;
    if (len < 8 || memcmp(b, npy_magic, sizeof npy_magic) != 0) {
        ld_errorf(errbuf, "not a .npy file (no \\x93NUMPY magic at its start)");
        return LD_ESAMPLE;
    }
    uint8_t major = b[6], minor = b[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        ld_errorf(errbuf, ".npy format version %u.%u is not one of 1.0, 2.0, 3.0", major, minor);
        return LD_ESAMPLE;
    }
    size_t prefix = major == 1 ? 10 : 12;
    if (len < prefix) {
        ld_errorf(errbuf, "truncated .npy file: %zu bytes, shorter than its %zu-byte prefix", len, prefix);
        return LD_ESAMPLE;
    }
    uint64_t hlen = major == 1 ? (uint64_t)b[8] | (uint64_t)b[9] << 8
                               : (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
    if (hlen > NPY_HEADER_MAX - prefix) {
        ld_errorf(errbuf, ".npy header length %" PRIu64 " is over the %u bytes loaderd reads", hlen,
                  NPY_HEADER_MAX);
        return LD_ESAMPLE;
    }
    *ret_total = prefix + hlen;
    return 0;
}

/* ---- the dict literal ----------------------------------------------------------- */

struct npy_scan {
    const char *p, *end;
    char *errbuf;
};

static void scan_ws(struct npy_scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool scan_eat(struct npy_scan *s, char c)
{
    scan_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* What stands at the scanner, for "expected X at ..." messages. */
static int scan_fail(struct npy_scan *s, const char *base, const char *expected)
{
    if (s->p >= s->end)
        ld_errorf(s->errbuf, ".npy header: expected %s, found the end of the header", expected);
    else
        ld_errorf(s->errbuf, ".npy header: expected %s at byte %td, found '%c'", expected, s->p - base,
                  *s->p >= 0x20 && *s->p < 0x7f ? *s->p : '?');
    return LD_ESAMPLE;
}

/* A quoted string without escapes (numpy never writes one in these values). */
static int scan_string(struct npy_scan *s, const char *base, char *out, size_t cap)
{
    scan_ws(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return scan_fail(s, base, "a quoted string");
    char q = *s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != q) {
        if (*s->p == '\\' || (unsigned char)*s->p < 0x20 || n + 1 >= cap)
            return scan_fail(s, base, "a short string without escapes");
        out[n++] = *s->p++;
    }
    if (s->p >= s->end)
        return scan_fail(s, base, "the string's closing quote");
    s->p++;
    out[n] = '\0';
    return 0;
}

static bool scan_word(struct npy_scan *s, const char *word)
{
    size_t n = strlen(word);
    scan_ws(s);
    if ((size_t)(s->end - s->p) >= n && memcmp(s->p, word, n) == 0) {
        s->p += n;
        return true;
    }
    return false;
}

/* A non-negative decimal integer below 2^62 (Python 2's numpy may append 'L'). */
static int scan_int(struct npy_scan *s, const char *base, int64_t *ret)
{
    scan_ws(s);
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return scan_fail(s, base, "a dimension (a non-negative integer)");
    int64_t v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (v > (INT64_C(1) << 62) / 10) {
            ld_errorf(s->errbuf, ".npy header: a dimension at byte %td is too large", s->p - base);
            return LD_ESAMPLE;
        }
        v = v * 10 + (*s->p++ - '0');
    }
    if (s->p < s->end && *s->p == 'L')
        s->p++;
    *ret = v;
    return 0;
}

static int npy_descr(const char *descr, int *ret_dtype, size_t *ret_size, char *errbuf)
{
    static const struct {
        const char *code;
        int dtype;
    } types[] = {
        {"u1", LD_DTYPE_UINT8}, {"b1", LD_DTYPE_UINT8}, {"u2", LD_DTYPE_UINT16}, {"u4", LD_DTYPE_UINT32},
        {"i4", LD_DTYPE_INT32}, {"i8", LD_DTYPE_INT64}, {"f2", LD_DTYPE_FLOAT16}, {"f4", LD_DTYPE_FLOAT32},
    };
    const char *code = descr;
    char order = '=';
    if (*code == '<' || *code == '>' || *code == '|' || *code == '=')
        order = *code++;
    if (*code == 'O') {
        ld_errorf(errbuf, ".npy dtype '%s' is an object array (pickled Python objects, not data): save a numeric "
                  "array", descr);
        return LD_ENOTSUP;
    }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (strcmp(code, types[i].code) != 0)
            continue;
        size_t size = proto_dtype_size(types[i].dtype);
        if (order == '>' && size > 1) {
            ld_errorf(errbuf, ".npy dtype '%s' is big-endian: save it little-endian (a.astype('<%s'))", descr, code);
            return LD_ENOTSUP;
        }
        *ret_dtype = types[i].dtype;
        *ret_size = size;
        return 0;
    }
    ld_errorf(errbuf, ".npy dtype '%s' is not one loaderd serves (uint8, bool, uint16, uint32, int32, int64, "
              "float16, float32)%s", descr,
              strcmp(code, "f8") == 0 ? ": save float32 (a.astype(np.float32))" : "");
    return LD_ENOTSUP;
}

int npy_parse(const void *buf, size_t len, struct npy_header *ret_header, char *errbuf)
{
    uint64_t total;
    int r = npy_header_length(buf, len, &total, errbuf);
    if (r < 0)
        return r;
    if (total > len) {
        ld_errorf(errbuf, "truncated .npy file: its header claims %" PRIu64 " bytes, the file has %zu", total, len);
        return LD_ESAMPLE;
    }
    const char *base = buf;
    size_t prefix = ((const uint8_t *)buf)[6] == 1 ? 10 : 12;
    struct npy_scan s = {.p = base + prefix, .end = base + total, .errbuf = errbuf};
    struct npy_header h = {.data_offset = total};
    char key[32], descr[64];
    bool have_descr = false, have_order = false, have_shape = false, fortran = false;
    size_t itemsize = 0;

    if (!scan_eat(&s, '{'))
        return scan_fail(&s, base, "'{' (a dict)");
    while (!scan_eat(&s, '}')) {
        if ((r = scan_string(&s, base, key, sizeof key)) < 0)
            return r;
        if (!scan_eat(&s, ':'))
            return scan_fail(&s, base, "':'");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            scan_ws(&s);
            if (s.p < s.end && *s.p == '[') {
                ld_errorf(errbuf, ".npy dtype is structured (a list of named fields): save one plain array per field");
                return LD_ENOTSUP;
            }
            if ((r = scan_string(&s, base, descr, sizeof descr)) < 0)
                return r;
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (scan_word(&s, "True"))
                fortran = true;
            else if (!scan_word(&s, "False"))
                return scan_fail(&s, base, "True or False");
            have_order = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (!scan_eat(&s, '('))
                return scan_fail(&s, base, "'(' (the shape tuple)");
            while (!scan_eat(&s, ')')) {
                int64_t dim = 0;
                if ((r = scan_int(&s, base, &dim)) < 0)
                    return r;
                if (h.ndim == LD_MAX_DIMS) {
                    ld_errorf(errbuf, ".npy shape has more than %d dimensions, the most a field has", LD_MAX_DIMS);
                    return LD_ENOTSUP;
                }
                h.shape[h.ndim++] = dim;
                if (!scan_eat(&s, ',')) {
                    if (!scan_eat(&s, ')'))
                        return scan_fail(&s, base, "',' or ')' in the shape");
                    break;
                }
            }
            have_shape = true;
        } else {
            ld_errorf(errbuf, ".npy header: %s key '%s'",
                      strcmp(key, "descr") && strcmp(key, "fortran_order") && strcmp(key, "shape") ? "unknown"
                                                                                                  : "duplicate",
                      key);
            return LD_ESAMPLE;
        }
        if (!scan_eat(&s, ',')) {
            if (!scan_eat(&s, '}'))
                return scan_fail(&s, base, "',' or '}'");
            break;
        }
    }
    scan_ws(&s);
    if (s.p != s.end)
        return scan_fail(&s, base, "only padding after the dict");
    if (!have_descr || !have_order || !have_shape) {
        ld_errorf(errbuf, ".npy header lacks '%s'", !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
        return LD_ESAMPLE;
    }
    if ((r = npy_descr(descr, &h.dtype, &itemsize, errbuf)) < 0)
        return r;
    /* A Fortran-ordered array of one dimension (or none) lies as a C-ordered one. */
    int big = 0;
    for (int i = 0; i < h.ndim; i++)
        big += h.shape[i] > 1;
    if (fortran && big > 1) {
        ld_errorf(errbuf, ".npy array is in Fortran (column-major) order: save it C-ordered "
                  "(np.save(f, np.ascontiguousarray(a)))");
        return LD_ENOTSUP;
    }
    uint64_t bytes = itemsize;
    for (int i = 0; i < h.ndim; i++) {
        uint64_t dim = (uint64_t)h.shape[i];
        if (dim && bytes > NPY_DATA_MAX / dim) {
            char shape[128];
            ld_errorf(errbuf, ".npy shape %s holds more than %" PRIu64 " bytes", npy_describe(&h, shape, sizeof shape),
                      NPY_DATA_MAX);
            return LD_ESAMPLE;
        }
        bytes *= dim;
    }
    h.data_bytes = bytes;
    *ret_header = h;
    return 0;
}

bool npy_same(const struct npy_header *a, const struct npy_header *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

const char *npy_describe(const struct npy_header *h, char *buf, size_t size)
{
    const char *name = proto_dtype_name(h->dtype);
    int n = snprintf(buf, size, "%s[", name ? name : "?");
    for (int i = 0; i < h->ndim && n >= 0 && (size_t)n < size; i++)
        n += snprintf(buf + n, size - (size_t)n, "%s%" PRId64, i ? "," : "", h->shape[i]);
    if (n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "]");
    return buf;
}

/* ---- files ----------------------------------------------------------------------- */

/* Reads up to n bytes at off; fewer only at the end of the file. */
static int npy_pread(int fd, void *buf, size_t n, uint64_t off, size_t *ret_got, char *errbuf)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
        if (k < 0) {
            if (errno == EINTR)
                continue;
            char ebuf[128];
            int r = ld_from_errno(errno);
            ld_errorf(errbuf, "%s", strerror_r(errno, ebuf, sizeof ebuf));
            return r;
        }
        if (k == 0)
            break;
        got += (size_t)k;
    }
    *ret_got = got;
    return 0;
}

int npy_read_header(int fd, uint64_t file_size, struct npy_header *ret_header, char *errbuf)
{
    /* numpy pads its headers to 64 bytes and rarely needs more than 128: one read of a
     * page nearly always holds them; a longer one is read again whole. */
    uint8_t first[4096];
    uint8_t *big = NULL;
    size_t got;
    uint64_t total;
    size_t want = file_size < sizeof first ? (size_t)file_size : sizeof first;
    int r = npy_pread(fd, first, want, 0, &got, errbuf);
    if (r < 0)
        return r;
    if ((r = npy_header_length(first, got, &total, errbuf)) < 0)
        return r;
    const uint8_t *hdr = first;
    if (total > got) {
        if (total > file_size) {
            ld_errorf(errbuf, "truncated .npy file: its header claims %" PRIu64 " bytes, the file has %" PRIu64,
                      total, file_size);
            return LD_ESAMPLE;
        }
        if (!(big = malloc((size_t)total)))
            return LD_ENOMEM;
        if ((r = npy_pread(fd, big, (size_t)total, 0, &got, errbuf)) < 0)
            goto out;
        hdr = big;
    }
    r = npy_parse(hdr, got, ret_header, errbuf);
out:
    free(big);
    return r;
}

int npy_check(const struct npy_header *h, const struct npy_header *expect, uint64_t size, const char *what,
              char *errbuf)
{
    char want[128], have[128];
    if (!npy_same(h, expect)) {
        ld_errorf(errbuf, ".npy array is %s, the dataset's field is %s", npy_describe(h, have, sizeof have),
                  npy_describe(expect, want, sizeof want));
        return LD_ESAMPLE;
    }
    if (h->data_offset + h->data_bytes != size) {
        ld_errorf(errbuf, ".npy %s has %" PRIu64 " bytes, its header promises %" PRIu64 " (%" PRIu64
                  " of header and %" PRIu64 " of data)", what, size, h->data_offset + h->data_bytes, h->data_offset,
                  h->data_bytes);
        return LD_ESAMPLE;
    }
    return 0;
}

int npy_read(int fd, uint64_t file_size, const struct npy_header *expect, void *dst, char *errbuf)
{
    struct npy_header h;
    int r = npy_read_header(fd, file_size, &h, errbuf);
    if (r < 0)
        return r == LD_ENOTSUP ? LD_ESAMPLE : r;
    if ((r = npy_check(&h, expect, file_size, "file", errbuf)) < 0)
        return r;
    size_t got;
    if ((r = npy_pread(fd, dst, (size_t)h.data_bytes, h.data_offset, &got, errbuf)) < 0)
        return r;
    if (got != h.data_bytes) {
        ld_errorf(errbuf, ".npy file shrank: %zu of its %" PRIu64 " bytes of data are there", got, h.data_bytes);
        return LD_ESAMPLE;
    }
    return 0;
}
