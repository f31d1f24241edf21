/* share — several consumers of one stream's ring (see share.h for the model).
 *
 * The producer is an ordinary stream whose `group` is set: stream.c hands its "a batch
 * is ready" to share_ready instead of answering requests of its own. Each consumer is
 * a stream made by stream_consumer_new (its `member` set): stream.c answers its next
 * requests from the producer's slots and sends its leases and releases here. Which slot
 * may go back FREE is share_book's count; this file turns the count into ring
 * transitions, detaches consumers that lag, and keeps the producer's flow urgent while
 * any consumer waits. A consumer's leases are its own: a consumer that goes (closed,
 * or its connection gone with the trainer) gives back what it held, and the others
 * carry on. The last consumer to go closes the producer. */
#include "share.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "log.h"
#include "ring.h"
#include "share_book.h"
#include "stream_internal.h"

struct share_member {
    struct share_book_holder h; /* first: the book's list gives us back */
    share_group *g;
    stream *s;                  /* the consumer */
    bool waiting;
};

struct share_group {
    stream_set *set;
    share_group *next;
    char name[LD_NAME_MAX];
    stream *producer;
    struct share_book book;
    uint32_t max_lag;
    uint32_t n_waiting;         /* consumers waiting for a batch: the producer's flow is urgent */
    uint32_t *freed;            /* scratch for share_book_collect */
};

static int share_check(const share_group *g, const dataset *d, const struct stream_params *p, char *errbuf)
{
    const stream *s = g->producer;
    const struct stream_params *q = &s->p;
    const char *what = NULL;
    uint64_t have = 0, want = 0;
    if (d != s->ds) {
        ld_errorf(errbuf, "share '%s' reads dataset '%s'%s; this open asks for '%s': use another share name",
                  g->name, s->ds->name, strcmp(d->name, s->ds->name) == 0 ? " as it was before a reload" : "",
                  d->name);
        return LD_EINVAL;
    }
#define SHARE_SAME(field)                                      \
    if (!what && q->field != p->field) {                       \
        what = #field;                                         \
        have = (uint64_t)q->field;                             \
        want = (uint64_t)p->field;                             \
    }
    SHARE_SAME(batch_size)
    SHARE_SAME(shuffle)
    SHARE_SAME(seed)
    SHARE_SAME(epoch)
    SHARE_SAME(epochs)
    SHARE_SAME(rank)
    SHARE_SAME(world_size)
    SHARE_SAME(drop_last)
#undef SHARE_SAME
    if (!what)
        return 0;
    ld_errorf(errbuf, "share '%s' is open with %s %" PRIu64 "; this open asks for %" PRIu64
              " (a shared stream's consumers read the same batches: use another share name)",
              g->name, what, have, want);
    return LD_EINVAL;
}

int share_find(stream_set *set, const char *name, const dataset *d, const struct stream_params *p,
               share_group **ret_group, char *errbuf)
{
    bool automatic = strcmp(name, SHARE_AUTO) == 0;
    for (share_group *g = set->shares; g; g = g->next) {
        if (strcmp(g->name, name) != 0)
            continue;
        int rc = share_check(g, d, p, errbuf);
        if (rc == 0 || !automatic) {
            *ret_group = rc == 0 ? g : NULL;
            return rc;
        }
    }
    *ret_group = NULL;
    return 0;
}

