/* itest_cache — the single-file dataset cache inside a real loaderd.
 *
 * A first stream triggers the build while it is served from the files; later epochs,
 * streams and daemon runs are served from the cache with the same bytes and labels;
 * touching a file makes it stale and it is rebuilt; a corrupt or truncated cache is
 * never served (set aside, rebuilt); `verify` finds a flipped byte; mode rebuild builds
 * again; two streams share one build; a cache directory that cannot be written gives a
 * clear error while the source keeps being served; a `packed` dataset serves a shipped
 * cache file on its own; a hand-off stream (batches cut and finished on the workers)
 * reads exactly while the cache is replaced under it, and the old one is unmapped. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 400
#define FILE_SIZE 200
#define N_CLASSES 4

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static void start_with_cache(struct harness *h, const char *mode)
{
    char ds[512];
    snprintf(ds, sizeof ds,
             "  records:\n    kind: files\n    path: rec\n    cache: {path: cache/rec.ldcache, mode: %s}\n", mode);
    char dir[200];
    snprintf(dir, sizeof dir, "%s/cache", h->dir);
    mkdir(dir, 0755);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
}

static cJSON *cache_call(lc_client *c, const char *op, const char *extra)
{
    char req[256], *text = NULL;
    snprintf(req, sizeof req, "{\"op\":\"%s\",\"dataset\":\"records\"%s}", op, extra ? extra : "");
    int r = lc_request_json(c, req, &text);
    if (r < 0)
        fail_msg("%s: %s", op, lc_client_error(c));
    cJSON *j = cJSON_Parse(text);
    lc_free(text);
    assert_non_null(j);
    return j;
}

static const char *state_of(const cJSON *j)
{
    return cJSON_GetStringValue(cJSON_GetObjectItem(j, "state"));
}

/* Waits until the cache's state is `want` (up to 20 s); returns the last info. */
static cJSON *wait_state(lc_client *c, const char *want)
{
    for (int i = 0; i < 400; i++) {
        cJSON *j = cache_call(c, "cache_info", NULL);
        if (strcmp(state_of(j), want) == 0)
            return j;
        cJSON_Delete(j);
        usleep(50000);
    }
    cJSON *j = cache_call(c, "cache_info", NULL);
    char *s = cJSON_Print(j);
    fail_msg("cache state never became %s: %s", want, s);
    return NULL;
}

static double num(const cJSON *j, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItem(j, a);
    if (b)
        o = cJSON_GetObjectItem(o, b);
    assert_true(cJSON_IsNumber(o));
    return o->valuedouble;
}

/* Reads one whole epoch and checks every sample's bytes and label; returns how many. */
static uint64_t read_epoch_checked(lc_client *c, uint64_t seed)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.seed = seed;
    o.epochs = 1;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    char *seen = calloc(N_FILES, 1);
    uint64_t n = 0;
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            int64_t lab = ((const int64_t *)label.data)[row];
            int64_t found = -1;
            for (uint64_t i = (uint64_t)lab; i < N_FILES; i += N_CLASSES)
                if (harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false)) {
                    found = (int64_t)i;
                    break;
                }
            if (found < 0)
                fail_msg("a sample with label %lld matches no file of that class", (long long)lab);
            assert_int_equal(seen[found], 0);
            seen[found] = 1;
            n++;
        }
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    free(seen);
    lc_stream_close(s);
    return n;
}

/* Reads one stream (every sample checked against its file) until the cache has
 * served `want` samples in all, 30 s at most: a stream reads the source until the check
 * started at its open has passed, so its first batches may come from the files. */
static void read_until_hits(lc_client *c, uint64_t seed, double want)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.seed = seed;
    o.epochs = 0;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    time_t start = time(NULL);
    for (uint64_t n = 0;;) {
        lc_batch *b;
        if (lc_stream_next(s, 10000, &b) < 0)
            fail_msg("next: %s", lc_client_error(c));
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++, n++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            int64_t lab = ((const int64_t *)label.data)[row];
            bool found = false;
            for (uint64_t i = (uint64_t)lab; i < N_FILES && !found; i += N_CLASSES)
                found = harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false);
            if (!found)
                fail_msg("a sample with label %lld matches no file of that class", (long long)lab);
        }
        uint64_t index = lc_batch_index(b);
        lc_batch_release(b);
        if (index % 4 == 0) {
            cJSON *j = cache_call(c, "cache_info", NULL);
            double hits = num(j, "hits", NULL);
            cJSON_Delete(j);
            if (hits >= want)
                break;
        }
        if (time(NULL) - start > 30)
            fail_msg("the cache never served %.0f samples (%llu read)", want, (unsigned long long)n);
    }
    lc_stream_close(s);
}

