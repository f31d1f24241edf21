/* server_conn — one client connection's I/O: accepting it, reading its frames, keeping
 * its replies in request order, writing them, and closing it.
 *
 * Bytes from a client go through a proto_reader; each whole frame is one JSON request,
 * handed to server_ops. Replies leave in request order through the connection's
 * outbox: a `next` that has to wait for its batch holds its place while later requests
 * (a release, a status) are answered at once and queue behind it.
 *
 * Write batching. A reply is never written from inside the call that made it: filling
 * one puts its connection on the server's flush list, and the flusher (a uv_prepare
 * handle, which runs once per turn of the loop just before it waits for I/O) writes
 * every ready reply of each listed connection in as few uv_write calls as
 * SERVER_WRITE_BATCH allows. So the replies to all the requests of one read, and the
 * batches that the hub delivered on the same turn, leave in one write.
 *
 * Closing. A failure found inside a request or a stream's answer (the outbox overflows,
 * memory runs out) must not tear the connection down under the call chain that found
 * it: server_conn_abort stops reading and posts the close to the hub, which runs it
 * from the loop. Failures seen by a loop callback of our own (a read or write error,
 * the flusher) close at once.
 *
 * Descriptors. A reply may carry one (the hand-off's memory, which has no name): it leaves
 * with the first byte of its frame (uv_write2 on the connection, an IPC pipe, which
 * sends it as SCM_RIGHTS with the first sendmsg of that write). A client that sends us a
 * descriptor breaks the protocol: the connection ends, and the descriptor with it.
 *
 * Bad input is answered, not crashed on (server_ops); only a frame over the limit (the
 * stream cannot be resynchronised) or a client that stops reading its replies is
 * disconnected. */
#include "server_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

#define SERVER_WRITE_BATCH 32
#define SERVER_MAX_QUEUED_REPLIES 4096u /* replies held behind a waiting next: past this, dropped */
#define SERVER_TRIM_AFTER_BYTES (1u << 20) /* a connection that queued this much hands memory back when it goes */

struct write_req {
    uv_write_t req;
    conn *c;
    uv_pipe_t *passed;              /* the descriptor sent with the first frame, or NULL */
    int n;
    uint64_t cost;                  /* of the replies it carries, in conn.queued_bytes */
    char *frames[SERVER_WRITE_BATCH];
};

/* ---- writing ---------------------------------------------------------------------- */

static void server_conn_queued_sub(conn *c, uint64_t cost)
{
    c->queued_bytes -= cost;
    c->srv->queued_bytes -= cost;
}

static void server_conn_passed_closed(uv_handle_t *h)
{
    free(h);
}

static void server_conn_write_done(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    conn *c = w->c;
    if (w->passed)
        uv_close((uv_handle_t *)w->passed, server_conn_passed_closed); /* our copy: the client has its own */
    for (int i = 0; i < w->n; i++)
        free(w->frames[i]);
    server_conn_queued_sub(c, w->cost);
    free(w);
    /* A write cancelled by the close, or failing on a connection already going, says
     * nothing new. */
    if (status < 0 && status != UV_ECANCELED && c->state != CONN_CLOSED) {
        ld_log(LD_LOG_DEBUG, "client %" PRIu64 ": write failed: %s", c->id, uv_strerror(status));
        server_conn_close(c);
    }
}

/* Sends the replies at the head of the outbox that are ready, SERVER_WRITE_BATCH a
 * write. Returns 0, or a negative code when the connection must close. */
static int server_conn_flush(conn *c)
{
    while (c->out_head && c->out_head->frame) {
        struct write_req *w = calloc(1, sizeof *w);
        uv_buf_t bufs[SERVER_WRITE_BATCH];
        if (!w)
            return LD_ENOMEM;
        w->c = c;
        while (w->n < SERVER_WRITE_BATCH && c->out_head && c->out_head->frame) {
            struct reply *r = c->out_head;
            if (r->send_fd >= 0) {
                if (w->n)
                    break; /* a write of its own, so that the descriptor goes with its first byte */
                /* libuv sends a handle's descriptor: the memory's, wrapped in a pipe handle
                 * (uv_pipe_open works on any descriptor), closed when the write is done. */
                w->passed = malloc(sizeof *w->passed);
                if (!w->passed) {
                    free(w);
                    return LD_ENOMEM; /* the reply keeps the descriptor: the close closes it */
                }
                uv_pipe_init(c->pipe.loop, w->passed, 0);
                int prc = uv_pipe_open(w->passed, r->send_fd);
                if (prc < 0) {
                    uv_close((uv_handle_t *)w->passed, server_conn_passed_closed);
                    free(w);
                    return prc;
                }
                r->send_fd = -1;
            }
            bufs[w->n] = uv_buf_init(r->frame, (unsigned)r->len);
            w->frames[w->n++] = r->frame;
            w->cost += SERVER_REPLY_COST(r->len);
            c->out_head = r->next;
            if (!c->out_head)
                c->out_tail = NULL;
            c->out_count--;
            free(r);
        }
        int rc = uv_write2(&w->req, (uv_stream_t *)&c->pipe, bufs, (unsigned)w->n, (uv_stream_t *)w->passed,
                           server_conn_write_done);
        if (rc < 0) {
            if (w->passed)
                uv_close((uv_handle_t *)w->passed, server_conn_passed_closed);
            for (int i = 0; i < w->n; i++)
                free(w->frames[i]);
            server_conn_queued_sub(c, w->cost);
            free(w);
            ld_log(LD_LOG_DEBUG, "client %" PRIu64 ": write failed: %s", c->id, uv_strerror(rc));
            return rc;
        }
    }
    return 0;
}

