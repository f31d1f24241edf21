/* coldread_internal.h — the layout of a coldread and of read once's entries, shared
 * by coldread.c (detection, read-ahead, the I/O threads' work) and coldread_once.c (the
 * table of buffers the workers take from). This file is private to those two. */
#ifndef LD_COLDREAD_INTERNAL_H
#define LD_COLDREAD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "coldread.h"

/* Read once: hash buckets by sample index (a prefetch depth of batches is a few
 * thousand entries at most). */
#define COLDREAD_BUCKETS 4096u

enum coldread_state { COLDREAD_QUEUED, COLDREAD_INFLIGHT, COLDREAD_READY };

struct coldread_entry {
    struct coldread_entry *next;    /* in its bucket, while linked */
    const void *owner;              /* the stream that asked for it */
    uint64_t index;
    uint8_t *buf;                   /* set by the I/O thread: the sample's bytes */
    uint64_t bytes;                 /* of buf, counted in held_bytes */
    struct coldread_stamp stamp;
    enum coldread_state state;
    bool linked;
    bool waited;                    /* a worker waits for its read: wake the workers when it is back */
};

struct coldread {
    ioqueue *io;                    /* coldread_pool.io */
    unsigned threads;
    coldread_open_fn open;
    coldread_same_fn same;          /* NULL: no read once */
    const void *ctx;
    pthread_mutex_t lock;           /* the entries' table and states */
    pthread_cond_t ready;           /* an INFLIGHT entry that a worker waits for is back */
    struct coldread_entry **buckets;
    atomic_uint_fast64_t linked;    /* entries in the table: 0 makes coldread_take free */
    atomic_uint_fast64_t held_bytes, taken, changed;
    atomic_bool on;
    atomic_bool nowait_unsupported; /* the file system refuses RWF_NOWAIT: never cold */
    atomic_uint_fast64_t reads, misses; /* since the last decision */
    atomic_bool deciding;           /* coldread_wanted: one caller at a time takes the counts */
    atomic_uint_fast64_t samples, ahead_misses, failed, pending;
};

/* coldread_once.c. Under ra->lock: link e into the table (e->index set), unlink a
 * linked e. Not under it: free an unlinked entry (and its buffer, given back to the
 * budget), or a list of them chained by next. */
void coldread_link(coldread *ra, struct coldread_entry *e);
void coldread_unlink(coldread *ra, struct coldread_entry *e);
void coldread_entry_free(coldread *ra, struct coldread_entry *e);
void coldread_entries_free(coldread *ra, struct coldread_entry *list);

#endif
