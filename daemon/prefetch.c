/* prefetch — the depth of an automatic prefetch (`prefetch: auto`), in the spirit of
 * tf.data's AUTOTUNE: enough batches ahead that the trainer's `next` does not wait, and
 * no more.
 *
 * The signal is the one that matters: did the trainer's request have to wait? A wait
 * means the batches prepared ahead ran out (the trainer consumed faster than the ring
 * was refilled, or in a burst longer than the depth), so the depth grows by one at
 * once. A long calm (PREFETCH_CALM_ROUNDS times the depth in deliveries, no wait) with
 * at least two batches still READY each time means batches waited for the trainer
 * instead, so the depth shrinks by one; the calm counter restarts after every change,
 * so it settles where waits are rare rather than oscillating each batch. A trainer
 * whose step time jitters keeps the depth that covers its longest burst; a steady one
 * slower than the workers needs one or two. The ring is sized for `max` at open (within
 * the memory budget), so a change costs nothing but where the workers spend their
 * time. Pure logic on the loop thread; stream.c feeds it. */
#include "prefetch.h"

void prefetch_init(struct prefetch_ctl *c, uint32_t max)
{
    c->max = max ? max : 1;
    c->depth = PREFETCH_AUTO_START < c->max ? PREFETCH_AUTO_START : c->max;
    c->calm = 0;
}

uint32_t prefetch_on_delivery(struct prefetch_ctl *c, bool waited, uint32_t ready_after)
{
    if (waited) {
        c->calm = 0;
        if (c->depth < c->max)
            c->depth++;
        return c->depth;
    }
    if (ready_after < 2) {
        c->calm = 0; /* the trainer uses what is ahead: keep it */
        return c->depth;
    }
    if (++c->calm >= PREFETCH_CALM_ROUNDS * c->depth && c->depth > 1) {
        c->depth--;
        c->calm = 0;
    }
    return c->depth;
}
