/* proto — the control channel's wire format, shared by the daemon, the client library
 * and loaderctl. Three things live here: the incremental frame reader and the encoder
 * (4-byte big-endian length + one JSON object), the strict JSON decoder with checked
 * field getters that turn every bad request into a specific LD_EBADMSG or LD_EFIELD
 * message, and the reply helpers that give a code the same meaning on both ends of the
 * socket. It is library code: it never prints and never aborts on bad input, because
 * the input comes from another process.
 */
#include "proto.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- dtypes ----------------------------------------------------------------------- */

struct dtype_info {
    const char *name;
    size_t size;
};

/* Indexed by enum ld_dtype; slot 0 is unused so that 0 is never a valid dtype. */
static const struct dtype_info dtype_table[] = {
    [LD_DTYPE_UINT8] = {"uint8", 1},     [LD_DTYPE_UINT16] = {"uint16", 2},
    [LD_DTYPE_UINT32] = {"uint32", 4},   [LD_DTYPE_INT32] = {"int32", 4},
    [LD_DTYPE_INT64] = {"int64", 8},     [LD_DTYPE_FLOAT16] = {"float16", 2},
    [LD_DTYPE_FLOAT32] = {"float32", 4},
};
#define DTYPE_COUNT ((int)(sizeof(dtype_table) / sizeof(dtype_table[0])))

const char *proto_dtype_name(int dtype)
{
    if (dtype <= 0 || dtype >= DTYPE_COUNT)
        return NULL;
    return dtype_table[dtype].name;
}

int proto_dtype_from_name(const char *name)
{
    if (!name)
        return LD_EINVAL;
    for (int d = 1; d < DTYPE_COUNT; d++)
        if (dtype_table[d].name && strcmp(name, dtype_table[d].name) == 0)
            return d;
    return LD_EINVAL;
}

size_t proto_dtype_size(int dtype)
{
    if (dtype <= 0 || dtype >= DTYPE_COUNT)
        return 0;
    return dtype_table[dtype].size;
}

/* ---- framing ------------------------------------------------------------------------ */

/* A buffer bigger than this is given back once it holds nothing, so that one large
 * frame does not pin its memory for the life of a connection. */
#define READER_KEEP_BYTES (64u * 1024u)
#define READER_MIN_CAP 4096u

struct proto_reader {
    uint32_t max_frame;
    int error;        /* 0, or the code every later call returns */
    uint8_t *buf;     /* bytes received: [start, end) not yet returned as frames */
    size_t cap;
    size_t start;
    size_t end;
    size_t checked;   /* offset of the first frame header not yet checked against max_frame */
    char *frame;      /* NUL-terminated copy of the frame last returned by next() */
    size_t frame_cap;
};

static uint32_t read_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

void proto_frame_header(uint32_t len, uint8_t out[LD_FRAME_HEADER_SIZE])
{
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
}

int proto_reader_new(uint32_t max_frame, proto_reader **ret_reader)
{
    if (max_frame == 0 || max_frame > LD_FRAME_MAX_LIMIT || !ret_reader)
        return LD_EINVAL;
    proto_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return LD_ENOMEM;
    r->max_frame = max_frame;
    *ret_reader = r;
    return 0;
}

void proto_reader_free(proto_reader *r)
{
    if (!r)
        return;
    free(r->buf);
    free(r->frame);
    free(r);
}

size_t proto_reader_pending(const proto_reader *r)
{
    return r ? r->end - r->start : 0;
}

/* Walks the headers of every frame that is now complete, so that an oversized header is
 * reported by the feed that brings it in, not only when the frames before it have been
 * taken out. Each header is looked at once per feed at most: the walk resumes where it
 * stopped. */
static int reader_check_headers(proto_reader *r)
{
    while (r->end - r->checked >= LD_FRAME_HEADER_SIZE) {
        uint32_t len = read_be32(r->buf + r->checked);
        if (len > r->max_frame) {
            r->error = LD_EMSGSIZE;
            return r->error;
        }
        if (r->end - r->checked - LD_FRAME_HEADER_SIZE < len)
            break;
        r->checked += LD_FRAME_HEADER_SIZE + (size_t)len;
    }
    return 0;
}

/* Makes room for `len` more bytes. Consumed bytes are dropped by moving only what is
 * still pending (at most one partial frame when the caller drains frames after each
 * feed), so many small frames cost O(total bytes), not O(n^2). */
