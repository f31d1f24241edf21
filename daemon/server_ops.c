/* server_ops — the requests a client may send: the ops[] table and one server_op_* per
 * request, each reading its fields, doing its work and queueing its reply
 * (server_conn.c writes it). The `open` request is server_open.c's.
 *
 * A request is answered in one of two ways. Most are answered at once: the reply is
 * filled before the handler returns (a `next` whose batch is ready too: stream_next
 * returns the answer). A `next` that must wait and a `cache_verify` are answered later,
 * from the loop: the handler takes an outbox entry (which holds the reply's place in
 * request order) and hands it to the stream or the cache keeper, whose callback fills
 * it. Neither callback ever runs inside the handler, so a handler can trust the
 * connection and its streams until it returns.
 *
 * A wrong request gets an error reply naming the field and the reason (proto.h's
 * getters), and the connection stays.
 */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_report.h"
#include "log.h"
#include "metrics.h"
#include "ring.h"

/* ---- helpers ---------------------------------------------------------------------- */

static struct conn_stream *server_ops_find_stream(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    int64_t sid;
    int rc = proto_get_int(req, "stream", 0, LD_JSON_SAFE_INT, &sid, err);
    if (rc < 0) {
        server_reply_error(c, id, rc, err);
        return NULL;
    }
    for (struct conn_stream *cs = c->streams; cs; cs = cs->next)
        if (cs->id == (uint64_t)sid)
            return cs;
    const char *revoked = server_revoked_message(c, (uint64_t)sid);
    if (revoked) {
        server_reply_error(c, id, LD_EDENIED, revoked);
        return NULL;
    }
    snprintf(err, sizeof err, "stream %" PRId64 " is not open on this connection", sid);
    server_reply_error(c, id, LD_ENOSTREAM, err);
    return NULL;
}

/* A release or close of a stream that a reload ended (server_reload_access.c): nothing
 * is left to free, so it succeeds (a close also forgets the record). Whether it replied. */
static bool server_ops_revoked_ok(conn *c, const cJSON *req, int64_t id, bool forget)
{
    char err[LD_ERRMSG_MAX];
    int64_t sid;
    if (!c->revoked || proto_get_int(req, "stream", 0, LD_JSON_SAFE_INT, &sid, err) < 0 ||
        !server_revoked_message(c, (uint64_t)sid))
        return false;
    if (forget)
        server_revoked_forget(c, (uint64_t)sid);
    server_reply_send(c, proto_reply_ok(id));
    return true;
}

void server_ops_close_stream(conn *c, struct conn_stream *cs)
{
    server *srv = c->srv;
    struct conn_stream **pp = &c->streams;
    while (*pp && *pp != cs)
        pp = &(*pp)->next;
    if (*pp)
        *pp = cs->next;
    /* The stream forgets its waiting nexts (stream_close calls nobody back): they are
     * answered here, each in its place in the outbox. */
    for (struct reply *r = c->out_head; r; r = r->next)
        if (r->cs == cs && !r->frame) {
            r->cs = NULL;
            server_reply_fill(c, r, proto_reply_error(r->id, LD_ECLOSED, "the stream was closed"));
        }
    srv->closed_wait_ns += stream_wait_ns(cs->s);
    c->closed_wait_ns += stream_wait_ns(cs->s);
    struct stream_stats st;
    stream_get_stats(cs->s, &st);
    c->closed_cpu_s += st.worker_cpu_s;
    srv->memory_used -= cs->ring_bytes;
    if (cs->share && share_consumers(cs->share) == 1)
        srv->memory_used -= share_ring_bytes(cs->share); /* the last consumer: the ring goes */
    srv->n_streams--;
    ld_log(LD_LOG_INFO, "stream %" PRIu64 " closed (client %" PRIu64 ")", cs->id, c->id);
    handoff_close(cs->ho); /* before the stream: its waiting next is forgotten with it */
    stream_close(cs->s);
    free(cs);
}

dataset *server_ops_find_dataset(server *srv, const char *name)
{
    for (size_t i = 0; i < srv->n_datasets; i++)
        if (strcmp(srv->datasets[i]->name, name) == 0)
            return srv->datasets[i];
    return NULL;
}

