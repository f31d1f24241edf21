/* server_reload — the config read again while the daemon runs (`loaderctl reload`,
 * SIGHUP), and the datasets that could not be opened.
 *
 * A reload loads the file the daemon started with, by the same code and with the same
 * "FILE:LINE:COLUMN: " errors as at start; a file with an error is refused whole and
 * the running config stays. Otherwise each dataset of the new file is compared with
 * the running one of its name (config_diff.h): one defined the same keeps its open
 * dataset, its cache keeper and its folder watch, so its streams never notice; an
 * added or changed one is opened on a thread of the reload's own (a big folder's scan
 * does not hold up the other clients), and the new config is applied on the loop once
 * they are open (a hub completion); a changed or removed one is retired: streams
 * already open on it keep reading the old definition to their end (the dataset is
 * freed by its last holder, dataset_watch.h), and new opens get the new one. A dataset
 * that cannot be opened (its path is missing or unreadable), at start or at a reload,
 * is unavailable: listed with the reason, refused at open, tried again at each reload.
 * The new access rules apply to what is open as well (server_reload_access.c).
 *
 * A retired dataset's cache keeper keeps running, holding the dataset, while its streams
 * may still read the cache; the server's tick stops it (and so frees the dataset) once
 * the keeper's is the last hold (server_reap_old_keepers). The configs that reloads
 * replaced are kept until the daemon stops: the kept definitions point into them. They
 * are small. */
#include "server_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config_diff.h"
#include "log.h"
#include "notify.h"

const struct server_unavailable *server_find_unavailable(const server *srv, const char *name)
{
    for (size_t i = 0; i < srv->n_unavailable; i++)
        if (strcmp(srv->unavailable[i].name, name) == 0)
            return &srv->unavailable[i];
    return NULL;
}

/* The arrays of one generation of datasets, filled before they replace the server's. */
struct server_gen {
    dataset **datasets;
    const struct config_dataset **defs;
    cache_keeper **keepers;
    dataset_watch **watches;
    size_t n;
    struct server_unavailable *unavailable;
    size_t n_unavailable;
};

static int server_gen_alloc(struct server_gen *g, size_t n)
{
    size_t k = n ? n : 1;
    memset(g, 0, sizeof *g);
    g->datasets = calloc(k, sizeof *g->datasets);
    g->defs = calloc(k, sizeof *g->defs);
    g->keepers = calloc(k, sizeof *g->keepers);
    g->watches = calloc(k, sizeof *g->watches);
    g->unavailable = calloc(k, sizeof *g->unavailable);
    if (g->datasets && g->defs && g->keepers && g->watches && g->unavailable)
        return 0;
    free(g->datasets);
    free(g->defs);
    free(g->keepers);
    free(g->watches);
    free(g->unavailable);
    return LD_ENOMEM;
}

/* Into the server, whose arrays (already emptied of what they held) are freed. */
static void server_gen_install(server *srv, struct server_gen *g)
{
    free(srv->datasets);
    free(srv->defs);
    free(srv->keepers);
    free(srv->watches);
    free(srv->unavailable);
    srv->datasets = g->datasets;
    srv->defs = g->defs;
    srv->keepers = g->keepers;
    srv->watches = g->watches;
    srv->n_datasets = g->n;
    srv->unavailable = g->unavailable;
    srv->n_unavailable = g->n_unavailable;
}

/* A newly opened dataset joins g: its folder watch and its cache keeper start. */
static void server_gen_add_opened(server *srv, struct server_gen *g, dataset *d, const struct config_dataset *def)
{
    char err[LD_ERRMSG_MAX];
    size_t i = g->n++;
    g->datasets[i] = d;
    g->defs[i] = def;
    if (dataset_watch_new(def, d, &g->watches[i], err) < 0)
        ld_log(LD_LOG_WARN, "%s; files added later are served after a reload or a restart", err);
    if (def->cache_path && cache_keeper_new(srv->loop, d, def, &g->keepers[i], err) < 0)
        ld_log(LD_LOG_WARN, "%s; serving from the source", err); /* a cache is an optimisation */
}

