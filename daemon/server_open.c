/* server_open — the `open` request: a stream on a configured dataset, or on one the
 * trainer declares (declare.h); a consumer of a shared stream (share.h) when the
 * request names a share; and the hand-off in shared memory (handoff.h) when the client
 * asks for it. The checks come first (fields, access, the stream limits), and a refused
 * open leaves nothing behind: a dataset declared for it is freed with the error reply.
 * A declared dataset's scan runs on a thread (server_declare.c), which comes back here
 * through server_open_declared to finish the open with what it declared.
 *
 * The other requests are in server_ops.c, which dispatches this one from its ops[] table.
 */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "declare.h"
#include "log.h"
#include "ring.h"

/* A folder dataset follows files added or removed since its scan: *pd becomes the
 * fresh scan when its folder changed (dataset_watch.h). */
static int server_open_refresh_dataset(server *srv, dataset **pd, char *err)
{
    for (size_t i = 0; i < srv->n_datasets; i++) {
        if (srv->datasets[i] != *pd || !srv->watches[i])
            continue;
        int rc = dataset_watch_refresh(srv->watches[i], &srv->datasets[i], err);
        if (rc == 1 && srv->keepers[i])
            cache_keeper_set_dataset(srv->keepers[i], srv->datasets[i]);
        *pd = srv->datasets[i];
        return rc < 0 ? rc : 0;
    }
    return 0;
}

/* Whether the connection passes access.datasets.<name>; replies permission_denied when not. */
static bool server_open_dataset_allowed(conn *c, int64_t id, const char *name)
{
    char what[LD_NAME_MAX + 64], rule_name[LD_NAME_MAX + 32];
    snprintf(what, sizeof what, "open a stream on dataset '%s'", name);
    snprintf(rule_name, sizeof rule_name, "access.datasets.%s", name);
    return server_ops_allowed(c, id, access_dataset_rule(&c->srv->cfg->access, name), rule_name, what);
}

/* Whether the connection may open one more stream now; replies limit_reached when not. */
static bool server_open_may_open(conn *c, int64_t id)
{
    server *srv = c->srv;
    char err[LD_ERRMSG_MAX];
    if (c->reserved) {
        snprintf(err, sizeof err, "all %u client slots are taken (server.max_clients); this connection holds "
                 "the one kept for operator commands, which cannot open streams", srv->cfg->max_clients);
        server_reply_error(c, id, LD_ELIMIT, err);
        return false;
    }
    if (srv->n_streams >= srv->cfg->max_streams) {
        snprintf(err, sizeof err, "the daemon already serves %u streams (server.max_streams)", srv->n_streams);
        server_reply_error(c, id, LD_ELIMIT, err);
        return false;
    }
    return true;
}

/* What an open of a spec checks before its scan: the template (when it refines one)
 * exists and the connection may use it. Replies when not. */
static bool server_open_declare_allowed(conn *c, int64_t id, const char *template_name)
{
    server *srv = c->srv;
    char err[LD_ERRMSG_MAX];
    if (!template_name)
        return true;
    if (!server_ops_find_dataset(srv, template_name) && !server_find_unavailable(srv, template_name)) {
        snprintf(err, sizeof err, "no dataset named '%s' (see `loaderctl datasets`)", template_name);
        server_reply_error(c, id, LD_ENODATASET, err);
        return false;
    }
    return server_open_dataset_allowed(c, id, template_name);
}

/* A declared dataset this open will not use after all: freed, or, once its cache keeper
 * holds it, left to the keeper's stop (server_declare.c). */
static void server_open_drop_declared(dataset *d)
{
    if (d && d->keeper)
        d->retired = true;
    else
        dataset_free(d);
}

/* The open request's `share` and `share_join`: cs->s becomes a consumer of the shared
 * stream (opened now when the group is new), or stays NULL for a stream of its own
 * (no share, or a late joiner that asked for the whole epoch: p then starts there). */
