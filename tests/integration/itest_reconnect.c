/* Integration tests: a trainer's stream survives a daemon restart.
 *
 *   exactly once        a shuffled stream of three epochs is read while its daemon is
 *                       stopped (SIGTERM), killed (SIGKILL) between two nexts, and killed
 *                       while the reader is blocked in one, each time restarted on the same
 *                       socket: every batch comes in order ((epoch, index) one after the
 *                       other), every sample of each epoch exactly once, and the bytes
 *                       are the files'. A batch held across a death stays readable and
 *                       valid; releasing it is a no-op. Afterwards nothing is left: no
 *                       descriptor, no ring mapped, nothing in /dev/shm.
 *   does not come back  with a reconnect time of 0.5 s, the next that sees the daemon go
 *                       fails within a bound with a message saying how long it tried;
 *                       later calls say the connection is closed.
 *   changed dataset     the daemon comes back serving another tree under the same name:
 *                       the reopen fails with LC_EDATASET instead of mixing them.
 *   off                 LOADERD_RECONNECT=0 (and a bad value) at lc_connect.
 *
 * Every wait is bounded; the file takes a few seconds under ASan. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"
#include "probe.h"

#define N_FILES 600
#define FILE_SIZE 512
#define BATCH 16
#define EPOCHS 3

static const char datasets[] = "  records:\n    kind: files\n    path: rec\n";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    harness_write_config(h, "  workers: 2\n  prefetch: 2\n", datasets);
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    unsetenv("LOADERD_RECONNECT");
    harness_free(*state);
    return 0;
}

/* The file a row holds: the one whose content it is (every file's bytes differ). */
static int file_of(const uint8_t *row)
{
    for (uint64_t i = 0; i < N_FILES; i++)
        if (harness_file_matches(i, row, FILE_SIZE, FILE_SIZE, false))
            return (int)i;
    return -1;
}

/* SIGKILLs the daemon and waits for it; the test's harness then starts another. */
static void kill_daemon(struct harness *h)
{
    pid_t dead = h->pid;
    assert_int_equal(kill(dead, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(dead, &st, 0), dead);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    h->pid = 0;
}

struct reader {
    lc_stream *s;
    uint64_t epoch, index;       /* of the next batch expected */
    int seen[EPOCHS][N_FILES];
    uint64_t batches;
};

/* Checks a batch: the next in order, rows of files never seen in its epoch. */
static void account(struct reader *r, lc_batch *b)
{
    if (lc_batch_epoch(b) != r->epoch || lc_batch_index(b) != r->index)
        fail_msg("expected batch %llu of epoch %llu, got batch %llu of epoch %llu", (unsigned long long)r->index,
                 (unsigned long long)r->epoch, (unsigned long long)lc_batch_index(b),
                 (unsigned long long)lc_batch_epoch(b));
    lc_field f;
    assert_int_equal(lc_batch_field(b, 0, &f), 0);
    for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
        int i = file_of((const uint8_t *)f.data + (size_t)row * FILE_SIZE);
        if (i < 0)
            fail_msg("row %u of batch %llu of epoch %llu is no file's content", row, (unsigned long long)r->index,
                     (unsigned long long)r->epoch);
        if (r->seen[r->epoch][i]++)
            fail_msg("file %d delivered twice in epoch %llu", i, (unsigned long long)r->epoch);
    }
    if (++r->index == lc_stream_batches_per_epoch(r->s)) {
        r->index = 0;
        r->epoch++;
    }
    r->batches++;
}

/* One batch, checked. A timeout while the daemon is away is not an error: the next
 * call goes on where it left off. */
static lc_batch *read_one(struct reader *r, lc_client *c, int timeout_ms)
{
    lc_batch *b = NULL;
    lc_batch_info bi;
    int64_t t0 = now_ms();
    int rc;
    /* lc_stream_next_info: lc_stream_next and lc_batch_describe in one call, reopens included. */
    while ((rc = lc_stream_next_info(r->s, timeout_ms, &b, &bi)) == LC_ETIMEDOUT && lc_client_reconnecting(c) &&
           now_ms() - t0 < 20000)
        ;
    if (rc != 0)
        fail_msg("batch %llu of epoch %llu: %s: %s", (unsigned long long)r->index, (unsigned long long)r->epoch,
                 lc_strerror(rc), lc_client_error(c));
    assert_int_equal(bi.slot, lc_batch_slot(b));
    assert_int_equal(bi.rows, lc_batch_rows(b));
    assert_int_equal(bi.generation, lc_batch_generation(b));
    assert_int_equal(bi.epoch, lc_batch_epoch(b));
    assert_int_equal(bi.index, lc_batch_index(b));
    assert_int_equal(bi.reopens, lc_stream_reopens(r->s));
    account(r, b);
    return b;
}

static void read_release(struct reader *r, lc_client *c, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(lc_batch_release(read_one(r, c, 5000)), 0);
}

