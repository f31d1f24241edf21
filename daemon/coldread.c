/* coldread — cold-storage detection and read-ahead on an ioqueue (see coldread.h).
 *
 * The counters are relaxed atomics bumped by workers and I/O threads and read by the
 * loop thread's decision: an approximate share is all the decision needs. A job is one
 * batch's sample indices; its items are shared out among the ioqueue's threads. Each
 * item is a group of samples: an I/O thread opens them through the kind's callback,
 * starts RWF_NOWAIT reads of their first bytes in one io_uring submission (to learn
 * whether they were cached, and to hand the disk the misses together) and asks the
 * kernel for what was not with POSIX_FADV_WILLNEED; it never waits for the data
 * (coldread_item). Read once's table of buffers is coldread_once.c; the layouts are in
 * coldread_internal.h. */
#include "coldread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "coldread_internal.h"
#include "ld_error.h"
#include "log.h"

/* The daemon's I/O threads: one ioqueue shared by every dataset's read-ahead, so that
 * ten cold datasets keep the disk as busy as one does without ten sets of threads. It
 * is made with the first coldread, has as many threads as the largest `threads` asked
 * for by a coldread made since (started on the first submit), and goes with the last
 * coldread. A job's owner is its coldread, so one dataset's cancel leaves the others'
 * reads alone. */
static struct {
    pthread_mutex_t lock;
    ioqueue *io;
    unsigned users;                 /* coldreads alive */
} coldread_pool = {.lock = PTHREAD_MUTEX_INITIALIZER};



/* Samples an I/O thread takes at a time: opened one after another, then their reads
 * started with one io_uring submission (coldread_item), each into its share of the
 * thread's scratch buffer. 16 rather than 8: each group costs its thread a sleep for
 * its reads and a trip through the queue's lock, and with 8 those were a third of the
 * daemon's context switches; measured with 20,000 cold 3 KiB files (alternating
 * daemons, 6 rounds of 4 epochs, twice): 3-5% more files a second and 5% less CPU a
 * file (14.8 -> 14.1 us), the first batch about 1 ms later (9 against 8 ms). */
#define COLDREAD_GROUP 16u
#define COLDREAD_FIRST_BYTES (IOQUEUE_SCRATCH_BYTES / COLDREAD_GROUP)

struct coldread_job {
    struct ioqueue_job job;         /* first; its items are groups of COLDREAD_GROUP samples */
    coldread *ra;
    size_t count;                   /* samples (a cancel lowers job.n) */
    struct coldread_entry **ent;    /* read once: count entries (after idx), NULL each that could not be had */
    uint64_t idx[];
};

int coldread_new(unsigned threads, coldread_open_fn open, coldread_same_fn same, const void *ctx,
                 coldread **ret_ra)
{
    coldread *ra = calloc(1, sizeof *ra);
    if (!ra)
        return LD_ENOMEM;
    ra->buckets = same ? calloc(COLDREAD_BUCKETS, sizeof *ra->buckets) : NULL;
    if (same && !ra->buckets) {
        free(ra);
        return LD_ENOMEM;
    }
    pthread_mutex_init(&ra->lock, NULL);
    pthread_cond_init(&ra->ready, NULL);
    ra->threads = threads ? threads : IOQUEUE_DEFAULT_THREADS;
    ra->open = open;
    ra->same = same;
    ra->ctx = ctx;
    pthread_mutex_lock(&coldread_pool.lock);
    int r = coldread_pool.io ? 0 : ioqueue_new(ra->threads, &coldread_pool.io);
    if (r == 0) {
        ioqueue_grow(coldread_pool.io, ra->threads);
        coldread_pool.users++;
        ra->io = coldread_pool.io;
    }
    pthread_mutex_unlock(&coldread_pool.lock);
    if (r < 0) {
        pthread_cond_destroy(&ra->ready);
        pthread_mutex_destroy(&ra->lock);
        free(ra->buckets);
        free(ra);
        return r;
    }
    *ret_ra = ra;
    return 0;
}

