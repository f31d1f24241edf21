/* Unit tests for the config loader (daemon/config.c, config_table.c, config_yaml.c): a
 * full config parses into the right values, defaults and relative paths resolve, and
 * every kind of bad file is refused with LD_ECONFIG and a message that starts with the
 * exact "file:line:column: " of the culprit. Each case writes its YAML to a temporary
 * file (in $TMPDIR or /tmp) and removes it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "cpus.h"
#include "ld_error.h"
#include "log.h"
#include "proto.h"
#include "s3.h"
#include "transform_schema.h"

/* A value that config_load must leave in *ret_config when it fails. */
static struct config *const untouched = (struct config *)(uintptr_t)0x5a5a5a50;

static const char *tmp_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] == '/' ? t : "/tmp";
}

/* Writes `len` bytes of `text` to a fresh temporary .yaml file; its path into `path`. */
static void write_file(char *path, size_t size, const char *text, size_t len)
{
    int n = snprintf(path, size, "%s/ld-test-config-XXXXXX.yaml", tmp_dir());
    assert_true(n > 0 && (size_t)n < size);
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        assert_true(w > 0);
        off += (size_t)w;
    }
    assert_int_equal(close(fd), 0);
}

static void write_yaml(char *path, size_t size, const char *text)
{
    write_file(path, size, text, strlen(text));
}

static int load_text(const char *text, char *path, size_t size, struct config **ret,
                     char *errbuf)
{
    write_yaml(path, size, text);
    int rc = config_load(path, ret, errbuf);
    unlink(path);
    return rc;
}

/* Loads `text` and checks that it fails with LD_ECONFIG, a message that starts with
 * "PATH:line:column: " and contains each of the NULL-terminated `wants`. */
static void expect_error_at(const char *text, int line, int column, ...)
{
    char path[PATH_MAX], errbuf[LD_ERRMSG_MAX], prefix[PATH_MAX + 32];
    struct config *c = untouched;
    int rc = load_text(text, path, sizeof path, &c, errbuf);
    if (rc != LD_ECONFIG)
        fail_msg("expected LD_ECONFIG, got %d (%s) for:\n%s", rc, errbuf, text);
    assert_ptr_equal(c, untouched);
    snprintf(prefix, sizeof prefix, "%s:%d:%d: ", path, line, column);
    if (strncmp(errbuf, prefix, strlen(prefix)) != 0)
        fail_msg("message '%s' does not start with '%s'", errbuf, prefix);
    va_list ap;
    va_start(ap, column);
    for (const char *want; (want = va_arg(ap, const char *));)
        if (!strstr(errbuf, want))
            fail_msg("message '%s' lacks '%s'", errbuf, want);
    va_end(ap);
}

static struct config *load_ok(const char *text, char *path, size_t size)
{
    char errbuf[LD_ERRMSG_MAX] = "";
    struct config *c = NULL;
    int rc = load_text(text, path, size, &c, errbuf);
    if (rc != 0)
        fail_msg("config_load failed with %d: %s\nfor:\n%s", rc, errbuf, text);
    assert_non_null(c);
    return c;
}

#define ONE_DATASET "datasets:\n  a: {kind: files, path: x}\n"
#define IM_HEAD "datasets:\n  im:\n    kind: image_folder\n    path: x\n    transforms:\n"

/* ---- valid configs --------------------------------------------------------------- */

static void test_full_config(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("# a full config\n"
                               "server:\n"
                               "  socket: /tmp/ld-test.sock\n"
                               "  workers: 3\n"
                               "  memory_budget: 2GiB\n"
                               "  max_clients: 10\n"
                               "  max_streams: 20\n"
                               "  max_frame: \"64 KiB\"\n"
                               "  prefetch: 8\n"
                               "  log_level: debug\n"
                               "datasets:\n"
                               "  records:\n"
                               "    kind: files\n"
                               "    path: data/records\n"
                               "    pattern: \"*.bin\"\n"
                               "  tok.v2-x_y:\n"
                               "    kind: token_windows\n"
                               "    path: /srv/tokens.bin\n"
                               "    dtype: uint32\n"
                               "    context: 128\n"
                               "    stride: 64\n"
                               "  plain: {kind: token_windows, path: t.bin, context: 1048576}\n",
                               path, sizeof path);
    assert_string_equal(c->file, path);
    assert_string_equal(c->socket_path, "/tmp/ld-test.sock");
    assert_int_equal(c->workers, 3);
    assert_true(c->memory_budget == (UINT64_C(2) << 30));
    assert_int_equal(c->max_clients, 10);
    assert_int_equal(c->max_streams, 20);
    assert_int_equal(c->max_frame, 64 * 1024);
    assert_int_equal(c->prefetch, 8);
    assert_int_equal(c->log_level, LD_LOG_DEBUG);
    assert_int_equal(c->n_datasets, 3);

    /* Relative paths are resolved against the config file's directory. */
    char dir[PATH_MAX], want[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    const struct config_dataset *d = &c->datasets[0];
    assert_string_equal(d->name, "records");
    assert_int_equal(d->kind, CONFIG_DATASET_FILES);
    snprintf(want, sizeof want, "%s/data/records", dir);
    assert_string_equal(d->path, want);
    assert_string_equal(d->pattern, "*.bin");
    assert_int_equal(d->line, 12);
    assert_int_equal(d->column, 3);

    d = &c->datasets[1];
    assert_string_equal(d->name, "tok.v2-x_y");
    assert_int_equal(d->kind, CONFIG_DATASET_TOKEN_WINDOWS);
    assert_string_equal(d->path, "/srv/tokens.bin");
    assert_null(d->pattern);
    assert_int_equal(d->token_dtype, LD_DTYPE_UINT32);
    assert_int_equal(d->context, 128);
    assert_int_equal(d->stride, 64);
    assert_int_equal(d->line, 16);
    assert_int_equal(d->column, 3);

    /* Defaults of a token dataset: uint16, stride = context. */
    d = &c->datasets[2];
    assert_string_equal(d->name, "plain");
    snprintf(want, sizeof want, "%s/t.bin", dir);
    assert_string_equal(d->path, want);
    assert_int_equal(d->token_dtype, LD_DTYPE_UINT16);
    assert_int_equal(d->context, 1 << 20);
    assert_int_equal(d->stride, 1 << 20);
    assert_int_equal(d->line, 22);
    config_free(c);
}

static void test_defaults(void **state)
{
    char path[PATH_MAX], want[128];
    const char *old = getenv("XDG_RUNTIME_DIR");
    char *saved = old ? strdup(old) : NULL;
    const char *old_ld = getenv("LOADERD_SOCKET");
    char *saved_ld = old_ld ? strdup(old_ld) : NULL;
    unsetenv("LOADERD_SOCKET");

    /* A private runtime directory (ours, 0700) holds the socket. */
    char xdg[] = "/tmp/ld-test-xdg-XXXXXX", xdg_sock[64];
    assert_non_null(mkdtemp(xdg));
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    snprintf(xdg_sock, sizeof xdg_sock, "%s/loaderd.sock", xdg);
    struct config *c = load_ok(ONE_DATASET, path, sizeof path);
    assert_string_equal(c->socket_path, xdg_sock);
    rmdir(xdg);
    /* workers left out: auto, one per CPU this process may use */
    struct cpus_info ci;
    cpus_probe(&ci);
    assert_int_equal(c->workers, ci.usable);
    assert_true(c->memory_budget == (UINT64_C(1) << 30));
    assert_int_equal(c->max_clients, 64);
    assert_int_equal(c->max_streams, 64);
    assert_int_equal(c->max_frame, LD_FRAME_DEFAULT_LIMIT);
    assert_int_equal(c->prefetch, 0); /* auto */
    assert_int_equal(c->log_level, LD_LOG_INFO);
    assert_int_equal(c->n_datasets, 1);
    assert_string_equal(c->datasets[0].pattern, "*");
    config_free(c);

    /* workers: 0 means one per core too; an empty server section is all defaults. */
    unsetenv("XDG_RUNTIME_DIR");
    c = load_ok("server:\n" ONE_DATASET, path, sizeof path);
    snprintf(want, sizeof want, "/tmp/loaderd-%u/loaderd.sock", (unsigned)getuid());
    assert_string_equal(c->socket_path, want);
    config_free(c);
    c = load_ok("server:\n  workers: 0\n" ONE_DATASET, path, sizeof path);
    assert_int_equal(c->workers, ci.usable);
    config_free(c);
    c = load_ok("server:\n  workers: auto\n" ONE_DATASET, path, sizeof path);
    assert_int_equal(c->workers, ci.usable);
    config_free(c);
    expect_error_at("server:\n  workers: automatic\n" ONE_DATASET, 2, 12,
                    "server.workers: expected an integer in [0, 1024] or auto, got 'automatic'", NULL);

    /* A relative XDG_RUNTIME_DIR is ignored, as the XDG spec asks. */
    setenv("XDG_RUNTIME_DIR", "run/user", 1);
    config_default_socket(want, sizeof want);
    char want2[64];
    snprintf(want2, sizeof want2, "/tmp/loaderd-%u/loaderd.sock", (unsigned)getuid());
    assert_string_equal(want, want2);

    /* LOADERD_SOCKET wins over both, as it does for the client library. */
    setenv("LOADERD_SOCKET", "/srv/ld.sock", 1);
    config_default_socket(want, sizeof want);
    assert_string_equal(want, "/srv/ld.sock");
    if (saved_ld)
        setenv("LOADERD_SOCKET", saved_ld, 1);
    else
        unsetenv("LOADERD_SOCKET");
    free(saved_ld);

    if (saved)
        setenv("XDG_RUNTIME_DIR", saved, 1);
    else
        unsetenv("XDG_RUNTIME_DIR");
    free(saved);
}

static void test_sizes(void **state)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"1048576", UINT64_C(1) << 20}, {"1M", UINT64_C(1) << 20},
        {"1 MiB", UINT64_C(1) << 20},   {"1536K", UINT64_C(1536) << 10},
        {"3G", UINT64_C(3) << 30},      {"1T", UINT64_C(1) << 40},
        {"1TiB", UINT64_C(1) << 40},    {"'1024 MiB'", UINT64_C(1) << 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[PATH_MAX], text[256];
        snprintf(text, sizeof text, "server:\n  memory_budget: %s\n" ONE_DATASET, cases[i].text);
        struct config *c = load_ok(text, path, sizeof path);
        if (c->memory_budget != cases[i].bytes)
            fail_msg("'%s' gave %llu", cases[i].text, (unsigned long long)c->memory_budget);
        config_free(c);
    }
    /* max_frame's bounds are the protocol's. */
    char path[PATH_MAX];
    struct config *c = load_ok("server:\n  max_frame: 1K\n" ONE_DATASET, path, sizeof path);
    assert_int_equal(c->max_frame, LD_FRAME_MIN_LIMIT);
    config_free(c);
    c = load_ok("server:\n  max_frame: 64M\n" ONE_DATASET, path, sizeof path);
    assert_int_equal(c->max_frame, LD_FRAME_MAX_LIMIT);
    config_free(c);
}

