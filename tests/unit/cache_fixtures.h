/* cache_fixtures — what the cache's unit tests (test_cache.c: building and reading;
 * test_cache_keeper.c: the keeper) share: a private directory per test with the
 * dataset's files in src/ and caches in out/, a `files` dataset of fixed-size files in
 * three class folders, and byte surgery on a file. Include after <cmocka.h>;
 * everything here is static. */
#ifndef LD_CACHE_FIXTURES_H
#define LD_CACHE_FIXTURES_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "dataset.h"
#include "testfs.h"

struct tdir {
    char root[256];
    char src[300];                  /* the dataset's files */
    char out[300];                  /* where caches go */
    char cache[400];                /* out/ds.ldcache */
};

static inline int setup(void **state)
{
    struct tdir *t = calloc(1, sizeof *t);
    if (testfs_mkdtemp("ld-test-cache", t->root, sizeof t->root) < 0) {
        free(t);
        return -1;
    }
    snprintf(t->src, sizeof t->src, "%s/src", t->root);
    snprintf(t->out, sizeof t->out, "%s/out", t->root);
    snprintf(t->cache, sizeof t->cache, "%s/ds.ldcache", t->out);
    if (mkdir(t->src, 0755) < 0 || mkdir(t->out, 0755) < 0)
        return -1;
    *state = t;
    return 0;
}

static inline int teardown(void **state)
{
    struct tdir *t = *state;
    chmod(t->out, 0755);
    int r = testfs_rmtree(t->root);
    free(t);
    return r;
}

/* ---- the source ---------------------------------------------------------------------- */

/* n files of `size` bytes in three class folders. */
static inline void write_fixed_tree(const char *root, unsigned n, size_t size)
{
    char rel[64];
    for (unsigned i = 0; i < n; i++) {
        snprintf(rel, sizeof rel, "class_%u/%04u.bin", i % 3, i);
        testfs_write(root, rel, i, size);
    }
}

static inline dataset *open_dataset(struct tdir *t)
{
    struct config_dataset cfg = {.name = "ds", .kind = CONFIG_DATASET_FILES, .path = t->src,
                                 .pattern = "*"};
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = NULL;
    int r = dataset_open(&cfg, &d, err);
    if (r != 0)
        fail_msg("dataset_open: %d %s", r, err);
    return d;
}

/* The index of write_fixed_tree's file i in the dataset (sorted paths, not numbers). */
static inline uint64_t sample_of(const dataset *d, unsigned i)
{
    char rel[64];
    snprintf(rel, sizeof rel, "class_%u/%04u.bin", i % 3, i);
    for (uint64_t k = 0; k < d->count; k++)
        if (strcmp(dataset_sample_name(d, k), rel) == 0)
            return k;
    fail_msg("no sample %s", rel);
    return 0;
}

/* ---- file surgery --------------------------------------------------------------------- */

/* File surgery: read, patch and write back bytes of a cache file. */
static inline void file_read_at(const char *path, uint64_t off, void *buf, size_t len)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
}

static inline void file_write_at(const char *path, uint64_t off, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
}

static inline void flip_byte(const char *path, uint64_t off)
{
    uint8_t b;
    file_read_at(path, off, &b, 1);
    b ^= 0x5a;
    file_write_at(path, off, &b, 1);
}

static inline bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static inline uint64_t align_to(uint64_t v)
{
    return (v + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN;
}

#endif