static int server_open_share(server *srv, const cJSON *req, dataset *d, struct stream_params *p, uint64_t sid,
                             struct conn_stream *cs, char *err)
{
    const char *name = NULL, *join = "current";
    int rc;
    if (!cJSON_GetObjectItemCaseSensitive(req, "share"))
        return 0;
    if ((rc = proto_get_str(req, "share", LD_NAME_MAX - 1, &name, err)) < 0 ||
        (cJSON_GetObjectItemCaseSensitive(req, "share_join") &&
         (rc = proto_get_str(req, "share_join", 16, &join, err)) < 0))
        return rc;
    if (!*name) {
        ld_errorf(err, "field 'share': expected a name (or \"" SHARE_AUTO "\"), got an empty string");
        return LD_EFIELD;
    }
    bool whole_epoch = strcmp(join, "epoch_start") == 0;
    if (!whole_epoch && strcmp(join, "current") != 0) {
        ld_errorf(err, "field 'share_join': expected \"current\" or \"epoch_start\", got \"%s\"", join);
        return LD_EFIELD;
    }
    if (p->device.kind != DEVICE_HOST) {
        ld_errorf(err, "field 'share': a shared stream delivers host batches; open a device stream without share");
        return LD_EINVAL;
    }
    share_group *g;
    if ((rc = share_find(srv->set, name, d, p, &g, err)) < 0)
        return rc;
    if (g && whole_epoch) {
        /* Its own stream at batch 0 of the epoch the group is in. */
        uint64_t e = share_front_epoch(g), end = p->epoch + p->epochs;
        if (p->epochs && e >= end) {
            ld_errorf(err, "share '%s' has delivered all its epochs", name);
            return LD_EEND;
        }
        if (p->epochs)
            p->epochs = end - e;
        p->epoch = e;
        p->start_batch = 0;
        return 0;
    }
    bool fresh = !g;
    if (fresh) {
        uint64_t budget_left = srv->memory_used < srv->cfg->memory_budget ? srv->cfg->memory_budget - srv->memory_used : 0;
        stream *producer;
        p->extra_slots = srv->cfg->share_max_lag;
        if ((rc = stream_open(srv->set, d, ++srv->next_stream_id, p, budget_left, &producer, err)) < 0)
            return rc;
        if ((rc = share_group_new(srv->set, name, producer, srv->cfg->share_max_lag, &g)) < 0) {
            stream_close(producer);
            ld_errorf(err, "out of memory");
            return rc;
        }
        srv->memory_used += share_ring_bytes(g);
        ld_log(LD_LOG_INFO, "shared stream '%s': stream %" PRIu64 " prepares its batches", name, share_producer_id(g));
    }
    uint64_t bytes = share_ring_bytes(g);
    if ((rc = share_attach(g, sid, &cs->s)) < 0) {
        if (fresh)
            srv->memory_used -= bytes; /* share_attach closed the group it left empty */
        ld_errorf(err, "out of memory");
        return rc;
    }
    cs->share = g;
    return 0;
}

static void server_open_handoff_batch(void *ctx, uint64_t batches, uint64_t rows, uint64_t bytes)
{
    struct conn_stream *cs = ctx;
    server_ops_count_batches(cs->c, batches, rows, bytes);
}

/* The client wrote its release queue wrongly: the connection ends with the reason (the
 * write and the close go through the loop, so this may run inside a stream's answer). */
static void server_open_handoff_fail(void *ctx, int code, const char *message)
{
    struct conn_stream *cs = ctx;
    server_conn_fatal(cs->c, code, message);
}

/* The open; for a spec, first its checks and the scan on a thread (server_declare.c),
 * then again with what the scan declared (*pdeclared, taken when the open uses it;
 * left for the caller to free when the open is refused before) and where its cache
 * goes (place, NULL when none). */
