/* dataset — what a sample is, for each kind of source.
 *
 * A dataset is opened once at daemon start from its config (the `files` kind scans its
 * directory, `token_windows` maps its token file) and is then shared, read-only, by
 * every stream and every worker. Each kind provides an ops table; callers never test
 * the kind. Kinds live in source_<kind>.c and export only their ops table.
 *
 * A sample has up to LD_MAX_FIELDS fields. A fixed field has the same shape for every
 * sample; a ragged field (e.g. files of varying sizes) has a per-sample byte length
 * that the stream asks for (item_bytes) when it lays out a batch, so workers can write
 * every sample straight to its final place in the slot. */
#ifndef LD_DATASET_H
#define LD_DATASET_H

#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ld_error.h"
#include "ld_wire.h"
#include "config.h"
#include "coldread.h"

struct dataset_field {
    char name[LD_NAME_MAX];
    int dtype;                      /* LD_DTYPE_* */
    int ndim;                       /* dims of one sample (0 for a scalar) */
    int64_t shape[LD_MAX_DIMS];
    bool ragged;                    /* then ndim == 0 and dtype is uint8 */
    uint64_t max_item_bytes;        /* ragged: the largest sample's byte length (slots are
                                     * sized by dataset_slot_item_bytes, which may be less) */
};

typedef struct dataset dataset;

/* What a read may depend on besides the sample: the stream's seed and the epoch, and
 * the cache the batch may read (NULL: read the source). The stream takes the cache
 * from the keeper for each batch (cache_keeper_acquire) and holds it until the batch's
 * reads are done, so it is never unmapped under a reader. */
struct dataset_read_ctx {
    uint64_t seed;
    uint64_t epoch;
    struct cache *cache;
    /* Where dataset_read's reads from `cache` count their hits (the caller adds them to
     * the cache with cache_count_tally once its run of reads is done); NULL: each read
     * adds its own, as the kinds that read the cache themselves (read_ctx) do. */
    struct cache_tally *tally;
};

/* How much of each sample a worker prefetches before it reads the sample from a mapping
 * (a cache, a `packed` file, a token corpus): all of a small sample, whose lines lie at
 * a random place in the file and would otherwise arrive a few at a time; the start of a
 * large one, whose later lines the hardware streams in once the copy reads in order. */
#define DATASET_PREFETCH_BYTES 4096u

struct dataset_ops {
    const char *kind;               /* "files", "token_windows" */
    /* Opens the source described by cfg (scan, map). Runs at daemon start on the main
     * thread; may block. On failure errbuf (LD_ERRMSG_MAX) names the dataset, the path
     * and the reason. */
    int (*open)(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf);
    /* Frees everything open() made. Accepts NULL. */
    void (*free)(dataset *d);
    /* Byte length of sample `index` in ragged field `field`, as the source has it (the
     * stream lays out with dataset_item_bytes, which accounts for replacement). Any
     * thread; must not block. */
    uint64_t (*item_bytes)(const dataset *d, uint64_t index, int field);
    /* Reads sample `index` and writes each field to dst[f] (for a fixed field, one row
     * of the field's row_bytes; for a ragged field, exactly item_bytes bytes). Called
     * concurrently from worker threads; may block on I/O. On failure returns LD_ESAMPLE
     * (or -errno) with errbuf naming the sample and the path. */
    int (*read)(const dataset *d, uint64_t index, void *const dst[], char *errbuf);
    /* Instead of read, for kinds whose samples depend on the stream (random
     * augmentation keyed by the stream's seed and the epoch): same contract, plus ctx.
     * A kind with read_ctx reads ctx->cache itself (dataset_read does not). */
    int (*read_ctx)(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                    char *errbuf);
    /* Optional, for kinds whose reads each cost a round trip (a database server): the
     * calling worker thread is about to read samples idx[0..n) (a chunk of a batch, in
     * this order; the caller owns idx until run_end). The kind may fetch them together
     * at the first read and serve the reads that follow on this thread from what it
     * fetched. Reads of other samples meanwhile (a substitute) are still served.
     * run_end(d), on the same thread, always follows. Neither reports errors: the
     * reads do. */
    void (*run_begin)(const dataset *d, const uint64_t *idx, size_t n);
    void (*run_end)(const dataset *d);
    /* Optional, for kinds that serve samples from a mapping: the calling worker is
     * about to read samples idx[0..n) (a batch's next rows, read from the source, not
     * from the dataset's cache, which the worker prefetches itself); the kind asks the
     * CPU to bring up to DATASET_PREFETCH_BYTES of each into its caches. A hint: it
     * never faults (a file cut short included) or blocks, skips indices out of range,
     * and reports nothing. Called concurrently from worker threads. */
    void (*prefetch)(const dataset *d, const uint64_t *idx, size_t n);
    /* The sample's name for messages (a relative path); optional. Any thread. */
    const char *(*sample_name)(const dataset *d, uint64_t index);

