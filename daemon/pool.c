/* The worker pool: N threads that run the tasks the streams submit (reading, decoding
 * and collating the samples of a batch).
 *
 * Tasks are intrusive, so submitting allocates nothing and cannot fail. They are queued
 * per flow (one per stream) in the scheduler (scheduler.c), which this file drives under
 * one mutex: a free worker asks it for the next task, runs the task outside the lock,
 * and reports the task's cost, its thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that
 * shares are shares of the work done and not of the time spent blocked on storage (the
 * tasks it runs back to back for one flow are reported together: struct pool_run). One
 * lock is enough because a task is a run of samples (micro- to milliseconds of work),
 * not a single one. A closing stream takes its queued tasks back with pool_cancel and
 * closes its flow, which is freed when its last running task is done. The wall time
 * workers spend inside tasks is summed for `loaderctl status` (busy time against wall
 * time is the pool's utilisation). Workers block all signals: the loop thread handles
 * them. */
#include "pool.h"

#include "ld_error.h"
#include "log.h"

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

struct pool_flow {
    pool_flow *prev, *next;         /* every flow not yet freed, for pool_free */
    scheduler_flow *sf;
    bool closed;                    /* freed by the worker that finishes its last task */
};

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;            /* signalled on submit and on stop */
    scheduler *sched;               /* under lock */
    pool_flow *flows;               /* under lock */
    pool_flow *own;                 /* tasks submitted without a flow */
    bool stopping;
    atomic_uint queued;             /* tasks queued, readable without the lock */
    unsigned idle;                  /* workers blocked in the condition variable */
    unsigned nthreads;              /* threads started (and to be joined) */
    pthread_t *threads;
    atomic_uint_fast64_t busy_ns;
};

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
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

/* A worker reports the tasks it ran back to back for one flow together (struct
 * pool_run): at most this many, or this much wall time. */
#define POOL_RUN_TASKS 16u
#define POOL_RUN_NS (2u * 1000u * 1000u)

/* The pool whose worker this thread is, NULL on any other thread. */
static _Thread_local pool *pool_self;

/* Under the lock. */
static void flow_free(pool *p, pool_flow *f)
{
    if (f->prev)
        f->prev->next = f->next;
    else
        p->flows = f->next;
    if (f->next)
        f->next->prev = f->prev;
    scheduler_flow_free(p->sched, f->sf);
    free(f);
}

/* Sleeps until a submit or a stop, or for wait_ns when every queued task is held back
 * by a cap. Under the lock. */
static void worker_sleep(pool *p, uint64_t wait_ns)
{
    p->idle++;
    if (wait_ns) {
        uint64_t until = now_ns() + wait_ns;
        struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u), .tv_nsec = (long)(until % 1000000000u)};
        pthread_cond_timedwait(&p->wake, &p->lock, &ts);
    } else {
        pthread_cond_wait(&p->wake, &p->lock);
    }
    p->idle--;
}

/* The tasks a worker ran back to back for one flow and has not reported yet: their
 * cost is known together, from one read of the thread's CPU clock (a system call, where
 * the monotonic clock is not), when the run ends: before the next pick when another
 * flow has work, when nothing is left, after the first task of a flow that has no cost
 * yet (its picks charge nothing until one is known), or once the run has POOL_RUN_TASKS
 * tasks or POOL_RUN_NS of their wall time. That is looked at as each task ends, so a
 * run's report can also wait for the end of the flow's next task (one that blocks on
 * storage holds it as long). Until then each stays charged what its pick charged
 * (scheduler.h: the flow's recent cost per unit), so a cap's credit sees it at once (a
 * cap's bucket holds SCHEDULER_CAP_BURST_NS). */
struct pool_run {
    pool_flow *flow;                /* NULL: empty */
    unsigned n;
    uint64_t wall_ns;               /* the tasks' wall time, summed */
    uint64_t cpu_start;             /* the thread's CPU clock when the run began */
    struct scheduler_ticket tickets[POOL_RUN_TASKS];
    uint64_t wall[POOL_RUN_TASKS];
};

/* Under the lock: reports the run's tasks, its CPU time (to `now`, the thread's CPU
 * clock; 0: read it here) split among them in proportion to their wall time, and frees
 * a closed flow whose last task it was. Returns the clock, where the next run begins. */
