/* coldread — reading a dataset's samples ahead of the workers when they are not in
 * the page cache.
 *
 * Warm, a worker's open + pread of a 3 KiB file costs about 3 us and nothing should be
 * added to it; cold, each read waits a disk round trip and the workers leave the
 * device idle. So a dataset first finds out which case it is in: the workers read with
 * preadv2(RWF_NOWAIT) first (the same cost when the data is cached; EAGAIN, then a
 * plain pread, when it is not) and count the misses. When at least one read in
 * COLDREAD_COLD_DIV of the last COLDREAD_SAMPLE_READS missed, read-ahead turns on:
 * each batch's samples, as the stream starts to fill it, are handed to the daemon's
 * ioqueue (ioqueue.h, one for all datasets), whose threads open them and start their
 * reads into the page cache without waiting for the disk, so that the data of the
 * batches being filled is in flight at once, while the workers read them from
 * there (waiting only for what is still on its way). The read-ahead threads count the
 * misses (the workers mostly find what was read for them), and when their reads find
 * the data cached again, read-ahead turns off. Read-ahead is a hint: its failures
 * (a file that vanished or shrank) are ignored, and the worker's own read reports them
 * as it always did.
 *
 * Read once: a kind that gives a `same` callback has each small sample read whole by
 * the I/O thread into a buffer of its own (io_uring, a group of reads per submission,
 * waited for together), and the worker takes that buffer (coldread_take) instead of
 * opening, reading and closing the file a second time from the page cache. The buffers
 * are bounded (COLDREAD_ONCE_BUDGET bytes per dataset, files up to
 * COLDREAD_ONCE_MAX_FILE); past that the sample is only read ahead as above. A buffer
 * goes to the worker that takes it, to coldread_forget when the stream that asked for
 * it closes, or to coldread_free. Only a read that brought in the whole recorded size
 * is kept, so every failure is the worker's own read's to report, with the same words;
 * and before a buffer is used, `same` checks that the file at the sample's path is
 * still the one read (inode, size, change time: a file replaced, removed, cut short,
 * rewritten or turned into a link since), otherwise the worker reads it as without
 * read-ahead. */
#ifndef LD_COLDREAD_H
#define LD_COLDREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ioqueue.h"

/* Reads between two decisions, and the share of misses that means "cold" (1 in 8). */
#define COLDREAD_SAMPLE_READS 32u
#define COLDREAD_COLD_DIV 8u

/* Read once: the bytes kept in buffers per dataset, and the largest file kept. */
#define COLDREAD_ONCE_BUDGET (64u << 20)
#define COLDREAD_ONCE_MAX_FILE (1u << 20)

/* What identifies the file a buffer was read from: a change to the file (written, cut,
 * renamed over, removed, linked) changes its inode number or its change time. */
struct coldread_stamp {
    uint64_t dev, ino, size;
    int64_t ctime_sec, ctime_nsec;
};
struct stat;
void coldread_stamp_of(const struct stat *st, struct coldread_stamp *ret_stamp);

/* Opens sample `index` for reading (blocking) and says how many bytes to bring in and
 * the file's stamp (from the open descriptor's fstat); 0 or a negative code (the sample
 * is then skipped). Called on the I/O threads, concurrently. */
typedef int (*coldread_open_fn)(const void *ctx, uint64_t index, int *ret_fd, uint64_t *ret_bytes,
                                struct coldread_stamp *ret_stamp);
/* Whether sample `index` is still the file `then` was taken from (it must not block
 * long: a stat by path). Called on the workers, in coldread_take. */
typedef bool (*coldread_same_fn)(const void *ctx, uint64_t index, const struct coldread_stamp *then);

typedef struct coldread coldread;

struct coldread_stats {
    bool on;                        /* samples are read ahead now */
    uint64_t samples;               /* read ahead, in all */
    uint64_t misses;                /* of those, not in the page cache when read ahead */
    uint64_t failed;                /* could not be opened or read (the workers report why) */
    uint64_t pending;               /* queued or in flight now */
    uint64_t entries;               /* read once: samples in the table now (queued, in flight or read) */
    uint64_t taken;                 /* read once: buffers the workers used instead of a read */
    uint64_t changed;               /* read once: buffers dropped, the file having changed since */
    uint64_t held_bytes;            /* read once: bytes in buffers now */
    unsigned threads;               /* the daemon's I/O threads (shared by all datasets) */
};

/* threads: I/O threads wanted when cold (0: IOQUEUE_DEFAULT_THREADS); the daemon's
 * read-ahead shares one set of them, as many as the largest number asked for by a
 * coldread made while the set existed. open(ctx, ...) opens a sample; same (NULL: no
 * read once, only read-ahead) checks a buffer before a worker uses it. No thread starts
 * until read-ahead first turns on. LD_ENOMEM. Any thread but an I/O thread. */
int coldread_new(unsigned threads, coldread_open_fn open, coldread_same_fn same, const void *ctx,
                 coldread **ret_ra);
/* Cancels what is queued, waits for the opens in flight (the last coldread also stops
 * the I/O threads) and frees every buffer; after it the open callback is never called
 * again. No worker may be in coldread_take. Accepts NULL. */
void coldread_free(coldread *ra);
/* The same without waiting, for the loop thread (a read of a hung file system may not
 * return for a long time): what is queued is dropped; when no read is in flight, ra is
 * freed and done(arg) runs before this returns; otherwise a detached thread waits for
 * the reads, frees ra, then runs done(arg), so what the open callback uses (arg: the
 * dataset) stays valid until then. ra may be NULL (done runs at once). */
void coldread_release(coldread *ra, void (*done)(void *arg), void *arg);

/* The worker's read: like pread, restarted after EINTR, but tries RWF_NOWAIT first
 * and counts whether the data was cached (while read-ahead is off: then the workers
 * are the first to touch it). Returns bytes read (0 at end of file) or -1 with errno
 * set, as pread does. ra may be NULL (a plain pread). Any thread. */
ssize_t coldread_pread(coldread *ra, int fd, void *buf, size_t len, off_t off);

/* Decides, from the reads counted since the last call, whether samples are read ahead
 * now; true when they are. Any thread (the loop, a worker on a stream's direct path);
 * does not block. */
bool coldread_wanted(coldread *ra);
/* Queues samples idx[0..n) for read-ahead (copied: the caller keeps idx) on behalf of
 * `owner` (a stream: coldread_forget drops what is left of its buffers). Does not
 * block on I/O. LD_ENOMEM when the job or the threads cannot be had: nothing is read
 * ahead and the workers read as usual. Any thread but an I/O thread (the loop, a worker
 * on a stream's direct path). */
int coldread_submit(coldread *ra, const void *owner, const uint64_t *idx, size_t n);
/* Read once: when the read-ahead holds sample `index`'s bytes (`bytes` of them, as
 * recorded) and `same` says the file has not changed since, copies them to dst, frees
 * the buffer and returns true; a read of it still in flight is waited for. Otherwise
 * false: the caller reads the sample itself (a sample queued but not started is taken
 * off the I/O threads' hands, so it is not read twice). Cheap when nothing is held (an
 * atomic load). ra may be NULL. Workers, concurrently. */
bool coldread_take(coldread *ra, uint64_t index, void *dst, uint64_t bytes);
/* Frees the buffers held for `owner` and makes those of its samples still queued or in
 * flight go as soon as their reads are back; its samples are never handed to a worker
 * after this. Does not block on I/O. ra may be NULL. Loop thread. */
void coldread_forget(coldread *ra, const void *owner);
void coldread_get_stats(coldread *ra, struct coldread_stats *ret_stats);

#endif
