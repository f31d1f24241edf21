/* cache_keeper — the life of one dataset's cache inside the daemon.
 *
 *   checking ──▶ ready (attached: workers read the cache)
 *      │            │ a stream opens and the fingerprint moved ─▶ stale ─▶ building
 *      ├──▶ absent ──┴─ a stream opens (auto), or cache build ──────────▶ building
 *      ├──▶ stale (built from another state of the source) ─────────────▶ building
 *      └──▶ failed (unreadable directory, ...): served from the source
 *   building ──▶ ready, or failed
 *
 * A job (check, build, verify) runs on the keeper's thread; the loop thread starts it,
 * and learns its result through `done`, a uv_async handle. Between the two, the thread
 * owns `job` and the loop owns the rest; progress is an atomic the loop may read. A
 * cache is attached by storing its pointer in the dataset (release order, so a worker
 * that sees the pointer sees the mapping); a replaced or detached cache stays mapped
 * until the keeper is freed, after the workers have stopped. */
#include "cache_keeper.h"

#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "log.h"

enum keeper_state { K_CHECKING, K_ABSENT, K_BUILDING, K_READY, K_STALE, K_FAILED };
static const char *const state_names[] = {"checking", "absent", "building", "ready", "stale", "failed"};

enum job_kind { JOB_NONE, JOB_CHECK, JOB_BUILD, JOB_VERIFY };

#define MAX_CACHES 16 /* caches attached over one run (each rebuild adds one) */

struct cache_keeper {
    uv_async_t done;
    dataset *d;
    char *path;
    int mode, fp_mode;
    enum keeper_state state;
    bool rebuilt_once;              /* mode rebuild: the forced build of this run is done */
    bool pending_build, pending_force;
    void (*pending_verify)(void *ctx, int rc, const char *message); /* a verify waiting for the job */
    void *pending_verify_ctx;
    char error[LD_ERRMSG_MAX];
    cache *caches[MAX_CACHES];      /* every cache attached so far; the last is current */
    int n_caches;
    cache *current;
    /* the running job; written by the thread until it signals `done` */
    pthread_t thread;
    bool thread_live;
    struct {
        enum job_kind kind;
        bool force;
        int rc;
        cache *opened;              /* check/build: the cache to attach */
        bool set_aside, stale;      /* check: what was found */
        char msg[LD_ERRMSG_MAX];
        void (*verify_done)(void *ctx, int rc, const char *message);
        void *verify_ctx;
    } job;
    atomic_int cancel;
    _Atomic uint64_t progress_done, progress_total;
    void (*on_closed)(void *ctx);
    void *closed_ctx;
};

static void progress_cb(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total)
{
    cache_keeper *k = ctx;
    if (stage == CACHE_STAGE_READ || stage == CACHE_STAGE_VERIFY) {
        atomic_store(&k->progress_total, total);
        atomic_store(&k->progress_done, done);
    }
}

/* ---- the keeper's thread ---------------------------------------------------------- */

static uint64_t current_fingerprint(const cache *c)
{
    return c ? cache_meta(c)->fingerprint : 0;
}

static void job_check(cache_keeper *k)
{
    uint64_t fp;
    char err[LD_ERRMSG_MAX];
    int rc = k->d->ops->fingerprint(k->d, k->fp_mode, &fp, k->job.msg);
    if (rc < 0) {
        k->job.rc = rc;
        return;
    }
    if (k->current && current_fingerprint(k->current) == fp) {
        k->job.rc = 0; /* unchanged: keep what is attached */
        return;
    }
    rc = cache_open(k->path, fp, &k->job.opened, err);
    k->job.rc = rc;
    if (rc == LD_ECACHE) {
        k->job.set_aside = true;
        char aside[LD_ERRMSG_MAX];
        if (cache_set_aside(k->path, err, aside) < 0)
            ld_log(LD_LOG_WARN, "dataset '%s': %s", k->d->name, aside);
    } else if (rc == LD_ECACHESTALE || rc == LD_ECACHEVERSION) {
        k->job.stale = true;
    }
    snprintf(k->job.msg, sizeof k->job.msg, "%s", rc < 0 ? err : "");
}

static void job_build(cache_keeper *k)
{
    uint64_t fp;
    /* The fingerprint is taken before the build: a file changed during the build
     * makes the new cache stale at the next check, never silently wrong. */
    int rc = k->d->ops->fingerprint(k->d, k->fp_mode, &fp, k->job.msg);
    if (rc == 0)
        rc = cache_build(k->d, k->path, fp, progress_cb, k, &k->cancel, k->job.msg);
    if (rc == 0)
        rc = cache_open(k->path, fp, &k->job.opened, k->job.msg);
    k->job.rc = rc;
}

