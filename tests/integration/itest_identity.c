/* itest_identity — who talks to whom, against a real loaderd: a client refuses a
 * daemon that runs as an unexpected user (a squatter on the socket, or a wrong
 * LOADERD_UID), the daemon and the client find the same default socket, and a trainer
 * of another user in the daemon's group can map the rings (socket_group).
 *
 * The tests that need a second user create one (useradd) and run the trainer or the
 * squatter as that user in a forked child (and the daemon as a service user); they are skipped, saying so, when the tests
 * do not run as root. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include <cJSON.h>
#include "loaderclient.h"

#define N_FILES 120
#define FILE_SIZE 48
#define TEST_GROUP "ldtest-svc"
#define TEST_TRAINER "ldtest-trainer"
#define TEST_SERVICE "ldtest-svcd"
#define TEST_SQUATTER "ldtest-squat"

static const char datasets_yaml[] = "  records:\n"
                                    "    kind: files\n"
                                    "    path: rec\n";

static struct harness *identity_harness(const char *server_extra)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    harness_write_config(h, server_extra ? server_extra : "  workers: 1\n  memory_budget: 64MiB\n", datasets_yaml);
    return h;
}

static void set_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

static char *save_env(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

/* A daemon whose uid is not the expected one is refused before a byte is sent, with
 * both uids in the message; LOADERD_UID (a number or a name) sets the expected one. */
static void test_expected_daemon_uid(void **state)
{
    (void)state;
    struct harness *h = identity_harness(NULL);
    harness_start(h);
    char *saved = save_env("LOADERD_UID");
    char err[1024], want[160];
    lc_client *c = NULL;
    uid_t other = getuid() == 4242 ? 4243 : 4242;
    snprintf(want, sizeof want, "%u", (unsigned)other);
    setenv("LOADERD_UID", want, 1);
    assert_int_equal(lc_connect(h->socket, 5000, "wrong-uid", &c, err, sizeof err), LC_EPERM);
    assert_null(c);
    snprintf(want, sizeof want, "runs as uid %u, but loaderd is expected to run as uid %u (LOADERD_UID)",
             (unsigned)getuid(), (unsigned)other);
    if (!strstr(err, want))
        fail_msg("message '%s' lacks '%s'", err, want);
    /* loaderctl says the same, and --daemon-uid sets it. */
    char out[2048];
    unsetenv("LOADERD_UID");
    snprintf(want, sizeof want, "%u", (unsigned)other);
    assert_int_equal(harness_ctl(h, out, sizeof out, "--daemon-uid", want, "status", NULL), 1);
    assert_non_null(strstr(out, "refusing to talk to it"));
    setenv("LOADERD_UID", "no-such-user-here", 1);
    assert_int_equal(lc_connect(h->socket, 5000, "bad-env", &c, err, sizeof err), LC_EINVAL);
    assert_non_null(strstr(err, "neither a uid nor a user name"));
    /* The right one, by number: accepted. */
    snprintf(want, sizeof want, "%u", (unsigned)getuid());
    setenv("LOADERD_UID", want, 1);
    c = harness_connect(h, 5000, "right-uid");
    lc_client_close(c);
    set_env("LOADERD_UID", saved);
    free(saved);
    harness_stop_clean(h);
    harness_free(h);
}

/* Another user binds the socket path first (the squatting of a socket in a shared
 * directory): the client refuses to talk to it, naming the squatter's uid. */
static void test_squatter_refused(void **state)
{
    (void)state;
    uid_t uid;
    gid_t gid;
    if (harness_test_user(TEST_SQUATTER, TEST_GROUP, &uid, &gid) < 0) {
        print_message("skipped: creating a second user needs root\n");
        skip();
    }
    struct harness *h = harness_new();
    char shared[90], path[104];
    snprintf(shared, sizeof shared, "%s/shared", h->dir);
    snprintf(path, sizeof path, "%s/loaderd.sock", shared);
    assert_int_equal(mkdir(shared, 0777), 0);
    assert_int_equal(chmod(shared, 01777), 0); /* like /tmp */
    assert_int_equal(chmod(h->dir, 0711), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        harness_become(uid, gid);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        umask(0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 8) < 0)
            _exit(2);
        if (write(ready[1], "x", 1) != 1)
            _exit(3);
        for (;;) { /* accept and hold: an impostor that would answer anything */
            int cfd = accept(fd, NULL, NULL);
            (void)cfd;
        }
    }
    close(ready[1]);
    char x;
    assert_int_equal(read(ready[0], &x, 1), 1);
    close(ready[0]);
    char *saved = save_env("LOADERD_UID");
    unsetenv("LOADERD_UID");
    lc_client *c = NULL;
    char err[1024], want[96];
    int r = lc_connect(path, 5000, "victim", &c, err, sizeof err);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    set_env("LOADERD_UID", saved);
    free(saved);
    assert_int_equal(r, LC_EPERM);
    assert_null(c);
    snprintf(want, sizeof want, "runs as uid %u", (unsigned)uid);
    if (!strstr(err, want) || !strstr(err, "refusing to talk to it"))
        fail_msg("message '%s' lacks '%s'", err, want);
    unlink(path);
    harness_free(h);
}

