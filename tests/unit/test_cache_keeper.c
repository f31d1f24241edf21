/* Unit tests for cache_keeper (one dataset's cache while the daemon runs) and the JSON
 * that cache_report makes of it: tickets (a stream opened after a change never reads a
 * cache built before it), reclamation of replaced caches, verify during a build and
 * forced rebuilds, a failed directory retried, mode off, a corrupt sample found while
 * serving, and the keeper's stats agreeing with its JSON; references taken and given
 * back by worker threads (a stream's direct path) while the loop replaces the cache,
 * with the last reference to a replaced cache and a cache found bad left to the loop.
 * A real uv loop runs the keeper's completions; its thread builds real caches of a real
 * `files` dataset. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cache_fixtures.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <uv.h>

#include "cache_keeper.h"
#include "cache_report.h"
#include "log.h"

/* ---- the keeper -------------------------------------------------------------------------- */

struct keeper_fixture {
    uv_loop_t loop;
    dataset *d;
    cache_keeper *k;
    struct config_dataset cfg;
    bool closed;
};

static cJSON *keeper_info(cache_keeper *k)
{
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(cache_report_keeper(k, o), 0);
    return o;
}

static bool keeper_in(cache_keeper *k, const char *state)
{
    cJSON *o = keeper_info(k);
    bool r = strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "state")), state) == 0;
    cJSON_Delete(o);
    return r;
}

static double keeper_num(cache_keeper *k, const char *key)
{
    cJSON *o = keeper_info(k);
    double v = cJSON_GetNumberValue(cJSON_GetObjectItem(o, key));
    cJSON_Delete(o);
    return v;
}

/* Runs the loop until the keeper is in `state` with no job running (10 s at most). */
static void keeper_wait(struct keeper_fixture *f, const char *state)
{
    for (int i = 0; i < 2000; i++) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        cJSON *o = keeper_info(f->k);
        bool idle = !cJSON_GetObjectItem(o, "progress");
        bool in = strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "state")), state) == 0;
        cJSON_Delete(o);
        if (in && idle && i > 0)
            return;
        usleep(5000);
    }
    cJSON *o = keeper_info(f->k);
    fail_msg("keeper never became %s: %s", state, cJSON_PrintUnformatted(o));
}

/* Runs the loop until `ticket` may read the cache; returns the reference. */
static cache *keeper_acquire_wait(struct keeper_fixture *f, uint64_t ticket)
{
    for (int i = 0; i < 2000; i++) {
        cache *c = cache_keeper_acquire(f->k, f->d, ticket, NULL);
        if (c)
            return c;
        uv_run(&f->loop, UV_RUN_NOWAIT);
        usleep(5000);
    }
    fail_msg("ticket %" PRIu64 " never got the cache", ticket);
    return NULL;
}

static void keeper_start(struct keeper_fixture *f, struct tdir *t, int mode, const char *cache_path)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    f->d = open_dataset(t);
    f->cfg = (struct config_dataset){.name = "ds", .kind = CONFIG_DATASET_FILES, .path = t->src,
                                     .pattern = "*", .cache_path = (char *)cache_path, .cache_mode = mode};
    char err[LD_ERRMSG_MAX] = "";
    if (cache_keeper_new(&f->loop, f->d, &f->cfg, &f->k, err) != 0)
        fail_msg("cache_keeper_new: %s", err);
    assert_ptr_equal(f->d->keeper, f->k);
}

static void keeper_closed_cb(void *ctx)
{
    ((struct keeper_fixture *)ctx)->closed = true;
}

static void keeper_stop(struct keeper_fixture *f)
{
    cache_keeper_close(f->k, keeper_closed_cb, f);
    while (!f->closed)
        uv_run(&f->loop, UV_RUN_NOWAIT);
    cache_keeper_free(f->k);
    assert_null(f->d->keeper);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    dataset_free(f->d);
}

