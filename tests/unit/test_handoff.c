/* Unit tests for the hand-off's queues (daemon/handoff.c) on a real stream, loop, hub and
 * pool, with the test playing the client on the shared memory itself: every batch of
 * two epochs is published once, in order, with its slot's generation, then the end
 * entry; releases written into the queue are taken and let the stream go on; a daemon
 * with every slot leased says it is idle, and a release plus a poll ends that; release
 * entries that name a slot out of range, one not leased, a stale generation, or a tail
 * the queue cannot hold fail the hand-off once with a message naming the entry, and
 * change nothing in the ring; a client asleep on the ready queue's futex is woken once
 * it has taken what the last wake-up announced and sleeps anew (the daemon never writes
 * its mark), and by
 * an end entry when the daemon ends the stream (stream_end: the next then answers the
 * code and message, and the batches it holds can still be released) and when the
 * hand-off is closed under it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "dataset.h"
#include "dataset_watch.h"
#include "handoff.h"
#include "hub.h"
#include "pool.h"
#include "ring.h"
#include "stream.h"

#define SAMPLES 24
#define BATCH 4
#define LOOP_MS 10000

/* Each sample is its index, as one int64. */
static int index_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    int64_t v = (int64_t)index;
    memcpy(dst[0], &v, sizeof v);
    return 0;
}

static void index_free(dataset *d)
{
    (void)d;
}

static const struct dataset_ops index_ops = {.kind = "index", .free = index_free, .read = index_read};

struct env {
    uv_loop_t loop;
    hub *hub;
    pool *workers;
    stream_set *set;
    dataset ds;
    stream *s;
    handoff *h;
    struct ld_handoff_header *hdr;  /* the client's mapping */
    size_t size;
    uint64_t batches;               /* published, counted by the callback */
    atomic_uint_fast64_t allowed;   /* gated_read: samples below this index may be read */
    int fails;
    char fail_msg[LD_ERRMSG_MAX];
};

static void on_batch(void *ctx, uint64_t batches, uint64_t rows, uint64_t bytes)
{
    struct env *e = ctx;
    assert_int_equal(rows, batches * BATCH);
    assert_int_equal(bytes, rows * sizeof(int64_t));
    e->batches += batches;
}

static void on_fail(void *ctx, int code, const char *message)
{
    struct env *e = ctx;
    assert_int_equal(code, LD_EPROTO);
    e->fails++;
    snprintf(e->fail_msg, sizeof e->fail_msg, "%s", message);
}

static int setup_with(void **state, const struct dataset_ops *ops, uint32_t prefetch, uint64_t count)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    assert_int_equal(uv_loop_init(&e->loop), 0);
    assert_int_equal(hub_new(&e->loop, &e->hub), 0);
    assert_int_equal(pool_new(2, &e->workers), 0);
    assert_int_equal(stream_set_new(e->hub, e->workers, &e->set), 0);
    e->ds.ops = ops;
    snprintf(e->ds.name, sizeof e->ds.name, "index");
    e->ds.count = count;
    atomic_store(&e->allowed, UINT64_MAX);
    e->ds.n_fields = 1;
    snprintf(e->ds.fields[0].name, sizeof e->ds.fields[0].name, "index");
    e->ds.fields[0].dtype = LD_DTYPE_INT64;
    e->ds.on_error = CONFIG_ON_ERROR_FAIL;
    dataset_hold(&e->ds);
    struct stream_params p = {.batch_size = BATCH, .world_size = 1, .prefetch = prefetch, .epochs = 2};
    char err[LD_ERRMSG_MAX] = "";
    if (stream_open(e->set, &e->ds, 1, &p, UINT64_MAX, &e->s, err) < 0)
        fail_msg("stream_open: %s", err);
    uint32_t slots = ring_slot_count(stream_ring(e->s));
    if (handoff_open(e->s, 1, slots, on_batch, on_fail, e, &e->h, err) < 0)
        fail_msg("handoff_open: %s", err);
    /* The client's side: the descriptor that goes with the open reply, mapped read-write;
     * it is the only way to the memory, and sealed to its size. */
    cJSON *o = cJSON_CreateObject();
    handoff_describe(e->h, o);
    const cJSON *ho = cJSON_GetObjectItem(o, "handoff");
    e->size = (size_t)cJSON_GetObjectItem(ho, "size")->valuedouble;
    assert_null(cJSON_GetObjectItem(ho, "shm"));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(ho, "fd")));
    int fd = handoff_take_fd(e->h);
    assert_true(fd >= 0);
    assert_int_equal(handoff_take_fd(e->h), -1);
    int seals = fcntl(fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    errno = 0;
    assert_int_equal(ftruncate(fd, 0), -1); /* a client cannot pull the pages from under the daemon */
    assert_int_equal(errno, EPERM);
    e->hdr = mmap(NULL, e->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(e->hdr != MAP_FAILED);
    close(fd);
    assert_int_equal(cJSON_GetObjectItem(ho, "capacity")->valuedouble, e->hdr->capacity);
    cJSON_Delete(o);
    assert_int_equal(e->hdr->magic, LD_HANDOFF_MAGIC);
    assert_true(e->hdr->capacity > slots && (e->hdr->capacity & (e->hdr->capacity - 1)) == 0);
    *state = e;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, &index_ops, 2, SAMPLES);
}

