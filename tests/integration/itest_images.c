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
#include <sys/stat.h>
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

    /* A plug-in that is not there: --check fails and says which (the daemon itself
     * serves the dataset as unavailable, with the same message: itest_reload). */
    harness_write_config(h, NULL,
                         "  bad:\n    kind: image_folder\n    path: img\n    transforms:\n"
                         "      - center_crop: {size: 32}\n      - plugin: {path: /nonexistent/plugin.so}\n");
    const char *const check[] = {"--check", NULL};
    assert_int_equal(harness_run_to_exit(h, check), 1);
    char *log = harness_log(h);
    /* At the plug-in's line (server 1-2, datasets 3, bad 4-7, center_crop 8). */
    if (!strstr(log, "loaderd.yaml:9:9: dataset 'bad': transforms[1] (plugin): cannot load '/nonexistent/plugin.so'"))
        fail_msg("no position of the plug-in in:\n%s", log);
    free(log);
    /* A folder that is not there: at its `path`. */
    harness_write_config(h, NULL,
                         "  gone:\n    kind: image_folder\n    transforms: [center_crop: {size: 32}]\n"
                         "    path: no-such-folder\n");
    assert_int_equal(harness_run_to_exit(h, check), 1);
    log = harness_log(h);
    if (!strstr(log, "loaderd.yaml:7:5: dataset 'gone'") || !strstr(log, "no-such-folder"))
        fail_msg("no position of the path in:\n%s", log);
    free(log);
    /* A bad parameter: file:line:column. */
    harness_write_config(h, NULL,
                         "  bad:\n    kind: image_folder\n    path: img\n    transforms:\n"
                         "      - random_resized_crop: {size: 32, scale: [0.5]}\n");
    assert_int_equal(harness_run_to_exit(h, check), 1);
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

/* ---- a poisoned JPEG in a folder of mixed formats ------------------------------------ */

static uint32_t png_crc(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

static uint8_t *put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return p + 4;
}

static uint8_t *png_chunk(uint8_t *p, const char *type, const uint8_t *data, uint32_t len)
{
    p = put32(p, len);
    uint8_t *start = p;
    memcpy(p, type, 4);
    if (len)
        memcpy(p + 4, data, len);
    p += 4 + len;
    return put32(p, png_crc(start, len + 4));
}

/* A w x h PNG of one colour, its zlib stream one stored block (this test links no
 * image library). Returns its length; out holds at least 100 + h * (1 + 3w) bytes. */
static size_t tiny_png(uint8_t *out, int w, int h, uint8_t r, uint8_t g, uint8_t b)
{
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    size_t raw_len = (size_t)h * (1 + 3 * (size_t)w);
    assert_true(raw_len < 65536);
    uint8_t ihdr[13], *z = malloc(raw_len + 11);
    put32(put32(ihdr, (uint32_t)w), (uint32_t)h);
    memcpy(ihdr + 8, "\x08\x02\x00\x00\x00", 5);         /* 8-bit RGB, no interlace */
    uint8_t *q = z;
    *q++ = 0x78;
    *q++ = 0x01;
    *q++ = 0x01;                                        /* final, stored */
    *q++ = (uint8_t)raw_len;
    *q++ = (uint8_t)(raw_len >> 8);
    *q++ = (uint8_t)~raw_len;
    *q++ = (uint8_t)(~raw_len >> 8);
    uint32_t a = 1, bsum = 0;
    for (int y = 0; y < h; y++)
        for (int x = -1; x < w; x++)
            for (int c = x < 0 ? 2 : 0; c < 3; c++) {
                uint8_t v = x < 0 ? 0 : c == 0 ? r : c == 1 ? g : b;   /* filter byte, then RGB */
                *q++ = v;
                a = (a + v) % 65521;
                bsum = (bsum + a) % 65521;
            }
    q = put32(q, bsum << 16 | a);
    uint8_t *p = out;
    memcpy(p, sig, 8);
    p = png_chunk(p + 8, "IHDR", ihdr, 13);
    p = png_chunk(p, "IDAT", z, (uint32_t)(q - z));
    p = png_chunk(p, "IEND", NULL, 0);
    free(z);
    return (size_t)(p - out);
}

/* One worker, a folder of JPEG classes plus a class of PNGs, and a JPEG whose frame
 * header declares 0x0 first in the order, with two more broken files. Before, that one
 * JPEG left the worker's decoder failing every later JPEG ("Bogus marker length"):
 * replacements found only PNGs and the batches were quietly made of the PNG class.
 * Now every good JPEG is served, exactly the bad files are replaced, and an epoch
 * that replaces more than on_error_warn_fraction says so in the log, every epoch. */
