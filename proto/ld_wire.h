/* ld_wire — the facts of loaderd's wire that need no JSON: protocol and frame
 * constants, the limits every party checks, operation names, dtypes and the
 * shared-memory ring layout (pinned with offsetof asserts). The daemon, libloaderclient
 * and loaderctl include it; the JSON codec is proto.h, which includes this file.
 *
 * The limits are the single statement of each bound: the daemon validates requests and
 * its config against them, the client library validates replies against them and hands
 * them out by name (lc_limit), and the Python binding reads them from the library.
 * Never change a constant here without a protocol version bump.
 */
#ifndef LD_WIRE_H
#define LD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ld_error.h"

#define LD_PROTO_VERSION 1
#define LD_FRAME_HEADER_SIZE 4u
#define LD_FRAME_MIN_LIMIT 1024u               /* smallest max_frame a config may set */
#define LD_FRAME_DEFAULT_LIMIT (1u << 20)      /* 1 MiB */
#define LD_FRAME_MAX_LIMIT (64u << 20)         /* 64 MiB */
#define LD_JSON_MAX_DEPTH 16                   /* deeper nesting is rejected before cJSON sees it */
#define LD_NAME_MAX 64                         /* dataset, field and client names, including the NUL */
#define LD_MAX_FIELDS 8                        /* fields per batch */
#define LD_MAX_DIMS 4                          /* dims per field, after the batch dim */
#define LD_ERRMSG_MAX 512                      /* error message buffers */
#define LD_JSON_SAFE_INT 9007199254740991LL    /* 2^53 - 1: larger integers lose precision in JSON */

/* ---- limits ---------------------------------------------------------------------- */
#define LD_BATCH_SIZE_MAX 65536     /* open: batch_size in [1, this] */
#define LD_WORLD_SIZE_MAX 65536     /* open: world_size in [1, this]; rank < world_size */
#define LD_PREFETCH_MAX 64          /* open and server.prefetch: batches prepared ahead, >= 1 */
#define LD_WORKERS_MAX 1024         /* server.workers (0: one per CPU, capped here) */
#define LD_SLOT_COUNT_MAX 65536     /* slots of one ring a client accepts from an open reply */
#define LD_SHM_NAME_MAX 96          /* a ring's shared-memory name, including the NUL */
#define LD_OP_NAME_MAX 32           /* a request's "op", excluding the NUL */
/* Epochs travel as JSON numbers (the open request, every next reply), so the largest
 * one a stream may reach is the largest integer a double holds exactly. */
#define LD_EPOCH_MAX LD_JSON_SAFE_INT

/* X(public name, value): the limits by name, for lc_limit() and the Python binding. */
#define LD_LIMIT_MAP(X)                           \
    X("batch_size_max", LD_BATCH_SIZE_MAX)        \
    X("world_size_max", LD_WORLD_SIZE_MAX)        \
    X("prefetch_max", LD_PREFETCH_MAX)            \
    X("workers_max", LD_WORKERS_MAX)              \
    X("slot_count_max", LD_SLOT_COUNT_MAX)        \
    X("shm_name_max", LD_SHM_NAME_MAX)            \
    X("op_name_max", LD_OP_NAME_MAX)              \
    X("epoch_max", LD_EPOCH_MAX)                  \
    X("name_max", LD_NAME_MAX)                    \
    X("fields_max", LD_MAX_FIELDS)                \
    X("dims_max", LD_MAX_DIMS)                    \
    X("frame_max", LD_FRAME_MAX_LIMIT)            \
    X("errmsg_max", LD_ERRMSG_MAX)

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
#define LD_OP_RELOAD "reload"
#define LD_OP_HANDOFF "handoff"

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
_Static_assert(offsetof(struct ld_ring_header, magic) == 0, "ld_ring_header.magic");
_Static_assert(offsetof(struct ld_ring_header, version) == 4, "ld_ring_header.version");
_Static_assert(offsetof(struct ld_ring_header, slot_count) == 8, "ld_ring_header.slot_count");
_Static_assert(offsetof(struct ld_ring_header, slot_size) == 16, "ld_ring_header.slot_size");
_Static_assert(offsetof(struct ld_ring_header, slot_offset) == 24, "ld_ring_header.slot_offset");
_Static_assert(offsetof(struct ld_ring_header, total_size) == 32, "ld_ring_header.total_size");
_Static_assert(offsetof(struct ld_ring_header, stream_id) == 40, "ld_ring_header.stream_id");
_Static_assert(offsetof(struct ld_ring_header, reserved) == 48, "ld_ring_header.reserved");

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
_Static_assert(offsetof(struct ld_slot_header, generation) == 0, "ld_slot_header.generation");
_Static_assert(offsetof(struct ld_slot_header, epoch) == 8, "ld_slot_header.epoch");
_Static_assert(offsetof(struct ld_slot_header, batch) == 16, "ld_slot_header.batch");
_Static_assert(offsetof(struct ld_slot_header, rows) == 24, "ld_slot_header.rows");
_Static_assert(offsetof(struct ld_slot_header, reserved) == 32, "ld_slot_header.reserved");

