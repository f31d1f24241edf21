/* client_handoff — the trainer's side of the batch hand-off through shared memory.
 *
 * An open that asks for it ("handoff": LD_HANDOFF_VERSION) gets a second shared object
 * beside the ring (struct ld_handoff_header in proto/ld_wire.h), as a descriptor that
 * comes with the open reply (it has no name: nobody else can open it; client_recv takes
 * it off the socket, and it is closed once mapped): the daemon publishes each batch it
 * leases to us in a ready queue, we publish each slot we give back in a release queue.
 * A batch then costs no system call while the daemon keeps ahead: lc_stream_next takes
 * the next entry, lc_batch_release writes one. With nothing to take we sleep on a futex
 * (in slices, looking at the socket in between, so a daemon that went away is noticed
 * as it is on the socket path). After a short sleep the next one is brief: we say so
 * (LD_HANDOFF_WAIT_BRIEF) and look again by ourselves within LD_HANDOFF_BRIEF_NS (5 ms),
 * and the daemon may then wake us once a few batches are ready instead of at the first
 * (batches that come fast: a sleep and wake-up per batch would cost more than them).
 * The daemon sleeps in its event loop, not on a futex: when it has nothing left to fill
 * it says so (`daemon_idle`), and we send it one `handoff` request, once we have given
 * back half the ring or before we sleep ourselves.
 *
 * Nothing in the object is trusted more than a socket reply: an entry must name a slot
 * of the ring, the batch that comes next in the stream's order, and the generation the
 * slot's header holds (lc_stream_next checks the header as for a socket reply). */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A sleep on the futex lasts at most this long before the socket is looked at. */
#define CLIENT_HANDOFF_SLICE_MS 50

struct client_handoff {
    struct ld_handoff_header *hdr;
    const struct ld_handoff_ready *ready;
    struct ld_handoff_release *rel;
    size_t size;
    uint32_t cap;
    uint64_t ready_head, release_tail; /* our own copies */
    uint32_t woke_idle;         /* the idle spell we sent a wake-up for */
    uint32_t idle_seen;         /* the idle spell the events below count for */
    uint32_t idle_events;       /* batches taken and released since it began */
    uint64_t last_sleep_ns;     /* how long the last sleep lasted (UINT64_MAX: none yet) */
};

bool client_handoff_wanted(const lc_stream_options *o)
{
    if (o->handoff == LC_HANDOFF_SOCKET)
        return false;
    const char *env = getenv("LOADERD_HANDOFF");
    return !(env && strcmp(env, "socket") == 0);
}

void client_handoff_close(lc_stream *s)
{
    struct client_handoff *h = s->ho;
    if (!h)
        return;
    munmap(h->hdr, h->size);
    free(h);
    s->ho = NULL;
}

/* Maps the object that came with the reply (fd, or -1 when none came) and checks it
 * against the stream. Closes fd. */