static void server_conn_flush_later(conn *c)
{
    if (c->flush_queued)
        return;
    c->flush_queued = true;
    c->flush_next = c->srv->flush_head;
    c->srv->flush_head = c;
    uv_prepare_start(&c->srv->flusher, server_conn_flush_pending);
}

static void server_conn_flush_unlist(conn *c)
{
    if (!c->flush_queued)
        return;
    conn **pp = &c->srv->flush_head;
    while (*pp != c)
        pp = &(*pp)->flush_next;
    *pp = c->flush_next;
    c->flush_queued = false;
}

void server_conn_flush_pending(uv_prepare_t *p)
{
    server *srv = p->data;
    while (srv->flush_head) {
        conn *c = srv->flush_head;
        srv->flush_head = c->flush_next;
        c->flush_queued = false;
        /* An ending connection writes nothing more: a last error (server_conn_fatal)
         * went ahead of the outbox, or its close is queued. */
        if (c->state == CONN_OPEN && server_conn_flush(c) < 0)
            server_conn_close(c);
    }
    uv_prepare_stop(p);
}

/* ---- the outbox ------------------------------------------------------------------- */

struct reply *server_outbox_add(conn *c, int64_t id)
{
    if (c->out_count >= SERVER_MAX_QUEUED_REPLIES) {
        /* Requests keep coming while earlier replies wait (a next for a slot the client
         * never releases): memory would grow without bound. */
        ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): %u replies queued unread; disconnecting", c->id, c->name,
               SERVER_MAX_QUEUED_REPLIES);
        return NULL;
    }
    struct reply *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    c->out_count++;
    r->id = id;
    r->send_fd = -1;
    if (c->out_tail)
        c->out_tail->next = r;
    else
        c->out_head = r;
    c->out_tail = r;
    return r;
}

/* Out of memory drops the connection: the client would otherwise wait for a reply that
 * never comes. */
void server_reply_fill(conn *c, struct reply *r, cJSON *msg)
{
    int rc = msg ? proto_encode(msg, &r->frame, &r->len) : LD_ENOMEM;
    cJSON_Delete(msg);
    if (rc < 0) {
        ld_log(LD_LOG_ERROR, "client %" PRIu64 ": cannot encode a reply: %s", c->id, ld_strerror(rc));
        server_conn_abort(c);
        return;
    }
    /* Replies queue up when a client does not read them, or while a next that cannot
     * finish holds its place in front of them (a client that asks for `streams`
     * thousands of times behind it): bound them in bytes, per connection and in all.
     * One reply alone always goes, however large. */
    server *srv = c->srv;
    uint64_t cost = SERVER_REPLY_COST(r->len);
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
        server_conn_abort(c);
        return;
    }
    if (r == c->out_head)
        server_conn_flush_later(c); /* else it waits for the reply in front of it */
}

void server_reply_send_fd(conn *c, cJSON *msg, int fd)
{
    /* A declared open answers in the place its request took (server_declare.c). */
    struct reply *r = c->reply_into ? c->reply_into : server_outbox_add(c, 0);
    c->reply_into = NULL;
    if (!r) {
        if (fd >= 0)
            close(fd);
        cJSON_Delete(msg);
        server_conn_abort(c);
        return;
    }
    r->send_fd = fd;
    server_reply_fill(c, r, msg);
}

void server_reply_send(conn *c, cJSON *msg)
{
    server_reply_send_fd(c, msg, -1);
}

void server_reply_error(conn *c, int64_t id, int code, const char *message)
{
    ld_log(LD_LOG_DEBUG, "client %" PRIu64 " (%s): request %" PRId64 ": %s: %s", c->id, c->name, id,
           ld_error_name(code), message ? message : ld_strerror(code));
    server_reply_send(c, proto_reply_error(id, code, message && *message ? message : ld_strerror(code)));
}

/* ---- closing ---------------------------------------------------------------------- */

