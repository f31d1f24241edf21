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
#include "resample.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ld_error.h"

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

static inline uint8_t clip8(int32_t v)
{
    v >>= RESAMPLE_PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
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

/* The kernel limit set by resample_simd_limit; atomic so that a test may change it
 * while no resample runs without a data race on the workers' reads. */
static _Atomic int simd_cap = RESAMPLE_SIMD_AVX2;

void resample_simd_limit(enum resample_simd level)
{
    simd_cap = (int)level;
}

enum resample_simd resample_simd_level(void)
{
    int cpu = RESAMPLE_SIMD_C;
#if defined(__SSE2__)
    cpu = RESAMPLE_SIMD_SSE2;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    if (__builtin_cpu_supports("ssse3"))
        cpu = RESAMPLE_SIMD_SSSE3;
    if (cpu == RESAMPLE_SIMD_SSSE3 && __builtin_cpu_supports("avx2"))
        cpu = RESAMPLE_SIMD_AVX2;
#endif
#endif
    int cap = simd_cap;
    return (enum resample_simd)(cpu < cap ? cpu : cap);
}

/* One pixel of the horizontal pass, plain C: axis position p into out. */
static void hpass_px_c(const uint8_t *restrict row, int base, const struct axis *a, int p,
                       uint8_t *restrict out)
{
    const int32_t round = 1 << (RESAMPLE_PRECISION_BITS - 1);
    const uint8_t *s = row + (size_t)(a->bounds[2 * p] - base) * 3;
    const int32_t *c = a->coef + (size_t)p * a->ksize;
    int cnt = a->bounds[2 * p + 1];
    int32_t r = round, g = round, b = round;
    for (int k = 0; k < cnt; k++, s += 3) {
        r += s[0] * c[k];
        g += s[1] * c[k];
        b += s[2] * c[k];
    }
    out[0] = clip8(r);
    out[1] = clip8(g);
    out[2] = clip8(b);
}

#if defined(__SSE2__)
/* The vector kernels compute two taps of all three channels per pmaddwd: pixels k and
 * k + 1 of the window are brought to 16-bit lanes {r0, r1, g0, g1, b0, b1, 0, 0} and
 * multiplied by the position's {c0, c1, c0, c1, c0, c1, 0, 0}. Every position runs
 * the same number of pairs (a->npu, the most any window needs; shorter windows have
 * zero weights there), so there is no branch per pixel. A pair reads eight bytes from
 * its first pixel: positions whose padded window would read past the row
 * (p >= a->safe_end, and the few others that fail the same test) take the plain C
 * path. Four output pixels are packed together and stored as twelve bytes. */
static inline bool hpass_px_safe(const struct axis *a, int p, int base, int row_px)
{
    return a->bounds[2 * p] - base + 2 * a->npu < row_px;
}

static inline __m128i hpass_acc_sse2(const uint8_t *s, const struct axis *a, int p, int np)
{
    const __m128i zero = _mm_setzero_si128();
    const __m128i *cp = (const __m128i *)(const void *)(a->pairs + (size_t)p * a->npair * 8);
    __m128i acc = _mm_set1_epi32(1 << (RESAMPLE_PRECISION_BITS - 1));
    for (int k = 0; k < np; k++, s += 6) {
        int32_t w0, w1;
        memcpy(&w0, s, 4);
        memcpy(&w1, s + 3, 4);
        __m128i px = _mm_unpacklo_epi8(_mm_cvtsi32_si128(w0), _mm_cvtsi32_si128(w1));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi8(px, zero), _mm_load_si128(cp + k)));
    }
    return _mm_srai_epi32(acc, RESAMPLE_PRECISION_BITS);
}

/* Four pixels' sums to twelve bytes. */
static inline void hpass_store4_sse2(uint8_t *out, __m128i a0, __m128i a1, __m128i a2, __m128i a3)
{
    __m128i v = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    uint32_t w[4];
    _mm_storeu_si128((__m128i *)(void *)w, v);
    uint8_t b[12];
    memcpy(b, &w[0], 4);
    memcpy(b + 3, &w[1], 4);
    memcpy(b + 6, &w[2], 4);
    memcpy(b + 9, &w[3], 3);
    memcpy(out, b, 12);
}

