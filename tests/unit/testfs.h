/* testfs — what unit tests that read real files share: a private temporary directory
 * that is removed afterwards, files whose every byte is a known function of (seed,
 * position), and the pid of a process that is gone (for the sweeps of files that dead
 * processes leave). Include after <cmocka.h>; everything here is static. */
#ifndef LD_TESTFS_H
#define LD_TESTFS_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Creates $TMPDIR/<prefix>-XXXXXX (or under /tmp) into buf. 0 or -1. */
static inline int testfs_mkdtemp(const char *prefix, char *buf, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, size, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
    return mkdtemp(buf) ? 0 : -1;
}

static inline int testfs_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes a directory tree (without following links). */
static inline int testfs_rmtree(const char *root)
{
    return nftw(root, testfs_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A test's own directory, removed after it: cmocka setup and teardown functions that
 * put a struct testfs_dir in *state. */
struct testfs_dir {
    char root[256];
};

static inline int testfs_dir_setup(void **state)
{
    struct testfs_dir *t = calloc(1, sizeof *t);
    if (!t || testfs_mkdtemp("ld-test", t->root, sizeof t->root) < 0) {
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

static inline int testfs_dir_teardown(void **state)
{
    struct testfs_dir *t = *state;
    int r = testfs_rmtree(t->root);
    free(t);
    return r;
}

/* Byte j of a file written with `seed`. */
static inline uint8_t testfs_byte(unsigned seed, size_t j)
{
    return (uint8_t)(seed * 131u + j * 7u + (j >> 8));
}

/* Makes the directories of root/rel (every component before the last '/'). */
static inline void testfs_make_dirs(const char *root, const char *rel)
{
    char path[1024];
    assert_true(snprintf(path, sizeof path, "%s/%s", root, rel) < (int)sizeof path);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        if (mkdir(path, 0755) < 0)
            assert_int_equal(errno, EEXIST);
        *p = '/';
    }
}

/* Writes root/rel (making its directories) with `size` bytes of testfs_byte(seed, j). */
static inline void testfs_write(const char *root, const char *rel, unsigned seed, size_t size)
{
    char path[1024];
    testfs_make_dirs(root, rel);
    assert_true(snprintf(path, sizeof path, "%s/%s", root, rel) < (int)sizeof path);
    uint8_t *buf = malloc(size + 1);
    for (size_t j = 0; j < size; j++)
        buf[j] = testfs_byte(seed, j);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, size), (ssize_t)size);
    close(fd);
    free(buf);
}

/* A pid that no process has: a child forked and reaped (its pid being reused within a
 * test is unlikely, and would only keep a file that should have gone). */
static inline pid_t testfs_dead_pid(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    return pid;
}

#endif
