/* itest_sources — reading samples from files safely, in a real loaderd: a bad sample of
 * a ragged `files` dataset is replaced (the same substitute every time, counted and
 * logged as it happened); max_sample_bytes bounds a ragged slot and the budget error
 * names it; links that lead outside the dataset, a FIFO put in a sample's place and a
 * class folder swapped for a link after the scan are refused without a hang; running
 * out of descriptors is waited out, not blamed on the data; and the open-file limit is
 * raised at start and checked against server.max_clients. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_RAGGED 200
#define RAGGED_SIZE 300

static int setup(void **state)
{
    *state = harness_new();
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static lc_stream *open_ok(lc_client *c, const char *ds, const lc_stream_options *o)
{
    lc_stream *s = NULL;
    if (lc_stream_open(c, ds, o, &s) < 0)
        fail_msg("open %s: %s", ds, lc_client_error(c));
    return s;
}

/* The `datasets` entry of `name`, as a number field. */
static double dataset_num(lc_client *c, const char *name, const char *key)
{
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"datasets\"}", &json), 0);
    cJSON *r = cJSON_Parse(json);
    lc_free(json);
    double v = -1;
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(r, "datasets")) {
        if (strcmp(cJSON_GetObjectItem(d, "name")->valuestring, name) == 0) {
            const cJSON *n = cJSON_GetObjectItem(d, key);
            if (!n)
                fail_msg("dataset %s has no %s", name, key);
            v = n->valuedouble;
        }
    }
    cJSON_Delete(r);
    if (v < 0)
        fail_msg("no dataset %s", name);
    return v;
}

static int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* Which generated file (harness_gen_files, no classes) a row holds, or -1. */
static int64_t which_file(const uint8_t *buf, uint64_t len, uint64_t n, uint64_t size, bool vary)
{
    for (uint64_t j = 0; j < n; j++)
        if (harness_file_matches(j, buf, len, size, vary))
            return (int64_t)j;
    return -1;
}

/* ---- issue: on_error: replace in a ragged dataset -------------------------------- */

/* Reads one in-order epoch of a ragged dataset; every row must be its file, except
 * row `missing`, whose substitute is returned. */
static int64_t ragged_epoch(lc_client *c, const char *ds, uint64_t missing)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 25;
    o.shuffle = 0;
    o.epochs = 1;
    lc_stream *s = open_ok(c, ds, &o);
    lc_batch *b;
    int r;
    uint64_t row0 = 0;
    int64_t sub = -1;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field f;
        assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
        assert_non_null(f.offsets);
        assert_int_equal(f.shape[0], 25);
        for (int64_t k = 0; k < f.shape[0]; k++) {
            const uint8_t *p = (const uint8_t *)f.data + f.offsets[k];
            uint64_t len = (uint64_t)(f.offsets[k + 1] - f.offsets[k]);
            uint64_t i = row0 + (uint64_t)k;
            if (i != missing) {
                if (!harness_file_matches(i, p, len, RAGGED_SIZE, true))
                    fail_msg("%s: row %llu does not hold its file", ds, (unsigned long long)i);
                continue;
            }
            sub = which_file(p, len, N_RAGGED, RAGGED_SIZE, true);
            assert_true(sub >= 0 && (uint64_t)sub != missing);
        }
        row0 += (uint64_t)f.shape[0];
        lc_batch_release(b);
    }
    if (r != LC_EEND)
        fail_msg("%s: %s", ds, lc_client_error(c));
    assert_int_equal(row0, N_RAGGED);
    lc_stream_close(s);
    return sub;
}

