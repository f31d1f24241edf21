/* Unit tests for ld_mix.h, the one mixing function: splitmix64's published outputs
 * (the generator seeded with 0 returns e220a8397b1dcdaf, 6e789e6aa1b965f4,
 * 06c45d188009454f, f88bb8a8724c81ec), the finalizer alone, and the finalizer being a
 * bijection on a sample of inputs. Sample orders, replacements, augmentations and the
 * generated test data all hang on these values. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>

#include "ld_mix.h"
#include "transform_plugin.h"

static void test_splitmix64_reference_stream(void **state)
{
    (void)state;
    static const uint64_t want[] = {
        UINT64_C(0xe220a8397b1dcdaf), UINT64_C(0x6e789e6aa1b965f4),
        UINT64_C(0x06c45d188009454f), UINT64_C(0xf88bb8a8724c81ec),
    };
    uint64_t s = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(ld_splitmix64(s), want[i]);
        s += LD_MIX_GOLDEN;
    }
}

static void test_mix64_finalizer(void **state)
{
    (void)state;
    assert_int_equal(ld_mix64(0), 0);
    assert_int_equal(ld_mix64(1), UINT64_C(0x5692161d100b05e5));
    assert_int_equal(ld_mix64(UINT64_MAX), UINT64_C(0xb4d055fcf2cbbd7b));
    assert_int_equal(ld_splitmix64(41), ld_mix64(41 + LD_MIX_GOLDEN));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* 4096 consecutive inputs give 4096 different outputs, and each flipped input bit
 * changes about half of the output bits (every bit matters). */
static void test_mix64_spreads(void **state)
{
    (void)state;
    enum { N = 4096 };
    uint64_t *out = malloc(N * sizeof *out);
    assert_non_null(out);
    for (uint64_t i = 0; i < N; i++)
        out[i] = ld_mix64(i + 1);
    qsort(out, N, sizeof *out, cmp_u64);
    for (size_t i = 1; i < N; i++)
        assert_true(out[i] != out[i - 1]);
    free(out);
    for (int bit = 0; bit < 64; bit++) {
        uint64_t x = UINT64_C(0x0123456789abcdef);
        int changed = __builtin_popcountll(ld_mix64(x) ^ ld_mix64(x ^ (UINT64_C(1) << bit)));
        assert_in_range(changed, 12, 52);
    }
}

/* The plug-in ABI's own copy (transform_plugin.h stands alone) is the same function:
 * a plug-in's draws and the built-in transforms' come from one generator. */
static void test_plugin_prng_is_splitmix64(void **state)
{
    (void)state;
    for (uint64_t i = 0; i < 4096; i++) {
        uint64_t x = ld_splitmix64(i) ^ (i << 40);
        assert_int_equal(ld_prng_mix(x), ld_splitmix64(x));
    }
    assert_int_equal(ld_prng_mix(0), UINT64_C(0xe220a8397b1dcdaf));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splitmix64_reference_stream),
        cmocka_unit_test(test_mix64_finalizer),
        cmocka_unit_test(test_mix64_spreads),
        cmocka_unit_test(test_plugin_prng_is_splitmix64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
