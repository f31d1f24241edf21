/* The batch ring: one stream's slots in one POSIX shared-memory object, and the state
 * of each slot.
 *
 * Slots are allocated once per stream and reused for every batch, because a fresh
 * buffer per batch is what makes per-batch IPC slow. The pages are committed
 * (posix_fallocate), since on tmpfs ftruncate reserves nothing and a /dev/shm too small
 * for the ring would otherwise surface as a SIGBUS in the middle of an epoch; a ring
 * larger than /dev/shm's free space is refused at open with an error that names
 * /dev/shm and the sizes. Committing tens of megabytes takes tens of milliseconds, so
 * ring_open_partial commits only the header and the first slots, which is all the
 * first batch needs, and ring_commit commits the others later, on a thread that may
 * block; until then ring_acquire hands out committed slots only, so a worker never
 * writes a page that has no backing. The name carries the daemon's
 * pid so that a daemon that starts can sweep what a crashed one left (ring_sweep), and
 * an unguessable part so that no other process can predict and pre-create it.
 *
 * The slot states live in the daemon's own memory, not in the mapping: clients map the
 * object read-only and see only the generation in each slot's header, which the ring
 * writes on acquire so a client can tell a recycled slot from the one it was given.
 * Every call comes from the loop thread, so there is no locking. */
#include "ring.h"

#include "ld_error.h"
#include "ld_format.h"
#include "ld_wire.h"
#include "log.h"
#include "sweep.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define RING_SHM_DIR "/dev/shm"

/* The group rings are shared with, or -1: set once at start-up (ring_share_with_group). */
static gid_t ring_group = (gid_t)-1;

void ring_share_with_group(gid_t gid)
{
    ring_group = gid;
}

struct ring {
    char name[RING_NAME_MAX];
    bool unlinked;
    uint8_t *base;
    uint64_t total_size;
    uint64_t slot_size;
    uint32_t slot_count;
    uint32_t cursor;          /* where the next acquire starts looking */
    uint32_t counts[RING_STATES]; /* slots per state, so ring_count is O(1) */
    uint8_t *states;          /* enum ring_state per slot */
    uint64_t *generations;    /* the authoritative copy; the header mirrors it */
    /* Slots [0, committed) have their pages; the committer (ring_commit, one thread at a
     * time) publishes more with a release store, ring_acquire reads it. fd stays open
     * until every slot is committed. */
    _Atomic uint32_t committed;
    int fd;
    uint64_t stream_id;       /* for messages */
};

/* A prefix becomes part of a file name in /dev/shm and of the pattern ring_sweep
 * matches, so it must be one plain path component. */
static bool prefix_ok(const char *prefix)
{
    if (!prefix || !prefix[0] || strlen(prefix) > RING_NAME_MAX / 2)
        return false;
    return strchr(prefix, '/') == NULL && strcmp(prefix, ".") != 0 && strcmp(prefix, "..") != 0;
}

