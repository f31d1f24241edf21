/* cache — the single-file dataset cache: build it from a dataset, open it, serve samples.
 *
 * Files: the format and both halves' API are here; cache_build.c builds (the writer,
 * the sweep of dead builders' temporary files, setting a bad file aside), cache.c reads
 * (open and its checks, samples, read-ahead advice, verify), cache_report.c shows a
 * cache as JSON, cache_keeper.c runs one dataset's cache inside the daemon.
 *
 * A cache file packs every sample of a dataset (its first field's raw bytes and its
 * label) into one file: a header page, the sample data (each sample 64-byte aligned),
 * an index of 32 bytes per sample and a 64-byte footer. docs/cache-format.md describes
 * it byte by byte, with the crash-safety argument and the invalidation rules.
 *
 * Threads. cache_build(), cache_verify() and cache_open() block on I/O (open reads the
 * whole index): run them on a thread that may block, never on the loop thread. An
 * open cache is immutable apart from its hit counters (atomics), so cache_sample(),
 * cache_read(), cache_advise(), cache_meta() and the accessors may be called from any
 * number of threads at once; cache_free() must not race with any of them. Every read of
 * the mapping in this module runs under mapguard, so a file truncated by someone else
 * fails the read (LD_ECACHE) instead of raising SIGBUS.
 *
 * Errors: 0 or a negative LD_* code, with a sentence in errbuf (LD_ERRMSG_MAX bytes)
 * that names the cache file. LD_ECACHE: corrupt or truncated (never serve it: set it
 * aside and rebuild); LD_ECACHESTALE: whole, but built from another state of the
 * source (rebuild); LD_ECACHEVERSION: a format this build does not read (rebuild);
 * LD_ENOENT: no cache yet. */
#ifndef LD_CACHE_H
#define LD_CACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataset.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the cache file is little-endian and written as in memory: port cache.c first"
#endif

/* ---- the file format ---------------------------------------------------------------
 * Never change any of this without bumping CACHE_VERSION: files outlive the binary
 * that wrote them, and are shipped to other machines (the `packed` source kind). */
#define CACHE_MAGIC "LDCACHE1"          /* 8 bytes at offset 0, no NUL */
#define CACHE_FOOTER_MAGIC "LDCFOOT1"   /* 8 bytes at file_size - 64, no NUL */
#define CACHE_VERSION 1u
#define CACHE_HEADER_SIZE 4096u         /* the header page; the data starts right after */
#define CACHE_ALIGN 64u                 /* every sample's offset is a multiple of this */
#define CACHE_INDEX_ENTRY_SIZE 32u
#define CACHE_FOOTER_SIZE 64u
#define CACHE_MAX_FIELDS 8              /* field slots in the header (>= LD_MAX_FIELDS) */
#define CACHE_MAX_DIMS 4                /* shape slots per field (>= LD_MAX_DIMS) */
#define CACHE_NAME_SIZE 64              /* kind, dataset and field names, NUL-padded */
#define CACHE_SOURCE_SIZE 1024          /* the source's path, NUL-padded, may be cut */
#define CACHE_NO_LABEL 0xffffffffu      /* header.label_field when the layout has none */

/* header.flags. A reader refuses a file with a bit it does not know (LD_ECACHEVERSION). */
#define CACHE_FLAG_RAGGED 0x1u          /* samples differ in length (field 0 is ragged) */
#define CACHE_FLAGS_KNOWN CACHE_FLAG_RAGGED

_Static_assert(LD_MAX_FIELDS <= CACHE_MAX_FIELDS, "the header has a slot per field");
_Static_assert(LD_MAX_DIMS <= CACHE_MAX_DIMS, "the header has a slot per dim");
_Static_assert(LD_NAME_MAX <= CACHE_NAME_SIZE, "names fit the header");

/* One field of the dataset's layout, as the dataset described it (dataset_field). */
struct cache_field {
    char name[CACHE_NAME_SIZE];     /* NUL-terminated, NUL-padded */
    uint32_t dtype;                 /* LD_DTYPE_* */
    uint32_t ndim;                  /* 0..CACHE_MAX_DIMS */
    int64_t shape[CACHE_MAX_DIMS];  /* unused dims are 0 */
    uint8_t ragged;                 /* 0 or 1 */
    uint8_t reserved0[7];           /* 0 */
    uint64_t max_item_bytes;        /* ragged: the largest sample's byte length; else 0 */
    uint8_t reserved1[8];           /* 0 */
};
_Static_assert(sizeof(struct cache_field) == 128, "cache_field is file layout");
_Static_assert(offsetof(struct cache_field, dtype) == 64, "cache_field is file layout");
_Static_assert(offsetof(struct cache_field, shape) == 72, "cache_field is file layout");
_Static_assert(offsetof(struct cache_field, ragged) == 104, "cache_field is file layout");
_Static_assert(offsetof(struct cache_field, max_item_bytes) == 112, "cache_field is file layout");

