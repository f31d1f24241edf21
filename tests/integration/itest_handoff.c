/* Integration tests: batches handed off through shared memory (a ready queue and a
 * release queue beside the ring, proto/ld_wire.h) against a real loaderd.
 *
 *   same batches      one epoch through the hand-off and through the socket: the same
 *                     batches, bit for bit, every sample exactly once, no slot left leased.
 *   idle daemon       a trainer that holds every slot (the daemon has nothing to fill)
 *                     and then gives them back: the daemon is woken and the epoch goes on
 *                     in order.
 *   killed asleep     a trainer SIGKILLed while it sleeps on the ready queue's futex
 *                     leaves nothing: no stream, slot, ring memory, /dev/shm object,
 *                     mapping or descriptor in the daemon.
 *   killed polling    a trainer SIGKILLed while it takes and releases batches as fast as
 *                     it can (the workers publish them and take its releases
 *                     themselves, without the loop thread) leaves nothing either, and the
 *                     next stream gets every slot of its ring.
 *   hostile client    a client that writes garbage into its release queue has its
 *                     connection ended with a message that names the entry; one that
 *                     tries to shrink or grow the queues' memory gets EPERM (sealed) and
 *                     is still served; another client reading at the same time gets its
 *                     whole epoch, in order.
 *   no names         the queues' memory reaches the client as a descriptor with the open
 *                     reply and never has a name; neither side keeps a descriptor of it;
 *                     a client of the named layout gets the socket, and a client that sends
 *                     the daemon a descriptor has its connection ended.
 *   woken at the end  a client asleep on one stream's ready queue (a futex wait with no
 *                     time slice: only the daemon can wake it) when the daemon ends its
 *                     connection is woken by the end entry, and the socket says why.
 *
 * The other integration tests (exact cover, leases, kill loops, reconnects) run through
 * the hand-off too, since it is the default; LOADERD_HANDOFF=socket runs them through the
 * socket. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ld_mix.h"
#include "ld_wire.h"
#include "loaderclient.h"
#include "probe.h"

#define N_FILES 800
#define FILE_SIZE 128
#define N_CLASSES 4
#define BATCH 16

/* No read-ahead: its I/O threads (and their descriptors) start when reads miss the page
 * cache, which the descriptor counts below must not depend on; and without it the
 * workers also start the fills on the direct path. */
static const char datasets_yaml[] = "  records:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "    read_ahead: 0\n";

static int setup_daemon(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    harness_write_config(h, "  workers: 2\n  memory_budget: 64MiB\n", datasets_yaml);
    harness_start(h);
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

static lc_stream *open_records(lc_client *c, int handoff, uint32_t prefetch, uint64_t epochs)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = BATCH;
    o.seed = 7;
    o.prefetch = prefetch;
    o.epochs = epochs;
    o.handoff = handoff;
    lc_stream *s = NULL;
    int r = lc_stream_open(c, "records", &o, &s);
    if (r < 0)
        fail_msg("open: %s: %s", lc_strerror(r), lc_client_error(c));
    return s;
}

/* Reads one epoch, releasing each batch; returns a hash of every byte in order and
 * checks that every file came exactly once. */
static uint64_t read_epoch(lc_client *c, lc_stream *s)
{
    int seen[N_FILES] = {0};
    uint64_t hash = 0, batch = 0;
    for (;;) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 10000, &b);
        if (r == LC_EEND)
            break;
        if (r < 0)
            fail_msg("next: %s: %s", lc_strerror(r), lc_client_error(c));
        assert_int_equal(lc_batch_index(b), batch);
        lc_field data, label;
        assert_int_equal(lc_batch_field(b, 0, &data), 0);
        assert_int_equal(lc_batch_field(b, 1, &label), 0);
        for (uint32_t i = 0; i < lc_batch_rows(b); i++) {
            const uint8_t *row = (const uint8_t *)data.data + (size_t)i * FILE_SIZE;
            bool found = false;
            for (uint64_t f = 0; f < N_FILES && !found; f++)
                if (harness_file_matches(f, row, FILE_SIZE, FILE_SIZE, false)) {
                    seen[f]++;
                    found = true;
                }
            assert_true(found);
            for (size_t k = 0; k < FILE_SIZE; k++)
                hash = ld_splitmix64(hash ^ row[k]);
            hash = ld_splitmix64(hash ^ (uint64_t)((const int64_t *)label.data)[i]);
        }
        assert_int_equal(lc_batch_release(b), 0);
        batch++;
    }
    for (int f = 0; f < N_FILES; f++)
        if (seen[f] != 1)
            fail_msg("file %d delivered %d times", f, seen[f]);
    return hash;
}

