/* proto — the control channel's wire format, shared by loaderd, libloaderclient and
 * loaderctl. It knows framing, message names, limits, dtypes, the shared-memory ring
 * header and JSON encode/decode with checked field access; it knows nothing of libuv
 * or sockets. Library code: it never prints, it returns codes.
 *
 * A frame is a 4-byte big-endian payload length followed by that many bytes of one
 * JSON object (UTF-8, no NUL). See proto/PROTOCOL.md for every message.
 */
#ifndef LD_PROTO_H
#define LD_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cJSON.h>

#include "ld_error.h"

/* Never change without a version bump. */
#define LD_PROTO_VERSION 1
#define LD_FRAME_HEADER_SIZE 4u
#define LD_FRAME_MIN_LIMIT 1024u               /* smallest max_frame a config may set */
#define LD_FRAME_DEFAULT_LIMIT (1u << 20)      /* 1 MiB */
#define LD_FRAME_MAX_LIMIT (64u << 20)         /* 64 MiB */
#define LD_JSON_MAX_DEPTH 16                   /* deeper nesting is rejected before cJSON sees it */
#define LD_NAME_MAX 64                         /* dataset and field names, including the NUL */
#define LD_MAX_FIELDS 8                        /* fields per batch */
#define LD_MAX_DIMS 4                          /* dims per field, after the batch dim */
#define LD_ERRMSG_MAX 512                      /* error message buffers */
#define LD_JSON_SAFE_INT 9007199254740991LL    /* 2^53 - 1: larger integers lose precision in JSON */

/* Epochs travel as JSON numbers (the open request, every next reply), so the largest
 * one a stream may reach is the largest integer a double holds exactly. */
#define LD_EPOCH_MAX LD_JSON_SAFE_INT

/* Operation names (the "op" field of a request). */
#define LD_OP_HELLO "hello"
#define LD_OP_DATASETS "datasets"
#define LD_OP_OPEN "open"
#define LD_OP_NEXT "next"
#define LD_OP_RELEASE "release"
#define LD_OP_CLOSE "close"
#define LD_OP_STATUS "status"
#define LD_OP_STREAMS "streams"
#define LD_OP_CACHE_BUILD "cache_build"
#define LD_OP_CACHE_INFO "cache_info"
#define LD_OP_CACHE_VERIFY "cache_verify"
#define LD_OP_METRICS "metrics"

/* Element types of batch fields. Never renumber: the wire carries the names, the
 * Python binding the numbers. */
enum ld_dtype {
    LD_DTYPE_UINT8 = 1,
    LD_DTYPE_UINT16 = 2,
    LD_DTYPE_UINT32 = 3,
    LD_DTYPE_INT32 = 4,
    LD_DTYPE_INT64 = 5,
    LD_DTYPE_FLOAT16 = 6,
    LD_DTYPE_FLOAT32 = 7,
};
const char *proto_dtype_name(int dtype);     /* "uint8"...; NULL for an unknown dtype */
int proto_dtype_from_name(const char *name); /* LD_DTYPE_* or LD_EINVAL */
size_t proto_dtype_size(int dtype);          /* bytes per element; 0 for an unknown dtype */

/* ---- shared-memory ring layout (the client maps it read-only) -------------------
 * One POSIX shm object per stream: a header page, then `slot_count` slots of
 * `slot_size` bytes each, starting at `slot_offset`. Each slot begins with a
 * struct ld_slot_header, then the fields at the offsets the open reply gives.
 * Never change without a version bump. */
#define LD_RING_MAGIC 0x474e524cu /* "LRNG" little-endian */
#define LD_RING_VERSION 1u
#define LD_RING_ALIGN 4096u       /* slot_offset and slot_size are multiples of this */
#define LD_FIELD_ALIGN 64u        /* every field (and ragged part) starts on this */

struct ld_ring_header {
    uint32_t magic;
    uint32_t version;
    uint32_t slot_count;
    uint32_t reserved0;
    uint64_t slot_size;
    uint64_t slot_offset;
    uint64_t total_size;
    uint64_t stream_id;
    uint8_t reserved[16];
};
_Static_assert(sizeof(struct ld_ring_header) == 64, "ld_ring_header is wire layout");

/* Written by the daemon before a slot becomes READY; a client checks `generation`
 * against the one in its next reply, and again before each access in the Python
 * binding, so a view of a recycled slot is detected. */