/* The documented service layout: the daemon runs as a service user whose group is
 * server.socket_group, and a trainer of another user in that group connects (naming the
 * daemon's user in LOADERD_UID) and reads every byte: the rings carry the group and mode
 * 0640 (before, they were 0600 and open failed). Without LOADERD_UID the trainer refuses
 * a daemon that is neither itself nor root. */
static void test_group_trainer_reads(void **state)
{
    (void)state;
    uid_t uid, svc_uid;
    gid_t gid, svc_gid;
    if (harness_test_user(TEST_SERVICE, TEST_GROUP, &svc_uid, &svc_gid) < 0 ||
        harness_test_user(TEST_TRAINER, TEST_GROUP, &uid, &gid) < 0) {
        print_message("skipped: creating a second user needs root\n");
        skip();
    }
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    /* The service's runtime directory (systemd's RuntimeDirectory=, mode 0750). */
    char run[96];
    snprintf(run, sizeof run, "%s/run", h->dir);
    assert_int_equal(mkdir(run, 0750), 0);
    assert_int_equal(chown(run, svc_uid, svc_gid), 0);
    snprintf(h->socket, sizeof h->socket, "%s/s.sock", run);
    harness_write_config(h, "  workers: 1\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n",
                         datasets_yaml);
    assert_int_equal(chmod(h->dir, 0711), 0); /* the users may reach what is theirs, not list the rest */
    h->run_uid = svc_uid;
    h->run_gid = svc_gid;
    harness_start(h);
    struct stat st;
    assert_int_equal(stat(h->socket, &st), 0);
    assert_int_equal(st.st_uid, svc_uid);
    assert_int_equal(st.st_gid, gid);
    assert_int_equal(st.st_mode & 0777, 0660);
    int status_pipe[2];
    assert_int_equal(pipe(status_pipe), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(status_pipe[0]);
        harness_become(uid, gid);
        lc_client *c = NULL;
        char err[1024];
        /* Not told who the daemon is: a daemon of another user is refused. */
        unsetenv("LOADERD_UID");
        int r = lc_connect(h->socket, 5000, "group-trainer", &c, err, sizeof err);
        if (r != LC_EPERM) {
            dprintf(status_pipe[1], "without LOADERD_UID, connect gave %d: %s", r, err);
            _exit(0);
        }
        setenv("LOADERD_UID", TEST_SERVICE, 1);
        r = lc_connect(h->socket, 5000, "group-trainer", &c, err, sizeof err);
        lc_stream *s = NULL;
        if (r == 0) {
            lc_stream_options o;
            lc_stream_options_init(&o);
            o.batch_size = 40;
            o.epochs = 1;
            o.shuffle = 0;
            r = lc_stream_open(c, "records", &o, &s);
            if (r < 0)
                snprintf(err, sizeof err, "%s", lc_client_error(c));
        }
        uint64_t rows = 0;
        bool exact = true;
        while (r == 0) {
            lc_batch *b = NULL;
            r = lc_stream_next(s, 5000, &b);
            if (r < 0)
                break;
            lc_field f;
            lc_batch_field_by_name(b, "data", &f);
            for (uint32_t i = 0; i < lc_batch_rows(b); i++)
                exact = exact && harness_file_matches(lc_batch_index(b) * 40 + i,
                                                      (const uint8_t *)f.data + i * FILE_SIZE, FILE_SIZE,
                                                      FILE_SIZE, false);
            rows += lc_batch_rows(b);
            lc_batch_release(b);
        }
        if (r == LC_EEND && rows == N_FILES && exact)
            snprintf(err, sizeof err, "ok");
        else if (r == LC_EEND)
            snprintf(err, sizeof err, "read %llu rows, content %s", (unsigned long long)rows,
                     exact ? "exact" : "wrong");
        dprintf(status_pipe[1], "%s", err);
        _exit(0);
    }
    close(status_pipe[1]);
    char msg[1024] = "";
    ssize_t n = 0, got;
    while ((got = read(status_pipe[0], msg + n, sizeof msg - 1 - (size_t)n)) > 0)
        n += got;
    msg[n > 0 ? n : 0] = '\0';
    close(status_pipe[0]);
    int wst;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst));
    if (WEXITSTATUS(wst) == 120)
        fail_msg("the child could not become %s", TEST_TRAINER);
    if (strcmp(msg, "ok") != 0) {
        char *log = harness_log(h);
        print_error("loaderd log:\n%s\n", log);
        free(log);
        fail_msg("the trainer in group %s (uid %u) could not read: %s", TEST_GROUP, (unsigned)uid, msg);
    }
    char *log = harness_log(h);
    assert_non_null(strstr(log, "the socket and the rings (mode 0640) belong to it"));
    free(log);
    harness_stop_clean(h);
    harness_free(h);
}

