/* stream_internal — private to daemon/stream*.c and share.c: the layout of a stream, its
 * slots and its tasks, shared by stream.c (the flow of batches), stream_report.c (what
 * `open`, `streams`, metrics and `loaderctl top` show of a stream) and share.c (several
 * consumers of one stream's ring). */
#ifndef LD_STREAM_INTERNAL_H
#define LD_STREAM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "hub.h"
#include "pool.h"
#include "prefetch.h"
#include "sampler.h"
#include "share.h"
#include "stream.h"

struct stream_set {
    hub *hub;
    pool *workers;
    uint32_t live;
    stream *streams;                /* the live ones, linked by set_next */
    share_group *shares;            /* the shared streams' groups (share.c) */
    struct hub_completion stalled;  /* posted by the deadline watcher: a read was found stalled */
};

struct stream_task {
    struct pool_task base;          /* first: pool hands us this pointer back */
    stream *s;
    uint32_t slot;
    uint32_t row_begin, row_end;
    struct hub_completion done;     /* the slot's last chunk back: slot_filled() on the loop */
};

struct field_layout {
    uint64_t offset;                /* from the slot start */
    uint64_t row_bytes;             /* fixed fields */
    uint64_t offsets_offset;        /* ragged fields: int64[batch_size + 1] */
    uint64_t capacity;              /* ragged fields: bytes at offset */
};

struct stream_slot {
    uint64_t seq, epoch, batch;
    uint32_t rows;
    uint32_t n_chunks;
    uint32_t relayouts;             /* times this batch was laid out again (LD_ESTALE) */
    bool busy;                      /* chunks outstanding; the loop, or the direct path under the lock */
    struct cache *cache;            /* what the chunks may read (a keeper reference), or NULL */
    atomic_uint chunks_left;
    atomic_int err;                 /* first failing chunk wins */
    char errmsg[LD_ERRMSG_MAX];     /* written by the chunk that set err */
    struct stream_task *tasks;      /* max_chunks, preallocated */
    /* The device copy's report, posted by the stage's thread (stream_copied). */
    struct hub_completion copy_done;
    stream *copy_stream;
    uint32_t copy_slot;
    atomic_int copy_rc;
};

struct stream {
    stream_set *set;
    stream *set_next;
    dataset *ds;
    uint64_t id;
    struct stream_params p;
    sampler smp;
    ring *ring;
    device_stage *dev;              /* the host stage for a stream without a device */
    uint64_t slot_used;             /* bytes of a slot the layout uses */
    struct field_layout layout[LD_MAX_FIELDS];
    uint32_t n_slots, max_chunks;
    pool *workers;
    pool_flow *flow;                /* this stream's queue in the pool (scheduler.h) */
    bool urgent;                    /* the trainer waits and the batch is not READY */
    bool eager;                     /* nexts wait ahead of the trainer: it says when it waits */
    uint32_t handed_ahead;          /* eager: batches handed over, not yet taken by the trainer */
    uint32_t weight;                /* in the share of worker time */
    bool prefetch_auto;             /* opened with prefetch 0: the depth adapts (prefetch.h) */
    struct prefetch_ctl pf;
    struct stream_slot *slots;
    uint64_t total_seq;             /* UINT64_MAX when unbounded */
    uint64_t next_fill, next_deliver;
    uint64_t failed_seq;            /* UINT64_MAX while healthy */
    int fail_rc;
    char fail_msg[LD_ERRMSG_MAX];
    struct hub_completion ended;    /* stream_end: answers the waiting nexts from the loop */
    /* The direct path (stream.c). `lock` guards the stream's state while `direct` is on;
     * `direct` is set and cleared under it. */
    pthread_mutex_t lock;
    atomic_bool direct;
    const struct stream_direct_ops *direct_ops;
    void *direct_ctx;
    struct hub_completion direct_wake; /* a worker asks the loop to come by */
    struct hub_completion cache_bad; /* a worker found the dataset's cache bad: the loop drops it */
    uint32_t busy_slots;
    uint64_t cache_ticket;          /* from the dataset's cache keeper at open */
    bool closing, unlinked;
    /* Shared streams (share.h). A consumer reads the slots of another stream, `src`,
     * which fills them (itself for every other stream): its ring, slots, layout, flow
     * and device stage are src's, borrowed, and it only keeps its own place, requests
     * and counters. The producer of a shared stream has `group` set: it answers no next
     * of its own and tells the group when a batch is ready. */
    stream *src;
    share_member *member;
    share_group *group;
    struct {
        stream_next_cb cb;
        void *ctx;
    } waiters[STREAM_MAX_WAITING];  /* next requests in arrival order (a client may ask ahead) */
    uint32_t w_head, w_count;
    uint64_t wait_start_ns;
    uint64_t batches_served, samples_served, bytes_served, wait_ns;
    uint64_t first_next_ns;         /* 0 until the trainer first asks */
    /* The ring's slots beyond the first, committed in the background (stream_commit.c):
     * the thread writes commit_err, then commit_rc (< 0: it stopped there), and posts
     * commit_done after each slot. The rest is the loop thread's. */
    pthread_t committer;
    bool commit_started, commit_joinable, commit_warned;
    atomic_bool commit_stop;
    atomic_int commit_rc;
    char commit_err[LD_ERRMSG_MAX];
    struct hub_completion commit_done;
    struct stats_mark {
        uint64_t ns, samples, wait_ns;
    } mark, last;                   /* the window being measured, and the one before */
};

