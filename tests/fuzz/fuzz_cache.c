/* fuzz_cache — libFuzzer harness for the cache file reader (daemon/cache.c): the header,
 * footer and index checks of cache_open(), then every read path over what it accepted.
 *
 * A cache file is guarded by checksums, so mutated bytes would almost never get past
 * the header's XXH3 and the fuzzer would only ever test the first check. Byte 0 of the
 * input therefore says which checksums (and which footer copies of header fields) the
 * harness recomputes after the mutation, so that inconsistent files with valid
 * checksums (the hard case: a bug, or a file written by a hostile party) reach the
 * consistency checks and the readers. The rest is the file, written to an in-memory
 * file that cache_open() opens by its /proc/self/fd path.
 *
 * Once a file is accepted, every promise cache.h makes is checked against the input
 * itself: each sample's bytes are the ones the index names, inside the file, and
 * cache_verify, cache_info and cache_advise work on it. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache.h"
#include "cache_report.h"
#include "ld_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum {
    FIX_FILE_SIZE = 1,          /* header.file_size = the input's length */
    FIX_HEADER_SUM = 2,         /* header checksum */
    FIX_FOOTER_COPIES = 4,      /* footer's count, fingerprint, offsets, sizes from the header */
    FIX_INDEX_SUM = 8,          /* index checksum, where the header's index lies in the file */
    FIX_FOOTER_SUM = 16,        /* footer checksum */
};

#define MAX_SAMPLES_READ 256
#define MAX_SAMPLE_BYTES (1u << 20)

static void check(int cond)
{
    if (!cond)
        abort();
}

static int memfd = -1;
static char path[64];
static uint8_t *file;
static size_t file_cap;

static void fix_up(uint8_t *f, size_t len, unsigned fix)
{
    if (len < CACHE_HEADER_SIZE + CACHE_FOOTER_SIZE)
        return;
    struct cache_header h;
    struct cache_footer ft;
    memcpy(&h, f, sizeof h);
    memcpy(&ft, f + len - CACHE_FOOTER_SIZE, sizeof ft);
    if (fix & FIX_FILE_SIZE)
        h.file_size = len;
    if (fix & FIX_HEADER_SUM)
        h.header_checksum = XXH3_64bits(&h, offsetof(struct cache_header, header_checksum));
    if (fix & FIX_FOOTER_COPIES) {
        ft.count = h.count;
        ft.fingerprint = h.fingerprint;
        ft.index_offset = h.index_offset;
        ft.header_checksum = h.header_checksum;
        ft.file_size = h.file_size;
    }
    if ((fix & FIX_INDEX_SUM) && h.index_offset <= len && h.index_bytes <= len - h.index_offset)
        ft.index_checksum = XXH3_64bits(f + h.index_offset, (size_t)h.index_bytes);
    if (fix & FIX_FOOTER_SUM)
        ft.footer_checksum = XXH3_64bits(&ft, offsetof(struct cache_footer, footer_checksum));
    memcpy(f, &h, sizeof h);
    memcpy(f + len - CACHE_FOOTER_SIZE, &ft, sizeof ft);
}

static void read_all(cache *c, const uint8_t *f, size_t len)
{
    const struct cache_meta *m = cache_meta(c);
    const struct cache_header *h = (const struct cache_header *)f;
    char err[LD_ERRMSG_MAX];
    check(m->count == h->count && m->count >= 1 && m->file_size == len);
    check(m->n_fields >= 1 && m->n_fields <= LD_MAX_FIELDS);

    static uint8_t dst[MAX_SAMPLE_BYTES];
    uint64_t n = m->count < MAX_SAMPLES_READ ? m->count : MAX_SAMPLES_READ;
    for (uint64_t i = 0; i < n; i++) {
        struct cache_index_entry e;
        memcpy(&e, f + h->index_offset + i * CACHE_INDEX_ENTRY_SIZE, sizeof e);
        /* What cache_open accepted must lie inside the file. */
        check(e.offset <= len && e.length <= len - e.offset);
        const void *p = NULL;
        uint64_t got = 0;
        int64_t label = 0;
        check(cache_sample(c, i, &p, &got, &label) == 0);
        check(got == e.length && label == e.label && (uintptr_t)p % CACHE_ALIGN == 0);
        check(memcmp(p, f + e.offset, (size_t)got) == 0);
        if (e.length <= sizeof dst) {
            int r = cache_read(c, i, dst, sizeof dst, &got, &label, true, err);
            bool sum_ok = XXH3_64bits(f + e.offset, (size_t)e.length) == e.checksum;
            check(sum_ok ? r == 0 : r == LD_ECACHE);
            if (r == 0)
                check(got == e.length && memcmp(dst, f + e.offset, (size_t)got) == 0);
        }
    }
    const void *p;
    uint64_t got;
    int64_t label;
    check(cache_sample(c, m->count, &p, &got, &label) == LD_ERANGE);
    uint64_t idx[4] = {0, m->count - 1, m->count, UINT64_MAX};
    check(cache_advise(c, idx, 4) >= 0);
    int r = cache_verify(c, NULL, NULL, NULL, err);
    check(r == 0 || r == LD_ECACHE);
    cJSON *info = cJSON_CreateObject();
    check(info != NULL);
    check(cache_report_file(c, info) == 0);
    cJSON_Delete(info);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_cache.bin", MFD_CLOEXEC);
        check(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    unsigned fix = data[0];
    size_t len = size - 1;
    if (len > file_cap) {
        free(file);
        file = malloc(len);
        check(file != NULL);
        file_cap = len;
    }
    if (len)
        memcpy(file, data + 1, len);
    fix_up(file, len, fix);

    check(ftruncate(memfd, 0) == 0);
    size_t off = 0;
    while (off < len) {
        ssize_t w = pwrite(memfd, file + off, len - off, (off_t)off);
        check(w > 0);
        off += (size_t)w;
    }

    cache *c = NULL;
    char err[LD_ERRMSG_MAX];
    uint64_t expect = fix & 0x80 ? 0x1234 : 0;   /* sometimes a fingerprint to match */
    int r = cache_open(path, expect, &c, err);
    if (r < 0) {
        check(c == NULL && err[0] != '\0');
        check(r == LD_ECACHE || r == LD_ECACHEVERSION || r == LD_ECACHESTALE);
        return 0;
    }
    read_all(c, file, len);
    cache_free(c);
    return 0;
}
