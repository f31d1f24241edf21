/* arena — the growing storage of the scanners that build a dataset's sample list (the
 * folder walk in source_files.c, the manifest reader in manifest.c): heap arrays that
 * double when full, and string arenas, one heap block of NUL-terminated strings that
 * are addressed by offset (so the block may move as it grows). Everything here is
 * static inline; nothing is thread-safe. */
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

#endif
