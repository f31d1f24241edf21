/* itest_daemon — the daemon's contracts, tested against a real loaderd with the real
 * client: determinism across seeds and epochs, exact cover across ranks, resume, two
 * clients at once, a trainer SIGKILLed mid-epoch, malformed frames from one client while
 * another keeps reading, a missing sample, the memory budget and /dev/shm limits, a
 * second daemon on the same socket, a bad config, a socket that cannot be bound, and a
 * shutdown that leaves nothing in /dev/shm. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 600
#define FILE_SIZE 128
#define N_CLASSES 6
#define N_TOKENS 40000
#define CONTEXT 64

static const char datasets_yaml[] = "  records:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "    on_error: fail\n"
                                    "  replacing:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "  tokens:\n"
                                    "    kind: token_windows\n"
                                    "    path: tok.bin\n"
                                    "    dtype: uint16\n"
                                    "    context: 64\n";

static int setup_daemon(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    harness_gen_tokens(h, "tok.bin", N_TOKENS, 2, 50257);
    harness_write_config(h, "  workers: 2\n  memory_budget: 64MiB\n  max_frame: 4096\n", datasets_yaml);
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown_daemon(void **state)
{
    harness_free(*state);
    return 0;
}

static lc_stream *open_ok(lc_client *c, const char *ds, const lc_stream_options *o)
{
    lc_stream *s = NULL;
    int r = lc_stream_open(c, ds, o, &s);
    if (r < 0)
        fail_msg("lc_stream_open(%s): %s: %s", ds, lc_strerror(r), lc_client_error(c));
    return s;
}

/* Reads `batches` batches and returns the sample order as file indices (recovered from
 * the bytes: file i's first byte pattern is unique enough with its label, so we match
 * every row against the known content). For records only. */
static void read_order(lc_stream *s, uint64_t batches, int64_t *order, uint64_t *ret_n)
{
    uint64_t n = 0;
    for (uint64_t k = 0; k < batches; k++) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 10000, &b);
        assert_int_equal(r, 0);
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        const uint8_t *bytes = data.data;
        const int64_t *labels = label.data;
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            const uint8_t *buf = bytes + (size_t)row * FILE_SIZE;
            int64_t found = -1;
            /* Candidates share the label: i % N_CLASSES == label. */
            for (uint64_t i = (uint64_t)labels[row]; i < N_FILES; i += N_CLASSES)
                if (harness_file_matches(i, buf, FILE_SIZE, FILE_SIZE, false)) {
                    found = (int64_t)i;
                    break;
                }
            if (found < 0)
                fail_msg("batch %llu row %u matches no file with label %lld", (unsigned long long)k, row,
                         (long long)labels[row]);
            order[n++] = found;
        }
        assert_int_equal(lc_batch_release(b), 0);
    }
    *ret_n = n;
}