static int teardown(void **state)
{
    struct env *e = *state;
    atomic_store(&e->allowed, UINT64_MAX); /* no read waits on a gate any more */
    munmap(e->hdr, e->size);
    handoff_close(e->h);
    stream_close(e->s);
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (stream_set_live(e->set) && uv_hrtime() < end)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(stream_set_live(e->set), 0);
    stream_set_free(e->set);
    hub_close(e->hub);
    pool_free(e->workers);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    free(e);
    return 0;
}

static const struct ld_handoff_ready *ready_at(struct env *e, uint64_t i)
{
    const uint8_t *base = (const uint8_t *)e->hdr;
    return (const struct ld_handoff_ready *)(base + e->hdr->ready_offset) + (i & (e->hdr->capacity - 1));
}

static struct ld_handoff_release *release_at(struct env *e, uint64_t i)
{
    uint8_t *base = (uint8_t *)e->hdr;
    return (struct ld_handoff_release *)(base + e->hdr->release_offset) + (i & (e->hdr->capacity - 1));
}

/* Turns the loop until the ready queue holds more than `head` entries, waking an idle
 * daemon as a client does (its `handoff` request polls the hand-off). */
static bool wait_entry(struct env *e, uint64_t head)
{
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (__atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE) <= head) {
        if (uv_hrtime() > end)
            return false;
        if (__atomic_load_n(&e->hdr->daemon_idle, __ATOMIC_RELAXED))
            handoff_poll(e->h);
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    /* A worker publishes under the stream's lock (the direct path). Our mapping is
     * another address for the same memory, so ThreadSanitizer does not see its release
     * store through ours: the lock is what orders the batch's bytes before our reads. */
    stream_unlock(e->s, stream_lock(e->s));
    return true;
}

static void client_release(struct env *e, uint32_t slot, uint64_t gen)
{
    uint64_t t = e->hdr->release_tail;
    *release_at(e, t) = (struct ld_handoff_release){.slot = slot, .generation = gen};
    __atomic_store_n(&e->hdr->release_tail, t + 1, __ATOMIC_RELEASE);
}

static void test_every_batch_once_in_order(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    const uint64_t per_epoch = SAMPLES / BATCH;
    uint64_t head = 0;
    for (uint64_t seq = 0; seq < 2 * per_epoch; seq++) {
        assert_true(wait_entry(e, head));
        struct ld_handoff_ready r = *ready_at(e, head);
        e->hdr->ready_head = ++head;
        assert_int_equal(r.epoch, seq / per_epoch);
        assert_int_equal(r.batch, seq % per_epoch);
        assert_int_equal(r.rows, BATCH);
        assert_int_equal(ring_state(stream_ring(e->s), r.slot), RING_LEASED);
        assert_int_equal(ring_generation(stream_ring(e->s), r.slot), r.generation);
        const int64_t *rows = (const int64_t *)((const uint8_t *)ring_slot((ring *)stream_ring(e->s), r.slot) + 64);
        for (uint32_t i = 0; i < r.rows; i++)
            assert_int_equal(rows[i], (int64_t)(r.batch * BATCH + i));
        client_release(e, r.slot, r.generation);
    }
    assert_true(wait_entry(e, head));
    assert_int_equal(ready_at(e, head)->rows, 0); /* the end */
    assert_int_equal(e->batches, 2 * per_epoch);
    handoff_poll(e->h); /* an ended hand-off still takes the releases */
    assert_int_equal(ring_count(stream_ring(e->s), RING_LEASED), 0);
    assert_int_equal(e->hdr->release_head, e->hdr->release_tail);
    assert_int_equal(e->fails, 0);
}

