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
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dataset.h"

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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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

/* ---- beneath the root: links, FIFOs, swaps after the scan -------------------------- */

/* Reads sample i through ops->read; the code, and the message in err. */
static int read_code(const dataset *d, uint64_t i, char *err)
{
    uint8_t buf[4096];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    err[0] = '\0';
    return d->ops->read(d, i, dst, err);
}

/* The same checks with openat2 and with the component-wise walk that stands in for it
 * where the kernel refuses openat2. */
static void links_and_swaps(struct testfs_dir *t, bool walk)
{
    char path[1024], target[1024], outside[300], err[LD_ERRMSG_MAX];
    if (walk)
        setenv("LOADERD_NO_OPENAT2", "1", 1);
    else
        unsetenv("LOADERD_NO_OPENAT2");

    /* A tree outside the dataset, with a "secret" of the same size as the samples. */
    snprintf(outside, sizeof outside, "%s/outside", t->root);
    assert_int_equal(mkdir(outside, 0755), 0);
    testfs_write(outside, "secret.bin", 9, 64);
    testfs_write(outside, "cls/a.bin", 9, 64);
    char root[300];
    snprintf(root, sizeof root, "%s/ds", t->root);
    assert_int_equal(mkdir(root, 0755), 0);
    testfs_write(root, "a/f.bin", 1, 64);
    testfs_write(root, "b/g.bin", 2, 64);
    testfs_write(root, "c/a.bin", 3, 64);
    snprintf(path, sizeof path, "%s/a/rel.bin", root);
    assert_int_equal(symlink("../b/g.bin", path), 0);       /* inside, relative: a sample */
    snprintf(path, sizeof path, "%s/a/abs.bin", root);
    snprintf(target, sizeof target, "%s/b/g.bin", root);
    assert_int_equal(symlink(target, path), 0);             /* inside, absolute: a sample */
    snprintf(path, sizeof path, "%s/a/out.bin", root);
    snprintf(target, sizeof target, "%s/secret.bin", outside);
    assert_int_equal(symlink(target, path), 0);             /* outside: not a sample */
    snprintf(path, sizeof path, "%s/a/fifo.bin", root);
    assert_int_equal(mkfifo(path, 0644), 0);                /* not a regular file */
    snprintf(path, sizeof path, "%s/a/tofifo.bin", root);
    assert_int_equal(symlink("fifo.bin", path), 0);         /* a link to it: neither */
    snprintf(path, sizeof path, "%s/linkdir", root);
    assert_int_equal(symlink(outside, path), 0);            /* a folder link: not walked */

    struct config_dataset cfg = files_cfg("b", root, "*.bin");
    dataset *d = open_ok(&cfg);
    /* a/abs.bin a/f.bin a/rel.bin b/g.bin c/a.bin */
    assert_int_equal(d->count, 5);
    assert_string_equal(dataset_sample_name(d, 0), "a/abs.bin");
    check_sample(d, 0, 2, 64, 0);
    check_sample(d, 1, 1, 64, 0);
    check_sample(d, 2, 2, 64, 0);
    check_sample(d, 3, 2, 64, 1);
    check_sample(d, 4, 3, 64, 2);

    /* After the scan: a file becomes a FIFO. Refused at once, no worker hangs. */
    snprintf(path, sizeof path, "%s/a/f.bin", root);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(read_code(d, 1, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "a/f.bin"));
    assert_non_null(strstr(err, "not a regular file"));

    /* A file becomes a link to a file outside. */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(read_code(d, 1, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "symbolic link where the scan saw none"));

    /* A class folder becomes a link to a folder outside holding a file of that name. */
    char moved[1024];
    snprintf(path, sizeof path, "%s/c", root);
    snprintf(moved, sizeof moved, "%s/c.old", root);
    assert_int_equal(rename(path, moved), 0);
    snprintf(target, sizeof target, "%s/cls", outside);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(read_code(d, 4, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "c/a.bin"));
    assert_non_null(strstr(err, "symbolic link"));

    /* An inside link re-pointed outside after the scan: the end is checked at each read. */
    snprintf(path, sizeof path, "%s/a/rel.bin", root);
    assert_int_equal(unlink(path), 0);
    snprintf(target, sizeof target, "%s/secret.bin", outside);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(read_code(d, 2, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "leads outside"));
    dataset_free(d);

    /* follow_links: outside serves links to files anywhere, still only regular files,
     * and still never a link swapped into a folder's place. */
    cfg.follow_links = CONFIG_FOLLOW_LINKS_OUTSIDE;
    d = open_ok(&cfg);
    /* a/abs.bin a/f.bin (now a link: the scan takes it) a/out.bin a/rel.bin b/g.bin c/a.bin */
    assert_int_equal(d->count, 6);
    assert_string_equal(dataset_sample_name(d, 2), "a/out.bin");
    check_sample(d, 2, 9, 64, 0);
    assert_int_equal(read_code(d, 5, err), 0); /* c is a link now, but the scan saw it so */
    dataset_free(d);
    unsetenv("LOADERD_NO_OPENAT2");
}

