/* prefetch — how many batches a stream prepares ahead of its trainer when its prefetch
 * is `auto`: the depth follows what the trainer's `next` requests meet. */
#ifndef LD_PREFETCH_H
#define LD_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

/* The most an automatic depth may reach (the ring is sized for it, within the memory
 * budget), and where it starts. */
#define PREFETCH_AUTO_MAX 8u
#define PREFETCH_AUTO_START 4u
/* Deliveries without a wait, in units of the current depth, before the depth is
 * lowered by one. */
#define PREFETCH_CALM_ROUNDS 8u

struct prefetch_ctl {
    uint32_t depth;                 /* batches FILLING or READY to keep ahead */
    uint32_t max;                   /* at most (what the ring holds) */
    uint32_t calm;                  /* deliveries since the last wait or change */
};

/* max >= 1; the depth starts at min(PREFETCH_AUTO_START, max). */
void prefetch_init(struct prefetch_ctl *c, uint32_t max);
/* A batch was handed to the trainer: `waited` when its request had to wait for it,
 * `ready_after` the batches still READY behind it. Returns the new depth: one more
 * after a wait (the trainer outran the batches ahead: its rate or its jitter needs
 * more), one less after PREFETCH_CALM_ROUNDS x depth deliveries without a wait while
 * at least two batches stayed READY (more was held than the trainer used). */
uint32_t prefetch_on_delivery(struct prefetch_ctl *c, bool waited, uint32_t ready_after);

#endif