/* For share.c: answers a stream's waiting nexts as far as the answers are known
 * (from hub completions only); keeps `prefetch` batches in flight. */
void stream_deliver(stream *s);
void stream_schedule(stream *s);
/* A consumer of src's ring, at sequence `seq` (share.c owns it): LD_ENOMEM or 0. */
int stream_consumer_new(stream *src, uint64_t id, uint64_t seq, stream **ret_consumer);
/* Tells the scheduler whether a trainer of this stream is waiting (on changes only). */
void stream_set_urgent(stream *s, bool urgent);
/* stream_deliver.c, for stream_direct.c: the answer to the next request in line when it
 * is known (a batch next in line is leased to it). stream.c: a slot whose last chunk is
 * back. */
bool stream_answer_now(stream *s, struct stream_answer *ret);
void stream_slot_idle(stream *s, struct stream_slot *sl);
/* stream.c, for stream_deliver.c: records that the stream fails at sequence `seq` (the
 * earliest failure wins); the bytes a batch of `rows` rows in `slot` holds. */
void stream_fail(stream *s, uint64_t seq, int rc, const char *msg);
uint64_t stream_batch_bytes(stream *s, uint32_t slot, uint32_t rows);
/* stream_direct.c. filled: a worker, the last chunk of the slot is back; false when the
 * slot is the loop's to take (nothing was done). on_direct_worker: this thread is a
 * worker inside filled. init and fini: at open and free (the lock, the completions). */
bool stream_direct_filled(stream *s, uint32_t slot);
bool stream_on_direct_worker(void);
/* stream_direct.c, for start_fill on a worker (the dataset has a cache keeper): the
 * cache the batch may read, as cache_keeper_acquire; a cache found bad is left to the
 * loop (the batch reads the source). */
struct cache *stream_direct_acquire(stream *s, bool *ret_advise);
void stream_direct_init(stream *s);
void stream_direct_fini(stream *s);
/* stream_commit.c. Loop thread. start: after the first batch is filled, starts the
 * thread that commits the ring's other slots (once; nothing when all are committed),
 * which has the loop fill each as it comes. stop: stops and joins it, and cancels a
 * commit_done still queued; before ring_free. */
void stream_commit_start(stream *s);
void stream_commit_stop(stream *s);

static inline uint64_t stream_now_ns(void)
{
    return uv_hrtime();
}

#endif
