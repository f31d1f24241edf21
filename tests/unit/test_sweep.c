/* Unit tests for the sweep of files left by dead processes (sweep.h): a reaped child's
 * pid is dead, ours and init's are not; in a scratch directory only the dead owner's
 * regular files go, while a live owner's file, a stranger's name, and a dead owner's
 * link and directory stay (the link's target too); an unreadable directory is a
 * negative code with a message naming it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testfs.h"

#include "ld_error.h"
#include "proto.h"
#include "sweep.h"

/* Names "own.<pid>" belong to us; everything else does not. */
static pid_t own_owner(const char *name, void *ctx)
{
    int *calls = ctx;
    (*calls)++;
    if (strncmp(name, "own.", 4) != 0)
        return 0;
    return (pid_t)atol(name + 4);
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

static void test_pid_dead(void **state)
{
    (void)state;
    assert_false(sweep_pid_dead(getpid()));
    assert_false(sweep_pid_dead(1));           /* init: alive, maybe not ours (EPERM) */
    assert_false(sweep_pid_dead(0));           /* a process group, not a process */
    assert_false(sweep_pid_dead(-1));
    assert_true(sweep_pid_dead(testfs_dead_pid()));
}

static void test_sweep_dir(void **state)
{
    (void)state;
    char dir[256];
    assert_int_equal(testfs_mkdtemp("ld-test-sweep", dir, sizeof dir), 0);
    char dead[32], dead2[32], live[32], dead_dir[32];
    snprintf(dead, sizeof dead, "own.%ld", (long)testfs_dead_pid());
    snprintf(dead2, sizeof dead2, "own.%ld", (long)testfs_dead_pid());
    snprintf(live, sizeof live, "own.%ld", (long)getpid());
    testfs_write(dir, dead, 0, 0);
    testfs_write(dir, dead2, 0, 0);
    testfs_write(dir, live, 0, 0);
    testfs_write(dir, "stranger.1", 0, 0);
    testfs_write(dir, "target", 0, 0);
    /* A dead owner's link and directory are not regular files: kept, not followed. */
    char path[512], name[64];
    snprintf(name, sizeof name, "own.%ld", (long)testfs_dead_pid());
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(symlink("target", path), 0);
    snprintf(dead_dir, sizeof dead_dir, "own.%ld", (long)testfs_dead_pid());
    snprintf(path, sizeof path, "%s/%s", dir, dead_dir);
    assert_int_equal(mkdir(path, 0700), 0);

    int calls = 0;
    char err[LD_ERRMSG_MAX] = "";
    assert_int_equal(sweep_dead_owners(dir, own_owner, &calls, "test directory", err), 2);
    assert_true(calls >= 7);                   /* every entry was asked about */
    assert_false(exists(dir, dead));
    assert_false(exists(dir, dead2));
    assert_true(exists(dir, live));
    assert_true(exists(dir, "stranger.1"));
    assert_true(exists(dir, name));
    assert_true(exists(dir, "target"));
    assert_true(exists(dir, dead_dir));
    /* Nothing left to remove. */
    assert_int_equal(sweep_dead_owners(dir, own_owner, &calls, "test directory", err), 0);

    const char *left[] = {live, "stranger.1", name, "target"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, left[i]);
        assert_int_equal(unlink(path), 0);
    }
    snprintf(path, sizeof path, "%s/%s", dir, dead_dir);
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(rmdir(dir), 0);

    /* A directory that is not there: the code, and a message naming it. */
    assert_int_equal(sweep_dead_owners(dir, own_owner, &calls, "test directory", err), LD_ENOENT);
    assert_non_null(strstr(err, "test directory '"));
    assert_non_null(strstr(err, dir));
    assert_int_equal(sweep_dead_owners(dir, own_owner, &calls, "test directory", NULL), LD_ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pid_dead),
        cmocka_unit_test(test_sweep_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