static void test_build_serve_restart(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    /* The first stream is served from the files and starts the build, even when it
     * opens while the start-up check is still running. */
    assert_int_equal(read_epoch_checked(c, 1), N_FILES);
    cJSON *j = wait_state(c, "ready");
    assert_int_equal((int)num(j, "file", "count"), N_FILES);
    cJSON_Delete(j);
    /* Later epochs come from the cache: same bytes, same labels, and the hits count. */
    read_until_hits(c, 2, N_FILES);
    j = cache_call(c, "cache_verify", NULL);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    cJSON_Delete(j);
    lc_client_close(c);
    harness_stop_clean(h);

    /* A later daemon run finds it valid and serves from it at once. */
    harness_start(h);
    c = harness_connect(h, 10000, "itest_cache");
    j = wait_state(c, "ready");
    cJSON_Delete(j);
    read_until_hits(c, 3, N_FILES);

    /* Touching a file makes it stale: detected when a stream opens, rebuilt. */
    char path[4300];
    snprintf(path, sizeof path, "%s/rec/class_001/0000005.bin", h->dir);
    struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_sec = 1000000000, .tv_nsec = 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
    j = cache_call(c, "cache_info", NULL);
    char *fp_before = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "file"), "fingerprint")));
    cJSON_Delete(j);
    assert_int_equal(read_epoch_checked(c, 4), N_FILES);
    for (int i = 0; i < 400; i++) {
        j = cache_call(c, "cache_info", NULL);
        const cJSON *f = cJSON_GetObjectItem(j, "file");
        const char *fp = f ? cJSON_GetStringValue(cJSON_GetObjectItem(f, "fingerprint")) : NULL;
        bool rebuilt = strcmp(state_of(j), "ready") == 0 && fp && strcmp(fp, fp_before) != 0;
        cJSON_Delete(j);
        if (rebuilt)
            break;
        assert_true(i < 399);
        usleep(50000);
    }
    free(fp_before);
    assert_int_equal(read_epoch_checked(c, 5), N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "the source changed since the cache was built"));
    free(log);
}