static void test_files_beneath_root(void **state)
{
    links_and_swaps(*state, false);
}

static void test_files_beneath_root_walk(void **state)
{
    links_and_swaps(*state, true);
}

/* ---- bad samples: replacement, ragged layouts, max_sample_bytes -------------------- */

/* dataset_read into a buffer laid out for `len` bytes (a ragged row). */
static int read_ragged(const dataset *d, uint64_t i, uint64_t len, uint8_t *buf, int64_t *lab, char *err)
{
    void *dst[2] = {buf, lab};
    uint64_t lens[2] = {len, 0};
    struct dataset_read_ctx ctx = {0};
    err[0] = '\0';
    return dataset_read(d, i, &ctx, dst, lens, err);
}

/* ---- files, format: npy ------------------------------------------------------------ */

/* Writes root/rel as a version 1.0 .npy file: `dict`, padded as numpy pads it, then
 * `n` float32 values seed + k / 4. */
static void write_npy(const char *root, const char *rel, const char *dict, unsigned seed, size_t n)
{
    char path[1024];
    uint8_t head[256];
    size_t dlen = strlen(dict), total = (10 + dlen + 1 + 63) / 64 * 64;
    memcpy(head, "\x93NUMPY\1\0", 8);
    head[8] = (uint8_t)(total - 10);
    head[9] = 0;
    memcpy(head + 10, dict, dlen);
    memset(head + 10 + dlen, ' ', total - 10 - dlen - 1);
    head[total - 1] = '\n';
    testfs_make_dirs(root, rel);
    snprintf(path, sizeof path, "%s/%s", root, rel);
    float *v = malloc(n * sizeof *v + 1);
    for (size_t k = 0; k < n; k++)
        v[k] = (float)seed + (float)k / 4;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, head, total), (ssize_t)total);
    assert_int_equal(write(fd, v, n * sizeof *v), (ssize_t)(n * sizeof *v));
    close(fd);
    free(v);
}

#define NPY_2x3 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"

static void check_npy(const float *got, unsigned seed)
{
    for (size_t k = 0; k < 6; k++)
        if (got[k] != (float)seed + (float)k / 4)
            fail_msg("value %zu: %g != %g", k, (double)got[k], (double)((float)seed + (float)k / 4));
}

static void test_files_npy(void **state)
{
    struct testfs_dir *t = *state;
    char err[LD_ERRMSG_MAX];
    write_npy(t->root, "a/0.npy", NPY_2x3, 10, 6);
    write_npy(t->root, "a/1.npy", NPY_2x3, 11, 6);
    write_npy(t->root, "b/2.npy", NPY_2x3, 12, 6);
    write_npy(t->root, "b/3.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 13, 6);
    testfs_write(t->root, "b/4.npy", 5, 152); /* not a .npy file, the same size */

    struct config_dataset cfg = files_cfg("arr", t->root, "*.npy");
    cfg.format = CONFIG_FORMAT_NPY;
    cfg.on_error = CONFIG_ON_ERROR_FAIL;
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 5);
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_FLOAT32);
    assert_int_equal(d->fields[0].ndim, 2);
    assert_int_equal(d->fields[0].shape[0], 2);
    assert_int_equal(d->fields[0].shape[1], 3);
    assert_false(d->fields[0].ragged);
    assert_int_equal(dataset_row_bytes(d, 0), 24);
    assert_int_equal(d->ops->raw_bytes(d, 0), 24);

    float v[8];
    int64_t lab = 99;
    void *dst[2] = {v, &lab};
    for (unsigned i = 0; i < 3; i++) {
        memset(v, 0, sizeof v);
        assert_int_equal(dataset_read(d, i, NULL, dst, NULL, err), 0);
        check_npy(v, 10 + i);
        assert_int_equal(lab, i < 2 ? 0 : 1);
    }
    /* The cache gets the array, not the file. */
    uint64_t len = 0;
    assert_int_equal(d->ops->read_raw(d, 1, v, sizeof v, &len, &lab, err), 0);
    assert_int_equal(len, 24);
    check_npy(v, 11);
    /* on_error: fail: another shape and a file that is not .npy fail, naming the file and why. */
    assert_int_equal(dataset_read(d, 3, NULL, dst, NULL, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "b/3.npy"));
    assert_non_null(strstr(err, "float32[3,2], the dataset's field is float32[2,3]"));
    assert_int_equal(dataset_read(d, 4, NULL, dst, NULL, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "b/4.npy"));
    assert_non_null(strstr(err, "magic"));
    /* The fingerprint differs from the same tree read raw: never the same cache. */
    uint64_t fp_npy, fp_raw;
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp_npy, err), 0);
    dataset_free(d);
    cfg.format = CONFIG_FORMAT_RAW;
    d = open_ok(&cfg);
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp_raw, err), 0);
    assert_true(fp_npy != fp_raw);
    dataset_free(d);

    /* on_error: replace: another sample, the same every time, takes the odd one's place. */
    cfg.format = CONFIG_FORMAT_NPY;
    cfg.on_error = CONFIG_ON_ERROR_REPLACE;
    d = open_ok(&cfg);
    assert_int_equal(dataset_read(d, 3, NULL, dst, NULL, err), 0);
    assert_true(v[0] == 10.0f || v[0] == 11.0f || v[0] == 12.0f);
    assert_int_equal(atomic_load(&d->bad_samples), 1);
    assert_int_equal(atomic_load(&d->replaced_samples), 1);
    dataset_free(d);
}