static void test_ragged_replace(void **state)
{
    struct harness *h = *state;
    harness_gen_files(h, "rag", N_RAGGED, RAGGED_SIZE, 0, true);
    harness_write_config(h, "  workers: 2\n",
                         "  rag:\n    kind: files\n    path: rag\n"
                         "  ragfail:\n    kind: files\n    path: rag\n    on_error: fail\n");
    harness_start(h);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/rag/0000050.bin", h->dir);
    assert_int_equal(unlink(path), 0);
    lc_client *c = harness_connect(h, 10000, "itest_sources");

    /* Whole batches; the missing file's row holds another file, the same one twice. */
    int64_t sub1 = ragged_epoch(c, "rag", 50);
    int64_t sub2 = ragged_epoch(c, "rag", 50);
    assert_true(sub1 >= 0);
    assert_int_equal(sub1, sub2);
    assert_int_equal(dataset_num(c, "rag", "bad_samples"), 1);
    assert_int_equal(dataset_num(c, "rag", "replaced_samples"), 2);

    /* on_error: fail on the same tree: the two batches before it, then the error. */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 25;
    o.shuffle = 0;
    o.epochs = 1;
    lc_stream *s = open_ok(c, "ragfail", &o);
    lc_batch *b;
    int r, delivered = 0;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        delivered++;
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_ESAMPLE);
    assert_int_equal(delivered, 2);
    assert_non_null(strstr(lc_client_error(c), "0000050.bin"));
    assert_int_equal(dataset_num(c, "ragfail", "replaced_samples"), 0);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);

    /* The log says what happened, once per dataset. */
    char *log = harness_log(h);
    assert_int_equal(count_in(log, "'rag': sample 50 (0000050.bin): No such file or directory; another sample takes "
                                   "its place"), 1);
    assert_int_equal(count_in(log, "'ragfail': sample 50 (0000050.bin): No such file or directory; a batch that "
                                   "holds it fails"), 1);
    free(log);
}

/* ---- issue: a ragged slot sized by the largest file ------------------------------ */

static void test_max_sample_bytes(void **state)
{
    struct harness *h = *state;
    harness_gen_files(h, "small", 400, 64, 0, true);
    /* One large file among small ones; "big" sorts after the digits: sample 400. */
    size_t big = 8u << 20;
    char *data = malloc(big);
    memset(data, 0xEE, big);
    harness_write_file(h, "small/big.bin", data, big);
    free(data);
    harness_write_config(h, "  workers: 2\n  memory_budget: 64MiB\n",
                         "  unbounded:\n    kind: files\n    path: small\n"
                         "  bounded:\n    kind: files\n    path: small\n    max_sample_bytes: 4KiB\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_sources");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 100;
    o.shuffle = 0;
    o.epochs = 1;
    o.prefetch = 2;

    /* batch_size x 8 MiB a slot: over the budget, and the error says what to set. */
    lc_stream *s = NULL;
    assert_true(lc_stream_open(c, "unbounded", &o, &s) < 0);
    assert_non_null(strstr(lc_client_error(c), "datasets.unbounded.max_sample_bytes"));

    /* Bounded: 100 x 4 KiB a slot; the big file is replaced, every other row is its file. */
    assert_int_equal(dataset_num(c, "bounded", "samples"), 401);
    s = open_ok(c, "bounded", &o);
    size_t ring = 0;
    assert_non_null(lc_stream_ring(s, &ring));
    assert_true(ring < 8u << 20);
    lc_batch *b;
    int r;
    uint64_t rows = 0;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field f;
        assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
        for (int64_t k = 0; k < f.shape[0]; k++) {
            const uint8_t *p = (const uint8_t *)f.data + f.offsets[k];
            uint64_t len = (uint64_t)(f.offsets[k + 1] - f.offsets[k]);
            uint64_t i = rows + (uint64_t)k;
            if (i < 400)
                assert_true(harness_file_matches(i, p, len, 64, true));
            else
                assert_true(which_file(p, len, 400, 64, true) >= 0);
        }
        rows += (uint64_t)f.shape[0];
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(rows, 401);
    assert_int_equal(dataset_num(c, "bounded", "replaced_samples"), 1);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "dataset 'bounded': 1 of 401 samples are larger than max_sample_bytes"));
    free(log);
}

/* ---- issue: links outside, FIFOs, swapped folders --------------------------------- */

#define N_TREE 60