static void server_conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    server *srv = c->srv;
    bool trim = c->peak_queued_bytes >= SERVER_TRIM_AFTER_BYTES;
    proto_reader_free(c->reader);
    server_revoked_free(c);
    free(c);
    /* Many small replies leave the heap fragmented: give the pages back, so that a
     * burst of queued replies does not stay resident after its client has gone. */
    if (trim)
        malloc_trim(0);
    server_closed_one(srv);
}

void server_conn_close(conn *c)
{
    if (c->state == CONN_CLOSED)
        return;
    c->state = CONN_CLOSED;
    server *srv = c->srv;
    hub_cancel(srv->hub, &c->abort);
    server_conn_flush_unlist(c);
    /* The outbox goes first: the streams closed below then have no waiting next to
     * answer. */
    while (c->out_head) {
        struct reply *r = c->out_head;
        c->out_head = r->next;
        if (r->frame)
            server_conn_queued_sub(c, SERVER_REPLY_COST(r->len));
        if (r->send_fd >= 0)
            close(r->send_fd);
        free(r->frame);
        free(r);
    }
    c->out_tail = NULL;
    c->out_count = 0;
    while (c->streams)
        server_ops_close_stream(c, c->streams);
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
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    ld_log(LD_LOG_INFO, "client %" PRIu64 " (%s) disconnected", c->id, c->name);
    srv->pending_closes++;
    uv_close((uv_handle_t *)&c->pipe, server_conn_closed);
}

static void server_conn_abort_run(struct hub_completion *hc)
{
    conn *c = (conn *)((char *)hc - offsetof(conn, abort));
    server_conn_close(c);
}

void server_conn_abort(conn *c)
{
    if (c->state != CONN_OPEN)
        return;
    c->state = CONN_ENDING;
    uv_read_stop((uv_stream_t *)&c->pipe);
    hub_post(c->srv->hub, &c->abort);
}

static void server_conn_shutdown_done(uv_shutdown_t *req, int status)
{
    conn *c = req->handle->data;
    free(req);
    server_conn_close(c);
}

/* Sends a last error straight to the socket (ahead of anything waiting in the outbox:
 * the connection ends), then closes once it is written. */
void server_conn_fatal(conn *c, int code, const char *message)
{
    if (c->state != CONN_OPEN)
        return;
    ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s): %s", c->id, c->name, message);
    cJSON *msg = proto_reply_error(-1, code, message);
    struct write_req *w = calloc(1, sizeof *w);
    uv_shutdown_t *sh = calloc(1, sizeof *sh);
    size_t len;
    if (msg && w && sh && proto_encode(msg, &w->frames[0], &len) == 0) {
        w->c = c;
        w->n = 1;
        uv_buf_t buf = uv_buf_init(w->frames[0], (unsigned)len);
        if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, server_conn_write_done) == 0) {
            w = NULL;
            if (uv_shutdown(sh, (uv_stream_t *)&c->pipe, server_conn_shutdown_done) == 0)
                sh = NULL;
        }
    }
    cJSON_Delete(msg);
    if (w)
        free(w->frames[0]);
    free(w);
    if (sh) {
        free(sh);
        server_conn_abort(c); /* the error could not be sent: just close */
        return;
    }
    c->state = CONN_ENDING; /* no more requests; server_conn_shutdown_done closes */
    uv_read_stop((uv_stream_t *)&c->pipe);
}

/* ---- reading ---------------------------------------------------------------------- */

static void server_conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void server_conn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = st->data;
    if (nread < 0) {
        server_conn_close(c);
        return;
    }
    if (nread == 0 || c->state != CONN_OPEN)
        return;
    if (uv_pipe_pending_count(&c->pipe) > 0) {
        /* libuv keeps what came until the handle closes: the close frees it. */
        server_conn_fatal(c, LD_EPROTO, "the client sent a file descriptor; loaderd takes none from clients; "
                                        "closing the connection");
        return;
    }
    int rc = proto_reader_feed(c->reader, buf->base, (size_t)nread);
    /* Several requests often arrive in one read (a release and the next request): each
     * is answered now or through the hub; the flusher writes them together. */
    while (c->state == CONN_OPEN) {
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
            server_conn_fatal(c, rc, err);
            return;
        }
        if (rc == 0)
            return;
        c->last_frame_ns = uv_hrtime();
        server_ops_handle(c, payload, len);
    }
}

/* The connected process's credentials, from the kernel when the connection was made
 * (SO_PEERCRED: a process cannot lie about them), and its name then. The name comes
 * from /proc and is only informative (a process chooses it); our own uid and gid stand
 * in when the kernel cannot say, which it always can on a Unix socket. */
