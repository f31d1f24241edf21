/* itest_share — shared streams in a real loaderd: consumers of one share read one ring
 * (the same shared-memory object) and get exactly the batches a stream of their own
 * would give; a consumer killed while it holds a batch leaves the others reading on
 * and nothing leased or in /dev/shm once they are done; a consumer that stops reading
 * is detached past server.share_max_lag, the others never stall, and it reads on, its
 * batches still exact, in a stream of its own; a late joiner starts at the group's
 * front, or at batch 0 of the epoch with share_join epoch_start; "auto" shares by
 * settings; a share name opened with other settings is refused, naming the setting.
 * The workers' CPU time of a share is counted once: under the share in `streams`, the
 * metrics and `loaderctl top`, and in no consumer's or client's own figure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_FILES 200
#define BATCH 8
#define BPE (N_FILES / BATCH)      /* 25 batches per epoch */
#define EPOCHS 2
#define TOTAL (BPE * EPOCHS)

/* The batches of a stream of its own with the same settings: each one's hash. */
static uint64_t ref_hash[TOTAL];

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t batch_hash(lc_batch *b)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int n = lc_batch_field_count(b);
    for (int i = 0; i < n; i++) {
        lc_field f;
        assert_int_equal(lc_batch_field(b, i, &f), 0);
        h = hash_bytes(h, &f.nbytes, sizeof f.nbytes);
        h = hash_bytes(h, f.data, f.nbytes);
        if (f.offsets)
            h = hash_bytes(h, f.offsets, (size_t)(f.shape[0] + 1) * sizeof(int64_t));
    }
    return h;
}

static uint64_t seq_of(lc_batch *b)
{
    return lc_batch_epoch(b) * BPE + lc_batch_index(b);
}

static lc_stream *open_share(lc_client *c, const char *share, int join, uint64_t seed)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.seed = seed;
    o.epochs = EPOCHS;
    o.prefetch = 2;
    o.share = share;
    o.share_join = join;
    lc_stream *s = NULL;
    int rc = lc_stream_open(c, "rec", &o, &s);
    if (rc < 0)
        fail_msg("open share %s: %s", share ? share : "(none)", lc_client_error(c));
    return s;
}

/* Reads one batch, checks it against the reference, returns its sequence number. */
static uint64_t read_check(lc_stream *s, lc_batch **ret_b)
{
    lc_batch *b = NULL;
    int rc = lc_stream_next(s, 10000, &b);
    if (rc < 0)
        fail_msg("next: %s", lc_strerror(rc));
    uint64_t q = seq_of(b);
    assert_true(q < TOTAL);
    assert_true(batch_hash(b) == ref_hash[q]);
    if (ret_b)
        *ret_b = b;
    else
        lc_batch_release(b);
    return q;
}

static ino_t ring_inode(lc_stream *s)
{
    int fd = lc_stream_ring_fd(s);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    return st.st_ino;
}

