/* itest_coldread — cold storage against a real loaderd: the dataset's files are pushed
 * out of the page cache (syncfs, then POSIX_FADV_DONTNEED per file: no root needed),
 * so the workers' reads miss and read-ahead turns on. Every epoch still delivers every
 * file exactly once with its bytes and label, `loaderctl datasets` shows the samples
 * read ahead and read once (the workers copied them from the read-ahead's buffers), and
 * a second, warm epoch is just as exact; a stream closed in the middle of a cold epoch
 * leaves no buffer behind. A file removed while the data
 * is cold, or cut short, is skipped by read-ahead and replaced by the worker's read as
 * before (a bad sample each, counted, named in the log with what was wrong); the daemon
 * stops clean. On a file system whose pages cannot be
 * dropped (tmpfs) the tests skip. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 600
#define FILE_SIZE 3000
#define N_CLASSES 12
#define BATCH 64

static const char datasets_yaml[] = "  cold:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "    on_error: fail\n"
                                    "    read_ahead: 16\n"
                                    "  cold_replace:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "    read_ahead: 16\n";

static int setup_daemon(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    harness_write_config(h, "  workers: 2\n  memory_budget: 64MiB\n", datasets_yaml);
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown_daemon(void **state)
{
    harness_free(*state);
    return 0;
}

static int coldread_dropped, coldread_kept;

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

static int coldread_drop_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag != FTW_F)
        return 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (page_cached(fd))
        coldread_kept++;
    else
        coldread_dropped++;
    close(fd);
    return 0;
}

/* Pushes the dataset's files out of the page cache (written back first: only clean
 * pages can be dropped); false when the file system keeps them (then the test skips). */
static bool make_cold(struct harness *h)
{
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/rec", h->dir);
    int dfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    syncfs(dfd);
    close(dfd);
    coldread_dropped = coldread_kept = 0;
    assert_int_equal(nftw(root, coldread_drop_one, 16, FTW_PHYS), 0);
    return coldread_dropped > coldread_kept;
}

static lc_stream *open_ok(lc_client *c, const char *ds, const lc_stream_options *o)
{
    lc_stream *s = NULL;
    int r = lc_stream_open(c, ds, o, &s);
    if (r < 0)
        fail_msg("lc_stream_open(%s): %s: %s", ds, lc_strerror(r), lc_client_error(c));
    return s;
}

/* Reads one epoch; seen[i] counts the rows that held file i's exact bytes and label. */
static uint64_t read_epoch(lc_stream *s, unsigned *seen)
{
    uint64_t rows = 0, bpe = lc_stream_batches_per_epoch(s);
    for (uint64_t k = 0; k < bpe; k++) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 30000, &b);
        if (r != 0)
            fail_msg("batch %llu: %s", (unsigned long long)k, lc_strerror(r));
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        const int64_t *labels = label.data;
        for (uint32_t row = 0; row < lc_batch_rows(b); row++, rows++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            int64_t found = -1;
            for (uint64_t i = (uint64_t)labels[row]; i < N_FILES; i += N_CLASSES)
                if (harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false)) {
                    found = (int64_t)i;
                    break;
                }
            if (found < 0)
                fail_msg("batch %llu row %u matches no file with label %lld", (unsigned long long)k, row,
                         (long long)labels[row]);
            seen[found]++;
        }
        assert_int_equal(lc_batch_release(b), 0);
    }
    return rows;
}

/* The dataset's read_ahead object from `loaderctl --json datasets`. */
static double read_ahead_num(struct harness *h, const char *ds, const char *key)
{
    static char out[1 << 16];
    assert_int_equal(harness_ctl(h, out, sizeof out, "--json", "datasets", NULL), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    double v = -1;
    cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(j, "datasets"))
    {
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(d, "name")), ds) == 0) {
            cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(d, "read_ahead"), key);
            if (cJSON_IsNumber(n))
                v = n->valuedouble;
        }
    }
    cJSON_Delete(j);
    if (v < 0)
        fail_msg("no read_ahead.%s for dataset %s in: %s", key, ds, out);
    return v;
}