static uint64_t shm_free_bytes(void)
{
    struct statvfs sv;
    if (statvfs(RING_SHM_DIR, &sv) < 0)
        return 0;
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* Commits (posix_fallocate) and populates bytes [from, to) of a shared-memory object of
 * `total` bytes mapped at base. */
static int shm_commit(int fd, const char *name, uint8_t *base, uint64_t from, uint64_t to, uint64_t total,
                      uint64_t stream_id, char *errbuf)
{
    int err = posix_fallocate(fd, (off_t)from, (off_t)(to - from));
    if (err == ENOSPC || err == EFBIG) {
        char want[LD_FORMAT_BYTES_MAX], avail[LD_FORMAT_BYTES_MAX];
        ld_format_bytes(total, want, sizeof(want));
        ld_format_bytes(shm_free_bytes(), avail, sizeof(avail));
        ld_errorf(errbuf,
                "cannot commit %s of shared memory for stream %" PRIu64 " in " RING_SHM_DIR
                " (free: %s): " RING_SHM_DIR " is too small; in a container raise it "
                "(docker run --shm-size=...)",
                want, stream_id, avail);
        return LD_ENOSPC;
    } else if (err != 0) {
        ld_errorf(errbuf, "posix_fallocate %s: %s", name, strerror(err));
        return ld_from_errno(err);
    }
    /* The page tables are filled now rather than on the first write (MADV_POPULATE_WRITE,
     * Linux 5.14; older kernels fault the pages in as they are used). */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    (void)madvise(base + from, (size_t)(to - from), MADV_POPULATE_WRITE);
    return 0;
}

/* Creates `/<prefix>.<pid>.<stream_id>.<16 random hex>` of `total` bytes, mode `mode`
 * (plus `group_mode`, and the group, when ring_share_with_group set one), commits
 * [0, commit) now (LD_ENOSPC names /dev/shm and the size) and maps it read-write into
 * *ret_base; the name goes into name, and on failure nothing is left and name is empty.
 * With ret_fd the descriptor stays open for later commits (shm_commit), else it is
 * closed. */
static int shm_create(const char *prefix, uint64_t stream_id, uint64_t total, uint64_t commit,
                      unsigned mode, unsigned group_mode, char name[RING_NAME_MAX], void **ret_base, int *ret_fd,
                      char *errbuf)
{
    int fd = -1;
    bool created = false;
    void *base = MAP_FAILED;
    int ret;
    if (!prefix_ok(prefix) || (mode & ~0777u) != 0 || (group_mode & ~0070u) != 0 || total == 0 ||
        total > SIZE_MAX || commit > total) {
        ld_errorf(errbuf, "invalid shared-memory parameters (prefix, size or mode)");
        return LD_EINVAL;
    }
    /* O_EXCL: the name is ours alone. A clash of 64 random bits means a name was
     * planted or the generator is broken; retrying a few times covers neither case
     * silently but costs nothing when it is a real accident. */
    for (int attempt = 0; attempt < 4 && fd < 0; attempt++) {
        uint64_t rnd;
        if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
            ret = ld_from_errno(errno);
            ld_errorf(errbuf, "getrandom: %s", strerror(errno));
            goto fail;
        }
        int n = snprintf(name, RING_NAME_MAX, "/%s.%ld.%" PRIu64 ".%016" PRIx64, prefix,
                         (long)getpid(), stream_id, rnd);
        if (n < 0 || (size_t)n >= RING_NAME_MAX) {
            ret = LD_ENAMETOOLONG;
            ld_errorf(errbuf, "shared memory name for prefix '%s' is too long", prefix);
            goto fail;
        }
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, mode);
        if (fd < 0 && errno != EEXIST) {
            ret = ld_from_errno(errno);
            ld_errorf(errbuf, "shm_open %s: %s", name, strerror(errno));
            goto fail;
        }
    }
    if (fd < 0) {
        ret = LD_EEXIST;
        ld_errorf(errbuf, "shm_open: could not find a free name for stream %" PRIu64, stream_id);
        goto fail;
    }
    created = true;
    /* A trainer in the service group maps the object with its own uid: it carries that
     * group and group_mode. */
    if (ring_group != (gid_t)-1) {
        mode |= group_mode;
        if (fchown(fd, (uid_t)-1, ring_group) < 0) {
            ret = ld_from_errno(errno);
            ld_errorf(errbuf, "cannot give %s to group %u: %s", name, (unsigned)ring_group, strerror(errno));
            goto fail;
        }
    }
    /* The umask must not decide who may map the object: the mode is the contract
     * (0600, or group-readable for the service group). */
    if (fchmod(fd, mode) < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(errbuf, "fchmod %s: %s", name, strerror(errno));
        goto fail;
    }
    if (ftruncate(fd, (off_t)total) < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(errbuf, "ftruncate %s to %" PRIu64 " bytes: %s", name, total, strerror(errno));
        goto fail;
    }
    /* Not MAP_POPULATE: that would fault in pages not committed yet, unreserved. */
    base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        ret = ld_from_errno(errno);
        ld_errorf(errbuf, "mmap %s (%" PRIu64 " bytes): %s", name, total, strerror(errno));
        goto fail;
    }
    ret = shm_commit(fd, name, base, 0, commit, total, stream_id, errbuf);
    if (ret < 0)
        goto fail;
    if (ret_fd)
        *ret_fd = fd;
    else
        close(fd);
    *ret_base = base;
    return 0;