static int client_handoff_map(lc_stream *s, const cJSON *jo, int fd, struct client_handoff *h, char *msg)
{
    int64_t size, cap, version;
    char sub[LD_ERRMSG_MAX];
    struct stat st = {0};
    int ret;
    if (proto_get_int(jo, "version", 1, LD_JSON_SAFE_INT, &version, sub) < 0 || version != LD_HANDOFF_VERSION) {
        ret = 1; /* another layout: the socket serves us */
        goto out;
    }
    if ((ret = proto_get_int(jo, "size", sizeof(struct ld_handoff_header), INT64_MAX / 2, &size, sub)) < 0 ||
        (ret = proto_get_int(jo, "capacity", 1, LD_HANDOFF_QUEUE_MAX, &cap, sub)) < 0) {
        client_msgf(msg, "malformed open reply from loaderd: handoff: %s", sub);
        ret = LC_EPROTO;
        goto out;
    }
    if ((cap & (cap - 1)) || cap <= s->slot_count || (uint64_t)size > SIZE_MAX) {
        client_msgf(msg, "malformed open reply from loaderd: handoff of %lld bytes, capacity %lld for %u slots",
                    (long long)size, (long long)cap, s->slot_count);
        ret = LC_EPROTO;
        goto out;
    }
    if (fd < 0) {
        client_msgf(msg, "malformed open reply from loaderd: it offers the hand-off, and its memory did not come "
                    "with it");
        ret = LC_EPROTO;
        goto out;
    }
    /* The daemon's, and sealed to its size (neither side can shrink it under the other's
     * mapping). */
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) < 0 || st.st_uid != s->client->server_uid || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size < (uint64_t)size || seals < 0 || !(seals & F_SEAL_SHRINK)) {
        ret = LC_EPERM;
        client_msgf(msg, "the hand-off's memory (uid %u, %lld bytes, seals 0x%x) is not loaderd's of %lld bytes "
                    "(uid %u, sealed against shrinking): refusing to map it", (unsigned)st.st_uid,
                    (long long)st.st_size, (unsigned)seals, (long long)size, (unsigned)s->client->server_uid);
        goto out;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot map the hand-off's memory: %s", strerror(errno));
        goto out;
    }
    const struct ld_handoff_header *hd = map;
    uint64_t ready_end = hd->ready_offset + (uint64_t)cap * sizeof(struct ld_handoff_ready);
    uint64_t release_end = hd->release_offset + (uint64_t)cap * sizeof(struct ld_handoff_release);
    if (hd->magic != LD_HANDOFF_MAGIC || hd->version != LD_HANDOFF_VERSION || hd->capacity != cap ||
        hd->slot_count != s->slot_count || hd->stream_id != s->id || hd->total_size != (uint64_t)size ||
        hd->ready_offset < sizeof *hd || hd->ready_offset % 8 || hd->release_offset % 8 ||
        ready_end > (uint64_t)size || hd->release_offset < ready_end || release_end > (uint64_t)size) {
        munmap(map, (size_t)size);
        ret = LC_EPROTO;
        client_msgf(msg, "the hand-off's header does not match the open reply (magic 0x%08x version %u, "
                    "capacity %u, %u slots, stream %llu)", hd->magic, hd->version, hd->capacity,
                    hd->slot_count, (unsigned long long)hd->stream_id);
        goto out;
    }
    h->hdr = map;
    h->size = (size_t)size;
    h->cap = (uint32_t)cap;
    h->ready = (const struct ld_handoff_ready *)((const uint8_t *)map + hd->ready_offset);
    h->rel = (struct ld_handoff_release *)((uint8_t *)map + hd->release_offset);
    h->ready_head = __atomic_load_n(&hd->ready_tail, __ATOMIC_ACQUIRE); /* 0: nothing published yet */
    h->release_tail = __atomic_load_n(&hd->release_head, __ATOMIC_ACQUIRE);
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

/* Sends `handoff` for the stream: the start, or a wake-up of an idle daemon. A wake-up's
 * reply is not waited for (it is read with whatever comes next). */
static int client_handoff_send(lc_stream *s, bool wait)
{
    lc_client *c = s->client;
    cJSON *req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_HANDOFF) ||
        !cJSON_AddNumberToObject(req, "stream", (double)s->id)) {
        cJSON_Delete(req);
        client_seterr(c, "out of memory building 'handoff'");
        return LC_ENOMEM;
    }
    if (wait) {
        cJSON *reply = NULL;
        int ret = client_call(c, req, LD_OP_HANDOFF, c->timeout_ms, &reply);
        cJSON_Delete(reply);
        return ret;
    }
    int64_t id;
    return client_send(c, req, CLIENT_PENDING_IGNORE, LD_OP_HANDOFF, NULL, client_now_ms() + c->timeout_ms,
                       c->timeout_ms, &id);
}