static void test_same_batches(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_handoff");
    lc_stream *a = open_records(c, LC_HANDOFF_SHM, 3, 1);
    uint64_t ha = read_epoch(c, a);
    assert_int_equal(lc_stream_close(a), 0);
    lc_stream *b = open_records(c, LC_HANDOFF_SOCKET, 3, 1);
    uint64_t hb = read_epoch(c, b);
    assert_int_equal(lc_stream_close(b), 0);
    assert_true(ha == hb);
    harness_flush_releases(c);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    lc_client_close(c);
    /* loaderctl read --handoff: both paths read the same bytes (the checksum of --touch). */
    char shm[4096], sock[4096], bad[4096];
    assert_int_equal(harness_ctl(h, shm, sizeof shm, "read", "records", "--batch-size", "16", "--seed", "3",
                                 "--touch", "--json", NULL), 0);
    assert_int_equal(harness_ctl(h, sock, sizeof sock, "read", "records", "--batch-size", "16", "--seed", "3",
                                 "--touch", "--json", "--handoff", "socket", NULL), 0);
    const char *cs = strstr(shm, "\"checksum\""), *cb = strstr(sock, "\"checksum\"");
    assert_non_null(cs);
    assert_non_null(cb);
    cs = strchr(cs + 10, '"'); /* the value: 16 hex digits in quotes */
    cb = strchr(cb + 10, '"');
    assert_non_null(cs);
    assert_non_null(cb);
    assert_memory_equal(cs, cb, 18);
    assert_int_equal(harness_ctl(h, bad, sizeof bad, "read", "records", "--handoff", "pipe", NULL), 2);
    assert_non_null(strstr(bad, "--handoff needs shm or socket"));
    harness_stop_clean(h);
}