static int setup(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, 256, 0, true);
    harness_write_config(h, "  workers: 2\n  share_max_lag: 6\n", "  rec:\n    kind: files\n    path: rec\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "reference");
    lc_stream *s = open_share(c, NULL, 0, 7);
    for (int i = 0; i < TOTAL; i++) {
        lc_batch *b;
        assert_int_equal(lc_stream_next(s, 10000, &b), 0);
        assert_int_equal(seq_of(b), i);
        ref_hash[i] = batch_hash(b);
        lc_batch_release(b);
    }
    lc_stream_close(s);
    lc_client_close(c);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

/* Nothing leased, nothing of the daemon's in /dev/shm once every stream is closed. */
static void assert_clean(struct harness *h)
{
    assert_int_equal(harness_wait_leased(h, 0), 0);
    char names[1024];
    int n = harness_shm_count(h->pid, names, sizeof names);
    if (n)
        fail_msg("left in /dev/shm: %s", names);
    assert_int_equal(harness_status_num(h, "streams", NULL), 0);
    assert_int_equal(harness_status_num(h, "memory_used", NULL), 0);
}

/* The share's CPU time: each consumer's own worker_cpu_s is 0 and its share object
 * carries the group's, the same for both; the metrics have it once, under the share,
 * and top marks it shared and lists the share once. */
static void check_share_cpu(struct harness *h, lc_client *c, uint64_t ida, uint64_t idb)
{
    /* Read again while the last chunk's cost is still being settled (its batch can be
     * delivered a moment before the worker reports it): then the two differ. */
    double group[2] = {-1, -2}, producer = -1;
    for (int tries = 0; tries < 100 && group[0] != group[1]; tries++) {
        char *reply = NULL;
        assert_int_equal(lc_request_json(c, "{\"op\":\"streams\"}", &reply), 0);
        cJSON *r = cJSON_Parse(reply);
        assert_non_null(r);
        const cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(r, "streams")) {
            uint64_t id = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(s, "id"));
            if (id != ida && id != idb)
                continue;
            assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(s, "worker_cpu_s")) == 0);
            const cJSON *sh = cJSON_GetObjectItem(s, "share");
            assert_true(cJSON_IsNumber(cJSON_GetObjectItem(sh, "worker_cpu_s")));
            group[id == idb] = cJSON_GetNumberValue(cJSON_GetObjectItem(sh, "worker_cpu_s"));
            producer = cJSON_GetNumberValue(cJSON_GetObjectItem(sh, "producer"));
        }
        cJSON_Delete(r);
        lc_free(reply);
    }
    assert_true(group[0] > 0); /* every batch was prepared, by somebody */
    assert_true(group[0] == group[1]); /* one figure, the group's */

    static char out[65536];
    char line[128];
    assert_int_equal(harness_ctl(h, out, sizeof out, "metrics", NULL), 0);
    snprintf(line, sizeof line, "loaderd_share_worker_cpu_seconds_total{share=\"sweep\",producer=\"%.0f\"} ", producer);
    const char *p = strstr(out, line);
    assert_non_null(p);
    assert_null(strstr(p + 1, line)); /* once, for two consumers */
    assert_true(strtod(p + strlen(line), NULL) > 0);
    snprintf(line, sizeof line, "loaderd_stream_worker_cpu_seconds_total{dataset=\"rec\",stream=\"%lu\",",
             (unsigned long)ida);
    p = strstr(out, line);
    assert_non_null(p);
    assert_true(strncmp(strchr(p, '}'), "} 0\n", 4) == 0); /* the consumer's own: none */

    assert_int_equal(harness_ctl(h, out, sizeof out, "top", "--once", NULL), 0);
    assert_non_null(strstr(out, "* a shared stream's CPU, prepared once for its consumers"));
    assert_non_null(strstr(out, " sweep "));
}

static void test_identical_bytes(void **state)
{
    struct harness *h = *state;
    lc_client *a = harness_connect(h, 10000, "a"), *b = harness_connect(h, 10000, "b");
    lc_stream *sa = open_share(a, "sweep", LC_SHARE_JOIN_CURRENT, 7);
    lc_stream *sb = open_share(b, "sweep", LC_SHARE_JOIN_CURRENT, 7);
    assert_true(ring_inode(sa) == ring_inode(sb)); /* one ring */
    assert_true(lc_stream_id(sa) != lc_stream_id(sb));
    /* The streams listing shows both consumers of the share. */
    char *reply = NULL;
    assert_int_equal(lc_request_json(a, "{\"op\":\"streams\"}", &reply), 0);
    assert_non_null(strstr(reply, "\"name\":\"sweep\""));
    assert_non_null(strstr(reply, "\"consumers\":2"));
    lc_free(reply);
    char out[8192];
    assert_int_equal(harness_ctl(h, out, sizeof out, "streams", NULL), 0);
    assert_non_null(strstr(out, "reads shared stream 'sweep' (prepared by stream"));
    assert_non_null(strstr(out, "2 consumers, 2 attached"));
    /* A batch apart (with the read-ahead, within share_max_lag): always the reference
     * batches, in order. */
    for (uint64_t i = 0; i < TOTAL; i++) {
        assert_int_equal(read_check(sa, NULL), i);
        if (i >= 1)
            assert_int_equal(read_check(sb, NULL), i - 1);
    }
    assert_int_equal(read_check(sb, NULL), TOTAL - 1);
    check_share_cpu(h, a, lc_stream_id(sa), lc_stream_id(sb));
    lc_batch *x;
    assert_int_equal(lc_stream_next(sa, 10000, &x), LC_EEND);
    assert_int_equal(lc_stream_next(sb, 10000, &x), LC_EEND);
    assert_int_equal(lc_stream_reopens(sb), 0);
    lc_stream_close(sa);
    lc_stream_close(sb);
    assert_clean(h);
    lc_client_close(a);
    lc_client_close(b);
}

