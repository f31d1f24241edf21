/* Unit tests for proto: framing (split, joined, oversized, truncated and empty frames),
 * the strict JSON decoder (garbage, non-objects, deep nesting, trailing data), every
 * field getter's type, range and missing-field errors with their messages, reply round
 * trips through the encoder and the reader, the error table and the dtype table. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>
#include <unistd.h>
#include "proto.h"
#include "proto_socket.h"

/* ---- helpers ---------------------------------------------------------------------- */

/* A frame for `payload` in a malloc'd buffer of exactly the frame's size. */
static uint8_t *make_frame(const char *payload, size_t *ret_len)
{
    size_t len = strlen(payload);
    uint8_t *f = malloc(LD_FRAME_HEADER_SIZE + len);
    assert_non_null(f);
    proto_frame_header((uint32_t)len, f);
    memcpy(f + LD_FRAME_HEADER_SIZE, payload, len);
    *ret_len = LD_FRAME_HEADER_SIZE + len;
    return f;
}

/* Parses a copy of `text` in a buffer of exactly strlen+1 bytes, so ASan catches a read
 * past the payload's NUL. */
static int parse_text(const char *text, cJSON **ret_obj, char *errbuf)
{
    size_t len = strlen(text);
    char *copy = malloc(len + 1);
    assert_non_null(copy);
    memcpy(copy, text, len + 1);
    int rc = proto_parse(copy, len, ret_obj, errbuf);
    free(copy);
    return rc;
}

static cJSON *parse_ok(const char *text)
{
    char err[LD_ERRMSG_MAX] = "";
    cJSON *obj = NULL;
    int rc = parse_text(text, &obj, err);
    if (rc != 0)
        print_error("parse of %s failed: %s\n", text, err);
    assert_int_equal(rc, 0);
    assert_non_null(obj);
    return obj;
}

/* Expects proto_parse to fail with `code`, with `needle` in the message, leaving the
 * out-parameter untouched. */
static void parse_fails(const char *text, size_t len, int code, const char *needle)
{
    char err[LD_ERRMSG_MAX] = "";
    char *copy = malloc(len + 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    copy[len] = '\0';
    cJSON *sentinel = (cJSON *)(uintptr_t)0x1;
    cJSON *obj = sentinel;
    int rc = proto_parse(copy, len, &obj, err);
    free(copy);
    if (rc != code || !strstr(err, needle))
        print_error("input %.60s: rc %d, message '%s', wanted '%s'\n", text, rc, err, needle);
    assert_int_equal(rc, code);
    assert_ptr_equal(obj, sentinel);
    assert_non_null(strstr(err, needle));
}

static void assert_msg(const char *err, const char *want)
{
    if (strcmp(err, want) != 0)
        print_error("message '%s', wanted '%s'\n", err, want);
    assert_string_equal(err, want);
}

/* Sends `msg` through the encoder, the reader and the parser, as the socket would. */
static cJSON *round_trip(const cJSON *msg, char *text_out, size_t text_size)
{
    char *frame = NULL;
    size_t flen = 0;
    assert_int_equal(proto_encode(msg, &frame, &flen), 0);
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    assert_int_equal(proto_reader_feed(r, frame, flen), 0);
    const char *payload;
    size_t len;
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, flen - LD_FRAME_HEADER_SIZE);
    if (text_out)
        snprintf(text_out, text_size, "%s", payload);
    char err[LD_ERRMSG_MAX];
    cJSON *back = NULL;
    assert_int_equal(proto_parse(payload, len, &back, err), 0);
    proto_reader_free(r);
    free(frame);
    return back;
}

/* ---- framing ---------------------------------------------------------------------- */

static void test_frame_header_is_big_endian(void **state)
{
    (void)state;
    uint8_t h[LD_FRAME_HEADER_SIZE];
    proto_frame_header(0x01020304u, h);
    assert_int_equal(h[0], 1);
    assert_int_equal(h[1], 2);
    assert_int_equal(h[2], 3);
    assert_int_equal(h[3], 4);
    proto_frame_header(5, h);
    assert_memory_equal(h, "\0\0\0\5", 4);
}

static void test_reader_new_rejects_bad_limits(void **state)
{
    (void)state;
    proto_reader *r = (proto_reader *)(uintptr_t)0x1;
    assert_int_equal(proto_reader_new(0, &r), LD_EINVAL);
    assert_int_equal(proto_reader_new(LD_FRAME_MAX_LIMIT + 1, &r), LD_EINVAL);
    assert_ptr_equal(r, (proto_reader *)(uintptr_t)0x1);
    assert_int_equal(proto_reader_new(LD_FRAME_MAX_LIMIT, &r), 0);
    proto_reader_free(r);
    proto_reader_free(NULL);
}

static void test_reader_byte_by_byte(void **state)
{
    (void)state;
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    const char *text = "{\"op\":\"hello\",\"id\":0,\"version\":1}";
    size_t flen;
    uint8_t *f = make_frame(text, &flen);
    const char *payload = NULL;
    size_t len = 0;

    for (size_t i = 0; i < flen; i++) {
        assert_int_equal(proto_reader_next(r, &payload, &len), 0);
        assert_null(payload);
        assert_int_equal(proto_reader_pending(r), i);
        assert_int_equal(proto_reader_feed(r, f + i, 1), 0);
    }
    assert_int_equal(proto_reader_pending(r), flen);
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(payload, text, len);
    assert_int_equal(payload[len], '\0');
    assert_int_equal(proto_reader_pending(r), 0);
    assert_int_equal(proto_reader_next(r, &payload, &len), 0);

    /* The same frame again, to show that the reader is reusable after a frame. */
    assert_int_equal(proto_reader_feed(r, f, flen), 0);
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_string_equal(payload, text);
    free(f);
    proto_reader_free(r);
}

