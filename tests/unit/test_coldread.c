/* Unit tests for coldread over a real `files` dataset: files pushed out of the page
 * cache (syncfs, then POSIX_FADV_DONTNEED) make the workers' reads miss, which turns
 * read-ahead on; the samples read ahead are then in the page cache and every sample
 * reads back exactly; warm reads turn it off again; a file that vanished or shrank
 * after the scan is skipped by read-ahead (counted as failed) and still reported by the
 * worker's read as before; read_ahead: 0 makes no read-ahead at all. On a file system
 * whose pages cannot be dropped (tmpfs) the tests that need cold files are skipped. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "coldread.h"
#include "dataset.h"

#define N_FILES 96
#define FILE_SIZE 3000
#define BIG_SIZE (IOQUEUE_SCRATCH_BYTES + 5000) /* read ahead partly by fadvise */

static void file_rel(uint64_t i, char *buf, size_t size)
{
    snprintf(buf, size, "class_%02u/%04u.bin", (unsigned)(i % 4), (unsigned)i);
}

static size_t file_size(uint64_t i)
{
    return i == 7 ? BIG_SIZE : FILE_SIZE;
}

/* Sample order is bytewise path order: class_00/0000, class_00/0004, ... */
static uint64_t file_of_sample(uint64_t s)
{
    uint64_t per = N_FILES / 4;
    return (s % per) * 4 + s / per;
}

static void write_tree(const char *root)
{
    char rel[64];
    for (uint64_t i = 0; i < N_FILES; i++) {
        file_rel(i, rel, sizeof rel);
        testfs_write(root, rel, (unsigned)i, file_size(i));
    }
}

/* Whether the first page of fd is in the page cache (mincore: a read would bring it in). */
static bool page_cached(int fd)
{
    void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char v = 1;
    if (p == MAP_FAILED)
        return true;
    mincore(p, 4096, &v);
    munmap(p, 4096);
    return v & 1;
}

/* Pushes every file out of the page cache (written back first: only clean pages can be
 * dropped). False when the file system keeps them. */
static bool make_cold(const char *root)
{
    char rel[64], path[512];
    bool cold = true;
    int dfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    syncfs(dfd);
    close(dfd);
    for (uint64_t i = 0; i < N_FILES; i++) {
        file_rel(i, rel, sizeof rel);
        snprintf(path, sizeof path, "%s/%s", root, rel);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (i == 0)
            cold = !page_cached(fd);
        close(fd);
    }
    return cold;
}

static dataset *open_files(char *root, uint32_t read_ahead)
{
    struct config_dataset cfg = {.name = "cold", .kind = CONFIG_DATASET_FILES, .path = root,
                                 .pattern = "*.bin", .read_ahead = read_ahead};
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = NULL;
    int r = dataset_open(&cfg, &d, err);
    if (r != 0)
        fail_msg("dataset_open: %d %s", r, err);
    return d;
}

/* Reads sample s through dataset_read and checks every byte. */
static void read_check(const dataset *d, uint64_t s)
{
    uint64_t f = file_of_sample(s);
    size_t size = file_size(f);
    uint8_t *buf = malloc(BIG_SIZE);
    int64_t label = -2;
    void *dst[2] = {buf, &label};
    char err[LD_ERRMSG_MAX] = "";
    struct dataset_read_ctx ctx = {0};
    int r = dataset_read(d, s, &ctx, dst, NULL, err);
    if (r != 0)
        fail_msg("sample %llu: %d %s", (unsigned long long)s, r, err);
    for (size_t j = 0; j < size; j++)
        if (buf[j] != testfs_byte((unsigned)f, j))
            fail_msg("sample %llu byte %zu differs", (unsigned long long)s, j);
    assert_int_equal(label, (int64_t)(f % 4));
    free(buf);
}

static void wait_idle(coldread *ra, struct coldread_stats *st)
{
    for (int ms = 0; ms < 10000; ms++) {
        coldread_get_stats(ra, st);
        if (st->pending == 0)
            return;
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("read-ahead still has %llu samples pending after 10 s", (unsigned long long)st->pending);
}

static void test_cold_turns_on_and_reads_exactly(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 8);
    assert_non_null(d->ahead);
    struct coldread_stats st;
    if (!make_cold(t->root)) {
        dataset_free(d);
        skip();
    }
    /* Warm-up decision: too few reads say nothing, the state stays off. */
    assert_false(coldread_wanted(d->ahead));
    for (uint64_t s = 0; s < COLDREAD_SAMPLE_READS; s++)
        read_check(d, s);
    assert_true(coldread_wanted(d->ahead));

    /* The rest, read ahead as one batch (in a shuffled order), then read and checked:
     * every sample exactly once, with its bytes and label. */
    make_cold(t->root);
    uint64_t idx[N_FILES - COLDREAD_SAMPLE_READS];
    size_t n = 0;
    for (uint64_t s = COLDREAD_SAMPLE_READS; s < N_FILES; s++)
        idx[n++] = s;
    for (size_t k = n - 1; k > 0; k--) {
        size_t j = (k * 7919u) % (k + 1);
        uint64_t x = idx[k];
        idx[k] = idx[j];
        idx[j] = x;
    }
    assert_int_equal(coldread_submit(d->ahead, idx, n), 0);
    wait_idle(d->ahead, &st);
    assert_int_equal(st.samples, n);
    assert_int_equal(st.failed, 0);
    assert_true(st.misses > 0);
    assert_int_equal(st.threads, 8);
    assert_true(coldread_wanted(d->ahead)); /* its own reads missed: it stays on */
    char *seen = calloc(N_FILES, 1);
    for (size_t k = 0; k < n; k++) {
        assert_int_equal(seen[idx[k]], 0);
        seen[idx[k]] = 1;
        read_check(d, idx[k]);
    }
    free(seen);

    /* Everything is cached now: read-ahead's own reads hit, and it turns off. */
    assert_int_equal(coldread_submit(d->ahead, idx, n), 0);
    wait_idle(d->ahead, &st);
    assert_false(coldread_wanted(d->ahead));
    dataset_free(d);
}

