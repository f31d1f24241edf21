/* itest_declare — datasets a trainer declares at open, against a real loaderd: a
 * declared pipeline delivers its files exactly once and is freed with its last stream;
 * a configured dataset refined as a template; the refusals (declaring off, a path
 * outside the roots, "..", a symbolic link leading out, a cache or a plug-in the
 * config does not allow, a kind that cannot be declared, a wrong key) each say what
 * was wrong while the other clients keep reading; and, run as unprivileged users, a
 * file or a directory the trainer cannot read and a user the config does not let
 * declare (skipped, saying so, when the tests do not run as root). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 96
#define FILE_SIZE 40
#define BATCH 16
#define TEST_GROUP "ldtest-svc"
#define TEST_DECLARER "ldtest-decl"
#define TEST_OTHER "ldtest-nodecl"

/* A daemon with the configured `records` and data/train (N_FILES files) beneath
 * <dir>/data; declare_fmt is the access.declare value, DATA standing for <dir>/data
 * (NULL: no access section). */
static struct harness *declare_harness(const char *server_extra, const char *declare_fmt)
{
    struct harness *h = harness_new();
    char declare[1024] = "";
    size_t n_decl = 0;
    for (const char *q = declare_fmt; q && *q && n_decl + 1 < sizeof declare;) {
        if (strncmp(q, "DATA", 4) == 0) {
            n_decl += (size_t)snprintf(declare + n_decl, sizeof declare - n_decl, "%s/data", h->dir);
            q += 4;
        } else {
            declare[n_decl++] = *q++;
        }
        declare[n_decl < sizeof declare ? n_decl : sizeof declare - 1] = '\0';
    }
    char data[PATH_MAX];
    snprintf(data, sizeof data, "%s/data", h->dir);
    assert_int_equal(mkdir(data, 0755), 0);
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    harness_gen_files(h, "data/train", N_FILES, FILE_SIZE, 0, false);
    char datasets[2048];
    int n = snprintf(datasets, sizeof datasets, "  records:\n    kind: files\n    path: rec\n");
    if (declare_fmt)
        snprintf(datasets + n, sizeof datasets - (size_t)n, "access:\n  declare: %s\n", declare);
    harness_write_config(h, server_extra ? server_extra : "  workers: 2\n  memory_budget: 64MiB\n", datasets);
    return h;
}

/* Opens `name` (NULL with a spec) with options for an in-order epoch. */
static int open_stream(lc_client *c, const char *name, const char *spec, lc_stream **ret)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.shuffle = 0;
    o.epochs = 1;
    o.spec = spec;
    return lc_stream_open(c, name, &o, ret);
}

/* Reads the epoch; every row must be file `row` of the folder, in order. With
 * `restart`, that daemon is stopped and started again before batch `at`. Returns "" or
 * what was wrong (static). */
static const char *read_epoch_restarting(lc_stream *s, struct harness *restart, int at)
{
    static char why[256];
    uint64_t rows = 0;
    for (int k = 0;; k++) {
        if (restart && k == at) {
            assert_int_equal(harness_stop(restart), 0);
            harness_start(restart);
        }
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 20000, &b);
        if (r == LC_EEND)
            break;
        if (r < 0) {
            snprintf(why, sizeof why, "next: %s", lc_strerror(r));
            return why;
        }
        lc_field f;
        if (lc_batch_field_by_name(b, "data", &f) < 0) {
            lc_batch_release(b);
            return "no field 'data'";
        }
        for (uint32_t i = 0; i < lc_batch_rows(b); i++, rows++)
            if (!harness_file_matches(rows, (const uint8_t *)f.data + (size_t)i * FILE_SIZE, FILE_SIZE, FILE_SIZE,
                                      false)) {
                snprintf(why, sizeof why, "row %" PRIu64 " is not file %" PRIu64, rows, rows);
                lc_batch_release(b);
                return why;
            }
        lc_batch_release(b);
    }
    if (rows != N_FILES) {
        snprintf(why, sizeof why, "read %" PRIu64 " rows of %d", rows, N_FILES);
        return why;
    }
    return "";
}

static const char *read_epoch(lc_stream *s)
{
    return read_epoch_restarting(s, NULL, 0);
}

/* The open of `spec` fails with `code` and a message containing `want`. */
static void expect_refused(lc_client *c, const char *name, const char *spec, int code, const char *want)
{
    lc_stream *s = NULL;
    int r = open_stream(c, name, spec, &s);
    if (r != code || !strstr(lc_client_error(c), want))
        fail_msg("open of %s: got %d (%s) '%s', expected %d with '%s'", spec, r, lc_strerror(r), lc_client_error(c),
                 code, want);
    assert_null(s);
}