/* Flips one byte at `offset` from the end (negative) or the start of the cache file. */
static void flip_byte(struct harness *h, long offset)
{
    char path[300];
    snprintf(path, sizeof path, "%s/cache/rec.ldcache", h->dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t at = offset >= 0 ? offset : lseek(fd, 0, SEEK_END) + offset;
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static bool bad_copy_exists(struct harness *h)
{
    char path[300];
    snprintf(path, sizeof path, "%s/cache/rec.ldcache.bad", h->dir);
    return access(path, F_OK) == 0;
}

static void build_now(struct harness *h)
{
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    cJSON *j = wait_state(c, "absent");
    cJSON_Delete(j);
    j = cache_call(c, "cache_build", NULL);
    cJSON_Delete(j);
    j = wait_state(c, "ready");
    cJSON_Delete(j);
    lc_client_close(c);
}

static void test_corruption_is_never_served(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    build_now(h);
    /* A flipped data byte: verify names the sample, the cache is set aside, rebuilt. */
    flip_byte(h, 4096 + 70);
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    char *text = NULL;
    int r = lc_request_json(c, "{\"op\":\"cache_verify\",\"dataset\":\"records\"}", &text);
    assert_true(r < 0);
    assert_non_null(strstr(lc_client_error(c), "sample"));
    assert_true(bad_copy_exists(h));
    cJSON *j = wait_state(c, "ready"); /* rebuilt */
    cJSON_Delete(j);
    assert_int_equal(read_epoch_checked(c, 1), N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);

    /* A flipped header byte or a truncated file: refused at start, set aside, served
     * from the source (and rebuilt when a stream needs it). */
    const long where[] = {20, -10};
    for (int k = 0; k < 3; k++) {
        char path[300];
        snprintf(path, sizeof path, "%s/cache/rec.ldcache", h->dir);
        if (k < 2) {
            flip_byte(h, where[k]);
        } else {
            struct stat st;
            assert_int_equal(stat(path, &st), 0);
            assert_int_equal(truncate(path, st.st_size - 100), 0);
        }
        harness_start(h);
        c = harness_connect(h, 10000, "itest_cache");
        j = wait_state(c, "absent");
        assert_non_null(cJSON_GetObjectItem(j, "error"));
        cJSON_Delete(j);
        assert_int_equal(read_epoch_checked(c, 2), N_FILES); /* from the source, and it triggers the build */
        j = wait_state(c, "ready");
        cJSON_Delete(j);
        lc_client_close(c);
        harness_stop_clean(h);
        char *log = harness_log(h);
        assert_non_null(strstr(log, "set aside"));
        free(log);
    }
}

static void test_rebuild_mode_and_shared_build(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    build_now(h);
    harness_stop_clean(h);

    /* mode rebuild: a new build at the first stream, over the valid cache. */
    start_with_cache(h, "rebuild");
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    cJSON *j = wait_state(c, "ready");
    char *built = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "file"), "build_time")));
    cJSON_Delete(j);
    /* Two streams opened together share one build. */
    lc_client *c2 = harness_connect(h, 10000, "itest_cache");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    lc_stream *s1 = NULL, *s2 = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s1), 0);
    assert_int_equal(lc_stream_open(c2, "records", &o, &s2), 0);
    lc_stream_close(s1);
    lc_stream_close(s2);
    for (int i = 0;; i++) {
        j = cache_call(c, "cache_info", NULL);
        const cJSON *f = cJSON_GetObjectItem(j, "file");
        const char *t = f ? cJSON_GetStringValue(cJSON_GetObjectItem(f, "build_time")) : NULL;
        bool done = strcmp(state_of(j), "ready") == 0 && t && strcmp(t, built) != 0; /* ns resolution */
        cJSON_Delete(j);
        if (done)
            break;
        assert_true(i < 400);
        usleep(50000);
    }
    free(built);
    lc_client_close(c);
    lc_client_close(c2);
    harness_stop_clean(h);
    char *log = harness_log(h), *p = log, *run;
    while ((run = strstr(p, "listening on")) != NULL) /* this run's lines only */
        p = run + 1;
    int builds = 0;
    while ((p = strstr(p, "building the cache")) != NULL) {
        builds++;
        p++;
    }
    assert_int_equal(builds, 1);
    free(log);
}

static void test_unwritable_cache_dir_and_packed(void **state)
{
    struct harness *h = *state;
    /* The cache's directory is a regular file: the build fails with a clear error and
     * the daemon keeps serving from the source. */
    harness_write_file(h, "notadir", "x", 1);
    harness_write_config(h, "  workers: 2\n",
                         "  records:\n    kind: files\n    path: rec\n    cache: {path: notadir/rec.ldcache}\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    assert_int_equal(read_epoch_checked(c, 1), N_FILES);
    cJSON *j = wait_state(c, "failed");
    const char *err = cJSON_GetStringValue(cJSON_GetObjectItem(j, "error"));
    assert_non_null(err);
    assert_non_null(strstr(err, "notadir"));
    cJSON_Delete(j);
    assert_int_equal(read_epoch_checked(c, 2), N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);

    /* Build one, then serve the file alone as a `packed` dataset. */
    start_with_cache(h, "auto");
    build_now(h);
    harness_stop_clean(h);
    harness_write_config(h, "  workers: 2\n", "  records:\n    kind: packed\n    path: cache/rec.ldcache\n");
    harness_start(h);
    c = harness_connect(h, 10000, "itest_cache");
    assert_int_equal(read_epoch_checked(c, 7), N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Reads one epoch and checks every sample: file `changed` must have its new content
 * (every byte `byte`), every other file its generated content. Fails on a single byte
 * of the old version of `changed`. */
static void read_epoch_expect_change(lc_client *c, uint64_t seed, uint64_t changed, uint8_t byte)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.seed = seed;
    o.epochs = 1;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    uint64_t n = 0, seen_new = 0;
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field data;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++, n++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            if (harness_file_matches(changed, buf, FILE_SIZE, FILE_SIZE, false))
                fail_msg("batch %llu: the old content of file %llu was served after it changed",
                         (unsigned long long)lc_batch_index(b), (unsigned long long)changed);
            bool all_new = true;
            for (int k = 0; k < FILE_SIZE && all_new; k++)
                all_new = buf[k] == byte;
            seen_new += all_new;
        }
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(n, N_FILES);
    assert_int_equal(seen_new, 1);
    lc_stream_close(s);
}

/* Rewrites file i with FILE_SIZE bytes of `byte`; restores its times when asked (the
 * change the stat fingerprint cannot see). */
static void rewrite_same_size(struct harness *h, uint64_t i, uint8_t byte, bool keep_times)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/rec/class_%03llu/%07llu.bin", h->dir, (unsigned long long)(i % N_CLASSES),
             (unsigned long long)i);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    uint8_t buf[FILE_SIZE];
    memset(buf, byte, sizeof buf);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, buf, sizeof buf, 0), FILE_SIZE);
    close(fd);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (keep_times)
        assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
}

