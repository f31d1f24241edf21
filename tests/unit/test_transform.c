/* Unit tests for transform and resample: spec validation with its messages; crops,
 * pads and flips against hand-computed pixels; resize and random_resized_crop within
 * +-1 of a straightforward double-precision reference of the same filter; the random
 * crop's parameters against torchvision's rule; normalize, float16 and layouts exact;
 * determinism per (seed, epoch, index) across threads; the decode scale chosen from
 * the plan; the example plug-in and broken plug-ins; bad samples and the pixel limit.
 *
 * Plug-ins are found in $LD_PLUGIN_DIR (default: ../lib next to this binary's
 * directory, i.e. $(BUILD)/lib), fixtures in the binary's directory's plugins/. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image_fixtures.h"
#include "ld_error.h"
#include "proto.h"
#include "resample.h"
#include "transform.h"
#include "transform_schema.h"

/* ---- helpers ------------------------------------------------------------------------ */

static struct transform_spec S(enum transform_kind k)
{
    struct transform_spec s;
    transform_spec_init(&s, k);
    return s;
}

static struct transform_spec crop(int h, int w)
{
    struct transform_spec s = S(TRANSFORM_CENTER_CROP);
    s.center_crop.height = h;
    s.center_crop.width = w;
    return s;
}

static struct transform_spec resize_exact(int h, int w)
{
    struct transform_spec s = S(TRANSFORM_RESIZE);
    s.resize.height = h;
    s.resize.width = w;
    return s;
}

static struct transform_spec resize_short(int size)
{
    struct transform_spec s = S(TRANSFORM_RESIZE);
    s.resize.size = size;
    return s;
}

static struct transform_spec flip(double p)
{
    struct transform_spec s = S(TRANSFORM_RANDOM_FLIP);
    s.random_flip.p = p;
    return s;
}

static struct transform_spec rrc(int h, int w)
{
    struct transform_spec s = S(TRANSFORM_RANDOM_RESIZED_CROP);
    s.random_resized_crop.height = h;
    s.random_resized_crop.width = w;
    return s;
}

static struct transform_spec to_dtype(int dtype, enum transform_layout layout)
{
    struct transform_spec s = S(TRANSFORM_TO_DTYPE);
    s.to_dtype.dtype = dtype;
    s.to_dtype.layout = layout;
    return s;
}

static struct transform_spec normalize3(double m0, double m1, double m2, double s0, double s1,
                                        double s2)
{
    struct transform_spec s = S(TRANSFORM_NORMALIZE);
    s.normalize.n_mean = s.normalize.n_std = 3;
    s.normalize.mean[0] = m0;
    s.normalize.mean[1] = m1;
    s.normalize.mean[2] = m2;
    s.normalize.std[0] = s0;
    s.normalize.std[1] = s1;
    s.normalize.std[2] = s2;
    return s;
}

static transform_pipeline *pipeline(const struct transform_spec *specs, size_t n,
                                    struct transform_output *out)
{
    transform_pipeline *p = NULL;
    char err[LD_ERRMSG_MAX] = "";
    int r = transform_pipeline_new(specs, n, &p, out, err);
    if (r != 0)
        fail_msg("pipeline: %d %s", r, err);
    return p;
}

/* Expects transform_pipeline_new to fail with LD_ECONFIG and `needle` in the message. */
static void pipeline_fails(const struct transform_spec *specs, size_t n, const char *needle)
{
    transform_pipeline *p = NULL;
    char err[LD_ERRMSG_MAX] = "";
    int r = transform_pipeline_new(specs, n, &p, NULL, err);
    if (r != LD_ECONFIG || !strstr(err, needle))
        fail_msg("expected LD_ECONFIG with '%s', got %d: '%s'", needle, r, err);
    assert_null(p);
}

/* Runs the pipeline on one sample; returns a malloc'ed output of sample_bytes. */
static void *apply(const transform_pipeline *p, const struct blob *b, uint64_t seed,
                   uint64_t epoch, uint64_t index, struct image_buf *scratch)
{
    const struct transform_output *o = transform_pipeline_output(p);
    void *dst = malloc(o->sample_bytes);
    assert_non_null(dst);
    memset(dst, 0xcd, o->sample_bytes);
    char err[LD_ERRMSG_MAX] = "";
    int r = transform_apply(p, b->data, b->len, seed, epoch, index, dst, scratch, err);
    if (r != 0)
        fail_msg("transform_apply: %d %s", r, err);
    return dst;
}

static void *apply1(const transform_pipeline *p, const struct blob *b, uint64_t index)
{
    struct image_buf scratch;
    image_buf_init(&scratch);
    void *out = apply(p, b, 7, 0, index, &scratch);
    image_buf_close(&scratch);
    return out;
}

/* A picture whose every pixel is distinct: (x * 10, y * 20, x + y * 3). */
static uint8_t *coords_rgb(int w, int h)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    assert_non_null(px);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 10);
            p[1] = (uint8_t)(y * 20);
            p[2] = (uint8_t)(x + y * 3);
        }
    return px;
}

static const uint8_t *pix(const uint8_t *px, int w, int x, int y)
{
    return px + ((size_t)y * w + x) * 3;
}

static uint8_t *mirror(const uint8_t *px, int w, int h)
{
    uint8_t *m = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            memcpy(m + ((size_t)y * w + x) * 3, pix(px, w, w - 1 - x, y), 3);
    return m;
}

/* ---- the reference resize: every source pixel weighted by the triangle filter -------- */

static double tri(double x)
{
    x = fabs(x);
    return x < 1 ? 1 - x : 0;
}

/* Weights of output i over source pixels [lo, hi) (w has hi - lo entries), sum 1. */
static void ref_weights(double in0, double in_w, int lo, int hi, int out_n, int i, double *w)
{
    double scale = in_w / out_n, s = scale > 1 ? scale : 1;
    double c = in0 + (i + 0.5) * scale, sum = 0;
    for (int x = lo; x < hi; x++)
        sum += w[x - lo] = tri((x + 0.5 - c) / s);
    for (int x = lo; x < hi; x++)
        w[x - lo] /= sum;
}

/* Resizes box (bx, by, bw, bh) of src, windows kept in [cx0, cx1) x [cy0, cy1), to
 * ow x oh, in doubles, with no intermediate rounding. */
static double *ref_resize(const uint8_t *src, int sw, double bx, double by, double bw, double bh,
                          int cx0, int cy0, int cx1, int cy1, int ow, int oh)
{
    double *out = calloc((size_t)ow * oh * 3, sizeof(double));
    double *wx = malloc(sizeof(double) * (size_t)(cx1 - cx0));
    double *wy = malloc(sizeof(double) * (size_t)(cy1 - cy0));
    for (int oy = 0; oy < oh; oy++) {
        ref_weights(by, bh, cy0, cy1, oh, oy, wy);
        for (int ox = 0; ox < ow; ox++) {
            ref_weights(bx, bw, cx0, cx1, ow, ox, wx);
            for (int y = cy0; y < cy1; y++) {
                if (wy[y - cy0] == 0)
                    continue;
                for (int x = cx0; x < cx1; x++) {
                    double k = wy[y - cy0] * wx[x - cx0];
                    for (int c = 0; c < 3; c++)
                        out[((size_t)oy * ow + ox) * 3 + c] += k * pix(src, sw, x, y)[c];
                }
            }
        }
    }
    free(wx);
    free(wy);
    return out;
}

/* Every byte of got within 1 of the reference's rounding; a region of it
 * (rx, ry, gw x gh) when the reference is larger. */
static void expect_near(const uint8_t *got, int gw, int gh, const double *ref, int rw, int rx,
                        int ry)
{
    for (int y = 0; y < gh; y++)
        for (int x = 0; x < gw; x++)
            for (int c = 0; c < 3; c++) {
                double want = ref[((size_t)(y + ry) * rw + x + rx) * 3 + c];
                int g = got[((size_t)y * gw + x) * 3 + c];
                if (fabs(g - want) > 1.0 + 1e-9 && abs(g - (int)floor(want + 0.5)) > 1)
                    fail_msg("pixel (%d,%d,%d): got %d, reference %.3f", x, y, c, g, want);
            }
}

/* ---- torchvision's RandomResizedCrop.get_params, written from its source ------------- *
 *
 * Independent of transform.c: only the random numbers come from the same stream (the
 * documented ld_prng of transform_plugin.h), drawn in torchvision's order: per attempt
 * the area fraction, then the log-ratio, then (on success) the row and the column.
 *
 *     area = height * width; log_ratio = log(ratio)
 *     for _ in range(10):
 *         target_area = area * uniform(scale[0], scale[1])
 *         aspect_ratio = exp(uniform(log_ratio[0], log_ratio[1]))
 *         w = int(round(sqrt(target_area * aspect_ratio)))
 *         h = int(round(sqrt(target_area / aspect_ratio)))
 *         if 0 < w <= width and 0 < h <= height:
 *             i = randint(0, height - h + 1); j = randint(0, width - w + 1)
 *             return i, j, h, w
 *     in_ratio = width / height
 *     if in_ratio < min(ratio): w = width; h = int(round(w / min(ratio)))
 *     elif in_ratio > max(ratio): h = height; w = int(round(h * max(ratio)))
 *     else: w = width; h = height
 *     return (height - h) // 2, (width - w) // 2, h, w
 *
 * Python's round() goes half to even, which is rint() in the default rounding mode. */
static void tv_rrc_params(int width, int height, const double scale[2], const double ratio[2],
                          struct ld_prng *rng, struct transform_rect *ret)
{
    double area = (double)height * width;
    double log_lo = log(ratio[0]), log_hi = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target_area = area * (scale[0] + (scale[1] - scale[0]) * ld_prng_uniform(rng));
        double aspect_ratio = exp(log_lo + (log_hi - log_lo) * ld_prng_uniform(rng));
        long w = lrint(sqrt(target_area * aspect_ratio));
        long h = lrint(sqrt(target_area / aspect_ratio));
        if (0 < w && w <= width && 0 < h && h <= height) {
            long i = (long)ld_prng_below(rng, (uint64_t)(height - h + 1));
            long j = (long)ld_prng_below(rng, (uint64_t)(width - w + 1));
            *ret = (struct transform_rect){(int)j, (int)i, (int)w, (int)h};
            return;
        }
    }
    double in_ratio = (double)width / height;
    double rmin = fmin(ratio[0], ratio[1]), rmax = fmax(ratio[0], ratio[1]);
    long w = width, h = height;
    if (in_ratio < rmin)
        h = lrint(w / rmin);
    else if (in_ratio > rmax)
        w = lrint(h * rmax);
    *ret = (struct transform_rect){(int)((width - w) / 2), (int)((height - h) / 2), (int)w, (int)h};
}

