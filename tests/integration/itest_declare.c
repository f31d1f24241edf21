/* itest_declare — datasets a trainer declares at open, against a real loaderd: a
 * declared pipeline delivers its files exactly once and is freed with its last stream;
 * a configured dataset refined as a template; the refusals (declaring off, a path
 * outside the roots, "..", a symbolic link leading out, a cache or a plug-in the
 * config does not allow, a kind that cannot be declared, a wrong key) each say what
 * was wrong while the other clients keep reading; and, run as unprivileged users, a
 * file or a directory the trainer cannot read and a user the config does not let
 * declare (skipped, saying so, when the tests do not run as root); a trainer's cache in
 * a directory of its uid's (the caches themselves: itest_declare_cache.c). The scan
 * runs off the loop: stuck on a file system that does not answer (FUSE, as root), it
 * holds up neither the other clients nor, past its own reply, its connection's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "harness.h"
#include "harness_declare.h"
#include "loaderclient.h"

#define TEST_GROUP "ldtest-svc"
#define TEST_DECLARER "ldtest-decl"
#define TEST_OTHER "ldtest-nodecl"

/* A declared pipeline reads exactly its files, beside a configured stream; a path
 * relative to the first root works too; the dataset goes with its last stream. */
static void test_declared_exact_cover(void **state)
{
    (void)state;
    struct harness *h = harness_declare_new(NULL, "{roots: [DATA]}");
    char spec[512];
    harness_start(h);
    assert_int_equal(harness_status_num(h, "datasets_in_memory", NULL), 1);

    lc_client *c = harness_connect(h, 5000, "declarer");
    lc_client *other = harness_connect(h, 5000, "configured");
    lc_stream *cs = NULL, *s = NULL, *rel = NULL;
    assert_int_equal(harness_declare_open(other, "records", NULL, &cs), 0);
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/train\",\"pattern\":\"*.bin\"}", h->dir);
    if (harness_declare_open(c, NULL, spec, &s) < 0)
        fail_msg("declared open: %s", lc_client_error(c));
    assert_int_equal(lc_stream_samples_per_epoch(s), DECLARE_N_FILES);
    /* Relative to the first root. */
    assert_int_equal(harness_declare_open(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &rel), 0);
    assert_int_equal(harness_status_num(h, "datasets_in_memory", NULL), 3);
    const char *why = harness_declare_read_epoch(s);
    if (*why)
        fail_msg("declared stream: %s", why);
    why = harness_declare_read_epoch(cs);
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
    struct harness *h = harness_declare_new(NULL, "{roots: [DATA]}");
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "restart");
    lc_stream *s = NULL;
    /* Through the socket: the hand-off may have handed over the whole (short) epoch
     * before the restart, and then there is nothing to reopen. */
    char *was = getenv("LOADERD_HANDOFF") ? strdup(getenv("LOADERD_HANDOFF")) : NULL;
    setenv("LOADERD_HANDOFF", "socket", 1);
    assert_int_equal(harness_declare_open(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &s), 0);
    if (was)
        setenv("LOADERD_HANDOFF", was, 1);
    else
        unsetenv("LOADERD_HANDOFF");
    free(was);
    const char *why = harness_declare_read_epoch_restarting(s, h, 2);
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
    struct harness *h = harness_declare_new(NULL, "{roots: [DATA]}");
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "refiner");
    lc_stream *s = NULL;
    if (harness_declare_open(c, "records", "{\"on_error\":\"fail\",\"read_timeout\":5}", &s) < 0)
        fail_msg("template open: %s", lc_client_error(c));
    const char *why = harness_declare_read_epoch(s);
    if (*why)
        fail_msg("refined stream: %s", why);
    lc_stream_close(s);
    /* The source is the operator's; keys are checked as in the config. */
    harness_declare_refused(c, "records", "{\"path\":\"/etc\"}", LC_EDENIED, "spec.path: the source of template 'records'");
    harness_declare_refused(c, "records", "{\"connection\":\"host=/tmp dbname=x\"}", LC_EDENIED,
                   "spec.connection: the source of template 'records'");
    harness_declare_refused(c, "records", "{\"read_timeout\":-1}", LC_ECONFIG, "spec.read_timeout: ");
    harness_declare_refused(c, "nosuch", "{}", LC_ENODATASET, "no dataset named 'nosuch'");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* Each refusal names what was wrong; a configured stream reads on through them. */