static void test_seeds_and_epochs(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.epochs = 2;
    o.seed = 7;
    uint64_t n;
    int64_t *a = calloc(2 * N_FILES, sizeof *a), *b = calloc(2 * N_FILES, sizeof *b);
    int64_t *d = calloc(N_FILES, sizeof *d);

    lc_stream *s = open_ok(c, "records", &o);
    uint64_t bpe = lc_stream_batches_per_epoch(s);
    assert_int_equal(bpe, (N_FILES + 31) / 32);
    read_order(s, 2 * bpe, a, &n);
    assert_int_equal(n, 2 * N_FILES);
    /* After the last epoch: end of stream, a clear error and nothing else. */
    lc_batch *end = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &end), LC_EEND);
    assert_null(end);
    /* Every release reached the daemon and was accepted: nothing is leased any more. */
    harness_flush_releases(c);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(lc_stream_close(s), 0);

    /* Each epoch is a permutation: every file exactly once. */
    for (int e = 0; e < 2; e++) {
        char *seen = calloc(N_FILES, 1);
        for (uint64_t i = 0; i < N_FILES; i++) {
            int64_t f = a[e * N_FILES + i];
            assert_int_equal(seen[f], 0);
            seen[f] = 1;
        }
        free(seen);
    }
    /* Epoch 1 is ordered differently from epoch 0. */
    assert_true(memcmp(a, a + N_FILES, N_FILES * sizeof *a) != 0);

    /* Same seed: the same two epochs, bit for bit. */
    s = open_ok(c, "records", &o);
    read_order(s, 2 * bpe, b, &n);
    lc_stream_close(s);
    assert_memory_equal(a, b, 2 * N_FILES * sizeof *a);

    /* Another seed: another order. */
    o.seed = 8;
    o.epochs = 1;
    s = open_ok(c, "records", &o);
    read_order(s, bpe, d, &n);
    lc_stream_close(s);
    assert_true(memcmp(a, d, N_FILES * sizeof *a) != 0);

    /* Starting at epoch 1 gives what the two-epoch stream gave second. */
    o.seed = 7;
    o.epoch = 1;
    s = open_ok(c, "records", &o);
    read_order(s, bpe, d, &n);
    lc_stream_close(s);
    assert_memory_equal(a + N_FILES, d, N_FILES * sizeof *a);

    /* Resume at batch k: the tail of the full epoch. */
    o.epoch = 0;
    o.start_batch = 5;
    s = open_ok(c, "records", &o);
    read_order(s, bpe - 5, d, &n);
    assert_int_equal(n, N_FILES - 5 * 32);
    lc_stream_close(s);
    assert_memory_equal(a + 5 * 32, d, n * sizeof *a);

    /* shuffle off: dataset order. */
    lc_stream_options_init(&o);
    o.batch_size = 50;
    o.shuffle = 0;
    o.epochs = 1;
    s = open_ok(c, "records", &o);
    read_order(s, N_FILES / 50, d, &n);
    lc_stream_close(s);
    /* Dataset order is sorted path order: class_000's files, then class_001's, ... */
    uint64_t pos = 0;
    for (uint64_t cls = 0; cls < N_CLASSES; cls++)
        for (uint64_t i = cls; i < N_FILES; i += N_CLASSES)
            assert_int_equal(d[pos++], (int64_t)i);

    free(a);
    free(b);
    free(d);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_ranks_cover_epoch(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    char *seen = calloc(N_FILES, 1);
    int64_t *order = calloc(N_FILES, sizeof *order);
    uint64_t batches = 0;
    for (int rank = 0; rank < 3; rank++) {
        lc_stream_options o;
        lc_stream_options_init(&o);
        o.batch_size = 16;
        o.seed = 3;
        o.rank = rank;
        o.world_size = 3;
        o.epochs = 1;
        lc_stream *s = open_ok(c, "records", &o);
        if (rank == 0)
            batches = lc_stream_batches_per_epoch(s);
        assert_int_equal(lc_stream_batches_per_epoch(s), batches); /* equal on every rank */
        assert_int_equal(lc_stream_samples_per_epoch(s), N_FILES / 3);
        uint64_t n;
        read_order(s, batches, order, &n);
        assert_int_equal(n, N_FILES / 3);
        for (uint64_t i = 0; i < n; i++) {
            assert_int_equal(seen[order[i]], 0); /* disjoint */
            seen[order[i]] = 1;
        }
        lc_stream_close(s);
    }
    for (int i = 0; i < N_FILES; i++)
        assert_int_equal(seen[i], 1); /* the union is the epoch */
    free(seen);
    free(order);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_two_clients_interleaved(void **state)
{
    struct harness *h = *state;
    lc_client *c1 = harness_connect(h, 10000, "itest_daemon"), *c2 = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.epochs = 1;
    o.seed = 11;
    lc_stream *s1 = open_ok(c1, "records", &o);
    o.batch_size = 8;
    lc_stream *s2 = open_ok(c2, "tokens", &o);
    uint64_t windows = (N_TOKENS - (CONTEXT + 1)) / CONTEXT + 1;
    uint64_t got1 = 0, got2 = 0;
    int done1 = 0, done2 = 0;
    while (!done1 || !done2) {
        lc_batch *b;
        if (!done1) {
            int r = lc_stream_next(s1, 10000, &b);
            if (r == LC_EEND) {
                done1 = 1;
            } else {
                assert_int_equal(r, 0);
                got1 += lc_batch_rows(b);
                lc_batch_release(b);
            }
        }
        if (!done2) {
            int r = lc_stream_next(s2, 10000, &b);
            if (r == LC_EEND) {
                done2 = 1;
            } else {
                assert_int_equal(r, 0);
                lc_field f;
                assert_int_equal(lc_batch_field_by_name(b, "tokens", &f), 0);
                assert_int_equal(f.dtype, LC_DTYPE_UINT16);
                assert_int_equal(f.ndim, 2);
                assert_int_equal(f.shape[1], CONTEXT + 1);
                /* Each window is a run of the token file starting at a multiple of the
                 * stride: find which one by its first token and check the rest. */
                const uint16_t *t = f.data;
                for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
                    const uint16_t *w = t + (size_t)row * (CONTEXT + 1);
                    int ok = 0;
                    for (uint64_t k = 0; k < windows && !ok; k++) {
                        if (w[0] != harness_token(k * CONTEXT, 50257))
                            continue;
                        ok = 1;
                        for (int j = 0; j <= CONTEXT; j++)
                            if (w[j] != harness_token(k * CONTEXT + (uint64_t)j, 50257))
                                ok = 0;
                    }
                    assert_true(ok);
                }
                got2 += lc_batch_rows(b);
                lc_batch_release(b);
            }
        }
    }
    assert_int_equal(got1, N_FILES);
    assert_int_equal(got2, windows);
    lc_client_close(c1);
    lc_client_close(c2);
    harness_stop_clean(h);
}