/* ---- PIL's antialiased bilinear resize, separable, in doubles ---------------------------- *
 *
 * Written from Pillow's ImagingResample (precompute_coeffs with the bilinear filter):
 * output i of n over source [0, in) is centered at (i + 0.5) * scale, scale = in / n;
 * support = max(scale, 1); window [int(center - support + 0.5), int(center + support +
 * 0.5)) clipped to the source; weights triangle((x + 0.5 - center) / max(scale, 1)),
 * normalized. Rows are done first, then columns; nothing is rounded in between. */
static void pil_axis(int in, int n, int i, int *ret_lo, int *ret_hi, double *wt)
{
    double scale = (double)in / n, fs = scale > 1 ? scale : 1, center = (i + 0.5) * scale;
    int lo = (int)(center - fs + 0.5), hi = (int)(center + fs + 0.5);
    lo = lo < 0 ? 0 : lo;
    hi = hi > in ? in : hi;
    double sum = 0;
    for (int x = lo; x < hi; x++)
        sum += wt[x - lo] = tri((x + 0.5 - center) / fs);
    for (int x = lo; x < hi; x++)
        wt[x - lo] /= sum;
    *ret_lo = lo;
    *ret_hi = hi;
}

/* Resizes the rectangle (rx, ry, rw, rh) of src (sw pixels wide) as an image of its own
 * (torchvision crops, then resizes) to ow x oh. */
static double *pil_resize(const uint8_t *src, int sw, int rx, int ry, int rw, int rh, int ow,
                          int oh)
{
    double *tmp = calloc((size_t)ow * rh * 3, sizeof(double));
    double *out = calloc((size_t)ow * oh * 3, sizeof(double));
    double *wt = malloc(sizeof(double) * (size_t)(rw > rh ? rw : rh));
    assert_true(tmp && out && wt);
    for (int ox = 0; ox < ow; ox++) {
        int lo, hi;
        pil_axis(rw, ow, ox, &lo, &hi, wt);
        for (int y = 0; y < rh; y++)
            for (int x = lo; x < hi; x++)
                for (int c = 0; c < 3; c++)
                    tmp[((size_t)y * ow + ox) * 3 + c] += wt[x - lo] * pix(src, sw, rx + x, ry + y)[c];
    }
    for (int oy = 0; oy < oh; oy++) {
        int lo, hi;
        pil_axis(rh, oh, oy, &lo, &hi, wt);
        for (int y = lo; y < hi; y++)
            for (int i = 0; i < ow * 3; i++)
                out[(size_t)oy * ow * 3 + i] += wt[y - lo] * tmp[(size_t)y * ow * 3 + i];
    }
    free(wt);
    free(tmp);
    return out;
}

/* Largest and summed absolute difference of got (uint8) from ref rounded. */
static void diff_ref(const uint8_t *got, const double *ref, size_t n, int *mx, double *sum)
{
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - (int)floor(ref[i] + 0.5));
        *mx = d > *mx ? d : *mx;
        *sum += d;
    }
}

/* ---- spec validation ----------------------------------------------------------------- */

static void test_spec_validation(void **state)
{
    (void)state;
    struct transform_spec l[4];

    l[0] = crop(4, 4);
    l[1] = flip(0.5);
    l[2] = normalize3(0.5, 0.5, 0.5, 0.2, 0.2, 0.2);
    l[2].normalize.n_mean = 2;
    pipeline_fails(l, 3, "transforms[2] (normalize): mean has 2 values, expected 3 (or 1 for every channel)");
    l[2].normalize.n_mean = 3;
    l[2].normalize.n_std = 4;
    pipeline_fails(l, 3, "transforms[2] (normalize): std has 4 values");
    l[2].normalize.n_std = 3;
    l[2].normalize.std[1] = 0;
    pipeline_fails(l, 3, "transforms[2] (normalize): std[1] is 0: it must be a finite non-zero number");
    l[2].normalize.std[1] = 0.2;
    l[2].normalize.mean[2] = NAN;
    pipeline_fails(l, 3, "transforms[2] (normalize): mean[2] is not a finite number");

    l[0] = resize_short(256);
    pipeline_fails(l, 1, "the output size depends on the image");
    l[0] = crop(8, 8);
    l[1] = resize_short(256);
    pipeline_fails(l, 2, "the output size depends on the image");

    l[0] = crop(8, 8);
    l[1] = S(TRANSFORM_DECODE);
    pipeline_fails(l, 2, "transforms[1] (decode): must be the first transform");

    l[0] = resize_short(10);
    l[0].resize.height = 5;
    pipeline_fails(l, 1, "transforms[0] (resize): give either size (the shorter side) or height and width");
    l[0] = resize_exact(0, 5);
    pipeline_fails(l, 1, "transforms[0] (resize): height 0 and width 5 must be in [1, 16384]");
    l[0] = crop(5, 20000);
    pipeline_fails(l, 1, "transforms[0] (center_crop): height 5 and width 20000 must be in [1, 16384]");

    l[0] = rrc(8, 8);
    l[0].random_resized_crop.scale[0] = 0.5;
    l[0].random_resized_crop.scale[1] = 0.2;
    pipeline_fails(l, 1, "transforms[0] (random_resized_crop): scale [0.5, 0.2] must satisfy 0 < min <= max <= 1");
    l[0] = rrc(8, 8);
    l[0].random_resized_crop.ratio[0] = 0;
    pipeline_fails(l, 1, "transforms[0] (random_resized_crop): ratio [0, 1.33333]");

    l[0] = crop(8, 8);
    l[1] = flip(1.5);
    pipeline_fails(l, 2, "transforms[1] (random_flip): p 1.5 must be in [0, 1]");

    l[0] = crop(8, 8);
    l[1] = normalize3(0, 0, 0, 1, 1, 1);
    l[2] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_CHW);
    pipeline_fails(l, 3, "transforms[1] (normalize): the output dtype is uint8, which cannot hold normalized values");

    l[0] = normalize3(0, 0, 0, 1, 1, 1);
    l[1] = crop(8, 8);
    pipeline_fails(l, 2, "transforms[1] (center_crop): must come before normalize and to_dtype");
    l[0] = crop(8, 8);
    l[1] = to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC);
    l[2] = to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC);
    pipeline_fails(l, 3, "transforms[2] (to_dtype): to_dtype appears twice");
    l[1] = to_dtype(LD_DTYPE_INT32, TRANSFORM_LAYOUT_HWC);
    pipeline_fails(l, 2, "transforms[1] (to_dtype): dtype int32 is not an image output");
    l[1] = to_dtype(LD_DTYPE_UINT8, (enum transform_layout)7);
    pipeline_fails(l, 2, "transforms[1] (to_dtype): layout must be CHW or HWC");

    pipeline_fails(l, 0, "the list is empty");
    l[0] = crop(8, 8);
    l[0].kind = (enum transform_kind)99;
    pipeline_fails(l, 1, "transforms[0]: unknown kind 99");
    struct transform_spec many[TRANSFORM_MAX + 1];
    for (int i = 0; i <= TRANSFORM_MAX; i++)
        many[i] = crop(8, 8);
    pipeline_fails(many, TRANSFORM_MAX + 1, "at most 32");

    /* Valid lists, and what they produce. */
    struct transform_output o;
    l[0] = rrc(224, 200);
    l[1] = flip(0.5);
    l[2] = normalize3(0.485, 0.456, 0.406, 0.229, 0.224, 0.225);
    l[3] = to_dtype(LD_DTYPE_FLOAT16, TRANSFORM_LAYOUT_CHW);
    transform_pipeline *p = pipeline(l, 4, &o);
    assert_int_equal(o.dtype, LD_DTYPE_FLOAT16);
    assert_int_equal(o.layout, TRANSFORM_LAYOUT_CHW);
    assert_int_equal(o.shape[0], 3);
    assert_int_equal(o.shape[1], 224);
    assert_int_equal(o.shape[2], 200);
    assert_int_equal(o.sample_bytes, 224 * 200 * 3 * 2);
    assert_int_equal(o.max_pixels, IMAGE_DEFAULT_MAX_PIXELS);
    assert_memory_equal(transform_pipeline_output(p), &o, sizeof o);
    transform_pipeline_free(p);
    /* normalize without to_dtype: float32; HWC shape order; flip may follow normalize. */
    l[0] = resize_short(256);
    l[1] = crop(224, 224);
    l[2] = normalize3(0.5, 0.5, 0.5, 0.5, 0.5, 0.5);
    l[3] = flip(0.5);
    p = pipeline(l, 4, &o);
    assert_int_equal(o.dtype, LD_DTYPE_FLOAT32);
    assert_int_equal(o.sample_bytes, 224 * 224 * 3 * 4);
    transform_pipeline_free(p);
    l[0] = S(TRANSFORM_DECODE);
    l[0].decode.max_pixels = 12345;
    l[1] = crop(10, 20);
    l[2] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 3, &o);
    assert_int_equal(o.shape[0], 10);
    assert_int_equal(o.shape[1], 20);
    assert_int_equal(o.shape[2], 3);
    assert_int_equal(o.max_pixels, 12345);
    transform_pipeline_free(p);
    transform_pipeline_free(NULL);
}

static void test_names(void **state)
{
    (void)state;
    for (int k = TRANSFORM_DECODE; k <= TRANSFORM_PLUGIN; k++) {
        const char *n = transform_kind_name((enum transform_kind)k);
        assert_non_null(n);
        assert_int_equal(transform_kind_from_name(n), k);
    }
    assert_string_equal(transform_kind_name(TRANSFORM_RANDOM_RESIZED_CROP), "random_resized_crop");
    assert_null(transform_kind_name((enum transform_kind)0));
    assert_null(transform_kind_name((enum transform_kind)99));
    assert_int_equal(transform_kind_from_name("blur"), LD_EINVAL);
    assert_int_equal(transform_kind_from_name(NULL), LD_EINVAL);
    assert_int_equal(transform_layout_from_name("CHW"), TRANSFORM_LAYOUT_CHW);
    assert_int_equal(transform_layout_from_name("hwc"), TRANSFORM_LAYOUT_HWC);
    assert_int_equal(transform_layout_from_name("NCHW"), LD_EINVAL);
}

/* Every kind publishes one schema, the single list of names and parameters that the
 * config loader walks: the tables must be whole and consistent, and the defaults and
 * the freeing of loaded strings go through them too. */