static void test_links_fifos_swaps(void **state)
{
    struct harness *h = *state;
    char path[PATH_MAX], target[PATH_MAX];
    harness_gen_files(h, "tree", N_TREE, 128, 3, false);
    harness_gen_files(h, "other", 40, 128, 0, false);
    /* Outside the tree: a secret, and a folder of files named like class_002's. */
    uint8_t secret[128];
    memset(secret, 0xEE, sizeof secret);
    harness_write_file(h, "secret.bin", secret, sizeof secret);
    snprintf(path, sizeof path, "%s/elsewhere", h->dir);
    assert_int_equal(mkdir(path, 0755), 0);
    for (int i = 2; i < N_TREE; i += 3) {
        char rel[64];
        snprintf(rel, sizeof rel, "elsewhere/%07d.bin", i);
        harness_write_file(h, rel, secret, sizeof secret);
    }
    snprintf(path, sizeof path, "%s/tree/class_000/zz_secret.bin", h->dir);
    snprintf(target, sizeof target, "%s/secret.bin", h->dir);
    assert_int_equal(symlink(target, path), 0);
    harness_write_config(h, "  workers: 2\n",
                         "  tree:\n    kind: files\n    path: tree\n    on_error: fail\n"
                         "  tree_rep:\n    kind: files\n    path: tree\n"
                         "  tree_out:\n    kind: files\n    path: tree\n    follow_links: outside\n"
                         "  other:\n    kind: files\n    path: other\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_sources");
    /* The link to the secret is a sample only where the dataset allows outside links. */
    assert_int_equal(dataset_num(c, "tree", "samples"), N_TREE);
    assert_int_equal(dataset_num(c, "tree_out", "samples"), N_TREE + 1);

    /* After the scan: file 4 (class_001, sample 20 + 1) becomes a FIFO, and class_002
     * a link to the folder elsewhere. */
    snprintf(path, sizeof path, "%s/tree/class_001/0000004.bin", h->dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    snprintf(path, sizeof path, "%s/tree/class_002", h->dir);
    snprintf(target, sizeof target, "%s/tree/old_002", h->dir);
    assert_int_equal(rename(path, target), 0);
    snprintf(target, sizeof target, "%s/elsewhere", h->dir);
    assert_int_equal(symlink(target, path), 0);

    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.shuffle = 0;
    o.epochs = 1;
    /* on_error: fail: the FIFO's batch fails at once (before: every worker hung). */
    lc_stream *s = open_ok(c, "tree", &o);
    lc_batch *b;
    int r, delivered = 0;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        delivered++;
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_ESAMPLE);
    assert_int_equal(delivered, 2);
    assert_non_null(strstr(lc_client_error(c), "class_001/0000004.bin"));
    assert_non_null(strstr(lc_client_error(c), "not a regular file"));
    lc_stream_close(s);

    /* on_error: replace: whole batches, none of the outside bytes, every bad one counted. */
    s = open_ok(c, "tree_rep", &o);
    uint64_t rows = 0;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        lc_field f;
        assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
        for (int64_t k = 0; k < f.shape[0]; k++) {
            const uint8_t *p = (const uint8_t *)f.data + k * 128;
            int64_t j = which_file(p, 128, N_TREE, 128, false);
            assert_true(j >= 0);        /* a file of the tree, never the secret */
            assert_true(j % 3 != 2);    /* never through the swapped folder */
            assert_true(j != 4);        /* never the FIFO */
        }
        rows += (uint64_t)f.shape[0];
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(rows, N_TREE);
    assert_int_equal(dataset_num(c, "tree_rep", "bad_samples"), 1 + N_TREE / 3);

    /* Other datasets were served all along. */
    s = open_ok(c, "other", &o);
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    lc_batch_release(b);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "'class_000/zz_secret.bin' is not a sample: a symbolic link that leads outside"));
    assert_non_null(strstr(log, "class_002/0000002.bin): a symbolic link where the scan saw none"));
    free(log);
}

/* ---- issue: running out of descriptors is not bad data --------------------------- */

/* The lowest descriptor number process `pid` has free. */
static int lowest_free_fd(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    static char used[65536];
    memset(used, 0, sizeof used);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int n = atoi(de->d_name);
        if (de->d_name[0] != '.' && n >= 0 && n < (int)sizeof used)
            used[n] = 1;
    }
    closedir(d);
    int k = 0;
    while (k < (int)sizeof used && used[k])
        k++;
    return k;
}

