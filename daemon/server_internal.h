/* server_internal — private to daemon/server*.c: the server's and a connection's layout,
 * and the calls between the server's files.
 *
 *   server.c          the listener and the server's life: bind, accept, the tick
 *                     (idle clients, rate, watchdog), stop and free.
 *   server_conn.c     a connection's I/O: reading frames, the outbox that keeps replies
 *                     in request order, write batching, and closing.
 *   server_ops.c      the requests: the ops[] table and one op_* per request.
 *   server_open.c     the `open` request: configured and declared datasets, shared
 *                     streams, the hand-off.
 *   server_metrics.c  the Prometheus text of the daemon's counters.
 *   server_reload.c   a reload: the config read again, datasets added, changed and
 *                     removed, and the datasets that could not be opened.
 *   server_reload_access.c  what a reload's access rules end among what is open.
 *
 * Everything here runs on the loop thread. No callback runs inside the call that caused
 * it: a stream returns the answer to a `next` that it knows at once and calls back only
 * for one that must wait, from a hub completion (hub.h); a connection that must go away
 * because of something found inside a request or an answer is closed through the hub
 * too (server_conn_abort); and replies are written once per turn of the loop, just
 * before it waits for I/O again (server_conn_flush_pending). */
#ifndef LD_SERVER_INTERNAL_H
#define LD_SERVER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>
#include <uv.h>

#include "access.h"
#include "cache_keeper.h"
#include "dataset_watch.h"
#include "handoff.h"
#include "hub.h"
#include "metrics_http.h"
#include "proto.h"
#include "server.h"
#include "share.h"
#include "stream.h"

#define SERVER_READ_BUF_SIZE (64u * 1024u)
#define SERVER_RATE_WINDOW 6        /* seconds of history for samples_per_s */

typedef struct conn conn;

/* One request's place in the outbox. Replies leave in request order: one whose answer
 * is not known yet (a `next` waiting for its batch, a cache verify) holds back those
 * behind it. */
struct reply {
    struct reply *next;
    struct conn_stream *cs;         /* a waiting next: the stream it waits on */
    int64_t id;
    char *frame;                    /* NULL while the answer is not known */
    size_t len;
    int send_fd;                    /* a descriptor that goes with the frame (SCM_RIGHTS), or -1 */
};

/* What a queued reply costs: its frame and its outbox entry. */
#define SERVER_REPLY_COST(len) ((uint64_t)(len) + sizeof(struct reply))

/* A stream that a connection opened (the connection is its lease holder). */
struct conn_stream {
    struct conn_stream *next;
    conn *c;
    stream *s;
    uint64_t id;
    uint64_t ring_bytes;
    share_group *share;             /* a consumer of a shared stream (share.h), or NULL */
    handoff *ho;                    /* batches handed off in shared memory (handoff.h), or NULL */
};

/* A stream that a reload ended because its peer may no longer read its dataset: a
 * later `next` naming it gets the reason (a release or a close: ok). */
struct conn_revoked {
    struct conn_revoked *next;
    uint64_t id;
    char message[LD_ERRMSG_MAX];
};

enum conn_state {
    CONN_OPEN,                      /* reading requests, writing replies */
    CONN_ENDING,                    /* reads no more: a last error is on its way, or a close is queued */
    CONN_CLOSED,                    /* torn down; the handle is closing */
};

struct conn {
    uv_pipe_t pipe;
    server *srv;
    conn *prev, *next;
    uint64_t id;
    proto_reader *reader;
    enum conn_state state;
    bool hello;
    bool reserved;                  /* holds the slot kept for operator commands: no streams */
    bool flush_queued;              /* on srv->flush_head */
    conn *flush_next;
    struct hub_completion abort;    /* server_conn_abort: closes it from the loop */
    char name[LD_NAME_MAX];
    /* The peer's credentials (SO_PEERCRED) at connect, and its process name then
     * (/proc/PID/comm): for scheduling by client, access control, and the operator's
     * `streams` and `status`. pid is 0 when the peer is in another pid namespace. */
    uint32_t uid, gid;
    int32_t pid;
    char comm[16];
    uint32_t groups[ACCESS_MAX_PEER_GROUPS]; /* supplementary (SO_PEERGROUPS), for access rules */
    uint32_t n_groups;
    struct reply *out_head, *out_tail;
    struct reply *reply_into;       /* set: the next reply fills this entry (a declared open's place) */
    uint32_t out_count;             /* replies in the outbox, sent or not */
    uint64_t queued_bytes;          /* replies queued and not yet written to the socket */
    uint64_t peak_queued_bytes;
    uint64_t connected_ns, last_frame_ns; /* for the hello deadline and the idle timeout */
    uint64_t batches_served, samples_served, bytes_served, closed_wait_ns; /* for metrics */
    double closed_cpu_s;            /* workers' CPU time on streams already closed */
    struct conn_stream *streams;
    struct conn_revoked *revoked;   /* streams a reload ended (server_reload_access.c) */
    char rbuf[SERVER_READ_BUF_SIZE];
};

