/* The sampler turns (seed, epoch) into the order in which one rank reads the dataset.
 *
 * The order is a keyed bijection of [0, n) computed one position at a time, so the
 * workers that fill batch k need nothing from the batches before it: resuming at batch
 * k, or splitting a batch across threads, costs no coordination and no O(n) table. The
 * bijection is a balanced Feistel network over the smallest even bit width whose range
 * (a power of 4) holds n; values that land outside [0, n) are fed back in ("cycle
 * walking"), which stays a bijection of [0, n) because the network is one of the whole
 * range. The range is below 4n, so a position takes fewer than four walks on average.
 *
 * Ranks interleave over one global order (rank r takes positions r, r+W, r+2W, ...), so
 * the union over ranks is the epoch; when n is not a multiple of W the tail wraps to the
 * start of the order, or is cut with drop_last, so every rank gets the same number of
 * batches and no distributed job waits on a rank that ran out. */
#include "sampler.h"

#include "ld_error.h"
#include "ld_mix.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SAMPLER_HAVE_AVX2 1
#else
#define SAMPLER_HAVE_AVX2 0
#endif

/* Enough rounds that even the 2-bit range of a tiny dataset reaches odd as well as
 * even permutations after cycle walking; each round costs one 64-bit mix. */
#define SAMPLER_ROUNDS 6
/* Positions computed side by side (sampler_indices). */
#define SAMPLER_LANES 16u
/* Rows of a batch that sampler_index computes at once. */
#define SAMPLER_RUN 32u

/* One key per (seed, epoch). The epoch goes through its own mix first so that
 * (seed, epoch) and (seed + 1, epoch - 1) do not collide the way a plain sum would. */
static inline uint64_t epoch_key(uint64_t seed, uint64_t epoch)
{
    return ld_mix64(seed + LD_MIX_GOLDEN * (ld_mix64(epoch + 0x632be59bd9b4e019ULL) | 1));
}

/* The round function: a hash of (key, round, right half). The half has at most 32
 * bits and goes into the high word, the round into the low one, so no two (round,
 * half) pairs give the same input under one key. */
static inline uint64_t feistel_round(uint64_t key, unsigned round, uint64_t half)
{
    return ld_mix64(key ^ ((half << 32) | round));
}

/* Half width in bits: the smallest h >= 1 with 4^h >= n. */
static inline unsigned half_bits(uint64_t n)
{
    unsigned h = 1;
    while (h < 32 && (n - 1) >> (2 * h) != 0)
        h++;
    return h;
}

uint64_t sampler_permute(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t pos)
{
    if (n <= 1)
        return 0;
    if (pos >= n)
        pos %= n;
    unsigned h = half_bits(n);
    uint64_t mask = h == 32 ? UINT32_MAX : (UINT64_C(1) << h) - 1;
    uint64_t key = epoch_key(seed, epoch);
    uint64_t x = pos;
    /* Terminates: x lies on a cycle of the network's permutation that contains pos,
     * which is < n, so walking the cycle reaches a value < n. */
    do {
        uint64_t left = x >> h, right = x & mask;
        for (unsigned r = 0; r < SAMPLER_ROUNDS; r++) {
            uint64_t next = left ^ (feistel_round(key, r, right) & mask);
            left = right;
            right = next;
        }
        x = (left << h) | right;
    } while (x >= n);
    return x;
}

int sampler_init(sampler *s, const struct sampler_params *p)
{
    if (!s || !p || p->n == 0 || p->batch_size == 0 || p->world_size == 0 ||
        p->rank >= p->world_size)
        return LD_EINVAL;
    uint64_t w = p->world_size, b = p->batch_size;
    uint64_t per_rank = p->drop_last ? p->n / w : p->n / w + (p->n % w != 0);
    uint64_t batches = p->drop_last ? per_rank / b : per_rank / b + (per_rank % b != 0);
    if (batches == 0)
        return LD_ERANGE;
    s->p = *p;
    s->per_rank = per_rank;
    s->batches = batches;
    return 0;
}

uint64_t sampler_batches(const sampler *s)
{
    return s->batches;
}

uint64_t sampler_samples(const sampler *s)
{
    return s->per_rank;
}

uint32_t sampler_batch_rows(const sampler *s, uint64_t batch)
{
    if (batch >= s->batches)
        return 0;
    if (batch + 1 < s->batches || s->p.drop_last)
        return s->p.batch_size;
    /* The last batch without drop_last: whatever is left, between 1 and batch_size. */
    return (uint32_t)(s->per_rank - (s->batches - 1) * (uint64_t)s->p.batch_size);
}

