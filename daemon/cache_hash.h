/* cache_hash — the checksum the cache keeps for every sample: XXH3-64 with seed 0 of
 * its bytes (cache.h, struct cache_index_entry). Computed when a cache is built, when
 * a sample is served (every one: what a trainer gets was checked) and by verify. */
#ifndef LD_CACHE_HASH_H
#define LD_CACHE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3_64bits(p, n), the same value on every CPU; thread-safe. */
uint64_t cache_hash_sample(const void *p, size_t n);

/* cache_hash_avx2.c, for cache_hash_sample alone: the same function compiled for AVX2
 * (cache_hash_avx2_built is 1) or, on other machines, the library's call (0). */
extern const int cache_hash_avx2_built;
uint64_t cache_hash_avx2(const void *p, size_t n);

#endif