/* With no socket configured, the daemon and the library compute the same default: in a
 * private XDG_RUNTIME_DIR here (the /tmp/loaderd-UID fallback is checked by test_proto). */
static void test_default_socket_meets(void **state)
{
    (void)state;
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    char cfg[512];
    int len = snprintf(cfg, sizeof cfg, "server:\n  workers: 1\n  memory_budget: 64MiB\ndatasets:\n%s", datasets_yaml);
    harness_write_file(h, "loaderd.yaml", cfg, (size_t)len);
    char xdg[88];
    snprintf(xdg, sizeof xdg, "%s/run", h->dir);
    assert_int_equal(mkdir(xdg, 0700), 0);
    char *saved_xdg = save_env("XDG_RUNTIME_DIR"), *saved_sock = save_env("LOADERD_SOCKET");
    unsetenv("LOADERD_SOCKET");
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    snprintf(h->socket, sizeof h->socket, "%s/loaderd.sock", xdg); /* where harness_start waits */
    harness_start(h);
    lc_client *c = NULL;
    char err[512];
    assert_int_equal(lc_connect(NULL, 5000, "default", &c, err, sizeof err), 0);
    lc_client_close(c);
    set_env("XDG_RUNTIME_DIR", saved_xdg);
    set_env("LOADERD_SOCKET", saved_sock);
    free(saved_xdg);
    free(saved_sock);
    harness_stop_clean(h);
    harness_free(h);
}

/* Reads the pipe to its end into msg (NUL-terminated). */
static void read_all(int fd, char *msg, size_t size)
{
    size_t n = 0;
    ssize_t got;
    while (n + 1 < size && (got = read(fd, msg + n, size - 1 - n)) > 0)
        n += (size_t)got;
    msg[n] = '\0';
}

/* The stream of `streams --json` opened by pid, or NULL. */
static const cJSON *find_by_pid(const cJSON *list, pid_t pid)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (cJSON_IsNumber(p) && p->valuedouble == (double)pid)
            return e;
    }
    return NULL;
}

static void assert_peer(const cJSON *e, uid_t uid, gid_t gid, const char *process, const char *client)
{
    assert_non_null(e);
    assert_true(cJSON_GetObjectItemCaseSensitive(e, "uid")->valuedouble == (double)uid);
    assert_true(cJSON_GetObjectItemCaseSensitive(e, "gid")->valuedouble == (double)gid);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "process")), process);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "client")), client);
}

/* Every connection's credentials as the kernel gave them (uid, gid, pid) and its process
 * name are shown by `streams` and `status`, in JSON and for a person. As root the trainer
 * is another user (in the socket's group), so the numbers cannot be the daemon's own. */