/* A configured dataset that could not be opened (its path is missing or unreadable):
 * listed by `datasets`, refused at open with the reason; a reload tries it again. */
struct server_unavailable {
    char name[LD_NAME_MAX];
    char reason[LD_ERRMSG_MAX];     /* "FILE:LINE:COLUMN: why" */
};

/* The cache keeper of a dataset a reload changed or removed: its streams may still
 * read through it, so it runs (holding the dataset) until they are gone. */
struct server_old_keeper {
    cache_keeper *k;
    dataset *d;
};

struct server {
    uv_loop_t *loop;
    struct config *cfg;             /* the one running (owned), server.c / server_reload.c */
    dataset **datasets;             /* the available datasets (owned) */
    const struct config_dataset **defs; /* per dataset: its definition, in cfg or an older one */
    size_t n_datasets;
    struct server_unavailable *unavailable;
    size_t n_unavailable;
    struct config **old_cfgs;       /* configs replaced by reloads: kept definitions point there */
    size_t n_old_cfgs;
    struct server_old_keeper *old_keepers;
    size_t n_old_keepers;
    struct server_declared_cache *declared_caches; /* server_declare.c */
    int declare_scans;              /* declared opens being scanned on their threads */
    struct server_declare_job *declare_jobs; /* those scans (server_declare.c), for the per-user cap */
    uint64_t reloads;               /* successful ones */
    struct server_reload_job *reload_job; /* the reload whose datasets are being opened, or NULL */
    bool reload_again;              /* a SIGHUP came during it: reload once more after it */
    cache_keeper **keepers;         /* per dataset; NULL where the dataset has no cache */
    dataset_watch **watches;        /* per dataset: rescans a folder that changed */
    pool *workers;
    hub *hub;                       /* the loop's (main.c's): completions come back through it */
    stream_set *set;                /* NULL once stopped and every stream freed */
    uv_pipe_t listener;
    bool listening, owns_socket_file;
    metrics_http *metrics;          /* server.metrics.listen, or NULL */
    uv_timer_t tick;
    uv_prepare_t flusher;           /* writes the queued replies before the loop waits */
    conn *flush_head;               /* connections with replies to write */
    conn *conns;
    uint32_t n_conns, n_streams;
    uint32_t n_reserved;            /* connections in the operator slot (0 or 1) */
    uint64_t queued_bytes;          /* replies queued unread, across connections */
    uint64_t next_conn_id, next_stream_id;
    uint64_t memory_used;
    uint64_t started_ns;
    uint64_t batches_served, samples_served, bytes_served;
    uint64_t closed_wait_ns;        /* client wait of streams already closed */
    uint64_t rate_samples[SERVER_RATE_WINDOW];
    uint64_t rate_ns[SERVER_RATE_WINDOW];
    unsigned rate_pos;
    uint64_t watchdog_ns, last_watchdog_ns;
    bool stopping;
    int pending_closes;
    void (*done)(void *ctx);
    void *done_ctx;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* ---- server.c ---- */
/* A handle or a keeper of the server finished closing (counts towards `done`). */
void server_closed_one(server *srv);
/* The same, in cache_keeper_close's callback shape (ctx: the server). */
void server_part_closed(void *ctx);

/* ---- server_conn.c ---- */
/* The listener's connection callback: accepts one client. */
void server_conn_accept(uv_stream_t *listener, int status);
/* Tears the connection down now (its streams closed, its outbox dropped) and closes its
 * handle. Only from a loop callback that holds nothing of the connection's (not from
 * inside a request or a stream's answer: use server_conn_abort there). */
void server_conn_close(conn *c);
/* Stops reading and queues the close for the loop: for a failure found inside a
 * request or a stream's answer. */
void server_conn_abort(conn *c);
/* Sends a last error straight to the socket and closes once it is written. */
void server_conn_fatal(conn *c, int code, const char *message);
/* The flusher's callback: writes every connection's ready replies, as few writes as
 * the replies allow. */
void server_conn_flush_pending(uv_prepare_t *p);
/* An outbox entry for request `id` (NULL when the outbox is full or memory is short:
 * the caller aborts the connection). */
struct reply *server_outbox_add(conn *c, int64_t id);
/* Fills an outbox entry with msg (consumed) and queues it for writing. */
void server_reply_fill(conn *c, struct reply *r, cJSON *msg);
/* Queues msg (consumed) as the next reply. */
void server_reply_send(conn *c, cJSON *msg);
/* The same, with descriptor fd (owned from now on: closed once sent or dropped; -1:
 * none) passed along with the reply's frame, as SCM_RIGHTS on its first byte. */
void server_reply_send_fd(conn *c, cJSON *msg, int fd);
void server_reply_error(conn *c, int64_t id, int code, const char *message);

/* Adds the connection's credentials (uid, gid, pid, process) to o. */
void server_conn_describe_peer(const conn *c, cJSON *o);
/* The connection's credentials, for access.h's checks. */
struct access_peer server_conn_peer(const conn *c);

/* ---- server_ops.c ---- */
/* Handles one request frame. */
void server_ops_handle(conn *c, const char *payload, size_t len);
/* Closes one of the connection's streams (its waiting nexts are answered `closed`). */
void server_ops_close_stream(conn *c, struct conn_stream *cs);
/* The configured dataset named name, or NULL. */
dataset *server_ops_find_dataset(server *srv, const char *name);
/* Whether the connection passes rule r; when not, replies permission_denied naming what
 * was denied (`what`), for whom, and who the rule (`rule_name`) allows. */
bool server_ops_allowed(conn *c, int64_t id, const struct access_rule *r, const char *rule_name, const char *what);
/* Counts a batch leased to the connection, by a next reply or the hand-off. */
void server_ops_count_batch(conn *c, const struct stream_batch *b);
/* The same for `batches` batches of `rows` and `bytes` in all (the hand-off settles in bulk). */
void server_ops_count_batches(conn *c, uint64_t batches, uint64_t rows, uint64_t bytes);
/* Adds what the hand-offs published on their direct path to the counters, before they
 * are read (handoff_settle_now). */
void server_ops_settle(server *srv);

/* ---- server_open.c ---- */
/* The `open` request. */
void server_open_stream(conn *c, const cJSON *req, int64_t id);
struct declare_cache;
/* The rest of an open of a spec once its scan is done (server_declare.c): d (taken) and
 * where its cache goes (place: its dirfd taken when the cache keeper starts). Replies. */
void server_open_declared(conn *c, const cJSON *req, int64_t id, dataset *d, struct declare_cache *place);

/* ---- server_reload.c ---- */
/* The `reload` request (an operator op). */
void server_ops_reload(conn *c, const cJSON *req, int64_t id);
/* The unavailable dataset named name, or NULL. */
const struct server_unavailable *server_find_unavailable(const server *srv, const char *name);
/* Fills the arrays of srv for cfg's datasets: opened[i] for cfg->datasets[i], or NULL
 * with why[i] (watches and keepers started for the opened ones). Used at start. */
int server_install_datasets(server *srv, dataset *const *opened, char *const *why, char *errbuf);
/* Frees what the reloads kept: old configs, the old keepers (after
 * server_close_old_keepers) and their datasets. */
void server_reload_free(server *srv);
/* From the tick: stops the old keepers whose dataset no stream or job holds any more
 * (each close counts towards `done` until it is through). */
void server_reap_old_keepers(server *srv);
/* At stop: closes the old keepers (each counts towards `done`). */
void server_close_old_keepers(server *srv);

/* ---- server_declare.c ---- */
struct declare_cache;
/* The open of a spec (declare.h), once its fields and limits are checked: the scan
 * runs on a thread, and the open goes on (server_open_declared) when it is done; the
 * reply takes the request's place among the connection's replies. */
void server_declare_start(conn *c, const cJSON *req, int64_t id, const char *template_name);
/* Starts the cache keeper of declared dataset d in `place` (taken) and keeps it until
 * the dataset's last stream is gone; sets d->keeper. 0, or a code with errbuf (the
 * dataset then has no cache). */
int server_declare_keep_cache(server *srv, dataset *d, uint32_t uid, struct declare_cache *place, char *errbuf);
/* From the tick: stops the keepers of declared datasets no stream holds any more. */
void server_declare_reap(server *srv);
/* At stop: closes every declared dataset's keeper (each counts towards `done`). */
void server_declare_close(server *srv);
/* In server_free, after the streams: frees the keepers and their datasets. */
void server_declare_free(server *srv);
/* Adds the declared datasets' caches to status's `caches`. */
void server_declare_report(const server *srv, const conn *c, cJSON *caches);

/* ---- server_reload_access.c ---- */
/* After a reload is applied: ends the connections whose peer the new access.connect no
 * longer lets in and the streams whose peer may no longer read their dataset; how many
 * of each. */
void server_reload_recheck_access(server *srv, int *ret_conns, int *ret_streams);
/* The reason a reload ended stream `stream_id` of c, or NULL when it did not. */
const char *server_revoked_message(const conn *c, uint64_t stream_id);
/* Forgets that record (the client closed the stream): whether there was one. */
bool server_revoked_forget(conn *c, uint64_t stream_id);
/* Frees c's records, when c closes. */
void server_revoked_free(conn *c);

/* ---- server_metrics.c ---- */
/* The Prometheus text of the daemon's counters now (see metrics.h). */
int server_metrics_text(server *srv, char **ret_text, size_t *ret_len);
/* The same, in metrics_http's callback shape. */
int server_metrics_render(void *ctx, char **ret_text, size_t *ret_len);

#endif
