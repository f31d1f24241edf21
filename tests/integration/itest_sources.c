/* itest_sources — reading samples from files safely, in a real loaderd: a bad sample of
 * a ragged `files` dataset is replaced (the same substitute every time, counted and
 * logged as it happened); max_sample_bytes bounds a ragged slot and the budget error
 * names it; links that lead outside the dataset, a FIFO put in a sample's place and a
 * class folder swapped for a link after the scan are refused without a hang; running
 * out of descriptors is waited out, not blamed on the data; and the open-file limit is
 * raised at start and checked against server.max_clients; a read that never returns
 * (a FUSE file system that stops answering) costs its stream a timed_out after
 * read_timeout, not every worker, and SIGTERM still ends the daemon in bounded time. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
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
    /* Emptied, not removed: a removed file changes its folder, and the next stream open
     * would rescan the folder and serve a list without it. */
    snprintf(path, sizeof path, "%s/rag/0000050.bin", h->dir);
    assert_int_equal(truncate(path, 0), 0);
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
    assert_int_equal(count_in(log, "'rag': sample 50 (0000050.bin): expected "), 1);
    assert_int_equal(count_in(log, "file has 0; another sample takes its place"), 1);
    assert_int_equal(count_in(log, "'ragfail': sample 50 (0000050.bin): expected "), 1);
    assert_int_equal(count_in(log, "file has 0; a batch that holds it fails"), 1);
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

    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 10;
    o.shuffle = 0;
    o.epochs = 1;
    o.prefetch = 1;
    /* Through the socket: the hand-off would lease (and so prepare) every batch the ring
     * holds at once, and how many of them are read before the changes would be timing. */
    o.handoff = LC_HANDOFF_SOCKET;
    /* The streams are opened first: a stream keeps the list of samples it was opened
     * on, while a later open would rescan the changed folders. With prefetch 1 only
     * batch 0 is read before the changes. */
    lc_stream *s = open_ok(c, "tree", &o);
    lc_stream *s_rep = open_ok(c, "tree_rep", &o);

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

    /* on_error: fail: the FIFO's batch fails at once (before: every worker hung). */
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
    s = s_rep;
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

    /* No new descriptor for the daemon for 400 ms: with the soft limit at 3, only 0, 1
     * and 2 could be handed out, and those stay open (stdin, the log). */
    struct raise_later rl = {.pid = h->pid};
    assert_int_equal(prlimit(h->pid, RLIMIT_NOFILE, NULL, &rl.old), 0);
    struct rlimit low = {.rlim_cur = 3, .rlim_max = rl.old.rlim_max};
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

/* ---- issue: a read that never returns ------------------------------------------- */

/* A FUSE file system served by this test: one file, f.bin (128 bytes), whose reads are
 * never answered, like a hung network or FUSE server. Needs root (mount) and /dev/fuse;
 * the test is skipped without them. */
struct hangfs {
    int fd;
    int stop[2];
    char mnt[PATH_MAX];
    pthread_t thread;
    atomic_int reads;
    bool mounted, running;
};

static void hangfs_reply(int fd, uint64_t unique, int error, const void *payload, size_t len)
{
    struct fuse_out_header oh = {.len = (uint32_t)(sizeof oh + len), .error = error, .unique = unique};
    struct iovec iov[2] = {{&oh, sizeof oh}, {(void *)payload, len}};
    (void)!writev(fd, iov, payload ? 2 : 1);
}

static void hangfs_attr(uint64_t node, struct fuse_attr *a)
{
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->mode = node == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0644;
    a->nlink = node == FUSE_ROOT_ID ? 2 : 1;
    a->size = node == FUSE_ROOT_ID ? 0 : 128;
    a->blksize = 4096;
}