static void test_credentials_shown(void **state)
{
    (void)state;
    uid_t uid = getuid();
    gid_t gid = getgid();
    bool other = harness_test_user(TEST_TRAINER, TEST_GROUP, &uid, &gid) == 0;
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    harness_write_config(h, other ? "  workers: 1\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n"
                                  : "  workers: 1\n  memory_budget: 64MiB\n",
                         datasets_yaml);
    if (other)
        assert_int_equal(chmod(h->dir, 0711), 0);
    harness_start(h);
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        close(done[1]);
        if (other)
            harness_become(uid, gid);
        prctl(PR_SET_NAME, "ldtest-creds", 0, 0, 0);
        lc_client *c = NULL;
        lc_stream *s = NULL;
        char err[1024];
        int r = lc_connect(h->socket, 5000, "creds-trainer", &c, err, sizeof err);
        if (r == 0) {
            lc_stream_options o;
            lc_stream_options_init(&o);
            o.batch_size = 8;
            r = lc_stream_open(c, "records", &o, &s);
            if (r < 0)
                snprintf(err, sizeof err, "%s", lc_client_error(c));
        }
        dprintf(ready[1], "%s", r == 0 ? "ok" : err);
        close(ready[1]);
        char x;
        while (read(done[0], &x, 1) > 0) /* held open until the parent has looked */
            ;
        if (s)
            lc_stream_close(s);
        lc_client_close(c);
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    char msg[1024];
    read_all(ready[0], msg, sizeof msg);
    close(ready[0]);
    if (strcmp(msg, "ok") != 0) {
        close(done[1]);
        waitpid(child, NULL, 0);
        fail_msg("the trainer could not open its stream: %s", msg);
    }
    static char out[65536];
    assert_int_equal(harness_ctl(h, out, sizeof out, "--json", "streams", NULL), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_peer(find_by_pid(cJSON_GetObjectItemCaseSensitive(j, "streams"), child), uid, gid, "ldtest-creds",
                "creds-trainer");
    cJSON_Delete(j);
    assert_int_equal(harness_ctl(h, out, sizeof out, "--json", "status", NULL), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *conns = cJSON_GetObjectItemCaseSensitive(j, "connections");
    const cJSON *e = find_by_pid(conns, child);
    assert_peer(e, uid, gid, "ldtest-creds", "creds-trainer");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(e, "streams")->valuedouble, 1);
    /* loaderctl's own connection is there too, marked as the one asking. */
    const cJSON *self = NULL, *k;
    cJSON_ArrayForEach(k, conns)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(k, "self")))
            self = k;
    assert_non_null(self);
    assert_true(cJSON_GetObjectItemCaseSensitive(self, "uid")->valuedouble == (double)getuid());
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(self, "process")), "loaderctl");
    cJSON_Delete(j);
    /* For a person: the pid and the process name in both. */
    char want[64];
    snprintf(want, sizeof want, "pid %d (ldtest-creds)", (int)child);
    assert_int_equal(harness_ctl(h, out, sizeof out, "status", NULL), 0);
    if (!strstr(out, want) || (other && !strstr(out, TEST_TRAINER "(")))
        fail_msg("status lacks '%s' (or the user's name):\n%s", want, out);
    assert_int_equal(harness_ctl(h, out, sizeof out, "streams", NULL), 0);
    snprintf(want, sizeof want, "%d", (int)child);
    if (!strstr(out, "ldtest-creds") || !strstr(out, want) || !strstr(out, "UID/GID"))
        fail_msg("streams lacks the trainer's pid %s and process name:\n%s", want, out);
    close(done[1]);
    int wst;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    harness_stop_clean(h);
    harness_free(h);
}

/* A child that becomes uid/gid, runs body and writes what body returns ("ok" or why
 * not) to the parent, which returns it in msg. */
static void run_as(struct harness *h, uid_t uid, gid_t gid, void (*body)(struct harness *h, char *msg, size_t size),
                   char *msg, size_t size)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[0]);
        harness_become(uid, gid);
        char out[2048] = "";
        body(h, out, sizeof out);
        dprintf(p[1], "%s", out);
        _exit(0);
    }
    close(p[1]);
    read_all(p[0], msg, size);
    close(p[0]);
    int wst;
    waitpid(child, &wst, 0);
    assert_true(WIFEXITED(wst));
    if (WEXITSTATUS(wst) == 120)
        fail_msg("the child could not become uid %u", (unsigned)uid);
}

/* The trainer: allowed to connect and to read `records`; denied `secret` and the
 * operator command, each with permission_denied naming what and whom, and the
 * connection serves it on after each denial. */
