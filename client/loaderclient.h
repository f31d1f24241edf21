/* libloaderclient — attach a trainer to loaderd.
 *
 * Blocking calls with timeouts; no event loop needed. A client is one connection to the
 * daemon; a stream is one ordered sequence of batches of a dataset; a batch is a lease
 * on one slot of the stream's shared-memory ring, mapped read-only into this process:
 * its fields are zero-copy views that stay valid until lc_batch_release().
 *
 * Every function returns 0 or a negative LC_E* code; lc_client_error() gives the
 * message of the client's last failure (the daemon's own message for daemon errors).
 * A client and its streams are used from one thread at a time.
 *
 * Versions and growth: the library's soname is libloaderclient.so.<major>; within a
 * major version, a trainer compiled against an older header keeps working with a newer
 * library. The structs a trainer allocates carry the size it was compiled with:
 * lc_stream_options starts with `struct_size` (set by lc_stream_options_init), and
 * lc_batch_field() is a macro that passes sizeof(lc_field). The library reads and
 * writes only that many bytes, so members can be added at the end (a device build adds
 * the device fields there) without breaking compiled trainers: members a trainer does
 * not know take their defaults. A trainer compiled against a newer header than the
 * library gets LC_ENOTSUP when it sets a member the library does not know (all-zero
 * unknown members are accepted: they are the defaults).
 */
#ifndef LOADERCLIENT_H
#define LOADERCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LC_EXPORT __attribute__((visibility("default")))
#else
#define LC_EXPORT
#endif

/* Error codes: LC_OK and one LC_E* per code the daemon can send (LC_EINVAL, LC_EFIELD,
 * LC_ENODATASET, ...), generated from the one table the daemon uses too. Every code has
 * a wire name (lc_error_name) and a sentence (lc_strerror). */
#include "loaderclient_errors.h"

/* Field element types (same numbers as the wire's dtypes). */
#define LC_DTYPE_UINT8 1
#define LC_DTYPE_UINT16 2
#define LC_DTYPE_UINT32 3
#define LC_DTYPE_INT32 4
#define LC_DTYPE_INT64 5
#define LC_DTYPE_FLOAT16 6
#define LC_DTYPE_FLOAT32 7

#define LC_MAX_DIMS 5 /* batch dim + up to 4 */
/* Next requests a stream keeps outstanding ahead of the trainer: that many slots may be
 * leased to a stream whose trainer holds no batch. */
#define LC_READ_AHEAD 2

typedef struct lc_client lc_client;
typedef struct lc_stream lc_stream;
typedef struct lc_batch lc_batch;

/* One field of a batch: a view into the mapped ring, valid until the batch is released.
 * New members are added at the end only. */
typedef struct lc_field {
    const char *name;
    int dtype;                    /* LC_DTYPE_* */
    int ndim;                     /* including the batch dimension (shape[0] = rows) */
    int64_t shape[LC_MAX_DIMS];
    const void *data;             /* fixed: rows * row bytes, C order; ragged: the bytes */
    size_t nbytes;                /* bytes at data */
    const int64_t *offsets;       /* ragged only: rows + 1 offsets into data; else NULL */
} lc_field;

/* Initialise with lc_stream_options_init() (it sets struct_size and the defaults), then
 * set what differs. */