static uint64_t run_settle(pool *p, struct pool_run *r, uint64_t now)
{
    if (!now)
        now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    uint64_t cost = now - r->cpu_start, given = 0;
    for (unsigned i = 0; i < r->n; i++) {
        uint64_t c = i + 1 == r->n ? cost - given
                                   : (r->wall_ns ? (uint64_t)((double)cost * (double)r->wall[i] / (double)r->wall_ns)
                                                 : cost / r->n);
        if (c > cost - given)
            c = cost - given;
        given += c;
        scheduler_done(p->sched, &r->tickets[i], c);
    }
    pool_flow *f = r->flow;
    if (f->closed && scheduler_flow_idle(f->sf))
        flow_free(p, f);
    r->flow = NULL;
    r->n = 0;
    r->wall_ns = 0;
    return now;
}

/* Under the lock: whether a flow other than f has work, so that the next pick depends
 * on the costs of f's run. */
static bool others_queued(pool *p, const pool_flow *f)
{
    struct scheduler_flow_stats st;
    scheduler_flow_get_stats(f->sf, &st);
    return scheduler_queued(p->sched) > st.queued;
}

static void *worker_main(void *arg)
{
    pool *p = arg;
    bool spun = false;
    /* The thread's CPU clock is read when a run of one flow's tasks ends (another
     * flow's task is next, nothing is, or the run is long enough) rather than after
     * every task: a worker filling one stream's batches reads it once every
     * POOL_RUN_TASKS tasks. What the picks in between cost (a lock and a scheduler
     * step) is counted to the run. */
    struct pool_run run = {.flow = NULL};
    bool cpu_known = false; /* run.cpu_start holds the clock as the last run ended */
    pool_self = p;
    pthread_mutex_lock(&p->lock);
    /* Stopping wins over a non-empty queue: pool_free drops what is queued. */
    while (!p->stopping) {
        struct scheduler_ticket ticket;
        uint64_t wait = 0;
        /* The run's costs go in before a pick between flows. */
        if (run.flow && others_queued(p, run.flow)) {
            run.cpu_start = run_settle(p, &run, 0);
            cpu_known = true;
        }
        struct pool_task *t = (struct pool_task *)scheduler_pick(p->sched, now_ns(), &ticket, &wait);
        if (run.flow && (!t || t->flow != run.flow)) {
            run.cpu_start = run_settle(p, &run, 0);
            cpu_known = true;
        }
        if (!t) {
            cpu_known = false; /* a spin or a sleep is nobody's cost */
            if (!wait && !spun) {
                pthread_mutex_unlock(&p->lock);
                spin_for_work(p);
                pthread_mutex_lock(&p->lock);
                spun = true;
                continue;
            }
            worker_sleep(p, wait);
            continue;
        }
        spun = false;
        atomic_fetch_sub_explicit(&p->queued, 1, memory_order_relaxed);
        pool_flow *f = t->flow;
        /* Another flow has work: this task's run will end at the next pick, so its
         * clock is read after the task, before the lock (a system call not to make
         * while the other workers wait for the lock). */
        bool others = others_queued(p, f);
        pthread_mutex_unlock(&p->lock);

        uint64_t start = now_ns();
        if (!run.flow && !cpu_known)
            run.cpu_start = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        cpu_known = true;
        t->run(t); /* t may be freed by now: do not touch it again */
        uint64_t wall = now_ns() - start;
        atomic_fetch_add_explicit(&p->busy_ns, wall, memory_order_relaxed);
        /* The run ends here when another flow had work, when it is long enough, and
         * most likely when nothing is queued (the worker is about to wait): the clock is
         * read before the lock. */
        uint64_t cpu_end = 0;
        if (others || run.n + 1 >= POOL_RUN_TASKS || run.wall_ns + wall >= POOL_RUN_NS ||
            !atomic_load_explicit(&p->queued, memory_order_relaxed))
            cpu_end = clock_ns(CLOCK_THREAD_CPUTIME_ID);

        pthread_mutex_lock(&p->lock);
        run.flow = f;
        run.tickets[run.n] = ticket;
        run.wall[run.n++] = wall;
        run.wall_ns += wall;
        if (!cpu_end) {
            struct scheduler_flow_stats st;
            scheduler_flow_get_stats(f->sf, &st);
            if (!st.tasks) /* a new flow: its first cost, for the picks that follow */
                cpu_end = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        }
        if (cpu_end)
            run.cpu_start = run_settle(p, &run, cpu_end);
    }
    if (run.flow)
        run_settle(p, &run, 0);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Stops and joins the threads started so far, then frees. Works on a half-built pool. */
static void pool_destroy(pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    for (pool_flow *f = p->flows; f; f = f->next)
        scheduler_flow_take(p->sched, f->sf);
    atomic_store(&p->queued, 0);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    while (p->flows) {
        pool_flow *f = p->flows;
        p->flows = f->next;
        free(f);
    }
    scheduler_free(p->sched); /* and the flows' scheduler halves */
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

static int flow_new_locked(pool *p, const struct scheduler_flow_params *params, pool_flow **ret_flow)
{
    pool_flow *f = calloc(1, sizeof *f);
    if (!f)
        return LD_ENOMEM;
    int rc = scheduler_flow_new(p->sched, params, &f->sf);
    if (rc < 0) {
        free(f);
        return rc;
    }
    f->next = p->flows;
    if (p->flows)
        p->flows->prev = f;
    p->flows = f;
    *ret_flow = f;
    return 0;
}

int pool_new(unsigned threads, pool **ret_pool)
{
    if (threads == 0 || threads > POOL_MAX_THREADS || !ret_pool)
        return LD_EINVAL;
    pool *p = calloc(1, sizeof(*p));
    if (!p)
        return LD_ENOMEM;
    p->threads = calloc(threads, sizeof(*p->threads));
    if (!p->threads || scheduler_new(threads, &p->sched) < 0 ||
        flow_new_locked(p, &(struct scheduler_flow_params){.weight = 1}, &p->own) < 0) {
        free(p->own);
        scheduler_free(p->sched);
        free(p->threads);
        free(p);
        return LD_ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    /* Timed waits (a capped flow's credit) on the monotonic clock: a clock step must
     * not stretch them. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &ca);
    pthread_condattr_destroy(&ca);
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

int pool_flow_new(pool *p, const struct scheduler_flow_params *params, pool_flow **ret_flow)
{
    pthread_mutex_lock(&p->lock);
    int rc = flow_new_locked(p, params, ret_flow);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void pool_flow_close(pool *p, pool_flow *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&p->lock);
    /* Queued tasks of a closed flow would run for a stream that is gone. */
    const struct scheduler_item *left = scheduler_flow_take(p->sched, f->sf);
    ld_require(!left);
    if (scheduler_flow_idle(f->sf))
        flow_free(p, f);
    else
        f->closed = true;
    pthread_mutex_unlock(&p->lock);
}

void pool_flow_set_urgent(pool *p, pool_flow *f, bool urgent)
{
    pthread_mutex_lock(&p->lock);
    scheduler_flow_set_urgent(f->sf, urgent);
    pthread_mutex_unlock(&p->lock);
}

void pool_flow_get_stats(pool *p, pool_flow *f, struct scheduler_flow_stats *ret_stats)
{
    pthread_mutex_lock(&p->lock);
    scheduler_flow_get_stats(f->sf, ret_stats);
    pthread_mutex_unlock(&p->lock);
}

void pool_submit(pool *p, pool_flow *f, struct pool_task *t)
{
    pthread_mutex_lock(&p->lock);
    t->flow = f ? f : p->own;
    scheduler_push(p->sched, t->flow->sf, &t->item);
    unsigned queued = atomic_fetch_add_explicit(&p->queued, 1, memory_order_relaxed) + 1;
    /* A task submitted by one of our workers (a stream refilling the slot it just
     * handed on) is the next that worker picks: another is woken only for more. */
    if (p->idle && (pool_self != p || queued > 1))
        pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

size_t pool_cancel(pool *p, pool_flow *f, void (*cancelled)(struct pool_task *t))
{
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    struct scheduler_item *taken = scheduler_flow_take(p->sched, (f ? f : p->own)->sf);
    for (struct scheduler_item *it = taken; it; it = it->next)
        n++;
    atomic_fetch_sub_explicit(&p->queued, (unsigned)n, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);

    /* Outside the lock: the callback may free the task or submit others. */
    while (taken) {
        struct pool_task *t = (struct pool_task *)taken;
        taken = taken->next;
        t->item.next = NULL;
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