/* Rewrites file i of write_fixed_tree with the same size, new bytes and a new mtime. */
static void rewrite_file(const char *root, unsigned i, unsigned seed, time_t mtime)
{
    char rel[64], path[600];
    snprintf(rel, sizeof rel, "class_%u/%04u.bin", i % 3, i);
    testfs_write(root, rel, seed, 1000);
    snprintf(path, sizeof path, "%s/%s", root, rel);
    struct timespec ts[2] = {{.tv_sec = mtime}, {.tv_sec = mtime}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* A stream opened after a change never gets the old cache; a replaced cache stays
 * mapped while a batch holds it and is unmapped after; far more than 16 rebuilds in
 * one run work (no attach limit). */
static void test_keeper_tickets_and_reclaim(void **state)
{
    struct tdir *t = *state;
    struct keeper_fixture f;
    write_fixed_tree(t->src, 30, 1000);
    keeper_start(&f, t, CONFIG_CACHE_AUTO, t->cache);
    keeper_wait(&f, "absent");
    uint64_t t1 = cache_keeper_stream_opened(f.k);
    assert_null(cache_keeper_acquire(f.k, f.d, t1, NULL));    /* building: the source */
    keeper_wait(&f, "ready");
    cache *c1 = cache_keeper_acquire(f.k, f.d, t1, NULL);     /* built after t1 opened */
    assert_non_null(c1);

    /* A new stream waits for its own check, even with nothing changed. */
    uint64_t t2 = cache_keeper_stream_opened(f.k);
    assert_null(cache_keeper_acquire(f.k, f.d, t2, NULL));
    cache *c2 = keeper_acquire_wait(&f, t2);
    assert_ptr_equal(c2, c1);
    cache_keeper_release(f.k, c2);

    /* Same size, new bytes: the stream opened after it reads the source, and once the
     * rebuild is attached, the new bytes. */
    rewrite_file(t->src, 4, 777, 1500000000);
    uint64_t t3 = cache_keeper_stream_opened(f.k);
    assert_null(cache_keeper_acquire(f.k, f.d, t3, NULL));
    cache *c3 = keeper_acquire_wait(&f, t3);
    assert_ptr_not_equal(c3, c1);
    uint8_t buf[1000];
    uint64_t len;
    int64_t label;
    char err[LD_ERRMSG_MAX] = "";
    const uint64_t s4 = sample_of(f.d, 4);
    assert_int_equal(cache_read(c3, s4, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(buf[0], testfs_byte(777, 0));
    assert_int_equal(buf[999], testfs_byte(777, 999));
    cache_keeper_release(f.k, c3);
    /* c1 is still held by a batch of stream 1: mapped and readable until released. */
    assert_int_equal((int)keeper_num(f.k, "mapped"), 2);
    assert_int_equal(cache_read(c1, s4, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(buf[0], testfs_byte(4, 0));
    cache_keeper_release(f.k, c1);
    assert_int_equal((int)keeper_num(f.k, "mapped"), 1);

    /* 20 more changes and rebuilds in one run: each attaches, none stays mapped. */
    for (unsigned n = 0; n < 20; n++) {
        rewrite_file(t->src, n % 30, 1000 + n, 1500000001 + n);
        uint64_t tk = cache_keeper_stream_opened(f.k);
        cache *c = keeper_acquire_wait(&f, tk);
        assert_int_equal(cache_read(c, sample_of(f.d, n % 30), buf, sizeof buf, &len, &label, true, err), 0);
        assert_int_equal(buf[7], testfs_byte(1000 + n, 7));
        cache_keeper_release(f.k, c);
        assert_int_equal((int)keeper_num(f.k, "mapped"), 1);
    }
    assert_true(keeper_num(f.k, "attached") >= 22);
    assert_true(keeper_in(f.k, "ready"));
    keeper_stop(&f);
}

struct verify_result {
    bool called;
    int rc;
    char msg[LD_ERRMSG_MAX];
};

static void verify_cb(void *ctx, int rc, const char *message)
{
    struct verify_result *v = ctx;
    v->called = true;
    v->rc = rc;
    snprintf(v->msg, sizeof v->msg, "%s", message ? message : "");
}

/* A verify asked for while a build runs waits for the build and checks its result; a
 * second verify meanwhile is refused; a forced rebuild is rate-limited. */
static void test_keeper_verify_during_build_and_force(void **state)
{
    struct tdir *t = *state;
    struct keeper_fixture f;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 200, 1000);
    keeper_start(&f, t, CONFIG_CACHE_AUTO, t->cache);
    keeper_wait(&f, "absent");
    assert_int_equal(cache_keeper_build(f.k, false, err), 0);
    assert_true(keeper_in(f.k, "building")); /* the loop has not run: still building */
    struct verify_result v = {0}, v2 = {0};
    assert_int_equal(cache_keeper_verify(f.k, verify_cb, &v, err), 0);
    assert_int_equal(cache_keeper_verify(f.k, verify_cb, &v2, err), LD_EBUSY);
    assert_non_null(strstr(err, "already running"));
    for (int i = 0; i < 2000 && !v.called; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        usleep(5000);
    }
    assert_true(v.called);
    if (v.rc != 0)
        fail_msg("verify after the build: %d %s", v.rc, v.msg);
    assert_false(v2.called);
    assert_true(keeper_in(f.k, "ready"));

    /* Not forced over a valid cache: refused; forced: once, then limited. */
    assert_int_equal(cache_keeper_build(f.k, false, err), LD_EEXIST);
    assert_int_equal(cache_keeper_build(f.k, true, err), 0);
    keeper_wait(&f, "ready");
    assert_int_equal(cache_keeper_build(f.k, true, err), LD_EAGAIN);
    assert_non_null(strstr(err, "limited to one per 60 s"));
    keeper_stop(&f);
}

/* A failed cache (its directory missing) is retried at the next stream open once the
 * cause is gone; mode off says so. */
/* What status and `loaderctl cache info` show of an idle keeper: its stats, and the
 * JSON cache_report builds from them, agree. */
static void check_report(cache_keeper *k, const char *state, const char *mode, bool has_file, bool has_error)
{
    struct cache_keeper_stats st;
    cache_keeper_stats(k, &st);
    assert_string_equal(st.state, state);
    assert_string_equal(st.mode, mode);
    assert_int_equal(st.file != NULL, has_file);
    assert_int_equal(st.error != NULL, has_error);
    assert_true(st.progress < 0);           /* idle: no job running */
    cJSON *o = keeper_info(k);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(o, "state")), state);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(o, "mode")), mode);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(o, "path")), st.path);
    assert_null(cJSON_GetObjectItem(o, "progress"));
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "hits")) == (double)st.hits);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "attached")) == (double)st.attached);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "mapped")) == (double)st.mapped);
    const cJSON *file = cJSON_GetObjectItem(o, "file");
    assert_int_equal(file != NULL, has_file);
    if (file) {
        assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(file, "count")) == (double)cache_meta(st.file)->count);
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(file, "path")), cache_path(st.file));
    }
    const cJSON *error = cJSON_GetObjectItem(o, "error");
    assert_int_equal(error != NULL, has_error);
    if (error)
        assert_string_equal(cJSON_GetStringValue(error), st.error);
    cJSON_Delete(o);
}