static void test_schemas(void **state)
{
    (void)state;
    char names[512];
    transform_names(names, sizeof names);
    assert_string_equal(names, "decode, resize, center_crop, random_resized_crop, random_flip, normalize, "
                               "to_dtype, plugin");
    size_t listed = 0;
    for (int k = TRANSFORM_DECODE; k <= TRANSFORM_PLUGIN; k++) {
        const struct transform_schema *sc = transform_schema_of((enum transform_kind)k);
        assert_non_null(sc);
        assert_int_equal(sc->kind, k);
        assert_ptr_equal(transform_schema_find(sc->name), sc);
        assert_string_equal(transform_kind_name((enum transform_kind)k), sc->name);
        assert_non_null(strstr(names, sc->name));
        listed += strlen(sc->name) + (k > TRANSFORM_DECODE ? 2 : 0);
        assert_true(sc->n_params >= 1 && sc->n_params <= 64);
        unsigned groups = 0;
        for (size_t i = 0; i < sc->n_params; i++) {
            const struct transform_param *pr = &sc->params[i];
            assert_non_null(pr->name);
            for (size_t j = 0; j < i; j++)
                assert_string_not_equal(pr->name, sc->params[j].name);
            assert_true(pr->offset >= sizeof(enum transform_kind));
            assert_true(pr->offset + pr->width <= sizeof(struct transform_spec));
            if (pr->type == TRANSFORM_PARAM_INT)
                assert_true(pr->width == sizeof(int) || pr->width == sizeof(int64_t));
            if (pr->type == TRANSFORM_PARAM_NUMBERS)
                assert_true(pr->min >= 1 && pr->min <= pr->max && (size_t)pr->max * sizeof(double) <= pr->width);
            if (pr->type == TRANSFORM_PARAM_ENUM)
                assert_true(pr->from_name && pr->choices);
            if (pr->type == TRANSFORM_PARAM_SQUARE || (pr->flags & TRANSFORM_PARAM_COUNTED))
                assert_true(pr->offset2 >= sizeof(enum transform_kind) &&
                            pr->offset2 + sizeof(int) <= sizeof(struct transform_spec));
            groups |= pr->flags & (TRANSFORM_PARAM_EITHER_A | TRANSFORM_PARAM_EITHER_B);
        }
        /* Two groups that exclude each other, and a sentence saying so, or neither. */
        assert_true(groups == 0 || groups == (TRANSFORM_PARAM_EITHER_A | TRANSFORM_PARAM_EITHER_B));
        assert_true((groups != 0) == (sc->either != NULL));
    }
    assert_int_equal(strlen(names), listed);        /* nothing listed twice or beyond the kinds */
    assert_null(transform_schema_of((enum transform_kind)0));
    assert_null(transform_schema_of((enum transform_kind)(TRANSFORM_PLUGIN + 1)));
    assert_null(transform_schema_find("blur"));
    assert_null(transform_schema_find(NULL));
    /* A short buffer is cut, never overrun. */
    char small[8];
    assert_string_equal(transform_names(small, sizeof small), "decode,");

    /* The defaults come from the kind's descriptor (torchvision's values). */
    struct transform_spec s = S(TRANSFORM_RANDOM_RESIZED_CROP);
    assert_true(s.random_resized_crop.scale[0] == 0.08 && s.random_resized_crop.scale[1] == 1.0);
    assert_true(s.random_resized_crop.ratio[0] == 0.75 && s.random_resized_crop.ratio[1] == 4.0 / 3.0);
    assert_true(S(TRANSFORM_RANDOM_FLIP).random_flip.p == 0.5);
    assert_int_equal(S(TRANSFORM_TO_DTYPE).to_dtype.dtype, LD_DTYPE_UINT8);
    assert_int_equal(S(TRANSFORM_TO_DTYPE).to_dtype.layout, TRANSFORM_LAYOUT_CHW);
    s = S((enum transform_kind)99);
    assert_int_equal(s.kind, 99);
    assert_int_equal(s.resize.size, 0);

    /* transform_spec_clear frees exactly the strings the schema says were allocated
     * (ASan reports a leak or a bad free otherwise). */
    s = S(TRANSFORM_PLUGIN);
    s.plugin.path = strdup("/x/ld-plugin-a.so");
    s.plugin.params_json = strdup("{}");
    assert_non_null(s.plugin.path);
    assert_non_null(s.plugin.params_json);
    transform_spec_clear(&s);
    assert_null(s.plugin.path);
    assert_null(s.plugin.params_json);
    transform_spec_clear(&s);
    s = S(TRANSFORM_NORMALIZE);
    transform_spec_clear(&s);
    transform_spec_clear(NULL);
}

/* ---- geometry against hand-computed pixels ------------------------------------------ */

static void test_center_crop(void **state)
{
    (void)state;
    int w = 7, h = 5;
    uint8_t *px = coords_rgb(w, h);
    struct blob b = png_encode_rgb(px, w, h);

    /* left = round(4 / 2) = 2, top = round(3 / 2) = 2 (half to even). */
    struct transform_spec l[] = {crop(2, 3), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    transform_pipeline *p = pipeline(l, 2, NULL);
    uint8_t *out = apply1(p, &b, 0);
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 3; x++)
            assert_memory_equal(pix(out, 3, x, y), pix(px, w, 2 + x, 2 + y), 3);
    free(out);
    transform_pipeline_free(p);

    /* round(5 / 2) = 2 (half to even, as Python rounds), not 3. */
    struct transform_spec l5[] = {crop(5, 2), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l5, 2, NULL);
    out = apply1(p, &b, 0);
    for (int y = 0; y < 5; y++)
        for (int x = 0; x < 2; x++)
            assert_memory_equal(pix(out, 2, x, y), pix(px, w, 2 + x, y), 3);
    free(out);
    transform_pipeline_free(p);

    /* The same as CHW planes (the default layout). */
    l[1] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_CHW);
    p = pipeline(l, 2, NULL);
    out = apply1(p, &b, 0);
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 3; x++)
                assert_int_equal(out[c * 6 + y * 3 + x], pix(px, w, 2 + x, 2 + y)[c]);
    free(out);
    transform_pipeline_free(p);

    /* Larger than the image: zero padding, left (9 - 7) / 2 = 1, top 0 and 2 rows cut
     * at round((5 - 3) / 2) = 1. */
    l[0] = crop(3, 9);
    l[1] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 2, NULL);
    out = apply1(p, &b, 0);
    static const uint8_t zero[3];
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 9; x++) {
            if (x == 0 || x == 8)
                assert_memory_equal(pix(out, 9, x, y), zero, 3);
            else
                assert_memory_equal(pix(out, 9, x, y), pix(px, w, x - 1, y + 1), 3);
        }
    free(out);
    transform_pipeline_free(p);
    /* Both larger: padded (3, 1) left/top, (4, 2) right/bottom... then it is the image. */
    l[0] = crop(8, 14);
    p = pipeline(l, 2, NULL);
    out = apply1(p, &b, 0);
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 14; x++) {
            bool inside = x >= 3 && x < 10 && y >= 1 && y < 6;
            assert_memory_equal(pix(out, 14, x, y), inside ? pix(px, w, x - 3, y - 1) : zero, 3);
        }
    free(out);
    transform_pipeline_free(p);
    blob_free(&b);
    free(px);
}

static void test_flip(void **state)
{
    (void)state;
    int w = 6, h = 4;
    uint8_t *px = coords_rgb(w, h);
    uint8_t *m = mirror(px, w, h);
    struct blob b = png_encode_rgb(px, w, h);
    struct transform_spec l[3];

    /* flip, then crop 3 wide at round(3 / 2) = 2 of the flipped image. */
    l[0] = flip(1.0);
    l[1] = crop(4, 3);
    l[2] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    transform_pipeline *p = pipeline(l, 3, NULL);
    uint8_t *out = apply1(p, &b, 3);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 3; x++)
            assert_memory_equal(pix(out, 3, x, y), pix(m, w, 2 + x, y), 3);
    free(out);
    transform_pipeline_free(p);

    /* crop, then flip: the crop mirrored. */
    l[0] = crop(4, 3);
    l[1] = flip(1.0);
    p = pipeline(l, 3, NULL);
    out = apply1(p, &b, 3);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 3; x++)
            assert_memory_equal(pix(out, 3, x, y), pix(px, w, 2 + 2 - x, y), 3);
    free(out);
    transform_pipeline_free(p);

    /* flip, then a crop wider than the image: padding 1 left, 2 right of the flipped
     * image (not of the original). */
    struct transform_spec lp[] = {flip(1.0), crop(4, 9), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(lp, 3, NULL);
    out = apply1(p, &b, 3);
    static const uint8_t zero[3];
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 9; x++)
            assert_memory_equal(pix(out, 9, x, y), x >= 1 && x < 7 ? pix(m, w, x - 1, y) : zero, 3);
    free(out);
    transform_pipeline_free(p);

    /* p = 0: never; two flips: none. CHW and float outputs flip the same way. */
    l[0] = flip(0.0);
    l[1] = crop(4, 6);
    p = pipeline(l, 3, NULL);
    out = apply1(p, &b, 3);
    assert_memory_equal(out, px, (size_t)w * h * 3);
    free(out);
    transform_pipeline_free(p);
    struct transform_spec l2[4] = {flip(1.0), crop(4, 6), flip(1.0),
                                   to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l2, 4, NULL);
    out = apply1(p, &b, 3);
    assert_memory_equal(out, px, (size_t)w * h * 3);
    free(out);
    transform_pipeline_free(p);
    l[0] = flip(1.0);
    l[1] = crop(4, 6);
    l[2] = to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_CHW);
    p = pipeline(l, 3, NULL);
    float *f = apply1(p, &b, 3);
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                assert_true(f[(c * h + y) * w + x] == (float)(pix(m, w, x, y)[c] / 255.0));
    free(f);
    transform_pipeline_free(p);

    /* p = 0.5 flips about half of the samples, each the same way every time. */
    l[0] = flip(0.5);
    l[1] = crop(4, 6);
    l[2] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 3, NULL);
    int flipped = 0;
    for (uint64_t i = 0; i < 200; i++) {
        out = apply1(p, &b, i);
        bool fl = memcmp(out, m, (size_t)w * h * 3) == 0;
        assert_true(fl || memcmp(out, px, (size_t)w * h * 3) == 0);
        flipped += fl;
        uint8_t *again = apply1(p, &b, i);
        assert_memory_equal(out, again, (size_t)w * h * 3);
        free(again);
        free(out);
    }
    assert_in_range(flipped, 70, 130);
    transform_pipeline_free(p);
    blob_free(&b);
    free(m);
    free(px);
}

/* ---- resize and random_resized_crop against the reference ----------------------------- */

static uint8_t *noisy_rgb(int w, int h, uint32_t seed)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    uint32_t s = seed;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        s = s * 1103515245u + 12345u;
        px[i] = (uint8_t)(s >> 23);
    }
    return px;
}

