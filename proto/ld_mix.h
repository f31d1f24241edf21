/* ld_mix — the one 64-bit mixing function of loaderd: splitmix64 (Steele, Lea and Flood,
 * "Fast splittable pseudorandom number generators", 2014). The sampler's permutation,
 * the choice of a replacement for a bad sample, the transforms' PRNG and the test data
 * generators all derive their numbers from it, so batches are bit-identical on every
 * build, and the test tools and the harness that checks their output agree by
 * construction.
 *
 * Never change either function: sample orders, replacements, augmentations and the
 * generated test datasets are pinned by them (tests/unit/test_mix.c pins the values). */
#ifndef LD_MIX_H
#define LD_MIX_H

#include <stdint.h>

/* The golden-ratio increment of splitmix64's state (2^64 / phi, odd). */
#define LD_MIX_GOLDEN UINT64_C(0x9e3779b97f4a7c15)

/* The finalizer's two multipliers and three shifts (a vector version, in sampler.c,
 * takes them from here). */
#define LD_MIX_M1 UINT64_C(0xbf58476d1ce4e5b9)
#define LD_MIX_M2 UINT64_C(0x94d049bb133111eb)
#define LD_MIX_S1 30
#define LD_MIX_S2 27
#define LD_MIX_S3 31

/* splitmix64's finalizer: a bijection of 64-bit words in which every input bit affects
 * every output bit. ld_mix64(0) == 0: add a constant first when 0 is a likely input. */
static inline uint64_t ld_mix64(uint64_t z)
{
    z = (z ^ (z >> LD_MIX_S1)) * LD_MIX_M1;
    z = (z ^ (z >> LD_MIX_S2)) * LD_MIX_M2;
    return z ^ (z >> LD_MIX_S3);
}

/* splitmix64 as a function of its state: a generator in state s returns
 * ld_splitmix64(s) and moves to s + LD_MIX_GOLDEN. */
static inline uint64_t ld_splitmix64(uint64_t x)
{
    return ld_mix64(x + LD_MIX_GOLDEN);
}

#endif
