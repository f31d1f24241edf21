/* itest_client — libloaderclient against a real loaderd, and against a scripted fake
 * daemon for the failures a healthy loaderd never produces (a reply out of order, a ring
 * header that does not match, a hang-up, a reply that comes late).
 *
 * Against loaderd: connecting and hello, the datasets list, open errors, one epoch that
 * delivers every sample exactly once with the right bytes and labels (fixed and ragged
 * fields), release semantics, next timing out while the trainer holds every slot and
 * picking its batch up afterwards, and that closing streams and clients leaves no
 * shared-memory object and no descriptor behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"
#include "proto.h"

#define N_FILES 1000
#define FILE_SIZE 256
#define N_CLASSES 10
#define N_VARIED 300
#define VARIED_SIZE 200

static const char datasets_yaml[] = "  records:\n"
                                    "    kind: files\n"
                                    "    path: rec\n"
                                    "  varied:\n"
                                    "    kind: files\n"
                                    "    path: var\n";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int setup_daemon(void **state)
{
    struct harness *h = harness_new();
    harness_gen_files(h, "rec", N_FILES, FILE_SIZE, N_CLASSES, false);
    harness_gen_files(h, "var", N_VARIED, VARIED_SIZE, 0, true);
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

/* A directory only, for the tests that need no loaderd (the fake daemon's socket). */
static int setup_dir(void **state)
{
    *state = harness_new();
    return 0;
}

/* ---- without a daemon ------------------------------------------------------------------ */

static void test_connect_missing_socket(void **state)
{
    struct harness *h = *state;
    char err[512], path[200];
    lc_client *c = (lc_client *)(uintptr_t)0x1; /* must stay untouched */
    snprintf(path, sizeof path, "%s/nobody.sock", h->dir);
    int r = lc_connect(path, 1000, "t", &c, err, sizeof err);
    assert_int_equal(r, LC_ENOENT);
    assert_ptr_equal(c, (lc_client *)(uintptr_t)0x1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file or directory"));
    assert_non_null(strstr(err, "is loaderd running?"));

    char longpath[300];
    memset(longpath, 'x', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = '\0';
    r = lc_connect(longpath, 1000, "t", &c, err, sizeof err);
    assert_int_equal(r, LC_EINVAL);
    assert_non_null(strstr(err, "socket path too long (299 bytes, max 107)"));

    /* A NULL errbuf is allowed. */
    assert_int_equal(lc_connect(path, 1000, "t", &c, NULL, 0), LC_ENOENT);
}

static void test_default_socket(void **state)
{
    (void)state;
    char *saved_sock = getenv("LOADERD_SOCKET") ? strdup(getenv("LOADERD_SOCKET")) : NULL;
    char *saved_xdg = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
    setenv("LOADERD_SOCKET", "/x/y.sock", 1);
    assert_string_equal(lc_default_socket(), "/x/y.sock");
    unsetenv("LOADERD_SOCKET");
    /* XDG_RUNTIME_DIR only when it is absolute, ours and 0700 (the daemon uses the same
     * function: proto_socket_default). */
    char xdg[] = "/tmp/ld-itest-xdg-XXXXXX", want[64];
    assert_non_null(mkdtemp(xdg));
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    snprintf(want, sizeof want, "%s/loaderd.sock", xdg);
    assert_string_equal(lc_default_socket(), want);
    snprintf(want, sizeof want, "/tmp/loaderd-%u/loaderd.sock", (unsigned)getuid());
    assert_int_equal(chmod(xdg, 0755), 0); /* others could plant a socket there */
    assert_string_equal(lc_default_socket(), want);
    rmdir(xdg);
    setenv("XDG_RUNTIME_DIR", "run/user", 1); /* relative: ignored, as the XDG spec asks */
    assert_string_equal(lc_default_socket(), want);
    unsetenv("XDG_RUNTIME_DIR");
    assert_string_equal(lc_default_socket(), want);
    if (saved_sock)
        setenv("LOADERD_SOCKET", saved_sock, 1);
    if (saved_xdg)
        setenv("XDG_RUNTIME_DIR", saved_xdg, 1);
    free(saved_sock);
    free(saved_xdg);
    assert_string_equal(lc_strerror(LC_ENODATASET), "no such dataset");
    /* One version: the Makefile passes VERSION's to every part. */
    assert_string_equal(lc_version(), LD_VERSION);
    assert_int_equal(lc_version_number(), LD_VERSION_NUMBER);
}

/* The error table and the limits the library hands out are the daemon's, by
 * construction (one list each); these check that every entry is reachable by code and
 * by name and that nothing past the ends is. */
static void test_error_table_and_limits(void **state)
{
    int n = 0;
#define COUNT_CODE(name, value, wire, msg) n++;
    LD_ERROR_MAP(COUNT_CODE)
#undef COUNT_CODE
    for (int i = 0; i < n; i++) {
        int code = lc_error_code(i);
        assert_true(code < 0);
        assert_int_equal(ld_error_from_name(lc_error_name(code)), code);
        assert_string_equal(lc_strerror(code), ld_strerror(code));
        assert_string_not_equal(lc_error_name(code), "unknown_error");
    }
    assert_int_equal(lc_error_code(n), 0);
    assert_int_equal(lc_error_code(-1), 0);
    assert_string_equal(lc_error_name(0), "ok");
    assert_string_equal(lc_error_name(-4999), "unknown_error");
    assert_string_equal(lc_error_name(LC_ENODATASET), "no_such_dataset");
    assert_int_equal(LC_ECACHEVERSION, LD_ECACHEVERSION);

    assert_int_equal(lc_limit("batch_size_max"), LD_BATCH_SIZE_MAX);
    assert_int_equal(lc_limit("world_size_max"), LD_WORLD_SIZE_MAX);
    assert_int_equal(lc_limit("prefetch_max"), LD_PREFETCH_MAX);
    assert_int_equal(lc_limit("workers_max"), LD_WORKERS_MAX);
    assert_int_equal(lc_limit("slot_count_max"), LD_SLOT_COUNT_MAX);
    assert_int_equal(lc_limit("shm_name_max"), LD_SHM_NAME_MAX);
    assert_int_equal(lc_limit("op_name_max"), LD_OP_NAME_MAX);
    assert_int_equal(lc_limit("epoch_max"), LD_EPOCH_MAX);
    assert_int_equal(lc_limit("nope"), LC_EINVAL);
    assert_int_equal(lc_limit(NULL), LC_EINVAL);
    int nl = 0;
    for (; lc_limit_name(nl); nl++)
        assert_true(lc_limit(lc_limit_name(nl)) > 0);
    assert_int_equal(nl, 13);
    assert_null(lc_limit_name(-1));
}

/* lc_stream_options and lc_field can grow: a trainer built against an older or newer
 * header works as long as it asks for nothing the library does not know. */
static void test_versioned_structs(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream *s = NULL;
    /* A newer header's struct: ours plus members this library does not know. */
    struct {
        lc_stream_options o;
        uint64_t device;
    } newer;
    memset(&newer, 0, sizeof newer);
    lc_stream_options_init(&newer.o);
    newer.o.struct_size = sizeof newer;
    newer.o.batch_size = 16;
    newer.o.epochs = 1;
    newer.device = 3;
    assert_int_equal(lc_stream_open(c, "records", &newer.o, &s), LC_ENOTSUP);
    assert_non_null(strstr(lc_client_error(c), "does not know"));
    assert_null(s);
    newer.device = 0; /* unknown members left at zero are their defaults */
    assert_int_equal(lc_stream_open(c, "records", &newer.o, &s), 0);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 0, &b), 0);
    struct {
        lc_field f;
        uint64_t device_ptr;
    } big;
    memset(&big, 0xff, sizeof big);
    assert_int_equal(lc_batch_field_sized(b, 0, &big.f, sizeof big), 0);
    assert_string_equal(big.f.name, "data");
    assert_int_equal(big.device_ptr, 0); /* zeroed: the library has no such member */
    lc_field small;
    assert_int_equal(lc_batch_field_sized(b, 0, &small, offsetof(lc_field, offsets)), LC_EINVAL);
    assert_int_equal(lc_batch_field_by_name(b, "label", &small), 0);
    assert_int_equal(small.dtype, LC_DTYPE_INT64);
    assert_int_equal(lc_batch_release(b), 0);
    assert_int_equal(lc_stream_close(s), 0);
    s = NULL;

    /* An older or uninitialised struct: refused, with the way out in the message. */
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.struct_size = 8;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EINVAL);
    assert_non_null(strstr(lc_client_error(c), "lc_stream_options_init"));
    assert_null(s);

    /* Over a limit: the daemon refuses with the limit the library reports. */
    lc_stream_options_init(&o);
    o.batch_size = (uint32_t)lc_limit("batch_size_max") + 1;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EFIELD);
    char want[64];
    snprintf(want, sizeof want, "[1, %lld]", (long long)lc_limit("batch_size_max"));
    assert_non_null(strstr(lc_client_error(c), want));
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.prefetch = (uint32_t)lc_limit("prefetch_max") + 1;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EFIELD);
    snprintf(want, sizeof want, "[1, %lld]", (long long)lc_limit("prefetch_max"));
    assert_non_null(strstr(lc_client_error(c), want));
    lc_client_close(c);
}

