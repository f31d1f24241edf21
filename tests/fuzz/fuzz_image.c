/* fuzz_image — libFuzzer harness for the image path a worker runs on every sample:
 * format detection, header probe, JPEG/PNG decode (whole, DCT-scaled, or a region)
 * and the transform pipelines (resize, crops, flip, normalize, the three dtypes).
 *
 * Input: byte 0 picks the path, bytes 1..8 the sample index (the random crop's draws),
 * bytes 9..12 a region for a direct decode; the rest is the file. As in a worker, one
 * struct image_buf is reused for every input, and after each one a known-good JPEG and
 * PNG (the first seeds of that kind found in tests/fuzz/corpus/image, or in
 * $FUZZ_IMAGE_GOOD) must still decode with it: a bad file may fail, but may not break
 * the worker's decoder for the files after it. The pixel limit is kept small (1 MP) so that each run is
 * quick; the limit's own path is still reached by headers that claim more. */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "ld_error.h"
#include "proto.h"
#include "transform.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_PIXELS (1u << 20)
#define HEAD 13

static void check(int cond)
{
    if (!cond)
        abort();
}

enum { N_PIPES = 3 };
static transform_pipeline *pipes[N_PIPES];
static struct transform_output outs[N_PIPES];
static uint8_t *dst;
static struct image_buf scratch;

/* Known-good files (without the 13-byte head) that must decode after any input. */
struct good {
    uint8_t *data;
    size_t len;
};
static struct good good_jpeg, good_png;