/* Reads the daemon's status with a fresh client. */
static cJSON *status(struct harness *h)
{
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &json), 0);
    cJSON *st = cJSON_Parse(json);
    assert_non_null(st);
    lc_free(json);
    lc_client_close(c);
    return st;
}

static int status_int(const cJSON *st, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItem(st, a);
    if (b)
        o = cJSON_GetObjectItem(o, b);
    assert_true(cJSON_IsNumber(o));
    return (int)o->valuedouble;
}

static void test_killed_trainer_leaks_nothing(void **state)
{
    struct harness *h = *state;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* The trainer: takes two batches, holds them, and is killed mid-epoch. */
        close(ready[0]);
        lc_client *c = NULL;
        char err[256];
        if (lc_connect(h->socket, 5000, "doomed", &c, err, sizeof err) < 0)
            _exit(1);
        lc_stream_options o;
        lc_stream_options_init(&o);
        o.batch_size = 16;
        lc_stream *s = NULL;
        lc_batch *b1, *b2;
        if (lc_stream_open(c, "records", &o, &s) < 0 || lc_stream_next(s, 5000, &b1) < 0 ||
            lc_stream_next(s, 5000, &b2) < 0)
            _exit(2);
        if (write(ready[1], "x", 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char x;
    assert_int_equal(read(ready[0], &x, 1), 1);
    close(ready[0]);

    cJSON *st = status(h);
    assert_int_equal(status_int(st, "streams", NULL), 1);
    /* The two it holds, and what the client asked for ahead (up to 2 more); through the
     * hand-off, every batch made ready is leased at once. */
    int held = status_int(st, "slots", "leased");
    assert_true(held >= 2 && (held <= 4 || harness_handoff_default()));
    cJSON_Delete(st);

    kill(child, SIGKILL);
    int wst;
    waitpid(child, &wst, 0);
    /* The daemon notices the closed connection and tears the stream down. */
    int streams = -1, leased = -1;
    for (int i = 0; i < 100; i++) {
        st = status(h);
        streams = status_int(st, "streams", NULL);
        leased = status_int(st, "slots", "leased");
        int used = status_int(st, "memory_used", NULL);
        cJSON_Delete(st);
        if (streams == 0 && leased == 0 && used == 0)
            break;
        usleep(20000);
    }
    assert_int_equal(streams, 0);
    assert_int_equal(leased, 0);
    assert_int_equal(harness_shm_count(h->pid, NULL, 0), 0);
    harness_stop_clean(h);
}

/* ---- raw frames ------------------------------------------------------------------ */

static int raw_connect(struct harness *h)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", h->socket);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void raw_send(int fd, const void *payload, uint32_t len)
{
    uint8_t hdr[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    assert_int_equal(send(fd, hdr, 4, MSG_NOSIGNAL), 4);
    if (len)
        assert_int_equal(send(fd, payload, len, MSG_NOSIGNAL), (ssize_t)len);
}

static void raw_send_str(int fd, const char *s)
{
    raw_send(fd, s, (uint32_t)strlen(s));
}

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
            return -1;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* The next reply, or NULL when the daemon closed the connection. */
static cJSON *raw_reply(int fd)
{
    uint8_t hdr[4];
    if (read_full(fd, hdr, 4) < 0)
        return NULL;
    uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    char *buf = calloc(1, len + 1);
    assert_int_equal(read_full(fd, buf, len), 0);
    cJSON *r = cJSON_Parse(buf);
    free(buf);
    assert_non_null(r);
    return r;
}

static void expect_error(int fd, const char *code, const char *needle)
{
    cJSON *r = raw_reply(fd);
    assert_non_null(r);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
    const cJSON *err = cJSON_GetObjectItem(r, "error");
    const char *got = cJSON_GetStringValue(cJSON_GetObjectItem(err, "code"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(err, "message"));
    if (!got || strcmp(got, code) != 0 || !msg || !strstr(msg, needle))
        fail_msg("expected error %s mentioning '%s', got %s: %s", code, needle, got ? got : "(none)",
                 msg ? msg : "(none)");
    cJSON_Delete(r);
}

static void expect_ok(int fd)
{
    cJSON *r = raw_reply(fd);
    assert_non_null(r);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
    cJSON_Delete(r);
}

static void test_malformed_frames(void **state)
{
    struct harness *h = *state;
    /* A well-behaved trainer reads throughout. */
    lc_client *good = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 8;
    o.epochs = 1;
    lc_stream *s = open_ok(good, "records", &o);
    uint64_t rows = 0;
    lc_batch *b;

    int fd = raw_connect(h);
    raw_send_str(fd, "{\"op\":\"status\",\"id\":1}");
    expect_error(fd, "hello_required", "first request must be hello");
    raw_send_str(fd, "{\"op\":\"hello\",\"id\":2,\"version\":99}");
    expect_error(fd, "version_mismatch", "version 99");
    raw_send_str(fd, "{\"op\":\"hello\",\"id\":3,\"version\":1}");
    expect_ok(fd);

    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    rows += lc_batch_rows(b);
    lc_batch_release(b);

    raw_send_str(fd, "{\"op\":\"status\",");
    expect_error(fd, "bad_message", "invalid JSON");
    raw_send_str(fd, "[1,2,3]");
    expect_error(fd, "bad_message", "object");
    raw_send(fd, "", 0);
    expect_error(fd, "bad_message", "");
    raw_send_str(fd, "{\"op\":\"fly\",\"id\":4}");
    expect_error(fd, "unknown_op", "'fly'");
    raw_send_str(fd, "{\"op\":\"open\",\"id\":5,\"dataset\":\"records\"}");
    expect_error(fd, "bad_field", "batch_size");
    raw_send_str(fd, "{\"op\":\"open\",\"id\":6,\"dataset\":\"records\",\"batch_size\":\"8\"}");
    expect_error(fd, "bad_field", "batch_size");
    raw_send_str(fd, "{\"op\":\"open\",\"id\":7,\"dataset\":\"nope\",\"batch_size\":8}");
    expect_error(fd, "no_such_dataset", "'nope'");
    raw_send_str(fd, "{\"op\":\"open\",\"id\":8,\"dataset\":\"records\",\"batch_size\":8,\"rank\":2,\"world_size\":2}");
    expect_error(fd, "invalid_argument", "rank 2");
    raw_send_str(fd, "{\"op\":\"next\",\"id\":9,\"stream\":12345}");
    expect_error(fd, "no_such_stream", "12345");
    raw_send_str(fd, "{\"op\":\"status\"}");
    expect_error(fd, "bad_field", "'id'");
    char deep[200];
    memset(deep, '[', sizeof deep);
    raw_send(fd, deep, sizeof deep);
    expect_error(fd, "bad_message", "nesting");

    /* Streams of another connection are not ours to touch. */
    char req[160];
    snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":10,\"stream\":%llu,\"slot\":0,\"generation\":1}",
             (unsigned long long)lc_stream_id(s));
    raw_send_str(fd, req);
    expect_error(fd, "no_such_stream", "not open on this connection");

    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    rows += lc_batch_rows(b);
    lc_batch_release(b);

    /* A frame over the limit (max_frame 4096): an error, then the connection closes. */
    uint8_t hdr[4] = {0, 1, 0, 0}; /* 65536 bytes announced */
    assert_int_equal(send(fd, hdr, 4, MSG_NOSIGNAL), 4);
    expect_error(fd, "frame_too_large", "4096");
    assert_null(raw_reply(fd)); /* closed */
    close(fd);

    /* The good client was not disturbed. */
    for (;;) {
        int r = lc_stream_next(s, 5000, &b);
        if (r == LC_EEND)
            break;
        assert_int_equal(r, 0);
        rows += lc_batch_rows(b);
        lc_batch_release(b);
    }
    assert_int_equal(rows, N_FILES);
    lc_client_close(good);
    harness_stop_clean(h);
}

static void test_release_errors_change_nothing(void **state)
{
    struct harness *h = *state;
    int fd = raw_connect(h);
    raw_send_str(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    expect_ok(fd);
    raw_send_str(fd, "{\"op\":\"open\",\"id\":2,\"dataset\":\"records\",\"batch_size\":4,\"prefetch\":1}");
    cJSON *r = raw_reply(fd);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
    int sid = (int)cJSON_GetObjectItem(r, "stream")->valuedouble;
    int slots = (int)cJSON_GetObjectItem(r, "slot_count")->valuedouble;
    cJSON_Delete(r);
    char req[200];
    snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":3,\"stream\":%d}", sid);
    raw_send_str(fd, req);
    r = raw_reply(fd);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
    int slot = (int)cJSON_GetObjectItem(r, "slot")->valuedouble;
    int gen = (int)cJSON_GetObjectItem(r, "generation")->valuedouble;
    cJSON_Delete(r);

    snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":4,\"stream\":%d,\"slot\":%d,\"generation\":%d}", sid,
             slot, gen + 1);
    raw_send_str(fd, req);
    expect_error(fd, "stale_generation", "generation");
    snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":5,\"stream\":%d,\"slot\":%d,\"generation\":1}", sid,
             slots);
    raw_send_str(fd, req);
    expect_error(fd, "invalid_argument", "out of range");
    snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":6,\"stream\":%d,\"slot\":%d,\"generation\":%d}", sid,
             (slot + 1) % slots, gen);
    raw_send_str(fd, req);
    expect_error(fd, "not_leased", "not leased (its state is "); /* a ring_state_name() */
    /* The real release still works: nothing was changed by the bad ones. */
    snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":7,\"stream\":%d,\"slot\":%d,\"generation\":%d}", sid,
             slot, gen);
    raw_send_str(fd, req);
    expect_ok(fd);
    raw_send_str(fd, req);
    expect_error(fd, "not_leased", "not leased");
    /* Pipelined requests are answered in order, even when the first one waits. */
    snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":8,\"stream\":%d}", sid);
    raw_send_str(fd, req);
    raw_send_str(fd, "{\"op\":\"status\",\"id\":9}");
    r = raw_reply(fd);
    assert_int_equal((int)cJSON_GetObjectItem(r, "id")->valuedouble, 8);
    cJSON_Delete(r);
    r = raw_reply(fd);
    assert_int_equal((int)cJSON_GetObjectItem(r, "id")->valuedouble, 9);
    cJSON_Delete(r);
    close(fd);
    harness_stop_clean(h);
}