/* Saves and restores the environment variables the socket resolution reads. */
struct saved_env {
    char *sock, *config;
};

static void env_save(struct saved_env *e)
{
    e->sock = getenv("LOADERD_SOCKET") ? strdup(getenv("LOADERD_SOCKET")) : NULL;
    e->config = getenv("LOADERD_CONFIG") ? strdup(getenv("LOADERD_CONFIG")) : NULL;
    unsetenv("LOADERD_SOCKET");
    unsetenv("LOADERD_CONFIG");
}

static void env_restore(struct saved_env *e)
{
    if (e->sock)
        setenv("LOADERD_SOCKET", e->sock, 1);
    else
        unsetenv("LOADERD_SOCKET");
    if (e->config)
        setenv("LOADERD_CONFIG", e->config, 1);
    else
        unsetenv("LOADERD_CONFIG");
    free(e->sock);
    free(e->config);
}

/* Resolves with (socket, config) and expects `code`; on success the path `want`, on
 * failure a message containing `want`. */
static void expect_resolve(const char *sock, const char *config, int code, const char *want)
{
    char buf[PATH_MAX], err[1024];
    int r = lc_socket_resolve(sock, config, buf, sizeof buf, err, sizeof err);
    if (r != code)
        fail_msg("lc_socket_resolve(%s, %s) = %d (%s), expected %d", sock ? sock : "NULL",
                 config ? config : "NULL", r, r < 0 ? err : buf, code);
    if (code == 0)
        assert_string_equal(buf, want);
    else if (!strstr(err, want))
        fail_msg("message '%s' does not contain '%s'", err, want);
}

/* Where a client connects: explicit socket > explicit config (--config) >
 * LOADERD_SOCKET > LOADERD_CONFIG > the default (flags before the environment); a
 * config that names no usable socket is an error naming FILE:LINE:COLUMN, never a
 * silent fall back. */
static void test_socket_resolution(void **state)
{
    struct harness *h = *state;
    struct saved_env env;
    char good[PATH_MAX], other[PATH_MAX], path[PATH_MAX], want[PATH_MAX + 64];
    env_save(&env);
    static const char good_yaml[] = "server:\n  workers: 2\n  socket: /run/ld/a.sock\n";
    static const char other_yaml[] = "server: {socket: /run/ld/b.sock}\n";
    harness_write_file(h, "good.yaml", good_yaml, strlen(good_yaml));
    harness_write_file(h, "other.yaml", other_yaml, strlen(other_yaml));
    snprintf(good, sizeof good, "%s/good.yaml", h->dir);
    snprintf(other, sizeof other, "%s/other.yaml", h->dir);

    /* 1. An explicit socket beats everything. */
    setenv("LOADERD_SOCKET", "/env.sock", 1);
    setenv("LOADERD_CONFIG", other, 1);
    expect_resolve("/explicit.sock", good, 0, "/explicit.sock");
    /* 2. An explicit config (--config) beats the environment, LOADERD_SOCKET included. */
    expect_resolve(NULL, good, 0, "/run/ld/a.sock");
    /* 3. LOADERD_SOCKET beats LOADERD_CONFIG. */
    expect_resolve(NULL, NULL, 0, "/env.sock");
    /* 4. LOADERD_CONFIG alone. */
    unsetenv("LOADERD_SOCKET");
    expect_resolve(NULL, good, 0, "/run/ld/a.sock");
    expect_resolve(NULL, NULL, 0, "/run/ld/b.sock");
    char buf[PATH_MAX], err[1024];
    assert_int_equal(lc_socket_from_config(good, buf, sizeof buf, err, sizeof err), 0);
    assert_string_equal(buf, "/run/ld/a.sock");
    /* 5. Nothing given: the daemon's default. */
    unsetenv("LOADERD_CONFIG");
    expect_resolve(NULL, NULL, 0, lc_default_socket());
    setenv("LOADERD_CONFIG", "", 1); /* empty: unset */
    expect_resolve(NULL, NULL, 0, lc_default_socket());

    /* Configs that name no usable socket: FILE:LINE:COLUMN and what is wrong. */
    static const struct {
        const char *name, *text, *msg;
        int code;
    } bad[] = {
        {"nosock.yaml", "server:\n  workers: 2\n", "nosock.yaml:2:3: no server.socket", LC_ECONFIG},
        {"noserver.yaml", "datasets: {}\n", "noserver.yaml:1:1: no server.socket", LC_ECONFIG},
        {"list.yaml", "server:\n  socket: [a]\n", "list.yaml:2:11: server.socket: expected a socket path, got a sequence",
         LC_ECONFIG},
        {"empty.yaml", "server:\n  socket: ''\n", "empty.yaml:2:11: server.socket: expected a socket path, got an "
         "empty string", LC_ECONFIG},
        {"rel.yaml", "server:\n  socket: run/x.sock\n", "rel.yaml:2:11: server.socket 'run/x.sock' is a relative path",
         LC_ECONFIG},
        {"twice.yaml", "server:\n  socket: /a\n  socket: /b\n", "twice.yaml:3:3: 'socket' appears twice", LC_ECONFIG},
        {"server.yaml", "server: 3\n", "server.yaml:1:9: server: expected a mapping", LC_ECONFIG},
        {"syntax.yaml", "server:\n  socket: [\n", "syntax.yaml:3:1: not valid YAML", LC_ECONFIG},
        {"scalar.yaml", "just text\n", "scalar.yaml:1:1: not a loaderd config", LC_ECONFIG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        harness_write_file(h, bad[i].name, bad[i].text, strlen(bad[i].text));
        snprintf(path, sizeof path, "%s/%s", h->dir, bad[i].name);
        snprintf(want, sizeof want, "%s/%s", h->dir, bad[i].msg);
        expect_resolve(NULL, path, bad[i].code, want);
    }
    char longcfg[300];
    int n = snprintf(longcfg, sizeof longcfg, "server:\n  socket: /%0150d\n", 0);
    harness_write_file(h, "long.yaml", longcfg, (size_t)n);
    snprintf(path, sizeof path, "%s/long.yaml", h->dir);
    expect_resolve(NULL, path, LC_ECONFIG, "long.yaml:2:11: server.socket: the path is 151 bytes long");
    snprintf(path, sizeof path, "%s/missing.yaml", h->dir);
    expect_resolve(NULL, path, LC_ENOENT, "missing.yaml: cannot open loaderd's config");

    /* lc_connect without a path takes the same road, and says why it cannot. */
    snprintf(path, sizeof path, "%s/nosock.yaml", h->dir);
    setenv("LOADERD_CONFIG", path, 1);
    lc_client *c = NULL;
    assert_int_equal(lc_connect(NULL, 1000, "t", &c, err, sizeof err), LC_ECONFIG);
    assert_null(c);
    assert_non_null(strstr(err, "nosock.yaml:2:3: no server.socket"));
    env_restore(&env);
}

/* The daemon's own config file finds the daemon. */
static void test_connect_from_config(void **state)
{
    struct harness *h = *state;
    struct saved_env env;
    char err[1024], *reply = NULL;
    lc_client *c = NULL;
    env_save(&env);
    setenv("LOADERD_CONFIG", h->config, 1);
    int r = lc_connect(NULL, 5000, "itest_client", &c, err, sizeof err);
    if (r < 0)
        fail_msg("lc_connect through LOADERD_CONFIG: %s", err);
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), 0);
    lc_free(reply);
    lc_client_close(c);
    env_restore(&env);
}

