/* itest_server — the daemon's process and connection contracts against a real loaderd:
 * signals that must not kill it or leave anything behind, loaderctl's usage, limits on
 * clients, streams, silent connections and unread replies, epochs the protocol carries
 * exactly, and systemd socket activation. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 200
#define FILE_SIZE 64

static const char datasets_yaml[] = "  records:\n"
                                    "    kind: files\n"
                                    "    path: rec\n";

static struct harness *server_harness(const char *server_extra)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 4, false);
    harness_write_config(h, server_extra, datasets_yaml);
    return h;
}

static int setup_daemon(void **state)
{
    struct harness *h = server_harness("  workers: 2\n  memory_budget: 64MiB\n");
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown_daemon(void **state)
{
    harness_free(*state);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static lc_stream *open_records(lc_client *c, uint32_t batch)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = batch;
    lc_stream *s = NULL;
    int r = lc_stream_open(c, "records", &o, &s);
    if (r < 0)
        fail_msg("lc_stream_open: %s: %s", lc_strerror(r), lc_client_error(c));
    return s;
}

static void assert_log_has(struct harness *h, const char *needle)
{
    char *log = harness_log(h);
    if (!strstr(log, needle)) {
        print_error("loaderd log:\n%s\n", log);
        free(log);
        fail_msg("the log does not say '%s'", needle);
    }
    free(log);
}

/* ---- signals ------------------------------------------------------------------------ */

/* SIGHUP (a reload of the same file), SIGUSR1, SIGUSR2 and SIGPIPE are logged (or ignored) and the daemon keeps
 * serving the stream it had; SIGQUIT stops it as cleanly as SIGTERM: exit 0, no socket
 * file, nothing in /dev/shm although a stream with a leased batch was open. */
static void test_signals_leave_nothing(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_server");
    lc_stream *s = open_records(c, 8);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    const int sigs[] = {SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        assert_int_equal(kill(h->pid, sigs[i]), 0);
        sleep_ms(50);
        assert_true(harness_alive(h));
    }
    assert_log_has(h, "received SIGHUP: reloading");
    assert_log_has(h, "received SIGUSR1");
    /* Still serving: the stream goes on, and a new client is answered. */
    assert_int_equal(lc_batch_release(b), 0);
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    assert_true(harness_status_num(h, "streams", NULL) == 1);
    pid_t pid = h->pid;
    int st = harness_stop_with(h, SIGQUIT);
    if (st != 0) {
        char *log = harness_log(h);
        print_error("loaderd log:\n%s\n", log);
        free(log);
    }
    assert_int_equal(st, 0);
    assert_int_equal(harness_shm_count(pid, NULL, 0), 0);
    struct stat sst;
    assert_int_equal(lstat(h->socket, &sst), -1);
    assert_log_has(h, "received Quit");
    lc_client_close(c);
}

/* ---- loaderctl ---------------------------------------------------------------------- */

static void test_ctl_help(void **state)
{
    struct harness *h = *state;
    char out[8192];
    static const char *const cmds[] = {"read", "status", "datasets", "streams", "cache"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int st = harness_ctl(h, out, sizeof out, cmds[i], "--help", NULL);
        if (st != 0 || !strstr(out, "usage:") || !strstr(out, cmds[i]) || strstr(out, "unknown"))
            fail_msg("loaderctl %s --help: status %d:\n%s", cmds[i], st, out);
    }
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "-h", NULL), 0);
    assert_non_null(strstr(out, "--batch-size"));
    assert_int_equal(harness_ctl(h, out, sizeof out, "cache", "build", "--help", NULL), 0);
    assert_non_null(strstr(out, "--force"));
    /* An unknown option is still an error, with the usage. */
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "--bogus", NULL), 2);
    assert_non_null(strstr(out, "unknown option --bogus"));
    harness_stop_clean(h);
}

/* ---- connection limits -------------------------------------------------------------- */

/* The error frame the daemon sends before it closes a connection, as "code: message",
 * then the end of the connection; "" when nothing came within timeout_ms. */