/* A config named without a directory resolves dataset paths against the working
 * directory, made absolute so that a later chdir does not change them. */
static void test_relative_config_path(void **state)
{
    char path[PATH_MAX], cwd[PATH_MAX], errbuf[LD_ERRMSG_MAX], want[PATH_MAX + 16];
    assert_non_null(getcwd(cwd, sizeof cwd));
    write_yaml(path, sizeof path, "datasets:\n  a: {kind: files, path: sub/dir}\n");
    char *slash = strrchr(path, '/');
    *slash = '\0';
    assert_int_equal(chdir(path), 0);
    struct config *c = NULL;
    int rc = config_load(slash + 1, &c, errbuf);
    snprintf(want, sizeof want, "%s/sub/dir", path);
    unlink(slash + 1);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rc, 0);
    char real[PATH_MAX];
    assert_non_null(realpath(path, real));
    /* getcwd gives the real path of the directory, which $TMPDIR may not be. */
    if (strcmp(c->datasets[0].path, want) != 0) {
        snprintf(want, sizeof want, "%s/sub/dir", real);
        assert_string_equal(c->datasets[0].path, want);
    }
    assert_string_equal(c->file, slash + 1);
    config_free(c);
}

/* A file of exactly CONFIG_MAX_FILE_BYTES is read; one byte more is refused. */
static void test_file_size_limit(void **state)
{
    char path[PATH_MAX], errbuf[LD_ERRMSG_MAX];
    size_t len = CONFIG_MAX_FILE_BYTES;
    char *text = malloc(len + 2);
    assert_non_null(text);
    memset(text, '#', len + 1);
    const char *body = "\n" ONE_DATASET;
    memcpy(text + len - strlen(body), body, strlen(body));

    write_file(path, sizeof path, text, len);
    struct config *c = NULL;
    int rc = config_load(path, &c, errbuf);
    unlink(path);
    if (rc != 0)
        fail_msg("a file at the limit failed: %s", errbuf);
    assert_int_equal(c->n_datasets, 1);
    config_free(c);

    /* One more comment byte at the front. */
    memmove(text + 1, text, len);
    text[0] = '#';
    write_file(path, sizeof path, text, len + 1);
    c = untouched;
    rc = config_load(path, &c, errbuf);
    unlink(path);
    assert_int_equal(rc, LD_ECONFIG);
    assert_ptr_equal(c, untouched);
    assert_true(strncmp(errbuf, path, strlen(path)) == 0);
    assert_non_null(strstr(errbuf, "larger than the 1048576 bytes"));
    free(text);
}

static void test_missing_file(void **state)
{
    char path[PATH_MAX], errbuf[LD_ERRMSG_MAX];
    snprintf(path, sizeof path, "%s/ld-test-config-does-not-exist-%d.yaml", tmp_dir(),
             (int)getpid());
    struct config *c = untouched;
    assert_int_equal(config_load(path, &c, errbuf), -ENOENT);
    assert_ptr_equal(c, untouched);
    assert_true(strncmp(errbuf, path, strlen(path)) == 0);
    assert_non_null(strstr(errbuf, "cannot open"));

    /* A directory is not a config either. */
    assert_int_equal(config_load(tmp_dir(), &c, errbuf), LD_EISDIR);
    assert_ptr_equal(c, untouched);
    assert_non_null(strstr(errbuf, "is a directory"));
}

static void test_example_config(void **state)
{
    const char *src = getenv("LD_SOURCE_DIR");
    char path[PATH_MAX], errbuf[LD_ERRMSG_MAX];
    snprintf(path, sizeof path, "%s/config/loaderd.yaml", src ? src : ".");
    struct config *c = NULL;
    int rc = config_load(path, &c, errbuf);
    if (rc != 0)
        fail_msg("%s (run from the repository root or set LD_SOURCE_DIR): %s", path, errbuf);
    assert_int_equal(c->n_datasets, 4);
    assert_string_equal(c->datasets[0].name, "records");
    assert_int_equal(c->datasets[0].kind, CONFIG_DATASET_FILES);
    assert_string_equal(c->datasets[0].pattern, "*.bin");
    assert_int_equal(c->datasets[0].path[0], '/');
    const char *tail = "/config/../bench/data/records";
    size_t pl = strlen(c->datasets[0].path);
    assert_true(pl > strlen(tail));
    assert_string_equal(c->datasets[0].path + pl - strlen(tail), tail);
    assert_string_equal(c->datasets[1].name, "tokens");
    assert_int_equal(c->datasets[1].kind, CONFIG_DATASET_TOKEN_WINDOWS);
    assert_int_equal(c->datasets[1].token_dtype, LD_DTYPE_UINT16);
    assert_int_equal(c->datasets[1].context, 1024);
    assert_int_equal(c->datasets[1].stride, 1024);
    /* the cache and image examples (their contents: test_examples.c) */
    assert_string_equal(c->datasets[2].name, "records_cached");
    assert_int_equal(c->datasets[2].kind, CONFIG_DATASET_FILES);
    assert_string_equal(c->datasets[3].name, "images");
    assert_int_equal(c->datasets[3].kind, CONFIG_DATASET_IMAGE_FOLDER);
    assert_true(c->memory_budget == (UINT64_C(1) << 30));
    assert_int_equal(c->log_level, LD_LOG_INFO);
    config_free(c);

    /* Every key is documented in the example. */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    static const char *const keys[] = {"socket:",    "workers:",   "memory_budget:",
                                       "max_clients:", "max_streams:", "max_frame:",
                                       "prefetch:",  "log_level:", "kind:",
                                       "path:",      "pattern:",   "dtype:",
                                       "context:",   "stride:"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strstr(text, keys[i]))
            fail_msg("config/loaderd.yaml does not mention '%s'", keys[i]);
}

/* A config that fails late, after the first dataset took every kind of memory a
 * config owns (pattern, cache path, plug-in path and params): the error is reported,
 * *ret_config is untouched, and the half-built config is freed. A missing free is a
 * leak that LeakSanitizer reports when this program exits (the run fails); a double
 * free is an ASan error. config_free also accepts NULL. */
static void test_free_partial(void **state)
{
    char path[PATH_MAX], err[LD_ERRMSG_MAX];
    struct config *c = untouched;
    int rc = load_text("datasets:\n"
                       "  a:\n"
                       "    kind: files\n"
                       "    path: a\n"
                       "    pattern: \"*.bin\"\n"
                       "    cache: {path: a.ldcache}\n"
                       "  im:\n"
                       "    kind: image_folder\n"
                       "    path: imgs\n"
                       "    transforms:\n"
                       "      - plugin: {path: plug/x.so, params: {amount: 3}}\n"
                       "      - center_crop: {height: 8, width: 8}\n"
                       "  z:\n"
                       "    kind: files\n"
                       "    path: z\n"
                       "    patern: \"*\"\n",
                       path, sizeof path, &c, err);
    assert_int_equal(rc, LD_ECONFIG);
    assert_ptr_equal(c, untouched);
    assert_non_null(strstr(err, ":16:5: unknown key 'patern'"));
    config_free(NULL);
}

/* ---- errors: each at its exact position ------------------------------------------ */

static void test_unknown_keys(void **state)
{
    expect_error_at("server:\n  workerz: 4\n" ONE_DATASET, 2, 3,
                    "unknown key 'workerz' in 'server' (expected one of: socket, workers, "
                    "memory_budget, device_memory_budget, max_clients, max_streams, max_frame, prefetch, log_level, "
                    "socket_group, hello_timeout, idle_timeout, max_reply_bytes, max_total_reply_bytes, share_max_lag, metrics)",
                    NULL);
    expect_error_at("datasets:\n"
                    "  a:\n"
                    "    kind: files\n"
                    "    path: x\n"
                    "    patern: \"*.bin\"\n",
                    5, 5, "unknown key 'patern' in 'datasets.a' (expected one of: kind, path, pattern, format, manifest, on_error, on_error_warn_fraction, cache, follow_links, max_sample_bytes, read_timeout, read_ahead, weight, max_share, s3)",
                    NULL);
    expect_error_at(ONE_DATASET "servers:\n  workers: 1\n", 3, 1,
                    "unknown top-level key 'servers' (expected one of: server, datasets, clients, access)", NULL);
}

static void test_wrong_types(void **state)
{
    expect_error_at("server:\n  - workers\n" ONE_DATASET, 2, 3,
                    "server: expected a mapping, got a sequence", NULL);
    expect_error_at("server:\n  workers: [1, 2]\n" ONE_DATASET, 2, 12,
                    "server.workers: expected an integer in [0, 1024] or auto, got a sequence", NULL);
    expect_error_at("server:\n  socket: {a: 1}\n" ONE_DATASET, 2, 11,
                    "server.socket: expected a non-empty string, got a mapping", NULL);
    expect_error_at("server:\n  socket:\n" ONE_DATASET, 2, 10, "server.socket",
                    "non-empty string", "null", NULL);
    expect_error_at("datasets:\n  - a\n", 2, 3, "datasets: expected a mapping", "got a sequence",
                    NULL);
    expect_error_at("datasets:\n  a: files\n", 2, 6, "datasets.a: expected a mapping",
                    "got 'files'", NULL);
    expect_error_at("- server\n- datasets\n", 1, 1, "the top level must be a mapping",
                    "got a sequence", NULL);
    expect_error_at("just a string\n", 1, 1, "the top level must be a mapping", NULL);
    expect_error_at("datasets:\n  [a, b]: {kind: files, path: x}\n", 2, 3,
                    "datasets: expected a key name, got a sequence", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: \"x\\0y\"}\n", 2, 26, "datasets.a.path",
                    "NUL", NULL);
}