static void test_keeper_failed_retried_and_off(void **state)
{
    struct tdir *t = *state;
    struct keeper_fixture f;
    char path[600], dir[500], err[LD_ERRMSG_MAX] = "";
    snprintf(dir, sizeof dir, "%s/later", t->root);
    snprintf(path, sizeof path, "%s/ds.ldcache", dir);
    write_fixed_tree(t->src, 10, 100);
    keeper_start(&f, t, CONFIG_CACHE_AUTO, path);
    keeper_wait(&f, "absent");
    uint64_t t1 = cache_keeper_stream_opened(f.k);
    keeper_wait(&f, "failed");
    check_report(f.k, "failed", "auto", false, true);
    assert_null(cache_keeper_acquire(f.k, f.d, t1, NULL));
    assert_int_equal(mkdir(dir, 0755), 0);
    uint64_t t2 = cache_keeper_stream_opened(f.k);
    cache *c = keeper_acquire_wait(&f, t2);
    cache_keeper_release(f.k, c);
    assert_true(keeper_in(f.k, "ready"));
    keeper_wait(&f, "ready");
    check_report(f.k, "ready", "auto", true, false);
    keeper_stop(&f);

    keeper_start(&f, t, CONFIG_CACHE_OFF, path);
    assert_true(keeper_in(f.k, "off"));
    check_report(f.k, "off", "off", false, false);
    uint64_t t3 = cache_keeper_stream_opened(f.k);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    assert_null(cache_keeper_acquire(f.k, f.d, t3, NULL));
    assert_int_equal(cache_keeper_build(f.k, true, err), LD_ENOTSUP);
    assert_non_null(strstr(err, "cache.mode: off"));
    struct verify_result v = {0};
    assert_int_equal(cache_keeper_verify(f.k, verify_cb, &v, err), LD_ENOTSUP);
    assert_non_null(strstr(err, "cache.mode: off"));
    keeper_stop(&f);
}