static bool idle_now(struct env *e)
{
    return __atomic_load_n(&e->hdr->daemon_idle, __ATOMIC_RELAXED) != 0;
}

static void test_idle_until_released(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    const ring *r = stream_ring(e->s);
    uint32_t slots = ring_slot_count(r);
    /* Nothing taken, nothing released: the prefetch fills, then the daemon is idle. */
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (!idle_now(e) && uv_hrtime() < end) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    assert_true(idle_now(e));
    assert_true(e->hdr->wake_after >= 1);
    uint64_t published = e->hdr->ready_tail;
    assert_true(published >= 1 && published <= slots);
    /* Take and release them all, then the wake-up (the `handoff` request's poll). */
    for (uint64_t i = 0; i < published; i++) {
        const struct ld_handoff_ready *x = ready_at(e, i);
        client_release(e, x->slot, x->generation);
    }
    e->hdr->ready_head = published;
    handoff_kick(e->h);
    assert_false(idle_now(e));
    assert_true(wait_entry(e, published));
    assert_int_equal(ready_at(e, published)->batch, published);
    assert_int_equal(e->fails, 0);
}

static void test_bad_release_entries(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    assert_true(wait_entry(e, 0));
    struct ld_handoff_ready first = *ready_at(e, 0);
    const ring *r = stream_ring(e->s);
    uint32_t leased = ring_count(r, RING_LEASED);
    /* Stale generation: refused, the hand-off fails once, the ring is as it was. */
    client_release(e, first.slot, first.generation + 7);
    handoff_poll(e->h);
    assert_int_equal(e->fails, 1);
    assert_non_null(strstr(e->fail_msg, "release queue entry 0"));
    assert_non_null(strstr(e->fail_msg, "generation"));
    assert_int_equal(ring_count(r, RING_LEASED), leased);
    assert_int_equal(ring_state(r, first.slot), RING_LEASED);
    /* A failed hand-off does nothing more, whatever is written. */
    client_release(e, first.slot, first.generation);
    handoff_poll(e->h);
    assert_int_equal(e->fails, 1);
    assert_int_equal(ring_state(r, first.slot), RING_LEASED);
}

/* One garbage release on a fresh hand-off: the message it fails with. */
static void expect_refused(struct env *e, uint32_t slot, uint64_t gen, uint64_t tail, const char *says)
{
    uint64_t t = e->hdr->release_tail;
    *release_at(e, t) = (struct ld_handoff_release){.slot = slot, .generation = gen};
    __atomic_store_n(&e->hdr->release_tail, tail, __ATOMIC_RELEASE);
    handoff_poll(e->h);
    assert_int_equal(e->fails, 1);
    if (!strstr(e->fail_msg, says))
        fail_msg("expected '%s' in: %s", says, e->fail_msg);
}

static void test_slot_out_of_range(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    expect_refused(e, 1u << 20, 1, 1, "out of range");
}

static void test_slot_not_leased(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    const ring *r = stream_ring(e->s);
    uint32_t s = 0;
    while (s < ring_slot_count(r) && ring_state(r, s) == RING_LEASED)
        s++;
    assert_true(s < ring_slot_count(r));
    expect_refused(e, s, ring_generation(r, s), 1, "is not leased");
}

static void test_tail_out_of_bounds(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    expect_refused(e, 0, 0, (uint64_t)e->hdr->capacity + 1, "release queue's tail");
}

/* A client asleep on the ready queue, as libloaderclient sleeps: client_waiting set, one
 * more look, FUTEX_WAIT on ready_seq. It stops at the first entry past `head`. */
struct sleeper {
    struct env *e;
    uint64_t head;
    pthread_t thread;
    atomic_bool done;
    bool timed_out;             /* a wait of LOOP_MS ran out: nothing woke it */
    bool leave_mark;            /* does not clear client_waiting once woken */
    struct ld_handoff_ready entry;
};