int client_handoff_attach(lc_stream *s, const cJSON *reply, char *msg)
{
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(reply, "handoff");
    int fd = client_take_passed_fd(s->client, proto_request_id(reply));
    if (!jo)
        return 0; /* not offered (an older daemon, or none asked): the socket serves us */
    if (!cJSON_IsObject(jo)) {
        if (fd >= 0)
            close(fd);
        client_msgf(msg, "malformed open reply from loaderd: 'handoff' is not an object");
        return LC_EPROTO;
    }
    struct client_handoff *h = calloc(1, sizeof *h);
    if (!h) {
        if (fd >= 0)
            close(fd);
        client_msgf(msg, "out of memory");
        return LC_ENOMEM;
    }
    h->last_sleep_ns = UINT64_MAX;
    int ret = client_handoff_map(s, jo, fd, h, msg);
    if (ret != 0) {
        free(h);
        return ret > 0 ? 0 : ret;
    }
    s->ho = h;
    ret = client_handoff_send(s, true);
    if (ret < 0) {
        client_handoff_close(s);
        client_msgf(msg, "%s", s->client->error);
    }
    return ret;
}

/* An idle daemon gets one wake-up per idle spell: once we have taken and released
 * `wake_after` batches since it went idle (it can prepare that many again), or when we
 * are about to sleep. `event`: we just took or released one. */
static int client_handoff_wake(lc_stream *s, bool sleeping, bool event)
{
    struct client_handoff *h = s->ho;
    uint32_t idle = __atomic_load_n(&h->hdr->daemon_idle, __ATOMIC_SEQ_CST);
    if (!idle || idle == h->woke_idle)
        return 0;
    if (idle != h->idle_seen) {
        h->idle_seen = idle;
        h->idle_events = 0;
    }
    h->idle_events += event;
    uint32_t after = __atomic_load_n(&h->hdr->wake_after, __ATOMIC_RELAXED);
    if (!sleeping && h->idle_events < 2 * (uint64_t)(after ? after : 1))
        return 0;
    h->woke_idle = idle;
    return client_handoff_send(s, false);
}

int client_handoff_release(lc_stream *s, int slot, uint64_t generation)
{
    struct client_handoff *h = s->ho;
    lc_client *c = s->client;
    if (h->release_tail - __atomic_load_n(&h->hdr->release_head, __ATOMIC_ACQUIRE) >= h->cap)
        return client_break(c, LC_EPROTO, "the hand-off's release queue of stream %llu is full: loaderd does not "
                            "take releases", (unsigned long long)s->id);
    struct ld_handoff_release *e = &h->rel[h->release_tail & (h->cap - 1)];
    e->slot = (uint32_t)slot;
    e->generation = generation;
    h->release_tail++;
    /* Sequentially consistent, as the daemon's saying it is idle and its last look at
     * the queue are: either it sees this release, or we see it idle. */
    __atomic_store_n(&h->hdr->release_tail, h->release_tail, __ATOMIC_SEQ_CST);
    return client_handoff_wake(s, false, true);
}

static uint64_t client_handoff_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Returns whether the wait ran out (nothing woke us). */
static bool client_handoff_futex_wait(uint32_t *word, uint32_t seen, uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    /* EAGAIN (the word moved), EINTR, a wake-up: look at the queue again. */
    return syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0) < 0 && errno == ETIMEDOUT;
}