static void server_gen_add_unavailable(struct server_gen *g, const struct config *cfg,
                                       const struct config_dataset *def, const char *why)
{
    struct server_unavailable *u = &g->unavailable[g->n_unavailable++];
    struct config_pos at = config_dataset_error_at(def, why);
    snprintf(u->name, sizeof u->name, "%s", def->name);
    snprintf(u->reason, sizeof u->reason, "%s:%d:%d: %s", cfg->file, at.line, at.column, why);
}

int server_install_datasets(server *srv, dataset *const *opened, char *const *why, char *errbuf)
{
    struct server_gen g;
    if (server_gen_alloc(&g, srv->cfg->n_datasets) < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "cannot set up %zu datasets: out of memory", srv->cfg->n_datasets);
        return LD_ENOMEM;
    }
    for (size_t i = 0; i < srv->cfg->n_datasets; i++) {
        const struct config_dataset *def = &srv->cfg->datasets[i];
        if (opened[i])
            server_gen_add_opened(srv, &g, opened[i], def);
        else
            server_gen_add_unavailable(&g, srv->cfg, def, why[i] ? why[i] : "cannot be opened");
    }
    server_gen_install(srv, &g);
    return 0;
}

/* ---- a reload ------------------------------------------------------------------- */

struct server_reload_report {
    cJSON *json;                    /* the reply's body */
    cJSON *restart;                 /* "restart_needed": [{key, running, file}] */
};

static void server_reload_restart_key(void *ctx, const char *key, const char *running, const char *loaded)
{
    struct server_reload_report *rp = ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddStringToObject(o, "running", running);
    cJSON_AddStringToObject(o, "file", loaded);
    cJSON_AddItemToArray(rp->restart, o);
    ld_log(LD_LOG_WARN, "reload: %s changed from '%s' to '%s': that takes a restart; '%s' stays until then", key,
           running, loaded, running);
}

/* A live server key whose value changed, for the report. */
static void server_reload_live_key(cJSON *live, const char *key, uint64_t was, uint64_t now)
{
    if (was == now)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddNumberToObject(o, "was", (double)was);
    cJSON_AddNumberToObject(o, "now", (double)now);
    cJSON_AddItemToArray(live, o);
    ld_log(LD_LOG_INFO, "reload: %s is now %" PRIu64 " (was %" PRIu64 ")", key, now, was);
}

static void server_reload_live_keys(const struct config *was, const struct config *now, cJSON *live)
{
    server_reload_live_key(live, "server.memory_budget", was->memory_budget, now->memory_budget);
    server_reload_live_key(live, "server.device_memory_budget", was->device_memory_budget, now->device_memory_budget);
    server_reload_live_key(live, "server.max_clients", was->max_clients, now->max_clients);
    server_reload_live_key(live, "server.max_streams", was->max_streams, now->max_streams);
    server_reload_live_key(live, "server.max_frame", was->max_frame, now->max_frame);
    server_reload_live_key(live, "server.prefetch", was->prefetch, now->prefetch);
    server_reload_live_key(live, "server.share_max_lag", was->share_max_lag, now->share_max_lag);
    server_reload_live_key(live, "server.hello_timeout", was->hello_timeout_s, now->hello_timeout_s);
    server_reload_live_key(live, "server.idle_timeout", was->idle_timeout_s, now->idle_timeout_s);
    server_reload_live_key(live, "server.max_reply_bytes", was->max_reply_bytes, now->max_reply_bytes);
    server_reload_live_key(live, "server.max_total_reply_bytes", was->max_total_reply_bytes,
                           now->max_total_reply_bytes);
    server_reload_live_key(live, "server.log_level", (uint64_t)was->log_level, (uint64_t)now->log_level);
    if (was->log_level != now->log_level)
        ld_log_set_level(now->log_level);
}

/* An old dataset that the new config changed or removed: its streams finish on it. */
static int server_reload_retire(server *srv, size_t j)
{
    dataset *d = srv->datasets[j];
    int streams = 0;
    for (conn *c = srv->conns; c; c = c->next)
        for (struct conn_stream *cs = c->streams; cs; cs = cs->next)
            streams += stream_dataset(cs->s) == d;
    dataset_watch_free(srv->watches[j]);
    srv->watches[j] = NULL;
    if (srv->keepers[j]) { /* room was made before anything changed */
        srv->old_keepers[srv->n_old_keepers++] = (struct server_old_keeper){srv->keepers[j], d};
        dataset_hold(d); /* the keeper's: released when it stops (server_reap_old_keepers) */
        srv->keepers[j] = NULL;
    }
    d->retired = true;
    if (d->holders == 0)
        dataset_free(d);
    srv->datasets[j] = NULL;
    return streams;
}

