/* stream_deliver — a stream's answers to `next`: the batch next in line leased to the
 * oldest request (or the end, or the failure in line), known at once or called back when
 * a slot is filled; the requests that wait, the trainer's wait clock and urgency (which
 * the scheduler hears of), the statistics window, and the end a stream is given
 * (stream_end). The filling side — slots, chunks, the device stage — is stream.c's; see
 * its header for the flow of a batch. Loop thread, and a worker on the direct path
 * (stream_direct.c) under the stream's lock. */
#include "stream_internal.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include "dataset.h"
#include "hub.h"
#include "log.h"
#include "pool.h"
#include "prefetch.h"
#include "ring.h"
#include "share.h"

static int next_locked(stream *s, stream_next_cb cb, void *ctx, struct stream_answer *ret);

/* Pops the oldest waiting next. */
static void pop_waiter(stream *s, stream_next_cb *ret_cb, void **ret_ctx)
{
    *ret_cb = s->waiters[s->w_head].cb;
    *ret_ctx = s->waiters[s->w_head].ctx;
    s->w_head = (s->w_head + 1) % STREAM_MAX_WAITING;
    s->w_count--;
}

/* Starts a new statistics window when the current one is old enough: `last` keeps the
 * previous window's rate and stall as counts over its length. */
static void stats_roll(stream *s, uint64_t now)
{
    if (!s->mark.ns) {
        s->mark = (struct stats_mark){now, s->samples_served, stream_wait_ns(s)};
        return;
    }
    if (now - s->mark.ns < STREAM_STATS_WINDOW_NS)
        return;
    uint64_t wait = stream_wait_ns(s);
    s->last = (struct stats_mark){now - s->mark.ns, s->samples_served - s->mark.samples, wait - s->mark.wait_ns};
    s->mark = (struct stats_mark){now, s->samples_served, wait};
}

/* Tells the scheduler whether this stream's trainer is waiting (on changes only). */
static void set_urgent(stream *s, bool urgent)
{
    if (s->urgent == urgent)
        return;
    s->urgent = urgent;
    if (s->member)
        share_waiting(s->member, urgent); /* the producer's flow is urgent while any consumer waits */
    else
        stream_set_urgent(s, urgent);
}

void stream_set_urgent(stream *s, bool urgent)
{
    if (s->flow)
        pool_flow_set_urgent(s->workers, s->flow, urgent);
}

/* The answer to the next request in line, when it is known: the end, the failure, or
 * the batch with the next sequence number, which is leased to the request. Returns
 * false when the request must wait (and starts counting the trainer's wait, which the
 * scheduler hears of). */
bool stream_answer_now(stream *s, struct stream_answer *ret)
{
    stream *src = s->src; /* whose slots: itself, or a shared stream's producer */
    for (;;) {
        if (s->next_deliver >= s->total_seq) {
            *ret = (struct stream_answer){.rc = LD_EEND, .message = "the stream has delivered all its epochs"};
            return true;
        }
        if (s->next_deliver >= s->failed_seq || s->next_deliver >= src->failed_seq) {
            const stream *f = s->next_deliver >= s->failed_seq ? s : src;
            *ret = (struct stream_answer){.rc = f->fail_rc, .message = f->fail_msg};
            return true;
        }
        uint32_t i;
        for (i = 0; i < s->n_slots; i++) {
            enum ring_state st = ring_state(s->ring, i);
            /* A shared stream's batch stays LEASED while any consumer still needs it. */
            if ((st == RING_READY || (st == RING_LEASED && s->member)) && s->slots[i].seq == s->next_deliver)
                break;
        }
        if (i < s->n_slots) {
            struct stream_slot *sl = &s->slots[i];
            if (!s->member) {
                int leased = ring_lease(s->ring, i);
                ld_require(leased == 0); /* READY was just checked: else the ring's bookkeeping is broken */
            }
            *ret = (struct stream_answer){.rc = 0};
            ret->batch = (struct stream_batch){
                .slot = i,
                .generation = ring_generation(s->ring, i),
                .epoch = sl->epoch,
                .batch = sl->batch,
                .rows = sl->rows,
                .bytes = stream_batch_bytes(s, i, sl->rows),
            };
            s->next_deliver++;
            if (s->member)
                share_take(s->member, i);
            s->batches_served++;
            s->samples_served += sl->rows;
            s->bytes_served += ret->batch.bytes;
            stats_roll(s, stream_now_ns());
            /* Past the ring's first fill: the first batches are waited for whatever the
             * trainer's rate, so they say nothing about the depth it needs. */
            if (s->prefetch_auto && s->batches_served > s->p.prefetch)
                prefetch_on_delivery(&s->pf, s->wait_start_ns != 0, ring_count(s->ring, RING_READY) + s->handed_ahead);
            if (s->wait_start_ns) {
                s->wait_ns += stream_now_ns() - s->wait_start_ns;
                s->wait_start_ns = 0;
            }
            if (s->eager) {
                set_urgent(s, false); /* until the asker says its trainer waits again */
                s->handed_ahead++;    /* handed over now; the asker counts them exactly */
            }
            return true;
        }
        if (!atomic_load_explicit(&s->ds->stalled_reads, memory_order_relaxed)) {
            if (!s->eager) {
                if (!s->wait_start_ns)
                    s->wait_start_ns = stream_now_ns();
                set_urgent(s, true);
            }
            return false;
        }
        /* A read of this dataset does not return: the batch may never come. Its slot
         * stays busy until the read returns, if ever. */
        char msg[LD_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "a read of dataset '%s' has not returned for more than %" PRIu64
                 " s (read_timeout): its storage is not answering", s->ds->name,
                 s->ds->read_timeout_ns / 1000000000u);
        stream_fail(src, s->next_deliver, LD_ETIMEDOUT, msg); /* then answered as a failure */
    }
}

