/* Unit tests for dataset, source_files and source_tokens: each test builds a small
 * tree or token file in its own temporary directory, opens it through dataset_open()
 * and checks the fields, the sample order, the labels and the bytes read, then the
 * errors a bad source must produce, and that two threads can read at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"

struct tdir {
    char root[256];
};

static int setup(void **state)
{
    struct tdir *t = calloc(1, sizeof *t);
    if (testfs_mkdtemp("ld-test-dataset", t->root, sizeof t->root) < 0) {
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    struct tdir *t = *state;
    int r = testfs_rmtree(t->root);
    free(t);
    return r;
}

/* The content of a test file: distinct per seed, so a mixed-up order shows. */
static void write_raw(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, size), (ssize_t)size);
    close(fd);
}

static struct config_dataset files_cfg(const char *name, char *root, const char *pattern)
{
    return (struct config_dataset){.name = (char *)name, .kind = CONFIG_DATASET_FILES,
                                   .path = root, .pattern = (char *)pattern};
}

static struct config_dataset tokens_cfg(char *path, int dtype, uint32_t context, uint32_t stride)
{
    return (struct config_dataset){.name = "tok", .kind = CONFIG_DATASET_TOKEN_WINDOWS,
                                   .path = path, .token_dtype = dtype, .context = context,
                                   .stride = stride};
}

/* Opens, expecting success; the message buffer must stay untouched then. */
static dataset *open_ok(const struct config_dataset *cfg)
{
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = (dataset *)0x1;
    int r = dataset_open(cfg, &d, err);
    if (r != 0)
        fail_msg("dataset_open: %d %s", r, err);
    assert_non_null(d);
    assert_true(d != (dataset *)0x1);
    return d;
}

/* Opens, expecting `code`; ret_dataset must be left alone. The message in err. */
static void open_fails(const struct config_dataset *cfg, int code, char *err)
{
    dataset *d = (dataset *)0x1;
    err[0] = '\0';
    int r = dataset_open(cfg, &d, err);
    assert_int_equal(r, code);
    assert_ptr_equal(d, (dataset *)0x1);
    assert_true(err[0] != '\0');
}

/* Reads sample i and checks its data against testfs_byte(seed), size bytes, and its
 * label; bytes past `size` in the buffer must stay untouched. */
static void check_sample(const dataset *d, uint64_t i, unsigned seed, size_t size, int64_t label)
{
    char err[LD_ERRMSG_MAX] = "";
    uint8_t *buf = malloc(size + 32);
    int64_t lab = 12345;
    memset(buf, 0xAA, size + 32);
    void *dst[2] = {buf, &lab};
    int r = d->ops->read(d, i, dst, err);
    if (r != 0)
        fail_msg("read %llu: %d %s", (unsigned long long)i, r, err);
    for (size_t j = 0; j < size; j++)
        if (buf[j] != testfs_byte(seed, j))
            fail_msg("sample %llu byte %zu: %u != %u", (unsigned long long)i, j, buf[j],
                     testfs_byte(seed, j));
    for (size_t j = size; j < size + 32; j++)
        assert_int_equal(buf[j], 0xAA);
    assert_int_equal(lab, label);
    free(buf);
}

/* ---- files ------------------------------------------------------------------------ */

