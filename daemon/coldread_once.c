/* coldread_once — read once's table of buffers (coldread.h), by sample index.
 *
 * Each sample of a read-ahead job has an entry, made at submit (coldread.c) and found by
 * sample index in a hash table under the coldread's lock, so a worker can tell whether
 * its sample is queued, in flight or read. Who frees an entry: while it is
 * QUEUED or unlinked before its read, its job (the I/O thread that reaches it, or the
 * job's done when it is dropped); while INFLIGHT, the I/O thread reading it (which
 * frees it at the end instead of publishing it when it was unlinked meanwhile);
 * once READY, whoever unlinks it (coldread_take, coldread_forget, coldread_free). A
 * worker that finds its sample QUEUED unlinks it and reads the file itself, and the
 * I/O thread skips it; one that finds it INFLIGHT waits on `ready`. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coldread_internal.h"

void coldread_stamp_of(const struct stat *st, struct coldread_stamp *ret_stamp)
{
    *ret_stamp = (struct coldread_stamp){
        .dev = (uint64_t)st->st_dev,
        .ino = (uint64_t)st->st_ino,
        .size = (uint64_t)st->st_size,
        .ctime_sec = (int64_t)st->st_ctim.tv_sec,
        .ctime_nsec = (int64_t)st->st_ctim.tv_nsec,
    };
}

static size_t coldread_bucket(uint64_t index)
{
    return (size_t)((index * 0x9E3779B97F4A7C15ull) >> 52) & (COLDREAD_BUCKETS - 1);
}

/* Under the lock. */
void coldread_link(coldread *ra, struct coldread_entry *e)
{
    struct coldread_entry **b = &ra->buckets[coldread_bucket(e->index)];
    e->next = *b;
    *b = e;
    e->linked = true;
    atomic_fetch_add_explicit(&ra->linked, 1, memory_order_relaxed);
}

/* Under the lock; e is linked. */
void coldread_unlink(coldread *ra, struct coldread_entry *e)
{
    struct coldread_entry **link = &ra->buckets[coldread_bucket(e->index)];
    while (*link != e)
        link = &(*link)->next;
    *link = e->next;
    e->next = NULL;
    e->linked = false;
    atomic_fetch_sub_explicit(&ra->linked, 1, memory_order_relaxed);
}

/* Under the lock: sample index's entry, READY first, then INFLIGHT, then QUEUED (a
 * sample asked for twice, by two streams or two epochs, has two). */
static struct coldread_entry *coldread_find(coldread *ra, uint64_t index)
{
    struct coldread_entry *best = NULL;
    for (struct coldread_entry *e = ra->buckets[coldread_bucket(index)]; e; e = e->next)
        if (e->index == index && (!best || e->state > best->state))
            best = e;
    return best;
}

/* Unlinked, not on an I/O thread's hands: its buffer and itself go. */
void coldread_entry_free(coldread *ra, struct coldread_entry *e)
{
    if (!e)
        return;
    if (e->buf) {
        free(e->buf);
        atomic_fetch_sub_explicit(&ra->held_bytes, e->bytes, memory_order_relaxed);
    }
    free(e);
}

void coldread_entries_free(coldread *ra, struct coldread_entry *list)
{
    while (list) {
        struct coldread_entry *next = list->next;
        coldread_entry_free(ra, list);
        list = next;
    }
}

bool coldread_take(coldread *ra, uint64_t index, void *dst, uint64_t bytes)
{
    if (!ra || !ra->same || !atomic_load_explicit(&ra->linked, memory_order_relaxed))
        return false;
    struct coldread_entry *e;
    pthread_mutex_lock(&ra->lock);
    for (;;) {
        e = coldread_find(ra, index);
        if (!e || e->state != COLDREAD_INFLIGHT)
            break;
        e->waited = true; /* its read is on its way: reading it again would only wait longer */
        pthread_cond_wait(&ra->ready, &ra->lock);
    }
    bool ready = e && e->state == COLDREAD_READY;
    if (e)
        coldread_unlink(ra, e); /* QUEUED: the I/O thread skips it and frees it (e is its now) */
    pthread_mutex_unlock(&ra->lock);
    if (!ready)
        return false;
    bool same = e->bytes == bytes && ra->same(ra->ctx, index, &e->stamp);
    if (same)
        memcpy(dst, e->buf, bytes);
    atomic_fetch_add_explicit(same ? &ra->taken : &ra->changed, 1, memory_order_relaxed);
    coldread_entry_free(ra, e);
    return same;
}

void coldread_forget(coldread *ra, const void *owner)
{
    if (!ra || !ra->same || !atomic_load_explicit(&ra->linked, memory_order_relaxed))
        return;
    struct coldread_entry *gone = NULL;
    pthread_mutex_lock(&ra->lock);
    for (size_t b = 0; b < COLDREAD_BUCKETS; b++) {
        for (struct coldread_entry **link = &ra->buckets[b]; *link;) {
            struct coldread_entry *e = *link;
            if (e->owner != owner) {
                link = &e->next;
                continue;
            }
            coldread_unlink(ra, e); /* QUEUED or INFLIGHT: its job or I/O thread frees it */
            if (e->state == COLDREAD_READY) {
                e->next = gone;
                gone = e;
            }
        }
    }
    pthread_mutex_unlock(&ra->lock);
    coldread_entries_free(ra, gone);
}