static inline void hpass_store1(uint8_t *out, __m128i a0)
{
    __m128i v = _mm_packs_epi32(a0, a0);
    int32_t w = _mm_cvtsi128_si32(_mm_packus_epi16(v, v));
    memcpy(out, &w, 3);
}

/* The row, with NP pairs per position: a constant in the common cases, so that the
 * compiler unrolls the taps. */
#define HPASS_ROW_NP(ACC, STORE4, NP)                                                   \
    do {                                                                                \
        int n = a->n;                                                                   \
        const int *off = a->off;                                                        \
        for (int i = 0; i < n;) {                                                       \
            int p = flip ? n - 1 - i : i;                                               \
            int pmax = flip ? p : i + 3;                                                \
            uint8_t *o = out + 3 * (size_t)i;                                           \
            if (i + 4 <= n && pmax < a->safe_end) {                                     \
                int d = flip ? -1 : 1;                                                  \
                __m128i a0 = ACC(row + off[p], a, p, NP);                               \
                __m128i a1 = ACC(row + off[p + d], a, p + d, NP);                       \
                __m128i a2 = ACC(row + off[p + 2 * d], a, p + 2 * d, NP);               \
                __m128i a3 = ACC(row + off[p + 3 * d], a, p + 3 * d, NP);               \
                STORE4(o, a0, a1, a2, a3);                                              \
                i += 4;                                                                 \
                continue;                                                               \
            }                                                                           \
            if (hpass_px_safe(a, p, base, row_px))                                      \
                hpass_store1(o, ACC(row + off[p], a, p, NP));                           \
            else                                                                        \
                hpass_px_c(row, base, a, p, o);                                         \
            i++;                                                                        \
        }                                                                               \
    } while (0)

#define HPASS_ROW_VEC(ACC, STORE4)                                                      \
    do {                                                                                \
        switch (a->npu) {                                                               \
        case 1:                                                                         \
            HPASS_ROW_NP(ACC, STORE4, 1);                                               \
            break;                                                                      \
        case 2:                                                                         \
            HPASS_ROW_NP(ACC, STORE4, 2);                                               \
            break;                                                                      \
        case 3:                                                                         \
            HPASS_ROW_NP(ACC, STORE4, 3);                                               \
            break;                                                                      \
        default:                                                                        \
            HPASS_ROW_NP(ACC, STORE4, a->npu);                                          \
            break;                                                                      \
        }                                                                               \
    } while (0)

static void hpass_row_sse2(const uint8_t *restrict row, int row_px, int base, const struct axis *a,
                           bool flip, uint8_t *restrict out)
{
    HPASS_ROW_VEC(hpass_acc_sse2, hpass_store4_sse2);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_SSSE3_KERNEL 1
#include <tmmintrin.h>

/* SSSE3: one 8-byte load and one pshufb per pair instead of two loads and three
 * unpacks, and one pshufb to pack four pixels into twelve bytes. */
__attribute__((target("ssse3"))) static inline __m128i hpass_acc_ssse3(const uint8_t *s,
                                                                       const struct axis *a,
                                                                       int p, int np)
{
    const __m128i shuf = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m128i *cp = (const __m128i *)(const void *)(a->pairs + (size_t)p * a->npair * 8);
    __m128i acc = _mm_set1_epi32(1 << (RESAMPLE_PRECISION_BITS - 1));
    for (int k = 0; k < np; k++, s += 6) {
        __m128i px = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(const void *)s), shuf);
        acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_load_si128(cp + k)));
    }
    return _mm_srai_epi32(acc, RESAMPLE_PRECISION_BITS);
}

__attribute__((target("ssse3"))) static inline void hpass_store4_ssse3(uint8_t *out, __m128i a0,
                                                                       __m128i a1, __m128i a2,
                                                                       __m128i a3)
{
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    __m128i v = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    v = _mm_shuffle_epi8(v, pack);
    _mm_storel_epi64((__m128i *)(void *)out, v);
    int32_t hi = _mm_cvtsi128_si32(_mm_srli_si128(v, 8));
    memcpy(out + 8, &hi, 4);
}

