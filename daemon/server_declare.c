/* server_declare — the server's half of the datasets trainers declare (declare.h).
 *
 * The open. Declaring walks the trainer's tree and checks its right to read every
 * directory and file: a second or more for a hundred thousand files, or as long as a
 * stuck file system makes it. So the open of a spec checks what it can at once (the
 * request's fields, the limits, a template's access rule), reserves the open's place
 * among the connection's replies, and runs declare_open on a thread of its own; the
 * thread posts a hub completion, and the loop finishes the open there
 * (server_open_declared) with the reply filling that place. Meanwhile the loop serves
 * every other client, and this one's later requests (answered in order behind it). A
 * client gone before the scan ends gets nothing: the completion finds no connection and
 * frees what the scan built. A stop waits for scans under way (each counts in
 * pending_closes), as a reload's does.
 *
 * The scan reads srv->cfg as it was when the open came: a reload keeps the configs it
 * replaced until the daemon stops (server_reload.c), so that one stays valid. A scan
 * that a reload overtook is answered `busy` (open again): its checks were made against
 * the rules the reload replaced.
 *
 * The caches. A declared dataset with a cache gets a cache keeper of its own
 * (cache_keeper_new_at, in the directory declare_cache.h chose), which holds the
 * dataset. The tick stops it once nothing but the keeper (and its running job, which
 * the close cancels) holds the dataset: the last stream is gone, and with the keeper
 * goes the dataset, its threads and its descriptors. `status` lists them with the
 * configured datasets' caches. */
#include "server_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_report.h"
#include "dataset_watch.h"
#include "declare.h"
#include "log.h"

/* Scans under way at once, daemon-wide: each is a thread; an open beyond them is told
 * to try again rather than queued without bound. One user may hold a few of them, so
 * that its scans stuck on a file system that does not answer leave room for others'. */
#define SERVER_DECLARE_MAX_SCANS 16
#define SERVER_DECLARE_MAX_SCANS_PER_UID 4

struct server_declare_job {
    struct hub_completion done;     /* posted by the scan thread once declare_open returned */
    server *srv;
    const struct config *cfg;       /* the config when the open came (kept until the daemon stops) */
    uint64_t conn_id;
    struct reply *reply;            /* the open's place in the connection's outbox */
    int64_t id;
    cJSON *req;                     /* the open request, for the rest of the open */
    char *template_name;
    struct access_peer peer;
    uint32_t groups[ACCESS_MAX_PEER_GROUPS];
    uint32_t self_uid;
    /* the thread's until it posts `done` */
    dataset *d;
    struct declare_cache place;
    int rc;
    char err[LD_ERRMSG_MAX];
    uint64_t scan_ns;
    pthread_t thread;
    bool thread_live;
    struct server_declare_job *next; /* srv->declare_jobs (loop thread) */
};

/* A declared dataset's cache keeper, holding the dataset until the tick stops it. */
struct server_declared_cache {
    server *srv;
    cache_keeper *k;
    dataset *d;
    uint32_t uid;                   /* whose: status lists it to them and to operators */
    bool closing;
    struct server_declared_cache *next;
};

static void server_declare_job_free(struct server_declare_job *job)
{
    dataset_free(job->d);
    declare_cache_close(&job->place);
    cJSON_Delete(job->req);
    free(job->template_name);
    free(job);
}

static void *server_declare_main(void *arg)
{
    struct server_declare_job *job = arg;
    uint64_t t0 = uv_hrtime();
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(job->req, "spec");
    job->rc = declare_open(job->cfg, &job->peer, job->self_uid, spec, job->template_name, &job->d, &job->place,
                           job->err);
    job->scan_ns = uv_hrtime() - t0;
    hub_post(job->srv->hub, &job->done);
    return NULL;
}

/* The connection `id`, if it is still there. */
static conn *server_declare_conn(server *srv, uint64_t id)
{
    for (conn *c = srv->conns; c; c = c->next)
        if (c->id == id)
            return c->state == CONN_CLOSED ? NULL : c;
    return NULL;
}