/* A declared pipeline reads exactly its files, beside a configured stream; a path
 * relative to the first root works too; the dataset goes with its last stream. */
static void test_declared_exact_cover(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, "{roots: [DATA]}");
    char spec[512];
    harness_start(h);
    assert_int_equal(harness_status_num(h, "datasets_in_memory", NULL), 1);

    lc_client *c = harness_connect(h, 5000, "declarer");
    lc_client *other = harness_connect(h, 5000, "configured");
    lc_stream *cs = NULL, *s = NULL, *rel = NULL;
    assert_int_equal(open_stream(other, "records", NULL, &cs), 0);
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/train\",\"pattern\":\"*.bin\"}", h->dir);
    if (open_stream(c, NULL, spec, &s) < 0)
        fail_msg("declared open: %s", lc_client_error(c));
    assert_int_equal(lc_stream_samples_per_epoch(s), N_FILES);
    /* Relative to the first root. */
    assert_int_equal(open_stream(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &rel), 0);
    assert_int_equal(harness_status_num(h, "datasets_in_memory", NULL), 3);
    const char *why = read_epoch(s);
    if (*why)
        fail_msg("declared stream: %s", why);
    why = read_epoch(cs);
    if (*why)
        fail_msg("configured stream beside it: %s", why);
    /* `streams` shows where the declared dataset is. */
    char out[16384];
    assert_int_equal(harness_ctl(h, out, sizeof out, "streams", NULL), 0);
    assert_non_null(strstr(out, "spec:train"));
    /* loaderctl read declares as a trainer does, or refines a configured dataset. */
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "--spec", "{\"kind\":\"files\",\"path\":\"train\"}",
                                 NULL), 0);
    assert_non_null(strstr(out, "loaderctl read spec: batch 64"));
    assert_non_null(strstr(out, "epoch 0: 96 samples"));
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "records", "--spec", "{\"on_error\":\"fail\"}",
                                 NULL), 0);
    assert_non_null(strstr(out, "loaderctl read records+spec: batch 64"));
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "--spec", "{\"kind\":\"files\",\"path\":\"/etc\"}",
                                 NULL), 1);
    assert_non_null(strstr(out, "is outside the roots"));
    lc_stream_close(s);
    lc_stream_close(rel);
    lc_stream_close(cs);
    harness_flush_releases(c);
    /* Freed with its last stream (stream memory goes once running work ends). */
    double live = 0;
    for (int i = 0; i < 100 && (live = harness_status_num(h, "datasets_in_memory", NULL)) != 1; i++)
        usleep(20000);
    assert_int_equal(live, 1);
    lc_client_close(c);
    lc_client_close(other);
    harness_stop_clean(h);
    harness_free(h);
}

/* A daemon restart under a declared stream: the client declares it again and goes on
 * with the very next batch. */
static void test_declared_survives_restart(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, "{roots: [DATA]}");
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "restart");
    lc_stream *s = NULL;
    /* Through the socket: the hand-off may have handed over the whole (short) epoch
     * before the restart, and then there is nothing to reopen. */
    char *was = getenv("LOADERD_HANDOFF") ? strdup(getenv("LOADERD_HANDOFF")) : NULL;
    setenv("LOADERD_HANDOFF", "socket", 1);
    assert_int_equal(open_stream(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &s), 0);
    if (was)
        setenv("LOADERD_HANDOFF", was, 1);
    else
        unsetenv("LOADERD_HANDOFF");
    free(was);
    const char *why = read_epoch_restarting(s, h, 2);
    if (*why)
        fail_msg("across the restart: %s", why);
    assert_int_equal(lc_stream_reopens(s), 1);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* A configured dataset refined by the trainer: its own keys, the operator's source. */
static void test_template_refined(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, "{roots: [DATA]}");
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "refiner");
    lc_stream *s = NULL;
    if (open_stream(c, "records", "{\"on_error\":\"fail\",\"read_timeout\":5}", &s) < 0)
        fail_msg("template open: %s", lc_client_error(c));
    const char *why = read_epoch(s);
    if (*why)
        fail_msg("refined stream: %s", why);
    lc_stream_close(s);
    /* The source is the operator's; keys are checked as in the config. */
    expect_refused(c, "records", "{\"path\":\"/etc\"}", LC_EDENIED, "spec.path: the source of template 'records'");
    expect_refused(c, "records", "{\"connection\":\"host=/tmp dbname=x\"}", LC_EDENIED,
                   "spec.connection: the source of template 'records'");
    expect_refused(c, "records", "{\"read_timeout\":-1}", LC_ECONFIG, "spec.read_timeout: ");
    expect_refused(c, "nosuch", "{}", LC_ENODATASET, "no dataset named 'nosuch'");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* Each refusal names what was wrong; a configured stream reads on through them. */