static void test_files_fixed(void **state)
{
    struct tdir *t = *state;
    testfs_write(t->root, "class_b/2.bin", 4, 3072);
    testfs_write(t->root, "class_b/1.bin", 3, 3072);
    testfs_write(t->root, "class_a/x.bin", 1, 3072);
    testfs_write(t->root, "class_c/z.bin", 7, 3072);

    struct config_dataset cfg = files_cfg("recs", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_string_equal(dataset_kind(d), "files");
    assert_string_equal(d->name, "recs");
    assert_string_equal(d->source, t->root);
    assert_int_equal(d->count, 4);
    assert_int_equal(d->n_fields, 2);
    assert_string_equal(d->fields[0].name, "data");
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_UINT8);
    assert_int_equal(d->fields[0].ndim, 1);
    assert_int_equal(d->fields[0].shape[0], 3072);
    assert_false(d->fields[0].ragged);
    assert_int_equal(d->fields[0].max_item_bytes, 3072);
    assert_string_equal(d->fields[1].name, "label");
    assert_int_equal(d->fields[1].dtype, LD_DTYPE_INT64);
    assert_int_equal(d->fields[1].ndim, 0);
    assert_false(d->fields[1].ragged);
    assert_int_equal(dataset_row_bytes(d, 0), 3072);
    assert_int_equal(dataset_row_bytes(d, 1), 8);
    assert_int_equal(dataset_row_bytes(d, 2), 0);
    assert_int_equal(dataset_row_bytes(d, -1), 0);

    /* Bytewise path order, labels by sorted class folder. */
    check_sample(d, 0, 1, 3072, 0);    /* class_a/x.bin */
    check_sample(d, 1, 3, 3072, 1);    /* class_b/1.bin */
    check_sample(d, 2, 4, 3072, 1);    /* class_b/2.bin */
    check_sample(d, 3, 7, 3072, 2);    /* class_c/z.bin */

    /* Out of range is refused, not read. */
    char err[LD_ERRMSG_MAX] = "";
    uint8_t buf[3072];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    assert_int_equal(d->ops->read(d, 4, dst, err), LD_EINVAL);
    assert_non_null(strstr(err, "out of range"));
    assert_int_equal(d->ops->item_bytes(d, 4, 0), 0);
    dataset_free(d);
}

static void test_files_pattern(void **state)
{
    struct tdir *t = *state;
    testfs_write(t->root, "a/keep.bin", 1, 16);
    testfs_write(t->root, "a/skip.txt", 2, 16);
    testfs_write(t->root, "b/keep.bin", 3, 16);
    testfs_write(t->root, "b/.hidden.bin", 4, 16);
    testfs_write(t->root, ".hidden_dir/h.bin", 5, 16);
    testfs_write(t->root, "c/only.txt", 6, 16);
    testfs_write(t->root, ".complete", 7, 16);

    /* No '/' in the glob: it matches base names at any depth; c has no match, so it is
     * not a class and b is label 1. */
    struct config_dataset cfg = files_cfg("p", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 2);
    check_sample(d, 0, 1, 16, 0);
    check_sample(d, 1, 3, 16, 1);
    dataset_free(d);

    /* With a '/', the glob is on the whole relative path; '*' does not cross '/'. */
    cfg = files_cfg("p", t->root, "b/*");
    d = open_ok(&cfg);
    assert_int_equal(d->count, 1);
    check_sample(d, 0, 3, 16, 0);
    dataset_free(d);

    cfg = files_cfg("p", t->root, "*/*.txt");
    d = open_ok(&cfg);
    assert_int_equal(d->count, 2);
    check_sample(d, 0, 2, 16, 0);
    check_sample(d, 1, 6, 16, 1);
    dataset_free(d);

    /* No pattern means "*": every file that is not hidden. */
    cfg = files_cfg("p", t->root, NULL);
    d = open_ok(&cfg);
    assert_int_equal(d->count, 4);
    check_sample(d, 0, 1, 16, 0);
    check_sample(d, 1, 2, 16, 0);
    check_sample(d, 2, 3, 16, 1);
    check_sample(d, 3, 6, 16, 2);
    dataset_free(d);
}

static void test_files_nested_and_root(void **state)
{
    struct tdir *t = *state;
    testfs_write(t->root, "a-b/x.bin", 1, 32);
    testfs_write(t->root, "a/deep/er/y.bin", 2, 32);
    testfs_write(t->root, "a/z.bin", 3, 32);
    testfs_write(t->root, "noise/readme.txt", 4, 32);
    testfs_write(t->root, "top.bin", 5, 32);
    testfs_write(t->root, "zz/q.bin", 6, 32);
    testfs_make_dirs(t->root, "empty/");

    /* Paths sort bytewise ('-' < '/'), so "a-b/..." comes before "a/..."; classes sort
     * by name ("a" < "a-b" < "zz"), so the labels are not in path order. */
    struct config_dataset cfg = files_cfg("n", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 5);
    check_sample(d, 0, 1, 32, 1);      /* a-b/x.bin */
    check_sample(d, 1, 2, 32, 0);      /* a/deep/er/y.bin: label of its first level */
    check_sample(d, 2, 3, 32, 0);      /* a/z.bin */
    check_sample(d, 3, 5, 32, -1);     /* top.bin, in the root */
    check_sample(d, 4, 6, 32, 2);      /* zz/q.bin */
    dataset_free(d);

    /* Only root-level files: every label is -1. */
    cfg = files_cfg("n", t->root, "top.*");
    d = open_ok(&cfg);
    assert_int_equal(d->count, 1);
    check_sample(d, 0, 5, 32, -1);
    dataset_free(d);
}

