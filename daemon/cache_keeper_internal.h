/* cache_keeper_internal.h — what cache_keeper.c (the loop's side) and cache_keeper_job.c
 * (the keeper's thread) share: the keeper itself and the caches it holds. Not for other
 * modules: they see cache_keeper.h. */
#ifndef LD_CACHE_KEEPER_INTERNAL_H
#define LD_CACHE_KEEPER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "cache.h"
#include "cache_keeper.h"
#include "dataset.h"
#include "ld_error.h"

enum keeper_state { K_CHECKING, K_ABSENT, K_BUILDING, K_READY, K_STALE, K_FAILED, K_OFF };

enum job_kind { JOB_NONE, JOB_CHECK, JOB_BUILD, JOB_VERIFY };

/* A cache this keeper opened, with the number of readers holding it. */
struct held {
    cache *c;
    const dataset *d;               /* the scan of the source it was checked against */
    uint32_t refs;                  /* batches reading it + the job using it */
    bool advise;                    /* much larger than memory: advise the next pages */
    struct held *next;
};

struct cache_keeper {
    uv_async_t done;
    dataset *d;
    char *path;                     /* the cache file, as shown */
    char *io_path;                  /* as opened: path, or /proc/self/fd/N/NAME beneath dirfd */
    int dirfd;                      /* the directory of a declared cache (owned), or -1 */
    char *name;                     /* its file name in dirfd */
    uint64_t quota;                 /* bytes all files in dirfd may take (0: none) */
    int mode, fp_mode;
    enum keeper_state state;
    bool rebuilt_once;              /* mode rebuild: the forced build of this run is done */
    bool pending_build, pending_force;
    bool pending_check;             /* a job ran on a dataset a rescan has replaced */
    void (*pending_verify)(void *ctx, int rc, const char *message); /* a verify waiting for the job */
    void *pending_verify_ctx;
    char error[LD_ERRMSG_MAX];
    struct held *held;              /* every cache still mapped; current is one of them */
    struct held *current;           /* the attached cache, or NULL */
    uint64_t tickets;               /* tickets issued: one per stream opened */
    uint64_t valid_for;             /* current matches the source for tickets <= this */
    /* held, current, valid_for and every held's refs: written under it; read by a
     * worker only under it (the loop reads them freely: it is their only other writer) */
    pthread_mutex_t refs_lock;
    uint64_t last_force_ns;         /* uv_hrtime() of the last forced build's start; 0: none */
    uint64_t attached, freed;       /* caches attached and unmapped over the run */
    uint64_t freed_hits, freed_hit_bytes;
    /* the running job; written by the thread until it signals `done` */
    pthread_t thread;
    bool thread_live;
    struct {
        enum job_kind kind;
        bool force;
        uint64_t ticket;            /* the last ticket issued when the job started */
        dataset *d;                 /* the dataset it reads (held until the job is done) */
        struct held *uses;          /* check/verify: the cache it looks at (a reference) */
        int rc;
        cache *opened;              /* check/build: the cache to attach */
        bool set_aside, stale;      /* check: what was found */
        bool reused;                /* build: another build had just written the same cache */
        char msg[LD_ERRMSG_MAX];
        void (*verify_done)(void *ctx, int rc, const char *message);
        void *verify_ctx;
    } job;
    atomic_int cancel;
    _Atomic uint64_t progress_done, progress_total;
    void (*on_closed)(void *ctx);
    void *closed_ctx;
};

/* The keeper's thread: runs k->job (check, build or verify), then signals k->done. */
void *cache_keeper_thread(void *arg);

#endif