/* A client may ask ahead: up to 8 next requests wait on a stream and are answered in
 * order as slots come back; a ninth is refused (in its turn) and changes nothing. */
static void test_nexts_asked_ahead(void **state)
{
    struct harness *h = *state;
    int fd = raw_connect(h);
    raw_send_str(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    expect_ok(fd);
    raw_send_str(fd, "{\"op\":\"open\",\"id\":2,\"dataset\":\"records\",\"batch_size\":4,\"prefetch\":1,"
                     "\"shuffle\":false}");
    cJSON *r = raw_reply(fd);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
    int sid = (int)cJSON_GetObjectItem(r, "stream")->valuedouble;
    int slots = (int)cJSON_GetObjectItem(r, "slot_count")->valuedouble;
    cJSON_Delete(r);
    char req[200];
    int held_slot[8], held_gen[8];
    /* Hold every slot: nothing can be ready after that. */
    for (int i = 0; i < slots; i++) {
        snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":%d,\"stream\":%d}", 10 + i, sid);
        raw_send_str(fd, req);
        r = raw_reply(fd);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
        held_slot[i] = (int)cJSON_GetObjectItem(r, "slot")->valuedouble;
        held_gen[i] = (int)cJSON_GetObjectItem(r, "generation")->valuedouble;
        cJSON_Delete(r);
    }
    /* Nine more: eight wait, the ninth is refused. Then give the slots back. */
    for (int i = 0; i < 9; i++) {
        snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":%d,\"stream\":%d}", 30 + i, sid);
        raw_send_str(fd, req);
    }
    for (int i = 0; i < slots; i++) {
        snprintf(req, sizeof req, "{\"op\":\"release\",\"id\":%d,\"stream\":%d,\"slot\":%d,\"generation\":%d}",
                 100 + i, sid, held_slot[i], held_gen[i]);
        raw_send_str(fd, req);
    }
    /* Replies come in request order: the eight waiting nexts (each released as soon as it
     * arrives, so the next one can be filled), then the refusal, then the releases. */
    for (int i = 0; i < 9; i++) {
        r = raw_reply(fd);
        if (!r)
            fail_msg("no reply to next %d (the stream has %d slots)", i, slots);
        assert_int_equal((int)cJSON_GetObjectItem(r, "id")->valuedouble, 30 + i);
        if (i < 8) {
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
            assert_int_equal((int)cJSON_GetObjectItem(r, "batch")->valuedouble, slots + i); /* in order */
            snprintf(req, sizeof req,
                     "{\"op\":\"release\",\"id\":%d,\"stream\":%d,\"slot\":%d,\"generation\":%d}", 200 + i,
                     sid, (int)cJSON_GetObjectItem(r, "slot")->valuedouble,
                     (int)cJSON_GetObjectItem(r, "generation")->valuedouble);
            raw_send_str(fd, req);
        } else {
            const cJSON *err = cJSON_GetObjectItem(r, "error");
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(err, "code")), "busy");
        }
        cJSON_Delete(r);
    }
    for (int i = 0; i < slots + 8; i++) {
        r = raw_reply(fd);
        assert_non_null(r);
        assert_int_equal((int)cJSON_GetObjectItem(r, "id")->valuedouble, i < slots ? 100 + i : 200 + i - slots);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
        cJSON_Delete(r);
    }
    close(fd);
    harness_stop_clean(h);
}