static void test_reader_joined_and_split_frames(void **state)
{
    (void)state;
    const char *texts[] = {"{\"id\":1}", "{\"id\":2,\"op\":\"next\"}", "{}", "{\"id\":4,\"x\":[1,2,3]}"};
    size_t n = sizeof(texts) / sizeof(texts[0]);
    uint8_t stream[256];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t flen;
        uint8_t *f = make_frame(texts[i], &flen);
        memcpy(stream + total, f, flen);
        total += flen;
        free(f);
    }

    /* Every chunk size from 1 byte to all of it at once (several frames in one feed). */
    for (size_t chunk = 1; chunk <= total; chunk++) {
        proto_reader *r = NULL;
        assert_int_equal(proto_reader_new(LD_FRAME_MIN_LIMIT, &r), 0);
        size_t got = 0;
        for (size_t off = 0; off < total; off += chunk) {
            size_t take = total - off < chunk ? total - off : chunk;
            assert_int_equal(proto_reader_feed(r, stream + off, take), 0);
            const char *payload;
            size_t len;
            int rc;
            while ((rc = proto_reader_next(r, &payload, &len)) == 1) {
                assert_true(got < n);
                assert_int_equal(len, strlen(texts[got]));
                assert_string_equal(payload, texts[got]);
                got++;
            }
            assert_int_equal(rc, 0);
        }
        assert_int_equal(got, n);
        assert_int_equal(proto_reader_pending(r), 0);
        proto_reader_free(r);
    }
}

static void test_reader_oversize_header(void **state)
{
    (void)state;
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_MIN_LIMIT, &r), 0);
    uint8_t h[LD_FRAME_HEADER_SIZE];
    proto_frame_header(LD_FRAME_MIN_LIMIT + 1, h);
    /* Three header bytes say nothing yet; the fourth makes it oversized. */
    assert_int_equal(proto_reader_feed(r, h, 3), 0);
    assert_int_equal(proto_reader_feed(r, h + 3, 1), LD_EMSGSIZE);
    const char *payload = NULL;
    size_t len = 0;
    assert_int_equal(proto_reader_next(r, &payload, &len), LD_EMSGSIZE);
    assert_null(payload);
    /* The reader stays failed, even for well-formed input. */
    size_t flen;
    uint8_t *f = make_frame("{}", &flen);
    assert_int_equal(proto_reader_feed(r, f, flen), LD_EMSGSIZE);
    assert_int_equal(proto_reader_next(r, &payload, &len), LD_EMSGSIZE);
    proto_reader_free(r);

    /* A huge length (a peer speaking another protocol) is refused without allocating. */
    assert_int_equal(proto_reader_new(LD_FRAME_MIN_LIMIT, &r), 0);
    assert_int_equal(proto_reader_feed(r, "GET / HTTP/1.1\r\n", 16), LD_EMSGSIZE);
    proto_reader_free(r);

    /* An oversized header behind a good frame in the same feed is seen by that feed. */
    assert_int_equal(proto_reader_new(LD_FRAME_MIN_LIMIT, &r), 0);
    uint8_t both[64];
    memcpy(both, f, flen);
    memcpy(both + flen, h, sizeof(h));
    assert_int_equal(proto_reader_feed(r, both, flen + sizeof(h)), LD_EMSGSIZE);
    assert_int_equal(proto_reader_next(r, &payload, &len), LD_EMSGSIZE);
    proto_reader_free(r);
    free(f);
}

static void test_reader_frame_at_limit(void **state)
{
    (void)state;
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_MIN_LIMIT, &r), 0);
    uint8_t *f = malloc(LD_FRAME_HEADER_SIZE + LD_FRAME_MIN_LIMIT);
    assert_non_null(f);
    proto_frame_header(LD_FRAME_MIN_LIMIT, f);
    memset(f + LD_FRAME_HEADER_SIZE, 'x', LD_FRAME_MIN_LIMIT);
    assert_int_equal(proto_reader_feed(r, f, LD_FRAME_HEADER_SIZE + LD_FRAME_MIN_LIMIT), 0);
    const char *payload;
    size_t len;
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, LD_FRAME_MIN_LIMIT);
    assert_int_equal(payload[0], 'x');
    assert_int_equal(payload[len - 1], 'x');
    assert_int_equal(payload[len], '\0');
    free(f);
    proto_reader_free(r);
}

static void test_reader_truncated_frame(void **state)
{
    (void)state;
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    size_t flen;
    uint8_t *f = make_frame("{\"id\":1,\"op\":\"status\"}", &flen);
    const char *payload = NULL;
    size_t len = 0;

    assert_int_equal(proto_reader_feed(r, f, 2), 0); /* half a header */
    assert_int_equal(proto_reader_next(r, &payload, &len), 0);
    assert_int_equal(proto_reader_pending(r), 2);
    assert_int_equal(proto_reader_feed(r, f + 2, flen - 3), 0); /* all but one byte */
    assert_int_equal(proto_reader_next(r, &payload, &len), 0);
    assert_null(payload);
    assert_int_equal(len, 0);
    assert_int_equal(proto_reader_pending(r), flen - 1);
    assert_int_equal(proto_reader_feed(r, f + flen - 1, 1), 0);
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_string_equal(payload, "{\"id\":1,\"op\":\"status\"}");
    free(f);
    proto_reader_free(r);
}

static void test_reader_zero_length_frame(void **state)
{
    (void)state;
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    uint8_t two[LD_FRAME_HEADER_SIZE * 2 + 2] = {0, 0, 0, 0, 0, 0, 0, 2, '{', '}'};
    assert_int_equal(proto_reader_feed(r, two, sizeof(two)), 0);
    const char *payload;
    size_t len = 99;
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, 0);
    assert_string_equal(payload, "");
    char err[LD_ERRMSG_MAX] = "";
    cJSON *obj = NULL;
    assert_int_equal(proto_parse(payload, len, &obj, err), LD_EBADMSG);
    assert_null(obj);
    assert_non_null(strstr(err, "empty"));
    /* The frame after the empty one is intact. */
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, 2);
    assert_string_equal(payload, "{}");
    proto_reader_free(r);
}

