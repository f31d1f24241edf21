/* Unit tests for a shared stream's lease counting (daemon/share_book.c): a slot stays
 * while any consumer holds it or an attached consumer has not reached it, and goes
 * (once) when neither is true; releases are checked; a consumer that leaves gives back
 * what it held; a lagging consumer is detached and no longer keeps the slots ahead of
 * it, but keeps what it holds; joiners start at the front. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ld_error.h"
#include "share_book.h"

#define SLOTS 6

static uint32_t collect(struct share_book *b, uint32_t *slots)
{
    return share_book_collect(b, slots);
}

static void test_last_release_frees(void **state)
{
    struct share_book b;
    struct share_book_holder x, y;
    uint32_t freed[SLOTS];
    assert_int_equal(share_book_init(&b, SLOTS, 0), 0);
    assert_int_equal(share_book_join(&b, &x), 0);
    assert_int_equal(share_book_join(&b, &y), 0);
    assert_int_equal(x.cursor, 0);
    /* x takes batch 0 in slot 3: the slot enters the book once. */
    assert_true(share_book_take(&b, &x, 3, 0));
    assert_int_equal(b.front, 1);
    assert_int_equal(share_book_put(&b, &x, 3), 0);
    assert_int_equal(collect(&b, freed), 0); /* y has not had batch 0 yet */
    assert_false(share_book_take(&b, &y, 3, 0));
    assert_int_equal(collect(&b, freed), 0); /* y holds it */
    assert_int_equal(share_book_put(&b, &y, 3), 0);
    assert_int_equal(collect(&b, freed), 1);
    assert_int_equal(freed[0], 3);
    assert_int_equal(collect(&b, freed), 0); /* once */
    /* Releases of what is not held. */
    assert_int_equal(share_book_put(&b, &y, 3), LD_ENOTLEASED);
    assert_int_equal(share_book_put(&b, &y, SLOTS), LD_EINVAL);
    share_book_leave(&b, &x);
    share_book_leave(&b, &y);
    assert_int_equal(b.n_holders, 0);
    share_book_free(&b);
}

static void test_leave_gives_back(void **state)
{
    struct share_book b;
    struct share_book_holder x, y;
    uint32_t freed[SLOTS];
    assert_int_equal(share_book_init(&b, SLOTS, 0), 0);
    assert_int_equal(share_book_join(&b, &x), 0);
    assert_int_equal(share_book_join(&b, &y), 0);
    share_book_take(&b, &x, 0, 0);
    share_book_take(&b, &x, 1, 1);
    share_book_take(&b, &y, 0, 0);
    assert_int_equal(x.n_held, 2);
    /* x dies holding two slots: slot 1 is still needed by y (not reached), slot 0 held by y. */
    share_book_leave(&b, &x);
    assert_int_equal(collect(&b, freed), 0);
    assert_int_equal(share_book_put(&b, &y, 0), 0);
    assert_int_equal(collect(&b, freed), 1);
    assert_int_equal(freed[0], 0);
    share_book_take(&b, &y, 1, 1);
    assert_int_equal(share_book_put(&b, &y, 1), 0);
    assert_int_equal(collect(&b, freed), 1);
    assert_int_equal(freed[0], 1);
    /* A consumer joining now starts at the front. */
    struct share_book_holder z;
    assert_int_equal(share_book_join(&b, &z), 0);
    assert_int_equal(z.cursor, 2);
    share_book_leave(&b, &y);
    share_book_leave(&b, &z);
    share_book_free(&b);
}

static void test_lagging_detached(void **state)
{
    struct share_book b;
    struct share_book_holder fast, slow;
    uint32_t freed[SLOTS];
    assert_int_equal(share_book_init(&b, SLOTS, 10), 0);
    assert_int_equal(share_book_join(&b, &fast), 0);
    assert_int_equal(share_book_join(&b, &slow), 0);
    assert_int_equal(slow.cursor, 10);
    share_book_take(&b, &slow, 0, 10); /* slow holds batch 10 and stops */
    for (uint32_t k = 0; k < 3; k++) {
        share_book_take(&b, &fast, k, 10 + k);
        assert_int_equal(share_book_put(&b, &fast, k), 0);
    }
    /* front 13, slow at 11: a lag of 2 is allowed, batches 11 and 12 are kept for it. */
    assert_int_equal(share_book_detach_lagging(&b, 2), 0);
    assert_int_equal(collect(&b, freed), 0);
    share_book_take(&b, &fast, 3, 13);
    assert_int_equal(share_book_put(&b, &fast, 3), 0);
    assert_int_equal(share_book_detach_lagging(&b, 2), 1);
    assert_false(slow.attached);
    assert_int_equal(b.n_attached, 1);
    /* Detached: 11, 12, 13 go; 10 stays, held by the slow one. */
    assert_int_equal(collect(&b, freed), 3);
    assert_int_equal(freed[0], 1);
    assert_int_equal(freed[1], 2);
    assert_int_equal(freed[2], 3);
    assert_int_equal(share_book_put(&b, &slow, 0), 0);
    assert_int_equal(collect(&b, freed), 1);
    assert_int_equal(freed[0], 0);
    assert_int_equal(share_book_detach_lagging(&b, 2), 0); /* once */
    share_book_leave(&b, &slow);
    assert_int_equal(b.n_attached, 1);
    share_book_leave(&b, &fast);
    assert_int_equal(b.n_attached, 0);
    share_book_free(&b);
}

static void test_free_accepts_zeroed(void **state)
{
    struct share_book b = {0};
    share_book_free(&b);
    struct share_book_holder h = {0};
    share_book_leave(&b, &h); /* not in the book: nothing happens */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_release_frees),
        cmocka_unit_test(test_leave_gives_back),
        cmocka_unit_test(test_lagging_detached),
        cmocka_unit_test(test_free_accepts_zeroed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