__attribute__((target("ssse3"))) static void hpass_row_ssse3(const uint8_t *restrict row, int row_px,
                                                             int base, const struct axis *a,
                                                             bool flip, uint8_t *restrict out)
{
    HPASS_ROW_VEC(hpass_acc_ssse3, hpass_store4_ssse3);
}

#define HAVE_AVX2_HPASS 1
#include <immintrin.h>

/* AVX2: two output pixels at a time, one in each 128-bit lane, each lane doing what
 * hpass_acc_ssse3 does; their weights are one 32-byte load (a->pairs2). */
__attribute__((target("avx2"))) static inline __m256i hpass_acc2_avx2(const uint8_t *s0,
                                                                      const uint8_t *s1,
                                                                      const int16_t *cp, int np)
{
    const __m256i shuf = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    __m256i acc = _mm256_set1_epi32(1 << (RESAMPLE_PRECISION_BITS - 1));
    for (int k = 0; k < np; k++, s0 += 6, s1 += 6, cp += 16) {
        __m128i lo = _mm_loadl_epi64((const __m128i *)(const void *)s0);
        __m128i hi = _mm_loadl_epi64((const __m128i *)(const void *)s1);
        __m256i px = _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), shuf);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(px, _mm256_loadu_si256((const __m256i *)(const void *)cp)));
    }
    return _mm256_srai_epi32(acc, RESAMPLE_PRECISION_BITS);
}

/* Outputs i, i + 1 (a01) and i + 2, i + 3 (a23) to twelve bytes. */
__attribute__((target("avx2"))) static inline void hpass_store4_avx2(uint8_t *out, __m256i a01,
                                                                     __m256i a23)
{
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    __m256i w = _mm256_packs_epi32(a01, a23);       /* lane 0: i, i + 2; lane 1: i + 1, i + 3 */
    __m256i b = _mm256_packus_epi16(w, w);
    __m128i v = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    v = _mm_shuffle_epi8(v, pack);
    _mm_storel_epi64((__m128i *)(void *)out, v);
    int32_t hi = _mm_cvtsi128_si32(_mm_srli_si128(v, 8));
    memcpy(out + 8, &hi, 4);
}

/* Outputs [a->v0, a->v1) four at a time (their windows are safe to read padded), the
 * others one by one the SSSE3 or C way. */
#define HPASS2_ROW_NP(NP)                                                               \
    do {                                                                                \
        const int *off2 = a->off2;                                                      \
        const int16_t *cp = a->pairs2 + (size_t)(a->v0 / 2) * (NP) * 16;                \
        for (int i = a->v0; i < a->v1; i += 4, cp += (size_t)(NP) * 32) {               \
            __m256i a01 = hpass_acc2_avx2(row + off2[i], row + off2[i + 1], cp, NP);    \
            __m256i a23 = hpass_acc2_avx2(row + off2[i + 2], row + off2[i + 3],         \
                                          cp + (size_t)(NP) * 16, NP);                  \
            hpass_store4_avx2(out + 3 * (size_t)i, a01, a23);                           \
        }                                                                               \
    } while (0)

__attribute__((target("avx2"))) static void hpass_row_avx2(const uint8_t *restrict row, int row_px,
                                                           int base, const struct axis *a,
                                                           bool flip, uint8_t *restrict out)
{
    for (int i = 0; i < a->n; i++) {
        if (i == a->v0)
            i = a->v1;
        if (i >= a->n)
            break;
        int p = flip ? a->n - 1 - i : i;
        uint8_t *o = out + 3 * (size_t)i;
        if (hpass_px_safe(a, p, base, row_px))
            hpass_store1(o, hpass_acc_ssse3(row + a->off[p], a, p, a->npu));
        else
            hpass_px_c(row, base, a, p, o);
    }
    switch (a->npu) {
    case 1:
        HPASS2_ROW_NP(1);
        break;
    case 2:
        HPASS2_ROW_NP(2);
        break;
    case 3:
        HPASS2_ROW_NP(3);
        break;
    default:
        HPASS2_ROW_NP(a->npu);
        break;
    }
}
#endif
#endif