static void test_idle_daemon(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 10000, "itest_handoff");
    lc_stream *s = open_records(c, LC_HANDOFF_SHM, 2, 1);
    lc_batch *held[64];
    int n = 0, r;
    /* Every slot ends up leased to us (each waited for as long as it takes: a slow
     * machine may take a while for the first), then the daemon has nothing left to fill. */
    lc_ring_info ri;
    assert_int_equal(lc_stream_ring_info(s, &ri), 0);
    assert_true(ri.slot_count < 64);
    for (; n < (int)ri.slot_count; n++) {
        if ((r = lc_stream_next(s, 10000, &held[n])) < 0)
            fail_msg("next %d of %u slots: %s: %s", n, ri.slot_count, lc_strerror(r), lc_client_error(c));
        assert_int_equal(lc_batch_index(held[n]), (uint64_t)n);
    }
    assert_int_equal(lc_stream_next(s, 300, &held[n]), LC_ETIMEDOUT);
    /* Given back one at a time, each followed by a next: the daemon is woken each time
     * it has gone idle, and batches keep their order. */
    uint64_t want = (uint64_t)n;
    for (int i = 0; i < n; i++) {
        assert_int_equal(lc_batch_release(held[i]), 0);
        lc_batch *b = NULL;
        r = lc_stream_next(s, 10000, &b);
        if (r < 0)
            fail_msg("next after release %d: %s: %s", i, lc_strerror(r), lc_client_error(c));
        assert_int_equal(lc_batch_index(b), want++);
        held[i] = b;
    }
    for (int i = 0; i < n; i++)
        assert_int_equal(lc_batch_release(held[i]), 0);
    lc_batch *b = NULL;
    while ((r = lc_stream_next(s, 10000, &b)) == 0) {
        assert_int_equal(lc_batch_index(b), want++);
        assert_int_equal(lc_batch_release(b), 0);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(want, lc_stream_batches_per_epoch(s));
    harness_flush_releases(c); /* the last release is a message, sent with the next request */
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* After a trainer was killed: waits until the daemon has taken everything back (no
 * stream, slot or memory left, `ctl` the only client, no ring mapped, its descriptors as
 * `fds`), then checks it, and that no shared-memory object is left. */
static void wait_all_back(struct harness *h, lc_client *ctl, int fds, bool ctl_only)
{
    struct probe_status st = {0};
    for (int i = 0; i < 300; i++) {
        assert_int_equal(probe_status(ctl, &st), 0);
        if (st.streams == 0 && st.leased == 0 && st.memory_used == 0 && st.clients == 1 &&
            probe_ring_maps(h->pid) == 0 && probe_fd_count(h->pid) == fds)
            break;
        sleep_ms(10);
    }
    assert_int_equal(st.streams, 0);
    assert_int_equal(st.leased, 0);
    assert_int_equal(st.memory_used, 0);
    if (ctl_only)
        assert_int_equal(st.clients, 1);
    assert_int_equal(probe_ring_maps(h->pid), 0);
    assert_int_equal(probe_fd_count(h->pid), fds);
    char names[256];
    assert_int_equal(harness_shm_count(h->pid, names, sizeof names), 0);
}

static void test_killed_asleep(void **state)
{
    struct harness *h = *state;
    lc_client *ctl = harness_connect(h, 10000, "itest_handoff_ctl");
    int fds = probe_fd_count(h->pid);
    int maps = probe_ring_maps(h->pid);
    assert_true(fds > 0);
    assert_int_equal(maps, 0);
    for (int round = 0; round < 3; round++) {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            lc_client *c = harness_connect(h, 10000, "itest_handoff_victim");
            lc_stream *s = open_records(c, LC_HANDOFF_SHM, 2, 0);
            lc_batch *b;
            /* Holds every batch it gets, then sleeps on the ready queue until killed. */
            for (;;)
                lc_stream_next(s, round == 0 ? 60000 : 100 + 50 * round, &b);
        }
        /* Until it holds every slot and sleeps (round 0), or at any moment (others). */
        struct probe_status st = {0};
        for (int i = 0; i < 200; i++) {
            assert_int_equal(probe_status(ctl, &st), 0);
            if (st.streams == 1 && st.leased >= 2 && st.filling == 0)
                break;
            sleep_ms(10);
        }
        assert_int_equal(st.streams, 1);
        assert_true(probe_ring_maps(h->pid) >= 1);
        sleep_ms(round == 0 ? 100 : 5 * round);
        assert_int_equal(kill(child, SIGKILL), 0);
        assert_int_equal(waitpid(child, NULL, 0), child);
        wait_all_back(h, ctl, fds, true);
    }
    lc_client_close(ctl);
    harness_stop_clean(h);
}

static void test_killed_polling(void **state)
{
    struct harness *h = *state;
    lc_client *ctl = harness_connect(h, 10000, "itest_handoff_ctl");
    int fds = probe_fd_count(h->pid);
    for (int round = 0; round < 3; round++) {
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            close(ready[0]);
            lc_client *c = harness_connect(h, 10000, "itest_handoff_victim");
            lc_stream *s = open_records(c, LC_HANDOFF_SHM, 2, 0);
            /* Takes and gives back as fast as it can; says so once well into it, and
             * goes on until killed. */
            for (uint64_t n = 0;; n++) {
                lc_batch *b = NULL;
                if (lc_stream_next(s, 10000, &b) < 0)
                    _exit(1);
                lc_batch_release(b);
                if (n == 200u * (unsigned)(round + 1) && write(ready[1], "x", 1) != 1)
                    _exit(1);
            }
        }
        close(ready[1]);
        char x;
        assert_int_equal(read(ready[0], &x, 1), 1);
        close(ready[0]);
        assert_int_equal(kill(child, SIGKILL), 0);
        assert_int_equal(waitpid(child, NULL, 0), child);
        wait_all_back(h, ctl, fds, false);
    }
    /* The next stream gets its whole ring: every slot comes, in order, and is leased. */
    lc_client *c = harness_connect(h, 10000, "itest_handoff");
    lc_stream *s = open_records(c, LC_HANDOFF_SHM, 2, 0);
    lc_ring_info ri;
    assert_int_equal(lc_stream_ring_info(s, &ri), 0);
    lc_batch *held[64];
    assert_true(ri.slot_count < 64);
    for (uint32_t i = 0; i < ri.slot_count; i++) {
        int r = lc_stream_next(s, 10000, &held[i]);
        if (r < 0)
            fail_msg("next %u of %u: %s: %s", i, ri.slot_count, lc_strerror(r), lc_client_error(c));
        assert_int_equal(lc_batch_index(held[i]), i);
    }
    struct probe_status st = {0};
    assert_int_equal(probe_status(ctl, &st), 0);
    assert_int_equal(st.leased, (int)ri.slot_count);
    for (uint32_t i = 0; i < ri.slot_count; i++)
        assert_int_equal(lc_batch_release(held[i]), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    lc_client_close(ctl);
    harness_stop_clean(h);
}

