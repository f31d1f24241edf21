/* itest_reload — live reload against a real loaderd: `loaderctl reload` and SIGHUP
 * re-read the config while streams read. A dataset defined the same keeps its streams
 * (they read exact data throughout), a changed or removed one's open streams finish
 * their epoch on the old definition, an added one opens, a config with an error is
 * refused with its file:line:column and the running one stays, a restart-only key is
 * reported and keeps its value, a live one applies. A dataset whose path is missing at
 * start is served as unavailable (listed with the reason, refused at open by name)
 * while the others are served, `--check` still fails on it, and a reload opens it once
 * its folder exists. Every test stops the daemon cleanly (exit 0, nothing in /dev/shm);
 * ASan's leak check covers the retired datasets and configs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

/* "keep" never changes; "chg" moves from old/ (30 files of 64 bytes) to new/ (50 of
 * 96); "gone" (with a cache) is removed; "added" appears. */
#define N_KEEP 40
#define N_OLD 30
#define N_NEW 50
#define N_GONE 24
#define SIZE_OLD 64
#define SIZE_NEW 96

static const char first_yaml[] = "  keep:\n    kind: files\n    path: keep\n"
                                 "  chg:\n    kind: files\n    path: old\n"
                                 "  gone:\n    kind: files\n    path: gone\n    cache: {path: gone.ldc}\n";

/* The same "keep" further down and after a comment: still the same definition. */
static const char second_yaml[] = "  added:\n    kind: files\n    path: keep\n    pattern: '*'\n"
                                  "  chg:\n    kind: files\n    path: new\n"
                                  "  # keep moved, its definition did not change\n"
                                  "  keep:\n    kind: files\n    path: keep\n";

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "keep", N_KEEP, SIZE_OLD, 0, false);
    harness_gen_files(h, "old", N_OLD, SIZE_OLD, 0, false);
    harness_gen_files(h, "new", N_NEW, SIZE_NEW, 0, false);
    harness_gen_files(h, "gone", N_GONE, SIZE_OLD, 0, false);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static lc_stream *open_ds(lc_client *c, const char *name, uint32_t batch)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = batch;
    o.shuffle = 0;
    o.epochs = 1;
    lc_stream *s = NULL;
    int r = lc_stream_open(c, name, &o, &s);
    if (r < 0)
        fail_msg("open '%s': %s: %s", name, lc_strerror(r), lc_client_error(c));
    return s;
}

/* Reads up to `batches` batches (all when 0) and checks every row is exactly file
 * `*pos` of its folder (no shuffle: in order) of `size` bytes. Returns rows read; sets
 * *end at the end of the epoch. */
static uint64_t read_exact(lc_stream *s, uint64_t *pos, uint64_t size, int batches, int *end)
{
    uint64_t rows = 0;
    for (int k = 0; batches == 0 || k < batches; k++) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 20000, &b);
        if (r == LC_EEND) {
            *end = 1;
            break;
        }
        assert_int_equal(r, 0);
        lc_field f;
        assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            const uint8_t *buf = (const uint8_t *)f.data + (size_t)row * size;
            if (!harness_file_matches(*pos, buf, size, size, false))
                fail_msg("row %u of batch %" PRIu64 " is not file %" PRIu64 " of %" PRIu64 " bytes", row,
                         lc_batch_index(b), *pos, size);
            (*pos)++;
            rows++;
        }
        lc_batch_release(b);
    }
    return rows;
}

/* {"op": op} on c; the reply (ok or not) parsed, and the library's code in *rc. */
static cJSON *request(lc_client *c, const char *op, int *rc)
{
    char req[64], *json = NULL;
    snprintf(req, sizeof req, "{\"op\":\"%s\"}", op);
    *rc = lc_request_json(c, req, &json);
    cJSON *r = json ? cJSON_Parse(json) : NULL;
    lc_free(json);
    return r;
}

static bool names_has(const cJSON *list, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const char *n = cJSON_IsString(e) ? e->valuestring
                                          : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        if (n && strcmp(n, name) == 0)
            return true;
    }
    return false;
}

static int streams_of(const cJSON *list, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        if (n && strcmp(n, name) == 0)
            return (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "streams"));
    }
    return -1;
}

/* The dataset `name` of a `datasets` reply, or NULL. */
static const cJSON *dataset_entry(const cJSON *reply, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(reply, "datasets")) {
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        if (n && strcmp(n, name) == 0)
            return e;
    }
    return NULL;
}

