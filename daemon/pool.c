/* The worker pool: N threads that run the tasks the streams submit (reading, decoding
 * and collating the samples of a batch).
 *
 * Tasks are intrusive, so submitting allocates nothing and cannot fail; the queue is a
 * FIFO under one mutex, which is enough because a task is a run of samples (micro- to
 * milliseconds of work), not a single one. A closing stream takes its queued tasks back
 * with pool_cancel and then only waits for those already running. The time workers
 * spend inside tasks is summed for `loaderctl status` (busy time against wall time is
 * the pool's utilisation). Workers block all signals: the loop thread handles them. */
#include "pool.h"

#include "ld_error.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <time.h>

/* More threads than this is a configuration mistake, not a machine. */
#define POOL_MAX_THREADS 1024

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;          /* signalled on submit and on stop */
    struct pool_task *head, *tail;
    bool stopping;
    atomic_uint queued;           /* tasks in the queue, readable without the lock */
    unsigned idle;                /* workers blocked in the condition variable */
    unsigned nthreads;            /* threads started (and to be joined) */
    pthread_t *threads;
    atomic_uint_fast64_t busy_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Before sleeping, a worker that just finished a task watches the queue for a short
 * while: batches of cheap samples arrive every few tens of microseconds, and a sleep
 * and wake-up through the kernel costs about as much as the work itself. */
#define POOL_SPIN_NS 50000u

static void spin_for_work(pool *p)
{
    uint64_t until = now_ns() + POOL_SPIN_NS;
    while (!atomic_load_explicit(&p->queued, memory_order_relaxed)) {
        if (now_ns() > until)
            return;
        sched_yield();
    }
}

static void *worker_main(void *arg)
{
    pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        if (!p->head && !p->stopping) {
            pthread_mutex_unlock(&p->lock);
            spin_for_work(p);
            pthread_mutex_lock(&p->lock);
        }
        while (!p->head && !p->stopping) {
            p->idle++;
            pthread_cond_wait(&p->wake, &p->lock);
            p->idle--;
        }
        /* Stopping wins over a non-empty queue: pool_free drops what is queued. */
        if (p->stopping)
            break;
        struct pool_task *t = p->head;
        atomic_fetch_sub_explicit(&p->queued, 1, memory_order_relaxed);
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        t->next = NULL;
        pthread_mutex_unlock(&p->lock);

        uint64_t start = now_ns();
        t->run(t); /* t may be freed by now: do not touch it again */
        atomic_fetch_add_explicit(&p->busy_ns, now_ns() - start, memory_order_relaxed);

        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Stops and joins the threads started so far, then frees. Works on a half-built pool. */
static void pool_destroy(pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    p->head = p->tail = NULL;
    atomic_store(&p->queued, 0);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

int pool_new(unsigned threads, pool **ret_pool)
{
    if (threads == 0 || threads > POOL_MAX_THREADS || !ret_pool)
        return LD_EINVAL;
    pool *p = calloc(1, sizeof(*p));
    if (!p)
        return LD_ENOMEM;
    p->threads = calloc(threads, sizeof(*p->threads));
    if (!p->threads) {
        free(p);
        return LD_ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->busy_ns, 0);

    /* New threads inherit the creator's signal mask: block everything around the
     * creation so that signals go to the loop thread, then restore ours. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int ret = 0;
    for (unsigned i = 0; i < threads; i++) {
        int err = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (err != 0) {
            ret = ld_from_errno(err);
            break;
        }
        p->nthreads++;
        char name[16];
        snprintf(name, sizeof(name), "ld-worker-%u", i);
        pthread_setname_np(p->threads[i], name);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ret != 0) {
        pool_destroy(p);
        return ret;
    }
    *ret_pool = p;
    return 0;
}

void pool_free(pool *p)
{
    if (p)
        pool_destroy(p);
}

void pool_submit(pool *p, struct pool_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    atomic_fetch_add_explicit(&p->queued, 1, memory_order_relaxed);
    if (p->idle)
        pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

size_t pool_cancel(pool *p, void *owner, void (*cancelled)(struct pool_task *t))
{
    struct pool_task *taken = NULL, **taken_tail = &taken;
    size_t n = 0;

    pthread_mutex_lock(&p->lock);
    struct pool_task **link = &p->head, *prev = NULL;
    while (*link) {
        struct pool_task *t = *link;
        if (t->owner == owner) {
            *link = t->next;
            t->next = NULL;
            *taken_tail = t;
            taken_tail = &t->next;
            n++;
        } else {
            prev = t;
            link = &t->next;
        }
    }
    p->tail = prev;
    atomic_fetch_sub_explicit(&p->queued, (unsigned)n, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);

    /* Outside the lock: the callback may free the task or submit others. */
    while (taken) {
        struct pool_task *t = taken;
        taken = t->next;
        t->next = NULL;
        if (cancelled)
            cancelled(t);
    }
    return n;
}

unsigned pool_running(pool *p)
{
    pthread_mutex_lock(&p->lock);
    unsigned n = p->nthreads - p->idle;
    pthread_mutex_unlock(&p->lock);
    return n;
}

unsigned pool_threads(const pool *p)
{
    return p->nthreads;
}

uint64_t pool_busy_ns(const pool *p)
{
    return atomic_load_explicit(&p->busy_ns, memory_order_relaxed);
}