typedef struct lc_stream_options {
    size_t struct_size;           /* sizeof(lc_stream_options) as compiled; set by lc_stream_options_init */
    uint32_t batch_size;          /* required, in [1, lc_limit("batch_size_max")] */
    int shuffle;                  /* default 1 */
    uint64_t seed;                /* default 0 */
    uint64_t epoch;               /* first epoch, default 0 */
    int32_t rank;                 /* default 0 */
    int32_t world_size;           /* default 1; at most lc_limit("world_size_max") */
    int drop_last;                /* default 0 */
    uint64_t start_batch;         /* resume within the first epoch, default 0 */
    uint32_t prefetch;            /* 0 = the daemon's default; at most lc_limit("prefetch_max") */
    uint64_t epochs;              /* 0 = unbounded; else LC_EEND after that many */
    /* Device batches (see "device batches" below); new in 0.1 device builds. */
    const char *device;           /* NULL: host batches; "cuda:N": batches on GPU N */
    int transfer;                 /* LC_TRANSFER_IPC (default) or LC_TRANSFER_CLIENT */
    /* NULL, or a JSON object: the daemon's GPU casts and normalizes a uint8 image field as
     * the batch's last step, {"field": "image", "mean": [...], "std": [...], "dtype":
     * "float16" | "float32", "layout": "CHW" | "HWC" (the field's on the host)}; the
     * device field is then float, CHW (transfer ipc only). */
    const char *device_normalize;
    /* NULL, or a JSON object: a dataset the trainer declares (the keys of a
     * dataset in the daemon's config: kind, path, pattern, transforms, on_error, ...).
     * With lc_stream_open's dataset NULL it is the whole dataset, which the daemon's
     * access.declare must allow (its path beneath an allowed root, every file readable
     * by this process's user); with a configured dataset's name, it holds the keys
     * that refine that dataset (e.g. {"transforms": [...]}). Errors: LC_EDENIED (not
     * allowed, naming what), LC_ECONFIG ("spec.KEY: ..."), LC_ENOTSUP. The daemon owns
     * the declared dataset while the stream is open; a reconnect declares it again. */
    const char *spec;
    /* Shared streams (see "shared streams" in the README); new in 0.1. NULL: a stream of
     * its own. A name: every stream opened with that name and the same dataset and
     * settings (batch_size, shuffle, seed, epoch, epochs, rank, world_size, drop_last)
     * reads one ring, each batch prepared once; "auto": the same, named by the settings.
     * Host batches only. */
    const char *share;
    int share_join;               /* LC_SHARE_JOIN_CURRENT (default) or LC_SHARE_JOIN_EPOCH_START */
    /* How batches are announced and given back (new in 0.1.1):
     *   LC_HANDOFF_SHM (0, the default)  through shared memory, a ready queue and a
     *       release queue beside the ring: no socket message per batch (a daemon that
     *       does not offer it is served through the socket);
     *   LC_HANDOFF_SOCKET  one `next` and one `release` message per batch.
     * The environment variable LOADERD_HANDOFF=socket turns the default into
     * LC_HANDOFF_SOCKET for a whole process. */
    int handoff;
} lc_stream_options;
#define LC_HANDOFF_SHM 0
#define LC_HANDOFF_SOCKET 1

/* Where a stream joins a shared stream that is already running: at the next batch the
 * group prepares (start_batch is then ignored), or in a stream of its own at batch 0 of
 * the epoch the group is in. A consumer that falls more than the daemon's
 * server.share_max_lag batches behind is detached: lc_stream_next reopens it, unshared,
 * at its next batch (lc_stream_reopens counts it), and its batches stay the same. */
#define LC_SHARE_JOIN_CURRENT 0
#define LC_SHARE_JOIN_EPOCH_START 1

/* The library's version, "MAJOR.MINOR.PATCH", and as MAJOR * 10000 + MINOR * 100 + PATCH
 * (0.1.0 is 100), for run-time checks against the pkg-config version compiled against. */
LC_EXPORT const char *lc_version(void);
LC_EXPORT int lc_version_number(void);
/* A sentence for a code ("no such dataset"); never NULL. */
LC_EXPORT const char *lc_strerror(int code);
/* The wire name of a code ("no_such_dataset"; "ok" for 0); never NULL: "unknown_error"
 * for a code not in the table. */
LC_EXPORT const char *lc_error_name(int code);
/* The index-th code of the table (0 <= index), 0 past its end: for bindings that build
 * their own view of the table (the Python binding does). */
LC_EXPORT int lc_error_code(int index);
/* A limit of the protocol by name: "batch_size_max", "world_size_max", "prefetch_max",
 * "workers_max", "slot_count_max", "shm_name_max" (with the NUL), "op_name_max",
 * "epoch_max", "name_max" (with the NUL), "fields_max", "dims_max", "frame_max",
 * "errmsg_max". LC_EINVAL for an unknown name. lc_limit_name(i) lists them (NULL past
 * the end). */
LC_EXPORT int64_t lc_limit(const char *name);
LC_EXPORT const char *lc_limit_name(int index);
/* The default socket, the daemon's default too: $LOADERD_SOCKET, else
 * $XDG_RUNTIME_DIR/loaderd.sock when that is an absolute path to a directory of this
 * user's with mode 0700, else /tmp/loaderd-<uid>/loaderd.sock (a private 0700
 * directory). It does not read a config file: lc_socket_resolve does. */