static void test_vanished_and_short_files(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 4);
    char path[512], rel[64];
    /* Sample 0 is file 0 (removed), sample 1 is file 4 (cut short). */
    file_rel(0, rel, sizeof rel);
    snprintf(path, sizeof path, "%s/%s", t->root, rel);
    assert_int_equal(unlink(path), 0);
    file_rel(4, rel, sizeof rel);
    snprintf(path, sizeof path, "%s/%s", t->root, rel);
    assert_int_equal(truncate(path, 100), 0);
    make_cold(t->root);

    uint64_t idx[] = {0, 1, 2, 3};
    struct coldread_stats st;
    assert_int_equal(coldread_submit(d->ahead, idx, 4), 0);
    wait_idle(d->ahead, &st);
    assert_int_equal(st.failed, 2);
    assert_int_equal(st.samples, 2);

    /* The workers' reads report both, as without read-ahead. */
    uint8_t buf[FILE_SIZE];
    int64_t label;
    void *dst[2] = {buf, &label};
    char err[LD_ERRMSG_MAX] = "";
    assert_int_equal(d->ops->read(d, 0, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "0000.bin"));
    err[0] = '\0';
    assert_int_equal(d->ops->read(d, 1, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "0004.bin"));
    assert_non_null(strstr(err, "expected 3000 bytes"));
    read_check(d, 2);
    read_check(d, 3);
    dataset_free(d);
}

static void test_off_and_freed_with_work_queued(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 0);
    assert_null(d->ahead);
    read_check(d, 5); /* coldread_pread(NULL, ...) is a plain pread */
    dataset_free(d);

    /* Freed with read-ahead queued and in flight: nothing leaks, nothing runs after. */
    d = open_files(t->root, 2);
    make_cold(t->root);
    uint64_t idx[N_FILES];
    for (uint64_t s = 0; s < N_FILES; s++)
        idx[s] = s;
    assert_int_equal(coldread_submit(d->ahead, idx, N_FILES), 0);
    assert_int_equal(coldread_submit(d->ahead, idx, 10), 0);
    dataset_free(d);
    coldread_free(NULL);
}

/* Threads of this process named ld-io (the I/O threads). */
static unsigned io_threads(void)
{
    unsigned n = 0;
    char path[300], comm[32];
    DIR *dir = opendir("/proc/self/task");
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* gone meanwhile */
        if (fgets(comm, sizeof comm, f) && strcmp(comm, "ld-io\n") == 0)
            n++;
        fclose(f);
    }
    closedir(dir);
    return n;
}

/* A joined thread leaves /proc a moment after pthread_join returns: wait for the count. */
static void expect_io_threads(unsigned want)
{
    unsigned n = 0;
    for (int ms = 0; ms < 10000; ms++) {
        if ((n = io_threads()) == want)
            return;
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("%u I/O threads, %u expected", n, want);
}

static void test_datasets_share_the_io_threads(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *a = open_files(t->root, 3), *b = open_files(t->root, 5);
    expect_io_threads(0); /* none before the first submit */
    uint64_t idx[N_FILES];
    for (uint64_t s = 0; s < N_FILES; s++)
        idx[s] = s;
    make_cold(t->root);
    assert_int_equal(coldread_submit(a->ahead, idx, N_FILES), 0);
    assert_int_equal(coldread_submit(b->ahead, idx, N_FILES / 2), 0);
    /* One set for both, as many as the larger read_ahead asked for. */
    expect_io_threads(5);
    struct coldread_stats st;
    coldread_get_stats(a->ahead, &st);
    assert_int_equal(st.threads, 5);
    /* Freeing one with its work queued leaves the other's reads and the threads alone. */
    dataset_free(a);
    expect_io_threads(5);
    wait_idle(b->ahead, &st);
    assert_int_equal(st.samples + st.failed, N_FILES / 2);
    assert_int_equal(st.failed, 0);
    for (uint64_t s = 0; s < N_FILES; s++)
        read_check(b, s);
    /* A dataset that asks for more raises the count for all. */
    dataset *c = open_files(t->root, 7);
    assert_int_equal(coldread_submit(c->ahead, idx, 4), 0);
    expect_io_threads(7);
    dataset_free(b);
    dataset_free(c);
    expect_io_threads(0); /* the last one stops them */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cold_turns_on_and_reads_exactly, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_vanished_and_short_files, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_off_and_freed_with_work_queued, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_datasets_share_the_io_threads, testfs_dir_setup, testfs_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
