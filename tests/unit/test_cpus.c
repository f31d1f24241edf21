/* Unit tests for daemon/cpus.c: the CPU quota read from fake cgroup trees (v2 cpu.max,
 * v1 cfs quota and period, limits on ancestors, no limit, unreadable values), the
 * rounding from a quota to a worker count, and this process's own numbers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpus.h"

static char root[PATH_MAX];

/* Writes root/relpath (creating its directories) with text. */
static void put(const char *relpath, const char *text)
{
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", root, relpath);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0700);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "%s/ld-test-cpus-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void test_v2(void **state)
{
    (void)state;
    /* No file at all: no limit. */
    assert_true(cpus_cgroup_quota(root, "0::/a/b\n") == 0);
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    put("sys/fs/cgroup/a/cpu.max", "250000 100000\n");
    put("sys/fs/cgroup/a/b/cpu.max", "max 100000\n");
    assert_true(cpus_cgroup_quota(root, "0::/a/b\n") == 2.5); /* from the parent */
    put("sys/fs/cgroup/a/b/cpu.max", "150000 100000\n");
    assert_true(cpus_cgroup_quota(root, "0::/a/b\n") == 1.5); /* the tighter, below */
    assert_true(cpus_cgroup_quota(root, "0::/a/b/\n") == 1.5);
    assert_true(cpus_cgroup_quota(root, "0::/a\n") == 2.5);
    /* The root of a container's namespace ("0::/"), and garbage that counts as none. */
    put("sys/fs/cgroup/cpu.max", "300000 100000\n");
    assert_true(cpus_cgroup_quota(root, "0::/\n") == 3.0);
    put("sys/fs/cgroup/cpu.max", "lots 100000\n");
    assert_true(cpus_cgroup_quota(root, "0::/\n") == 0);
    put("sys/fs/cgroup/cpu.max", "100000 0\n");
    assert_true(cpus_cgroup_quota(root, "0::/\n") == 0);
    assert_true(cpus_cgroup_quota(root, "") == 0);
    assert_true(cpus_cgroup_quota(root, "garbage without colons\n") == 0);
}

static void test_v1(void **state)
{
    (void)state;
    const char *text = "12:memory:/x\n4:cpu,cpuacct:/x/y\n0::/\n";
    assert_true(cpus_cgroup_quota(root, text) == 0);
    put("sys/fs/cgroup/cpu,cpuacct/x/y/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/x/y/cpu.cfs_period_us", "100000\n");
    assert_true(cpus_cgroup_quota(root, text) == 0); /* -1: no limit */
    put("sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_quota_us", "50000\n");
    put("sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
    assert_true(cpus_cgroup_quota(root, text) == 0.5);
    /* The memory controller's path is not the cpu one's; "cpuacct" alone is not "cpu". */
    assert_true(cpus_cgroup_quota(root, "4:cpuacct:/x/y\n") == 0);
    /* Mounted as plain "cpu". */
    put("sys/fs/cgroup/cpu/z/cpu.cfs_quota_us", "400000\n");
    put("sys/fs/cgroup/cpu/z/cpu.cfs_period_us", "100000\n");
    assert_true(cpus_cgroup_quota(root, "3:cpu:/z\n") == 4.0);
}

static void test_usable(void **state)
{
    (void)state;
    assert_int_equal(cpus_usable(8, 2.5), 3);
    assert_int_equal(cpus_usable(2, 2.5), 2);
    assert_int_equal(cpus_usable(8, 0), 8);
    assert_int_equal(cpus_usable(8, 2.0), 2);
    assert_int_equal(cpus_usable(4, 0.2), 1);
    assert_int_equal(cpus_usable(0, 0), 1);

    struct cpus_info me;
    cpus_probe(&me);
    assert_true(me.online >= 1);
    assert_true(me.affinity >= 1);
    assert_true(me.usable >= 1 && me.usable <= me.affinity);
    assert_int_equal(me.usable, cpus_usable(me.affinity, me.quota));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1, setup, teardown),
        cmocka_unit_test(test_usable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