static void test_refusals(void **state)
{
    (void)state;
    struct harness *h = harness_declare_new(NULL, "{roots: [DATA]}");
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

    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"/etc\"}", LC_EDENIED,
                   "spec.path '/etc' is outside the roots");
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/../rec\"}", h->dir);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "has a '..' component");
    snprintf(spec, sizeof spec, "{\"kind\":\"files\",\"path\":\"%s/data/escape\"}", h->dir);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "data/escape' leads outside the allowed root");
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"nothere\"}", LC_ENOENT, "no such directory");
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{\"path\":\"c.ldc\"}}", LC_EDENIED,
                   "may not declare a cache");
    harness_declare_refused(c, NULL, "{\"kind\":\"image_folder\",\"path\":\"train\",\"transforms\":[{\"decode\":{}},"
                   "{\"plugin\":{\"path\":\"/x.so\"}},{\"resize\":{\"height\":8,\"width\":8}}]}", LC_EDENIED,
                   "spec.transforms[1]: ");
    harness_declare_refused(c, NULL, "{\"kind\":\"token_windows\",\"path\":\"train\",\"context\":8}", LC_ENOTSUP,
                   "spec.kind: a trainer may declare files and image_folder");
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"follow_links\":\"outside\"}", LC_EDENIED,
                   "spec.follow_links");
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"patern\":\"*\"}", LC_ECONFIG,
                   "unknown key 'patern' in 'spec'");
    /* The scheduling is the operator's. */
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"train\",\"weight\":1000}", LC_EDENIED,
                   "spec.weight: a dataset's share of the workers is the operator's");
    harness_declare_refused(c, "records", "{\"max_share\":1}", LC_EDENIED, "spec.max_share: ");
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
    assert_int_equal(harness_declare_open(c, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &s), 0);
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
    struct harness *h = harness_declare_new(NULL, "[{roots: [DATA/img], plugins: true}, {roots: [DATA]}]");
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
    if (harness_declare_open(c, NULL, spec, &s) < 0)
        fail_msg("plug-in where granted: %s", lc_client_error(c));
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 20000, &b), 0);
    assert_int_equal(lc_batch_rows(b), 8);
    lc_batch_release(b);
    lc_stream_close(s);
    image_spec(spec, sizeof spec, h->dir, "pics", bindir);
    harness_declare_refused(c, NULL, spec, LC_EDENIED, "the access.declare entry of its root does not say plugins: true");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* Without access.declare nobody declares, root included. */
static void test_declaring_off(void **state)
{
    (void)state;
    struct harness *h = harness_declare_new(NULL, NULL);
    harness_start(h);
    lc_client *c = harness_connect(h, 5000, "off");
    harness_declare_refused(c, NULL, "{\"kind\":\"files\",\"path\":\"data/train\"}", LC_EDENIED, "declaring is off");
    harness_declare_refused(c, "records", "{\"on_error\":\"fail\"}", LC_EDENIED, "declaring is off");
    lc_client_close(c);
    harness_stop_clean(h);
    harness_free(h);
}

/* ---- the scan off the loop ------------------------------------------------------------ */

/* Mounts a FUSE file system on `dir` that never answers (its device is never read):
 * whatever touches it waits until the returned descriptor is closed, then fails. -1
 * when this process cannot mount (not root, no /dev/fuse). */
