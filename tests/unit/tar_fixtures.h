/* tar_fixtures — tar archives built in memory for the tar reader's unit tests and the
 * fuzzer's seeds: ustar headers with a correct checksum, members padded to whole
 * blocks, pax extended headers and GNU long names. Everything here is static. */
#ifndef LD_TAR_FIXTURES_H
#define LD_TAR_FIXTURES_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define TAR_FIX_BLOCK 512u

/* A ustar header for `name` (at most 100 bytes) of `size` bytes and type `type`. */
static inline void tar_fixture_header(uint8_t *b, const char *name, uint64_t size, char type)
{
    memset(b, 0, TAR_FIX_BLOCK);
    size_t n = strlen(name);
    memcpy(b, name, n < 100 ? n : 100);
    snprintf((char *)b + 100, 8, "%07o", 0644);
    snprintf((char *)b + 108, 8, "%07o", 0);
    snprintf((char *)b + 116, 8, "%07o", 0);
    snprintf((char *)b + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)b + 136, 12, "%011o", 0);
    b[156] = (uint8_t)type;
    memcpy(b + 257, "ustar\0" "00", 8);
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < TAR_FIX_BLOCK; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
}

/* Appends a header and `size` bytes of data (padded) to buf at *len; cap is buf's size.
 * Returns the header's offset, or -1 when it does not fit. */
static inline long tar_fixture_add(uint8_t *buf, size_t *len, size_t cap, const char *name, const void *data,
                                   size_t size, char type)
{
    size_t padded = (size + TAR_FIX_BLOCK - 1) / TAR_FIX_BLOCK * TAR_FIX_BLOCK;
    if (*len + TAR_FIX_BLOCK + padded > cap)
        return -1;
    long at = (long)*len;
    tar_fixture_header(buf + *len, name, size, type);
    *len += TAR_FIX_BLOCK;
    memset(buf + *len, 0, padded);
    if (size)
        memcpy(buf + *len, data, size);
    *len += padded;
    return at;
}

/* A pax extended header whose one record is `key=value`, then the member itself. */
static inline long tar_fixture_add_pax(uint8_t *buf, size_t *len, size_t cap, const char *key, const char *value,
                                       const char *name, const void *data, size_t size)
{
    char rec[1200];
    size_t body = strlen(key) + strlen(value) + 3, total = body + 1;
    while ((size_t)snprintf(NULL, 0, "%zu", total) + body != total)
        total++;
    int n = snprintf(rec, sizeof rec, "%zu %s=%s\n", total, key, value);
    if (tar_fixture_add(buf, len, cap, "PaxHeader", rec, (size_t)n, 'x') < 0)
        return -1;
    return tar_fixture_add(buf, len, cap, name, data, size, '0');
}

/* The end marker: two zero blocks. */
static inline int tar_fixture_end(uint8_t *buf, size_t *len, size_t cap)
{
    if (*len + 2 * TAR_FIX_BLOCK > cap)
        return -1;
    memset(buf + *len, 0, 2 * TAR_FIX_BLOCK);
    *len += 2 * TAR_FIX_BLOCK;
    return 0;
}

#endif