static void expect_closed_with(int fd, const char *code, const char *needle, int timeout_ms)
{
    char *text = harness_raw_reply(fd, timeout_ms);
    if (!text)
        fail_msg("expected an error %s mentioning '%s' before the daemon closed the connection; got nothing",
                 code, needle);
    cJSON *r = cJSON_Parse(text);
    const cJSON *err = cJSON_GetObjectItem(r, "error");
    const char *got = cJSON_GetStringValue(cJSON_GetObjectItem(err, "code"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(err, "message"));
    if (!got || strcmp(got, code) != 0 || !msg || !strstr(msg, needle))
        fail_msg("expected error %s mentioning '%s', got %s", code, needle, text);
    cJSON_Delete(r);
    free(text);
    char c;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 2000), 1);
    assert_int_equal(read(fd, &c, 1), 0); /* closed */
}

static int raw_hello(struct harness *h)
{
    int fd = harness_raw_connect(h);
    harness_raw_send(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    char *r = harness_raw_reply(fd, 5000);
    assert_non_null(r);
    assert_non_null(strstr(r, "\"ok\":true"));
    free(r);
    return fd;
}

/* max_clients silent sockets: loaderctl still gets in through the slot kept for
 * operator commands (which cannot open streams), one more is refused, and the silent
 * ones are closed at the hello deadline; a connection that said hello and then nothing,
 * without a stream, is closed at the idle timeout; then trainers get their slots back. */
static void test_silent_connections(void **state)
{
    (void)state;
    struct harness *h = server_harness("  workers: 1\n  memory_budget: 64MiB\n  max_clients: 2\n"
                                       "  hello_timeout: 2\n  idle_timeout: 3\n");
    harness_start(h);
    int silent = harness_raw_connect(h);
    int partial = harness_raw_connect(h);
    assert_int_equal(send(partial, "\0\0\0\x30{\"op\":", 10, MSG_NOSIGNAL), 10); /* half a frame */
    sleep_ms(100);

    char out[4096];
    int st = harness_ctl(h, out, sizeof out, "status", NULL);
    if (st != 0)
        fail_msg("loaderctl status with every client slot taken: status %d:\n%s", st, out);
    assert_non_null(strstr(out, "clients"));
    assert_non_null(strstr(out, " of 64.0 MiB budget")); /* sizes as ld_format_bytes writes them */

    /* The operator slot is for commands: a stream is refused there, clearly. */
    lc_client *op = harness_connect(h, 5000, "operator");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 8;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(op, "records", &o, &s), LC_ELIMIT);
    assert_non_null(strstr(lc_client_error(op), "operator commands"));
    /* And with that slot taken too, the next connection is refused at once. */
    lc_client *extra = NULL;
    char err[512];
    assert_int_equal(lc_connect(h->socket, 5000, "extra", &extra, err, sizeof err), LC_ELIMIT);
    assert_non_null(strstr(err, "max_clients"));
    lc_client_close(op);

    /* The hello deadline closes both silent ones, with a reason. */
    /* (generous waits: under ThreadSanitizer, next to another test, the timer runs late) */
    expect_closed_with(silent, "timed_out", "no hello within 2 s", 15000);
    expect_closed_with(partial, "timed_out", "no hello within 2 s", 5000);
    close(silent);
    close(partial);

    /* Hello, then silence and no stream: closed at the idle timeout. A connection with
     * a stream is not (a trainer may compute for long between batches). */
    int idle = raw_hello(h);
    lc_client *trainer = harness_connect(h, 5000, "trainer");
    s = open_records(trainer, 8);
    expect_closed_with(idle, "timed_out", "idle for 3 s without a stream", 6000);
    close(idle);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    assert_int_equal(lc_batch_release(b), 0);
    /* Both trainer slots are free for trainers again. */
    lc_client *second = harness_connect(h, 5000, "second");
    lc_stream *s2 = open_records(second, 8);
    assert_int_equal(lc_stream_next(s2, 5000, &b), 0);
    assert_int_equal(lc_batch_release(b), 0);
    harness_flush_releases(trainer);
    harness_flush_releases(second);
    /* What the clients asked for ahead; through the hand-off, what the rings hold. */
    int ahead = harness_handoff_default() ? 2 * 64 : 2 * LC_READ_AHEAD;
    assert_true(harness_wait_leased(h, ahead) <= ahead);
    lc_client_close(second);
    lc_client_close(trainer);
    assert_log_has(h, "no hello within 2 s of connecting (server.hello_timeout)");
    harness_stop_clean(h);
    harness_free(h);
}