static void test_bad_values(void **state)
{
    expect_error_at("server:\n  workers: two\n" ONE_DATASET, 2, 12,
                    "server.workers: expected an integer in [0, 1024] or auto, got 'two'", NULL);
    expect_error_at("server:\n  prefetch: -1\n" ONE_DATASET, 2, 13,
                    "server.prefetch: expected an integer in [1, 64] or auto, got '-1'", NULL);
    expect_error_at("server:\n  max_clients: 4097\n" ONE_DATASET, 2, 16,
                    "server.max_clients: expected an integer in [1, 4096], got '4097'", NULL);
    expect_error_at("server:\n  workers: 99999999999999999999999\n" ONE_DATASET, 2, 12,
                    "server.workers: expected an integer", NULL);
    expect_error_at("server:\n  workers: 4.0\n" ONE_DATASET, 2, 12, "got '4.0'", NULL);
    expect_error_at("server:\n  memory_budget: 2TiB\n" ONE_DATASET, 2, 18,
                    "server.memory_budget: expected a size in [1 MiB, 1 TiB]", "got '2TiB'", NULL);
    expect_error_at("server:\n  memory_budget: -5M\n" ONE_DATASET, 2, 18,
                    "server.memory_budget: expected a size", "got '-5M'", NULL);
    expect_error_at("server:\n  max_frame: 1MB\n" ONE_DATASET, 2, 14,
                    "server.max_frame: expected a size in [1 KiB, 64 MiB]", "got '1MB'", NULL);
    expect_error_at("server:\n  max_frame: 1000\n" ONE_DATASET, 2, 14,
                    "server.max_frame: expected a size in [1 KiB, 64 MiB]", "got '1000'", NULL);
    expect_error_at("server:\n  memory_budget: 99999999999T\n" ONE_DATASET, 2, 18,
                    "server.memory_budget", NULL);
    expect_error_at("server:\n  log_level: loud\n" ONE_DATASET, 2, 14,
                    "server.log_level: expected one of error, warn, info, debug, got 'loud'", NULL);
    expect_error_at("datasets:\n"
                    "  tokens:\n"
                    "    kind: token_windows\n"
                    "    path: t.bin\n"
                    "    dtype: int8\n"
                    "    context: 8\n",
                    5, 12, "datasets.tokens.dtype: expected one of uint16, uint32, got 'int8'",
                    NULL);
    expect_error_at("datasets:\n  a: {kind: folder, path: x}\n", 2, 13,
                    "datasets.a.kind: expected one of files, token_windows, packed, image_folder, sql, tar_shards, got 'folder'", NULL);
    expect_error_at("datasets:\n  t: {kind: token_windows, path: x, context: 0}\n", 2, 46,
                    "datasets.t.context: expected an integer in [1, 1048576], got '0'", NULL);
    expect_error_at("datasets:\n  t: {kind: token_windows, path: x, context: 8, stride: 1073741825}\n",
                    2, 57, "datasets.t.stride: expected an integer in [1, 1073741824]", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: ''}\n", 2, 26,
                    "datasets.a.path: expected a non-empty string, got ''", NULL);
}

static void test_socket_length(void **state)
{
    char path[PATH_MAX], text[512], sock[128];
    /* 107 bytes fit in sun_path with its NUL; 108 do not. */
    memset(sock, 'a', sizeof sock);
    memcpy(sock, "/tmp/", 5);
    sock[107] = '\0';
    snprintf(text, sizeof text, "server:\n  socket: %s\n" ONE_DATASET, sock);
    struct config *c = load_ok(text, path, sizeof path);
    assert_int_equal(strlen(c->socket_path), 107);
    config_free(c);

    sock[107] = 'a';
    sock[108] = '\0';
    snprintf(text, sizeof text, "server:\n  socket: %s\n" ONE_DATASET, sock);
    expect_error_at(text, 2, 11, "server.socket: the path is 108 bytes long",
                    "at most 107", NULL);
}

static void test_aliases_rejected(void **state)
{
    expect_error_at("datasets:\n"
                    "  a: &base\n"
                    "    kind: files\n"
                    "    path: x\n"
                    "  b: *base\n",
                    2, 6, "anchors and aliases are not allowed", "'&base'", NULL);
    expect_error_at("server:\n  workers: &n 4\n" ONE_DATASET, 2, 12, "anchor '&n'", NULL);
    /* An alias alone (its anchor never defined) is caught at the alias. */
    expect_error_at("datasets:\n"
                    "  a: {kind: files, path: x}\n"
                    "  b: *base\n",
                    3, 6, "anchors and aliases are not allowed", "'*base'", NULL);
    /* A merge key is an alias too. */
    expect_error_at("datasets:\n"
                    "  a: {kind: files, path: x}\n"
                    "  b:\n"
                    "    <<: *a\n",
                    4, 9, "alias '*a'", NULL);
}

static void test_duplicates(void **state)
{
    expect_error_at("datasets:\n"
                    "  a: {kind: files, path: x}\n"
                    "  b: {kind: files, path: y}\n"
                    "  a: {kind: files, path: z}\n",
                    4, 3, "datasets: duplicate dataset 'a' (first at line 2, column 3)", NULL);
    expect_error_at("server:\n  workers: 1\n  prefetch: 2\n  workers: 2\n" ONE_DATASET, 4, 3,
                    "server: duplicate key 'workers' (first at line 2, column 3)", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: x, path: y}\n", 2, 29,
                    "datasets.a: duplicate key 'path' (first at line 2, column 20)", NULL);
    expect_error_at(ONE_DATASET "datasets:\n  b: {kind: files, path: x}\n", 3, 1,
                    "duplicate top-level key 'datasets' (first at line 1, column 1)", NULL);
}

static void test_missing_keys(void **state)
{
    expect_error_at("datasets:\n  a:\n    kind: files\n", 2, 3,
                    "datasets.a: missing required key 'path'", NULL);
    expect_error_at("datasets:\n  a:\n    path: x\n", 2, 3,
                    "datasets.a: missing required key 'kind' (one of files, token_windows, packed, image_folder, sql, tar_shards)", NULL);
    expect_error_at("datasets:\n  ok: {kind: files, path: x}\n  t:\n    kind: token_windows\n"
                    "    path: t.bin\n",
                    3, 3, "datasets.t: missing required key 'context'", NULL);
    expect_error_at("server:\n  workers: 1\n", 1, 1, "missing required top-level key 'datasets'",
                    NULL);
    expect_error_at("server:\n  workers: 1\ndatasets:\n", 3, 1,
                    "datasets: at least one dataset is required", NULL);
    expect_error_at("datasets: {}\n", 1, 11, "datasets: at least one dataset is required", NULL);
}

/* format: what a `files` dataset's files hold (raw by default, or npy arrays). */
static void test_files_format(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n  a: {kind: files, path: x}\n  b: {kind: files, path: x, format: npy}\n",
                               path, sizeof path);
    assert_int_equal(c->datasets[0].format, CONFIG_FORMAT_RAW);
    assert_int_equal(c->datasets[1].format, CONFIG_FORMAT_NPY);
    config_free(c);
    expect_error_at("datasets:\n  a:\n    kind: files\n    path: x\n    format: tiff\n", 5, 13,
                    "datasets.a.format: expected one of raw, npy, got 'tiff'", NULL);
    expect_error_at("datasets:\n  t:\n    kind: token_windows\n    path: x\n    context: 8\n    format: npy\n", 6, 5,
                    "key 'format' is not valid for kind 'token_windows'", NULL);
}

/* A files dataset's manifest: its keys, and what a column list may say. */
static void test_manifest(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  m:\n    kind: files\n    path: /d\n    manifest:\n      path: /d/t.csv\n"
                               "      columns: {img: file, tgt: npy, cls: label, w: float32}\n"
                               "  j:\n    kind: files\n    path: /d\n"
                               "    manifest: {path: /d/t.txt, format: jsonl, columns: {p: file, n: int64}}\n"
                               ,
                               path, sizeof path);
    const struct config_dataset *m = &c->datasets[0], *j = &c->datasets[1];
    assert_string_equal(m->manifest_path, "/d/t.csv");
    assert_int_equal(m->manifest_format, 0);
    assert_int_equal(m->n_columns, 4);
    assert_string_equal(m->columns[0].name, "img");
    assert_int_equal(m->columns[0].type, CONFIG_COLUMN_FILE);
    assert_int_equal(m->columns[1].type, CONFIG_COLUMN_NPY);
    assert_int_equal(m->columns[2].type, CONFIG_COLUMN_LABEL);
    assert_int_equal(m->columns[3].type, CONFIG_COLUMN_FLOAT32);
    assert_int_equal(j->manifest_format, 2);
    assert_int_equal(j->columns[1].type, CONFIG_COLUMN_INT64);
    config_free(c);

