/* share_book — the lease counting of a shared stream (share.h), apart from rings and
 * streams so that a test can drive it alone.
 *
 * A slot enters the book when its batch is first taken by a consumer, and leaves it
 * (the caller then frees the slot) once no consumer holds it and every attached
 * consumer has moved past its batch. A detached consumer no longer keeps slots for
 * batches it has not taken, but what it holds stays held until it gives it back.
 * Batches are numbered by the stream's sequence; `front` is one past the highest
 * batch taken so far, where a consumer joining now starts. */
#ifndef LD_SHARE_BOOK_H
#define LD_SHARE_BOOK_H

#include <stdbool.h>
#include <stdint.h>

struct share_book_holder {
    struct share_book_holder *next;
    uint8_t *held;              /* per slot: 1 while this consumer holds it */
    uint32_t n_held;
    uint64_t cursor;            /* its next batch */
    bool attached;              /* keeps the batches it has not reached yet */
};

struct share_book {
    uint32_t n_slots;
    uint64_t *seq;              /* per slot in the book: its batch */
    uint32_t *holds;            /* per slot: consumers holding it */
    uint8_t *in_book;
    uint64_t front;
    struct share_book_holder *holders;
    uint32_t n_holders, n_attached;
};

/* LD_ENOMEM or 0; share_book_free accepts a zeroed or half-built book. */
int share_book_init(struct share_book *b, uint32_t n_slots, uint64_t front);
void share_book_free(struct share_book *b);
/* Adds an attached consumer whose next batch is the front. LD_ENOMEM or 0. */
int share_book_join(struct share_book *b, struct share_book_holder *h);
/* The consumer took `slot`, which holds batch `seq` (its cursor): true when the slot
 * was not in the book yet (the caller turns it LEASED). */
bool share_book_take(struct share_book *b, struct share_book_holder *h, uint32_t slot, uint64_t seq);
/* The consumer gives `slot` back: 0, LD_EINVAL (out of range) or LD_ENOTLEASED. */
int share_book_put(struct share_book *b, struct share_book_holder *h, uint32_t slot);
/* Attached consumers more than max_lag batches behind the front are detached; returns
 * how many. */
uint32_t share_book_detach_lagging(struct share_book *b, uint64_t max_lag);
/* The consumer goes: its holds are dropped. */
void share_book_leave(struct share_book *b, struct share_book_holder *h);
/* Slots that leave the book now (nobody holds them, every attached consumer is past
 * them): written to ret_slots (n_slots entries), counted in the return value. */
uint32_t share_book_collect(struct share_book *b, uint32_t *ret_slots);

#endif
