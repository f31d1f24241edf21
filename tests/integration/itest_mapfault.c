/* itest_mapfault — files the daemon maps, cut short under a reading stream.
 *
 * A `token_windows` corpus, a `packed` file and a dataset's cache file are mapped; a
 * page past a new, shorter end raises SIGBUS when touched, which used to kill the
 * daemon and every client with it. Now only the stream that read the shrunk file is
 * affected: a token corpus or a packed file ends that stream with a clear error, a
 * cache is dropped (set aside, served from the source, rebuilt) without the stream
 * noticing, and a stream on another dataset keeps going throughout. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 300
#define FILE_SIZE 1000
#define N_CLASSES 3
#define N_TOKENS 400000
#define VOCAB 50000

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    harness_gen_tokens(h, "tok.bin", N_TOKENS, 2, VOCAB);
    char dir[200];
    snprintf(dir, sizeof dir, "%s/cache", h->dir);
    mkdir(dir, 0755);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static lc_stream *open_stream(lc_client *c, const char *ds, uint32_t batch)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = batch;
    o.seed = 3;
    o.epochs = 0; /* unbounded */
    lc_stream *s = NULL;
    if (lc_stream_open(c, ds, &o, &s) < 0)
        fail_msg("open %s: %s", ds, lc_client_error(c));
    return s;
}

/* Reads n batches of `records`, each sample checked against its file. */
static void read_records(lc_client *c, lc_stream *s, int n)
{
    for (int k = 0; k < n; k++) {
        lc_batch *b;
        if (lc_stream_next(s, 10000, &b) < 0)
            fail_msg("records: %s", lc_client_error(c));
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            const uint8_t *buf = (const uint8_t *)data.data + (size_t)row * FILE_SIZE;
            int64_t lab = ((const int64_t *)label.data)[row];
            bool found = false;
            for (uint64_t i = (uint64_t)lab; i < N_FILES && !found; i += N_CLASSES)
                found = harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false);
            if (!found)
                fail_msg("records: a sample with label %lld matches no file", (long long)lab);
        }
        lc_batch_release(b);
    }
}

/* Reads `s` until it fails (20 s at most); returns the error message (malloc'd). */
static char *read_until_error(lc_client *c, lc_stream *s, lc_client *other_c, lc_stream *other)
{
    time_t start = time(NULL);
    for (;;) {
        lc_batch *b;
        int r = lc_stream_next(s, 10000, &b);
        if (r < 0)
            return strdup(lc_client_error(c));
        lc_batch_release(b);
        if (other)
            read_records(other_c, other, 1); /* the other dataset is served meanwhile */
        if (time(NULL) - start > 20)
            fail_msg("the stream never noticed the shrunk file");
    }
}

