/* server_reload — the config read again while the daemon runs (`loaderctl reload`,
 * SIGHUP), and the datasets that could not be opened.
 *
 * A reload loads the file the daemon started with, by the same code and with the same
 * "FILE:LINE:COLUMN: " errors as at start; a file with an error is refused whole and
 * the running config stays. Otherwise each dataset of the new file is compared with
 * the running one of its name (config_diff.h): one defined the same keeps its open
 * dataset, its cache keeper and its folder watch, so its streams never notice; an
 * added or changed one is opened (on the loop thread: a big folder's scan delays the
 * other clients' requests that long); a changed or removed one is retired: streams
 * already open on it keep reading the old definition to their end (the dataset is
 * freed by its last holder, dataset_watch.h), and new opens get the new one. A dataset
 * that cannot be opened (its path is missing or unreadable), at start or at a reload,
 * is unavailable: listed with the reason, refused at open, tried again at each reload.
 *
 * A retired dataset's cache keeper keeps running, holding the dataset, while its streams
 * may still read the cache; the server's tick stops it (and so frees the dataset) once
 * the keeper's is the last hold (server_reap_old_keepers). The configs that reloads
 * replaced are kept until the daemon stops: the kept definitions point into them. They
 * are small. */
#include "server_internal.h"

#include <inttypes.h>
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

/* Applies ncfg (loaded, valid). Takes ncfg; fills rp. 0, or LD_ENOMEM before anything
 * changed. */
static int server_reload_apply(server *srv, struct config *ncfg, struct server_reload_report *rp, char *errbuf)
{
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
            size_t n = g.n++;
            g.datasets[n] = srv->datasets[k];
            g.defs[n] = srv->defs[k]; /* in an older config, which is kept */
            g.keepers[n] = srv->keepers[k];
            g.watches[n] = srv->watches[k];
            kept[k] = true;
            cJSON_AddItemToArray(same, cJSON_CreateString(nd->name));
            continue;
        }
        char err[LD_ERRMSG_MAX];
        dataset *d = NULL;
        uint64_t t0 = uv_hrtime();
        if (dataset_open(nd, &d, err) < 0) {
            server_gen_add_unavailable(&g, ncfg, nd, err);
            struct server_unavailable *u = &g.unavailable[g.n_unavailable - 1];
            ld_log(LD_LOG_WARN, "reload: dataset '%s' is unavailable: %s", nd->name, u->reason);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", nd->name);
            cJSON_AddStringToObject(o, "reason", u->reason);
            cJSON_AddItemToArray(unavail, o);
            continue;
        }
        ld_log(LD_LOG_INFO, "reload: dataset '%s' (%s): %" PRIu64 " samples from %s, opened in %.1f ms", d->name,
               dataset_kind(d), d->count, d->source, (double)(uv_hrtime() - t0) / 1e6);
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

/* Loads the file again and applies it; on success *ret_report is what changed. */
static int server_reload_run(server *srv, cJSON **ret_report, char *errbuf)
{
    char mono[64];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(mono, sizeof mono, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64,
             (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
    notify_send(mono);
    uint64_t t0 = uv_hrtime();
    struct config *ncfg = NULL;
    struct server_reload_report rp = {0};
    int rc = config_load(srv->cfg->file, &ncfg, errbuf);
    if (rc == 0 && (!(rp.json = cJSON_CreateObject()) ||
                    !(rp.restart = cJSON_AddArrayToObject(rp.json, "restart_needed")))) {
        config_free(ncfg);
        snprintf(errbuf, LD_ERRMSG_MAX, "reload: out of memory; the running config stays");
        rc = LD_ENOMEM;
    }
    if (rc == 0)
        rc = server_reload_apply(srv, ncfg, &rp, errbuf);
    if (rc == 0) {
        srv->reloads++;
        cJSON_AddNumberToObject(rp.json, "datasets", (double)srv->n_datasets);
        ld_log(LD_LOG_INFO, "reloaded %s in %.1f ms: %zu datasets served, %zu unavailable", srv->cfg->file,
               (double)(uv_hrtime() - t0) / 1e6, srv->n_datasets, srv->n_unavailable);
        *ret_report = rp.json;
    } else {
        cJSON_Delete(rp.json);
        ld_log(LD_LOG_ERROR, "reload refused, the running config stays: %s", errbuf);
    }
    notify_send("READY=1");
    return rc;
}

void server_reload_signal(server *srv)
{
    char err[LD_ERRMSG_MAX];
    cJSON *report = NULL;
    if (srv->stopping)
        return;
    ld_log(LD_LOG_INFO, "received SIGHUP: reloading %s", srv->cfg->file);
    if (server_reload_run(srv, &report, err) == 0)
        cJSON_Delete(report);
}

void server_ops_reload(conn *c, const cJSON *req, int64_t id)
{
    (void)req;
    char err[LD_ERRMSG_MAX];
    cJSON *report = NULL;
    ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s) asks for a reload of %s", c->id, c->name, c->srv->cfg->file);
    int rc = server_reload_run(c->srv, &report, err);
    if (rc < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    cJSON *r = proto_reply_ok(id);
    cJSON *it = report->child;
    while (it) { /* the report's members move into the reply */
        cJSON *next = it->next;
        cJSON_AddItemToObject(r, it->string, cJSON_DetachItemViaPointer(report, it));
        it = next;
    }
    cJSON_Delete(report);
    server_reply_send(c, r);
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