/* A sample found corrupt while served: the batch got the source's bytes, and at the
 * next batch the keeper sets the file aside, stops handing it out and rebuilds. */
static void test_keeper_drops_bad_cache(void **state)
{
    struct tdir *t = *state;
    struct keeper_fixture f;
    char bad[600], err[LD_ERRMSG_MAX] = "";
    snprintf(bad, sizeof bad, "%s.bad", t->cache);
    write_fixed_tree(t->src, 30, 1000);
    keeper_start(&f, t, CONFIG_CACHE_AUTO, t->cache);
    keeper_wait(&f, "absent");
    uint64_t t1 = cache_keeper_stream_opened(f.k);
    cache *c = keeper_acquire_wait(&f, t1);
    flip_byte(t->cache, CACHE_HEADER_SIZE + 5 * align_to(1000) + 3);
    uint8_t buf[1000];
    int64_t label = -7;
    void *dst[2] = {buf, &label};
    struct dataset_read_ctx ctx = {.cache = c};
    for (uint64_t i = 0; i < 30; i++)
        assert_int_equal(dataset_read(f.d, i, &ctx, dst, NULL, err), 0);
    assert_int_equal(dataset_read(f.d, 5, &ctx, dst, NULL, err), 0);
    unsigned file5 = 0;
    while (sample_of(f.d, file5) != 5)
        file5++;
    assert_int_equal(buf[3], testfs_byte(file5, 3));
    cache_keeper_release(f.k, c);
    assert_null(cache_keeper_acquire(f.k, f.d, t1, NULL)); /* found bad: set aside, rebuilding */
    assert_true(exists(bad));
    c = keeper_acquire_wait(&f, t1);
    assert_int_equal(cache_verify(c, NULL, NULL, NULL, err), 0);
    cache_keeper_release(f.k, c);
    keeper_stop(&f);
}

/* ---- worker threads ---------------------------------------------------------------- */

#define READERS 2
#define HANDED_MAX 4096

/* What the readers share with the loop: the ticket they read with, and the references
 * try_release refused (the last ones to a replaced cache), handed to the loop. */
struct readers {
    struct keeper_fixture *f;
    uint64_t ticket;
    atomic_bool stop;
    atomic_uint_fast64_t reads, refused;
    pthread_mutex_t lock;
    char error[LD_ERRMSG_MAX];      /* the first thing a reader found wrong (cmocka asserts on the main thread) */
    cache *handed[HANDED_MAX];
    unsigned n_handed;
};

static void reader_failed(struct readers *r, const char *what, unsigned i, const char *err)
{
    pthread_mutex_lock(&r->lock);
    if (!r->error[0])
        snprintf(r->error, sizeof r->error, "file %u: %s%s", i, what, err);
    pthread_mutex_unlock(&r->lock);
    atomic_store(&r->stop, true);
}