static void server_reload_note(cJSON *list, const char *name, int streams, const char *what)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "streams", streams);
    cJSON_AddItemToArray(list, o);
    if (streams)
        ld_log(LD_LOG_INFO, "reload: dataset '%s' %s; its %d open stream(s) finish on the old definition", name,
               what, streams);
    else
        ld_log(LD_LOG_INFO, "reload: dataset '%s' %s", name, what);
}

/* A reload in flight: the new config, loaded and valid, and what the scan thread opened
 * for it. The thread owns opened, why and open_ns until it posts `done`; the loop owns
 * everything else. */
struct server_reload_job {
    struct hub_completion done;     /* posted by the scan thread when it has finished */
    server *srv;
    struct config *ncfg;            /* until applied */
    size_t n;                       /* its datasets */
    bool *scan;                     /* per ncfg dataset: added or changed, so opened here */
    dataset **opened;               /* per ncfg dataset: what the scan opened, or NULL */
    char **why;                     /* per ncfg dataset: why it could not be opened */
    uint64_t *open_ns;              /* per ncfg dataset: how long it took */
    pthread_t thread;
    bool thread_live;
    uint64_t t0;
    uint64_t conn_id;               /* the connection that asked (0: SIGHUP) */
    struct reply *reply;            /* its outbox entry, filled once applied (if it is still there) */
    int64_t req_id;
};

/* Applies job->ncfg (loaded, valid; its added and changed datasets already opened by
 * the scan). Takes ncfg and the opened datasets; fills rp. 0, or LD_ENOMEM before
 * anything changed. */
static int server_reload_apply(server *srv, struct server_reload_job *job, struct server_reload_report *rp,
                               char *errbuf)
{
    struct config *ncfg = job->ncfg;
    job->ncfg = NULL;
    struct server_gen g;
    struct config **olds = realloc(srv->old_cfgs, (srv->n_old_cfgs + 1) * sizeof *srv->old_cfgs);
    if (olds)
        srv->old_cfgs = olds;
    struct server_old_keeper *oks =
        realloc(srv->old_keepers, (srv->n_old_keepers + srv->n_datasets + 1) * sizeof *srv->old_keepers);
    if (oks)
        srv->old_keepers = oks;
    bool *kept = calloc(srv->n_datasets ? srv->n_datasets : 1, sizeof *kept);
    if (!olds || !oks || !kept || server_gen_alloc(&g, ncfg->n_datasets) < 0) {
        free(kept);
        config_free(ncfg);
        snprintf(errbuf, LD_ERRMSG_MAX, "reload: out of memory; the running config stays");
        return LD_ENOMEM;
    }
    cJSON *j = rp->json;
    cJSON *added = cJSON_AddArrayToObject(j, "added"), *changed = cJSON_AddArrayToObject(j, "changed");
    cJSON *removed = cJSON_AddArrayToObject(j, "removed"), *same = cJSON_AddArrayToObject(j, "unchanged");
    cJSON *unavail = cJSON_AddArrayToObject(j, "unavailable"), *live = cJSON_AddArrayToObject(j, "live");
    config_diff_restart_keys(srv->cfg, ncfg, server_reload_restart_key, rp);
    server_reload_live_keys(srv->cfg, ncfg, live);

    for (size_t i = 0; i < ncfg->n_datasets; i++) {
        const struct config_dataset *nd = &ncfg->datasets[i];
        size_t k = 0;
        while (k < srv->n_datasets && strcmp(srv->datasets[k]->name, nd->name) != 0)
            k++;
        if (k < srv->n_datasets && config_dataset_same(srv->defs[k], nd)) {
            dataset_free(job->opened[i]); /* NULL: one reload at a time, so the scan skipped it */
            job->opened[i] = NULL;
            size_t n = g.n++;
            g.datasets[n] = srv->datasets[k];
            g.defs[n] = srv->defs[k]; /* in an older config, which is kept */
            g.keepers[n] = srv->keepers[k];
            g.watches[n] = srv->watches[k];
            kept[k] = true;
            cJSON_AddItemToArray(same, cJSON_CreateString(nd->name));
            continue;
        }
        dataset *d = job->opened[i];
        job->opened[i] = NULL;
        if (!d) {
            server_gen_add_unavailable(&g, ncfg, nd, job->why[i] ? job->why[i] : "cannot be opened");
            struct server_unavailable *u = &g.unavailable[g.n_unavailable - 1];
            ld_log(LD_LOG_WARN, "reload: dataset '%s' is unavailable: %s", nd->name, u->reason);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", nd->name);
            cJSON_AddStringToObject(o, "reason", u->reason);
            cJSON_AddItemToArray(unavail, o);
            continue;
        }
        ld_log(LD_LOG_INFO, "reload: dataset '%s' (%s): %" PRIu64 " samples from %s, opened in %.1f ms", d->name,
               dataset_kind(d), d->count, d->source, (double)job->open_ns[i] / 1e6);
        server_gen_add_opened(srv, &g, d, nd);
        if (k == srv->n_datasets)
            cJSON_AddItemToArray(added, cJSON_CreateString(nd->name));
    }
    /* What the new config does not keep: changed (its name is still there) or removed. */
    for (size_t k = 0; k < srv->n_datasets; k++) {
        if (kept[k])
            continue;
        char name[LD_NAME_MAX];
        snprintf(name, sizeof name, "%s", srv->datasets[k]->name);
        bool still = false;
        for (size_t i = 0; i < ncfg->n_datasets && !still; i++)
            still = strcmp(ncfg->datasets[i].name, name) == 0;
        int streams = server_reload_retire(srv, k);
        server_reload_note(still ? changed : removed, name, streams, still ? "changed" : "was removed");
    }
    free(kept);
    srv->old_cfgs[srv->n_old_cfgs++] = srv->cfg;
    srv->cfg = ncfg;
    server_gen_install(srv, &g);
    return 0;
}

