/* Unit tests for the stream module, with a fake dataset kind (each sample is its own
 * index, as one int64), a real libuv loop, the hub and a pool of two workers: batches
 * come in order with the right rows; no more than `prefetch` batches are prepared
 * ahead; a sample that fails fails the stream at its batch, and the batches before it
 * are served; a `next` gets a ready batch back from stream_next and is otherwise called
 * back from the loop, never inside stream_next; a stream closed while workers still
 * fill its slots calls nobody back and is freed once they are back.
 * Every test ends with the loop closed (no handle left), the ring's name gone from
 * /dev/shm, and ASan's leak check at exit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#include "dataset.h"
#include "dataset_watch.h"
#include "hub.h"
#include "pool.h"
#include "ring.h"
#include "stream.h"

#define SAMPLES 40
#define WORKERS 2
#define LOOP_BUDGET_MS 10000 /* any wait in these tests: far beyond what they need */

/* ---- the fake dataset ------------------------------------------------------------- */

struct fake {
    dataset base;                   /* first: the stream sees a dataset */
    atomic_uint reads;
    uint64_t fail_index;            /* UINT64_MAX: none */
    /* A gate the reads wait at while closed, to keep work in flight. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool gate_closed;
    unsigned at_gate;
};

static int fake_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    struct fake *f = (struct fake *)d;
    pthread_mutex_lock(&f->lock);
    f->at_gate++;
    pthread_cond_broadcast(&f->cond);
    while (f->gate_closed)
        pthread_cond_wait(&f->cond, &f->lock);
    f->at_gate--;
    pthread_mutex_unlock(&f->lock);
    atomic_fetch_add(&f->reads, 1);
    if (index == f->fail_index) {
        snprintf(errbuf, LD_ERRMSG_MAX, "fake sample %llu is unreadable", (unsigned long long)index);
        return LD_ESAMPLE;
    }
    int64_t v = (int64_t)index;
    memcpy(dst[0], &v, sizeof v);
    return 0;
}

static void fake_free(dataset *d)
{
    (void)d;
}

static const struct dataset_ops fake_ops = {
    .kind = "fake",
    .free = fake_free,
    .read = fake_read,
};

static void fake_init(struct fake *f)
{
    memset(f, 0, sizeof *f);
    f->base.ops = &fake_ops;
    snprintf(f->base.name, sizeof f->base.name, "fake");
    f->base.count = SAMPLES;
    f->base.n_fields = 1;
    snprintf(f->base.fields[0].name, sizeof f->base.fields[0].name, "index");
    f->base.fields[0].dtype = LD_DTYPE_INT64;
    f->base.fields[0].ndim = 0;
    f->base.on_error = CONFIG_ON_ERROR_FAIL;
    f->fail_index = UINT64_MAX;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
}

static void fake_gate(struct fake *f, bool closed)
{
    pthread_mutex_lock(&f->lock);
    f->gate_closed = closed;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

static unsigned fake_at_gate(struct fake *f)
{
    pthread_mutex_lock(&f->lock);
    unsigned n = f->at_gate;
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* ---- the harness ------------------------------------------------------------------ */

struct env {
    uv_loop_t loop;
    hub *hub;
    pool *workers;
    stream_set *set;
    struct fake ds;
};

static int env_setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    assert_int_equal(uv_loop_init(&e->loop), 0);
    assert_int_equal(hub_new(&e->loop, &e->hub), 0);
    assert_int_equal(pool_new(WORKERS, &e->workers), 0);
    assert_int_equal(stream_set_new(e->hub, e->workers, &e->set), 0);
    fake_init(&e->ds);
    dataset_hold(&e->ds.base); /* the test's own hold: the fake is not freed by a stream */
    *state = e;
    return 0;
}

/* Everything goes: the set (its last stream gone), the hub, the pool; the loop then
 * closes, which fails while any handle is open. */
