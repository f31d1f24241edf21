/* itest_sched — scheduling across streams in a real loaderd with 2 workers: two
 * trainers reading as fast as they can, one on large JPEGs and one on small ones, get
 * equal shares of the workers' CPU time (first come, first served gives the heavy one
 * nearly all of it); a light stream opened while a heavy one saturates the workers gets
 * its first batch at once instead of after the heavy one's queued batches; a `clients:`
 * entry for our uid caps and weights our streams; `workers: auto` follows the affinity
 * mask; `prefetch: auto` shrinks for a steady trainer and grows for a bursty one; bad scheduling keys stop the start with a message naming them. The JPEGs come from ld-genimages (built next to loaderd). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <libgen.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

static char bindir[4096];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static bool tsan_build(void)
{
#if defined(__SANITIZE_THREAD__)
    return true;
#else
    return false;
#endif
}

static int setup(void **state)
{
    struct harness *h = harness_new();
    const char *bin = getenv("LOADERD_BIN") ? getenv("LOADERD_BIN") : "build/bin/loaderd";
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", bin);
    char *abs = realpath(dirname(tmp), NULL);
    assert_non_null(abs);
    snprintf(bindir, sizeof bindir, "%s", abs);
    free(abs);
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "%s/ld-genimages %s/big --count 24 --classes 2 --min 320 --max 400 >/dev/null && "
             "%s/ld-genimages %s/small --count 256 --classes 2 --min 24 --max 32 >/dev/null",
             bindir, h->dir, bindir, h->dir);
    assert_int_equal(system(cmd), 0);
    harness_gen_files(h, "rec", 256, 512, 0, false);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static const char datasets_yaml[] =
    "  big:\n    kind: image_folder\n    path: big\n    transforms:\n"
    "      - random_resized_crop: {size: 128}\n      - to_dtype: {dtype: uint8, layout: CHW}\n"
    "  small:\n    kind: image_folder\n    path: small\n    transforms:\n"
    "      - center_crop: {size: 16}\n      - to_dtype: {dtype: uint8, layout: CHW}\n"
    "  rec:\n    kind: files\n    path: rec\n";

/* A trainer on its own thread and connection: reads as fast as it can until told to stop. */
struct trainer {
    struct harness *h;
    const char *dataset;
    uint32_t batch_size, prefetch;
    double step_s;                  /* time "training" on each batch */
    pthread_t thread;
    atomic_bool stop;
    atomic_uint_fast64_t batches;
    uint64_t stream_id;
    atomic_bool opened;
    char error[512];
};

static void *trainer_main(void *arg)
{
    struct trainer *t = arg;
    lc_client *c = NULL;
    char err[256];
    if (lc_connect(t->h->socket, 20000, t->dataset, &c, err, sizeof err) < 0) {
        snprintf(t->error, sizeof t->error, "connect: %s", err);
        return NULL;
    }
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = t->batch_size;
    o.prefetch = t->prefetch;
    o.seed = 1;
    lc_stream *s = NULL;
    if (lc_stream_open(c, t->dataset, &o, &s) < 0) {
        snprintf(t->error, sizeof t->error, "open %s: %s", t->dataset, lc_client_error(c));
        lc_client_close(c);
        return NULL;
    }
    t->stream_id = lc_stream_id(s);
    atomic_store(&t->opened, true);
    while (!atomic_load(&t->stop)) {
        lc_batch *b;
        int r = lc_stream_next(s, 20000, &b);
        if (r < 0) {
            snprintf(t->error, sizeof t->error, "next on %s: %s", t->dataset, lc_client_error(c));
            break;
        }
        if (t->step_s > 0)
            sleep_s(t->step_s);
        lc_batch_release(b);
        atomic_fetch_add(&t->batches, 1);
    }
    lc_stream_close(s);
    lc_client_close(c);
    return NULL;
}

static void trainer_start(struct trainer *t, struct harness *h, const char *dataset, uint32_t batch_size,
                          uint32_t prefetch, double step_s)
{
    memset(t, 0, sizeof *t);
    t->step_s = step_s;
    t->h = h;
    t->dataset = dataset;
    t->batch_size = batch_size;
    t->prefetch = prefetch;
    assert_int_equal(pthread_create(&t->thread, NULL, trainer_main, t), 0);
    for (int i = 0; i < 2000 && !atomic_load(&t->opened) && !t->error[0]; i++)
        sleep_s(0.01);
    if (t->error[0])
        fail_msg("%s", t->error);
    assert_true(atomic_load(&t->opened));
}