/* Answers the waiting next requests, oldest first, as far as the answers are known.
 * Runs from hub completions only (a slot filled, a read found stalled, an end). */
void stream_deliver(stream *s)
{
    if (s->group) {
        share_ready(s->group); /* a shared stream's producer: its consumers answer */
        return;
    }
    bool locked = stream_lock(s);
    struct stream_answer a;
    while (s->w_count && stream_answer_now(s, &a)) {
        stream_next_cb cb;
        void *ctx;
        pop_waiter(s, &cb, &ctx);
        cb(ctx, &a);
    }
    if (!s->w_count)
        set_urgent(s, false);
    stream_unlock(s, locked);
}

int stream_next(stream *s, stream_next_cb cb, void *ctx, struct stream_answer *ret)
{
    bool locked = stream_lock(s);
    int rc = next_locked(s, cb, ctx, ret);
    stream_unlock(s, locked);
    return rc;
}

static int next_locked(stream *s, stream_next_cb cb, void *ctx, struct stream_answer *ret)
{
    if (s->closing)
        return LD_ECLOSED;
    if (!s->unlinked) {
        /* The client maps the ring before its first next: from now on the name is not
         * needed, and removing it means nothing can be left in /dev/shm. */
        ring_unlink(s->ring);
        s->unlinked = true;
    }
    if (!s->first_next_ns)
        s->first_next_ns = stream_now_ns();
    stats_roll(s, stream_now_ns());
    /* Known now (and nobody asked before it): the answer is returned, not called back. */
    if (s->w_count == 0 && stream_answer_now(s, ret)) {
        stream_schedule(s); /* a batch leased just now leaves room for one more ahead */
        return 1;
    }
    if (s->w_count == STREAM_MAX_WAITING)
        return LD_EBUSY;
    uint32_t tail = (s->w_head + s->w_count) % STREAM_MAX_WAITING;
    s->waiters[tail].cb = cb;
    s->waiters[tail].ctx = ctx;
    s->w_count++;
    return 0;
}

void stream_forget_next(stream *s, void *ctx)
{
    bool locked = stream_lock(s);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->w_count; i++) {
        uint32_t from = (s->w_head + i) % STREAM_MAX_WAITING;
        if (s->waiters[from].ctx != ctx)
            s->waiters[(s->w_head + kept++) % STREAM_MAX_WAITING] = s->waiters[from];
    }
    s->w_count = kept;
    if (!kept)
        set_urgent(s, false);
    stream_unlock(s, locked);
}

void stream_set_eager(stream *s)
{
    s->eager = true;
}

void stream_set_handed_ahead(stream *s, uint32_t n)
{
    bool locked = stream_lock(s);
    uint32_t was = s->handed_ahead;
    s->handed_ahead = n;
    if (n < was)
        stream_schedule(s); /* the trainer took some: room to prepare more */
    stream_unlock(s, locked);
}

uint32_t stream_prefetch_target(const stream *s)
{
    return s->prefetch_auto ? s->pf.depth : s->p.prefetch;
}

void stream_trainer_waits(stream *s)
{
    bool locked = stream_lock(s);
    if (s->w_count && !s->closing) {
        if (!s->wait_start_ns)
            s->wait_start_ns = stream_now_ns();
        set_urgent(s, true);
    }
    stream_unlock(s, locked);
}

/* The hub's turn after stream_end: the waiting nexts get the end. */
static void stream_ended(struct hub_completion *c)
{
    stream *s = (stream *)((char *)c - offsetof(stream, ended));
    stream_deliver(s);
}

void stream_end(stream *s, int code, const char *message)
{
    if (!s || s->closing)
        return;
    bool locked = stream_lock(s);
    stream_fail(s, s->next_deliver, code, message); /* an earlier end or failure stays */
    stream_unlock(s, locked);
    s->ended.done = stream_ended;
    hub_post(s->set->hub, &s->ended);
}