/* Reads on after the daemon died until the client sees it (the batches asked for ahead
 * may still come first), ending with a next that timed out while reconnecting. */
static void read_until_lost(struct reader *r, lc_client *c)
{
    int64_t t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        lc_batch *b = NULL;
        int rc = lc_stream_next(r->s, 100, &b);
        if (rc == LC_ETIMEDOUT && lc_client_reconnecting(c)) {
            assert_non_null(strstr(lc_client_error(c), "has not come back yet"));
            return;
        }
        if (rc == LC_ETIMEDOUT)
            continue; /* a slow batch, the daemon still up */
        if (rc != 0)
            fail_msg("next while the daemon is gone (at batch %llu of epoch %llu, reopened %llu times): %s: %s", (unsigned long long)r->index, (unsigned long long)r->epoch, (unsigned long long)lc_stream_reopens(r->s), lc_strerror(rc), lc_client_error(c));
        account(r, b);
        assert_int_equal(lc_batch_release(b), 0);
    }
    fail_msg("the daemon's death was not seen within 5 s");
}

/* A batch held across the death: still readable, still valid, and its release (into a
 * connection that is gone) sends nothing and fails nothing. */
static void check_held(lc_batch *held, int expect_file0)
{
    lc_field f;
    assert_int_equal(lc_batch_field(held, 0, &f), 0);
    assert_int_equal(file_of(f.data), expect_file0);
    assert_int_equal(lc_batch_valid(held), 1);
    assert_int_equal(lc_batch_release(held), 0);
}

static void test_restart_exactly_once(void **state)
{
    struct harness *h = *state;
    const pid_t self = getpid();
    int base_fds = probe_fd_count(self);
    lc_client *c = harness_connect(h, 5000, "reconnect");
    assert_int_equal(lc_client_set_reconnect(c, 20000), 0);
    assert_int_equal(lc_client_set_reconnect(c, -1), LC_EINVAL);
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.seed = 7;
    o.epochs = EPOCHS;
    static struct reader r;
    memset(&r, 0, sizeof r);
    assert_int_equal(lc_stream_open(c, "records", &o, &r.s), 0);
    const uint64_t bpe = lc_stream_batches_per_epoch(r.s);
    assert_int_equal(bpe, (N_FILES + BATCH - 1) / BATCH);

    /* 1. A clean stop (SIGTERM) with a batch held, then a restart. */
    read_release(&r, c, 5);
    lc_batch *held = read_one(&r, c, 5000);
    lc_field f;
    assert_int_equal(lc_batch_field(held, 0, &f), 0);
    int held_file = file_of(f.data);
    assert_int_equal(harness_stop(h), 0);
    harness_start(h);
    read_release(&r, c, 3);
    check_held(held, held_file);
    assert_int_equal(lc_client_reconnects(c), 1);
    assert_int_equal(lc_stream_reopens(r.s), 1);

    /* 2. SIGKILL right after the last batch of epoch 0: the reopen starts epoch 1. */
    read_release(&r, c, (int)(bpe - r.index));
    assert_int_equal(r.epoch, 1);
    pid_t dead = h->pid;
    kill_daemon(h);
    /* Not back yet: a short next times out while reconnecting, and says so. */
    read_until_lost(&r, c);
    harness_start(h);
    char names[512];
    if (harness_shm_count(dead, names, sizeof names) != 0)
        fail_msg("the new loaderd left the killed one's objects: %s", names);
    read_release(&r, c, 4);
    assert_int_equal(lc_client_reconnecting(c), 0);

    /* 3. SIGKILL while the reader waits in a next (a killer process fires), with a batch
     * held; the daemon comes back while the reader retries. */
    held = read_one(&r, c, 5000);
    assert_int_equal(lc_batch_field(held, 0, &f), 0);
    held_file = file_of(f.data);
    fflush(NULL);
    pid_t killer = fork();
    assert_true(killer >= 0);
    if (killer == 0) {
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        kill(h->pid, SIGKILL);
        _exit(0);
    }
    read_until_lost(&r, c);
    int kst;
    assert_int_equal(waitpid(killer, &kst, 0), killer);
    int wst;
    assert_int_equal(waitpid(h->pid, &wst, 0), h->pid);
    h->pid = 0;
    assert_int_equal(lc_client_reconnecting(c), 1);
    harness_start(h);
    check_held(held, held_file);

    /* The rest of the epochs, then the end. */
    while (r.epoch < EPOCHS)
        assert_int_equal(lc_batch_release(read_one(&r, c, 5000)), 0);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(r.s, 5000, &b), LC_EEND);
    for (int e = 0; e < EPOCHS; e++)
        for (int i = 0; i < N_FILES; i++)
            if (r.seen[e][i] != 1)
                fail_msg("file %d delivered %d times in epoch %d", i, r.seen[e][i], e);
    assert_int_equal(lc_client_reconnects(c), 3);
    assert_int_equal(lc_stream_reopens(r.s), 3);
    print_message("%llu batches over 3 restarts, every sample once per epoch\n", (unsigned long long)r.batches);

    assert_int_equal(lc_stream_close(r.s), 0);
    lc_client_close(c);
    assert_int_equal(probe_fd_count(self), base_fds);
    assert_int_equal(probe_ring_maps(self), 0);
    harness_stop_clean(h);
}

