/* Unit tests for coldread over a real `files` dataset: files pushed out of the page
 * cache (syncfs, then POSIX_FADV_DONTNEED) make the workers' reads miss, which turns
 * read-ahead on; the samples read ahead are then in the page cache and every sample
 * reads back exactly; warm reads turn it off again; a file that vanished or shrank
 * after the scan is skipped by read-ahead (counted as failed) and still reported by the
 * worker's read as before; read_ahead: 0 makes no read-ahead at all. Read once: the
 * samples read ahead are read from the read-ahead's buffers (counted as taken), with
 * the same bytes; a file removed, cut short, renamed over, turned into a link or
 * rewritten after the read-ahead read it gives exactly what a dataset without
 * read-ahead gives (the same code and message, or the new bytes); a stream's buffers go
 * when it is forgotten, even with its reads queued. On a file system whose pages cannot
 * be dropped (tmpfs) the tests that need cold files are skipped. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <dirent.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/stat.h>
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

/* Drops the pages of every file still cached; true when none is left. */
static bool drop_files(const char *root)
{
    char rel[64], path[512];
    bool cold = true;
    for (uint64_t i = 0; i < N_FILES; i++) {
        file_rel(i, rel, sizeof rel);
        snprintf(path, sizeof path, "%s/%s", root, rel);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        if (page_cached(fd)) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            cold = cold && !page_cached(fd);
        }
        close(fd);
    }
    return cold;
}

/* Pushes every file out of the page cache (written back first: only clean pages can be
 * dropped). A page just written may still sit in another CPU's batch of pages on their
 * way to the LRU lists, which POSIX_FADV_DONTNEED cannot drop (it drains only the
 * calling CPU's): the drop is repeated from each CPU this test may run on. False when
 * the file system keeps them all the same. */
static bool make_cold(const char *root)
{
    int dfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    syncfs(dfd);
    close(dfd);
    bool cold = drop_files(root);
    cpu_set_t all, one;
    if (cold || sched_getaffinity(0, sizeof all, &all) != 0)
        return cold;
    for (int c = 0; c < CPU_SETSIZE && !cold; c++) {
        if (!CPU_ISSET(c, &all))
            continue;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        if (sched_setaffinity(0, sizeof one, &one) == 0)
            cold = drop_files(root);
    }
    sched_setaffinity(0, sizeof all, &all);
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
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, n), 0);
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
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, n), 0);
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
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, 4), 0);
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
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, N_FILES), 0);
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, 10), 0);
    dataset_free(d);
    coldread_free(NULL);
}

/* Read once: every sample read ahead is copied from its buffer, exactly, and the
 * buffers are all given back. */
static void test_read_once_exact(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 4);
    make_cold(t->root); /* read once does not depend on it: the misses only count */
    uint64_t idx[N_FILES];
    for (uint64_t s = 0; s < N_FILES; s++)
        idx[s] = (s * 37u) % N_FILES; /* 37 is prime to 96: each sample once */
    struct coldread_stats st;
    int owner;
    assert_int_equal(coldread_submit(d->ahead, &owner, idx, N_FILES), 0);
    wait_idle(d->ahead, &st);
    assert_int_equal(st.samples, N_FILES);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.held_bytes, (N_FILES - 1) * FILE_SIZE + BIG_SIZE);
    for (uint64_t s = 0; s < N_FILES; s++)
        read_check(d, s);
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.taken, N_FILES);
    assert_int_equal(st.changed, 0);
    assert_int_equal(st.held_bytes, 0);
    /* Not asked for: read by the worker, as before. */
    read_check(d, 9);
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.taken, N_FILES);
    dataset_free(d);
}

static void sample_path(const char *root, uint64_t s, char *path, size_t size)
{
    char rel[64];
    file_rel(file_of_sample(s), rel, sizeof rel);
    snprintf(path, size, "%s/%s", root, rel);
}

/* Rewrites a file in place, same size, other bytes, until its change time shows it (a
 * write in the same clock tick as the last change leaves it as it was). */
static void rewrite_in_place(const char *path, unsigned seed)
{
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    uint8_t buf[FILE_SIZE];
    for (size_t j = 0; j < FILE_SIZE; j++)
        buf[j] = testfs_byte(seed, j);
    for (int tries = 0; tries < 10000; tries++) {
        int fd = open(path, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, buf, FILE_SIZE, 0), FILE_SIZE);
        assert_int_equal(fstat(fd, &after), 0);
        close(fd);
        if (after.st_ctim.tv_sec != before.st_ctim.tv_sec || after.st_ctim.tv_nsec != before.st_ctim.tv_nsec)
            return;
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("%s: change time unchanged after 10,000 writes", path);
}

/* Read once must not hide a change the worker's own read would have seen: files changed
 * after the read-ahead read them read exactly as through a dataset without read-ahead
 * opened on the same scan (same code, same message, same bytes). The check that covers
 * it is files_ahead_same (inode, size, change time by the sample's path). */
