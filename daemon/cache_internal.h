/* cache_internal — private to the cache's two halves: building (cache_build.c: the
 * writer, the temporary-file sweep, setting a bad file aside) and reading (cache.c:
 * open and its checks, samples, read-ahead advice, verify). What both need is here:
 * the sample checksum, the error formatter, and the progress and cancel helpers. No
 * other file includes this. */
#ifndef LD_CACHE_INTERNAL_H
#define LD_CACHE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "cache.h"
#include "cache_hash.h"

/* Formats "cache 'PATH': MESSAGE" into errbuf and returns code. */
int cache_fail(char *errbuf, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline const char *cache_errno_text(int e, char *buf, size_t size)
{
    return strerror_r(e, buf, size);
}

static inline uint64_t cache_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static inline bool cache_stop_requested(const atomic_int *cancel)
{
    return cancel && atomic_load_explicit(cancel, memory_order_relaxed) != 0;
}

/* Calls cb with READ/VERIFY progress when the whole percent changes (and at the end). */
static inline void cache_report_percent(cache_progress_fn cb, void *ctx, enum cache_stage stage,
                                        uint64_t done, uint64_t total, unsigned *last)
{
    if (!cb)
        return;
    unsigned pct = (unsigned)(total ? (unsigned __int128)done * 100 / total : 100);
    if (pct != *last) {
        *last = pct;
        cb(ctx, stage, done, total);
    }
}

#endif
