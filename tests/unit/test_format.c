/* Unit tests for ld_format_bytes(), the one byte-size formatter of the daemon and
 * loaderctl: exact bytes below 1 KiB, one decimal above, every unit up to EiB, no
 * "1024.0 KiB" at a unit's edge, and a buffer too small cut but terminated. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ld_format.h"

static void check(uint64_t bytes, const char *want)
{
    char buf[LD_FORMAT_BYTES_MAX];
    memset(buf, 'x', sizeof buf);
    assert_ptr_equal(ld_format_bytes(bytes, buf, sizeof buf), buf);
    assert_string_equal(buf, want);
}

static void test_units(void **state)
{
    (void)state;
    check(0, "0 B");
    check(1, "1 B");
    check(1023, "1023 B");
    check(1024, "1.0 KiB");
    check(1536, "1.5 KiB");
    check(UINT64_C(512) << 20, "512.0 MiB");
    check((UINT64_C(3) << 30) / 2, "1.5 GiB");
    check(UINT64_C(2) << 40, "2.0 TiB");
    check(UINT64_C(5) << 50, "5.0 PiB");
    check(UINT64_MAX, "16.0 EiB");
}

/* Just below a unit rounds up into that unit, never to "1024.0" of the one below. */
static void test_unit_edges(void **state)
{
    (void)state;
    check((UINT64_C(1) << 20) - 1, "1.0 MiB");
    check((UINT64_C(1) << 30) - 1, "1.0 GiB");
    check((UINT64_C(1) << 20) - 60, "1023.9 KiB");
    check((UINT64_C(1) << 60) - 1, "1.0 EiB");
    /* The longest form fits the promised size. */
    char buf[LD_FORMAT_BYTES_MAX];
    ld_format_bytes((UINT64_C(1023) * 1024 + 922) << 40, buf, sizeof buf);
    assert_string_equal(buf, "1023.9 PiB");
}

static void test_small_buffer(void **state)
{
    (void)state;
    char buf[5];
    ld_format_bytes(UINT64_C(512) << 20, buf, sizeof buf);
    assert_string_equal(buf, "512.");
    char one = 'x';
    ld_format_bytes(7, &one, 1);
    assert_int_equal(one, '\0');
    assert_null(ld_format_bytes(7, NULL, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_unit_edges),
        cmocka_unit_test(test_small_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
