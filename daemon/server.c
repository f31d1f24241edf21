/* server — loaderd's control channel.
 *
 * One libuv loop thread owns every connection and stream. Bytes from a client go
 * through a proto_reader; each whole frame is one JSON request, dispatched through the
 * `ops` table below. Replies leave in request order through the connection's outbox: a
 * `next` that has to wait for its batch holds its place in the outbox while later
 * requests (a release, a status) are handled at once and queue behind it.
 *
 * Bad input is answered, not crashed on: invalid JSON, a wrong field or an unknown op
 * get an error reply and the connection stays; only a frame over the limit (the stream
 * cannot be resynchronised) or a client that stops reading its replies is disconnected.
 */
#include "server.h"

#include <grp.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cache_keeper.h"
#include "cache_report.h"
#include "dataset_watch.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "notify.h"
#include "proto.h"
#include "proto_socket.h"
#include "ring.h"
#include "stream.h"

#define READ_BUF_SIZE (64u * 1024u)
#define WRITE_BATCH 32
#define MAX_QUEUED_REPLIES 4096u     /* replies held behind a waiting next: past this, dropped */
#define TRIM_AFTER_BYTES (1u << 20)  /* a connection that queued this much hands memory back when it goes */
#define RATE_WINDOW 6                /* seconds of history for samples_per_s */

typedef struct conn conn;

struct conn_stream;

struct reply {
    struct reply *next;
    struct conn_stream *cs;         /* a waiting next: the stream it waits on */
    int64_t id;
    char *frame;                    /* NULL while a deferred reply waits */
    size_t len;
};

/* What a queued reply costs: its frame and its outbox entry. */
#define REPLY_COST(len) ((uint64_t)(len) + sizeof(struct reply))

struct conn_stream {
    struct conn_stream *next;
    conn *c;
    stream *s;
    uint64_t id;
    uint64_t ring_bytes;
};

struct conn {
    uv_pipe_t pipe;
    server *srv;
    conn *prev, *next;
    uint64_t id;
    proto_reader *reader;
    bool hello, closing;
    bool reserved;                  /* holds the slot kept for operator commands: no streams */
    bool doomed;                    /* to be closed from the reaper, outside any callback chain */
    bool reading;                   /* in on_read: replies are written once, after the last frame */
    conn *doom_next;
    char name[LD_NAME_MAX];
    uint32_t uid;                   /* the peer's (SO_PEERCRED), for scheduling by client */
    struct reply *out_head, *out_tail;
    uint32_t out_count;             /* replies in the outbox, sent or not */
    uint64_t queued_bytes;          /* replies queued and not yet written to the socket */
    uint64_t peak_queued_bytes;
    uint64_t connected_ns, last_frame_ns; /* for the hello deadline and the idle timeout */
    uint64_t batches_served, samples_served, bytes_served, closed_wait_ns; /* for metrics */
    double closed_cpu_s;            /* workers' CPU time on streams already closed */
    struct conn_stream *streams;
    char rbuf[READ_BUF_SIZE];
};

struct write_req {
    uv_write_t req;
    conn *c;
    int n;
    uint64_t cost;                  /* of the replies it carries, in conn.queued_bytes */
    char *frames[WRITE_BATCH];
};

struct server {
    uv_loop_t *loop;
    const struct config *cfg;
    dataset **datasets;
    size_t n_datasets;
    cache_keeper **keepers;         /* per dataset; NULL where the dataset has no cache */
    dataset_watch **watches;        /* per dataset: rescans a folder that changed */
    pool *workers;
    hub *hub;                       /* the loop's (main.c's): stream work comes back through it */
    stream_set *set;                /* NULL once stopped and every stream freed */
    uv_pipe_t listener;
    bool listening, owns_socket_file;
    metrics_http *metrics;          /* server.metrics.listen, or NULL */
    uv_timer_t tick;
    uv_timer_t reaper;              /* closes doomed connections on the next loop turn */
    conn *doomed;
    conn *conns;
    uint32_t n_conns, n_streams;
    uint32_t n_reserved;            /* connections in the operator slot (0 or 1) */
    uint64_t queued_bytes;          /* replies queued unread, across connections */
    uint64_t next_conn_id, next_stream_id;
    uint64_t memory_used;
    uint64_t started_ns;
    uint64_t batches_served, samples_served, bytes_served;
    uint64_t closed_wait_ns;        /* client wait of streams already closed */
    uint64_t rate_samples[RATE_WINDOW];
    uint64_t rate_ns[RATE_WINDOW];
    unsigned rate_pos;
    uint64_t watchdog_ns, last_watchdog_ns;
    bool stopping;
    int pending_closes;
    void (*done)(void *ctx);
    void *done_ctx;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* ---- outbox --------------------------------------------------------------------- */

static void conn_close(conn *c);
static void on_reap(uv_timer_t *t);

/* Marks a connection for closing on the next loop turn. Used wherever we are deep in a
 * call chain (a reply being flushed from inside a stream's delivery): closing there
 * would free streams that the chain is still using. */
static void conn_doom(conn *c)
{
    if (c->closing || c->doomed)
        return;
    c->doomed = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->doom_next = c->srv->doomed;
    c->srv->doomed = c;
    uv_timer_start(&c->srv->reaper, on_reap, 0, 0);
}

static void queued_sub(conn *c, uint64_t cost)
{
    c->queued_bytes -= cost;
    c->srv->queued_bytes -= cost;
}

static void write_done(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    for (int i = 0; i < w->n; i++)
        free(w->frames[i]);
    queued_sub(w->c, w->cost);
    if (status < 0 && status != UV_ECANCELED && !w->c->closing) {
        ld_log(LD_LOG_DEBUG, "client %" PRIu64 ": write failed: %s", w->c->id, uv_strerror(status));
        conn_doom(w->c);
    }
    free(w);
}

/* Sends the replies at the head of the outbox that are ready, in one write. */
static void flush(conn *c)
{
    while (!c->closing && !c->doomed && c->out_head && c->out_head->frame) {
        struct write_req *w = calloc(1, sizeof *w);
        uv_buf_t bufs[WRITE_BATCH];
        if (!w) {
            conn_doom(c);
            return;
        }
        w->c = c;
        while (w->n < WRITE_BATCH && c->out_head && c->out_head->frame) {
            struct reply *r = c->out_head;
            bufs[w->n] = uv_buf_init(r->frame, (unsigned)r->len);
            w->frames[w->n++] = r->frame;
            w->cost += REPLY_COST(r->len);
            c->out_head = r->next;
            if (!c->out_head)
                c->out_tail = NULL;
            c->out_count--;
            free(r);
        }
        int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, bufs, (unsigned)w->n, write_done);
        if (rc < 0) {
            for (int i = 0; i < w->n; i++)
                free(w->frames[i]);
            queued_sub(c, w->cost);
            free(w);
            conn_doom(c);
            return;
        }
    }
}