/* max_streams is enforced across clients, with an error that names the setting; a
 * closed stream frees its place. */
static void test_max_streams(void **state)
{
    (void)state;
    struct harness *h = server_harness("  workers: 1\n  memory_budget: 64MiB\n  max_streams: 2\n");
    harness_start(h);
    lc_client *a = harness_connect(h, 5000, "a");
    lc_client *b = harness_connect(h, 5000, "b");
    lc_stream *s1 = open_records(a, 4);
    open_records(b, 4);
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    lc_stream *s3 = NULL;
    assert_int_equal(lc_stream_open(a, "records", &o, &s3), LC_ELIMIT);
    assert_null(s3);
    assert_non_null(strstr(lc_client_error(a), "server.max_streams"));
    assert_int_equal(lc_stream_close(s1), 0);
    s3 = open_records(a, 4);
    assert_true(harness_status_num(h, "streams", NULL) == 2);
    lc_client_close(a);
    lc_client_close(b);
    harness_stop_clean(h);
    harness_free(h);
}

/* max_clients is enforced: with 2 trainers and the operator slot taken, a fourth
 * connection is refused. When the operator and then a trainer leave, a new trainer gets
 * the free slot; while a trainer slot is free, the connection in the operator slot takes
 * it (and may open streams). */
static void test_max_clients(void **state)
{
    (void)state;
    struct harness *h = server_harness("  workers: 1\n  memory_budget: 64MiB\n  max_clients: 2\n");
    harness_start(h);
    lc_client *a = harness_connect(h, 5000, "a");
    lc_client *b = harness_connect(h, 5000, "b");
    open_records(a, 4);
    open_records(b, 4);
    lc_client *op = harness_connect(h, 5000, "operator");
    lc_client *d = NULL;
    char err[512];
    assert_int_equal(lc_connect(h->socket, 5000, "d", &d, err, sizeof err), LC_ELIMIT);
    assert_non_null(strstr(err, "already serves 2 clients (server.max_clients)"));
    lc_client_close(op);
    lc_client_close(a);
    /* The daemon sees both leave soon; until then e may land in the operator slot. */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    lc_client *e = NULL;
    lc_stream *s = NULL;
    for (int i = 0; i < 100 && !s; i++) {
        lc_client_close(e);
        e = NULL;
        if (lc_connect(h->socket, 5000, "e", &e, err, sizeof err) < 0 || lc_stream_open(e, "records", &o, &s) < 0)
            sleep_ms(20);
    }
    assert_non_null(s);
    /* Full again: this one holds the operator slot until b leaves, then takes b's. */
    lc_client *f = harness_connect(h, 5000, "f");
    s = NULL;
    assert_int_equal(lc_stream_open(f, "records", &o, &s), LC_ELIMIT);
    assert_non_null(strstr(lc_client_error(f), "operator commands"));
    lc_client_close(b);
    for (int i = 0; i < 100 && lc_stream_open(f, "records", &o, &s) < 0; i++)
        sleep_ms(20);
    assert_non_null(s);
    lc_client_close(f);
    lc_client_close(e);
    harness_stop_clean(h);
    harness_free(h);
}

/* ---- queued replies ------------------------------------------------------------------ */

/* Holds every slot of a stream and leaves one next waiting, so that every later reply
 * queues behind it. Returns the raw connection. */