static void trainer_stop(struct trainer *t)
{
    atomic_store(&t->stop, true);
    pthread_join(t->thread, NULL);
    if (t->error[0])
        fail_msg("%s", t->error);
}

/* The `streams` reply's entry for stream id, field key; -1 when the stream is not open. */
static double stream_field_or(struct harness *h, uint64_t id, const char *key)
{
    lc_client *c = harness_connect(h, 10000, "look");
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"streams\"}", &reply), 0);
    cJSON *r = cJSON_Parse(reply);
    assert_non_null(r);
    double v = -1;
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItem(r, "streams")) {
        if ((uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(s, "id")) == id) {
            const cJSON *f = cJSON_GetObjectItem(s, key);
            assert_true(cJSON_IsNumber(f));
            v = cJSON_GetNumberValue(f);
        }
    }
    cJSON_Delete(r);
    lc_free(reply);
    lc_client_close(c);
    return v;
}

/* The same for a stream that must be open. */
static double stream_field(struct harness *h, uint64_t id, const char *key)
{
    double v = stream_field_or(h, id, key);
    assert_true(v >= 0);
    return v;
}

/* Two saturated streams, one ~5x the other's cost per batch: equal CPU shares. */
static void test_equal_shares(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", datasets_yaml);
    harness_start(h);
    struct trainer big, small;
    trainer_start(&big, h, "big", 32, 4, 0);
    trainer_start(&small, h, "small", 128, 4, 0);
    sleep_s(0.5); /* both pipelines warm, costs measured */
    double b0 = stream_field(h, big.stream_id, "worker_cpu_s"), s0 = stream_field(h, small.stream_id, "worker_cpu_s");
    sleep_s(2.0);
    double b1 = stream_field(h, big.stream_id, "worker_cpu_s"), s1 = stream_field(h, small.stream_id, "worker_cpu_s");
    trainer_stop(&big);
    trainer_stop(&small);
    double db = b1 - b0, dsm = s1 - s0;
    double share = dsm / (db + dsm);
    print_message("worker CPU over 2 s: big %.3f s, small %.3f s: small's share %.2f (batches %lu / %lu)\n", db,
                  dsm, share, (unsigned long)atomic_load(&big.batches), (unsigned long)atomic_load(&small.batches));
    assert_true(db + dsm > 0.2);
    /* Equal weights: half each; first come, first served gives the small one ~15%. */
    assert_true(share > 0.35 && share < 0.65);
    harness_stop_clean(h);
}

/* A light stream opened while a heavy one keeps both workers busy with a deep queue:
 * its first batch comes as soon as a worker is free, not after that queue. */
static void test_light_first_batch(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", datasets_yaml);
    harness_start(h);
    struct trainer big;
    trainer_start(&big, h, "big", 32, 8, 0);
    sleep_s(0.5);
    lc_client *c = harness_connect(h, 20000, "light");
    double first[5];
    for (int i = 0; i < 5; i++) {
        lc_stream_options o;
        lc_stream_options_init(&o);
        o.batch_size = 32;
        lc_stream *s = NULL;
        double t0 = now_s();
        if (lc_stream_open(c, "rec", &o, &s) < 0)
            fail_msg("open rec: %s", lc_client_error(c));
        lc_batch *b;
        assert_int_equal(lc_stream_next(s, 20000, &b), 0);
        first[i] = now_s() - t0;
        lc_batch_release(b);
        lc_stream_close(s);
        sleep_s(0.05);
    }
    lc_client_close(c);
    trainer_stop(&big);
    /* The median of five. */
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (first[j] < first[i]) {
                double x = first[i];
                first[i] = first[j];
                first[j] = x;
            }
    print_message("light first batch: median %.1f ms (min %.1f, max %.1f) behind %lu heavy batches\n",
                  first[2] * 1e3, first[0] * 1e3, first[4] * 1e3, (unsigned long)atomic_load(&big.batches));
    /* First come, first served: behind 8 queued batches of 32 large JPEGs (hundreds of
     * ms; seconds under ThreadSanitizer, where everything is 5-15 times slower). */
    assert_true(first[2] < (tsan_build() ? 0.5 : 0.08));
    harness_stop_clean(h);
}