static struct reply *outbox_add(conn *c, int64_t id)
{
    if (c->out_count >= MAX_QUEUED_REPLIES) {
        /* Requests keep coming while earlier replies wait (a next for a slot the client
         * never releases): memory would grow without bound. */
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): %u replies queued unread; disconnecting", c->id, c->name,
               MAX_QUEUED_REPLIES);
        return NULL;
    }
    struct reply *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    c->out_count++;
    r->id = id;
    if (c->out_tail)
        c->out_tail->next = r;
    else
        c->out_head = r;
    c->out_tail = r;
    return r;
}

/* Fills an outbox entry with msg (consumed). Out of memory drops the connection: the
 * client would otherwise wait for a reply that never comes. */
static void reply_fill(conn *c, struct reply *r, cJSON *msg)
{
    int rc = msg ? proto_encode(msg, &r->frame, &r->len) : LD_ENOMEM;
    cJSON_Delete(msg);
    if (rc < 0) {
        ld_log(LD_LOG_ERROR, "client %" PRIu64 ": cannot encode a reply: %s", c->id, ld_strerror(rc));
        conn_doom(c);
        return;
    }
    /* Replies queue up when a client does not read them, or while a next that cannot
     * finish holds its place in front of them (a client that asks for `streams`
     * thousands of times behind it): bound them in bytes, per connection and in all.
     * One reply alone always goes, however large. */
    server *srv = c->srv;
    uint64_t cost = REPLY_COST(r->len);
    bool alone = c->queued_bytes == 0;
    c->queued_bytes += cost;
    srv->queued_bytes += cost;
    if (c->queued_bytes > c->peak_queued_bytes)
        c->peak_queued_bytes = c->queued_bytes;
    if (!alone && (c->queued_bytes > srv->cfg->max_reply_bytes ||
                   srv->queued_bytes > srv->cfg->max_total_reply_bytes)) {
        bool mine = c->queued_bytes > srv->cfg->max_reply_bytes;
        ld_log(LD_LOG_WARN,
               "client %" PRIu64 " (%s): %" PRIu64 " bytes of replies queued unread (%s %" PRIu64
               " bytes, server.%s); disconnecting",
               c->id, c->name, mine ? c->queued_bytes : srv->queued_bytes,
               mine ? "limit per connection" : "limit across all connections",
               mine ? srv->cfg->max_reply_bytes : srv->cfg->max_total_reply_bytes,
               mine ? "max_reply_bytes" : "max_total_reply_bytes");
        conn_doom(c);
        return;
    }
    if (!c->reading)
        flush(c);
}

static void reply_send(conn *c, cJSON *msg)
{
    struct reply *r = outbox_add(c, 0);
    if (!r) {
        cJSON_Delete(msg);
        conn_doom(c);
        return;
    }
    reply_fill(c, r, msg);
}

static void reply_error(conn *c, int64_t id, int code, const char *message)
{
    ld_log(LD_LOG_DEBUG, "client %" PRIu64 " (%s): request %" PRId64 ": %s: %s", c->id, c->name, id,
           ld_error_name(code), message ? message : ld_strerror(code));
    reply_send(c, proto_reply_error(id, code, message && *message ? message : ld_strerror(code)));
}

/* ---- helpers -------------------------------------------------------------------- */

static struct conn_stream *find_stream(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    int64_t sid;
    int rc = proto_get_int(req, "stream", 0, LD_JSON_SAFE_INT, &sid, err);
    if (rc < 0) {
        reply_error(c, id, rc, err);
        return NULL;
    }
    for (struct conn_stream *cs = c->streams; cs; cs = cs->next)
        if (cs->id == (uint64_t)sid)
            return cs;
    snprintf(err, sizeof err, "stream %" PRId64 " is not open on this connection", sid);
    reply_error(c, id, LD_ENOSTREAM, err);
    return NULL;
}

static void conn_stream_close(conn *c, struct conn_stream *cs)
{
    server *srv = c->srv;
    struct conn_stream **pp = &c->streams;
    while (*pp && *pp != cs)
        pp = &(*pp)->next;
    if (*pp)
        *pp = cs->next;
    srv->closed_wait_ns += stream_wait_ns(cs->s);
    c->closed_wait_ns += stream_wait_ns(cs->s);
    struct stream_stats st;
    stream_get_stats(cs->s, &st);
    c->closed_cpu_s += st.worker_cpu_s;
    srv->memory_used -= cs->ring_bytes;
    srv->n_streams--;
    ld_log(LD_LOG_INFO, "stream %" PRIu64 " closed (client %" PRIu64 ")", cs->id, c->id);
    stream_close(cs->s); /* a waiting next is answered (or dropped) through on_next */
    free(cs);
}

static dataset *find_dataset(server *srv, const char *name)
{
    for (size_t i = 0; i < srv->n_datasets; i++)
        if (strcmp(srv->datasets[i]->name, name) == 0)
            return srv->datasets[i];
    return NULL;
}

/* A folder dataset follows files added or removed since its scan: *pd becomes the
 * fresh scan when its folder changed (dataset_watch.h). */
static int refresh_dataset(server *srv, dataset **pd, char *err)
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

static cache_keeper *keeper_of(server *srv, const dataset *d)
{
    for (size_t i = 0; i < srv->n_datasets; i++)
        if (srv->datasets[i] == d)
            return srv->keepers[i];
    return NULL;
}

/* ---- operations ----------------------------------------------------------------- */

static void op_hello(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    int64_t version;
    int rc = proto_get_int(req, "version", 0, INT32_MAX, &version, err);
    if (rc < 0) {
        reply_error(c, id, rc, err);
        return;
    }
    if (version != LD_PROTO_VERSION) {
        snprintf(err, sizeof err, "client speaks protocol version %" PRId64 ", this daemon speaks %d",
                 version, LD_PROTO_VERSION);
        reply_error(c, id, LD_EVERSION, err);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(req, "client")) {
        const char *name;
        rc = proto_get_str(req, "client", LD_NAME_MAX - 1, &name, err);
        if (rc < 0) {
            reply_error(c, id, rc, err);
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
    reply_send(c, r);
}

static void op_datasets(conn *c, const cJSON *req, int64_t id)
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
        if (srv->keepers[i])
            cache_report_keeper(srv->keepers[i], cJSON_AddObjectToObject(jd, "cache"));
        cJSON_AddItemToArray(list, jd);
    }
    reply_send(c, r);
}