static cache_keeper *server_ops_keeper_of(server *srv, const dataset *d)
{
    for (size_t i = 0; i < srv->n_datasets; i++)
        if (srv->datasets[i] == d)
            return srv->keepers[i];
    return NULL;
}

/* Whether the connection passes rule r; when not, replies permission_denied naming what
 * was denied (`what`), for whom, and who the rule (`rule_name`) allows. The connection
 * stays: a denial changes nothing else. */
bool server_ops_allowed(conn *c, int64_t id, const struct access_rule *r, const char *rule_name,
                        const char *what)
{
    struct access_peer peer = server_conn_peer(c);
    if (access_allows(r, &peer, (uint32_t)getuid()))
        return true;
    char who[160], allowed[224], err[LD_ERRMSG_MAX + 512];
    access_describe_peer(&peer, who, sizeof who);
    access_describe_rule(r, allowed, sizeof allowed);
    snprintf(err, sizeof err, "permission denied: %s may not %s (%s allows %s)", who, what, rule_name, allowed);
    ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s, pid %d): %s", c->id, c->name, c->pid, err);
    server_reply_error(c, id, LD_EDENIED, err);
    return false;
}

/* ---- operations ----------------------------------------------------------------- */

static void server_op_hello(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    int64_t version;
    int rc = proto_get_int(req, "version", 0, INT32_MAX, &version, err);
    if (rc < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    if (version != LD_PROTO_VERSION) {
        snprintf(err, sizeof err, "client speaks protocol version %" PRId64 ", this daemon speaks %d",
                 version, LD_PROTO_VERSION);
        server_reply_error(c, id, LD_EVERSION, err);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(req, "client")) {
        const char *name;
        rc = proto_get_str(req, "client", LD_NAME_MAX - 1, &name, err);
        if (rc < 0) {
            server_reply_error(c, id, rc, err);
            return;
        }
        snprintf(c->name, sizeof c->name, "%s", name);
    }
    c->hello = true;
    cJSON *r = proto_reply_ok(id);
    cJSON_AddNumberToObject(r, "version", LD_PROTO_VERSION);
    cJSON_AddStringToObject(r, "server", "loaderd " LD_VERSION);
    cJSON_AddNumberToObject(r, "pid", getpid());
    cJSON_AddNumberToObject(r, "max_frame", c->srv->cfg->max_frame);
    server_reply_send(c, r);
}

static void server_op_datasets(conn *c, const cJSON *req, int64_t id)
{
    server *srv = c->srv;
    cJSON *r = proto_reply_ok(id);
    cJSON *list = cJSON_AddArrayToObject(r, "datasets");
    for (size_t i = 0; i < srv->n_datasets; i++) {
        const dataset *d = srv->datasets[i];
        cJSON *jd = cJSON_CreateObject();
        cJSON_AddStringToObject(jd, "name", d->name);
        cJSON_AddStringToObject(jd, "kind", dataset_kind(d));
        cJSON_AddStringToObject(jd, "source", d->source);
        cJSON_AddNumberToObject(jd, "samples", (double)d->count);
        cJSON *fields = cJSON_AddArrayToObject(jd, "fields");
        for (int f = 0; f < d->n_fields; f++) {
            const struct dataset_field *df = &d->fields[f];
            cJSON *jf = cJSON_CreateObject();
            cJSON_AddStringToObject(jf, "name", df->name);
            cJSON_AddStringToObject(jf, "dtype", proto_dtype_name(df->dtype));
            cJSON *shape = cJSON_AddArrayToObject(jf, "shape");
            for (int k = 0; k < df->ndim; k++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)df->shape[k]));
            cJSON_AddBoolToObject(jf, "ragged", df->ragged);
            if (df->ragged) {
                cJSON_AddNumberToObject(jf, "max_bytes", (double)df->max_item_bytes);
                /* What a row may take in a slot: max_bytes, or max_sample_bytes if smaller. */
                cJSON_AddNumberToObject(jf, "slot_bytes", (double)dataset_slot_item_bytes(d, f));
            }
            cJSON_AddItemToArray(fields, jf);
        }
        if (d->n_classes) {
            cJSON *cl = cJSON_AddArrayToObject(jd, "classes");
            for (size_t k = 0; k < d->n_classes; k++)
                cJSON_AddItemToArray(cl, cJSON_CreateString(d->class_names[k] ? d->class_names[k] : ""));
        }
        cJSON_AddNumberToObject(jd, "bad_samples", (double)atomic_load(&srv->datasets[i]->bad_samples));
        cJSON_AddNumberToObject(jd, "replaced_samples", (double)atomic_load(&srv->datasets[i]->replaced_samples));
        cJSON_AddNumberToObject(jd, "resource_retries", (double)atomic_load(&srv->datasets[i]->resource_retries));
        if (d->ahead) { /* cold storage: reads in flight ahead of the workers (coldread.h) */
            struct coldread_stats st;
            coldread_get_stats(d->ahead, &st);
            cJSON *ra = cJSON_AddObjectToObject(jd, "read_ahead");
            cJSON_AddBoolToObject(ra, "on", st.on);
            cJSON_AddNumberToObject(ra, "threads", st.threads);
            cJSON_AddNumberToObject(ra, "samples", (double)st.samples);
            cJSON_AddNumberToObject(ra, "misses", (double)st.misses);
            cJSON_AddNumberToObject(ra, "failed", (double)st.failed);
            cJSON_AddNumberToObject(ra, "read_once", (double)st.taken);
            cJSON_AddNumberToObject(ra, "changed", (double)st.changed);
            cJSON_AddNumberToObject(ra, "buffered_bytes", (double)st.held_bytes);
            cJSON_AddNumberToObject(ra, "pending", (double)st.pending);
            cJSON_AddNumberToObject(ra, "entries", (double)st.entries);
        }
        if (srv->keepers[i])
            cache_report_keeper(srv->keepers[i], cJSON_AddObjectToObject(jd, "cache"));
        cJSON_AddItemToArray(list, jd);
    }
    /* Those that could not be opened: after the others, with the reason. */
    for (size_t i = 0; i < srv->n_unavailable; i++) {
        cJSON *jd = cJSON_CreateObject();
        cJSON_AddStringToObject(jd, "name", srv->unavailable[i].name);
        cJSON_AddBoolToObject(jd, "available", false);
        cJSON_AddStringToObject(jd, "unavailable", srv->unavailable[i].reason);
        cJSON_AddItemToArray(list, jd);
    }
    server_reply_send(c, r);
}