/* ---- batch hand-off through shared memory (an open with "handoff": 2) -----------
 * One object per stream and connection, beside the ring, with no name: its descriptor
 * comes with the open reply (SCM_RIGHTS; the reply's "handoff" object says "fd": true),
 * and it is sealed to its size. A header, a ready queue that
 * the daemon writes (each entry a batch leased to the connection, in stream order) and
 * a release queue that the client writes (each entry a slot it gives back). Unlike the
 * ring, the client maps it read-write; the daemon trusts nothing in it: every release
 * entry is checked against the ring's own state, and the connection still owns every
 * lease (a closed connection gives back every slot, whatever the queues say).
 *
 * Sleeping: a client with nothing to read sets `client_waiting`, checks the queue once
 * more and waits on the futex word `ready_seq` (FUTEX_WAIT, not private: the word is
 * shared); the daemon bumps `ready_seq` after every entry and, when `client_waiting`
 * is set, wakes the client, once per sleep (the daemon never writes `client_waiting`).
 * A client that sets it to LD_HANDOFF_WAIT_BRIEF promises to look at the queue again by
 * itself within LD_HANDOFF_BRIEF_NS: its wake-up may then be held back until a few
 * entries are ready (LD_HANDOFF_WAIT_SLEEP, 1: woken at the first). The daemon takes
 * releases, and reads `ready_head` (batches
 * handed over and not yet taken count towards the stream's prefetch), whenever a batch
 * is filled. With nothing filling (every slot leased, or the prefetch made of batches
 * the client has not taken) it sets `daemon_idle` to a new non-zero number; the client
 * then sends one `handoff` request on the socket for that number (the daemon's loop
 * sleeps in epoll, not on a futex): once it has taken and released `wake_after`
 * batches since, or before it sleeps. An entry with `rows` 0 ends the hand-off: the
 * stream ended, failed or was ended by the daemon, and a `next` on the socket answers
 * why (code and message); the daemon also writes one when it closes the stream with its
 * connection, so a sleeping client wakes at once and reads the connection's last error
 * on the socket. Entries before it are batches leased before the end. Counters only grow;
 * entry i of a queue is at i % capacity. Never change without a version bump. */
#define LD_HANDOFF_MAGIC 0x464f484cu  /* "LHOF" little-endian */
#define LD_HANDOFF_VERSION 2u     /* 1: the object was opened by name (no longer offered) */
#define LD_HANDOFF_QUEUE_MAX 131072u  /* capacity: a power of two above the ring's slot count */
#define LD_HANDOFF_WAIT_SLEEP 1u      /* client_waiting: asleep; wake it at the first entry */
#define LD_HANDOFF_WAIT_BRIEF 2u      /* asleep at most LD_HANDOFF_BRIEF_NS, then it looks itself */
/* Not shorter: a sleep whose timeout comes before the kernel's next tick reprograms the
 * timer at each sleep and wake-up, which doubled a fast trainer's CPU (1 ms measured). */
#define LD_HANDOFF_BRIEF_NS 5000000u

struct ld_handoff_header {
    uint32_t magic;
    uint32_t version;
    uint32_t capacity;          /* entries per queue, a power of two */
    uint32_t slot_count;        /* of the stream's ring */
    uint64_t stream_id;
    uint64_t ready_offset;      /* struct ld_handoff_ready[capacity] */
    uint64_t release_offset;    /* struct ld_handoff_release[capacity] */
    uint64_t total_size;
    uint8_t reserved0[16];
    /* written by the daemon (its own cache line) */
    uint64_t ready_tail;        /* ready entries published */
    uint64_t release_head;      /* release entries taken */
    uint32_t ready_seq;         /* futex word: bumped after each entry */
    uint32_t daemon_idle;       /* 0, or the number of the idle spell a wake-up should end */
    uint32_t wake_after;        /* batches taken and released before an idle daemon is woken */
    uint8_t reserved1[36];
    /* written by the client (its own cache line) */
    uint64_t ready_head;        /* ready entries taken (informative: the daemon never needs it) */
    uint64_t release_tail;      /* release entries published */
    uint32_t client_waiting;    /* LD_HANDOFF_WAIT_*: it sleeps on ready_seq (the client's alone to write) */
    uint8_t reserved2[44];
};
_Static_assert(sizeof(struct ld_handoff_header) == 192, "ld_handoff_header is wire layout");
_Static_assert(offsetof(struct ld_handoff_header, capacity) == 8, "ld_handoff_header.capacity");
_Static_assert(offsetof(struct ld_handoff_header, stream_id) == 16, "ld_handoff_header.stream_id");
_Static_assert(offsetof(struct ld_handoff_header, ready_offset) == 24, "ld_handoff_header.ready_offset");
_Static_assert(offsetof(struct ld_handoff_header, release_offset) == 32, "ld_handoff_header.release_offset");
_Static_assert(offsetof(struct ld_handoff_header, total_size) == 40, "ld_handoff_header.total_size");
_Static_assert(offsetof(struct ld_handoff_header, ready_tail) == 64, "ld_handoff_header.ready_tail");
_Static_assert(offsetof(struct ld_handoff_header, release_head) == 72, "ld_handoff_header.release_head");
_Static_assert(offsetof(struct ld_handoff_header, ready_seq) == 80, "ld_handoff_header.ready_seq");
_Static_assert(offsetof(struct ld_handoff_header, daemon_idle) == 84, "ld_handoff_header.daemon_idle");
_Static_assert(offsetof(struct ld_handoff_header, wake_after) == 88, "ld_handoff_header.wake_after");
_Static_assert(offsetof(struct ld_handoff_header, ready_head) == 128, "ld_handoff_header.ready_head");
_Static_assert(offsetof(struct ld_handoff_header, release_tail) == 136, "ld_handoff_header.release_tail");
_Static_assert(offsetof(struct ld_handoff_header, client_waiting) == 144, "ld_handoff_header.client_waiting");

