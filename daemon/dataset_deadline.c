/* dataset_deadline — a deadline on every read of a sample.
 *
 * A read from a local disk always returns; one from a hung NFS server or a FUSE file
 * system whose server stopped answering may not, and no signal gets a thread out of
 * it (the kernel waits "killable" or uninterruptibly). What the daemon can do is not
 * send more workers after it: each read of a sample is registered here (which dataset,
 * which sample, since when), a watcher thread looks at the reads in progress four times
 * a second, and a read older than its dataset's read_timeout marks the dataset stalled.
 * While a dataset has a stalled read, dataset_read() fails at once with LD_ETIMEDOUT
 * (the stream that needs it gets `timed_out`, naming the sample), so the other workers
 * stay free for the other datasets; when the read returns at last, reads resume.
 *
 * Registration costs a few atomic stores and a read of the coarse clock (no system
 * call) per read. The token protocol lets the watcher flag a read without a lock
 * against the worker: the worker publishes the read, then its token; the watcher flags
 * it by compare-and-swap on that very token, which fails if the read has ended (token
 * 0) or another has begun (new token); the worker's end exchanges the token for 0 and
 * sees whether it had been flagged. */
#include "dataset.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"

#define DEADLINE_FLAGGED UINT64_C(1)
#define DEADLINE_PERIOD_NS (250u * 1000u * 1000u)

struct deadline_reader {
    struct deadline_reader *next;
    _Atomic uint64_t token;             /* 0: idle; else the read's number, | DEADLINE_FLAGGED */
    _Atomic(const dataset *) d;
    _Atomic uint64_t index, since_ns;
    uint64_t seq;                       /* the owner's last number (even) */
};

static pthread_mutex_t deadline_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t deadline_wake;
static struct deadline_reader *deadline_readers;
static unsigned deadline_users;
static bool deadline_stopping, deadline_running;
static pthread_t deadline_thread;
static pthread_key_t deadline_key;
static pthread_once_t deadline_once = PTHREAD_ONCE_INIT;
static _Thread_local struct deadline_reader *deadline_self;
static void (*deadline_notify_fn)(void *ctx);
static void *deadline_notify_ctx;

/* The coarse clock (the last tick's time, read from memory without a system call): a
 * read is timed on every sample, and the deadlines are seconds long. */
static uint64_t deadline_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A reading thread ends: its record leaves the list. */
static void deadline_reader_free(void *p)
{
    struct deadline_reader *r = p;
    pthread_mutex_lock(&deadline_lock);
    for (struct deadline_reader **link = &deadline_readers; *link; link = &(*link)->next) {
        if (*link == r) {
            *link = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&deadline_lock);
    free(r);
}

static void deadline_init(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&deadline_wake, &ca);
    pthread_condattr_destroy(&ca);
    (void)pthread_key_create(&deadline_key, deadline_reader_free);
}

/* One look at the reads in progress; under deadline_lock. The clock is read after the
 * read's start, so a read that began during the scan is never seen as old: its start
 * would otherwise lie after "now" and the difference wrap around. */
static void deadline_scan(void)
{
    for (struct deadline_reader *r = deadline_readers; r; r = r->next) {
        uint64_t t = atomic_load_explicit(&r->token, memory_order_acquire);
        if (!t || (t & DEADLINE_FLAGGED))
            continue;
        const dataset *d = atomic_load_explicit(&r->d, memory_order_relaxed);
        uint64_t since = atomic_load_explicit(&r->since_ns, memory_order_relaxed);
        uint64_t index = atomic_load_explicit(&r->index, memory_order_relaxed);
        uint64_t now = deadline_now_ns();
        if (!d || !d->read_timeout_ns || now < since || now - since < d->read_timeout_ns)
            continue;
        if (!atomic_compare_exchange_strong(&r->token, &t, t | DEADLINE_FLAGGED))
            continue; /* it ended meanwhile */
        atomic_fetch_add(&((dataset *)d)->stalled_reads, 1);
        ld_log(LD_LOG_ERROR, "dataset '%s': the read of sample %" PRIu64 " (%s) has not returned after %.0f s: "
               "its storage is not answering (a hung network or FUSE file system?); reads of this dataset "
               "fail with timed_out until it returns", d->name, index, dataset_sample_name(d, index),
               (double)(now - since) / 1e9);
        if (deadline_notify_fn)
            deadline_notify_fn(deadline_notify_ctx);
    }
}

