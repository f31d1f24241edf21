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
    CLIENT_PENDING_REOPEN,      /* a stream's open after a reconnect: applied to it on arrival */
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

/* The ring of a connection that died while the trainer still held batches of it. No
 * daemon writes it any more; it stays mapped until the last of those batches is
 * released (client_reconnect.c). */
struct client_old_ring {
    const uint8_t *map;
    size_t map_size;
    int fd;
    unsigned refs;              /* held batches that point into it */
    /* Whether releasing its batches is owed to the daemon, under stream release_id: not
     * when the daemon that leased them is gone; yes for a shared stream's consumer that
     * was detached (the daemon keeps those slots until they come back). */
    bool release;
    uint64_t release_id;
};

struct lc_batch {
    lc_stream *stream;
    struct client_old_ring *old; /* NULL: a batch of the stream's current ring */
    lc_batch *prev, *next;      /* the stream's list of held batches */
    int slot;
    uint64_t generation;
    uint64_t epoch;
    uint64_t index;
    uint32_t rows;
    uint64_t slot_offset;       /* of the slot in its ring */
    uint64_t reopens;           /* the stream's reopens when handed out (its ring's) */
    const uint8_t *base;        /* the slot's first byte (its struct ld_slot_header) */
    lc_field fields[LD_MAX_FIELDS];
    void *dev_stream;           /* device streams: the CUDA stream lc_batch_device_wait was given */
    bool dev_waited;
};

struct lc_stream {
    lc_client *client;
    lc_stream *prev, *next;     /* the client's list of streams */
    uint64_t id;
    uint64_t ring_id;           /* the id in the ring's header: id, or a shared stream's producer */
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
    /* What a reopen after a daemon restart needs (client_reconnect.c): the stream as
     * opened, and the position of the next batch to hand out. */
    char *dataset;
    lc_stream_options opts;     /* as opened: first epoch, epochs, seed, ... */
    uint64_t next_epoch, next_batch;
    bool needs_reopen;          /* the connection died: open it again once reconnected */
    int64_t reopen_id;          /* the reopen request awaiting its reply, or -1 */
    uint64_t reopens;           /* times it was reopened on a new connection */
    int failed;                 /* 0, or why it cannot go on (a reopen failed) */
    char failed_msg[CLIENT_ERRMSG_MAX];
    int dev_ordinal;            /* -1: a host stream */
    struct client_device *dev;  /* client_device.c; NULL for a host stream or while detached */
    char *dev_name, *dev_norm;  /* copies of opts.device and opts.device_normalize */
    char *spec;                 /* copy of opts.spec (NULL: a configured dataset) */
    bool spec_template;         /* spec refines `dataset` (else dataset is only a label) */
    /* Batches handed off in shared memory (client_handoff.c), or NULL: the socket. */
    struct client_handoff *ho;
    bool ho_over;               /* the hand-off ended: the socket says why */
};

/* Descriptors received and not yet claimed by a reply (SCM_RIGHTS): a few at most. */
#define CLIENT_FDS_IN 4

