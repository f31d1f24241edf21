/* resample — the resize at the heart of every image pipeline (see resample.h for the
 * filter). It is the most expensive step after the decode, so it is written for cache
 * locality and SIMD: the weights of both axes are computed once per call; each pass
 * reads only the rows and columns the other one needs; when the vertical pass comes
 * first it works one output row at a time into a single scratch row, which the
 * horizontal pass turns into the output row at once. Both passes have an SSE2 path
 * (pmaddwd on 16-bit weights) and a plain C path for other machines, and both an AVX2
 * one, chosen at run time; the horizontal pass, which costs the most per pixel, also
 * an SSSE3 one. It runs four output pixels at a time with the same number of taps for
 * all (in AVX2 two pixels a register, one per 128-bit lane, with their weights laid
 * out side by side in output order). Integer sums are exact, so every kernel gives
 * the same bytes (test_transform compares them).
 * A horizontal flip of the output is the horizontal pass walking its positions
 * backwards: mirroring the rows costs nothing.
 *
 * A pass whose scale is exactly 1 at an integer offset is the identity and is skipped:
 * a crop (or a crop plus a one-axis resize) costs a copy at most. */
#include "resample_internal.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "ld_error.h"

static double triangle(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

static int axis_ksize(double in_w, int out_full)
{
    double scale = in_w / out_full;
    double support = scale > 1.0 ? scale : 1.0;
    return (int)ceil(support) * 2 + 1;
}

/* Zeroed bytes after the vertical pass's scratch row, which the horizontal kernels may
 * read past a window's end. */
#define RESAMPLE_ROW_PAD 64

/* Weights axis_weights keeps between its two loops over a window (longer windows, a
 * shrink by more than 15, compute the rest twice). */
#define AXIS_WEIGHTS_KEPT 32

/* Weights of positions [o0, o0 + n) of an output out_full long that covers source
 * [in0, in0 + in_w), windows clipped to [lo, hi). */
static void axis_weights(struct axis *a, double in0, double in_w, int lo, int hi, int out_full,
                         int o0)
{
    double scale = in_w / out_full;
    double fscale = scale > 1.0 ? scale : 1.0;
    double support = fscale;
    double inv = 1.0 / fscale;
    for (int i = 0; i < a->n; i++) {
        double center = in0 + (o0 + i + 0.5) * scale;
        int xmin = (int)floor(center - support + 0.5);
        int xmax = (int)floor(center + support + 0.5);
        if (xmin < lo)
            xmin = lo;
        if (xmax > hi)
            xmax = hi;
        int cnt = xmax - xmin;
        if (cnt > a->ksize)
            cnt = a->ksize;
        /* Each weight once (most windows are short), the same sums either way. */
        double wk[AXIS_WEIGHTS_KEPT];
        double sum = 0.0;
        for (int k = 0; k < cnt; k++) {
            double t = triangle((xmin + k - center + 0.5) * inv);
            if (k < AXIS_WEIGHTS_KEPT)
                wk[k] = t;
            sum += t;
        }
        int32_t *c = a->coef + (size_t)i * a->ksize;
        if (cnt <= 0 || sum <= 0.0) {
            /* The window fell outside the clamp (a box beyond the image): the nearest
             * pixel inside. */
            int x = (int)floor(center);
            xmin = x < lo ? lo : x >= hi ? hi - 1 : x;
            cnt = 1;
            c[0] = 1 << RESAMPLE_PRECISION_BITS;
        } else {
            for (int k = 0; k < cnt; k++) {
                double t = k < AXIS_WEIGHTS_KEPT ? wk[k] : triangle((xmin + k - center + 0.5) * inv);
                c[k] = (int32_t)floor(t / sum * (double)(1 << RESAMPLE_PRECISION_BITS) + 0.5);
            }
        }
        a->bounds[2 * i] = xmin;
        a->bounds[2 * i + 1] = cnt;
    }
}

static bool axis_is_identity(double in0, double in_w, int lo, int hi, int out_full, int o0, int n)
{
    return in_w == (double)out_full && in0 == floor(in0) && in0 + o0 >= lo &&
           in0 + o0 + n <= hi;
}

static void axis_pairs(struct axis *a)
{
    a->npu = 1;
    for (int i = 0; i < a->n; i++) {
        const int32_t *c = a->coef + (size_t)i * a->ksize;
        int cnt = a->bounds[2 * i + 1];
        if ((cnt + 1) / 2 > a->npu)
            a->npu = (cnt + 1) / 2;
        int16_t *p = a->pairs + (size_t)i * a->npair * 8;
        for (int k = 0; k < 2 * a->npair; k += 2, p += 8) {
            int16_t c0 = (int16_t)(k < cnt ? c[k] : 0), c1 = (int16_t)(k + 1 < cnt ? c[k + 1] : 0);
            int16_t g[8] = {c0, c1, c0, c1, c0, c1, 0, 0};
            memcpy(p, g, sizeof g);
        }
    }
}

/* The AVX2 layout of the weights and offsets: outputs 2g and 2g + 1 share a register,
 * one per 128-bit lane, so each step loads the pair of both as one 32-byte row; the
 * vector loop runs over whole groups of four outputs whose windows are safe to read
 * padded (positions below safe_end: the first outputs, or with a flip the last). */
static void axis_pairs2(struct axis *a, bool flip)
{
    for (int g = 0; g < a->n / 2; g++) {
        int16_t *d = a->pairs2 + (size_t)g * a->npu * 16;
        for (int h = 0; h < 2; h++) {
            int o = 2 * g + h, p = flip ? a->n - 1 - o : o;
            const int16_t *src = a->pairs + (size_t)p * a->npair * 8;
            for (int k = 0; k < a->npu; k++)
                memcpy(d + (size_t)k * 16 + h * 8, src + (size_t)k * 8, 8 * sizeof(int16_t));
        }
    }
    for (int i = 0; i < a->n; i++)
        a->off2[i] = a->off[flip ? a->n - 1 - i : i];
    if (flip) {
        a->v0 = a->n - a->safe_end + (a->n - a->safe_end) % 2;
        if (a->v0 > a->n)
            a->v0 = a->n;
        a->v1 = a->v0 + (a->n - a->v0) / 4 * 4;
    } else {
        a->v0 = 0;
        a->v1 = a->safe_end / 4 * 4;
    }
}

/* A row mirrored: for a flip when the horizontal pass is the identity. */
static void copy_mirrored(uint8_t *restrict out, const uint8_t *restrict in, int n)
{
    for (int i = 0; i < n; i++)
        memcpy(out + 3 * (size_t)i, in + 3 * (size_t)(n - 1 - i), 3);
}

static void mirror_in_place(uint8_t *px, int n)
{
    for (int i = 0, k = n - 1; i < k; i++, k--) {
        uint8_t t[3];
        memcpy(t, px + 3 * (size_t)i, 3);
        memcpy(px + 3 * (size_t)i, px + 3 * (size_t)k, 3);
        memcpy(px + 3 * (size_t)k, t, 3);
    }
}

static bool job_valid(const struct resample_job *j)
{
    return j->src && j->src_w > 0 && j->src_h > 0 && j->src_stride >= (size_t)j->src_w * 3 &&
           j->box_w > 0 && j->box_h > 0 && isfinite(j->box_x0) && isfinite(j->box_y0) &&
           isfinite(j->box_w) && isfinite(j->box_h) && j->box_w <= 1e9 && j->box_h <= 1e9 &&
           j->clamp_x0 >= 0 && j->clamp_y0 >= 0 && j->clamp_x1 <= j->src_w &&
           j->clamp_y1 <= j->src_h && j->clamp_x0 < j->clamp_x1 && j->clamp_y0 < j->clamp_y1 &&
           j->out_w > 0 && j->out_h > 0 && j->rect_x0 >= 0 && j->rect_y0 >= 0 &&
           j->rect_w > 0 && j->rect_h > 0 && j->rect_x0 <= j->out_w - j->rect_w &&
           j->rect_y0 <= j->out_h - j->rect_h;
}

int resample_run(const struct resample_job *j, struct image_buf *scratch, uint8_t *dst,
                 size_t dst_stride, resample_emit_fn emit, void *ctx)
{
    if (!job_valid(j) || (!dst && !emit))
        return LD_EINVAL;
    struct axis ax = {.n = j->rect_w}, ay = {.n = j->rect_h};
    ax.identity = axis_is_identity(j->box_x0, j->box_w, j->clamp_x0, j->clamp_x1, j->out_w,
                                   j->rect_x0, j->rect_w);
    ay.identity = axis_is_identity(j->box_y0, j->box_h, j->clamp_y0, j->clamp_y1, j->out_h,
                                   j->rect_y0, j->rect_h);
    /* Window sizes cannot exceed the clamp's extent plus one. */
    ax.ksize = ax.identity ? 1 : axis_ksize(j->box_w, j->out_w);
    ay.ksize = ay.identity ? 1 : axis_ksize(j->box_h, j->out_h);
    if (ax.ksize > j->clamp_x1 - j->clamp_x0 + 2)
        ax.ksize = j->clamp_x1 - j->clamp_x0 + 2;
    if (ay.ksize > j->clamp_y1 - j->clamp_y0 + 2)
        ay.ksize = j->clamp_y1 - j->clamp_y0 + 2;

    /* Weights and bounds of both axes in one scratch block. */
    size_t nx = (size_t)ax.n, ny = (size_t)ay.n;
    ax.npair = (ax.ksize + 1) / 2;
    size_t pair_bytes = nx * (size_t)ax.npair * 8 * sizeof(int16_t);   /* first: 16-aligned */
    enum resample_simd level = resample_simd_level();
    bool use_pairs2 = level >= RESAMPLE_SIMD_AVX2 && !ax.identity;
    size_t pair2_bytes = use_pairs2 ? nx / 2 * (size_t)ax.npair * 16 * sizeof(int16_t) : 0;
    size_t off2_bytes = use_pairs2 ? nx * sizeof(int) : 0;
    pair_bytes += pair2_bytes;
    size_t coef_bytes = pair_bytes + (nx * ax.ksize + ny * ay.ksize) * sizeof(int32_t) +
                        (nx + ny) * 2 * sizeof(int) + nx * sizeof(int) + off2_bytes;
    uint8_t *mem;
    int r = image_buf_reserve(scratch, IMAGE_AUX_COEF, coef_bytes, &mem);
    if (r < 0)
        return r;
    ax.pairs = (int16_t *)(void *)mem;
    ax.pairs2 = use_pairs2 ? (int16_t *)(void *)(mem + pair_bytes - pair2_bytes) : NULL;
    ax.coef = (int32_t *)(void *)(mem + pair_bytes);
    ay.coef = ax.coef + nx * ax.ksize;
    ax.bounds = (int *)(ay.coef + ny * ay.ksize);
    ay.bounds = ax.bounds + 2 * nx;
    ax.off = ay.bounds + 2 * ny;
    ax.off2 = use_pairs2 ? ax.off + nx : NULL;
    if (ax.identity) {
        ax.offset = (int)j->box_x0 + j->rect_x0;
    } else {
        axis_weights(&ax, j->box_x0, j->box_w, j->clamp_x0, j->clamp_x1, j->out_w, j->rect_x0);
        axis_pairs(&ax);
    }
    if (ay.identity) {
        ay.offset = (int)j->box_y0 + j->rect_y0;
        for (int i = 0; i < ay.n; i++) {
            ay.bounds[2 * i] = ay.offset + i;
            ay.bounds[2 * i + 1] = 1;
            ay.coef[i] = 1 << RESAMPLE_PRECISION_BITS;
        }
    } else {
        axis_weights(&ay, j->box_y0, j->box_h, j->clamp_y0, j->clamp_y1, j->out_h, j->rect_y0);
    }

    /* The source rows and columns the windows read. */
    int y_lo = ay.bounds[0], y_hi = ay.bounds[0] + ay.bounds[1];
    for (int i = 1; i < ay.n; i++) {
        if (ay.bounds[2 * i] < y_lo)
            y_lo = ay.bounds[2 * i];
        if (ay.bounds[2 * i] + ay.bounds[2 * i + 1] > y_hi)
            y_hi = ay.bounds[2 * i] + ay.bounds[2 * i + 1];
    }
    int x_lo = ax.identity ? ax.offset : ax.bounds[0];
    int x_hi = ax.identity ? ax.offset + ax.n : ax.bounds[0] + ax.bounds[1];
    for (int i = 1; !ax.identity && i < ax.n; i++) {
        if (ax.bounds[2 * i] < x_lo)
            x_lo = ax.bounds[2 * i];
        if (ax.bounds[2 * i] + ax.bounds[2 * i + 1] > x_hi)
            x_hi = ax.bounds[2 * i] + ax.bounds[2 * i + 1];
    }
    size_t row_len = nx * 3, src_cols = (size_t)(x_hi - x_lo);
    bool flip = j->flip;

    /* Which pass first: per tap and byte the horizontal pass costs several times the
     * vertical one (which runs sixteen bytes at a time), so it goes where it has fewer
     * rows. The choice depends on the geometry only: the same on every thread. */
    double taps_x = ax.identity ? 0.0 : (double)axis_ksize(j->box_w, j->out_w);
    double taps_y = ay.identity ? 0.0 : (double)axis_ksize(j->box_h, j->out_h);
    double cost_h_first = 4.0 * (y_hi - y_lo) * (double)nx * taps_x + (double)ny * nx * taps_y;
    double cost_v_first = (double)ny * (double)src_cols * taps_y + 4.0 * (double)ny * nx * taps_x;
    bool v_first = cost_v_first < cost_h_first;

    /* The pixels the horizontal pass may read from a window's row start: the vector
     * kernels read a little past a window (with zero weights). A source row goes on to
     * the image's right edge; the vertical pass's scratch row is followed by
     * RESAMPLE_ROW_PAD zeroed bytes. */
    int row_px = v_first ? (int)src_cols + RESAMPLE_ROW_PAD / 3 : j->src_w - x_lo;
    if (!ax.identity) {
        ax.safe_end = 0;
        while (ax.safe_end < ax.n && ax.bounds[2 * ax.safe_end] - x_lo + 2 * ax.npu < row_px)
            ax.safe_end++;
        for (int i = 0; i < ax.n; i++)
            ax.off[i] = (ax.bounds[2 * i] - x_lo) * 3;
        if (ax.pairs2)
            axis_pairs2(&ax, j->flip);
    }

    uint8_t *rowbuf;
    size_t row_room = (row_len + 63) & ~(size_t)63;
    size_t mid_len = v_first ? src_cols * 3 : 0;
    r = image_buf_reserve(scratch, IMAGE_AUX_ROW, row_room + mid_len + RESAMPLE_ROW_PAD, &rowbuf);
    if (r < 0)
        return r;
    uint8_t *mid = rowbuf + row_room;
    if (v_first)
        memset(mid + mid_len, 0, RESAMPLE_ROW_PAD);

    if (v_first) {
        /* Per output row: the vertical pass over the columns the horizontal windows
         * read, into one scratch row, then the horizontal pass into the output. */
        for (int i = 0; i < ay.n; i++) {
            const uint8_t *col0 = j->src + (size_t)ay.bounds[2 * i] * j->src_stride +
                                  (size_t)x_lo * 3;
            const uint8_t *vrow = col0;
            if (!ay.identity) {
                resample_vpass_row(col0, j->src_stride, ay.bounds[2 * i + 1],
                          ay.coef + (size_t)i * ay.ksize, mid, src_cols * 3, level);
                vrow = mid;
            }
            uint8_t *out = dst ? dst + (size_t)i * dst_stride : rowbuf;
            if (ax.identity && flip) {
                copy_mirrored(out, vrow, ax.n);
            } else if (ax.identity) {
                if (!dst) {
                    emit(ctx, i, vrow);
                    continue;
                }
                memcpy(out, vrow, row_len);
            } else {
                resample_hpass_row(vrow, row_px, x_lo, &ax, flip, level, out);
            }
            if (emit)
                emit(ctx, i, out);
        }
        return 0;
    }

    /* Horizontal pass over the rows the vertical windows read (or a view of the source
     * when it is the identity), then the vertical pass row by row. */
    const uint8_t *tmp;
    size_t tmp_stride;
    if (ax.identity) {
        tmp = j->src + (size_t)y_lo * j->src_stride + (size_t)ax.offset * 3;
        tmp_stride = j->src_stride;
    } else {
        uint8_t *t;
        r = image_buf_reserve(scratch, IMAGE_AUX_TMP, row_len * (size_t)(y_hi - y_lo), &t);
        if (r < 0)
            return r;
        for (int y = y_lo; y < y_hi; y++)
            resample_hpass_row(j->src + (size_t)y * j->src_stride + (size_t)x_lo * 3, row_px, x_lo, &ax,
                      flip, level, t + (size_t)(y - y_lo) * row_len);
        tmp = t;
        tmp_stride = row_len;
    }
    for (int i = 0; i < ay.n; i++) {
        const uint8_t *s = tmp + (size_t)(ay.bounds[2 * i] - y_lo) * tmp_stride;
        uint8_t *out = dst ? dst + (size_t)i * dst_stride : rowbuf;
        if (ay.identity && ax.identity && flip) {
            copy_mirrored(out, s, ax.n);
        } else if (ay.identity) {
            if (!dst) {
                emit(ctx, i, s);
                continue;
            }
            memcpy(out, s, row_len);
        } else {
            resample_vpass_row(s, tmp_stride, ay.bounds[2 * i + 1], ay.coef + (size_t)i * ay.ksize, out,
                      row_len, level);
            /* The horizontal pass mirrored its rows already, unless it was skipped. */
            if (ax.identity && flip)
                mirror_in_place(out, ax.n);
        }
        if (emit)
            emit(ctx, i, out);
    }
    return 0;
}