int share_group_new(stream_set *set, const char *name, stream *producer, uint32_t max_lag, share_group **ret_group)
{
    share_group *g = calloc(1, sizeof *g);
    if (!g)
        return LD_ENOMEM;
    g->freed = calloc(producer->n_slots, sizeof *g->freed);
    if (!g->freed || share_book_init(&g->book, producer->n_slots, producer->next_deliver) < 0) {
        free(g->freed);
        free(g);
        return LD_ENOMEM;
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    g->set = set;
    g->producer = producer;
    g->max_lag = max_lag;
    producer->group = g;
    g->next = set->shares;
    set->shares = g;
    *ret_group = g;
    return 0;
}

static share_member *share_member_of(struct share_book_holder *h)
{
    return (share_member *)h;
}

int share_attach(share_group *g, uint64_t id, stream **ret_consumer)
{
    share_member *m = calloc(1, sizeof *m);
    if (!m)
        return LD_ENOMEM;
    stream *c = NULL;
    if (share_book_join(&g->book, &m->h) < 0 || stream_consumer_new(g->producer, id, m->h.cursor, &c) < 0) {
        m->g = g;
        share_leave(m); /* the last one out closes the group */
        return LD_ENOMEM;
    }
    m->g = g;
    m->s = c;
    c->member = m;
    *ret_consumer = c;
    return 0;
}

uint64_t share_front_epoch(const share_group *g)
{
    const stream *s = g->producer;
    return s->p.epoch + (s->p.start_batch + g->book.front) / sampler_batches(&s->smp);
}

uint64_t share_ring_bytes(const share_group *g)
{
    return stream_ring_bytes(g->producer);
}

uint32_t share_consumers(const share_group *g)
{
    return g->book.n_holders;
}

uint64_t share_producer_id(const share_group *g)
{
    return g->producer->id;
}

const char *share_name(const share_group *g)
{
    return g->name;
}

void share_ready(share_group *g)
{
    for (struct share_book_holder *h = g->book.holders; h; h = h->next)
        stream_deliver(share_member_of(h)->s);
}

/* Slots nobody needs any more go back FREE; the producer fills them again. */
static void share_collect(share_group *g, bool refill)
{
    stream *p = g->producer;
    uint32_t n = share_book_collect(&g->book, g->freed);
    for (uint32_t i = 0; i < n; i++) {
        int rc = ring_release(p->ring, g->freed[i], ring_generation(p->ring, g->freed[i]));
        ld_require(rc == 0); /* a slot in the book is LEASED: else the bookkeeping is broken */
    }
    if (n && refill)
        stream_schedule(p);
}

/* The consumer's next answer says where to reopen; what it holds stays its own. */
static void share_detach(share_group *g, share_member *m)
{
    stream *c = m->s;
    uint64_t bpe = sampler_batches(&c->smp), pos = c->p.start_batch + c->next_deliver;
    c->failed_seq = c->next_deliver;
    c->fail_rc = LD_EDETACHED;
    snprintf(c->fail_msg, sizeof c->fail_msg,
             "stream %" PRIu64 " fell %" PRIu64 " batches behind shared stream '%s' (server.share_max_lag %u): "
             "detached; reopen at epoch %" PRIu64 " batch %" PRIu64 " for a stream of its own",
             c->id, g->book.front - c->next_deliver, g->name, g->max_lag, c->p.epoch + pos / bpe, pos % bpe);
    ld_log(LD_LOG_INFO, "%s", c->fail_msg);
    if (m->waiting)
        share_waiting(m, false);
}

void share_take(share_member *m, uint32_t slot)
{
    share_group *g = m->g;
    stream *p = g->producer;
    if (share_book_take(&g->book, &m->h, slot, p->slots[slot].seq)) {
        int rc = ring_lease(p->ring, slot);
        ld_require(rc == 0); /* stream.c found it READY */
    }
    if (!share_book_detach_lagging(&g->book, g->max_lag))
        return;
    for (struct share_book_holder *h = g->book.holders; h; h = h->next) {
        share_member *o = share_member_of(h);
        if (!h->attached && o->s->failed_seq == UINT64_MAX)
            share_detach(g, o);
    }
    share_collect(g, true);
}

int share_release(share_member *m, uint32_t slot, uint64_t generation)
{
    share_group *g = m->g;
    if (slot >= g->book.n_slots)
        return LD_EINVAL;
    if (!m->h.held[slot])
        return LD_ENOTLEASED;
    if (generation != ring_generation(g->producer->ring, slot))
        return LD_ESTALE;
    int rc = share_book_put(&g->book, &m->h, slot);
    ld_require(rc == 0);
    share_collect(g, true);
    return 0;
}

void share_waiting(share_member *m, bool waiting)
{
    share_group *g = m->g;
    if (m->waiting == waiting)
        return;
    m->waiting = waiting;
    g->n_waiting += waiting ? 1 : -1;
    if (g->n_waiting == (waiting ? 1u : 0u))
        stream_set_urgent(g->producer, waiting);
}

void share_leave(share_member *m)
{
    share_group *g = m->g;
    if (m->waiting)
        share_waiting(m, false);
    share_book_leave(&g->book, &m->h);
    free(m);
    if (g->book.n_holders) {
        share_collect(g, true);
        return;
    }
    /* The last consumer: the group and its producer go. */
    for (share_group **link = &g->set->shares; *link; link = &(*link)->next) {
        if (*link == g) {
            *link = g->next;
            break;
        }
    }
    stream *p = g->producer;
    p->group = NULL; /* it answers nobody from now on */
    share_book_free(&g->book);
    free(g->freed);
    free(g);
    stream_close(p);
}

void share_position(const stream *consumer, uint64_t *ret_epoch, uint64_t *ret_batch)
{
    uint64_t bpe = sampler_batches(&consumer->smp), pos = consumer->p.start_batch + consumer->next_deliver;
    *ret_epoch = consumer->p.epoch + pos / bpe;
    *ret_batch = pos % bpe;
}

bool share_done(const stream *consumer)
{
    const share_member *m = consumer->member;
    return m && !m->h.attached && m->h.n_held == 0;
}

void share_describe(const share_member *m, cJSON *o)
{
    const share_group *g = m->g;
    cJSON *js = cJSON_AddObjectToObject(o, "share");
    cJSON_AddStringToObject(js, "name", g->name);
    cJSON_AddNumberToObject(js, "producer", (double)g->producer->id);
    cJSON_AddNumberToObject(js, "consumers", g->book.n_holders);
    cJSON_AddNumberToObject(js, "attached", g->book.n_attached);
    cJSON_AddBoolToObject(js, "detached", !m->h.attached);
    cJSON_AddNumberToObject(js, "lag", (double)(g->book.front - m->h.cursor));
    cJSON_AddNumberToObject(js, "max_lag", g->max_lag);
}