/* Position in the global order of row `row` of batch `batch` for this rank. */
static uint64_t sampler_position(const sampler *s, uint64_t batch, uint32_t row)
{
    uint64_t k = batch * s->p.batch_size + row;
    uint64_t pos = s->p.rank + k * s->p.world_size;
    /* Positions past the end are the padding that evens out the ranks: they wrap to
     * the start of the order. The reduction also keeps any (batch, row) a caller passes
     * inside [0, n). */
    if (pos >= s->p.n)
        pos %= s->p.n;
    return pos;
}

/* The lanes of permute_rows: each walks one position through the network. */
struct sampler_lanes {
    uint64_t left[SAMPLER_LANES], right[SAMPLER_LANES];
    uint32_t lane[SAMPLER_LANES]; /* the row each lane computes */
};

/* One walk of lanes [0, m): the network's rounds, one lane at a time. */
static void walk_scalar(struct sampler_lanes *w, unsigned m, uint64_t key, uint64_t mask)
{
    for (unsigned r = 0; r < SAMPLER_ROUNDS; r++)
        for (unsigned i = 0; i < m; i++) {
            uint64_t nr = w->left[i] ^ (feistel_round(key, r, w->right[i]) & mask);
            w->left[i] = w->right[i];
            w->right[i] = nr;
        }
}

#if SAMPLER_HAVE_AVX2
/* z * c mod 2^64 in each 64-bit lane, c given as its low and high 32 bits (AVX2 has
 * 32 x 32 -> 64-bit products only). */
__attribute__((target("avx2"))) static inline __m256i mul64(__m256i z, __m256i c_lo, __m256i c_hi)
{
    __m256i lo = _mm256_mul_epu32(z, c_lo);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(z, 32), c_lo), _mm256_mul_epu32(z, c_hi));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

/* walk_scalar four lanes to a vector, nv vectors side by side (a constant at each call,
 * so that the lanes stay in registers): the same ld_mix64, step for step. Lanes past m
 * (zeros, or a closed lane's last value) are computed and never read. */
__attribute__((target("avx2"), always_inline)) static inline void walk_vectors(struct sampler_lanes *w, uint64_t key,
                                                                                uint64_t mask, const unsigned nv)
{
    const __m256i c1_lo = _mm256_set1_epi64x((long long)(LD_MIX_M1 & UINT32_MAX));
    const __m256i c1_hi = _mm256_set1_epi64x((long long)(LD_MIX_M1 >> 32));
    const __m256i c2_lo = _mm256_set1_epi64x((long long)(LD_MIX_M2 & UINT32_MAX));
    const __m256i c2_hi = _mm256_set1_epi64x((long long)(LD_MIX_M2 >> 32));
    const __m256i vkey = _mm256_set1_epi64x((long long)key), vmask = _mm256_set1_epi64x((long long)mask);
    __m256i L[SAMPLER_LANES / 4], R[SAMPLER_LANES / 4];
#pragma GCC unroll 4
    for (unsigned v = 0; v < nv; v++) {
        L[v] = _mm256_loadu_si256((const __m256i *)&w->left[4 * v]);
        R[v] = _mm256_loadu_si256((const __m256i *)&w->right[4 * v]);
    }
#pragma GCC unroll 6
    for (unsigned r = 0; r < SAMPLER_ROUNDS; r++) {
        const __m256i vr = _mm256_set1_epi64x(r);
#pragma GCC unroll 4
        for (unsigned v = 0; v < nv; v++) {
            __m256i z = _mm256_xor_si256(vkey, _mm256_or_si256(_mm256_slli_epi64(R[v], 32), vr));
            z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, LD_MIX_S1)), c1_lo, c1_hi);
            z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, LD_MIX_S2)), c2_lo, c2_hi);
            z = _mm256_xor_si256(z, _mm256_srli_epi64(z, LD_MIX_S3));
            __m256i next = _mm256_xor_si256(L[v], _mm256_and_si256(z, vmask));
            L[v] = R[v];
            R[v] = next;
        }
    }
#pragma GCC unroll 4
    for (unsigned v = 0; v < nv; v++) {
        _mm256_storeu_si256((__m256i *)&w->left[4 * v], L[v]);
        _mm256_storeu_si256((__m256i *)&w->right[4 * v], R[v]);
    }
}

__attribute__((target("avx2"))) static void walk_avx2(struct sampler_lanes *w, unsigned m, uint64_t key,
                                                      uint64_t mask)
{
    _Static_assert(SAMPLER_LANES == 16, "walk_avx2 handles up to four vectors of four lanes");
    switch ((m + 3) / 4) {
    case 1: walk_vectors(w, key, mask, 1); break;
    case 2: walk_vectors(w, key, mask, 2); break;
    case 3: walk_vectors(w, key, mask, 3); break;
    default: walk_vectors(w, key, mask, 4); break;
    }
}
#endif

