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

#include <stddef.h>

/* Enough rounds that even the 2-bit range of a tiny dataset reaches odd as well as
 * even permutations after cycle walking; each round costs one 64-bit mix. */
#define SAMPLER_ROUNDS 6

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

uint64_t sampler_index(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row)
{
    uint64_t k = batch * s->p.batch_size + row;
    uint64_t pos = s->p.rank + k * s->p.world_size;
    /* Positions past the end are the padding that evens out the ranks: they wrap to
     * the start of the order. The reduction also keeps any (batch, row) a caller passes
     * inside [0, n). */
    if (pos >= s->p.n)
        pos %= s->p.n;
    if (!s->p.shuffle)
        return pos;
    return sampler_permute(s->p.n, s->p.seed, epoch, pos);
}