static int env_teardown(void **state)
{
    struct env *e = *state;
    fake_gate(&e->ds, false);
    assert_int_equal(stream_set_live(e->set), 0);
    stream_set_free(e->set);
    hub_close(e->hub);
    pool_free(e->workers);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    assert_int_equal(e->ds.base.holders, 1);
    pthread_cond_destroy(&e->ds.cond);
    pthread_mutex_destroy(&e->ds.lock);
    free(e);
    return 0;
}

/* Turns the loop until done() says so, within LOOP_BUDGET_MS. */
static bool env_run_until(struct env *e, bool (*done)(void *ctx), void *ctx)
{
    uint64_t end = uv_hrtime() + (uint64_t)LOOP_BUDGET_MS * 1000000u;
    while (!done(ctx)) {
        if (uv_hrtime() > end)
            return false;
        uv_run(&e->loop, UV_RUN_NOWAIT);
        if (!done(ctx))
            uv_sleep(1);
    }
    return true;
}

static stream *env_open(struct env *e, uint64_t id, uint32_t batch, uint32_t prefetch, uint64_t epochs)
{
    struct stream_params p = {
        .batch_size = batch, .shuffle = false, .seed = 1, .epoch = 0, .rank = 0, .world_size = 1,
        .drop_last = false, .start_batch = 0, .prefetch = prefetch, .epochs = epochs,
    };
    char err[LD_ERRMSG_MAX] = "";
    stream *s = NULL;
    int rc = stream_open(e->set, &e->ds.base, id, &p, UINT64_MAX, &s, err);
    if (rc < 0)
        fail_msg("stream_open: %s", err);
    return s;
}

/* Whether the shared-memory object `name` still exists. */
static bool shm_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return errno != ENOENT;
    close(fd);
    return true;
}

/* One next request and its answer. */
struct ask {
    bool inside;                    /* the test is inside stream_next */
    bool answered;
    bool answered_inside;           /* the callback ran inside stream_next: never */
    bool returned;                  /* the answer came back from stream_next itself */
    int rc;
    struct stream_batch b;
    char msg[LD_ERRMSG_MAX];
};

static void ask_record(struct ask *a, const struct stream_answer *an)
{
    a->answered = true;
    a->rc = an->rc;
    a->b = an->batch;
    snprintf(a->msg, sizeof a->msg, "%s", an->message ? an->message : "");
}

static void ask_cb(void *ctx, const struct stream_answer *an)
{
    struct ask *a = ctx;
    assert_false(a->answered); /* one answer per request */
    a->answered_inside = a->inside;
    ask_record(a, an);
}

static bool ask_done(void *ctx)
{
    return ((struct ask *)ctx)->answered;
}

/* Asks for the next batch without waiting: the answer is returned when known now. */
static int ask(stream *s, struct ask *a)
{
    memset(a, 0, sizeof *a);
    struct stream_answer an;
    a->inside = true;
    int rc = stream_next(s, ask_cb, a, &an);
    a->inside = false;
    assert_false(a->answered_inside);
    if (rc == 1) {
        a->returned = true;
        ask_record(a, &an);
    } else {
        assert_false(a->answered);
    }
    return rc;
}

/* Asks for the next batch and waits for the answer. */
static void ask_next(struct env *e, stream *s, struct ask *a)
{
    int rc = ask(s, a);
    assert_true(rc == 0 || rc == 1);
    assert_true(env_run_until(e, ask_done, a));
    assert_false(a->answered_inside);
}

/* The offset of field 0 in a slot, from the layout the open reply carries. */
static uint64_t field_offset(stream *s)
{
    cJSON *o = cJSON_CreateObject();
    stream_describe_layout(s, o);
    cJSON *f0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "fields"), 0);
    uint64_t off = (uint64_t)cJSON_GetObjectItemCaseSensitive(f0, "offset")->valuedouble;
    cJSON_Delete(o);
    return off;
}

static int64_t row_value(stream *s, uint32_t slot, uint64_t off, uint32_t row)
{
    const uint8_t *base = ring_slot((ring *)stream_ring(s), slot);
    int64_t v;
    memcpy(&v, base + off + (uint64_t)row * sizeof v, sizeof v);
    return v;
}