static void test_cold_epochs_are_exact(void **state)
{
    struct harness *h = *state;
    if (!make_cold(h))
        skip();
    lc_client *c = harness_connect(h, 10000, "itest_coldread");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.epochs = 2;
    o.seed = 3;
    lc_stream *s = open_ok(c, "cold", &o);
    unsigned *seen = calloc(N_FILES, sizeof *seen);

    /* Epoch 0, cold: every file exactly once. */
    assert_int_equal(read_epoch(s, seen), N_FILES);
    for (uint64_t i = 0; i < N_FILES; i++)
        if (seen[i] != 1)
            fail_msg("cold epoch: file %llu delivered %u times", (unsigned long long)i, seen[i]);
    double ahead = read_ahead_num(h, "cold", "samples");
    if (ahead < BATCH) /* at least a batch was read ahead */
        fail_msg("%.0f samples read ahead; the daemon's log:\n%s", ahead, harness_log(h));
    assert_true(ahead <= 2 * N_FILES);
    assert_true(read_ahead_num(h, "cold", "misses") > 0);
    assert_int_equal(read_ahead_num(h, "cold", "failed"), 0);
    assert_int_equal(read_ahead_num(h, "cold", "threads"), 16);
    /* Read once: most of what was read ahead reached the batches from its buffer. */
    double once = read_ahead_num(h, "cold", "read_once");
    if (once < BATCH || once > ahead)
        fail_msg("%.0f samples read once of %.0f read ahead", once, ahead);
    assert_int_equal(read_ahead_num(h, "cold", "changed"), 0);

    /* Epoch 1, warm now: exact as well. */
    memset(seen, 0, N_FILES * sizeof *seen);
    assert_int_equal(read_epoch(s, seen), N_FILES);
    for (uint64_t i = 0; i < N_FILES; i++)
        assert_int_equal(seen[i], 1);
    lc_batch *end = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &end), LC_EEND);
    harness_flush_releases(c);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    free(seen);
    harness_stop_clean(h);
}

/* A stream closed while its batches are being read ahead: every buffer it asked for
 * goes, those still in flight as their reads come back (waited for as a state), and the
 * daemon stops clean (under ASan: nothing leaked). How much is buffered at the close
 * depends on how far the workers got; test_coldread's test_forget_frees_buffers covers
 * each state of a buffer deterministically. */
static void test_close_while_cold(void **state)
{
    struct harness *h = *state;
    if (!make_cold(h))
        skip();
    lc_client *c = harness_connect(h, 10000, "itest_coldread");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.epochs = 1;
    o.prefetch = 4;
    lc_stream *s = open_ok(c, "cold", &o);
    for (int k = 0; k < 3; k++) { /* cold batches: read-ahead on, batches behind them in flight */
        lc_batch *b = NULL;
        assert_int_equal(lc_stream_next(s, 30000, &b), 0);
        assert_int_equal(lc_batch_release(b), 0);
    }
    assert_int_equal(lc_stream_close(s), 0);
    /* Nothing of the closed stream's is kept: no buffer, no sample queued or being read,
     * no entry in the read-once table. */
    double held = -1, pending = -1, entries = -1;
    for (int tries = 0; tries < 1000 && (held != 0 || pending != 0 || entries != 0); tries++) {
        held = read_ahead_num(h, "cold", "buffered_bytes");
        pending = read_ahead_num(h, "cold", "pending");
        entries = read_ahead_num(h, "cold", "entries");
        if (held != 0 || pending != 0 || entries != 0) {
            struct timespec ts = {.tv_nsec = 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (held != 0 || pending != 0 || entries != 0)
        fail_msg("10 s after the stream closed: %.0f bytes buffered, %.0f samples pending, %.0f entries", held,
                 pending, entries);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_file_removed_while_cold(void **state)
{
    struct harness *h = *state;
    char path[PATH_MAX], cut[PATH_MAX];
    /* Files 5 and 6 of the generator's tree (classes 5 and 6). */
    snprintf(path, sizeof path, "%s/rec/class_%03d/%07d.bin", h->dir, 5 % N_CLASSES, 5);
    snprintf(cut, sizeof cut, "%s/rec/class_%03d/%07d.bin", h->dir, 6 % N_CLASSES, 6);
    lc_client *c = harness_connect(h, 10000, "itest_coldread");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.epochs = 1;
    /* Opened first: the stream keeps the dataset as scanned, with file 5 in it (a
     * rescan would drop the file from later streams). */
    lc_stream *s = open_ok(c, "cold_replace", &o);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(truncate(cut, 100), 0);
    if (!make_cold(h))
        skip();
    unsigned *seen = calloc(N_FILES, sizeof *seen);
    assert_int_equal(read_epoch(s, seen), N_FILES);
    assert_int_equal(seen[5], 0);                 /* replaced by another file */
    assert_int_equal(seen[6], 0);                 /* cut short: replaced as well */
    assert_int_equal(harness_status_num(h, "bad_samples", NULL), 2);
    char *log = harness_log(h);                   /* each named, with what was wrong */
    if (!strstr(log, "0000005.bin") || !strstr(log, "0000006.bin): expected 3000 bytes, file has 100"))
        fail_msg("the daemon's log does not name both files and the short one's size:\n%s", log);
    free(log);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    free(seen);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cold_epochs_are_exact, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_close_while_cold, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_file_removed_while_cold, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