static void server_open_run(conn *c, const cJSON *req, int64_t id, dataset **pdeclared, struct declare_cache *place)
{
    server *srv = c->srv;
    char err[LD_ERRMSG_MAX];
    const char *name = NULL;
    int64_t batch, seed, epoch, rank, world, start, prefetch, epochs, handoff_version;
    bool shuffle, drop_last;
    int rc;
    /* "spec": a dataset the trainer declares; with "template" (or "dataset"), the keys
     * that refine a configured one (declare.h). */
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(req, "spec");
    const char *key = spec && cJSON_GetObjectItemCaseSensitive(req, "template") ? "template" : "dataset";
    if (((!spec || cJSON_GetObjectItemCaseSensitive(req, key)) &&
         (rc = proto_get_str(req, key, LD_NAME_MAX - 1, &name, err)) < 0) ||
        (rc = proto_get_int(req, "batch_size", 1, LD_BATCH_SIZE_MAX, &batch, err)) < 0 ||
        (rc = proto_opt_bool(req, "shuffle", true, &shuffle, err)) < 0 ||
        (rc = proto_opt_int(req, "seed", 0, LD_JSON_SAFE_INT, 0, &seed, err)) < 0 ||
        (rc = proto_opt_int(req, "epoch", 0, LD_JSON_SAFE_INT, 0, &epoch, err)) < 0 ||
        (rc = proto_opt_int(req, "world_size", 1, LD_WORLD_SIZE_MAX, 1, &world, err)) < 0 ||
        (rc = proto_opt_int(req, "rank", 0, LD_WORLD_SIZE_MAX - 1, 0, &rank, err)) < 0 ||
        (rc = proto_opt_bool(req, "drop_last", false, &drop_last, err)) < 0 ||
        (rc = proto_opt_int(req, "start_batch", 0, LD_JSON_SAFE_INT, 0, &start, err)) < 0 ||
        (rc = proto_opt_int(req, "prefetch", 1, LD_PREFETCH_MAX, srv->cfg->prefetch, &prefetch, err)) < 0 ||
        (rc = proto_opt_int(req, "epochs", 0, LD_JSON_SAFE_INT, 0, &epochs, err)) < 0 ||
        (rc = proto_opt_int(req, "handoff", 0, LD_JSON_SAFE_INT, 0, &handoff_version, err)) < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    if (spec && cJSON_GetObjectItemCaseSensitive(req, "share")) {
        /* Each open declares a dataset of its own: two of them are never the same one. */
        server_reply_error(c, id, LD_ENOTSUP, "field 'share': a stream of a declared dataset (spec) cannot be "
                                              "shared; share a configured dataset");
        return;
    }
    if ((rc = proto_epoch_span(epoch, epochs, &epochs, err)) < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    /* Where batches go (device.h): "device", "transfer", "device_normalize". */
    const char *device = NULL, *transfer = NULL;
    struct device_spec dev;
    if ((cJSON_GetObjectItemCaseSensitive(req, "device") &&
         (rc = proto_get_str(req, "device", LD_DEVICE_NAME_MAX - 1, &device, err)) < 0) ||
        (cJSON_GetObjectItemCaseSensitive(req, "transfer") &&
         (rc = proto_get_str(req, "transfer", 16, &transfer, err)) < 0) ||
        (rc = device_parse(device, transfer, &dev, err)) < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    if (rank >= world) {
        snprintf(err, sizeof err, "rank %" PRId64 " is not below world_size %" PRId64, rank, world);
        server_reply_error(c, id, LD_EINVAL, err);
        return;
    }
    dataset *d = NULL;
    if (spec && !pdeclared) {
        /* The scan and the check take a while: a thread runs them, and the open goes
         * on from server_open_declared once they are done. */
        if (server_open_may_open(c, id) && server_open_declare_allowed(c, id, name))
            server_declare_start(c, req, id, name);
        return;
    }
    if (spec) {
        if (!server_open_may_open(c, id))
            return;
        d = *pdeclared;
        *pdeclared = NULL; /* this open's from here */
        name = d->name;
    } else {
        d = server_ops_find_dataset(srv, name);
    }
    const struct server_unavailable *u = d ? NULL : server_find_unavailable(srv, name);
    if (u) {
        ld_errorf(err, "dataset '%s' is unavailable: %s (fix it, then `loaderctl reload`)", name,
                 u->reason);
        server_reply_error(c, id, LD_EDATASET, err);
        return;
    }
    if (!d) {
        snprintf(err, sizeof err, "no dataset named '%s' (see `loaderctl datasets`)", name);
        server_reply_error(c, id, LD_ENODATASET, err);
        return;
    }
    if (!spec && (!server_open_dataset_allowed(c, id, name) || !server_open_may_open(c, id)))
        return;
    dataset *declared = spec ? d : NULL; /* the stream will own it; until then, this op */
    if ((rc = server_open_refresh_dataset(srv, &d, err)) < 0) {
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): open '%s' failed: %s", c->id, c->name, name, err);
        server_reply_error(c, id, rc, err);
        return;
    }
    struct device_normalize *norm = calloc(1, sizeof *norm);
    if (!norm) {
        server_open_drop_declared(declared);
        server_reply_error(c, id, LD_ENOMEM, NULL);
        return;
    }
    const cJSON *jnorm = cJSON_GetObjectItemCaseSensitive(req, "device_normalize");
    if (jnorm && !cJSON_IsNull(jnorm) && (dev.kind != DEVICE_CUDA || dev.transfer_client)) {
        snprintf(err, sizeof err, "field 'device_normalize': needs \"device\": \"cuda:N\" with transfer \"ipc\" "
                 "(the daemon's GPU runs it)");
        rc = LD_EFIELD;
    } else {
        rc = device_normalize_parse(jnorm, d, norm, err);
    }
    if (rc < 0) {
        free(norm);
        server_open_drop_declared(declared);
        server_reply_error(c, id, rc, err);
        return;
    }
    struct conn_stream *cs = calloc(1, sizeof *cs);
    if (!cs) {
        free(norm);
        server_open_drop_declared(declared);
        server_reply_error(c, id, LD_ENOMEM, NULL);
        return;
    }
    struct stream_params p = {
        .batch_size = (uint32_t)batch, .shuffle = shuffle, .seed = (uint64_t)seed,
        .epoch = (uint64_t)epoch, .rank = (uint32_t)rank, .world_size = (uint32_t)world,
        .drop_last = drop_last, .start_batch = (uint64_t)start, .prefetch = (uint32_t)prefetch,
        .epochs = (uint64_t)epochs, .device = dev, .norm = norm, .device_budget = srv->cfg->device_memory_budget,
        .uid = c->uid, .client_weight = 1, .client_max_share = 1,
    };
    const struct config_client *cc = config_client_for_uid(srv->cfg, c->uid);
    if (cc) {
        p.client_weight = cc->weight;
        p.client_max_share = cc->max_share;
    }
    if (declared && place && place->dirfd >= 0 && server_declare_keep_cache(srv, declared, c->uid, place, err) < 0)
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): declared dataset '%s' has no cache: %s", c->id, c->name,
               declared->name, err);
    uint64_t sid = ++srv->next_stream_id;
    /* A reload may have lowered the budget below what is in use. */
    uint64_t budget_left = srv->memory_used < srv->cfg->memory_budget ? srv->cfg->memory_budget - srv->memory_used : 0;
    err[0] = '\0';
    rc = server_open_share(srv, req, d, &p, sid, cs, err);
    if (rc == 0 && !cs->s) {
        rc = stream_open(srv->set, d, sid, &p, budget_left, &cs->s, err);
        if (rc == 0)
            cs->ring_bytes = stream_ring_bytes(cs->s);
    }
    free(norm); /* the stage keeps what it needs */
    if (rc < 0) {
        free(cs);
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): open '%s' failed: %s", c->id, c->name, name, err);
        server_open_drop_declared(declared);
        server_reply_error(c, id, rc, err);
        return;
    }
    if (declared)
        declared->retired = true; /* freed when its last stream lets it go (dataset_watch.h) */
    cs->c = c;
    cs->id = sid;
    /* A client that asks for the hand-off and does not get it uses the socket (the
     * consumers of a shared stream do, and a client of the named layout, version 1). */
    if (handoff_version >= LD_HANDOFF_VERSION && !cs->share &&
        handoff_open(cs->s, sid, ring_slot_count(stream_ring(cs->s)), server_open_handoff_batch,
                     server_open_handoff_fail, cs, &cs->ho, err) < 0)
        ld_log(LD_LOG_WARN, "stream %" PRIu64 ": no hand-off in shared memory, the socket carries its batches: %s",
               sid, err);
    cs->next = c->streams;
    c->streams = cs;
    srv->memory_used += cs->ring_bytes;
    srv->n_streams++;
    ld_log(LD_LOG_INFO, "stream %" PRIu64 " opened on '%s' by client %" PRIu64 " (%s): batch %u, seed %" PRIu64
           ", epoch %" PRIu64 ", rank %u/%u, prefetch %u",
           sid, name, c->id, c->name, p.batch_size, p.seed, p.epoch, p.rank, p.world_size, p.prefetch);
    cJSON *r = proto_reply_ok(id);
    stream_describe_layout(cs->s, r);
    if (cs->share) {
        cJSON_AddStringToObject(r, "share", share_name(cs->share));
        cJSON_AddNumberToObject(r, "ring_stream", (double)share_producer_id(cs->share));
        cJSON_AddNumberToObject(r, "consumers", share_consumers(cs->share));
        uint64_t e, b;
        share_position(cs->s, &e, &b);
        cJSON_AddNumberToObject(r, "start_epoch", (double)e);
        cJSON_AddNumberToObject(r, "start_batch", (double)b);
    }
    /* stream_open told the dataset's cache keeper. The hand-off's memory has no name: its
     * descriptor goes with the reply. */
    if (cs->ho) {
        handoff_describe(cs->ho, r);
        server_reply_send_fd(c, r, handoff_take_fd(cs->ho));
    } else {
        server_reply_send(c, r);
    }
}

void server_open_stream(conn *c, const cJSON *req, int64_t id)
{
    server_open_run(c, req, id, NULL, NULL);
}

void server_open_declared(conn *c, const cJSON *req, int64_t id, dataset *d, struct declare_cache *place)
{
    server_open_run(c, req, id, &d, place);
    dataset_free(d); /* refused before the open took it */
}