static void check_resize(const uint8_t *px, int w, int h, const struct blob *b, int ow, int oh)
{
    struct transform_spec l[] = {resize_exact(oh, ow), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    transform_pipeline *p = pipeline(l, 2, NULL);
    uint8_t *out = apply1(p, b, 0);
    double *ref = ref_resize(px, w, 0, 0, w, h, 0, 0, w, h, ow, oh);
    expect_near(out, ow, oh, ref, ow, 0, 0);
    free(ref);
    free(out);
    transform_pipeline_free(p);
}

static void test_resize_reference(void **state)
{
    (void)state;
    int w = 40, h = 30;
    uint8_t *px = noisy_rgb(w, h, 1);
    struct blob b = png_encode_rgb(px, w, h);
    check_resize(px, w, h, &b, 17, 11);     /* shrink, non-integer ratios */
    check_resize(px, w, h, &b, 55, 41);     /* enlarge */
    check_resize(px, w, h, &b, 40, 13);     /* one axis only */
    check_resize(px, w, h, &b, 3, 2);       /* wide windows */
    check_resize(px, w, h, &b, 40, 30);     /* identity */

    /* Shorter side 20: 40x30 -> int(20 * 40 / 30) = 26 x 20, then a centered 20x20 at
     * round(6 / 2) = 3: only that part is computed, and it matches the full resize. */
    struct transform_spec l[] = {resize_short(20), crop(20, 20),
                                 to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    transform_pipeline *p = pipeline(l, 3, NULL);
    uint8_t *out = apply1(p, &b, 0);
    double *ref = ref_resize(px, w, 0, 0, w, h, 0, 0, w, h, 26, 20);
    expect_near(out, 20, 20, ref, 26, 3, 0);
    free(ref);
    free(out);
    transform_pipeline_free(p);

    /* A crop, then a resize: the filter stays inside the crop. */
    struct transform_spec l2[] = {crop(20, 30), resize_exact(7, 9),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l2, 3, NULL);
    out = apply1(p, &b, 0);
    ref = ref_resize(px, w, 5, 5, 30, 20, 5, 5, 35, 25, 9, 7);
    expect_near(out, 9, 7, ref, 9, 0, 0);
    free(ref);
    free(out);
    transform_pipeline_free(p);
    blob_free(&b);
    free(px);

    /* Antialiasing: a one-pixel checkerboard shrunk 8x is flat gray, where two-tap
     * bilinear sampling would keep black and white. */
    int cw = 64;
    uint8_t *cb = malloc((size_t)cw * cw * 3);
    for (int y = 0; y < cw; y++)
        for (int x = 0; x < cw; x++)
            memset(cb + ((size_t)y * cw + x) * 3, (x + y) % 2 ? 255 : 0, 3);
    b = png_encode_rgb(cb, cw, cw);
    struct transform_spec l3[] = {resize_exact(8, 8), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l3, 2, NULL);
    out = apply1(p, &b, 0);
    for (int i = 0; i < 8 * 8 * 3; i++)
        assert_in_range(out[i], 120, 135);
    free(out);
    transform_pipeline_free(p);
    blob_free(&b);
    free(cb);
}

/* The resampler alone: an output rectangle equals that part of the full output. */
static void test_resample_rect(void **state)
{
    (void)state;
    int w = 33, h = 21;
    uint8_t *px = noisy_rgb(w, h, 5);
    struct image_buf s;
    image_buf_init(&s);
    struct resample_job j = {.src = px, .src_stride = (size_t)w * 3, .src_w = w, .src_h = h,
                             .box_x0 = 1.5, .box_y0 = 0.25, .box_w = 30.0, .box_h = 19.5,
                             .clamp_x0 = 1, .clamp_y0 = 0, .clamp_x1 = 32, .clamp_y1 = 20,
                             .out_w = 12, .out_h = 9, .rect_w = 12, .rect_h = 9};
    uint8_t full[12 * 9 * 3], part[5 * 4 * 3];
    assert_int_equal(resample_run(&j, &s, full, 12 * 3, NULL, NULL), 0);
    double *ref = ref_resize(px, w, 1.5, 0.25, 30.0, 19.5, 1, 0, 32, 20, 12, 9);
    expect_near(full, 12, 9, ref, 12, 0, 0);
    free(ref);
    j.rect_x0 = 6;
    j.rect_y0 = 3;
    j.rect_w = 5;
    j.rect_h = 4;
    assert_int_equal(resample_run(&j, &s, part, 5 * 3, NULL, NULL), 0);
    for (int y = 0; y < 4; y++)
        assert_memory_equal(part + y * 15, full + ((y + 3) * 12 + 6) * 3, 15);
    /* Scale 1 at a half-pixel offset is not the identity: each output is the mean of
     * two neighbours. */
    struct resample_job half = {.src = px, .src_stride = (size_t)w * 3, .src_w = w, .src_h = h,
                                .box_x0 = 0.5, .box_y0 = 0, .box_w = 12, .box_h = 9,
                                .clamp_x1 = w, .clamp_y1 = h, .out_w = 12, .out_h = 9,
                                .rect_w = 12, .rect_h = 9};
    assert_int_equal(resample_run(&half, &s, full, 12 * 3, NULL, NULL), 0);
    ref = ref_resize(px, w, 0.5, 0, 12, 9, 0, 0, w, h, 12, 9);
    expect_near(full, 12, 9, ref, 12, 0, 0);
    for (int x = 0; x < 12; x++)
        assert_true(abs(full[x * 3] - (px[x * 3] + px[(x + 1) * 3] + 1) / 2) <= 1);
    free(ref);
    /* Bad jobs are refused. */
    j.rect_x0 = 8;
    assert_int_equal(resample_run(&j, &s, part, 5 * 3, NULL, NULL), LD_EINVAL);
    j.rect_x0 = 6;
    j.clamp_x1 = 40;
    assert_int_equal(resample_run(&j, &s, part, 5 * 3, NULL, NULL), LD_EINVAL);
    j.clamp_x1 = 32;
    assert_int_equal(resample_run(&j, &s, NULL, 0, NULL, NULL), LD_EINVAL);
    image_buf_close(&s);
    free(px);
}

/* Rows the resampler emits, gathered into an image. */
struct gathered {
    uint8_t *px;
    int w;
};

static void gather_row(void *ctx, int y, const uint8_t *row)
{
    struct gathered *g = ctx;
    memcpy(g->px + (size_t)y * g->w * 3, row, (size_t)g->w * 3);
}

/* Every kernel (plain C, SSE2, SSSE3, AVX2 where the CPU has them) gives the same bytes, into
 * a buffer or through the emitter, over geometries that take each pass order, the
 * identity shortcuts, shrinking and enlarging, fractional boxes and sub-rectangles;
 * and a flipped job gives exactly the mirror of the unflipped one. */
static void test_resample_kernels(void **state)
{
    (void)state;
    int w = 61, h = 37;
    uint8_t *px = noisy_rgb(w, h, 17);
    struct image_buf s;
    image_buf_init(&s);
    struct resample_job base = {.src = px, .src_stride = (size_t)w * 3, .src_w = w, .src_h = h,
                                .box_w = w, .box_h = h, .clamp_x1 = w, .clamp_y1 = h};
    struct {
        double bx, by, bw, bh;
        int ow, oh, rx, ry, rw, rh;
    } jobs[] = {
        {0, 0, 61, 37, 100, 50, 0, 0, 100, 50},      /* enlarging both */
        {0, 0, 61, 37, 36, 22, 0, 0, 36, 22},        /* shrinking 1.7x */
        {0, 0, 61, 37, 12, 7, 0, 0, 12, 7},          /* shrinking 5x: wide windows */
        {2.5, 1.25, 50.5, 30.0, 23, 17, 3, 2, 17, 11}, /* fractional box, a rectangle */
        {0, 0, 61, 37, 12, 90, 0, 0, 12, 90},        /* narrow and tall */
        {0, 0, 61, 37, 100, 5, 0, 0, 100, 5},        /* wide and flat */
        {5, 0, 20, 37, 20, 50, 0, 0, 20, 50},        /* x the identity (a crop), y enlarged */
        {5, 3, 20, 30, 20, 30, 1, 1, 18, 27},        /* both the identity: a crop */
        {0, 4, 61, 20, 31, 20, 0, 0, 31, 20},        /* y the identity, x shrunk */
        {0, 0, 61, 37, 1, 1, 0, 0, 1, 1},            /* one pixel */
        {0, 0, 61, 37, 7, 3, 0, 0, 7, 3},            /* fewer than four pixels a row, almost */
        {0, 0, 61, 37, 101, 9, 0, 0, 101, 9},        /* enlarging, an odd width: AVX2 pairs */
        {1.5, 0, 59, 37, 19, 12, 2, 0, 15, 12},      /* shrinking 3x, an odd rectangle */
    };
    enum resample_simd top = resample_simd_level();
    for (size_t t = 0; t < sizeof jobs / sizeof jobs[0]; t++) {
        struct resample_job j = base;
        j.box_x0 = jobs[t].bx;
        j.box_y0 = jobs[t].by;
        j.box_w = jobs[t].bw;
        j.box_h = jobs[t].bh;
        j.clamp_x0 = (int)floor(j.box_x0);
        j.clamp_y0 = (int)floor(j.box_y0);
        j.clamp_x1 = (int)ceil(j.box_x0 + j.box_w);
        j.clamp_y1 = (int)ceil(j.box_y0 + j.box_h);
        j.out_w = jobs[t].ow;
        j.out_h = jobs[t].oh;
        j.rect_x0 = jobs[t].rx;
        j.rect_y0 = jobs[t].ry;
        j.rect_w = jobs[t].rw;
        j.rect_h = jobs[t].rh;
        size_t bytes = (size_t)j.rect_w * j.rect_h * 3, stride = (size_t)j.rect_w * 3;
        uint8_t *want = malloc(bytes), *got = malloc(bytes), *flipped = NULL;
        assert_true(want && got);
        resample_simd_limit(RESAMPLE_SIMD_C);
        assert_int_equal(resample_simd_level(), RESAMPLE_SIMD_C);
        assert_int_equal(resample_run(&j, &s, want, stride, NULL, NULL), 0);
        for (int flip = 0; flip < 2; flip++) {
            j.flip = flip;
            if (flip) {
                flipped = mirror(want, j.rect_w, j.rect_h);
                memcpy(want, flipped, bytes);
            }
            for (int level = RESAMPLE_SIMD_C; level <= (int)top; level++) {
                resample_simd_limit((enum resample_simd)level);
                memset(got, 0xa5, bytes);
                assert_int_equal(resample_run(&j, &s, got, stride, NULL, NULL), 0);
                if (memcmp(got, want, bytes) != 0)
                    fail_msg("job %zu, flip %d, kernel %d: bytes differ", t, flip, level);
                memset(got, 0x5a, bytes);
                struct gathered g = {got, j.rect_w};
                assert_int_equal(resample_run(&j, &s, NULL, 0, gather_row, &g), 0);
                if (memcmp(got, want, bytes) != 0)
                    fail_msg("job %zu, flip %d, kernel %d, emitted rows: bytes differ", t, flip, level);
            }
        }
        free(flipped);
        free(want);
        free(got);
    }
    resample_simd_limit(RESAMPLE_SIMD_AVX2);
    assert_int_equal(resample_simd_level(), top);
    image_buf_close(&s);
    free(px);
}

/* uint8 CHW is HWC split into planes, pixel for pixel, flipped or not, whatever the
 * row width (the split runs thirty-two or sixteen pixels at a time, the rest one by
 * one). */
static void test_chw_planes(void **state)
{
    (void)state;
    int w = 50, h = 31;
    uint8_t *px = noisy_rgb(w, h, 23);
    struct blob b = png_encode_rgb(px, w, h);
    const int widths[] = {37, 16, 5, 48, 32, 83};
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
        for (int flipped = 0; flipped < 2; flipped++) {
            int ow = widths[k], oh = 13;
            struct transform_spec hwc[] = {flip(flipped ? 1.0 : 0.0), resize_exact(oh, ow),
                                           to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
            struct transform_spec chw[] = {flip(flipped ? 1.0 : 0.0), resize_exact(oh, ow),
                                           to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_CHW)};
            transform_pipeline *ph = pipeline(hwc, 3, NULL), *pc = pipeline(chw, 3, NULL);
            struct image_buf scratch;
            image_buf_init(&scratch);
            uint8_t *a = apply(ph, &b, 1, 0, 0, &scratch), *c = apply(pc, &b, 1, 0, 0, &scratch);
            image_buf_close(&scratch);
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++)
                    for (int ch = 0; ch < 3; ch++)
                        if (c[((size_t)ch * oh + y) * ow + x] != a[((size_t)y * ow + x) * 3 + ch])
                            fail_msg("width %d, flip %d: pixel (%d,%d,%d) differs", ow, flipped, x, y, ch);
            free(a);
            free(c);
            transform_pipeline_free(ph);
            transform_pipeline_free(pc);
        }
    }
    blob_free(&b);
    free(px);
}

