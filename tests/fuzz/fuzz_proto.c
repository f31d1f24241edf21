/* fuzz_proto — libFuzzer harness for the control channel's input side: the incremental
 * frame reader and the JSON message decoder with its checked getters, as the daemon
 * runs them on every byte a client sends (and the client on every reply).
 *
 * The input is a byte stream from a socket. The first byte picks how it is cut into
 * reads (split frames and joined frames are what the reader must get right), the
 * second the frame limit; the rest is fed in those pieces. Every whole frame is parsed
 * and then read field by field the way server.c reads an `open` request and the client
 * reads a reply, so the getters see every kind of JSON value. Nothing here may crash,
 * leak, read out of bounds or trip UBSan; a getter that fails must leave its output
 * alone. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An output that a failing getter must not touch. */
#define UNTOUCHED_INT 0x5a5a5a5a5a5aLL

static void check(int cond)
{
    if (!cond)
        abort();
}

static void decode(const cJSON *obj)
{
    char err[LD_ERRMSG_MAX];
    int64_t v = UNTOUCHED_INT;
    bool b = true;
    const char *s = NULL;

    /* The fields of `open`, `release`, `hello` and a reply, with their real bounds. */
    static const struct {
        const char *key;
        int64_t min, max;
    } ints[] = {
        {"batch_size", 1, 65536},       {"seed", 0, LD_JSON_SAFE_INT},
        {"epoch", 0, LD_JSON_SAFE_INT}, {"world_size", 1, 65536},
        {"rank", 0, 65535},             {"slot", 0, UINT32_MAX},
        {"generation", 0, LD_JSON_SAFE_INT}, {"version", 0, INT32_MAX},
        {"stream", 0, LD_JSON_SAFE_INT}, {"id", INT64_MIN, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = UNTOUCHED_INT;
        int r = proto_get_int(obj, ints[i].key, ints[i].min, ints[i].max, &v, err);
        if (r == 0)
            check(v >= ints[i].min && v <= ints[i].max);
        else
            check(v == UNTOUCHED_INT && err[0] != '\0');
        v = UNTOUCHED_INT;
        r = proto_opt_int(obj, ints[i].key, ints[i].min, ints[i].max, ints[i].min, &v, err);
        if (r == 0)
            check(v >= ints[i].min && v <= ints[i].max);
        else
            check(v == UNTOUCHED_INT);
    }
    static const char *const bools[] = {"shuffle", "drop_last", "force", "ok"};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        (void)proto_get_bool(obj, bools[i], &b, err);
        (void)proto_opt_bool(obj, bools[i], false, &b, err);
    }
    static const char *const strs[] = {"op", "dataset", "client", "name"};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        s = NULL;
        if (proto_get_str(obj, strs[i], LD_NAME_MAX - 1, &s, err) == 0) {
            size_t n = strlen(s);
            check(n > 0 && n <= LD_NAME_MAX - 1);
        } else {
            check(s == NULL);
        }
    }
    (void)proto_request_id(obj);
    (void)proto_reply_status(obj, err);
    /* Whatever was decoded can be sent back: the encoder must take any parsed tree. */
    char *frame = NULL;
    size_t len = 0;
    if (proto_encode(obj, &frame, &len) == 0) {
        check(len >= LD_FRAME_HEADER_SIZE);
        free(frame);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t chunk = (size_t)data[0] % 17 + 1;        /* 1..17 bytes per read, 17: all at once */
    uint32_t limit = data[1] & 1 ? LD_FRAME_MIN_LIMIT : LD_FRAME_DEFAULT_LIMIT;
    data += 2;
    size -= 2;

    proto_reader *r = NULL;
    if (proto_reader_new(limit, &r) < 0)
        return 0;
    size_t off = 0;
    int failed = 0;
    while (off < size && !failed) {
        size_t n = chunk == 17 ? size - off : (size - off < chunk ? size - off : chunk);
        if (proto_reader_feed(r, data + off, n) < 0)
            failed = 1;
        off += n;
        const char *payload;
        size_t len;
        int got;
        while (!failed && (got = proto_reader_next(r, &payload, &len)) != 0) {
            if (got < 0) {
                failed = 1;
                break;
            }
            check(len <= limit && payload[len] == '\0');
            char err[LD_ERRMSG_MAX];
            cJSON *obj = NULL;
            if (proto_parse(payload, len, &obj, err) == 0) {
                check(cJSON_IsObject(obj));
                decode(obj);
                cJSON_Delete(obj);
            } else {
                check(obj == NULL && err[0] != '\0');
            }
        }
    }
    if (!failed)
        check(proto_reader_pending(r) <= size);
    proto_reader_free(r);
    return 0;
}
