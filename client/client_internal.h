/* This file is private to libloaderclient: the layouts behind the opaque handles of
 * client/loaderclient.h. Nothing outside client/ may include it; the Python binding and
 * trainers see only the public header. */
#ifndef LC_CLIENT_INTERNAL_H
#define LC_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cJSON.h>

#include "loaderclient.h"
#include "proto.h"

#define CLIENT_ERRMSG_MAX (2 * LD_ERRMSG_MAX) /* room for our prefix + the daemon's message */
#define CLIENT_REPLY_LIMIT LD_FRAME_MAX_LIMIT /* largest reply frame we accept: 64 MiB */
#define CLIENT_DEFAULT_TIMEOUT_MS 30000
#define CLIENT_READ_AHEAD LC_READ_AHEAD /* next requests a stream keeps ahead of the trainer */
#define CLIENT_DEFER_MAX_FRAMES 32     /* releases queued before they are sent on their own */

/* What to do with a reply when it arrives. Replies come in request order, so the
 * requests still waiting for one form a FIFO. */
enum client_pending_kind {
    CLIENT_PENDING_CALL = 1,    /* someone is waiting for it right now */
    CLIENT_PENDING_RELEASE,     /* pipelined release: an error is recorded, not returned */
    CLIENT_PENDING_NEXT,        /* a next that timed out: its reply is kept for the stream */
    CLIENT_PENDING_IGNORE,      /* its caller gave up (timeout): the reply is dropped */
};

struct client_pending {
    int64_t id;
    int kind;                   /* enum client_pending_kind */
    char op[LD_OP_NAME_MAX + 1]; /* for messages */
    lc_stream *stream;          /* NEXT: the stream to give the reply to */
    uint64_t stream_id;         /* RELEASE: for the error message */
    int slot;                   /* RELEASE */
    uint64_t generation;        /* RELEASE */
};

/* One field of the stream's batch layout, as the open reply gave it (validated). */
struct client_field {
    char name[LD_NAME_MAX];
    int dtype;                  /* LD_DTYPE_* */
    int ndim;                   /* dims of one sample (0 for a scalar; 0 for ragged) */
    int64_t shape[LD_MAX_DIMS];
    bool ragged;
    uint64_t offset;            /* from the slot's start */
    uint64_t row_bytes;         /* fixed: bytes of one sample */
    uint64_t offsets_offset;    /* ragged: int64[batch_size + 1] */
    uint64_t capacity;          /* ragged: bytes available at offset */
};

struct lc_batch {
    lc_stream *stream;
    lc_batch *prev, *next;      /* the stream's list of held batches */
    int slot;
    uint64_t generation;
    uint64_t epoch;
    uint64_t index;
    uint32_t rows;
    const uint8_t *base;        /* the slot's first byte (its struct ld_slot_header) */
    lc_field fields[LD_MAX_FIELDS];
};

struct lc_stream {
    lc_client *client;
    lc_stream *prev, *next;     /* the client's list of streams */
    uint64_t id;
    uint32_t batch_size;
    uint64_t batches_per_epoch;
    uint64_t samples_per_epoch;
    uint32_t slot_count;
    uint64_t slot_size;
    uint64_t slot_offset;
    const uint8_t *map;         /* PROT_READ mapping of the whole ring */
    size_t map_size;
    int ring_fd;                /* the ring's shm, read-only, for lc_stream_ring_fd; -1 when none */
    int n_fields;
    struct client_field fields[LD_MAX_FIELDS];
    lc_batch *batches;          /* held (not yet released) batches */
    /* next requests sent and not yet handed out, oldest first (a ring of
     * CLIENT_READ_AHEAD): their ids, and their replies once read. */
    int64_t ahead_id[CLIENT_READ_AHEAD];
    cJSON *ahead_reply[CLIENT_READ_AHEAD];
    unsigned ahead_head, ahead_count;
    bool ahead_stop;            /* an error answered a next: ask no more ahead */
};