LC_EXPORT const char *lc_default_socket(void);
/* The socket a client connects to, into buf (size bytes), in this order (what the
 * caller names, as command-line flags, before the environment):
 *  1. socket_path, when not NULL (`loaderctl --socket`);
 *  2. server.socket of the daemon's YAML config at config_path, when not NULL
 *     (`loaderctl --config`);
 *  3. $LOADERD_SOCKET, when set and not empty;
 *  4. server.socket of the config named by $LOADERD_CONFIG, when set and not empty;
 *  5. the default ($XDG_RUNTIME_DIR/loaderd.sock or /tmp/loaderd-<uid>/loaderd.sock, as
 *     lc_default_socket).
 * lc_connect(NULL, ...) connects where lc_socket_resolve(NULL, NULL, ...) says. A config
 * that is asked for but gives no usable socket is an error, never a fall back to the
 * default: LC_ECONFIG with "FILE:LINE:COLUMN: ..." in errbuf when server.socket is
 * missing, not a non-empty string, a relative path (the daemon resolves those against
 * its own working directory) or longer than a socket address holds; LC_ENOENT (or
 * another errno code) when the file cannot be opened. */
LC_EXPORT int lc_socket_resolve(const char *socket_path, const char *config_path, char *buf, size_t size,
                                char *errbuf, size_t errbuf_size);
/* Steps 2 and 4 alone: server.socket of the config file at config_path, checked as above. */
LC_EXPORT int lc_socket_from_config(const char *config_path, char *buf, size_t size, char *errbuf,
                                    size_t errbuf_size);

/* Connects (NULL socket_path: lc_default_socket()) and says hello. The socket is
 * opened close-on-exec. The daemon's identity is checked first (SO_PEERCRED): it must
 * run as $LOADERD_UID (a uid or a user name) when that is set, else as this user or
 * root; LC_EPERM with both uids in the message otherwise. The default socket's
 * directory must be private (LC_EACCES otherwise), and every ring the client maps must
 * belong to the daemon's uid and not be writable by others (LC_EPERM). timeout_ms bounds the connect and hello, and is the default
 * timeout of later requests (<= 0: 30 s). On failure *ret_client is untouched and,
 * when errbuf is not NULL, a message is written there (errbuf_size bytes). */
LC_EXPORT int lc_connect(const char *socket_path, int timeout_ms, const char *client_name,
                         lc_client **ret_client, char *errbuf, size_t errbuf_size);
/* ---- surviving a daemon restart ------------------------------------------------------
 * When the daemon goes away (it hangs up without an error: an upgrade, a crash, a
 * systemd restart), the client connects again to the same socket, with a growing pause
 * between attempts (20 ms doubling to 1 s), for at most its reconnect time, and reopens
 * each stream at the batch after the last one lc_stream_next handed out: no batch is
 * repeated or skipped, and batches keep their epoch and index. lc_stream_next rides
 * through it (it returns LC_ETIMEDOUT when its own timeout ends first: call again); other
 * calls that were waiting for a reply fail with LC_ECONNRESET and the next call
 * reconnects. Batches held across the restart stay readable and valid until released;
 * releasing them sends nothing. A daemon that comes back with another dataset under the
 * name (other batch or sample counts per epoch, other fields) fails the stream with
 * LC_EDATASET. Past the reconnect time the connection is closed: LC_ECONNRESET, with a
 * message saying how long it tried, then LC_ECLOSED.
 * The reconnect time is $LOADERD_RECONNECT seconds at lc_connect (a decimal number; 0
 * turns reconnecting off; an invalid value fails lc_connect with LC_EINVAL), else 60 s. */
#define LC_RECONNECT_DEFAULT_MS 60000
/* Sets the reconnect time in milliseconds (0: never reconnect). LC_EINVAL when negative. */
LC_EXPORT int lc_client_set_reconnect(lc_client *c, int timeout_ms);
/* 1 while the connection is gone and the client is trying to make it again, else 0. */
LC_EXPORT int lc_client_reconnecting(const lc_client *c);
/* How many times the client reconnected. */
LC_EXPORT uint64_t lc_client_reconnects(const lc_client *c);
/* How many times the stream was reopened after a reconnect. Each reopen gives it a new
 * ring: lc_stream_id, lc_stream_ring, lc_stream_ring_fd, the slot offsets and field
 * offsets may all change (bindings that map slots themselves map them again); batches
 * handed out before keep their own ring. */
