/* cache_keeper_job — the keeper's thread (cache_keeper.c starts it): one job at a time,
 * a check (is the cache on disk the source's?), a build or a verify. It owns k->job
 * until it signals k->done; the loop owns the rest of the keeper, and reads the
 * progress atomics while it runs. */
#include "cache_keeper_internal.h"

#include <stdio.h>
#include <unistd.h>

#include "cache_quota.h"
#include "log.h"

static void progress_cb(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total)
{
    cache_keeper *k = ctx;
    if (stage == CACHE_STAGE_READ || stage == CACHE_STAGE_VERIFY) {
        atomic_store(&k->progress_total, total);
        atomic_store(&k->progress_done, done);
    }
}

static int keeper_open(cache_keeper *k, uint64_t fp, cache **ret, char *errbuf)
{
    if (k->dirfd >= 0)
        return cache_open_at(k->dirfd, k->name, k->io_path, fp, ret, errbuf);
    return cache_open(k->path, fp, ret, errbuf);
}

static void job_check(cache_keeper *k)
{
    uint64_t fp;
    char err[LD_ERRMSG_MAX];
    const dataset *d = k->job.d;
    int rc = d->ops->fingerprint(d, k->fp_mode, &fp, k->job.msg);
    if (rc < 0) {
        k->job.rc = rc;
        return;
    }
    if (k->job.uses && cache_meta(k->job.uses->c)->fingerprint == fp) {
        k->job.rc = 0; /* unchanged: keep what is attached */
        return;
    }
    rc = keeper_open(k, fp, &k->job.opened, err);
    k->job.rc = rc;
    if (rc == LD_ECACHE) {
        k->job.set_aside = true;
        char aside[LD_ERRMSG_MAX];
        if (cache_set_aside(k->io_path, err, aside) < 0)
            ld_log(LD_LOG_WARN, "dataset '%s': %s", d->name, aside);
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
    const dataset *d = k->job.d;
    int rc = d->ops->fingerprint(d, k->fp_mode, &fp, k->job.msg), lock = -1;
    uint64_t need = 0;
    k->job.reused = false;
    if (rc == 0 && k->dirfd >= 0) {
        /* A declared cache: the directory's builds take turns. One that waited may find
         * the cache it was to write already there, written for the same spec by another
         * open (another rank of the same job): it serves that one. */
        rc = cache_quota_lock(k->dirfd, k->path, &k->cancel, &lock, k->job.msg);
        char err[LD_ERRMSG_MAX];
        if (rc == 0 && !k->job.force && keeper_open(k, fp, &k->job.opened, err) == 0) {
            k->job.reused = true;
            close(lock);
            k->job.rc = 0;
            return;
        }
        if (rc == 0 && (rc = cache_plan_bytes(d, &need, k->job.msg)) == 0)
            rc = cache_quota_make_room(k->dirfd, k->name, k->path, k->quota, need, k->job.msg);
    }
    if (rc == 0)
        rc = cache_build_mode(d, k->io_path, fp, k->dirfd >= 0 ? 0600 : 0644, progress_cb, k, &k->cancel,
                              k->job.msg);
    if (lock >= 0)
        close(lock);
    if (rc == 0)
        rc = keeper_open(k, fp, &k->job.opened, k->job.msg);
    k->job.rc = rc;
}

void *cache_keeper_thread(void *arg)
{
    cache_keeper *k = arg;
    switch (k->job.kind) {
    case JOB_CHECK: job_check(k); break;
    case JOB_BUILD: job_build(k); break;
    case JOB_VERIFY: k->job.rc = cache_verify(k->job.uses->c, progress_cb, k, &k->cancel, k->job.msg); break;
    case JOB_NONE: break;
    }
    uv_async_send(&k->done);
    return NULL;
}