static void op_open(conn *c, const cJSON *req, int64_t id)
{
    server *srv = c->srv;
    char err[LD_ERRMSG_MAX];
    const char *name;
    int64_t batch, seed, epoch, rank, world, start, prefetch, epochs;
    bool shuffle, drop_last;
    int rc;
    if ((rc = proto_get_str(req, "dataset", LD_NAME_MAX - 1, &name, err)) < 0 ||
        (rc = proto_get_int(req, "batch_size", 1, LD_BATCH_SIZE_MAX, &batch, err)) < 0 ||
        (rc = proto_opt_bool(req, "shuffle", true, &shuffle, err)) < 0 ||
        (rc = proto_opt_int(req, "seed", 0, LD_JSON_SAFE_INT, 0, &seed, err)) < 0 ||
        (rc = proto_opt_int(req, "epoch", 0, LD_JSON_SAFE_INT, 0, &epoch, err)) < 0 ||
        (rc = proto_opt_int(req, "world_size", 1, LD_WORLD_SIZE_MAX, 1, &world, err)) < 0 ||
        (rc = proto_opt_int(req, "rank", 0, LD_WORLD_SIZE_MAX - 1, 0, &rank, err)) < 0 ||
        (rc = proto_opt_bool(req, "drop_last", false, &drop_last, err)) < 0 ||
        (rc = proto_opt_int(req, "start_batch", 0, LD_JSON_SAFE_INT, 0, &start, err)) < 0 ||
        (rc = proto_opt_int(req, "prefetch", 1, LD_PREFETCH_MAX, srv->cfg->prefetch, &prefetch, err)) < 0 ||
        (rc = proto_opt_int(req, "epochs", 0, LD_JSON_SAFE_INT, 0, &epochs, err)) < 0) {
        reply_error(c, id, rc, err);
        return;
    }
    if ((rc = proto_epoch_span(epoch, epochs, &epochs, err)) < 0) {
        reply_error(c, id, rc, err);
        return;
    }
    if (rank >= world) {
        snprintf(err, sizeof err, "rank %" PRId64 " is not below world_size %" PRId64, rank, world);
        reply_error(c, id, LD_EINVAL, err);
        return;
    }
    dataset *d = find_dataset(srv, name);
    if (!d) {
        snprintf(err, sizeof err, "no dataset named '%s' (see `loaderctl datasets`)", name);
        reply_error(c, id, LD_ENODATASET, err);
        return;
    }
    if (c->reserved) {
        snprintf(err, sizeof err, "all %u client slots are taken (server.max_clients); this connection holds "
                 "the one kept for operator commands, which cannot open streams", srv->cfg->max_clients);
        reply_error(c, id, LD_ELIMIT, err);
        return;
    }
    if (srv->n_streams >= srv->cfg->max_streams) {
        snprintf(err, sizeof err, "the daemon already serves %u streams (server.max_streams)", srv->n_streams);
        reply_error(c, id, LD_ELIMIT, err);
        return;
    }
    if ((rc = refresh_dataset(srv, &d, err)) < 0) {
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): open '%s' failed: %s", c->id, c->name, name, err);
        reply_error(c, id, rc, err);
        return;
    }
    struct conn_stream *cs = calloc(1, sizeof *cs);
    if (!cs) {
        reply_error(c, id, LD_ENOMEM, NULL);
        return;
    }
    struct stream_params p = {
        .batch_size = (uint32_t)batch, .shuffle = shuffle, .seed = (uint64_t)seed,
        .epoch = (uint64_t)epoch, .rank = (uint32_t)rank, .world_size = (uint32_t)world,
        .drop_last = drop_last, .start_batch = (uint64_t)start, .prefetch = (uint32_t)prefetch,
        .epochs = (uint64_t)epochs,
        .uid = c->uid, .client_weight = 1, .client_max_share = 1,
    };
    const struct config_client *cc = config_client_for_uid(srv->cfg, c->uid);
    if (cc) {
        p.client_weight = cc->weight;
        p.client_max_share = cc->max_share;
    }
    uint64_t sid = ++srv->next_stream_id;
    uint64_t budget_left = srv->cfg->memory_budget - srv->memory_used;
    err[0] = '\0';
    rc = stream_open(srv->set, d, sid, &p, budget_left, &cs->s, err);
    if (rc < 0) {
        free(cs);
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): open '%s' failed: %s", c->id, c->name, name, err);
        reply_error(c, id, rc, err);
        return;
    }
    cs->c = c;
    cs->id = sid;
    cs->ring_bytes = stream_ring_bytes(cs->s);
    cs->next = c->streams;
    c->streams = cs;
    srv->memory_used += cs->ring_bytes;
    srv->n_streams++;
    ld_log(LD_LOG_INFO, "stream %" PRIu64 " opened on '%s' by client %" PRIu64 " (%s): batch %u, seed %" PRIu64
           ", epoch %" PRIu64 ", rank %u/%u, prefetch %u",
           sid, name, c->id, c->name, p.batch_size, p.seed, p.epoch, p.rank, p.world_size, p.prefetch);
    cJSON *r = proto_reply_ok(id);
    stream_describe_layout(cs->s, r);
    reply_send(c, r); /* stream_open told the dataset's cache keeper */
}

/* A next's answer: ctx is its outbox entry, which the connection keeps until the
 * stream has answered (closing a stream answers its waiting nexts first). */
static void on_next(void *ctx, int rc, const struct stream_batch *b, const char *message)
{
    struct reply *r = ctx;
    conn *c = r->cs->c;
    if (c->closing)
        return; /* the connection is going away; its outbox is freed with it */
    cJSON *msg;
    if (rc < 0) {
        msg = proto_reply_error(r->id, rc, message && *message ? message : ld_strerror(rc));
    } else {
        server *srv = c->srv;
        srv->batches_served++;
        srv->samples_served += b->rows;
        srv->bytes_served += b->bytes;
        c->batches_served++;
        c->samples_served += b->rows;
        c->bytes_served += b->bytes;
        msg = proto_reply_ok(r->id);
        cJSON_AddNumberToObject(msg, "slot", b->slot);
        cJSON_AddNumberToObject(msg, "generation", (double)b->generation);
        cJSON_AddNumberToObject(msg, "epoch", (double)b->epoch);
        cJSON_AddNumberToObject(msg, "batch", (double)b->batch);
        cJSON_AddNumberToObject(msg, "rows", b->rows);
    }
    reply_fill(c, r, msg);
}

static void op_next(conn *c, const cJSON *req, int64_t id)
{
    struct conn_stream *cs = find_stream(c, req, id);
    if (!cs)
        return;
    struct reply *r = outbox_add(c, id);
    if (!r) {
        conn_doom(c);
        return;
    }
    r->cs = cs;
    int rc = stream_next(cs->s, on_next, r);
    if (rc < 0) {
        char err[LD_ERRMSG_MAX];
        if (rc == LD_EBUSY)
            snprintf(err, sizeof err, "%d next requests already wait on stream %" PRIu64, STREAM_MAX_WAITING,
                     cs->id);
        else
            snprintf(err, sizeof err, "%s", ld_strerror(rc));
        reply_fill(c, r, proto_reply_error(id, rc, err));
    }
}

