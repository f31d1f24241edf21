/* transform_emit — runs one sample's plan (transform_plan.c) and writes the result
 * into its row of the batch slot: the per-sample hot path of an image pipeline.
 *
 * transform_apply probes the header, plans, decodes at the scale and region the plan
 * allows (image.h), then executes the stages: each computes only what the next one
 * reads (a resize followed by a center crop resamples just the crop), and the last one
 * streams its rows into the emitter, which applies the flip, normalize, dtype and
 * layout while writing into the slot. No full-size intermediate copy is ever made.
 * Buffers come from the worker's struct image_buf: the decoded image, then two image
 * slots used alternately by the stages. Workers call this concurrently on a shared,
 * read-only pipeline. */
#include "transform_internal.h"

#include <math.h>
#include <string.h>

#include "ld_error.h"
#include "proto.h"
#include "resample.h"

/* ---- writing the sample ------------------------------------------------------------ */

struct emitter {
    const transform_pipeline *p;
    uint8_t *dst;
    int w, h;
    bool flip;
};

/* Writes one output row: pixel x comes from pixel x of `row`, or w - 1 - x when
 * flipping; values through the dtype's table (uint8 as is); HWC or one row of each
 * CHW plane. */
/* The flip test is hoisted out of the pixel loop and the planes are restrict, so the
 * compiler can vectorise each variant (this loop is a tenth of a sample's time). */
#define EMIT_PIXELS(T, value, src_x)                                                    \
    do {                                                                                \
        if (chw) {                                                                      \
            T *restrict r = d + (size_t)y * w, *restrict g = r + plane, *restrict b = g + plane; \
            for (int x = 0; x < w; x++) {                                               \
                const uint8_t *s = src + (size_t)(src_x) * 3;                           \
                r[x] = value(0, s[0]);                                                  \
                g[x] = value(1, s[1]);                                                  \
                b[x] = value(2, s[2]);                                                  \
            }                                                                           \
        } else {                                                                        \
            T *restrict o = d + (size_t)y * w * 3;                                      \
            for (int x = 0; x < w; x++) {                                               \
                const uint8_t *s = src + (size_t)(src_x) * 3;                           \
                o[3 * x] = value(0, s[0]);                                              \
                o[3 * x + 1] = value(1, s[1]);                                          \
                o[3 * x + 2] = value(2, s[2]);                                          \
            }                                                                           \
        }                                                                               \
    } while (0)
#define EMIT_LOOP(T, value)                                                             \
    do {                                                                                \
        T *d = (T *)(void *)e->dst;                                                     \
        const uint8_t *restrict src = row;                                              \
        if (e->flip)                                                                    \
            EMIT_PIXELS(T, value, w - 1 - x);                                           \
        else                                                                            \
            EMIT_PIXELS(T, value, x);                                                   \
    } while (0)
#define VALUE_U8(c, v) (v)
#define VALUE_F32(c, v) (p->lut32[c][v])
#define VALUE_F16(c, v) (p->lut16[c][v])

#if defined(__GNUC__) && defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_SPLIT_SSSE3 1
#include <tmmintrin.h>

/* uint8 CHW without a flip, the usual training layout: sixteen pixels (48 bytes) at a
 * time split into the three planes with nine pshufb, the rest one by one (and with
 * AVX2, below, thirty-two first). */
__attribute__((target("ssse3"))) static void split_planes_ssse3(const uint8_t *restrict src, int w,
                                                                uint8_t *restrict r,
                                                                uint8_t *restrict g,
                                                                uint8_t *restrict b)
{
    const __m128i m[3][3] = {
        {_mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)},
        {_mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)},
        {_mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1),
         _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15)},
    };
    int x = 0;
    for (; x + 16 <= w; x += 16) {
        const __m128i *s = (const __m128i *)(const void *)(src + 3 * (size_t)x);
        __m128i a = _mm_loadu_si128(s), bb = _mm_loadu_si128(s + 1), c = _mm_loadu_si128(s + 2);
        uint8_t *planes[3] = {r + x, g + x, b + x};
        for (int ch = 0; ch < 3; ch++) {
            __m128i v = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m[ch][0]),
                                                  _mm_shuffle_epi8(bb, m[ch][1])),
                                     _mm_shuffle_epi8(c, m[ch][2]));
            _mm_storeu_si128((__m128i *)(void *)planes[ch], v);
        }
    }
    for (; x < w; x++) {
        r[x] = src[3 * x];
        g[x] = src[3 * x + 1];
        b[x] = src[3 * x + 2];
    }
}