struct ld_slot_header {
    uint64_t generation;
    uint64_t epoch;
    uint64_t batch;
    uint32_t rows;
    uint32_t reserved0;
    uint8_t reserved[32];
};
_Static_assert(sizeof(struct ld_slot_header) == 64, "ld_slot_header is wire layout");

/* ---- framing ------------------------------------------------------------------- */

/* Incremental frame reader: feed it whatever the socket gave, take whole frames out.
 * Split and joined frames are handled; a header announcing more than `max_frame`
 * bytes is an error (LD_EMSGSIZE) and the reader stays failed. */
typedef struct proto_reader proto_reader;

int proto_reader_new(uint32_t max_frame, proto_reader **ret_reader);
void proto_reader_free(proto_reader *r);
/* Appends bytes. LD_EMSGSIZE when a frame header over the limit is seen,
 * LD_ENOMEM on allocation failure. */
int proto_reader_feed(proto_reader *r, const void *data, size_t len);
/* 1 and a frame in *ret_payload and *ret_len when one is complete (the payload is a
 * NUL-terminated copy owned by the reader, valid until the next call), 0 when more
 * bytes are needed, <0 after an error. */
int proto_reader_next(proto_reader *r, const char **ret_payload, size_t *ret_len);
/* Bytes buffered but not yet returned as frames. */
size_t proto_reader_pending(const proto_reader *r);

/* Writes the 4-byte big-endian header for a payload of `len` bytes. */
void proto_frame_header(uint32_t len, uint8_t out[LD_FRAME_HEADER_SIZE]);
/* Prints `msg` unformatted and returns header+payload in one malloc'd buffer. */
int proto_encode(const cJSON *msg, char **ret_frame, size_t *ret_len);

/* ---- JSON decode with checked fields ----------------------------------------------
 * proto_parse accepts exactly one JSON object of `len` bytes (payload must be
 * NUL-terminated at payload[len], as proto_reader gives it), nested at most
 * LD_JSON_MAX_DEPTH deep. LD_EBADMSG otherwise, with a message in errbuf.
 *
 * The getters fail with LD_EFIELD and a message naming the field and what was
 * expected ("field 'batch_size': expected an integer in [1, 65536], got 0") when the
 * field is missing (proto_get_*) or has the wrong type or range. The proto_opt_*
 * variants store `def` when the field is absent or null. errbuf has LD_ERRMSG_MAX
 * bytes; ret_* is left untouched on failure. */
int proto_parse(const char *payload, size_t len, cJSON **ret_obj, char *errbuf);
int proto_get_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t *ret, char *errbuf);
int proto_opt_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t def, int64_t *ret, char *errbuf);
int proto_get_bool(const cJSON *obj, const char *key, bool *ret, char *errbuf);
int proto_opt_bool(const cJSON *obj, const char *key, bool def, bool *ret, char *errbuf);
/* Strings: non-empty, at most maxlen bytes (excluding NUL), no control characters.
 * *ret points into obj. */
int proto_get_str(const cJSON *obj, const char *key, size_t maxlen, const char **ret, char *errbuf);

/* For an open: checks that a stream starting at `epoch` and running `epochs` epochs
 * (0: unbounded) never reaches an epoch past LD_EPOCH_MAX, which neither client could
 * read back exactly. 0 and, in *ret_epochs, the count to run (an unbounded stream ends
 * after epoch LD_EPOCH_MAX); LD_EFIELD with a message naming both fields otherwise. */
int proto_epoch_span(int64_t epoch, int64_t epochs, int64_t *ret_epochs, char *errbuf);

/* ---- replies ----------------------------------------------------------------------
 * Every reply echoes the request's id: {"id":7,"ok":true,...} or
 * {"id":7,"ok":false,"error":{"code":"bad_field","errno":-4003,"message":"..."}}. */
cJSON *proto_reply_ok(int64_t id);
cJSON *proto_reply_error(int64_t id, int code, const char *message);
/* For a client: 0 when reply has ok:true; otherwise the error's code (from its wire
 * name) with the message copied into errbuf. LD_EPROTO when the reply is malformed. */
int proto_reply_status(const cJSON *reply, char *errbuf);
/* A request's id, or -1 when absent/invalid (an id is an integer in [0, 2^53)). */
int64_t proto_request_id(const cJSON *req);

#endif
