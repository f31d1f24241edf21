/* Unit tests for config_diff (daemon/config_diff.c), what a reload compares: two loads
 * of one dataset written differently (order, style, comments, another place in the
 * file) are the same definition; a change of any key makes it another; a restart-only
 * server key that changed is reported and the loaded config takes the running value,
 * while a live key is left to apply. Each case writes its YAML to a temporary file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "config_diff.h"
#include "ld_error.h"
#include "proto.h"

static struct config *load(const char *text)
{
    const char *t = getenv("TMPDIR");
    char path[PATH_MAX], err[LD_ERRMSG_MAX];
    snprintf(path, sizeof path, "%s/ld-test-diff-XXXXXX.yaml", t && t[0] == '/' ? t : "/tmp");
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct config *c = NULL;
    int rc = config_load(path, &c, err);
    unlink(path);
    if (rc < 0)
        fail_msg("config_load: %s\nfor:\n%s", err, text);
    return c;
}

static const struct config_dataset *find(const struct config *c, const char *name)
{
    for (size_t i = 0; i < c->n_datasets; i++)
        if (strcmp(c->datasets[i].name, name) == 0)
            return &c->datasets[i];
    fail_msg("no dataset %s", name);
    return NULL;
}

#define IM "  im:\n    kind: image_folder\n    path: img\n    transforms:\n" \
           "      - resize: {size: 40}\n      - center_crop: {size: 32}\n      - normalize: {mean: [0.5], std: [0.25]}\n"
#define FL "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: c.ldc}\n"

static void test_same_definition_written_differently(void **state)
{
    (void)state;
    struct config *a = load("datasets:\n" IM FL);
    struct config *b = load("# moved and restyled\ndatasets:\n"
                            "  fl: {path: rec, kind: files, cache: {path: c.ldc}, pattern: '*.bin'}\n"
                            "  # the pipeline\n"
                            "  im:\n    path: img\n    kind: image_folder\n"
                            "    transforms: [resize: {size: 40}, center_crop: {size: 32},"
                            " normalize: {mean: [0.5], std: [0.25]}]\n");
    assert_true(config_dataset_same(find(a, "im"), find(b, "im")));
    assert_true(config_dataset_same(find(a, "fl"), find(b, "fl")));
    assert_false(config_dataset_same(find(a, "im"), find(b, "fl")));
    config_free(a);
    config_free(b);
}

static void test_any_change_is_another_definition(void **state)
{
    (void)state;
    static const char *const variants[] = {
        "  fl:\n    kind: files\n    path: rec2\n    pattern: '*.bin'\n    cache: {path: c.ldc}\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.dat'\n    cache: {path: c.ldc}\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: d.ldc}\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: c.ldc, mode: rebuild}\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: c.ldc}\n    on_error: fail\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: c.ldc}\n    weight: 2\n",
        "  fl:\n    kind: files\n    path: rec\n    pattern: '*.bin'\n    cache: {path: c.ldc}\n    max_sample_bytes: 4096\n",
    };
    struct config *a = load("datasets:\n" FL);
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "datasets:\n%s", variants[i]);
        struct config *b = load(yaml);
        if (config_dataset_same(find(a, "fl"), find(b, "fl")))
            fail_msg("variant %zu counted as the same:\n%s", i, variants[i]);
        config_free(b);
    }
    config_free(a);
    /* A transform's parameter. */
    a = load("datasets:\n" IM);
    struct config *b = load("datasets:\n  im:\n    kind: image_folder\n    path: img\n    transforms:\n"
                            "      - resize: {size: 40}\n      - center_crop: {size: 32}\n"
                            "      - normalize: {mean: [0.5], std: [0.3]}\n");
    assert_false(config_dataset_same(find(a, "im"), find(b, "im")));
    config_free(a);
    config_free(b);
}

struct reported {
    int n;
    char keys[4][64], running[4][64], file[4][64];
};

static void note(void *ctx, const char *key, const char *running, const char *loaded)
{
    struct reported *r = ctx;
    assert_true(r->n < 4);
    snprintf(r->keys[r->n], 64, "%s", key);
    snprintf(r->running[r->n], 64, "%s", running);
    snprintf(r->file[r->n], 64, "%s", loaded);
    r->n++;
}

static void test_restart_keys_reported_and_kept(void **state)
{
    (void)state;
    struct config *run = load("server:\n  socket: /tmp/a.sock\n  workers: 2\n  max_streams: 8\n"
                              "datasets:\n  fl: {kind: files, path: rec}\n");
    struct config *file = load("server:\n  socket: /tmp/b.sock\n  workers: 3\n  max_streams: 9\n"
                               "datasets:\n  fl: {kind: files, path: rec}\n");
    struct reported r = {0};
    assert_int_equal(config_diff_restart_keys(run, file, note, &r), 2);
    assert_string_equal(r.keys[0], "server.socket");
    assert_string_equal(r.running[0], "/tmp/a.sock");
    assert_string_equal(r.file[0], "/tmp/b.sock");
    assert_string_equal(r.keys[1], "server.workers");
    assert_string_equal(r.running[1], "2");
    assert_string_equal(r.file[1], "3");
    /* The loaded config now says what the daemon runs with; the live key is its own. */
    assert_string_equal(file->socket_path, "/tmp/a.sock");
    assert_int_equal(file->workers, 2);
    assert_int_equal(file->max_streams, 9);
    struct reported none = {0};
    assert_int_equal(config_diff_restart_keys(run, file, note, &none), 0);
    config_free(run);
    config_free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_definition_written_differently),
        cmocka_unit_test(test_any_change_is_another_definition),
        cmocka_unit_test(test_restart_keys_reported_and_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