/* A batch leased to the connection, by a next reply or the hand-off. */
void server_ops_count_batches(conn *c, uint64_t batches, uint64_t rows, uint64_t bytes)
{
    server *srv = c->srv;
    srv->batches_served += batches;
    srv->samples_served += rows;
    srv->bytes_served += bytes;
    c->batches_served += batches;
    c->samples_served += rows;
    c->bytes_served += bytes;
}

void server_ops_settle(server *srv)
{
    for (conn *k = srv->conns; k; k = k->next)
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next)
            handoff_settle_now(cs->ho);
}

void server_ops_count_batch(conn *c, const struct stream_batch *b)
{
    server_ops_count_batches(c, 1, b->rows, b->bytes);
}

/* Fills a next's outbox entry with the stream's answer. */
static void server_op_next_reply(conn *c, struct reply *r, const struct stream_answer *a)
{
    cJSON *msg;
    if (a->rc < 0) {
        msg = proto_reply_error(r->id, a->rc, a->message && *a->message ? a->message : ld_strerror(a->rc));
    } else {
        const struct stream_batch *b = &a->batch;
        server_ops_count_batch(c, b);
        msg = proto_reply_ok(r->id);
        cJSON_AddNumberToObject(msg, "slot", b->slot);
        cJSON_AddNumberToObject(msg, "generation", (double)b->generation);
        cJSON_AddNumberToObject(msg, "epoch", (double)b->epoch);
        cJSON_AddNumberToObject(msg, "batch", (double)b->batch);
        cJSON_AddNumberToObject(msg, "rows", b->rows);
    }
    server_reply_fill(c, r, msg);
}

/* The answer to a next that had to wait, from a hub completion (never inside
 * stream_next): ctx is its outbox entry, which the connection keeps until the stream
 * has answered or been closed. */
static void server_op_next_done(void *ctx, const struct stream_answer *a)
{
    struct reply *r = ctx;
    conn *c = r->cs->c;
    r->cs = NULL;
    server_op_next_reply(c, r, a);
}