/* Which walk permute_rows takes: 0 not chosen yet, 1 scalar, 2 AVX2. */
static atomic_int walk_path;

static int best_walk_path(void)
{
#if SAMPLER_HAVE_AVX2
    if (__builtin_cpu_supports("avx2"))
        return 2;
#endif
    return 1;
}

bool sampler_use_vector(bool on)
{
    int best = best_walk_path();
    atomic_store(&walk_path, on ? best : 1);
    return best == 2;
}

/* sampler_permute of many positions at once. One position is a chain of dependent
 * multiplications; SAMPLER_LANES chains side by side keep the multiplier busy, and with
 * AVX2 four lanes share each instruction. A lane whose value lands inside [0, n) hands
 * its result out and takes the next position at once, so the lanes stay full while
 * positions are left (the walks' lengths vary: waiting for the longest of a group would
 * leave most lanes idle; 64 positions cost 15% less this way); those that land outside
 * walk on. */
static void permute_rows(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row, uint32_t count,
                         uint64_t *out)
{
    const uint64_t n = s->p.n;
    unsigned h = half_bits(n);
    uint64_t mask = h == 32 ? UINT32_MAX : (UINT64_C(1) << h) - 1;
    uint64_t key = epoch_key(s->p.seed, epoch);
    int path = atomic_load_explicit(&walk_path, memory_order_relaxed);
    if (path == 0) {
        path = best_walk_path();
        atomic_store_explicit(&walk_path, path, memory_order_relaxed);
    }
    struct sampler_lanes w = {0};
    uint32_t m = 0, next = 0;
    while (m < SAMPLER_LANES && next < count) {
        uint64_t x = sampler_position(s, batch, row + next);
        w.left[m] = x >> h;
        w.right[m] = x & mask;
        w.lane[m++] = next++;
    }
    while (m) {
#if SAMPLER_HAVE_AVX2
        if (path == 2)
            walk_avx2(&w, m, key, mask);
        else
#endif
            walk_scalar(&w, m, key, mask);
        unsigned k = 0;
        for (unsigned i = 0; i < m; i++) {
            uint64_t x = (w.left[i] << h) | w.right[i];
            uint32_t l = w.lane[i];
            if (x < n) {
                out[l] = x;
                if (next == count)
                    continue; /* nothing left to start: the lane closes */
                x = sampler_position(s, batch, row + next);
                l = next++;
            }
            w.left[k] = x >> h;
            w.right[k] = x & mask;
            w.lane[k++] = l;
        }
        m = k;
    }
}

void sampler_indices(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row, uint32_t count,
                     uint64_t *ret_idx)
{
    if (!s->p.shuffle || s->p.n <= 1) {
        for (uint32_t i = 0; i < count; i++)
            ret_idx[i] = sampler_position(s, batch, row + i);
        return;
    }
    permute_rows(s, epoch, batch, row, count, ret_idx);
}

/* The rows of one batch that this thread computed last, from its first call for them:
 * a worker asks for the rows of its chunk one by one, in order. The key is everything
 * the indices depend on, so an entry can only ever be right. */
static _Thread_local struct {
    uint64_t n, seed, epoch, batch;
    uint32_t batch_size, rank, world_size;
    uint32_t row, count;        /* rows [row, row + count) are in idx; count 0: none */
    uint64_t idx[SAMPLER_RUN];
} sampler_run;

uint64_t sampler_index(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row)
{
    if (!s->p.shuffle)
        return sampler_position(s, batch, row);
    const struct sampler_params *p = &s->p;
    if (row - sampler_run.row < sampler_run.count && sampler_run.epoch == epoch && sampler_run.batch == batch &&
        sampler_run.n == p->n && sampler_run.seed == p->seed && sampler_run.batch_size == p->batch_size &&
        sampler_run.rank == p->rank && sampler_run.world_size == p->world_size)
        return sampler_run.idx[row - sampler_run.row];
    /* The rest of the batch from this row, up to a run. */
    uint32_t count = row < p->batch_size && p->batch_size - row < SAMPLER_RUN ? p->batch_size - row : SAMPLER_RUN;
    sampler_indices(s, epoch, batch, row, count, sampler_run.idx);
    sampler_run.n = p->n;
    sampler_run.seed = p->seed;
    sampler_run.epoch = epoch;
    sampler_run.batch = batch;
    sampler_run.batch_size = p->batch_size;
    sampler_run.rank = p->rank;
    sampler_run.world_size = p->world_size;
    sampler_run.row = row;
    sampler_run.count = count;
    return sampler_run.idx[0];
}