struct lc_client {
    int fd;                     /* non-blocking, close-on-exec; -1 once broken */
    int timeout_ms;             /* default for every call */
    int64_t next_id;
    uint32_t max_frame;         /* the daemon's frame limit, from hello */
    int64_t server_pid;
    uid_t server_uid;           /* the daemon's, from SO_PEERCRED: its rings must be its own */
    proto_reader *reader;
    int broken;                 /* 0, or the code that broke the connection */
    struct client_pending *pending;
    size_t pending_head, pending_len, pending_cap; /* live entries: [head, len) */
    lc_stream *streams;
    uint64_t release_errors;    /* failed pipelined releases (see client_transport.c) */
    int release_failed;         /* the first refused release not yet returned to the caller, or 0 */
    char release_msg[CLIENT_ERRMSG_MAX];
    char *deferred;             /* release frames not yet sent: they go out with the next request */
    size_t deferred_len, deferred_cap;
    unsigned deferred_frames;
    char error[CLIENT_ERRMSG_MAX];
    char broken_msg[CLIENT_ERRMSG_MAX];
};

/* The first published layouts of the versioned structs: a caller's size may not be
 * smaller. */
#define CLIENT_OPTIONS_V0_SIZE (offsetof(lc_stream_options, epochs) + sizeof(uint64_t))
#define CLIENT_FIELD_V0_SIZE (offsetof(lc_field, offsets) + sizeof(const int64_t *))
#define CLIENT_RING_INFO_V0_SIZE (offsetof(lc_ring_info, field_count) + sizeof(int))
#define CLIENT_FIELD_LAYOUT_V0_SIZE (offsetof(lc_field_layout, capacity) + sizeof(uint64_t))
#define CLIENT_BATCH_INFO_V0_SIZE (offsetof(lc_batch_info, slot_offset) + sizeof(uint64_t))

/* ---- client_transport.c: deadlines, errors, requests and replies ------------------ */
int64_t client_now_ms(void);
int client_remaining_ms(int64_t deadline);            /* for poll(): never negative */
int client_effective_timeout(const lc_client *c, int timeout_ms);
/* Formats into a LD_ERRMSG_MAX buffer; long messages are cut, which is fine for errors. */
void client_msgf(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void client_seterr(lc_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Marks the connection broken (closing the fd) and returns code: later calls fail with
 * LC_ECLOSED quoting this message. */
int client_break(lc_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int client_check_usable(lc_client *c);                 /* LC_ECLOSED once broken */
struct client_pending *client_pending_find(lc_client *c, int64_t id);
void client_pending_forget_stream(lc_client *c, const lc_stream *s);
int client_flush_deferred(lc_client *c, int64_t deadline, int timeout_ms);
/* Adds an id to msg (taking ownership of msg) and sends it, after the deferred frames in
 * the same write; with `defer`, queues it among them instead. The FIFO learns what to do
 * with its reply (kind). On success *ret_id is the request's id. */
int client_send_ex(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s, int64_t deadline,
                   int timeout_ms, bool defer, int64_t *ret_id);
int client_send(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s, int64_t deadline,
                int timeout_ms, int64_t *ret_id);
/* Reads replies until the one with id `want` arrives (*ret_reply, the caller's) or the
 * deadline passes (LC_ETIMEDOUT; the request stays in the FIFO). want = -1 settles what
 * has arrived and returns 0 at the deadline. */
int client_wait(lc_client *c, int64_t want, int64_t deadline, int timeout_ms, cJSON **ret_reply);
/* One request and its reply; ok:false comes back as its code, the message in c->error. */
int client_call(lc_client *c, cJSON *msg, const char *op, int timeout_ms, cJSON **ret_reply);
int client_take_release_failure(lc_client *c);

/* ---- client_info.c: versioned structs ---------------------------------------------- */
int client_copy_struct_in(void *dst, size_t ours, const void *src, size_t theirs, size_t min, const char *what,
                          char *msg);
int client_copy_struct_out(void *dst, size_t theirs, const void *src, size_t ours, size_t min);

/* ---- client_stream.c: the open reply and the ring ---------------------------------- */
/* Reads the open reply into s (everything but the mapping); *ret_shm points into reply. */
int client_parse_open(const cJSON *reply, uint32_t batch_size, lc_stream *s, const char **ret_shm,
                      int64_t *ret_shm_size, char *msg);
/* Slot `slot` (0 <= slot < slot_count) of the mapped ring: its header, then its fields. */
const struct ld_slot_header *client_stream_slot(const lc_stream *s, int slot);
void client_stream_free(lc_stream *s);

/* ---- client_next.c ----------------------------------------------------------------- */
void client_next_read_ahead(lc_stream *s, int64_t deadline, int timeout_ms);

/* ---- client_batch.c ---------------------------------------------------------------- */
/* Fills b's field views from its slot, checking every ragged offset array. */
int client_fill_batch(lc_stream *s, lc_batch *b, char *msg);

#endif