static int reader_reserve(proto_reader *r, size_t len)
{
    size_t pending = r->end - r->start;
    if (len > SIZE_MAX / 2 - pending)
        return LD_ENOMEM;
    size_t need = pending + len;

    if (r->cap - r->end >= len)
        return 0;
    /* Compact only when it frees at least half the buffer, so that each byte moved pays
     * for at least one byte of new room; otherwise grow. */
    if (r->start > 0 && r->cap >= need && pending <= r->cap / 2) {
        memmove(r->buf, r->buf + r->start, pending);
        r->checked -= r->start;
        r->end = pending;
        r->start = 0;
        return 0;
    }

    size_t cap = r->cap > READER_MIN_CAP ? r->cap : READER_MIN_CAP;
    while (cap < need || pending > cap / 2)
        cap *= 2;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return LD_ENOMEM;
    if (pending)
        memcpy(buf, r->buf + r->start, pending);
    free(r->buf);
    r->buf = buf;
    r->cap = cap;
    r->checked -= r->start;
    r->end = pending;
    r->start = 0;
    return 0;
}

int proto_reader_feed(proto_reader *r, const void *data, size_t len)
{
    if (!r || (!data && len))
        return LD_EINVAL;
    if (r->error)
        return r->error;
    if (len == 0)
        return 0;
    int rc = reader_reserve(r, len);
    if (rc < 0)
        return rc;
    memcpy(r->buf + r->end, data, len);
    r->end += len;
    return reader_check_headers(r);
}

int proto_reader_next(proto_reader *r, const char **ret_payload, size_t *ret_len)
{
    if (!r || !ret_payload || !ret_len)
        return LD_EINVAL;
    if (r->error)
        return r->error;

    /* The previous frame's copy is no longer promised to the caller. */
    if (r->frame_cap > READER_KEEP_BYTES) {
        free(r->frame);
        r->frame = NULL;
        r->frame_cap = 0;
    }

    size_t pending = r->end - r->start;
    if (pending < LD_FRAME_HEADER_SIZE)
        return 0;
    uint32_t len = read_be32(r->buf + r->start);
    if (len > r->max_frame) { /* reader_check_headers saw it already; kept for safety */
        r->error = LD_EMSGSIZE;
        return r->error;
    }
    if (pending - LD_FRAME_HEADER_SIZE < len)
        return 0;

    if (r->frame_cap < (size_t)len + 1) {
        size_t cap = (size_t)len + 1 > 256 ? (size_t)len + 1 : 256;
        char *frame = malloc(cap);
        if (!frame)
            return LD_ENOMEM;
        free(r->frame);
        r->frame = frame;
        r->frame_cap = cap;
    }
    memcpy(r->frame, r->buf + r->start + LD_FRAME_HEADER_SIZE, len);
    r->frame[len] = '\0';
    r->start += LD_FRAME_HEADER_SIZE + (size_t)len;

    if (r->start == r->end) {
        r->start = r->end = r->checked = 0;
        if (r->cap > READER_KEEP_BYTES) {
            free(r->buf);
            r->buf = NULL;
            r->cap = 0;
        }
    }
    *ret_payload = r->frame;
    *ret_len = len;
    return 1;
}

/* cJSON 1.7.15 prints a number that is not an int with "%1.15g" whenever that reads
 * back within a relative epsilon, so 9007199254740991 goes out as 9.00719925474099e+15
 * and an id or seed near 2^53 arrives changed. A number whose "%1.15g" is not exact is
 * therefore sent as raw text that is. */
static bool number_is_lossy(double d)
{
    if (!isfinite(d))
        return false; /* cJSON prints null, which is all JSON can say */
    char buf[32];
    snprintf(buf, sizeof(buf), "%1.15g", d);
    return strtod(buf, NULL) != d;
}

static bool tree_has_lossy_number(const cJSON *item)
{
    for (; item; item = item->next) {
        if (cJSON_IsNumber(item) && number_is_lossy(item->valuedouble))
            return true;
        if (item->child && tree_has_lossy_number(item->child))
            return true;
    }
    return false;
}