/* A client that keeps sending while its replies wait behind a next it never lets finish
 * (it holds every slot) is disconnected at a bound; the daemon stays small and serves others. */
static void test_unread_replies_are_bounded(void **state)
{
    struct harness *h = *state;
    int fd = raw_connect(h);
    raw_send_str(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    expect_ok(fd);
    raw_send_str(fd, "{\"op\":\"open\",\"id\":2,\"dataset\":\"records\",\"batch_size\":4,\"prefetch\":1}");
    cJSON *r = raw_reply(fd);
    int sid = (int)cJSON_GetObjectItem(r, "stream")->valuedouble;
    int slots = (int)cJSON_GetObjectItem(r, "slot_count")->valuedouble;
    cJSON_Delete(r);
    char req[160];
    for (int i = 0; i <= slots; i++) { /* every slot leased, then one next that waits */
        snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":%d,\"stream\":%d}", 10 + i, sid);
        raw_send_str(fd, req);
        if (i < slots)
            cJSON_Delete(raw_reply(fd));
    }
    const char *status = "{\"op\":\"status\",\"id\":99}";
    uint32_t len = (uint32_t)strlen(status);
    uint8_t frame[64] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    memcpy(frame + 4, status, len);
    int sent = 0;
    for (; sent < 20000; sent++) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 2000) != 1 || !(p.revents & POLLOUT) ||
            send(fd, frame, 4 + len, MSG_NOSIGNAL) != (ssize_t)(4 + len))
            break; /* the daemon stopped reading or hung up */
    }
    assert_true(sent > 4096);
    assert_null(raw_reply(fd)); /* disconnected; the waiting replies were never sent */
    close(fd);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "replies queued unread; disconnecting"));
    free(log);
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_missing_sample_is_reported(void **state)
{
    struct harness *h = *state;
    char path[4200];
    snprintf(path, sizeof path, "%s/rec/class_002/0000008.bin", h->dir);
    /* Emptied, not removed: a file removed from the folder leaves the list at the next
     * open (the folder is scanned again); one emptied is still listed and fails its read. */
    assert_int_equal(truncate(path, 0), 0);
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 25;
    o.shuffle = 0;
    o.epochs = 1;
    lc_stream *s = open_ok(c, "records", &o);
    lc_batch *b;
    /* File 8 is in class_002: dataset position 2 * 100 + 1 = 201, in batch 8. The
     * batches before it arrive whole; batch 8 is reported. */
    int r, delivered = 0;
    while ((r = lc_stream_next(s, 5000, &b)) == 0) {
        delivered++;
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_ESAMPLE);
    assert_int_equal(delivered, 8);
    assert_non_null(strstr(lc_client_error(c), "class_002/0000008.bin"));
    /* It stays failed, and says so again. */
    assert_int_equal(lc_stream_next(s, 5000, &b), LC_ESAMPLE);
    lc_stream_close(s);
    /* Other datasets and streams are served as before. */
    s = open_ok(c, "tokens", &o);
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    lc_batch_release(b);
    lc_stream_close(s);
    /* on_error: replace (the default): every batch is whole, the missing file's place
     * is taken by another sample, counted, and logged once. */
    for (int run = 0; run < 2; run++) {
        s = open_ok(c, "replacing", &o);
        uint64_t rows = 0;
        while ((r = lc_stream_next(s, 5000, &b)) == 0) {
            assert_int_equal(lc_batch_rows(b), 25);
            rows += lc_batch_rows(b);
            lc_batch_release(b);
        }
        assert_int_equal(r, LC_EEND);
        assert_int_equal(rows, N_FILES);
        lc_stream_close(s);
    }
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &json), 0);
    cJSON *st = cJSON_Parse(json);
    lc_free(json);
    assert_int_equal((int)cJSON_GetObjectItem(st, "replaced_samples")->valuedouble, 2);
    cJSON_Delete(st);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h), *p = log;
    int logged = 0;
    while ((p = strstr(p, "0000008.bin): expected 128 bytes, file has 0; another sample takes its place")) != NULL) {
        logged++;
        p++;
    }
    assert_int_equal(logged, 1);
    free(log);
}