static void *hangfs_main(void *arg)
{
    struct hangfs *fs = arg;
    size_t cap = (1u << 20) + 4096;
    char *buf = malloc(cap);
    for (;;) {
        struct pollfd p[2] = {{.fd = fs->fd, .events = POLLIN}, {.fd = fs->stop[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        ssize_t n = read(fs->fd, buf, cap);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ENOENT)
                continue;
            break;
        }
        struct fuse_in_header *ih = (struct fuse_in_header *)buf;
        void *in = ih + 1;
        switch (ih->opcode) {
        case FUSE_INIT: {
            const struct fuse_init_in *ii = in;
            struct fuse_init_out o = {.major = FUSE_KERNEL_VERSION,
                                      .minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor
                                                                                    : FUSE_KERNEL_MINOR_VERSION,
                                      .max_readahead = ii->max_readahead, .max_write = 65536, .time_gran = 1};
            hangfs_reply(fs->fd, ih->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_LOOKUP: {
            struct fuse_entry_out o = {.nodeid = 2, .generation = 1};
            hangfs_attr(2, &o.attr);
            if (ih->nodeid == FUSE_ROOT_ID && strcmp(in, "f.bin") == 0)
                hangfs_reply(fs->fd, ih->unique, 0, &o, sizeof o);
            else
                hangfs_reply(fs->fd, ih->unique, -ENOENT, NULL, 0);
            break;
        }
        case FUSE_GETATTR: {
            struct fuse_attr_out o = {0};
            hangfs_attr(ih->nodeid, &o.attr);
            hangfs_reply(fs->fd, ih->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_OPEN: {
            struct fuse_open_out o = {.fh = 1, .open_flags = FOPEN_DIRECT_IO};
            hangfs_reply(fs->fd, ih->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_READ:
            atomic_fetch_add(&fs->reads, 1); /* never answered */
            break;
        case FUSE_FLUSH:
        case FUSE_RELEASE:
            hangfs_reply(fs->fd, ih->unique, 0, NULL, 0);
            break;
        case FUSE_FORGET:
        case FUSE_BATCH_FORGET:
        case FUSE_INTERRUPT:
            break;
        default:
            hangfs_reply(fs->fd, ih->unique, -ENOSYS, NULL, 0);
        }
    }
    free(buf);
    return NULL;
}

/* Mounts the file system at <dir>/mnt; false (with the reason printed) when it cannot. */
static bool hangfs_mount(struct harness *h, struct hangfs *fs)
{
    memset(fs, 0, sizeof *fs);
    fs->fd = -1;
    fs->stop[0] = fs->stop[1] = -1;
    snprintf(fs->mnt, sizeof fs->mnt, "%s/mnt", h->dir);
    assert_int_equal(mkdir(fs->mnt, 0755), 0);
    fs->fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fs->fd < 0) {
        print_message("skipped: /dev/fuse: %s\n", strerror(errno));
        return false;
    }
    char opts[256];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=%u,group_id=%u", fs->fd, (unsigned)getuid(),
             (unsigned)getgid());
    if (mount("ld-hangfs", fs->mnt, "fuse.ld-hangfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        print_message("skipped: cannot mount a FUSE file system: %s\n", strerror(errno));
        return false;
    }
    fs->mounted = true;
    assert_int_equal(pipe2(fs->stop, O_CLOEXEC), 0);
    assert_int_equal(pthread_create(&fs->thread, NULL, hangfs_main, fs), 0);
    fs->running = true;
    return true;
}

/* Stops answering, aborts the connection (a read still waiting fails), unmounts. */
static void hangfs_unmount(struct hangfs *fs)
{
    if (fs->running) {
        (void)!write(fs->stop[1], "x", 1);
        pthread_join(fs->thread, NULL);
    }
    if (fs->mounted)
        umount2(fs->mnt, MNT_DETACH);
    if (fs->fd >= 0)
        close(fs->fd); /* the last descriptor: the connection aborts, waiting reads fail */
    if (fs->stop[0] >= 0) {
        close(fs->stop[0]);
        close(fs->stop[1]);
    }
    fs->running = fs->mounted = false;
    fs->fd = fs->stop[0] = fs->stop[1] = -1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The file system of test_stalled_read; its teardown unmounts it before the daemon is
 * reaped, since a process whose thread waits on a FUSE read cannot finish exiting. */
static struct hangfs stalled_fs = {.fd = -1, .stop = {-1, -1}};

static int teardown_stalled(void **state)
{
    hangfs_unmount(&stalled_fs);
    harness_free(*state);
    return 0;
}

static void test_stalled_read(void **state)
{
    struct harness *h = *state;
    struct hangfs *fsp = &stalled_fs;
    if (geteuid() != 0) {
        print_message("skipped: mounting a FUSE file system needs root\n");
        skip();
    }
    if (!hangfs_mount(h, fsp))
        skip();
#define fs (*fsp)
    char path[PATH_MAX], target[2 * PATH_MAX];
    snprintf(path, sizeof path, "%s/hung", h->dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/hung/x.bin", h->dir);
    snprintf(target, sizeof target, "%s/f.bin", fs.mnt);
    assert_int_equal(symlink(target, path), 0);
    harness_gen_files(h, "other", 40, 128, 0, false);
    harness_write_config(h, "  workers: 2\n",
                         "  hung:\n    kind: files\n    path: hung\n    follow_links: outside\n    read_timeout: 1\n"
                         "  other:\n    kind: files\n    path: other\n");
    harness_start(h);
    pid_t pid = h->pid;
    lc_client *c = harness_connect(h, 10000, "itest_sources");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 1;
    o.prefetch = 1;

    /* The read never returns: after read_timeout the waiting trainer gets timed_out. */
    lc_stream *s = open_ok(c, "hung", &o);
    lc_batch *b;
    int64_t t0 = now_ms();
    assert_int_equal(lc_stream_next(s, 15000, &b), LC_ETIMEDOUT);
    int64_t waited = now_ms() - t0;
    assert_true(waited >= 900 && waited < 5000);
    assert_non_null(strstr(lc_client_error(c), "read_timeout"));
    assert_true(atomic_load(&fs.reads) >= 1);
    lc_stream_close(s);

    /* While it is stalled, a new stream of that dataset fails at once, without sending
     * another worker into the hung file system; other datasets are served. */
    s = open_ok(c, "hung", &o);
    t0 = now_ms();
    assert_int_equal(lc_stream_next(s, 15000, &b), LC_ETIMEDOUT);
    assert_true(now_ms() - t0 < 1000);
    lc_stream_close(s);
    assert_int_equal(atomic_load(&fs.reads), 1);
    s = open_ok(c, "other", &o);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(lc_stream_next(s, 10000, &b), 0);
        lc_batch_release(b);
    }
    lc_stream_close(s);
    lc_client_close(c);

    /* SIGTERM with a worker stuck for good: the stop gives up on it after its grace
     * (5 s), leaving no socket and no shared memory behind. The kernel finishes the exit
     * only once the read returns: here, when the file system is aborted. */
    t0 = now_ms();
    assert_int_equal(kill(pid, SIGTERM), 0);
    char *log = NULL;
    while (now_ms() - t0 < 9000) {
        free(log);
        log = harness_log(h);
        if (strstr(log, "stopping took more than"))
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_non_null(strstr(log, "stopping took more than 5 s: 1 worker(s) still inside a task"));
    assert_true(now_ms() - t0 < 9000);
    assert_int_equal(harness_shm_count(pid, NULL, 0), 0);
    assert_int_equal(access(h->socket, F_OK), -1);
    assert_non_null(strstr(log, "dataset 'hung': the read of sample 0 (x.bin) has not returned after"));
    free(log);
    hangfs_unmount(&fs);
    assert_int_equal(harness_stop(h), 1);
#undef fs
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ragged_replace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_sample_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_links_fifos_swaps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_exhaustion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_limit_at_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_read, setup, teardown_stalled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