    /* The three members below serve the cache file (cache_build.c, cache_keeper.c). Each
     * is optional: a kind that leaves them NULL cannot be cached (cache_build answers
     * LD_ENOTSUP). */

    /* A 64-bit fingerprint of the source as it is on disk now, never 0. mode is a
     * DATASET_FINGERPRINT_*: STAT covers the list of samples (relative paths), their
     * sizes and modification times, so a file added, removed, resized or touched
     * changes it; CONTENT hashes every sample's bytes instead of the times, so only a
     * change of content (or of the list) changes it. The root's own path is not
     * covered: a moved or copied tree keeps its cache. Blocking (STAT: one stat per
     * sample; CONTENT: reads the whole source): call it from a thread that may block,
     * never the loop thread. Thread-safe. On failure errbuf names the dataset and the
     * file. */
    int (*fingerprint)(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf);
    /* The byte length of sample `index`'s raw bytes, which read_raw() returns: the
     * bytes of the first field, as the scan recorded them. Must not block. */
    uint64_t (*raw_bytes)(const dataset *d, uint64_t index);
    /* Reads sample `index`'s raw bytes (the first field: for `files`, the file's
     * content) into buf, which holds cap bytes (the caller owns it; LD_ERANGE when
     * raw_bytes() exceeds cap), and its label (the int64 field named "label", or -1
     * when the kind has none). Same threading and blocking as read(). ret_* are set
     * on success only; on failure errbuf names the sample and the path. */
    int (*read_raw)(const dataset *d, uint64_t index, void *buf, uint64_t cap,
                    uint64_t *ret_len, int64_t *ret_label, char *errbuf);
};

/* Modes of dataset_ops.fingerprint. */
enum dataset_fingerprint_mode {
    DATASET_FINGERPRINT_STAT = 0,
    DATASET_FINGERPRINT_CONTENT = 1,
};

/* The common part every kind embeds first. */
struct dataset {
    const struct dataset_ops *ops;
    char name[LD_NAME_MAX];
    char source[4096];              /* path shown by `loaderctl datasets` */
    uint64_t count;                 /* samples */
    uint64_t sample_overhead;       /* fixed cost of reading one sample (system calls), in
                                     * bytes of memcpy that take as long; cuts batches into chunks */
    int n_fields;
    struct dataset_field fields[LD_MAX_FIELDS];
    /* The keeper of this dataset's cache file, or NULL (no `cache:` section). Set by
     * cache_keeper_new(); used on the loop thread only (streams ask it which cache a
     * batch may read). */
    struct cache_keeper *keeper;
    /* Loop thread only (dataset_watch.h): holders (streams, cache jobs) and whether a
     * rescan replaced it; a retired dataset is freed by its last holder. */
    uint32_t holders;
    bool retired;
    /* The config the dataset was opened from when the dataset owns it (a dataset a
     * trainer declared, declare.h): freed with the dataset. NULL otherwise. */
    struct config *owned_config;
    /* Class names by label (files, image_folder: the first-level sub-folders, sorted);
     * owned by the kind. */
    char **class_names;
    size_t n_classes;
    /* Bad samples (dataset_read): the policy; how many distinct samples were found
     * unreadable and how many reads were served by a substitute; one bit per sample
     * found unreadable (it is logged once, and under replace never read again until
     * the daemon restarts). */
    int on_error;                   /* CONFIG_ON_ERROR_* */
    uint64_t max_sample_bytes;      /* ragged fields: larger samples are not served; 0: none */
    _Atomic uint64_t bad_samples, replaced_samples;
    _Atomic uint64_t *bad_seen;
    /* Replacements per epoch (any stream's), so that an epoch in which more than
     * warn_fraction of the samples were replaced is logged once, loudly: a few epochs
     * at once, for streams of one dataset at different epochs. */
    double warn_fraction;
    /* Scheduling (scheduler.h): each stream's weight and the cap on all its streams
     * together, from the config. */
    uint32_t weight;
    double max_share;
    pthread_mutex_t tally_lock;
    bool tally_ready;
    struct dataset_tally {
        uint64_t epoch, count;
        bool used, warned;
    } tally[4];
    /* Reads that met a shortage of descriptors or memory and were retried, and when the
     * last such retry was logged (they are logged at most every 10 s). */
    _Atomic uint64_t resource_retries;
    _Atomic uint64_t resource_logged_ns;
    /* The read deadline (dataset_deadline.c): a read older than read_timeout_ns (0: none)
     * is stalled, and while one is, reads of this dataset fail with LD_ETIMEDOUT. */
    uint64_t read_timeout_ns;
    _Atomic uint32_t stalled_reads;
    /* Read-ahead for samples not in the page cache (coldread.h), or NULL: a kind that
     * reads files makes it at open and reads through coldread_pread; its free hands
     * itself to coldread_release, which frees what the open callback uses only once
     * no read-ahead read is in flight. The stream hands it each batch's samples while
     * coldread_wanted says so. */
    coldread *ahead;
};

