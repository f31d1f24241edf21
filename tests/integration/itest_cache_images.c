/* itest_cache_images — an `image_folder` dataset's cache end to end in a real loaderd:
 * it builds (the cache holds the encoded files, not decoded rows), verifies, serves,
 * and the batches served from it are byte for byte those of the same pipeline on the
 * uncached folder, augmentation included. The JPEGs come from ld-genimages. */
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

#define N_IMAGES 60
#define N_CLASSES 3
#define EPOCHS 3

static int setup(void **state)
{
    struct harness *h = harness_new();
    const char *bin = getenv("LOADERD_BIN") ? getenv("LOADERD_BIN") : "build/bin/loaderd";
    char tmp[4096], cmd[8192];
    snprintf(tmp, sizeof tmp, "%s", bin);
    char *abs = realpath(dirname(tmp), NULL);
    assert_non_null(abs);
    snprintf(cmd, sizeof cmd, "%s/ld-genimages %s/img --count %d --classes %d --min 48 --max 96 >/dev/null", abs,
             h->dir, N_IMAGES, N_CLASSES);
    free(abs);
    assert_int_equal(system(cmd), 0);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness_free(*state);
    return 0;
}

static cJSON *call(lc_client *c, const char *op, const char *ds)
{
    char req[256], *text = NULL;
    snprintf(req, sizeof req, "{\"op\":\"%s\",\"dataset\":\"%s\"}", op, ds);
    if (lc_request_json(c, req, &text) < 0)
        fail_msg("%s: %s", op, lc_client_error(c));
    cJSON *j = cJSON_Parse(text);
    lc_free(text);
    assert_non_null(j);
    return j;
}

/* Every batch of EPOCHS epochs of one stream (shuffled, augmented), concatenated. */
static uint8_t *read_all(lc_client *c, const char *ds, size_t *ret_len)
{
    lc_stream_options o;
    lc_stream_options_init(&o);
    o.batch_size = 8;
    o.seed = 11;
    o.epochs = EPOCHS;
    lc_stream *s = NULL;
    if (lc_stream_open(c, ds, &o, &s) < 0)
        fail_msg("open %s: %s", ds, lc_client_error(c));
    size_t cap = 1 << 20, len = 0;
    uint8_t *all = malloc(cap);
    lc_batch *b;
    int r;
    while ((r = lc_stream_next(s, 20000, &b)) == 0) {
        for (int k = 0; k < 2; k++) {
            lc_field f;
            assert_int_equal(lc_batch_field_by_name(b, k ? "label" : "image", &f), 0);
            while (len + f.nbytes > cap)
                all = realloc(all, cap *= 2);
            memcpy(all + len, f.data, f.nbytes);
            len += f.nbytes;
        }
        lc_batch_release(b);
    }
    if (r != LC_EEND)
        fail_msg("next on %s: %s", ds, lc_client_error(c));
    lc_stream_close(s);
    *ret_len = len;
    return all;
}

static void test_image_cache_end_to_end(void **state)
{
    struct harness *h = *state;
    const char *pipeline = "    transforms:\n"
                           "      - random_resized_crop: {size: 32}\n"
                           "      - random_flip: {p: 0.5}\n"
                           "      - to_dtype: {dtype: uint8, layout: CHW}\n";
    char ds[2048], dir[200];
    snprintf(ds, sizeof ds,
             "  plain:\n    kind: image_folder\n    path: img\n%s"
             "  cached:\n    kind: image_folder\n    path: img\n    cache: {path: cache/img.ldcache}\n%s",
             pipeline, pipeline);
    snprintf(dir, sizeof dir, "%s/cache", h->dir);
    mkdir(dir, 0755);
    harness_write_config(h, "  workers: 2\n", ds);
    harness_start(h);
    lc_client *c = harness_connect(h, 10000, "itest_cache_images");

    cJSON *j = call(c, "cache_build", "cached");
    cJSON_Delete(j);
    const char *st = NULL;
    for (int i = 0; i < 400; i++) {
        j = call(c, "cache_info", "cached");
        st = cJSON_GetStringValue(cJSON_GetObjectItem(j, "state"));
        if (strcmp(st, "ready") == 0 || strcmp(st, "failed") == 0)
            break;
        cJSON_Delete(j);
        j = NULL;
        usleep(50000);
    }
    assert_non_null(j);
    if (strcmp(st, "ready") != 0)
        fail_msg("the image cache did not build: %s", cJSON_PrintUnformatted(j));
    const cJSON *file = cJSON_GetObjectItem(j, "file");
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(file, "count")), N_IMAGES);
    /* Field 0 holds the encoded files: ragged bytes. */
    const cJSON *f0 = cJSON_GetArrayItem(cJSON_GetObjectItem(file, "fields"), 0);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(f0, "ragged")));
    cJSON_Delete(j);
    j = call(c, "cache_verify", "cached");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    cJSON_Delete(j);

    size_t n_plain, n_cached;
    uint8_t *plain = read_all(c, "plain", &n_plain);
    uint8_t *cached = read_all(c, "cached", &n_cached);
    assert_int_equal(n_plain, n_cached);
    assert_int_equal(n_plain, (size_t)EPOCHS * N_IMAGES * (3 * 32 * 32 + 8));
    assert_memory_equal(plain, cached, n_plain);
    free(plain);
    free(cached);
    /* Most of those epochs came from the cache (the first batches of the stream may
     * come from the files, until the check started at its open passed). */
    j = call(c, "cache_info", "cached");
    double hits = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "hits"));
    if (hits < N_IMAGES)
        fail_msg("only %.0f samples served from the cache", hits);
    cJSON_Delete(j);
    lc_client_close(c);
    harness_stop_clean(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_image_cache_end_to_end, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
