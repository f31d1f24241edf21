/* itest_images — image_folder datasets in a real loaderd: layout and labels, class
 * names, bit-identical batches whatever the worker count, augmentation that changes
 * with the epoch, a plug-in transform, bad files under both policies, a pixel limit,
 * and a broken plug-in path refused at start. The JPEGs come from ld-genimages (built
 * next to loaderd). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "loaderclient.h"

#define N_IMAGES 90
#define N_CLASSES 3

static char bindir[4096];

static int setup(void **state)
{
    struct harness *h = harness_new();
    const char *bin = getenv("LOADERD_BIN") ? getenv("LOADERD_BIN") : "build/bin/loaderd";
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", bin);
    char *abs = realpath(dirname(tmp), NULL); /* the config resolves relative paths against its own dir */
    assert_non_null(abs);
    snprintf(bindir, sizeof bindir, "%s", abs);
    free(abs);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/ld-genimages %s/img --count %d --classes %d --min 48 --max 96 >/dev/null", bindir,
             h->dir, N_IMAGES, N_CLASSES);
    assert_int_equal(system(cmd), 0);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static const char pipeline_yaml[] = "    transforms:\n"
                                    "      - random_resized_crop: {size: 32}\n"
                                    "      - random_flip: {p: 0.5}\n"
                                    "      - to_dtype: {dtype: uint8, layout: CHW}\n";

/* Reads one epoch (shuffle off) and returns a hash of every batch's bytes, in order. */
static uint64_t epoch_hash(lc_client *c, const char *ds, uint64_t epoch, int *label_counts)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.shuffle = 0;
    o.seed = 5;
    o.epoch = epoch;
    o.epochs = 1;
    lc_stream *s = NULL;
    if (lc_stream_open(c, ds, &o, &s) < 0)
        fail_msg("open %s: %s", ds, lc_client_error(c));
    uint64_t hash = 1469598103934665603ull;
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 20000, &b)) == 0) {
        lc_field img, label;
        assert_int_equal(lc_batch_field_by_name(b, "image", &img), 0);
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        assert_int_equal(img.dtype, LC_DTYPE_UINT8);
        assert_int_equal(img.ndim, 4);
        assert_int_equal(img.shape[1], 3);
        assert_int_equal(img.shape[2], 32);
        assert_int_equal(img.shape[3], 32);
        const uint8_t *p = img.data;
        for (size_t i = 0; i < img.nbytes; i++)
            hash = (hash ^ p[i]) * 1099511628211ull;
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            int64_t l = ((const int64_t *)label.data)[row];
            assert_true(l >= 0 && l < N_CLASSES);
            if (label_counts)
                label_counts[l]++;
        }
        lc_batch_release(b);
    }
    if (r != LC_EEND)
        fail_msg("next on %s: %s", ds, lc_client_error(c));
    lc_stream_close(s);
    return hash;
}

static void test_layout_determinism_epochs(void **state)
{
    struct harness *h = *state;
    char ds[1024];
    snprintf(ds, sizeof ds, "  images:\n    kind: image_folder\n    path: img\n%s", pipeline_yaml);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_images");
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"datasets\"}", &json), 0);
    cJSON *j = cJSON_Parse(json);
    lc_free(json);
    const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "datasets"), 0);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d0, "kind")), "image_folder");
    const cJSON *classes = cJSON_GetObjectItem(d0, "classes");
    assert_int_equal(cJSON_GetArraySize(classes), N_CLASSES);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetArrayItem(classes, 2)), "class_002");
    cJSON_Delete(j);

    int counts[N_CLASSES] = {0};
    uint64_t two_workers = epoch_hash(c, "images", 0, counts);
    for (int k = 0; k < N_CLASSES; k++)
        assert_int_equal(counts[k], N_IMAGES / N_CLASSES);
    assert_int_equal(epoch_hash(c, "images", 0, NULL), two_workers); /* same settings, same bytes */
    uint64_t next_epoch = epoch_hash(c, "images", 1, NULL);
    assert_true(next_epoch != two_workers);                      /* other crops and flips */
    lc_client_close(c);
    harness_stop_clean(h);

    /* One worker: bit-identical batches. */
    harness_write_config(h, "  workers: 1\n", ds);
    harness_start(h);
    c = harness_connect(h, 10000, "itest_images");
    assert_int_equal(epoch_hash(c, "images", 0, NULL), two_workers);
    assert_int_equal(epoch_hash(c, "images", 1, NULL), next_epoch);
    lc_client_close(c);
    harness_stop_clean(h);
}

/* Reads the first batch (shuffle off) of a dataset into buf. */
static void first_batch(lc_client *c, const char *ds, uint8_t *buf, size_t size)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 8;
    o.shuffle = 0;
    lc_stream *s = NULL;
    if (lc_stream_open(c, ds, &o, &s) < 0)
        fail_msg("open %s: %s", ds, lc_client_error(c));
    lc_batch *b;
    if (lc_stream_next(s, 20000, &b) < 0)
        fail_msg("next %s: %s", ds, lc_client_error(c));
    lc_field f;
    assert_int_equal(lc_batch_field_by_name(b, "image", &f), 0);
    assert_int_equal(f.nbytes, size);
    memcpy(buf, f.data, size);
    lc_batch_release(b);
    lc_stream_close(s);
}