/* clients: our uid weighted and capped: the stream's weight is the dataset's times the
 * client's, and its worker time stays under the cap while workers are free. */
static void test_client_cap_and_weight(void **state)
{
    struct harness *h = *state;
    char ds[2048];
    snprintf(ds, sizeof ds,
             "  big:\n    kind: image_folder\n    path: big\n    weight: 3\n    transforms:\n"
             "      - random_resized_crop: {size: 128}\n      - to_dtype: {dtype: uint8, layout: CHW}\n"
             "clients:\n  \"%u\": {weight: 2, max_share: 0.1}\n",
             (unsigned)getuid());
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
    struct trainer big;
    trainer_start(&big, h, "big", 8, 4, 0);
    assert_int_equal((int)stream_field(h, big.stream_id, "weight"), 6);
    sleep_s(0.3);
    double c0 = stream_field(h, big.stream_id, "worker_cpu_s"), t0 = now_s();
    sleep_s(1.5);
    double c1 = stream_field(h, big.stream_id, "worker_cpu_s"), t1 = now_s();
    trainer_stop(&big);
    double used = c1 - c0, allowed = 0.1 * 2 * (t1 - t0);
    print_message("capped at 0.1 of 2 workers: %.3f s of worker CPU in %.2f s (cap %.3f s)\n", used, t1 - t0,
                  allowed);
    assert_true(used > 0);
    /* The cap, plus one bucket (0.1 x 2 x 100 ms) and the chunks running when it ran out. */
    assert_true(used < allowed * 1.3 + 0.05);
    harness_stop_clean(h);
}

/* The stall metrics: a trainer that asks as fast as the workers can prepare waits most
 * of the time; one that trains 20 ms per batch of cheap samples (60 under TSan) never
 * waits. Both in
 * `streams`, in `loaderctl top` (worst stall first) and in the Prometheus text. */