/* Rewrites, in a private copy, each lossy number as a raw item holding its exact text. */
static int tree_fix_numbers(cJSON *item)
{
    for (; item; item = item->next) {
        if (item->child && tree_fix_numbers(item->child) < 0)
            return LD_ENOMEM;
        if (!cJSON_IsNumber(item) || !number_is_lossy(item->valuedouble))
            continue;
        double d = item->valuedouble;
        char text[32];
        if (d == trunc(d) && fabs(d) < 9.2e18)
            snprintf(text, sizeof(text), "%" PRId64, (int64_t)d);
        else
            snprintf(text, sizeof(text), "%.17g", d);
        char *raw = cJSON_malloc(strlen(text) + 1);
        if (!raw)
            return LD_ENOMEM;
        memcpy(raw, text, strlen(text) + 1);
        item->type = cJSON_Raw | (item->type & cJSON_StringIsConst);
        item->valuestring = raw;
    }
    return 0;
}

int proto_encode(const cJSON *msg, char **ret_frame, size_t *ret_len)
{
    if (!msg || !ret_frame || !ret_len)
        return LD_EINVAL;
    int rc = 0;
    cJSON *copy = NULL;
    char *text = NULL;
    char *frame = NULL;
    if (tree_has_lossy_number(msg)) {
        copy = cJSON_Duplicate(msg, true);
        if (!copy || tree_fix_numbers(copy) < 0) {
            rc = LD_ENOMEM;
            goto out;
        }
    }
    /* cJSON's printer takes a non-const item but does not modify it. */
    text = cJSON_PrintUnformatted(copy ? copy : (cJSON *)msg);
    if (!text) {
        rc = LD_ENOMEM;
        goto out;
    }
    size_t len = strlen(text);
    if (len > LD_FRAME_MAX_LIMIT) {
        rc = LD_EMSGSIZE;
        goto out;
    }
    frame = malloc(LD_FRAME_HEADER_SIZE + len + 1);
    if (!frame) {
        rc = LD_ENOMEM;
        goto out;
    }
    proto_frame_header((uint32_t)len, (uint8_t *)frame);
    memcpy(frame + LD_FRAME_HEADER_SIZE, text, len + 1);
    *ret_frame = frame;
    *ret_len = LD_FRAME_HEADER_SIZE + len;
    frame = NULL;
out:
    free(frame);
    cJSON_free(text);
    cJSON_Delete(copy);
    return rc;
}

/* ---- JSON decode ---------------------------------------------------------------------- */

/* What a value is, for "got ..." in messages. Numbers are shown by value, since
 * "got 0" or "got 1.5" says more than "got a number". */
static const char *describe(const cJSON *v, char *buf, size_t size)
{
    if (!v)
        return "nothing";
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!isfinite(d))
            return "a non-finite number";
        if (d == trunc(d) && fabs(d) <= (double)LD_JSON_SAFE_INT) {
            snprintf(buf, size, "%" PRId64, (int64_t)d);
            return buf;
        }
        /* The shortest of %.15g and %.17g that reads back as the same double. */
        snprintf(buf, size, "%.15g", d);
        if (strtod(buf, NULL) != d)
            snprintf(buf, size, "%.17g", d);
        return buf;
    }
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNull(v))
        return "null";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "an unknown value";
}

static const char *kind_of(const cJSON *v)
{
    if (cJSON_IsNumber(v))
        return "a number";
    char unused[8];
    return describe(v, unused, sizeof(unused));
}

/* Rejects, before cJSON sees the payload, what cJSON would accept or handle badly:
 * nesting deeper than LD_JSON_MAX_DEPTH (cJSON recurses once per level, so a frame of
 * '[' bytes would cost deep recursion before failing), raw control bytes (cJSON takes
 * any byte <= 32 as whitespace and copies raw control bytes into strings, neither of
 * which is JSON) and the \u0000 escape (a C string cannot carry it: cJSON would cut the
 * string short, silently changing a name). Brackets inside strings do not count; a
 * backslash escapes the next byte. */
static int scan_payload(const char *payload, size_t len, char *errbuf)
{
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)payload[i];
        if (in_string) {
            if (c < 0x20) {
                ld_errorf(errbuf, "invalid JSON at byte %zu: control character in a string", i);
                return LD_EBADMSG;
            }
            if (c == '"') {
                in_string = false;
            } else if (c == '\\' && i + 1 < len) {
                if (payload[i + 1] == 'u' && len - i >= 6 && memcmp(payload + i + 2, "0000", 4) == 0) {
                    ld_errorf(errbuf, "invalid JSON at byte %zu: \\u0000 is not allowed in a string", i);
                    return LD_EBADMSG;
                }
                i++;
            }
            continue;
        }
        switch (c) {
        case '"':
            in_string = true;
            break;
        case '{':
        case '[':
            if (++depth > LD_JSON_MAX_DEPTH) {
                ld_errorf(errbuf, "nesting deeper than %d levels at byte %zu", LD_JSON_MAX_DEPTH, i);
                return LD_EBADMSG;
            }
            break;
        case '}':
        case ']':
            if (depth > 0)
                depth--;
            break;
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            break;
        default:
            if (c < 0x20) {
                ld_errorf(errbuf, "invalid JSON at byte %zu: control character", i);
                return LD_EBADMSG;
            }
            break;
        }
    }
    return 0;
}