static void server_op_next(conn *c, const cJSON *req, int64_t id)
{
    struct conn_stream *cs = server_ops_find_stream(c, req, id);
    if (!cs)
        return;
    handoff_poll(cs->ho);
    struct reply *r = server_outbox_add(c, id);
    if (!r) {
        server_conn_abort(c);
        return;
    }
    r->cs = cs;
    struct stream_answer a;
    int rc = stream_next(cs->s, server_op_next_done, r, &a);
    if (rc == 1) {
        r->cs = NULL;
        server_op_next_reply(c, r, &a); /* known now: no callback comes */
        if (share_done(cs->s))
            server_ops_close_stream(c, cs); /* detached, holding nothing: its trainer reopened */
    } else if (rc < 0) {
        char err[LD_ERRMSG_MAX];
        if (rc == LD_EBUSY)
            snprintf(err, sizeof err, "%d next requests already wait on stream %" PRIu64, STREAM_MAX_WAITING,
                     cs->id);
        else
            snprintf(err, sizeof err, "%s", ld_strerror(rc));
        r->cs = NULL;
        server_reply_fill(c, r, proto_reply_error(id, rc, err));
    }
}

static void server_op_release(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    if (server_ops_revoked_ok(c, req, id, false))
        return;
    struct conn_stream *cs = server_ops_find_stream(c, req, id);
    if (!cs)
        return;
    int64_t slot, gen;
    int rc;
    if ((rc = proto_get_int(req, "slot", 0, UINT32_MAX, &slot, err)) < 0 ||
        (rc = proto_get_int(req, "generation", 0, LD_JSON_SAFE_INT, &gen, err)) < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    rc = stream_release(cs->s, (uint32_t)slot, (uint64_t)gen);
    if (rc == 0) {
        handoff_poll(cs->ho); /* the slot may be what the hand-off waited for */
        server_reply_send(c, proto_reply_ok(id));
        if (share_done(cs->s))
            server_ops_close_stream(c, cs); /* a detached consumer gave back its last slot */
        return;
    }
    if (rc == LD_ENOTLEASED && cs->share)
        snprintf(err, sizeof err, "slot %" PRId64 " of stream %" PRIu64 " is not leased to it (shared stream '%s')",
                 slot, cs->id, share_name(cs->share));
    else
        handoff_release_error(stream_ring(cs->s), cs->id, slot, gen, rc, err);
    server_reply_error(c, id, rc, err);
}

/* The client mapped the hand-off's memory (the first one), or released while the daemon
 * was idle (later ones). */
static void server_op_handoff(conn *c, const cJSON *req, int64_t id)
{
    struct conn_stream *cs = server_ops_find_stream(c, req, id);
    if (!cs)
        return;
    if (!cs->ho) {
        char err[LD_ERRMSG_MAX];
        snprintf(err, sizeof err, "stream %" PRIu64 " was not opened with \"handoff\"", cs->id);
        server_reply_error(c, id, LD_ENOTSUP, err);
        return;
    }
    server_reply_send(c, proto_reply_ok(id)); /* first: the kick may end the connection */
    handoff_kick(cs->ho);
}

static void server_op_close(conn *c, const cJSON *req, int64_t id)
{
    if (server_ops_revoked_ok(c, req, id, true))
        return;
    struct conn_stream *cs = server_ops_find_stream(c, req, id);
    if (!cs)
        return;
    server_ops_close_stream(c, cs);
    server_reply_send(c, proto_reply_ok(id));
}

static void server_ops_slot_counts(cJSON *o, const uint32_t counts[RING_STATES])
{
    for (int st = 0; st < RING_STATES; st++)
        cJSON_AddNumberToObject(o, ring_state_name((enum ring_state)st), counts[st]);
}

static double server_ops_samples_per_s(const server *srv)
{
    /* The oldest sample in the window that has been taken (the window fills up during
     * the first seconds), against the counter now. */
    for (unsigned k = 1; k <= SERVER_RATE_WINDOW; k++) {
        unsigned i = (srv->rate_pos + k) % SERVER_RATE_WINDOW;
        if (!srv->rate_ns[i])
            continue;
        uint64_t dt = uv_hrtime() - srv->rate_ns[i];
        return dt ? (double)(srv->samples_served - srv->rate_samples[i]) * 1e9 / (double)dt : 0;
    }
    return 0;
}

/* Whether a consumer of cs's shared stream comes before cs in the server's streams (its
 * ring is counted there). */
static bool server_ops_share_counted(const server *srv, const struct conn_stream *cs)
{
    for (conn *k = srv->conns; k; k = k->next)
        for (struct conn_stream *o = k->streams; o; o = o->next) {
            if (o == cs)
                return false;
            if (o->share == cs->share)
                return true;
        }
    return false;
}

static void server_op_status(conn *c, const cJSON *req, int64_t id)
{
    server *srv = c->srv;
    server_ops_settle(srv);
    uint32_t counts[RING_STATES] = {0};
    uint64_t wait = srv->closed_wait_ns;
    for (conn *k = srv->conns; k; k = k->next)
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next) {
            for (int st = 0; st < RING_STATES && !(cs->share && server_ops_share_counted(srv, cs)); st++)
                counts[st] += ring_count(stream_ring(cs->s), (enum ring_state)st);
            wait += stream_wait_ns(cs->s);
        }
    cJSON *r = proto_reply_ok(id);
    cJSON_AddStringToObject(r, "server", "loaderd " LD_VERSION);
    cJSON_AddNumberToObject(r, "pid", getpid());
    cJSON_AddStringToObject(r, "socket", srv->socket_path);
    cJSON_AddNumberToObject(r, "uptime_s", (double)(uv_hrtime() - srv->started_ns) / 1e9);
    cJSON_AddNumberToObject(r, "clients", srv->n_conns);
    cJSON_AddNumberToObject(r, "streams", srv->n_streams);
    cJSON_AddNumberToObject(r, "datasets", (double)srv->n_datasets);
    cJSON_AddNumberToObject(r, "datasets_unavailable", (double)srv->n_unavailable);
    cJSON_AddNumberToObject(r, "datasets_in_memory", dataset_live_count());
    cJSON_AddNumberToObject(r, "reloads", (double)srv->reloads);
    cJSON_AddNumberToObject(r, "workers", pool_threads(srv->workers));
    cJSON_AddNumberToObject(r, "batches_served", (double)srv->batches_served);
    cJSON_AddNumberToObject(r, "samples_served", (double)srv->samples_served);
    cJSON_AddNumberToObject(r, "bytes_served", (double)srv->bytes_served);
    cJSON_AddNumberToObject(r, "samples_per_s", server_ops_samples_per_s(srv));
    cJSON_AddNumberToObject(r, "worker_busy_s", (double)pool_busy_ns(srv->workers) / 1e9);
    cJSON_AddNumberToObject(r, "client_wait_s", (double)wait / 1e9);
    cJSON_AddNumberToObject(r, "memory_budget", (double)srv->cfg->memory_budget);
    cJSON_AddNumberToObject(r, "memory_used", (double)srv->memory_used);
    cJSON_AddNumberToObject(r, "queued_reply_bytes", (double)srv->queued_bytes);
    server_ops_slot_counts(cJSON_AddObjectToObject(r, "slots"), counts);
    cJSON_AddNumberToObject(r, "device_memory_used", (double)device_budget_used_total());
    cJSON_AddNumberToObject(r, "device_memory_budget", (double)srv->cfg->device_memory_budget);
    uint64_t bad = 0, replaced = 0, retries = 0;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        bad += atomic_load(&srv->datasets[i]->bad_samples);
        replaced += atomic_load(&srv->datasets[i]->replaced_samples);
        retries += atomic_load(&srv->datasets[i]->resource_retries);
    }
    cJSON_AddNumberToObject(r, "bad_samples", (double)bad);
    cJSON_AddNumberToObject(r, "replaced_samples", (double)replaced);
    cJSON_AddNumberToObject(r, "resource_retries", (double)retries);
    /* Who is connected: each connection's credentials and its streams. */
    cJSON *conns = cJSON_AddArrayToObject(r, "connections");
    for (conn *k = srv->conns; k; k = k->next) {
        if (k->state == CONN_CLOSED)
            continue;
        cJSON *jc = cJSON_CreateObject();
        int n = 0;
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next)
            n++;
        cJSON_AddNumberToObject(jc, "id", (double)k->id);
        cJSON_AddStringToObject(jc, "client", k->name);
        server_conn_describe_peer(k, jc);
        cJSON_AddNumberToObject(jc, "streams", n);
        cJSON_AddNumberToObject(jc, "connected_s", (double)(uv_hrtime() - k->connected_ns) / 1e9);
        cJSON_AddBoolToObject(jc, "self", k == c);
        cJSON_AddItemToArray(conns, jc);
    }
    cJSON *caches = cJSON_AddArrayToObject(r, "caches");
    for (size_t i = 0; i < srv->n_datasets; i++) {
        if (!srv->keepers[i])
            continue;
        cJSON *jc = cJSON_CreateObject();
        cJSON_AddStringToObject(jc, "dataset", srv->datasets[i]->name);
        cache_report_keeper(srv->keepers[i], jc);
        cJSON_DeleteItemFromObjectCaseSensitive(jc, "file");
        cJSON_AddItemToArray(caches, jc);
    }
    server_declare_report(srv, c, caches);
    server_reply_send(c, r);
}