static void test_files_npy_layout_errors(void **state)
{
    struct testfs_dir *t = *state;
    char err[LD_ERRMSG_MAX];
    struct config_dataset cfg = files_cfg("arr", t->root, "*.npy");
    cfg.format = CONFIG_FORMAT_NPY;

    /* A bad first file does not decide the layout: the next good one does. */
    testfs_write(t->root, "0.npy", 3, 100);
    write_npy(t->root, "1.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 1, 6);
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->fields[0].dtype, LD_DTYPE_INT64);
    assert_int_equal(d->fields[0].shape[0], 3);
    dataset_free(d);

    /* Only Fortran-ordered arrays: nothing to lay out, and the message says why. */
    char path[1024];
    snprintf(path, sizeof path, "%s/0.npy", t->root);
    unlink(path);
    snprintf(path, sizeof path, "%s/1.npy", t->root);
    unlink(path);
    write_npy(t->root, "f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 1, 6);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "dataset 'arr': format npy"));
    assert_non_null(strstr(err, "'f.npy': .npy array is in Fortran"));
    unlink(path);
    snprintf(path, sizeof path, "%s/f.npy", t->root);
    unlink(path);
    /* An object array, and an empty one. */
    write_npy(t->root, "o.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 1, 4);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "object array"));
    snprintf(path, sizeof path, "%s/o.npy", t->root);
    unlink(path);
    write_npy(t->root, "e.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", 1, 0);
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "holds no element"));
}

