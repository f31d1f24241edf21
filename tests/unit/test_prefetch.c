/* Unit tests for daemon/prefetch.c, the automatic prefetch depth: it starts at
 * PREFETCH_AUTO_START (or the ring's maximum when smaller), grows by one on each
 * delivery whose request waited, up to the maximum, shrinks by one only after a calm of
 * PREFETCH_CALM_ROUNDS x depth deliveries that each left two batches or more READY,
 * never below one, and a wait or a nearly empty ring restarts the calm. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "prefetch.h"

static void test_start(void **state)
{
    (void)state;
    struct prefetch_ctl c;
    prefetch_init(&c, PREFETCH_AUTO_MAX);
    assert_int_equal(c.depth, PREFETCH_AUTO_START);
    prefetch_init(&c, 2);
    assert_int_equal(c.depth, 2);
    prefetch_init(&c, 0);
    assert_int_equal(c.max, 1);
    assert_int_equal(c.depth, 1);
}

static void test_grow_on_waits(void **state)
{
    (void)state;
    struct prefetch_ctl c;
    prefetch_init(&c, 8);
    for (uint32_t want = PREFETCH_AUTO_START + 1; want <= 8; want++)
        assert_int_equal(prefetch_on_delivery(&c, true, 0), want);
    assert_int_equal(prefetch_on_delivery(&c, true, 0), 8); /* the ring's maximum */
}

/* Delivers until the depth changes; returns how many deliveries it took. */
static uint32_t until_change(struct prefetch_ctl *c, uint32_t ready_after)
{
    uint32_t d = c->depth, n = 0;
    while (c->depth == d && n < 10000) {
        prefetch_on_delivery(c, false, ready_after);
        n++;
    }
    return n;
}

static void test_shrink_after_calm(void **state)
{
    (void)state;
    struct prefetch_ctl c;
    prefetch_init(&c, 8);
    assert_int_equal(until_change(&c, 3), PREFETCH_CALM_ROUNDS * 4);
    assert_int_equal(c.depth, 3);
    assert_int_equal(until_change(&c, 2), PREFETCH_CALM_ROUNDS * 3);
    assert_int_equal(c.depth, 2);
    assert_int_equal(until_change(&c, 2), PREFETCH_CALM_ROUNDS * 2);
    assert_int_equal(c.depth, 1);
    assert_int_equal(until_change(&c, 5), 10000); /* never below one */
    assert_int_equal(c.depth, 1);
}

static void test_calm_restarts(void **state)
{
    (void)state;
    struct prefetch_ctl c;
    prefetch_init(&c, 8);
    /* Almost the whole calm, then a wait: deeper, and the calm starts over. */
    for (uint32_t i = 0; i < PREFETCH_CALM_ROUNDS * 4 - 1; i++)
        prefetch_on_delivery(&c, false, 3);
    assert_int_equal(prefetch_on_delivery(&c, true, 0), 5);
    assert_int_equal(until_change(&c, 3), PREFETCH_CALM_ROUNDS * 5);
    assert_int_equal(c.depth, 4);
    /* A trainer that uses what is ahead (fewer than two READY behind it) keeps it. */
    for (uint32_t i = 0; i < PREFETCH_CALM_ROUNDS * 4 - 1; i++)
        prefetch_on_delivery(&c, false, 3);
    prefetch_on_delivery(&c, false, 1);
    assert_int_equal(until_change(&c, 3), PREFETCH_CALM_ROUNDS * 4);
    assert_int_equal(c.depth, 3);
}

/* A bursty trainer: bursts of 12 requests that find at most `depth` ready (the rest
 * wait), then a pause that refills the ring. The depth climbs to the maximum and stays. */
static void test_bursty_trainer(void **state)
{
    (void)state;
    struct prefetch_ctl c;
    prefetch_init(&c, 8);
    for (int burst = 0; burst < 50; burst++) {
        uint32_t ready = c.depth;
        for (int i = 0; i < 12; i++) {
            bool waited = ready == 0;
            if (!waited)
                ready--;
            prefetch_on_delivery(&c, waited, ready);
        }
    }
    assert_int_equal(c.depth, 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start),
        cmocka_unit_test(test_grow_on_waits),
        cmocka_unit_test(test_shrink_after_calm),
        cmocka_unit_test(test_calm_restarts),
        cmocka_unit_test(test_bursty_trainer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