fail:
    if (base != MAP_FAILED)
        munmap(base, (size_t)total);
    if (fd >= 0)
        close(fd);
    if (created)
        shm_unlink(name);
    name[0] = '\0';
    return ret;
}

int ring_open(const char *prefix, uint64_t stream_id, uint32_t slot_count, uint64_t slot_bytes,
              unsigned mode, ring **ret_ring, char *errbuf)
{
    return ring_open_partial(prefix, stream_id, slot_count, slot_bytes, mode, slot_count, ret_ring, errbuf);
}

int ring_open_partial(const char *prefix, uint64_t stream_id, uint32_t slot_count, uint64_t slot_bytes,
                      unsigned mode, uint32_t commit_slots, ring **ret_ring, char *errbuf)
{
    ring *r = NULL;
    int ret;

    if (!prefix_ok(prefix) || slot_count == 0 || slot_bytes == 0 || !ret_ring ||
        (mode & ~0777u) != 0 || commit_slots == 0) {
        ld_errorf(errbuf, "invalid ring parameters (prefix, slot count, slot size or mode)");
        return LD_EINVAL;
    }
    /* Sizes: each slot rounded up to the alignment, the header page in front. */
    if (slot_bytes > UINT64_MAX - LD_RING_ALIGN) {
        ld_errorf(errbuf, "slot size %" PRIu64 " is too large", slot_bytes);
        return LD_ERANGE;
    }
    uint64_t slot_size = (slot_bytes + LD_RING_ALIGN - 1) / LD_RING_ALIGN * LD_RING_ALIGN;
    if (slot_size > ((uint64_t)INT64_MAX - LD_RING_ALIGN) / slot_count ||
        slot_size > SIZE_MAX / slot_count) {
        ld_errorf(errbuf, "ring of %" PRIu32 " slots of %" PRIu64 " bytes is too large",
                slot_count, slot_size);
        return LD_ERANGE;
    }
    uint64_t total = LD_RING_ALIGN + slot_size * slot_count;

    r = calloc(1, sizeof(*r));
    if (!r) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "out of memory for the ring");
        goto fail;
    }
    r->fd = -1;
    r->stream_id = stream_id;
    if (commit_slots > slot_count)
        commit_slots = slot_count;
    r->states = calloc(slot_count, sizeof(*r->states));
    r->generations = calloc(slot_count, sizeof(*r->generations));
    if (!r->states || !r->generations) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "out of memory for the ring's slot table");
        goto fail;
    }
    r->slot_count = slot_count;
    r->slot_size = slot_size;
    r->total_size = total;
    r->counts[RING_FREE] = slot_count;

    /* The header and the first commit_slots slots now. A ring that cannot fit at all is
     * committed whole now instead, so that it is refused at open with the message (tmpfs
     * refuses a size beyond its free space at once); a file system of unknown size
     * (f_blocks 0) is left to the later commits. */
    uint64_t eager = LD_RING_ALIGN + slot_size * commit_slots;
    struct statvfs sv;
    if (eager < total && statvfs(RING_SHM_DIR, &sv) == 0 && sv.f_blocks != 0 &&
        total > (uint64_t)sv.f_bavail * sv.f_frsize) {
        eager = total;
        commit_slots = slot_count;
    }
    /* Group read, never write: a client never writes into a slot. */
    void *base = NULL; /* set on success; a compiler that inlines shm_create may not see it */
    ret = shm_create(prefix, stream_id, total, eager, mode, 0040, r->name, &base,
                     commit_slots < slot_count ? &r->fd : NULL, errbuf);
    if (ret < 0)
        goto fail;
    r->base = base;
    atomic_store_explicit(&r->committed, commit_slots, memory_order_release);

    struct ld_ring_header *h = (struct ld_ring_header *)r->base;
    h->magic = LD_RING_MAGIC;
    h->version = LD_RING_VERSION;
    h->slot_count = slot_count;
    h->slot_size = slot_size;
    h->slot_offset = LD_RING_ALIGN;
    h->total_size = total;
    h->stream_id = stream_id;

    *ret_ring = r;
    return 0;

