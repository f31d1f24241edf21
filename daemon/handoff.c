/* handoff — the daemon's side of the batch hand-off through shared memory (handoff.h).
 *
 * A stream answers `next` requests in order (stream.h); the hand-off is one more asker:
 * it keeps exactly one `next` waiting on its stream, and every answer (a leased batch)
 * becomes an entry of the ready queue, after which it asks again. The client takes
 * entries without a system call while there are some, and sleeps on a futex when there
 * are none; the daemon wakes it only when it said it sleeps. Releases come back the same
 * way, through a queue the client writes, and the daemon takes them whenever the loop
 * passes by: its own publications come with every filled slot, so while anything fills
 * the releases are taken without being asked. When nothing fills (every slot leased or
 * published) the daemon says it is idle, and the client that releases then sends one
 * `handoff` request: the only socket message in the loop, and only for a trainer slower
 * than its data.
 *
 * Wake-ups are coalesced while batches come fast. A trainer that outruns cheap batches
 * (token windows, a packed cache) would sleep after nearly every one, and a sleep and
 * its wake-up cost the two sides more CPU than such a batch. A client whose last sleep
 * was short sleeps "briefly" (LD_HANDOFF_WAIT_BRIEF: it looks again by itself within
 * 5 ms); while batches come fast (the last one less than `wake_gap_ns` before) and more
 * are filling, such a client is woken once half the prefetch depth is ready, and takes
 * those without sleeping. Never a client that sleeps long (its first sleep, or one after
 * a slow batch: a stream of decoded images wakes its trainer at once), never when
 * nothing else fills (no more batches come before the client gives slots back), never at
 * the end, and not once the hold is `wake_hold_ns` old when a batch comes; the client's
 * own brief timeout bounds a hold whose next batch is late.
 *
 * The direct path. Once the client has mapped the object, the stream runs it without
 * the loop (stream_direct.c): the worker that fills the batch next in line
 * publishes it (handoff_publish, under the stream's lock) and then takes the releases
 * (direct_after), and refills follow from them. What a worker does not decide is left
 * to the loop, which it posts: a release entry that is wrong (the loop takes the queue
 * again and ends the connection), nothing left filling (the loop says the daemon is
 * idle, as before), the counters to settle every HANDOFF_SETTLE_BATCHES batches, and the
 * end. The loop's calls here take the same lock, so the state below has one owner at
 * a time; an ended, failed or closed hand-off turns the direct path off first.
 *
 * The object has no name: it is a memfd whose descriptor travels with the open reply
 * (SCM_RIGHTS), so no other process can open it, not even one of the service group
 * before the trainer does, and nothing of it outlives its last mapping. It is sealed to
 * its size: the client gets a writable descriptor, and must not be able to shrink the
 * object under the daemon's mapping (a SIGBUS here) or grow it.
 *
 * The client's memory is read once per field into locals and checked before anything
 * is done with it: a release queue that claims more entries than it can hold, or an
 * entry that names a slot not leased at that generation, ends the connection with the
 * reason (handoff_fail_cb); other clients never see it. */
#include "handoff.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <uv.h>

#include "ld_wire.h"
#include "log.h"
#include "ring.h"

struct handoff {
    stream *s;
    uint64_t id;
    int fd;                     /* until taken for the open reply */
    bool started;               /* the client mapped it: publishing */
    bool asking;                /* a next of ours waits on the stream */
    bool ended;                 /* the end entry is published: nothing more */
    bool failed;                /* the client broke the protocol: nothing more */
    struct ld_handoff_header *hdr;
    struct ld_handoff_ready *ready;
    const struct ld_handoff_release *rel;
    uint64_t size;
    uint32_t cap, slot_count;
    uint64_t ready_tail, release_head; /* our own copies: the shared ones are only told */
    uint32_t seq, idle_seq;
    bool client_waited;         /* the client slept when the last entry was published */
    uint64_t woke_tail;         /* ready_tail when the client was last woken */
    uint64_t last_publish_ns;   /* when the last entry was published (monotonic) */
    uint64_t held_since_ns;     /* a sleeping client's wake-up is held since then (0: none) */
    uint64_t wake_gap_ns, wake_hold_ns; /* the coalescing rule's times (above) */
    handoff_batch_cb on_batch;
    handoff_fail_cb on_fail;
    void *ctx;
    uint64_t owed_batches, owed_rows, owed_bytes; /* published, not yet told to on_batch */
    bool direct;                /* publishing on a worker: the futex wake-up waits */
    bool wake_owed;             /* the client sleeps and was not woken yet */
    atomic_uint waking;         /* workers about to wake the client: close waits for them */
};

