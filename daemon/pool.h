/* pool — the worker threads that prepare samples.
 *
 * Tasks are intrusive (struct pool_task embedded in the caller's object), queued FIFO
 * and run on one of N threads. pool_cancel removes a stream's queued tasks so a closing
 * stream waits only for the ones already running. */
#ifndef LD_POOL_H
#define LD_POOL_H

#include <stddef.h>
#include <stdint.h>

struct pool_task {
    struct pool_task *next;
    /* Runs on a worker thread; may block on I/O; must not touch loop-thread state
     * except through the caller's own synchronization. */
    void (*run)(struct pool_task *t);
    void *owner;           /* for pool_cancel */
};

typedef struct pool pool;

int pool_new(unsigned threads, pool **ret_pool);
/* Drops the tasks still queued without running them (nor any callback: they belong to
 * their owners), waits for the running ones to finish, joins the threads and frees the
 * pool. Accepts NULL. */
void pool_free(pool *p);
void pool_submit(pool *p, struct pool_task *t);
/* Removes queued tasks of `owner`, calling `cancelled` on each (on this thread).
 * Returns how many were removed. */
size_t pool_cancel(pool *p, void *owner, void (*cancelled)(struct pool_task *t));
unsigned pool_threads(const pool *p);
/* Workers inside a task now (any thread). */
unsigned pool_running(pool *p);
/* Total nanoseconds workers spent running tasks. */
uint64_t pool_busy_ns(const pool *p);

#endif