static void start_cache_cfg(struct harness *h, const char *cache_yaml)
{
    char ds[512], dir[200];
    snprintf(ds, sizeof ds, "  records:\n    kind: files\n    path: rec\n    cache: %s\n", cache_yaml);
    snprintf(dir, sizeof dir, "%s/cache", h->dir);
    mkdir(dir, 0755);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
}

/* A same-size rewrite is never served from the old cache by a stream opened after it:
 * with the stat fingerprint (the mtime moved) and with the content fingerprint (the
 * mtime put back). Rewritten again and again, the cache follows. */
static void test_stale_never_served(void **state)
{
    struct harness *h = *state;
    static const char *const modes[] = {"{path: cache/rec.ldcache}",
                                        "{path: cache/rec.ldcache, fingerprint: content}"};
    for (int m = 0; m < 2; m++) {
        start_cache_cfg(h, modes[m]);
        build_now(h);
        lc_client *c = harness_connect(h, 10000, "itest_cache");
        read_until_hits(c, 1, N_FILES); /* served from the cache */
        for (uint8_t round = 0; round < 3; round++) {
            uint64_t changed = 5 + round * 7;
            rewrite_same_size(h, changed, (uint8_t)(0xe0 + round), m == 1);
            read_epoch_expect_change(c, 10 + round, changed, (uint8_t)(0xe0 + round));
            read_epoch_expect_change(c, 20 + round, changed, (uint8_t)(0xe0 + round));
            /* Put it back for the next round's checks of the other files. */
            cJSON *j = wait_state(c, "ready");
            cJSON_Delete(j);
            char path[4300];
            snprintf(path, sizeof path, "%s/rec/class_%03llu/%07llu.bin", h->dir,
                     (unsigned long long)(changed % N_CLASSES), (unsigned long long)changed);
            uint8_t buf[FILE_SIZE];
            for (int k = 0; k < FILE_SIZE; k++)
                buf[k] = harness_file_byte(changed, (uint64_t)k);
            harness_write_file(h, path + strlen(h->dir) + 1, buf, sizeof buf);
        }
        lc_client_close(c);
        harness_stop_clean(h);
        char cachefile[300];
        snprintf(cachefile, sizeof cachefile, "%s/cache/rec.ldcache", h->dir);
        unlink(cachefile);
    }
}

/* A data byte flipped after the build, no verify run: the stream still gets the right
 * bytes (read from the files), the cache is set aside and rebuilt. */