static void *sleeper_run(void *arg)
{
    struct sleeper *sl = arg;
    struct ld_handoff_header *hdr = sl->e->hdr;
    for (;;) {
        uint32_t seq = __atomic_load_n(&hdr->ready_seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&hdr->ready_tail, __ATOMIC_ACQUIRE) > sl->head)
            break;
        __atomic_store_n(&hdr->client_waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&hdr->ready_tail, __ATOMIC_SEQ_CST) == sl->head) {
            struct timespec ts = {LOOP_MS / 1000, 0};
            if (syscall(SYS_futex, &hdr->ready_seq, FUTEX_WAIT, seq, &ts, NULL, 0) < 0 && errno == ETIMEDOUT) {
                sl->timed_out = true;
                break;
            }
        }
        if (!sl->leave_mark)
            __atomic_store_n(&hdr->client_waiting, 0, __ATOMIC_RELAXED);
    }
    sl->entry = *ready_at(sl->e, sl->head);
    atomic_store(&sl->done, true);
    return NULL;
}

/* Kicks the hand-off, takes what it publishes until the daemon is idle (every slot
 * leased to us), and starts a client that sleeps for the next entry. */
static void sleep_on_idle_queue(struct env *e, struct sleeper *sl)
{
    handoff_kick(e->h);
    /* Idle for good: both batches of the prefetch published (the ring's later slots are
     * committed in the background, so an idle spell may come before that). */
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (!(idle_now(e) && e->hdr->ready_tail == 2) && uv_hrtime() < end) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    assert_true(idle_now(e));
    assert_int_equal(e->hdr->ready_tail, 2);
    *sl = (struct sleeper){.e = e, .head = e->hdr->ready_tail};
    e->hdr->ready_head = sl->head;
    assert_int_equal(pthread_create(&sl->thread, NULL, sleeper_run, sl), 0);
    /* Asleep, or about to be: it has said it waits. */
    while (!__atomic_load_n(&e->hdr->client_waiting, __ATOMIC_SEQ_CST) && uv_hrtime() < end)
        uv_sleep(1);
    assert_true(__atomic_load_n(&e->hdr->client_waiting, __ATOMIC_SEQ_CST) != 0);
}

/* Turns the loop until the sleeper has its entry; it must have been woken, not timed out. */
static void wait_sleeper(struct env *e, struct sleeper *sl)
{
    while (!atomic_load(&sl->done))
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(pthread_join(sl->thread, NULL), 0);
    assert_false(sl->timed_out);
}

static void no_callback(void *ctx, const struct stream_answer *a)
{
    (void)ctx;
    (void)a;
    fail_msg("an ended stream's next is answered at once");
}

/* Gives back every batch published so far and wakes the daemon, as a client's release
 * queue and `handoff` request do. */
static void release_all(struct env *e)
{
    uint64_t tail = __atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE);
    for (uint64_t i = e->hdr->release_tail; i < tail; i++)
        client_release(e, ready_at(e, i)->slot, ready_at(e, i)->generation);
    handoff_kick(e->h);
}

/* The daemon wakes a sleeping client with the first entry it publishes; a client that
 * has taken every entry and sleeps again is woken again, even with the mark of its last
 * sleep never cleared (the daemon tells a new sleep by what the client has taken, and
 * leaves the mark alone: taking it back could clear the mark of the next sleep). */
static void test_wakes_once_per_sleep(void **state)
{
    struct env *e = *state;
    struct sleeper sl;
    sleep_on_idle_queue(e, &sl);
    assert_false(atomic_load(&sl.done));
    release_all(e);
    wait_sleeper(e, &sl);
    assert_int_equal(sl.entry.rows, BATCH);
    assert_int_equal(sl.entry.batch, 2);
    /* Twice more: asleep with the queue taken, woken by the next batch. The sleeper
     * leaves its mark: only the daemon's wake-up takes it back. */
    for (int round = 0; round < 2; round++) {
        uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
        while (!(idle_now(e) && e->hdr->ready_tail == e->hdr->release_tail + 2) && uv_hrtime() < end) {
            uv_run(&e->loop, UV_RUN_NOWAIT);
            uv_sleep(1);
        }
        assert_true(idle_now(e));
        sl = (struct sleeper){.e = e, .head = e->hdr->ready_tail, .leave_mark = true};
        e->hdr->ready_head = sl.head;
        assert_int_equal(pthread_create(&sl.thread, NULL, sleeper_run, &sl), 0);
        while (!__atomic_load_n(&e->hdr->client_waiting, __ATOMIC_SEQ_CST) && uv_hrtime() < end)
            uv_sleep(1);
        assert_true(__atomic_load_n(&e->hdr->client_waiting, __ATOMIC_SEQ_CST) != 0);
        release_all(e);
        wait_sleeper(e, &sl);
        assert_int_equal(sl.entry.batch, sl.head % (SAMPLES / BATCH));
        assert_int_equal(__atomic_load_n(&e->hdr->client_waiting, __ATOMIC_SEQ_CST), 1);
    }
    assert_int_equal(e->fails, 0);
}