static int raw_blocked_connection(struct harness *h)
{
    int fd = raw_hello(h);
    harness_raw_send(fd, "{\"op\":\"open\",\"id\":2,\"dataset\":\"records\",\"batch_size\":4,\"prefetch\":1}");
    char *text = harness_raw_reply(fd, 5000);
    cJSON *r = cJSON_Parse(text);
    free(text);
    int sid = (int)cJSON_GetObjectItem(r, "stream")->valuedouble;
    int slots = (int)cJSON_GetObjectItem(r, "slot_count")->valuedouble;
    cJSON_Delete(r);
    char req[128];
    for (int i = 0; i <= slots; i++) {
        snprintf(req, sizeof req, "{\"op\":\"next\",\"id\":%d,\"stream\":%d}", 10 + i, sid);
        harness_raw_send(fd, req);
        if (i < slots)
            free(harness_raw_reply(fd, 5000));
    }
    return fd;
}

/* Sends `streams` requests without reading until the daemon hangs up or `max` went
 * out; returns how many went out. */
static int amplify(int fd, int max)
{
    int sent = 0;
    for (; sent < max; sent++) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 2000) != 1 || (p.revents & (POLLHUP | POLLERR)))
            break;
        static const char req[] = "{\"op\":\"streams\",\"id\":99}";
        uint8_t frame[64] = {0, 0, 0, (uint8_t)(sizeof req - 1)};
        memcpy(frame + 4, req, sizeof req - 1);
        if (send(fd, frame, 4 + sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(4 + sizeof req - 1))
            break;
    }
    return sent;
}

static bool hung_up(int fd, int timeout_ms)
{
    char buf[4096];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) != 1)
            return false;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            return true;
    }
}

/* The amplification pattern (a next that waits, then thousands of `streams` requests
 * whose replies queue behind it) is cut off at server.max_reply_bytes per connection and
 * at server.max_total_reply_bytes across connections, far below the count limit; the
 * daemon keeps serving. */
static void test_queued_reply_bytes(void **state)
{
    (void)state;
    struct harness *h = server_harness("  workers: 1\n  memory_budget: 256MiB\n  max_reply_bytes: 256KiB\n"
                                       "  max_total_reply_bytes: 384KiB\n");
    harness_start(h);
    /* Eight streams make each `streams` reply a few KiB. */
    lc_client *owner = harness_connect(h, 5000, "owner");
    for (int i = 0; i < 6; i++)
        open_records(owner, 4);
    int fd = raw_blocked_connection(h);
    int sent = amplify(fd, 3000);
    assert_true(hung_up(fd, 5000));
    close(fd);
    assert_true(sent < 3000);
    assert_log_has(h, "limit per connection 262144 bytes, server.max_reply_bytes); disconnecting");

    /* Two such clients: the first queues about 180 KiB (under its own 256 KiB), then the
     * second passes the total of 384 KiB before it reaches its own limit. */
    int probe = raw_hello(h);
    harness_raw_send(probe, "{\"op\":\"streams\",\"id\":99}");
    char *one = harness_raw_reply(probe, 5000);
    assert_non_null(one);
    size_t reply_cost = strlen(one) + 4 + 64; /* frame and header, and a margin for the entry */
    free(one);
    close(probe);
    int a = raw_blocked_connection(h), b = raw_blocked_connection(h);
    int n_a = (int)((180u << 10) / reply_cost);
    assert_int_equal(amplify(a, n_a), n_a);
    sleep_ms(300); /* all of them read and queued */
    assert_false(hung_up(a, 100));
    amplify(b, 3000);
    assert_true(hung_up(b, 5000));
    close(a);
    close(b);
    assert_log_has(h, "limit across all connections 393216 bytes, server.max_total_reply_bytes); disconnecting");
    /* Still serving, and the queued bytes were given back: the count that the total cap
     * is checked against returns to zero. */
    assert_true(harness_status_num(h, "streams", NULL) == 6);
    double queued = -1;
    for (int i = 0; i < 100 && queued != 0; i++) {
        queued = harness_status_num(h, "queued_reply_bytes", NULL);
        if (queued != 0)
            sleep_ms(20);
    }
    assert_true(queued == 0);
    lc_client_close(owner);
    harness_stop_clean(h);
    harness_free(h);
}

/* ---- epochs ------------------------------------------------------------------------- */

/* An epoch past 2^53 - 1 cannot be carried exactly as a JSON number: a stream that would
 * reach one is refused at open, clearly; one that starts at the last exact epoch ends
 * there instead of running past it. */