static void test_reader_many_small_frames(void **state)
{
    (void)state;
    /* 200k frames in 8 KiB feeds: quadratic compaction would take minutes here. */
    enum { FRAMES = 200000, FEED = 8192 };
    const char *text = "{\"op\":\"release\",\"id\":1}";
    size_t flen;
    uint8_t *f = make_frame(text, &flen);
    size_t total = flen * FRAMES;
    uint8_t *stream = malloc(total);
    assert_non_null(stream);
    for (size_t i = 0; i < FRAMES; i++)
        memcpy(stream + i * flen, f, flen);

    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    clock_t t0 = clock();
    size_t got = 0;
    for (size_t off = 0; off < total; off += FEED) {
        size_t take = total - off < FEED ? total - off : FEED;
        assert_int_equal(proto_reader_feed(r, stream + off, take), 0);
        const char *payload;
        size_t len;
        while (proto_reader_next(r, &payload, &len) == 1) {
            if (len != flen - LD_FRAME_HEADER_SIZE || memcmp(payload, text, len) != 0)
                fail_msg("frame %zu is corrupt", got);
            got++;
        }
    }
    assert_int_equal(got, FRAMES);
    assert_int_equal(proto_reader_pending(r), 0);

    /* Also when the consumer lets frames pile up and drains them all at the end. */
    proto_reader_free(r);
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    for (size_t off = 0; off < total; off += FEED) {
        size_t take = total - off < FEED ? total - off : FEED;
        assert_int_equal(proto_reader_feed(r, stream + off, take), 0);
    }
    assert_int_equal(proto_reader_pending(r), total);
    const char *payload;
    size_t len;
    got = 0;
    while (proto_reader_next(r, &payload, &len) == 1)
        got++;
    assert_int_equal(got, FRAMES);
    /* Both runs move 11 MB; a copy per frame would move terabytes. */
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (secs > 2.0)
        fail_msg("2 x 200k small frames took %.2f s", secs);
    proto_reader_free(r);
    free(stream);
    free(f);
}

static void test_reader_large_frame_then_small(void **state)
{
    (void)state;
    /* A frame much bigger than the initial buffer, split unevenly, then a small one. */
    size_t big = 300 * 1024;
    char *text = malloc(big + 1);
    assert_non_null(text);
    memset(text, 'a', big);
    text[big] = '\0';
    size_t flen;
    uint8_t *f = make_frame(text, &flen);
    proto_reader *r = NULL;
    assert_int_equal(proto_reader_new(LD_FRAME_DEFAULT_LIMIT, &r), 0);
    for (size_t off = 0; off < flen; off += 7777) {
        size_t take = flen - off < 7777 ? flen - off : 7777;
        assert_int_equal(proto_reader_feed(r, f + off, take), 0);
    }
    const char *payload;
    size_t len;
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_int_equal(len, big);
    assert_memory_equal(payload, text, big);
    assert_int_equal(payload[big], '\0');
    free(f);
    f = make_frame("{\"id\":9}", &flen);
    assert_int_equal(proto_reader_feed(r, f, flen), 0);
    assert_int_equal(proto_reader_next(r, &payload, &len), 1);
    assert_string_equal(payload, "{\"id\":9}");
    free(f);
    free(text);
    proto_reader_free(r);
}

static void test_encode(void **state)
{
    (void)state;
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "op", "next");
    cJSON_AddNumberToObject(msg, "id", 3);
    cJSON_AddNumberToObject(msg, "stream", 1);
    char *frame = NULL;
    size_t len = 0;
    assert_int_equal(proto_encode(msg, &frame, &len), 0);
    const char *want = "{\"op\":\"next\",\"id\":3,\"stream\":1}";
    assert_int_equal(len, LD_FRAME_HEADER_SIZE + strlen(want));
    uint8_t h[LD_FRAME_HEADER_SIZE];
    proto_frame_header((uint32_t)strlen(want), h);
    assert_memory_equal(frame, h, sizeof(h));
    assert_memory_equal(frame + LD_FRAME_HEADER_SIZE, want, strlen(want));
    free(frame);

    frame = (char *)(uintptr_t)0x1;
    assert_int_equal(proto_encode(NULL, &frame, &len), LD_EINVAL);
    assert_ptr_equal(frame, (char *)(uintptr_t)0x1);
    cJSON_Delete(msg);
}

static void test_encode_numbers_exact(void **state)
{
    (void)state;
    /* cJSON alone prints 9007199254740991 as 9.00719925474099e+15 and 6000000000000001
     * as 6e+15; the encoder must send every number so that it reads back exactly. */
    static const double values[] = {9007199254740991.0, -9007199254740991.0, 6000000000000001.0,
                                    4503599627370497.0, 1234567890123456.0, 2147483648.0, 0.1,
                                    1.0 / 3.0, 1e300, 123456.789012345678, 0.0, -1.0};
    cJSON *msg = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(msg, "nested");
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        char key[16];
        snprintf(key, sizeof(key), "v%zu", i);
        cJSON_AddNumberToObject(msg, key, values[i]);
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(values[i]));
    }
    char *before = cJSON_PrintUnformatted(msg);
    char text[1024];
    cJSON *back = round_trip(msg, text, sizeof(text));
    assert_non_null(strstr(text, "\"v0\":9007199254740991,"));
    cJSON *barr = cJSON_GetObjectItemCaseSensitive(back, "nested");
    assert_int_equal(cJSON_GetArraySize(barr), sizeof(values) / sizeof(values[0]));
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        char key[16];
        snprintf(key, sizeof(key), "v%zu", i);
        cJSON *v = cJSON_GetObjectItemCaseSensitive(back, key);
        assert_true(cJSON_IsNumber(v));
        if (v->valuedouble != values[i] || cJSON_GetArrayItem(barr, (int)i)->valuedouble != values[i])
            fail_msg("%s: sent %.17g, got %.17g", key, values[i], v->valuedouble);
    }
    /* The caller's tree is not modified by the fix-up. */
    char *after = cJSON_PrintUnformatted(msg);
    assert_string_equal(before, after);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(msg, "v0")));
    cJSON_free(before);
    cJSON_free(after);
    cJSON_Delete(back);
    cJSON_Delete(msg);
}

/* ---- parse -------------------------------------------------------------------------- */