static void test_end_wakes_a_sleeping_client(void **state)
{
    struct env *e = *state;
    struct sleeper sl;
    sleep_on_idle_queue(e, &sl);
    stream_end(e->s, LD_EDENIED, "permission denied: a reload narrowed access.datasets.index");
    assert_false(atomic_load(&sl.done)); /* answered from the loop, not inside the call */
    wait_sleeper(e, &sl);
    assert_int_equal(sl.entry.rows, 0);
    /* The reason, as a `next` on the socket gets it; a later end does not replace it. */
    stream_end(e->s, LD_ECLOSED, "another reason");
    struct stream_answer a;
    assert_int_equal(stream_next(e->s, no_callback, NULL, &a), 1);
    assert_int_equal(a.rc, LD_EDENIED);
    assert_string_equal(a.message, "permission denied: a reload narrowed access.datasets.index");
    /* The batches leased before the end are still ours to give back. */
    const ring *r = stream_ring(e->s);
    assert_true(ring_count(r, RING_LEASED) >= 1);
    for (uint64_t i = 0; i < sl.head; i++)
        client_release(e, ready_at(e, i)->slot, ready_at(e, i)->generation);
    e->hdr->ready_head = sl.head + 1;
    handoff_poll(e->h);
    assert_int_equal(ring_count(r, RING_LEASED), 0);
    assert_int_equal(e->fails, 0);
    /* Nothing more is published, and nothing is filled. */
    uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(e->hdr->ready_tail, sl.head + 1);
}

static void test_close_wakes_a_sleeping_client(void **state)
{
    struct env *e = *state;
    struct sleeper sl;
    sleep_on_idle_queue(e, &sl);
    /* The connection goes (its last error is on the socket): the stream with it. */
    handoff_close(e->h);
    e->h = NULL;
    wait_sleeper(e, &sl);
    assert_int_equal(sl.entry.rows, 0);
}

/* A stall found in line by a worker on the direct path. Every read takes a few tens of
 * microseconds, and the client takes and gives back batches as fast as it can, so two
 * batches fill at once; batch STALL_BATCH's first read waits until the batch before it
 * is in the ready queue and then says the dataset's storage stopped answering (as the
 * read deadline's watcher does). The worker that published that batch may then find
 * the failure in line while it still holds the stream: the failure is the loop's to
 * publish, once (the path is turned off on the loop only). */
#define STALL_BATCH 5

static void spin_us(uint64_t us)
{
    uint64_t end = uv_hrtime() + us * 1000u;
    while (uv_hrtime() < end)
        ;
}

static int stall_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    struct env *e = (struct env *)((char *)d - offsetof(struct env, ds));
    spin_us(20);
    if (index == STALL_BATCH * BATCH) {
        uint64_t end = uv_hrtime() + 200000000u;
        while (__atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE) < STALL_BATCH && uv_hrtime() < end)
            ;
        atomic_fetch_add(&e->ds.stalled_reads, 1);
    }
    return index_read(d, index, dst, errbuf);
}

static const struct dataset_ops stall_ops = {.kind = "index", .free = index_free, .read = stall_read};

static int setup_stall(void **state)
{
    return setup_with(state, &stall_ops, 2, SAMPLES);
}

static void test_stall_in_line_ends_once(void **state)
{
    struct env *e = *state;
    handoff_kick(e->h);
    uint64_t head = 0, end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    for (;;) {
        assert_true(uv_hrtime() < end);
        if (__atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE) <= head) {
            if (__atomic_load_n(&e->hdr->daemon_idle, __ATOMIC_RELAXED))
                handoff_poll(e->h);
            uv_run(&e->loop, UV_RUN_NOWAIT);
            continue;
        }
        stream_unlock(e->s, stream_lock(e->s)); /* as wait_entry: orders the entry's bytes */
        struct ld_handoff_ready r = *ready_at(e, head);
        e->hdr->ready_head = ++head;
        if (r.rows == 0)
            break;
        assert_true(head <= STALL_BATCH); /* batch STALL_BATCH never comes */
        client_release(e, r.slot, r.generation);
    }
    /* The end is published once, and nothing after it, whatever the loop does next. */
    for (int i = 0; i < 20; i++) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    assert_int_equal(__atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE), head);
    struct stream_answer a;
    assert_int_equal(stream_next(e->s, no_callback, NULL, &a), 1);
    assert_int_equal(a.rc, LD_ETIMEDOUT);
    assert_int_equal(e->fails, 0);
    atomic_store(&e->ds.stalled_reads, 0);
}