/* Descriptors the daemon holds now, sockets aside (a client that just hung up may still
 * be closing): datasets' folders, cache files, rings. */
static int daemon_fds(const struct harness *h)
{
    char path[64], link[PATH_MAX], target[256];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)h->pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(link, sizeof link, "%s/%s", path, e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        target[len > 0 ? len : 0] = '\0';
        n += strncmp(target, "socket:", 7) != 0;
    }
    closedir(d);
    return n;
}

static void assert_log_has(struct harness *h, const char *needle)
{
    char *log = harness_log(h);
    if (!strstr(log, needle)) {
        print_error("loaderd log:\n%s\n", log);
        free(log);
        fail_msg("the log lacks '%s'", needle);
    }
    free(log);
}

/* Waits (up to 10 s) for the daemon to log needle: what it logs in answer to a signal. */
static void wait_log(struct harness *h, const char *needle)
{
    for (int k = 0; k < 400; k++) {
        char *log = harness_log(h);
        bool found = strstr(log, needle) != NULL;
        free(log);
        if (found)
            return;
        sleep_ms(25);
    }
    assert_log_has(h, needle);
}

static void test_reload_while_streams_read(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", first_yaml);
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_reload");
    lc_stream *keep = open_ds(c, "keep", 4), *chg = open_ds(c, "chg", 5), *gone = open_ds(c, "gone", 4);
    uint64_t pk = 0, pc = 0, pg = 0;
    int ek = 0, ec = 0, eg = 0;
    read_exact(keep, &pk, SIZE_OLD, 2, &ek);
    read_exact(chg, &pc, SIZE_OLD, 2, &ec);
    read_exact(gone, &pg, SIZE_OLD, 2, &eg);

    /* The new file: chg changed, gone removed, added added, keep the same. */
    harness_write_config(h, "  workers: 2\n", second_yaml);
    char out[8192];
    int st = harness_ctl(h, out, sizeof out, "reload", NULL);
    if (st != 0 || !strstr(out, "added:     added") || !strstr(out, "unchanged: keep") ||
        !strstr(out, "changed:   chg (1 open stream finishes on the old definition)") ||
        !strstr(out, "removed:   gone (1 open stream finishes on the old definition)"))
        fail_msg("loaderctl reload: exit %d:\n%s", st, out);
    assert_log_has(h, "reload: dataset 'chg' changed; its 1 open stream(s) finish on the old definition");
    /* keep, chg and added served; the old chg and gone still in memory for their streams. */
    assert_true(harness_status_num(h, "datasets", NULL) == 3);
    assert_true(harness_status_num(h, "datasets_in_memory", NULL) == 5);
    assert_true(harness_status_num(h, "reloads", NULL) == 1);

    /* Every stream reads on, exactly: keep and the two old definitions to their ends. */
    read_exact(keep, &pk, SIZE_OLD, 0, &ek);
    read_exact(chg, &pc, SIZE_OLD, 0, &ec);
    read_exact(gone, &pg, SIZE_OLD, 0, &eg);
    assert_true(ek && ec && eg);
    assert_int_equal(pk, N_KEEP);
    assert_int_equal(pc, N_OLD);
    assert_int_equal(pg, N_GONE);
    lc_stream_close(keep);
    lc_stream_close(chg);
    lc_stream_close(gone);
    harness_flush_releases(c);
    /* The old chg went with its last stream; gone's cache keeper held it until then and
     * stops at the server's next tick (a second at most), freeing it. */
    double in_memory = 0;
    for (int k = 0; k < 200 && (in_memory = harness_status_num(h, "datasets_in_memory", NULL)) != 3; k++)
        sleep_ms(50);
    assert_true(in_memory == 3);
    assert_log_has(h, "reload: the last stream of the old definition of 'gone' is gone; its cache keeper stops");

    /* New opens get the new definitions. */
    lc_stream *s = NULL;
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    assert_int_equal(lc_stream_open(c, "gone", &o, &s), LC_ENODATASET);
    chg = open_ds(c, "chg", 7);
    pc = 0;
    ec = 0;
    read_exact(chg, &pc, SIZE_NEW, 0, &ec);
    assert_int_equal(pc, N_NEW);
    lc_stream_close(chg);
    lc_stream *added = open_ds(c, "added", 8);
    uint64_t pa = 0;
    int ea = 0;
    read_exact(added, &pa, SIZE_OLD, 1, &ea);

    /* A config with an error is refused with its position; the running one stays. */
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n    patern: '*'\n");
    int rc;
    cJSON *r = request(c, "reload", &rc);
    assert_int_equal(rc, LC_ECONFIG);
    if (!strstr(lc_client_error(c), "loaderd.yaml:8:5: ") || !strstr(lc_client_error(c), "patern"))
        fail_msg("reload of a bad config: %s", lc_client_error(c));
    cJSON_Delete(r);
    st = harness_ctl(h, out, sizeof out, "reload", NULL);
    if (st != 1 || !strstr(out, "loaderd.yaml:8:5: "))
        fail_msg("loaderctl reload of a bad config: exit %d:\n%s", st, out);
    r = request(c, "datasets", &rc);
    assert_int_equal(rc, 0);
    assert_non_null(dataset_entry(r, "added"));
    assert_non_null(dataset_entry(r, "chg"));
    cJSON_Delete(r);
    r = NULL;
    read_exact(added, &pa, SIZE_OLD, 0, &ea); /* still reading, to its end */
    assert_int_equal(pa, N_KEEP);
    lc_stream_close(added);

    /* SIGHUP: the same reload; a dataset appears. */
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n"
                                              "  later:\n    kind: files\n    path: new\n");
    assert_int_equal(kill(h->pid, SIGHUP), 0);
    const cJSON *later = NULL;
    for (int k = 0; k < 100 && !later; k++) {
        sleep_ms(50);
        cJSON_Delete(r);
        r = request(c, "datasets", &rc);
        assert_int_equal(rc, 0);
        later = dataset_entry(r, "later");
    }
    assert_non_null(later);
    assert_null(dataset_entry(r, "chg"));
    cJSON_Delete(r);
    assert_log_has(h, "received SIGHUP: reloading");
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Which server keys apply at a reload: a restart-only one is reported and keeps its
 * running value; a live one applies at once. */