static void test_daemon_does_not_come_back(void **state)
{
    struct harness *h = *state;
    const pid_t self = getpid();
    int base_fds = probe_fd_count(self);
    lc_client *c = harness_connect(h, 5000, "reconnect");
    assert_int_equal(lc_client_set_reconnect(c, 500), 0);
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_batch *held = NULL, *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &held), 0);
    kill_daemon(h);
    int64_t t0 = now_ms();
    int rc;
    while ((rc = lc_stream_next(s, 5000, &b)) == 0)
        lc_batch_release(b);
    int64_t waited = now_ms() - t0;
    assert_int_equal(rc, LC_ECONNRESET);
    /* The message gives the time it tried: at least the 0.5 s configured, a little more
     * on a loaded machine. */
    const char *after = strstr(lc_client_error(c), " after ");
    double tried = 0;
    if (!strstr(lc_client_error(c), "loaderd closed the connection") ||
        !strstr(lc_client_error(c), "gave up reconnecting") || !after || sscanf(after, " after %lf s", &tried) != 1 ||
        tried < 0.5 || tried >= 3.0)
        fail_msg("unexpected message: %s", lc_client_error(c));
    assert_true(waited >= 450 && waited < 3000);
    assert_int_equal(lc_client_reconnecting(c), 0);
    assert_int_equal(lc_stream_next(s, 1000, &b), LC_ECLOSED);
    assert_non_null(strstr(lc_client_error(c), "gave up reconnecting"));
    /* The held batch outlives it all. */
    assert_int_equal(lc_batch_valid(held), 1);
    lc_field f;
    assert_int_equal(lc_batch_field(held, 0, &f), 0);
    assert_true(file_of(f.data) >= 0);
    assert_int_equal(lc_batch_release(held), 0);
    lc_stream_close(s);
    lc_client_close(c);
    assert_int_equal(probe_fd_count(self), base_fds);
    assert_int_equal(probe_ring_maps(self), 0);
}

static void test_changed_dataset(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "reconnect");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.shuffle = 0;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    lc_batch_release(b);
    assert_int_equal(harness_stop(h), 0);
    /* The same name, another tree: 500 files instead of 600. */
    harness_gen_files(h, "rec2", 500, FILE_SIZE, 0, false);
    harness_write_config(h, "  workers: 2\n", "  records:\n    kind: files\n    path: rec2\n");
    harness_start(h);
    /* The batches asked for ahead before the stop come first (at most the read-ahead). */
    int rc, ahead = 0;
    while ((rc = lc_stream_next(s, 5000, &b)) == 0) {
        assert_true(++ahead <= LC_READ_AHEAD);
        lc_batch_release(b);
    }
    assert_int_equal(rc, LC_EDATASET);
    if (!strstr(lc_client_error(c), "dataset 'records' changed") || !strstr(lc_client_error(c), "600") ||
        !strstr(lc_client_error(c), "500"))
        fail_msg("unexpected message: %s", lc_client_error(c));
    /* It stays failed; the client itself goes on. */
    assert_int_equal(lc_stream_next(s, 5000, &b), LC_EDATASET);
    assert_int_equal(lc_stream_close(s), 0);
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), 0);
    lc_free(reply);
    /* The daemon holds no stream: the one it reopened for us was closed (the close went
     * out with the status request). */
    assert_int_equal((int)harness_status_num(h, "streams", NULL), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_reconnect_off(void **state)
{
    struct harness *h = *state;
    char err[512];
    lc_client *c = NULL;
    setenv("LOADERD_RECONNECT", "soon", 1);
    assert_int_equal(lc_connect(h->socket, 5000, "reconnect", &c, err, sizeof err), LC_EINVAL);
    assert_non_null(strstr(err, "LOADERD_RECONNECT='soon'"));
    assert_null(c);
    setenv("LOADERD_RECONNECT", "0", 1);
    c = harness_connect(h, 5000, "reconnect");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    lc_batch_release(b);
    kill_daemon(h);
    int64_t t0 = now_ms();
    int rc;
    while ((rc = lc_stream_next(s, 5000, &b)) == 0)
        lc_batch_release(b);
    assert_true(rc == LC_ECONNRESET || rc == LC_ECLOSED);
    assert_true(now_ms() - t0 < 2000);
    assert_null(strstr(lc_client_error(c), "reconnect"));
    assert_int_equal(lc_client_reconnects(c), 0);
    lc_stream_close(s);
    lc_client_close(c);
    unsetenv("LOADERD_RECONNECT");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restart_exactly_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_daemon_does_not_come_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changed_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconnect_off, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
