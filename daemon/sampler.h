/* sampler — the order of an epoch, computable one position at a time.
 *
 * For (seed, epoch) the sampler defines a permutation of the dataset's N sample
 * indices through a keyed bijection (a Feistel network over the next power of two,
 * with cycle walking), so the sample at any position is computed without computing the
 * positions before it: resume at batch k costs nothing and workers need no
 * coordination. Rank r of W takes positions r, r+W, r+2W, ... of the global
 * permutation (padded by wrapping around when N is not a multiple of W, or truncated
 * with drop_last) so every rank gets the same number of samples and batches. */
#ifndef LD_SAMPLER_H
#define LD_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

struct sampler_params {
    uint64_t n;            /* samples in the dataset, > 0 */
    uint64_t seed;
    bool shuffle;
    uint32_t batch_size;   /* > 0 */
    uint32_t rank, world_size;
    bool drop_last;
};

typedef struct sampler {
    struct sampler_params p;
    uint64_t per_rank;     /* samples per epoch for each rank */
    uint64_t batches;      /* batches per epoch for each rank */
} sampler;

/* LD_EINVAL when the parameters are inconsistent (n == 0, rank >= world_size, ...)
 * and LD_ERANGE when they leave no batch at all (drop_last with too few samples). */
int sampler_init(sampler *s, const struct sampler_params *p);
uint64_t sampler_batches(const sampler *s);
uint64_t sampler_samples(const sampler *s);
/* Rows in batch `batch` (batch_size except a short last batch without drop_last). */
uint32_t sampler_batch_rows(const sampler *s, uint64_t batch);
/* Dataset index of row `row` of batch `batch` of `epoch` for this rank. The first call
 * for a row computes the batch's next rows with it (sampler_indices) and keeps them for
 * the calling thread, so rows asked for in order cost about half as much. */
uint64_t sampler_index(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row);
/* sampler_index of rows [row, row + count) of one batch, into ret_idx[0..count). */
void sampler_indices(const sampler *s, uint64_t epoch, uint64_t batch, uint32_t row, uint32_t count,
                     uint64_t *ret_idx);
/* The global permutation: position pos in [0, n) of epoch under seed → index in [0, n). */
uint64_t sampler_permute(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t pos);

/* For tests: sampler_indices computes four positions per instruction where the CPU has
 * AVX2 (the default) or one at a time (on = false); the order is the same either way.
 * Returns whether this CPU has the vector path. */
bool sampler_use_vector(bool on);

#endif