/* The layout calls hand out what the library checked: a private mapping of the ring's
 * descriptor, read at their offsets, shows exactly the library's views. */
static void check_layout_matches(lc_stream *s, lc_batch *b, const uint8_t *mine)
{
    lc_batch_info bi;
    assert_int_equal(lc_batch_describe(b, &bi), 0);
    assert_int_equal(bi.slot, lc_batch_slot(b));
    assert_int_equal(bi.rows, lc_batch_rows(b));
    assert_int_equal(bi.generation, lc_batch_generation(b));
    assert_int_equal(bi.epoch, lc_batch_epoch(b));
    assert_int_equal(bi.index, lc_batch_index(b));
    assert_int_equal((int64_t)bi.slot_offset, lc_stream_slot_offset(s, bi.slot));
    size_t ring_size = 0;
    const uint8_t *ring = lc_stream_ring(s, &ring_size);
    const uint8_t *slot = mine + bi.slot_offset;
    for (int i = 0; i < lc_batch_field_count(b); i++) {
        lc_field f;
        lc_field_layout l;
        assert_int_equal(lc_batch_field(b, i, &f), 0);
        assert_int_equal(lc_stream_field_layout(s, i, &l), 0);
        assert_string_equal(l.name, f.name);
        assert_int_equal(l.dtype, f.dtype);
        assert_ptr_equal(ring + bi.slot_offset + l.offset, f.data);
        if (!l.ragged) {
            assert_null(f.offsets);
            assert_int_equal(l.ndim + 1, f.ndim);
            for (int d = 0; d < l.ndim; d++)
                assert_int_equal(l.shape[d], f.shape[d + 1]);
            assert_int_equal(l.row_bytes * bi.rows, f.nbytes);
            assert_memory_equal(slot + l.offset, f.data, f.nbytes);
        } else {
            assert_ptr_equal(ring + bi.slot_offset + l.offsets_offset, f.offsets);
            assert_memory_equal(slot + l.offsets_offset, f.offsets, (bi.rows + 1) * sizeof(int64_t));
            assert_true(f.nbytes <= l.capacity);
            assert_memory_equal(slot + l.offset, f.data, f.nbytes);
        }
    }
}