void coldread_free(coldread *ra)
{
    if (!ra)
        return;
    ioqueue_cancel(ra->io, ra); /* drops ra's queued jobs, waits for its items running */
    ioqueue *last = NULL;
    pthread_mutex_lock(&coldread_pool.lock);
    if (--coldread_pool.users == 0) {
        last = coldread_pool.io;
        coldread_pool.io = NULL;
    }
    pthread_mutex_unlock(&coldread_pool.lock);
    ioqueue_free(last); /* nobody else's jobs are left in it */
    /* Every job is back: what is left in the table is READY and nobody else's. */
    for (size_t b = 0; ra->buckets && b < COLDREAD_BUCKETS; b++)
        coldread_entries_free(ra, ra->buckets[b]);
    free(ra->buckets);
    pthread_cond_destroy(&ra->ready);
    pthread_mutex_destroy(&ra->lock);
    free(ra);
}

struct coldread_reaper {
    coldread *ra;
    void (*done)(void *arg);
    void *arg;
};

static void *coldread_reap(void *p)
{
    struct coldread_reaper *r = p;
    coldread_free(r->ra);
    r->done(r->arg);
    free(r);
    return NULL;
}

void coldread_release(coldread *ra, void (*done)(void *arg), void *arg)
{
    if (ra && ioqueue_cancel_nowait(ra->io, ra) > 0) {
        struct coldread_reaper *r = malloc(sizeof *r);
        pthread_attr_t attr;
        pthread_t t;
        if (r && pthread_attr_init(&attr) == 0) {
            *r = (struct coldread_reaper){.ra = ra, .done = done, .arg = arg};
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old);
            int e = pthread_create(&t, &attr, coldread_reap, r);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            pthread_attr_destroy(&attr);
            if (e == 0)
                return;
        }
        free(r); /* no thread: wait here instead */
    }
    coldread_free(ra);
    done(arg);
}

static void coldread_count(coldread *ra, bool miss)
{
    atomic_fetch_add_explicit(&ra->reads, 1, memory_order_relaxed);
    if (miss)
        atomic_fetch_add_explicit(&ra->misses, 1, memory_order_relaxed);
}

/* One RWF_NOWAIT attempt: bytes read, or -1 with errno; EAGAIN means "not cached". A
 * file system without it (EOPNOTSUPP) is remembered and the answer is EAGAIN without
 * a count: the caller then reads as usual. */
static ssize_t coldread_try(coldread *ra, int fd, void *buf, size_t len, off_t off, bool *ret_counted)
{
    *ret_counted = false;
    if (atomic_load_explicit(&ra->nowait_unsupported, memory_order_relaxed)) {
        errno = EAGAIN;
        return -1;
    }
    struct iovec v = {.iov_base = buf, .iov_len = len};
    for (;;) {
        ssize_t n = preadv2(fd, &v, 1, off, RWF_NOWAIT);
        if (n >= 0 || errno == EAGAIN) {
            *ret_counted = true;
            if (n < 0)
                errno = EAGAIN;
            return n;
        }
        if (errno == EINTR)
            continue;
        if (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS) {
            atomic_store(&ra->nowait_unsupported, true);
            errno = EAGAIN;
        }
        return -1;
    }
}