static void op_release(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    struct conn_stream *cs = find_stream(c, req, id);
    if (!cs)
        return;
    int64_t slot, gen;
    int rc;
    if ((rc = proto_get_int(req, "slot", 0, UINT32_MAX, &slot, err)) < 0 ||
        (rc = proto_get_int(req, "generation", 0, LD_JSON_SAFE_INT, &gen, err)) < 0) {
        reply_error(c, id, rc, err);
        return;
    }
    const ring *rg = stream_ring(cs->s);
    rc = stream_release(cs->s, (uint32_t)slot, (uint64_t)gen);
    if (rc == 0) {
        reply_send(c, proto_reply_ok(id));
        return;
    }
    static const char *const state_names[] = {"free", "being filled", "ready", "leased"};
    if (rc == LD_EINVAL)
        snprintf(err, sizeof err, "slot %" PRId64 " is out of range (stream %" PRIu64 " has %u slots)", slot,
                 cs->id, ring_slot_count(rg));
    else if (rc == LD_ENOTLEASED)
        snprintf(err, sizeof err, "slot %" PRId64 " of stream %" PRIu64 " is not leased (it is %s)", slot, cs->id,
                 state_names[ring_state(rg, (uint32_t)slot)]);
    else if (rc == LD_ESTALE)
        snprintf(err, sizeof err, "slot %" PRId64 " of stream %" PRIu64 " is at generation %" PRIu64 ", not %" PRId64,
                 slot, cs->id, ring_generation(rg, (uint32_t)slot), gen);
    else
        snprintf(err, sizeof err, "%s", ld_strerror(rc));
    reply_error(c, id, rc, err);
}

static void op_close(conn *c, const cJSON *req, int64_t id)
{
    struct conn_stream *cs = find_stream(c, req, id);
    if (!cs)
        return;
    conn_stream_close(c, cs);
    reply_send(c, proto_reply_ok(id));
}

static void add_slot_counts(cJSON *o, const uint32_t counts[4])
{
    cJSON_AddNumberToObject(o, "free", counts[RING_FREE]);
    cJSON_AddNumberToObject(o, "filling", counts[RING_FILLING]);
    cJSON_AddNumberToObject(o, "ready", counts[RING_READY]);
    cJSON_AddNumberToObject(o, "leased", counts[RING_LEASED]);
}

static double samples_per_s(const server *srv)
{
    /* The oldest sample in the window that has been taken (the window fills up during
     * the first seconds), against the counter now. */
    for (unsigned k = 1; k <= RATE_WINDOW; k++) {
        unsigned i = (srv->rate_pos + k) % RATE_WINDOW;
        if (!srv->rate_ns[i])
            continue;
        uint64_t dt = uv_hrtime() - srv->rate_ns[i];
        return dt ? (double)(srv->samples_served - srv->rate_samples[i]) * 1e9 / (double)dt : 0;
    }
    return 0;
}

static void op_status(conn *c, const cJSON *req, int64_t id)
{
    server *srv = c->srv;
    uint32_t counts[4] = {0};
    uint64_t wait = srv->closed_wait_ns;
    for (conn *k = srv->conns; k; k = k->next)
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next) {
            for (int st = 0; st < 4; st++)
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
    cJSON_AddNumberToObject(r, "workers", pool_threads(srv->workers));
    cJSON_AddNumberToObject(r, "batches_served", (double)srv->batches_served);
    cJSON_AddNumberToObject(r, "samples_served", (double)srv->samples_served);
    cJSON_AddNumberToObject(r, "bytes_served", (double)srv->bytes_served);
    cJSON_AddNumberToObject(r, "samples_per_s", samples_per_s(srv));
    cJSON_AddNumberToObject(r, "worker_busy_s", (double)pool_busy_ns(srv->workers) / 1e9);
    cJSON_AddNumberToObject(r, "client_wait_s", (double)wait / 1e9);
    cJSON_AddNumberToObject(r, "memory_budget", (double)srv->cfg->memory_budget);
    cJSON_AddNumberToObject(r, "memory_used", (double)srv->memory_used);
    cJSON_AddNumberToObject(r, "queued_reply_bytes", (double)srv->queued_bytes);
    add_slot_counts(cJSON_AddObjectToObject(r, "slots"), counts);
    uint64_t bad = 0, replaced = 0, retries = 0;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        bad += atomic_load(&srv->datasets[i]->bad_samples);
        replaced += atomic_load(&srv->datasets[i]->replaced_samples);
        retries += atomic_load(&srv->datasets[i]->resource_retries);
    }
    cJSON_AddNumberToObject(r, "bad_samples", (double)bad);
    cJSON_AddNumberToObject(r, "replaced_samples", (double)replaced);
    cJSON_AddNumberToObject(r, "resource_retries", (double)retries);
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
    reply_send(c, r);
}

/* ---- metrics ----------------------------------------------------------------------- */

/* A number from a describe() object (stream or cache keeper); 0 when absent. */
static double server_json_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The Prometheus text of the daemon's counters now (see metrics.h). Per-stream and cache
 * values are read from the same describe() objects that `streams` and `status` show, so
 * the three always agree. */