static void test_ring_layout(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    int fds = harness_fd_count();
    static const char *const names[] = {"records", "varied"};
    for (int k = 0; k < 2; k++) {
        lc_stream_options o;
        lc_stream *s = NULL;
        lc_stream_options_init(&o);
        o.batch_size = 32;
        assert_int_equal(lc_stream_open(c, names[k], &o, &s), 0);
        lc_ring_info ri;
        size_t ring_size = 0;
        (void)lc_stream_ring(s, &ring_size);
        assert_int_equal(lc_stream_ring_info(s, &ri), 0);
        assert_int_equal(ri.size, ring_size);
        assert_true(ri.slot_count >= 2);
        assert_int_equal(ri.slot_header_size, sizeof(struct ld_slot_header));
        assert_int_equal(ri.field_count, 2);
        for (uint32_t i = 0; i < ri.slot_count; i++) {
            int64_t off = lc_stream_slot_offset(s, (int)i);
            assert_true(off > 0 && (uint64_t)off + ri.slot_size <= ri.size);
            if (i)
                assert_int_equal(off - lc_stream_slot_offset(s, (int)i - 1), (int64_t)ri.slot_size);
        }
        assert_int_equal(lc_stream_slot_offset(s, -1), LC_EINVAL);
        assert_int_equal(lc_stream_slot_offset(s, (int)ri.slot_count), LC_EINVAL);
        lc_field_layout l;
        assert_int_equal(lc_stream_field_layout(s, 2, &l), LC_EINVAL);
        assert_int_equal(lc_stream_field_layout(s, -1, &l), LC_EINVAL);
        assert_int_equal(lc_stream_field_layout_sized(s, 0, &l, offsetof(lc_field_layout, capacity)), LC_EINVAL);
        assert_int_equal(lc_stream_ring_info_sized(s, &ri, 8), LC_EINVAL);
        struct {
            lc_field_layout l;
            uint64_t device;
        } big;
        memset(&big, 0xff, sizeof big);
        assert_int_equal(lc_stream_field_layout_sized(s, 1, &big.l, sizeof big), 0);
        assert_string_equal(big.l.name, "label");
        assert_int_equal(big.device, 0);
        assert_int_equal(lc_stream_field_layout(s, 0, &l), 0);
        assert_int_equal(l.ragged, k == 1);

        /* The first batch removes the ring's name: the descriptor is the way in. */
        lc_batch *b = NULL;
        assert_int_equal(lc_stream_next(s, 0, &b), 0);
        int fd = lc_stream_ring_fd(s);
        assert_true(fd >= 0);
        assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
        for (int n = 0; n < 3; n++) {
            /* A mapping per batch: the copy-on-write page below would hide what the
             * daemon writes next into the same slot (an early batch may reuse its slot
             * while the ring's other slots are still being committed). */
            uint8_t *mine = mmap(NULL, ri.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
            assert_true(mine != MAP_FAILED);
            check_layout_matches(s, b, mine);
            /* Copy-on-write: a write stays in this mapping. */
            lc_batch_info bi;
            lc_field f;
            assert_int_equal(lc_batch_describe(b, &bi), 0);
            assert_int_equal(lc_batch_field(b, 0, &f), 0);
            uint8_t *p = mine + bi.slot_offset + l.offset;
            uint8_t before = *(const uint8_t *)f.data;
            *p = (uint8_t)(before + 1);
            assert_int_equal(*(const uint8_t *)f.data, before);
            munmap(mine, ri.size);
            assert_int_equal(lc_batch_release(b), 0);
            b = NULL;
            /* lc_stream_next_info: the batch and what lc_batch_describe says of it, in one call. */
            lc_batch_info ni;
            memset(&ni, 0xff, sizeof ni);
            assert_int_equal(lc_stream_next_info(s, 0, &b, &ni), 0);
            assert_int_equal(lc_batch_describe(b, &bi), 0);
            assert_memory_equal(&ni, &bi, sizeof bi);
            assert_int_equal(ni.reopens, 0);
        }
        lc_batch_info small;
        assert_int_equal(lc_batch_describe_sized(b, &small, 4), LC_EINVAL);
        assert_int_equal(lc_batch_describe(NULL, &small), LC_EINVAL);
        /* No batch is taken when there is nowhere to put it. */
        lc_batch *none = NULL;
        assert_int_equal(lc_stream_next_info_sized(s, 0, &none, &small, 4), LC_EINVAL);
        assert_non_null(strstr(lc_client_error(c), "lc_stream_next_info"));
        assert_int_equal(lc_stream_next_info(s, 0, NULL, &small), LC_EINVAL);
        assert_int_equal(lc_stream_next_info(NULL, 0, &none, &small), LC_EINVAL);
        assert_null(none);
        close(fd);
        assert_int_equal(lc_batch_release(b), 0);
        assert_int_equal(lc_stream_close(s), 0);
        assert_int_equal(harness_fd_count(), fds);
    }
    assert_int_equal(lc_stream_ring_fd(NULL), LC_EBADF);
    lc_client_close(c);
}

/* ---- against loaderd ------------------------------------------------------------------- */

static void test_hello_and_datasets(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    assert_string_equal(lc_client_error(c), "");
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"datasets\"}", &reply), 0);
    cJSON *j = cJSON_Parse(reply);
    lc_free(reply);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    const cJSON *ds = cJSON_GetObjectItem(j, "datasets");
    assert_int_equal(cJSON_GetArraySize(ds), 2);
    const cJSON *rec = NULL, *d;
    cJSON_ArrayForEach(d, ds)
        if (strcmp(cJSON_GetObjectItem(d, "name")->valuestring, "records") == 0)
            rec = d;
    assert_non_null(rec);
    assert_string_equal(cJSON_GetObjectItem(rec, "kind")->valuestring, "files");
    assert_int_equal((int)cJSON_GetObjectItem(rec, "samples")->valuedouble, N_FILES);
    const cJSON *fields = cJSON_GetObjectItem(rec, "fields");
    assert_int_equal(cJSON_GetArraySize(fields), 2);
    const cJSON *f0 = cJSON_GetArrayItem(fields, 0), *f1 = cJSON_GetArrayItem(fields, 1);
    assert_string_equal(cJSON_GetObjectItem(f0, "name")->valuestring, "data");
    assert_string_equal(cJSON_GetObjectItem(f0, "dtype")->valuestring, "uint8");
    assert_int_equal((int)cJSON_GetArrayItem(cJSON_GetObjectItem(f0, "shape"), 0)->valuedouble, FILE_SIZE);
    assert_string_equal(cJSON_GetObjectItem(f1, "name")->valuestring, "label");
    assert_string_equal(cJSON_GetObjectItem(f1, "dtype")->valuestring, "int64");
    cJSON_Delete(j);

    /* Bad raw requests are answered, and the connection stays usable. */
    reply = (char *)(uintptr_t)0x1;
    assert_int_equal(lc_request_json(c, "[1,2]", &reply), LC_EINVAL);
    assert_int_equal(lc_request_json(c, "{\"op\":", &reply), LC_EINVAL);
    assert_int_equal(lc_request_json(c, "{\"op\":\"fly\"}", &reply), -4002 /* unknown_op */);
    assert_non_null(strstr(lc_client_error(c), "fly"));
    assert_ptr_equal(reply, (char *)(uintptr_t)0x1);
    /* A caller's own id is replaced by the library's. */
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\",\"id\":123456}", &reply), 0);
    j = cJSON_Parse(reply);
    lc_free(reply);
    assert_non_null(j);
    assert_true(cJSON_GetObjectItem(j, "id")->valuedouble != 123456);
    assert_int_equal((int)cJSON_GetObjectItem(j, "clients")->valuedouble, 1);
    cJSON_Delete(j);
    lc_client_close(c);
    lc_client_close(NULL);
    harness_stop_clean(h);
}

static void test_open_errors(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = (lc_stream *)(uintptr_t)0x1;
    lc_stream_options_init(&o);
    o.batch_size = 8;
    assert_int_equal(lc_stream_open(c, "nope", &o, &s), LC_ENODATASET);
    assert_non_null(strstr(lc_client_error(c), "nope"));
    o.batch_size = 0;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EFIELD);
    assert_non_null(strstr(lc_client_error(c), "batch_size"));
    o.batch_size = 8;
    o.rank = 2;
    o.world_size = 2;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EINVAL);
    o.rank = 0;
    o.world_size = 1;
    o.seed = UINT64_MAX; /* cannot travel as a JSON number: refused before sending */
    assert_int_equal(lc_stream_open(c, "records", &o, &s), LC_EFIELD);
    assert_non_null(strstr(lc_client_error(c), "seed"));
    assert_int_equal(lc_stream_open(c, "records", NULL, &s), LC_EINVAL);
    assert_ptr_equal(s, (lc_stream *)(uintptr_t)0x1);
    /* After all that, the connection still works. */
    o.seed = 0;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Index of the file whose content starts with `first8`, by search over every file. */
static int64_t file_by_first_word(const uint64_t *first, uint64_t n, const uint8_t *data)
{
    uint64_t w;
    memcpy(&w, data, 8);
    for (uint64_t i = 0; i < n; i++)
        if (first[i] == w)
            return (int64_t)i;
    return -1;
}

