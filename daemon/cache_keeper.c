/* cache_keeper — the life of one dataset's cache inside the daemon.
 *
 *   checking ──▶ ready (attached: batches may read the cache)
 *      │            │ a stream opens and the fingerprint moved ─▶ stale ─▶ building
 *      ├──▶ absent ──┴─ a stream opens (auto), or cache build ──────────▶ building
 *      ├──▶ stale (built from another state of the source) ─────────────▶ building
 *      └──▶ failed (unreadable directory, ...): served from the source; checked again
 *                   (and built again) when the next stream opens
 *   building ──▶ ready, or failed
 *   off (cache.mode: off): nothing is checked, built or served
 *
 * A job (check, build, verify) runs on the keeper's thread; the loop thread starts it,
 * and learns its result through `done`, a uv_async handle. Between the two, the thread
 * owns `job` and the loop owns the rest; progress is an atomic the loop may read.
 *
 * Never a stale byte. Every stream gets a ticket when it opens (cache_keeper_stream_opened),
 * and a check or build records the last ticket issued when it starts: its fingerprint
 * is taken after that, so a cache it finds matching matches the source as every one of
 * those streams found it. `valid_for` is the last ticket the attached cache has been
 * proven for; a stream with a later ticket reads the source until a check started after
 * its open has passed (one is started whenever a stream opens, or right after the job
 * that was running then). So a stream opened after a change never reads a byte of a
 * cache built before it.
 *
 * Reclamation. The stream takes the cache for one batch at a time (acquire when the
 * batch is cut into chunks, release when its last chunk is back), so every cache has an
 * exact count of the batches reading it; a job that uses a cache holds a reference too.
 * A cache that is no longer attached (replaced, stale, corrupt) is unmapped as soon as
 * that count is 0: the number of caches a run may attach is unbounded, and superseded
 * files are not kept on disk by our mappings.
 *
 * Workers. A stream on the direct path (stream_direct.c) cuts and finishes batches on
 * a worker, which takes and gives back references with try_acquire and try_release.
 * `refs_lock` makes that safe: the counts, the list of held caches, `current` and
 * `valid_for` change only under it (always on the loop, but for the counts), and a
 * worker reads them only under it. What a worker may not do is the loop's, and the
 * worker leaves it undone: a cache found bad is dropped by cache_keeper_tend (the
 * worker's batch reads the source meanwhile), and the last reference to a cache no
 * longer attached is given back on the loop (try_release refuses it), so a cache is
 * unmapped by the loop alone, once no batch can read it. Lock order: a stream's lock,
 * then this one; nothing here calls out while holding it.
 *
 * A trainer's declared cache (cache_keeper_new_at) lives in a directory the daemon
 * opened once: every file of it is reached through that descriptor (/proc/self/fd/N/NAME
 * for the build, openat with O_NOFOLLOW for the open), so no rename or link in the path
 * above it changes which file is read or written; its user's caches there are kept
 * within a quota, the oldest others removed to make room for a build. The builds in one
 * such directory take turns (cache_quota_lock, from the quota check to the rename):
 * the quota then counts every byte reserved, and the keepers of one spec opened many
 * times at once (a keeper per open, one open per rank) build it once, the others
 * finding it written when their turn comes. */
#include "cache_keeper_internal.h"

#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "cache_quota.h"
#include "dataset_watch.h"
#include "ld_format.h"
#include "log.h"

static const char *const state_names[] = {"checking", "absent", "building", "ready", "stale", "failed", "off"};

/* `cache build --force` over a valid cache at most this often: any client may ask,
 * and each forced build rereads the whole source. */
#define FORCE_INTERVAL_NS (60ull * 1000000000ull)

/* ---- references ----------------------------------------------------------------------- */

/* Under refs_lock: takes a superseded cache nobody reads off the list. */
static struct held *held_unlink(cache_keeper *k, struct held *h)
{
    struct held **pp = &k->held;
    while (*pp != h)
        pp = &(*pp)->next;
    *pp = h->next;
    return h;
}

/* The loop thread, after held_unlink and outside refs_lock: unmapping a large cache
 * takes a while, and workers of every stream on the dataset take that lock. */