static void test_reload_server_keys(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n  max_streams: 4\n", "  keep:\n    kind: files\n    path: keep\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_reload");
    lc_stream *a = open_ds(c, "keep", 4);
    harness_write_config(h, "  workers: 3\n  max_streams: 1\n", "  keep:\n    kind: files\n    path: keep\n");
    int rc;
    cJSON *r = request(c, "reload", &rc);
    assert_int_equal(rc, 0);
    const cJSON *rn = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "restart_needed"), 0);
    assert_non_null(rn);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rn, "key")), "server.workers");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rn, "running")), "2");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rn, "file")), "3");
    assert_true(names_has(cJSON_GetObjectItemCaseSensitive(r, "unchanged"), "keep"));
    assert_int_equal(streams_of(cJSON_GetObjectItemCaseSensitive(r, "changed"), "keep"), -1);
    cJSON_Delete(r);
    assert_true(harness_status_num(h, "workers", NULL) == 2);
    /* max_streams is live: the second stream is refused now. */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    lc_stream *b = NULL;
    assert_int_equal(lc_stream_open(c, "keep", &o, &b), LC_ELIMIT);
    assert_non_null(strstr(lc_client_error(c), "server.max_streams"));
    uint64_t pos = 0;
    int end = 0;
    read_exact(a, &pos, SIZE_OLD, 0, &end); /* the unchanged dataset's stream never noticed */
    assert_int_equal(pos, N_KEEP);
    lc_stream_close(a);
    assert_log_has(h, "server.workers changed from '2' to '3': that takes a restart");

    /* Reloads that change a dataset back and forth leave no descriptor behind once its
     * streams are closed (the retired dataset goes with its last stream). */
    int before = daemon_fds(h);
    for (int k = 0; k < 6; k++) {
        harness_write_config(h, "  workers: 2\n  max_streams: 1\n",
                             k % 2 ? "  keep:\n    kind: files\n    path: keep\n"
                                   : "  keep:\n    kind: files\n    path: new\n");
        a = open_ds(c, "keep", 4);
        r = request(c, "reload", &rc);
        assert_int_equal(rc, 0);
        assert_int_equal(streams_of(cJSON_GetObjectItemCaseSensitive(r, "changed"), "keep"), 1);
        cJSON_Delete(r);
        lc_stream_close(a);
        harness_flush_releases(c);
        /* The old one is freed with its last stream, once that stream's running chunks
         * are back (a loop turn or so after the close). */
        for (int w = 0; w < 500 && harness_status_num(h, "datasets_in_memory", NULL) != 1; w++)
            sleep_ms(10);
        assert_true(harness_status_num(h, "datasets_in_memory", NULL) == 1);
    }
    int after = daemon_fds(h);
    if (after > before) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "ls -l /proc/%d/fd >&2", (int)h->pid);
        if (system(cmd) != 0)
            print_error("cannot list the descriptors\n");
        fail_msg("the daemon held %d descriptors before 6 reloads, %d after", before, after);
    }
    lc_client_close(c);
    harness_stop_clean(h);
}