static void test_poisoned_jpeg_mixed_folder(void **state)
{
    struct harness *h = *state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/img/class_003", h->dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    uint8_t *png = malloc(100 + 48 * (1 + 3 * 48));
    char rel[64];
    for (int i = 0; i < 6; i++) {
        size_t n = tiny_png(png, 48, 48, (uint8_t)(40 * i), 200, 30);
        snprintf(rel, sizeof rel, "img/class_003/png%d.png", i);
        harness_write_file(h, rel, png, n);
    }
    free(png);
    char src[4200], *buf = malloc(1 << 20);
    snprintf(src, sizeof src, "%s/img/class_000/0000000.jpg", h->dir);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    size_t sof = 0;
    for (size_t i = 2; i + 9 < len && !sof; i++)
        if ((uint8_t)buf[i] == 0xff && (uint8_t)buf[i + 1] == 0xc0)
            sof = i;
    assert_true(sof > 0);
    memset(buf + sof + 5, 0, 4);                        /* height 0, width 0 */
    harness_write_file(h, "img/class_000/0000000-zero.jpg", buf, len);
    harness_write_file(h, "img/class_001/0000001-cut.jpg", buf, 100);
    harness_write_file(h, "img/class_002/0000002-text.jpg", "not an image", 12);
    free(buf);
    const int n_samples = N_IMAGES + 6 + 3;

    harness_write_config(h, "  workers: 1\n",
                         "  mixed:\n    kind: image_folder\n    path: img\n    on_error_warn_fraction: 0.02\n"
                         "    transforms:\n      - resize: {size: 40}\n      - center_crop: {size: 32}\n");
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_images");
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 16;
    o.shuffle = 0;
    o.epochs = 2;
    lc_stream *s = NULL;
    assert_int_equal(lc_stream_open(c, "mixed", &o, &s), 0);
    int counts[4] = {0};
    lc_batch *b;
    int r;
    uint64_t rows = 0;
    while ((r = lc_stream_next(s, 20000, &b)) == 0) {
        lc_field label;
        assert_int_equal(lc_batch_field_by_name(b, "label", &label), 0);
        for (uint32_t row = 0; row < lc_batch_rows(b); row++) {
            int64_t l = ((const int64_t *)label.data)[row];
            assert_true(l >= 0 && l < 4);
            counts[l]++;
        }
        rows += lc_batch_rows(b);
        lc_batch_release(b);
    }
    if (r != LC_EEND)
        fail_msg("mixed: %s", lc_client_error(c));
    assert_int_equal(rows, 2 * n_samples);
    /* Every good JPEG of every class, both epochs; the PNGs; 6 replacements anywhere. */
    for (int k = 0; k < 3; k++)
        if (counts[k] < 2 * N_IMAGES / N_CLASSES)
            fail_msg("class %d: %d samples in two epochs, fewer than its %d good JPEGs twice", k,
                     counts[k], N_IMAGES / N_CLASSES);
    assert_true(counts[3] >= 12);
    lc_stream_close(s);
    char *json = NULL;
    assert_int_equal(lc_request_json(c, "{\"op\":\"status\"}", &json), 0);
    cJSON *st = cJSON_Parse(json);
    lc_free(json);
    /* Six reads served by a substitute (three bad files, two epochs); bad_samples counts
     * distinct files, each once. */
    assert_int_equal((int)cJSON_GetObjectItem(st, "replaced_samples")->valuedouble, 6);
    assert_int_equal((int)cJSON_GetObjectItem(st, "bad_samples")->valuedouble, 3);
    cJSON_Delete(st);
    lc_client_close(c);
    harness_stop_clean(h);
    /* 0.02 of 99 samples is 1: the second replacement of each epoch is reported, with
     * the count and the file that failed. */
    char *log = harness_log(h);
    for (int e = 0; e < 2; e++) {
        char want[200];
        snprintf(want, sizeof want, "dataset 'mixed': epoch %d: 2 samples replaced so far, more than "
                 "on_error_warn_fraction 0.02 of %d samples", e, n_samples);
        if (!strstr(log, want))
            fail_msg("the log lacks '%s':\n%s", want, log);
    }
    assert_non_null(strstr(log, "0000000-zero.jpg"));
    assert_non_null(strstr(log, "corrupt JPEG header: the frame declares 0x0 pixels"));
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_layout_determinism_epochs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_and_broken_plugin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_images, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poisoned_jpeg_mixed_folder, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
