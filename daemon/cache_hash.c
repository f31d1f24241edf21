/* cache_hash — the samples' checksum, XXH3-64 computed by xxHash itself.
 *
 * Where the CPU has AVX2, the call goes to xxHash's code compiled for AVX2 into
 * cache_hash_avx2.c; elsewhere to the library. The two give the same value (XXH3's
 * definition does not depend on the vector width; test_cache checks them against each
 * other). Why not the library: on 3 KiB samples served from a cache (two workers on two
 * cores, every sample copied out of the mapping, then hashed), alternating runs gave
 * 1.92-2.03 M samples/s through its dispatching entry point (AVX-512 here), 1.83-1.86 M
 * through its plain one (SSE2), 1.94-1.99 M with xxHash's SSE2 code compiled in here, and
 * 2.20-2.27 M with the AVX2 code. Alone in a loop over a buffer in L1, the AVX2 code is
 * not the fastest (about 61 ns a 3 KiB sample against 54 for the library's two): the gain
 * is in how it runs right after the copy, a cause not pinned down. */
#include "cache_hash.h"

#include <stdbool.h>
#include <xxhash.h>

static bool hash_use_avx2(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    static int known; /* 0 not asked yet, 1 no, 2 yes; a race asks the CPU twice */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!k) {
        __builtin_cpu_init();
        k = cache_hash_avx2_built && __builtin_cpu_supports("avx2") ? 2 : 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
#else
    return false;
#endif
}

uint64_t cache_hash_sample(const void *p, size_t n)
{
    return hash_use_avx2() ? cache_hash_avx2(p, n) : XXH3_64bits(p, n);
}