static void held_unmap(cache_keeper *k, struct held *h)
{
    if (!h)
        return;
    uint64_t hits, bytes;
    cache_hits(h->c, &hits, &bytes);
    k->freed_hits += hits;
    k->freed_hit_bytes += bytes;
    k->freed++;
    ld_log(LD_LOG_DEBUG, "dataset '%s': unmapped a superseded cache (%" PRIu64 " so far)", k->d->name, k->freed);
    cache_free(h->c);
    free(h);
}

/* The loop thread. */
static void held_unref(cache_keeper *k, struct held *h)
{
    if (!h)
        return;
    struct held *gone = NULL;
    pthread_mutex_lock(&k->refs_lock);
    ld_require(h->refs > 0); /* else more releases than acquires */
    if (--h->refs == 0 && h != k->current)
        gone = held_unlink(k, h);
    pthread_mutex_unlock(&k->refs_lock);
    held_unmap(k, gone);
}

/* Under refs_lock, or on the loop thread. */
static struct held *held_of(cache_keeper *k, const cache *c)
{
    for (struct held *h = k->held; h; h = h->next)
        if (h->c == c)
            return h;
    return NULL;
}

/* ---- the loop thread ---------------------------------------------------------------- */

static int start_job(cache_keeper *k, enum job_kind kind, bool force)
{
    if (k->thread_live)
        return LD_EBUSY;
    memset(&k->job, 0, sizeof k->job);
    k->job.kind = kind;
    k->job.force = force;
    k->job.ticket = k->tickets;
    k->job.d = k->d;
    if (kind != JOB_BUILD && k->current) {
        k->job.uses = k->current;
        pthread_mutex_lock(&k->refs_lock);
        k->current->refs++;
        pthread_mutex_unlock(&k->refs_lock);
    }
    atomic_store(&k->progress_done, 0);
    atomic_store(&k->progress_total, 0);
    int e = pthread_create(&k->thread, NULL, cache_keeper_thread, k);
    if (e != 0) {
        held_unref(k, k->job.uses);
        k->job.uses = NULL;
        k->job.d = NULL;
        snprintf(k->error, sizeof k->error, "cannot start the cache thread: %s", strerror(e));
        return ld_from_errno(e);
    }
    k->thread_live = true;
    dataset_hold(k->job.d);
    if (kind == JOB_BUILD) {
        k->state = K_BUILDING;
        if (force)
            k->last_force_ns = uv_hrtime();
        ld_log(LD_LOG_INFO, "dataset '%s': building the cache %s", k->d->name, k->path);
    } else if (kind == JOB_CHECK && k->state != K_READY) {
        k->state = K_CHECKING;
    }
    return 0;
}

/* Makes c the cache batches read, proven for tickets up to `ticket`, for the streams
 * of dataset d. */