static void load_good(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    static uint8_t buf[1 << 16];
    while ((e = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (n <= HEAD || buf[0] != 0)       /* the seeds of pipeline 0 */
            continue;
        enum image_format fmt = image_detect(buf + HEAD, n - HEAD);
        struct good *g = fmt == IMAGE_FORMAT_JPEG ? &good_jpeg : fmt == IMAGE_FORMAT_PNG ? &good_png : NULL;
        if (!g || g->data)
            continue;
        char err[LD_ERRMSG_MAX];
        if (transform_apply(pipes[0], buf + HEAD, n - HEAD, 7, 1, 0, dst, &scratch, err) != 0)
            continue;
        g->data = malloc(n - HEAD);
        check(g->data != NULL);
        memcpy(g->data, buf + HEAD, n - HEAD);
        g->len = n - HEAD;
    }
    closedir(d);
}

static void check_good(const struct good *g, const char *what)
{
    char err[LD_ERRMSG_MAX];
    if (!g->data)
        return;
    if (transform_apply(pipes[0], g->data, g->len, 7, 1, 0, dst, &scratch, err) != 0) {
        fprintf(stderr, "fuzz_image: a good %s no longer decodes after this input: %s\n", what, err);
        abort();
    }
}

static void build(int i, const struct transform_spec *specs, size_t n)
{
    char err[LD_ERRMSG_MAX];
    if (transform_pipeline_new(specs, n, &pipes[i], &outs[i], err) < 0)
        abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct transform_spec s[6];
    size_t n;

    /* The ImageNet validation recipe: resize the shorter side, center crop, uint8 CHW. */
    n = 0;
    transform_spec_init(&s[n], TRANSFORM_DECODE);
    s[n++].decode.max_pixels = FUZZ_MAX_PIXELS;
    transform_spec_init(&s[n], TRANSFORM_RESIZE);
    s[n++].resize.size = 20;
    transform_spec_init(&s[n], TRANSFORM_CENTER_CROP);
    s[n].center_crop.height = 16;
    s[n++].center_crop.width = 16;
    transform_spec_init(&s[n++], TRANSFORM_TO_DTYPE);
    build(0, s, n);

    /* The training recipe: random resized crop, flip, normalize, float32 HWC, strict. */
    n = 0;
    transform_spec_init(&s[n], TRANSFORM_DECODE);
    s[n].decode.max_pixels = FUZZ_MAX_PIXELS;
    s[n++].decode.strict = true;
    transform_spec_init(&s[n], TRANSFORM_RANDOM_RESIZED_CROP);
    s[n].random_resized_crop.height = 12;
    s[n++].random_resized_crop.width = 12;
    transform_spec_init(&s[n++], TRANSFORM_RANDOM_FLIP);
    transform_spec_init(&s[n], TRANSFORM_NORMALIZE);
    s[n].normalize.n_mean = s[n].normalize.n_std = 3;
    for (int c = 0; c < 3; c++) {
        s[n].normalize.mean[c] = 0.4 + 0.05 * c;
        s[n].normalize.std[c] = 0.2 + 0.01 * c;
    }
    n++;
    transform_spec_init(&s[n], TRANSFORM_TO_DTYPE);
    s[n].to_dtype.dtype = LD_DTYPE_FLOAT32;
    s[n++].to_dtype.layout = TRANSFORM_LAYOUT_HWC;
    build(1, s, n);

    /* A crop larger than most inputs (zero padding), then an exact resize; float16,
     * the fast DCT and no DCT scaling. */
    n = 0;
    transform_spec_init(&s[n], TRANSFORM_DECODE);
    s[n].decode.max_pixels = FUZZ_MAX_PIXELS;
    s[n].decode.fast = true;
    s[n++].decode.dct_scaling = false;
    transform_spec_init(&s[n], TRANSFORM_CENTER_CROP);
    s[n].center_crop.height = 40;
    s[n++].center_crop.width = 24;
    transform_spec_init(&s[n], TRANSFORM_RESIZE);
    s[n].resize.height = 9;
    s[n++].resize.width = 7;
    transform_spec_init(&s[n], TRANSFORM_TO_DTYPE);
    s[n++].to_dtype.dtype = LD_DTYPE_FLOAT16;
    build(2, s, n);

    size_t most = 0;
    for (int i = 0; i < N_PIPES; i++)
        if (outs[i].sample_bytes > most)
            most = outs[i].sample_bytes;
    dst = malloc(most);
    check(dst != NULL);
    image_buf_init(&scratch);
    const char *env = getenv("FUZZ_IMAGE_GOOD");
    load_good(env && env[0] ? env : "tests/fuzz/corpus/image");
    if (!good_jpeg.data || !good_png.data)
        fprintf(stderr, "fuzz_image: no good JPEG/PNG seed found: the decoder-state check is off\n");
    return 0;
}

static int fuzz_one(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_one(data, size);
    check_good(&good_jpeg, "JPEG");
    check_good(&good_png, "PNG");
    return 0;
}

static int fuzz_one(const uint8_t *data, size_t size)
{
    if (size < HEAD)
        return 0;
    unsigned mode = data[0] % (N_PIPES + 1);
    uint64_t index = 0;
    memcpy(&index, data + 1, sizeof index);
    const uint8_t *img = data + HEAD;
    size_t len = size - HEAD;
    char err[LD_ERRMSG_MAX];
    err[0] = '\0';

    if (mode < N_PIPES) {
        int r = transform_apply(pipes[mode], img, len, 7, 1, index, dst, &scratch, err);
        check(r == 0 || r == LD_ESAMPLE || r == LD_ENOMEM);
        check(r == 0 || err[0] != '\0');
        return 0;
    }

    /* A direct decode: probe, then a region (or the whole image) at a DCT scale. */
    struct image_info info;
    int r = image_probe(img, len, &scratch, &info, err);
    check(r == 0 || r == LD_ESAMPLE);
    if (r < 0)
        return 0;
    check(info.width > 0 && info.height > 0);
    struct image_decode_opts o = {.max_pixels = FUZZ_MAX_PIXELS, .strict = data[9] & 1, .fast = data[9] & 2};
    o.min_width = data[10] % 64;
    o.min_height = data[10] % 48;
    if (data[9] & 4) {
        o.region_x = data[11] % info.width;
        o.region_y = data[12] % info.height;
        o.region_w = 1 + data[11] % (info.width - o.region_x);
        o.region_h = 1 + data[12] % (info.height - o.region_y);
    }
    r = image_decode(img, len, &o, &scratch, err);
    check(r == 0 || r == LD_ESAMPLE || r == LD_ENOMEM);
    if (r == 0) {
        check(scratch.data != NULL && scratch.width > 0 && scratch.height > 0);
        check((uint64_t)scratch.width * (uint64_t)scratch.height <= FUZZ_MAX_PIXELS);
        check((size_t)scratch.width * (size_t)scratch.height * 3 <= scratch.cap);
        /* Touch every pixel: ASan catches a buffer shorter than width x height. */
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < (size_t)scratch.width * (size_t)scratch.height * 3; i++)
            sum += scratch.data[i];
        (void)sum;
    } else {
        check(err[0] != '\0');
    }
    return 0;
}