/* ---- coalesced wake-ups: a gated dataset whose batches the test lets through -------- */

#define GATED_PREFETCH 8            /* half of it: the batches a held wake-up waits for */
#define GATED_SAMPLES (16 * BATCH)

/* A read waits until the test allows its sample (in order: the stream fills in order). */
static int gated_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    struct env *e = (struct env *)((char *)d - offsetof(struct env, ds));
    while (index >= atomic_load(&e->allowed))
        usleep(100);
    return index_read(d, index, dst, errbuf);
}

static const struct dataset_ops gated_ops = {.kind = "index", .free = index_free, .read = gated_read};

static int setup_gated(void **state)
{
    int rc = setup_with(state, &gated_ops, GATED_PREFETCH, GATED_SAMPLES);
    struct env *e = *state;
    atomic_store(&e->allowed, 0);
    return rc;
}

/* A client asleep on the ready queue from `head` (marked `mark`: a brief or a long
 * sleep), that says what it saw when a wake-up (FUTEX_WAKE, not a moved word) ended it. */
struct napper {
    struct env *e;
    uint64_t head;
    uint32_t mark;
    pthread_t thread;
    atomic_int tid;
    atomic_bool done;
    int rc;                         /* of FUTEX_WAIT: 0 woken */
    uint64_t tail;                  /* ready_tail when it woke */
};

static void *napper_run(void *arg)
{
    struct napper *n = arg;
    struct ld_handoff_header *hdr = n->e->hdr;
    atomic_store(&n->tid, (int)syscall(SYS_gettid));
    uint32_t seq = __atomic_load_n(&hdr->ready_seq, __ATOMIC_ACQUIRE);
    __atomic_store_n(&hdr->ready_head, n->head, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hdr->client_waiting, n->mark, __ATOMIC_SEQ_CST);
    n->rc = -1;
    if (__atomic_load_n(&hdr->ready_tail, __ATOMIC_SEQ_CST) == n->head) {
        struct timespec ts = {LOOP_MS / 1000, 0};
        n->rc = (int)syscall(SYS_futex, &hdr->ready_seq, FUTEX_WAIT, seq, &ts, NULL, 0);
    }
    n->tail = __atomic_load_n(&hdr->ready_tail, __ATOMIC_ACQUIRE);
    __atomic_store_n(&hdr->client_waiting, 0, __ATOMIC_SEQ_CST);
    atomic_store(&n->done, true);
    return NULL;
}

/* Starts a napper at `head` and returns once it is blocked in FUTEX_WAIT (the kernel
 * says which system call a thread is blocked in): from then on only a wake-up ends it. */
