/* Unit tests for manifest and source_manifest: CSV (quotes, commas and line breaks in
 * fields, CRLF, a byte order mark, blank lines, columns in any order) and JSONL
 * (strings and numbers) read to the same cells; every bad manifest refused with its
 * file:line; then datasets built on manifests: fields in the declared order (a file,
 * an npy array, a label, numbers), integer labels and class names, files missing at
 * start under on_error replace and fail, a number that does not parse, and the cache
 * members only where the cache can hold the sample. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset.h"
#include "ld_error.h"
#include "manifest.h"

/* Writes root/name with `text`; the full path in path. */
static void put(const struct testfs_dir *t, const char *name, const char *text, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", t->root, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static const char *const COLS[] = {"path", "label"};

static manifest *open_ok(const char *path, int format, const char *const *cols, size_t n)
{
    char err[LD_ERRMSG_MAX] = "";
    manifest *m = NULL;
    int r = manifest_open(path, format, cols, n, &m, err);
    if (r != 0)
        fail_msg("manifest_open: %d %s", r, err);
    return m;
}

/* Expects LD_EDATASET and a message "PATH:LINE: ..." that contains `needle`. */
static void open_fails(const struct testfs_dir *t, const char *name, const char *text, int line, const char *needle)
{
    char path[512], err[LD_ERRMSG_MAX] = "", want[600];
    put(t, name, text, path, sizeof path);
    manifest *m = NULL;
    assert_int_equal(manifest_open(path, MANIFEST_AUTO, COLS, 2, &m, err), LD_EDATASET);
    assert_null(m);
    snprintf(want, sizeof want, "%s:%d: ", path, line);
    if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, needle))
        fail_msg("got '%s', expected '%s...%s'", err, want, needle);
}

static void test_csv(void **state)
{
    struct testfs_dir *t = *state;
    char path[512];
    /* A BOM, CRLF, a column we do not ask for, columns in another order, quotes with a
     * comma, a doubled quote and a line break inside, a blank line, no final newline. */
    put(t, "m.csv",
        "\xef\xbb\xbfid,label,path\r\n"
        "1,3,a/x.bin\r\n"
        "2,\"cat, big\",\"b/\"\"q\"\".bin\"\r\n"
        "\r\n"
        "3,\"two\nlines\",c.bin\n"
        "4,7,\"d.bin\"",
        path, sizeof path);
    manifest *m = open_ok(path, MANIFEST_AUTO, COLS, 2);
    assert_int_equal(manifest_rows(m), 4);
    assert_string_equal(manifest_cell(m, 0, 0), "a/x.bin");
    assert_string_equal(manifest_cell(m, 0, 1), "3");
    assert_string_equal(manifest_cell(m, 1, 0), "b/\"q\".bin");
    assert_string_equal(manifest_cell(m, 1, 1), "cat, big");
    assert_string_equal(manifest_cell(m, 2, 1), "two\nlines");
    assert_string_equal(manifest_cell(m, 3, 0), "d.bin");
    assert_int_equal(manifest_line(m, 0), 2);
    assert_int_equal(manifest_line(m, 1), 3);
    assert_int_equal(manifest_line(m, 2), 5);
    assert_int_equal(manifest_line(m, 3), 7); /* the line break inside the quotes counts */
    assert_string_equal(manifest_path(m), path);
    manifest_free(m);
}

static void test_jsonl(void **state)
{
    struct testfs_dir *t = *state;
    char path[512];
    put(t, "m.jsonl",
        "{\"path\": \"a/x.bin\", \"label\": 3, \"extra\": [1, 2]}\n"
        "\n"
        "  {\"label\": \"cat\", \"path\": \"b.bin\"}  \r\n"
        "{\"path\": \"c.bin\", \"label\": 2.5}\n",
        path, sizeof path);
    manifest *m = open_ok(path, MANIFEST_AUTO, COLS, 2);
    assert_int_equal(manifest_rows(m), 3);
    assert_string_equal(manifest_cell(m, 0, 1), "3");
    assert_string_equal(manifest_cell(m, 1, 0), "b.bin");
    assert_string_equal(manifest_cell(m, 1, 1), "cat");
    assert_string_equal(manifest_cell(m, 2, 1), "2.5");
    assert_int_equal(manifest_line(m, 1), 3);
    assert_int_equal(manifest_line(m, 2), 4);
    manifest_free(m);
    /* The format may be said instead of guessed from the name. */
    put(t, "list.txt", "{\"path\": \"a\", \"label\": 1}\n", path, sizeof path);
    m = open_ok(path, MANIFEST_JSONL, COLS, 2);
    assert_int_equal(manifest_rows(m), 1);
    manifest_free(m);
}