fail:
    if (r) {
        r->unlinked = !r->name[0];
        ring_free(r);
    }
    return ret;
}

void ring_free(ring *r)
{
    if (!r)
        return;
    if (r->base)
        munmap(r->base, (size_t)r->total_size);
    if (r->fd >= 0)
        close(r->fd);
    if (!r->unlinked && r->name[0])
        shm_unlink(r->name);
    free(r->states);
    free(r->generations);
    free(r);
}

int ring_unlink(ring *r)
{
    if (r->unlinked)
        return 0;
    /* ENOENT means someone removed it already (a sweep by hand): the goal is met. */
    if (shm_unlink(r->name) < 0 && errno != ENOENT)
        return ld_from_errno(errno);
    r->unlinked = true;
    return 0;
}

const char *ring_name(const ring *r)
{
    return r->name;
}

uint32_t ring_slot_count(const ring *r)
{
    return r->slot_count;
}

uint64_t ring_slot_size(const ring *r)
{
    return r->slot_size;
}

uint64_t ring_slot_offset(const ring *r)
{
    return LD_RING_ALIGN;
}

uint64_t ring_total_size(const ring *r)
{
    return r->total_size;
}

void *ring_slot(ring *r, uint32_t slot)
{
    if (slot >= r->slot_count)
        return NULL;
    return r->base + LD_RING_ALIGN + (uint64_t)slot * r->slot_size;
}

int ring_commit(ring *r, uint32_t upto, char *errbuf)
{
    uint32_t from = atomic_load_explicit(&r->committed, memory_order_relaxed); /* only we change it */
    if (upto > r->slot_count)
        upto = r->slot_count;
    if (from >= upto)
        return 0;
    int ret = shm_commit(r->fd, r->name, r->base, LD_RING_ALIGN + (uint64_t)from * r->slot_size,
                         LD_RING_ALIGN + (uint64_t)upto * r->slot_size, r->total_size, r->stream_id, errbuf);
    if (ret < 0)
        return ret;
    atomic_store_explicit(&r->committed, upto, memory_order_release);
    if (upto == r->slot_count) {
        close(r->fd);
        r->fd = -1;
    }
    return 0;
}

uint32_t ring_committed(const ring *r)
{
    return atomic_load_explicit(&((ring *)r)->committed, memory_order_acquire);
}

/* The state machine is driven by one thread at a time (the loop thread, or a worker
 * holding its stream's lock on the direct path, stream.c); states, counts and
 * generations are stored atomically so that the loop may read them for a report
 * (ring_state, ring_count, ring_generation) while a worker moves them. */
static void set_state(ring *r, uint32_t slot, enum ring_state to)
{
    __atomic_store_n(&r->counts[r->states[slot]], r->counts[r->states[slot]] - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->counts[to], r->counts[to] + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->states[slot], (uint8_t)to, __ATOMIC_RELAXED);
}

int ring_acquire(ring *r, uint32_t *ret_slot, uint64_t *ret_generation)
{
    if (r->counts[RING_FREE] == 0)
        return LD_EAGAIN;
    /* Round robin from the last slot handed out, so a slot just released is the last
     * to be rewritten: a client holding a stale view of it keeps valid data longest.
     * Only committed slots are handed out (the others have no pages yet). */
    uint32_t n = atomic_load_explicit(&r->committed, memory_order_acquire);
    uint32_t i, s = 0;
    for (i = 0; i < n; i++) {
        s = (r->cursor + i) % n;
        if (r->states[s] == RING_FREE)
            break;
    }
    if (i == n) {
        /* else counts[RING_FREE] > 0 lied: the bookkeeping is corrupt */
        ld_require(n < r->slot_count);
        return LD_EAGAIN;
    }
    uint64_t gen = r->generations[s] + 1;
    __atomic_store_n(&r->generations[s], gen, __ATOMIC_RELAXED);
    struct ld_slot_header *sh = ring_slot(r, s);
    /* Clients read the header concurrently from another process. */
    __atomic_store_n(&sh->generation, gen, __ATOMIC_RELEASE);
    set_state(r, s, RING_FILLING);
    r->cursor = (s + 1) % r->slot_count;
    if (ret_slot)
        *ret_slot = s;
    if (ret_generation)
        *ret_generation = gen;
    return 0;
}