/* Reads sample `index` into dst[] like ops->read, from ctx->cache when there is one
 * (its field 0 bytes, checked against the sample's checksum, and its label), else
 * from the source; a cached sample that fails its check or cannot be read (the file
 * shrank) is read from the source instead, and the cache is marked bad for the keeper.
 * A sample that cannot be read (or, in a ragged field, is larger than
 * max_sample_bytes) is logged once and counted; under on_error: replace another sample
 * takes its place: the first of a sequence of candidates drawn from the index alone
 * that is not known to be bad (the same whatever the worker or timing); under fail, or
 * when no candidate of 64 can be read, the error names the file.
 *
 * lens[f] is the room the caller laid out for ragged field f (dataset_item_bytes at
 * layout time; NULL: dataset_item_bytes now). When the sample to serve has another
 * length, because it was found bad since, nothing is written and the answer is
 * LD_ESTALE: lay the batch out again, which then makes room for the substitute. Once
 * more than on_error_warn_fraction of the dataset has been replaced in ctx->epoch, a
 * warning with the count and an example says so (once per epoch). A
 * shortage of descriptors or memory (dataset_resource_error) and LD_EDATASET (the
 * source itself cannot be served, e.g. a mapped file shrank) are returned as they are
 * and never mark the sample bad. Worker threads. */
int dataset_read(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                 const uint64_t lens[], char *errbuf);
/* The bytes to lay out for sample `index` in ragged field `field`: those of the sample
 * that will be served in its place when it is known bad (on_error: replace), 0 when it
 * cannot be served at all (its read then fails). Loop thread; does not block. */
uint64_t dataset_item_bytes(const dataset *d, uint64_t index, int field);
/* The room one row of ragged field `field` may need: the largest sample, or
 * max_sample_bytes when that is smaller. A slot holds batch_size times this. */
uint64_t dataset_slot_item_bytes(const dataset *d, int field);
/* True for the codes that say the system is short of something (EMFILE, ENFILE,
 * ENOMEM, EAGAIN, ENOBUFS), not that a sample is bad: such a read is retried. */
bool dataset_resource_error(int rc);
/* Counts one retry after a resource shortage and logs `msg` (what failed), at most
 * once every 10 s per dataset. Any thread. */
void dataset_note_resource(const dataset *d, const char *msg);
/* The sample's name for messages ("class_003/0000042.jpg"), or "?" when the kind has none. */
const char *dataset_sample_name(const dataset *d, uint64_t index);
/* The index of the int64 field named "label", or -1. */
int dataset_label_field(const dataset *d);

/* The read deadline (dataset_deadline.c). dataset_open starts the watcher thread and
 * dataset_free stops it with the last dataset; dataset_read brackets every read with
 * begin (returns a token, 0 when the read cannot be watched) and end. */
int dataset_deadline_start(void);
void dataset_deadline_stop(void);
/* fn(ctx) runs on the watcher thread (under its lock: it must not block) whenever a
 * read is found stalled; NULL unregisters, and after that returns fn is not running. */
void dataset_deadline_notify(void (*fn)(void *ctx), void *ctx);
uint64_t dataset_deadline_begin(const dataset *d, uint64_t index);
void dataset_deadline_end(const dataset *d, uint64_t token);
/* True when rc says a sample is bad (LD_ESAMPLE and the like); false for a shortage
 * (dataset_resource_error), a stalled storage (LD_ETIMEDOUT) or a source that cannot be
 * served (LD_EDATASET), which keep their code. */
bool dataset_sample_error(int rc);

/* Opens a dataset of any kind from its config. */
int dataset_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf);
void dataset_free(dataset *d);
/* Datasets in memory: the served ones and those a rescan or a reload replaced that
 * streams still read (`status` shows it as datasets_in_memory). */
uint32_t dataset_live_count(void);
const char *dataset_kind(const dataset *d);
/* Bytes of one row of a fixed field (product of shape times dtype size). */
uint64_t dataset_row_bytes(const dataset *d, int field);

extern const struct dataset_ops source_files_ops;
extern const struct dataset_ops source_manifest_ops;   /* files with a manifest */
extern const struct dataset_ops source_tokens_ops;
extern const struct dataset_ops source_packed_ops;
extern const struct dataset_ops source_images_ops;
extern const struct dataset_ops source_sql_ops;
extern const struct dataset_ops source_tar_ops;
extern const struct dataset_ops source_s3_ops;      /* files at an s3:// location */

struct s3_options;
/* A dataset's `s3:` keys as the options of its store's client (source_s3.c); for the
 * files and tar_shards kinds at an s3:// location. */
void source_s3_options(const struct config_dataset *cfg, struct s3_options *ret_opt);

#endif