#include <immintrin.h>

/* AVX2: thirty-two pixels at a time, pixels 0-15 in the low 128-bit lanes and 16-31 in
 * the high ones, so that the same in-lane shuffles as above leave each plane's 32 bytes
 * in order; the rest as above. */
__attribute__((target("avx2"))) static void split_planes_avx2(const uint8_t *restrict src, int w,
                                                              uint8_t *restrict r,
                                                              uint8_t *restrict g,
                                                              uint8_t *restrict b)
{
#define SPLIT_MASKS(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)   \
    _mm256_setr_epi8(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,  \
                     a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
    const __m256i m[3][3] = {
        {SPLIT_MASKS(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)},
        {SPLIT_MASKS(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)},
        {SPLIT_MASKS(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1),
         SPLIT_MASKS(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15)},
    };
#undef SPLIT_MASKS
    int x = 0;
    for (; x + 32 <= w; x += 32) {
        const __m128i *s = (const __m128i *)(const void *)(src + 3 * (size_t)x);
        __m256i a = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(s)),
                                            _mm_loadu_si128(s + 3), 1);
        __m256i bb = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(s + 1)),
                                             _mm_loadu_si128(s + 4), 1);
        __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(s + 2)),
                                            _mm_loadu_si128(s + 5), 1);
        uint8_t *planes[3] = {r + x, g + x, b + x};
        for (int ch = 0; ch < 3; ch++) {
            __m256i v = _mm256_or_si256(_mm256_or_si256(_mm256_shuffle_epi8(a, m[ch][0]),
                                                        _mm256_shuffle_epi8(bb, m[ch][1])),
                                        _mm256_shuffle_epi8(c, m[ch][2]));
            _mm256_storeu_si256((__m256i *)(void *)planes[ch], v);
        }
    }
    if (x < w)
        split_planes_ssse3(src + 3 * (size_t)x, w - x, r + x, g + x, b + x);
}
#endif

static void emit_row(void *ctx, int y, const uint8_t *row)
{
    const struct emitter *e = ctx;
    const transform_pipeline *p = e->p;
    int w = e->w;
    size_t plane = (size_t)e->w * (size_t)e->h;
    bool chw = p->out.layout == TRANSFORM_LAYOUT_CHW;
    switch (p->out.dtype) {
    case LD_DTYPE_UINT8:
        if (!chw && !e->flip) {
            memcpy(e->dst + (size_t)y * w * 3, row, (size_t)w * 3);
            break;
        }
#if defined(HAVE_SPLIT_SSSE3)
        if (chw && !e->flip && __builtin_cpu_supports("avx2")) {
            uint8_t *r = e->dst + (size_t)y * w;
            split_planes_avx2(row, w, r, r + plane, r + 2 * plane);
            break;
        }
        if (chw && !e->flip && __builtin_cpu_supports("ssse3")) {
            uint8_t *r = e->dst + (size_t)y * w;
            split_planes_ssse3(row, w, r, r + plane, r + 2 * plane);
            break;
        }
#endif
        EMIT_LOOP(uint8_t, VALUE_U8);
        break;
    case LD_DTYPE_FLOAT32:
        EMIT_LOOP(float, VALUE_F32);
        break;
    case LD_DTYPE_FLOAT16:
        EMIT_LOOP(uint16_t, VALUE_F16);
        break;
    default:
        break;
    }
}

/* ---- executing the plan ------------------------------------------------------------ */

/* The current image: `base` is its pixel (0, 0) in the coordinates the plan uses,
 * `scale` maps those onto the buffer (< 1 only for the decoded image). */