/* One output row of the horizontal pass. `row` holds row_px pixels; the axis's source
 * indexes are relative to pixel `base` of the full row. With `flip`, output pixel i is
 * axis position n - 1 - i. */
static void hpass_row(const uint8_t *restrict row, int row_px, int base, const struct axis *a,
                      bool flip, enum resample_simd level, uint8_t *restrict out)
{
#if defined(HAVE_AVX2_HPASS)
    if (level >= RESAMPLE_SIMD_AVX2 && a->pairs2) {
        hpass_row_avx2(row, row_px, base, a, flip, out);
        return;
    }
#endif
#if defined(HAVE_SSSE3_KERNEL)
    if (level >= RESAMPLE_SIMD_SSSE3) {
        hpass_row_ssse3(row, row_px, base, a, flip, out);
        return;
    }
#endif
#if defined(__SSE2__)
    if (level >= RESAMPLE_SIMD_SSE2) {
        hpass_row_sse2(row, row_px, base, a, flip, out);
        return;
    }
#endif
    (void)row_px;
    (void)level;
    for (int i = 0; i < a->n; i++)
        hpass_px_c(row, base, a, flip ? a->n - 1 - i : i, out + 3 * (size_t)i);
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

#if defined(__SSE2__) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_AVX2_KERNEL 1
#include <immintrin.h>

/* The vertical pass in AVX2: the SSE2 loop below on 32 bytes at a time (unpacks and
 * packs stay within each 128-bit lane, so the bytes come out in order). Returns how
 * many bytes it did. */
__attribute__((target("avx2"))) static size_t vpass_avx2(const uint8_t *restrict src, size_t stride,
                                                         int cnt, const int32_t *c,
                                                         uint8_t *restrict out, size_t len)
{
    const __m256i zero = _mm256_setzero_si256();
    const __m256i rnd = _mm256_set1_epi32(1 << (RESAMPLE_PRECISION_BITS - 1));
    size_t x = 0;
    for (;; x += 32) {
        /* The last, partial step is a full one ending at len: it rewrites a few bytes
         * with the values they already have instead of leaving them to the scalar loop. */
        if (x + 32 > len) {
            if (x == len || len < 32)
                break;
            x = len - 32;
        }
        __m256i a0 = rnd, a1 = rnd, a2 = rnd, a3 = rnd;
        int k = 0;
        for (; k + 2 <= cnt; k += 2) {
            const uint8_t *p = src + (size_t)k * stride + x;
            __m256i s0 = _mm256_loadu_si256((const __m256i *)(const void *)p);
            __m256i s1 = _mm256_loadu_si256((const __m256i *)(const void *)(p + stride));
            __m256i cc = _mm256_set1_epi32((int32_t)((uint32_t)c[k + 1] << 16 | (uint16_t)c[k]));
            __m256i lo = _mm256_unpacklo_epi8(s0, s1), hi = _mm256_unpackhi_epi8(s0, s1);
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), cc));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), cc));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), cc));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), cc));
        }
        if (k < cnt) {
            const uint8_t *p = src + (size_t)k * stride + x;
            __m256i s0 = _mm256_loadu_si256((const __m256i *)(const void *)p);
            __m256i cc = _mm256_set1_epi32((uint16_t)c[k]);
            __m256i lo = _mm256_unpacklo_epi8(s0, zero), hi = _mm256_unpackhi_epi8(s0, zero);
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi16(lo, zero), cc));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi16(lo, zero), cc));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi16(hi, zero), cc));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi16(hi, zero), cc));
        }
        a0 = _mm256_srai_epi32(a0, RESAMPLE_PRECISION_BITS);
        a1 = _mm256_srai_epi32(a1, RESAMPLE_PRECISION_BITS);
        a2 = _mm256_srai_epi32(a2, RESAMPLE_PRECISION_BITS);
        a3 = _mm256_srai_epi32(a3, RESAMPLE_PRECISION_BITS);
        __m256i w0 = _mm256_packs_epi32(a0, a1), w1 = _mm256_packs_epi32(a2, a3);
        _mm256_storeu_si256((__m256i *)(void *)(out + x), _mm256_packus_epi16(w0, w1));
    }
    return x;
}
#endif