static void test_killed_consumer(void **state)
{
    struct harness *h = *state;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The doomed trainer: reads 3 batches, keeps the last, says so, waits to die. */
        lc_client *c = NULL;
        char err[256];
        if (lc_connect(h->socket, 10000, "doomed", &c, err, sizeof err) < 0)
            _exit(1);
        lc_stream_options o;
        lc_stream_options_init(&o);
        o.batch_size = BATCH;
        o.seed = 7;
        o.epochs = EPOCHS;
        o.prefetch = 2;
        o.share = "k";
        lc_stream *s = NULL;
        lc_batch *b = NULL;
        if (lc_stream_open(c, "rec", &o, &s) < 0)
            _exit(2);
        for (int i = 0; i < 3; i++)
            if (lc_stream_next(s, 10000, &b) < 0 || (i < 2 && lc_batch_release(b) < 0))
                _exit(3);
        if (write(pipefd[1], "x", 1) != 1)
            _exit(4);
        pause();
        _exit(0);
    }
    close(pipefd[1]);
    lc_client *a = harness_connect(h, 10000, "survivor");
    char ch;
    assert_int_equal(read(pipefd[0], &ch, 1), 1);
    close(pipefd[0]);
    lc_stream *sa = open_share(a, "k", LC_SHARE_JOIN_CURRENT, 7);
    uint64_t first = read_check(sa, NULL);
    assert_true(first >= 3);
    kill(pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    for (uint64_t i = first + 1; i < TOTAL; i++)
        assert_int_equal(read_check(sa, NULL), i);
    lc_stream_close(sa);
    assert_clean(h);
    lc_client_close(a);
}

static void test_lagging_consumer(void **state)
{
    struct harness *h = *state;
    lc_client *a = harness_connect(h, 10000, "fast"), *b = harness_connect(h, 10000, "slow");
    lc_stream *sa = open_share(a, "lag", LC_SHARE_JOIN_CURRENT, 7);
    lc_stream *sb = open_share(b, "lag", LC_SHARE_JOIN_CURRENT, 7);
    lc_batch *held = NULL;
    assert_int_equal(read_check(sb, &held), 0); /* the slow one keeps its first batch */
    /* The fast one reads the whole run: it would stall on a full ring if the slow one
     * were not detached. */
    for (uint64_t i = 0; i < TOTAL; i++)
        assert_int_equal(read_check(sa, NULL), i);
    assert_true(batch_hash(held) == ref_hash[0]); /* still its bytes: the slot stayed its own */
    assert_true(lc_batch_valid(held));
    lc_batch_release(held);
    /* The slow one reads on from batch 1, in a stream of its own, the same batches. */
    for (uint64_t i = 1; i < TOTAL; i++)
        assert_int_equal(read_check(sb, NULL), i);
    assert_int_equal(lc_stream_reopens(sb), 1);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "detached; reopen at epoch 0 batch"));
    free(log);
    lc_stream_close(sa);
    lc_stream_close(sb);
    assert_clean(h);
    lc_client_close(a);
    lc_client_close(b);
}