/* The first page of the file. */
struct cache_header {
    char magic[8];                  /* CACHE_MAGIC */
    uint32_t version;               /* CACHE_VERSION */
    uint32_t flags;                 /* CACHE_FLAG_* */
    uint64_t count;                 /* samples, >= 1 */
    uint64_t fingerprint;           /* the source's (dataset_ops.fingerprint); 0 = none */
    uint64_t file_size;             /* bytes of the whole file */
    uint64_t data_offset;           /* = CACHE_HEADER_SIZE */
    uint64_t data_bytes;            /* sum of the samples' lengths, each rounded up to CACHE_ALIGN */
    uint64_t index_offset;          /* = data_offset + data_bytes */
    uint64_t index_bytes;           /* = count * CACHE_INDEX_ENTRY_SIZE */
    uint64_t build_time_ns;         /* CLOCK_REALTIME when the build started, unix ns */
    uint64_t sample_bytes;          /* sum of the samples' lengths (no padding) */
    uint64_t max_sample_bytes;      /* the longest sample */
    uint32_t n_fields;              /* 1..CACHE_MAX_FIELDS; field 0 is the cached bytes */
    uint32_t label_field;           /* index of the int64 "label" field, or CACHE_NO_LABEL */
    uint32_t align;                 /* = CACHE_ALIGN */
    uint8_t reserved0[20];          /* 0 */
    char kind[CACHE_NAME_SIZE];     /* the source's kind ("files"), NUL-padded */
    char name[CACHE_NAME_SIZE];     /* the dataset's name when built, NUL-padded */
    struct cache_field fields[CACHE_MAX_FIELDS];  /* n_fields used, the rest 0 */
    char source[CACHE_SOURCE_SIZE]; /* the source's path when built (informative) */
    uint8_t reserved1[1784];        /* 0 */
    uint64_t header_checksum;       /* XXH3-64 (seed 0) of bytes [0, 4088) */
};
_Static_assert(sizeof(struct cache_header) == CACHE_HEADER_SIZE, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, version) == 8, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, count) == 16, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, fingerprint) == 24, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, file_size) == 32, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, index_offset) == 56, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, build_time_ns) == 72, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, n_fields) == 96, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, align) == 104, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, kind) == 128, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, name) == 192, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, fields) == 256, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, source) == 1280, "cache_header is file layout");
_Static_assert(offsetof(struct cache_header, header_checksum) == 4088, "cache_header is file layout");

/* One sample's entry in the index, in sample order. */
struct cache_index_entry {
    uint64_t offset;                /* from the start of the file; a multiple of CACHE_ALIGN */
    uint64_t length;                /* bytes */
    int64_t label;                  /* the sample's label; -1 when none */
    uint64_t checksum;              /* XXH3-64 (seed 0) of the sample's `length` bytes */
};
_Static_assert(sizeof(struct cache_index_entry) == CACHE_INDEX_ENTRY_SIZE, "cache_index_entry is file layout");
_Static_assert(offsetof(struct cache_index_entry, label) == 16, "cache_index_entry is file layout");
_Static_assert(offsetof(struct cache_index_entry, checksum) == 24, "cache_index_entry is file layout");

/* The last 64 bytes of the file: found from the file's size alone, so a file cut
 * short has no footer where one must be. */
struct cache_footer {
    char magic[8];                  /* CACHE_FOOTER_MAGIC */
    uint64_t count;                 /* = header.count */
    uint64_t fingerprint;           /* = header.fingerprint */
    uint64_t index_offset;          /* = header.index_offset */
    uint64_t index_checksum;        /* XXH3-64 (seed 0) of the index section */
    uint64_t header_checksum;       /* = header.header_checksum */
    uint64_t file_size;             /* = header.file_size */
    uint64_t footer_checksum;       /* XXH3-64 (seed 0) of bytes [0, 56) of the footer */
};
_Static_assert(sizeof(struct cache_footer) == CACHE_FOOTER_SIZE, "cache_footer is file layout");
_Static_assert(offsetof(struct cache_footer, index_checksum) == 32, "cache_footer is file layout");
_Static_assert(offsetof(struct cache_footer, file_size) == 48, "cache_footer is file layout");
_Static_assert(offsetof(struct cache_footer, footer_checksum) == 56, "cache_footer is file layout");

/* ---- building ----------------------------------------------------------------------- */