static void test_random_resized_crop_reference(void **state)
{
    (void)state;
    int w = 48, h = 36;
    uint8_t *px = noisy_rgb(w, h, 9);
    uint8_t *m = mirror(px, w, h);
    struct blob b = png_encode_rgb(px, w, h);
    for (int flipped = 0; flipped < 2; flipped++) {
        /* Step 1 is the crop (step 0 the flip), so its stream is ld_prng_for(.., 1). */
        struct transform_spec l[] = {flip(flipped ? 1.0 : 0.0), rrc(10, 12),
                                     to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
        transform_pipeline *p = pipeline(l, 3, NULL);
        for (uint64_t index = 0; index < 12; index++) {
            struct image_buf scratch;
            image_buf_init(&scratch);
            uint8_t *out = apply(p, &b, 11, 2, index, &scratch);
            image_buf_close(&scratch);
            /* The crop torchvision's rule draws from this sample's stream. */
            struct ld_prng rng = ld_prng_for(11, 2, index, 1);
            struct transform_rect c;
            tv_rrc_params(w, h, l[1].random_resized_crop.scale, l[1].random_resized_crop.ratio,
                          &rng, &c);
            /* The crop of the (flipped) image, resized with windows inside the crop. */
            double *ref = ref_resize(flipped ? m : px, w, c.x, c.y, c.width, c.height, c.x, c.y,
                                     c.x + c.width, c.y + c.height, 12, 10);
            expect_near(out, 12, 10, ref, 12, 0, 0);
            free(ref);
            free(out);
        }
        transform_pipeline_free(p);
    }
    blob_free(&b);
    free(m);
    free(px);
}

/* ---- random_resized_crop's parameters -------------------------------------------------- */

static void test_rrc_params(void **state)
{
    (void)state;
    /* The same rectangles as torchvision's rule, written out independently above, on
     * every kind of image and range: landscape, portrait, tiny, strips that only the
     * fallback fits, narrow and unusual scale and ratio ranges. */
    static const int sizes[][2] = {{500, 375}, {375, 500}, {224, 224}, {3, 2}, {1, 1},
                                   {1000, 10}, {10, 1000}, {4000, 3000}, {17, 911}};
    static const double ranges[][4] = {{0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0}, {1.0, 1.0, 1.0, 1.0},
                                       {0.5, 0.5, 0.2, 5.0}, {0.9, 1.0, 2.0, 3.0},
                                       {0.01, 0.02, 0.5, 0.6}};
    int fallbacks = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
            for (uint64_t i = 0; i < 200; i++) {
                int W0 = sizes[si][0], H0 = sizes[si][1];
                const double sc[2] = {ranges[ri][0], ranges[ri][1]};
                const double ra[2] = {ranges[ri][2], ranges[ri][3]};
                struct ld_prng a = ld_prng_for(5, si, i, ri), b = a;
                struct transform_rect got, want;
                transform_random_resized_crop_params(W0, H0, sc, ra, &a, &got);
                tv_rrc_params(W0, H0, sc, ra, &b, &want);
                /* Where torchvision's fallback rounds a side to 0 (a 1-pixel side and a
                 * ratio of 2 or more) it would fail on an empty crop; loaderd keeps 1. */
                if (want.height == 0) {
                    want.height = 1;
                    want.y = (H0 - 1) / 2;
                }
                if (want.width == 0) {
                    want.width = 1;
                    want.x = (W0 - 1) / 2;
                }
                if (memcmp(&got, &want, sizeof got) != 0)
                    fail_msg("%dx%d scale [%g, %g] ratio [%g, %g] draw %" PRIu64 ": got %d,%d "
                             "%dx%d, torchvision's rule gives %d,%d %dx%d", W0, H0, sc[0], sc[1],
                             ra[0], ra[1], i, got.x, got.y, got.width, got.height, want.x,
                             want.y, want.width, want.height);
                fallbacks += a.counter == 20;       /* ten failed attempts drew 20 numbers */
            }
    assert_true(fallbacks > 500);

    const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    int W = 500, H = 375;
    double area_min = 1, area_max = 0, r_min = 10, r_max = 0;
    int distinct = 0;
    struct transform_rect prev = {-1, -1, -1, -1};
    for (uint64_t i = 0; i < 3000; i++) {
        struct ld_prng rng = ld_prng_for(3, 1, i, 0);
        struct transform_rect c;
        transform_random_resized_crop_params(W, H, scale, ratio, &rng, &c);
        assert_true(c.x >= 0 && c.y >= 0 && c.width >= 1 && c.height >= 1);
        assert_true(c.x + c.width <= W && c.y + c.height <= H);
        double a = (double)c.width * c.height / (W * H), r = (double)c.width / c.height;
        /* Rounding w and h to integers moves area and ratio a little past the range. */
        assert_true(a >= 0.08 * 0.95 && a <= 1.0);
        assert_true(r >= 0.75 * 0.97 && r <= 4.0 / 3.0 * 1.03);
        area_min = fmin(area_min, a);
        area_max = fmax(area_max, a);
        r_min = fmin(r_min, r);
        r_max = fmax(r_max, r);
        distinct += memcmp(&c, &prev, sizeof c) != 0;
        prev = c;
        /* The same key gives the same crop. */
        struct ld_prng again = ld_prng_for(3, 1, i, 0);
        struct transform_rect c2;
        transform_random_resized_crop_params(W, H, scale, ratio, &again, &c2);
        assert_memory_equal(&c, &c2, sizeof c);
    }
    /* The draws cover the ranges. */
    assert_true(area_min < 0.1 && area_max > 0.9);
    assert_true(r_min < 0.78 && r_max > 1.28);
    assert_true(distinct > 2900);

    /* A strip no allowed crop fits in ten tries: the centered fallback, ratio clamped:
     * w = round(10 * 4/3) = 13. */
    struct ld_prng rng = ld_prng_for(1, 0, 0, 0);
    struct transform_rect c;
    const double one[2] = {1.0, 1.0};
    transform_random_resized_crop_params(1000, 10, one, ratio, &rng, &c);
    assert_int_equal(c.width, 13);
    assert_int_equal(c.height, 10);
    assert_int_equal(c.x, (1000 - 13) / 2);
    assert_int_equal(c.y, 0);
    transform_random_resized_crop_params(10, 1000, one, ratio, &rng, &c);
    assert_int_equal(c.width, 10);
    assert_int_equal(c.height, 13);
    assert_int_equal(c.y, (1000 - 13) / 2);
    /* scale 1 and the image's own ratio: the whole image. */
    const double own[2] = {4.0 / 3.0, 4.0 / 3.0};
    transform_random_resized_crop_params(400, 300, one, own, &rng, &c);
    assert_int_equal(c.width, 400);
    assert_int_equal(c.height, 300);
    assert_int_equal(c.x, 0);
    assert_int_equal(c.y, 0);
}

static void test_prng(void **state)
{
    (void)state;
    struct ld_prng a = ld_prng_for(1, 2, 3, 4), b = ld_prng_for(1, 2, 3, 4);
    struct ld_prng c = ld_prng_for(1, 2, 4, 4), d = ld_prng_for(1, 3, 3, 4);
    struct ld_prng e = ld_prng_for(1, 2, 3, 5), f = ld_prng_for(2, 2, 3, 4);
    uint64_t va = ld_prng_next(&a);
    assert_true(va == ld_prng_next(&b));
    assert_true(va != ld_prng_next(&c));
    assert_true(va != ld_prng_next(&d));
    assert_true(va != ld_prng_next(&e));
    assert_true(va != ld_prng_next(&f));
    int hist[10] = {0};
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = ld_prng_uniform(&a);
        assert_true(u >= 0 && u < 1);
        sum += u;
        uint64_t k = ld_prng_below(&a, 10);
        assert_true(k < 10);
        hist[k]++;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.01);
    for (int k = 0; k < 10; k++)
        assert_in_range(hist[k], 9500, 10500);
    assert_int_equal(ld_prng_below(&a, 1), 0);
}

/* ---- values: normalize, float16, layouts ------------------------------------------------ */