struct lc_client {
    int fd;                     /* non-blocking, close-on-exec; -1 once broken */
    /* Descriptors that came with replies (client_transport.c): received in order, and
     * each claimed by the next reply that says one comes with it, which parks it here
     * for the call that reads that reply (the hand-off's memory). */
    int fds_in[CLIENT_FDS_IN];
    unsigned n_fds_in;
    bool fds_lost;              /* more came than fit, or were cut: a claim then fails */
    int passed_fd;              /* parked for the reply with id passed_id, or -1 */
    int64_t passed_id;
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
    /* Reconnecting after the daemon went away (client_reconnect.c). */
    char *socket_path;          /* the resolved path connected to */
    char *name;                 /* the hello's client name, or NULL */
    int reconnect_ms;           /* how long to keep trying; 0: never */
    bool lost;                  /* the connection is gone and not yet made again */
    int64_t lost_since;         /* when the outage began (0: none); ends once every stream is reopened */
    int64_t next_try;           /* earliest time of the next attempt */
    unsigned attempts;          /* failed attempts of this outage */
    uint64_t reconnects;        /* successful reconnections */
    char lost_msg[CLIENT_ERRMSG_MAX];  /* what ended the connection */
    char retry_msg[CLIENT_ERRMSG_MAX]; /* why the last attempt failed */
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
int client_check_usable(lc_client *c);                 /* LC_ECLOSED once broken, LC_ECONNRESET while lost */
/* recv() on the connection that also takes the descriptors sent with the bytes. */
ssize_t client_recv(lc_client *c, void *buf, size_t len);
/* The descriptor that came with the reply `id` (the caller's from now on), or -1. */
int client_take_passed_fd(lc_client *c, int64_t id);
/* Closes every descriptor received and not claimed (the connection goes). */
void client_fds_reset(lc_client *c);
struct client_pending *client_pending_find(lc_client *c, int64_t id);
void client_pending_forget_stream(lc_client *c, const lc_stream *s);
/* A shared stream's consumer was detached (its next answered LC_EDETACHED): its held
 * batches keep the shared ring (released under the old id), and the stream is reopened,
 * unshared, at its next batch by the next call. LC_EDETACHED when there is nothing to
 * reopen (the stream is over or failed). */
int client_stream_detached(lc_stream *s);
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

/* ---- client_connect.c ------------------------------------------------------------- */
/* A new connection to path (connect, identity check, hello) before deadline: a client
 * with no stream. On failure errbuf says why. */
int client_dial(const char *path, int64_t deadline, int timeout_ms, const char *name, lc_client **ret_client,
                char *errbuf, size_t errbuf_size);
void client_free(lc_client *c);

/* ---- client_reconnect.c: surviving a daemon restart -------------------------------- */
/* The daemon hung up (EOF, reset, broken pipe): with reconnection on, the connection is
 * marked lost (every stream detached from its ring and due for a reopen) and the next
 * call reconnects; with it off, this is client_break. Returns LC_ECONNRESET. */
int client_lost(lc_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads LOADERD_RECONNECT into c->reconnect_ms (default CLIENT_RECONNECT_DEFAULT_MS). */
int client_reconnect_init(lc_client *c, char *errbuf, size_t errbuf_size);
/* Makes the connection again if it was lost, before deadline (LC_ETIMEDOUT, to be
 * resumed by a later call), or gives up once the reconnect time is over. */
int client_reconnect(lc_client *c, int64_t deadline, int timeout_ms);
/* The stream is usable: connected, reopened, not failed. May wait for the reopen. */
int client_stream_ready(lc_stream *s, int64_t deadline, int timeout_ms);
/* Applies the reply to a stream's reopen (any caller that reads it). Takes reply. */
void client_stream_reopened(lc_stream *s, cJSON *reply);
/* The same for a reply read by another call; a stream closed meanwhile (NULL) has the
 * daemon's new stream closed. Takes reply. */
void client_stream_reopened_or_orphan(lc_client *c, lc_stream *s, cJSON *reply);
/* Frees a batch, dropping its hold on an old ring. */
void client_batch_free(lc_batch *b);
/* The stream has delivered every epoch it was opened for. */
bool client_stream_over(const lc_stream *s);
/* Builds an open request for s's options at (epoch, start_batch), asking for the
 * hand-off in shared memory when `handoff`. */
cJSON *client_open_request(const char *dataset, const lc_stream_options *o, uint64_t epoch, uint64_t start_batch,
                           uint64_t epochs, bool handoff);
#define CLIENT_RECONNECT_DEFAULT_MS LC_RECONNECT_DEFAULT_MS

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
/* Maps the ring named by an open reply into s and checks its header. */
int client_map_ring(lc_stream *s, const char *shm, uint64_t shm_size, char *msg);

/* ---- client_handoff.c: batches through shared memory -------------------------------- */
/* Whether an open with these options asks for the hand-off (LOADERD_HANDOFF=socket: no). */
bool client_handoff_wanted(const lc_stream_options *o);
/* Maps the hand-off an open reply offers and starts it (one `handoff` request). 0 with
 * s->ho set, or 0 without it when the reply offers none; < 0 when the connection broke. */
int client_handoff_attach(lc_stream *s, const cJSON *reply, char *msg);
/* The next entry of the ready queue, waiting until deadline: 0 with *ret set, 1 when the
 * hand-off ended (a `next` on the socket says why), or < 0 (LC_ETIMEDOUT, a lost or
 * broken connection, LC_EPROTO for a queue that makes no sense). */
int client_handoff_next(lc_stream *s, int64_t deadline, int timeout_ms, struct ld_handoff_ready *ret);
/* Gives a slot back through the release queue (and wakes an idle daemon when it is time). */
int client_handoff_release(lc_stream *s, int slot, uint64_t generation);
/* Unmaps it (the stream closes, or its connection is gone). Accepts a stream without one. */
void client_handoff_close(lc_stream *s);

/* ---- client_next.c ----------------------------------------------------------------- */
void client_next_read_ahead(lc_stream *s, int64_t deadline, int timeout_ms);

/* ---- client_batch.c ---------------------------------------------------------------- */
/* Fills b's field views from its slot, checking every ragged offset array. */
int client_fill_batch(lc_stream *s, lc_batch *b, char *msg);

#endif