LC_EXPORT uint64_t lc_stream_reopens(const lc_stream *s);

/* Closes every stream of the client (releasing their batches) and the connection.
 * Accepts NULL. Batches and streams of the client must not be used afterwards. */
LC_EXPORT void lc_client_close(lc_client *c);
/* Message of the client's last failure ("" when none). */
LC_EXPORT const char *lc_client_error(const lc_client *c);

/* Sends a raw request (a JSON object without "id"; the library adds it) and returns
 * the whole reply as a malloc'd JSON string (free with lc_free). Daemon errors are
 * returned as codes, with the message in lc_client_error(). For status, datasets,
 * streams. */
LC_EXPORT int lc_request_json(lc_client *c, const char *request_json, char **ret_reply_json);
LC_EXPORT void lc_free(void *p);

/* Sets struct_size = sizeof(lc_stream_options) and every default. */
LC_EXPORT void lc_stream_options_init(lc_stream_options *o);
/* Opens a stream and maps its ring. LC_EINVAL when o->struct_size is smaller than the
 * first version of the struct (not initialised with lc_stream_options_init). `dataset`
 * may be NULL when o->spec declares the dataset. */
LC_EXPORT int lc_stream_open(lc_client *c, const char *dataset, const lc_stream_options *o,
                             lc_stream **ret_stream);
LC_EXPORT uint64_t lc_stream_batches_per_epoch(const lc_stream *s);
LC_EXPORT uint64_t lc_stream_samples_per_epoch(const lc_stream *s);
LC_EXPORT uint64_t lc_stream_id(const lc_stream *s);
/* Bytes of the mapped ring: [base, base + size). For zero-copy checks. */
LC_EXPORT const void *lc_stream_ring(const lc_stream *s, size_t *ret_size);

/* ---- the ring's layout, for trainers and bindings that map slots themselves --------
 * The library maps the ring read-only and checks its layout against the daemon's open
 * reply; these calls hand that checked layout out, so that nobody restates it. A binding
 * that wants views of its own (the Python one maps each slot privately, copy-on-write,
 * so that a trainer may write into a batch without touching the daemon's memory) maps
 * lc_stream_ring_fd() at lc_stream_slot_offset() and finds each field at the offsets of
 * lc_stream_field_layout(). Offsets are in bytes; a slot's offset is the same in the
 * descriptor and in lc_stream_ring()'s mapping. */

/* The ring as a whole. New members are added at the end only (see lc_field). */
typedef struct lc_ring_info {
    uint64_t size;                /* bytes of the ring's shared memory (lc_stream_ring's mapping) */
    uint32_t slot_count;
    uint64_t slot_size;           /* bytes of one slot: its header, then its fields */
    uint64_t slot_header_size;    /* bytes of a slot's header (generation, epoch, batch, rows) */
    int field_count;              /* fields of every batch (lc_stream_field_layout) */
} lc_ring_info;

/* One field's place in every slot of a stream. New members are added at the end only. */
typedef struct lc_field_layout {
    const char *name;             /* valid while the stream is open */
    int dtype;                    /* LC_DTYPE_* */
    int ragged;                   /* 1: variable-length bytes per sample (offsets + data) */
    int ndim;                     /* dims of one sample: 0 for a scalar (and for ragged) */
    int64_t shape[LC_MAX_DIMS];   /* shape[0..ndim) of one sample; rows come from the batch */
    uint64_t offset;              /* from the slot's start: fixed, rows * row_bytes of data; ragged, the bytes */
    uint64_t row_bytes;           /* fixed: bytes of one sample; ragged: 0 */
    uint64_t offsets_offset;      /* ragged: int64 offsets[rows + 1] into the data, from the slot's start */
    uint64_t capacity;            /* ragged: bytes available for the data; fixed: batch_size * row_bytes */
} lc_field_layout;

