/* pool — the worker threads that prepare samples.
 *
 * Tasks are intrusive (struct pool_task embedded in the caller's object) and queued per
 * flow (one per stream); which flow's task a free worker runs next is the scheduler's
 * choice (scheduler.h: weighted fair share of measured worker CPU time, priority to a
 * flow whose trainer waits, caps per group). pool_cancel takes a flow's queued tasks
 * back, so a closing stream waits only for the ones already running. */
#ifndef LD_POOL_H
#define LD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler.h"

typedef struct pool pool;
typedef struct pool_flow pool_flow;

struct pool_task {
    struct scheduler_item item;     /* first; set item.units (rows) before submitting */
    /* Runs on a worker thread; may block on I/O; must not touch loop-thread state
     * except through the caller's own synchronization. */
    void (*run)(struct pool_task *t);
    pool_flow *flow;                /* set by pool_submit */
};

int pool_new(unsigned threads, pool **ret_pool);
/* Drops the tasks still queued without running them (nor any callback: they belong to
 * their owners), waits for the running ones to finish, joins the threads and frees the
 * pool and its flows. Accepts NULL. */
void pool_free(pool *p);

/* A queue of its own for one stream's tasks, scheduled against the others. */
int pool_flow_new(pool *p, const struct scheduler_flow_params *params, pool_flow **ret_flow);
/* Ends a flow: its queued tasks must have been cancelled; it is freed once the tasks
 * still running are done. Accepts NULL. */
void pool_flow_close(pool *p, pool_flow *f);
/* The trainer of this flow's stream waits for a batch now (see scheduler.h). */
void pool_flow_set_urgent(pool *p, pool_flow *f, bool urgent);
void pool_flow_get_stats(pool *p, pool_flow *f, struct scheduler_flow_stats *ret_stats);

/* Queues t on flow f (NULL: the pool's own flow, for work that belongs to no stream). */
void pool_submit(pool *p, pool_flow *f, struct pool_task *t);
/* Removes the queued tasks of f (NULL: the pool's own flow), calling `cancelled` on
 * each (on this thread, oldest first). Returns how many were removed. */
size_t pool_cancel(pool *p, pool_flow *f, void (*cancelled)(struct pool_task *t));
unsigned pool_threads(const pool *p);
/* Workers inside a task now (any thread). */
unsigned pool_running(pool *p);
/* Total nanoseconds workers spent running tasks (wall time). */
uint64_t pool_busy_ns(const pool *p);

#endif