static void test_epochs_stay_exact(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "epochs");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 100;
    o.epoch = 9007199254740991ull;
    o.epochs = 2;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EFIELD);
    assert_non_null(strstr(lc_client_error(c), "2^53 - 1"));
    o.epoch = 9007199254740990ull;
    s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_stream_close(s);
    o.epochs = 0; /* unbounded: ends after the last exact epoch */
    o.epoch = 9007199254740991ull;
    s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    for (int k = 0; k < 2; k++) {
        lc_batch *b = NULL;
        assert_int_equal(lc_stream_next(s, 5000, &b), 0);
        assert_true(lc_batch_epoch(b) == 9007199254740991ull);
        assert_int_equal(lc_batch_release(b), 0);
    }
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), LC_EEND);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* ---- socket activation ------------------------------------------------------------------ */

/* systemd passes the listening socket (LISTEN_FDS): the daemon serves on it instead of
 * binding its own, shares its rings with the socket's group when the socket lets that
 * group connect, and on stop leaves the socket to systemd but /dev/shm clean. */
static void test_socket_activation(void **state)
{
    (void)state;
    struct harness *h = server_harness("  workers: 1\n  memory_budget: 64MiB\n");
    harness_start_activated(h, 0660);
    lc_client *c = harness_connect(h, 10000, "activated");
    lc_stream *s = open_records(c, 8);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    assert_int_equal(lc_batch_release(b), 0);
    harness_flush_releases(c);
    int ahead = harness_handoff_default() ? 64 : LC_READ_AHEAD;
    assert_true(harness_wait_leased(h, ahead) <= ahead);
    assert_log_has(h, "using the socket passed by systemd");
    assert_log_has(h, "serving group");
    lc_client_close(c);
    pid_t pid = h->pid;
    int st = harness_stop(h);
    if (st != 0) {
        char *log = harness_log(h);
        print_error("loaderd log:\n%s\n", log);
        free(log);
    }
    assert_int_equal(st, 0);
    assert_int_equal(harness_shm_count(pid, NULL, 0), 0);
    harness_free(h);
}

/* ---- rings of a killed trainer ------------------------------------------------------ */

/* A trainer SIGKILLed between open and its first next (the ring still has its name in
 * /dev/shm, since the name is removed at the first next): the name goes with the
 * connection, not at the next daemon start. */
static void test_killed_before_first_next(void **state)
{
    struct harness *h = *state;
    for (int round = 0; round < 3; round++) {
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            close(ready[0]);
            lc_client *c = NULL;
            char err[256];
            lc_stream_options o;
            lc_stream_options_init(&o);
            o.batch_size = 8 + round;
            /* Through the socket: the hand-off removes the names at open already
             * (itest_handoff kills a client between open and the hand-off's start). */
            o.handoff = LC_HANDOFF_SOCKET;
            lc_stream *s = NULL;
            if (lc_connect(h->socket, 5000, "killed-early", &c, err, sizeof err) < 0 ||
                lc_stream_open(c, "records", &o, &s) < 0 || write(ready[1], "x", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        close(ready[1]);
        char x;
        assert_int_equal(read(ready[0], &x, 1), 1);
        close(ready[0]);
        assert_int_equal(harness_shm_count(h->pid, NULL, 0), 1);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        int left = -1;
        for (int i = 0; i < 200 && left != 0; i++) {
            left = harness_shm_count(h->pid, NULL, 0);
            if (left)
                sleep_ms(10);
        }
        assert_int_equal(left, 0);
    }
    assert_true(harness_status_num(h, "streams", NULL) == 0);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_signals_leave_nothing, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_ctl_help, setup_daemon, teardown_daemon),
        cmocka_unit_test(test_silent_connections),
        cmocka_unit_test(test_max_streams),
        cmocka_unit_test(test_max_clients),
        cmocka_unit_test(test_queued_reply_bytes),
        cmocka_unit_test_setup_teardown(test_epochs_stay_exact, setup_daemon, teardown_daemon),
        cmocka_unit_test(test_socket_activation),
        cmocka_unit_test_setup_teardown(test_killed_before_first_next, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