/* A worker: takes the cache for a "batch", checks one sample's bytes against its file
 * (a replaced cache is still mapped while held), gives the reference back. */
static void *reader_main(void *arg)
{
    struct readers *r = arg;
    uint8_t buf[1000];
    char err[LD_ERRMSG_MAX] = "";
    for (unsigned n = 0; !atomic_load(&r->stop); n++) {
        bool advise = false, bad = true;
        unsigned i = 10 + n % 20; /* files 10..29 never change here */
        cache *c = cache_keeper_try_acquire(r->f->k, r->f->d, r->ticket, &advise, &bad);
        if (bad)
            reader_failed(r, "the cache was said to be bad", i, "");
        if (!c) {
            sched_yield();
            continue;
        }
        uint64_t len;
        int64_t label;
        if (cache_read(c, sample_of(r->f->d, i), buf, sizeof buf, &len, &label, true, err) != 0)
            reader_failed(r, "a held cache could not be read: ", i, err);
        else if (buf[5] != testfs_byte(i, 5))
            reader_failed(r, "wrong bytes from the cache", i, "");
        atomic_fetch_add(&r->reads, 1);
        if (!cache_keeper_try_release(r->f->k, c)) {
            atomic_fetch_add(&r->refused, 1);
            pthread_mutex_lock(&r->lock);
            if (r->n_handed < HANDED_MAX)
                r->handed[r->n_handed++] = c;
            else
                snprintf(r->error, sizeof r->error, "more than %u references handed to the loop", HANDED_MAX);
            pthread_mutex_unlock(&r->lock);
        }
    }
    return NULL;
}

/* The loop's part: gives back what the readers handed over. */
static void readers_settle(struct readers *r)
{
    pthread_mutex_lock(&r->lock);
    for (unsigned i = 0; i < r->n_handed; i++)
        cache_keeper_release(r->f->k, r->handed[i]);
    r->n_handed = 0;
    pthread_mutex_unlock(&r->lock);
}

/* Worker threads take and give back references while the loop replaces the cache
 * three times: what they read is always right, and every replaced cache is unmapped
 * once its last reference is back. The last reference to a replaced cache is refused
 * to a worker (the loop gives it back); a cache found bad is reported, not dropped, by
 * try_acquire, and dropped by cache_keeper_tend. */