void dataset_deadline_notify(void (*fn)(void *ctx), void *ctx)
{
    pthread_once(&deadline_once, deadline_init);
    pthread_mutex_lock(&deadline_lock);
    deadline_notify_fn = fn;
    deadline_notify_ctx = ctx;
    pthread_mutex_unlock(&deadline_lock);
}

static void *deadline_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&deadline_lock);
    while (!deadline_stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t until = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + DEADLINE_PERIOD_NS;
        ts.tv_sec = (time_t)(until / 1000000000u);
        ts.tv_nsec = (long)(until % 1000000000u);
        pthread_cond_timedwait(&deadline_wake, &deadline_lock, &ts);
        if (!deadline_stopping)
            deadline_scan();
    }
    pthread_mutex_unlock(&deadline_lock);
    return NULL;
}

int dataset_deadline_start(void)
{
    int rc = 0;
    pthread_once(&deadline_once, deadline_init);
    pthread_mutex_lock(&deadline_lock);
    if (deadline_users++ == 0) {
        deadline_stopping = false;
        /* The watcher takes no signal: the loop thread handles them. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = pthread_create(&deadline_thread, NULL, deadline_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) {
            deadline_users--;
            rc = ld_from_errno(err);
        } else {
            deadline_running = true;
            pthread_setname_np(deadline_thread, "ld-deadline");
        }
    }
    pthread_mutex_unlock(&deadline_lock);
    return rc;
}

void dataset_deadline_stop(void)
{
    pthread_mutex_lock(&deadline_lock);
    bool join = deadline_users > 0 && --deadline_users == 0 && deadline_running;
    if (join) {
        deadline_stopping = true;
        deadline_running = false;
        pthread_cond_broadcast(&deadline_wake);
    }
    pthread_mutex_unlock(&deadline_lock);
    if (join)
        pthread_join(deadline_thread, NULL);
}

uint64_t dataset_deadline_begin(const dataset *d, uint64_t index)
{
    struct deadline_reader *r = deadline_self;
    if (!r) {
        pthread_once(&deadline_once, deadline_init);
        r = calloc(1, sizeof *r);
        if (!r)
            return 0; /* unwatched: the read still happens */
        if (pthread_setspecific(deadline_key, r) != 0) {
            free(r);
            return 0;
        }
        pthread_mutex_lock(&deadline_lock);
        r->next = deadline_readers;
        deadline_readers = r;
        pthread_mutex_unlock(&deadline_lock);
        deadline_self = r;
    }
    r->seq += 2;
    atomic_store_explicit(&r->d, d, memory_order_relaxed);
    atomic_store_explicit(&r->index, index, memory_order_relaxed);
    atomic_store_explicit(&r->since_ns, deadline_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&r->token, r->seq, memory_order_release);
    return r->seq;
}

void dataset_deadline_end(const dataset *d, uint64_t token)
{
    struct deadline_reader *r = deadline_self;
    if (!token || !r)
        return;
    uint64_t t = atomic_exchange(&r->token, 0);
    if (!(t & DEADLINE_FLAGGED))
        return;
    atomic_fetch_sub(&((dataset *)d)->stalled_reads, 1);
    uint64_t since = atomic_load_explicit(&r->since_ns, memory_order_relaxed);
    ld_log(LD_LOG_WARN, "dataset '%s': the read of sample %" PRIu64 " returned after %.1f s; reads resume", d->name,
           atomic_load_explicit(&r->index, memory_order_relaxed), (double)(deadline_now_ns() - since) / 1e9);
}