static int stuck_mount(const char *dir)
{
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char opts[128];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
    if (mount("ldtest-stuck", dir, "fuse", MS_NOSUID | MS_NODEV, opts) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether the log holds `what` at least n times. */
static bool log_has(struct harness *h, const char *what, int n)
{
    char *log = harness_log(h);
    int k = 0;
    for (const char *p = strstr(log, what); p; p = strstr(p + 1, what))
        k++;
    free(log);
    return k >= n;
}

static void wait_log(struct harness *h, const char *what, int n)
{
    int i = 0;
    while (i++ < 1000 && !log_has(h, what, n))
        usleep(20000);
    if (!log_has(h, what, n))
        fail_msg("the log never said '%s' %d times", what, n);
}

/* A declared open whose tree does not answer: the other clients are served, and this
 * connection's next request waits behind the open's reply, which comes when the scan
 * ends; a client gone meanwhile leaves nothing behind. */
static void test_scan_off_the_loop(void **state)
{
    (void)state;
    struct harness *h = harness_declare_new(NULL, "{roots: [DATA]}");
    char stuck[PATH_MAX];
    snprintf(stuck, sizeof stuck, "%s/data/stuck", h->dir);
    assert_int_equal(mkdir(stuck, 0755), 0);
    harness_start(h);
    int fuse = stuck_mount(stuck);
    if (fuse < 0) {
        harness_stop_clean(h);
        harness_free(h);
        print_message("skipped: mounting a FUSE file system needs root and /dev/fuse\n");
        skip();
    }
    int raw = harness_raw_connect(h);
    harness_raw_send(raw, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(raw, 5000));
    harness_raw_send(raw, "{\"op\":\"open\",\"id\":2,\"batch_size\":4,\"spec\":{\"kind\":\"files\",\"path\":\"stuck\"}}");
    harness_raw_send(raw, "{\"op\":\"status\",\"id\":3}");
    wait_log(h, "scanning and checking on a thread", 1);
    /* Stuck for as long as the file system does not answer; meanwhile, another client. */
    lc_client *other = harness_connect(h, 5000, "bystander");
    lc_stream *s = NULL;
    assert_int_equal(harness_declare_open(other, "records", NULL, &s), 0);
    assert_string_equal(harness_declare_read_epoch(s), "");
    lc_stream_close(s);
    char out[4096];
    assert_int_equal(harness_ctl(h, out, sizeof out, "status", NULL), 0);
    char *r = harness_raw_reply(raw, 0);
    if (r)
        fail_msg("a reply came while the scan was stuck: %s", r);
    /* The file system gives up: the open's error, then the status behind it. */
    close(fuse);
    r = harness_raw_reply(raw, 20000);
    assert_non_null(r);
    if (!strstr(r, "\"id\":2") || !strstr(r, "\"ok\":false"))
        fail_msg("the open's reply: %s", r);
    free(r);
    r = harness_raw_reply(raw, 20000);
    assert_non_null(r);
    assert_non_null(strstr(r, "\"id\":3"));
    free(r);
    close(raw);
    assert_int_equal(umount2(stuck, MNT_DETACH), 0);

    /* The client goes while its scan is stuck. */
    fuse = stuck_mount(stuck);
    assert_true(fuse >= 0);
    raw = harness_raw_connect(h);
    harness_raw_send(raw, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(raw, 5000));
    harness_raw_send(raw, "{\"op\":\"open\",\"id\":2,\"batch_size\":4,\"spec\":{\"kind\":\"files\",\"path\":\"stuck\"}}");
    wait_log(h, "scanning and checking on a thread", 2);
    close(raw);
    close(fuse);
    wait_log(h, "dropped after its scan", 1);
    assert_int_equal(umount2(stuck, MNT_DETACH), 0);
    assert_int_equal(harness_status_num(h, "datasets_in_memory", NULL), 1);

    /* One user's stuck scans hold at most four of the daemon's: a fifth is told at once
     * to try again, on another connection (its replies wait behind no scan). */
    fuse = stuck_mount(stuck);
    assert_true(fuse >= 0);
    raw = harness_raw_connect(h);
    harness_raw_send(raw, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(raw, 5000));
    for (int i = 0; i < 4; i++) {
        char req[256];
        snprintf(req, sizeof req, "{\"op\":\"open\",\"id\":%d,\"batch_size\":4,\"spec\":{\"kind\":\"files\","
                 "\"path\":\"stuck\"}}", 2 + i);
        harness_raw_send(raw, req);
    }
    wait_log(h, "scanning and checking on a thread", 6);
    harness_declare_refused(other, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", LC_EBUSY,
                            "4 declared datasets of uid 0 are being scanned: try again once one is open");
    close(fuse);
    for (int i = 0; i < 4; i++) {
        r = harness_raw_reply(raw, 20000);
        assert_non_null(r);
        if (!strstr(r, "\"ok\":false"))
            fail_msg("a stuck scan's reply: %s", r);
        free(r);
    }
    close(raw);
    assert_int_equal(umount2(stuck, MNT_DETACH), 0);
    /* Once they are done, the user declares again. */
    assert_int_equal(harness_declare_open(other, NULL, "{\"kind\":\"files\",\"path\":\"train\"}", &s), 0);
    assert_string_equal(harness_declare_read_epoch(s), "");
    lc_stream_close(s);
    lc_client_close(other);
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
        if (r == 0 && (r = harness_declare_open(c, NULL, spec, &s)) < 0)
            snprintf(err, sizeof err, "%s", lc_client_error(c));
        if (r == 0) {
            const char *why = harness_declare_read_epoch(s);
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

/* How many declared caches `status` shows to uid/gid (run in a child). */
static int declared_seen_as(struct harness *h, uid_t uid, gid_t gid)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(fds[0]);
        harness_become(uid, gid);
        lc_client *c = NULL;
        char err[1024], *json = NULL;
        int n = -1;
        if (lc_connect(h->socket, 5000, "looker", &c, err, sizeof err) == 0 &&
            lc_request_json(c, "{\"op\":\"status\"}", &json) == 0) {
            cJSON *st = cJSON_Parse(json);
            const cJSON *it;
            n = 0;
            cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(st, "caches"))
                n += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "declared"));
            cJSON_Delete(st);
            lc_free(json);
        }
        dprintf(fds[1], "%d", n);
        lc_client_close(c);
        _exit(0);
    }
    close(fds[1]);
    char buf[32] = "";
    ssize_t got = read(fds[0], buf, sizeof buf - 1);
    buf[got > 0 ? got : 0] = '\0';
    close(fds[0]);
    int wst;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst));
    return atoi(buf);
}