static ssize_t coldread_blocking(int fd, void *buf, size_t len, off_t off)
{
    for (;;) {
        ssize_t n = pread(fd, buf, len, off);
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

ssize_t coldread_pread(coldread *ra, int fd, void *buf, size_t len, off_t off)
{
    if (!ra)
        return coldread_blocking(fd, buf, len, off);
    bool counted;
    ssize_t n = coldread_try(ra, fd, buf, len, off, &counted);
    if (counted && !atomic_load_explicit(&ra->on, memory_order_relaxed))
        coldread_count(ra, n < 0);
    if (n >= 0)
        return n; /* a partial read: part of the range was cached; the next call asks again */
    /* Not cached, or another error: the plain read waits, or says what it is. */
    return coldread_blocking(fd, buf, len, off);
}

bool coldread_wanted(coldread *ra)
{
    uint64_t reads = atomic_load_explicit(&ra->reads, memory_order_relaxed);
    bool on = atomic_load_explicit(&ra->on, memory_order_relaxed);
    if (reads < COLDREAD_SAMPLE_READS)
        return on;
    /* Streams of one dataset decide on several threads at once (the loop, workers on
     * direct paths): one of them takes the reads counted so far, the others go by the
     * last decision (else both would subtract the same reads). */
    if (atomic_exchange_explicit(&ra->deciding, true, memory_order_acquire))
        return on;
    reads = atomic_load_explicit(&ra->reads, memory_order_relaxed);
    uint64_t misses = atomic_exchange_explicit(&ra->misses, 0, memory_order_relaxed);
    atomic_fetch_sub_explicit(&ra->reads, reads, memory_order_relaxed);
    bool cold = misses * COLDREAD_COLD_DIV >= reads;
    if (cold != on) {
        atomic_store_explicit(&ra->on, cold, memory_order_relaxed);
        ld_log(LD_LOG_DEBUG, "read-ahead %s: %" PRIu64 " of %" PRIu64 " reads missed the page cache",
               cold ? "on" : "off", misses, reads);
    }
    atomic_store_explicit(&ra->deciding, false, memory_order_release);
    return cold;
}

/* Each I/O thread's io_uring, made on its first group and freed when the thread ends
 * (the key's destructor). A thread where io_uring cannot be had (an old kernel, a
 * seccomp filter, a memory limit) starts its reads with one preadv2 each instead. */
static pthread_key_t coldread_ring_key;
static pthread_once_t coldread_ring_once = PTHREAD_ONCE_INIT;
static bool coldread_ring_key_made;
static __thread int coldread_ring_state; /* 0: not tried yet; 1: made; -1: none */

static void coldread_ring_free(void *p)
{
    io_uring_queue_exit(p);
    free(p);
}

static void coldread_ring_key_make(void)
{
    coldread_ring_key_made = pthread_key_create(&coldread_ring_key, coldread_ring_free) == 0;
}

static struct io_uring *coldread_ring(void)
{
    if (coldread_ring_state)
        return coldread_ring_state > 0 ? pthread_getspecific(coldread_ring_key) : NULL;
    coldread_ring_state = -1;
    pthread_once(&coldread_ring_once, coldread_ring_key_make);
    struct io_uring *r = coldread_ring_key_made ? malloc(sizeof *r) : NULL;
    if (!r)
        return NULL;
    if (io_uring_queue_init(COLDREAD_GROUP, r, 0) < 0) {
        free(r);
        return NULL;
    }
    if (pthread_setspecific(coldread_ring_key, r) != 0) {
        coldread_ring_free(r);
        return NULL;
    }
    coldread_ring_state = 1;
    return r;
}

/* This thread's ring failed in a way that leaves it unusable: dropped, and the thread
 * starts its reads one by one from now on. */
static void coldread_ring_drop(struct io_uring *r)
{
    pthread_setspecific(coldread_ring_key, NULL);
    coldread_ring_free(r);
    coldread_ring_state = -1;
}

/* One sample of a group on an I/O thread. */
struct coldread_file {
    struct coldread_entry *e;       /* read once (its buffer: e->buf); NULL: read ahead only */
    int fd;                         /* -1: not opened (failed, or a worker reads it) */
    uint64_t bytes;                 /* to bring in */
    uint64_t have;                  /* read once: bytes in e->buf so far */
    struct coldread_stamp stamp;
    ssize_t got;                    /* the last read: bytes, or -errno (-EAGAIN: not cached) */
    bool tried, counted;            /* got is set; it says whether the data was cached */
    bool hit;                       /* read once: the read was served from the page cache */
    bool whole;                     /* read once: e->buf holds the whole sample */
};

/* Where a sample's read goes: read once, the rest of its buffer; read ahead only, its
 * share of the scratch buffer (first bytes: the rest is advised). */
static size_t coldread_target(struct coldread_file *f, char *scratch, size_t s, void **ret_dst, off_t *ret_off)
{
    if (f->e && f->e->buf) {
        *ret_dst = f->e->buf + f->have;
        *ret_off = (off_t)f->have;
        return (size_t)(f->bytes - f->have);
    }
    *ret_dst = scratch + s * COLDREAD_FIRST_BYTES;
    *ret_off = 0;
    return f->bytes < COLDREAD_FIRST_BYTES ? (size_t)f->bytes : COLDREAD_FIRST_BYTES;
}

/* The reads of a group's opened files, all in one io_uring submission (one doorbell for
 * the disk), then waited for: RWF_NOWAIT reads of the samples only read ahead (nowait:
 * each answers at once, -EAGAIN when not cached), or the plain reads of the samples
 * read once. A plain read whose data is cached completes within the submission (the
 * kernel tries it without blocking first), one that goes to the disk later: so those
 * found completed right after the submit are the hits, and no RWF_NOWAIT read is needed
 * to tell (a read that came back from the disk as fast is counted a hit: the decision
 * only needs a share). Those the ring could not take are left untried. */
static void coldread_ring_reads(coldread *ra, struct coldread_file *f, size_t m, char *scratch, bool nowait)
{
    struct io_uring *r = coldread_ring();
    if (!r)
        return;
    unsigned queued = 0;
    for (size_t s = 0; s < m; s++) {
        f[s].tried = false;
        bool once = f[s].e && f[s].e->buf;
        if (f[s].fd < 0 || !f[s].bytes || once == nowait || f[s].whole)
            continue;
        void *dst;
        off_t off;
        size_t len = coldread_target(&f[s], scratch, s, &dst, &off);
        struct io_uring_sqe *sqe = io_uring_get_sqe(r);
        if (!sqe)
            break; /* cannot happen: the ring holds a group and is emptied after each */
        io_uring_prep_read(sqe, f[s].fd, dst, (unsigned)len, (uint64_t)off);
        sqe->rw_flags = nowait ? RWF_NOWAIT : 0;
        sqe->user_data = s;
        queued++;
    }
    if (!queued)
        return;
    int sub = io_uring_submit(r);
    if (sub < 0) {
        coldread_ring_drop(r);
        return;
    }
    bool within = true; /* completed within the submission */
    for (int done = 0; done < sub;) {
        struct io_uring_cqe *cqe;
        if (io_uring_peek_cqe(r, &cqe) != 0) {
            within = false;
            int e = io_uring_wait_cqe_nr(r, &cqe, (unsigned)(sub - done)); /* one sleep for the rest */
            if (e == -EINTR || (!nowait && (e == -EAGAIN || e == -EBUSY)))
                continue;
            if (e < 0 && !nowait) {
                /* The plain reads may still be writing into the samples' buffers: the
                 * ring cannot be dropped and the buffers freed. (A ring of a group's
                 * size with one group in it has no other way to fail.) */
                char ebuf[128];
                ld_log(LD_LOG_ERROR, "read-ahead: waiting for io_uring reads failed: %s",
                       strerror_r(-e, ebuf, sizeof ebuf));
                abort();
            }
            if (e < 0) {
                coldread_ring_drop(r); /* the others stay untried: read one by one */
                return;
            }
        }
        size_t s = (size_t)cqe->user_data;
        int res = cqe->res;
        io_uring_cqe_seen(r, cqe);
        done++;
        if (s >= m)
            continue;
        if (nowait && (res == -EOPNOTSUPP || res == -EINVAL)) {
            atomic_store(&ra->nowait_unsupported, true); /* as coldread_try: never cold */
            continue; /* untried: the one-by-one path asks the kernel for it */
        }
        f[s].tried = true;
        f[s].got = res;
        f[s].counted = nowait ? res >= 0 || res == -EAGAIN : true;
        f[s].hit = !nowait && within;
    }
    if ((unsigned)sub < queued)
        coldread_ring_drop(r); /* the rest sit in its queue: not to be mixed with the next group */
}

/* Read once: what the last read brought; false when the sample cannot be kept (an
 * error, or the end of the file before the recorded size: the worker's read says so). */
static bool coldread_got(struct coldread_file *f)
{
    if (f->got == -EAGAIN)
        return true; /* not cached: the plain read follows */
    if (f->got <= 0)
        return false;
    f->have += (uint64_t)f->got;
    f->whole = f->have >= f->bytes;
    return true;
}

/* Read once: a buffer for f's sample within the dataset's budget, or none (then it is
 * only read ahead). */
static void coldread_buffer(coldread *ra, struct coldread_file *f)
{
    if (!f->e || !f->bytes || f->bytes > COLDREAD_ONCE_MAX_FILE)
        return;
    uint64_t held = atomic_fetch_add_explicit(&ra->held_bytes, f->bytes, memory_order_relaxed);
    if (held + f->bytes <= COLDREAD_ONCE_BUDGET && (f->e->buf = malloc(f->bytes))) {
        f->e->bytes = f->bytes;
        f->e->stamp = f->stamp;
        return;
    }
    atomic_fetch_sub_explicit(&ra->held_bytes, f->bytes, memory_order_relaxed);
}

/* An I/O thread: start bringing a group of samples into the page cache, without
 * waiting for the disk. The opens are the part that blocks (a cold directory block or
 * inode); the data is only asked for: a RWF_NOWAIT read that misses has already
 * started the kernel's read of those pages when it answers EAGAIN, and
 * POSIX_FADV_WILLNEED makes sure of the whole file. The thread then moves on while the
 * disk works, so the data of a whole batch (and of the batches queued behind it) is in
 * flight at once, and the thread pays no sleep and wake-up per sample. The group's
 * reads go to the kernel in one io_uring submission, so the disk is handed
 * COLDREAD_GROUP requests with one doorbell (on a virtual disk a doorbell is an exit to
 * the hypervisor: a tenth of the CPU of a cold file when each has its own). Measured
 * on a virtio disk, 20,000 cold 3 KiB files: 45 us of CPU each with a blocking read per
 * file, 24-37 us starting the reads one by one, 20-23 us in groups of 8 (one thread
 * per request, 32 threads; groups of 16 since: above). The worker's read then finds
 * the pages, or waits for the ones still in flight.
 *
 * Read once changes the end of it: the reads of the group's samples that have a buffer
 * are plain reads into it, in one submission that the thread waits for (one sleep per
 * group, not per file), so that the worker copies the bytes instead of opening and
 * reading the file again; whether they were cached is told by whether they completed
 * within the submission (coldread_ring_reads). */
static void coldread_item(struct ioqueue_job *j, size_t g, void *scratch)
{
    struct coldread_job *k = (struct coldread_job *)j;
    coldread *ra = k->ra;
    size_t begin = g * COLDREAD_GROUP;
    size_t m = k->count - begin < COLDREAD_GROUP ? k->count - begin : COLDREAD_GROUP;
    struct coldread_file f[COLDREAD_GROUP];
    struct coldread_entry *gone = NULL;
    bool skip[COLDREAD_GROUP] = {false};

    if (k->ent) { /* samples a worker took meanwhile are its to read */
        pthread_mutex_lock(&ra->lock);
        for (size_t s = 0; s < m; s++) {
            struct coldread_entry *e = k->ent[begin + s];
            if (e && !e->linked) {
                skip[s] = true;
                e->next = gone;
                gone = e;
                k->ent[begin + s] = NULL;
            } else if (e) {
                e->state = COLDREAD_INFLIGHT;
            }
        }
        pthread_mutex_unlock(&ra->lock);
    }
    for (size_t s = 0; s < m; s++) {
        f[s] = (struct coldread_file){.fd = -1, .e = k->ent ? k->ent[begin + s] : NULL};
        if (skip[s])
            continue;
        if (ra->open(ra->ctx, k->idx[begin + s], &f[s].fd, &f[s].bytes, &f[s].stamp) < 0) {
            f[s].fd = -1;
            atomic_fetch_add_explicit(&ra->failed, 1, memory_order_relaxed);
            continue;
        }
        coldread_buffer(ra, &f[s]);
    }
    if (!atomic_load_explicit(&ra->nowait_unsupported, memory_order_relaxed))
        coldread_ring_reads(ra, f, m, scratch, true);
    for (size_t s = 0; s < m; s++) {
        if (f[s].fd < 0 || (f[s].e && f[s].e->buf))
            continue; /* read once: below */
        void *dst;
        off_t off;
        size_t first = coldread_target(&f[s], scratch, s, &dst, &off);
        if (first && !f[s].tried) {
            ssize_t n = coldread_try(ra, f[s].fd, dst, first, off, &f[s].counted);
            f[s].got = n < 0 ? -errno : n;
        }
        if (first && f[s].got < 0 && f[s].got != -EAGAIN) {
            atomic_fetch_add_explicit(&ra->failed, 1, memory_order_relaxed);
            close(f[s].fd); /* the worker's read says what it is */
            f[s].fd = -1;
            continue;
        }
        bool miss = first && f[s].got == -EAGAIN && f[s].counted;
        if (f[s].counted)
            coldread_count(ra, miss);
        atomic_fetch_add_explicit(&ra->samples, 1, memory_order_relaxed);
        if (miss)
            atomic_fetch_add_explicit(&ra->ahead_misses, 1, memory_order_relaxed);
        uint64_t have = !first || f[s].got < 0 ? 0 : (uint64_t)f[s].got;
        if (f[s].bytes > have)
            posix_fadvise(f[s].fd, (off_t)have, (off_t)(f[s].bytes - have), POSIX_FADV_WILLNEED);
        close(f[s].fd);
        f[s].fd = -1;
    }

    if (k->ent) {
        /* Read once: the group's reads in one submission, waited for; what the ring did
         * not take with a RWF_NOWAIT try (to count it) and plain reads, as what it
         * brought short. Only a whole read is kept: an error or a file shorter than
         * recorded is the worker's read's to report. */
        coldread_ring_reads(ra, f, m, scratch, false);
        for (size_t s = 0; s < m; s++) {
            if (f[s].fd < 0)
                continue;
            if (!f[s].tried) {
                ssize_t n = coldread_try(ra, f[s].fd, f[s].e->buf, (size_t)f[s].bytes, 0, &f[s].counted);
                f[s].got = n < 0 ? -errno : n;
                f[s].hit = n >= 0;
            }
            if (f[s].got < 0 && f[s].got != -EAGAIN) {
                atomic_fetch_add_explicit(&ra->failed, 1, memory_order_relaxed);
                close(f[s].fd);
                f[s].fd = -1;
                continue;
            }
            bool miss = f[s].counted && !f[s].hit;
            if (f[s].counted)
                coldread_count(ra, miss);
            atomic_fetch_add_explicit(&ra->samples, 1, memory_order_relaxed);
            if (miss)
                atomic_fetch_add_explicit(&ra->ahead_misses, 1, memory_order_relaxed);
            if (!coldread_got(&f[s])) { /* cut short: the worker's read says so */
                close(f[s].fd);
                f[s].fd = -1;
                continue;
            }
            while (!f[s].whole) {
                ssize_t n = coldread_blocking(f[s].fd, f[s].e->buf + f[s].have, (size_t)(f[s].bytes - f[s].have),
                                              (off_t)f[s].have);
                f[s].got = n < 0 ? -errno : n;
                if (!coldread_got(&f[s]) || f[s].got == -EAGAIN)
                    break;
            }
            close(f[s].fd);
            f[s].fd = -1;
        }
        /* Published: a whole buffer becomes READY; anything else goes, and the worker
         * reads the sample itself. */
        bool wake = false;
        pthread_mutex_lock(&ra->lock);
        for (size_t s = 0; s < m; s++) {
            struct coldread_entry *e = f[s].e;
            if (!e)
                continue;
            wake |= e->waited;
            if (e->linked && f[s].whole) {
                e->state = COLDREAD_READY;
                continue;
            }
            if (e->linked)
                coldread_unlink(ra, e);
            e->next = gone;
            gone = e;
        }
        if (wake) /* only then: the workers wait for a read of this group, not for any */
            pthread_cond_broadcast(&ra->ready);
        pthread_mutex_unlock(&ra->lock);
        coldread_entries_free(ra, gone);
    }
    atomic_fetch_sub_explicit(&ra->pending, m, memory_order_relaxed);
}

static void coldread_job_done(struct ioqueue_job *j, size_t items_run)
{
    struct coldread_job *k = (struct coldread_job *)j;
    coldread *ra = k->ra;
    /* The groups run are the first items_run (a cancel stops taking more); the samples
     * of those dropped were counted pending at submit, and their entries are the job's. */
    size_t ran = items_run * COLDREAD_GROUP < k->count ? items_run * COLDREAD_GROUP : k->count;
    atomic_fetch_sub_explicit(&ra->pending, k->count - ran, memory_order_relaxed);
    if (k->ent && ran < k->count) {
        struct coldread_entry *gone = NULL;
        pthread_mutex_lock(&ra->lock);
        for (size_t i = ran; i < k->count; i++) {
            struct coldread_entry *e = k->ent[i];
            if (!e)
                continue;
            if (e->linked)
                coldread_unlink(ra, e);
            e->next = gone;
            gone = e;
        }
        pthread_mutex_unlock(&ra->lock);
        coldread_entries_free(ra, gone);
    }
    free(k);
}

int coldread_submit(coldread *ra, const void *owner, const uint64_t *idx, size_t n)
{
    if (!n)
        return 0;
    size_t each = sizeof(uint64_t) + (ra->same ? sizeof(struct coldread_entry *) : 0);
    struct coldread_job *k = malloc(sizeof *k + n * each);
    if (!k)
        return LD_ENOMEM;
    memset(&k->job, 0, sizeof k->job);
    k->job.run = coldread_item;
    k->job.done = coldread_job_done;
    k->job.n = (n + COLDREAD_GROUP - 1) / COLDREAD_GROUP;
    k->job.owner = ra;
    k->ra = ra;
    k->count = n;
    k->ent = NULL;
    memcpy(k->idx, idx, n * sizeof idx[0]);
    if (ra->same) {
        /* An entry that cannot be had only means that sample is read ahead, not once. */
        k->ent = (struct coldread_entry **)(k->idx + n);
        for (size_t i = 0; i < n; i++) {
            k->ent[i] = calloc(1, sizeof *k->ent[i]);
            if (k->ent[i]) {
                k->ent[i]->index = idx[i];
                k->ent[i]->owner = owner;
            }
        }
        pthread_mutex_lock(&ra->lock);
        for (size_t i = 0; i < n; i++)
            if (k->ent[i])
                coldread_link(ra, k->ent[i]);
        pthread_mutex_unlock(&ra->lock);
    }
    atomic_fetch_add_explicit(&ra->pending, n, memory_order_relaxed);
    int r = ioqueue_submit(ra->io, &k->job);
    if (r < 0) {
        atomic_fetch_sub_explicit(&ra->pending, n, memory_order_relaxed);
        if (k->ent) {
            pthread_mutex_lock(&ra->lock);
            for (size_t i = 0; i < n; i++)
                if (k->ent[i] && k->ent[i]->linked)
                    coldread_unlink(ra, k->ent[i]);
            pthread_mutex_unlock(&ra->lock);
            for (size_t i = 0; i < n; i++)
                coldread_entry_free(ra, k->ent[i]);
        }
        free(k);
    }
    return r;
}


void coldread_get_stats(coldread *ra, struct coldread_stats *ret_stats)
{
    *ret_stats = (struct coldread_stats){
        .on = atomic_load_explicit(&ra->on, memory_order_relaxed),
        .samples = atomic_load_explicit(&ra->samples, memory_order_relaxed),
        .misses = atomic_load_explicit(&ra->ahead_misses, memory_order_relaxed),
        .failed = atomic_load_explicit(&ra->failed, memory_order_relaxed),
        .pending = atomic_load_explicit(&ra->pending, memory_order_relaxed),
        .entries = atomic_load_explicit(&ra->linked, memory_order_relaxed),
        .threads = ioqueue_threads(ra->io),
        .taken = atomic_load_explicit(&ra->taken, memory_order_relaxed),
        .changed = atomic_load_explicit(&ra->changed, memory_order_relaxed),
        .held_bytes = atomic_load_explicit(&ra->held_bytes, memory_order_relaxed),
    };
}