static void test_keeper_worker_references(void **state)
{
    struct tdir *t = *state;
    struct keeper_fixture f;
    write_fixed_tree(t->src, 30, 1000);
    keeper_start(&f, t, CONFIG_CACHE_AUTO, t->cache);
    keeper_wait(&f, "absent");
    uint64_t t1 = cache_keeper_stream_opened(f.k);
    bool advise = true, bad = true;
    assert_null(cache_keeper_try_acquire(f.k, f.d, t1, &advise, &bad)); /* building: the source */
    assert_false(bad);
    cache_keeper_release(f.k, keeper_acquire_wait(&f, t1));

    /* The last reference to a replaced cache: refused to a worker, taken by the loop. */
    cache *old = cache_keeper_try_acquire(f.k, f.d, t1, &advise, &bad);
    assert_non_null(old);
    assert_true(cache_keeper_try_release(f.k, old));      /* attached: given back */
    old = cache_keeper_try_acquire(f.k, f.d, t1, &advise, &bad);
    rewrite_file(t->src, 1, 501, 1500000000);
    uint64_t t2 = cache_keeper_stream_opened(f.k);
    cache_keeper_release(f.k, keeper_acquire_wait(&f, t2));
    assert_int_equal((int)keeper_num(f.k, "mapped"), 2);
    assert_false(cache_keeper_try_release(f.k, old));     /* the last one of a replaced cache */
    assert_int_equal((int)keeper_num(f.k, "mapped"), 2);  /* nothing was done */
    cache_keeper_release(f.k, old);
    assert_int_equal((int)keeper_num(f.k, "mapped"), 1);

    /* Readers on two threads while the loop replaces the cache three times. */
    struct readers r = {.f = &f, .ticket = t2};
    pthread_mutex_init(&r.lock, NULL);
    pthread_t th[READERS];
    for (int i = 0; i < READERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &r), 0);
    for (unsigned round = 0; round < 3; round++) {
        double attached = keeper_num(f.k, "attached");
        rewrite_file(t->src, round + 2, 600 + round, 1500000001 + round);
        cache_keeper_stream_opened(f.k); /* the check finds the change: rebuilt, attached */
        for (int i = 0; i < 2000 && !(keeper_in(f.k, "ready") && keeper_num(f.k, "attached") > attached); i++) {
            uv_run(&f.loop, UV_RUN_NOWAIT);
            readers_settle(&r);
            usleep(5000);
        }
        assert_true(keeper_num(f.k, "attached") > attached);
        /* The readers' ticket came before the change: proven for the new cache too
         * (built after it opened), so they go on reading it. */
        uint64_t before = atomic_load(&r.reads);
        for (int i = 0; i < 2000 && atomic_load(&r.reads) < before + 50; i++)
            usleep(1000);
        assert_true(atomic_load(&r.reads) >= before + 50);
    }
    atomic_store(&r.stop, true);
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    readers_settle(&r);
    pthread_mutex_destroy(&r.lock);
    if (r.error[0])
        fail_msg("%s", r.error);
    assert_int_equal((int)keeper_num(f.k, "mapped"), 1);
    assert_true(keeper_in(f.k, "ready"));

    /* A cache found bad: try_acquire says so and leaves it (the loop's to drop). */
    char badpath[600];
    snprintf(badpath, sizeof badpath, "%s.bad", t->cache);
    cache *c = cache_keeper_try_acquire(f.k, f.d, t2, &advise, &bad);
    assert_non_null(c);
    uint64_t len;
    int64_t label;
    uint8_t buf[1000];
    char err[LD_ERRMSG_MAX];
    flip_byte(t->cache, CACHE_HEADER_SIZE + 5 * align_to(1000) + 9);
    assert_int_equal(cache_read(c, 5, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_true(cache_keeper_try_release(f.k, c));
    assert_null(cache_keeper_try_acquire(f.k, f.d, t2, &advise, &bad));
    assert_true(bad);
    assert_true(keeper_in(f.k, "ready"));                 /* not dropped by a worker */
    assert_false(exists(badpath));
    cache_keeper_tend(f.k);
    assert_true(exists(badpath));                         /* the loop set it aside */
    assert_false(keeper_in(f.k, "ready"));
    cache_keeper_release(f.k, keeper_acquire_wait(&f, t2)); /* rebuilt */

    /* Found bad by a worker once more, and the daemon stops before the loop comes by:
     * the tend that comes after the keeper was closed starts no rebuild (its thread
     * would outlive the keeper) and sets nothing aside. */
    assert_int_equal(unlink(badpath), 0);
    c = cache_keeper_try_acquire(f.k, f.d, t2, &advise, &bad);
    assert_non_null(c);
    flip_byte(t->cache, CACHE_HEADER_SIZE + 7 * align_to(1000) + 3);
    assert_int_equal(cache_read(c, 7, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_true(cache_keeper_try_release(f.k, c));
    assert_null(cache_keeper_try_acquire(f.k, f.d, t2, &advise, &bad));
    assert_true(bad);
    cache_keeper_close(f.k, keeper_closed_cb, &f);
    cache_keeper_tend(f.k);
    assert_false(exists(badpath));
    assert_true(keeper_in(f.k, "off"));
    while (!f.closed)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    cache_keeper_free(f.k);
    assert_null(f.d->keeper);
    assert_int_equal(uv_loop_close(&f.loop), 0);
    dataset_free(f.d);
}

int main(void)
{
    ld_log_set_level(LD_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keeper_tickets_and_reclaim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keeper_verify_during_build_and_force, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keeper_failed_retried_and_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keeper_drops_bad_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keeper_worker_references, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