struct prepared {
    stream *s;
    uint32_t want;
};

/* `want` batches are READY (and none FILLING). */
static bool prepared_done(void *ctx)
{
    struct prepared *p = ctx;
    const ring *r = stream_ring(p->s);
    return ring_count(r, RING_READY) == p->want && ring_count(r, RING_FILLING) == 0;
}

struct live {
    stream_set *set;
};

static bool set_empty(void *ctx)
{
    return stream_set_live(((struct live *)ctx)->set) == 0;
}

/* ---- the tests -------------------------------------------------------------------- */

/* 40 samples in batches of 6: six full batches and a last one of 4, in order, each row
 * holding its sample; then the end. */
static void test_batches_in_order(void **state)
{
    struct env *e = *state;
    stream *s = env_open(e, 1, 6, 2, 1);
    uint64_t off = field_offset(s);
    struct ask a;
    for (uint64_t k = 0; k < 7; k++) {
        ask_next(e, s, &a);
        assert_int_equal(a.rc, 0);
        assert_int_equal(a.b.epoch, 0);
        assert_int_equal(a.b.batch, k);
        assert_int_equal(a.b.rows, k < 6 ? 6 : 4);
        for (uint32_t row = 0; row < a.b.rows; row++)
            assert_int_equal(row_value(s, a.b.slot, off, row), (int64_t)(k * 6 + row));
        assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
        /* A slot given back twice is refused and changes nothing. */
        assert_int_equal(stream_release(s, a.b.slot, a.b.generation), LD_ENOTLEASED);
    }
    ask_next(e, s, &a);
    assert_int_equal(a.rc, LD_EEND);
    assert_int_equal(atomic_load(&e->ds.reads), SAMPLES);
    char name[256];
    snprintf(name, sizeof name, "%s", ring_name(stream_ring(s)));
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
    assert_false(shm_exists(name));
}

/* Several nexts may wait at once: they are answered in order. */
static void test_waiting_nexts_in_order(void **state)
{
    struct env *e = *state;
    fake_gate(&e->ds, true); /* nothing is ready when they ask */
    stream *s = env_open(e, 2, 4, 3, 1);
    struct ask a[3];
    memset(a, 0, sizeof a);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ask(s, &a[i]), 0); /* nothing ready: each waits */
    fake_gate(&e->ds, false);
    assert_true(env_run_until(e, ask_done, &a[2]));
    for (int i = 0; i < 3; i++) {
        assert_true(a[i].answered);
        assert_int_equal(a[i].rc, 0);
        assert_int_equal(a[i].b.batch, (uint64_t)i);
    }
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
}

/* With prefetch 2 and nobody asking, exactly two batches are prepared, and only two:
 * each batch taken and given back lets exactly one more be prepared. */
static void test_prefetch_depth(void **state)
{
    struct env *e = *state;
    stream *s = env_open(e, 3, 4, 2, 1);
    struct prepared p = {s, 2};
    assert_true(env_run_until(e, prepared_done, &p));
    for (int turn = 0; turn < 20; turn++) /* nothing more comes, however long we wait */
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(ring_count(stream_ring(s), RING_READY), 2);
    assert_int_equal(ring_count(stream_ring(s), RING_FILLING), 0);
    assert_int_equal(atomic_load(&e->ds.reads), 2 * 4);

    struct ask a;
    ask_next(e, s, &a);
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.b.batch, 0);
    /* Held by the trainer: another batch is prepared behind the two. */
    assert_true(env_run_until(e, prepared_done, &p));
    assert_int_equal(atomic_load(&e->ds.reads), 3 * 4);
    assert_int_equal(ring_count(stream_ring(s), RING_LEASED), 1);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    for (int turn = 0; turn < 20; turn++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&e->ds.reads), 3 * 4);
    assert_int_equal(ring_count(stream_ring(s), RING_READY), 2);
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
}

struct committed {
    stream *s;
};