static void test_half(void **state)
{
    (void)state;
    struct {
        double v;
        uint16_t h;
    } known[] = {
        {0.0, 0x0000},       {-0.0, 0x8000},      {1.0, 0x3c00},         {-2.0, 0xc000},
        {0.5, 0x3800},       {65504.0, 0x7bff},   {65519.99, 0x7bff},    {65520.0, 0x7c00},
        {1e6, 0x7c00},       {-1e6, 0xfc00},      {1.0 / 3.0, 0x3555},   {0x1p-14, 0x0400},
        {0x1p-24, 0x0001},   {0x1p-25, 0x0000},   {0x1.8p-25, 0x0001},   {3 * 0x1p-25, 0x0002},
        {0x1p-26, 0x0000},   {1.0 + 0x1p-11, 0x3c00}, {1.0 + 3 * 0x1p-11, 0x3c02},
        {0x1.ffcp-15, 0x0400}, {2049.0, 0x6800},  {2051.0, 0x6802},      {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00}, {1e-300, 0x0000},    {(1.0 - 0.5) / 0.5, 0x3c00},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint16_t h = transform_half_from_double(known[i].v);
        if (h != known[i].h)
            fail_msg("half(%a) = %#06x, expected %#06x", known[i].v, h, known[i].h);
    }
    assert_int_equal(transform_half_from_double(NAN) & 0x7c00, 0x7c00);
    assert_true(transform_half_from_double(NAN) & 0x03ff);
#ifdef __FLT16_MAX__
    /* The compiler's own conversion agrees on many values of every magnitude. */
    struct ld_prng rng = ld_prng_for(0, 0, 0, 0);
    for (int i = 0; i < 200000; i++) {
        double v = ldexp(ld_prng_uniform(&rng) * 2 - 1, (int)ld_prng_below(&rng, 50) - 30);
        _Float16 f = (_Float16)v;
        uint16_t want;
        memcpy(&want, &f, 2);
        uint16_t got = transform_half_from_double(v);
        if (got != want)
            fail_msg("half(%a) = %#06x, compiler says %#06x", v, got, want);
    }
#endif
}

static void test_normalize_and_dtypes(void **state)
{
    (void)state;
    uint8_t px[2 * 2 * 3] = {0, 255, 128, 64, 32, 16, 255, 0, 1, 100, 200, 51};
    struct blob b = png_encode_rgb(px, 2, 2);
    struct transform_spec l[3] = {crop(2, 2), normalize3(0.5, 0.25, 0.0, 0.5, 0.25, 2.0),
                                  to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC)};
    const double mean[3] = {0.5, 0.25, 0.0}, sd[3] = {0.5, 0.25, 2.0};

    transform_pipeline *p = pipeline(l, 3, NULL);
    float *f = apply1(p, &b, 0);
    for (int i = 0; i < 12; i++)
        assert_true(f[i] == (float)((px[i] / 255.0 - mean[i % 3]) / sd[i % 3]));
    assert_true(f[0] == -1.0f && f[1] == 3.0f && f[6] == 1.0f);
    free(f);
    transform_pipeline_free(p);

    l[2] = to_dtype(LD_DTYPE_FLOAT16, TRANSFORM_LAYOUT_CHW);
    p = pipeline(l, 3, NULL);
    uint16_t *h = apply1(p, &b, 0);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(h[c * 4 + i],
                             transform_half_from_double((px[i * 3 + c] / 255.0 - mean[c]) / sd[c]));
    assert_int_equal(h[0], 0xbc00);           /* R of pixel 0: (0 - 0.5) / 0.5 = -1 */
    assert_int_equal(h[4], 0x4200);           /* G of pixel 0: (1 - 0.25) / 0.25 = 3 */
    assert_int_equal(h[2], 0x3c00);           /* R of pixel 2: (1 - 0.5) / 0.5 = 1 */
    free(h);
    transform_pipeline_free(p);

    /* One value for every channel. */
    struct transform_spec one = S(TRANSFORM_NORMALIZE);
    one.normalize.n_mean = one.normalize.n_std = 1;
    one.normalize.mean[0] = 0.5;
    one.normalize.std[0] = 0.5;
    l[1] = one;
    l[2] = to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 3, NULL);
    f = apply1(p, &b, 0);
    for (int i = 0; i < 12; i++)
        assert_true(f[i] == (float)((px[i] / 255.0 - 0.5) / 0.5));
    free(f);
    transform_pipeline_free(p);

    /* float without normalize: v / 255; uint8 CHW and HWC: the bytes. */
    l[1] = to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 2, NULL);
    f = apply1(p, &b, 0);
    for (int i = 0; i < 12; i++)
        assert_true(f[i] == (float)(px[i] / 255.0));
    free(f);
    transform_pipeline_free(p);
    l[1] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 2, NULL);
    uint8_t *u = apply1(p, &b, 0);
    assert_memory_equal(u, px, 12);
    free(u);
    transform_pipeline_free(p);
    p = pipeline(l, 1, NULL);               /* the default: uint8 CHW */
    u = apply1(p, &b, 0);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(u[c * 4 + i], px[i * 3 + c]);
    free(u);
    transform_pipeline_free(p);
    blob_free(&b);
}

/* ---- determinism and the decode scale ----------------------------------------------------- */

struct thread_job {
    const transform_pipeline *p;
    const struct blob *b;
    uint64_t index;
    void *out;
};

static void *thread_main(void *arg)
{
    struct thread_job *j = arg;
    struct image_buf scratch;
    image_buf_init(&scratch);
    const struct transform_output *o = transform_pipeline_output(j->p);
    j->out = malloc(o->sample_bytes);
    char err[LD_ERRMSG_MAX];
    if (transform_apply(j->p, j->b->data, j->b->len, 5, 1, j->index, j->out, &scratch, err) != 0) {
        free(j->out);
        j->out = NULL;
    }
    image_buf_close(&scratch);
    return NULL;
}

static void test_determinism(void **state)
{
    (void)state;
    int w = 160, h = 120;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    struct transform_spec l[] = {rrc(32, 32), flip(0.5),
                                 normalize3(0.485, 0.456, 0.406, 0.229, 0.224, 0.225),
                                 to_dtype(LD_DTYPE_FLOAT16, TRANSFORM_LAYOUT_CHW)};
    struct transform_output o;
    transform_pipeline *p = pipeline(l, 4, &o);
    struct image_buf scratch;
    image_buf_init(&scratch);
    void *first = apply(p, &b, 5, 1, 42, &scratch);
    void *again = apply(p, &b, 5, 1, 42, &scratch);
    assert_memory_equal(first, again, o.sample_bytes);
    void *other_index = apply(p, &b, 5, 1, 43, &scratch);
    void *other_epoch = apply(p, &b, 5, 2, 42, &scratch);
    void *other_seed = apply(p, &b, 6, 1, 42, &scratch);
    assert_memory_not_equal(first, other_index, o.sample_bytes);
    assert_memory_not_equal(first, other_epoch, o.sample_bytes);
    assert_memory_not_equal(first, other_seed, o.sample_bytes);
    /* Other threads with their own scratch, after this one's scratch saw other sizes. */
    struct thread_job jobs[2] = {{p, &b, 42, NULL}, {p, &b, 43, NULL}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thread_main, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_non_null(jobs[0].out);
    assert_non_null(jobs[1].out);
    assert_memory_equal(jobs[0].out, first, o.sample_bytes);
    assert_memory_equal(jobs[1].out, other_index, o.sample_bytes);
    free(jobs[0].out);
    free(jobs[1].out);
    free(first);
    free(again);
    free(other_index);
    free(other_epoch);
    free(other_seed);
    image_buf_close(&scratch);
    transform_pipeline_free(p);
    blob_free(&b);
    free(px);
}

/* Mean absolute difference of two uint8 outputs. */
static double mean_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += abs((int)a[i] - (int)b[i]);
    return s / (double)n;
}

