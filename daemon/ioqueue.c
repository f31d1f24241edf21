/* ioqueue — a set of threads that keep many blocking reads in flight (see ioqueue.h).
 *
 * One mutex guards a list of jobs in submission order. A free thread takes the next
 * item of the oldest job that has one left, runs it outside the lock and counts it
 * finished; the job leaves the list, and its `done` runs, when its last item taken has
 * finished and no more can be taken (all taken, or cancelled). Items are shared out
 * one at a time rather than a job per thread, so a batch of 64 samples is read by as
 * many threads as are free, and two batches queued behind each other overlap. The
 * threads start on the first submit and block all signals (the loop thread handles
 * them); cancel and free wait on a second condition variable for running items. */
#include "ioqueue.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>

#include "ld_error.h"
#include "log.h"

#define IOQUEUE_MAX_THREADS 1024u

struct ioqueue {
    pthread_mutex_t lock;
    pthread_cond_t work;            /* an item was queued, or stopping */
    pthread_cond_t finished;        /* a job left the list, or its done returned */
    struct ioqueue_job *head, *tail;
    struct ioqueue_finishing *finishing; /* jobs whose done runs on an I/O thread now */
    bool stopping;
    unsigned want, started;
    unsigned sleeping;              /* threads waiting on `work` */
    unsigned woken;                 /* of those, signalled and not yet back */
    pthread_t *threads;
};

/* A job whose last item finished on an I/O thread, while that thread runs its done
 * outside the lock: on the thread's stack, since the job is the callee's from then on.
 * ioqueue_cancel waits for these too, so that its owner's done has run when it returns. */
struct ioqueue_finishing {
    const void *owner;
    struct ioqueue_finishing *next;
};

static void ioqueue_unlink(ioqueue *q, struct ioqueue_job *j)
{
    struct ioqueue_job **link = &q->head, *prev = NULL;
    while (*link && *link != j) {
        prev = *link;
        link = &(*link)->next;
    }
    if (!*link)
        return;
    *link = j->next;
    if (q->tail == j)
        q->tail = prev;
    j->next = NULL;
}

/* Under the lock: the job's last item has finished and none is left to take. */
static bool ioqueue_job_over(const struct ioqueue_job *j)
{
    return j->taken == j->n && j->finished == j->taken;
}

static void *ioqueue_thread(void *arg)
{
    ioqueue *q = arg;
    void *scratch = malloc(IOQUEUE_SCRATCH_BYTES);
    if (!scratch) {
        /* It cannot work, and must not sleep with the others: a wake-up meant for a
         * thread that can would be spent on it. The others do its share. */
        ld_log(LD_LOG_WARN, "ioqueue: an I/O thread could not get its %u-byte buffer: one fewer request in flight",
               IOQUEUE_SCRATCH_BYTES);
        return NULL;
    }

    pthread_mutex_lock(&q->lock);
    for (;;) {
        struct ioqueue_job *j = q->head;
        while (j && j->taken == j->n)
            j = j->next;
        if (q->stopping)
            break;
        if (!j) {
            q->sleeping++;
            pthread_cond_wait(&q->work, &q->lock);
            q->sleeping--;
            if (q->woken)
                q->woken--;
            continue;
        }
        size_t i = j->taken++;
        pthread_mutex_unlock(&q->lock);
        j->run(j, i, scratch);
        pthread_mutex_lock(&q->lock);
        j->finished++;
        j->ran++;
        if (ioqueue_job_over(j)) {
            size_t ran = j->ran;
            struct ioqueue_finishing f = {.owner = j->owner, .next = q->finishing};
            ioqueue_unlink(q, j);
            q->finishing = &f;
            pthread_mutex_unlock(&q->lock);
            j->done(j, ran);
            pthread_mutex_lock(&q->lock);
            struct ioqueue_finishing **link = &q->finishing;
            while (*link != &f)
                link = &(*link)->next;
            *link = f.next;
            pthread_cond_broadcast(&q->finished);
        }
    }
    pthread_mutex_unlock(&q->lock);
    free(scratch);
    return NULL;
}

int ioqueue_new(unsigned threads, ioqueue **ret_q)
{
    if (threads < 1 || threads > IOQUEUE_MAX_THREADS)
        return LD_EINVAL;
    ioqueue *q = calloc(1, sizeof *q);
    if (!q)
        return LD_ENOMEM;
    q->threads = calloc(IOQUEUE_MAX_THREADS, sizeof *q->threads); /* room to grow: 8 KiB */
    if (!q->threads) {
        free(q);
        return LD_ENOMEM;
    }
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->finished, NULL);
    q->want = threads;
    *ret_q = q;
    return 0;
}

/* Under the lock, on first use. Threads that cannot be started are logged and done
 * without: fewer requests in flight, nothing lost. */
