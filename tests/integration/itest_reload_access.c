/* itest_reload_access — a reload that narrows `access:` while trainers read, against a
 * real loaderd. A trainer of a second user reads two datasets and a refined template
 * of one; a first reload lets only root read the other and lets nobody declare: those
 * streams end, their next gets permission_denied naming the rule (at once: well within
 * the next's own timeout, which a client that learnt nothing would run out), asked
 * again it says so again, its close succeeds, and the trainer's other stream reads on.
 * A second reload no longer lets the trainer connect: its connection ends with a last
 * frame that says why. Root's stream reads on through both. Run over the shared-memory
 * hand-off (the default) and over the socket; the daemon stops cleanly (nothing left in
 * /dev/shm) and ASan's leak check covers what the ended streams leave. Needs root (it
 * creates the second user); skipped otherwise. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 120
#define FILE_SIZE 48
#define TEST_GROUP "ldtest-svc"
#define TEST_TRAINER "ldtest-trainer"
/* Far longer than an answer takes: a next that runs it out learnt nothing. */
#define NEXT_TIMEOUT_MS 20000

static void read_all(int fd, char *msg, size_t size)
{
    size_t n = 0;
    ssize_t got;
    while (n + 1 < size && (got = read(fd, msg + n, size - 1 - n)) > 0)
        n += (size_t)got;
    msg[n] = '\0';
}

static char wait_byte(int fd)
{
    char ch = 0;
    while (read(fd, &ch, 1) < 0 && errno == EINTR)
        ;
    return ch;
}

/* The trainer's "ready" byte, or its failure ('!' and the message: the test fails with
 * it). */
static void wait_ready(int fd)
{
    char ch = wait_byte(fd);
    if (ch == 'r')
        return;
    char msg[2048];
    read_all(fd, msg, sizeof msg);
    fail_msg("trainer: %s%s", ch == '!' ? "" : "(gone) ", msg);
}

/* Reads stream s until a next fails (a batch or two may have been answered or handed
 * over before the reload): the error's code, its message in msg. */
static int next_until_error(lc_client *c, lc_stream *s, char *msg, size_t size)
{
    for (int i = 0; i < 64; i++) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, NEXT_TIMEOUT_MS, &b);
        if (r < 0) {
            snprintf(msg, size, "%s", lc_client_error(c));
            return r;
        }
        lc_batch_release(b);
    }
    snprintf(msg, size, "no error after 64 batches");
    return 0;
}

/* The trainer: reads `records`, `open` and `open` refined (a declared template) while
 * the parent narrows the rules in two reloads (it writes a byte after each; the trainer
 * one when it is ready for the next). */
static void narrowed_body(int handoff, int to_parent, int from_parent, char *msg, size_t size)
{
    lc_client *c = NULL;
    char err[1024];
    setenv("LOADERD_UID", "0", 1);
    int r = lc_connect(getenv("ITEST_SOCKET"), 5000, "acl-narrowed", &c, err, sizeof err);
    if (r < 0) {
        snprintf(msg, size, "connect: %d %s", r, err);
        return;
    }
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.handoff = handoff;
    lc_stream *rec = NULL, *opn = NULL, *ref = NULL;
    lc_batch *b = NULL;
    lc_stream_options refined = o;
    refined.spec = "{\"on_error\":\"fail\"}";
    if ((r = lc_stream_open(c, "records", &o, &rec)) < 0 || (r = lc_stream_open(c, "open", &o, &opn)) < 0 ||
        (r = lc_stream_open(c, "open", &refined, &ref)) < 0 || (r = lc_stream_next(rec, 5000, &b)) < 0) {
        snprintf(msg, size, "before the reloads: %d %s", r, lc_client_error(c));
        goto out;
    }
    lc_batch_release(b);
    harness_flush_releases(c);
    (void)!write(to_parent, "r", 1);
    wait_byte(from_parent);
    /* access.datasets.records now lets only root in, and access.declare is gone: those
     * two streams end, `open` reads on. */
    char why[1024];
    r = next_until_error(c, rec, why, sizeof why);
    if (r != LC_EDENIED || !strstr(why, "(" TEST_TRAINER "), gid ") ||
        !strstr(why, "may no longer read dataset 'records'") ||
        !strstr(why, "a reload narrowed access.datasets.records (it allows users 0 (root)); the stream was closed")) {
        snprintf(msg, size, "records after the first reload: %d (%s) %s", r, lc_strerror(r), why);
        goto out;
    }
    r = next_until_error(c, ref, why, sizeof why);
    if (r != LC_EDENIED || !strstr(why, "may no longer declare datasets: a reload narrowed access.declare; the "
                                        "stream on 'open+spec' was closed")) {
        snprintf(msg, size, "the refined stream after the first reload: %d (%s) %s", r, lc_strerror(r), why);
        goto out;
    }
    if ((r = lc_stream_next(rec, 5000, &b)) != LC_EDENIED) { /* and says so again */
        snprintf(msg, size, "records asked again: %d %s", r, lc_client_error(c));
        goto out;
    }
    r = lc_stream_close(rec);
    rec = NULL;
    if (r < 0) {
        snprintf(msg, size, "close of the ended stream: %d %s", r, lc_client_error(c));
        goto out;
    }
    if ((r = lc_stream_next(opn, 5000, &b)) < 0) {
        snprintf(msg, size, "open after the first reload: %d %s", r, lc_client_error(c));
        goto out;
    }
    lc_batch_release(b);
    harness_flush_releases(c);
    (void)!write(to_parent, "r", 1);
    wait_byte(from_parent);
    /* access.connect no longer lists the trainer: the daemon ends the connection (the
     * call that reads its last frame returns LC_EDENIED, later ones LC_ECLOSED, each
     * with its message). */
    r = next_until_error(c, opn, why, sizeof why);
    if ((r != LC_EDENIED && r != LC_ECLOSED) || !strstr(why, "(" TEST_TRAINER "), gid ") ||
        !strstr(why, " (pid ") ||
        !strstr(why, "may no longer connect to this daemon: a reload narrowed access.connect (it allows users 0 "
                     "(root))"))
        snprintf(msg, size, "open after the second reload: %d (%s) %s", r, lc_strerror(r), why);
    else
        snprintf(msg, size, "ok");
out:
    lc_stream_close(rec);
    lc_stream_close(ref);
    lc_client_close(c);
}