static void test_files_symlinks(void **state)
{
    struct tdir *t = *state;
    char path[1024];
    testfs_write(t->root, "real/f.bin", 1, 8);
    snprintf(path, sizeof path, "%s/real/loop", t->root);
    assert_int_equal(symlink("..", path), 0);           /* a cycle: must not be walked */
    snprintf(path, sizeof path, "%s/real/link.bin", t->root);
    assert_int_equal(symlink("f.bin", path), 0);        /* a link to a file is a sample */
    snprintf(path, sizeof path, "%s/real/dead.bin", t->root);
    assert_int_equal(symlink("nowhere.bin", path), 0);  /* dangling: skipped */

    struct config_dataset cfg = files_cfg("s", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 2);
    check_sample(d, 0, 1, 8, 0);       /* real/f.bin */
    check_sample(d, 1, 1, 8, 0);       /* real/link.bin */
    dataset_free(d);
}

static void test_files_ragged(void **state)
{
    struct tdir *t = *state;
    testfs_write(t->root, "c0/a.bin", 1, 10);
    testfs_write(t->root, "c0/b.bin", 2, 300);
    testfs_write(t->root, "c1/c.bin", 3, 7);
    testfs_write(t->root, "c1/d.bin", 4, 0);

    struct config_dataset cfg = files_cfg("r", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 4);
    assert_true(d->fields[0].ragged);
    assert_int_equal(d->fields[0].ndim, 0);
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_UINT8);
    assert_int_equal(d->fields[0].max_item_bytes, 300);
    assert_int_equal(dataset_row_bytes(d, 0), 0);      /* no fixed row */
    assert_int_equal(dataset_row_bytes(d, 1), 8);
    assert_int_equal(d->ops->item_bytes(d, 0, 0), 10);
    assert_int_equal(d->ops->item_bytes(d, 1, 0), 300);
    assert_int_equal(d->ops->item_bytes(d, 2, 0), 7);
    assert_int_equal(d->ops->item_bytes(d, 3, 0), 0);
    check_sample(d, 0, 1, 10, 0);
    check_sample(d, 1, 2, 300, 0);
    check_sample(d, 2, 3, 7, 1);
    check_sample(d, 3, 4, 0, 1);
    dataset_free(d);
}

static void test_files_changed_after_open(void **state)
{
    struct tdir *t = *state;
    char path[1024], err[LD_ERRMSG_MAX];
    testfs_write(t->root, "a/b.bin", 1, 3072);
    testfs_write(t->root, "a/c.bin", 2, 3072);
    testfs_write(t->root, "a/d.bin", 3, 3072);

    struct config_dataset cfg = files_cfg("ch", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 3);

    uint8_t *buf = malloc(4096);
    int64_t lab;
    void *dst[2] = {buf, &lab};

    /* Shrunk: a bad sample that says what was expected and what is there. */
    snprintf(path, sizeof path, "%s/a/b.bin", t->root);
    assert_int_equal(truncate(path, 100), 0);
    err[0] = '\0';
    assert_int_equal(d->ops->read(d, 0, dst, err), LD_ESAMPLE);
    assert_string_equal(err, "sample 0 (a/b.bin): expected 3072 bytes, file has 100");

    /* Removed: a bad sample naming the file and the reason. */
    snprintf(path, sizeof path, "%s/a/c.bin", t->root);
    assert_int_equal(unlink(path), 0);
    err[0] = '\0';
    assert_int_equal(d->ops->read(d, 1, dst, err), LD_ESAMPLE);
    char want[256];
    snprintf(want, sizeof want, "sample 1 (a/c.bin): %s", strerror(ENOENT));
    assert_string_equal(err, want);

    /* Grown: still fine, and only the recorded size is written. */
    testfs_write(t->root, "a/d.bin", 3, 4000);
    check_sample(d, 2, 3, 3072, 0);

    free(buf);
    dataset_free(d);
}