static bool all_committed(void *ctx)
{
    const ring *r = stream_ring(((struct committed *)ctx)->s);
    return ring_committed(r) == ring_slot_count(r);
}

static bool first_reads_waiting(void *ctx)
{
    return fake_at_gate(ctx) > 0;
}

/* The first batch is filled in the one slot committed at open, the ring is not fully
 * committed meanwhile, and no other batch starts; once it is filled the other slots are
 * committed in the background and the stream goes to its full prefetch depth. */
static void test_first_slot_first(void **state)
{
    struct env *e = *state;
    fake_gate(&e->ds, true);
    stream *s = env_open(e, 6, 4, 4, 1);
    assert_true(env_run_until(e, first_reads_waiting, &e->ds));
    for (int turn = 0; turn < 20; turn++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    const ring *r = stream_ring(s);
    assert_int_equal(ring_committed(r), 1);
    assert_true(ring_slot_count(r) > 1);
    assert_int_equal(ring_count(r, RING_FILLING), 1);
    fake_gate(&e->ds, false);
    struct prepared p = {s, 4};
    assert_true(env_run_until(e, prepared_done, &p));
    struct committed c = {s};
    assert_true(env_run_until(e, all_committed, &c));
    struct ask a;
    ask_next(e, s, &a);
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.b.batch, 0);
    assert_int_equal(row_value(s, a.b.slot, field_offset(s), 0), 0);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
}

/* prefetch auto (0, the daemon's default): a ring for 8 batches ahead and the 3 beyond
 * when the memory budget left holds them, fewer when it holds fewer, and a clear error
 * naming the budget when it holds not even one batch ahead. */
static void test_auto_ring_within_budget(void **state)
{
    struct env *e = *state;
    struct stream_params p = {.batch_size = 4, .seed = 1, .world_size = 1, .prefetch = 0, .epochs = 1};
    char err[LD_ERRMSG_MAX] = "";
    stream *s = NULL;
    assert_int_equal(stream_open(e->set, &e->ds.base, 20, &p, UINT64_MAX, &s, err), 0);
    const uint64_t slot = ring_slot_size(stream_ring(s));
    assert_int_equal(ring_slot_count(stream_ring(s)), 8 + 3);
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));

    /* Room for 7 slots: 4 ahead and the 3 beyond. */
    assert_int_equal(stream_open(e->set, &e->ds.base, 21, &p, LD_RING_ALIGN + 7 * slot, &s, err), 0);
    assert_int_equal(ring_slot_count(stream_ring(s)), 4 + 3);
    stream_close(s);
    assert_true(env_run_until(e, set_empty, &l));

    /* Room for 3: not one batch ahead. */
    s = NULL;
    assert_true(stream_open(e->set, &e->ds.base, 22, &p, LD_RING_ALIGN + 3 * slot, &s, err) < 0);
    assert_null(s);
    if (!strstr(err, "memory_budget"))
        fail_msg("%s", err);
}

/* A stream closed while its first batch fills (the committer not started) and one
 * closed at once after it (the committer possibly running) both go cleanly. */
static void test_close_while_committing(void **state)
{
    struct env *e = *state;
    fake_gate(&e->ds, true);
    stream *s = env_open(e, 7, 4, 8, 1);
    assert_true(env_run_until(e, first_reads_waiting, &e->ds));
    stream_close(s);
    fake_gate(&e->ds, false);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));

    s = env_open(e, 8, 4, 8, 1);
    struct ask a;
    ask_next(e, s, &a);
    assert_int_equal(a.rc, 0);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    stream_close(s);
    assert_true(env_run_until(e, set_empty, &l));
}

/* Sample 13 cannot be read: batches 0..2 (samples 0..11) are served, batch 3 fails with
 * the sample's message, and so does every next after it. */
