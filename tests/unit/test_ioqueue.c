/* Unit tests for ioqueue: every item of a job runs exactly once, on several threads at
 * once, and `done` runs once with the count; a job's items wake as many sleeping
 * threads as they need, also when a second job comes before the first one's are up; a
 * cancel drops one owner's queued items,
 * waits for its running ones and leaves the other owners' jobs alone (or, without
 * waiting, says how many still run, and their job comes back when they end); freeing a queue
 * with jobs still queued hands each back through `done`; bad arguments are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ioqueue.h"
#include "ld_error.h"

#define ITEMS 400

struct counting_job {
    struct ioqueue_job job;         /* first */
    atomic_int runs[ITEMS];
    atomic_int running, max_running;
    atomic_int done_calls;
    atomic_size_t items_run;
    atomic_bool after_cancel;       /* set by the test once its cancel returned */
    atomic_int ran_after_cancel;
    long sleep_us;
};

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void counting_run(struct ioqueue_job *j, size_t i, void *scratch)
{
    struct counting_job *k = (struct counting_job *)j;
    assert_non_null(scratch);
    memset(scratch, 0x5a, IOQUEUE_SCRATCH_BYTES); /* all of it is this call's */
    if (atomic_load(&k->after_cancel))
        atomic_fetch_add(&k->ran_after_cancel, 1);
    int now = atomic_fetch_add(&k->running, 1) + 1;
    int seen = atomic_load(&k->max_running);
    while (now > seen && !atomic_compare_exchange_weak(&k->max_running, &seen, now))
        ;
    if (k->sleep_us)
        sleep_us(k->sleep_us);
    atomic_fetch_add(&k->runs[i], 1);
    atomic_fetch_sub(&k->running, 1);
}

static void counting_done(struct ioqueue_job *j, size_t items_run)
{
    struct counting_job *k = (struct counting_job *)j;
    atomic_store(&k->items_run, items_run);
    atomic_fetch_add(&k->done_calls, 1);
}

static struct counting_job *counting_new(size_t n, void *owner, long us)
{
    struct counting_job *k = calloc(1, sizeof *k);
    assert_non_null(k);
    k->job.run = counting_run;
    k->job.done = counting_done;
    k->job.n = n;
    k->job.owner = owner;
    k->sleep_us = us;
    return k;
}

static void wait_done(struct counting_job *k)
{
    for (int ms = 0; ms < 10000 && !atomic_load(&k->done_calls); ms++)
        sleep_us(1000);
    assert_int_equal(atomic_load(&k->done_calls), 1);
}

static void test_every_item_once(void **state)
{
    (void)state;
    ioqueue *q = NULL;
    assert_int_equal(ioqueue_new(8, &q), 0);
    assert_int_equal(ioqueue_threads(q), 8);
    struct counting_job *a = counting_new(ITEMS, NULL, 200), *b = counting_new(3, NULL, 0);
    assert_int_equal(ioqueue_submit(q, &a->job), 0);
    assert_int_equal(ioqueue_submit(q, &b->job), 0);
    wait_done(a);
    wait_done(b);
    for (size_t i = 0; i < ITEMS; i++)
        assert_int_equal(atomic_load(&a->runs[i]), 1);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(atomic_load(&b->runs[i]), 1);
    assert_int_equal(atomic_load(&a->items_run), ITEMS);
    assert_int_equal(atomic_load(&b->items_run), 3);
    /* Many requests in flight is the point: sleeping items overlap. */
    assert_true(atomic_load(&a->max_running) >= 2);
    assert_int_equal(ioqueue_pending(q), 0);
    ioqueue_free(q);
    free(a);
    free(b);
}

static void test_cancel_one_owner(void **state)
{
    (void)state;
    int owner_a, owner_b;
    ioqueue *q = NULL;
    assert_int_equal(ioqueue_new(2, &q), 0);
    struct counting_job *a = counting_new(ITEMS, &owner_a, 2000), *b = counting_new(20, &owner_b, 100);
    assert_int_equal(ioqueue_submit(q, &a->job), 0);
    assert_int_equal(ioqueue_submit(q, &b->job), 0);
    /* Until one of a's items has started (not a fixed time: a loaded machine may not
     * have started the threads yet), then cancel with most of a still queued. */
    for (int ms = 0; ms < 10000 && atomic_load(&a->max_running) == 0; ms++)
        sleep_us(100);
    ioqueue_cancel(q, &owner_a);
    atomic_store(&a->after_cancel, true);
    /* a is back: its done ran, with fewer items than it had, and none runs any more. */
    assert_int_equal(atomic_load(&a->done_calls), 1);
    size_t ran = atomic_load(&a->items_run);
    assert_true(ran >= 1 && ran < ITEMS);
    assert_int_equal(atomic_load(&a->running), 0);
    size_t total = 0;
    for (size_t i = 0; i < ITEMS; i++) {
        assert_true(atomic_load(&a->runs[i]) <= 1);
        total += (size_t)atomic_load(&a->runs[i]);
    }
    assert_int_equal(total, ran);
    /* b is untouched: all of it runs. */
    wait_done(b);
    assert_int_equal(atomic_load(&b->items_run), 20);
    assert_int_equal(atomic_load(&a->ran_after_cancel), 0);
    /* Cancelling an owner with nothing queued returns at once. */
    ioqueue_cancel(q, &owner_a);
    ioqueue_free(q);
    free(a);
    free(b);
}