static void test_scaled_decode(void **state)
{
    (void)state;
    int w = 512, h = 384;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_444, 95, 0);
    struct image_buf scratch;
    image_buf_init(&scratch);
    /* The default decodes at full size; dct_scaling asks for the reduced decode. */
    struct transform_spec off = S(TRANSFORM_DECODE), on = S(TRANSFORM_DECODE);
    on.decode.dct_scaling = true;
    assert_false(off.decode.dct_scaling);

    /* The reduction keeps at least two decoded pixels per output pixel. */
    struct {
        struct transform_spec first, second;
        int n, want_denom;
    } cases[] = {
        {resize_exact(48, 64), {0}, 1, 4},      /* 1/4 gives exactly 2 x 64x48 */
        {resize_exact(49, 64), {0}, 1, 2},      /* one row more: 1/2 */
        {resize_exact(200, 200), {0}, 1, 1},    /* 1/2 would give 192 rows */
        {resize_short(96), crop(96, 96), 2, 2}, /* 128x96, twice that at 1/2 */
        {crop(64, 64), {0}, 1, 1},              /* a crop first needs full size */
        {flip(1.0), resize_exact(48, 64), 2, 4},
        /* A crop at odd offsets (131, 67) then a resize: a fractional box at 1/4. */
        {crop(250, 250), resize_exact(30, 30), 2, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct transform_spec l[5] = {on, cases[i].first, cases[i].second};
        l[cases[i].n + 1] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
        transform_pipeline *p = pipeline(l, (size_t)cases[i].n + 2, NULL);
        uint8_t *scaled = apply(p, &b, 1, 0, 0, &scratch);
        if (scratch.scale_denom != cases[i].want_denom)
            fail_msg("case %zu: decoded at 1/%d, expected 1/%d", i, scratch.scale_denom,
                     cases[i].want_denom);
        size_t bytes = transform_pipeline_output(p)->sample_bytes;
        transform_pipeline_free(p);
        /* The same list without a decode step (the default) decodes at full size and
         * gives nearly the same picture: the geometry was mapped onto the smaller image
         * correctly. */
        struct transform_spec lf[4] = {cases[i].first, cases[i].second};
        lf[cases[i].n] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
        p = pipeline(lf, (size_t)cases[i].n + 1, NULL);
        uint8_t *full = apply(p, &b, 1, 0, 0, &scratch);
        assert_int_equal(scratch.scale_denom, 1);
        double d = mean_diff(scaled, full, bytes);
        if (d > 2.0)
            fail_msg("case %zu: scaled decode differs from full decode by %.2f on average", i, d);
        free(scaled);
        free(full);
        transform_pipeline_free(p);
    }

    /* A random crop: the scale follows each crop's size, the picture stays put. */
    struct transform_spec l[] = {on, rrc(24, 24), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    struct transform_spec lf[] = {off, rrc(24, 24), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    transform_pipeline *p = pipeline(l, 3, NULL), *pf = pipeline(lf, 3, NULL);
    int reduced = 0;
    for (uint64_t i = 0; i < 20; i++) {
        uint8_t *scaled = apply(p, &b, 1, 0, i, &scratch);
        reduced += scratch.scale_denom > 1;
        /* The reduction leaves at least 2 x 24 decoded pixels across the crop. */
        struct ld_prng rng = ld_prng_for(1, 0, i, 0);
        struct transform_rect c;
        transform_random_resized_crop_params(w, h, l[1].random_resized_crop.scale,
                                             l[1].random_resized_crop.ratio, &rng, &c);
        assert_true(c.width / scratch.scale_denom >= 48 - 1);
        assert_true(c.height / scratch.scale_denom >= 48 - 1);
        uint8_t *full = apply(pf, &b, 1, 0, i, &scratch);
        double d = mean_diff(scaled, full, 24 * 24 * 3);
        if (d > 2.5)
            fail_msg("crop %" PRIu64 ": scaled decode differs by %.2f on average", i, d);
        free(scaled);
        free(full);
    }
    assert_true(reduced >= 10);
    transform_pipeline_free(p);
    transform_pipeline_free(pf);
    blob_free(&b);
    free(px);

    /* Sizes that are not multiples of 8: 100x75 at 1/4 is 25x19, the box fractional. */
    px = picture_rgb(100, 75);
    b = jpeg_encode(px, 100, 75, TJPF_RGB, TJSAMP_444, 95, 0);
    struct transform_spec l2[] = {on, resize_exact(9, 12), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    struct transform_spec l2f[] = {off, resize_exact(9, 12), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l2, 3, NULL);
    pf = pipeline(l2f, 3, NULL);
    uint8_t *scaled = apply(p, &b, 1, 0, 0, &scratch);
    assert_int_equal(scratch.scale_denom, 4);
    assert_int_equal(scratch.width, 25);
    uint8_t *full = apply(pf, &b, 1, 0, 0, &scratch);
    assert_true(mean_diff(scaled, full, 12 * 9 * 3) < 3.0);
    free(scaled);
    free(full);
    transform_pipeline_free(p);
    transform_pipeline_free(pf);
    blob_free(&b);
    free(px);
    image_buf_close(&scratch);
}

/* ---- pixels against PIL's --------------------------------------------------------------- */

struct accuracy {
    int max;
    double sum;
    size_t n;
    int reduced;                    /* samples decoded at a reduced DCT scale */
};

/* Runs `b` (w x h, pixels `px` as the full-size decode gives them) through
 * RandomResizedCrop(out) and Resize(out + out / 4) + CenterCrop(out) with the given
 * decode step, and compares every byte with torchvision on PIL: the crop torchvision's
 * rule draws, resized by PIL's filter from the full-size pixels. */
static void accuracy_run(const struct blob *b, const uint8_t *px, int w, int h,
                         const struct transform_spec *decode, int out, struct accuracy *acc)
{
    struct image_buf scratch;
    image_buf_init(&scratch);
    /* Without a decode step, the defaults. */
    struct transform_spec l1[] = {decode ? *decode : S(TRANSFORM_DECODE), rrc(out, out),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    int skip = decode ? 0 : 1;
    transform_pipeline *p = pipeline(l1 + skip, 3 - skip, NULL);
    for (uint64_t i = 0; i < 10; i++) {
        uint8_t *got = apply(p, b, 3, 0, i, &scratch);
        acc->reduced += scratch.scale_denom > 1;
        struct ld_prng rng = ld_prng_for(3, 0, i, 0);
        struct transform_rect c;
        tv_rrc_params(w, h, l1[1].random_resized_crop.scale, l1[1].random_resized_crop.ratio,
                      &rng, &c);
        double *ref = pil_resize(px, w, c.x, c.y, c.width, c.height, out, out);
        diff_ref(got, ref, (size_t)out * out * 3, &acc->max, &acc->sum);
        acc->n += (size_t)out * out * 3;
        free(ref);
        free(got);
    }
    transform_pipeline_free(p);
    /* torchvision's Resize(s): the shorter side s, the longer int(s * long / short); then
     * CenterCrop at int(round((side - out) / 2)). */
    int s = out + out / 4;
    int rw = w <= h ? s : (int)((double)s * w / h), rh = w <= h ? (int)((double)s * h / w) : s;
    struct transform_spec l2[] = {l1[0], resize_short(s), crop(out, out),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(l2 + skip, 4 - skip, NULL);
    uint8_t *got = apply(p, b, 3, 0, 0, &scratch);
    acc->reduced += scratch.scale_denom > 1;
    double *ref = pil_resize(px, w, 0, 0, w, h, rw, rh);
    int top = (int)rint((rh - out) / 2.0), left = (int)rint((rw - out) / 2.0);
    for (int y = 0; y < out; y++)
        diff_ref(got + (size_t)y * out * 3, ref + ((size_t)(y + top) * rw + left) * 3,
                 (size_t)out * 3, &acc->max, &acc->sum);
    acc->n += (size_t)out * out * 3;
    free(ref);
    free(got);
    transform_pipeline_free(p);
    image_buf_close(&scratch);
}

/* JPEG through the default pipeline gives PIL's pixels: within 1 level of torchvision's
 * RandomResizedCrop and Resize + CenterCrop on photograph-like and synthetic pictures
 * (before, the default reduced-scale decode was off by up to 20-70 levels at edges).
 * decode.dct_scaling trades that for speed, within the bounds README states. */
static void test_jpeg_matches_pil(void **state)
{
    (void)state;
    struct {
        int w, h, kind, samp, quality;          /* kind < 0: photograph-like, seed -kind */
    } pics[] = {
        {640, 480, -1, TJSAMP_420, 90}, {480, 640, -2, TJSAMP_444, 75},
        {1024, 768, -3, TJSAMP_420, 95}, {512, 384, 0, TJSAMP_420, 90},
        {512, 384, 1, TJSAMP_420, 90}, {512, 384, 2, TJSAMP_444, 90},
    };
    struct transform_spec accurate = S(TRANSFORM_DECODE), scaled = S(TRANSFORM_DECODE);
    scaled.decode.dct_scaling = true;
    for (size_t k = 0; k < sizeof pics / sizeof pics[0]; k++) {
        int w = pics[k].w, h = pics[k].h;
        uint8_t *src = pics[k].kind < 0 ? photo_rgb(w, h, (uint32_t)-pics[k].kind)
                                        : synthetic_rgb(w, h, pics[k].kind);
        struct blob b = jpeg_encode(src, w, h, TJPF_RGB, pics[k].samp, pics[k].quality, 0);
        /* The full-size decode: libjpeg-turbo's accurate DCT and fancy upsampling, the
         * same library and settings as PIL's JpegDecode, so the same bytes. */
        struct image_buf full;
        image_buf_init(&full);
        char err[LD_ERRMSG_MAX];
        assert_int_equal(image_decode(b.data, b.len, NULL, &full, err), 0);
        assert_int_equal(full.scale_denom, 1);
        struct accuracy a = {0}, d = {0};
        accuracy_run(&b, full.data, w, h, NULL, 64, &a);
        accuracy_run(&b, full.data, w, h, &accurate, 64, &a);
        double mean = a.sum / (double)a.n;
        if (a.max > 1 || mean > 0.3 || a.reduced)
            fail_msg("picture %zu: default pipeline vs PIL: max %d, mean %.3f, %d reduced decodes",
                     k, a.max, mean, a.reduced);
        accuracy_run(&b, full.data, w, h, &scaled, 64, &d);
        double dmean = d.sum / (double)d.n;
        print_message("picture %zu (%dx%d): default max %d mean %.3f; dct_scaling max %d mean "
                      "%.3f (%d of 11 reduced)\n", k, w, h, a.max, mean, d.max, dmean, d.reduced);
        assert_true(d.reduced > 0);
        if (d.max > 40 || dmean > 2.5)
            fail_msg("picture %zu: dct_scaling vs PIL: max %d, mean %.3f", k, d.max, dmean);
        image_buf_close(&full);
        blob_free(&b);
        free(src);
    }
}

/* ---- bad samples and limits ---------------------------------------------------------------- */

static void apply_fails(const transform_pipeline *p, const uint8_t *data, size_t len,
                        const char *needle)
{
    struct image_buf scratch;
    image_buf_init(&scratch);
    void *dst = malloc(transform_pipeline_output(p)->sample_bytes);
    char err[LD_ERRMSG_MAX] = "";
    int r = transform_apply(p, data, len, 1, 0, 0, dst, &scratch, err);
    if (r != LD_ESAMPLE || !strstr(err, needle))
        fail_msg("expected LD_ESAMPLE with '%s', got %d: '%s'", needle, r, err);
    free(dst);
    image_buf_close(&scratch);
}

static void test_bad_samples(void **state)
{
    (void)state;
    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    struct transform_spec l[3] = {rrc(16, 16)};
    transform_pipeline *p = pipeline(l, 1, NULL);
    apply_fails(p, b.data, b.len - 200, "truncated JPEG");
    apply_fails(p, (const uint8_t *)"GIF89a....", 10, "unsupported image format GIF");
    apply_fails(p, b.data, 0, "empty file");
    transform_pipeline_free(p);

    /* Pixel limit: 64x48 over 1000 pixels decodes at 1/2 (768 pixels)... */
    l[0] = S(TRANSFORM_DECODE);
    l[0].decode.max_pixels = 1000;
    l[1] = resize_exact(6, 8);
    p = pipeline(l, 2, NULL);
    struct image_buf scratch;
    image_buf_init(&scratch);
    free(apply(p, &b, 1, 0, 0, &scratch));
    assert_int_equal(scratch.scale_denom, 2);
    image_buf_close(&scratch);
    transform_pipeline_free(p);
    /* ...which a crop that comes first cannot use. */
    l[1] = crop(6, 8);
    p = pipeline(l, 2, NULL);
    apply_fails(p, b.data, b.len, "image too large: 64x48 pixels, over the limit of 1000, and the "
                                  "pipeline's first transform needs it at full size");
    transform_pipeline_free(p);
    /* A PNG over the limit is refused. */
    struct blob png = png_encode_rgb(px, w, h);
    l[1] = resize_exact(6, 8);
    p = pipeline(l, 2, NULL);
    apply_fails(p, png.data, png.len, "image too large: 64x48 pixels, over the limit of 1000");
    transform_pipeline_free(p);
    blob_free(&png);
    /* The output itself must fit under the limit. */
    l[1] = crop(100, 100);
    pipeline_fails(l, 2, "the output 100x100 is over the pixel limit of 1000");

    /* A 1-pixel strip resized to 16384 on its shorter side would be absurdly long. */
    uint8_t strip[2000 * 3];
    memset(strip, 9, sizeof strip);
    png = png_encode_rgb(strip, 2000, 1);
    l[0] = resize_short(16384);
    l[1] = crop(8, 8);
    p = pipeline(l, 2, NULL);
    apply_fails(p, png.data, png.len, "a 2000x1 image resized to 16384 on its shorter side would be");
    transform_pipeline_free(p);
    /* A moderate one is fine: only the crop is computed. */
    l[0] = resize_short(100);
    p = pipeline(l, 2, NULL);
    uint8_t *out = apply1(p, &png, 0);
    for (int i = 0; i < 8 * 8 * 3; i++)
        assert_int_equal(out[i], 9);
    free(out);
    transform_pipeline_free(p);
    blob_free(&png);
    blob_free(&b);
    free(px);
}

/* ---- plug-ins ------------------------------------------------------------------------------- */

static char exe_dir[PATH_MAX];

static void plugin_path(char *out, size_t n, const char *name, bool fixture)
{
    const char *env = getenv("LD_PLUGIN_DIR");
    if (!fixture && env && *env)
        snprintf(out, n, "%s/%s", env, name);
    else if (fixture)
        snprintf(out, n, "%s/plugins/%s", exe_dir, name);
    else
        snprintf(out, n, "%s/../lib/%s", exe_dir, name);
}

static int find_exe_dir(void **state)
{
    (void)state;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    snprintf(exe_dir, sizeof exe_dir, "%s", dirname(exe));
    return 0;
}

static struct transform_spec plugin(const char *path, const char *params)
{
    struct transform_spec s = S(TRANSFORM_PLUGIN);
    s.plugin.path = path;
    s.plugin.params_json = params;
    return s;
}

static void test_plugin_invert(void **state)
{
    (void)state;
    char path[PATH_MAX + 64];
    plugin_path(path, sizeof path, "ld-plugin-invert.so", false);
    int w = 6, h = 4;
    uint8_t *px = coords_rgb(w, h);
    uint8_t *m = mirror(px, w, h);
    struct blob b = png_encode_rgb(px, w, h);

    /* The params string is copied: the caller's buffer may go away. */
    char *params = strdup("{\"p\": 1}");
    struct transform_spec l[4] = {plugin(path, params), crop(4, 6),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    transform_pipeline *p = pipeline(l, 3, NULL);
    free(params);
    uint8_t *out = apply1(p, &b, 0);
    for (int i = 0; i < w * h * 3; i++)
        assert_int_equal(out[i], 255 - px[i]);
    free(out);
    transform_pipeline_free(p);

    /* After a flip the plug-in sees the flipped image; after a crop, the crop. */
    l[0] = flip(1.0);
    l[1] = crop(2, 3);
    l[2] = plugin(path, NULL);
    l[3] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 4, NULL);
    out = apply1(p, &b, 0);
    /* Crop 3x2 of the flipped image at (round(1.5) = 2, 1). */
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 3; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(out[(y * 3 + x) * 3 + c], 255 - pix(m, w, 2 + x, 1 + y)[c]);
    free(out);
    transform_pipeline_free(p);

    /* Between a resize (computed only where the crop reads it) and the output. */
    struct transform_spec lr[] = {resize_exact(20, 30), crop(10, 10), plugin(path, NULL),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    struct transform_spec ln[] = {resize_exact(20, 30), crop(10, 10),
                                  to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)};
    p = pipeline(lr, 4, NULL);
    transform_pipeline *pn = pipeline(ln, 3, NULL);
    out = apply1(p, &b, 0);
    uint8_t *plain = apply1(pn, &b, 0);
    for (int i = 0; i < 10 * 10 * 3; i++)
        assert_int_equal(out[i], 255 - plain[i]);
    free(out);
    free(plain);
    transform_pipeline_free(p);
    transform_pipeline_free(pn);

    /* Noise from the sample's PRNG: reproducible per sample, different across samples. */
    l[0] = plugin(path, "{\"p\": 0, \"noise\": 20}");
    l[1] = crop(4, 6);
    l[2] = to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC);
    p = pipeline(l, 3, NULL);
    uint8_t *a = apply1(p, &b, 5), *a2 = apply1(p, &b, 5), *o = apply1(p, &b, 6);
    assert_memory_equal(a, a2, (size_t)w * h * 3);
    assert_memory_not_equal(a, o, (size_t)w * h * 3);
    int changed = 0;
    for (int i = 0; i < w * h * 3; i++) {
        assert_true(abs(a[i] - px[i]) <= 20);
        changed += a[i] != px[i];
    }
    assert_true(changed > w * h);
    free(a);
    free(a2);
    free(o);
    transform_pipeline_free(p);

    /* The plug-in checks its own parameters. */
    l[0] = plugin(path, "{\"p\": 2}");
    pipeline_fails(l, 3, "transforms[0] (plugin): plug-in 'invert' (");
    pipeline_fails(l, 3, "refused its parameters: p = 2 must be in [0, 1]");
    blob_free(&b);
    free(m);
    free(px);
}

static void test_plugin_errors(void **state)
{
    (void)state;
    char path[PATH_MAX + 64];
    struct transform_spec l[2] = {plugin(NULL, NULL), crop(2, 2)};

    pipeline_fails(l, 2, "transforms[0] (plugin): path is required");
    l[0] = plugin("ld-plugin-invert.so", NULL);
    pipeline_fails(l, 2, "transforms[0] (plugin): path 'ld-plugin-invert.so' must contain a '/'");
    plugin_path(path, sizeof path, "no-such-plugin.so", true);
    l[0] = plugin(path, NULL);
    pipeline_fails(l, 2, "transforms[0] (plugin): cannot load '");
    pipeline_fails(l, 2, "No such file or directory");
    plugin_path(path, sizeof path, "fixture-nosym.so", true);
    l[0] = plugin(path, NULL);
    pipeline_fails(l, 2, "is not a loaderd transform plug-in: it has no symbol ld_transform_plugin_v1");
    plugin_path(path, sizeof path, "fixture-badabi.so", true);
    l[0] = plugin(path, NULL);
    pipeline_fails(l, 2, "declares plug-in ABI version 99; this loaderd supports 1");
    plugin_path(path, sizeof path, "fixture-v2only.so", true);
    l[0] = plugin(path, NULL);
    pipeline_fails(l, 2, "was built for plug-in ABI v2 (it exports ld_transform_plugin_v2); this "
                         "loaderd supports v1");
    plugin_path(path, sizeof path, "fixture-failinit.so", true);
    l[0] = plugin(path, "{\"x\":1}");
    pipeline_fails(l, 2, "plug-in 'fixture' (");
    pipeline_fails(l, 2, "refused its parameters: fixture refuses {\"x\":1}");
    /* Not a shared object at all. */
    l[0] = plugin("/proc/self/status", NULL);
    pipeline_fails(l, 2, "cannot load '/proc/self/status'");

    /* A plug-in that fails a sample makes it a bad sample, named by the plug-in. */
    plugin_path(path, sizeof path, "fixture-failapply.so", true);
    l[0] = crop(2, 2);
    l[1] = plugin(path, NULL);
    transform_pipeline *p = pipeline(l, 2, NULL);
    uint8_t px[4 * 3] = {0};
    struct blob b = png_encode_rgb(px, 2, 2);
    apply_fails(p, b.data, b.len, "transforms[1] (plug-in fixture): fixture fails");
    transform_pipeline_free(p);
    blob_free(&b);
}

/* ---- the benchmark's floor -------------------------------------------------------------------- */

/* The cropped decode (image.c decodes only the rows and iMCU columns of the first
 * stage's region) changes no output byte: each list gives the same samples as with a
 * strict decode, which always decodes the whole image; the scale and the flip are the
 * same too. Crops on the image's edges included (center_crop of the full height). */
static void test_region_decode(void **state)
{
    (void)state;
    int w = 237, h = 181;
    uint8_t *px = picture_rgb(w, h);
    struct transform_spec strict = S(TRANSFORM_DECODE);
    strict.decode.strict = true;
    struct transform_spec lists[][4] = {
        {rrc(32, 32), flip(0.5), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_CHW)},
        {rrc(100, 90), to_dtype(LD_DTYPE_FLOAT32, TRANSFORM_LAYOUT_HWC)},
        {crop(60, 70), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)},
        {crop(181, 50), resize_exact(20, 20), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)},
        {flip(1.0), crop(41, 200), resize_exact(10, 30), to_dtype(LD_DTYPE_UINT8, TRANSFORM_LAYOUT_HWC)},
    };
    size_t lens[] = {3, 2, 2, 3, 4};
    for (int samp = 0; samp < 2; samp++) {
        struct blob b = jpeg_encode(px, w, h, TJPF_RGB, samp ? TJSAMP_444 : TJSAMP_420, 90, 0);
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            struct transform_spec lf[5] = {strict};
            memcpy(lf + 1, lists[k], lens[k] * sizeof lists[k][0]);
            transform_pipeline *p = pipeline(lists[k], lens[k], NULL);
            transform_pipeline *pf = pipeline(lf, lens[k] + 1, NULL);
            size_t bytes = transform_pipeline_output(p)->sample_bytes;
            struct image_buf sa, sb;
            image_buf_init(&sa);
            image_buf_init(&sb);
            int cropped = 0;
            for (uint64_t i = 0; i < 12; i++) {
                uint8_t *a = apply(p, &b, 3, 1, i, &sa);
                uint8_t *f = apply(pf, &b, 3, 1, i, &sb);
                assert_int_equal(sa.scale_denom, sb.scale_denom);
                assert_int_equal(sb.width * sb.scale_denom >= w, true);
                cropped += sa.width < sb.width || sa.height < sb.height;
                if (memcmp(a, f, bytes) != 0)
                    fail_msg("list %zu, sample %" PRIu64 ": the region decode changed the output", k, i);
                free(a);
                free(f);
            }
            /* Every list here reads less than the whole image. */
            if (cropped == 0)
                fail_msg("list %zu never took the cropped decode", k);
            image_buf_close(&sa);
            image_buf_close(&sb);
            transform_pipeline_free(p);
            transform_pipeline_free(pf);
        }
        blob_free(&b);
    }
    free(px);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_validation),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_schemas),
        cmocka_unit_test(test_center_crop),
        cmocka_unit_test(test_flip),
        cmocka_unit_test(test_resize_reference),
        cmocka_unit_test(test_resample_rect),
        cmocka_unit_test(test_resample_kernels),
        cmocka_unit_test(test_chw_planes),
        cmocka_unit_test(test_random_resized_crop_reference),
        cmocka_unit_test(test_rrc_params),
        cmocka_unit_test(test_prng),
        cmocka_unit_test(test_half),
        cmocka_unit_test(test_normalize_and_dtypes),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_scaled_decode),
        cmocka_unit_test(test_jpeg_matches_pil),
        cmocka_unit_test(test_bad_samples),
        cmocka_unit_test(test_plugin_invert),
        cmocka_unit_test(test_plugin_errors),
        cmocka_unit_test(test_region_decode),
    };
    return cmocka_run_group_tests(tests, find_exe_dir, NULL);
}