/* The scan is done (on the loop): the open goes on, or its error is the reply. */
static void server_declare_scanned(struct hub_completion *hc)
{
    struct server_declare_job *job =
        (struct server_declare_job *)((char *)hc - offsetof(struct server_declare_job, done));
    server *srv = job->srv;
    if (job->thread_live)
        pthread_join(job->thread, NULL);
    srv->declare_scans--;
    struct server_declare_job **pp = &srv->declare_jobs;
    while (*pp != job)
        pp = &(*pp)->next;
    *pp = job->next;
    conn *c = server_declare_conn(srv, job->conn_id);
    if (!c || srv->stopping) {
        ld_log(LD_LOG_INFO, "client %" PRIu64 ": declared dataset dropped after its scan (%.1f ms): %s",
               job->conn_id, (double)job->scan_ns / 1e6, srv->stopping ? "the daemon is stopping" : "the client is gone");
    } else if (job->rc == 0 && job->cfg != srv->cfg) {
        /* A reload during the scan may have taken the grant away: the scan's checks were
         * against the config it replaced, so the open is not finished under them. */
        ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s, uid %u, pid %d): declared dataset dropped after its scan: the "
               "config was reloaded meanwhile", c->id, c->name, c->uid, c->pid);
        server_reply_fill(c, job->reply, proto_reply_error(job->id, LD_EBUSY, "the daemon's config was reloaded "
                                                           "while this dataset was being scanned: open it again"));
    } else if (job->rc < 0) {
        ld_log(job->rc == LD_EDENIED ? LD_LOG_WARN : LD_LOG_INFO, "client %" PRIu64 " (%s, uid %u, pid %d): declared "
               "dataset refused: %s", c->id, c->name, c->uid, c->pid, job->err);
        server_reply_fill(c, job->reply, proto_reply_error(job->id, job->rc, job->err));
    } else {
        dataset *d = job->d;
        struct declare_cache place = job->place;
        job->d = NULL;
        job->place.dirfd = -1;
        ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s, uid %u): declared dataset '%s' on %s: %" PRIu64 " samples, "
               "scanned and checked in %.1f ms", c->id, c->name, c->uid, d->name, d->source, d->count,
               (double)job->scan_ns / 1e6);
        c->reply_into = job->reply;
        server_open_declared(c, job->req, job->id, d, &place);
        declare_cache_close(&place);
        if (c->reply_into) { /* every path of the open replies: this one did not */
            c->reply_into = NULL;
            server_reply_fill(c, job->reply, proto_reply_error(job->id, LD_EIO, "the open ended without a reply"));
        }
    }
    server_declare_job_free(job);
    server_closed_one(srv);
}

void server_declare_start(conn *c, const cJSON *req, int64_t id, const char *template_name)
{
    server *srv = c->srv;
    char err[LD_ERRMSG_MAX];
    if (srv->declare_scans >= SERVER_DECLARE_MAX_SCANS) {
        snprintf(err, sizeof err, "%d declared datasets are being scanned: try again once one is open",
                 SERVER_DECLARE_MAX_SCANS);
        server_reply_error(c, id, LD_EBUSY, err);
        return;
    }
    int mine = 0;
    for (const struct server_declare_job *j = srv->declare_jobs; j; j = j->next)
        mine += j->peer.uid == c->uid;
    if (mine >= SERVER_DECLARE_MAX_SCANS_PER_UID) {
        snprintf(err, sizeof err, "%d declared datasets of uid %u are being scanned: try again once one is open",
                 mine, (unsigned)c->uid);
        server_reply_error(c, id, LD_EBUSY, err);
        return;
    }
    struct server_declare_job *job = calloc(1, sizeof *job);
    if (!job || !(job->req = cJSON_Duplicate(req, true)) ||
        (template_name && !(job->template_name = strdup(template_name)))) {
        if (job)
            server_declare_job_free(job);
        server_reply_error(c, id, LD_ENOMEM, NULL);
        return;
    }
    job->place.dirfd = -1;
    job->srv = srv;
    job->cfg = srv->cfg;
    job->conn_id = c->id;
    job->id = id;
    job->self_uid = (uint32_t)getuid();
    job->peer = server_conn_peer(c);
    size_t n = job->peer.n_groups < ACCESS_MAX_PEER_GROUPS ? job->peer.n_groups : ACCESS_MAX_PEER_GROUPS;
    memcpy(job->groups, job->peer.groups, n * sizeof *job->groups);
    job->peer.groups = job->groups;
    job->peer.n_groups = n;
    job->done.done = server_declare_scanned;
    if (!(job->reply = server_outbox_add(c, id))) {
        server_declare_job_free(job);
        server_conn_abort(c);
        return;
    }
    srv->declare_scans++;
    job->next = srv->declare_jobs;
    srv->declare_jobs = job;
    srv->pending_closes++; /* a stop waits for the scan */
    ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s): declared dataset: scanning and checking on a thread of its own",
           c->id, c->name);
    job->thread_live = pthread_create(&job->thread, NULL, server_declare_main, job) == 0;
    if (!job->thread_live) {
        ld_log(LD_LOG_WARN, "client %" PRIu64 ": cannot start a thread for a declared dataset's scan; scanning on "
               "the loop", c->id);
        server_declare_main(job); /* posts: the completion runs from the loop, as always */
    }
}