static void test_refusals(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, "{roots: [DATA]}");
    char path[PATH_MAX], target[PATH_MAX], spec[1024];
    snprintf(path, sizeof path, "%s/secret", h->dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/data/escape", h->dir);
    snprintf(target, sizeof target, "%s/rec", h->dir);
    assert_int_equal(symlink(target, path), 0);
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "refused");
    lc_client *other = harness_connect(h, 5000, "bystander");
    lc_stream *cs = NULL;
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    o.shuffle = 0;
    assert_int_equal(lc_stream_open(other, "records", &o, &cs), 0);
    uint64_t served = 0;

    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"/etc\"}", LC_EDENIED,
                   "spec.path '/etc' is outside the roots");
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/../rec\"}", h->dir);
    expect_refused(c, NULL, spec, LC_EDENIED, "has a '..' component");
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/escape\"}", h->dir);
    expect_refused(c, NULL, spec, LC_EDENIED, "data/escape' leads outside the allowed root");
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"nothere\"}", LC_ENOENT, "no such directory");
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{\"path\":\"c.ldc\"}}", LC_EDENIED,
                   "may not declare a cache");
    expect_refused(c, NULL, "{\"kind\":\"image_folder\",\"path\":\"train\",\"transforms\":[{\"decode\":{}},"
                   "{\"plugin\":{\"path\":\"/x.so\"}},{\"resize\":{\"height\":8,\"width\":8}}]}", LC_EDENIED,
                   "spec.transforms[1]: ");
    expect_refused(c, NULL, "{\"kind\":\"token_windows\",\"path\":\"train\",\"context\":8}", LC_ENOTSUP,
                   "spec.kind: a trainer may declare files and image_folder");
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"follow_links\":\"outside\"}", LC_EDENIED,
                   "spec.follow_links");
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"patern\":\"*\"}", LC_ECONFIG,
                   "unknown key 'patern' in 'spec'");
    /* The scheduling is the operator's. */
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"weight\":1000}", LC_EDENIED,
                   "spec.weight: a dataset's share of the workers is the operator's");
    expect_refused(c, "records", "{\"max_share\":1}", LC_EDENIED, "spec.max_share: ");
    /* The bystander's stream went on. */
    for (int i = 0; i < 5; i++) {
        lc_batch *b = NULL;
        assert_int_equal(lc_stream_next(cs, 10000, &b), 0);
        served += lc_batch_rows(b);
        lc_batch_release(b);
    }
    assert_int_equal(served, 20);
    /* And this connection still works. */
    lc_stream *s = NULL;
    assert_int_equal(open_stream(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &s), 0);
    lc_stream_close(s);
    lc_stream_close(cs);
    lc_client_close(c);
    lc_client_close(other);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "declared dataset refused: permission denied"));
    free(log);
    harness_stop_clean(h);
    harness_free(h);
}

/* An image_folder spec on <dir>/data/<sub> whose pipeline has the invert plug-in. */
static void image_spec(char *buf, size_t size, const char *dir, const char *sub, const char *bindir)
{
    snprintf(buf, size, "{\"kind\":\"image_folder\",\"path\":\"%s/data/%s\",\"transforms\":[{\"decode\":{}},"
             "{\"resize\":{\"height\":16,\"width\":16}},{\"plugin\":{\"path\":\"%s/../lib/"
             "ld-plugin-invert.so\"}},{\"to_dtype\":{\"dtype\":\"uint8\"}}]}", dir, sub, bindir);
}

/* A plug-in where the grant of the dataset's root allows it, refused where that
 * grant does not (whatever another grant says). */
static void test_plugin_granted(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, "[{roots: [DATA/img], plugins: true}, {roots: [DATA]}]");
    const char *bin = getenv("LOADERD_BIN") ? getenv("LOADERD_BIN") : "build/bin/loaderd";
    char tmp[PATH_MAX], bindir[PATH_MAX], cmd[PATH_MAX * 3], spec[PATH_MAX * 3];
    snprintf(tmp, sizeof tmp, "%s", bin);
    char *slash = strrchr(tmp, '/');
    if (slash)
        *slash = '\0';
    assert_non_null(realpath(slash ? tmp : ".", bindir));
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s/ld-genimages %s/data/%s --count 8 --classes 2 --min 48 --max 64 >/dev/null",
                 bindir, h->dir, k ? "pics" : "img");
        assert_int_equal(system(cmd), 0);
    }
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "plugins");
    image_spec(spec, sizeof spec, h->dir, "img", bindir);
    lc_stream *s = NULL;
    if (open_stream(c, NULL, spec, &s) < 0)
        fail_msg("plug-in where granted: %s", lc_client_error(c));
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 20000, &b), 0);
    assert_int_equal(lc_batch_rows(b), 8);
    lc_batch_release(b);
    lc_stream_close(s);
    image_spec(spec, sizeof spec, h->dir, "pics", bindir);
    expect_refused(c, NULL, spec, LC_EDENIED, "the access.declare entry of its root does not say plugins: true");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* Without access.declare nobody declares, root included. */