static void test_one_epoch_fixed(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 64;
    o.epochs = 1;
    o.seed = 42;
    o.prefetch = 3;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    assert_int_equal(lc_stream_batches_per_epoch(s), (N_FILES + 63) / 64);
    assert_int_equal(lc_stream_samples_per_epoch(s), N_FILES);
    size_t ring_size = 0;
    const uint8_t *ring = lc_stream_ring(s, &ring_size);
    assert_non_null(ring);
    assert_true(ring_size > 0);

    uint64_t first[N_FILES];
    int seen[N_FILES] = { 0 };
    for (uint64_t i = 0; i < N_FILES; i++)
        first[i] = ld_splitmix64(i * 1000003);
    uint64_t samples = 0, in_order = 0, batch_no = 0;
    int64_t prev_file = -1;
    for (;;) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 0, &b);
        if (r == LC_EEND)
            break;
        if (r < 0)
            fail_msg("next: %s: %s", lc_strerror(r), lc_client_error(c));
        assert_int_equal(lc_batch_epoch(b), 0);
        assert_int_equal(lc_batch_index(b), batch_no);
        assert_true(lc_batch_valid(b));
        assert_int_equal(lc_batch_field_count(b), 2);
        uint32_t rows = lc_batch_rows(b);
        assert_int_equal(rows, batch_no + 1 < lc_stream_batches_per_epoch(s) ? 64 : N_FILES % 64);
        lc_field data, label, by_name;
        assert_int_equal(lc_batch_field(b, 0, &data), 0);
        assert_int_equal(lc_batch_field(b, 1, &label), 0);
        assert_int_equal(lc_batch_field(b, 2, &by_name), LC_EINVAL);
        assert_int_equal(lc_batch_field_by_name(b, "label", &by_name), 0);
        assert_ptr_equal(by_name.data, label.data);
        assert_int_equal(lc_batch_field_by_name(b, "nope", &by_name), LC_EINVAL);
        assert_string_equal(data.name, "data");
        assert_int_equal(data.dtype, LC_DTYPE_UINT8);
        assert_int_equal(data.ndim, 2);
        assert_int_equal(data.shape[0], rows);
        assert_int_equal(data.shape[1], FILE_SIZE);
        assert_int_equal(data.nbytes, (size_t)rows * FILE_SIZE);
        assert_null(data.offsets);
        assert_int_equal(label.dtype, LC_DTYPE_INT64);
        assert_int_equal(label.ndim, 1);
        assert_int_equal(label.nbytes, (size_t)rows * 8);
        /* Zero copy: the views point into the mapped ring. */
        assert_true((const uint8_t *)data.data >= ring && (const uint8_t *)data.data + data.nbytes <= ring + ring_size);
        const int64_t *labels = label.data;
        for (uint32_t r2 = 0; r2 < rows; r2++) {
            const uint8_t *row = (const uint8_t *)data.data + (size_t)r2 * FILE_SIZE;
            int64_t f = file_by_first_word(first, N_FILES, row);
            if (f < 0)
                fail_msg("batch %llu row %u holds no file's bytes", (unsigned long long)batch_no, r2);
            assert_true(harness_file_matches((uint64_t)f, row, FILE_SIZE, FILE_SIZE, false));
            assert_int_equal(labels[r2], f % N_CLASSES);
            seen[f]++;
            if (f > prev_file)
                in_order++;
            prev_file = f;
        }
        samples += rows;
        batch_no++;
        assert_int_equal(lc_batch_release(b), 0);
    }
    assert_int_equal(samples, N_FILES);
    for (int i = 0; i < N_FILES; i++)
        if (seen[i] != 1)
            fail_msg("file %d delivered %d times", i, seen[i]);
    assert_true(in_order < N_FILES - 10); /* shuffled, not in file order */
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 0, &b), LC_EEND); /* and stays ended */
    assert_null(b);
    /* Every release reached the daemon and was accepted: nothing is leased any more. */
    harness_flush_releases(c);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_one_epoch_ragged(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 32;
    o.epochs = 1;
    o.shuffle = 0;
    assert_int_equal(lc_stream_open(c, "varied", &o, &s), 0);
    uint64_t next_file = 0;
    for (;;) {
        lc_batch *b = NULL;
        int r = lc_stream_next(s, 0, &b);
        if (r == LC_EEND)
            break;
        if (r < 0)
            fail_msg("next: %s: %s", lc_strerror(r), lc_client_error(c));
        uint32_t rows = lc_batch_rows(b);
        lc_field data, label;
        assert_int_equal(lc_batch_field_by_name(b, "data", &data), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        assert_non_null(data.offsets);
        assert_int_equal(data.ndim, 1);
        assert_int_equal(data.shape[0], rows);
        assert_int_equal(data.nbytes, (size_t)data.offsets[rows]);
        for (uint32_t i = 0; i < rows; i++, next_file++) {
            /* No shuffle: dataset order, which is file order. */
            const uint8_t *p = (const uint8_t *)data.data + data.offsets[i];
            uint64_t len = (uint64_t)(data.offsets[i + 1] - data.offsets[i]);
            if (!harness_file_matches(next_file, p, len, VARIED_SIZE, true))
                fail_msg("sample %llu: %llu bytes that are not file %llu's", (unsigned long long)next_file,
                         (unsigned long long)len, (unsigned long long)next_file);
            assert_int_equal(((const int64_t *)label.data)[i], -1); /* no class folders */
        }
        assert_int_equal(lc_batch_release(b), 0);
    }
    assert_int_equal(next_file, N_VARIED);
    harness_flush_releases(c);
    assert_int_equal(harness_wait_leased(h, 0), 0);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_release_semantics(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_batch *b = NULL, *b2 = NULL;
    char req[256], *reply = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.handoff = LC_HANDOFF_SOCKET; /* releases as messages (itest_handoff: the release queue) */
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    assert_int_equal(lc_stream_next(s, 0, &b), 0);
    int slot = lc_batch_slot(b);
    uint64_t gen = lc_batch_generation(b);

    /* A stale generation is refused and changes nothing. */
    snprintf(req, sizeof req, "{\"op\":\"release\",\"stream\":%llu,\"slot\":%d,\"generation\":%llu}",
             (unsigned long long)lc_stream_id(s), slot, (unsigned long long)gen + 1);
    assert_int_equal(lc_request_json(c, req, &reply), LC_ESTALE);
    assert_true(lc_batch_valid(b));
    /* Released behind the library's back, then once more: the second is an error. */
    snprintf(req, sizeof req, "{\"op\":\"release\",\"stream\":%llu,\"slot\":%d,\"generation\":%llu}",
             (unsigned long long)lc_stream_id(s), slot, (unsigned long long)gen);
    assert_int_equal(lc_request_json(c, req, &reply), 0);
    lc_free(reply);
    reply = NULL;
    assert_int_equal(lc_request_json(c, req, &reply), LC_ENOTLEASED);
    assert_null(reply);
    /* The library's own release of that batch is pipelined: it returns 0 and its error
     * reply is recorded by whichever call reads it, without failing that call. */
    assert_int_equal(lc_batch_release(b), 0);
    assert_int_equal(lc_stream_next(s, 0, &b2), 0);
    assert_int_equal(lc_batch_index(b2), 1);
    /* The release went out with the next request; a call that reads its reply (this
     * status) succeeds and leaves the release's error in lc_client_error(). */
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), 0);
    lc_free(reply);
    reply = NULL;
    assert_non_null(strstr(lc_client_error(c), "release of slot"));
    /* A release of a slot of a stream that is not ours. */
    assert_int_equal(lc_request_json(c, "{\"op\":\"release\",\"stream\":999,\"slot\":0,\"generation\":1}", &reply),
                     LC_ENOSTREAM);
    lc_batch_release(NULL);
    /* The caller learns of the refused release from the next release (b2's own goes
     * through), once, with the message naming the slot. */
    assert_int_equal(lc_batch_release(b2), LC_ENOTLEASED);
    char want[64];
    snprintf(want, sizeof want, "release of slot %d (generation %llu)", slot, (unsigned long long)gen);
    assert_non_null(strstr(lc_client_error(c), want));
    assert_int_equal(lc_stream_next(s, 0, &b2), 0);
    assert_int_equal(lc_batch_release(b2), 0);
    /* A refusal read by lc_stream_close is returned by it. */
    assert_int_equal(lc_stream_next(s, 0, &b2), 0);
    snprintf(req, sizeof req, "{\"op\":\"release\",\"stream\":%llu,\"slot\":%d,\"generation\":%llu}",
             (unsigned long long)lc_stream_id(s), lc_batch_slot(b2), (unsigned long long)lc_batch_generation(b2));
    assert_int_equal(lc_request_json(c, req, &reply), 0);
    lc_free(reply);
    reply = NULL;
    assert_int_equal(lc_batch_release(b2), 0); /* queued; refused by the daemon */
    assert_int_equal(lc_stream_close(s), LC_ENOTLEASED);
    lc_stream_close(NULL);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_next_timeout_keeps_request(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_batch *held[80];
    int n = 0;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.prefetch = 2;
    o.epochs = 0; /* unbounded: only holding slots can stop it */
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    int r = 0;
    int64_t t0 = 0;
    while (n < 80) {
        t0 = now_ms();
        r = lc_stream_next(s, n == 0 ? 10000 : 300, &held[n]); /* the first as long as it takes */
        if (r < 0)
            break;
        assert_int_equal(lc_batch_index(held[n]), (uint64_t)n);
        n++;
    }
    int64_t waited = now_ms() - t0;
    assert_int_equal(r, LC_ETIMEDOUT);
    assert_true(n >= 1 && n < 80);
    assert_true(waited >= 250 && waited < 3000);
    assert_non_null(strstr(lc_client_error(c), "timed out"));
    /* Give one slot back: the outstanding next gets it. Replies come in order, so the
     * streams request reads the next's reply first; the library keeps it for the
     * stream, and the following lc_stream_next returns it: no batch is skipped. */
    assert_int_equal(lc_batch_release(held[0]), 0);
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"streams\"}", &reply), 0);
    assert_non_null(strstr(reply, "\"leased\""));
    lc_free(reply);
    lc_batch *b = NULL;
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    assert_int_equal(lc_batch_index(b), (uint64_t)n); /* the outstanding one: none skipped */
    assert_int_equal(lc_batch_release(b), 0);
    assert_int_equal(lc_stream_next(s, 5000, &b), 0);
    assert_int_equal(lc_batch_index(b), (uint64_t)n + 1);
    /* Close with batches still held: they are freed with the stream. */
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_no_leaks(void **state)
{
    struct harness *h = *state;
    int fds = harness_fd_count();
    char names[512];
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s1 = NULL, *s2 = NULL;
    lc_batch *b = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 50;
    /* One stream through the socket, one through the hand-off in shared memory (unless
     * LOADERD_HANDOFF=socket makes both use the socket). */
    bool shm = harness_handoff_default();
    o.handoff = LC_HANDOFF_SOCKET;
    assert_int_equal(lc_stream_open(c, "records", &o, &s1), 0);
    o.handoff = LC_HANDOFF_SHM;
    assert_int_equal(lc_stream_open(c, "varied", &o, &s2), 0);
    /* The client keeps its socket and, per stream, the ring's descriptor (for
     * lc_stream_ring_fd): closed with the stream or the client. The hand-off's memory
     * stays mapped, its descriptor is closed at once. */
    assert_int_equal(harness_fd_count(), fds + 3);
    /* A ring's name is removed once its client asked for a batch, or started the
     * hand-off (at open); the hand-off's own name then too. */
    assert_int_equal(harness_shm_count(h->pid, names, sizeof names), shm ? 1 : 2);
    assert_int_equal(lc_stream_next(s1, 0, &b), 0);
    assert_int_equal(lc_stream_next(s2, 0, &b), 0);
    assert_int_equal(harness_shm_count(h->pid, names, sizeof names), 0);
    assert_int_equal(lc_stream_close(s1), 0);

    /* A client that goes away with a stream and a batch leaks nothing on the daemon. */
    lc_client_close(c);
    assert_int_equal(harness_fd_count(), fds);
    c = harness_connect(h, 5000, "itest_client");
    /* The daemon notices the hang-up asynchronously: give it up to 2 s. */
    double streams = -1, memory = -1;
    for (int i = 0; i < 200 && (streams != 0 || memory != 0); i++) {
        char *reply = NULL;
        assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), 0);
        cJSON *j = cJSON_Parse(reply);
        lc_free(reply);
        streams = cJSON_GetObjectItem(j, "streams")->valuedouble;
        memory = cJSON_GetObjectItem(j, "memory_used")->valuedouble;
        cJSON_Delete(j);
        if (streams != 0 || memory != 0)
            usleep(10000);
    }
    assert_true(streams == 0);
    assert_true(memory == 0);
    lc_client_close(c);
    harness_stop_clean(h);
}