static void *keeper_thread(void *arg)
{
    cache_keeper *k = arg;
    switch (k->job.kind) {
    case JOB_CHECK: job_check(k); break;
    case JOB_BUILD: job_build(k); break;
    case JOB_VERIFY: k->job.rc = cache_verify(k->current, progress_cb, k, &k->cancel, k->job.msg); break;
    case JOB_NONE: break;
    }
    uv_async_send(&k->done);
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
    atomic_store(&k->progress_done, 0);
    atomic_store(&k->progress_total, 0);
    int e = pthread_create(&k->thread, NULL, keeper_thread, k);
    if (e != 0) {
        snprintf(k->error, sizeof k->error, "cannot start the cache thread: %s", strerror(e));
        return ld_from_errno(e);
    }
    k->thread_live = true;
    if (kind == JOB_BUILD) {
        k->state = K_BUILDING;
        ld_log(LD_LOG_INFO, "dataset '%s': building the cache %s", k->d->name, k->path);
    } else if (kind == JOB_CHECK && k->state != K_READY) {
        k->state = K_CHECKING;
    }
    return 0;
}

/* Attaches c (or, past MAX_CACHES, frees it and says why); false when not attached. */
static bool attach(cache_keeper *k, cache *c)
{
    if (k->n_caches == MAX_CACHES) {
        /* A mapping a worker may still read is never freed while the daemon runs, so the
         * number of caches one run may attach is bounded; restart the daemon to go on. */
        ld_log(LD_LOG_WARN, "dataset '%s': %d caches attached in one run; not attaching more (restart loaderd)",
               k->d->name, MAX_CACHES);
        cache_free(c);
        k->state = k->current ? K_READY : K_FAILED;
        snprintf(k->error, sizeof k->error, "%d caches attached in one run: restart loaderd to attach another",
                 MAX_CACHES);
        return false;
    }
    k->caches[k->n_caches++] = c;
    k->current = c;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    atomic_store(&k->d->cache_advise, ram && cache_meta(c)->file_size > ram / 2);
    atomic_store_explicit(&k->d->cached, c, memory_order_release);
    k->state = K_READY;
    k->error[0] = '\0';
    return true;
}

static void detach(cache_keeper *k)
{
    atomic_store_explicit(&k->d->cached, NULL, memory_order_release);
    k->current = NULL;
}

static int start_verify(cache_keeper *k, void (*done)(void *ctx, int rc, const char *message), void *ctx);

static void maybe_pending(cache_keeper *k)
{
    if (k->pending_verify && !k->thread_live) {
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
    if (k->pending_build && !k->thread_live) {
        bool force = k->pending_force;
        k->pending_build = k->pending_force = false;
        if (force || k->state != K_READY)
            start_job(k, JOB_BUILD, force);
    }
}

static void on_done(uv_async_t *a)
{
    cache_keeper *k = a->data;
    if (!k->thread_live)
        return;
    pthread_join(k->thread, NULL);
    k->thread_live = false;
    const char *name = k->d->name;
    switch (k->job.kind) {
    case JOB_CHECK:
        if (k->job.rc == 0 && k->job.opened) {
            if (k->current) {
                detach(k); /* the source moved on and a matching cache was found */
            }
            if (attach(k, k->job.opened))
                ld_log(LD_LOG_INFO, "dataset '%s': serving from the cache %s", name, k->path);
        } else if (k->job.rc == 0) {
            /* fingerprint unchanged: nothing to do */
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
            if (k->mode == CONFIG_CACHE_AUTO && k->n_caches > 0)
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
            if (attach(k, k->job.opened))
                ld_log(LD_LOG_INFO, "dataset '%s': cache built (%" PRIu64 " samples, %.1f MiB); serving from it",
                       name, cache_meta(k->current)->count, (double)cache_meta(k->current)->file_size / (1 << 20));
        } else if (k->job.rc == LD_ECANCELED) {
            k->state = k->current ? K_READY : K_ABSENT;
        } else {
            k->state = k->current ? K_READY : K_FAILED;
            snprintf(k->error, sizeof k->error, "%s", k->job.msg);
            ld_log(LD_LOG_WARN, "dataset '%s': cache build failed: %s; serving from the source", name, k->job.msg);
        }
        break;
    case JOB_VERIFY:
        if (k->job.rc == LD_ECACHE) {
            /* Never serve it again: detach, set aside, rebuild. */
            ld_log(LD_LOG_WARN, "dataset '%s': %s", name, k->job.msg);
            detach(k);
            char aside[LD_ERRMSG_MAX];
            if (cache_set_aside(k->path, k->job.msg, aside) < 0)
                ld_log(LD_LOG_WARN, "dataset '%s': %s", name, aside);
            k->state = K_ABSENT;
            snprintf(k->error, sizeof k->error, "%s", k->job.msg);
            if (k->mode != CONFIG_CACHE_OFF)
                k->pending_build = true;
        }
        if (k->job.verify_done)
            k->job.verify_done(k->job.verify_ctx, k->job.rc, k->job.msg);
        break;
    case JOB_NONE:
        break;
    }
    maybe_pending(k);
}

int cache_keeper_new(uv_loop_t *loop, dataset *d, const struct config_dataset *cfg, cache_keeper **ret_keeper,
                     char *errbuf)
{
    if (!d->ops->fingerprint || !d->ops->read_raw) {
        ld_errorf(errbuf, "dataset '%s': kind '%s' cannot be cached", d->name, dataset_kind(d));
        return LD_ENOTSUP;
    }
    cache_keeper *k = calloc(1, sizeof *k);
    if (!k || !(k->path = strdup(cfg->cache_path))) {
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
        free(k->path);
        free(k);
        return rc;
    }
    k->done.data = k;
    /* Temporary files of builders that died (a crash, a kill -9) are never a cache. */
    char *dup = strdup(k->path), err[LD_ERRMSG_MAX];
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
        if (k->job.opened && k->job.opened != k->current)
            cache_free(k->job.opened);
        k->job.opened = NULL;
        if (k->job.kind == JOB_VERIFY && k->job.verify_done)
            k->job.verify_done(k->job.verify_ctx, LD_ECLOSED, "the daemon is stopping");
    }
    if (k->pending_verify) {
        void (*done)(void *, int, const char *) = k->pending_verify;
        k->pending_verify = NULL;
        done(k->pending_verify_ctx, LD_ECLOSED, "the daemon is stopping");
    }
    k->on_closed = on_closed;
    k->closed_ctx = ctx;
    uv_close((uv_handle_t *)&k->done, keeper_closed);
}