static void test_plugin_and_broken_plugin(void **state)
{
    struct harness *h = *state;
    char ds[8192];
    snprintf(ds, sizeof ds,
             "  plain:\n    kind: image_folder\n    path: img\n    transforms:\n"
             "      - resize: {size: 40}\n      - center_crop: {size: 32}\n      - to_dtype: {dtype: uint8}\n"
             "  inverted:\n    kind: image_folder\n    path: img\n    transforms:\n"
             "      - resize: {size: 40}\n      - center_crop: {size: 32}\n"
             "      - plugin: {path: %s/../lib/ld-plugin-invert.so}\n      - to_dtype: {dtype: uint8}\n",
             bindir);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_images");
    size_t n = 8 * 3 * 32 * 32;
    uint8_t *a = malloc(n), *b = malloc(n);
    first_batch(c, "plain", a, n);
    first_batch(c, "inverted", b, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(b[i], 255 - a[i]);
    free(a);
    free(b);
    lc_client_close(c);
    harness_stop_clean(h);

    /* A plug-in that is not there: the daemon refuses to start and says which. */
    harness_write_config(h, NULL,
                         "  bad:\n    kind: image_folder\n    path: img\n    transforms:\n"
                         "      - center_crop: {size: 32}\n      - plugin: {path: /nonexistent/plugin.so}\n");
    const char *const none[] = {NULL};
    assert_int_equal(harness_run_to_exit(h, none), 1);
    char *log = harness_log(h);
    assert_non_null(strstr(log, "/nonexistent/plugin.so"));
    free(log);
    /* A bad parameter: file:line:column. */
    harness_write_config(h, NULL,
                         "  bad:\n    kind: image_folder\n    path: img\n    transforms:\n"
                         "      - random_resized_crop: {size: 32, scale: [0.5]}\n");
    assert_int_equal(harness_run_to_exit(h, none), 1);
    log = harness_log(h);
    assert_non_null(strstr(log, "random_resized_crop.scale: expected a list of 2 to 2 numbers"));
    free(log);
}

static void test_bad_images(void **state)
{
    struct harness *h = *state;
    /* A file that is not an image and a truncated JPEG among the good ones. */
    harness_write_file(h, "img/class_001/zz-garbage.jpg", "this is not a jpeg at all", 25);
    char src[4200], *buf = malloc(1 << 20);
    snprintf(src, sizeof src, "%s/img/class_002/0000002.jpg", h->dir);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    harness_write_file(h, "img/class_002/zz-truncated.jpg", buf, len / 2);
    free(buf);
    char ds[2048];
    snprintf(ds, sizeof ds,
             "  strict:\n    kind: image_folder\n    path: img\n    on_error: fail\n%s"
             "  lenient:\n    kind: image_folder\n    path: img\n%s"
             "  tiny:\n    kind: image_folder\n    path: img\n    on_error: fail\n    transforms:\n"
             "      - decode: {max_pixels: 2000}\n      - center_crop: {size: 32}\n"
             "  scaled:\n    kind: image_folder\n    path: img\n    on_error: fail\n    transforms:\n"
             "      - decode: {max_pixels: 2000}\n      - resize: {height: 16, width: 16}\n",
             pipeline_yaml, pipeline_yaml);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_images");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.epochs = 1;
    /* fail: the stream reports the file. */
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "strict", &o, &s), 0);
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 20000, &b)) == 0)
        lc_batch_release(b);
    assert_int_equal(r, LC_ESAMPLE);
    const char *msg = lc_client_error(c);
    assert_true(strstr(msg, "zz-garbage.jpg") || strstr(msg, "zz-truncated.jpg"));
    lc_stream_close(s);
    /* replace: whole batches, every sample, both counted. */
    assert_int_equal(lc_stream_open(c, "lenient", &o, &s), 0);
    uint64_t rows = 0;
    while ((r = lc_stream_next(s, 20000, &b)) == 0) {
        rows += lc_batch_rows(b);
        lc_batch_release(b);
    }
    assert_int_equal(r, LC_EEND);
    assert_int_equal(rows, N_IMAGES + 2);
    lc_stream_close(s);
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &json), 0);
    cJSON *st = cJSON_Parse(json);
    lc_free(json);
    assert_true(cJSON_GetObjectItem(st, "replaced_samples")->valuedouble >= 2);
    cJSON_Delete(st);
    /* A pixel limit (every image here is at least 48x48 = 2304 pixels): a pipeline that
     * needs the full image refuses it with a clear message, before decoding; one that
     * shrinks it anyway decodes it at a reduced DCT scale, within the limit. */
    assert_int_equal(lc_stream_open(c, "tiny", &o, &s), 0);
    assert_int_equal(lc_stream_next(s, 20000, &b), LC_ESAMPLE);
    assert_non_null(strstr(lc_client_error(c), "pixel"));
    lc_stream_close(s);
    assert_int_equal(lc_stream_open(c, "scaled", &o, &s), 0);
    r = lc_stream_next(s, 20000, &b);
    if (r < 0)
        fail_msg("scaled: %s", lc_client_error(c));
    lc_batch_release(b);
    lc_stream_close(s);
    lc_client_close(c);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_layout_determinism_epochs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_and_broken_plugin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_images, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