static void test_budget_and_shm_limits(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 65536; /* prefetch + spare slots of 8.5 MiB: over the 64 MiB budget */
    o.prefetch = 16;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EBUDGET);
    assert_non_null(strstr(lc_client_error(c), "memory_budget"));
    /* Sizes as ld_format_bytes writes them. */
    if (!strstr(lc_client_error(c), " slots of 8.5 MiB for batch_size 65536) but only 64.0 MiB is left"))
        fail_msg("budget message: %s", lc_client_error(c));
    assert_null(s);
    /* Still serving. */
    o.batch_size = 4;
    s = open_ok(c, "records", &o);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);

    /* A ring larger than /dev/shm itself: refused at open, naming /dev/shm. */
    harness_gen_tokens(h, "big.bin", (1u << 20) + 1, 4, 1000);
    harness_write_config(h, "  memory_budget: 1TiB\n",
                         "  big:\n    kind: token_windows\n    path: big.bin\n    dtype: uint32\n"
                         "    context: 1048576\n");
    harness_start(h);
    c = harness_connect(h, 10000, "itest_daemon");
    lc_stream_options_init(&o);
    o.batch_size = 65536; /* 65536 windows of 4 MiB: 256 GiB per slot */
    s = NULL;
    int r = lc_stream_open(c, "big", &o, &s);
    assert_true(r == LC_EBUDGET || r == -28 /* no_space */);
    assert_non_null(strstr(lc_client_error(c), r == -28 ? "/dev/shm" : "memory_budget"));
    assert_int_equal(harness_shm_count(h->pid, NULL, 0), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_second_daemon_and_bad_config(void **state)
{
    struct harness *h = *state;
    /* A second daemon on the same socket refuses to start and leaves the first alone. */
    const char *const none[] = {NULL};
    pid_t first = h->pid;
    h->pid = 0;
    int st = harness_run_to_exit(h, none);
    assert_int_equal(st, 1);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "another process already serves"));
    free(log);
    h->pid = first;
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    lc_client_close(c);
    /* A daemon that died leaves a stale socket file: the next one replaces it. */
    kill(h->pid, SIGKILL);
    waitpid(h->pid, &st, 0);
    h->pid = 0;
    harness_start(h);
    c = harness_connect(h, 10000, "itest_daemon");
    lc_client_close(c);
    harness_stop_clean(h);

    /* A bad config: exit 1 with file:line:column. */
    harness_write_file(h, "loaderd.yaml", "server:\n  workerz: 2\ndatasets:\n  r:\n    kind: files\n    path: rec\n",
                       strlen("server:\n  workerz: 2\ndatasets:\n  r:\n    kind: files\n    path: rec\n"));
    st = harness_run_to_exit(h, none);
    assert_int_equal(st, 1);
    log = harness_log(h);
    assert_non_null(strstr(log, "loaderd.yaml:2:3: unknown key 'workerz'"));
    free(log);
    /* A dataset that cannot be opened: --check exits 1 naming it (the daemon itself
     * serves it as unavailable: itest_reload). */
    const char *const check[] = {"--check", NULL};
    harness_write_config(h, NULL, "  r:\n    kind: files\n    path: does-not-exist\n");
    st = harness_run_to_exit(h, check);
    assert_int_equal(st, 1);
    log = harness_log(h);
    assert_non_null(strstr(log, "does-not-exist"));
    free(log);
}

