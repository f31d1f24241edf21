/* ioqueue — many blocking reads in flight, for storage that is not in the page cache.
 *
 * A worker reads its samples one after another: on a cold disk it waits for each one,
 * so two workers keep two requests in flight where the device serves dozens at once.
 * An ioqueue is a set of threads that only do blocking I/O (open, read, close) on
 * behalf of a caller that must not wait: a job is a list of items (the samples of a
 * batch, a group of them an item) that the threads share out, one item at a time, so
 * up to `threads` items are under way at once. A job wakes as many sleeping threads as
 * it has items. The jobs here are read-ahead: they bring data into the page cache
 * before the workers read it (or into buffers the workers copy from: coldread.h), and
 * their failures are the workers' to report, so a job has no result. Measured on a
 * virtio disk (4 KiB random reads, O_DIRECT, fio):
 * 32 blocking threads 55.7k IOPS, io_uring at depth 32 42.6k, one thread 6.5k; small
 * files also need a path lookup and an inode per open, which io_uring would hand to
 * its own worker threads anyway. So the threads open, and what they start reading
 * goes to the kernel through io_uring a group at a time (coldread.c).
 *
 * Threads start on the first submit, so a dataset that is never cold costs nothing. */
#ifndef LD_IOQUEUE_H
#define LD_IOQUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ioqueue ioqueue;

/* Threads when nothing else is said: opens in flight (each thread then has a group of
 * reads in flight at once: coldread.c). */
#define IOQUEUE_DEFAULT_THREADS 32u
/* Each thread's scratch buffer: read-ahead reads the first bytes of each file of its
 * group into a share of it (8 KiB each for a group of 16). */
#define IOQUEUE_SCRATCH_BYTES (128u * 1024u)

struct ioqueue_job {
    /* Runs item `i` (0 <= i < n) on an I/O thread: may block; scratch holds
     * IOQUEUE_SCRATCH_BYTES and belongs to this call only. Items of one job run
     * concurrently on several threads. */
    void (*run)(struct ioqueue_job *j, size_t i, void *scratch);
    /* Runs once, on the I/O thread that finished the job's last item, or on the thread
     * of ioqueue_cancel / ioqueue_free when the job is dropped: the job is the
     * callee's again (free it). Must not block. */
    void (*done)(struct ioqueue_job *j, size_t items_run);
    size_t n;
    void *owner;                    /* what ioqueue_cancel matches on */
    /* The queue's own (set by ioqueue_submit). */
    struct ioqueue_job *next;
    size_t taken, finished, ran;    /* under the queue's lock */
};

/* threads: at most this many items under way at once (1..1024). */
int ioqueue_new(unsigned threads, ioqueue **ret_q);
/* Drops the jobs still queued (their `done` runs with the items run so far), waits for
 * the items running, joins the threads. Accepts NULL. */
void ioqueue_free(ioqueue *q);
/* Raises the threads to `threads` (capped at 1024): started now if the others are,
 * else on the first submit. A smaller number changes nothing. Any thread but an I/O
 * thread of q. */
void ioqueue_grow(ioqueue *q, unsigned threads);
/* Queues j (j->run, j->done, j->n, j->owner set; n > 0). Does not block on I/O: any
 * thread, the loop thread included. Starts the threads on first use; LD_ENOMEM (and j
 * is still the caller's) when they cannot be started. */
int ioqueue_submit(ioqueue *q, struct ioqueue_job *j);
/* Drops the queued items of every job of `owner` and waits until none of its items is
 * running; each such job's `done` has run when this returns. Any thread but an I/O
 * thread of q. */
void ioqueue_cancel(ioqueue *q, const void *owner);
/* Like ioqueue_cancel, but returns at once: the number of owner's items still running
 * (0: every job of owner's is back, its done has run). The jobs with items running
 * call their done on the I/O thread that finishes the last one. */
size_t ioqueue_cancel_nowait(ioqueue *q, const void *owner);
/* Items waiting and running now (for reports and tests). */
size_t ioqueue_pending(ioqueue *q);
unsigned ioqueue_threads(const ioqueue *q);

#endif
