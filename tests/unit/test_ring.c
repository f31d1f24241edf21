/* Unit tests for the batch ring: the shared-memory object's name, mode, layout and
 * lifetime, the slot state machine (every legal and illegal transition), the /dev/shm
 * too-small error, and the sweep of objects left by dead processes. Every object these
 * tests create carries a prefix with this process's pid, and each test checks that
 * none is left behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testfs.h"

#include "ld_error.h"
#include "proto.h"
#include "ring.h"

static char prefix[64];

/* Objects in /dev/shm whose name starts with "<prefix>." */
static int count_ours(void)
{
    char start[80];
    snprintf(start, sizeof(start), "%s.", prefix);
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, start, strlen(start)) == 0;
    closedir(d);
    return n;
}

static bool shm_exists(const char *name)
{
    char path[512];
    assert_true(snprintf(path, sizeof(path), "/dev/shm%s", name) < (int)sizeof(path));
    return access(path, F_OK) == 0;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static int setup(void **state)
{
    (void)state;
    snprintf(prefix, sizeof(prefix), "ldtestring-%ld", (long)getpid());
    return 0;
}

/* Removes every object whose name contains the prefix (the sweep test also makes
 * "x<prefix>..."), so a failed test leaves nothing behind either. Returns how many. */
static int remove_ours(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    char path[512];
    while ((de = readdir(d)) != NULL)
        if (strstr(de->d_name, prefix) &&
            snprintf(path, sizeof(path), "/%s", de->d_name) < (int)sizeof(path) &&
            shm_unlink(path) == 0)
            n++;
    closedir(d);
    return n;
}

/* After each test: nothing of ours is left in /dev/shm. */
static int teardown(void **state)
{
    (void)state;
    int left = remove_ours();
    if (left != 0)
        print_error("%d shared memory object(s) left behind\n", left);
    return left == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    remove_ours();
    return 0;
}

static ring *open_ring(uint64_t stream, uint32_t slots, uint64_t bytes)
{
    ring *r = NULL;
    char err[LD_ERRMSG_MAX] = "";
    int rc = ring_open(prefix, stream, slots, bytes, 0600, &r, err);
    if (rc != 0)
        print_error("ring_open: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(r);
    return r;
}

static void test_open_close(void **state)
{
    (void)state;
    int fds = count_fds();
    ring *r = open_ring(7, 3, 1000);
    /* The fd is closed once mapped. */
    assert_int_equal(count_fds(), fds);

    /* "/<prefix>.<pid>.<stream>.<16 lowercase hex>" */
    const char *name = ring_name(r);
    char want[96];
    snprintf(want, sizeof(want), "/%s.%ld.7.", prefix, (long)getpid());
    assert_int_equal(strncmp(name, want, strlen(want)), 0);
    const char *hex = name + strlen(want);
    assert_int_equal(strlen(hex), 16);
    for (int i = 0; i < 16; i++)
        assert_non_null(strchr("0123456789abcdef", hex[i]));
    assert_true(shm_exists(name));

    /* Mode and size are what was asked, whatever the umask. */
    char path[256];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal((uint64_t)st.st_size, ring_total_size(r));
    /* Pages are committed: the blocks cover the whole object. */
    assert_true((uint64_t)st.st_blocks * 512 >= ring_total_size(r));

    /* A second ring of the same stream gets another name. */
    ring *r2 = open_ring(7, 1, 1);
    assert_string_not_equal(ring_name(r2), name);
    assert_int_equal(count_ours(), 2);

    char saved[RING_NAME_MAX];
    snprintf(saved, sizeof(saved), "%s", name);
    ring_free(r);
    assert_false(shm_exists(saved));
    ring_free(r2);
    ring_free(NULL);
    assert_int_equal(count_ours(), 0);
    assert_int_equal(count_fds(), fds);

    /* A group-readable mode is kept as given, despite a restrictive umask. */
    mode_t old = umask(077);
    ring *r3 = NULL;
    assert_int_equal(ring_open(prefix, 1, 1, 1, 0640, &r3, NULL), 0);
    umask(old);
    snprintf(path, sizeof(path), "/dev/shm%s", ring_name(r3));
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    ring_free(r3);
}

static void test_layout(void **state)
{
    (void)state;
    static const struct { uint64_t bytes, size; } cases[] = {
        {1, 4096}, {4096, 4096}, {4097, 8192}, {266000, 266240}, {1 << 20, 1 << 20},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ring *r = open_ring(100 + i, 5, cases[i].bytes);
        assert_int_equal(ring_slot_count(r), 5);
        assert_int_equal(ring_slot_size(r), cases[i].size);
        assert_int_equal(ring_slot_offset(r), LD_RING_ALIGN);
        assert_int_equal(ring_total_size(r), LD_RING_ALIGN + 5 * cases[i].size);

        /* What a client sees: map it read-only and check the header. */
        int fd = shm_open(ring_name(r), O_RDONLY, 0);
        assert_true(fd >= 0);
        const uint8_t *view = mmap(NULL, ring_total_size(r), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        assert_true(view != MAP_FAILED);
        const struct ld_ring_header *h = (const void *)view;
        assert_int_equal(h->magic, LD_RING_MAGIC);
        assert_int_equal(h->version, LD_RING_VERSION);
        assert_int_equal(h->slot_count, 5);
        assert_int_equal(h->slot_size, cases[i].size);
        assert_int_equal(h->slot_offset, LD_RING_ALIGN);
        assert_int_equal(h->total_size, ring_total_size(r));
        assert_int_equal(h->stream_id, 100 + i);

        /* Slots are where the header says, writable in full, and seen by the client. */
        uint8_t *base = (uint8_t *)ring_slot(r, 0) - LD_RING_ALIGN;
        for (uint32_t s = 0; s < 5; s++) {
            uint8_t *p = ring_slot(r, s);
            assert_ptr_equal(p, base + LD_RING_ALIGN + s * cases[i].size);
            memset(p + sizeof(struct ld_slot_header), 0x40 + (int)s,
                   cases[i].size - sizeof(struct ld_slot_header));
            assert_int_equal(view[LD_RING_ALIGN + (s + 1) * cases[i].size - 1], 0x40 + s);
        }
        assert_null(ring_slot(r, 5));
        assert_null(ring_slot(r, UINT32_MAX));

        /* The slot header's generation mirrors the ring's after acquire. */
        uint32_t slot;
        uint64_t gen;
        assert_int_equal(ring_acquire(r, &slot, &gen), 0);
        const struct ld_slot_header *sh =
            (const void *)(view + LD_RING_ALIGN + slot * cases[i].size);
        assert_int_equal(sh->generation, gen);
        munmap((void *)view, ring_total_size(r));
        ring_free(r);
    }
}

/* Everything a call may change, to prove that a failed call changed nothing. */
struct snap {
    enum ring_state st[4];          /* the tests' rings have at most 4 slots */
    uint64_t gen[4], hdr_gen[4];
    uint32_t counts[RING_STATES];
};

static struct snap take(ring *r)
{
    struct snap s;
    memset(&s, 0, sizeof(s));
    for (uint32_t i = 0; i < ring_slot_count(r); i++) {
        s.st[i] = ring_state(r, i);
        s.gen[i] = ring_generation(r, i);
        s.hdr_gen[i] = ((struct ld_slot_header *)ring_slot(r, i))->generation;
    }
    for (int st = 0; st < RING_STATES; st++)
        s.counts[st] = ring_count(r, (enum ring_state)st);
    return s;
}

static void assert_unchanged(ring *r, const struct snap *before)
{
    struct snap now = take(r);
    assert_memory_equal(&now, before, sizeof(now));
}

/* Drives slot 0 of a one-slot ring from FREE to `to` through the legal path. */
static void drive(ring *r, enum ring_state to)
{
    assert_int_equal(ring_state(r, 0), RING_FREE);
    if (to == RING_FREE)
        return;
    uint32_t slot = 99;
    uint64_t gen = 0;
    assert_int_equal(ring_acquire(r, &slot, &gen), 0);
    assert_int_equal(slot, 0);
    if (to == RING_FILLING)
        return;
    assert_int_equal(ring_copying(r, 0), 0);
    if (to == RING_COPYING)
        return;
    assert_int_equal(ring_copied(r, 0), 0);
    if (to == RING_READY)
        return;
    assert_int_equal(ring_lease(r, 0), 0);
}

/* Back to FREE from any state, through legal calls. */
static void reset(ring *r)
{
    switch (ring_state(r, 0)) {
    case RING_FREE: break;
    case RING_COPYING: assert_int_equal(ring_copied(r, 0), 0); /* fall through */
    case RING_FILLING:
    case RING_READY: assert_int_equal(ring_discard(r, 0), 0); break;
    case RING_LEASED: assert_int_equal(ring_release(r, 0, ring_generation(r, 0)), 0); break;
    }
}

enum op { OP_ACQUIRE, OP_READY, OP_LEASE, OP_RELEASE, OP_RELEASE_OLD, OP_RELEASE_NEW,
          OP_DISCARD, OP_COPYING, OP_COPIED, OP_COUNT };

static int apply(ring *r, enum op op, uint32_t slot)
{
    uint64_t g = ring_generation(r, slot < ring_slot_count(r) ? slot : 0);
    switch (op) {
    case OP_ACQUIRE: {
        uint32_t s = 77;
        uint64_t gen = 77;
        int rc = ring_acquire(r, &s, &gen);
        if (rc != 0) {
            assert_int_equal(s, 77);
            assert_int_equal(gen, 77);
        }
        return rc;
    }
    case OP_READY: return ring_ready(r, slot);
    case OP_LEASE: return ring_lease(r, slot);
    case OP_RELEASE: return ring_release(r, slot, g);
    case OP_RELEASE_OLD: return ring_release(r, slot, g - 1);
    case OP_RELEASE_NEW: return ring_release(r, slot, g + 1);
    case OP_DISCARD: return ring_discard(r, slot);
    case OP_COPYING: return ring_copying(r, slot);
    case OP_COPIED: return ring_copied(r, slot);
    case OP_COUNT: break;
    }
    fail();
    return 0;
}

static void test_state_machine(void **state)
{
    (void)state;
    /* expect[from][op]: the documented result; on success, the state reached. */
    static const struct { int rc; enum ring_state to; } expect[RING_STATES][OP_COUNT] = {
        [RING_FREE] = {
            [OP_ACQUIRE] = {0, RING_FILLING}, [OP_READY] = {LD_EBUSY, 0},
            [OP_LEASE] = {LD_EBUSY, 0}, [OP_RELEASE] = {LD_ENOTLEASED, 0},
            [OP_RELEASE_OLD] = {LD_ENOTLEASED, 0}, [OP_RELEASE_NEW] = {LD_ENOTLEASED, 0},
            [OP_DISCARD] = {LD_EBUSY, 0}, [OP_COPYING] = {LD_EBUSY, 0}, [OP_COPIED] = {LD_EBUSY, 0},
        },
        [RING_FILLING] = {
            [OP_ACQUIRE] = {LD_EAGAIN, 0}, [OP_READY] = {0, RING_READY},
            [OP_LEASE] = {LD_EBUSY, 0}, [OP_RELEASE] = {LD_ENOTLEASED, 0},
            [OP_RELEASE_OLD] = {LD_ENOTLEASED, 0}, [OP_RELEASE_NEW] = {LD_ENOTLEASED, 0},
            [OP_DISCARD] = {0, RING_FREE}, [OP_COPYING] = {0, RING_COPYING}, [OP_COPIED] = {LD_EBUSY, 0},
        },
        [RING_READY] = {
            [OP_ACQUIRE] = {LD_EAGAIN, 0}, [OP_READY] = {LD_EBUSY, 0},
            [OP_LEASE] = {0, RING_LEASED}, [OP_RELEASE] = {LD_ENOTLEASED, 0},
            [OP_RELEASE_OLD] = {LD_ENOTLEASED, 0}, [OP_RELEASE_NEW] = {LD_ENOTLEASED, 0},
            [OP_DISCARD] = {0, RING_FREE}, [OP_COPYING] = {LD_EBUSY, 0}, [OP_COPIED] = {LD_EBUSY, 0},
        },
        [RING_LEASED] = {
            [OP_ACQUIRE] = {LD_EAGAIN, 0}, [OP_READY] = {LD_EBUSY, 0},
            [OP_LEASE] = {LD_EBUSY, 0}, [OP_RELEASE] = {0, RING_FREE},
            [OP_RELEASE_OLD] = {LD_ESTALE, 0}, [OP_RELEASE_NEW] = {LD_ESTALE, 0},
            [OP_DISCARD] = {LD_EBUSY, 0}, [OP_COPYING] = {LD_EBUSY, 0}, [OP_COPIED] = {LD_EBUSY, 0},
        },
        /* The copy engine reads the slot: only the copy's end moves it. */
        [RING_COPYING] = {
            [OP_ACQUIRE] = {LD_EAGAIN, 0}, [OP_READY] = {LD_EBUSY, 0},
            [OP_LEASE] = {LD_EBUSY, 0}, [OP_RELEASE] = {LD_ENOTLEASED, 0},
            [OP_RELEASE_OLD] = {LD_ENOTLEASED, 0}, [OP_RELEASE_NEW] = {LD_ENOTLEASED, 0},
            [OP_DISCARD] = {LD_EBUSY, 0}, [OP_COPYING] = {LD_EBUSY, 0}, [OP_COPIED] = {0, RING_READY},
        },
    };
    ring *r = open_ring(1, 1, 64);
    int legal = 0;
    for (int from = 0; from < RING_STATES; from++)
        for (int op = 0; op < OP_COUNT; op++) {
            drive(r, (enum ring_state)from);
            assert_int_equal(ring_state(r, 0), from);
            struct snap before = take(r);
            int rc = apply(r, (enum op)op, 0);
            assert_int_equal(rc, expect[from][op].rc);
            if (rc != 0) {
                assert_unchanged(r, &before);
            } else {
                legal++;
                assert_int_equal(ring_state(r, 0), expect[from][op].to);
                assert_int_equal(ring_count(r, expect[from][op].to), 1);
                /* Only acquire moves the generation. */
                assert_int_equal(ring_generation(r, 0), before.gen[0] + (op == OP_ACQUIRE));
            }
            /* Slots out of range: LD_EINVAL from every call that names a slot. */
            if (op != OP_ACQUIRE) {
                struct snap mid = take(r);
                assert_int_equal(apply(r, (enum op)op, 1), LD_EINVAL);
                assert_int_equal(apply(r, (enum op)op, UINT32_MAX), LD_EINVAL);
                assert_unchanged(r, &mid);
            }
            reset(r);
        }
    /* FREE-acquire, FILLING-ready, FILLING-discard, FILLING-copying, READY-lease,
     * READY-discard, LEASED-release, COPYING-copied. */
    assert_int_equal(legal, 8);
    ring_free(r);
}

/* The cycle many times over one slot: generations count acquisitions. */
static void test_full_cycle_and_generations(void **state)
{
    (void)state;
    ring *r = open_ring(2, 1, 64);
    struct ld_slot_header *sh = ring_slot(r, 0);
    assert_int_equal(ring_generation(r, 0), 0);
    for (uint64_t round = 1; round <= 5; round++) {
        uint32_t slot;
        uint64_t gen;
        assert_int_equal(ring_acquire(r, &slot, &gen), 0);
        assert_int_equal(slot, 0);
        assert_int_equal(gen, round);
        assert_int_equal(ring_generation(r, 0), round);
        assert_int_equal(sh->generation, round);
        assert_int_equal(ring_ready(r, 0), 0);
        assert_int_equal(ring_lease(r, 0), 0);
        /* A client quoting last round's generation is stale. */
        if (round > 1)
            assert_int_equal(ring_release(r, 0, round - 1), LD_ESTALE);
        assert_int_equal(ring_state(r, 0), RING_LEASED);
        assert_int_equal(ring_release(r, 0, round), 0);
        /* A second release of the same lease: no longer leased. */
        assert_int_equal(ring_release(r, 0, round), LD_ENOTLEASED);
    }
    ring_free(r);
}

/* Each state's name as status, streams and metrics print it; a value outside the enum
 * gets "?", never a read past the table. */
static void test_state_names(void **state)
{
    (void)state;
    static const char *const want[RING_STATES] = {"free", "filling", "ready", "leased", "copying"};
    for (int st = 0; st < RING_STATES; st++)
        assert_string_equal(ring_state_name((enum ring_state)st), want[st]);
    assert_string_equal(ring_state_name((enum ring_state)RING_STATES), "?");
    assert_string_equal(ring_state_name((enum ring_state)-1), "?");
}

static void test_full_ring_and_counts(void **state)
{
    (void)state;
    enum { S = 4 };
    ring *r = open_ring(3, S, 100);
    assert_int_equal(ring_count(r, RING_FREE), S);
    uint32_t slots[S];
    uint64_t gens[S];
    bool seen[S] = {false};
    for (int i = 0; i < S; i++) {
        assert_int_equal(ring_acquire(r, &slots[i], &gens[i]), 0);
        assert_true(slots[i] < S);
        assert_false(seen[slots[i]]);
        seen[slots[i]] = true;
        assert_int_equal(gens[i], 1);
        assert_int_equal(ring_count(r, RING_FILLING), i + 1);
        assert_int_equal(ring_count(r, RING_FREE), S - i - 1);
    }
    struct snap before = take(r);
    uint32_t s = 1234;
    uint64_t g = 5678;
    assert_int_equal(ring_acquire(r, &s, &g), LD_EAGAIN);
    assert_int_equal(s, 1234);
    assert_int_equal(g, 5678);
    assert_unchanged(r, &before);

    /* One slot in each state. */
    assert_int_equal(ring_ready(r, slots[1]), 0);
    assert_int_equal(ring_ready(r, slots[2]), 0);
    assert_int_equal(ring_lease(r, slots[2]), 0);
    assert_int_equal(ring_ready(r, slots[3]), 0);
    assert_int_equal(ring_lease(r, slots[3]), 0);
    assert_int_equal(ring_release(r, slots[3], gens[3]), 0);
    assert_int_equal(ring_count(r, RING_FREE), 1);
    assert_int_equal(ring_count(r, RING_FILLING), 1);
    assert_int_equal(ring_count(r, RING_READY), 1);
    assert_int_equal(ring_count(r, RING_LEASED), 1);
    assert_int_equal(ring_state(r, slots[0]), RING_FILLING);
    assert_int_equal(ring_state(r, slots[1]), RING_READY);
    assert_int_equal(ring_state(r, slots[2]), RING_LEASED);
    assert_int_equal(ring_state(r, slots[3]), RING_FREE);
    assert_int_equal(ring_count(r, (enum ring_state)9), 0);

    /* The only FREE slot is the one acquired next, with its generation bumped. */
    uint32_t got;
    uint64_t gen;
    assert_int_equal(ring_acquire(r, &got, &gen), 0);
    assert_int_equal(got, slots[3]);
    assert_int_equal(gen, 2);
    assert_int_equal(ring_acquire(r, NULL, NULL), LD_EAGAIN);

    /* Teardown: discard what is FILLING or READY, release what is LEASED. */
    for (uint32_t i = 0; i < S; i++) {
        if (ring_state(r, i) == RING_LEASED)
            assert_int_equal(ring_release(r, i, ring_generation(r, i)), 0);
        else
            assert_int_equal(ring_discard(r, i), 0);
    }
    assert_int_equal(ring_count(r, RING_FREE), S);
    ring_free(r);
}

static void test_unlink(void **state)
{
    (void)state;
    ring *r = open_ring(4, 2, 4096);
    char name[RING_NAME_MAX];
    snprintf(name, sizeof(name), "%s", ring_name(r));
    assert_true(shm_exists(name));
    assert_int_equal(ring_unlink(r), 0);
    assert_false(shm_exists(name));
    assert_int_equal(ring_unlink(r), 0); /* idempotent */
    /* The mapping outlives the name. */
    memset(ring_slot(r, 1), 0x5a, 4096);
    uint32_t s;
    uint64_t g;
    assert_int_equal(ring_acquire(r, &s, &g), 0);
    ring_free(r);
    assert_int_equal(count_ours(), 0);
}

static void test_shm_too_small(void **state)
{
    (void)state;
    struct statvfs sv;
    assert_int_equal(statvfs("/dev/shm", &sv), 0);
    if (sv.f_blocks == 0) {
        /* An unlimited tmpfs would really try to allocate: nothing to test safely. */
        skip();
    }
    /* Larger than the whole file system, not only its free space: tmpfs refuses that
     * up front, without allocating a page first. */
    uint64_t fs_size = (uint64_t)sv.f_blocks * sv.f_frsize;
    uint64_t want = fs_size + (UINT64_C(1) << 30);
    int fds = count_fds();
    ring *r = (ring *)0x1;
    char err[LD_ERRMSG_MAX] = "";
    assert_int_equal(ring_open(prefix, 3, 1, want, 0600, &r, err), LD_ENOSPC);
    assert_ptr_equal(r, (ring *)0x1);
    print_message("message: %s\n", err);
    assert_non_null(strstr(err, "/dev/shm"));
    assert_non_null(strstr(err, "stream 3"));
    assert_non_null(strstr(err, "free: "));
    assert_non_null(strstr(err, "--shm-size"));
    /* The size asked for (header page + the slot rounded up), in GiB with one decimal. */
    uint64_t total = LD_RING_ALIGN + (want + LD_RING_ALIGN - 1) / LD_RING_ALIGN * LD_RING_ALIGN;
    if (total < (UINT64_C(1) << 40)) {
        char size[48];
        snprintf(size, sizeof(size), "cannot commit %.1f GiB ", (double)total / (1 << 30));
        assert_non_null(strstr(err, size));
    }
    assert_int_equal(count_ours(), 0);
    assert_int_equal(count_fds(), fds);
}

static void test_bad_params(void **state)
{
    (void)state;
    ring *r = (ring *)0x1;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(ring_open(prefix, 1, 0, 4096, 0600, &r, err), LD_EINVAL);
    assert_int_equal(ring_open(prefix, 1, 1, 0, 0600, &r, err), LD_EINVAL);
    assert_int_equal(ring_open(NULL, 1, 1, 4096, 0600, &r, err), LD_EINVAL);
    assert_int_equal(ring_open("", 1, 1, 4096, 0600, &r, err), LD_EINVAL);
    assert_int_equal(ring_open("a/b", 1, 1, 4096, 0600, &r, err), LD_EINVAL);
    assert_int_equal(ring_open(prefix, 1, 1, 4096, 01777, &r, err), LD_EINVAL);
    assert_int_equal(ring_open(prefix, 1, 1, 4096, 0600, NULL, err), LD_EINVAL);
    /* Sizes that overflow. */
    assert_int_equal(ring_open(prefix, 1, 1, UINT64_MAX, 0600, &r, err), LD_ERANGE);
    assert_int_equal(ring_open(prefix, 1, UINT32_MAX, UINT64_C(1) << 40, 0600, &r, err),
                     LD_ERANGE);
    /* A prefix so long the name cannot fit. */
    char longp[RING_NAME_MAX];
    memset(longp, 'p', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_true(ring_open(longp, 1, 1, 4096, 0600, &r, err) < 0);
    assert_ptr_equal(r, (ring *)0x1);
    assert_int_equal(count_ours(), 0);
}

/* Bytes of the ring's object that have pages (st_blocks). */
static uint64_t committed_bytes(ring *r)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm%s", ring_name(r));
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

/* ring_open_partial commits the header and the first slots only; acquire hands out
 * those alone; ring_commit adds the others, and then every slot is handed out. */
static void test_partial_commit(void **state)
{
    (void)state;
    const uint64_t slot = UINT64_C(1) << 20;
    ring *r = NULL;
    char err[LD_ERRMSG_MAX] = "";
    int fds = count_fds();
    assert_int_equal(ring_open_partial(prefix, 4, 6, slot, 0600, 2, &r, err), 0);
    assert_int_equal(ring_committed(r), 2);
    assert_int_equal(committed_bytes(r), LD_RING_ALIGN + 2 * slot);
    assert_int_equal(count_fds(), fds + 1); /* kept for the later commits */
    uint32_t s;
    uint64_t gen;
    assert_int_equal(ring_acquire(r, &s, &gen), 0);
    assert_int_equal(s, 0);
    assert_int_equal(ring_acquire(r, &s, &gen), 0);
    assert_int_equal(s, 1);
    assert_int_equal(ring_acquire(r, &s, &gen), LD_EAGAIN); /* free, but not committed */
    assert_int_equal(ring_count(r, RING_FREE), 4);

    assert_int_equal(ring_commit(r, 4, err), 0);
    assert_int_equal(ring_committed(r), 4);
    assert_int_equal(committed_bytes(r), LD_RING_ALIGN + 4 * slot);
    assert_int_equal(ring_acquire(r, &s, &gen), 0);
    assert_int_equal(s, 2);
    assert_int_equal(ring_commit(r, 99, err), 0); /* clamped to the slot count */
    assert_int_equal(ring_committed(r), 6);
    assert_int_equal(committed_bytes(r), ring_total_size(r));
    assert_int_equal(count_fds(), fds); /* every slot committed: the descriptor is closed */
    assert_int_equal(ring_acquire(r, &s, &gen), 0);
    assert_int_equal(s, 3);
    assert_int_equal(ring_commit(r, 6, err), 0); /* nothing left: a no-op */
    /* The written pages are the object's: write a slot handed out late. */
    memset(ring_slot(r, 5), 0xab, (size_t)slot);
    ring_free(r);
    assert_int_equal(count_ours(), 0);
    assert_int_equal(count_fds(), fds);

    /* No slot at all is refused; more than the count means all. */
    assert_int_equal(ring_open_partial(prefix, 4, 2, 4096, 0600, 0, &r, err), LD_EINVAL);
    assert_int_equal(ring_open_partial(prefix, 4, 2, 4096, 0600, 7, &r, err), 0);
    assert_int_equal(ring_committed(r), 2);
    ring_free(r);
    assert_int_equal(count_ours(), 0);
}

/* A partial ring that could never fit is refused at open all the same. */
static void test_partial_too_large(void **state)
{
    (void)state;
    struct statvfs sv;
    assert_int_equal(statvfs("/dev/shm", &sv), 0);
    if (sv.f_blocks == 0)
        skip();
    uint64_t fs_size = (uint64_t)sv.f_blocks * sv.f_frsize;
    ring *r = (ring *)0x1;
    char err[LD_ERRMSG_MAX] = "";
    /* 4 slots of a quarter of the file system each, plus a GiB: one fits, four do not. */
    uint64_t slot = fs_size / 4 + (UINT64_C(1) << 30);
    assert_int_equal(ring_open_partial(prefix, 5, 4, slot, 0600, 1, &r, err), LD_ENOSPC);
    assert_ptr_equal(r, (ring *)0x1);
    assert_non_null(strstr(err, "/dev/shm"));
    assert_non_null(strstr(err, "stream 5"));
    assert_int_equal(count_ours(), 0);
}

/* Creates /dev/shm/<name> (name without the leading slash). */
static void make_obj(const char *name)
{
    char path[512];
    assert_true(snprintf(path, sizeof(path), "/%s", name) < (int)sizeof(path));
    int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    close(fd);
}

static void test_sweep(void **state)
{
    (void)state;
    long dead = (long)testfs_dead_pid(), self = (long)getpid();

    char names[8][160];
    snprintf(names[0], sizeof(names[0]), "%s.%ld.1.x", prefix, dead);       /* swept */
    snprintf(names[1], sizeof(names[1]), "%s.%ld.1.x", prefix, self);       /* alive */
    snprintf(names[2], sizeof(names[2]), "%s.%ld", prefix, dead);           /* no tail */
    snprintf(names[3], sizeof(names[3]), "%s.%ld.", prefix, dead);          /* empty tail */
    snprintf(names[4], sizeof(names[4]), "%sX.%ld.1.x", prefix, dead);      /* other prefix */
    snprintf(names[5], sizeof(names[5]), "%s.%ldz.1.x", prefix, dead);      /* not a pid */
    snprintf(names[6], sizeof(names[6]), "%s.0%ld.1.x", prefix, dead);      /* leading 0 */
    snprintf(names[7], sizeof(names[7]), "x%s.%ld.1.x", prefix, dead);      /* prefix inside */
    for (int i = 0; i < 8; i++)
        make_obj(names[i]);
    /* And a real ring of this live process. */
    ring *r = open_ring(9, 1, 64);

    assert_int_equal(ring_sweep(prefix), 1);
    char path[512];
    for (int i = 0; i < 8; i++) {
        assert_true(snprintf(path, sizeof(path), "/%s", names[i]) < (int)sizeof(path));
        assert_int_equal(shm_exists(path), i != 0);
    }
    assert_true(shm_exists(ring_name(r)));
    /* Nothing more to sweep. */
    assert_int_equal(ring_sweep(prefix), 0);

    for (int i = 1; i < 8; i++) {
        assert_true(snprintf(path, sizeof(path), "/%s", names[i]) < (int)sizeof(path));
        assert_int_equal(shm_unlink(path), 0);
    }
    ring_free(r);

    assert_int_equal(ring_sweep(NULL), LD_EINVAL);
    assert_int_equal(ring_sweep(""), LD_EINVAL);
    assert_int_equal(ring_sweep("a/b"), LD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_open_close, teardown),
        cmocka_unit_test_teardown(test_layout, teardown),
        cmocka_unit_test_teardown(test_state_machine, teardown),
        cmocka_unit_test_teardown(test_full_cycle_and_generations, teardown),
        cmocka_unit_test_teardown(test_full_ring_and_counts, teardown),
        cmocka_unit_test(test_state_names),
        cmocka_unit_test_teardown(test_unlink, teardown),
        cmocka_unit_test_teardown(test_shm_too_small, teardown),
        cmocka_unit_test_teardown(test_partial_commit, teardown),
        cmocka_unit_test_teardown(test_partial_too_large, teardown),
        cmocka_unit_test_teardown(test_bad_params, teardown),
        cmocka_unit_test_teardown(test_sweep, teardown),
    };
    return cmocka_run_group_tests(tests, setup, group_teardown);
}