static void test_daemon_goes_away(void **state)
{
    struct harness *h = *state;
    lc_client *c = harness_connect(h, 5000, "itest_client");
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_batch *b = NULL;
    /* Without reconnecting (itest_reconnect covers the daemon that comes back). */
    assert_int_equal(lc_client_set_reconnect(c, 0), 0);
    lc_stream_options_init(&o);
    o.batch_size = 10;
    assert_int_equal(lc_stream_open(c, "records", &o, &s), 0);
    assert_int_equal(lc_stream_next(s, 0, &b), 0);
    /* A clean stop with a client attached still exits 0 and removes everything. */
    harness_stop_clean(h);
    /* The mapping outlives the daemon: the held batch is still readable. */
    lc_field f;
    assert_int_equal(lc_batch_field(b, 0, &f), 0);
    volatile uint8_t x = ((const uint8_t *)f.data)[f.nbytes - 1];
    (void)x;
    lc_batch *b2 = NULL;
    /* The batch asked for ahead (read-ahead) may have been delivered before the stop:
     * it is handed out; then the hang-up is reported. */
    int r, delivered = 0;
    lc_ring_info ri;
    assert_int_equal(lc_stream_ring_info(s, &ri), 0);
    while ((r = lc_stream_next(s, 2000, &b2)) == 0) {
        delivered++;
        /* The read-ahead depth; through the hand-off, every slot but the one held. */
        assert_true(delivered <= (harness_handoff_default() ? (int)ri.slot_count - 1 : 2));
        lc_batch_release(b2);
    }
    /* Found by this next, or already by the release before it (which asks ahead in
     * the same write): either way the reason is the hang-up. */
    assert_true(r == LC_ECONNRESET || r == LC_ECLOSED);
    assert_non_null(strstr(lc_client_error(c), "loaderd closed the connection"));
    r = lc_stream_next(s, 2000, &b2);
    assert_int_equal(r, LC_ECLOSED);
    assert_non_null(strstr(lc_client_error(c), "loaderd closed the connection"));
    assert_int_equal(lc_batch_release(b), LC_ECLOSED);
    assert_int_equal(lc_stream_close(s), 0);
    lc_client_close(c);
}

/* ---- against a scripted fake daemon ---------------------------------------------------- */

enum fake_action {
    FAKE_END = 0,
    FAKE_REPLY,        /* reply with `reply`, "@ID" replaced by the request's id */
    FAKE_REPLY_LATE,   /* the same after delay_ms */
    FAKE_WRONG_ID,     /* reply with the request's id + 1000 */
    FAKE_HANGUP,       /* close the connection without replying */
    FAKE_SILENT,       /* read the request, never reply */
    FAKE_HUGE,         /* answer with a frame header announcing 65 MiB */
};