/* A dataset whose folder is missing at start: --check fails naming it; the daemon
 * serves the others and lists it as unavailable; an open of it says why; a reload once
 * the folder exists opens it. */
static void test_missing_path_at_start(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n"
                                              "  late:\n    kind: files\n    path: not-yet\n");
    const char *const check[] = {"--check", NULL};
    assert_int_equal(harness_run_to_exit(h, check), 1);
    assert_log_has(h, "loaderd.yaml:10:5: ");
    assert_log_has(h, "not-yet");

    harness_start(h);
    char out[8192];
    int st = harness_ctl(h, out, sizeof out, "datasets", NULL);
    if (st != 0 || !strstr(out, "UNAVAILABLE: ") || !strstr(out, "not-yet"))
        fail_msg("loaderctl datasets: exit %d:\n%s", st, out);
    lc_client *c = harness_connect(h, 10000, "itest_reload");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "late", &o, &s), LC_EDATASET);
    const char *e = lc_client_error(c);
    if (!strstr(e, "dataset 'late' is unavailable: ") || !strstr(e, "loaderd.yaml:10:5: ") || !strstr(e, "not-yet"))
        fail_msg("open of an unavailable dataset: %s", e);
    lc_stream *k = open_ds(c, "keep", 4);
    uint64_t pk = 0;
    int ek = 0;
    read_exact(k, &pk, SIZE_OLD, 1, &ek);

    /* Still missing: a reload leaves it unavailable and says so. */
    int rc;
    cJSON *r = request(c, "reload", &rc);
    assert_int_equal(rc, 0);
    assert_true(names_has(cJSON_GetObjectItemCaseSensitive(r, "unavailable"), "late"));
    cJSON_Delete(r);
    /* The folder appears: the next reload opens it, and keep's stream goes on. */
    harness_gen_files(h, "not-yet", N_NEW, SIZE_NEW, 0, false);
    r = request(c, "reload", &rc);
    assert_int_equal(rc, 0);
    assert_true(names_has(cJSON_GetObjectItemCaseSensitive(r, "changed"), "late") ||
                names_has(cJSON_GetObjectItemCaseSensitive(r, "added"), "late"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "unavailable")), 0);
    cJSON_Delete(r);
    lc_stream *l = open_ds(c, "late", 10);
    uint64_t pl = 0;
    int el = 0;
    read_exact(l, &pl, SIZE_NEW, 0, &el);
    assert_int_equal(pl, N_NEW);
    read_exact(k, &pk, SIZE_OLD, 0, &ek);
    assert_int_equal(pk, N_KEEP);
    lc_stream_close(l);
    lc_stream_close(k);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* The next datagram on the notify socket, NUL-terminated into buf; fails the test when
 * none comes within 10 s. */
static void notify_next(int fd, char *buf, size_t size)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1)
        fail_msg("no message on NOTIFY_SOCKET within 10 s");
    ssize_t n = recv(fd, buf, size - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
}

/* Under systemd (NOTIFY_SOCKET), a reload is bracketed by RELOADING=1 (with the
 * MONOTONIC_USEC that Type=notify-reload requires) and READY=1, refused or not. */