static void test_parse_valid(void **state)
{
    (void)state;
    cJSON *obj = parse_ok(" {\"op\": \"open\", \"id\": 2, \"x\": [1, {\"y\": null}]}\r\n\t ");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(obj, "op")->valuestring, "open");
    cJSON_Delete(obj);
    obj = parse_ok("{}");
    cJSON_Delete(obj);
    /* UTF-8 and escapes in strings are fine. */
    obj = parse_ok("{\"name\":\"caf\xc3\xa9 \\\"q\\\" \\u00e9\"}");
    cJSON_Delete(obj);
}

static void test_parse_garbage(void **state)
{
    (void)state;
    parse_fails("hello", 5, LD_EBADMSG, "invalid JSON at byte 0");
    parse_fails("{\"op\":\"open\",\"id\":}", 19, LD_EBADMSG, "invalid JSON at byte 18");
    parse_fails("{\"op\":", 6, LD_EBADMSG, "invalid JSON at byte");
    parse_fails("{]", 2, LD_EBADMSG, "invalid JSON at byte");
    parse_fails("{\"a\":1,}", 8, LD_EBADMSG, "invalid JSON at byte");
    parse_fails("{\"a\":'x'}", 9, LD_EBADMSG, "invalid JSON at byte");
    parse_fails("   ", 3, LD_EBADMSG, "invalid JSON at byte");
    parse_fails("", 0, LD_EBADMSG, "empty payload");
    /* A NUL inside the payload is not whitespace, whatever cJSON thinks. */
    parse_fails("{\"a\":1}\0\0", 9, LD_EBADMSG, "invalid JSON at byte 7");
    parse_fails("\0{}", 3, LD_EBADMSG, "invalid JSON at byte 0");
    /* Raw control characters, outside and inside strings. */
    parse_fails("{\x01\"a\":1}", 8, LD_EBADMSG, "invalid JSON at byte 1");
    parse_fails("{\"a\":\"x\ty\"}", 11, LD_EBADMSG, "invalid JSON at byte 7: control character");
    /* \u0000 would silently cut a C string short. */
    parse_fails("{\"dataset\":\"ab\\u0000cd\"}", 24, LD_EBADMSG, "\\u0000");
    /* An escaped backslash before u0000 is just text. */
    cJSON *obj = parse_ok("{\"a\":\"\\\\u0000\"}");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(obj, "a")->valuestring, "\\u0000");
    cJSON_Delete(obj);
}

static void test_parse_non_objects(void **state)
{
    (void)state;
    parse_fails("[1,2]", 5, LD_EBADMSG, "expected a JSON object, got an array");
    parse_fails("42", 2, LD_EBADMSG, "expected a JSON object, got a number");
    parse_fails("\"op\"", 4, LD_EBADMSG, "expected a JSON object, got a string");
    parse_fails("null", 4, LD_EBADMSG, "expected a JSON object, got null");
    parse_fails("true", 4, LD_EBADMSG, "expected a JSON object, got a boolean");
}

static void test_parse_trailing_garbage(void **state)
{
    (void)state;
    parse_fails("{\"a\":1}x", 8, LD_EBADMSG, "invalid JSON at byte 7");
    parse_fails("{\"a\":1} {}", 10, LD_EBADMSG, "invalid JSON at byte 8");
    parse_fails("{}}", 3, LD_EBADMSG, "invalid JSON at byte 2");
    parse_fails("{} \n ,", 6, LD_EBADMSG, "invalid JSON at byte 5");
}

static void test_parse_respects_len(void **state)
{
    (void)state;
    /* Only `len` bytes are the payload: what follows is not parsed. */
    const char *text = "{\"a\":1}garbage";
    char *buf = malloc(strlen(text) + 1);
    assert_non_null(buf);
    strcpy(buf, text);
    cJSON *obj = NULL;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(proto_parse(buf, 7, &obj, err), 0);
    cJSON_Delete(obj);
    obj = NULL;
    assert_int_equal(proto_parse(buf, 6, &obj, err), LD_EBADMSG);
    assert_null(obj);
    free(buf);

    /* And no byte past them is read (ASan would report it): no NUL after these. */
    const char *inputs[] = {"{\"a\":1}", "{\"a\":tru", "{\"a\":12", "{\"a\":\"x", "{\"a", "{", "nul"};
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        size_t len = strlen(inputs[i]);
        char *exact = malloc(len);
        assert_non_null(exact);
        memcpy(exact, inputs[i], len);
        obj = NULL;
        int rc = proto_parse(exact, len, &obj, err);
        assert_int_equal(rc, i == 0 ? 0 : LD_EBADMSG);
        cJSON_Delete(obj);
        free(exact);
    }
}

static char *repeat(char c, size_t n, const char *prefix, const char *suffix)
{
    size_t pl = strlen(prefix), sl = strlen(suffix);
    char *s = malloc(pl + n + sl + 1);
    assert_non_null(s);
    memcpy(s, prefix, pl);
    memset(s + pl, c, n);
    memcpy(s + pl + n, suffix, sl + 1);
    return s;
}

static void test_parse_depth(void **state)
{
    (void)state;
    /* 16 levels: an object holding 15 nested arrays. */
    char text[256];
    snprintf(text, sizeof(text), "{\"a\":%.*s%.*s}", LD_JSON_MAX_DEPTH - 1, "[[[[[[[[[[[[[[[[[[[[",
             LD_JSON_MAX_DEPTH - 1, "]]]]]]]]]]]]]]]]]]]]");
    cJSON *obj = parse_ok(text);
    cJSON_Delete(obj);
    /* 17 levels. */
    snprintf(text, sizeof(text), "{\"a\":%.*s%.*s}", LD_JSON_MAX_DEPTH, "[[[[[[[[[[[[[[[[[[[[",
             LD_JSON_MAX_DEPTH, "]]]]]]]]]]]]]]]]]]]]");
    parse_fails(text, strlen(text), LD_EBADMSG, "nesting deeper than 16 levels");
    /* Sibling containers do not add up. */
    obj = parse_ok("{\"a\":[[[[]]]],\"b\":[[[[]]]],\"c\":{\"d\":{\"e\":{}}}}");
    cJSON_Delete(obj);

    /* 10000 '[': rejected by the scan at the 17th bracket, before cJSON recurses. */
    char *deep = repeat('[', 10000, "", "");
    clock_t t0 = clock();
    parse_fails(deep, 10000, LD_EBADMSG, "nesting deeper than 16 levels at byte 16");
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 0.5);
    free(deep);
    deep = repeat('{', 10000, "", "");
    parse_fails(deep, 10000, LD_EBADMSG, "nesting deeper than 16 levels");
    free(deep);

    /* Brackets inside strings are text, escaped quotes do not end the string. */
    char *inside = repeat('[', 10000, "{\"a\":\"\\\"", "\\\\\",\"b\":[[1]]}");
    obj = parse_ok(inside);
    assert_int_equal(strlen(cJSON_GetObjectItemCaseSensitive(obj, "a")->valuestring), 10002);
    cJSON_Delete(obj);
    free(inside);
    /* ...but a string that ends lets the brackets after it count again. */
    char *after = repeat('[', 20, "{\"a\":\"\\\\\",\"b\":", "");
    parse_fails(after, strlen(after), LD_EBADMSG, "nesting deeper than 16 levels");
    free(after);
}

