/* tar_index — the member index of a `tar_shards` dataset's shards, and the file that
 * keeps it between daemon runs.
 *
 * Scanning a shard reads every header (tar.h): for a thousand shards of ten thousand
 * members, ten million small reads. The index keeps what the scan found, per shard:
 * each regular member's name, data offset and size, and the bytes of the small members
 * (up to TAR_INDEX_INLINE: the `.cls` labels, so that labels are known without a read).
 * It is saved next to the dataset's cache (`<cache.path>.tarindex`) and a shard's part
 * is reused only while the shard has the size and modification time it had when it was
 * scanned; a changed shard is scanned again, alone.
 *
 * The file: "LDTARIX1", a u32 version (TAR_INDEX_VERSION) and a u32 count of shards;
 * per shard its name (u32 length + bytes), size (u64), mtime (i64 s, i64 ns), member
 * count (u64) and per member offset, size (u64 each), name (u32 length + bytes) and,
 * when size <= TAR_INDEX_INLINE, its bytes; then the XXH3-64 of all that (u64). Host
 * byte order: the file is a cache of this machine. Anything that does not check out is
 * ignored (the shards are scanned), never trusted. */
#ifndef LD_TAR_INDEX_H
#define LD_TAR_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define TAR_INDEX_VERSION 1u
#define TAR_INDEX_INLINE 32u
#define TAR_INDEX_NONE UINT32_MAX

struct tar_entry {
    uint64_t offset, size;          /* the member's data in the shard */
    uint32_t name_off;              /* its NUL-terminated name in the shard's pool */
    uint32_t data_off;              /* its bytes in the pool when size <= TAR_INDEX_INLINE, else TAR_INDEX_NONE */
};

struct tar_shard_index {
    char *name;                     /* relative to the dataset's directory */
    uint64_t size;                  /* as scanned */
    struct timespec mtime;
    struct tar_entry *entries;
    size_t n_entries, cap_entries;
    char *pool;                     /* names and inline bytes */
    size_t pool_len, pool_cap;
};

/* Scans the shard open at fd (size bytes) into s (whose name, size and mtime the caller
 * sets). Blocking. LD_EDATASET with "offset N: what" in errbuf for a bad archive. */
int tar_index_scan(int fd, uint64_t size, struct tar_shard_index *s, char *errbuf);
/* Reads an index file: the shards it holds (*ret_n of them), or 0 shards when the file
 * is absent, of another version or corrupt (why: in errbuf, for a debug line). Returns
 * 0, or LD_ENOMEM. */
int tar_index_load(const char *path, struct tar_shard_index **ret_shards, size_t *ret_n, char *errbuf);
/* Writes the index of n shards to path (a temporary name, then a rename). */
int tar_index_save(const char *path, const struct tar_shard_index *shards, size_t n, char *errbuf);
/* Frees what a shard's index holds (not s itself); accepts a zeroed one. */
void tar_shard_index_clear(struct tar_shard_index *s);
/* Frees an array of n shard indexes. */
void tar_index_free(struct tar_shard_index *shards, size_t n);

#endif