/* A raw client that opens a stream with the hand-off and maps its memory read-write. */
struct raw_handoff {
    int fd;
    int64_t stream;
    struct ld_handoff_header *hdr;
    size_t size;
};

/* Opens one more stream with the hand-off on rh->fd (request id `id`). The descriptor
 * that came with the reply is closed once mapped, or left in *keep_fd when not NULL. */
static void raw_open_keep(struct raw_handoff *rh, int id, int *keep_fd)
{
    char req[160];
    snprintf(req, sizeof req, "{\"op\":\"open\",\"id\":%d,\"dataset\":\"records\",\"batch_size\":16,"
             "\"prefetch\":2,\"handoff\":2}", id);
    harness_raw_send(rh->fd, req);
    int sfd;
    char *reply = harness_raw_reply_fd(rh->fd, 10000, &sfd);
    assert_non_null(reply);
    cJSON *j = cJSON_Parse(reply);
    free(reply);
    assert_non_null(j);
    rh->stream = (int64_t)cJSON_GetObjectItem(j, "stream")->valuedouble;
    const cJSON *ho = cJSON_GetObjectItem(j, "handoff");
    assert_non_null(ho);
    assert_null(cJSON_GetObjectItem(ho, "shm")); /* no name: the memory comes as a descriptor */
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(ho, "fd")));
    rh->size = (size_t)cJSON_GetObjectItem(ho, "size")->valuedouble;
    assert_true(sfd >= 0);
    rh->hdr = mmap(NULL, rh->size, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    assert_true(rh->hdr != MAP_FAILED);
    if (keep_fd)
        *keep_fd = sfd;
    else
        close(sfd);
    cJSON_Delete(j);
    assert_int_equal(rh->hdr->magic, LD_HANDOFF_MAGIC);
}

static void raw_open_on(struct raw_handoff *rh, int id)
{
    raw_open_keep(rh, id, NULL);
}

static void raw_open(struct harness *h, struct raw_handoff *rh)
{
    rh->fd = harness_raw_connect(h);
    harness_raw_send(rh->fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(rh->fd, 10000));
    raw_open_on(rh, 2);
}

static void raw_kick(struct raw_handoff *rh, int id)
{
    char req[128];
    snprintf(req, sizeof req, "{\"op\":\"handoff\",\"id\":%d,\"stream\":%lld}", id, (long long)rh->stream);
    harness_raw_send(rh->fd, req);
}

/* Reads replies until the connection ends; returns the last error message seen. */
static char *raw_read_until_closed(int fd)
{
    char *last = NULL, *reply;
    while ((reply = harness_raw_reply(fd, 10000)) != NULL) {
        if (strstr(reply, "\"ok\":false")) {
            free(last);
            last = reply;
        } else {
            free(reply);
        }
    }
    return last;
}

/* Descriptors of pid that lead to the hand-off's memory (a memfd). */
static int handoff_fds(pid_t pid)
{
    char dir[64], path[320], link[256];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k > 0) {
            link[k] = '\0';
            n += strstr(link, "memfd:loaderd-handoff") != NULL;
        }
    }
    closedir(d);
    return n;
}