/* Runs loaderd on a config whose socket is `socket` and returns its log; the daemon
 * must exit with status 1. */
static char *start_fails(struct harness *h, const char *socket)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     "server:\n  socket: %s\n  workers: 1\ndatasets:\n  t:\n    kind: token_windows\n"
                     "    path: tok.bin\n    dtype: uint16\n    context: 64\n", socket);
    harness_write_file(h, "loaderd.yaml", yaml, (size_t)n);
    const char *const none[] = {NULL};
    assert_int_equal(harness_run_to_exit(h, none), 1);
    return harness_log(h);
}

/* A daemon that cannot start says why, naming what failed: never a silent exit 1. */
static void test_startup_failures_say_why(void **state)
{
    struct harness *h = *state;
    harness_stop_clean(h);
    char path[256], want[512];
    /* A socket whose directory is a regular file cannot be bound. */
    harness_write_file(h, "plain-file", "x", 1);
    snprintf(path, sizeof path, "%s/plain-file/s.sock", h->dir);
    char *log = start_fails(h, path);
    snprintf(want, sizeof want, "loaderd error: cannot bind '%s': not a directory", path);
    if (!strstr(log, want))
        fail_msg("expected \"%s\" in the log:\n%s", want, log);
    free(log);
    /* A path longer than a Unix socket's address holds: the config says so, with its place. */
    char longp[sizeof h->dir + 200];
    snprintf(longp, sizeof longp, "%s/%0120d.sock", h->dir, 0);
    log = start_fails(h, longp);
    if (!strstr(log, "loaderd.yaml:2:11: server.socket: the path is"))
        fail_msg("expected the path's length in the log:\n%s", log);
    free(log);
}

