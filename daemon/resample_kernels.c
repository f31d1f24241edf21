/* resample_kernels — the resampler's row kernels (resample_internal.h): the horizontal
 * and vertical passes over one row in plain C, SSE2, SSSE3 and AVX2, all giving the same
 * bytes, and the choice among them (resample_simd_level). The plan they run — weights,
 * windows, pass order — is resample.c's. */
#include "resample_internal.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
void resample_hpass_row(const uint8_t *restrict row, int row_px, int base, const struct axis *a, bool flip,
                        enum resample_simd level, uint8_t *restrict out)
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
void resample_vpass_row(const uint8_t *restrict src, size_t stride, int cnt, const int32_t *c,
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