static void server_op_metrics(conn *c, const cJSON *req, int64_t id)
{
    char *text = NULL;
    size_t len = 0;
    int rc = server_metrics_text(c->srv, &text, &len);
    if (rc < 0) {
        server_reply_error(c, id, rc, "cannot format the metrics: out of memory");
        return;
    }
    cJSON *r = proto_reply_ok(id);
    cJSON_AddStringToObject(r, "content_type", METRICS_CONTENT_TYPE);
    cJSON_AddStringToObject(r, "text", text);
    free(text);
    server_reply_send(c, r);
}

/* The dataset a cache request names, and its keeper; replies the error when there is none. */
static cache_keeper *server_ops_cache_request(conn *c, const cJSON *req, int64_t id, dataset **ret_d)
{
    char err[LD_ERRMSG_MAX];
    const char *name;
    int rc = proto_get_str(req, "dataset", LD_NAME_MAX - 1, &name, err);
    if (rc < 0) {
        server_reply_error(c, id, rc, err);
        return NULL;
    }
    dataset *d = server_ops_find_dataset(c->srv, name);
    if (!d) {
        snprintf(err, sizeof err, "no dataset named '%s' (see `loaderctl datasets`)", name);
        server_reply_error(c, id, LD_ENODATASET, err);
        return NULL;
    }
    cache_keeper *k = server_ops_keeper_of(c->srv, d);
    if (!k) {
        snprintf(err, sizeof err, "dataset '%s' has no cache configured (add a `cache: {path: ...}` mapping to it)",
                 name);
        server_reply_error(c, id, LD_ENOTSUP, err);
        return NULL;
    }
    *ret_d = d;
    return k;
}

