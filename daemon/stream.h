/* stream — one trainer's ordered sequence of batches of one dataset.
 *
 * A stream ties together a dataset, a sampler, a ring of shared-memory slots and the
 * worker pool. It keeps up to `prefetch` batches FILLING or READY ahead of the trainer,
 * crossing epochs without a pause, and hands them out in order. All of its state is
 * owned by the loop thread; workers only write sample bytes into a slot they were given
 * and report the slot done through the hub, which runs the rest on the loop.
 *
 * Batches are numbered by a sequence `seq` from 0 across epochs:
 *   epoch = start_epoch + (start_batch + seq) / batches_per_epoch
 *   batch = (start_batch + seq) % batches_per_epoch
 */
#ifndef LD_STREAM_H
#define LD_STREAM_H

#include <stdbool.h>
#include <stdint.h>
#include <cJSON.h>
#include <uv.h>

#include "dataset.h"
#include "device.h"
#include "hub.h"
#include "pool.h"
#include "ring.h"

/* The streams of one daemon: the hub their workers report through (hub.h), the worker
 * pool, and the live streams (a read found stalled looks at the ones waiting on it). */
typedef struct stream_set stream_set;

int stream_set_new(hub *h, pool *workers, stream_set **ret_set);
/* Call once stream_set_live() is 0, on the loop thread, before the hub closes. */
void stream_set_free(stream_set *set);
/* Streams opened in the set and not yet freed (a closed stream lives on until the
 * work already running for it finishes). */
uint32_t stream_set_live(const stream_set *set);

struct stream_params {
    uint32_t batch_size;
    bool shuffle;
    uint64_t seed;
    uint64_t epoch;             /* first epoch */
    uint32_t rank, world_size;
    bool drop_last;
    uint64_t start_batch;
    uint32_t prefetch;          /* 0: auto, the depth adapts (prefetch.h) */
    uint64_t epochs;            /* 0: unbounded */
    uint32_t extra_slots;       /* slots beyond prefetch's: a shared stream's lag (share.h) */
    /* Scheduling (scheduler.h): the opening client's uid and its `clients:` entry
     * (weight 1 and max_share 1 when it has none); the dataset adds its own. */
    uint32_t uid;
    uint32_t client_weight;
    double client_max_share;
    struct device_spec device;  /* where batches go (device.h); zeroed: the host */
    const struct device_normalize *norm; /* on-GPU normalize, or NULL */
    uint64_t device_budget;     /* server.device_memory_budget, per GPU */
};

/* What `next` delivers. */
struct stream_batch {
    uint32_t slot;
    uint64_t generation;
    uint64_t epoch;
    uint64_t batch;
    uint32_t rows;
    uint64_t bytes;             /* payload bytes of the batch, for statistics */
};

/* The answer to a next request: rc 0 with a leased batch, or an error (LD_EEND,
 * LD_ESAMPLE, LD_ETIMEDOUT, ...) with a message (valid until the stream is closed or
 * answers again). */
struct stream_answer {
    int rc;
    struct stream_batch batch;
    const char *message;
};

/* Called for a next request whose answer was not known when it was asked (unless the
 * stream is closed first): on the loop thread, from a hub completion, never inside
 * stream_next. It must not close the stream (post a hub completion that does). */
typedef void (*stream_next_cb)(void *ctx, const struct stream_answer *a);

typedef struct stream stream;

#define STREAM_MAX_WAITING 8

/* Lays out the slot, creates and commits the ring, opens its device stage. errbuf gets
 * the reason on failure (LD_ERANGE: no batch with these settings; LD_ENOSPC: /dev/shm
 * too small; LD_EINVAL: start_batch past the epoch; LD_EBUDGET: the ring needs more
 * than budget_left bytes, or the device ring more than is left of the GPU's budget;
 * LD_EDEVICE: the device cannot be used, with the reason). */
int stream_open(stream_set *set, dataset *d, uint64_t id, const struct stream_params *p,
                uint64_t budget_left, stream **ret_stream, char *errbuf);
/* Ends the stream: waiting nexts are forgotten (their callbacks never run: the caller
 * answers them), queued work is cancelled, slots are dropped; the memory is freed once
 * work already running finishes. Calls nobody back. */
void stream_close(stream *s);

/* Asks for the next batch. Returns 1 when the answer is known now (the batch is ready,
 * the stream ended or failed) and no earlier request waits: *ret holds it and cb is
 * never called. Returns 0 when the request waits: cb(ctx) runs later with the answer.
 * Several requests may wait (a client asking ahead); they are answered in order.
 * LD_EBUSY when STREAM_MAX_WAITING already wait, LD_ECLOSED after stream_close (neither
 * then). */
int stream_next(stream *s, stream_next_cb cb, void *ctx, struct stream_answer *ret);
/* Forgets the waiting nexts of ctx (their callbacks never run): an asker that goes
 * before the stream. */
void stream_forget_next(stream *s, void *ctx);
/* For an asker that keeps a next waiting whether or not its trainer waits (the hand-off
 * in shared memory, handoff.h): from now on a waiting next starts neither the wait clock
 * (client_wait_s, stall, the adaptive prefetch's "waited") nor the scheduler's priority
 * for a waiting trainer; the asker says when its trainer waits (stream_trainer_waits). */