struct cur_image {
    const uint8_t *buf;             /* the buffer's own origin */
    size_t stride;
    int buf_w, buf_h;               /* the buffer's pixels */
    int org_x, org_y;               /* plan coordinates of the buffer's (0, 0) */
    double scale;
    int slot;                       /* IMAGE_AUX_IMG_A/B, or -1 for the decoded image */
};

static bool rect_in_buffer(const struct cur_image *c, const struct transform_rect *r)
{
    int x = r->x - c->org_x, y = r->y - c->org_y;
    return x >= 0 && y >= 0 && r->width > 0 && r->height > 0 && x <= c->buf_w - r->width &&
           y <= c->buf_h - r->height;
}

static const uint8_t *rect_ptr(const struct cur_image *c, const struct transform_rect *r)
{
    return c->buf + (size_t)(r->y - c->org_y) * c->stride + (size_t)(r->x - c->org_x) * 3;
}

static int other_slot(int slot)
{
    return slot == IMAGE_AUX_IMG_A ? IMAGE_AUX_IMG_B : IMAGE_AUX_IMG_A;
}

static void flip_rows(uint8_t *px, size_t stride, int w, int h)
{
    for (int y = 0; y < h; y++) {
        uint8_t *a = px + (size_t)y * stride, *b = a + (size_t)(w - 1) * 3;
        for (; a < b; a += 3, b -= 3)
            for (int c = 0; c < 3; c++) {
                uint8_t t = a[c];
                a[c] = b[c];
                b[c] = t;
            }
    }
}

static int internal_error(char *errbuf, const char *what)
{
    ld_errorf(errbuf, "internal error in the image pipeline: %s", what);
    return LD_EINVAL;
}

/* Runs a resample stage. `next` is the rectangle of its output the next stage reads;
 * when `em` is set the rows go to the emitter (or straight to em->dst when no
 * conversion is needed) instead of a buffer. */
static int run_resample(const struct stage *st, const struct transform_rect *next,
                        struct cur_image *cur, struct image_buf *scratch, struct emitter *em,
                        bool direct, uint64_t max_pixels, char *errbuf)
{
    struct resample_job j = {
        .src = cur->buf, .src_stride = cur->stride, .src_w = cur->buf_w, .src_h = cur->buf_h,
        .out_w = st->out_w, .out_h = st->out_h,
        .rect_x0 = next->x, .rect_y0 = next->y, .rect_w = next->width, .rect_h = next->height,
    };
    double f = cur->scale;
    j.box_x0 = (st->in.x - cur->org_x) * f;
    j.box_y0 = (st->in.y - cur->org_y) * f;
    j.box_w = st->in.width * f;
    j.box_h = st->in.height * f;
    j.clamp_x0 = (int)floor(j.box_x0);
    j.clamp_y0 = (int)floor(j.box_y0);
    j.clamp_x1 = (int)ceil(j.box_x0 + j.box_w);
    j.clamp_y1 = (int)ceil(j.box_y0 + j.box_h);
    if (j.clamp_x1 > cur->buf_w)
        j.clamp_x1 = cur->buf_w;
    if (j.clamp_y1 > cur->buf_h)
        j.clamp_y1 = cur->buf_h;
    if (j.clamp_x0 >= j.clamp_x1)
        j.clamp_x0 = j.clamp_x1 - 1;
    if (j.clamp_y0 >= j.clamp_y1)
        j.clamp_y0 = j.clamp_y1 - 1;
    int r;
    if (em) {
        /* The mirror rides on the horizontal pass: the emitter writes rows as they come. */
        j.flip = em->flip;
        em->flip = false;
        r = resample_run(&j, scratch, direct ? em->dst : NULL, (size_t)next->width * 3,
                         direct ? NULL : emit_row, em);
    } else {
        if ((uint64_t)next->width * (uint64_t)next->height > max_pixels) {
            ld_errorf(errbuf, "an intermediate image of %dx%d pixels is over the limit of %llu",
                      next->width, next->height, (unsigned long long)max_pixels);
            return LD_ESAMPLE;
        }
        int slot = other_slot(cur->slot);
        uint8_t *out;
        size_t stride = (size_t)next->width * 3;
        r = image_buf_reserve(scratch, slot, stride * (size_t)next->height, &out);
        if (r == 0)
            r = resample_run(&j, scratch, out, stride, NULL, NULL);
        if (r == 0)
            *cur = (struct cur_image){.buf = out, .stride = stride, .buf_w = next->width,
                                      .buf_h = next->height, .org_x = next->x,
                                      .org_y = next->y, .scale = 1.0, .slot = slot};
    }
    if (r == LD_ENOMEM)
        ld_errorf(errbuf, "out of memory resizing to %dx%d", next->width, next->height);
    else if (r < 0)
        return internal_error(errbuf, "bad resample");
    return r;
}