/* ---- getters ------------------------------------------------------------------------ */

static void test_get_int(void **state)
{
    (void)state;
    cJSON *obj = parse_ok("{\"batch_size\":64,\"zero\":0,\"neg\":-5,\"half\":1.5,\"huge\":1e300,"
                          "\"str\":\"64\",\"t\":true,\"n\":null,\"arr\":[1],\"o\":{},\"one\":1.0,"
                          "\"safe\":9007199254740991,\"unsafe\":9007199254740993,\"exp\":1e3,"
                          "\"nsafe\":-9007199254740991}");
    char err[LD_ERRMSG_MAX] = "";
    int64_t v = 0;
    const int64_t untouched = 0x5eed;

    assert_int_equal(proto_get_int(obj, "batch_size", 1, 65536, &v, err), 0);
    assert_int_equal(v, 64);
    assert_int_equal(proto_get_int(obj, "one", 1, 1, &v, err), 0);
    assert_int_equal(v, 1);
    assert_int_equal(proto_get_int(obj, "exp", 0, 1000, &v, err), 0);
    assert_int_equal(v, 1000);
    assert_int_equal(proto_get_int(obj, "neg", -5, -5, &v, err), 0);
    assert_int_equal(v, -5);
    assert_int_equal(proto_get_int(obj, "safe", 0, INT64_MAX, &v, err), 0);
    assert_int_equal(v, LD_JSON_SAFE_INT);
    assert_int_equal(proto_get_int(obj, "nsafe", INT64_MIN, 0, &v, err), 0);
    assert_int_equal(v, -LD_JSON_SAFE_INT);

    struct {
        const char *key;
        int64_t min, max;
        const char *msg;
    } bad[] = {
        {"zero", 1, 65536, "field 'zero': expected an integer in [1, 65536], got 0"},
        {"batch_size", 1, 63, "field 'batch_size': expected an integer in [1, 63], got 64"},
        {"neg", 0, 10, "field 'neg': expected an integer in [0, 10], got -5"},
        {"half", 0, 10, "field 'half': expected an integer in [0, 10], got 1.5"},
        {"huge", INT64_MIN, INT64_MAX,
         "field 'huge': expected an integer in [-9223372036854775808, 9223372036854775807], got 1e+300"},
        {"unsafe", 0, INT64_MAX,
         "field 'unsafe': expected an integer in [0, 9223372036854775807], got 9007199254740992"},
        {"str", 1, 65536, "field 'str': expected an integer in [1, 65536], got a string"},
        {"t", 0, 1, "field 't': expected an integer in [0, 1], got a boolean"},
        {"n", 0, 1, "field 'n': expected an integer in [0, 1], got null"},
        {"arr", 0, 1, "field 'arr': expected an integer in [0, 1], got an array"},
        {"o", 0, 1, "field 'o': expected an integer in [0, 1], got an object"},
        {"missing", 0, 1, "field 'missing': missing"},
        {"BATCH_SIZE", 1, 65536, "field 'BATCH_SIZE': missing"}, /* keys are case-sensitive */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = untouched;
        err[0] = '\0';
        assert_int_equal(proto_get_int(obj, bad[i].key, bad[i].min, bad[i].max, &v, err), LD_EFIELD);
        assert_int_equal(v, untouched);
        assert_msg(err, bad[i].msg);
    }

    /* NaN and infinity cannot be written in JSON, but a cJSON tree can hold them. */
    cJSON *odd = cJSON_CreateObject();
    cJSON_AddNumberToObject(odd, "nan", NAN);
    cJSON_AddNumberToObject(odd, "inf", INFINITY);
    v = untouched;
    assert_int_equal(proto_get_int(odd, "nan", INT64_MIN, INT64_MAX, &v, err), LD_EFIELD);
    assert_non_null(strstr(err, "non-finite"));
    assert_int_equal(proto_get_int(odd, "inf", INT64_MIN, INT64_MAX, &v, err), LD_EFIELD);
    assert_int_equal(v, untouched);
    cJSON_Delete(odd);

    /* proto_opt_int: default when absent or null, same errors otherwise. */
    assert_int_equal(proto_opt_int(obj, "missing", 1, 64, 4, &v, err), 0);
    assert_int_equal(v, 4);
    v = untouched;
    assert_int_equal(proto_opt_int(obj, "n", 1, 64, 7, &v, err), 0);
    assert_int_equal(v, 7);
    assert_int_equal(proto_opt_int(obj, "batch_size", 1, 64, 4, &v, err), 0);
    assert_int_equal(v, 64);
    v = untouched;
    assert_int_equal(proto_opt_int(obj, "zero", 1, 64, 4, &v, err), LD_EFIELD);
    assert_msg(err, "field 'zero': expected an integer in [1, 64], got 0");
    assert_int_equal(proto_opt_int(obj, "str", 1, 64, 4, &v, err), LD_EFIELD);
    assert_msg(err, "field 'str': expected an integer in [1, 64], got a string");
    assert_int_equal(v, untouched);

    /* Caller bugs are not the peer's fault: LD_EINVAL. */
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, "arr");
    assert_int_equal(proto_get_int(arr, "x", 0, 1, &v, err), LD_EINVAL);
    assert_int_equal(proto_get_int(NULL, "x", 0, 1, &v, err), LD_EINVAL);
    assert_int_equal(proto_get_int(obj, "batch_size", 5, 1, &v, err), LD_EINVAL);
    assert_int_equal(v, untouched);
    /* A NULL errbuf is tolerated. */
    assert_int_equal(proto_get_int(obj, "zero", 1, 2, &v, NULL), LD_EFIELD);
    cJSON_Delete(obj);
}