/* ---- the caches of declared datasets ----------------------------------------------- */

int server_declare_keep_cache(server *srv, dataset *d, uint32_t uid, struct declare_cache *place, char *errbuf)
{
    struct server_declared_cache *e = calloc(1, sizeof *e);
    if (!e) {
        declare_cache_close(place);
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    int dirfd = place->dirfd;
    place->dirfd = -1; /* the keeper's from here, whatever happens */
    int rc = cache_keeper_new_at(srv->loop, d, &d->owned_config->datasets[0], dirfd, place->name, place->quota,
                                 &e->k, errbuf);
    if (rc < 0) {
        free(e);
        return rc;
    }
    dataset_hold(d); /* the keeper's: released when it stops */
    e->srv = srv;
    e->d = d;
    e->uid = uid;
    e->next = srv->declared_caches;
    srv->declared_caches = e;
    return 0;
}

static void server_declare_keeper_closed(void *ctx)
{
    struct server_declared_cache *e = ctx;
    server *srv = e->srv;
    if (!srv->stopping) {
        /* Nothing reads through it any more: free it, and the dataset with it. */
        struct server_declared_cache **pp = &srv->declared_caches;
        while (*pp != e)
            pp = &(*pp)->next;
        *pp = e->next;
        cache_keeper_free(e->k);
        dataset_release(e->d);
        free(e);
    }
    /* Stopping: streams may still hold batches of its caches; server_declare_free frees. */
    server_closed_one(srv);
}

void server_declare_reap(server *srv)
{
    for (struct server_declared_cache *e = srv->declared_caches; e; e = e->next) {
        /* Only the keeper's hold is left, and its running job's (the close cancels it). */
        if (e->closing || !e->d->retired || e->d->holders != 1u + cache_keeper_busy(e->k))
            continue;
        ld_log(LD_LOG_INFO, "declared dataset '%s': its last stream is gone; its cache keeper stops", e->d->name);
        e->closing = true;
        srv->pending_closes++;
        cache_keeper_close(e->k, server_declare_keeper_closed, e);
    }
}

void server_declare_close(server *srv)
{
    for (struct server_declared_cache *e = srv->declared_caches; e; e = e->next) {
        if (e->closing)
            continue;
        e->closing = true;
        srv->pending_closes++;
        cache_keeper_close(e->k, server_declare_keeper_closed, e);
    }
}

void server_declare_free(server *srv)
{
    while (srv->declared_caches) {
        struct server_declared_cache *e = srv->declared_caches;
        srv->declared_caches = e->next;
        cache_keeper_free(e->k);
        dataset_release(e->d);
        free(e);
    }
}

/* Whether `c` may see the declared caches of other users: root, the daemon's own user,
 * and the peers an access.operators rule names (not everyone, as an unset rule would
 * let through: a cache's name and state tell what another user trains on). */
static bool server_declare_sees_all(const conn *c)
{
    uint32_t self = (uint32_t)getuid();
    const struct access_rule *ops = &c->srv->cfg->access.operators;
    if (c->uid == 0 || c->uid == self)
        return true;
    struct access_peer peer = server_conn_peer(c);
    return ops->set && access_allows(ops, &peer, self);
}

void server_declare_report(const server *srv, const conn *c, cJSON *caches)
{
    bool all = server_declare_sees_all(c);
    for (const struct server_declared_cache *e = srv->declared_caches; e; e = e->next) {
        if (e->closing || (!all && e->uid != c->uid))
            continue;
        cJSON *jc = cJSON_CreateObject();
        if (!jc)
            return;
        cJSON_AddStringToObject(jc, "dataset", e->d->name);
        cJSON_AddBoolToObject(jc, "declared", true);
        cache_report_keeper(e->k, jc);
        cJSON_DeleteItemFromObjectCaseSensitive(jc, "file");
        cJSON_AddItemToArray(caches, jc);
    }
}