static int run_pad(const struct stage *st, struct cur_image *cur, struct image_buf *scratch,
                   uint64_t max_pixels, char *errbuf)
{
    if (cur->scale != 1.0 || !rect_in_buffer(cur, &st->in))
        return internal_error(errbuf, "pad outside the image");
    if ((uint64_t)st->out_w * (uint64_t)st->out_h > max_pixels) {
        ld_errorf(errbuf, "a padded image of %dx%d pixels is over the limit of %llu", st->out_w,
                  st->out_h, (unsigned long long)max_pixels);
        return LD_ESAMPLE;
    }
    int slot = other_slot(cur->slot);
    size_t stride = (size_t)st->out_w * 3;
    uint8_t *out;
    int r = image_buf_reserve(scratch, slot, stride * (size_t)st->out_h, &out);
    if (r < 0) {
        ld_errorf(errbuf, "out of memory padding to %dx%d", st->out_w, st->out_h);
        return r;
    }
    memset(out, 0, stride * (size_t)st->out_h);
    const uint8_t *src = rect_ptr(cur, &st->in);
    for (int y = 0; y < st->in.height; y++)
        memcpy(out + (size_t)(st->pad_y + y) * stride + (size_t)st->pad_x * 3,
               src + (size_t)y * cur->stride, (size_t)st->in.width * 3);
    *cur = (struct cur_image){.buf = out, .stride = stride, .buf_w = st->out_w,
                              .buf_h = st->out_h, .scale = 1.0, .slot = slot};
    return 0;
}

static int run_plugin(const transform_pipeline *p, const struct stage *st, struct cur_image *cur,
                      uint64_t seed, uint64_t epoch, uint64_t index, char *errbuf)
{
    if (cur->scale != 1.0 || !rect_in_buffer(cur, &st->in))
        return internal_error(errbuf, "plug-in region outside the image");
    /* The plan's images are scratch memory of this worker: the plug-in works in place. */
    uint8_t *px = (uint8_t *)(uintptr_t)rect_ptr(cur, &st->in);
    if (st->flip)
        flip_rows(px, cur->stride, st->in.width, st->in.height);
    const struct tstep *s = &p->steps[st->step];
    struct ld_image img = {.data = px, .width = st->in.width, .height = st->in.height,
                           .stride = cur->stride};
    struct ld_prng rng = ld_prng_for(seed, epoch, index, transform_rng_step(p, st->step));
    struct ld_sample_info info = {.seed = seed, .epoch = epoch, .index = index,
                                  .step = (uint32_t)transform_rng_step(p, st->step)};
    char perr[LD_PLUGIN_ERR_MAX] = "";
    if (s->plugin->apply(s->state, &img, &rng, &info, perr) != 0) {
        perr[sizeof perr - 1] = '\0';
        ld_errorf(errbuf, "transforms[%zu] (plug-in %s): %s", st->step,
                  s->plugin->name ? s->plugin->name : "?", perr[0] ? perr : "failed");
        return LD_ESAMPLE;
    }
    *cur = (struct cur_image){.buf = px, .stride = cur->stride, .buf_w = st->in.width,
                              .buf_h = st->in.height, .scale = 1.0, .slot = cur->slot};
    return 0;
}