static int server_metrics_text(server *srv, char **ret_text, size_t *ret_len)
{
    struct metrics_snapshot m = {0};
    struct metrics_stream *st = calloc(srv->n_streams ? srv->n_streams : 1, sizeof *st);
    struct metrics_client *cl = calloc(srv->n_conns ? srv->n_conns : 1, sizeof *cl);
    struct metrics_dataset *ds = calloc(srv->n_datasets ? srv->n_datasets : 1, sizeof *ds);
    cJSON *held = cJSON_CreateArray(); /* keeps the describe() objects whose strings we point at */
    int rc = LD_ENOMEM;
    if (!st || !cl || !ds || !held)
        goto out;
    m.version = LD_VERSION;
    m.uptime_s = (double)(uv_hrtime() - srv->started_ns) / 1e9;
    m.clients = srv->n_conns;
    m.streams = srv->n_streams;
    m.workers = pool_threads(srv->workers);
    m.batches = srv->batches_served;
    m.samples = srv->samples_served;
    m.bytes = srv->bytes_served;
    m.worker_busy_s = (double)pool_busy_ns(srv->workers) / 1e9;
    m.memory_budget = srv->cfg->memory_budget;
    m.memory_used = srv->memory_used;
    m.queued_reply_bytes = srv->queued_bytes;
    m.have_process = metrics_read_self(&m.rss_bytes, &m.cpu_s) == 0;
    uint64_t wait = srv->closed_wait_ns;
    for (conn *k = srv->conns; k && m.n_clients < srv->n_conns; k = k->next) {
        struct metrics_client *mc = &cl[m.n_clients++];
        uint64_t cwait = k->closed_wait_ns;
        mc->id = k->id;
        mc->name = k->name;
        mc->batches = k->batches_served;
        mc->samples = k->samples_served;
        mc->bytes = k->bytes_served;
        mc->worker_cpu_s = k->closed_cpu_s;
        mc->connected_s = (double)(uv_hrtime() - k->connected_ns) / 1e9;
        for (struct conn_stream *cs = k->streams; cs && m.n_streams < srv->n_streams; cs = cs->next) {
            cJSON *js = cJSON_CreateObject();
            if (!js)
                goto out;
            cJSON_AddItemToArray(held, js);
            stream_describe_state(cs->s, js);
            struct metrics_stream *ms = &st[m.n_streams++];
            const cJSON *dn = cJSON_GetObjectItemCaseSensitive(js, "dataset");
            ms->id = cs->id;
            ms->dataset = cJSON_IsString(dn) ? dn->valuestring : "";
            ms->client_id = k->id;
            ms->batches = (uint64_t)server_json_num(js, "batches_served");
            ms->samples = (uint64_t)server_json_num(js, "samples_served");
            ms->bytes = (uint64_t)server_json_num(js, "bytes_served");
            ms->wait_s = (double)stream_wait_ns(cs->s) / 1e9;
            struct stream_stats sst;
            stream_get_stats(cs->s, &sst);
            ms->worker_cpu_s = sst.worker_cpu_s;
            ms->stall = sst.stall;
            ms->samples_per_s_now = sst.samples_per_s_now;
            ms->samples_per_s = sst.samples_per_s;
            ms->prefetch_depth = sst.prefetch_depth;
            mc->worker_cpu_s += sst.worker_cpu_s;
            mc->samples_per_s_now += sst.samples_per_s_now;
            for (int state = 0; state < METRICS_SLOT_STATES; state++) {
                ms->slots[state] = ring_count(stream_ring(cs->s), (enum ring_state)state);
                m.slots[state] += ms->slots[state];
            }
            mc->streams++;
            cwait += stream_wait_ns(cs->s);
        }
        mc->wait_s = (double)cwait / 1e9;
        wait += cwait - k->closed_wait_ns;
    }
    m.wait_s = (double)wait / 1e9;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        ds[i].name = srv->datasets[i]->name;
        ds[i].bad_samples = atomic_load(&srv->datasets[i]->bad_samples);
        ds[i].replaced_samples = atomic_load(&srv->datasets[i]->replaced_samples);
        if (srv->keepers[i]) {
            cJSON *jc = cJSON_CreateObject();
            if (!jc)
                goto out;
            cJSON_AddItemToArray(held, jc);
            cache_report_keeper(srv->keepers[i], jc);
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(jc, "state");
            ds[i].cache_state = cJSON_IsString(state) ? state->valuestring : "unknown";
            ds[i].cache_samples = (uint64_t)server_json_num(jc, "hits");
            ds[i].cache_bytes = (uint64_t)server_json_num(jc, "hit_bytes");
        }
    }
    m.n_datasets = srv->n_datasets;
    m.stream = st;
    m.client = cl;
    m.dataset = ds;
    rc = metrics_format(&m, ret_text, ret_len);
out:
    cJSON_Delete(held);
    free(st);
    free(cl);
    free(ds);
    return rc;
}

static int server_metrics_render(void *ctx, char **ret_text, size_t *ret_len)
{
    return server_metrics_text(ctx, ret_text, ret_len);
}

static void op_metrics(conn *c, const cJSON *req, int64_t id)
{
    char *text = NULL;
    size_t len = 0;
    int rc = server_metrics_text(c->srv, &text, &len);
    if (rc < 0) {
        reply_error(c, id, rc, "cannot format the metrics: out of memory");
        return;
    }
    cJSON *r = proto_reply_ok(id);
    cJSON_AddStringToObject(r, "content_type", METRICS_CONTENT_TYPE);
    cJSON_AddStringToObject(r, "text", text);
    free(text);
    reply_send(c, r);
}

/* The dataset a cache request names, and its keeper; replies the error when there is none. */
static cache_keeper *cache_request(conn *c, const cJSON *req, int64_t id, dataset **ret_d)
{
    char err[LD_ERRMSG_MAX];
    const char *name;
    int rc = proto_get_str(req, "dataset", LD_NAME_MAX - 1, &name, err);
    if (rc < 0) {
        reply_error(c, id, rc, err);
        return NULL;
    }
    dataset *d = find_dataset(c->srv, name);
    if (!d) {
        snprintf(err, sizeof err, "no dataset named '%s' (see `loaderctl datasets`)", name);
        reply_error(c, id, LD_ENODATASET, err);
        return NULL;
    }
    cache_keeper *k = keeper_of(c->srv, d);
    if (!k) {
        snprintf(err, sizeof err, "dataset '%s' has no cache configured (add a `cache: {path: ...}` mapping to it)",
                 name);
        reply_error(c, id, LD_ENOTSUP, err);
        return NULL;
    }
    *ret_d = d;
    return k;
}

static void op_cache_build(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    dataset *d;
    cache_keeper *k = cache_request(c, req, id, &d);
    bool force;
    int rc;
    if (!k)
        return;
    if ((rc = proto_opt_bool(req, "force", false, &force, err)) < 0 || (rc = cache_keeper_build(k, force, err)) < 0) {
        reply_error(c, id, rc, err);
        return;
    }
    cJSON *r = proto_reply_ok(id);
    cache_report_keeper(k, r);
    reply_send(c, r);
}

static void op_cache_info(conn *c, const cJSON *req, int64_t id)
{
    dataset *d;
    cache_keeper *k = cache_request(c, req, id, &d);
    if (!k)
        return;
    cJSON *r = proto_reply_ok(id);
    cJSON_AddStringToObject(r, "dataset", d->name);
    cache_report_keeper(k, r);
    reply_send(c, r);
}

/* A verify answers when the keeper's thread is done; the connection may be gone by
 * then, so the request remembers it by id and checks its outbox entry is still there. */
struct verify_wait {
    server *srv;
    uint64_t conn_id;
    struct reply *r;
};

static void verify_done(void *ctx, int rc, const char *message)
{
    struct verify_wait *w = ctx;
    conn *c = w->srv->conns;
    while (c && c->id != w->conn_id)
        c = c->next;
    struct reply *r = c ? c->out_head : NULL;
    while (r && r != w->r)
        r = r->next;
    if (c && r && !c->closing && !c->doomed)
        reply_fill(c, r, rc < 0 ? proto_reply_error(r->id, rc, message) : proto_reply_ok(r->id));
    free(w);
}

static void op_cache_verify(conn *c, const cJSON *req, int64_t id)
{
    char err[LD_ERRMSG_MAX];
    dataset *d;
    cache_keeper *k = cache_request(c, req, id, &d);
    if (!k)
        return;
    struct verify_wait *w = calloc(1, sizeof *w);
    struct reply *r = w ? outbox_add(c, id) : NULL;
    if (!r) {
        free(w);
        conn_doom(c);
        return;
    }
    w->srv = c->srv;
    w->conn_id = c->id;
    w->r = r;
    int rc = cache_keeper_verify(k, verify_done, w, err);
    if (rc < 0) {
        free(w);
        reply_fill(c, r, proto_reply_error(id, rc, err));
    }
}