static void test_get_bool(void **state)
{
    (void)state;
    cJSON *obj = parse_ok("{\"shuffle\":true,\"drop_last\":false,\"s\":\"true\",\"one\":1,\"n\":null,"
                          "\"a\":[]}");
    char err[LD_ERRMSG_MAX] = "";
    bool b = false;
    assert_int_equal(proto_get_bool(obj, "shuffle", &b, err), 0);
    assert_true(b);
    assert_int_equal(proto_get_bool(obj, "drop_last", &b, err), 0);
    assert_false(b);

    struct {
        const char *key, *msg;
    } bad[] = {
        {"s", "field 's': expected a boolean, got a string"},
        {"one", "field 'one': expected a boolean, got a number"},
        {"n", "field 'n': expected a boolean, got null"},
        {"a", "field 'a': expected a boolean, got an array"},
        {"nope", "field 'nope': missing"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = true;
        assert_int_equal(proto_get_bool(obj, bad[i].key, &b, err), LD_EFIELD);
        assert_true(b);
        assert_msg(err, bad[i].msg);
    }

    b = false;
    assert_int_equal(proto_opt_bool(obj, "nope", true, &b, err), 0);
    assert_true(b);
    assert_int_equal(proto_opt_bool(obj, "n", true, &b, err), 0);
    assert_true(b);
    assert_int_equal(proto_opt_bool(obj, "drop_last", true, &b, err), 0);
    assert_false(b);
    b = true;
    assert_int_equal(proto_opt_bool(obj, "s", false, &b, err), LD_EFIELD);
    assert_msg(err, "field 's': expected a boolean, got a string");
    assert_true(b);
    cJSON_Delete(obj);
}

static void test_get_str(void **state)
{
    (void)state;
    cJSON *obj = parse_ok("{\"dataset\":\"records\",\"empty\":\"\",\"num\":3,\"n\":null,"
                          "\"ctl\":\"ab\\u0001c\",\"del\":\"ab\x7f\",\"utf8\":\"caf\xc3\xa9\","
                          "\"bad8\":\"ab\xff\",\"overlong\":\"\xc0\xaf\",\"cut\":\"a\xe2\x82\","
                          "\"surrogate\":\"\xed\xa0\x80\",\"long\":\"0123456789\"}");
    char err[LD_ERRMSG_MAX] = "";
    const char *s = NULL;
    assert_int_equal(proto_get_str(obj, "dataset", LD_NAME_MAX - 1, &s, err), 0);
    assert_string_equal(s, "records");
    assert_int_equal(proto_get_str(obj, "utf8", 5, &s, err), 0);
    assert_string_equal(s, "caf\xc3\xa9");
    assert_int_equal(proto_get_str(obj, "long", 10, &s, err), 0);
    assert_string_equal(s, "0123456789");

    struct {
        const char *key;
        size_t maxlen;
        const char *msg;
    } bad[] = {
        {"long", 9, "field 'long': expected at most 9 bytes, got 10"},
        {"empty", 10, "field 'empty': expected a non-empty string"},
        {"num", 10, "field 'num': expected a string, got a number"},
        {"n", 10, "field 'n': expected a string, got null"},
        {"ctl", 10, "field 'ctl': control character at byte 2"},
        {"del", 10, "field 'del': control character at byte 2"},
        {"bad8", 10, "field 'bad8': invalid UTF-8 at byte 2"},
        {"overlong", 10, "field 'overlong': invalid UTF-8 at byte 0"},
        {"cut", 10, "field 'cut': invalid UTF-8 at byte 1"},
        {"surrogate", 10, "field 'surrogate': invalid UTF-8 at byte 0"},
        {"absent", 10, "field 'absent': missing"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = "untouched";
        assert_int_equal(proto_get_str(obj, bad[i].key, bad[i].maxlen, &s, err), LD_EFIELD);
        assert_string_equal(s, "untouched");
        assert_msg(err, bad[i].msg);
    }
    cJSON_Delete(obj);
}

/* ---- replies ------------------------------------------------------------------------ */

static void test_reply_ok(void **state)
{
    (void)state;
    char text[256], err[LD_ERRMSG_MAX];
    cJSON *reply = proto_reply_ok(7);
    assert_non_null(reply);
    cJSON *back = round_trip(reply, text, sizeof(text));
    assert_string_equal(text, "{\"id\":7,\"ok\":true}");
    assert_int_equal(proto_reply_status(back, err), 0);
    assert_int_equal(proto_request_id(back), 7);
    cJSON_Delete(back);
    cJSON_Delete(reply);

    reply = proto_reply_ok(-1);
    back = round_trip(reply, text, sizeof(text));
    assert_string_equal(text, "{\"id\":null,\"ok\":true}");
    assert_int_equal(proto_request_id(back), -1);
    cJSON_Delete(back);
    cJSON_Delete(reply);

    reply = proto_reply_ok(LD_JSON_SAFE_INT);
    back = round_trip(reply, text, sizeof(text));
    assert_string_equal(text, "{\"id\":9007199254740991,\"ok\":true}");
    assert_int_equal(proto_request_id(back), LD_JSON_SAFE_INT);
    cJSON_Delete(back);
    cJSON_Delete(reply);
}

static void test_reply_error(void **state)
{
    (void)state;
    char text[512], err[LD_ERRMSG_MAX];
    const char *msg = "field 'batch_size': expected an integer in [1, 65536], got 0";
    cJSON *reply = proto_reply_error(7, LD_EFIELD, msg);
    assert_non_null(reply);
    cJSON *back = round_trip(reply, text, sizeof(text));
    assert_string_equal(text, "{\"id\":7,\"ok\":false,\"error\":{\"code\":\"bad_field\",\"errno\":-4003,"
                              "\"message\":\"field 'batch_size': expected an integer in [1, 65536], "
                              "got 0\"}}");
    assert_int_equal(proto_reply_status(back, err), LD_EFIELD);
    assert_string_equal(err, msg);
    cJSON_Delete(back);
    cJSON_Delete(reply);

    /* No message: the code's sentence; a bad id: null. */
    reply = proto_reply_error(-1, LD_EMSGSIZE, NULL);
    back = round_trip(reply, text, sizeof(text));
    assert_non_null(strstr(text, "\"id\":null"));
    assert_int_equal(proto_reply_status(back, err), LD_EMSGSIZE);
    assert_string_equal(err, ld_strerror(LD_EMSGSIZE));
    cJSON_Delete(back);
    cJSON_Delete(reply);

    /* Every code in the table survives the trip with its meaning. */
#define CHECK_CODE(name, value, wire, sentence)                                    \
    do {                                                                           \
        cJSON *r_ = proto_reply_error(1, (value), "m " wire);                      \
        cJSON *b_ = round_trip(r_, NULL, 0);                                       \
        assert_int_equal(proto_reply_status(b_, err), (value));                    \
        assert_string_equal(err, "m " wire);                                       \
        cJSON *e_ = cJSON_GetObjectItemCaseSensitive(b_, "error");                 \
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(e_, "code")->valuestring, wire); \
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(e_, "errno")->valueint, (value)); \
        cJSON_Delete(b_);                                                          \
        cJSON_Delete(r_);                                                          \
    } while (0);
    LD_ERROR_MAP(CHECK_CODE)
#undef CHECK_CODE
}

