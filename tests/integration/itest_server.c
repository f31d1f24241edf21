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

/* SIGHUP, SIGUSR1, SIGUSR2 and SIGPIPE are logged (or ignored) and the daemon keeps
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
    assert_log_has(h, "reload is not supported yet; ignoring SIGHUP");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_signals_leave_nothing, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(test_ctl_help, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