static void test_shutdown_leaves_nothing(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_daemon");
    assert_int_equal(lc_client_set_reconnect(c, 0), 0); /* the daemon does not come back */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    /* One stream mid-read (through the hand-off by default), one never read through the
     * socket (its shm name still exists). */
    lc_stream *s1 = open_ok(c, "records", &o);
    o.handoff = LC_HANDOFF_SOCKET;
    lc_stream *s2 = open_ok(c, "tokens", &o);
    lc_batch *b;
    assert_int_equal(lc_stream_next(s1, 5000, &b), 0);
    assert_true(harness_shm_count(h->pid, NULL, 0) >= 1);
    harness_stop_clean(h); /* SIGTERM with a client attached: exit 0, /dev/shm empty, socket gone */
    assert_int_equal(access(h->socket, F_OK), -1);
    /* The client sees the daemon go (after at most the batches it asked for ahead, or
     * through the hand-off the ones made ready before the stop). */
    int r, delivered = 0;
    while ((r = lc_stream_next(s1, 2000, &b)) == 0 && ++delivered <= (harness_handoff_default() ? 64 : 2))
        ;
    assert_int_equal(r, LC_ECONNRESET);
    (void)s2;
    lc_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seeds_and_epochs, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_ranks_cover_epoch, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_two_clients_interleaved, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_killed_trainer_leaks_nothing, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_malformed_frames, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_release_errors_change_nothing, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_nexts_asked_ahead, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_unread_replies_are_bounded, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_missing_sample_is_reported, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_budget_and_shm_limits, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_second_daemon_and_bad_config, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_startup_failures_say_why, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_shutdown_leaves_nothing, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