/* Both are macros over _sized functions, as lc_batch_field: the library writes the
 * caller's sizeof bytes (members it does not know are zeroed). LC_EINVAL for a NULL
 * stream, an index out of range or a struct smaller than the first layout. */
LC_EXPORT int lc_stream_ring_info_sized(const lc_stream *s, lc_ring_info *ret_info, size_t info_size);
LC_EXPORT int lc_stream_field_layout_sized(const lc_stream *s, int i, lc_field_layout *ret_layout,
                                           size_t layout_size);
#define lc_stream_ring_info(s, r) lc_stream_ring_info_sized((s), (r), sizeof *(r))
#define lc_stream_field_layout(s, i, l) lc_stream_field_layout_sized((s), (i), (l), sizeof *(l))
/* The offset of slot `slot` (0 <= slot < slot_count) from the ring's start; LC_EINVAL
 * out of range. */
LC_EXPORT int64_t lc_stream_slot_offset(const lc_stream *s, int slot);
/* A new descriptor of the ring's shared memory, read-only and close-on-exec, for a
 * mapping of the caller's own (mmap it MAP_SHARED read-only, or MAP_PRIVATE with
 * PROT_WRITE for copy-on-write views); the caller closes it. It refers to the same
 * object as lc_stream_ring() even after the ring's name is gone (the daemon removes it
 * once the stream delivered its first batch). The library holds one descriptor per
 * open stream for this, closed with the stream. A negative LC_E* code on failure
 * (LC_EMFILE when the process is out of descriptors). */
LC_EXPORT int lc_stream_ring_fd(const lc_stream *s);
/* Waits up to timeout_ms (<= 0: the client's default) for the next batch. LC_EEND
 * after the last epoch; LC_ESAMPLE (message names the file) when a sample could not be
 * read; LC_ETIMEDOUT when it did not come in time (the request stays outstanding and
 * the next call picks its batch up). */
LC_EXPORT int lc_stream_next(lc_stream *s, int timeout_ms, lc_batch **ret_batch);
/* Releases held batches, closes the stream on the daemon, unmaps the ring. Accepts NULL.
 * Returns an earlier release's refusal not yet reported (see lc_batch_release). */
LC_EXPORT int lc_stream_close(lc_stream *s);

LC_EXPORT uint32_t lc_batch_rows(const lc_batch *b);
LC_EXPORT uint64_t lc_batch_epoch(const lc_batch *b);
LC_EXPORT uint64_t lc_batch_index(const lc_batch *b);   /* batch number within its epoch */
LC_EXPORT int lc_batch_slot(const lc_batch *b);
LC_EXPORT uint64_t lc_batch_generation(const lc_batch *b);
/* Everything above in one call, for bindings that pay per call. New members are added
 * at the end only; lc_batch_describe is a macro over the _sized function, as
 * lc_batch_field. LC_EINVAL for a NULL batch or a struct smaller than the first layout. */
typedef struct lc_batch_info {
    int slot;                     /* the slot it leases */
    uint32_t rows;
    uint64_t generation;          /* the slot's generation when leased (lc_batch_valid compares) */
    uint64_t epoch;
    uint64_t index;               /* batch number within its epoch */
    uint64_t slot_offset;         /* lc_stream_slot_offset(stream, slot) */
    uint64_t reopens;             /* lc_stream_reopens(stream) when it was handed out: a batch
                                   * of the ring after that many reopens (new in 0.1.1) */
} lc_batch_info;
LC_EXPORT int lc_batch_describe_sized(const lc_batch *b, lc_batch_info *ret_info, size_t info_size);
#define lc_batch_describe(b, r) lc_batch_describe_sized((b), (r), sizeof *(r))
/* lc_stream_next, then lc_batch_describe of the batch it hands out, in one call (a
 * binding that pays per call makes one per batch). On success *ret_batch and *ret_info
 * are set; on failure neither is touched and the code is lc_stream_next's. */
LC_EXPORT int lc_stream_next_info_sized(lc_stream *s, int timeout_ms, lc_batch **ret_batch, lc_batch_info *ret_info,
                                        size_t info_size);