static void attach(cache_keeper *k, cache *c, uint64_t ticket, const dataset *d)
{
    struct held *h = calloc(1, sizeof *h);
    if (!h) {
        /* Serving from the source is always right; only the speed-up is lost. */
        cache_free(c);
        k->state = K_FAILED;
        snprintf(k->error, sizeof k->error, "out of memory attaching the cache");
        return;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    h->c = c;
    h->d = d;
    h->advise = ram && cache_meta(c)->file_size > ram / 2;
    pthread_mutex_lock(&k->refs_lock);
    h->next = k->held;
    k->held = h;
    k->current = h;
    k->valid_for = ticket;
    pthread_mutex_unlock(&k->refs_lock);
    k->attached++;
    k->state = K_READY;
    k->error[0] = '\0';
}

static void detach(cache_keeper *k)
{
    struct held *gone = NULL;
    pthread_mutex_lock(&k->refs_lock);
    struct held *h = k->current;
    k->current = NULL;
    if (h && h->refs == 0)
        gone = held_unlink(k, h);
    pthread_mutex_unlock(&k->refs_lock);
    held_unmap(k, gone);
}

static int start_verify(cache_keeper *k, void (*done)(void *ctx, int rc, const char *message), void *ctx);

/* Starts what waits for the thread: a verify, a build, or a check that streams opened
 * since the last one need before they may read the cache. */
static void maybe_pending(cache_keeper *k)
{
    if (k->thread_live || k->state == K_OFF)
        return;
    if (k->pending_verify) {
        void (*done)(void *, int, const char *) = k->pending_verify;
        void *ctx = k->pending_verify_ctx;
        k->pending_verify = NULL;
        char err[LD_ERRMSG_MAX];
        if (!k->current) {
            ld_errorf(err, "dataset '%s' has no cache to verify (state: %s)", k->d->name, state_names[k->state]);
            done(ctx, LD_ENOENT, err);
        } else if (start_verify(k, done, ctx) < 0) {
            done(ctx, LD_EAGAIN, k->error);
        }
        return;
    }
    if (k->pending_build) {
        bool force = k->pending_force;
        k->pending_build = k->pending_force = false;
        if (force || k->state != K_READY) {
            start_job(k, JOB_BUILD, force);
            return;
        }
    }
    if (k->pending_check || (k->current && k->valid_for < k->tickets)) {
        k->pending_check = false;
        start_job(k, JOB_CHECK, false);
    }
}

/* A batch found the attached cache corrupt or cut short: never serve it again. */
static void drop_bad(cache_keeper *k, int why, uint64_t index)
{
    char reason[LD_ERRMSG_MAX], aside[LD_ERRMSG_MAX];
    snprintf(reason, sizeof reason, "sample %" PRIu64 ": %s (found while serving)", index,
             why == CACHE_BAD_CHECKSUM ? "checksum mismatch (data corrupt)"
             : why == CACHE_BAD_INDEX  ? "its index entry lies outside the file (changed in place)"
                                       : "the file was truncated");
    int r = cache_set_aside_file(k->current->c, reason, aside);
    ld_log(LD_LOG_WARN, "dataset '%s': cache %s: %s; %s, serving from the source%s", k->d->name, k->path, reason,
           r == 0 ? "set aside as .bad" : "not set aside", k->mode != CONFIG_CACHE_OFF ? " and rebuilding it" : "");
    if (r < 0 && r != LD_ENOENT)
        ld_log(LD_LOG_WARN, "dataset '%s': %s", k->d->name, aside);
    detach(k);
    k->state = K_ABSENT;
    snprintf(k->error, sizeof k->error, "%s", reason);
    k->pending_build = true;
    maybe_pending(k);
}

/* A declared cache's messages name the file as shown, not as opened (/proc/self/fd/N). */
static void keeper_shown(const cache_keeper *k, char *msg)
{
    size_t olen = strlen(k->io_path);
    if (k->io_path == k->path || !olen)
        return;
    char out[LD_ERRMSG_MAX];
    size_t n = 0;
    for (const char *p = msg; *p && n + 1 < sizeof out;) {
        if (strncmp(p, k->io_path, olen) == 0) {
            int w = snprintf(out + n, sizeof out - n, "%s", k->path);
            n = w < 0 || (size_t)w >= sizeof out - n ? sizeof out - 1 : n + (size_t)w;
            p += olen;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    snprintf(msg, LD_ERRMSG_MAX, "%s", out);
}

static void on_done(uv_async_t *a)
{
    cache_keeper *k = a->data;
    if (!k->thread_live)
        return;
    pthread_join(k->thread, NULL);
    k->thread_live = false;
    keeper_shown(k, k->job.msg);
    struct held *used = k->job.uses;
    dataset *job_d = k->job.d;
    k->job.uses = NULL;
    k->job.d = NULL;
    const char *name = k->d->name;
    switch (k->job.kind) {
    case JOB_CHECK:
        if (k->job.rc == 0 && k->job.opened) {
            if (k->current)
                detach(k); /* the source moved on and a matching cache was found */
            attach(k, k->job.opened, k->job.ticket, job_d);
            ld_log(LD_LOG_INFO, "dataset '%s': serving from the cache %s", name, k->path);
        } else if (k->job.rc == 0) {
            /* Fingerprint unchanged: proven for every stream opened before the check. */
            if (k->current && k->current == used && k->job.ticket > k->valid_for) {
                pthread_mutex_lock(&k->refs_lock);
                k->valid_for = k->job.ticket;
                pthread_mutex_unlock(&k->refs_lock);
            }
        } else if (k->job.rc == LD_ENOENT) {
            if (k->current) {
                detach(k);
                ld_log(LD_LOG_WARN, "dataset '%s': the source changed and %s is gone; serving from the source",
                       name, k->path);
            }
            k->state = K_ABSENT;
        } else if (k->job.set_aside || k->job.stale) {
            if (k->current) {
                detach(k);
                ld_log(LD_LOG_WARN, "dataset '%s': the source changed since the cache was built; serving "
                                    "from the source", name);
            }
            ld_log(LD_LOG_WARN, "dataset '%s': %s%s", name, k->job.msg,
                   k->job.set_aside ? " (set aside as .bad; it will be rebuilt)" : "; it will be rebuilt");
            k->state = k->job.set_aside ? K_ABSENT : K_STALE;
            snprintf(k->error, sizeof k->error, "%s", k->job.msg);
            if (k->mode == CONFIG_CACHE_AUTO && k->attached > 0)
                k->pending_build = true; /* it was in use: rebuild right away */
        } else {
            if (k->current)
                detach(k); /* cannot tell whether it still matches the source */
            k->state = K_FAILED;
            snprintf(k->error, sizeof k->error, "%s", k->job.msg);
            ld_log(LD_LOG_WARN, "dataset '%s': cache check failed: %s; serving from the source", name, k->job.msg);
        }
        break;
    case JOB_BUILD:
        if (k->job.rc == 0) {
            if (k->current)
                detach(k);
            attach(k, k->job.opened, k->job.ticket, job_d);
            if (k->current) {
                char size[LD_FORMAT_BYTES_MAX];
                ld_format_bytes(cache_meta(k->current->c)->file_size, size, sizeof size);
                if (k->job.reused)
                    ld_log(LD_LOG_INFO, "dataset '%s': the cache %s was built meanwhile for the same spec (%" PRIu64
                           " samples, %s); serving from it, not building it again", name, k->path,
                           cache_meta(k->current->c)->count, size);
                else
                    ld_log(LD_LOG_INFO, "dataset '%s': cache built (%" PRIu64 " samples, %s); serving from it",
                           name, cache_meta(k->current->c)->count, size);
            }
        } else if (k->job.rc == LD_ECANCELED) {
            k->state = k->current ? K_READY : K_ABSENT;
        } else {
            k->state = k->current ? K_READY : K_FAILED;
            snprintf(k->error, sizeof k->error, "%s", k->job.msg);
            ld_log(LD_LOG_WARN, "dataset '%s': cache build failed: %s; serving from the source", name, k->job.msg);
        }
        break;
    case JOB_VERIFY:
        if (k->job.rc == LD_ECACHE && used) {
            /* Never serve it again: detach, set aside, rebuild. */
            ld_log(LD_LOG_WARN, "dataset '%s': %s", name, k->job.msg);
            char aside[LD_ERRMSG_MAX];
            int r = cache_set_aside_file(used->c, k->job.msg, aside);
            if (r < 0 && r != LD_ENOENT)
                ld_log(LD_LOG_WARN, "dataset '%s': %s", name, aside);
            if (k->current == used) {
                detach(k);
                k->state = K_ABSENT;
                snprintf(k->error, sizeof k->error, "%s", k->job.msg);
                k->pending_build = true;
            }
        }
        if (k->job.verify_done)
            k->job.verify_done(k->job.verify_ctx, k->job.rc, k->job.msg);
        break;
    case JOB_NONE:
        break;
    }
    if (job_d != k->d && k->state != K_OFF) {
        /* The folder was scanned again while the job ran: what it found or built
         * concerns the old list (kept for that list's streams). The new list needs its
         * own check, and in mode auto its own cache. */
        k->pending_check = true;
        if (k->mode == CONFIG_CACHE_AUTO)
            k->pending_build = true;
    }
    held_unref(k, used);
    dataset_release(job_d);
    maybe_pending(k);
}

static void keeper_free_names(cache_keeper *k)
{
    if (k->io_path != k->path)
        free(k->io_path);
    free(k->path);
    free(k->name);
    if (k->dirfd >= 0)
        close(k->dirfd);
}

static int keeper_new(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, int dirfd, const char *name,
                      uint64_t quota, cache_keeper **ret_keeper, char *errbuf)
{
    if (!d->ops->fingerprint || !d->ops->read_raw) {
        ld_errorf(errbuf, "dataset '%s': kind '%s' cannot be cached", d->name, dataset_kind(d));
        if (dirfd >= 0)
            close(dirfd);
        return LD_ENOTSUP;
    }
    cache_keeper *k = calloc(1, sizeof *k);
    if (k) {
        k->dirfd = dirfd;
        k->quota = quota;
        k->path = strdup(cfg->cache_path);
        k->io_path = k->path;
        if (dirfd >= 0) {
            k->name = strdup(name);
            if (asprintf(&k->io_path, "/proc/self/fd/%d/%s", dirfd, name) < 0)
                k->io_path = NULL;
        }
    } else if (dirfd >= 0) {
        close(dirfd);
    }
    if (!k || !k->path || !k->io_path || (dirfd >= 0 && !k->name)) {
        if (k)
            keeper_free_names(k);
        free(k);
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    k->d = d;
    k->mode = cfg->cache_mode;
    k->fp_mode = cfg->cache_fingerprint;
    int rc = uv_async_init(loop, &k->done, on_done);
    if (rc < 0) {
        ld_errorf(errbuf, "dataset '%s': %s", d->name, uv_strerror(rc));
        keeper_free_names(k);
        free(k);
        return rc;
    }
    pthread_mutex_init(&k->refs_lock, NULL);
    k->done.data = k;
    d->keeper = k;
    if (k->mode == CONFIG_CACHE_OFF) {
        /* Kept only to answer `loaderctl cache ...` with what the config says. */
        k->state = K_OFF;
        *ret_keeper = k;
        return 0;
    }
    /* Temporary files of builders that died (a crash, a kill -9) are never a cache. */
    char *dup = strdup(k->io_path), err[LD_ERRMSG_MAX];
    if (dup) {
        int n = cache_sweep_temps(dirname(dup), err);
        if (n > 0)
            ld_log(LD_LOG_INFO, "dataset '%s': removed %d temporary cache files of dead builders", d->name, n);
        free(dup);
    }
    start_job(k, JOB_CHECK, false);
    *ret_keeper = k;
    return 0;
}

int cache_keeper_new(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, cache_keeper **ret_keeper,
                     char *errbuf)
{
    return keeper_new(loop, d, cfg, -1, NULL, 0, ret_keeper, errbuf);
}

int cache_keeper_new_at(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, int dirfd, const char *name,
                        uint64_t quota, cache_keeper **ret_keeper, char *errbuf)
{
    return keeper_new(loop, d, cfg, dirfd, name, quota, ret_keeper, errbuf);
}

bool cache_keeper_busy(const cache_keeper *k)
{
    return k->thread_live;
}

static void keeper_closed(uv_handle_t *h)
{
    cache_keeper *k = h->data;
    if (k->on_closed)
        k->on_closed(k->closed_ctx);
}

void cache_keeper_close(cache_keeper *k, void (*on_closed)(void *ctx), void *ctx)
{
    atomic_store(&k->cancel, 1);
    if (k->thread_live) {
        pthread_join(k->thread, NULL); /* a build stops between two samples */
        k->thread_live = false;
        cache_free(k->job.opened);
        k->job.opened = NULL;
        held_unref(k, k->job.uses);
        k->job.uses = NULL;
        dataset_release(k->job.d);
        k->job.d = NULL;
        if (k->job.kind == JOB_VERIFY && k->job.verify_done)
            k->job.verify_done(k->job.verify_ctx, LD_ECLOSED, "the daemon is stopping");
    }
    if (k->pending_verify) {
        void (*done)(void *, int, const char *) = k->pending_verify;
        k->pending_verify = NULL;
        done(k->pending_verify_ctx, LD_ECLOSED, "the daemon is stopping");
    }
    k->pending_build = false;
    k->state = K_OFF; /* nothing more starts */
    k->on_closed = on_closed;
    k->closed_ctx = ctx;
    uv_close((uv_handle_t *)&k->done, keeper_closed);
}

void cache_keeper_free(cache_keeper *k)
{
    if (!k)
        return;
    if (k->d->keeper == k)
        k->d->keeper = NULL;
    while (k->held) {
        struct held *h = k->held;
        k->held = h->next;
        cache_free(h->c);
        free(h);
    }
    pthread_mutex_destroy(&k->refs_lock);
    keeper_free_names(k);
    free(k);
}

uint64_t cache_keeper_stream_opened(cache_keeper *k)
{
    uint64_t ticket = ++k->tickets;
    if (k->state == K_OFF)
        return ticket;
    if (k->mode == CONFIG_CACHE_REBUILD && !k->rebuilt_once) {
        k->rebuilt_once = true;
        k->pending_build = true;
        k->pending_force = true;
    } else if (k->state == K_FAILED) {
        /* Whatever failed (an unreadable file, a full disk) may be fixed by now. */
        if (k->mode == CONFIG_CACHE_AUTO)
            k->pending_build = true; /* a valid cache, if the check finds one, is kept */
        if (!k->thread_live) {
            start_job(k, JOB_CHECK, false);
            return ticket;
        }
    } else if (k->mode == CONFIG_CACHE_AUTO &&
               (k->state == K_ABSENT || k->state == K_STALE || k->state == K_CHECKING)) {
        /* While the start-up check runs, the build waits for its verdict: it starts
         * only if the check finds no valid cache (maybe_pending). */
        k->pending_build = true;
    }
    /* With a cache attached, maybe_pending starts the check this stream needs. */
    maybe_pending(k);
    return ticket;
}

/* Under refs_lock: a reference to the attached cache for a batch of the stream holding
 * `ticket` on d, or NULL; *ret_bad: the attached cache was found bad (nothing taken). */
static cache *keeper_take(cache_keeper *k, const dataset *d, uint64_t ticket, bool *ret_advise, bool *ret_bad)
{
    struct held *h = k->current;
    *ret_bad = false;
    if (!h)
        return NULL;
    if (cache_bad(h->c, NULL) != CACHE_BAD_NONE) {
        *ret_bad = true;
        return NULL;
    }
    if (ticket > k->valid_for)
        return NULL; /* opened after the last proof: the source until a check passes */
    if (h->d != d)
        return NULL; /* made for another scan of the folder: other sample indices */
    h->refs++;
    if (ret_advise)
        *ret_advise = h->advise;
    return h->c;
}

cache *cache_keeper_acquire(cache_keeper *k, const dataset *d, uint64_t ticket, bool *ret_advise)
{
    bool bad;
    pthread_mutex_lock(&k->refs_lock);
    cache *c = keeper_take(k, d, ticket, ret_advise, &bad);
    pthread_mutex_unlock(&k->refs_lock);
    if (bad)
        cache_keeper_tend(k);
    return c;
}

cache *cache_keeper_try_acquire(cache_keeper *k, const dataset *d, uint64_t ticket, bool *ret_advise,
                                bool *ret_bad)
{
    pthread_mutex_lock(&k->refs_lock);
    cache *c = keeper_take(k, d, ticket, ret_advise, ret_bad);
    pthread_mutex_unlock(&k->refs_lock);
    return c;
}

void cache_keeper_tend(cache_keeper *k)
{
    /* Closed (the daemon stops): a worker's report may still come, and nothing more
     * may start (a rebuild's thread would outlive the keeper). */
    if (k->state == K_OFF)
        return;
    uint64_t bad_index = 0;
    int why = k->current ? cache_bad(k->current->c, &bad_index) : CACHE_BAD_NONE;
    if (why != CACHE_BAD_NONE)
        drop_bad(k, why, bad_index);
}

void cache_keeper_release(cache_keeper *k, cache *c)
{
    if (!c)
        return;
    struct held *h = held_of(k, c);
    ld_require(h != NULL); /* else a cache we never handed out is given back */
    held_unref(k, h);
}

bool cache_keeper_try_release(cache_keeper *k, cache *c)
{
    if (!c)
        return true;
    pthread_mutex_lock(&k->refs_lock);
    struct held *h = held_of(k, c);
    ld_require(h != NULL && h->refs > 0); /* else a cache we never handed out is given back */
    bool last_of_retired = h->refs == 1 && h != k->current;
    if (!last_of_retired)
        h->refs--;
    pthread_mutex_unlock(&k->refs_lock);
    return !last_of_retired;
}

void cache_keeper_set_dataset(cache_keeper *k, dataset *d)
{
    k->d = d;
    d->keeper = k;
}

int cache_keeper_build(cache_keeper *k, bool force, char *errbuf)
{
    if (k->state == K_OFF) {
        ld_errorf(errbuf, "dataset '%s' has cache.mode: off: its cache %s is neither built nor used "
                  "(set mode: auto or rebuild to use it)", k->d->name, k->path);
        return LD_ENOTSUP;
    }
    if (k->state == K_BUILDING)
        return 0;
    if (k->state == K_READY && !force) {
        ld_errorf(errbuf, "dataset '%s': the cache %s is valid; use --force to rebuild it", k->d->name, k->path);
        return LD_EEXIST;
    }
    if (force && k->state == K_READY && k->last_force_ns) {
        uint64_t since = uv_hrtime() - k->last_force_ns;
        if (since < FORCE_INTERVAL_NS) {
            ld_errorf(errbuf, "dataset '%s': a forced rebuild of %s started %.0f s ago; forced rebuilds of a "
                      "valid cache are limited to one per %llu s (try again in %.0f s; a cache whose source "
                      "changed is rebuilt without --force)", k->d->name, k->path, (double)since / 1e9,
                      FORCE_INTERVAL_NS / 1000000000ull, (double)(FORCE_INTERVAL_NS - since) / 1e9 + 0.5);
            return LD_EAGAIN;
        }
    }
    k->pending_build = true;
    k->pending_force = k->pending_force || force;
    maybe_pending(k);
    return 0;
}

static int start_verify(cache_keeper *k, void (*done)(void *ctx, int rc, const char *message), void *ctx)
{
    int rc = start_job(k, JOB_VERIFY, false);
    if (rc == 0) {
        k->job.verify_done = done;
        k->job.verify_ctx = ctx;
    }
    return rc;
}

int cache_keeper_verify(cache_keeper *k, void (*done)(void *ctx, int rc, const char *message), void *ctx,
                        char *errbuf)
{
    if (k->state == K_OFF) {
        ld_errorf(errbuf, "dataset '%s' has cache.mode: off: its cache %s is not used", k->d->name, k->path);
        return LD_ENOTSUP;
    }
    if (!k->current && !k->thread_live) {
        ld_errorf(errbuf, "dataset '%s' has no cache to verify (state: %s)", k->d->name, state_names[k->state]);
        return LD_ENOENT;
    }
    if (k->pending_verify || (k->thread_live && k->job.kind == JOB_VERIFY)) {
        ld_errorf(errbuf, "dataset '%s': a verify of the cache is already running", k->d->name);
        return LD_EBUSY;
    }
    if (k->thread_live) {
        /* A check or a build is running: verify what it leaves, right after it. */
        k->pending_verify = done;
        k->pending_verify_ctx = ctx;
        return 0;
    }
    int rc = start_verify(k, done, ctx);
    if (rc < 0)
        ld_errorf(errbuf, "%s", k->error);
    return rc;
}

void cache_keeper_stats(const cache_keeper *k, struct cache_keeper_stats *ret)
{
    static const char *const modes[] = {"off", "auto", "rebuild"};
    /* The progress counters are atomics the keeper's thread writes; loading them
     * changes nothing. */
    cache_keeper *m = (cache_keeper *)k;
    uint64_t total = atomic_load(&m->progress_total);
    uint64_t done = atomic_load(&m->progress_done);
    *ret = (struct cache_keeper_stats){
        .state = state_names[k->state],
        .path = k->path,
        .mode = modes[k->mode],
        .progress = k->thread_live && total ? (double)done / (double)total : -1,
        .hits = k->freed_hits,
        .hit_bytes = k->freed_hit_bytes,
        .attached = k->attached,
        .error = k->error[0] ? k->error : NULL,
        .file = k->current ? k->current->c : NULL,
    };
    for (const struct held *h = k->held; h; h = h->next) {
        uint64_t hits, bytes;
        cache_hits(h->c, &hits, &bytes);
        ret->hits += hits;
        ret->hit_bytes += bytes;
        ret->mapped++;
    }
}