static void test_reply_status_malformed(void **state)
{
    (void)state;
    struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"id\":1}", "'ok'"},
        {"{\"id\":1,\"ok\":\"yes\"}", "'ok'"},
        {"{\"id\":1,\"ok\":1}", "'ok'"},
        {"{\"id\":1,\"ok\":false}", "'error'"},
        {"{\"id\":1,\"ok\":false,\"error\":\"bad_field\"}", "'error'"},
        {"{\"id\":1,\"ok\":false,\"error\":{\"code\":4003}}", "'code'"},
        {"{\"id\":1,\"ok\":false,\"error\":{\"code\":\"no_idea\",\"message\":\"m\"}}",
         "unknown error code 'no_idea': m"},
        {"{\"id\":1,\"ok\":false,\"error\":{\"code\":\"ok\"}}", "unknown error code 'ok'"},
    };
    char err[LD_ERRMSG_MAX];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *reply = parse_ok(bad[i].text);
        err[0] = '\0';
        assert_int_equal(proto_reply_status(reply, err), LD_EPROTO);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s: message '%s' lacks '%s'", bad[i].text, err, bad[i].needle);
        cJSON_Delete(reply);
    }
    cJSON *arr = cJSON_CreateArray();
    assert_int_equal(proto_reply_status(arr, err), LD_EPROTO);
    assert_int_equal(proto_reply_status(NULL, err), LD_EPROTO);
    cJSON_Delete(arr);

    /* A genuine protocol_error from the server is that code, not a malformed reply. */
    cJSON *reply = parse_ok("{\"id\":1,\"ok\":false,\"error\":{\"code\":\"protocol_error\",\"message\":\"x\"}}");
    assert_int_equal(proto_reply_status(reply, err), LD_EPROTO);
    assert_string_equal(err, "x");
    cJSON_Delete(reply);
    /* A missing message falls back to the code's sentence. */
    reply = parse_ok("{\"id\":1,\"ok\":false,\"error\":{\"code\":\"not_found\"}}");
    assert_int_equal(proto_reply_status(reply, err), LD_ENOENT);
    assert_string_equal(err, ld_strerror(LD_ENOENT));
    cJSON_Delete(reply);
}

static void test_request_id(void **state)
{
    (void)state;
    struct {
        const char *text;
        int64_t id;
    } cases[] = {
        {"{\"id\":0}", 0},
        {"{\"id\":42,\"op\":\"next\"}", 42},
        {"{\"id\":9007199254740991}", LD_JSON_SAFE_INT},
        {"{\"id\":9007199254740992}", -1},
        {"{\"id\":-1}", -1},
        {"{\"id\":1.5}", -1},
        {"{\"id\":\"7\"}", -1},
        {"{\"id\":null}", -1},
        {"{\"id\":true}", -1},
        {"{\"ID\":7}", -1},
        {"{}", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *req = parse_ok(cases[i].text);
        if (proto_request_id(req) != cases[i].id)
            fail_msg("%s: id %" PRId64 ", wanted %" PRId64, cases[i].text, proto_request_id(req),
                     cases[i].id);
        cJSON_Delete(req);
    }
    assert_int_equal(proto_request_id(NULL), -1);
}

/* ---- tables ------------------------------------------------------------------------- */

static void test_error_table(void **state)
{
    (void)state;
    static const int codes[] = {
#define CODE(name, value, wire, msg) (value),
        LD_ERROR_MAP(CODE)
#undef CODE
    };
    static const char *const names[] = {
#define NAME(name, value, wire, msg) wire,
        LD_ERROR_MAP(NAME)
#undef NAME
    };
    size_t n = sizeof(codes) / sizeof(codes[0]);
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        assert_string_equal(ld_error_name(codes[i]), names[i]);
        assert_int_equal(ld_error_from_name(ld_error_name(codes[i])), codes[i]);
        assert_non_null(ld_strerror(codes[i]));
        /* Codes and names are unique, or the wire would be ambiguous. */
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(codes[i], codes[j]);
            assert_string_not_equal(names[i], names[j]);
        }
    }
    assert_int_equal(LD_EFIELD, -4003);
    assert_int_equal(LD_EBADMSG, -EBADMSG);
    assert_string_equal(ld_error_name(0), "ok");
    assert_int_equal(ld_error_from_name("ok"), 0);
    assert_string_equal(ld_error_name(-3999), "unknown_error");
    assert_int_equal(ld_error_from_name("no_such_code"), LD_EPROTO);
    assert_int_equal(ld_error_from_name(NULL), LD_EPROTO);
    assert_string_equal(ld_strerror(-9999), "unknown error");
}

