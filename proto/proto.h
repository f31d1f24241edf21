/* proto — the control channel's wire format, shared by loaderd, libloaderclient and
 * loaderctl: framing and JSON encode/decode with checked field access. The facts that
 * need no JSON (constants, limits, dtypes, the shared-memory ring layout) are in
 * ld_wire.h, included here. It knows nothing of libuv or sockets. Library code: it
 * never prints, it returns codes.
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
#include "ld_wire.h" /* constants, limits, dtypes, ring layout: everything without JSON */

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