/* cJSON resets a global error position on every parse, even a successful one: two
 * threads parsing at once (a client library used from several trainer threads) would
 * race on it. The lock makes that harmless and costs nothing next to the parse. */
static pthread_mutex_t parse_lock = PTHREAD_MUTEX_INITIALIZER;

static bool is_json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int proto_parse(const char *payload, size_t len, cJSON **ret_obj, char *errbuf)
{
    if (!payload || !ret_obj) {
        ld_errorf(errbuf, "no payload");
        return LD_EINVAL;
    }
    if (len == 0) {
        ld_errorf(errbuf, "empty payload: expected a JSON object");
        return LD_EBADMSG;
    }
    if (len > LD_FRAME_MAX_LIMIT) {
        ld_errorf(errbuf, "payload of %zu bytes is over the %u-byte limit", len, LD_FRAME_MAX_LIMIT);
        return LD_EMSGSIZE;
    }
    int rc = scan_payload(payload, len, errbuf);
    if (rc < 0)
        return rc;

    /* Parsing exactly `len` bytes, then checking the rest ourselves, keeps cJSON from
     * reading past the payload and puts the position of trailing garbage in the
     * message; require_null_terminated would reject the same inputs. */
    const char *end = NULL;
    pthread_mutex_lock(&parse_lock);
    cJSON *obj = cJSON_ParseWithLengthOpts(payload, len, &end, false);
    pthread_mutex_unlock(&parse_lock);
    if (!obj) {
        size_t at = end && end >= payload && end <= payload + len ? (size_t)(end - payload) : 0;
        ld_errorf(errbuf, "invalid JSON at byte %zu", at);
        rc = LD_EBADMSG;
        goto out;
    }
    size_t at = (size_t)(end - payload);
    while (at < len && is_json_space(payload[at]))
        at++;
    if (at < len) {
        ld_errorf(errbuf, "invalid JSON at byte %zu: trailing data after the JSON value", at);
        rc = LD_EBADMSG;
        goto out;
    }
    if (!cJSON_IsObject(obj)) {
        ld_errorf(errbuf, "expected a JSON object, got %s", kind_of(obj));
        rc = LD_EBADMSG;
        goto out;
    }
    *ret_obj = obj;
    obj = NULL;
out:
    cJSON_Delete(obj);
    return rc;
}

/* Finds `key` in obj. 0 with *ret_item NULL when absent (or null and null_is_absent);
 * LD_EINVAL when obj is not an object, which is the caller's bug, not the peer's. */
static int lookup(const cJSON *obj, const char *key, bool null_is_absent, const cJSON **ret_item,
                  char *errbuf)
{
    if (!cJSON_IsObject(obj) || !key) {
        ld_errorf(errbuf, "field '%s': looked up in something that is not an object", key ? key : "?");
        return LD_EINVAL;
    }
    /* JSON keys are case-sensitive; cJSON_GetObjectItem is not. */
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (null_is_absent && cJSON_IsNull(item))
        item = NULL;
    *ret_item = item;
    return 0;
}

/* 0 and the value when `item` is an integral number in [min, max] and within what a
 * double holds exactly (a larger integer has already lost precision in the parser). */
static int int_value(const cJSON *item, int64_t min, int64_t max, int64_t *ret)
{
    if (!cJSON_IsNumber(item))
        return LD_EFIELD;
    double d = item->valuedouble;
    if (!isfinite(d) || d != trunc(d) || fabs(d) > (double)LD_JSON_SAFE_INT)
        return LD_EFIELD;
    int64_t v = (int64_t)d;
    if (v < min || v > max)
        return LD_EFIELD;
    *ret = v;
    return 0;
}

