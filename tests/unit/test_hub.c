/* Unit tests for the hub: a completion runs on the loop thread, from the loop and never
 * inside the call that posted it; in posting order; once however often it was posted
 * before it ran; not at all once cancelled or once the hub closed; and posts from many
 * threads at once all arrive. Each test runs its own loop and ends with the loop closed
 * (uv_loop_close fails while a handle is open). Built also under ThreadSanitizer. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "hub.h"

struct rec {
    struct hub_completion c;
    int id;
    int *log;                      /* ids in the order they ran */
    int *n_log;
    bool *inside_post;             /* set while the test is inside hub_post */
    hub *h;
    int repost;                    /* times to post itself again from done */
    pthread_t loop_thread;
    atomic_int runs;
};

static void rec_done(struct hub_completion *c)
{
    struct rec *r = (struct rec *)c;
    assert_false(r->inside_post && *r->inside_post);
    assert_true(pthread_equal(pthread_self(), r->loop_thread));
    atomic_fetch_add(&r->runs, 1);
    if (r->log)
        r->log[(*r->n_log)++] = r->id;
    if (r->repost > 0) {
        r->repost--;
        hub_post(r->h, &r->c);
    }
}

static void rec_init(struct rec *r, hub *h, int id, int *log, int *n_log)
{
    memset(r, 0, sizeof *r);
    r->c.done = rec_done;
    r->id = id;
    r->log = log;
    r->n_log = n_log;
    r->h = h;
    r->loop_thread = pthread_self();
    atomic_init(&r->runs, 0);
}

static hub *open_loop(uv_loop_t *loop)
{
    hub *h = NULL;
    assert_int_equal(uv_loop_init(loop), 0);
    assert_int_equal(hub_new(loop, &h), 0);
    return h;
}

static void close_loop(uv_loop_t *loop, hub *h)
{
    hub_close(h);
    uv_run(loop, UV_RUN_DEFAULT); /* the hub's handles close; nothing else keeps it alive */
    assert_int_equal(uv_loop_close(loop), 0);
}

static void test_runs_later_in_order(void **state)
{
    uv_loop_t loop;
    hub *h = open_loop(&loop);
    int log[8], n_log = 0;
    bool inside = false;
    struct rec r[4];
    for (int i = 0; i < 4; i++) {
        rec_init(&r[i], h, i, log, &n_log);
        r[i].inside_post = &inside;
    }
    inside = true;
    hub_post(h, &r[2].c);
    hub_post(h, &r[0].c);
    hub_post(h, &r[3].c);
    hub_post(h, &r[0].c); /* already queued: runs once, in its first place */
    inside = false;
    assert_int_equal(n_log, 0); /* nothing ran inside the posts */
    assert_int_equal(hub_pending(h), 3);
    /* One turn of the loop runs them without waiting for I/O (UV_RUN_ONCE would block
     * if the hub did not keep the loop from waiting). */
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(n_log, 3);
    assert_int_equal(log[0], 2);
    assert_int_equal(log[1], 0);
    assert_int_equal(log[2], 3);
    assert_int_equal(atomic_load(&r[1].runs), 0);
    assert_int_equal(hub_pending(h), 0);
    close_loop(&loop, h);
}

static void test_cancel(void **state)
{
    uv_loop_t loop;
    hub *h = open_loop(&loop);
    int log[8], n_log = 0;
    struct rec a, b, c;
    rec_init(&a, h, 1, log, &n_log);
    rec_init(&b, h, 2, log, &n_log);
    rec_init(&c, h, 3, log, &n_log);
    hub_post(h, &a.c);
    hub_post(h, &b.c);
    hub_post(h, &c.c);
    assert_true(hub_cancel(h, &b.c));
    assert_false(hub_cancel(h, &b.c)); /* not queued any more */
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(n_log, 2);
    assert_int_equal(log[0], 1);
    assert_int_equal(log[1], 3);
    assert_false(hub_cancel(h, &a.c)); /* ran: not queued */
    /* Posted again after a cancel: runs. */
    hub_post(h, &b.c);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(n_log, 3);
    assert_int_equal(log[2], 2);
    close_loop(&loop, h);
}

/* A completion that posts itself again runs once per turn: the loop goes on polling
 * for I/O between its runs. */
static void test_repost_runs_next_turn(void **state)
{
    uv_loop_t loop;
    hub *h = open_loop(&loop);
    struct rec r;
    rec_init(&r, h, 1, NULL, NULL);
    r.repost = 3;
    hub_post(h, &r.c);
    for (int turn = 1; turn <= 4; turn++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        assert_int_equal(atomic_load(&r.runs), turn);
    }
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&r.runs), 4);
    close_loop(&loop, h);
}

/* Closing forgets what is queued: its owners are going away. */
static void test_close_drops_queued(void **state)
{
    uv_loop_t loop;
    hub *h = open_loop(&loop);
    struct rec r;
    rec_init(&r, h, 1, NULL, NULL);
    hub_post(h, &r.c);
    close_loop(&loop, h);
    assert_int_equal(atomic_load(&r.runs), 0);
}

#define THREADS 4
#define PER_THREAD 2000

struct poster {
    hub *h;
    struct rec *recs;
};

static void *poster_main(void *arg)
{
    struct poster *p = arg;
    for (int i = 0; i < PER_THREAD; i++)
        hub_post(p->h, &p->recs[i].c);
    return NULL;
}

/* Posts from other threads wake the loop and all arrive, each on the loop thread. */
static void test_posts_from_threads(void **state)
{
    uv_loop_t loop;
    hub *h = open_loop(&loop);
    struct rec *recs = calloc(THREADS * PER_THREAD, sizeof *recs);
    assert_non_null(recs);
    for (int i = 0; i < THREADS * PER_THREAD; i++)
        rec_init(&recs[i], h, i, NULL, NULL);
    pthread_t th[THREADS];
    struct poster ps[THREADS];
    for (int t = 0; t < THREADS; t++) {
        ps[t] = (struct poster){.h = h, .recs = recs + t * PER_THREAD};
        assert_int_equal(pthread_create(&th[t], NULL, poster_main, &ps[t]), 0);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    /* Every post woke the loop (or coalesced with a wake-up not yet seen): bounded turns. */
    for (int turn = 0; turn < 100 && hub_pending(h) > 0; turn++)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(hub_pending(h), 0);
    for (int i = 0; i < THREADS * PER_THREAD; i++)
        assert_int_equal(atomic_load(&recs[i].runs), 1);
    free(recs);
    close_loop(&loop, h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_later_in_order),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_repost_runs_next_turn),
        cmocka_unit_test(test_close_drops_queued),
        cmocka_unit_test(test_posts_from_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