/* The daemon closes its descriptor once the reply that carried it is written. */
static int daemon_handoff_fds(pid_t pid)
{
    int n = handoff_fds(pid);
    for (int i = 0; i < 500 && n; i++) {
        sleep_ms(10);
        n = handoff_fds(pid);
    }
    return n;
}

static void test_closed_before_start(void **state)
{
    struct harness *h = *state;
    /* Opened with the hand-off, never started: the ring's name exists until the
     * connection goes, and goes with it. The queues' memory never had a name: nobody
     * but this client, which got it with the reply, can open it (the daemon keeps no
     * descriptor of it once the reply is sent, and neither does the client once it has
     * mapped it). */
    lc_client *ctl = harness_connect(h, 10000, "itest_handoff_ctl");
    lc_stream *s = open_records(ctl, LC_HANDOFF_SHM, 2, 1);
    assert_int_equal(handoff_fds(getpid()), 0);
    assert_int_equal(daemon_handoff_fds(h->pid), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(ctl);
    struct raw_handoff rh;
    raw_open(h, &rh);
    char names[512];
    assert_int_equal(harness_shm_count(h->pid, names, sizeof names), 1);
    assert_null(strstr(names, ".h"));
    assert_int_equal(daemon_handoff_fds(h->pid), 0);
    munmap(rh.hdr, rh.size);
    close(rh.fd);
    int left = -1;
    for (int i = 0; i < 200 && left != 0; i++) {
        left = harness_shm_count(h->pid, NULL, 0);
        if (left)
            sleep_ms(10);
    }
    assert_int_equal(left, 0);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    harness_stop_clean(h);
}

static void test_hostile_release_queue(void **state)
{
    struct harness *h = *state;
    /* A well-behaved trainer reads an epoch through the hand-off meanwhile. */
    lc_client *good = harness_connect(h, 10000, "itest_handoff_good");
    lc_stream *gs = open_records(good, LC_HANDOFF_SHM, 2, 1);
    lc_batch *gb = NULL;
    assert_int_equal(lc_stream_next(gs, 10000, &gb), 0);

    /* A client that cuts (or grows) the queues' memory under the daemon's mapping: the
     * seals refuse it (EPERM), and the daemon, which touches the header on its next
     * publish, goes on publishing to that client and serving the others. */
    {
        struct raw_handoff rh;
        int mfd = -1;
        rh.fd = harness_raw_connect(h);
        harness_raw_send(rh.fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
        free(harness_raw_reply(rh.fd, 10000));
        raw_open_keep(&rh, 2, &mfd);
        errno = 0;
        assert_int_equal(ftruncate(mfd, 0), -1);
        assert_int_equal(errno, EPERM);
        errno = 0;
        assert_int_equal(ftruncate(mfd, (off_t)rh.size / 2), -1);
        assert_int_equal(errno, EPERM);
        errno = 0;
        assert_int_equal(ftruncate(mfd, (off_t)rh.size * 2), -1);
        assert_int_equal(errno, EPERM);
        errno = 0;
        assert_int_equal(fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE), -1); /* nor reseal it */
        assert_int_equal(errno, EPERM);
        close(mfd);
        raw_kick(&rh, 3);
        char *reply = harness_raw_reply(rh.fd, 10000);
        assert_non_null(reply);
        assert_non_null(strstr(reply, "\"ok\":true"));
        free(reply);
        for (int i = 0; i < 1000 && __atomic_load_n(&rh.hdr->ready_tail, __ATOMIC_ACQUIRE) < 2; i++)
            sleep_ms(10);
        assert_int_equal(__atomic_load_n(&rh.hdr->ready_tail, __ATOMIC_ACQUIRE), 2); /* its prefetch */
        assert_true(harness_alive(h));
        munmap(rh.hdr, rh.size);
        close(rh.fd);
    }

    struct {
        const char *what;
        uint32_t slot;
        uint64_t gen;
        uint64_t tail;
        const char *says;
    } cases[] = {
        {"a slot out of range", 1000, 1, 1, "out of range"},
        {"a slot not leased", 0, 99, 1, "release queue entry 0"},
        {"a tail far past the head", 0, 0, 1u << 30, "release queue's tail"},
        {"a tail behind the head", 0, 0, UINT64_MAX, "release queue's tail"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct raw_handoff rh;
        raw_open(h, &rh);
        raw_kick(&rh, 3);
        /* Garbage: an entry, and a tail that claims it (or far more). */
        struct ld_handoff_release *rel = (struct ld_handoff_release *)((uint8_t *)rh.hdr + rh.hdr->release_offset);
        rel[0].slot = cases[k].slot;
        rel[0].generation = cases[k].gen;
        __atomic_store_n(&rh.hdr->release_tail, cases[k].tail, __ATOMIC_RELEASE);
        raw_kick(&rh, 4); /* the wake-up that makes the daemon look */
        char *err = raw_read_until_closed(rh.fd);
        if (!err || !strstr(err, cases[k].says))
            fail_msg("%s: the connection ended with %s", cases[k].what, err ? err : "no error");
        assert_non_null(strstr(err, "protocol_error"));
        free(err);
        munmap(rh.hdr, rh.size);
        close(rh.fd);
        assert_true(harness_alive(h));
    }
    /* The good trainer goes on to the end of its epoch, in order. */
    uint64_t want = 1;
    assert_int_equal(lc_batch_release(gb), 0);
    int r;
    while ((r = lc_stream_next(gs, 10000, &gb)) == 0) {
        assert_int_equal(lc_batch_index(gb), want++);
        assert_int_equal(lc_batch_release(gb), 0);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(want, lc_stream_batches_per_epoch(gs));
    assert_int_equal(lc_stream_close(gs), 0);
    lc_client_close(good);
    /* Nothing of the ended connections is left. */
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_true(harness_status_num(h, "streams", NULL) == 0);
    harness_stop_clean(h);
}

/* A client asleep on a ready queue with one long futex wait: nothing but the daemon's
 * wake-up ends it before the wait runs out. */
struct raw_sleeper {
    struct ld_handoff_header *hdr;
    uint64_t head;
    atomic_bool done;
    bool timed_out;
    uint32_t rows;              /* of the entry that woke it */
};

static void *raw_sleeper_run(void *arg)
{
    struct raw_sleeper *sl = arg;
    struct ld_handoff_header *hdr = sl->hdr;
    for (;;) {
        uint32_t seq = __atomic_load_n(&hdr->ready_seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&hdr->ready_tail, __ATOMIC_ACQUIRE) > sl->head)
            break;
        __atomic_store_n(&hdr->client_waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&hdr->ready_tail, __ATOMIC_SEQ_CST) == sl->head) {
            struct timespec ts = {60, 0};
            if (syscall(SYS_futex, &hdr->ready_seq, FUTEX_WAIT, seq, &ts, NULL, 0) < 0 && errno == ETIMEDOUT) {
                sl->timed_out = true;
                break;
            }
        }
    }
    const struct ld_handoff_ready *q = (const struct ld_handoff_ready *)((const uint8_t *)hdr + hdr->ready_offset);
    sl->rows = q[sl->head & (hdr->capacity - 1)].rows;
    atomic_store(&sl->done, true);
    return NULL;
}

static void test_woken_when_the_connection_ends(void **state)
{
    struct harness *h = *state;
    /* Two streams on one connection: the trainer sleeps on the first; the second's
     * release queue gets garbage, for which the daemon ends the connection. */
    struct raw_handoff a, b;
    raw_open(h, &a);
    b.fd = a.fd;
    raw_open_on(&b, 3);
    raw_kick(&a, 4);
    char *reply = harness_raw_reply(a.fd, 10000);
    assert_non_null(strstr(reply, "\"ok\":true"));
    free(reply);
    /* Both batches of its prefetch published and none taken: the daemon is idle for
     * good, and the next entry of this queue can only be the end. */
    for (int i = 0; i < 1000 && !(__atomic_load_n(&a.hdr->ready_tail, __ATOMIC_ACQUIRE) == 2 &&
                                  __atomic_load_n(&a.hdr->daemon_idle, __ATOMIC_ACQUIRE)); i++)
        sleep_ms(10);
    assert_int_equal(__atomic_load_n(&a.hdr->ready_tail, __ATOMIC_ACQUIRE), 2);
    assert_true(__atomic_load_n(&a.hdr->daemon_idle, __ATOMIC_ACQUIRE) != 0);
    struct raw_sleeper sl = {.hdr = a.hdr, .head = __atomic_load_n(&a.hdr->ready_tail, __ATOMIC_ACQUIRE)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, raw_sleeper_run, &sl), 0);
    for (int i = 0; i < 1000 && !__atomic_load_n(&a.hdr->client_waiting, __ATOMIC_SEQ_CST); i++)
        sleep_ms(10);
    assert_true(__atomic_load_n(&a.hdr->client_waiting, __ATOMIC_SEQ_CST) != 0);

    raw_kick(&b, 5);
    struct ld_handoff_release *rel = (struct ld_handoff_release *)((uint8_t *)b.hdr + b.hdr->release_offset);
    rel[0] = (struct ld_handoff_release){.slot = 1000, .generation = 1};
    __atomic_store_n(&b.hdr->release_tail, 1, __ATOMIC_RELEASE);
    raw_kick(&b, 6);
    char *err = raw_read_until_closed(a.fd);
    assert_non_null(err);
    assert_non_null(strstr(err, "protocol_error"));
    assert_non_null(strstr(err, "out of range"));
    free(err);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(atomic_load(&sl.done));
    assert_false(sl.timed_out); /* woken by the daemon, not by its own minute running out */
    assert_int_equal(sl.rows, 0);
    munmap(a.hdr, a.size);
    munmap(b.hdr, b.size);
    close(a.fd);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(harness_shm_count(h->pid, NULL, 0), 0);
    harness_stop_clean(h);
}