static void test_reload_notifies_systemd(void **state)
{
#if LD_HAVE_SYSTEMD
    struct harness *h = *state;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/n.sock", h->dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n");
    setenv("NOTIFY_SOCKET", a.sun_path, 1);
    harness_start(h);
    unsetenv("NOTIFY_SOCKET");
    char msg[256];
    notify_next(fd, msg, sizeof msg);
    assert_string_equal(msg, "READY=1");
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n"
                                              "  more:\n    kind: files\n    path: new\n");
    assert_int_equal(kill(h->pid, SIGHUP), 0);
    notify_next(fd, msg, sizeof msg);
    if (strncmp(msg, "RELOADING=1\nMONOTONIC_USEC=", strlen("RELOADING=1\nMONOTONIC_USEC=")) != 0)
        fail_msg("expected RELOADING=1 with MONOTONIC_USEC, got '%s'", msg);
    notify_next(fd, msg, sizeof msg);
    assert_string_equal(msg, "READY=1");
    assert_log_has(h, "reload: dataset 'more' (files): 50 samples");
    /* Refused: the same bracket, and the log says why. */
    harness_write_config(h, "  workerz: 2\n", "  keep:\n    kind: files\n    path: keep\n");
    assert_int_equal(kill(h->pid, SIGHUP), 0);
    notify_next(fd, msg, sizeof msg);
    assert_true(strncmp(msg, "RELOADING=1\n", strlen("RELOADING=1\n")) == 0);
    notify_next(fd, msg, sizeof msg);
    assert_string_equal(msg, "READY=1");
    assert_log_has(h, "reload refused, the running config stays: ");
    assert_log_has(h, "loaderd.yaml:3:3: unknown key 'workerz'");
    harness_stop_clean(h);
    close(fd);
#else
    (void)state;
    skip();
#endif
}

/* A reload opens what it adds on a thread of its own. Here the added dataset's token
 * file is a FIFO, whose open blocks until a writer comes: the reload is stuck in its scan
 * for as long as the test wants, and meanwhile a stream reads to its end and `status`
 * answers (on a daemon that scanned on its loop, the next would time out). Then a writer
 * comes and goes, the open ends (not a regular file), and the reload's reply comes with
 * the dataset unavailable. */
static void test_reload_scans_off_the_loop(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_reload");
    lc_stream *keep = open_ds(c, "keep", 4);
    uint64_t pk = 0;
    int ek = 0;
    read_exact(keep, &pk, SIZE_OLD, 1, &ek);
    char fifo[PATH_MAX];
    snprintf(fifo, sizeof fifo, "%s/slow.bin", h->dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n"
                                              "  slow:\n    kind: token_windows\n    path: slow.bin\n"
                                              "    dtype: uint16\n    context: 8\n");
    int fd = harness_raw_connect(h);
    harness_raw_send(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(fd, 10000));
    harness_raw_send(fd, "{\"op\":\"reload\",\"id\":2}");
    /* While the scan waits for a writer: the stream reads on to its end, status answers. */
    read_exact(keep, &pk, SIZE_OLD, 0, &ek);
    assert_true(ek);
    assert_int_equal(pk, N_KEEP);
    assert_true(harness_status_num(h, "reloads", NULL) == 0);
    assert_log_has(h, "reload: opening 1 added or changed dataset(s) on a thread of their own");
    /* One reload at a time: another request gets busy; a SIGHUP is remembered, and the
     * file (by then without "slow") is read once more after this reload. */
    int fd2 = harness_raw_connect(h);
    harness_raw_send(fd2, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(fd2, 10000));
    harness_raw_send(fd2, "{\"op\":\"reload\",\"id\":2}");
    char *busy = harness_raw_reply(fd2, 10000);
    if (!busy || !strstr(busy, "\"code\":\"busy\"") || !strstr(busy, "a reload is already running"))
        fail_msg("a reload during another: %s", busy ? busy : "(none)");
    free(busy);
    close(fd2);
    harness_write_config(h, "  workers: 2\n", "  keep:\n    kind: files\n    path: keep\n");
    assert_int_equal(kill(h->pid, SIGHUP), 0);
    wait_log(h, "a reload is running; the file is read again once it is done");
    int w = open(fifo, O_WRONLY); /* meets the scan's open */
    assert_true(w >= 0);
    close(w);
    char *reply = harness_raw_reply(fd, 20000);
    if (!reply || !strstr(reply, "\"ok\":true") || !strstr(reply, "\"unavailable\":[{\"name\":\"slow\""))
        fail_msg("the reload's reply: %s", reply ? reply : "(none)");
    free(reply);
    close(fd);
    for (int k = 0; k < 400 && harness_status_num(h, "reloads", NULL) < 2; k++)
        sleep_ms(25);
    assert_true(harness_status_num(h, "reloads", NULL) == 2);
    assert_true(harness_status_num(h, "datasets_unavailable", NULL) == 0);
    lc_stream_close(keep);
    lc_client_close(c);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reload_while_streams_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_server_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_path_at_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_notifies_systemd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_scans_off_the_loop, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