static void server_reload_job_free(struct server_reload_job *job)
{
    if (!job)
        return;
    for (size_t i = 0; job->opened && job->why && i < job->n; i++) {
        dataset_free(job->opened[i]);
        free(job->why[i]);
    }
    config_free(job->ncfg);
    free(job->scan);
    free(job->opened);
    free(job->why);
    free(job->open_ns);
    free(job);
}

/* The scan: opens (walks, indexes) the added and changed datasets off the loop, so that
 * a big folder does not hold up the other clients' requests. dataset_open touches only
 * the definition it is given and what it builds. */
static void *server_reload_scan_main(void *arg)
{
    struct server_reload_job *job = arg;
    for (size_t i = 0; i < job->n; i++) {
        if (!job->scan[i])
            continue;
        char err[LD_ERRMSG_MAX] = "";
        uint64_t t0 = uv_hrtime();
        if (dataset_open(&job->ncfg->datasets[i], &job->opened[i], err) < 0) {
            job->opened[i] = NULL;
            job->why[i] = strdup(err[0] ? err : "cannot be opened");
        }
        job->open_ns[i] = uv_hrtime() - t0;
    }
    hub_post(job->srv->hub, &job->done);
    return NULL;
}

/* The connection that asked for the reload, if it is still there. */
static conn *server_reload_asker(server *srv, uint64_t conn_id)
{
    for (conn *c = srv->conns; c && conn_id; c = c->next)
        if (c->id == conn_id && c->state != CONN_CLOSED)
            return c;
    return NULL;
}

/* Ends a reload: the reply to the connection that asked (msg, consumed), systemd told. */
static void server_reload_finish(server *srv, struct server_reload_job *job, cJSON *msg)
{
    conn *c = server_reload_asker(srv, job->conn_id);
    if (c && job->reply)
        server_reply_fill(c, job->reply, msg);
    else
        cJSON_Delete(msg);
    notify_send("READY=1");
}

static void server_reload_start(server *srv, uint64_t conn_id, struct reply *reply, int64_t req_id);

/* The scan is done (on the loop): applies the new config, or drops it when the daemon
 * is stopping. */