struct raise_later {
    pid_t pid;
    struct rlimit old;
};

static void *raise_later_main(void *arg)
{
    struct raise_later *r = arg;
    struct timespec ts = {0, 400 * 1000 * 1000};
    nanosleep(&ts, NULL);
    prlimit(r->pid, RLIMIT_NOFILE, &r->old, NULL);
    return NULL;
}

static void test_fd_exhaustion(void **state)
{
    struct harness *h = *state;
    harness_gen_files(h, "fds", 300, 256, 0, false);
    harness_write_config(h, "  workers: 2\n", "  fds:\n    kind: files\n    path: fds\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_sources");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 20;
    o.shuffle = 0;
    o.epochs = 1;
    o.prefetch = 1;
    lc_stream *s = open_ok(c, "fds", &o);
    lc_batch *b;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0); /* the ring is mapped: no more fds needed */
    lc_batch_release(b);

    /* No descriptor left to the daemon for 400 ms. */
    struct raise_later rl = {.pid = h->pid};
    assert_int_equal(prlimit(h->pid, RLIMIT_NOFILE, NULL, &rl.old), 0);
    struct rlimit low = {.rlim_cur = (rlim_t)lowest_free_fd(h->pid), .rlim_max = rl.old.rlim_max};
    assert_int_equal(prlimit(h->pid, RLIMIT_NOFILE, &low, NULL), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, raise_later_main, &rl), 0);

    uint64_t rows = 20;
    int r;
    while ((r = lc_stream_next(s, 15000, &b)) == 0) {
        lc_field f;
        assert_int_equal(lc_batch_field_by_name(b, "data", &f), 0);
        for (int64_t k = 0; k < f.shape[0]; k++)
            assert_true(harness_file_matches(rows + (uint64_t)k, (const uint8_t *)f.data + k * 256, 256, 256, false));
        rows += (uint64_t)f.shape[0];
        lc_batch_release(b);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    if (r != LC_EEND)
        fail_msg("next: %d %s", r, lc_client_error(c));
    assert_int_equal(rows, 300);
    /* Waited out and reported; nothing held against the data. */
    assert_true(dataset_num(c, "fds", "resource_retries") >= 1);
    assert_int_equal(dataset_num(c, "fds", "bad_samples"), 0);
    assert_int_equal(dataset_num(c, "fds", "replaced_samples"), 0);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "Too many open files: the system is short of a resource, not the sample at fault"));
    free(log);
}

/* Runs `loaderd --config ... --check` under the given open-file limits; the exit status,
 * its output in out. */
static int check_with_limit(struct harness *h, rlim_t soft, rlim_t hard, char *out, size_t size)
{
    char logpath[PATH_MAX];
    snprintf(logpath, sizeof logpath, "%s/check.log", h->dir);
    const char *bin = getenv("LOADERD_BIN") ? getenv("LOADERD_BIN") : "build/bin/loaderd";
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            _exit(126);
        execl(bin, bin, "--config", h->config, "--check", (char *)NULL);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    int fd = open(logpath, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, out, size - 1) : -1;
    out[n > 0 ? n : 0] = '\0';
    if (fd >= 0)
        close(fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_fd_limit_at_start(void **state)
{
    struct harness *h = *state;
    char out[4096];
    harness_gen_files(h, "few", 10, 16, 0, false);
    harness_write_config(h, "  workers: 2\n  max_clients: 500\n", "  few:\n    kind: files\n    path: few\n");
    /* A hard limit below what 500 clients need: a clear refusal naming both. */
    assert_int_equal(check_with_limit(h, 256, 256, out, sizeof out), 1);
    assert_non_null(strstr(out, "server.max_clients 500"));
    assert_non_null(strstr(out, "RLIMIT_NOFILE) is 256"));
    /* A low soft limit under a high hard one is raised: the same config is fine. */
    assert_int_equal(check_with_limit(h, 256, 4096, out, sizeof out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ragged_replace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_sample_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_links_fifos_swaps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_exhaustion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_limit_at_start, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
