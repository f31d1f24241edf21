/* resample_internal — what the resampler's plan (resample.c) and its row kernels
 * (resample_kernels.c) share: the per-axis weights and window offsets, laid out for
 * each kernel, and the two passes over one row. Nothing outside these two files. */
#ifndef LD_RESAMPLE_INTERNAL_H
#define LD_RESAMPLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "resample.h"

struct axis {
    int n;                  /* output positions */
    int ksize;              /* weights stored per position */
    int *bounds;            /* per position: first source index, count */
    int32_t *coef;          /* per position: ksize weights */
    int16_t *pairs;         /* horizontal axis, SSE2: per position, npair groups of
                             * {c0, c1, c0, c1, c0, c1, 0, 0}, the last c1 0 when odd */
    int npair;              /* pairs stored per position */
    int npu;                /* pairs the vector kernels run: the most any window needs */
    int16_t *pairs2;        /* horizontal axis, AVX2: per two outputs (in output order,
                             * the flip applied), npu groups of {pair of the first,
                             * pair of the second} */
    int *off2;              /* AVX2: off by output instead of position */
    int v0, v1;             /* AVX2: the outputs it runs four at a time, both even */
    int safe_end;           /* positions below this may read their padded windows */
    int *off;               /* per position: the window's first byte in the pass's row */
    bool identity;          /* output i is source offset + i */
    int offset;
};

static inline uint8_t clip8(int32_t v)
{
    v >>= RESAMPLE_PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One output row of the horizontal pass. `row` holds row_px pixels; the axis's source
 * indexes are relative to pixel `base` of the full row. With `flip`, output pixel i is
 * axis position n - 1 - i. The widest kernel `level` allows. */
void resample_hpass_row(const uint8_t *restrict row, int row_px, int base, const struct axis *a, bool flip,
                        enum resample_simd level, uint8_t *restrict out);
/* One output row of the vertical pass: out[x] = sum of c[k] * (row k)[x] for x < len,
 * the cnt rows `stride` apart from `src`. */
void resample_vpass_row(const uint8_t *restrict src, size_t stride, int cnt, const int32_t *c,
                        uint8_t *restrict out, size_t len, enum resample_simd level);

#endif