int transform_apply(const transform_pipeline *p, const uint8_t *data, size_t len, uint64_t seed,
                    uint64_t epoch, uint64_t index, void *dst, struct image_buf *scratch,
                    char *errbuf)
{
    struct image_info info;
    int r = image_probe(data, len, scratch, &info, errbuf);
    if (r < 0)
        return r;
    struct plan pl;
    r = transform_plan_build(p, info.width, info.height, seed, epoch, index, &pl, errbuf);
    if (r < 0)
        return r;
    struct image_decode_opts opts;
    transform_plan_decode_hint(p, &pl, info.width, info.height, &opts);
    /* Only a resample can take a reduced image; anything else reading the decoded image
     * first needs it whole, which the pixel limit may forbid: say so before decoding. */
    bool full_size = pl.n == 0 || pl.st[0].kind != STAGE_RESAMPLE;
    if (full_size && (uint64_t)info.width * (uint64_t)info.height > opts.max_pixels) {
        ld_errorf(errbuf, "image too large: %dx%d pixels, over the limit of %llu, and the "
                  "pipeline's first transform needs it at full size", info.width, info.height,
                  (unsigned long long)opts.max_pixels);
        return LD_ESAMPLE;
    }
    r = image_decode(data, len, &opts, scratch, errbuf);
    if (r < 0)
        return r;
    if (scratch->src_width != info.width || scratch->src_height != info.height)
        return internal_error(errbuf, "the header changed between probe and decode");
    double f = (double)scratch->scale_num / scratch->scale_denom;
    if (f != 1.0 && full_size)
        return internal_error(errbuf, "reduced decode for a full-size plan");
    /* A region decode's buffer starts at (org_x, org_y) of the decoded image: in plan
     * coordinates that is org * denom / num, whole since num is 1. */
    if (scratch->scale_num != 1 && (scratch->org_x || scratch->org_y))
        return internal_error(errbuf, "region decode at a scale other than 1/n");
    struct cur_image cur = {.buf = scratch->data, .stride = (size_t)scratch->width * 3,
                            .buf_w = scratch->width, .buf_h = scratch->height,
                            .org_x = scratch->org_x * scratch->scale_denom,
                            .org_y = scratch->org_y * scratch->scale_denom, .scale = f,
                            .slot = -1};
    struct emitter em = {.p = p, .dst = dst, .w = pl.final.width, .h = pl.final.height,
                         .flip = pl.flip};
    if (pl.final.width != p->out.width || pl.final.height != p->out.height)
        return internal_error(errbuf, "planned output size differs from the pipeline's");
    bool direct = p->out.dtype == LD_DTYPE_UINT8 && p->out.layout == TRANSFORM_LAYOUT_HWC;
    for (int k = 0; k < pl.n; k++) {
        const struct stage *st = &pl.st[k];
        const struct transform_rect *next = k + 1 < pl.n ? &pl.st[k + 1].in : &pl.final;
        switch (st->kind) {
        case STAGE_RESAMPLE:
            /* The last stage streams into the sample; a PAD or plug-in next reads a
             * rectangle of this output too, so it is computed just the same. */
            r = run_resample(st, next, &cur, scratch, k + 1 == pl.n ? &em : NULL, direct,
                             opts.max_pixels, errbuf);
            if (r == 0 && k + 1 == pl.n)
                return 0;
            break;
        case STAGE_PAD:
            r = run_pad(st, &cur, scratch, opts.max_pixels, errbuf);
            break;
        case STAGE_PLUGIN:
            r = run_plugin(p, st, &cur, seed, epoch, index, errbuf);
            break;
        }
        if (r < 0)
            return r;
    }
    /* The last stage was not a resample: write the final rectangle of the current image. */
    if (cur.scale != 1.0 || !rect_in_buffer(&cur, &pl.final))
        return internal_error(errbuf, "final rectangle outside the image");
    const uint8_t *src = rect_ptr(&cur, &pl.final);
    for (int y = 0; y < pl.final.height; y++)
        emit_row(&em, y, src + (size_t)y * cur.stride);
    return 0;
}