static void test_bad_manifests(void **state)
{
    struct testfs_dir *t = *state;
    open_fails(t, "a.csv", "path,label\nx,1\ny,2,3\n", 3, "3 fields, the header has 2");
    open_fails(t, "b.csv", "path,lable\nx,1\n", 1, "the header has no column 'label' (it has 'path', 'lable')");
    open_fails(t, "c.csv", "path,label\nx,1\n\"y,2\n", 3, "a quoted field is never closed");
    open_fails(t, "d.csv", "path,label\n\"x\"z,1\n", 2, "text after its closing quote");
    open_fails(t, "d2.csv", "path,label\n\"x\"\r#,1\n", 2, "text after its closing quote"); /* a lone CR */
    open_fails(t, "e.csv", "path,label,path\nx,1,y\n", 1, "names column 'path' twice");
    open_fails(t, "f.csv", "", 1, "empty");
    open_fails(t, "h.jsonl", "{\"path\": \"x\", \"label\": 1}\n{\"path\": \"y\"}\n", 2, "no key 'label'");
    open_fails(t, "i.jsonl", "{\"path\": \"x\", \"label\": 1}\n[1, 2]\n", 2, "expected a JSON object");
    open_fails(t, "j.jsonl", "{\"path\": \"x\", \"label\": 1}\n\n{\"path\": \"x\", \"label\": 1\n", 3, "not valid JSON");
    open_fails(t, "k.jsonl", "{\"path\": \"x\", \"label\": null}\n", 1, "key 'label': expected a string or a number");
    open_fails(t, "l.jsonl", "{\"path\": \"x\", \"label\": 1} {}\n", 1, "text after the JSON object");
    char err[LD_ERRMSG_MAX];
    manifest *m = NULL;
    char path[512];
    put(t, "g.csv", "path,label\n", path, sizeof path);
    assert_int_equal(manifest_open(path, MANIFEST_AUTO, COLS, 2, &m, err), LD_EDATASET);
    assert_non_null(strstr(err, "g.csv: the manifest lists no sample"));
    snprintf(path, sizeof path, "%s/none.csv", t->root);
    assert_int_equal(manifest_open(path, MANIFEST_AUTO, COLS, 2, &m, err), LD_ENOENT);
    assert_non_null(strstr(err, "cannot read the manifest"));
}

/* ---- datasets ---------------------------------------------------------------------- */

static void write_npy(const char *root, const char *rel, int64_t a, int64_t b)
{
    char path[1024];
    uint8_t head[128] = "\x93NUMPY\1\0";
    const char *dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    head[8] = 118;
    memset(head + 10, ' ', 117);
    memcpy(head + 10, dict, strlen(dict));
    head[127] = '\n';
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int64_t v[2] = {a, b};
    assert_int_equal(fwrite(head, 1, 128, f), 128);
    assert_int_equal(fwrite(v, 1, sizeof v, f), sizeof v);
    assert_int_equal(fclose(f), 0);
}

static struct config_dataset manifest_cfg(struct testfs_dir *t, char *mpath, struct config_column *cols, size_t n)
{
    return (struct config_dataset){.name = "man", .kind = CONFIG_DATASET_FILES, .path = t->root, .pattern = "*",
                                   .manifest_path = mpath, .columns = cols, .n_columns = n,
                                   .on_error = CONFIG_ON_ERROR_FAIL};
}