static void test_dtype_table(void **state)
{
    (void)state;
    static const struct {
        int dtype;
        const char *name;
        size_t size;
    } want[] = {
        {LD_DTYPE_UINT8, "uint8", 1},     {LD_DTYPE_UINT16, "uint16", 2}, {LD_DTYPE_UINT32, "uint32", 4},
        {LD_DTYPE_INT32, "int32", 4},     {LD_DTYPE_INT64, "int64", 8},   {LD_DTYPE_FLOAT16, "float16", 2},
        {LD_DTYPE_FLOAT32, "float32", 4},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        assert_string_equal(proto_dtype_name(want[i].dtype), want[i].name);
        assert_int_equal(proto_dtype_from_name(want[i].name), want[i].dtype);
        assert_int_equal(proto_dtype_size(want[i].dtype), want[i].size);
    }
    /* The numbers are ABI for the Python binding. */
    assert_int_equal(LD_DTYPE_UINT8, 1);
    assert_int_equal(LD_DTYPE_FLOAT32, 7);
    const int unknown[] = {0, -1, 8, 1000};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_null(proto_dtype_name(unknown[i]));
        assert_int_equal(proto_dtype_size(unknown[i]), 0);
    }
    assert_int_equal(proto_dtype_from_name("float64"), LD_EINVAL);
    assert_int_equal(proto_dtype_from_name("UINT8"), LD_EINVAL);
    assert_int_equal(proto_dtype_from_name(""), LD_EINVAL);
    assert_int_equal(proto_dtype_from_name(NULL), LD_EINVAL);
}

/* Epochs travel as JSON numbers: a stream may not reach one past 2^53 - 1. */
static void test_epoch_span(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    int64_t n = -1;
    assert_int_equal(proto_epoch_span(0, 5, &n, err), 0);
    assert_int_equal(n, 5);
    assert_int_equal(proto_epoch_span(LD_EPOCH_MAX, 1, &n, err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(proto_epoch_span(LD_EPOCH_MAX - 1, 2, &n, err), 0);
    /* Unbounded: ends after the last exact epoch. */
    assert_int_equal(proto_epoch_span(LD_EPOCH_MAX - 2, 0, &n, err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(proto_epoch_span(0, 0, &n, err), 0);
    assert_true(n == LD_EPOCH_MAX + 1);
    n = -1;
    assert_int_equal(proto_epoch_span(LD_EPOCH_MAX, 2, &n, err), LD_EFIELD);
    assert_int_equal(n, -1); /* untouched */
    assert_non_null(strstr(err, "field 'epochs': 2 epochs from epoch 9007199254740991 run past"));
    assert_non_null(strstr(err, "at most 1 fit"));
    assert_int_equal(proto_epoch_span(2, LD_EPOCH_MAX, &n, err), LD_EFIELD);
    assert_int_equal(proto_epoch_span(-1, 1, &n, err), LD_EFIELD);
    assert_int_equal(proto_epoch_span(LD_EPOCH_MAX + 1, 0, &n, err), LD_EFIELD);
}

/* The default socket's directory: created 0700; refused when it is a symlink, lets
 * group or others in, or belongs to another user. */
static void test_socket_dir_check(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX], base[] = "/tmp/ld-test-sockdir-XXXXXX", dir[128], link[128];
    assert_non_null(mkdtemp(base));
    snprintf(dir, sizeof dir, "%s/private", base);
    snprintf(link, sizeof link, "%s/link", base);
    assert_int_equal(proto_socket_check_dir(dir, false, err), LD_ENOENT);
    assert_int_equal(proto_socket_check_dir(dir, true, err), 0);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(proto_socket_check_dir(dir, true, err), 0); /* exists already: fine */
    assert_int_equal(chmod(dir, 0770), 0);
    assert_int_equal(proto_socket_check_dir(dir, true, err), LD_EACCES);
    assert_non_null(strstr(err, "mode 0770"));
    assert_int_equal(chmod(dir, 0700), 0);
    assert_int_equal(symlink(dir, link), 0);
    assert_int_equal(proto_socket_check_dir(link, true, err), LD_ENOTDIR);
    assert_non_null(strstr(err, "symbolic link"));
    if (getuid() == 0) {
        /* Root can hand the directory to someone else, as a squatter would own it. */
        assert_int_equal(chown(dir, 65534, 65534), 0);
        assert_int_equal(proto_socket_check_dir(dir, true, err), LD_EACCES);
        assert_non_null(strstr(err, "belongs to uid 65534"));
    }
    unlink(link);
    rmdir(dir);
    rmdir(base);
    /* Only the private directory is checked; a path someone configured is theirs. */
    assert_int_equal(proto_socket_check_path("/run/loaderd/loaderd.sock", false, err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_header_is_big_endian),
        cmocka_unit_test(test_reader_new_rejects_bad_limits),
        cmocka_unit_test(test_reader_byte_by_byte),
        cmocka_unit_test(test_reader_joined_and_split_frames),
        cmocka_unit_test(test_reader_oversize_header),
        cmocka_unit_test(test_reader_frame_at_limit),
        cmocka_unit_test(test_reader_truncated_frame),
        cmocka_unit_test(test_reader_zero_length_frame),
        cmocka_unit_test(test_reader_many_small_frames),
        cmocka_unit_test(test_reader_large_frame_then_small),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_encode_numbers_exact),
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_garbage),
        cmocka_unit_test(test_parse_non_objects),
        cmocka_unit_test(test_parse_trailing_garbage),
        cmocka_unit_test(test_parse_respects_len),
        cmocka_unit_test(test_parse_depth),
        cmocka_unit_test(test_get_int),
        cmocka_unit_test(test_get_bool),
        cmocka_unit_test(test_get_str),
        cmocka_unit_test(test_reply_ok),
        cmocka_unit_test(test_reply_error),
        cmocka_unit_test(test_reply_status_malformed),
        cmocka_unit_test(test_request_id),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_epoch_span),
        cmocka_unit_test(test_socket_dir_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