static int check_int(const cJSON *item, const char *key, int64_t min, int64_t max, int64_t *ret,
                     char *errbuf)
{
    int64_t v;
    if (int_value(item, min, max, &v) < 0) {
        char buf[64];
        ld_errorf(errbuf, "field '%s': expected an integer in [%" PRId64 ", %" PRId64 "], got %s", key,
                min, max, describe(item, buf, sizeof(buf)));
        return LD_EFIELD;
    }
    *ret = v;
    return 0;
}

int proto_get_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t *ret, char *errbuf)
{
    const cJSON *item = NULL;
    int rc = lookup(obj, key, false, &item, errbuf);
    if (rc < 0)
        return rc;
    if (min > max || !ret) {
        ld_errorf(errbuf, "field '%s': empty range [%" PRId64 ", %" PRId64 "]", key, min, max);
        return LD_EINVAL;
    }
    if (!item) {
        ld_errorf(errbuf, "field '%s': missing", key);
        return LD_EFIELD;
    }
    return check_int(item, key, min, max, ret, errbuf);
}

int proto_opt_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t def, int64_t *ret,
                  char *errbuf)
{
    const cJSON *item = NULL;
    int rc = lookup(obj, key, true, &item, errbuf);
    if (rc < 0)
        return rc;
    if (min > max || !ret) {
        ld_errorf(errbuf, "field '%s': empty range [%" PRId64 ", %" PRId64 "]", key, min, max);
        return LD_EINVAL;
    }
    if (!item) {
        *ret = def;
        return 0;
    }
    return check_int(item, key, min, max, ret, errbuf);
}

static int check_bool(const cJSON *item, const char *key, bool *ret, char *errbuf)
{
    if (!cJSON_IsBool(item)) {
        ld_errorf(errbuf, "field '%s': expected a boolean, got %s", key, kind_of(item));
        return LD_EFIELD;
    }
    *ret = cJSON_IsTrue(item);
    return 0;
}

int proto_epoch_span(int64_t epoch, int64_t epochs, int64_t *ret_epochs, char *errbuf)
{
    if (epoch < 0 || epoch > LD_EPOCH_MAX || epochs < 0 || epochs > LD_EPOCH_MAX || !ret_epochs) {
        ld_errorf(errbuf, "field 'epoch' / 'epochs': expected integers in [0, %lld]", (long long)LD_EPOCH_MAX);
        return LD_EFIELD;
    }
    int64_t room = LD_EPOCH_MAX - epoch + 1; /* epochs from `epoch` up to LD_EPOCH_MAX */
    if (epochs > room) {
        ld_errorf(errbuf,
                  "field 'epochs': %" PRId64 " epochs from epoch %" PRId64 " run past epoch %lld (2^53 - 1), "
                  "the largest the protocol carries exactly; at most %" PRId64 " fit",
                  epochs, epoch, (long long)LD_EPOCH_MAX, room);
        return LD_EFIELD;
    }
    *ret_epochs = epochs ? epochs : room;
    return 0;
}

int proto_get_bool(const cJSON *obj, const char *key, bool *ret, char *errbuf)
{
    const cJSON *item = NULL;
    int rc = lookup(obj, key, false, &item, errbuf);
    if (rc < 0)
        return rc;
    if (!ret)
        return LD_EINVAL;
    if (!item) {
        ld_errorf(errbuf, "field '%s': missing", key);
        return LD_EFIELD;
    }
    return check_bool(item, key, ret, errbuf);
}

int proto_opt_bool(const cJSON *obj, const char *key, bool def, bool *ret, char *errbuf)
{
    const cJSON *item = NULL;
    int rc = lookup(obj, key, true, &item, errbuf);
    if (rc < 0)
        return rc;
    if (!ret)
        return LD_EINVAL;
    if (!item) {
        *ret = def;
        return 0;
    }
    return check_bool(item, key, ret, errbuf);
}