struct fake_step {
    int action;
    const char *reply;
    int delay_ms;
};

struct fake {
    char path[108];
    int lfd;
    const struct fake_step *steps;
    char ops[16][16]; /* the op of each request received */
    int n_ops;
    pthread_t thread;
};

static const char fake_hello[] = "{\"id\":@ID,\"ok\":true,\"version\":1,\"server\":\"fake\",\"pid\":1,\"max_frame\":1048576}";
static const char fake_ok[] = "{\"id\":@ID,\"ok\":true}";

static void fake_send(int fd, const char *tmpl, int64_t id)
{
    char body[4096], num[32];
    size_t len = 0;
    snprintf(num, sizeof num, "%lld", (long long)id);
    for (const char *p = tmpl; *p && len + 32 < sizeof body;) {
        if (strncmp(p, "@ID", 3) == 0) {
            len += (size_t)snprintf(body + len, sizeof body - len, "%s", num);
            p += 3;
        } else {
            body[len++] = *p++;
        }
    }
    uint8_t hdr[4];
    proto_frame_header((uint32_t)len, hdr);
    if (send(fd, hdr, 4, MSG_NOSIGNAL) != 4 || send(fd, body, len, MSG_NOSIGNAL) != (ssize_t)len)
        return;
}

/* Blocks until one whole request arrives; returns its id (and records its op), or -1 at EOF. */
static int64_t fake_read(struct fake *f, int fd, proto_reader *rd)
{
    for (;;) {
        const char *payload;
        size_t len;
        if (proto_reader_next(rd, &payload, &len) == 1) {
            cJSON *j = cJSON_Parse(payload);
            int64_t id = proto_request_id(j);
            const cJSON *op = cJSON_GetObjectItem(j, "op");
            if (f->n_ops < 16)
                snprintf(f->ops[f->n_ops++], 16, "%s", cJSON_IsString(op) ? op->valuestring : "?");
            cJSON_Delete(j);
            return id;
        }
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0)
            return -1;
        proto_reader_feed(rd, buf, (size_t)n);
    }
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    proto_reader *rd = NULL;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0 || proto_reader_new(1 << 20, &rd) < 0)
        goto out;
    for (const struct fake_step *st = f->steps; st->action != FAKE_END; st++) {
        int64_t id = fake_read(f, fd, rd);
        if (id < 0)
            goto out;
        if (st->action == FAKE_HUGE) {
            uint8_t hdr[4];
            proto_frame_header(65u << 20, hdr);
            send(fd, hdr, 4, MSG_NOSIGNAL);
            continue;
        }
        if (st->action == FAKE_HANGUP)
            goto out;
        if (st->action == FAKE_SILENT)
            continue;
        if (st->action == FAKE_REPLY_LATE)
            usleep((useconds_t)st->delay_ms * 1000);
        fake_send(fd, st->reply, st->action == FAKE_WRONG_ID ? id + 1000 : id);
    }
    /* Drain until the client hangs up, so it never sees an early EOF. */
    while (fake_read(f, fd, rd) >= 0)
        ;
out:
    if (fd >= 0)
        close(fd);
    proto_reader_free(rd);
    return NULL;
}

static struct fake *fake_start(struct harness *h, const struct fake_step *steps)
{
    struct fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->path, sizeof f->path, "%s/fake.sock", h->dir);
    f->steps = steps;
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->lfd >= 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f->path);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->lfd, 4), 0);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
    return f;
}

static void fake_join(struct fake *f)
{
    pthread_join(f->thread, NULL);
    close(f->lfd);
    unlink(f->path);
}

static lc_client *fake_connect(struct fake *f, int timeout_ms)
{
    char err[512];
    lc_client *c = NULL;
    int r = lc_connect(f->path, timeout_ms, "itest", &c, err, sizeof err);
    if (r < 0)
        fail_msg("lc_connect to the fake daemon: %s", err);
    /* A fake daemon does not come back: its hang-ups are final. */
    assert_int_equal(lc_client_set_reconnect(c, 0), 0);
    return c;
}

static void test_fake_reply_out_of_order(void **state)
{
    struct harness *h = *state;
    const struct fake_step steps[] = { { FAKE_REPLY, fake_hello, 0 }, { FAKE_WRONG_ID, fake_ok, 0 }, { FAKE_END, 0, 0 } };
    struct fake *f = fake_start(h, steps);
    lc_client *c = fake_connect(f, 2000);
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), LC_EPROTO);
    assert_non_null(strstr(lc_client_error(c), "out of order"));
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), LC_ECLOSED);
    assert_non_null(strstr(lc_client_error(c), "out of order"));
    lc_client_close(c);
    fake_join(f);
    free(f);
}

static void test_fake_hangup_and_huge_frame(void **state)
{
    struct harness *h = *state;
    const struct fake_step hang[] = { { FAKE_REPLY, fake_hello, 0 }, { FAKE_HANGUP, 0, 0 }, { FAKE_END, 0, 0 } };
    struct fake *f = fake_start(h, hang);
    lc_client *c = fake_connect(f, 2000);
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), LC_ECONNRESET);
    assert_string_equal(lc_client_error(c), "loaderd closed the connection");
    lc_client_close(c);
    fake_join(f);
    free(f);

    const struct fake_step huge[] = { { FAKE_REPLY, fake_hello, 0 }, { FAKE_HUGE, 0, 0 }, { FAKE_END, 0, 0 } };
    f = fake_start(h, huge);
    c = fake_connect(f, 2000);
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), LC_EPROTO);
    assert_non_null(strstr(lc_client_error(c), "larger than"));
    lc_client_close(c);
    fake_join(f);
    free(f);
}

static void test_fake_timeouts(void **state)
{
    struct harness *h = *state;
    char err[512];
    lc_client *c = NULL;

    /* hello never answered: lc_connect gives up after its timeout. */
    const struct fake_step silent[] = { { FAKE_SILENT, 0, 0 }, { FAKE_END, 0, 0 } };
    struct fake *f = fake_start(h, silent);
    int64_t t0 = now_ms();
    assert_int_equal(lc_connect(f->path, 200, "t", &c, err, sizeof err), LC_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    assert_true(took >= 180 && took < 2000);
    assert_non_null(strstr(err, "timed out"));
    assert_null(c);
    fake_join(f);
    free(f);

    /* A reply that comes after its caller gave up is dropped, and the next call gets
     * its own reply. */
    const struct fake_step late[] = { { FAKE_REPLY, fake_hello, 0 },
                                      { FAKE_REPLY_LATE, "{\"id\":@ID,\"ok\":true,\"which\":1}", 400 },
                                      { FAKE_REPLY, "{\"id\":@ID,\"ok\":true,\"which\":2}", 0 },
                                      { FAKE_END, 0, 0 } };
    f = fake_start(h, late);
    c = fake_connect(f, 150);
    char *reply = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), LC_ETIMEDOUT);
    assert_non_null(strstr(lc_client_error(c), "timed out after 150 ms"));
    usleep(450 * 1000);
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &reply), 0);
    assert_non_null(strstr(reply, "\"which\":2"));
    lc_free(reply);
    lc_client_close(c);
    fake_join(f);
    free(f);

    /* Version mismatch. */
    const struct fake_step v2[] = { { FAKE_REPLY, "{\"id\":@ID,\"ok\":true,\"version\":2}", 0 }, { FAKE_END, 0, 0 } };
    f = fake_start(h, v2);
    assert_int_equal(lc_connect(f->path, 2000, "t", &c, err, sizeof err), LC_EVERSION);
    assert_non_null(strstr(err, "version 2"));
    fake_join(f);
    free(f);
}