static void test_corrupt_sample_checked_when_served(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    build_now(h);
    for (long k = 0; k < 40; k++)
        flip_byte(h, 4096 + k * 256 + 9); /* a byte in each of the first 40 samples */
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    for (int i = 0; i < 20 && !bad_copy_exists(h); i++)
        assert_int_equal(read_epoch_checked(c, (uint64_t)i), N_FILES);
    assert_true(bad_copy_exists(h));
    cJSON *j = wait_state(c, "ready");
    cJSON_Delete(j);
    read_until_hits(c, 50, N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "checksum mismatch (data corrupt) (found while serving)"));
    free(log);

    /* A `packed` file has no source to fall back on: the bad sample follows on_error
     * (replace, for packed), never served, and the log names the checksum. */
    harness_write_config(h, "  workers: 2\n", "  records:\n    kind: packed\n    path: cache/rec.ldcache\n");
    flip_byte(h, 4096 + 9);
    harness_start(h);
    c = harness_connect(h, 10000, "itest_cache");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 400;
    o.epochs = 1;
    o.shuffle = 0;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    lc_field data;
    assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
    for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
        const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
        bool known = false;
        for (uint64_t i = 0; i < N_FILES && !known; i++)
            known = harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false);
        if (!known)
            fail_msg("row %u of the packed batch holds corrupt bytes", row);
    }
    lc_batch_release(b);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
    log = harness_log(h);
    assert_non_null(strstr(log, "sample 0 (offset 4096, 200 bytes): checksum mismatch"));
    free(log);
}

/* mode off: cache requests say so; temporary files of a dead builder are removed at
 * start, those of a live process kept. */
static void test_mode_off_and_sweep_at_start(void **state)
{
    struct harness *h = *state;
    start_cache_cfg(h, "{path: cache/rec.ldcache, mode: off}");
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    char *text = NULL;
    assert_true(lc_request_json(c, "{\"op\":\"cache_build\",\"dataset\":\"records\"}", &text) < 0);
    assert_non_null(strstr(lc_client_error(c), "cache.mode: off"));
    cJSON *j = cache_call(c, "cache_info", NULL);
    assert_string_equal(state_of(j), "off");
    cJSON_Delete(j);
    assert_int_equal(read_epoch_checked(c, 1), N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);

    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0)
        _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char dead_tmp[300], live_tmp[300];
    snprintf(dead_tmp, sizeof dead_tmp, "cache/rec.ldcache.tmp.%d.00112233445566ff", (int)dead);
    snprintf(live_tmp, sizeof live_tmp, "cache/rec.ldcache.tmp.%d.00112233445566ff", (int)getpid());
    harness_write_file(h, dead_tmp, "x", 1);
    harness_write_file(h, live_tmp, "x", 1);
    start_cache_cfg(h, "{path: cache/rec.ldcache}");
    c = harness_connect(h, 10000, "itest_cache");
    j = wait_state(c, "absent");
    cJSON_Delete(j);
    char path[400];
    snprintf(path, sizeof path, "%s/%s", h->dir, dead_tmp);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/%s", h->dir, live_tmp);
    assert_int_equal(access(path, F_OK), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Mappings of deleted cache files the daemon holds (superseded copies kept on disk). */
static int deleted_cache_maps(pid_t pid)
{
    char path[64], line[4600];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "rec.ldcache") && strstr(line, "(deleted)"))
            n++;
    fclose(f);
    return n;
}

/* Far more than 16 rebuilds in one run (each change of the source replaces the
 * cache): every one attaches, and no superseded copy stays mapped once its readers
 * are gone. */
