/* arena — the growing storage of the scanners that build a dataset's sample list (the
 * folder walk in source_files_scan.c, the manifest reader in manifest.c): heap arrays that
 * double when full, string arenas, one heap block of NUL-terminated strings that are
 * addressed by offset (so the block may move as it grows), and runs, a value per stretch
 * of samples instead of one per sample. Everything here is static inline; nothing is
 * thread-safe. */
#ifndef LD_ARENA_H
#define LD_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"

/* Makes *array (*cap elements of elem bytes) hold at least `need` elements, doubling
 * its capacity from 64. LD_ENOMEM, with *array and *cap unchanged, when memory (or
 * size_t) runs out. */
static inline int arena_grow(void **array, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return LD_ENOMEM;
        n *= 2;
    }
    if (elem && n > SIZE_MAX / elem)
        return LD_ENOMEM;
    void *p = realloc(*array, n * elem);
    if (!p)
        return LD_ENOMEM;
    *array = p;
    *cap = n;
    return 0;
}

/* Appends `n` bytes of s and a NUL to the string arena *data (*len bytes used of *cap);
 * the offset of the copy in *ret_off. LD_ENOMEM, the arena unchanged. */
static inline int arena_push(char **data, size_t *len, size_t *cap, const char *s, size_t n, uint64_t *ret_off)
{
    if (*len > SIZE_MAX - n - 1 || arena_grow((void **)data, cap, *len + n + 1, 1) < 0)
        return LD_ENOMEM;
    memcpy(*data + *len, s, n);
    (*data)[*len + n] = '\0';
    *ret_off = *len;
    *len += n + 1;
    return 0;
}

/* Runs: an array of n >= 1 structs of `size` bytes whose first member is the uint64_t
 * index at which each run starts, in increasing order, the first at 0 (the label runs of
 * the folder walk, the line runs of the manifest reader). Returns the position of the run
 * that holds index i: the last that starts at or before it. */
static inline size_t arena_run_find(const void *runs, size_t n, size_t size, uint64_t i)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t first;
        memcpy(&first, (const char *)runs + mid * size, sizeof first);
        if (first <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

#endif