void cache_keeper_free(cache_keeper *k)
{
    if (!k)
        return;
    atomic_store(&k->d->cached, NULL);
    for (int i = 0; i < k->n_caches; i++)
        cache_free(k->caches[i]);
    free(k->path);
    free(k);
}

void cache_keeper_stream_opened(cache_keeper *k)
{
    if (k->mode == CONFIG_CACHE_REBUILD && !k->rebuilt_once) {
        k->rebuilt_once = true;
        k->pending_build = true;
        k->pending_force = true;
    } else if (k->state == K_READY) {
        /* Has the source changed since? The check runs in the background. */
        start_job(k, JOB_CHECK, false);
        return;
    } else if (k->mode == CONFIG_CACHE_AUTO &&
               (k->state == K_ABSENT || k->state == K_STALE || k->state == K_CHECKING)) {
        /* While the start-up check runs, the build waits for its verdict: it starts
         * only if the check finds no valid cache (maybe_pending). */
        k->pending_build = true;
    }
    maybe_pending(k);
}

int cache_keeper_build(cache_keeper *k, bool force, char *errbuf)
{
    if (k->state == K_BUILDING)
        return 0;
    if (k->state == K_READY && !force) {
        ld_errorf(errbuf, "dataset '%s': the cache %s is valid; use --force to rebuild it", k->d->name, k->path);
        return LD_EEXIST;
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

void cache_keeper_describe(const cache_keeper *k, cJSON *o)
{
    static const char *const modes[] = {"off", "auto", "rebuild"};
    cJSON_AddStringToObject(o, "state", state_names[k->state]);
    cJSON_AddStringToObject(o, "path", k->path);
    cJSON_AddStringToObject(o, "mode", modes[k->mode]);
    uint64_t total = atomic_load(&((cache_keeper *)k)->progress_total);
    uint64_t done = atomic_load(&((cache_keeper *)k)->progress_done);
    if (k->thread_live && total)
        cJSON_AddNumberToObject(o, "progress", (double)done / (double)total);
    uint64_t hits = 0, bytes = 0;
    for (int i = 0; i < k->n_caches; i++) {
        uint64_t h, b;
        cache_hits(k->caches[i], &h, &b);
        hits += h;
        bytes += b;
    }
    cJSON_AddNumberToObject(o, "hits", (double)hits);
    cJSON_AddNumberToObject(o, "hit_bytes", (double)bytes);
    if (k->error[0])
        cJSON_AddStringToObject(o, "error", k->error);
    if (k->current) {
        cJSON *info = cJSON_AddObjectToObject(o, "file");
        cache_info(k->current, info);
    }
}