static void server_op_cache_build(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    dataset *d;
    cache_keeper *k = server_ops_cache_request(c, req, id, &d);
    bool force;
    int rc;
    if (!k)
        return;
    if ((rc = proto_opt_bool(req, "force", false, &force, err)) < 0 || (rc = cache_keeper_build(k, force, err)) < 0) {
        server_reply_error(c, id, rc, err);
        return;
    }
    cJSON *r = proto_reply_ok(id);
    cache_report_keeper(k, r);
    server_reply_send(c, r);
}

static void server_op_cache_info(conn *c, const cJSON *req, int64_t id)
{
    dataset *d;
    cache_keeper *k = server_ops_cache_request(c, req, id, &d);
    if (!k)
        return;
    cJSON *r = proto_reply_ok(id);
    cJSON_AddStringToObject(r, "dataset", d->name);
    cache_report_keeper(k, r);
    server_reply_send(c, r);
}

/* A verify answers when the keeper's thread is done; the connection may be gone by
 * then, so the request remembers it by id and checks its outbox entry is still there. */
struct verify_wait {
    server *srv;
    uint64_t conn_id;
    struct reply *r;
};

static void server_op_verify_done(void *ctx, int rc, const char *message)
{
    struct verify_wait *w = ctx;
    conn *c = w->srv->conns;
    while (c && c->id != w->conn_id)
        c = c->next;
    struct reply *r = c ? c->out_head : NULL;
    while (r && r != w->r)
        r = r->next;
    if (c && r && c->state == CONN_OPEN)
        server_reply_fill(c, r, rc < 0 ? proto_reply_error(r->id, rc, message) : proto_reply_ok(r->id));
    free(w);
}