#define MAN "datasets:\n  m:\n    kind: files\n    path: x\n    manifest:\n      path: t.csv\n"
    expect_error_at(MAN "      columns: {a: label, b: file}\n", 7, 20,
                    "datasets.m.manifest.columns.a: the first column must be a file or npy column", NULL);
    expect_error_at(MAN "      columns: {a: file, b: blob}\n", 7, 29,
                    "datasets.m.manifest.columns.b: expected one of file, npy, label, int64, float32, got 'blob'", NULL);
    expect_error_at(MAN "      columns: {a: file, label: int64}\n", 7, 33, "the field 'label' is the label column's", NULL);
    expect_error_at(MAN "      columns: {a: file, b: label, c: label}\n", 7, 36, "a second label column", NULL);
    expect_error_at(MAN "      columns: {a: file, a: npy}\n", 7, 26, "duplicate column 'a'", NULL);
    expect_error_at(MAN "      columns: []\n", 7, 16, "expected a mapping of column name to type", NULL);
    expect_error_at(MAN, 6, 7, "missing required key 'columns'", NULL);
    expect_error_at(MAN "      columns: {a: file}\n    format: npy\n", 2, 3, "'format' does not apply with a manifest",
                    NULL);
#undef MAN
}

/* An sql dataset: its keys, and the column types it takes. */
static void test_sql_config(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  s:\n    kind: sql\n    path: /d/x.db\n    query: SELECT id, b FROM t\n    key: id\n"
                               "    columns: {b: blob, label: label}\n    version_query: SELECT 1\n"
                               "    cache: {path: /c/s.ldc}\n    on_error: fail\n",
                               path, sizeof path);
    const struct config_dataset *s = &c->datasets[0];
    assert_int_equal(s->kind, CONFIG_DATASET_SQL);
    assert_string_equal(s->path, "/d/x.db");
    assert_string_equal(s->sql_query, "SELECT id, b FROM t");
    assert_string_equal(s->sql_key, "id");
    assert_string_equal(s->sql_version_query, "SELECT 1");
    assert_int_equal(s->n_columns, 2);
    assert_int_equal(s->columns[0].type, CONFIG_COLUMN_BLOB);
    assert_int_equal(s->columns[1].type, CONFIG_COLUMN_LABEL);
    assert_string_equal(s->cache_path, "/c/s.ldc");
    assert_int_equal(s->on_error, CONFIG_ON_ERROR_FAIL);
    config_free(c);
#define SQLD "datasets:\n  s:\n    kind: sql\n    path: x.db\n    key: id\n"
    expect_error_at(SQLD "    columns: {b: blob}\n", 2, 3, "missing required key 'query'", NULL);
    expect_error_at(SQLD "    query: SELECT 1\n    columns: {b: file}\n", 7, 18,
                    "datasets.s.columns.b: expected one of blob, label, int64, float32, got 'file'", NULL);
    expect_error_at(SQLD "    query: SELECT 1\n    columns: {n: int64, b: blob}\n", 7, 18,
                    "the first column must be a blob column", NULL);
    expect_error_at(SQLD "    query: SELECT 1\n    columns: {b: blob}\n    pattern: \"*\"\n", 8, 5,
                    "key 'pattern' is not valid for kind 'sql'", NULL);
#undef SQLD
    /* PostgreSQL: a connection string (never resolved as a path) instead of `path`. */
    c = load_ok("datasets:\n  p:\n    kind: sql\n    connection: host=/run/postgresql dbname=recs\n"
                "    query: SELECT id, b FROM t\n    key: id\n    columns: {b: blob}\n", path, sizeof path);
    assert_null(c->datasets[0].path);
    assert_string_equal(c->datasets[0].sql_connection, "host=/run/postgresql dbname=recs");
    config_free(c);
#define SQLP "datasets:\n  s:\n    kind: sql\n    query: SELECT 1\n    key: id\n    columns: {b: blob}\n"
    expect_error_at(SQLP, 2, 3, "datasets.s: missing required key 'path' (an SQLite file) or 'connection' (PostgreSQL)",
                    NULL);
    expect_error_at(SQLP "    path: x.db\n    connection: dbname=x\n", 8, 17,
                    "datasets.s: 'path' (an SQLite file) and 'connection' (a PostgreSQL server) exclude each other",
                    NULL);
#undef SQLP
    expect_error_at("datasets:\n  f:\n    kind: files\n    connection: dbname=x\n", 4, 5,
                    "key 'connection' is not valid for kind 'files'", NULL);
    expect_error_at("datasets:\n  f:\n    kind: files\n", 2, 3, "datasets.f: missing required key 'path'", NULL);
}

/* A tar_shards dataset: its own default pattern, the fields mapping, the index file. */
static void test_tar_config(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  t:\n    kind: tar_shards\n    path: /d/shards\n"
                               "  u:\n    kind: tar_shards\n    path: /d/shards\n    pattern: 'train-*.tar'\n"
                               "    fields: {jpg: image, png: image, cls: label, seg.npy: npy, txt: bytes}\n"
                               "    transforms:\n      - center_crop: {size: 32}\n    index: /c/u.idx\n"
                               "    cache: {path: /c/u.ldc}\n  f:\n    kind: files\n    path: /d/f\n",
                               path, sizeof path);
    const struct config_dataset *t = &c->datasets[0], *u = &c->datasets[1];
    assert_int_equal(t->kind, CONFIG_DATASET_TAR_SHARDS);
    assert_string_equal(t->pattern, "*.tar");
    assert_int_equal(t->n_columns, 0);
    assert_null(t->index_path);
    assert_string_equal(u->pattern, "train-*.tar");
    assert_int_equal(u->n_columns, 5);
    assert_string_equal(u->columns[3].name, "seg.npy");
    assert_int_equal(u->columns[0].type, CONFIG_COLUMN_IMAGE);
    assert_int_equal(u->columns[1].type, CONFIG_COLUMN_IMAGE);
    assert_int_equal(u->columns[2].type, CONFIG_COLUMN_LABEL);
    assert_int_equal(u->columns[3].type, CONFIG_COLUMN_NPY);
    assert_int_equal(u->columns[4].type, CONFIG_COLUMN_BYTES);
    assert_int_equal(u->n_transforms, 1);
    assert_string_equal(u->index_path, "/c/u.idx");
    assert_string_equal(c->datasets[2].pattern, "*");       /* the files kind keeps its default */
    config_free(c);
#define TARD "datasets:\n  t:\n    kind: tar_shards\n    path: x\n"
    expect_error_at(TARD "    fields: {jpg: picture}\n", 5, 19,
                    "datasets.t.fields.jpg: expected one of image, label, npy, bytes, got 'picture'", NULL);
    expect_error_at(TARD "    fields: {JPG: image}\n", 5, 14, "lower case", NULL);
    expect_error_at(TARD "    fields: {cls: label, id: label}\n", 5, 30, "a second label suffix", NULL);
    expect_error_at(TARD "    fields: []\n", 5, 13, "expected a mapping of member suffix to type", NULL);
    expect_error_at(TARD "    format: npy\n", 5, 5, "key 'format' is not valid for kind 'tar_shards'", NULL);
    expect_error_at("datasets:\n  f:\n    kind: files\n    path: x\n    index: i\n", 5, 5,
                    "key 'index' is not valid for kind 'files'", NULL);
#undef TARD
}

static void test_kind_specific_keys(void **state)
{
    expect_error_at("datasets:\n"
                    "  records:\n"
                    "    kind: files\n"
                    "    path: x\n"
                    "    context: 8\n",
                    5, 5, "datasets.records: key 'context' is not valid for kind 'files'",
                    "(expected one of: kind, path, pattern, format, manifest, on_error, on_error_warn_fraction, cache, follow_links, max_sample_bytes, read_timeout, read_ahead, weight, max_share, s3)", NULL);
    /* The kind is read first even when it comes last. */
    expect_error_at("datasets:\n"
                    "  t:\n"
                    "    pattern: \"*\"\n"
                    "    context: 8\n"
                    "    path: x\n"
                    "    kind: token_windows\n",
                    3, 5, "key 'pattern' is not valid for kind 'token_windows'",
                    "kind, path, dtype, context, stride", NULL);
    /* read_ahead: files only, 0..1024, 32 by default. */
    expect_error_at("datasets:\n"
                    "  t:\n"
                    "    kind: token_windows\n"
                    "    path: x\n"
                    "    context: 8\n"
                    "    read_ahead: 4\n",
                    6, 5, "key 'read_ahead' is not valid for kind 'token_windows'", NULL);
    expect_error_at("datasets:\n"
                    "  r:\n"
                    "    kind: files\n"
                    "    path: x\n"
                    "    read_ahead: 2000\n",
                    5, 17, "read_ahead", NULL);
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  a: {kind: files, path: x}\n"
                               "  b: {kind: files, path: x, read_ahead: 0}\n",
                               path, sizeof path);
    assert_int_equal(c->datasets[0].read_ahead, 32);
    assert_int_equal(c->datasets[1].read_ahead, 0);
    config_free(c);
}

static void test_cache_section(void **state)
{
    char path[PATH_MAX];
    /* Present means auto, stat fingerprint; the path is resolved like the dataset's. */
    struct config *c = load_ok("datasets:\n"
                               "  a:\n"
                               "    kind: files\n"
                               "    path: x\n"
                               "    cache: {path: cache/a.ldcache}\n"
                               "  b:\n"
                               "    kind: files\n"
                               "    path: y\n"
                               "    cache:\n"
                               "      path: /var/cache/b.ldcache\n"
                               "      mode: rebuild\n"
                               "      fingerprint: content\n"
                               "  c: {kind: files, path: z}\n"
                               "  d: {kind: packed, path: /data/shipped.ldcache}\n",
                               path, sizeof path);
    assert_int_equal(c->n_datasets, 4);
    assert_int_equal(c->datasets[0].cache_mode, CONFIG_CACHE_AUTO);
    assert_int_equal(c->datasets[0].cache_fingerprint, 0);
    assert_non_null(strstr(c->datasets[0].cache_path, "/cache/a.ldcache"));
    assert_true(c->datasets[0].cache_path[0] == '/');
    assert_int_equal(c->datasets[1].cache_mode, CONFIG_CACHE_REBUILD);
    assert_int_equal(c->datasets[1].cache_fingerprint, 1);
    assert_string_equal(c->datasets[1].cache_path, "/var/cache/b.ldcache");
    assert_int_equal(c->datasets[2].cache_mode, CONFIG_CACHE_OFF);
    assert_null(c->datasets[2].cache_path);
    assert_int_equal(c->datasets[3].kind, CONFIG_DATASET_PACKED);
    assert_string_equal(c->datasets[3].path, "/data/shipped.ldcache");
    config_free(c);

    expect_error_at("datasets:\n  a:\n    kind: files\n    path: x\n    cache: {path: p, mode: sometimes}\n", 5, 28,
                    "datasets.a.cache.mode: expected one of auto, off, rebuild, got 'sometimes'", NULL);
    expect_error_at("datasets:\n  a:\n    kind: files\n    path: x\n    cache: {mode: auto}\n", 5, 12,
                    "datasets.a.cache: missing required key 'path'", NULL);
    expect_error_at("datasets:\n  a:\n    kind: files\n    path: x\n    cache: {path: p, size: 3}\n", 5, 22,
                    "unknown key 'size' in 'datasets.a.cache' (expected one of: path, mode, fingerprint)", NULL);
    expect_error_at("datasets:\n  a:\n    kind: files\n    path: x\n    cache: yes\n", 5, 12,
                    "datasets.a.cache: expected a mapping", NULL);
    expect_error_at("datasets:\n  t:\n    kind: token_windows\n    path: x\n    context: 4\n    cache: {path: p}\n", 6, 5,
                    "key 'cache' is not valid for kind 'token_windows'", NULL);
}