/* Stages reported to a progress callback, in this order. */
enum cache_stage {
    CACHE_STAGE_READ = 1,           /* samples copied: done of total; called at each new percent */
    CACHE_STAGE_SYNC = 2,           /* every byte written; about to fsync the temporary file */
    CACHE_STAGE_RENAME = 3,         /* synced; about to rename it over the cache path */
    CACHE_STAGE_RENAMED = 4,        /* renamed; about to fsync the directory */
    CACHE_STAGE_DONE = 5,           /* the cache is in place and durable */
    CACHE_STAGE_VERIFY = 6,         /* cache_verify(): samples checked, done of total */
};

/* Called on the building (or verifying) thread; must not call back into the cache. */
typedef void (*cache_progress_fn)(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total);

/* Builds the cache of dataset d at `path`. Needs the kind's raw_bytes and read_raw
 * (LD_ENOTSUP otherwise) and at least one sample (LD_EINVAL otherwise). `fingerprint`
 * is stored as is: take it from d->ops->fingerprint BEFORE the build, so that a
 * change made during the build makes the result stale rather than wrong.
 *
 * The file is written to `path`.tmp.<pid>.<16 hex digits> in the same directory, in
 * large buffered writes, fsync'ed, renamed over `path` (replacing any old cache
 * atomically: a reader that has the old one mapped keeps reading it), and the
 * directory is fsync'ed. On any failure, and when *cancel becomes non-zero (checked
 * between samples; LD_ECANCELED), the temporary file is removed and `path` is left
 * as it was. A crash leaves `path` as it was, or the whole new cache; the temporary
 * file it leaves is removed by cache_sweep_temps(). Blocking; one build per path at
 * a time is the caller's business (two builds of one path both finish whole, the
 * later rename wins). cb and cancel may be NULL. */
int cache_build(const dataset *d, const char *path, uint64_t fingerprint,
                cache_progress_fn cb, void *ctx, const atomic_int *cancel, char *errbuf);
/* cache_build, the file created with `mode` (before the umask) instead of 0644: 0600
 * for a trainer's declared cache, which only the daemon reads. */
int cache_build_mode(const dataset *d, const char *path, uint64_t fingerprint, unsigned mode,
                     cache_progress_fn cb, void *ctx, const atomic_int *cancel, char *errbuf);

/* The bytes cache_build would write for d (the whole file), from its samples' sizes:
 * what a quota is checked against before a build starts. Blocking (raw_bytes of every
 * sample). 0, LD_ENOTSUP (a kind that cannot be cached) or LD_EFBIG. */
int cache_plan_bytes(const dataset *d, uint64_t *ret_bytes, char *errbuf);

/* Removes, in directory `dir`, the temporary files (*.tmp.<pid>.<hex>) of builders
 * whose process no longer exists on this machine; those of live processes (this one
 * included) are kept. Returns how many were removed, or a negative code (dir
 * unreadable). A cache directory must not be shared by builders on several hosts. */
int cache_sweep_temps(const char *dir, char *errbuf);

/* Moves a cache that failed its checks out of the way: renames `path` to `path`.bad
 * (replacing an older one, so one is kept for inspection) and writes `reason` with
 * the time into `path`.bad.reason. The caller logs. LD_ENOENT when `path` is gone. */
int cache_set_aside(const char *path, const char *reason, char *errbuf);

/* ---- reading ------------------------------------------------------------------------ */

typedef struct cache cache;

/* What the header says, decoded (strings NUL-terminated). */
struct cache_meta {
    uint32_t version;
    uint32_t flags;
    uint64_t count;
    uint64_t fingerprint;
    uint64_t file_size;
    uint64_t data_bytes;
    uint64_t sample_bytes;
    uint64_t max_sample_bytes;
    uint64_t build_time_ns;
    char kind[CACHE_NAME_SIZE];
    char name[CACHE_NAME_SIZE];
    char source[CACHE_SOURCE_SIZE];
    int n_fields;
    int label_field;                /* -1 when none */
    struct dataset_field fields[LD_MAX_FIELDS];   /* the layout, as dataset.h has it */
};

/* Opens and checks the cache at `path`: size, magic, version, header checksum and
 * consistency, footer, index checksum and every index entry's bounds, then the
 * fingerprint against `expected_fingerprint` (0: not checked, for a `packed` source).
 * The sample data is not read (cache_verify() does that): the file is mapped
 * read-only and shared, so a cache larger than memory works. Blocking (reads the
 * index). LD_ENOENT, LD_ECACHE, LD_ECACHEVERSION, LD_ECACHESTALE as above. */