/* An open reply whose ring is not what it says: refused, and the stream closed. */
/* A ring someone else could write (or that belongs to another user than the daemon) is
 * refused: the trainer would read batches in place that anyone could change. */
static void test_fake_ring_not_the_daemons(void **state)
{
    struct harness *h = *state;
    char shm[64], reply1[1024], reply2[1024];
    snprintf(shm, sizeof shm, "/ldtest.fakeperm.%d", (int)getpid());
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 3 * 4096), 0);
    struct ld_ring_header hdr = { .magic = LD_RING_MAGIC, .version = LD_RING_VERSION, .slot_count = 2,
                                  .slot_size = 4096, .slot_offset = 4096, .total_size = 3 * 4096, .stream_id = 1 };
    assert_int_equal(pwrite(fd, &hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    assert_int_equal(fchmod(fd, 0622), 0); /* writable by group and others */
    for (int k = 0; k < 2; k++)
        snprintf(k ? reply2 : reply1, sizeof reply1,
                 "{\"id\":@ID,\"ok\":true,\"stream\":1,\"shm\":\"%s\",\"shm_size\":12288,\"slot_count\":2,"
                 "\"slot_size\":4096,\"slot_offset\":4096,\"batch_size\":4,\"batches_per_epoch\":1,"
                 "\"samples_per_epoch\":4,\"fields\":[{\"name\":\"x\",\"dtype\":\"int64\",\"shape\":[2],"
                 "\"ragged\":false,\"offset\":64}]}",
                 shm);
    const struct fake_step steps[] = { { FAKE_REPLY, fake_hello, 0 }, { FAKE_REPLY, reply1, 0 },
                                       { FAKE_REPLY, fake_ok, 0 },    { FAKE_REPLY, reply2, 0 },
                                       { FAKE_REPLY, fake_ok, 0 },    { FAKE_END, 0, 0 } };
    struct fake *f = fake_start(h, steps);
    lc_client *c = fake_connect(f, 2000);
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    int r1 = lc_stream_open(c, "d", &o, &s);
    char msg1[1024];
    snprintf(msg1, sizeof msg1, "%s", lc_client_error(c));
    /* Private again, but owned by another user (root can give it away). */
    int r2 = 0;
    bool root = geteuid() == 0;
    if (root) {
        assert_int_equal(fchmod(fd, 0600), 0);
        assert_int_equal(fchown(fd, 65534, (gid_t)-1), 0);
        r2 = lc_stream_open(c, "d", &o, &s);
    }
    close(fd);
    shm_unlink(shm); /* before any assert can leave it behind */
    assert_int_equal(r1, LC_EPERM);
    if (!strstr(msg1, "mode 0622") || !strstr(msg1, "refusing to map it"))
        fail_msg("unexpected message: %s", msg1);
    if (root) {
        assert_int_equal(r2, LC_EPERM);
        assert_non_null(strstr(lc_client_error(c), "belongs to uid 65534"));
    }
    assert_null(s);
    lc_client_close(c);
    fake_join(f);
    free(f);
}

static void test_fake_bad_ring(void **state)
{
    struct harness *h = *state;
    char shm[64], open_reply[1024], bad_field_reply[1024];
    snprintf(shm, sizeof shm, "/ldtest.fake.%d", (int)getpid());
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 3 * 4096), 0);
    struct ld_ring_header hdr = { .magic = 0x12345678, .version = 1, .slot_count = 2, .slot_size = 4096,
                                  .slot_offset = 4096, .total_size = 3 * 4096, .stream_id = 1 };
    assert_int_equal(pwrite(fd, &hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    close(fd);
    snprintf(open_reply, sizeof open_reply,
             "{\"id\":@ID,\"ok\":true,\"stream\":1,\"shm\":\"%s\",\"shm_size\":12288,\"slot_count\":2,"
             "\"slot_size\":4096,\"slot_offset\":4096,\"batch_size\":4,\"batches_per_epoch\":1,"
             "\"samples_per_epoch\":4,\"fields\":[{\"name\":\"x\",\"dtype\":\"int64\",\"shape\":[2],"
             "\"ragged\":false,\"offset\":64}]}",
             shm);
    /* 4 rows of 3 int64 at offset 4032 overrun a 4096-byte slot. */
    snprintf(bad_field_reply, sizeof bad_field_reply,
             "{\"id\":@ID,\"ok\":true,\"stream\":2,\"shm\":\"%s\",\"shm_size\":12288,\"slot_count\":2,"
             "\"slot_size\":4096,\"slot_offset\":4096,\"batch_size\":4,\"batches_per_epoch\":1,"
             "\"samples_per_epoch\":4,\"fields\":[{\"name\":\"x\",\"dtype\":\"int64\",\"shape\":[3],"
             "\"ragged\":false,\"offset\":4032}]}",
             shm);
    const struct fake_step steps[] = { { FAKE_REPLY, fake_hello, 0 }, { FAKE_REPLY, open_reply, 0 },
                                       { FAKE_REPLY, fake_ok, 0 },    { FAKE_REPLY, bad_field_reply, 0 },
                                       { FAKE_REPLY, fake_ok, 0 },    { FAKE_END, 0, 0 } };
    struct fake *f = fake_start(h, steps);
    lc_client *c = fake_connect(f, 2000);
    lc_stream_options o;
    lc_stream *s = NULL;
    lc_stream_options_init(&o);
    o.batch_size = 4;
    int r1 = lc_stream_open(c, "d", &o, &s);
    char msg1[1024];
    snprintf(msg1, sizeof msg1, "%s", lc_client_error(c));
    int r2 = lc_stream_open(c, "d", &o, &s);
    shm_unlink(shm); /* before any assert can leave it behind */
    assert_int_equal(r1, LC_EPROTO);
    assert_non_null(strstr(msg1, "ring header"));
    assert_int_equal(r2, LC_EPROTO);
    assert_non_null(strstr(lc_client_error(c), "overrun"));
    assert_null(s);
    lc_client_close(c);
    fake_join(f);
    assert_int_equal(f->n_ops, 5);
    assert_string_equal(f->ops[1], "open");
    assert_string_equal(f->ops[2], "close");
    assert_string_equal(f->ops[4], "close");
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connect_missing_socket, setup_dir, teardown),
        cmocka_unit_test(test_default_socket),
        cmocka_unit_test_setup_teardown(test_socket_resolution, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_connect_from_config, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_ring_layout, setup_daemon, teardown),
        cmocka_unit_test(test_error_table_and_limits),
        cmocka_unit_test_setup_teardown(test_versioned_structs, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_fake_reply_out_of_order, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_fake_hangup_and_huge_frame, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_fake_timeouts, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_fake_ring_not_the_daemons, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_fake_bad_ring, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_hello_and_datasets, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_one_epoch_fixed, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_one_epoch_ragged, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_release_semantics, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_next_timeout_keeps_request, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_no_leaks, setup_daemon, teardown),
        cmocka_unit_test_setup_teardown(test_daemon_goes_away, setup_daemon, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