static void test_transforms(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  im:\n"
                               "    kind: image_folder\n"
                               "    path: imgs\n"
                               "    on_error: fail\n"
                               "    transforms:\n"
                               "      - decode: {max_pixels: 1000000, strict: true}\n"
                               "      - random_resized_crop: {size: 224, scale: [0.2, 1.0], ratio: [0.75, 1.3333]}\n"
                               "      - random_flip: {p: 0.25}\n"
                               "      - plugin: {path: plug/x.so, params: {amount: 3, name: soft, on: true}}\n"
                               "      - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n"
                               "      - to_dtype: {dtype: float16, layout: HWC}\n",
                               path, sizeof path);
    const struct config_dataset *d = &c->datasets[0];
    assert_int_equal(d->kind, CONFIG_DATASET_IMAGE_FOLDER);
    assert_int_equal(d->on_error, CONFIG_ON_ERROR_FAIL);
    assert_true(d->on_error_warn_fraction == 0.001);        /* the default */
    assert_int_equal(d->n_transforms, 6);
    assert_int_equal(d->transforms[0].kind, TRANSFORM_DECODE);
    assert_true(d->transforms[0].decode.max_pixels == 1000000);
    assert_true(d->transforms[0].decode.strict);
    assert_int_equal(d->transforms[1].random_resized_crop.height, 224);
    assert_int_equal(d->transforms[1].random_resized_crop.width, 224);
    assert_true(d->transforms[1].random_resized_crop.scale[0] == 0.2);
    assert_true(d->transforms[1].random_resized_crop.ratio[1] == 1.3333);
    assert_true(d->transforms[2].random_flip.p == 0.25);
    assert_non_null(strstr(d->transforms[3].plugin.path, "/plug/x.so"));
    assert_string_equal(d->transforms[3].plugin.params_json, "{\"amount\":3,\"name\":\"soft\",\"on\":true}");
    assert_int_equal(d->transforms[4].normalize.n_mean, 3);
    assert_true(d->transforms[4].normalize.std[2] == 0.225);
    assert_int_equal(d->transforms[5].to_dtype.dtype, LD_DTYPE_FLOAT16);
    assert_int_equal(d->transforms[5].to_dtype.layout, TRANSFORM_LAYOUT_HWC);
    config_free(c);

#define IM "datasets:\n  im:\n    kind: image_folder\n    path: x\n    transforms:\n"
    expect_error_at(IM "      - blur: {radius: 2}\n", 6, 9, "datasets.im.transforms[0]: unknown transform 'blur'", NULL);
    expect_error_at(IM "      - random_flip: {q: 1}\n", 6, 23, "datasets.im.transforms[0].random_flip: unknown parameter 'q'",
                    NULL);
    expect_error_at(IM "      - resize: {size: -3}\n", 6, 24,
                    "datasets.im.transforms[0].resize.size: expected an integer in [1, 16384]", NULL);
    expect_error_at(IM "      - center_crop: {size: 8}\n      - random_resized_crop: {size: 8, ratio: [1]}\n", 7, 47,
                    "transforms[1].random_resized_crop.ratio: expected a list of 2 to 2 numbers, got 1", NULL);
    expect_error_at(IM "      - to_dtype: {dtype: int8}\n", 6, 27,
                    "transforms[0].to_dtype.dtype: expected one of uint8, float16, float32, got 'int8'", NULL);
    expect_error_at(IM "      - plugin: {params: {a: 1}}\n", 6, 9, "transforms[0].plugin: missing required parameter 'path'",
                    NULL);
    expect_error_at(IM "      - center_crop: {size: 8, height: 4}\n", 6, 32, "give either size or height and width", NULL);
    expect_error_at(IM "      random_flip\n", 6, 7, "datasets.im.transforms: expected a list of transforms", NULL);
    expect_error_at("datasets:\n  im:\n    kind: image_folder\n    path: x\n", 2, 3,
                    "datasets.im: missing required key 'transforms'", NULL);
    /* Where errors found only when the dataset opens are reported: the transform they
     * name, else the path. */
    c = load_ok("datasets:\n  im:\n    kind: image_folder\n    transforms:\n      - center_crop: {size: 8}\n"
                "      - plugin: {path: /p.so}\n    path: imgs\n", path, sizeof path);
    const struct config_dataset *im = &c->datasets[0];
    struct config_pos at = config_dataset_error_at(im, "dataset 'im': transforms[1] (plugin): cannot load");
    assert_int_equal(at.line, 6);
    assert_int_equal(at.column, 9);
    at = config_dataset_error_at(im, "dataset 'im': transforms[0] (center_crop): x");
    assert_int_equal(at.line, 5);
    at = config_dataset_error_at(im, "dataset 'im': transforms[7] (x): beyond the list");
    assert_int_equal(at.line, 7);
    assert_int_equal(at.column, 5);
    at = config_dataset_error_at(im, "dataset 'im': cannot open 'imgs': No such file or directory");
    assert_int_equal(at.line, 7);
    assert_int_equal(at.column, 5);
    config_free(c);
    /* The share of replaced samples per epoch above which loaderd warns. */
    c = load_ok("datasets:\n  f:\n    kind: files\n    path: x\n    on_error_warn_fraction: 0.05\n", path,
                sizeof path);
    assert_true(c->datasets[0].on_error_warn_fraction == 0.05);
    config_free(c);
    expect_error_at("datasets:\n  f:\n    kind: files\n    path: x\n    on_error_warn_fraction: 2\n", 5, 29,
                    "datasets.f.on_error_warn_fraction: expected a number in [0, 1], got '2'", NULL);
    expect_error_at("datasets:\n  f:\n    kind: files\n    path: x\n    on_error_warn_fraction: [1]\n", 5, 29,
                    "datasets.f.on_error_warn_fraction: expected a number in [0, 1], got a sequence", NULL);
    expect_error_at("datasets:\n  t:\n    kind: token_windows\n    path: x\n    context: 4\n"
                    "    on_error_warn_fraction: 0.1\n", 6, 5, "key 'on_error_warn_fraction' is not valid for kind "
                    "'token_windows'", NULL);
    /* An unknown parameter names the valid ones. */
    expect_error_at(IM "      - random_flip: {prob: 0.5}\n", 6, 23,
                    "datasets.im.transforms[0].random_flip: unknown parameter 'prob' (expected one of: p)", NULL);
    expect_error_at(IM "      - decode: {dct: true}\n", 6, 18, "unknown parameter 'dct' (expected one of: "
                    "max_pixels, strict, dct_scaling, fast)", NULL);
    /* What only the list as a whole can tell is checked when the config loads, points at
     * the parameter or transform at fault, and counts from 0 like the rest. */
    expect_error_at(IM "      - center_crop: {size: 8}\n      - random_flip: {}\n"
                       "      - normalize: {mean: [0.5, 0.4], std: [0.2]}\n", 8, 21,
                    "datasets.im.transforms[2] (normalize): mean has 2 values, expected 3 (or 1 for every channel)",
                    NULL);
    expect_error_at(IM "      - center_crop: {size: 8}\n      - normalize: {mean: [0.5], std: [0.2, 0, 0.1]}\n", 7, 34,
                    "datasets.im.transforms[1] (normalize): std[1] is 0", NULL);
    expect_error_at(IM "      - random_resized_crop: {size: 8, scale: [0.5, 0.2]}\n", 6, 40,
                    "datasets.im.transforms[0] (random_resized_crop): scale [0.5, 0.2] must satisfy", NULL);
    expect_error_at(IM "      - random_resized_crop:\n          size: 8\n          ratio: [2, 1]\n", 8, 11,
                    "datasets.im.transforms[0] (random_resized_crop): ratio [2, 1] must satisfy", NULL);
    expect_error_at(IM "      - center_crop: {size: 8}\n      - decode: {}\n", 7, 9,
                    "datasets.im.transforms[1] (decode): must be the first transform", NULL);
    expect_error_at(IM "      - resize: {height: 8}\n", 6, 9,
                    "datasets.im.transforms[0] (resize): height 8 and width 0 must be in [1, 16384]", NULL);
    expect_error_at(IM "      - resize: {height: 8, size: 4}\n", 6, 29,
                    "datasets.im.transforms[0].resize: give either size or height and width, not both", NULL);
    expect_error_at(IM "      - center_crop: {size: 8}\n      - normalize: {mean: [0.5], std: [0.5]}\n"
                       "      - to_dtype: {dtype: uint8}\n", 7, 9,
                    "datasets.im.transforms[1] (normalize): the output dtype is uint8", NULL);
    expect_error_at(IM "      - to_dtype: {}\n      - center_crop: {size: 8}\n", 7, 9,
                    "datasets.im.transforms[1] (center_crop): must come before normalize and to_dtype", NULL);
    /* The list's own faults point at `transforms:`. */
    expect_error_at(IM "      - random_flip: {}\n      - resize: {size: 8}\n", 5, 5,
                    "datasets.im.transforms: the output size depends on the image", NULL);
    expect_error_at(IM "      - decode: {max_pixels: 10}\n      - center_crop: {size: 8}\n", 5, 5,
                    "datasets.im.transforms: the output 8x8 is over the pixel limit of 10", NULL);
