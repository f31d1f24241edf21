/* Integration tests: kill loops. Trainers die at any moment, and so may the daemon;
 * neither may cost anything that lasts.
 *
 *   trainer kill loop  120 trainers (forked children using the real client library),
 *                      each SIGKILLed at a chosen or random point: right after connect,
 *                      after open, while holding leased batches, in the middle of a
 *                      next/release loop, or at a random moment from its start. After
 *                      each kill the daemon must be back where it started: no client,
 *                      stream, leased slot or ring memory in its status, no ring
 *                      object in /dev/shm, no ring mapped, as many open descriptors as
 *                      before; its resident memory may not drift by more than a bound
 *                      over the whole loop.
 *   daemon kill loop   12 daemons SIGKILLed under a reading client, some between two
 *                      nexts, some while the client is blocked in one. The client must
 *                      get an error (not hang) within a bound, close cleanly, and be
 *                      left with no ring mapped and no descriptor more than before; each
 *                      new daemon removes what the killed one left in /dev/shm,
 *                      grows no larger than the first one did, and serves the right
 *                      data at once.
 *
 * The points and delays come from a seeded generator: the seed is printed, and
 * KILLLOOP_SEED=N repeats a run. Counts and every wait are bounded (the whole file
 * takes seconds under ASan). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"
#include "probe.h"

#define N_FILES 600
#define FILE_SIZE 512
#define BATCH 16
#define TRAINER_KILLS 120
#define DAEMON_KILLS 12
#define SETTLE_MS 5000          /* how long the daemon may take to notice a death */
/* Resident memory the daemon may gain over the last 60 kills, after a warm-up of 60 in
 * which the allocator and ASan's (reduced) quarantine fill up: 68 KiB a kill. Measured:
 * about 1 MiB under ASan. A leaked ring is caught exactly by the mapping count; this
 * catches a leaked connection or stream state, the larger per-kill costs. */
#define RSS_WARMUP_KILLS 60
#define RSS_DRIFT_KIB (4 * 1024)
#define RSS_WINDOW 10
/* ThreadSanitizer's runtime grows its own tables in steps of tens of MiB whatever the
 * program does, so under TSan the figures are printed but not judged; the exact checks
 * (descriptors, mappings, /dev/shm, slots) hold in every build. */
#if defined(__SANITIZE_THREAD__)
#define RSS_JUDGED 0
#else
#define RSS_JUDGED 1
#endif

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state += LD_MIX_GOLDEN;
    return ld_splitmix64(rng_state);
}

