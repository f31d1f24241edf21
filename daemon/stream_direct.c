/* stream_direct — the direct path of a stream whose batches go to a hand-off in shared
 * memory (handoff.h): the steady state without the loop thread.
 *
 * The hand-off keeps one next waiting on its stream. Once it has started
 * (stream_set_direct), the worker whose chunk is the last of a slot calls
 * stream_direct_filled() instead of posting the slot to the hub, and under the stream's
 * lock does what slot_filled, start_copy and deliver (stream.c) would do on the loop:
 * the slot becomes READY (the host stage), every batch next in line that is READY is
 * leased and handed to the asker's publish (so a worker that finishes batch N publishes
 * N, N+1, ... as far as they are filled), and the asker then takes its client's releases,
 * whose freed slots are filled again from here, as stream_schedule does on the loop: the
 * batch's cache reference is taken (cache_keeper_try_acquire) and its samples are handed
 * to read-ahead when the disk is cold (coldread_submit), both safe on any thread.
 * Anything that is not the steady state goes to the loop, posted: a failed chunk (a
 * relayout, a bad sample), the last reference to a replaced cache (its unmapping), a
 * cache found bad (cache_keeper_tend; the batch reads the source), the ring's slots not
 * all committed yet, the end or a failure in line, a stalled read, a next that is not
 * the asker's, and whatever the asker asks the loop for (nothing left filling, counters
 * to settle, a wrong release entry).
 *
 * While the path is on, the loop thread takes the same lock in every call on the stream
 * (stream_lock), so the flow of stream.c is unchanged: only some of its steps run on a
 * worker. stream_clear_direct (an ended or closed hand-off, stream_close) turns it off
 * under the lock; the ring's state only ever changes under it, and the connection still
 * owns every slot it was handed, so closing it gives them all back. */
#include "stream_internal.h"

#include <stddef.h>

#include "cache_keeper.h"
#include "dataset.h"
#include "hub.h"
#include "log.h"
#include "ring.h"

/* Set on a worker while it runs the direct path. */
static _Thread_local bool on_direct_worker;

bool stream_on_direct_worker(void)
{
    return on_direct_worker;
}

/* Worker thread: the last chunk of `slot` is back. Hands the slot on as slot_filled and
 * deliver would, when nothing but the steady state is in sight; returns false (nothing
 * done: the caller posts to the hub) otherwise. */
bool stream_direct_filled(stream *s, uint32_t slot)
{
    struct stream_slot *sl = &s->slots[slot];
    pthread_mutex_lock(&s->lock);
    /* A failed chunk (a relayout, a bad sample), the last reference to a replaced cache
     * or the ring's other slots still to be committed: the loop's. */
    if (!atomic_load_explicit(&s->direct, memory_order_relaxed) || s->closing || atomic_load(&sl->err) ||
        !s->commit_started || (sl->cache && !cache_keeper_try_release(s->ds->keeper, sl->cache))) {
        pthread_mutex_unlock(&s->lock);
        return false;
    }
    sl->cache = NULL; /* given back: the batch's reads are done */
    on_direct_worker = true;
    stream_slot_idle(s, sl);
    int ready = ring_ready(s->ring, slot); /* the host stage: READY at once */
    ld_require(ready == 0);
    /* The asker's next stays asked: each answer is published and the next one asked
     * at once, as handoff_answer and stream_next would do on the loop. The end, a
     * failure in line, a stalled read and any other next waiting (a socket `next` after
     * the end) are answered there. */
    bool plain = s->w_count == 1 && s->waiters[s->w_head].ctx == s->direct_ctx &&
                 !atomic_load_explicit(&s->ds->stalled_reads, memory_order_relaxed);
    /* Only batches are published here. The answer may still turn out to be a failure (a
     * read found stalled while this batch filled: stream_answer_now records it): that
     * one is the loop's to publish, posted below, since publishing an end turns the
     * path off, which only the loop may do (after it, the loop runs unlocked). */
    struct stream_answer a;
    while (plain && s->next_deliver < s->total_seq && s->next_deliver < s->failed_seq && stream_answer_now(s, &a)) {
        if (a.rc < 0)
            break;
        s->direct_ops->publish(s->direct_ctx, &a);
    }
    unsigned then = s->direct_ops->after(s->direct_ctx);
    if ((then & STREAM_DIRECT_LOOP) || !plain || s->next_deliver >= s->total_seq || s->next_deliver >= s->failed_seq)
        hub_post(s->set->hub, &s->direct_wake);
    on_direct_worker = false;
    /* The wake-up is a system call that may hand this CPU to the woken trainer: not
     * while the lock holds the other workers back. s may be freed once it is let go. */
    const struct stream_direct_ops *ops = s->direct_ops;
    void *ctx = s->direct_ctx;
    pthread_mutex_unlock(&s->lock);
    if (then & STREAM_DIRECT_WAKE)
        ops->wake(ctx);
    return true;
}