void stream_set_eager(stream *s);
/* The trainer of an eager stream waits for the batch asked now: the clock and the
 * priority run until that batch is delivered. Does nothing while no next waits. */
void stream_trainer_waits(stream *s);
/* Eager streams: the batches handed to the trainer that it has not taken yet count as
 * prepared ahead, as READY ones do (the prefetch depth, its adaptation, `streams`). */
void stream_set_handed_ahead(stream *s, uint32_t n);
/* The batches the stream keeps prepared ahead now: its prefetch, or the adaptive depth. */
uint32_t stream_prefetch_target(const stream *s);
/* The direct path (stream_direct.c): an eager asker whose steady-state
 * batches need no loop thread. While it is on, the worker that fills the slot holding
 * the batch next in line leases it and hands it to `publish` itself, under the stream's
 * lock, and then calls `after`; anything else (an error, the end, a relayout, a stalled
 * read, a shared stream or a device stage) goes through the loop as before. */
struct stream_direct_ops {
    /* Worker thread, under the stream's lock: batch a (rc 0) was leased to the asker
     * whose next waits; that next stays asked. Must not block; calls no loop code. */
    void (*publish)(void *ctx, const struct stream_answer *a);
    /* Worker thread, under the stream's lock, after the batches filled by now were
     * published: the asker takes what its client gave back. Returns STREAM_DIRECT_LOOP
     * when the loop must come by (the asker's `poll` then runs there, from a hub
     * completion) and STREAM_DIRECT_WAKE to have `wake` called once the lock is let go. */
    unsigned (*after)(void *ctx);
    /* Worker thread, without the lock (the stream may be gone by then; the asker must
     * outlive the call): wakes whoever waits for what was published. */
    void (*wake)(void *ctx);
    /* Loop thread, under the stream's lock: the loop came by, as `after` asked. */
    void (*poll)(void *ctx);
};
#define STREAM_DIRECT_LOOP 1u
#define STREAM_DIRECT_WAKE 2u
/* Turns the direct path on for the asker (ctx) whose next waits on s, when s is a plain
 * stream: eager, filled on the host, neither shared nor a shared stream's consumer. From
 * now on the loop thread's calls on s take its lock. Loop thread. */
void stream_set_direct(stream *s, const struct stream_direct_ops *ops, void *ctx);
/* Turns it off: once it returns no worker publishes any more (a worker inside waits
 * for the lock and then finds it off). Idempotent. Loop thread. */
void stream_clear_direct(stream *s);
/* The stream's lock, taken only while the direct path may run: for the asker's own
 * state that workers touch too. stream_lock returns what to pass to stream_unlock.
 * Recursive. Loop thread. */
bool stream_lock(stream *s);
void stream_unlock(stream *s, bool locked);
/* Gives a leased slot back (LD_ENOTLEASED / LD_ESTALE / LD_EINVAL change nothing). */
int stream_release(stream *s, uint32_t slot, uint64_t generation);
/* Ends the stream now, for a reason of the daemon's (a reload that narrowed access, a
 * dataset taken away): every next from here on is answered with code (< 0) and message,
 * the ones waiting now included — from a hub completion, never inside this call, so the
 * caller may be walking its connections. The hand-off's waiting next is one of them: its
 * client, asleep or polling, finds the end entry at once (handoff.h). Batches leased
 * before stay leased: release and stream_close work as before, and the connection still
 * gives everything back when it goes. Nothing more is filled past what is in flight. The
 * first end or failure wins; after stream_close it does nothing. Loop thread. */
void stream_end(stream *s, int code, const char *message);

/* Adds the open reply's layout fields (stream, shm, sizes, fields[]) to obj. */
void stream_describe_layout(const stream *s, cJSON *obj);
/* Adds the `streams` entry fields (progress, occupancy, counters) to obj. */
void stream_describe_state(const stream *s, cJSON *obj);

/* What the trainer got from the stream and what it cost, for `streams`, metrics and
 * `loaderctl top`. "Now" values are over the last STREAM_STATS_WINDOW_NS or so; the
 * others over the time since the trainer's first `next`. */
#define STREAM_STATS_WINDOW_NS (1000u * 1000u * 1000u)
struct stream_stats {
    uint64_t batches, samples, bytes;
    double active_s;                /* since the first next */
    double wait_s;                  /* inside next, waiting for a batch not READY yet */
    double stall, stall_now;        /* wait_s / active_s: the data-stall fraction */
    double samples_per_s, samples_per_s_now;
    /* The workers' CPU time spent on its own batches. A shared stream's consumer has
     * none of its own: its batches are its group's, prepared once, and their CPU time is
     * shared_cpu_s, the group's (to be counted once per group, not once per consumer). */
    double worker_cpu_s;
    double shared_cpu_s;
    uint32_t prefetch_depth;        /* batches FILLING or READY now */
};
void stream_get_stats(const stream *s, struct stream_stats *ret_stats);

/* The dataset the stream was opened on (a reload may have retired it since). */
const dataset *stream_dataset(const stream *s);
uint64_t stream_ring_bytes(const stream *s);
const ring *stream_ring(const stream *s);
uint64_t stream_wait_ns(const stream *s);

#endif