static void server_conn_peer_cred(conn *c)
{
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t len = sizeof cred;
    c->uid = (uint32_t)getuid();
    c->gid = (uint32_t)getgid();
    c->pid = 0;
    c->comm[0] = '\0';
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return;
    c->uid = (uint32_t)cred.uid;
    c->gid = (uint32_t)cred.gid;
    c->pid = (int32_t)cred.pid;
    /* The supplementary groups, for access rules by group (Linux 4.13+; without them a
     * rule matches the primary group only). A peer in more groups than the array holds
     * is asked again with room for all, and the first ones are kept. */
    gid_t few[ACCESS_MAX_PEER_GROUPS], *groups = few;
    socklen_t glen = sizeof few;
    int grc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen);
    if (grc < 0 && errno == ERANGE && (groups = malloc(glen)) != NULL)
        grc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen);
    if (grc == 0 && groups) {
        size_t n = glen / sizeof groups[0];
        c->n_groups = (uint32_t)(n > ACCESS_MAX_PEER_GROUPS ? ACCESS_MAX_PEER_GROUPS : n);
        for (uint32_t i = 0; i < c->n_groups; i++)
            c->groups[i] = (uint32_t)groups[i];
    }
    if (groups != few)
        free(groups);
    if (cred.pid <= 0)
        return;
    char path[40];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)cred.pid);
    int cfd = open(path, O_RDONLY | O_CLOEXEC);
    if (cfd < 0)
        return; /* gone already, or /proc is not mounted: the name stays unknown */
    ssize_t n = read(cfd, c->comm, sizeof c->comm - 1);
    close(cfd);
    if (n < 0)
        n = 0;
    c->comm[n] = '\0';
    c->comm[strcspn(c->comm, "\n")] = '\0';
    for (char *p = c->comm; *p; p++) /* a name is printed in tables: keep it to one plain line */
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
            *p = '?';
}

struct access_peer server_conn_peer(const conn *c)
{
    return (struct access_peer){.uid = c->uid, .gid = c->gid, .groups = c->groups, .n_groups = c->n_groups};
}

void server_conn_describe_peer(const conn *c, cJSON *o)
{
    cJSON_AddNumberToObject(o, "uid", c->uid);
    cJSON_AddNumberToObject(o, "gid", c->gid);
    cJSON_AddNumberToObject(o, "pid", c->pid);
    cJSON_AddStringToObject(o, "process", c->comm);
}

void server_conn_accept(uv_stream_t *listener, int status)
{
    server *srv = listener->data;
    if (status < 0) {
        ld_log(LD_LOG_WARN, "accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        /* Not accepted, libuv stops watching the listener until uv_accept is called:
         * no client is accepted after this one (see the log). */
        ld_log(LD_LOG_ERROR, "cannot accept a client: out of memory; no more clients are accepted");
        return;
    }
    c->srv = srv;
    c->id = ++srv->next_conn_id;
    c->abort.done = server_conn_abort_run;
    snprintf(c->name, sizeof c->name, "client-%" PRIu64, c->id);
    uv_pipe_init(srv->loop, &c->pipe, 1); /* IPC: a reply may carry a descriptor */
    c->pipe.data = c;
    int rc = uv_accept(listener, (uv_stream_t *)&c->pipe);
    if (rc < 0 || (rc = proto_reader_new(srv->cfg->max_frame, &c->reader)) < 0) {
        ld_log(LD_LOG_WARN, "cannot accept a client: %s", ld_strerror(rc));
        c->state = CONN_CLOSED;
        srv->pending_closes++;
        uv_close((uv_handle_t *)&c->pipe, server_conn_closed);
        return;
    }
    c->connected_ns = c->last_frame_ns = uv_hrtime();
    server_conn_peer_cred(c);
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
        server_conn_fatal(c, LD_ELIMIT, err);
        return;
    }
    struct access_peer peer = server_conn_peer(c);
    if (!access_allows(&srv->cfg->access.connect, &peer, (uint32_t)getuid())) {
        char who[160], allowed[224], err[LD_ERRMSG_MAX + 512];
        access_describe_peer(&peer, who, sizeof who);
        access_describe_rule(&srv->cfg->access.connect, allowed, sizeof allowed);
        snprintf(err, sizeof err, "permission denied: %s (pid %d) may not connect to this daemon (access.connect "
                 "allows %s)", who, c->pid, allowed);
        ld_log(LD_LOG_WARN, "client %" PRIu64 ": %s", c->id, err);
        server_conn_fatal(c, LD_EDENIED, err);
        return;
    }
    ld_log(LD_LOG_DEBUG, "client %" PRIu64 " connected: uid %u, gid %u, pid %d (%s)", c->id, c->uid, c->gid, c->pid,
           c->comm);
    uv_read_start((uv_stream_t *)&c->pipe, server_conn_alloc, server_conn_read);
}