/* A batch leased to the connection: what a `next` reply says. rows 0: the end (see above). */
struct ld_handoff_ready {
    uint32_t slot;
    uint32_t rows;
    uint64_t generation;
    uint64_t epoch;
    uint64_t batch;
};
_Static_assert(sizeof(struct ld_handoff_ready) == 32, "ld_handoff_ready is wire layout");
_Static_assert(offsetof(struct ld_handoff_ready, rows) == 4, "ld_handoff_ready.rows");
_Static_assert(offsetof(struct ld_handoff_ready, generation) == 8, "ld_handoff_ready.generation");
_Static_assert(offsetof(struct ld_handoff_ready, epoch) == 16, "ld_handoff_ready.epoch");
_Static_assert(offsetof(struct ld_handoff_ready, batch) == 24, "ld_handoff_ready.batch");

/* A slot given back: what a `release` request says. */
struct ld_handoff_release {
    uint32_t slot;
    uint32_t reserved;
    uint64_t generation;
};
_Static_assert(sizeof(struct ld_handoff_release) == 16, "ld_handoff_release is wire layout");
_Static_assert(offsetof(struct ld_handoff_release, generation) == 8, "ld_handoff_release.generation");

/* ---- device stage (an open with "device": "cuda:N") -----------------------------
 * The open reply's "device" object (proto_device_encode / proto_device_decode) carries
 * the device ring once per stream: one memory handle for the whole ring and, per slot,
 * a "ready" event (the daemon records it when the slot's copy is done) and a "done"
 * event (the trainer records it before it releases the slot; the daemon's copy stream
 * waits on it before it overwrites that device slot). Handles travel as hex strings of
 * exactly 2 * LD_IPC_HANDLE_SIZE characters. Per batch only slot and generation cross
 * the socket, as for host batches. Never change without a version bump. */
#define LD_DEVICE_NAME_MAX 16              /* "cuda:N", including the NUL */
#define LD_DEVICE_ORDINAL_MAX 255          /* the N of cuda:N */
#define LD_DEVICE_SLOT_ALIGN (2u << 20)    /* device slots are multiples of 2 MiB */
#define LD_DEVICE_SLOT_COUNT_MAX (LD_PREFETCH_MAX + 8) /* device slots of one stream */
#define LD_IPC_HANDLE_SIZE 64              /* cudaIpcMemHandle_t and cudaIpcEventHandle_t */
#define LD_TRANSFER_IPC "ipc"              /* the daemon copies; the trainer imports its memory */
#define LD_TRANSFER_CLIENT "client"        /* the trainer copies from its read-only host mapping */

/* The bytes of one CUDA IPC handle, opaque to everything but the CUDA backends (which
 * pin sizeof(cudaIpcMemHandle_t) and sizeof(cudaIpcEventHandle_t) to this size). */
struct ld_ipc_handle {
    uint8_t bytes[LD_IPC_HANDLE_SIZE];
};
_Static_assert(sizeof(struct ld_ipc_handle) == 64, "ld_ipc_handle is wire layout");
_Static_assert(offsetof(struct ld_ipc_handle, bytes) == 0, "ld_ipc_handle.bytes");

/* Writes the 4-byte big-endian header for a payload of `len` bytes. */
void proto_frame_header(uint32_t len, uint8_t out[LD_FRAME_HEADER_SIZE]);

#endif