/* The coalescing rule's defaults: batches this close together are "coming fast" (token
 * windows and packed-cache batches come every 10-100 µs, decoded images every few ms),
 * and a held wake-up goes with the next batch once it is this old (the client's own
 * brief timeout bounds it when no batch comes). */
#define HANDOFF_WAKE_GAP_NS 200000u
#define HANDOFF_WAKE_HOLD_NS 1000000u

/* Batches published on the direct path before the loop is asked to settle the counts. */
#define HANDOFF_SETTLE_BATCHES 64u

/* Tells the connection of the batches published since the last time. Loop thread. */
static void handoff_settle(handoff *h)
{
    if (!h->owed_batches)
        return;
    h->on_batch(h->ctx, h->owed_batches, h->owed_rows, h->owed_bytes);
    h->owed_batches = h->owed_rows = h->owed_bytes = 0;
}

static uint32_t handoff_capacity(uint32_t slot_count)
{
    uint32_t cap = 16;
    while (cap <= slot_count) /* every slot leased and the end entry still fit */
        cap *= 2;
    return cap;
}

int handoff_open(stream *s, uint64_t id, uint32_t slot_count, handoff_batch_cb on_batch, handoff_fail_cb on_fail,
                 void *ctx, handoff **ret_handoff, char *errbuf)
{
    if (slot_count == 0 || slot_count >= LD_HANDOFF_QUEUE_MAX) {
        ld_errorf(errbuf, "a hand-off queue holds at most %u slots, the ring has %u", LD_HANDOFF_QUEUE_MAX - 1,
                  slot_count);
        return LD_ERANGE;
    }
    handoff *h = calloc(1, sizeof *h);
    if (!h) {
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    h->s = s;
    h->id = id;
    h->slot_count = slot_count;
    h->cap = handoff_capacity(slot_count);
    h->on_batch = on_batch;
    h->on_fail = on_fail;
    h->ctx = ctx;
    h->client_waited = true; /* the first batch is waited for: the trainer has just opened */
    h->wake_gap_ns = HANDOFF_WAKE_GAP_NS;
    h->wake_hold_ns = HANDOFF_WAKE_HOLD_NS;
    uint64_t ready_off = sizeof(struct ld_handoff_header);
    uint64_t release_off = ready_off + (uint64_t)h->cap * sizeof(struct ld_handoff_ready);
    uint64_t total = release_off + (uint64_t)h->cap * sizeof(struct ld_handoff_release);
    total = (total + LD_RING_ALIGN - 1) / LD_RING_ALIGN * LD_RING_ALIGN;
    void *base = MAP_FAILED;
    const char *step = "memfd_create";
    h->fd = memfd_create("loaderd-handoff", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (h->fd >= 0 && (step = "ftruncate", ftruncate(h->fd, (off_t)total)) == 0 &&
        /* Its pages now: a memory shortage is an error here, not a SIGBUS later. */
        (step = "fallocate", fallocate(h->fd, 0, 0, (off_t)total)) == 0 &&
        (step = "sealing", fcntl(h->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) == 0)
        base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0), step = "mmap";
    if (base == MAP_FAILED) {
        int rc = ld_from_errno(errno);
        ld_errorf(errbuf, "cannot make the hand-off's memory of stream %" PRIu64 " (%" PRIu64 " bytes): %s: %s", id,
                  total, step, strerror(errno));
        if (h->fd >= 0)
            close(h->fd);
        free(h);
        return rc;
    }
    h->size = total;
    h->hdr = base;
    h->ready = (struct ld_handoff_ready *)((uint8_t *)base + ready_off);
    h->rel = (const struct ld_handoff_release *)((uint8_t *)base + release_off);
    h->hdr->magic = LD_HANDOFF_MAGIC;
    h->hdr->version = LD_HANDOFF_VERSION;
    h->hdr->capacity = h->cap;
    h->hdr->slot_count = slot_count;
    h->hdr->stream_id = id;
    h->hdr->ready_offset = ready_off;
    h->hdr->release_offset = release_off;
    h->hdr->total_size = total;
    *ret_handoff = h;
    return 0;
}

int handoff_take_fd(handoff *h)
{
    int fd = h->fd;
    h->fd = -1;
    return fd;
}

static void handoff_publish(handoff *h, const struct stream_answer *a);

void handoff_close(handoff *h)
{
    if (!h)
        return;
    stream_clear_direct(h->s); /* no worker publishes past this */
    /* A worker that published before may still be waking the client, outside the
     * stream's lock: a system call away from done. */
    while (atomic_load_explicit(&h->waking, memory_order_acquire))
        sched_yield();
    handoff_settle(h);
    /* The stream goes while the client may sleep on the queue (its connection ended, the
     * daemon stops): an end entry wakes it now, and the socket says why. There is room:
     * the entries it has not taken are batches leased to it, fewer than the capacity. */
    if (h->started && !h->ended && !h->failed) {
        struct stream_answer a = {.rc = LD_ECLOSED};
        handoff_publish(h, &a);
    }
    stream_forget_next(h->s, h); /* the stream may outlive us by a loop turn */
    if (h->fd >= 0)
        close(h->fd);
    munmap(h->hdr, h->size);
    free(h);
}

void handoff_describe(const handoff *h, cJSON *obj)
{
    cJSON *o = cJSON_AddObjectToObject(obj, "handoff");
    if (!o)
        return;
    cJSON_AddTrueToObject(o, "fd"); /* it goes with the reply: handoff_take_fd */
    cJSON_AddNumberToObject(o, "size", (double)h->size);
    cJSON_AddNumberToObject(o, "capacity", h->cap);
    cJSON_AddNumberToObject(o, "version", LD_HANDOFF_VERSION);
}

void handoff_release_error(const ring *r, uint64_t id, int64_t slot, int64_t generation, int rc, char *errbuf)
{
    if (rc == LD_EINVAL)
        ld_errorf(errbuf, "slot %" PRId64 " is out of range (stream %" PRIu64 " has %u slots)", slot, id,
                  ring_slot_count(r));
    else if (rc == LD_ENOTLEASED)
        ld_errorf(errbuf, "slot %" PRId64 " of stream %" PRIu64 " is not leased (its state is %s)", slot, id,
                  ring_state_name(ring_state(r, (uint32_t)slot)));
    else if (rc == LD_ESTALE)
        ld_errorf(errbuf, "slot %" PRId64 " of stream %" PRIu64 " is at generation %" PRIu64 ", not %" PRId64, slot,
                  id, ring_generation(r, (uint32_t)slot), generation);
    else
        ld_errorf(errbuf, "%s", ld_strerror(rc));
}

static void handoff_fail(handoff *h, const char *msg)
{
    stream_clear_direct(h->s);
    h->failed = true;
    ld_log(LD_LOG_WARN, "stream %" PRIu64 ": hand-off: %s", h->id, msg);
    h->on_fail(h->ctx, LD_EPROTO, msg);
}

/* Takes every release the client published. Returns how many, or -1 once it failed.
 * On a worker (direct), a wrong entry is left where it is and -1 returned: the loop
 * takes the queue again and fails the connection. */
static int handoff_take_releases(handoff *h, bool direct)
{
    char msg[LD_ERRMSG_MAX];
    uint64_t tail = __atomic_load_n(&h->hdr->release_tail, __ATOMIC_ACQUIRE);
    if (tail - h->release_head > h->cap) {
        if (direct)
            return -1;
        snprintf(msg, sizeof msg, "the release queue's tail %" PRIu64 " is not within %u entries after the "
                 "daemon's head %" PRIu64 ": the shared queue was written wrongly", tail, h->cap, h->release_head);
        handoff_fail(h, msg);
        return -1;
    }
    int n = 0;
    while (h->release_head != tail) {
        const struct ld_handoff_release *e = &h->rel[h->release_head & (h->cap - 1)];
        /* One read of each field: the client may be writing them while we look. */
        uint32_t slot = __atomic_load_n(&e->slot, __ATOMIC_RELAXED);
        uint64_t gen = __atomic_load_n(&e->generation, __ATOMIC_RELAXED);
        int rc = stream_release(h->s, slot, gen);
        if (rc < 0 && direct) {
            n = -1;
            break;
        }
        if (rc < 0) {
            char why[LD_ERRMSG_MAX];
            handoff_release_error(stream_ring(h->s), h->id, slot, (int64_t)gen, rc, why);
            snprintf(msg, sizeof msg, "release queue entry %" PRIu64 ": %.400s", h->release_head, why);
            handoff_fail(h, msg);
            return -1;
        }
        h->release_head++;
        n++;
    }
    if (h->release_head != __atomic_load_n(&h->hdr->release_head, __ATOMIC_RELAXED))
        __atomic_store_n(&h->hdr->release_head, h->release_head, __ATOMIC_RELEASE);
    return n;
}

static bool handoff_stream_busy(const handoff *h);

/* Whether the wake-up of a client asleep briefly with `head` taken waits for more
 * batches (the coalescing rule, above). Under the stream's lock, at each publication. */
static bool handoff_hold_wake(handoff *h, uint64_t head, uint64_t now)
{
    uint64_t gap = now - h->last_publish_ns;
    uint32_t half = stream_prefetch_target(h->s) / 2;
    if (h->ended || h->ready_tail - head >= half || gap >= h->wake_gap_ns ||
        (h->held_since_ns && now - h->held_since_ns >= h->wake_hold_ns) || !handoff_stream_busy(h))
        return false;
    if (!h->held_since_ns)
        h->held_since_ns = now;
    return true;
}

/* Marks the client woken up to what is published; the caller makes the system call. */
static void handoff_woke(handoff *h)
{
    h->woke_tail = h->ready_tail;
    h->held_since_ns = 0;
}

static void handoff_wake_client(handoff *h)
{
    /* Sequentially consistent, as the client's setting of client_waiting and its second
     * look at the queue are: either it sees the entry, or we see it waiting. */
    __atomic_store_n(&h->hdr->ready_seq, ++h->seq, __ATOMIC_SEQ_CST);
    /* One wake-up per sleep: a client still marked asleep that has not yet taken what the
     * last wake-up announced is awake already (or about to be), so the batches published
     * before it runs (the other worker's, the rest of a run) cost no system call more.
     * Once it has taken them, a mark means a new sleep. The mark is the client's alone:
     * taking it back here could clear the mark of the client's next sleep, set between
     * our look and the take, and lose that sleep's wake-up. Its ready_head comes with
     * its mark (stored before it), so a client that sleeps anew is seen as such. */
    uint32_t mark = __atomic_load_n(&h->hdr->client_waiting, __ATOMIC_SEQ_CST);
    bool waiting = mark != 0;
    uint64_t head = __atomic_load_n(&h->hdr->ready_head, __ATOMIC_RELAXED);
    uint64_t now = uv_hrtime(); /* the monotonic clock, from the vDSO */
    bool wake = waiting && head >= h->woke_tail &&
                !(mark == LD_HANDOFF_WAIT_BRIEF && handoff_hold_wake(h, head, now));
    h->last_publish_ns = now;
    if (wake)
        handoff_woke(h);
    h->client_waited = waiting; /* asleep, or woken and not yet back for its entries */
    if (wake && h->direct)
        h->wake_owed = true; /* direct_wake, once the stream's lock is let go */
    else if (wake)
        syscall(SYS_futex, &h->hdr->ready_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Batches handed over that the client has not taken yet count as prepared ahead. Its
 * own count may say anything: clamped to what was published, it only moves this
 * stream's depth within its ring. */
static void handoff_count_ahead(handoff *h)
{
    uint64_t head = __atomic_load_n(&h->hdr->ready_head, __ATOMIC_RELAXED);
    uint64_t ahead = h->ready_tail - head;
    if (head > h->ready_tail || ahead > h->slot_count)
        ahead = h->slot_count;
    if (h->ended)
        ahead = 0;
    stream_set_handed_ahead(h->s, (uint32_t)ahead);
}

/* One answer of the stream into the ready queue. */
static void handoff_publish(handoff *h, const struct stream_answer *a)
{
    struct ld_handoff_ready *e = &h->ready[h->ready_tail & (h->cap - 1)];
    if (a->rc < 0) {
        *e = (struct ld_handoff_ready){.rows = 0};
        h->ended = true; /* every later next answers the same: the socket tells why */
        stream_clear_direct(h->s);
    } else {
        *e = (struct ld_handoff_ready){
            .slot = a->batch.slot, .rows = a->batch.rows, .generation = a->batch.generation,
            .epoch = a->batch.epoch, .batch = a->batch.batch,
        };
        h->owed_batches++;
        h->owed_rows += a->batch.rows;
        h->owed_bytes += a->batch.bytes;
    }
    h->ready_tail++;
    __atomic_store_n(&h->hdr->ready_tail, h->ready_tail, __ATOMIC_SEQ_CST);
    handoff_wake_client(h);
    handoff_count_ahead(h);
}

static void handoff_answer(void *ctx, const struct stream_answer *a);

/* Whether the stream is filling anything: if not, only a release can make it go on. */
static bool handoff_stream_busy(const handoff *h)
{
    const ring *r = stream_ring(h->s);
    return ring_count(r, RING_FILLING) + ring_count(r, RING_COPYING) > 0;
}

/* Takes the releases, keeps one next asked, and says whether the daemon is idle. Loop
 * thread, under the stream's lock. */
static void handoff_pump(handoff *h)
{
    handoff_settle(h);
    /* A few rounds at most: a client that keeps moving its counters must not hold the
     * loop (it stays idle and may wake the daemon again). */
    for (int round = 0; round < 4; round++) {
        /* An ended hand-off still takes the releases of the batches it published. */
        if (!h->started || h->failed || handoff_take_releases(h, false) < 0 || h->ended)
            return;
        uint64_t seen_head = __atomic_load_n(&h->hdr->ready_head, __ATOMIC_RELAXED);
        handoff_count_ahead(h);
        while (!h->asking && !h->ended) {
            struct stream_answer a;
            int rc = stream_next(h->s, handoff_answer, h, &a);
            if (rc == 1) {
                handoff_publish(h, &a);
            } else if (rc == 0) {
                h->asking = true;
                /* A trainer that slept until the last batch came will likely wait for
                 * this one too: the stream's wait clock and priority run (stream.h). */
                if (h->client_waited)
                    stream_trainer_waits(h->s);
            } else {
                a = (struct stream_answer){.rc = rc};
                handoff_publish(h, &a);
            }
        }
        if (h->ended || handoff_stream_busy(h)) {
            if (__atomic_load_n(&h->hdr->daemon_idle, __ATOMIC_RELAXED))
                __atomic_store_n(&h->hdr->daemon_idle, 0, __ATOMIC_RELAXED);
            return;
        }
        /* Nothing fills: every slot is leased, or the prefetch is made of batches the
         * client holds or has not taken. Say so, then look once more (the client looks
         * at daemon_idle after taking or releasing: one of us sees the other). */
        if (++h->idle_seq == 0)
            h->idle_seq = 1;
        uint32_t target = stream_prefetch_target(h->s);
        __atomic_store_n(&h->hdr->wake_after, target / 2 ? target / 2 : 1, __ATOMIC_RELAXED);
        __atomic_store_n(&h->hdr->daemon_idle, h->idle_seq, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->hdr->release_tail, __ATOMIC_SEQ_CST) == h->release_head &&
            __atomic_load_n(&h->hdr->ready_head, __ATOMIC_SEQ_CST) == seen_head)
            return;
    }
}

/* The stream's answer to our waiting next, from a hub completion (stream.h). */
static void handoff_answer(void *ctx, const struct stream_answer *a)
{
    handoff *h = ctx;
    h->asking = false;
    if (h->failed)
        return; /* the slot stays leased to the connection, which is ending */
    handoff_publish(h, a);
    handoff_pump(h);
}

void handoff_set_coalescing(handoff *h, uint64_t gap_ns, uint64_t hold_ns)
{
    bool locked = stream_lock(h->s);
    h->wake_gap_ns = gap_ns;
    h->wake_hold_ns = hold_ns;
    stream_unlock(h->s, locked);
}

void handoff_settle_now(handoff *h)
{
    if (!h)
        return;
    bool locked = stream_lock(h->s);
    handoff_settle(h);
    stream_unlock(h->s, locked);
}

void handoff_end(handoff *h)
{
    if (!h || h->ended || h->failed)
        return;
    bool locked = stream_lock(h->s);
    struct stream_answer a = {.rc = LD_ECLOSED};
    handoff_publish(h, &a);
    stream_unlock(h->s, locked);
}

/* ---- the direct path: a worker, under the stream's lock (stream.h) ---------------- */

static void direct_publish(void *ctx, const struct stream_answer *a)
{
    handoff *h = ctx;
    h->direct = true;
    handoff_publish(h, a);
    h->direct = false;
}

static unsigned direct_after(void *ctx)
{
    handoff *h = ctx;
    unsigned then = 0;
    if (h->wake_owed) {
        h->wake_owed = false;
        atomic_fetch_add_explicit(&h->waking, 1, memory_order_relaxed);
        then |= STREAM_DIRECT_WAKE;
    }
    if (!h->started || h->ended || h->failed || handoff_take_releases(h, true) < 0)
        return then | STREAM_DIRECT_LOOP;
    handoff_count_ahead(h);
    /* As handoff_pump's next, asked again at once: a trainer that slept until the last
     * batch came will likely wait for the next one too. */
    if (h->client_waited)
        stream_trainer_waits(h->s);
    if (!handoff_stream_busy(h))
        return then | STREAM_DIRECT_LOOP; /* the loop says the daemon is idle */
    if (__atomic_load_n(&h->hdr->daemon_idle, __ATOMIC_RELAXED))
        __atomic_store_n(&h->hdr->daemon_idle, 0, __ATOMIC_RELAXED);
    return then | (h->owed_batches < HANDOFF_SETTLE_BATCHES ? 0 : STREAM_DIRECT_LOOP);
}

/* Without the stream's lock: handoff_close waits until `waking` is back to 0. */
static void direct_wake(void *ctx)
{
    handoff *h = ctx;
    syscall(SYS_futex, &h->hdr->ready_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    atomic_fetch_sub_explicit(&h->waking, 1, memory_order_release);
}

/* The loop thread, posted when direct_after asks for the loop (STREAM_DIRECT_LOOP). */
static void direct_poll(void *ctx)
{
    handoff_pump(ctx);
}

static const struct stream_direct_ops handoff_direct_ops = {
    .publish = direct_publish,
    .after = direct_after,
    .wake = direct_wake,
    .poll = direct_poll,
};

void handoff_kick(handoff *h)
{
    if (!h->started) {
        stream_set_eager(h->s); /* our next waits whether or not the trainer does */
        h->started = true;
        stream_set_direct(h->s, &handoff_direct_ops, h);
    }
    bool locked = stream_lock(h->s);
    handoff_pump(h);
    stream_unlock(h->s, locked);
}

void handoff_poll(handoff *h)
{
    if (!h)
        return;
    bool locked = stream_lock(h->s);
    handoff_pump(h);
    stream_unlock(h->s, locked);
}