static void test_stall_metrics(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n", datasets_yaml);
    harness_start(h);
    struct trainer big, light;
    trainer_start(&big, h, "big", 16, 2, 0);
    /* A step well above what a batch of the light dataset takes to prepare while the
     * heavy one runs (ThreadSanitizer makes that 5-15 times longer). */
    double step = tsan_build() ? 0.06 : 0.02;
    trainer_start(&light, h, "rec", 32, 3, step);
    sleep_s(2.5); /* a whole statistics window (1 s) after the start */
    double big_stall = stream_field(h, big.stream_id, "stall_now");
    double light_stall = stream_field(h, light.stream_id, "stall_now");
    double light_rate = stream_field(h, light.stream_id, "samples_per_s_now");
    double light_avg = stream_field(h, light.stream_id, "samples_per_s");
    print_message("stall now: big %.2f, light %.2f; light %.0f samples/s now, %.0f average\n", big_stall,
                  light_stall, light_rate, light_avg);
    assert_true(big_stall > 0.5 && big_stall <= 1.0);
    assert_true(light_stall < 0.2);
    /* 32 samples per step (and the time next and release take): at most 32 / step. */
    assert_true(light_rate > 0.2 * 32 / step && light_rate < 1.07 * 32 / step);
    /* The average counts what was handed over, which runs ahead of the trainer by up
     * to the prefetch (the shared-memory hand-off publishes batches before they are
     * taken): at most that much more over the time active. */
    double ahead = stream_field(h, light.stream_id, "prefetch_depth") * 32 /
                   stream_field(h, light.stream_id, "active_s");
    assert_true(light_avg > 0 && light_avg < 1.07 * 32 / step + ahead);
    assert_true(stream_field(h, light.stream_id, "worker_cpu_s") > 0);
    assert_true(stream_field(h, big.stream_id, "worker_cpu_s") > stream_field(h, light.stream_id, "worker_cpu_s"));
    assert_true(stream_field(h, light.stream_id, "bytes_served") > 0);
    assert_true(stream_field(h, light.stream_id, "active_s") > 2.0);
    /* The light trainer is slower than its prefetch: the ring is kept full ahead of it. */
    assert_true(stream_field(h, light.stream_id, "prefetch_depth") >= 2);

    char out[16384];
    assert_int_equal(harness_ctl(h, out, sizeof out, "top", "--once", NULL), 0);
    const char *hdr = strstr(out, "STREAM DATASET");
    assert_non_null(hdr);
    const char *first = strchr(hdr, '\n');
    assert_non_null(first);
    char expect[64];
    snprintf(expect, sizeof expect, "\n%6lu big ", (unsigned long)big.stream_id);
    if (strncmp(first, expect, strlen(expect)) != 0)
        fail_msg("the most stalled stream (big, %lu) is not first:\n%s", (unsigned long)big.stream_id, out);
    assert_non_null(strstr(out, "CLIENT NAME"));
    assert_int_equal(harness_ctl(h, out, sizeof out, "top", "--once", "--json", NULL), 0);
    cJSON *arr = cJSON_Parse(out);
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), 2);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "id")),
                     (int)big.stream_id);
    cJSON_Delete(arr);
    assert_int_equal(harness_ctl(h, out, sizeof out, "top", "--interval", "0", NULL), 2);

    assert_int_equal(harness_ctl(h, out, sizeof out, "metrics", NULL), 0);
    char line[128];
    snprintf(line, sizeof line, "loaderd_stream_stall_ratio{dataset=\"big\",stream=\"%lu\"",
             (unsigned long)big.stream_id);
    assert_non_null(strstr(out, line));
    snprintf(line, sizeof line, "loaderd_stream_worker_cpu_seconds_total{dataset=\"rec\",stream=\"%lu\"",
             (unsigned long)light.stream_id);
    assert_non_null(strstr(out, line));
    assert_non_null(strstr(out, "loaderd_stream_prefetch_depth{dataset=\"rec\""));
    assert_non_null(strstr(out, "loaderd_client_stall_ratio{client="));
    assert_non_null(strstr(out, "loaderd_client_worker_cpu_seconds_total{client="));
    trainer_stop(&big);
    trainer_stop(&light);
    harness_stop_clean(h);
}

/* server.workers: auto starts one worker per CPU the daemon may use: started with an
 * affinity mask of one CPU (inherited from us), it runs one worker, not one per core. */
static void test_workers_auto(void **state)
{
    struct harness *h = *state;
    cpu_set_t saved, one;
    assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
    int first = -1;
    for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
        if (CPU_ISSET(i, &saved))
            first = i;
    assert_true(first >= 0);
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    harness_write_config(h, "  workers: auto\n", "  rec:\n    kind: files\n    path: rec\n");
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    harness_start(h);
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    assert_int_equal((int)harness_status_num(h, "workers", NULL), 1);
    harness_stop_clean(h);
    /* Without the mask: one per CPU of ours. */
    harness_start(h);
    assert_int_equal((int)harness_status_num(h, "workers", NULL), CPU_COUNT(&saved));
    harness_stop_clean(h);
}

/* A trainer that reads in bursts: `burst` batches back to back, then a pause. */
struct bursty {
    struct harness *h;
    const char *dataset;
    int burst;
    double pause_s, run_s;
    uint64_t stream_id;
    atomic_bool opened, done;
    char error[512];
};

static void *bursty_main(void *arg)
{
    struct bursty *t = arg;
    lc_client *c = NULL;
    char err[256];
    if (lc_connect(t->h->socket, 20000, "bursty", &c, err, sizeof err) < 0) {
        snprintf(t->error, sizeof t->error, "connect: %s", err);
        atomic_store(&t->done, true);
        return NULL;
    }
    lc_stream_options o;
    lc_stream_options_init(&o); /* prefetch 0: the daemon's default, auto here */
    o.batch_size = 64;
    lc_stream *s = NULL;
    if (lc_stream_open(c, t->dataset, &o, &s) < 0) {
        snprintf(t->error, sizeof t->error, "open: %s", lc_client_error(c));
    } else {
        t->stream_id = lc_stream_id(s);
        atomic_store(&t->opened, true);
        double until = now_s() + t->run_s;
        while (now_s() < until && !t->error[0]) {
            for (int i = 0; i < t->burst; i++) {
                lc_batch *b;
                if (lc_stream_next(s, 20000, &b) < 0) {
                    snprintf(t->error, sizeof t->error, "next: %s", lc_client_error(c));
                    break;
                }
                lc_batch_release(b);
            }
            sleep_s(t->pause_s);
        }
        lc_stream_close(s);
    }
    lc_client_close(c);
    atomic_store(&t->done, true);
    return NULL;
}