static void test_many_rebuilds_reclaimed(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    build_now(h);
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    char path[4300];
    snprintf(path, sizeof path, "%s/rec/class_001/0000005.bin", h->dir);
    for (int round = 0; round < 20; round++) {
        struct timespec times[2] = {{.tv_sec = 1000000000 + round}, {.tv_sec = 1000000000 + round}};
        assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
        cJSON *j = cache_call(c, "cache_info", NULL);
        double before = num(j, "attached", NULL);
        cJSON_Delete(j);
        assert_int_equal(read_epoch_checked(c, (uint64_t)round), N_FILES);
        for (int i = 0;; i++) {
            j = cache_call(c, "cache_info", NULL);
            bool done = strcmp(state_of(j), "ready") == 0 && num(j, "attached", NULL) > before;
            if (strcmp(state_of(j), "failed") == 0)
                fail_msg("round %d: %s", round, cJSON_PrintUnformatted(j));
            cJSON_Delete(j);
            if (done)
                break;
            assert_true(i < 400);
            usleep(20000);
        }
    }
    cJSON *j = cache_call(c, "cache_info", NULL);
    assert_true(num(j, "attached", NULL) >= 21);
    assert_int_equal((int)num(j, "mapped", NULL), 1);
    cJSON_Delete(j);
    assert_int_equal(deleted_cache_maps(h->pid), 0);
    read_until_hits(c, 100, N_FILES);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Reads `epochs` epochs of one stream; every sample must be file i for some present[i]
 * (i < max), each exactly once per epoch. Returns the samples per epoch. */
static uint64_t read_present(lc_client *c, uint64_t seed, uint64_t epochs, const bool *present, uint64_t max)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.seed = seed;
    o.epochs = epochs;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    uint64_t *seen = calloc(max, sizeof *seen), n = 0;
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++, n++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            int64_t lab = ((const int64_t *)label.data)[row];
            uint64_t i = (uint64_t)lab;
            while (i < max && !harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false))
                i += N_CLASSES;
            if (i >= max || !present[i])
                fail_msg("a sample with label %lld is no present file", (long long)lab);
            seen[i]++;
        }
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    for (uint64_t i = 0; i < max; i++)
        if (seen[i] != (present[i] ? epochs : 0))
            fail_msg("file %llu served %llu times in %llu epochs", (unsigned long long)i,
                     (unsigned long long)seen[i], (unsigned long long)epochs);
    free(seen);
    lc_stream_close(s);
    return n / epochs;
}

/* A file added to the folder while the daemon runs is served by the next stream (and
 * one removed is not), from the files and then from the rebuilt cache; a stream opened
 * before the change reads its whole epoch of the old list. */
static void test_files_added_and_removed(void **state)
{
    struct harness *h = *state;
    enum { MAX = N_FILES + 2 };
    bool present[MAX];
    for (int i = 0; i < MAX; i++)
        present[i] = i < N_FILES;
    start_with_cache(h, "auto");
    build_now(h);
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    lc_client *c_old = harness_connect(h, 10000, "itest_cache-old");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.epochs = 1;
    lc_stream *old = NULL;
    assert_int_equal(lc_stream_open(c_old, "records", &o, &old), 0);
    lc_batch *b;
    assert_int_equal(lc_stream_next(old, 10000, &b), 0);
    uint64_t old_n = lc_batch_rows(b);
    lc_batch_release(b);

    uint8_t buf[FILE_SIZE];
    for (int k = 0; k < FILE_SIZE; k++)
        buf[k] = harness_file_byte(N_FILES + 1, (uint64_t)k);
    char rel[64];
    snprintf(rel, sizeof rel, "rec/class_%03d/%07d.bin", (N_FILES + 1) % N_CLASSES, N_FILES + 1);
    harness_write_file(h, rel, buf, sizeof buf);
    present[N_FILES + 1] = true;
    assert_int_equal(read_present(c, 1, 1, present, MAX), N_FILES + 1);

    char path[4300];
    snprintf(path, sizeof path, "%s/rec/class_003/0000007.bin", h->dir);
    assert_int_equal(unlink(path), 0);
    present[7] = false;
    assert_int_equal(read_present(c, 2, 1, present, MAX), N_FILES);

    /* The stream opened before both changes reads its old list to the end. */
    int r;
    while ((r = lc_stream_next(old, 10000, &b)) == 0) {
        old_n += lc_batch_rows(b);
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(old_n, N_FILES);
    lc_stream_close(old);
    lc_client_close(c_old);

    /* The cache is rebuilt for the new list and serves it. Until the keeper has seen the
     * removal, the cache built for the 401 files may still answer "ready": wait for the one
     * built for the list as it is now. */
    cJSON *j = NULL;
    for (int i = 0; i < 400; i++) {
        j = wait_state(c, "ready");
        if ((int)num(j, "file", "count") == N_FILES)
            break;
        cJSON_Delete(j);
        j = NULL;
        usleep(50000);
    }
    assert_non_null(j);
    assert_int_equal((int)num(j, "file", "count"), N_FILES);
    double hits = num(j, "hits", NULL), now = hits;
    cJSON_Delete(j);
    /* A new stream reads the files until a check started after its open has passed (a
     * stat per file): three epochs of 400 samples can end first on a loaded machine, so
     * streams are opened until one is served from the cache, each epoch checked. */
    for (int i = 0; i < 200 && now <= hits; i++) {
        assert_int_equal(read_present(c, 3 + i, 3, present, MAX), N_FILES);
        j = cache_call(c, "cache_info", NULL);
        now = num(j, "hits", NULL);
        cJSON_Delete(j);
    }
    assert_true(now > hits);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "the folder changed: 401 samples now (were 400)"));
    free(log);
}