static void test_files_errors(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX], path[1024], want[1200];

    /* Missing directory: the path and the reason. */
    snprintf(path, sizeof path, "%s/missing", t->root);
    struct config_dataset cfg = files_cfg("x", path, "*.bin");
    open_fails(&cfg, LD_ENOENT, err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, strerror(ENOENT)));
    assert_non_null(strstr(err, "'x'"));

    /* Empty directory, then one with nothing that matches. */
    cfg = files_cfg("x", t->root, "*.bin");
    open_fails(&cfg, LD_EDATASET, err);
    snprintf(want, sizeof want, "dataset 'x': no file under '%s' matches '*.bin'", t->root);
    assert_string_equal(err, want);
    testfs_write(t->root, "a/readme.txt", 1, 10);
    open_fails(&cfg, LD_EDATASET, err);
    assert_string_equal(err, want);

    /* A file where a directory is expected. */
    snprintf(path, sizeof path, "%s/a/readme.txt", t->root);
    cfg = files_cfg("x", path, "*");
    open_fails(&cfg, LD_ENOTDIR, err);
    assert_non_null(strstr(err, path));

    /* Every matching file empty: nothing to serve. */
    testfs_write(t->root, "b/e1.bin", 1, 0);
    testfs_write(t->root, "b/e2.bin", 1, 0);
    cfg = files_cfg("x", t->root, "*.bin");
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "empty"));

    /* An unreadable sub-folder is an error, not a silently smaller dataset (root
     * reads it anyway, so this part only runs as a normal user). */
    if (geteuid() != 0) {
        testfs_write(t->root, "c/x.bin", 1, 4);
        snprintf(path, sizeof path, "%s/c", t->root);
        assert_int_equal(chmod(path, 0), 0);
        open_fails(&cfg, LD_EACCES, err);
        assert_non_null(strstr(err, path));
        assert_int_equal(chmod(path, 0755), 0);
    }

    /* An unknown kind. */
    cfg = files_cfg("x", t->root, "*.bin");
    cfg.kind = 99;
    open_fails(&cfg, LD_EINVAL, err);
    assert_non_null(strstr(err, "'x'"));
    dataset_free(NULL);
}

/* ---- token windows ---------------------------------------------------------------- */

static uint32_t token_value(uint64_t k, int dtype)
{
    return dtype == LD_DTYPE_UINT16 ? (uint32_t)((k * 40503u + 11u) & 0xFFFF)
                                    : (uint32_t)(k * 2654435761u + 7u);
}

static void write_tokens(const char *path, uint64_t n, int dtype)
{
    size_t tsize = dtype == LD_DTYPE_UINT16 ? 2 : 4;
    uint8_t *buf = malloc(n * tsize + 1);
    for (uint64_t k = 0; k < n; k++) {
        uint32_t v = token_value(k, dtype);
        if (tsize == 2) {
            uint16_t v16 = (uint16_t)v;
            memcpy(buf + k * 2, &v16, 2);
        } else {
            memcpy(buf + k * 4, &v, 4);
        }
    }
    write_raw(path, buf, n * tsize);
    free(buf);
}

/* Every window i must be tokens [i*stride, i*stride + context] and nothing more. */
static void check_windows(const dataset *d, int dtype, uint32_t context, uint64_t stride)
{
    size_t tsize = dtype == LD_DTYPE_UINT16 ? 2 : 4;
    size_t bytes = (context + 1) * tsize;
    uint8_t *buf = malloc(bytes + 16);
    char err[LD_ERRMSG_MAX];
    for (uint64_t i = 0; i < d->count; i++) {
        memset(buf, 0xAA, bytes + 16);
        void *dst[1] = {buf};
        assert_int_equal(d->ops->read(d, i, dst, err), 0);
        for (uint32_t j = 0; j <= context; j++) {
            uint32_t v;
            if (tsize == 2) {
                uint16_t v16;
                memcpy(&v16, buf + j * 2, 2);
                v = v16;
            } else {
                memcpy(&v, buf + j * 4, 4);
            }
            assert_int_equal(v, token_value(i * stride + j, dtype));
        }
        for (size_t j = bytes; j < bytes + 16; j++)
            assert_int_equal(buf[j], 0xAA);
    }
    void *dst[1] = {buf};
    assert_int_equal(d->ops->read(d, d->count, dst, err), LD_EINVAL);
    free(buf);
}