static int ioqueue_start(ioqueue *q)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (q->started < q->want) {
        int e = pthread_create(&q->threads[q->started], NULL, ioqueue_thread, q);
        if (e) {
            ld_log(LD_LOG_WARN, "ioqueue: started %u of %u I/O threads: %s", q->started, q->want,
                   e == EAGAIN ? "resource limit" : "error");
            q->want = q->started;
            break;
        }
        pthread_setname_np(q->threads[q->started], "ld-io");
        q->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return q->started ? 0 : LD_ENOMEM;
}

void ioqueue_grow(ioqueue *q, unsigned threads)
{
    if (threads > IOQUEUE_MAX_THREADS)
        threads = IOQUEUE_MAX_THREADS;
    pthread_mutex_lock(&q->lock);
    if (threads > q->want) {
        q->want = threads;
        if (q->started)
            ioqueue_start(q);
    }
    pthread_mutex_unlock(&q->lock);
}

int ioqueue_submit(ioqueue *q, struct ioqueue_job *j)
{
    if (!j->n || !j->run || !j->done)
        return LD_EINVAL;
    unsigned wake = 0;
    pthread_mutex_lock(&q->lock);
    int r = q->started ? 0 : ioqueue_start(q);
    if (r == 0 && q->stopping)
        r = LD_ECANCELED;
    if (r == 0) {
        j->next = NULL;
        j->taken = j->finished = j->ran = 0;
        if (q->tail)
            q->tail->next = j;
        else
            q->head = j;
        q->tail = j;
        /* As many sleeping threads as the job has items, not all of them: the ones
         * woken for nothing would only queue up for the lock. Threads at work take
         * the rest as they finish. Signalled after the unlock, so that the woken do
         * not wait for it. */
        unsigned idle = q->sleeping - q->woken;
        wake = j->n < idle ? (unsigned)j->n : idle;
        q->woken += wake;
    }
    pthread_mutex_unlock(&q->lock);
    while (wake--)
        pthread_cond_signal(&q->work);
    return r;
}

/* Under the lock: takes every job of owner (NULL: all) that no thread is running
 * back into *ret_dropped, and makes the others take no more items. */
static void ioqueue_drop(ioqueue *q, const void *owner, struct ioqueue_job **ret_dropped)
{
    struct ioqueue_job *j = q->head;
    while (j) {
        struct ioqueue_job *next = j->next;
        if (!owner || j->owner == owner) {
            j->n = j->taken; /* no more items of it start */
            if (j->finished == j->taken) {
                ioqueue_unlink(q, j);
                j->next = *ret_dropped;
                *ret_dropped = j;
            }
        }
        j = next;
    }
}

static void ioqueue_done_all(struct ioqueue_job *dropped)
{
    while (dropped) {
        struct ioqueue_job *next = dropped->next;
        dropped->done(dropped, dropped->ran);
        dropped = next;
    }
}

static bool ioqueue_has_owner(const ioqueue *q, const void *owner)
{
    for (const struct ioqueue_job *j = q->head; j; j = j->next)
        if (!owner || j->owner == owner)
            return true;
    for (const struct ioqueue_finishing *f = q->finishing; f; f = f->next)
        if (!owner || f->owner == owner)
            return true;
    return false;
}

void ioqueue_cancel(ioqueue *q, const void *owner)
{
    struct ioqueue_job *dropped = NULL;
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    ioqueue_drop(q, owner, &dropped);
    /* The jobs with items running finish on their threads, which call their done. */
    while (ioqueue_has_owner(q, owner))
        pthread_cond_wait(&q->finished, &q->lock);
    pthread_mutex_unlock(&q->lock);
    ioqueue_done_all(dropped);
}

size_t ioqueue_cancel_nowait(ioqueue *q, const void *owner)
{
    struct ioqueue_job *dropped = NULL;
    size_t running = 0;
    pthread_mutex_lock(&q->lock);
    ioqueue_drop(q, owner, &dropped);
    for (const struct ioqueue_job *j = q->head; j; j = j->next)
        if (!owner || j->owner == owner)
            running += j->taken - j->finished;
    for (const struct ioqueue_finishing *f = q->finishing; f; f = f->next)
        if (!owner || f->owner == owner)
            running++; /* its last item is done, its done not yet */
    pthread_mutex_unlock(&q->lock);
    ioqueue_done_all(dropped);
    return running;
}

void ioqueue_free(ioqueue *q)
{
    if (!q)
        return;
    ioqueue_cancel(q, NULL);
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    for (unsigned i = 0; i < q->started; i++)
        pthread_join(q->threads[i], NULL);
    pthread_cond_destroy(&q->finished);
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->lock);
    free(q->threads);
    free(q);
}

size_t ioqueue_pending(ioqueue *q)
{
    size_t n = 0;
    pthread_mutex_lock(&q->lock);
    for (const struct ioqueue_job *j = q->head; j; j = j->next)
        n += j->n - j->finished;
    pthread_mutex_unlock(&q->lock);
    return n;
}

unsigned ioqueue_threads(const ioqueue *q)
{
    return q->want;
}