/* The depth of a stream opened with prefetch auto (server.prefetch: auto) after a
 * trainer read it in bursts for run_s seconds; also checks what `streams` says of it. */
static double auto_depth_after(struct harness *h, const char *dataset, int burst, double pause_s, double run_s)
{
    struct bursty t = {.h = h, .dataset = dataset, .burst = burst, .pause_s = pause_s, .run_s = run_s};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bursty_main, &t), 0);
    for (int i = 0; i < 2000 && !atomic_load(&t.opened) && !atomic_load(&t.done); i++)
        sleep_s(0.01);
    if (!atomic_load(&t.opened)) {
        pthread_join(th, NULL);
        fail_msg("%s", t.error);
    }
    double max = stream_field_or(h, t.stream_id, "prefetch_max"), depth = -1;
    while (!atomic_load(&t.done)) {
        double d = stream_field_or(h, t.stream_id, "prefetch");
        if (d >= 0 && !atomic_load(&t.done))
            depth = d; /* the last one seen while it still read */
        sleep_s(0.1);
    }
    pthread_join(th, NULL);
    assert_true(max == 8);
    if (t.error[0])
        fail_msg("%s", t.error);
    return depth;
}

/* prefetch: auto. A steady trainer slower than the workers needs no more than two
 * batches ahead (the depth falls from four); one that reads in bursts longer than the
 * depth makes it grow to what the ring holds. */
static void test_prefetch_auto(void **state)
{
    struct harness *h = *state;
    harness_write_config(h, "  workers: 2\n  prefetch: auto\n", datasets_yaml);
    harness_start(h);
    double steady = auto_depth_after(h, "rec", 1, 0.02, 3.0);
    double bursty = auto_depth_after(h, "small", 16, 0.3, 3.0);
    print_message("prefetch auto: steady trainer %.0f, bursty trainer %.0f (start 4, max 8)\n", steady, bursty);
    /* Under TSan on a loaded machine a step of the steady trainer may still wait now and
     * then, and the depth need not fall within the 3 s (seen once: 4 in a full run of the
     * tsan group beside other work); there it must at least not grow. The falling depth
     * itself is checked by the other builds here and by test_prefetch. */
    assert_true(steady >= 1 && steady <= (tsan_build() ? 4 : 2));
    assert_true(bursty >= 7);
    harness_stop_clean(h);
}

static void test_bad_keys(void **state)
{
    struct harness *h = *state;
    const char *const none[] = {NULL};
    harness_write_config(h, "  workers: 2\n", "  rec:\n    kind: files\n    path: rec\n    max_share: 0\n");
    assert_int_equal(harness_run_to_exit(h, none), 1);
    char *log = harness_log(h);
    if (!strstr(log, "datasets.rec.max_share: expected a fraction above 0"))
        fail_msg("%s", log);
    free(log);
    harness_write_config(h, "  workers: 2\n",
                         "  rec:\n    kind: files\n    path: rec\nclients:\n  no-such-user-here: {weight: 2}\n");
    assert_int_equal(harness_run_to_exit(h, none), 1);
    log = harness_log(h);
    if (!strstr(log, "clients: no user named 'no-such-user-here'"))
        fail_msg("%s", log);
    free(log);
    harness_write_config(h, "  workers: 2\n", "  rec:\n    kind: files\n    path: rec\nclients:\n  \"0\": {weight: 0}\n");
    assert_int_equal(harness_run_to_exit(h, none), 1);
    log = harness_log(h);
    if (!strstr(log, "clients.0.weight: expected an integer in [1, 1000]"))
        fail_msg("%s", log);
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_equal_shares, setup, teardown),
        cmocka_unit_test_setup_teardown(test_light_first_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_cap_and_weight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stall_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_auto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefetch_auto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_keys, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