/* The loop thread: a worker on the direct path asked it to come by. */
static void direct_woken(struct hub_completion *c)
{
    stream *s = (stream *)((char *)c - offsetof(stream, direct_wake));
    bool locked = stream_lock(s);
    /* The end or a failure in line, or a READY slot a socket next waits for: answered
     * under the lock, or by the loop alone once the path is off. */
    stream_deliver(s);
    if (locked && atomic_load_explicit(&s->direct, memory_order_relaxed))
        s->direct_ops->poll(s->direct_ctx);
    stream_unlock(s, locked);
}

/* The loop thread: a worker on the direct path found the dataset's cache bad. */
static void direct_cache_bad(struct hub_completion *c)
{
    stream *s = (stream *)((char *)c - offsetof(stream, cache_bad));
    cache_keeper_tend(s->ds->keeper);
}

struct cache *stream_direct_acquire(stream *s, bool *ret_advise)
{
    bool bad = false;
    struct cache *c = cache_keeper_try_acquire(s->ds->keeper, s->ds, s->cache_ticket, ret_advise, &bad);
    if (bad)
        hub_post(s->set->hub, &s->cache_bad);
    return c;
}

void stream_set_direct(stream *s, const struct stream_direct_ops *ops, void *ctx)
{
    if (!s->eager || s->closing || s->group || s->member || s->src != s || s->p.device.kind != DEVICE_HOST ||
        atomic_load_explicit(&s->direct, memory_order_relaxed))
        return;
    pthread_mutex_lock(&s->lock);
    s->direct_ops = ops;
    s->direct_ctx = ctx;
    atomic_store_explicit(&s->direct, true, memory_order_release);
    pthread_mutex_unlock(&s->lock);
}

void stream_clear_direct(stream *s)
{
    /* The loop's alone: a worker that turned it off would go on under a lock the loop
     * no longer takes. */
    ld_require(!on_direct_worker);
    if (!atomic_load_explicit(&s->direct, memory_order_relaxed))
        return;
    pthread_mutex_lock(&s->lock);
    atomic_store_explicit(&s->direct, false, memory_order_relaxed);
    pthread_mutex_unlock(&s->lock);
}

bool stream_lock(stream *s)
{
    /* It is turned on and off by the loop thread under the lock, so this reads what is
     * on the loop, and on a worker that holds the lock (the direct path's own calls). */
    if (!atomic_load_explicit(&s->direct, memory_order_relaxed))
        return false;
    pthread_mutex_lock(&s->lock);
    return true;
}

void stream_unlock(stream *s, bool locked)
{
    if (locked)
        pthread_mutex_unlock(&s->lock);
}

void stream_direct_init(stream *s)
{
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE); /* the asker's callbacks call back in */
    pthread_mutex_init(&s->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    s->direct_wake.done = direct_woken;
    s->cache_bad.done = direct_cache_bad;
}

void stream_direct_fini(stream *s)
{
    if (s->set) {
        hub_cancel(s->set->hub, &s->direct_wake);
        hub_cancel(s->set->hub, &s->cache_bad);
    }
    pthread_mutex_destroy(&s->lock);
}
