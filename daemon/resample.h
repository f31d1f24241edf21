/* resample — separable bilinear resampling of 8-bit RGB, antialiased when shrinking.
 *
 * The filter is PIL's (and torchvision's antialias=True) bilinear filter: a triangle
 * whose support grows with the reduction ratio, so shrinking averages every source
 * pixel under an output pixel instead of sampling two. Output pixel x (of a full
 * output out_w wide) is centered on source coordinate box_x0 + (x + 0.5) * scale,
 * scale = box_w / out_w; its window covers the source pixels whose centers lie within
 * support = max(scale, 1) of it, clipped to the clamp rectangle, and its weights
 * triangle((xs + 0.5 - center) / max(scale, 1)) are normalized to sum to one. The
 * two passes go through 8-bit intermediate rows, in the cheaper order for the geometry
 * (the same order for the same job, always); both use 14-bit fixed-point weights and
 * round to nearest. Integer arithmetic throughout: the SSE2 and the plain C paths give
 * the same bytes, on every thread.
 *
 * One call can compute any sub-rectangle of the full output with exactly the pixels
 * the full resize would give (a resize followed by a crop costs only the crop), and
 * the box may be fractional (a crop chosen on the full-size image, mapped onto an
 * image decoded at 1/2 or 1/4 scale). It can also mirror its output rows (a horizontal
 * flip costs nothing when it rides on the horizontal pass).
 *
 * Each pass picks the widest kernel the CPU runs (AVX2, else the horizontal one SSSE3,
 * else SSE2, else plain C) at each call; all give the same bytes, which
 * resample_simd_limit lets a test check. */
#ifndef LD_RESAMPLE_H
#define LD_RESAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"

/* Weights are fixed-point with this many fraction bits; 14 keeps a weight of 1.0 in a
 * signed 16-bit lane. */
#define RESAMPLE_PRECISION_BITS 14

struct resample_job {
    const uint8_t *src;             /* RGB rows */
    size_t src_stride;              /* bytes between rows */
    int src_w, src_h;
    double box_x0, box_y0, box_w, box_h;   /* the source region mapped onto the full output */
    int clamp_x0, clamp_y0, clamp_x1, clamp_y1; /* windows stay in [x0, x1) x [y0, y1) */
    int out_w, out_h;               /* the full output */
    int rect_x0, rect_y0, rect_w, rect_h;  /* the part of it to compute */
    bool flip;                      /* row pixel x is output pixel rect_x0 + rect_w - 1 - x */
};

/* Kernels, narrowest first. */
enum resample_simd { RESAMPLE_SIMD_C = 0, RESAMPLE_SIMD_SSE2, RESAMPLE_SIMD_SSSE3, RESAMPLE_SIMD_AVX2 };

/* Called with each output row (rect_w RGB pixels), top to bottom; `row` is valid
 * during the call only. */
typedef void (*resample_emit_fn)(void *ctx, int y, const uint8_t *row);

/* Computes job's rectangle. When dst is not NULL, row y goes to dst + y * dst_stride;
 * when emit is not NULL it is called with each row (after it was written to dst, or
 * from a scratch row). Uses scratch's IMAGE_AUX_COEF, _TMP and _ROW slots.
 * LD_EINVAL for an inconsistent job, LD_ENOMEM. */
int resample_run(const struct resample_job *job, struct image_buf *scratch, uint8_t *dst,
                 size_t dst_stride, resample_emit_fn emit, void *ctx);

/* Caps the kernels every later call uses at `level` (the CPU's own limit still
 * applies): for tests that compare the kernels' bytes, and for benchmarks. */
void resample_simd_limit(enum resample_simd level);

/* The kernel resample_run uses now. */
enum resample_simd resample_simd_level(void);

#endif