/* Holds a stream on `spec` open as uid/gid in a child until *go is written; returns
 * the child (ready once this returns). */
static pid_t hold_as(struct harness *h, uid_t uid, gid_t gid, const char *spec, int go[2])
{
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        close(go[1]);
        harness_become(uid, gid);
        setenv("LOADERD_UID", "0", 1);
        lc_client *c = NULL;
        lc_stream *s = NULL;
        char err[1024], byte = 'x';
        if (lc_connect(h->socket, 5000, "holder", &c, err, sizeof err) < 0 ||
            harness_declare_open(c, NULL, spec, &s) < 0)
            byte = 'e';
        assert_int_equal(write(ready[1], &byte, 1), 1);
        (void)!read(go[0], &byte, 1);
        lc_client_close(c);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char byte = 0;
    assert_int_equal(read(ready[0], &byte, 1), 1);
    close(ready[0]);
    assert_int_equal(byte, 'x');
    return child;
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
    struct harness *h = harness_declare_new("  workers: 2\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n",
                                           "[{users: [" TEST_DECLARER "], roots: [DATA], caches: true, "
                                           "cache_dir: CACHE, cache_quota: 1MiB}]");
    /* The users may reach the tree, not list the test's directory. */
    assert_int_equal(chmod(h->dir, 0711), 0);
    char p[PATH_MAX];
    harness_gen_files(h, "data/closed", 8, DECLARE_FILE_SIZE, 0, false);
    snprintf(p, sizeof p, "%s/data/closed/0000005.bin", h->dir);
    assert_int_equal(chmod(p, 0600), 0);
    snprintf(p, sizeof p, "%s/data/locked", h->dir);
    assert_int_equal(mkdir(p, 0755), 0);
    harness_gen_files(h, "data/locked/in", 8, DECLARE_FILE_SIZE, 0, false);
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
    /* A trainer's cache goes in a directory of its uid's that only the daemon may enter. */
    expect_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{}}", "0 ok");
    struct stat st;
    snprintf(p, sizeof p, "%s/dcache/0", h->dir);
    assert_int_equal(stat(p, &st), -1);
    snprintf(p, sizeof p, "%s/dcache/%u", h->dir, (unsigned)uid);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(st.st_uid, getuid());
    /* Which caches a user trains on is theirs: status lists a declared cache to its
     * user and to root (and access.operators), not to another user of the socket. */
    int go[2];
    pid_t holder = hold_as(h, uid, gid, "{\"kind\":\"files\",\"path\":\"train\",\"cache\":{}}", go);
    /* (the earlier open's cache may still be listed until the tick reaps its keeper) */
    assert_true(declared_seen_as(h, uid, gid) >= 1);
    assert_int_equal(declared_seen_as(h, other, ogid), 0);
    assert_true(declared_seen_as(h, 0, 0) >= 1);
    assert_int_equal(write(go[1], "g", 1), 1);
    close(go[1]);
    int wst;
    waitpid(holder, &wst, 0);
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
        cmocka_unit_test(test_scan_off_the_loop),
        cmocka_unit_test(test_as_trainer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