static void server_reload_scanned(struct hub_completion *hc)
{
    struct server_reload_job *job = (struct server_reload_job *)((char *)hc - offsetof(struct server_reload_job, done));
    server *srv = job->srv;
    char errbuf[LD_ERRMSG_MAX];
    if (job->thread_live)
        pthread_join(job->thread, NULL);
    srv->reload_job = NULL;
    if (srv->stopping) {
        ld_log(LD_LOG_INFO, "reload dropped: the daemon is stopping");
        server_reload_finish(srv, job, proto_reply_error(job->req_id, LD_ECLOSED, "the daemon is stopping"));
        server_reload_job_free(job);
        server_closed_one(srv);
        return;
    }
    struct server_reload_report rp = {0};
    int rc = 0;
    if (!(rp.json = cJSON_CreateObject()) || !(rp.restart = cJSON_AddArrayToObject(rp.json, "restart_needed"))) {
        snprintf(errbuf, LD_ERRMSG_MAX, "reload: out of memory; the running config stays");
        rc = LD_ENOMEM;
    }
    if (rc == 0)
        rc = server_reload_apply(srv, job, &rp, errbuf);
    cJSON *msg;
    if (rc == 0) {
        int denied_conns, denied_streams;
        srv->reloads++;
        server_reload_recheck_access(srv, &denied_conns, &denied_streams);
        cJSON_AddNumberToObject(rp.json, "datasets", (double)srv->n_datasets);
        cJSON_AddNumberToObject(rp.json, "connections_denied", denied_conns);
        cJSON_AddNumberToObject(rp.json, "streams_denied", denied_streams);
        ld_log(LD_LOG_INFO, "reloaded %s in %.1f ms: %zu datasets served, %zu unavailable", srv->cfg->file,
               (double)(uv_hrtime() - job->t0) / 1e6, srv->n_datasets, srv->n_unavailable);
        msg = proto_reply_ok(job->req_id);
        for (cJSON *it = rp.json->child; it;) { /* the report's members move into the reply */
            cJSON *next = it->next;
            cJSON_AddItemToObject(msg, it->string, cJSON_DetachItemViaPointer(rp.json, it));
            it = next;
        }
    } else {
        ld_log(LD_LOG_ERROR, "reload refused, the running config stays: %s", errbuf);
        msg = proto_reply_error(job->req_id, rc, errbuf);
    }
    cJSON_Delete(rp.json);
    server_reload_finish(srv, job, msg);
    server_reload_job_free(job);
    server_closed_one(srv);
    if (srv->reload_again) { /* a SIGHUP came while this one ran: the file may have changed since */
        srv->reload_again = false;
        server_reload_start(srv, 0, NULL, -1);
    }
}

/* Loads the file again (on the loop: it is small, and an error is answered at once) and
 * starts the scan of what it adds and changes; the config is applied once the scan is
 * done (server_reload_scanned). reply: the asking connection's outbox entry, or NULL. */