static void op_streams(conn *c, const cJSON *req, int64_t id)
{
    cJSON *r = proto_reply_ok(id);
    cJSON *list = cJSON_AddArrayToObject(r, "streams");
    for (conn *k = c->srv->conns; k; k = k->next)
        for (struct conn_stream *cs = k->streams; cs; cs = cs->next) {
            cJSON *js = cJSON_CreateObject();
            stream_describe_state(cs->s, js);
            cJSON_AddNumberToObject(js, "client_id", (double)k->id);
            cJSON_AddStringToObject(js, "client", k->name);
            cJSON_AddItemToArray(list, js);
        }
    reply_send(c, r);
}

static const struct {
    const char *name;
    void (*run)(conn *c, const cJSON *req, int64_t id);
} ops[] = {
    {LD_OP_HELLO, op_hello},     {LD_OP_DATASETS, op_datasets}, {LD_OP_OPEN, op_open},
    {LD_OP_NEXT, op_next},       {LD_OP_RELEASE, op_release},   {LD_OP_CLOSE, op_close},
    {LD_OP_STATUS, op_status},   {LD_OP_STREAMS, op_streams},
    {LD_OP_CACHE_BUILD, op_cache_build}, {LD_OP_CACHE_INFO, op_cache_info},
    {LD_OP_CACHE_VERIFY, op_cache_verify},
    {LD_OP_METRICS, op_metrics},
};

static void handle_frame(conn *c, const char *payload, size_t len)
{
    char err[LD_ERRMSG_MAX];
    cJSON *req = NULL;
    int rc = proto_parse(payload, len, &req, err);
    if (rc < 0) {
        reply_error(c, -1, rc, err);
        return;
    }
    int64_t id = proto_request_id(req);
    const char *op;
    if (id < 0) {
        reply_error(c, -1, LD_EFIELD, "field 'id': expected an integer in [0, 2^53)");
    } else if ((rc = proto_get_str(req, "op", LD_OP_NAME_MAX, &op, err)) < 0) {
        reply_error(c, id, rc, err);
    } else if (!c->hello && strcmp(op, LD_OP_HELLO) != 0) {
        snprintf(err, sizeof err, "the first request must be hello, not '%s'", op);
        reply_error(c, id, LD_EHELLO, err);
    } else {
        size_t i;
        for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (strcmp(op, ops[i].name) == 0)
                break;
        if (i < sizeof ops / sizeof ops[0]) {
            ops[i].run(c, req, id);
        } else {
            snprintf(err, sizeof err, "unknown op '%s' (expected hello, datasets, open, next, release, "
                                      "close, status, streams, cache_build, cache_info, cache_verify or metrics)", op);
            reply_error(c, id, LD_EUNKNOWNOP, err);
        }
    }
    cJSON_Delete(req);
}

/* ---- connections ---------------------------------------------------------------- */

static void closed_one(server *srv)
{
    srv->pending_closes--;
    if (srv->pending_closes == 0 && srv->stopping && !srv->set && srv->done) {
        void (*done)(void *) = srv->done;
        srv->done = NULL;
        done(srv->done_ctx);
    }
}

static void conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    server *srv = c->srv;
    bool trim = c->peak_queued_bytes >= TRIM_AFTER_BYTES;
    proto_reader_free(c->reader);
    free(c);
    /* Many small replies leave the heap fragmented: give the pages back, so that a
     * burst of queued replies does not stay resident after its client has gone. */
    if (trim)
        malloc_trim(0);
    closed_one(srv);
}

static void maybe_done(server *srv);

static void conn_close(conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    server *srv = c->srv;
    if (c->doomed) {
        conn **pp = &srv->doomed;
        while (*pp && *pp != c)
            pp = &(*pp)->doom_next;
        if (*pp)
            *pp = c->doom_next;
    }
    while (c->streams)
        conn_stream_close(c, c->streams);
    while (c->out_head) {
        struct reply *r = c->out_head;
        c->out_head = r->next;
        if (r->frame)
            queued_sub(c, REPLY_COST(r->len));
        free(r->frame);
        free(r);
    }
    if (c->reserved) {
        srv->n_reserved--;
    } else if (srv->n_reserved) {
        /* A trainer slot is free now: the connection in the operator slot takes it, so
         * that the operator slot is free again for the next loaderctl. */
        for (conn *k = srv->conns; k; k = k->next)
            if (k->reserved) {
                k->reserved = false;
                srv->n_reserved--;
                break;
            }
    }
    c->out_tail = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s) disconnected", c->id, c->name);
    srv->pending_closes++;
    uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void shutdown_done(uv_shutdown_t *req, int status)
{
    conn *c = req->handle->data;
    free(req);
    conn_close(c);
}

/* Sends a last error straight to the socket (ahead of anything waiting in the outbox:
 * the connection ends), then closes once it is written. */
static void conn_fatal(conn *c, int code, const char *message)
{
    ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): %s", c->id, c->name, message);
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->doomed = true; /* no more requests; not on the reaper list: shutdown_done closes */
    cJSON *msg = proto_reply_error(-1, code, message);
    struct write_req *w = calloc(1, sizeof *w);
    uv_shutdown_t *sh = calloc(1, sizeof *sh);
    size_t len;
    if (msg && w && sh && proto_encode(msg, &w->frames[0], &len) == 0) {
        w->c = c;
        w->n = 1;
        uv_buf_t buf = uv_buf_init(w->frames[0], (unsigned)len);
        if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, write_done) == 0) {
            w = NULL;
            if (uv_shutdown(sh, (uv_stream_t *)&c->pipe, shutdown_done) == 0)
                sh = NULL;
        }
    }
    cJSON_Delete(msg);
    if (w)
        free(w->frames[0]);
    free(w);
    if (sh) {
        free(sh);
        c->doomed = false;
        conn_doom(c);
    }
}

static void on_frames(conn *c, int rc);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = st->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (nread == 0 || c->closing || c->doomed)
        return;
    int rc = proto_reader_feed(c->reader, buf->base, (size_t)nread);
    /* Several requests often arrive in one read (a release and the next request):
     * answer them all, then write the replies in one go. */
    c->reading = true;
    on_frames(c, rc);
    c->reading = false;
    flush(c);
}

static void on_frames(conn *c, int rc)
{
    for (;;) {
        const char *payload;
        size_t len;
        if (rc >= 0)
            rc = proto_reader_next(c->reader, &payload, &len);
        if (rc < 0) {
            char err[LD_ERRMSG_MAX];
            if (rc == LD_EMSGSIZE)
                snprintf(err, sizeof err, "frame larger than the limit of %u bytes (server.max_frame); "
                                          "closing the connection", c->srv->cfg->max_frame);
            else
                snprintf(err, sizeof err, "%s; closing the connection", ld_strerror(rc));
            conn_fatal(c, rc, err);
            return;
        }
        if (rc == 0)
            return;
        c->last_frame_ns = uv_hrtime();
        handle_frame(c, payload, len);
        if (c->closing || c->doomed)
            return;
    }
}