static void test_cancel_without_waiting(void **state)
{
    (void)state;
    int owner;
    ioqueue *q = NULL;
    assert_int_equal(ioqueue_new(2, &q), 0);
    struct counting_job *a = counting_new(100, &owner, 20000);
    assert_int_equal(ioqueue_submit(q, &a->job), 0);
    while (atomic_load(&a->running) < 2)
        sleep_us(100);
    /* Two items are inside their 20 ms: they are reported, not waited for. */
    assert_int_equal(ioqueue_cancel_nowait(q, &owner), 2);
    atomic_store(&a->after_cancel, true);
    wait_done(a); /* called by the thread that finished the last of them */
    assert_int_equal(atomic_load(&a->items_run), 2);
    assert_int_equal(atomic_load(&a->ran_after_cancel), 0);
    /* Nothing of owner's left: 0 at once. */
    assert_int_equal(ioqueue_cancel_nowait(q, &owner), 0);
    ioqueue_free(q);
    free(a);
}

static void test_free_with_queued_jobs(void **state)
{
    (void)state;
    ioqueue *q = NULL;
    assert_int_equal(ioqueue_new(1, &q), 0);
    struct counting_job *a = counting_new(50, NULL, 1000), *b = counting_new(50, NULL, 0);
    assert_int_equal(ioqueue_submit(q, &a->job), 0);
    assert_int_equal(ioqueue_submit(q, &b->job), 0);
    ioqueue_free(q);
    /* Both came back through done, the one never started with 0 items run. */
    assert_int_equal(atomic_load(&a->done_calls), 1);
    assert_int_equal(atomic_load(&b->done_calls), 1);
    assert_true(atomic_load(&a->items_run) < 50);
    free(a);
    free(b);
}

/* Items that each wait until `want` items run at once (or 5 s): they only all return
 * quickly when that many threads were woken for them. */
struct meeting_job {
    struct ioqueue_job job;         /* first */
    atomic_int *arrived;
    int want;
    atomic_int *met;                /* items that saw all the others arrive */
};

static void meeting_run(struct ioqueue_job *j, size_t i, void *scratch)
{
    (void)i;
    (void)scratch;
    struct meeting_job *k = (struct meeting_job *)j;
    atomic_fetch_add(k->arrived, 1);
    for (int t = 0; t < 5000 && atomic_load(k->arrived) < k->want; t++)
        sleep_us(1000);
    if (atomic_load(k->arrived) >= k->want)
        atomic_fetch_add(k->met, 1);
}

static atomic_int meeting_done_calls;

static void meeting_done(struct ioqueue_job *j, size_t items_run)
{
    (void)j;
    (void)items_run;
    atomic_fetch_add(&meeting_done_calls, 1);
}

static void test_items_wake_enough_threads(void **state)
{
    (void)state;
    ioqueue *q = NULL;
    assert_int_equal(ioqueue_new(8, &q), 0);
    struct counting_job *warm = counting_new(8, NULL, 0);
    assert_int_equal(ioqueue_submit(q, &warm->job), 0);
    wait_done(warm);
    sleep_us(50000); /* every thread back asleep */
    for (int round = 0; round < 20; round++) {
        /* One job of 8 items, then two of 4 submitted back to back: 8 threads must be
         * woken either way (the second job's wake-ups go to threads the first's did not
         * already take). */
        atomic_int arrived = 0, met = 0;
        struct meeting_job jobs[2];
        size_t njobs = round % 2 ? 2 : 1;
        atomic_store(&meeting_done_calls, 0);
        for (size_t n = 0; n < njobs; n++) {
            jobs[n] = (struct meeting_job){.job = {.run = meeting_run, .done = meeting_done, .n = 8 / njobs},
                                           .arrived = &arrived, .want = 8, .met = &met};
            assert_int_equal(ioqueue_submit(q, &jobs[n].job), 0);
        }
        for (int ms = 0; ms < 10000 && atomic_load(&meeting_done_calls) < (int)njobs; ms++)
            sleep_us(1000);
        assert_int_equal(atomic_load(&meeting_done_calls), (int)njobs);
        assert_int_equal(atomic_load(&met), 8);
        sleep_us(5000);
    }
    ioqueue_free(q);
    free(warm);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    ioqueue *q = (ioqueue *)0x1;
    assert_int_equal(ioqueue_new(0, &q), LD_EINVAL);
    assert_int_equal(ioqueue_new(100000, &q), LD_EINVAL);
    assert_ptr_equal(q, (ioqueue *)0x1);
    assert_int_equal(ioqueue_new(1, &q), 0);
    struct counting_job *a = counting_new(0, NULL, 0);
    assert_int_equal(ioqueue_submit(q, &a->job), LD_EINVAL);
    a->job.n = 1;
    a->job.done = NULL;
    assert_int_equal(ioqueue_submit(q, &a->job), LD_EINVAL);
    ioqueue_free(q);
    ioqueue_free(NULL);
    ioqueue_cancel(NULL, NULL);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_items_wake_enough_threads),
        cmocka_unit_test(test_cancel_one_owner),
        cmocka_unit_test(test_cancel_without_waiting),
        cmocka_unit_test(test_free_with_queued_jobs),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
