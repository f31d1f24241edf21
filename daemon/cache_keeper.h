/* cache_keeper — one dataset's single-file cache while the daemon runs: is there a valid
 * one (checked against the source's fingerprint), build it when a stream first needs it
 * or when `loaderctl cache build` asks, attach it so workers read it instead of the
 * source, notice when the source changed, verify it on request.
 *
 * Everything slow (fingerprinting thousands of files, building, verifying) runs on the
 * keeper's own thread, one job at a time; results come back to the loop thread through
 * a uv_async handle. All functions here are called on the loop thread, but for
 * try_acquire and try_release, which a worker on a stream's direct path calls. */
#ifndef LD_CACHE_KEEPER_H
#define LD_CACHE_KEEPER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "dataset.h"

typedef struct cache_keeper cache_keeper;

/* Starts checking the cache of dataset d (cfg->cache_path set): sweeps temp files left
 * by dead builders, fingerprints the source and opens the cache if there is one; a
 * corrupt cache is set aside, a stale one left for a rebuild. In mode off it does
 * nothing but answer requests with what the config says. Sets d->keeper. */
int cache_keeper_new(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, cache_keeper **ret_keeper,
                     char *errbuf);
/* The same for a cache the daemon writes for a trainer's declared dataset
 * (declare_cache.h): the file `name` of directory dirfd (taken: closed by the keeper),
 * cfg->cache_path the path shown for it. Every open, build and rename goes through
 * dirfd, never through a symbolic link at `name`; before a build the files in dirfd
 * are kept within `quota` bytes (the oldest other caches removed, the build refused
 * when it cannot fit: state failed, the streams read the source). */
int cache_keeper_new_at(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, int dirfd, const char *name,
                        uint64_t quota, cache_keeper **ret_keeper, char *errbuf);
/* Whether a job (check, build, verify) runs now: it holds the dataset until it ends. */
bool cache_keeper_busy(const cache_keeper *k);
/* Cancels a running job, waits for the thread, closes the handle; on_closed runs (on
 * the loop) when the keeper's handle is closed. The caches it attached stay mapped until
 * cache_keeper_free. */
void cache_keeper_close(cache_keeper *k, void (*on_closed)(void *ctx), void *ctx);
/* After the loop has finished, every stream is freed and the workers are idle: unmaps
 * its caches, clears d->keeper, frees. */
void cache_keeper_free(cache_keeper *k);

/* A stream was opened on the dataset: in mode auto, build when there is no valid cache;
 * in mode rebuild, build once per daemon run; when a cache is attached, check that the
 * source has not changed since (and detach it, then rebuild, when it has); a failed
 * cache is checked (and built) again. Returns the stream's ticket for acquire. */
uint64_t cache_keeper_stream_opened(cache_keeper *k);
/* The cache one batch of the stream holding `ticket`, opened on dataset d, may read
 * (none when the cache was made for another scan of the folder), with a reference the
 * caller gives back with cache_keeper_release() when the batch's reads are done; NULL
 * (read the source) when none is attached or when no check has passed since that
 * stream opened. *ret_advise: the cache is much larger than memory (advise the batch's
 * pages). A cache a batch found corrupt or truncated (cache_bad) is set aside here,
 * detached and rebuilt. */
struct cache *cache_keeper_acquire(cache_keeper *k, const dataset *d, uint64_t ticket, bool *ret_advise);
/* Drops a reference from cache_keeper_acquire (c may be NULL); a replaced cache is
 * unmapped when its last reader is gone. */
void cache_keeper_release(cache_keeper *k, struct cache *c);
/* Any thread (a worker cutting a batch on a stream's direct path). The steady state of
 * acquire, without what only the loop may do: the same answer, but a cache found bad is
 * not dropped here: NULL (the batch reads the source) and *ret_bad set, and the caller
 * has the loop call cache_keeper_tend. */
struct cache *cache_keeper_try_acquire(cache_keeper *k, const dataset *d, uint64_t ticket, bool *ret_advise,
                                       bool *ret_bad);
/* Any thread: drops a reference (c may be NULL) and returns true, unless it is the last
 * one to a cache no longer attached, whose unmapping is the loop's: false, and nothing
 * was done (the caller has the loop call cache_keeper_release). */
bool cache_keeper_try_release(cache_keeper *k, struct cache *c);
/* A batch found the attached cache bad (try_acquire said so): sets it aside, detaches
 * it and rebuilds, as acquire does; nothing when it is not, or once the keeper is closed. */
void cache_keeper_tend(cache_keeper *k);
/* A rescan replaced the keeper's dataset (dataset_watch.h): jobs from now on fingerprint
 * and build d; caches made for the old one are given only to its streams, and the next
 * check finds the cache stale. Sets d->keeper. */
void cache_keeper_set_dataset(cache_keeper *k, dataset *d);
/* `loaderctl cache build [--force]`: starts a build (force: even over a valid cache, at
 * most once a minute: LD_EAGAIN with the time to wait). 0 when a build was started or
 * is already running; errbuf says why not otherwise (LD_ENOTSUP in mode off). */
int cache_keeper_build(cache_keeper *k, bool force, char *errbuf);
/* `loaderctl cache verify`: checks every sample's checksum on the keeper's thread and
 * calls done (on the loop) with 0, or the error and a message naming the first bad
 * sample (a corrupt cache is then detached, set aside and rebuilt). A check or build
 * that is running finishes first. LD_ENOENT when there is no cache, LD_EBUSY when a
 * verify is already under way: done is not called then. */
int cache_keeper_verify(cache_keeper *k, void (*done)(void *ctx, int rc, const char *message), void *ctx,
                        char *errbuf);
/* What the keeper is doing, for status, datasets and `loaderctl cache info`
 * (cache_report.c shows it as JSON). The strings and the file are the keeper's: valid
 * until the next call into it on the loop thread. */
struct cache_keeper_stats {
    const char *state;              /* "absent|checking|building|ready|stale|failed|off" */
    const char *path;               /* the cache file's path */
    const char *mode;               /* "off|auto|rebuild" */
    double progress;                /* a running build or verify: 0..1; else -1 */
    uint64_t hits, hit_bytes;       /* samples and bytes served from cache files this run */
    uint64_t attached;              /* caches attached this run */
    uint64_t mapped;                /* still mapped: the attached one and replaced ones still read */
    const char *error;              /* the last failure's message, or NULL */
    const struct cache *file;       /* the attached cache (state ready), or NULL */
};
void cache_keeper_stats(const cache_keeper *k, struct cache_keeper_stats *ret);

#endif