static void test_replace_ragged(void **state)
{
    struct testfs_dir *t = *state;
    char path[1024], err[LD_ERRMSG_MAX], rel[64];
    /* 40 files of 40 distinct sizes. */
    for (unsigned i = 0; i < 40; i++) {
        snprintf(rel, sizeof rel, "c%u/%02u.bin", i / 20, i);
        testfs_write(t->root, rel, i, 100 + i);
    }
    struct config_dataset cfg = files_cfg("r", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_true(d->fields[0].ragged);
    assert_int_equal(dataset_item_bytes(d, 7, 0), 107);

    snprintf(path, sizeof path, "%s/c0/07.bin", t->root);
    assert_int_equal(unlink(path), 0);
    uint8_t buf[256];
    int64_t lab = 99;
    /* Laid out for the missing file: nothing written, "lay it out again". */
    assert_int_equal(read_ragged(d, 7, 107, buf, &lab, err), LD_ESTALE);
    assert_int_equal(atomic_load(&d->bad_samples), 1);
    assert_int_equal(atomic_load(&d->replaced_samples), 0);
    /* The new layout has the substitute's length; the substitute is served, counted. */
    uint64_t len = dataset_item_bytes(d, 7, 0);
    assert_true(len != 107 && len >= 100 && len < 140);
    unsigned sub = (unsigned)(len - 100);
    assert_int_equal(read_ragged(d, 7, len, buf, &lab, err), 0);
    for (size_t j = 0; j < len; j++)
        assert_int_equal(buf[j], testfs_byte(sub, j));
    assert_int_equal(lab, sub / 20);
    assert_int_equal(atomic_load(&d->replaced_samples), 1);
    /* The same substitute every time; the bad file is counted once. */
    assert_int_equal(dataset_item_bytes(d, 7, 0), len);
    assert_int_equal(read_ragged(d, 7, len, buf, &lab, err), 0);
    assert_int_equal(atomic_load(&d->bad_samples), 1);
    assert_int_equal(atomic_load(&d->replaced_samples), 2);

    /* The substitute goes bad too: stale again, then the next candidate. */
    snprintf(path, sizeof path, "%s/c%u/%02u.bin", t->root, sub / 20, sub);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(read_ragged(d, 7, len, buf, &lab, err), LD_ESTALE);
    uint64_t len2 = dataset_item_bytes(d, 7, 0);
    assert_true(len2 != len && len2 != 107);
    assert_int_equal(read_ragged(d, 7, len2, buf, &lab, err), 0);
    assert_int_equal(atomic_load(&d->bad_samples), 2);
    dataset_free(d);

    /* on_error: fail: the error names the file, nothing is replaced. */
    cfg.on_error = CONFIG_ON_ERROR_FAIL;
    d = open_ok(&cfg);
    assert_int_equal(dataset_item_bytes(d, 0, 0), 100);
    snprintf(path, sizeof path, "%s/c0/00.bin", t->root);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(read_ragged(d, 0, 100, buf, &lab, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "c0/00.bin"));
    assert_int_equal(atomic_load(&d->replaced_samples), 0);
    dataset_free(d);
}

static void test_max_sample_bytes(void **state)
{
    struct testfs_dir *t = *state;
    char err[LD_ERRMSG_MAX], rel[64];
    for (unsigned i = 0; i < 20; i++) {
        snprintf(rel, sizeof rel, "%02u.bin", i);
        testfs_write(t->root, rel, i, i == 5 ? 4000 : 10 + i);
    }
    struct config_dataset cfg = files_cfg("m", t->root, "*.bin");
    dataset *d = open_ok(&cfg);
    assert_int_equal(dataset_slot_item_bytes(d, 0), 4000);   /* no bound: the largest */
    dataset_free(d);

    cfg.max_sample_bytes = 64;
    d = open_ok(&cfg);
    assert_int_equal(d->fields[0].max_item_bytes, 4000);      /* what the source has */
    assert_int_equal(dataset_slot_item_bytes(d, 0), 64);      /* what a row may take */
    assert_int_equal(dataset_slot_item_bytes(d, 1), 0);       /* not ragged */
    uint64_t len = dataset_item_bytes(d, 5, 0);
    assert_true(len >= 10 && len < 30);                       /* a substitute's */
    uint8_t buf[64];
    int64_t lab;
    assert_int_equal(read_ragged(d, 5, len, buf, &lab, err), 0);
    for (size_t j = 0; j < len; j++)
        assert_int_equal(buf[j], testfs_byte((unsigned)(len - 10), j));
    assert_int_equal(atomic_load(&d->replaced_samples), 1);
    dataset_free(d);

    /* Under fail: nothing laid out for it, and the message says what to change. */
    cfg.on_error = CONFIG_ON_ERROR_FAIL;
    d = open_ok(&cfg);
    assert_int_equal(dataset_item_bytes(d, 5, 0), 0);
    assert_int_equal(read_ragged(d, 5, 0, buf, &lab, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "05.bin"));
    assert_non_null(strstr(err, "4000 bytes"));
    assert_non_null(strstr(err, "max_sample_bytes"));
    dataset_free(d);

    /* A bound that keeps out every sample is refused at open. */
    cfg.max_sample_bytes = 5;
    open_fails(&cfg, LD_EDATASET, err);
    assert_non_null(strstr(err, "max_sample_bytes"));
}

/* ---- resource shortages are not bad samples ----------------------------------------- */

struct nofile_restore {
    struct rlimit old;
    int delay_ms;
};

static void *restore_later(void *arg)
{
    struct nofile_restore *r = arg;
    usleep((useconds_t)r->delay_ms * 1000);
    setrlimit(RLIMIT_NOFILE, &r->old);
    return NULL;
}

static void test_fd_exhaustion_is_retried(void **state)
{
    struct testfs_dir *t = *state;
    char err[LD_ERRMSG_MAX];
    testfs_write(t->root, "a/x.bin", 1, 128);
    testfs_write(t->root, "a/y.bin", 2, 128);
    struct config_dataset cfg = files_cfg("e", t->root, "*.bin");
    dataset *d = open_ok(&cfg);

    /* The soft limit at the lowest free descriptor: no open can succeed now. */
    struct nofile_restore r = {.delay_ms = 150};
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &r.old), 0);
    int lowest = dup(0);
    assert_true(lowest >= 0);
    close(lowest);
    pthread_t th;
    struct rlimit low = {.rlim_cur = (rlim_t)lowest, .rlim_max = r.old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    assert_true(open("/dev/null", O_RDONLY) < 0 && errno == EMFILE);
    assert_int_equal(pthread_create(&th, NULL, restore_later, &r), 0);

    /* The read waits for descriptors instead of calling the sample bad. */
    uint8_t buf[128];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    struct dataset_read_ctx ctx = {0};
    int rc = dataset_read(d, 1, &ctx, dst, NULL, err);
    assert_int_equal(pthread_join(th, NULL), 0);
    if (rc != 0)
        fail_msg("read: %d %s", rc, err);
    for (size_t j = 0; j < 128; j++)
        assert_int_equal(buf[j], testfs_byte(2, j));
    assert_true(atomic_load(&d->resource_retries) >= 1);
    assert_int_equal(atomic_load(&d->bad_samples), 0);
    assert_int_equal(atomic_load(&d->replaced_samples), 0);
    dataset_free(d);
}