static void test_old_layout_and_client_descriptors(void **state)
{
    struct harness *h = *state;
    /* An open that asks for the layout with a named object (1) gets the socket path. */
    int fd = harness_raw_connect(h);
    harness_raw_send(fd, "{\"op\":\"hello\",\"id\":1,\"version\":1}");
    free(harness_raw_reply(fd, 10000));
    harness_raw_send(fd, "{\"op\":\"open\",\"id\":2,\"dataset\":\"records\",\"batch_size\":16,\"handoff\":1}");
    int passed;
    char *reply = harness_raw_reply_fd(fd, 10000, &passed);
    assert_non_null(reply);
    assert_non_null(strstr(reply, "\"ok\":true"));
    assert_null(strstr(reply, "\"handoff\""));
    assert_int_equal(passed, -1);
    free(reply);
    /* A descriptor sent to the daemon ends the connection, and nothing of it stays. */
    int fds = probe_fd_count(h->pid);
    int p[2];
    assert_int_equal(pipe(p), 0);
    const char req[] = "{\"op\":\"status\",\"id\":3}";
    uint8_t frame[4 + sizeof req - 1];
    proto_frame_header((uint32_t)(sizeof req - 1), frame);
    memcpy(frame + 4, req, sizeof req - 1);
    union {
        struct cmsghdr hdr;
        char space[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = frame, .iov_len = sizeof frame};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl.space};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &p[0], sizeof(int));
    assert_int_equal(sendmsg(fd, &m, MSG_NOSIGNAL), (ssize_t)sizeof frame);
    char *err = raw_read_until_closed(fd);
    assert_non_null(err);
    assert_non_null(strstr(err, "file descriptor"));
    free(err);
    close(fd);
    close(p[0]);
    close(p[1]);
    int now = -1;
    for (int i = 0; i < 500 && (now = probe_fd_count(h->pid)) > fds - 1; i++)
        sleep_ms(10);
    assert_true(now <= fds - 1); /* its connection's socket went, and the descriptor with it */
    assert_int_equal(harness_wait_leased(h, 0), 0);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_batches, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_idle_daemon, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_killed_asleep, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_killed_polling, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_closed_before_start, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_release_queue, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_woken_when_the_connection_ends, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_old_layout_and_client_descriptors, setup_daemon, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