static void test_tokens_uint16(void **state)
{
    struct tdir *t = *state;
    char path[1024];
    snprintf(path, sizeof path, "%s/t16.bin", t->root);
    write_tokens(path, 100, LD_DTYPE_UINT16);

    /* stride < context: overlapping windows; (100 - 8) / 3 + 1 = 31 */
    struct config_dataset cfg = tokens_cfg(path, LD_DTYPE_UINT16, 7, 3);
    dataset *d = open_ok(&cfg);
    assert_string_equal(dataset_kind(d), "token_windows");
    assert_string_equal(d->source, path);
    assert_int_equal(d->count, 31);
    assert_int_equal(d->n_fields, 1);
    assert_string_equal(d->fields[0].name, "tokens");
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_UINT16);
    assert_int_equal(d->fields[0].ndim, 1);
    assert_int_equal(d->fields[0].shape[0], 8);
    assert_false(d->fields[0].ragged);
    assert_int_equal(dataset_row_bytes(d, 0), 16);
    check_windows(d, LD_DTYPE_UINT16, 7, 3);
    dataset_free(d);

    /* stride = context: windows share one token; (100 - 8) / 7 + 1 = 14. Stride 0
     * means the same. */
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 7, 7);
    d = open_ok(&cfg);
    assert_int_equal(d->count, 14);
    check_windows(d, LD_DTYPE_UINT16, 7, 7);
    dataset_free(d);
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 7, 0);
    d = open_ok(&cfg);
    assert_int_equal(d->count, 14);
    check_windows(d, LD_DTYPE_UINT16, 7, 7);
    dataset_free(d);

    /* stride > context: gaps; (100 - 8) / 10 + 1 = 10 */
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 7, 10);
    d = open_ok(&cfg);
    assert_int_equal(d->count, 10);
    check_windows(d, LD_DTYPE_UINT16, 7, 10);
    dataset_free(d);

    /* Exactly context + 1 tokens: one window. */
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 99, 99);
    d = open_ok(&cfg);
    assert_int_equal(d->count, 1);
    check_windows(d, LD_DTYPE_UINT16, 99, 99);
    dataset_free(d);
}

static void test_tokens_uint32(void **state)
{
    struct tdir *t = *state;
    char path[1024];
    snprintf(path, sizeof path, "%s/t32.bin", t->root);
    write_tokens(path, 1000, LD_DTYPE_UINT32);

    struct config_dataset cfg = tokens_cfg(path, LD_DTYPE_UINT32, 64, 16);
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, (1000 - 65) / 16 + 1);
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_UINT32);
    assert_int_equal(d->fields[0].shape[0], 65);
    assert_int_equal(dataset_row_bytes(d, 0), 65 * 4);
    check_windows(d, LD_DTYPE_UINT32, 64, 16);
    dataset_free(d);

    cfg = tokens_cfg(path, LD_DTYPE_UINT32, 64, 64);
    d = open_ok(&cfg);
    assert_int_equal(d->count, (1000 - 65) / 64 + 1);
    check_windows(d, LD_DTYPE_UINT32, 64, 64);
    dataset_free(d);
}