/* A stream through the hand-off reads on while the source changes and the cache is
 * rebuilt and replaced under it: each of its epochs serves every file once with its
 * bytes, it goes on from the new cache, and the replaced cache is unmapped once its
 * last batch is back (its workers give their references back to the loop). */
static void test_replaced_under_a_handoff_stream(void **state)
{
    struct harness *h = *state;
    start_with_cache(h, "auto");
    build_now(h);
    lc_client *c = harness_connect(h, 10000, "itest_cache");
    lc_client *other = harness_connect(h, 10000, "itest_cache");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.seed = 3;
    o.epochs = 0;
    o.handoff = LC_HANDOFF_SHM;
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        fail_msg("open: %s", lc_client_error(c));
    char *seen = calloc(N_FILES, 1), path[4300];
    uint64_t epoch = 0, n = 0, epochs_done = 0;
    double attached0 = -1, hits_at = -1;
    snprintf(path, sizeof path, "%s/rec/class_001/0000005.bin", h->dir);
    for (int phase = 0; phase < 3; n++) {
        lc_batch *b;
        if (lc_stream_next(s, 10000, &b) < 0)
            fail_msg("next: %s", lc_client_error(c));
        if (lc_batch_epoch(b) != epoch) {
            for (uint64_t i = 0; i < N_FILES; i++)
                if (!seen[i])
                    fail_msg("epoch %llu: file %llu not served", (unsigned long long)epoch, (unsigned long long)i);
            memset(seen, 0, N_FILES);
            epoch = lc_batch_epoch(b);
            epochs_done++;
        }
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            uint64_t i = (uint64_t)((const int64_t *)label.data)[row];
            while (i < N_FILES && !harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false))
                i += N_CLASSES;
            if (i >= N_FILES || seen[i]++)
                fail_msg("epoch %llu: a sample is no file, or one served twice", (unsigned long long)epoch);
        }
        lc_batch_release(b);
        if (n % 4)
            continue;
        cJSON *j = cache_call(other, "cache_info", NULL);
        double hits = num(j, "hits", NULL), attached = num(j, "attached", NULL);
        bool ready = strcmp(state_of(j), "ready") == 0;
        cJSON_Delete(j);
        if (phase == 0 && hits >= N_FILES) {
            /* Served from the cache: change the source; another stream's open has the
             * change found and the cache rebuilt while this one reads on. */
            struct timespec times[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
            assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
            attached0 = attached;
            assert_int_equal(read_epoch_checked(other, 11), N_FILES);
            phase = 1;
        } else if (phase == 1 && ready && attached > attached0) {
            hits_at = hits;
            phase = 2;
        } else if (phase == 2 && hits >= hits_at + 2 * N_FILES && epochs_done >= 3) {
            phase = 3; /* read from the new cache, over more than one epoch */
        }
        assert_true(n < 100000);
    }
    free(seen);
    lc_stream_close(s);
    /* The close is the connection's to finish: wait for the old mapping to go. */
    for (int i = 0;; i++) {
        cJSON *j = cache_call(other, "cache_info", NULL);
        bool one = (int)num(j, "mapped", NULL) == 1;
        cJSON_Delete(j);
        if (one && deleted_cache_maps(h->pid) == 0)
            break;
        assert_true(i < 400);
        usleep(20000);
    }
    lc_client_close(c);
    lc_client_close(other);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_build_serve_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption_is_never_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebuild_mode_and_shared_build, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_cache_dir_and_packed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_never_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_sample_checked_when_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mode_off_and_sweep_at_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_rebuilds_reclaimed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_added_and_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replaced_under_a_handoff_stream, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