static void server_reload_start(server *srv, uint64_t conn_id, struct reply *reply, int64_t req_id)
{
    char mono[64], errbuf[LD_ERRMSG_MAX];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(mono, sizeof mono, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64,
             (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
    notify_send(mono);
    struct server_reload_job *job = calloc(1, sizeof *job);
    int rc = job ? config_load(srv->cfg->file, &job->ncfg, errbuf) : LD_ENOMEM;
    if (!job)
        snprintf(errbuf, LD_ERRMSG_MAX, "reload: out of memory; the running config stays");
    if (rc == 0) {
        job->n = job->ncfg->n_datasets;
        size_t n = job->n ? job->n : 1;
        job->scan = calloc(n, sizeof *job->scan);
        job->opened = calloc(n, sizeof *job->opened);
        job->why = calloc(n, sizeof *job->why);
        job->open_ns = calloc(n, sizeof *job->open_ns);
        if (!job->scan || !job->opened || !job->why || !job->open_ns) {
            snprintf(errbuf, LD_ERRMSG_MAX, "reload: out of memory; the running config stays");
            rc = LD_ENOMEM;
        }
    }
    if (rc < 0) {
        ld_log(LD_LOG_ERROR, "reload refused, the running config stays: %s", errbuf);
        struct server_reload_job fail = {.conn_id = conn_id, .reply = reply, .req_id = req_id};
        server_reload_finish(srv, &fail, proto_reply_error(req_id, rc, errbuf));
        server_reload_job_free(job);
        return;
    }
    job->srv = srv;
    job->conn_id = conn_id;
    job->reply = reply;
    job->req_id = req_id;
    job->t0 = uv_hrtime();
    job->done.done = server_reload_scanned;
    size_t to_scan = 0;
    for (size_t i = 0; i < job->ncfg->n_datasets; i++) {
        const struct config_dataset *nd = &job->ncfg->datasets[i];
        bool same = false;
        for (size_t k = 0; k < srv->n_datasets && !same; k++)
            same = strcmp(srv->datasets[k]->name, nd->name) == 0 && config_dataset_same(srv->defs[k], nd);
        job->scan[i] = !same;
        to_scan += !same;
    }
    srv->reload_job = job;
    srv->pending_closes++; /* a stop waits for the scan */
    if (to_scan) {
        ld_log(LD_LOG_INFO, "reload: opening %zu added or changed dataset(s) on a thread of their own", to_scan);
        job->thread_live = pthread_create(&job->thread, NULL, server_reload_scan_main, job) == 0;
        if (job->thread_live)
            return;
        ld_log(LD_LOG_WARN, "reload: cannot start a thread; opening the datasets on the loop");
    }
    server_reload_scan_main(job); /* nothing to open, or no thread: posts at once */
}

void server_reload_signal(server *srv)
{
    if (srv->stopping)
        return;
    ld_log(LD_LOG_INFO, "received SIGHUP: reloading %s", srv->cfg->file);
    if (srv->reload_job) {
        ld_log(LD_LOG_INFO, "a reload is running; the file is read again once it is done");
        srv->reload_again = true;
        return;
    }
    server_reload_start(srv, 0, NULL, -1);
}

void server_ops_reload(conn *c, const cJSON *req, int64_t id)
{
    (void)req;
    server *srv = c->srv;
    ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s) asks for a reload of %s", c->id, c->name, srv->cfg->file);
    if (srv->reload_job) {
        char err[LD_ERRMSG_MAX];
        snprintf(err, sizeof err, "a reload is already running (started %.0f ms ago, opening the datasets it "
                 "adds or changes); ask again when it is done", (double)(uv_hrtime() - srv->reload_job->t0) / 1e6);
        server_reply_error(c, id, LD_EBUSY, err);
        return;
    }
    struct reply *r = server_outbox_add(c, id); /* answered once the config is applied */
    if (!r) {
        server_conn_abort(c);
        return;
    }
    server_reload_start(srv, c->id, r, id);
}

/* ---- the cache keepers of retired datasets ---------------------------------------- */

struct server_reaped_keeper {
    server *srv;
    struct server_old_keeper ok;
};

static void server_reload_keeper_closed(void *ctx)
{
    struct server_reaped_keeper *rk = ctx;
    server *srv = rk->srv;
    cache_keeper_free(rk->ok.k);
    dataset_release(rk->ok.d); /* retired: freed here, its last holder */
    free(rk);
    server_closed_one(srv);
}

void server_reap_old_keepers(server *srv)
{
    size_t kept = 0;
    for (size_t i = 0; i < srv->n_old_keepers; i++) {
        struct server_old_keeper ok = srv->old_keepers[i];
        struct server_reaped_keeper *rk = ok.d->holders == 1 ? malloc(sizeof *rk) : NULL;
        if (!rk) { /* a stream or a cache job still holds the dataset (or memory is short) */
            srv->old_keepers[kept++] = ok;
            continue;
        }
        /* Only the keeper's own hold is left: no stream reads through it any more. */
        ld_log(LD_LOG_INFO, "reload: the last stream of the old definition of '%s' is gone; its cache keeper "
               "stops", ok.d->name);
        *rk = (struct server_reaped_keeper){srv, ok};
        srv->pending_closes++; /* a stop waits for it */
        cache_keeper_close(ok.k, server_reload_keeper_closed, rk);
    }
    srv->n_old_keepers = kept;
}

void server_close_old_keepers(server *srv)
{
    for (size_t i = 0; i < srv->n_old_keepers; i++) {
        srv->pending_closes++;
        cache_keeper_close(srv->old_keepers[i].k, server_part_closed, srv);
    }
}

void server_reload_free(server *srv)
{
    for (size_t i = 0; i < srv->n_old_keepers; i++) {
        cache_keeper_free(srv->old_keepers[i].k);
        dataset_release(srv->old_keepers[i].d);
    }
    free(srv->old_keepers);
    for (size_t i = 0; i < srv->n_old_cfgs; i++)
        config_free(srv->old_cfgs[i]);
    free(srv->old_cfgs);
}