static void test_read_once_sees_changes(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 4), *plain = open_files(t->root, 0);
    uint64_t idx[] = {0, 1, 2, 3, 4, 5};
    struct coldread_stats st;
    assert_int_equal(coldread_submit(d->ahead, NULL, idx, 6), 0);
    wait_idle(d->ahead, &st);
    assert_int_equal(st.held_bytes, 6 * FILE_SIZE);

    char path[512], other[512], tmp[600];
    sample_path(t->root, 0, path, sizeof path);
    assert_int_equal(unlink(path), 0);                       /* removed */
    sample_path(t->root, 1, path, sizeof path);
    assert_int_equal(truncate(path, 100), 0);                /* cut short */
    sample_path(t->root, 2, path, sizeof path);              /* renamed over: new bytes */
    snprintf(tmp, sizeof tmp, "%s.new", path);
    testfs_write("/", tmp + 1, 1234, FILE_SIZE);
    assert_int_equal(rename(tmp, path), 0);
    sample_path(t->root, 3, path, sizeof path);              /* turned into a link */
    sample_path(t->root, 5, other, sizeof other);
    snprintf(tmp, sizeof tmp, "%s.lnk", path);
    assert_int_equal(symlink(other, tmp), 0);
    assert_int_equal(rename(tmp, path), 0);
    sample_path(t->root, 4, path, sizeof path);
    rewrite_in_place(path, 4321);                            /* rewritten in place */

    for (uint64_t s = 0; s < 6; s++) {
        uint8_t a[FILE_SIZE], b[FILE_SIZE];
        int64_t la = -2, lb = -2;
        void *da[2] = {a, &la}, *db[2] = {b, &lb};
        char ea[LD_ERRMSG_MAX] = "", eb[LD_ERRMSG_MAX] = "";
        memset(a, 0xAA, sizeof a);
        memset(b, 0xAA, sizeof b);
        int ra = d->ops->read(d, s, da, ea), rb = plain->ops->read(plain, s, db, eb);
        if (ra != rb || strcmp(ea, eb) != 0)
            fail_msg("sample %llu: %d '%s' with read-ahead, %d '%s' without", (unsigned long long)s, ra, ea, rb, eb);
        if (ra == 0) {
            assert_memory_equal(a, b, sizeof a);
            assert_int_equal(la, lb);
        }
    }
    /* Those that failed, failed as they would have (the messages name the file). */
    uint8_t buf[FILE_SIZE];
    int64_t label;
    void *dst[2] = {buf, &label};
    char err[LD_ERRMSG_MAX] = "";
    assert_int_equal(plain->ops->read(plain, 1, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "expected 3000 bytes, file has 100"));
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.changed, 5);
    assert_int_equal(st.taken, 1);                           /* sample 5, unchanged */
    assert_int_equal(st.held_bytes, 0);
    dataset_free(plain);
    dataset_free(d);
}

/* A stream that closes while its samples are being read ahead: what was read goes at
 * once, what is in flight or queued as soon as its read is back, and none of it reaches
 * a worker afterwards; another stream's buffers stay. ASan checks that nothing leaks,
 * buffers held at dataset_free included. */
static void test_forget_frees_buffers(void **state)
{
    struct testfs_dir *t = *state;
    write_tree(t->root);
    dataset *d = open_files(t->root, 2);
    make_cold(t->root);
    uint64_t idx[N_FILES];
    for (uint64_t s = 0; s < N_FILES; s++)
        idx[s] = s;
    int a, b;
    struct coldread_stats st;
    assert_int_equal(coldread_submit(d->ahead, &a, idx, N_FILES), 0);
    coldread_forget(d->ahead, &a); /* queued and in flight */
    wait_idle(d->ahead, &st);
    assert_int_equal(st.held_bytes, 0);
    read_check(d, 3);
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.taken, 0);

    assert_int_equal(coldread_submit(d->ahead, &a, idx, 4), 0);
    assert_int_equal(coldread_submit(d->ahead, &b, idx + 4, 4), 0);
    wait_idle(d->ahead, &st);
    assert_int_equal(st.held_bytes, 8 * FILE_SIZE);
    coldread_forget(d->ahead, &a); /* read: freed now */
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.held_bytes, 4 * FILE_SIZE);
    read_check(d, 4);
    coldread_get_stats(d->ahead, &st);
    assert_int_equal(st.taken, 1);
    dataset_free(d); /* with b's other three buffers held */
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
    assert_int_equal(coldread_submit(a->ahead, NULL, idx, N_FILES), 0);
    assert_int_equal(coldread_submit(b->ahead, NULL, idx, N_FILES / 2), 0);
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
    assert_int_equal(coldread_submit(c->ahead, NULL, idx, 4), 0);
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
        cmocka_unit_test_setup_teardown(test_read_once_exact, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_read_once_sees_changes, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_forget_frees_buffers, testfs_dir_setup, testfs_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