/* The connected process's uid; our own if the kernel cannot say (it always can on a
 * Unix socket). */
static uint32_t server_peer_uid(uv_pipe_t *pipe)
{
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (uv_fileno((uv_handle_t *)pipe, &fd) == 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
        return (uint32_t)cred.uid;
    return (uint32_t)getuid();
}

static void on_connection(uv_stream_t *listener, int status)
{
    server *srv = listener->data;
    if (status < 0) {
        ld_log(LD_LOG_WARN, "accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = srv;
    c->id = ++srv->next_conn_id;
    snprintf(c->name, sizeof c->name, "client-%" PRIu64, c->id);
    uv_pipe_init(srv->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(listener, (uv_stream_t *)&c->pipe) < 0 ||
        proto_reader_new(srv->cfg->max_frame, &c->reader) < 0) {
        srv->pending_closes++;
        uv_close((uv_handle_t *)&c->pipe, conn_closed);
        return;
    }
    c->connected_ns = c->last_frame_ns = uv_hrtime();
    c->uid = server_peer_uid(&c->pipe);
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    bool full = srv->n_conns - srv->n_reserved >= srv->cfg->max_clients;
    srv->n_conns++;
    if (full && srv->n_reserved == 0) {
        /* One connection beyond max_clients is kept for operator commands, so that
         * loaderctl can still look at a daemon whose clients fill every slot. */
        c->reserved = true;
        srv->n_reserved++;
    } else if (full) {
        char err[LD_ERRMSG_MAX];
        snprintf(err, sizeof err, "the daemon already serves %u clients (server.max_clients), and the slot "
                 "kept for operator commands is taken", srv->cfg->max_clients);
        conn_fatal(c, LD_ELIMIT, err);
        return;
    }
    ld_log(LD_LOG_DEBUG, "client %" PRIu64 " connected", c->id);
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* ---- listening socket ----------------------------------------------------------- */

/* A group by name or number, for server.socket_group. */
static int server_group(const char *name, gid_t *ret_gid, char *errbuf)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(name, &end, 10);
    if (*name >= '0' && *name <= '9' && *end == '\0' && errno == 0 && v < (gid_t)-1) {
        *ret_gid = (gid_t)v;
        return 0;
    }
    struct group gr, *found = NULL;
    char buf[4096];
    int e = getgrnam_r(name, &gr, buf, sizeof buf, &found);
    if (!found) {
        snprintf(errbuf, LD_ERRMSG_MAX, "server.socket_group: no group named '%s'%s%s", name, e ? ": " : "",
                 e ? strerror(e) : "");
        return e ? ld_from_errno(e) : LD_ENOENT;
    }
    *ret_gid = gr.gr_gid;
    return 0;
}

/* Who may map the rings. With server.socket_group, the daemon serves that group: the
 * socket and every ring belong to it (rings 0640). A socket passed by systemd whose
 * mode lets its group connect (SocketGroup= with SocketMode=0660) means the same for
 * its group. Otherwise rings stay private to the daemon's user (0600). */
static int server_share_group(server *srv, bool passed, char *errbuf)
{
    const char *path = srv->socket_path;
    gid_t gid;
    int rc;
    if (srv->cfg->socket_group) {
        if ((rc = server_group(srv->cfg->socket_group, &gid, errbuf)) < 0)
            return rc;
        if (!passed && chown(path, (uid_t)-1, gid) < 0) {
            snprintf(errbuf, LD_ERRMSG_MAX, "cannot give the socket '%s' to group %s (server.socket_group): %s "
                     "(the daemon must run as root or be a member of the group)", path, srv->cfg->socket_group,
                     strerror(errno));
            return ld_from_errno(errno);
        }
    } else {
        struct stat st;
        if (!passed || stat(path, &st) < 0 || !(st.st_mode & S_IWGRP))
            return 0;
        gid = st.st_gid;
    }
    ring_share_with_group(gid);
    ld_log(LD_LOG_INFO, "serving group %u: the socket and the rings (mode 0640) belong to it", (unsigned)gid);
    return 0;
}

static int bind_socket(server *srv, const char *path, char *errbuf)
{
    int fd = notify_listen_fd();
    int rc;
    if (fd >= 0) {
        rc = uv_pipe_open(&srv->listener, fd);
        if (rc < 0) {
            snprintf(errbuf, LD_ERRMSG_MAX, "cannot use the socket passed by systemd: %s", uv_strerror(rc));
            return rc;
        }
        size_t n = sizeof srv->socket_path;
        if (uv_pipe_getsockname(&srv->listener, srv->socket_path, &n) < 0)
            snprintf(srv->socket_path, sizeof srv->socket_path, "(systemd socket)");
        ld_log(LD_LOG_INFO, "using the socket passed by systemd: %s", srv->socket_path);
        return server_share_group(srv, true, errbuf);
    }
    /* libuv 1.44 truncates a long path silently: check it ourselves. */
    if (strlen(path) >= sizeof srv->socket_path) {
        snprintf(errbuf, LD_ERRMSG_MAX, "socket path '%s' is %zu bytes; a Unix socket path must be under %zu",
                 path, strlen(path), sizeof srv->socket_path);
        return LD_ENAMETOOLONG;
    }
    /* The default socket's private directory: created 0700, refused when another user
     * owns it or can write into it (they could bind the socket before us). */
    if ((rc = proto_socket_check_path(path, true, errbuf)) < 0)
        return rc;
    snprintf(srv->socket_path, sizeof srv->socket_path, "%s", path);
    if ((rc = proto_socket_clear_stale(path, "control socket", errbuf)) < 0)
        return rc;
    if (rc == 1)
        ld_log(LD_LOG_INFO, "removed the stale socket %s", path);
    rc = uv_pipe_bind(&srv->listener, path);
    if (rc < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "cannot bind '%s': %s", path, uv_strerror(rc));
        return rc;
    }
    srv->owns_socket_file = true;
    if (chmod(path, 0660) < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "cannot set mode 0660 on '%s': %s", path, strerror(errno));
        return ld_from_errno(errno);
    }
    return server_share_group(srv, false, errbuf);
}

static void on_reap(uv_timer_t *t)
{
    server *srv = t->data;
    while (srv->doomed)
        conn_close(srv->doomed); /* conn_close unlinks it from the list */
}

/* A connection that never says hello (or sends part of a frame, then nothing), or that
 * holds no stream and sends nothing for a long time, only takes a client slot: close it. */
static void server_expire_idle(server *srv, uint64_t now)
{
    const struct config *cfg = srv->cfg;
    char err[LD_ERRMSG_MAX];
    for (conn *c = srv->conns; c; c = c->next) {
        if (c->closing || c->doomed)
            continue;
        if (!c->hello && now - c->connected_ns >= (uint64_t)cfg->hello_timeout_s * 1000000000u) {
            snprintf(err, sizeof err, "no hello within %u s of connecting (server.hello_timeout); closing the "
                     "connection", cfg->hello_timeout_s);
            conn_fatal(c, LD_ETIMEDOUT, err);
        } else if (c->hello && cfg->idle_timeout_s && !c->streams && !c->out_head &&
                   now - c->last_frame_ns >= (uint64_t)cfg->idle_timeout_s * 1000000000u) {
            snprintf(err, sizeof err, "idle for %u s without a stream (server.idle_timeout); closing the "
                     "connection", cfg->idle_timeout_s);
            conn_fatal(c, LD_ETIMEDOUT, err);
        }
    }
}

static void on_tick(uv_timer_t *t)
{
    server *srv = t->data;
    uint64_t now = uv_hrtime();
    if (!srv->stopping)
        server_expire_idle(srv, now);
    srv->rate_pos = (srv->rate_pos + 1) % RATE_WINDOW;
    srv->rate_samples[srv->rate_pos] = srv->samples_served;
    srv->rate_ns[srv->rate_pos] = now;
    if (srv->watchdog_ns && now - srv->last_watchdog_ns >= srv->watchdog_ns / 2) {
        notify_send("WATCHDOG=1");
        srv->last_watchdog_ns = now;
    }
    if (srv->stopping)
        maybe_done(srv);
}

int server_new(uv_loop_t *loop, hub *h, const struct config *cfg, dataset **datasets, size_t n_datasets,
               pool *workers, server **ret_server, char *errbuf)
{
    server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        return LD_ENOMEM;
    }
    srv->loop = loop;
    srv->cfg = cfg;
    srv->datasets = datasets;
    srv->n_datasets = n_datasets;
    srv->workers = workers;
    srv->started_ns = uv_hrtime();
    srv->keepers = calloc(n_datasets ? n_datasets : 1, sizeof *srv->keepers);
    srv->watches = calloc(n_datasets ? n_datasets : 1, sizeof *srv->watches);
    if (!srv->keepers || !srv->watches) {
        free(srv->keepers);
        free(srv->watches);
        free(srv);
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        return LD_ENOMEM;
    }
    srv->hub = h;
    int rc = stream_set_new(h, workers, &srv->set);
    if (rc < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "cannot set up the streams: %s", ld_strerror(rc));
        free(srv->keepers);
        free(srv->watches);
        free(srv);
        return rc;
    }
    uv_pipe_init(loop, &srv->listener, 0);
    srv->listener.data = srv;
    srv->listening = true;
    uv_timer_init(loop, &srv->tick);
    srv->tick.data = srv;
    uv_timer_init(loop, &srv->reaper);
    srv->reaper.data = srv;
    /* The metrics listener first: once the control socket answers, it is there too. */
    rc = cfg->metrics_listen
             ? metrics_http_new(loop, cfg->metrics_listen, server_metrics_render, srv, &srv->metrics, errbuf)
             : 0;
    if (rc == 0)
        rc = bind_socket(srv, cfg->socket_path, errbuf);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&srv->listener, 128, on_connection);
        if (rc < 0)
            snprintf(errbuf, LD_ERRMSG_MAX, "cannot listen on '%s': %s", srv->socket_path, uv_strerror(rc));
    }
    if (rc < 0) {
        if (srv->metrics)
            metrics_http_close(srv->metrics, NULL, NULL);
        srv->metrics = NULL;
        if (srv->owns_socket_file)
            unlink(srv->socket_path);
        srv->owns_socket_file = false;
        uv_close((uv_handle_t *)&srv->listener, NULL);
        uv_close((uv_handle_t *)&srv->tick, NULL);
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        stream_set_free(srv->set);
        uv_run(loop, UV_RUN_NOWAIT); /* let the handles close before srv goes */
        free(srv->keepers);
        free(srv->watches);
        free(srv);
        return rc;
    }
    for (size_t i = 0; i < n_datasets; i++) {
        char err[LD_ERRMSG_MAX];
        if (dataset_watch_new(&cfg->datasets[i], datasets[i], &srv->watches[i], err) < 0)
            ld_log(LD_LOG_WARN, "%s; files added later are served after a restart", err);
        if (!cfg->datasets[i].cache_path)
            continue; /* no `cache:` section (mode off with a path still answers cache requests) */
        if (cache_keeper_new(loop, datasets[i], &cfg->datasets[i], &srv->keepers[i], err) < 0)
            ld_log(LD_LOG_WARN, "%s; serving from the source", err); /* a cache is an optimisation */
    }
    srv->watchdog_ns = notify_watchdog_usec() * 1000;
    uv_timer_start(&srv->tick, on_tick, 1000, 1000);
    on_tick(&srv->tick);
    *ret_server = srv;
    return 0;
}

