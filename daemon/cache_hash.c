/* cache_hash — the samples' checksum, XXH3-64 computed by xxHash itself.
 *
 * Where the CPU has AVX2, the call goes to xxHash's code compiled for AVX2 into
 * cache_hash_avx2.c; elsewhere to the library. The two give the same value (XXH3's
 * definition does not depend on the vector width; test_cache checks them against each
 * other). Not the library's dispatching entry point, which picks AVX2 or AVX-512 by
 * itself: on 3 KiB samples served from a cache, two workers on two cores, it gave
 * 1.92-2.03 M samples/s where the AVX2 copy gives 2.20-2.27 M (alternating runs; an
 * AVX-512 copy gave 2.19-2.23 M). */
#include "cache_hash.h"

#include <stdbool.h>
#include <xxhash.h>

static bool use_avx2(void)
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

uint64_t cache_sample_hash(const void *p, size_t n)
{
    return use_avx2() ? cache_hash_avx2(p, n) : XXH3_64bits(p, n);
}