/* One checked transition: slot in range, in state `from`, to `to`. */
static int transition(ring *r, uint32_t slot, enum ring_state from, enum ring_state to)
{
    if (slot >= r->slot_count)
        return LD_EINVAL;
    if (r->states[slot] != from)
        return LD_EBUSY;
    set_state(r, slot, to);
    return 0;
}

int ring_ready(ring *r, uint32_t slot)
{
    return transition(r, slot, RING_FILLING, RING_READY);
}

int ring_copying(ring *r, uint32_t slot)
{
    return transition(r, slot, RING_FILLING, RING_COPYING);
}

int ring_copied(ring *r, uint32_t slot)
{
    return transition(r, slot, RING_COPYING, RING_READY);
}

int ring_lease(ring *r, uint32_t slot)
{
    return transition(r, slot, RING_READY, RING_LEASED);
}

int ring_release(ring *r, uint32_t slot, uint64_t generation)
{
    if (slot >= r->slot_count)
        return LD_EINVAL;
    if (r->states[slot] != RING_LEASED)
        return LD_ENOTLEASED;
    if (generation != r->generations[slot])
        return LD_ESTALE;
    set_state(r, slot, RING_FREE);
    return 0;
}

int ring_discard(ring *r, uint32_t slot)
{
    if (slot >= r->slot_count)
        return LD_EINVAL;
    if (r->states[slot] != RING_FILLING && r->states[slot] != RING_READY)
        return LD_EBUSY;
    set_state(r, slot, RING_FREE);
    return 0;
}

enum ring_state ring_state(const ring *r, uint32_t slot)
{
    return slot < r->slot_count ? (enum ring_state)__atomic_load_n(&r->states[slot], __ATOMIC_RELAXED) : RING_FREE;
}

uint64_t ring_generation(const ring *r, uint32_t slot)
{
    return slot < r->slot_count ? __atomic_load_n(&r->generations[slot], __ATOMIC_RELAXED) : 0;
}

uint32_t ring_count(const ring *r, enum ring_state state)
{
    if ((unsigned)state >= RING_STATES)
        return 0;
    return __atomic_load_n(&r->counts[state], __ATOMIC_RELAXED);
}

const char *ring_state_name(enum ring_state state)
{
    static const char *const names[RING_STATES] = {
        [RING_FREE] = "free", [RING_FILLING] = "filling", [RING_READY] = "ready", [RING_LEASED] = "leased",
        [RING_COPYING] = "copying",
    };
    return (unsigned)state < RING_STATES ? names[state] : "?";
}

/* Whether `name` is exactly "<prefix>.<pid>.<something>", with pid all decimal digits
 * without a leading zero; the pid goes to *ret_pid. */
static bool sweep_match(const char *name, const char *prefix, size_t plen, pid_t *ret_pid)
{
    if (strncmp(name, prefix, plen) != 0 || name[plen] != '.')
        return false;
    const char *p = name + plen + 1;
    if (*p < '1' || *p > '9')
        return false;
    long long pid = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        pid = pid * 10 + (*p - '0');
        if (pid > INT32_MAX)
            return false;
    }
    if (*p != '.' || p[1] == '\0')
        return false;
    *ret_pid = (pid_t)pid;
    return true;
}

struct ring_sweep_ctx {
    const char *prefix;
    size_t plen;
};

static pid_t ring_sweep_owner(const char *name, void *arg)
{
    const struct ring_sweep_ctx *ctx = arg;
    pid_t pid;
    return sweep_match(name, ctx->prefix, ctx->plen, &pid) ? pid : 0;
}

int ring_sweep(const char *prefix)
{
    if (!prefix_ok(prefix))
        return LD_EINVAL;
    struct ring_sweep_ctx ctx = {prefix, strlen(prefix)};
    return sweep_dead_owners(RING_SHM_DIR, ring_sweep_owner, &ctx, "shared memory", NULL);
}