static void handle_closed(uv_handle_t *h)
{
    closed_one(h->data);
}

/* Called while stopping: once every stream's running work is back, close the rest. */
static void maybe_done(server *srv)
{
    if (stream_set_live(srv->set) > 0 || !uv_is_active((uv_handle_t *)&srv->tick))
        return;
    uv_timer_stop(&srv->tick);
    stream_set_free(srv->set);
    srv->set = NULL;
    srv->pending_closes += 2;
    uv_close((uv_handle_t *)&srv->reaper, handle_closed);
    uv_close((uv_handle_t *)&srv->tick, handle_closed);
}

static void keeper_closed(void *ctx)
{
    closed_one(ctx);
}

void server_stop(server *srv, void (*done)(void *ctx), void *ctx)
{
    if (srv->stopping)
        return;
    srv->stopping = true;
    srv->done = done;
    srv->done_ctx = ctx;
    notify_send("STOPPING=1");
    ld_log(LD_LOG_INFO, "stopping: %u clients, %u streams", srv->n_conns, srv->n_streams);
    if (srv->listening) {
        srv->listening = false;
        srv->pending_closes++;
        uv_close((uv_handle_t *)&srv->listener, handle_closed);
    }
    if (srv->owns_socket_file) {
        unlink(srv->socket_path);
        srv->owns_socket_file = false;
    }
    if (srv->metrics) {
        srv->pending_closes++;
        metrics_http_close(srv->metrics, keeper_closed, srv);
        srv->metrics = NULL;
    }
    while (srv->conns)
        conn_close(srv->conns);
    for (size_t i = 0; i < srv->n_datasets; i++) {
        if (srv->keepers[i]) {
            srv->pending_closes++;
            cache_keeper_close(srv->keepers[i], keeper_closed, srv);
        }
    }
    /* Streams with work still running are freed as it comes back; the tick checks. */
    uv_timer_stop(&srv->tick);
    uv_timer_start(&srv->tick, on_tick, 10, 10);
    maybe_done(srv);
}

void server_free(server *srv)
{
    if (!srv)
        return;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        cache_keeper_free(srv->keepers[i]);
        dataset_watch_free(srv->watches[i]);
    }
    free(srv->keepers);
    free(srv->watches);
    free(srv);
}

const char *server_socket_path(const server *srv)
{
    return srv->socket_path;
}