static void trainer_body(struct harness *h, char *msg, size_t size)
{
    lc_client *c = NULL;
    char err[1024];
    int r = lc_connect(h->socket, 5000, "acl-trainer", &c, err, sizeof err);
    if (r < 0) {
        snprintf(msg, size, "connect: %d %s", r, err);
        return;
    }
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.shuffle = 0;
    lc_stream *s = NULL;
    r = lc_stream_open(c, "secret", &o, &s);
    if (r != LC_EDENIED || !strstr(lc_client_error(c), "permission denied: uid ") ||
        !strstr(lc_client_error(c), "(" TEST_TRAINER ")") ||
        !strstr(lc_client_error(c), "may not open a stream on dataset 'secret'") ||
        !strstr(lc_client_error(c), "access.datasets.secret allows users 0 (root)")) {
        snprintf(msg, size, "open secret: %d %s", r, lc_client_error(c));
        goto out;
    }
    char *reply = NULL;
    r = lc_request_json(c, "{\"op\":\"cache_build\",\"dataset\":\"records\"}", &reply);
    lc_free(reply);
    if (r != LC_EDENIED || !strstr(lc_client_error(c), "may not run the operator command 'cache_build'") ||
        !strstr(lc_client_error(c), "access.operators")) {
        snprintf(msg, size, "cache_build: %d %s", r, lc_client_error(c));
        goto out;
    }
    r = lc_request_json(c, "{\"op\":\"reload\"}", &reply);
    lc_free(reply);
    if (r != LC_EDENIED || !strstr(lc_client_error(c), "may not run the operator command 'reload'")) {
        snprintf(msg, size, "reload: %d %s", r, lc_client_error(c));
        goto out;
    }
    /* Nothing else changed: the same connection reads the dataset it may read. */
    r = lc_stream_open(c, "records", &o, &s);
    lc_batch *b = NULL;
    if (r == 0)
        r = lc_stream_next(s, 5000, &b);
    if (r < 0) {
        snprintf(msg, size, "records after the denials: %d %s", r, lc_client_error(c));
        goto out;
    }
    lc_field f;
    lc_batch_field_by_name(b, "data", &f);
    bool exact = lc_batch_rows(b) == 10;
    for (uint32_t i = 0; exact && i < 10; i++)
        exact = harness_file_matches(i, (const uint8_t *)f.data + i * FILE_SIZE, FILE_SIZE, FILE_SIZE, false);
    lc_batch_release(b);
    snprintf(msg, size, "%s", exact ? "ok" : "records: wrong content");
out:
    lc_client_close(c);
}

/* A user the config does not let connect, though the socket lets it in. */
static void stranger_body(struct harness *h, char *msg, size_t size)
{
    lc_client *c = NULL;
    char err[1024];
    setenv("LOADERD_UID", "0", 1);
    int r = lc_connect(h->socket, 5000, "acl-stranger", &c, err, sizeof err);
    if (r == LC_EDENIED && strstr(err, "(" TEST_SQUATTER ")") && strstr(err, "may not connect to this daemon") &&
        strstr(err, "access.connect allows users ") && strstr(err, "(" TEST_TRAINER ")"))
        snprintf(msg, size, "ok");
    else
        snprintf(msg, size, "connect: %d %s", r, err);
    lc_client_close(c);
}

/* access: who may connect, open which dataset, run operator commands. Denials say what
 * and for whom; root passes every rule. */
static void test_access_rules(void **state)
{
    (void)state;
    uid_t uid, other_uid;
    gid_t gid, other_gid;
    if (harness_test_user(TEST_TRAINER, TEST_GROUP, &uid, &gid) < 0 ||
        harness_test_user(TEST_SQUATTER, TEST_GROUP, &other_uid, &other_gid) < 0) {
        print_message("skipped: creating a second user needs root\n");
        skip();
    }
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    char extra[512];
    snprintf(extra, sizeof extra,
             "  workers: 1\n  memory_budget: 64MiB\n  socket_group: " TEST_GROUP "\n"
             "access:\n"
             "  connect: {users: [" TEST_TRAINER "]}\n"
             "  operators: {users: [root]}\n"
             "  datasets:\n"
             "    secret: {users: [0]}\n");
    harness_write_config(h, extra, "  records:\n    kind: files\n    path: rec\n"
                                   "  secret:\n    kind: files\n    path: rec\n");
    assert_int_equal(chmod(h->dir, 0711), 0);
    harness_start(h);
    char msg[2048];
    setenv("LOADERD_UID", "0", 1);
    run_as(h, uid, gid, trainer_body, msg, sizeof msg);
    if (strcmp(msg, "ok") != 0)
        fail_msg("trainer: %s", msg);
    run_as(h, other_uid, other_gid, stranger_body, msg, sizeof msg);
    unsetenv("LOADERD_UID");
    if (strcmp(msg, "ok") != 0)
        fail_msg("stranger: %s", msg);
    /* Root passes: the operator command reaches the dataset (which has no cache). */
    static char out[8192];
    assert_int_equal(harness_ctl(h, out, sizeof out, "cache", "build", "records", NULL), 1);
    if (!strstr(out, "has no cache configured"))
        fail_msg("root's cache build: %s", out);
    lc_client *c = harness_connect(h, 5000, "root-reader");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "secret", &o, &s), 0);
    lc_client_close(c);
    char *log = harness_log(h);
    bool logged = strstr(log, "may not connect") && strstr(log, "may not open a stream on dataset 'secret'");
    free(log);
    assert_true(logged);
    harness_stop_clean(h);
    harness_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expected_daemon_uid),
        cmocka_unit_test(test_squatter_refused),
        cmocka_unit_test(test_group_trainer_reads),
        cmocka_unit_test(test_default_socket_meets),
        cmocka_unit_test(test_credentials_shown),
        cmocka_unit_test(test_access_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