static void test_late_join(void **state)
{
    struct harness *h = *state;
    lc_client *a = harness_connect(h, 10000, "early"), *c = harness_connect(h, 10000, "late");
    lc_stream *sa = open_share(a, "late", LC_SHARE_JOIN_CURRENT, 7);
    for (uint64_t i = 0; i < 5; i++)
        assert_int_equal(read_check(sa, NULL), i);
    /* At the front: the first batch no consumer has taken (the early one's read-ahead
     * may have taken a few more). */
    lc_stream *sc = open_share(c, "late", LC_SHARE_JOIN_CURRENT, 7);
    assert_true(ring_inode(sa) == ring_inode(sc));
    uint64_t first = read_check(sc, NULL);
    assert_true(first >= 5 && first <= 5 + LC_READ_AHEAD + 1);
    /* The whole epoch: a stream of its own from batch 0. */
    lc_stream *sd = open_share(c, "late", LC_SHARE_JOIN_EPOCH_START, 7);
    assert_true(ring_inode(sa) != ring_inode(sd));
    for (uint64_t i = 0; i < TOTAL; i++)
        assert_int_equal(read_check(sd, NULL), i);
    for (uint64_t i = first + 1; i < TOTAL; i++)
        assert_int_equal(read_check(sc, NULL), i);
    for (uint64_t i = 5; i < TOTAL; i++)
        assert_int_equal(read_check(sa, NULL), i);
    lc_stream_close(sa);
    lc_stream_close(sc);
    lc_stream_close(sd);
    assert_clean(h);
    lc_client_close(a);
    lc_client_close(c);
}

static void test_auto_and_mismatch(void **state)
{
    struct harness *h = *state;
    lc_client *a = harness_connect(h, 10000, "auto");
    lc_stream *s1 = open_share(a, "auto", LC_SHARE_JOIN_CURRENT, 7);
    lc_stream *s2 = open_share(a, "auto", LC_SHARE_JOIN_CURRENT, 7);
    lc_stream *s3 = open_share(a, "auto", LC_SHARE_JOIN_CURRENT, 8); /* other settings: another group */
    assert_true(ring_inode(s1) == ring_inode(s2));
    assert_true(ring_inode(s1) != ring_inode(s3));
    /* Two consumers on one connection: each its own batches and releases. */
    lc_batch *b1, *b2;
    assert_int_equal(lc_stream_next(s1, 10000, &b1), 0);
    assert_int_equal(lc_stream_next(s2, 10000, &b2), 0);
    assert_int_equal(seq_of(b1), 0);
    assert_int_equal(seq_of(b2), 0);
    assert_int_equal(lc_batch_slot(b1), lc_batch_slot(b2));
    lc_batch_release(b1);
    lc_batch_release(b2);
    /* A named share with other settings is refused, naming the setting. */
    lc_stream *s4 = open_share(a, "named", LC_SHARE_JOIN_CURRENT, 7);
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.seed = 9;
    o.epochs = EPOCHS;
    o.share = "named";
    lc_stream *bad = NULL;
    assert_int_equal(lc_stream_open(a, "rec", &o, &bad), LC_EINVAL);
    assert_non_null(strstr(lc_client_error(a), "share 'named' is open with seed 7; this open asks for 9"));
    char *reply = NULL;
    assert_int_equal(lc_request_json(a, "{\"op\":\"open\",\"dataset\":\"rec\",\"batch_size\":8,\"share\":\"x\","
                                        "\"share_join\":\"later\"}", &reply), LC_EFIELD);
    assert_non_null(strstr(lc_client_error(a), "field 'share_join': expected \"current\" or \"epoch_start\""));
    assert_int_equal(lc_request_json(a, "{\"op\":\"open\",\"batch_size\":8,\"share\":\"x\","
                                        "\"spec\":{\"kind\":\"files\",\"path\":\"rec\"}}", &reply), LC_ENOTSUP);
    assert_non_null(strstr(lc_client_error(a), "cannot be shared"));
    lc_stream_close(s1);
    lc_stream_close(s2);
    lc_stream_close(s3);
    lc_stream_close(s4);
    /* loaderctl read --share: a trainer of its own on a share. */
    char out[8192];
    assert_int_equal(harness_ctl(h, out, sizeof out, "read", "rec", "--batch-size", "8", "--share", "ctl", "--json",
                                 NULL), 0);
    assert_non_null(strstr(out, "\"samples\":\t200"));
    assert_clean(h);
    lc_client_close(a);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_bytes),
        cmocka_unit_test(test_killed_consumer),
        cmocka_unit_test(test_lagging_consumer),
        cmocka_unit_test(test_late_join),
        cmocka_unit_test(test_auto_and_mismatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