#define lc_stream_next_info(s, ms, b, r) lc_stream_next_info_sized((s), (ms), (b), (r), sizeof *(r))
LC_EXPORT int lc_batch_field_count(const lc_batch *b);
/* Field i (0 <= i < count) or, by name, lc_batch_field_by_name. LC_EINVAL when absent.
 * Both are macros that pass the caller's sizeof(lc_field) to the _sized functions,
 * which write that many bytes (members the library does not know are zeroed); bindings
 * that cannot use the macros call the _sized functions with their struct's size. */
LC_EXPORT int lc_batch_field_sized(const lc_batch *b, int i, lc_field *ret_field, size_t field_size);
LC_EXPORT int lc_batch_field_by_name_sized(const lc_batch *b, const char *name, lc_field *ret_field,
                                           size_t field_size);
#define lc_batch_field(b, i, f) lc_batch_field_sized((b), (i), (f), sizeof *(f))
#define lc_batch_field_by_name(b, name, f) lc_batch_field_by_name_sized((b), (name), (f), sizeof *(f))
/* 1 while the slot still holds this batch (its generation in shared memory matches). */
LC_EXPORT int lc_batch_valid(const lc_batch *b);
/* ---- device batches ------------------------------------------------------------------
 * A stream opened with o.device = "cuda:N" hands out each batch on GPU N as well:
 *   LC_TRANSFER_IPC     the daemon copies every batch into a device ring while the GPU
 *                       trains on the previous one; this process opens the ring once per
 *                       stream (CUDA IPC) and gets device pointers into it.
 *   LC_TRANSFER_CLIENT  where IPC is not possible (another container, MIG, another
 *                       device): the library pins the read-only ring and copies each
 *                       batch on the trainer's stream into device memory it owns.
 * lc_batch_device_wait(b, stream) makes `stream` (a cudaStream_t; NULL: the legacy
 * default stream) wait for the batch without blocking the host; kernels queued on it
 * afterwards may read the device fields. lc_batch_release records, on that stream, that
 * the trainer is done with the slot: the daemon never overwrites device memory the
 * trainer's queued work may still read. Device pointers are valid until the release.
 * Opening fails with LC_EDEVICE and the reason (no driver, no device N, driver too old,
 * a library built without CUDA). */
#define LC_TRANSFER_IPC 0
#define LC_TRANSFER_CLIENT 1

/* One field of a batch on the device. New members are added at the end only. */
typedef struct lc_device_field {
    const char *name;
    int dtype;                    /* LC_DTYPE_*: float16/float32 for a field the GPU normalized */
    int ndim;                     /* including the batch dimension */
    int64_t shape[LC_MAX_DIMS];
    void *data;                   /* device pointer */
    size_t nbytes;
    int device;                   /* the N of cuda:N */
    const int64_t *offsets;       /* ragged only: rows + 1 offsets, on the device; else NULL */
} lc_device_field;

/* The GPU ordinal of a device stream, -1 for a host stream. */
LC_EXPORT int lc_stream_device(const lc_stream *s);
/* Field i (or by name) of b on the device; LC_EINVAL for a host stream or no such field. */
LC_EXPORT int lc_batch_device_field_sized(const lc_batch *b, int i, lc_device_field *ret_field, size_t field_size);
LC_EXPORT int lc_batch_device_field_by_name_sized(const lc_batch *b, const char *name, lc_device_field *ret_field,
                                                  size_t field_size);
#define lc_batch_device_field(b, i, f) lc_batch_device_field_sized((b), (i), (f), sizeof *(f))
#define lc_batch_device_field_by_name(b, name, f) lc_batch_device_field_by_name_sized((b), (name), (f), sizeof *(f))
/* Makes cuda_stream wait for b on the device (no host synchronisation). */
LC_EXPORT int lc_batch_device_wait(lc_batch *b, void *cuda_stream);

/* Gives the slot back to the daemon (without waiting for its reply) and frees b.
 * Accepts NULL. Releases are pipelined, so the daemon's refusal of one (LC_ENOTLEASED:
 * released already; LC_ESTALE: a recycled slot) is known only once its reply has been
 * read by a later call: the next lc_batch_release or lc_stream_close of the client then
 * returns that code, once, with the message in lc_client_error(). b is freed either way. */
LC_EXPORT int lc_batch_release(lc_batch *b);

#ifdef __cplusplus
}
#endif
#endif