static void nap(struct env *e, struct napper *n, uint64_t head, uint32_t mark)
{
    *n = (struct napper){.e = e, .head = head, .mark = mark};
    assert_int_equal(pthread_create(&n->thread, NULL, napper_run, n), 0);
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    for (;;) {
        assert_true(uv_hrtime() < end);
        assert_false(atomic_load(&n->done));
        int tid = atomic_load(&n->tid);
        char path[64], buf[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
        FILE *f = tid ? fopen(path, "r") : NULL;
        if (f) {
            if (!fgets(buf, sizeof buf, f))
                buf[0] = 0;
            fclose(f);
        }
        if (atoi(buf) == SYS_futex && buf[0] != '-')
            return;
        uv_sleep(1);
    }
}

/* Turns the loop until the napper is back; returns the ready_tail it woke to. */
static uint64_t woken_at(struct env *e, struct napper *n)
{
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (!atomic_load(&n->done)) {
        assert_true(uv_hrtime() < end);
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    assert_int_equal(pthread_join(n->thread, NULL), 0);
    assert_int_equal(n->rc, 0); /* a wake-up, not the end of its wait */
    return n->tail;
}

/* Lets the batches before `upto` through and turns the loop until they are published;
 * then gives a napper that a wrong wake-up ended a moment to say so. */
static void let_through(struct env *e, uint64_t upto)
{
    atomic_store(&e->allowed, upto * BATCH);
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (__atomic_load_n(&e->hdr->ready_tail, __ATOMIC_ACQUIRE) < upto) {
        assert_true(uv_hrtime() < end);
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    uv_sleep(2);
}

/* While batches come fast and more fill, a client asleep briefly is woken once half the
 * prefetch depth is ready; at once a client that sleeps long, for a batch once the hold
 * is older than the hold time, for batches that do not come fast, when nothing else
 * fills, and for the end. */
static void test_wake_ups_coalesced(void **state)
{
    struct env *e = *state;
    struct napper n;
    const uint64_t forever = UINT64_MAX;
    handoff_set_coalescing(e->h, forever, forever);
    assert_int_equal(ring_slot_count(stream_ring(e->s)), GATED_PREFETCH + 3);

    /* A long sleep (the first one): woken at once. */
    nap(e, &n, 0, LD_HANDOFF_WAIT_SLEEP);
    atomic_store(&e->allowed, 1 * BATCH);
    handoff_kick(e->h);
    assert_int_equal(woken_at(e, &n), 1);

    /* A brief sleep, batches 1-4 while 5-8 fill: asleep through three, woken by the fourth. */
    nap(e, &n, 1, LD_HANDOFF_WAIT_BRIEF);
    for (uint64_t upto = 2; upto < 5; upto++) {
        let_through(e, upto);
        assert_false(atomic_load(&n.done));
    }
    let_through(e, 5);
    assert_int_equal(woken_at(e, &n), 5);

    /* A long sleep while batches come fast: woken at once. */
    nap(e, &n, 5, LD_HANDOFF_WAIT_SLEEP);
    let_through(e, 6);
    assert_int_equal(woken_at(e, &n), 6);

    /* Held past the hold time: woken by the next batch (6 is held, 7 wakes). */
    handoff_set_coalescing(e->h, forever, 1);
    nap(e, &n, 6, LD_HANDOFF_WAIT_BRIEF);
    let_through(e, 7);
    assert_false(atomic_load(&n.done));
    let_through(e, 8);
    assert_int_equal(woken_at(e, &n), 8);

    /* Batches that do not come fast: each wakes at once. */
    handoff_set_coalescing(e->h, 1, forever);
    nap(e, &n, 8, LD_HANDOFF_WAIT_BRIEF);
    let_through(e, 9);
    assert_int_equal(woken_at(e, &n), 9);

    /* Nothing else fills: the client holds 9 of the 11 slots, so batches 9 and 10 are the
     * last before it gives some back, and the second wakes it with 2 < 4 ready. */
    handoff_set_coalescing(e->h, forever, forever);
    assert_int_equal(ring_count(stream_ring(e->s), RING_LEASED), 9);
    nap(e, &n, 9, LD_HANDOFF_WAIT_BRIEF);
    let_through(e, 10);
    assert_false(atomic_load(&n.done));
    let_through(e, 11);
    assert_int_equal(woken_at(e, &n), 11);

    /* The end, while batches fill (two slots given back, their batches held at the gate):
     * woken by it. */
    for (uint64_t i = 0; i < 2; i++)
        client_release(e, ready_at(e, i)->slot, ready_at(e, i)->generation);
    handoff_poll(e->h);
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_MS * 1000000u;
    while (ring_count(stream_ring(e->s), RING_FILLING) < 2) {
        assert_true(uv_hrtime() < end);
        uv_run(&e->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    nap(e, &n, 11, LD_HANDOFF_WAIT_BRIEF);
    handoff_end(e->h);
    assert_int_equal(woken_at(e, &n), 12);
    assert_int_equal(ready_at(e, 11)->rows, 0);

    /* Every batch came in order, each once. */
    for (uint64_t i = 0; i < 11; i++) {
        assert_int_equal(ready_at(e, i)->batch, i);
        assert_int_equal(ready_at(e, i)->rows, BATCH);
    }
    assert_int_equal(e->fails, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_batch_once_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_until_released, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_release_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_not_leased, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tail_out_of_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wakes_once_per_sleep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_wakes_a_sleeping_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_wakes_a_sleeping_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stall_in_line_ends_once, setup_stall, teardown),
        cmocka_unit_test_setup_teardown(test_stall_in_line_ends_once, setup_stall, teardown),
        cmocka_unit_test_setup_teardown(test_wake_ups_coalesced, setup_gated, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