int client_handoff_next(lc_stream *s, int64_t deadline, int timeout_ms, struct ld_handoff_ready *ret)
{
    struct client_handoff *h = s->ho;
    lc_client *c = s->client;
    bool look = true; /* at the socket: first, and after each sleep that nothing ended */
    bool timed_out = false;
    for (;;) {
        uint32_t seq = __atomic_load_n(&h->hdr->ready_seq, __ATOMIC_ACQUIRE);
        uint64_t tail = __atomic_load_n(&h->hdr->ready_tail, __ATOMIC_ACQUIRE);
        if (tail != h->ready_head) {
            if (tail - h->ready_head > h->cap)
                return client_break(c, LC_EPROTO, "the hand-off's ready queue of stream %llu is at %llu, %llu "
                                    "entries past ours (capacity %u)", (unsigned long long)s->id,
                                    (unsigned long long)tail, (unsigned long long)(tail - h->ready_head), h->cap);
            const struct ld_handoff_ready *src = &h->ready[h->ready_head & (h->cap - 1)];
            struct ld_handoff_ready e = {
                .slot = __atomic_load_n(&src->slot, __ATOMIC_RELAXED),
                .rows = __atomic_load_n(&src->rows, __ATOMIC_RELAXED),
                .generation = __atomic_load_n(&src->generation, __ATOMIC_RELAXED),
                .epoch = __atomic_load_n(&src->epoch, __ATOMIC_RELAXED),
                .batch = __atomic_load_n(&src->batch, __ATOMIC_RELAXED),
            };
            h->ready_head++;
            __atomic_store_n(&h->hdr->ready_head, h->ready_head, __ATOMIC_SEQ_CST); /* as a release */
            if (e.rows == 0)
                return 1;
            int w = client_handoff_wake(s, false, true);
            if (w < 0)
                return w;
            if (e.slot >= s->slot_count || e.rows > s->batch_size || e.epoch != s->next_epoch ||
                e.batch != s->next_batch)
                return client_break(c, LC_EPROTO, "the hand-off of stream %llu announced slot %u (epoch %llu batch "
                                    "%llu, %u rows); expected epoch %llu batch %llu in one of %u slots",
                                    (unsigned long long)s->id, e.slot, (unsigned long long)e.epoch,
                                    (unsigned long long)e.batch, e.rows, (unsigned long long)s->next_epoch,
                                    (unsigned long long)s->next_batch, s->slot_count);
            *ret = e;
            return 0;
        }
        int r = client_handoff_wake(s, true, false);
        if (r < 0)
            return r;
        int left = client_remaining_ms(deadline);
        if (left == 0) {
            client_seterr(c, "timed out after %d ms waiting for a batch of stream %llu", timeout_ms,
                          (unsigned long long)s->id);
            return LC_ETIMEDOUT;
        }
        /* Replies that came (a wake-up's), or the daemon gone: the socket says. Not
         * before every sleep (a system call each): only when a reply is owed to us or
         * the last slice ran out (a daemon that went away stops waking us). */
        if (look && (timed_out || c->pending_head != c->pending_len)) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            if (poll(&pfd, 1, 0) > 0 && (r = client_wait(c, -1, 0, 0, NULL)) < 0)
                return r;
            if (c->lost || c->broken)
                return client_check_usable(c);
        }
        /* Brief after a short sleep (the daemon may hold our wake-up for a few batches,
         * above), else a slice. The socket is looked at after a slice that ran out. */
        bool brief = h->last_sleep_ns < LD_HANDOFF_BRIEF_NS && left >= 1;
        uint64_t slice = brief ? LD_HANDOFF_BRIEF_NS
                               : (uint64_t)(left < CLIENT_HANDOFF_SLICE_MS ? left : CLIENT_HANDOFF_SLICE_MS) * 1000000u;
        /* Sequentially consistent, as the daemon's publishing and its look at
         * client_waiting are: either we see the entry, or it sees us waiting. */
        __atomic_store_n(&h->hdr->client_waiting, brief ? LD_HANDOFF_WAIT_BRIEF : LD_HANDOFF_WAIT_SLEEP,
                         __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->hdr->ready_tail, __ATOMIC_SEQ_CST) == h->ready_head) {
            uint64_t t0 = client_handoff_now_ns();
            bool ran_out = client_handoff_futex_wait(&h->hdr->ready_seq, seq, slice);
            h->last_sleep_ns = client_handoff_now_ns() - t0;
            look = ran_out;
            timed_out = ran_out && !brief;
        } else {
            look = timed_out = false;
        }
        __atomic_store_n(&h->hdr->client_waiting, 0, __ATOMIC_RELAXED);
    }
}