static void test_dataset_fields(void **state)
{
    struct testfs_dir *t = *state;
    char mpath[512], err[LD_ERRMSG_MAX];
    testfs_write(t->root, "img/0.bin", 1, 100);
    testfs_write(t->root, "img/1.bin", 2, 120);
    testfs_write(t->root, "img/2.bin", 3, 90);
    write_npy(t->root, "t0.npy", 10, 11);
    write_npy(t->root, "t1.npy", 20, 21);
    write_npy(t->root, "t2.npy", 30, 31);
    /* Rows in the manifest's order, not the paths'; class names numbered sorted. */
    put(t, "m.csv", "image,target,cls,w\nimg/2.bin,t2.npy,dog,0.5\nimg/0.bin,t0.npy,cat,-1\nimg/1.bin,t1.npy,dog,2e3\n",
        mpath, sizeof mpath);
    struct config_column cols[] = {{"image", CONFIG_COLUMN_FILE}, {"target", CONFIG_COLUMN_NPY},
                                   {"cls", CONFIG_COLUMN_LABEL}, {"w", CONFIG_COLUMN_FLOAT32}};
    struct config_dataset cfg = manifest_cfg(t, mpath, cols, 4);
    dataset *d = NULL;
    if (dataset_open(&cfg, &d, err) != 0)
        fail_msg("%s", err);
    assert_string_equal(dataset_kind(d), "files");
    assert_int_equal(d->count, 3);
    assert_int_equal(d->n_fields, 4);
    assert_string_equal(d->fields[0].name, "image");
    assert_true(d->fields[0].ragged);
    assert_int_equal(d->fields[0].max_item_bytes, 120);
    assert_string_equal(d->fields[1].name, "target");
    assert_int_equal(d->fields[1].dtype, LD_DTYPE_INT64);
    assert_int_equal(d->fields[1].shape[0], 2);
    assert_string_equal(d->fields[2].name, "label");
    assert_int_equal(dataset_label_field(d), 2);
    assert_string_equal(d->fields[3].name, "w");
    assert_int_equal(d->fields[3].dtype, LD_DTYPE_FLOAT32);
    assert_int_equal(d->n_classes, 2);
    assert_string_equal(d->class_names[0], "cat");
    assert_string_equal(d->class_names[1], "dog");
    assert_null(d->ops->fingerprint); /* more than a file and a label: no cache */
    assert_string_equal(dataset_sample_name(d, 1), "img/0.bin");

    static const unsigned seeds[3] = {3, 1, 2};
    static const int64_t first[3] = {30, 10, 20}, labels[3] = {1, 0, 1};
    static const float w[3] = {0.5f, -1.0f, 2000.0f};
    for (uint64_t i = 0; i < 3; i++) {
        uint8_t img[128];
        int64_t tgt[2], lab;
        float wv;
        void *dst[4] = {img, tgt, &lab, &wv};
        uint64_t len = dataset_item_bytes(d, i, 0);
        assert_int_equal(d->ops->read(d, i, dst, err), 0);
        for (uint64_t j = 0; j < len; j++)
            assert_int_equal(img[j], testfs_byte(seeds[i], j));
        assert_int_equal(tgt[0], first[i]);
        assert_int_equal(tgt[1], first[i] + 1);
        assert_int_equal(lab, labels[i]);
        assert_true(wv == w[i]);
    }
    dataset_free(d);

    /* A manifest with a file and integer labels can be cached. */
    put(t, "n.csv", "path,label\nimg/0.bin,4\nimg/1.bin,-2\n", mpath, sizeof mpath);
    struct config_column two[] = {{"path", CONFIG_COLUMN_FILE}, {"label", CONFIG_COLUMN_LABEL}};
    cfg = manifest_cfg(t, mpath, two, 2);
    assert_int_equal(dataset_open(&cfg, &d, err), 0);
    assert_non_null(d->ops->fingerprint);
    assert_int_equal(d->n_classes, 0);
    uint8_t buf[256];
    uint64_t len;
    int64_t lab;
    assert_int_equal(d->ops->read_raw(d, 1, buf, sizeof buf, &len, &lab, err), 0);
    assert_int_equal(len, 120);
    assert_int_equal(lab, -2);
    uint64_t fp1, fp2;
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp1, err), 0);
    dataset_free(d);
    /* Another label in the manifest is another fingerprint. */
    put(t, "n.csv", "path,label\nimg/0.bin,4\nimg/1.bin,-3\n", mpath, sizeof mpath);
    assert_int_equal(dataset_open(&cfg, &d, err), 0);
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp2, err), 0);
    assert_true(fp1 != fp2);
    dataset_free(d);
    /* ... and a cache for more than that is refused at open. */
    cfg = manifest_cfg(t, mpath, cols, 4);
    put(t, "m2.csv", "image,target,cls,w\nimg/0.bin,t0.npy,a,1\n", mpath, sizeof mpath);
    cfg.cache_path = "/nonexistent/c.ldc";
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    assert_non_null(strstr(err, "a cache holds one file column and a label"));
}