#undef IM
}

/* The transforms' names and parameters come from each transform's own schema
 * (transform.h), walked by the generic loader: every name and every parameter of
 * every schema is known to the loader, the messages list them from that one table,
 * and each parameter's error points at its own line and column. */
static void test_transform_schemas(void **state)
{
    (void)state;
    char yaml[1024], want[512], names[256];
    /* An unknown name lists every transform, from the one table. */
    snprintf(want, sizeof want, "datasets.im.transforms[0]: unknown transform 'blur' (expected one of: %s)",
             transform_names(names, sizeof names));
    expect_error_at(IM_HEAD "      - blur: {radius: 2}\n", 6, 9, want, NULL);
    for (int k = TRANSFORM_DECODE; k <= TRANSFORM_PLUGIN; k++) {
        const struct transform_schema *sc = transform_schema_of((enum transform_kind)k);
        assert_non_null(sc);
        assert_non_null(strstr(names, sc->name));
        /* An unknown parameter lists the schema's, in its order. */
        char list[256] = "";
        for (size_t i = 0; i < sc->n_params; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", sc->params[i].name);
        snprintf(yaml, sizeof yaml, IM_HEAD "      - %s: {nope: 1}\n", sc->name);
        snprintf(want, sizeof want, "datasets.im.transforms[0].%s: unknown parameter 'nope' (expected one of: %s)",
                 sc->name, list);
        expect_error_at(yaml, 6, (int)strlen(sc->name) + 12, want, NULL);
        /* Each parameter is known and its bad value is reported where it is, under its
         * full name. A mapping with a sequence for a key is no valid value of any type
         * (not even JSON, whose keys are strings). The transform sits second in the
         * list and in block style, so the position is the parameter's own. */
        for (size_t i = 0; i < sc->n_params; i++) {
            const char *pn = sc->params[i].name;
            snprintf(yaml, sizeof yaml, IM_HEAD "      - center_crop: {size: 8}\n      - %s:\n"
                     "          # a comment line\n          %s: {[1]: 2}\n", sc->name, pn);
            snprintf(want, sizeof want, "datasets.im.transforms[1].%s.%s: ", sc->name, pn);
            expect_error_at(yaml, 9, (int)strlen(pn) + 13, want, NULL);
        }
    }
    /* A transform that cannot follow another: the whole-list check's message keeps the
     * position of the parameter or transform it blames, in block style too. */
    expect_error_at(IM_HEAD "      - center_crop:\n          size: 8\n      - normalize:\n          mean: [0.5]\n"
                            "          std:\n            - 0.2\n            - 0.3\n", 10, 11,
                    "datasets.im.transforms[1] (normalize): std has 2 values, expected 3", NULL);
    expect_error_at(IM_HEAD "      - random_resized_crop:\n          size: 8\n          scale: [0.5, 0.2]\n", 8, 11,
                    "datasets.im.transforms[0] (random_resized_crop): scale [0.5, 0.2] must satisfy", NULL);
    /* A missing height is blamed on the transform when no `size` stands for it. */
    expect_error_at(IM_HEAD "      - center_crop:\n          width: 8\n", 6, 9,
                    "datasets.im.transforms[0] (center_crop): height 0 and width 8 must be in [1, 16384]", NULL);
}

static void test_dataset_names(void **state)
{
    expect_error_at("datasets:\n  a: {kind: files, path: x}\n  \"b c\": {kind: files, path: x}\n",
                    3, 3, "datasets: invalid dataset name 'b c'", NULL);
    char text[256], name[80];
    memset(name, 'n', 64);
    name[64] = '\0';
    snprintf(text, sizeof text, "datasets:\n  %s: {kind: files, path: x}\n", name);
    expect_error_at(text, 2, 3, "invalid dataset name", NULL);
    name[63] = '\0'; /* 63 characters are fine */
    snprintf(text, sizeof text, "datasets:\n  %s: {kind: files, path: x}\n", name);
    char path[PATH_MAX];
    struct config *c = load_ok(text, path, sizeof path);
    assert_string_equal(c->datasets[0].name, name);
    config_free(c);
}

static void test_too_many_datasets(void **state)
{
    size_t size = (CONFIG_MAX_DATASETS + 1) * 48 + 32;
    char *text = malloc(size);
    assert_non_null(text);
    size_t off = (size_t)snprintf(text, size, "datasets:\n");
    for (int i = 0; i <= CONFIG_MAX_DATASETS; i++)
        off += (size_t)snprintf(text + off, size - off, "  d%d: {kind: files, path: x}\n", i);
    expect_error_at(text, CONFIG_MAX_DATASETS + 2, 3, "more than 256 datasets", NULL);

    /* Exactly the maximum is accepted. */
    *strstr(text, "  d256:") = '\0';
    char path[PATH_MAX];
    struct config *c = load_ok(text, path, sizeof path);
    assert_int_equal(c->n_datasets, CONFIG_MAX_DATASETS);
    assert_string_equal(c->datasets[255].name, "d255");
    config_free(c);
    free(text);
}

static void test_syntax_errors(void **state)
{
    /* An unclosed flow mapping: libyaml notices at the end of the input. */
    expect_error_at("datasets:\n  a: {kind: files, path: x\n", 3, 1, "YAML syntax error",
                    "while parsing a flow mapping at line 2, column 6", NULL);
    /* A key indented less than its siblings. */
    expect_error_at("server:\n  workers: 1\n prefetch: 2\n" ONE_DATASET, 3, 2,
                    "YAML syntax error", NULL);
    /* A tab for indentation. */
    expect_error_at("server:\n\tworkers: 1\n" ONE_DATASET, 2, 1, "YAML syntax error", NULL);
    /* Invalid UTF-8 is a reader error: its position is counted from the byte offset. */
    expect_error_at("server:\n  log_level: x\xff\n", 2, 15, "YAML syntax error",
                    "invalid", NULL);
    /* A second document. */
    expect_error_at(ONE_DATASET "---\n" ONE_DATASET, 3, 1, "second YAML document", NULL);
    /* Nesting deeper than any config needs. */
    expect_error_at("datasets:\n  a: [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]\n", 2, 20,
                    "nested deeper than 16 levels", NULL);
}

static void test_empty_file(void **state)
{
    expect_error_at("", 1, 1, "the file is empty", NULL);
    expect_error_at("# only a comment\n\n", 1, 1, "the file is empty", NULL);
    /* A document with no content: libyaml places its empty root after the "---". */
    expect_error_at("---\n", 2, 1, "the top level must be a mapping", "null", NULL);
}

/* Scheduling keys: a dataset's weight and max_share, and clients by uid or user name. */
static void test_scheduling_keys(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n"
                               "  a: {kind: files, path: x, weight: 7, max_share: 0.5}\n"
                               "  b: {kind: files, path: x}\n"
                               "clients:\n"
                               "  \"1234\": {weight: 3, max_share: 0.25}\n"
                               "  root: {weight: 2}\n"
                               "  \"77\":\n",
                               path, sizeof path);
    assert_int_equal(c->datasets[0].weight, 7);
    assert_true(c->datasets[0].max_share == 0.5);
    assert_int_equal(c->datasets[1].weight, 1);
    assert_true(c->datasets[1].max_share == 1.0);
    assert_int_equal(c->n_clients, 3);
    const struct config_client *cl = config_client_for_uid(c, 1234);
    assert_non_null(cl);
    assert_int_equal(cl->weight, 3);
    assert_true(cl->max_share == 0.25);
    cl = config_client_for_uid(c, 0); /* root, by name */
    assert_non_null(cl);
    assert_int_equal(cl->weight, 2);
    assert_true(cl->max_share == 1.0);
    cl = config_client_for_uid(c, 77); /* no mapping: the defaults */
    assert_non_null(cl);
    assert_int_equal(cl->weight, 1);
    assert_null(config_client_for_uid(c, 4321));
    config_free(c);

    c = load_ok("server:\n  prefetch: auto\n" ONE_DATASET, path, sizeof path);
    assert_int_equal(c->prefetch, 0); /* auto: streams that do not say adapt (prefetch.h) */
    config_free(c);
    expect_error_at("server:\n  prefetch: 0\n" ONE_DATASET, 2, 13,
                    "server.prefetch: expected an integer in [1, 64] or auto, got '0'", NULL);

    expect_error_at(ONE_DATASET "clients:\n  \"0\": {weight: 2}\n  root: {weight: 3}\n", 5, 3,
                    "clients: 'root' is uid 0, which an earlier entry already names", NULL);
    expect_error_at(ONE_DATASET "clients:\n  \"1\": {max_share: 0}\n", 4, 20,
                    "clients.1.max_share: expected a fraction above 0", NULL);
    expect_error_at(ONE_DATASET "clients:\n  \"1\": {weight: 1001}\n", 4, 17,
                    "clients.1.weight: expected an integer in [1, 1000], got '1001'", NULL);
    expect_error_at(ONE_DATASET "clients:\n  \"1\": {wieght: 2}\n", 4, 9,
                    "unknown key 'wieght' in 'clients.1' (expected one of: weight, max_share)", NULL);
    expect_error_at(ONE_DATASET "clients:\n  \"-5\": {}\n", 4, 3, "clients: uid -5 is out of range", NULL);
    expect_error_at(ONE_DATASET "clients:\n  - 1000\n", 4, 3, "clients: expected a mapping of uid or user name",
                    NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: x, max_share: 0}\n", 2, 40,
                    "datasets.a.max_share: expected a fraction above 0", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: x, max_share: 1.5}\n", 2, 40,
                    "datasets.a.max_share: expected a number in [0, 1], got '1.5'", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: x, weight: 0}\n", 2, 37,
                    "datasets.a.weight: expected an integer in [1, 1000], got '0'", NULL);
}