static void seed_rng(void)
{
    const char *env = getenv("KILLLOOP_SEED");
    uint64_t seed = env && env[0] ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    print_message("kill loop seed %llu (repeat with KILLLOOP_SEED=%llu)\n", (unsigned long long)seed,
                  (unsigned long long)seed);
    rng_state = seed;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int setup(void **state)
{
    /* ASan keeps freed memory in a quarantine (256 MiB by default) to catch use after
     * free; that would read as growth here. A small one keeps the check meaningful. */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=4", asan ? asan : "", asan && asan[0] ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, 0, false);
    harness_write_config(h, "  workers: 2\n  max_clients: 16\n",
                         "  records:\n    kind: files\n    path: rec\n");
    harness_start(h);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

/* ---- trainers -------------------------------------------------------------------- */

enum stage {
    STAGE_CONNECTED,    /* connected and said hello, nothing open */
    STAGE_OPENED,       /* a stream open (ring mapped), no next yet */
    STAGE_HOLDING,      /* three batches leased and held */
    STAGE_READING,      /* in a tight next/release loop: killed mid-request */
    STAGE_RANDOM,       /* killed at a random moment from its start, unsynchronized */
    N_STAGES,
};
static const char *const stage_names[] = {"after connect", "after open", "holding leases",
                                          "mid-next", "at a random moment"};

/* The trainer: goes as far as `stage`, tells the parent (one byte on `ready`), and
 * keeps going or waits to be killed. Exits non-zero if anything fails first. */
static void trainer(const char *socket, enum stage stage, int ready)
{
    char err[256];
    lc_client *c = NULL;
    if (lc_connect(socket, 5000, "doomed", &c, err, sizeof err) < 0)
        _exit(10);
    if (stage == STAGE_CONNECTED && write(ready, "c", 1) != 1)
        _exit(11);
    if (stage == STAGE_CONNECTED)
        for (;;)
            pause();
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.seed = (uint64_t)getpid();
    lc_stream *s = NULL;
    if (lc_stream_open(c, "records", &o, &s) < 0)
        _exit(12);
    if (stage == STAGE_OPENED && write(ready, "o", 1) != 1)
        _exit(13);
    if (stage == STAGE_OPENED)
        for (;;)
            pause();
    lc_batch *held[3];
    if (stage == STAGE_HOLDING) {
        for (int i = 0; i < 3; i++)
            if (lc_stream_next(s, 5000, &held[i]) < 0)
                _exit(14);
        if (write(ready, "h", 1) != 1)
            _exit(15);
        for (;;)
            pause();
    }
    bool told = false;
    for (;;) {
        lc_batch *b;
        if (lc_stream_next(s, 5000, &b) < 0)
            _exit(16);
        lc_batch_release(b);
        if (!told && stage == STAGE_READING) {
            if (write(ready, "r", 1) != 1)
                _exit(17);
            told = true;
        }
    }
}

struct daemon_state {
    struct probe_status st;
    int fds, shm, maps;
};

/* Waits until the daemon is back at its idle state: only the observer connected, no
 * stream, slot, ring memory, /dev/shm object, ring mapping, and `want_fds` descriptors.
 * Fails the test with what is still held after SETTLE_MS. */
static void expect_idle(struct harness *h, lc_client *observer, int want_fds, const char *after)
{
    struct daemon_state d = {{0}, 0, 0, 0};
    int64_t deadline = now_ms() + SETTLE_MS;
    for (;;) {
        assert_int_equal(probe_status(observer, &d.st), 0);
        d.fds = probe_fd_count(h->pid);
        d.shm = harness_shm_count(h->pid, NULL, 0);
        d.maps = probe_ring_maps(h->pid);
        if (d.st.clients == 1 && d.st.streams == 0 && d.st.leased == 0 && d.st.filling == 0 &&
            d.st.memory_used == 0 && d.shm == 0 && d.maps == 0 && d.fds == want_fds)
            return;
        if (now_ms() > deadline)
            break;
        sleep_us(5000);
    }
    fail_msg("%s: after %d ms loaderd still holds clients=%d streams=%d leased=%d filling=%d "
             "memory_used=%lld shm_objects=%d ring_maps=%d fds=%d (expected %d)",
             after, SETTLE_MS, d.st.clients, d.st.streams, d.st.leased, d.st.filling,
             (long long)d.st.memory_used, d.shm, d.maps, d.fds, want_fds);
}

static void test_trainer_kill_loop(void **state)
{
    struct harness *h = *state;
    seed_rng();
    lc_client *observer = harness_connect(h, 10000, "observer");
    struct probe_status st;
    assert_int_equal(probe_status(observer, &st), 0);
    /* The daemon's descriptors with only the observer connected (the harness's readiness
     * probe may still be closing: wait for the count to settle). */
    int base_fds = -1;
    for (int i = 0; i < 100; i++) {
        int n = probe_fd_count(h->pid);
        if (n == base_fds)
            break;
        base_fds = n;
        sleep_us(20000);
    }
    assert_true(base_fds > 0);

    long rss_start = 0, rss_end = 0, rss_max = 0;
    int per_stage[N_STAGES] = {0};
    for (int k = 0; k < TRAINER_KILLS; k++) {
        /* Every stage in turn, so that each is covered ~24 times whatever the seed. */
        enum stage stage = (enum stage)(k % N_STAGES);
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        fflush(NULL);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            /* The observer's socket is inherited but never used here: closing it
             * politely could end the parent's session. */
            close(ready[0]);
            trainer(h->socket, stage, ready[1]);
            _exit(0);
        }
        close(ready[1]);
        if (stage == STAGE_RANDOM) {
            sleep_us((long)(rnd() % 30000));
        } else {
            char x;
            ssize_t r;
            do
                r = read(ready[0], &x, 1);
            while (r < 0 && errno == EINTR);
            if (r != 1) {
                int wst;
                waitpid(child, &wst, 0);
                fail_msg("trainer %d (%s) failed before it could be killed: exit %d", k,
                         stage_names[stage], WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
            }
            if (stage == STAGE_READING)
                sleep_us((long)(rnd() % 3000));     /* somewhere in a next or a release */
        }
        close(ready[0]);
        assert_int_equal(kill(child, SIGKILL), 0);
        int wst;
        assert_int_equal(waitpid(child, &wst, 0), child);
        if (!(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL))
            fail_msg("trainer %d (%s) ended by itself (status 0x%x) before the kill", k,
                     stage_names[stage], wst);
        per_stage[stage]++;

        char after[96];
        snprintf(after, sizeof after, "trainer %d killed %s", k, stage_names[stage]);
        expect_idle(h, observer, base_fds, after);

        long rss = probe_rss_kib(h->pid);
        assert_true(rss > 0);
        /* The least RSS over the last RSS_WINDOW kills of the warm-up, and of the run: a
         * leak grows every kill, so it moves the least value too, while a passing peak
         * (a trainer's allocation not yet returned on a loaded machine) does not. */
        if (k >= RSS_WARMUP_KILLS - RSS_WINDOW && k < RSS_WARMUP_KILLS && (rss_start == 0 || rss < rss_start))
            rss_start = rss;
        if (k >= TRAINER_KILLS - RSS_WINDOW && (rss_end == 0 || rss < rss_end))
            rss_end = rss;
        if (rss > rss_max)
            rss_max = rss;
        if (k % 20 == 19)
            print_message("  %d kills: loaderd RSS %ld KiB, %d fds\n", k + 1, rss, probe_fd_count(h->pid));
    }
    print_message("loaderd RSS (least of %d kills) after %d kills %ld KiB, at the end %ld KiB (max %ld), bound +%d KiB\n",
                  RSS_WINDOW,
                  RSS_WARMUP_KILLS, rss_start, rss_end, rss_max, RSS_DRIFT_KIB);
    for (int s = 0; s < N_STAGES; s++)
        assert_true(per_stage[s] >= TRAINER_KILLS / N_STAGES);
    if (RSS_JUDGED)
        assert_true(rss_end - rss_start < RSS_DRIFT_KIB);

    /* And the daemon still serves: a full, correct batch for a new trainer. */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.shuffle = 0;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(observer, "records", &o, &s), 0);
    lc_batch *b;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    lc_field f;
    assert_int_equal(lc_batch_field(b, 0, &f), 0);
    assert_int_equal(lc_batch_rows(b), BATCH);
    for (uint64_t r = 0; r < BATCH; r++)
        assert_true(harness_file_matches(r, (const uint8_t *)f.data + r * FILE_SIZE, FILE_SIZE,
                                         FILE_SIZE, false));
    lc_batch_release(b);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(observer);
    harness_stop_clean(h);
}

/* ---- daemons ---------------------------------------------------------------------- */

/* Forks a process that SIGKILLs `pid` after `us` microseconds. */
static pid_t kill_later(pid_t pid, long us)
{
    fflush(NULL);
    pid_t k = fork();
    assert_true(k >= 0);
    if (k == 0) {
        sleep_us(us);
        kill(pid, SIGKILL);
        _exit(0);
    }
    return k;
}

static void test_daemon_kill_loop(void **state)
{
    struct harness *h = *state;
    seed_rng();
    const pid_t self = getpid();
    int base_fds = probe_fd_count(self);
    long rss_first = 0, rss_max = 0;
    assert_true(base_fds > 0);
    for (int k = 0; k < DAEMON_KILLS; k++) {
        lc_client *c = harness_connect(h, 10000, "reader");
        /* The death must be reported, not ridden out (itest_reconnect covers that). */
        assert_int_equal(lc_client_set_reconnect(c, 0), 0);
        lc_stream_options o;
        lc_stream_options_init(&o);
        o.batch_size = BATCH;
        o.seed = (uint64_t)k;
        lc_stream *s = NULL;
        assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
        /* The ring, and the hand-off's queues beside it (unless LOADERD_HANDOFF=socket). */
        assert_int_equal(probe_ring_maps(self), harness_handoff_default() ? 2 : 1);

        /* Read a few batches (checking them), then the daemon dies: between two nexts
         * (even k) or while we wait in one (odd k: a killer process fires while we read). */
        int before = 1 + (int)(rnd() % 6);
        for (int i = 0; i < before; i++) {
            lc_batch *b;
            assert_int_equal(lc_stream_next(s, 10000, &b), 0);
            assert_int_equal(lc_batch_rows(b), BATCH);
            lc_batch_release(b);
        }
        /* Each new daemon, serving the same reader, is as big as the first one was: a
         * daemon that starts after a crash carries nothing of it. */
        long rss = probe_rss_kib(h->pid);
        assert_true(rss > 0);
        if (k == 0)
            rss_first = rss;
        if (rss > rss_max)
            rss_max = rss;
        pid_t dead = h->pid, killer = 0;
        if (k % 2 == 0)
            assert_int_equal(kill(dead, SIGKILL), 0);
        else
            killer = kill_later(dead, (long)(rnd() % 20000));
        int r = 0, reads = 0;
        int64_t t0 = now_ms();
        lc_batch *held = NULL;
        while (reads < 100000) {
            lc_batch *b;
            r = lc_stream_next(s, 10000, &b);
            if (r < 0)
                break;
            reads++;
            /* Hold one batch across the death: its mapping must still be readable. */
            if (!held)
                held = b;
            else
                lc_batch_release(b);
        }
        int64_t waited = now_ms() - t0;
        if (killer) {
            int kst;
            assert_int_equal(waitpid(killer, &kst, 0), killer);
        }
        int wst;
        assert_int_equal(waitpid(dead, &wst, 0), dead);
        assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
        h->pid = 0;
        /* An error, not a hang and not a timeout: the daemon's death is seen at once, by
         * this next (connection reset) or by a release before it, after which the
         * connection is closed and says why. */
        if ((r != LC_ECONNRESET && r != LC_ECLOSED) ||
            !strstr(lc_client_error(c), "loaderd closed the connection"))
            fail_msg("daemon kill %d: next returned %d (%s: %s) after the daemon died, expected "
                     "a connection reset", k, r, lc_strerror(r), lc_client_error(c));
        if (killer == 0)
            assert_true(waited < 3000);
        if (held) {
            lc_field f;
            assert_int_equal(lc_batch_field(held, 0, &f), 0);
            volatile uint8_t sum = 0;
            for (size_t i = 0; i < f.nbytes; i++)
                sum += ((const uint8_t *)f.data)[i];
            (void)sum;
        }
        /* Closing after the death releases everything on our side. */
        lc_batch_release(held);
        lc_stream_close(s);
        lc_client_close(c);
        assert_int_equal(probe_fd_count(self), base_fds);
        assert_int_equal(probe_ring_maps(self), 0);

        /* The next daemon sweeps what the dead one left in /dev/shm before it listens. */
        harness_start(h);
        char names[512];
        int left = harness_shm_count(dead, names, sizeof names);
        if (left != 0)
            fail_msg("daemon kill %d: the new loaderd left the dead one's objects: %s", k, names);
    }
    print_message("loaderd RSS under the reader: first daemon %ld KiB, largest %ld KiB, bound +%d KiB\n",
                  rss_first, rss_max, RSS_DRIFT_KIB);
    if (RSS_JUDGED)
        assert_true(rss_max - rss_first < RSS_DRIFT_KIB);

    /* The last daemon serves the right data from the start. */
    lc_client *c = harness_connect(h, 10000, "reader");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.shuffle = 0;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    lc_batch *b;
    assert_int_equal(lc_stream_next(s, 10000, &b), 0);
    lc_field f;
    assert_int_equal(lc_batch_field(b, 0, &f), 0);
    for (uint64_t row = 0; row < BATCH; row++)
        assert_true(harness_file_matches(row, (const uint8_t *)f.data + row * FILE_SIZE, FILE_SIZE,
                                         FILE_SIZE, false));
    lc_batch_release(b);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_trainer_kill_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_daemon_kill_loop, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