static void test_failure_at_batch(void **state)
{
    struct env *e = *state;
    e->ds.fail_index = 13;
    stream *s = env_open(e, 4, 4, 2, 1);
    struct ask a;
    for (uint64_t k = 0; k < 3; k++) {
        ask_next(e, s, &a);
        assert_int_equal(a.rc, 0);
        assert_int_equal(a.b.batch, k);
        assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    }
    ask_next(e, s, &a);
    assert_int_equal(a.rc, LD_ESAMPLE);
    assert_non_null(strstr(a.msg, "fake sample 13 is unreadable"));
    ask_next(e, s, &a);
    assert_int_equal(a.rc, LD_ESAMPLE);
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
}

struct gate_wait {
    struct fake *f;
    unsigned n;
};

static bool gate_reached(void *ctx)
{
    struct gate_wait *g = ctx;
    return fake_at_gate(g->f) >= g->n;
}

/* Closed while both workers are inside a read and a next waits: the waiting next is
 * never answered, the queued chunks are cancelled, the stream lives on (its ring's name
 * already gone) until the reads come back, and then everything is freed. */
static void test_close_with_work_in_flight(void **state)
{
    struct env *e = *state;
    fake_gate(&e->ds, true);
    /* Three batches of 40 rows are cut into chunks: two run, one per worker, held at
     * the gate, and the rest wait in the pool's queue. */
    stream *s = env_open(e, 5, 40, 3, 0);
    struct gate_wait g = {&e->ds, WORKERS};
    assert_true(env_run_until(e, gate_reached, &g));
    struct ask a;
    assert_int_equal(ask(s, &a), 0);
    char name[256];
    snprintf(name, sizeof name, "%s", ring_name(stream_ring(s)));
    stream_close(s);
    assert_int_equal(stream_set_live(e->set), 1); /* the reads still hold it */
    assert_false(shm_exists(name));
    for (int turn = 0; turn < 10; turn++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(stream_set_live(e->set), 1);
    fake_gate(&e->ds, false);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
    assert_false(a.answered);
    /* Only the chunks that were running (one per worker, at most a batch each) read
     * anything: the queued ones were cancelled, so the three batches were not read. */
    unsigned reads = atomic_load(&e->ds.reads);
    assert_true(reads >= WORKERS && reads <= WORKERS * 40);
}

/* A next whose batch is READY gets its answer back from stream_next, and its callback
 * never runs; one asked before its batch is ready waits, and is called back from the
 * loop when the batch is filled, never inside the call. */
static void test_answer_now_or_later(void **state)
{
    struct env *e = *state;
    stream *s = env_open(e, 6, 4, 2, 1);
    struct prepared p = {s, 2};
    assert_true(env_run_until(e, prepared_done, &p));
    struct ask a;
    assert_int_equal(ask(s, &a), 1);
    assert_true(a.returned);
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.b.batch, 0);
    assert_int_equal(ring_count(stream_ring(s), RING_LEASED), 1);
    for (int turn = 0; turn < 5; turn++) /* no callback comes later either */
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    assert_true(env_run_until(e, prepared_done, &p)); /* batches 1 and 2 */
    fake_gate(&e->ds, true);
    assert_int_equal(ask(s, &a), 1);
    assert_int_equal(a.b.batch, 1);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    assert_int_equal(ask(s, &a), 1);
    assert_int_equal(a.b.batch, 2);
    assert_int_equal(stream_release(s, a.b.slot, a.b.generation), 0);
    assert_int_equal(ask(s, &a), 0); /* batch 3 is held at the gate: it waits */
    for (int turn = 0; turn < 5; turn++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_false(a.answered);
    fake_gate(&e->ds, false);
    assert_true(env_run_until(e, ask_done, &a));
    assert_false(a.returned);
    assert_int_equal(a.rc, 0);
    assert_int_equal(a.b.batch, 3);
    stream_close(s);
    struct live l = {e->set};
    assert_true(env_run_until(e, set_empty, &l));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batches_in_order, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_waiting_nexts_in_order, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_prefetch_depth, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_first_slot_first, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_auto_ring_within_budget, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_close_while_committing, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_failure_at_batch, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_close_with_work_in_flight, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_answer_now_or_later, env_setup, env_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