/* access: users and groups by name or number, rules per dataset, in any order with
 * datasets:; typos fail at load with their position. */
static void test_access_section(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok("access:\n"
                               "  connect: {users: [root, 1234], groups: [root, \"77\"]}\n"
                               "  operators: {users: 0}\n"
                               "  datasets:\n"
                               "    b: {groups: [0]}\n"
                               "datasets:\n"
                               "  a: {kind: files, path: x}\n"
                               "  b: {kind: files, path: x}\n",
                               path, sizeof path);
    const struct access_config *a = &c->access;
    assert_true(a->connect.set);
    assert_int_equal(a->connect.n_uids, 2);
    assert_int_equal(a->connect.uids[0], 0);
    assert_int_equal(a->connect.uids[1], 1234);
    assert_int_equal(a->connect.n_gids, 2);
    assert_int_equal(a->connect.gids[1], 77);
    assert_true(a->operators.set);
    assert_int_equal(a->operators.n_uids, 1);
    assert_int_equal(a->operators.n_gids, 0);
    assert_null(access_dataset_rule(a, "a"));
    const struct access_rule *rb = access_dataset_rule(a, "b");
    assert_non_null(rb);
    assert_int_equal(rb->n_gids, 1);
    /* The checks: a listed uid, a listed group (primary or supplementary), and no one
     * else; the daemon's own uid and root pass everything. */
    uint32_t extra[2] = {5, 77};
    struct access_peer p = {.uid = 1234, .gid = 9};
    assert_true(access_allows(&a->connect, &p, 999));
    p = (struct access_peer){.uid = 4000, .gid = 9};
    assert_false(access_allows(&a->connect, &p, 999));
    assert_true(access_allows(&a->connect, &p, 4000)); /* the daemon's own user */
    p.groups = extra;
    p.n_groups = 2;
    assert_true(access_allows(&a->connect, &p, 999)); /* supplementary group 77 */
    p = (struct access_peer){.uid = 4000, .gid = 77};
    assert_true(access_allows(&a->connect, &p, 999)); /* primary group 77 */
    assert_false(access_allows(&a->operators, &p, 999));
    assert_true(access_allows(NULL, &p, 999));       /* no rule: everyone */
    assert_true(access_allows(&c->access.connect, &(struct access_peer){.uid = 0, .gid = 5}, 999));
    char buf[256];
    access_describe_rule(&a->connect, buf, sizeof buf);
    assert_string_equal(buf, "users 0 (root), 1234; groups 0 (root), 77");
    access_describe_rule(&a->connect, buf, 12); /* cut, never overrun */
    assert_int_equal(strlen(buf), 11);
    config_free(c);

    /* No section: no rule is set, everyone passes. */
    c = load_ok(ONE_DATASET, path, sizeof path);
    assert_false(c->access.connect.set);
    assert_false(c->access.operators.set);
    assert_int_equal(c->access.n_datasets, 0);
    config_free(c);

    expect_error_at(ONE_DATASET "access:\n  connect: {users: [no-such-user-xyz]}\n", 4, 21,
                    "access.connect.users[0]: no user named 'no-such-user-xyz' (give a user name or a uid)", NULL);
    expect_error_at(ONE_DATASET "access:\n  operators: {groups: [no-such-group-xyz]}\n", 4, 24,
                    "access.operators.groups[0]: no group named 'no-such-group-xyz'", NULL);
    expect_error_at(ONE_DATASET "access:\n  connect: {users: [\"-1\"]}\n", 4, 21,
                    "access.connect.users[0]: uid -1 is out of range", NULL);
    expect_error_at(ONE_DATASET "access:\n  connect: {user: [root]}\n", 4, 13,
                    "access.connect: unknown key 'user' (expected users or groups)", NULL);
    expect_error_at(ONE_DATASET "access:\n  conect: {users: [root]}\n", 4, 3,
                    "access: unknown key 'conect' (expected connect, operators, datasets or declare)", NULL);
    expect_error_at(ONE_DATASET "access:\n  connect: [root]\n", 4, 12,
                    "access.connect: expected a mapping with users and groups, got a sequence", NULL);
    expect_error_at(ONE_DATASET "access:\n  connect: {users: {a: 1}}\n", 4, 20,
                    "access.connect.users: expected a list of user names or numbers", NULL);
    expect_error_at("access:\n  datasets:\n    nope: {users: [root]}\n" ONE_DATASET, 3, 5,
                    "access.datasets: no dataset named 'nope' under datasets:", NULL);
}

/* access.declare: a list of grants (or one), roots kept clean, flags off by default;
 * a grant is found by who the peer is. */
static void test_access_declare(void **state)
{
    char path[PATH_MAX];
    struct config *c = load_ok(ONE_DATASET "access:\n"
                               "  declare:\n"
                               "    - {users: [1234], roots: [/data//vision/, /scratch], caches: true,\n"
                               "       cache_dir: /var/cache/ld//declared/, cache_quota: 2GiB}\n"
                               "    - {groups: [77], roots: /home/x, plugins: yes}\n"
                               "    - {roots: [/pub]}\n",
                               path, sizeof path);
    const struct access_config *a = &c->access;
    assert_int_equal(a->n_declare, 3);
    assert_int_equal(a->declare[0].n_roots, 2);
    assert_string_equal(a->declare[0].roots[0], "/data/vision");
    assert_true(a->declare[0].caches);
    assert_string_equal(a->declare[0].cache_dir, "/var/cache/ld/declared");
    assert_int_equal(a->declare[0].cache_quota, 2ull << 30);
    assert_false(a->declare[0].plugins);
    assert_null(a->declare[1].cache_dir);
    assert_string_equal(a->declare[1].roots[0], "/home/x");
    assert_true(a->declare[1].plugins);
    assert_false(a->declare[2].rule.set); /* no users or groups: everyone */
    struct access_peer p = {.uid = 1234, .gid = 9};
    size_t pos = 0;
    assert_ptr_equal(access_declare_next(a, &p, 999, &pos), &a->declare[0]);
    assert_ptr_equal(access_declare_next(a, &p, 999, &pos), &a->declare[2]);
    assert_null(access_declare_next(a, &p, 999, &pos));
    /* The dataset's definition is kept as JSON, for templates. */
    assert_string_equal(c->dataset_json[0], "{\"kind\":\"files\",\"path\":\"x\"}");
    config_free(c);
    /* One mapping is a list of one. */
    c = load_ok(ONE_DATASET "access:\n  declare: {roots: [/d]}\n", path, sizeof path);
    assert_int_equal(c->access.n_declare, 1);
    config_free(c);

    expect_error_at(ONE_DATASET "access:\n  declare: {users: [root]}\n", 4, 12,
                    "access.declare: missing required key 'roots'", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: {roots: [data]}\n", 4, 21,
                    "access.declare.roots[0]: expected an absolute directory, got 'data'", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: {roots: [/a/../etc]}\n", 4, 21,
                    "access.declare.roots[0]: '/a/../etc' has a '..' component", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: {roots: [/]}\n", 4, 21,
                    "access.declare.roots[0]: '/' cannot be a root", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], cache: true}]\n", 4, 27,
                    "access.declare[0]: unknown key 'cache' (expected users, groups, roots, caches, cache_dir, "
                    "cache_quota or plugins)", NULL);
    /* A grant of caches says where they go and how much each user may keep. */
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], caches: true}]\n", 4, 13,
                    "access.declare[0]: caches: true needs cache_dir", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], caches: true, cache_dir: /c}]\n", 4, 13,
                    "and cache_quota", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], cache_dir: /c}]\n", 4, 27,
                    "access.declare[0]: cache_dir and cache_quota belong to a grant with caches: true", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], caches: true, cache_dir: /c, cache_quota: 0}]"
                    "\n", 4, 69, "access.declare[0].cache_quota: expected a size in bytes above 0", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], caches: true, cache_dir: c, cache_quota: 1G}]"
                    "\n", 4, 52, "access.declare[0].cache_dir: expected an absolute directory", NULL);
    expect_error_at(ONE_DATASET "access:\n  declare: [{roots: [/a], plugins: maybe}]\n", 4, 36,
                    "access.declare[0].plugins: ", NULL);

    /* A cache_dir that exists is the daemon's, written by nobody else, and never a link. */
    char top[] = "/tmp/ld-cachedir-XXXXXX", dir[PATH_MAX], link[PATH_MAX], text[2 * PATH_MAX];
    assert_non_null(mkdtemp(top));
    snprintf(dir, sizeof dir, "%s/dc", top);
    snprintf(link, sizeof link, "%s/link", top);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(symlink(dir, link), 0);
#define CACHE_DIR_CONFIG ONE_DATASET "access:\n  declare: [{roots: [/a], caches: true, cache_dir: %s, cache_quota: 1G}]\n"
    snprintf(text, sizeof text, CACHE_DIR_CONFIG, dir);
    config_free(load_ok(text, path, sizeof path));
    assert_int_equal(chmod(dir, 0770), 0);
    expect_error_at(text, 4, 52, "access.declare[0].cache_dir: '", "' belongs to uid", "with mode 0770: it must be "
                    "the daemon's", "and writable by nobody else", NULL);
    assert_int_equal(chmod(dir, 0702), 0);
    expect_error_at(text, 4, 52, "with mode 0702", NULL);
    assert_int_equal(chmod(dir, 0755), 0);
    config_free(load_ok(text, path, sizeof path));
    snprintf(text, sizeof text, CACHE_DIR_CONFIG, link);
    expect_error_at(text, 4, 52, "access.declare[0].cache_dir: '", "/link' is not a directory (a symbolic link is "
                    "not followed)", NULL);
    /* Missing: created (mode 0700) by the first declared cache. */
    snprintf(link, sizeof link, "%s/none", top);
    snprintf(text, sizeof text, CACHE_DIR_CONFIG, link);
    config_free(load_ok(text, path, sizeof path));
    snprintf(link, sizeof link, "%s/link", top);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(rmdir(top), 0);