/* One output row of the vertical pass: out[x] = sum of c[k] * (row k)[x], the rows
 * `stride` apart from `src`. With SSE2 (every x86-64) sixteen bytes and two taps at a
 * time through pmaddwd, which is why the weights fit 16 bits; integer sums are exact,
 * so the vector and scalar paths give the same bytes. */
static void vpass_row(const uint8_t *restrict src, size_t stride, int cnt, const int32_t *c,
                      uint8_t *restrict out, size_t len, enum resample_simd level)
{
    const int32_t round = 1 << (RESAMPLE_PRECISION_BITS - 1);
    size_t x = 0;
#if defined(HAVE_AVX2_KERNEL)
    if (level >= RESAMPLE_SIMD_AVX2)
        x = vpass_avx2(src, stride, cnt, c, out, len);
#endif
#if defined(__SSE2__)
    if (level < RESAMPLE_SIMD_SSE2)
        goto scalar;
    const __m128i zero = _mm_setzero_si128(), rnd = _mm_set1_epi32(round);
    for (; x + 16 <= len; x += 16) {
        __m128i a0 = rnd, a1 = rnd, a2 = rnd, a3 = rnd;
        int k = 0;
        for (; k + 2 <= cnt; k += 2) {
            const uint8_t *p = src + (size_t)k * stride + x;
            __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i s1 = _mm_loadu_si128((const __m128i *)(const void *)(p + stride));
            __m128i cc = _mm_set1_epi32((int32_t)((uint32_t)c[k + 1] << 16 | (uint16_t)c[k]));
            __m128i lo = _mm_unpacklo_epi8(s0, s1), hi = _mm_unpackhi_epi8(s0, s1);
            a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), cc));
            a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), cc));
            a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), cc));
            a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), cc));
        }
        if (k < cnt) {
            const uint8_t *p = src + (size_t)k * stride + x;
            __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i cc = _mm_set1_epi32((uint16_t)c[k]);
            __m128i lo = _mm_unpacklo_epi8(s0, zero), hi = _mm_unpackhi_epi8(s0, zero);
            a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi16(lo, zero), cc));
            a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi16(lo, zero), cc));
            a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi16(hi, zero), cc));
            a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi16(hi, zero), cc));
        }
        /* >> precision, clamp to [0, 255] (sums are never negative), pack to bytes. */
        a0 = _mm_srai_epi32(a0, RESAMPLE_PRECISION_BITS);
        a1 = _mm_srai_epi32(a1, RESAMPLE_PRECISION_BITS);
        a2 = _mm_srai_epi32(a2, RESAMPLE_PRECISION_BITS);
        a3 = _mm_srai_epi32(a3, RESAMPLE_PRECISION_BITS);
        __m128i w0 = _mm_packs_epi32(a0, a1), w1 = _mm_packs_epi32(a2, a3);
        _mm_storeu_si128((__m128i *)(void *)(out + x), _mm_packus_epi16(w0, w1));
    }
scalar:
#endif
    (void)level;
    for (; x < len; x++) {
        int32_t acc = round;
        for (int k = 0; k < cnt; k++)
            acc += src[(size_t)k * stride + x] * c[k];
        out[x] = clip8(acc);
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
                vpass_row(col0, j->src_stride, ay.bounds[2 * i + 1],
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
                hpass_row(vrow, row_px, x_lo, &ax, flip, level, out);
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
            hpass_row(j->src + (size_t)y * j->src_stride + (size_t)x_lo * 3, row_px, x_lo, &ax,
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
            vpass_row(s, tmp_stride, ay.bounds[2 * i + 1], ay.coef + (size_t)i * ay.ksize, out,
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