static void server_op_cache_verify(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    dataset *d;
    cache_keeper *k = server_ops_cache_request(c, req, id, &d);
    if (!k)
        return;
    struct verify_wait *w = calloc(1, sizeof *w);
    struct reply *r = w ? server_outbox_add(c, id) : NULL;
    if (!r) {
        free(w);
        server_conn_abort(c);
        return;
    }
    w->srv = c->srv;
    w->conn_id = c->id;
    w->r = r;
    int rc = cache_keeper_verify(k, server_op_verify_done, w, err);
    if (rc < 0) {
        free(w);
        server_reply_fill(c, r, proto_reply_error(id, rc, err));
    }
}

static void server_op_streams(conn *c, const cJSON *req, int64_t id)
{
    cJSON *r = proto_reply_ok(id);
    cJSON *list = cJSON_AddArrayToObject(r, "streams");
    for (conn *k = c->srv->conns; k; k = k->next)
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next) {
            cJSON *js = cJSON_CreateObject();
            stream_describe_state(cs->s, js);
            cJSON_AddNumberToObject(js, "client_id", (double)k->id);
            cJSON_AddStringToObject(js, "client", k->name);
            server_conn_describe_peer(k, js);
            cJSON_AddItemToArray(list, js);
        }
    server_reply_send(c, r);
}

/* `operator`: the request changes what the daemon does for everyone (a cache rebuilt,
 * a verify's disk and CPU time, a reload), so it needs access.operators. */
static const struct {
    const char *name;
    void (*run)(conn *c, const cJSON *req, int64_t id);
    bool operator;
} ops[] = {
    {LD_OP_HELLO, server_op_hello, false},     {LD_OP_DATASETS, server_op_datasets, false},
    {LD_OP_OPEN, server_open_stream, false},       {LD_OP_NEXT, server_op_next, false},
    {LD_OP_RELEASE, server_op_release, false}, {LD_OP_CLOSE, server_op_close, false},
    {LD_OP_HANDOFF, server_op_handoff, false},
    {LD_OP_STATUS, server_op_status, false},   {LD_OP_STREAMS, server_op_streams, false},
    {LD_OP_CACHE_BUILD, server_op_cache_build, true}, {LD_OP_CACHE_INFO, server_op_cache_info, false},
    {LD_OP_CACHE_VERIFY, server_op_cache_verify, true},
    {LD_OP_METRICS, server_op_metrics, false}, {LD_OP_RELOAD, server_ops_reload, true},
};

void server_ops_handle(conn *c, const char *payload, size_t len)
{
    char err[LD_ERRMSG_MAX];
    cJSON *req = NULL;
    int rc = proto_parse(payload, len, &req, err);
    if (rc < 0) {
        server_reply_error(c, -1, rc, err);
        return;
    }
    int64_t id = proto_request_id(req);
    const char *op;
    if (id < 0) {
        server_reply_error(c, -1, LD_EFIELD, "field 'id': expected an integer in [0, 2^53)");
    } else if ((rc = proto_get_str(req, "op", LD_OP_NAME_MAX, &op, err)) < 0) {
        server_reply_error(c, id, rc, err);
    } else if (!c->hello && strcmp(op, LD_OP_HELLO) != 0) {
        snprintf(err, sizeof err, "the first request must be hello, not '%s'", op);
        server_reply_error(c, id, LD_EHELLO, err);
    } else {
        size_t i;
        for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (strcmp(op, ops[i].name) == 0)
                break;
        if (i < sizeof ops / sizeof ops[0]) {
            char what[LD_OP_NAME_MAX + 48];
            snprintf(what, sizeof what, "run the operator command '%s'", op);
            if (!ops[i].operator || server_ops_allowed(c, id, &c->srv->cfg->access.operators, "access.operators", what))
                ops[i].run(c, req, id);
        } else {
            snprintf(err, sizeof err, "unknown op '%s' (expected hello, datasets, open, next, release, "
                                      "close, handoff, status, streams, cache_build, cache_info, cache_verify, metrics or reload)", op);
            server_reply_error(c, id, LD_EUNKNOWNOP, err);
        }
    }
    cJSON_Delete(req);
}