#undef CACHE_DIR_CONFIG
}

/* Loads `json` as a trainer's spec and as the dataset "spec" of a config file; both
 * fail, and the spec's message is the file's without its position. */
static void spec_fails_as_file(const char *json, const char *want)
{
    char path[PATH_MAX], text[4096], errbuf[LD_ERRMSG_MAX], spec_err[LD_ERRMSG_MAX], expect[LD_ERRMSG_MAX];
    struct config *c = untouched;
    snprintf(text, sizeof text, "datasets:\n  spec: %s\n", json);
    assert_int_equal(load_text(text, path, sizeof path, &c, errbuf), LD_ECONFIG);
    assert_int_equal(config_load_spec(json, strlen(json), "/data", &c, spec_err), LD_ECONFIG);
    assert_ptr_equal(c, untouched);
    /* The file's message after "PATH:LINE:COL: ", with "datasets.spec" read as "spec". */
    const char *m = errbuf + strlen(path) + 1;
    m = strchr(strchr(m, ':') + 1, ':') + 2;
    size_t n = 0;
    while (*m && n + 1 < sizeof expect) {
        if (strncmp(m, "datasets.spec", 13) == 0) {
            memcpy(expect + n, "spec", 4);
            n += 4;
            m += 13;
        } else {
            expect[n++] = *m++;
        }
    }
    expect[n] = '\0';
    assert_string_equal(spec_err, expect);
    if (!strstr(spec_err, want))
        fail_msg("spec message '%s' lacks '%s'", spec_err, want);
}

/* A trainer's spec goes through the config's own tables: the same dataset, and the same
 * messages placed at the spec's keys. */
static void test_spec(void **state)
{
    struct config *c = NULL;
    char err[LD_ERRMSG_MAX];
    const char *ok = "{\"kind\":\"files\",\"path\":\"train\",\"pattern\":\"*.bin\",\"on_error\":\"fail\"}";
    assert_int_equal(config_load_spec(ok, strlen(ok), "/data", &c, err), 0);
    assert_int_equal(c->n_datasets, 1);
    assert_string_equal(c->datasets[0].name, "spec");
    assert_int_equal(c->datasets[0].kind, CONFIG_DATASET_FILES);
    assert_string_equal(c->datasets[0].path, "/data/train");
    assert_string_equal(c->datasets[0].pattern, "*.bin");
    assert_int_equal(c->datasets[0].on_error, CONFIG_ON_ERROR_FAIL);
    config_free(c);
    const char *im = "{\"kind\":\"image_folder\",\"path\":\"/abs/im\",\"transforms\":"
                     "[{\"decode\":{}},{\"random_resized_crop\":{\"size\":32}}]}";
    if (config_load_spec(im, strlen(im), "/data", &c, err) != 0)
        fail_msg("spec refused: %s", err);
    assert_string_equal(c->datasets[0].path, "/abs/im");
    assert_int_equal(c->datasets[0].n_transforms, 2);
    config_free(c);

    spec_fails_as_file("{\"kind\":\"files\",\"path\":\"x\",\"patern\":\"*\"}",
                       "unknown key 'patern' in 'spec'");
    spec_fails_as_file("{\"kind\":\"filez\",\"path\":\"x\"}", "spec.kind: ");
    spec_fails_as_file("{\"path\":\"x\"}", "spec: missing required key 'kind'");
    spec_fails_as_file("{\"kind\":\"files\",\"path\":\"x\",\"read_timeout\":-1}", "spec.read_timeout: ");
    spec_fails_as_file("{\"kind\":\"image_folder\",\"path\":\"x\",\"transforms\":[{\"decode\":{}},"
                       "{\"resize\":{\"size\":[0,32]}}]}", "spec.transforms[1]");
    spec_fails_as_file("[1,2]", "spec: expected a mapping with 'kind' and 'path'");
    /* Not a mapping of one line: refused before YAML sees it (no second top-level key). */
    const char *two = "{\"kind\":\"files\",\"path\":\"x\"}\nserver: {workers: 1}";
    c = untouched;
    assert_int_equal(config_load_spec(two, strlen(two), "/data", &c, err), LD_ECONFIG);
    assert_ptr_equal(c, untouched);
    assert_string_equal(err, "spec: expected one line of compact JSON");
    const char *syntax = "{\"kind\": \"files\"";
    assert_int_equal(config_load_spec(syntax, strlen(syntax), "/data", &c, err), LD_ECONFIG);
    if (strncmp(err, "spec: YAML syntax error", 23) != 0)
        fail_msg("syntax error message: %s", err);
}

/* files at an s3:// location: the path kept as written, the s3 keys with their
 * defaults (also without the mapping), and the combinations that cannot work. */
static void test_s3_keys(void **state)
{
    (void)state;
    char path[PATH_MAX];
    struct config *c = load_ok("datasets:\n  a:\n    kind: files\n    path: s3://bkt/train/\n"
                               "    s3: {endpoint: \"http://127.0.0.1:9000\", region: eu-west-3, addressing: path,\n"
                               "         profile: work, credentials_file: creds, part_size: 1MiB, parallel: 4,\n"
                               "         retries: 0, timeout: 7, connect_timeout: 2, list_ttl: 0}\n"
                               "  b: {kind: files, path: s3://bkt}\n", path, sizeof path);
    const struct config_dataset *a = &c->datasets[0], *b = &c->datasets[1];
    assert_string_equal(a->path, "s3://bkt/train/");
    assert_string_equal(a->s3_endpoint, "http://127.0.0.1:9000");
    assert_string_equal(a->s3_region, "eu-west-3");
    assert_int_equal(a->s3_addressing, S3_ADDRESSING_PATH);
    assert_string_equal(a->s3_profile, "work");
    assert_true(a->s3_credentials_file[0] == '/');         /* relative to the config's folder */
    assert_int_equal(a->s3_part_size, 1 << 20);
    assert_int_equal(a->s3_parallel, 4);
    assert_int_equal(a->s3_retries, 0);
    assert_int_equal(a->s3_timeout, 7);
    assert_int_equal(a->s3_connect_timeout, 2);
    assert_int_equal(a->s3_list_ttl, 0);
    assert_string_equal(b->path, "s3://bkt");
    assert_null(b->s3_endpoint);
    assert_int_equal(b->s3_addressing, S3_ADDRESSING_AUTO);
    assert_int_equal(b->s3_retries, 3);
    assert_int_equal(b->s3_parallel, 16);
    assert_int_equal(b->s3_part_size, 8 << 20);
    assert_int_equal(b->s3_list_ttl, 30);
    config_free(c);

    expect_error_at("datasets:\n  a: {kind: files, path: x, s3: {region: r}}\n", 2, 29, "datasets.a.s3: applies to "
                    "an s3://BUCKET/PREFIX path only", NULL);
    expect_error_at("datasets:\n  a: {kind: token_windows, path: s3://bkt/t.bin, context: 8}\n", 2, 34,
                    "an s3:// location is read by the files and tar_shards kinds only, not token_windows", NULL);
    /* tar_shards at s3://: the s3 keys apply; the copies need a place (index or cache). */
    c = load_ok("datasets:\n  t: {kind: tar_shards, path: s3://bkt/shards, index: t.idx, s3: {parallel: 8}}\n", path,
                sizeof path);
    assert_string_equal(c->datasets[0].path, "s3://bkt/shards");
    assert_int_equal(c->datasets[0].s3_parallel, 8);
    assert_int_equal(c->datasets[0].s3_retries, 3);
    config_free(c);
    expect_error_at("datasets:\n  t: {kind: tar_shards, path: s3://bkt/shards}\n", 2, 31, "datasets.t.path",
                    "next to the dataset's `index:`", NULL);
    expect_error_at("datasets:\n  t: {kind: tar_shards, path: x, s3: {region: r}}\n", 2, 34, "datasets.t.s3: applies "
                    "to an s3://BUCKET/PREFIX path only", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: \"s3://b/x\"}\n", 2, 26, "datasets.a.path",
                    "'s3://b/x'", "bucket name of 3 to 63", NULL);
    /* .npy objects are typed samples; a manifest names files of this node. */
    c = load_ok("datasets:\n  a: {kind: files, path: s3://bkt/x, format: npy}\n", path, sizeof path);
    assert_int_equal(c->datasets[0].format, CONFIG_FORMAT_NPY);
    config_free(c);
    expect_error_at("datasets:\n  a: {kind: files, path: s3://bkt/x, manifest: {path: m.csv, columns: {p: file}}}\n",
                    2, 48, "datasets.a.manifest: does not apply to an s3:// location", NULL);
    expect_error_at("datasets:\n  a: {kind: files, path: s3://bkt/x, s3: {addressing: dns}}\n", 2, 55,
                    "datasets.a.s3.addressing: expected one of auto, path, virtual, got 'dns'", NULL);

    /* A dataset a trainer declares may not read the store with the daemon's keys. */
    char errbuf[LD_ERRMSG_MAX];
    const char *spec = "{\"kind\": \"files\", \"path\": \"s3://bkt/x\"}";
    c = NULL;
    assert_int_equal(config_load_spec(spec, strlen(spec), "/tmp", &c, errbuf), LD_ECONFIG);
    assert_null(c);
    assert_non_null(strstr(errbuf, "daemon's credentials"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scheduling_keys),
        cmocka_unit_test(test_access_section),
        cmocka_unit_test(test_access_declare),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_full_config),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_relative_config_path),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_example_config),
        cmocka_unit_test(test_free_partial),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_socket_length),
        cmocka_unit_test(test_aliases_rejected),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_missing_keys),
        cmocka_unit_test(test_kind_specific_keys),
        cmocka_unit_test(test_files_format),
        cmocka_unit_test(test_manifest),
        cmocka_unit_test(test_sql_config),
        cmocka_unit_test(test_tar_config),
        cmocka_unit_test(test_cache_section),
        cmocka_unit_test(test_transforms),
        cmocka_unit_test(test_transform_schemas),
        cmocka_unit_test(test_dataset_names),
        cmocka_unit_test(test_too_many_datasets),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_s3_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