/* Length of the valid UTF-8 sequence at s (of n bytes available), 0 if it is not one.
 * Overlong forms and surrogates are refused, so that every name we echo back to other
 * clients is valid JSON text. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

int proto_get_str(const cJSON *obj, const char *key, size_t maxlen, const char **ret, char *errbuf)
{
    const cJSON *item = NULL;
    int rc = lookup(obj, key, false, &item, errbuf);
    if (rc < 0)
        return rc;
    if (!ret)
        return LD_EINVAL;
    if (!item) {
        ld_errorf(errbuf, "field '%s': missing", key);
        return LD_EFIELD;
    }
    if (!cJSON_IsString(item) || !item->valuestring) {
        ld_errorf(errbuf, "field '%s': expected a string, got %s", key, kind_of(item));
        return LD_EFIELD;
    }
    const unsigned char *s = (const unsigned char *)item->valuestring;
    size_t len = strlen(item->valuestring);
    if (len == 0) {
        ld_errorf(errbuf, "field '%s': expected a non-empty string", key);
        return LD_EFIELD;
    }
    if (len > maxlen) {
        ld_errorf(errbuf, "field '%s': expected at most %zu bytes, got %zu", key, maxlen, len);
        return LD_EFIELD;
    }
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x20 || s[i] == 0x7f) {
            ld_errorf(errbuf, "field '%s': control character at byte %zu", key, i);
            return LD_EFIELD;
        }
        size_t n = utf8_seq(s + i, len - i);
        if (n == 0) {
            ld_errorf(errbuf, "field '%s': invalid UTF-8 at byte %zu", key, i);
            return LD_EFIELD;
        }
        i += n;
    }
    *ret = item->valuestring;
    return 0;
}

/* ---- replies ------------------------------------------------------------------------- */

/* {"id": id} or {"id": null} for a request whose id could not be read. */
static cJSON *reply_new(int64_t id, bool ok)
{
    cJSON *reply = cJSON_CreateObject();
    cJSON *idv = id >= 0 && id <= LD_JSON_SAFE_INT ? cJSON_CreateNumber((double)id) : cJSON_CreateNull();
    if (!reply || !idv || !cJSON_AddItemToObject(reply, "id", idv))
        goto fail;
    idv = NULL; /* owned by reply now */
    if (!cJSON_AddBoolToObject(reply, "ok", ok))
        goto fail;
    return reply;
fail:
    cJSON_Delete(idv);
    cJSON_Delete(reply);
    return NULL;
}

cJSON *proto_reply_ok(int64_t id)
{
    return reply_new(id, true);
}

cJSON *proto_reply_error(int64_t id, int code, const char *message)
{
    cJSON *reply = reply_new(id, false);
    if (!reply)
        return NULL;
    cJSON *err = cJSON_AddObjectToObject(reply, "error");
    if (!err || !cJSON_AddStringToObject(err, "code", ld_error_name(code)) ||
        !cJSON_AddNumberToObject(err, "errno", code) ||
        !cJSON_AddStringToObject(err, "message", message ? message : ld_strerror(code))) {
        cJSON_Delete(reply);
        return NULL;
    }
    return reply;
}

int proto_reply_status(const cJSON *reply, char *errbuf)
{
    if (!cJSON_IsObject(reply)) {
        ld_errorf(errbuf, "malformed reply: not a JSON object");
        return LD_EPROTO;
    }
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(reply, "ok");
    if (!cJSON_IsBool(ok)) {
        ld_errorf(errbuf, "malformed reply: 'ok' is missing or not a boolean");
        return LD_EPROTO;
    }
    if (cJSON_IsTrue(ok)) {
        ld_errorf(errbuf, "%s", "");
        return 0;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(reply, "error");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(err, "code");
    if (!cJSON_IsObject(err) || !cJSON_IsString(name) || !name->valuestring) {
        ld_errorf(errbuf, "malformed reply: 'ok' is false without an 'error' object with a string 'code'");
        return LD_EPROTO;
    }
    int code = ld_error_from_name(name->valuestring);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    const char *text = cJSON_IsString(msg) && msg->valuestring ? msg->valuestring : NULL;
    if (code == 0 || (code == LD_EPROTO && strcmp(name->valuestring, ld_error_name(LD_EPROTO)) != 0)) {
        /* A name we do not know (a newer server) or "ok" in a failure: keep what the
         * server said, since it is all the user will get. */
        ld_errorf(errbuf, "malformed reply: unknown error code '%s'%s%s", name->valuestring,
                text ? ": " : "", text ? text : "");
        return LD_EPROTO;
    }
    ld_errorf(errbuf, "%s", text ? text : ld_strerror(code));
    return code;
}

int64_t proto_request_id(const cJSON *req)
{
    if (!cJSON_IsObject(req))
        return -1;
    int64_t id;
    if (int_value(cJSON_GetObjectItemCaseSensitive(req, "id"), 0, LD_JSON_SAFE_INT, &id) < 0)
        return -1;
    return id;
}