static void test_declaring_off(void **state)
{
    (void)state;
    struct harness *h = declare_harness(NULL, NULL);
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "off");
    expect_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"data/train\"}", LC_EDENIED, "declaring is off");
    expect_refused(c, "records", "{\"on_error\":\"fail\"}", LC_EDENIED, "declaring is off");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* ---- as unprivileged users -------------------------------------------------------- */

/* Runs the open of `spec` as uid/gid in a child; "ok" when the epoch read exactly,
 * else the library's code and message. */
static void open_as(struct harness *h, uid_t uid, gid_t gid, const char *spec, char *msg, size_t size)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(fds[0]);
        harness_become(uid, gid);
        setenv("LOADERD_UID", "0", 1);
        lc_client *c = NULL;
        char err[1024];
        int r = lc_connect(h->socket, 5000, "unprivileged", &c, err, sizeof err);
        lc_stream *s = NULL;
        if (r == 0 && (r = open_stream(c, NULL, spec, &s)) < 0)
            snprintf(err, sizeof err, "%s", lc_client_error(c));
        if (r == 0) {
            const char *why = read_epoch(s);
            snprintf(err, sizeof err, "%s", *why ? why : "ok");
        }
        dprintf(fds[1], "%d %s", r, err);
        lc_client_close(c);
        _exit(0);
    }
    close(fds[1]);
    ssize_t n = 0, got;
    while ((got = read(fds[0], msg + n, size - 1 - (size_t)n)) > 0)
        n += got;
    msg[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int wst;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst));
    if (WEXITSTATUS(wst) == 120)
        fail_msg("the child could not become uid %u", (unsigned)uid);
}

static void expect_as(struct harness *h, uid_t uid, gid_t gid, const char *spec, const char *want)
{
    char msg[1200];
    open_as(h, uid, gid, spec, msg, sizeof msg);
    if (!strstr(msg, want)) {
        char *log = harness_log(h);
        print_error("loaderd log:\n%s\n", log);
        free(log);
        fail_msg("as uid %u, open of %s gave '%s', expected '%s'", (unsigned)uid, spec, msg, want);
    }
}

static void test_as_trainer(void **state)
{
    (void)state;
    uid_t uid, other;
    gid_t gid, ogid;
    if (harness_test_user(TEST_DECLARER, TEST_GROUP, &uid, &gid) < 0 ||
        harness_test_user(TEST_OTHER, TEST_GROUP, &other, &ogid) < 0) {
        print_message("skipped: creating a second user needs root\n");
        skip();
    }
    struct harness *h = declare_harness("  workers: 2\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n",
                                           "[{users: [" TEST_DECLARER "], roots: [DATA]}]");
    /* The users may reach the tree, not list the test's directory. */
    assert_int_equal(chmod(h->dir, 0711), 0);
    char p[PATH_MAX];
    harness_gen_files(h, "data/closed", 8, FILE_SIZE, 0, false);
    snprintf(p, sizeof p, "%s/data/closed/0000005.bin", h->dir);
    assert_int_equal(chmod(p, 0600), 0);
    snprintf(p, sizeof p, "%s/data/locked", h->dir);
    assert_int_equal(mkdir(p, 0755), 0);
    harness_gen_files(h, "data/locked/in", 8, FILE_SIZE, 0, false);
    snprintf(p, sizeof p, "%s/data/locked/in", h->dir);
    assert_int_equal(chmod(p, 0700), 0);
    harness_start(h);
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"train\"}", "0 ok");
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"closed\"}", "cannot read '");
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"closed\"}", "closed/0000005.bin' (mode 0600");
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"locked\"}", "cannot list the directory '");
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"locked/in\"}", "locked/in' (mode 0700");
    expect_as(h, other, ogid, "{\"kind\":\"files\",\"path\":\"train\"}", "may not declare datasets");
    expect_as(h, other, ogid, "{\"kind\":\"files\",\"path\":\"train\"}", TEST_OTHER);
    harness_stop_clean(h);
    harness_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_exact_cover),
        cmocka_unit_test(test_declared_survives_restart),
        cmocka_unit_test(test_template_refined),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_plugin_granted),
        cmocka_unit_test(test_declaring_off),
        cmocka_unit_test(test_as_trainer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