/* One run: `handoff` is the trainer's (and root's) LC_HANDOFF_*. */
static void narrow_while_reading(int handoff)
{
    uid_t uid;
    gid_t gid;
    if (harness_test_user(TEST_TRAINER, TEST_GROUP, &uid, &gid) < 0) {
        print_message("skipped: creating a second user needs root\n");
        skip();
    }
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    static const char ds[] = "  records:\n    kind: files\n    path: rec\n"
                             "  open:\n    kind: files\n    path: rec\n";
    static const char head[] = "  workers: 1\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n"
                               "access:\n  operators: {users: [root]}\n";
    char extra[PATH_MAX + 512];
    snprintf(extra, sizeof extra, "%s  connect: {users: [" TEST_TRAINER "]}\n  declare: [{users: [" TEST_TRAINER
             "], roots: ['%s']}]\n", head, h->dir);
    harness_write_config(h, extra, ds);
    assert_int_equal(chmod(h->dir, 0711), 0);
    harness_start(h);
    lc_client *root = harness_connect(h, 5000, "root-reader"); /* root passes every rule */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.handoff = handoff;
    lc_stream *rs = NULL;
    assert_int_equal(lc_stream_open(root, "records", &o, &rs), 0);

    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    setenv("ITEST_SOCKET", h->socket, 1);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(up[0]);
        close(down[1]);
        harness_become(uid, gid);
        char out[2048] = "";
        narrowed_body(handoff, up[1], down[0], out, sizeof out);
        dprintf(up[1], "%s%s", strcmp(out, "ok") ? "!" : "", out);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    char out[8192];
    signal(SIGPIPE, SIG_IGN); /* a trainer that failed has closed its end */
    wait_ready(up[0]);
    snprintf(extra, sizeof extra, "%s  connect: {users: [" TEST_TRAINER "]}\n  datasets:\n    records: {users: [0]}\n",
             head);
    harness_write_config(h, extra, ds);
    assert_int_equal(harness_ctl(h, out, sizeof out, "reload", NULL), 0);
    if (!strstr(out, "denied:   0 connections and 2 streams that the new access rules no longer allow were ended"))
        fail_msg("loaderctl reload:\n%s", out);
    (void)!write(down[1], "1", 1);
    wait_ready(up[0]);
    snprintf(extra, sizeof extra, "%s  connect: {users: [root]}\n", head);
    harness_write_config(h, extra, ds);
    assert_int_equal(harness_ctl(h, out, sizeof out, "reload", NULL), 0);
    if (!strstr(out, "denied:   1 connection and 0 streams"))
        fail_msg("loaderctl reload:\n%s", out);
    (void)!write(down[1], "2", 1);
    char msg[2048];
    read_all(up[0], msg, sizeof msg);
    close(up[0]);
    close(down[1]);
    int wst;
    waitpid(child, &wst, 0);
    unsetenv("ITEST_SOCKET");
    assert_true(WIFEXITED(wst));
    if (strcmp(msg, "ok") != 0)
        fail_msg("trainer: %s", msg[0] == '!' ? msg + 1 : msg);
    /* Root's stream on records read on through both reloads. */
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(rs, 5000, &b), 0);
    lc_batch_release(b);
    lc_client_close(root);
    char *log = harness_log(h);
    bool logged = strstr(log, "may no longer read dataset 'records'") && strstr(log, "may no longer connect");
    free(log);
    assert_true(logged);
    harness_stop_clean(h);
    harness_free(h);
}

static void test_narrowed_over_the_handoff(void **state)
{
    (void)state;
    narrow_while_reading(LC_HANDOFF_SHM);
}

static void test_narrowed_over_the_socket(void **state)
{
    (void)state;
    narrow_while_reading(LC_HANDOFF_SOCKET);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_narrowed_over_the_handoff),
        cmocka_unit_test(test_narrowed_over_the_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