static void test_dataset_bad_rows(void **state)
{
    struct testfs_dir *t = *state;
    char mpath[512], err[LD_ERRMSG_MAX], want[600];
    dataset *d = NULL;
    testfs_write(t->root, "a.bin", 1, 64);
    testfs_write(t->root, "b.bin", 2, 64);
    struct config_column cols[] = {{"path", CONFIG_COLUMN_FILE}, {"n", CONFIG_COLUMN_INT64}};
    struct config_dataset cfg = manifest_cfg(t, mpath, cols, 2);

    /* A number that does not parse: refused at start with its line, whatever on_error. */
    put(t, "m.csv", "path,n\na.bin,1\nb.bin,1.5\n", mpath, sizeof mpath);
    cfg.on_error = CONFIG_ON_ERROR_REPLACE;
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    snprintf(want, sizeof want, "dataset 'man': %s:3: column 'n': '1.5' is not an integer", mpath);
    assert_string_equal(err, want);

    /* A file missing at start: fail refuses to start, naming the line ... */
    put(t, "m.csv", "path,n\na.bin,1\ngone.bin,2\nb.bin,3\n", mpath, sizeof mpath);
    cfg.on_error = CONFIG_ON_ERROR_FAIL;
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    snprintf(want, sizeof want, "%s:3: column 'path': 'gone.bin'", mpath);
    assert_non_null(strstr(err, want));
    /* ... replace serves another sample in its place. */
    cfg.on_error = CONFIG_ON_ERROR_REPLACE;
    assert_int_equal(dataset_open(&cfg, &d, err), 0);
    assert_int_equal(d->count, 3);
    uint8_t buf[64];
    int64_t n = 0;
    void *dst[2] = {buf, &n};
    assert_int_equal(d->ops->read(d, 1, dst, err), LD_ESAMPLE);
    snprintf(want, sizeof want, "%s:3: 'gone.bin' was missing at start", mpath);
    assert_non_null(strstr(err, want));
    assert_int_equal(dataset_read(d, 1, NULL, dst, NULL, err), 0);
    assert_true(n == 1 || n == 3);
    assert_int_equal(atomic_load(&d->replaced_samples), 1);
    dataset_free(d);

    /* A path may not leave the dataset's directory. */
    put(t, "m.csv", "path,n\na.bin,1\n../escape.bin,2\n", mpath, sizeof mpath);
    cfg.on_error = CONFIG_ON_ERROR_FAIL;
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    assert_non_null(strstr(err, "'../escape.bin'"));
    /* Every file missing: nothing to serve. */
    put(t, "m.csv", "path,n\nx.bin,1\ny.bin,2\n", mpath, sizeof mpath);
    cfg.on_error = CONFIG_ON_ERROR_REPLACE;
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    assert_non_null(strstr(err, "none of the 2 files"));
    /* The manifest's own errors carry the dataset's name. */
    put(t, "m.csv", "path\na.bin\n", mpath, sizeof mpath);
    assert_int_equal(dataset_open(&cfg, &d, err), LD_EDATASET);
    assert_non_null(strstr(err, "dataset 'man': "));
    assert_non_null(strstr(err, ":1: the header has no column 'n'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_csv, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_jsonl, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_bad_manifests, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_dataset_fields, testfs_dir_setup, testfs_dir_teardown),
        cmocka_unit_test_setup_teardown(test_dataset_bad_rows, testfs_dir_setup, testfs_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
