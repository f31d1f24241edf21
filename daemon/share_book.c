/* share_book — which slots of a shared stream are still needed, and by whom (see
 * share_book.h). Plain counting over arrays the size of the ring: a ring has at most
 * a few dozen slots, so every question is a short scan. */
#include "share_book.h"

#include <stdlib.h>

#include "ld_error.h"

int share_book_init(struct share_book *b, uint32_t n_slots, uint64_t front)
{
    *b = (struct share_book){.n_slots = n_slots, .front = front};
    b->seq = calloc(n_slots, sizeof *b->seq);
    b->holds = calloc(n_slots, sizeof *b->holds);
    b->in_book = calloc(n_slots, sizeof *b->in_book);
    if (!b->seq || !b->holds || !b->in_book) {
        share_book_free(b);
        return LD_ENOMEM;
    }
    return 0;
}

void share_book_free(struct share_book *b)
{
    free(b->seq);
    free(b->holds);
    free(b->in_book);
    b->seq = NULL;
    b->holds = NULL;
    b->in_book = NULL;
}

int share_book_join(struct share_book *b, struct share_book_holder *h)
{
    *h = (struct share_book_holder){.cursor = b->front, .attached = true};
    h->held = calloc(b->n_slots, 1);
    if (!h->held)
        return LD_ENOMEM;
    h->next = b->holders;
    b->holders = h;
    b->n_holders++;
    b->n_attached++;
    return 0;
}

bool share_book_take(struct share_book *b, struct share_book_holder *h, uint32_t slot, uint64_t seq)
{
    bool fresh = !b->in_book[slot];
    if (fresh) {
        b->in_book[slot] = 1;
        b->seq[slot] = seq;
    }
    h->held[slot] = 1;
    h->n_held++;
    b->holds[slot]++;
    h->cursor = seq + 1;
    if (b->front < h->cursor)
        b->front = h->cursor;
    return fresh;
}

int share_book_put(struct share_book *b, struct share_book_holder *h, uint32_t slot)
{
    if (slot >= b->n_slots)
        return LD_EINVAL;
    if (!h->held[slot])
        return LD_ENOTLEASED;
    h->held[slot] = 0;
    h->n_held--;
    b->holds[slot]--;
    return 0;
}

uint32_t share_book_detach_lagging(struct share_book *b, uint64_t max_lag)
{
    uint32_t n = 0;
    for (struct share_book_holder *h = b->holders; h; h = h->next) {
        if (h->attached && b->front - h->cursor > max_lag) {
            h->attached = false;
            b->n_attached--;
            n++;
        }
    }
    return n;
}

void share_book_leave(struct share_book *b, struct share_book_holder *h)
{
    for (uint32_t i = 0; i < b->n_slots; i++)
        if (h->held && h->held[i])
            b->holds[i]--;
    for (struct share_book_holder **link = &b->holders; *link; link = &(*link)->next) {
        if (*link == h) {
            *link = h->next;
            b->n_holders--;
            if (h->attached)
                b->n_attached--;
            break;
        }
    }
    free(h->held);
    h->held = NULL;
    h->n_held = 0;
    h->attached = false;
}

uint32_t share_book_collect(struct share_book *b, uint32_t *ret_slots)
{
    uint64_t min = UINT64_MAX;
    for (struct share_book_holder *h = b->holders; h; h = h->next)
        if (h->attached && h->cursor < min)
            min = h->cursor;
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n_slots; i++) {
        if (b->in_book[i] && b->holds[i] == 0 && b->seq[i] < min) {
            b->in_book[i] = 0;
            ret_slots[n++] = i;
        }
    }
    return n;
}