int cache_open(const char *path, uint64_t expected_fingerprint, cache **ret_cache, char *errbuf);
/* The same for the file `name` of directory dirfd, never through a symbolic link
 * (O_NOFOLLOW: a link there is LD_ECACHE, to set aside), for a cache the daemon writes
 * beneath a directory it opened once (declare_cache.h); `shown` names it in messages. */
int cache_open_at(int dirfd, const char *name, const char *shown, uint64_t expected_fingerprint,
                  cache **ret_cache, char *errbuf);
/* Unmaps and frees. Accepts NULL. */
void cache_free(cache *c);

/* Sample `index`: a pointer into the mapping (valid until cache_free(), aligned to
 * CACHE_ALIGN, read-only), its length and label. O(1), no system call (the first
 * touch of a page not in memory blocks on I/O), thread-safe; counts a hit. The bytes
 * are not checked against their checksum, and reading them through the pointer is not
 * guarded against a file truncated under us (SIGBUS): serve with cache_read(). LD_ERANGE
 * when index >= count, LD_ECACHE when the index itself is cut off. */
int cache_sample(cache *c, uint64_t index, const void **ret_ptr, uint64_t *ret_len,
                 int64_t *ret_label);
/* Copies sample `index` into dst (cap bytes; LD_ERANGE when it does not fit or index
 * >= count) with its length and label; with verify, checks the copy against the
 * sample's checksum (LD_ECACHE, naming the sample). A file truncated under the copy
 * (SIGBUS) is LD_EIO, never a crash (mapguard.h). Either failure marks the cache
 * bad (cache_bad()). Thread-safe; counts a hit. */
int cache_read(cache *c, uint64_t index, void *dst, uint64_t cap, uint64_t *ret_len,
               int64_t *ret_label, bool verify, char *errbuf);
/* Hits counted by the reader and added to the cache's counters in one go: a worker
 * reading a run of samples would otherwise add to counters that every worker shares,
 * twice a sample. */
struct cache_tally {
    uint64_t samples, bytes;
};
/* cache_read, with the hit added to *tally instead of the cache's counters. */
int cache_read_tally(cache *c, uint64_t index, void *dst, uint64_t cap, uint64_t *ret_len,
                     int64_t *ret_label, bool verify, struct cache_tally *tally, char *errbuf);
/* Adds *tally to the cache's hit counters and clears it. Thread-safe. */
void cache_count_tally(cache *c, struct cache_tally *tally);
/* Asks the kernel to read ahead the pages of the given samples (the next batches', in
 * the sampler's order): the ranges are sorted and merged, then one madvise(WILLNEED)
 * per merged range. Indices out of range are ignored. Does not block on I/O.
 * Returns the number of madvise calls made (>= 0). Thread-safe. */
int cache_advise(const cache *c, const uint64_t *indices, size_t n);
/* Tells the CPU that samples indices[0..n) are about to be read (a worker's next rows):
 * their index entries, then their data (up to 4 KiB of each), are prefetched into its
 * caches, so the reads that follow wait for memory side by side rather than one after
 * another. A hint: nothing is checked or counted; a file cut short is left to the read
 * (the entries are read under the mapping's guard). Thread-safe. */
void cache_prefetch(const cache *c, const uint64_t *indices, size_t n);
/* Checks every sample against its checksum, in file order; the first bad one fails
 * with LD_ECACHE and a message naming it. Progress as CACHE_STAGE_VERIFY. Blocking
 * (reads the whole file); LD_ECANCELED when *cancel becomes non-zero. cb and cancel
 * may be NULL. */
int cache_verify(const cache *c, cache_progress_fn cb, void *ctx, const atomic_int *cancel,
                 char *errbuf);

/* What cache_read() found wrong while serving, first failure wins. */
enum cache_bad_kind {
    CACHE_BAD_NONE = 0,
    CACHE_BAD_CHECKSUM = 1,         /* a sample's bytes do not match their checksum */
    CACHE_BAD_TRUNCATED = 2,        /* the file shrank under the mapping */
    CACHE_BAD_INDEX = 3,            /* an index entry points outside the file (rewritten in place) */
};
/* CACHE_BAD_*, and the first bad sample's index in *ret_index (may be NULL) when not
 * NONE. Any thread. */
int cache_bad(const cache *c, uint64_t *ret_index);
/* cache_set_aside() of the file this cache has mapped, only if the path still names
 * that file (a newer build may have replaced it: then LD_ENOENT, nothing moved). */
int cache_set_aside_file(const cache *c, const char *reason, char *errbuf);

const struct cache_meta *cache_meta(const cache *c);
const char *cache_path(const cache *c);
/* Samples and bytes served by cache_sample() and cache_read() since open. */
void cache_hits(const cache *c, uint64_t *ret_samples, uint64_t *ret_bytes);

#endif