static void test_tokens_and_packed_shrunk(void **state)
{
    struct harness *h = *state;
    char path[400];
    /* Phase 1: a token corpus overwritten in place by a shorter one. */
    harness_write_config(h, "  workers: 2\n",
                         "  tokens:\n    kind: token_windows\n    path: tok.bin\n    context: 255\n"
                         "  records:\n    kind: files\n    path: rec\n    cache: {path: cache/rec.ldcache}\n");
    harness_start(h);
    lc_client *c1 = harness_connect(h, 10000, "mapfault-tokens");
    lc_client *c2 = harness_connect(h, 10000, "mapfault-records");
    lc_stream *tok = open_stream(c1, "tokens", 16);
    lc_stream *rec = open_stream(c2, "records", 16);
    lc_batch *b;
    assert_int_equal(lc_stream_next(tok, 10000, &b), 0);
    lc_batch_release(b);
    read_records(c2, rec, 2);
    snprintf(path, sizeof path, "%s/tok.bin", h->dir);
    assert_int_equal(truncate(path, 8192), 0);
    char *msg = read_until_error(c1, tok, c2, rec);
    if (!strstr(msg, "shrank while being served") || !strstr(msg, "tok.bin"))
        fail_msg("unclear error: %s", msg);
    free(msg);
    read_records(c2, rec, 40); /* still served, through a cache rebuild or two */
    lc_stream_close(tok);
    lc_stream_close(rec);
    /* The records cache is built by now: keep a copy to ship as a packed file. */
    cJSON *j = NULL;
    for (int i = 0; i < 400; i++) {
        char *text = NULL;
        assert_int_equal(lc_request_json(c2, "{\"op\":\"cache_info\",\"dataset\":\"records\"}", &text), 0);
        j = cJSON_Parse(text);
        lc_free(text);
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "state")), "ready") == 0)
            break;
        cJSON_Delete(j);
        j = NULL;
        usleep(50000);
    }
    assert_non_null(j);
    cJSON_Delete(j);
    lc_client_close(c1);
    lc_client_close(c2);
    harness_stop_clean(h);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp %s/cache/rec.ldcache %s/pk.ldcache", h->dir, h->dir);
    assert_int_equal(system(cmd), 0);

    /* Phase 2: a packed file truncated under its stream; the files dataset goes on. */
    harness_gen_tokens(h, "tok.bin", N_TOKENS, 2, VOCAB);
    harness_write_config(h, "  workers: 2\n",
                         "  packed:\n    kind: packed\n    path: pk.ldcache\n"
                         "  records:\n    kind: files\n    path: rec\n");
    harness_start(h);
    c1 = harness_connect(h, 10000, "mapfault-packed");
    c2 = harness_connect(h, 10000, "mapfault-records");
    lc_stream *pk = open_stream(c1, "packed", 16);
    rec = open_stream(c2, "records", 16);
    assert_int_equal(lc_stream_next(pk, 10000, &b), 0);
    lc_batch_release(b);
    snprintf(path, sizeof path, "%s/pk.ldcache", h->dir);
    assert_int_equal(truncate(path, 3 * 4096), 0);
    msg = read_until_error(c1, pk, c2, rec);
    if (!strstr(msg, "truncated while being read") || !strstr(msg, "pk.ldcache"))
        fail_msg("unclear error: %s", msg);
    free(msg);
    read_records(c2, rec, 20);
    lc_stream_close(pk);
    lc_stream_close(rec);
    lc_client_close(c1);
    lc_client_close(c2);
    harness_stop_clean(h); /* alive, and a clean exit */
}

/* A dataset's cache truncated while a stream reads from it: the stream never sees it
 * (the files are read instead), the cache is set aside and rebuilt. */
static void test_cache_truncated_under_stream(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n",
                         "  records:\n    kind: files\n    path: rec\n    cache: {path: cache/rec.ldcache}\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "mapfault-cache");
    lc_stream *rec = open_stream(c, "records", 16);
    char path[400], bad[420];
    snprintf(path, sizeof path, "%s/cache/rec.ldcache", h->dir);
    snprintf(bad, sizeof bad, "%s.bad", path);
    /* Until the cache serves (built, and checked for this stream). */
    for (int i = 0;; i++) {
        read_records(c, rec, 1);
        char *text = NULL;
        assert_int_equal(lc_request_json(c, "{\"op\":\"cache_info\",\"dataset\":\"records\"}", &text), 0);
        cJSON *j = cJSON_Parse(text);
        lc_free(text);
        double hits = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "hits"));
        cJSON_Delete(j);
        if (hits > 64)
            break;
        assert_true(i < 2000);
    }
    assert_int_equal(truncate(path, 2 * 4096), 0);
    for (int i = 0; i < 2000 && access(bad, F_OK) != 0; i++)
        read_records(c, rec, 1);
    assert_int_equal(access(bad, F_OK), 0);
    read_records(c, rec, 40);
    lc_stream_close(rec);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "the file was truncated (found while serving)"));
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tokens_and_packed_shrunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_truncated_under_stream, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