static void test_tokens_errors(void **state)
{
    struct tdir *t = *state;
    char path[1024], err[LD_ERRMSG_MAX], want[1200];
    uint8_t zeros[1002] = {0};

    snprintf(path, sizeof path, "%s/t.bin", t->root);
    write_raw(path, zeros, 1001);
    struct config_dataset cfg = tokens_cfg(path, LD_DTYPE_UINT16, 8, 8);
    open_fails(&cfg, LD_EDATASET, err);
    snprintf(want, sizeof want,
             "dataset 'tok': '%s' is 1001 bytes, not a multiple of 2 (uint16 tokens)", path);
    assert_string_equal(err, want);

    write_raw(path, zeros, 1002);
    cfg = tokens_cfg(path, LD_DTYPE_UINT32, 8, 8);
    open_fails(&cfg, LD_EDATASET, err);
    snprintf(want, sizeof want,
             "dataset 'tok': '%s' is 1002 bytes, not a multiple of 4 (uint32 tokens)", path);
    assert_string_equal(err, want);

    /* Too short: 5 tokens cannot make a window of 6. */
    write_tokens(path, 5, LD_DTYPE_UINT16);
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 5, 5);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "has 5 uint16 tokens, fewer than context + 1 = 6"));

    write_raw(path, zeros, 0);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "is empty"));
    assert_non_null(strstr(err, path));

    snprintf(path, sizeof path, "%s/missing.bin", t->root);
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 5, 5);
    open_fails(&cfg, LD_ENOENT, err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, strerror(ENOENT)));

    cfg = tokens_cfg(t->root, LD_DTYPE_UINT16, 5, 5);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "not a regular file"));

    snprintf(path, sizeof path, "%s/t.bin", t->root);
    write_tokens(path, 100, LD_DTYPE_UINT16);
    cfg = tokens_cfg(path, LD_DTYPE_UINT8, 5, 5);
    open_fails(&cfg, LD_EINVAL, err);
    cfg = tokens_cfg(path, LD_DTYPE_UINT16, 0, 5);
    open_fails(&cfg, LD_EINVAL, err);
}

/* ---- concurrency ------------------------------------------------------------------ */

struct reader {
    pthread_t thread;
    const dataset *files, *tokens;
    int bad;
};

#define CONC_FILES 64
#define CONC_SIZE 1024

/* Reads every sample of both datasets, in opposite orders in the two threads. */
static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    uint8_t buf[CONC_SIZE];
    char err[LD_ERRMSG_MAX];
    int64_t lab;
    for (int pass = 0; pass < 4; pass++) {
        for (uint64_t n = 0; n < rd->files->count; n++) {
            uint64_t i = (pass & 1) ? rd->files->count - 1 - n : n;
            void *dst[2] = {buf, &lab};
            if (rd->files->ops->read(rd->files, i, dst, err) != 0) {
                rd->bad++;
                continue;
            }
            for (size_t j = 0; j < CONC_SIZE; j++)
                if (buf[j] != testfs_byte((unsigned)i, j)) {
                    rd->bad++;
                    break;
                }
            if (lab != (int64_t)(i / (CONC_FILES / 4)))
                rd->bad++;
        }
        for (uint64_t i = 0; i < rd->tokens->count; i++) {
            uint16_t win[33];
            void *dst[1] = {win};
            if (rd->tokens->ops->read(rd->tokens, i, dst, err) != 0) {
                rd->bad++;
                continue;
            }
            for (int j = 0; j < 33; j++)
                if (win[j] != (uint16_t)token_value(i * 8 + (uint64_t)j, LD_DTYPE_UINT16))
                    rd->bad++;
        }
    }
    return NULL;
}

static void test_concurrent_reads(void **state)
{
    struct tdir *t = *state;
    char rel[64], path[1024];
    /* File i in class folder i % 4 with a name that sorts as i within it: sample order is
     * class-major, so file i is sample (i % 4) * 16 + i / 4; seed it so that the
     * content is a function of the sample index. */
    for (unsigned i = 0; i < CONC_FILES; i++) {
        unsigned sample = (i % 4) * (CONC_FILES / 4) + i / 4;
        snprintf(rel, sizeof rel, "c%u/%03u.bin", i % 4, i);
        testfs_write(t->root, rel, sample, CONC_SIZE);
    }
    snprintf(path, sizeof path, "%s/c0/tok.tokens", t->root);
    write_tokens(path, 1000, LD_DTYPE_UINT16);

    struct config_dataset fc = files_cfg("f", t->root, "*.bin");
    struct config_dataset tc = tokens_cfg(path, LD_DTYPE_UINT16, 32, 8);
    dataset *f = open_ok(&fc), *tk = open_ok(&tc);
    assert_int_equal(f->count, CONC_FILES);

    struct reader rd[2] = {{.files = f, .tokens = tk}, {.files = f, .tokens = tk}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&rd[i].thread, NULL, reader_main, &rd[i]), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(rd[i].thread, NULL), 0);
        assert_int_equal(rd[i].bad, 0);
    }
    dataset_free(f);
    dataset_free(tk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_files_fixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_pattern, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_nested_and_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_symlinks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_ragged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_changed_after_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_uint16, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_uint32, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_reads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