/* ---- the read deadline never fires on reads that return -------------------------- */

struct busy_reader {
    pthread_t thread;
    const dataset *d;
    int64_t until_ms;
    uint64_t reads, failed;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *busy_main(void *arg)
{
    struct busy_reader *b = arg;
    uint8_t buf[64];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    struct dataset_read_ctx ctx = {0};
    char err[LD_ERRMSG_MAX];
    while (mono_ms() < b->until_ms) {
        for (uint64_t i = 0; i < b->d->count; i++) {
            if (dataset_read(b->d, i, &ctx, dst, NULL, err) != 0)
                b->failed++;
            b->reads++;
        }
    }
    return NULL;
}

/* Many short reads while the watcher looks four times a second: a read that began
 * during a look must not seem to have started in the future (and so be ancient). */
static void test_watch_no_false_stall(void **state)
{
    struct testfs_dir *t = *state;
    char rel[32];
    for (unsigned i = 0; i < 16; i++) {
        snprintf(rel, sizeof rel, "%02u.bin", i);
        testfs_write(t->root, rel, i, 64);
    }
    struct config_dataset cfg = files_cfg("w", t->root, "*.bin");
    cfg.read_timeout = 1;
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->read_timeout_ns, 1000000000u);
    struct busy_reader b[2] = {{.d = d, .until_ms = mono_ms() + 1500}, {.d = d, .until_ms = mono_ms() + 1500}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&b[i].thread, NULL, busy_main, &b[i]), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(b[i].thread, NULL), 0);
        assert_true(b[i].reads > 1000);
        assert_int_equal(b[i].failed, 0);
    }
    assert_int_equal(atomic_load(&d->stalled_reads), 0);
    dataset_free(d);
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
    struct testfs_dir *t = *state;
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

/* The worker's prefetch of a corpus cut short under it is a hint that never faults: the
 * windows past the new end are then reported by the read, those before it served. */
static void test_tokens_prefetch_shrunk(void **state)
{
    struct testfs_dir *t = *state;
    char path[1024], err[LD_ERRMSG_MAX];
    snprintf(path, sizeof path, "%s/shrink.bin", t->root);
    write_tokens(path, 1u << 20, LD_DTYPE_UINT16); /* 2 MiB: 512 pages */
    struct config_dataset cfg = tokens_cfg(path, LD_DTYPE_UINT16, 1023, 1024);
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, 1024);
    assert_non_null(d->ops->prefetch);
    uint64_t idx[1026];
    for (uint64_t i = 0; i < 1026; i++)
        idx[i] = 1025 - i; /* the first two out of range: skipped */
    d->ops->prefetch(d, idx, 1026);
    assert_int_equal(truncate(path, 4096), 0);
    d->ops->prefetch(d, idx, 1026);
    uint8_t buf[2048];
    void *dst[1] = {buf};
    assert_int_equal(d->ops->read(d, 0, dst, err), 0);
    assert_int_equal(d->ops->read(d, 1023, dst, err), LD_EDATASET);
    assert_non_null(strstr(err, "shrank"));
    dataset_free(d);
}

static void test_tokens_uint32(void **state)
{
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
    struct testfs_dir *t = *state;
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
        cmocka_unit_test_setup_teardown(test_files_fixed, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_pattern, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_nested_and_root, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_symlinks, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_ragged, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_changed_after_open, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_errors, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_beneath_root, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_beneath_root_walk, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_npy, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_files_npy_layout_errors, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_replace_ragged, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_max_sample_bytes, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_fd_exhaustion_is_retried, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_watch_no_false_stall, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_uint16, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_uint32, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_prefetch_shrunk, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_errors, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_reads, testfs_dir_setup, testfs_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
