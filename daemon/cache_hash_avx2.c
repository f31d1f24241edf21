/* cache_hash_avx2 — xxHash's XXH3-64 compiled for AVX2 (the Makefile builds this one
 * file with -mavx2 on x86-64), from xxHash's own header in its header-only mode.
 * Called only through cache_hash_sample (cache_hash.c), which asks the CPU first. On
 * other machines this file holds the library's call and says it is not the AVX2 build. */
#include <stddef.h>
#include <stdint.h>

#include "cache_hash.h"

#if defined(__AVX2__)
#define XXH_INLINE_ALL
#include <xxhash.h>
const int cache_hash_avx2_built = 1;
#else
#include <xxhash.h>
const int cache_hash_avx2_built = 0;
#endif

uint64_t cache_hash_avx2(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}
