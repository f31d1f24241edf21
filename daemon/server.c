/* server — loaderd's control channel: the listening socket and the server's life.
 *
 * One libuv loop thread owns every connection and stream. This file binds the Unix
 * socket (or adopts the one systemd passed), accepts clients (server_conn.c serves
 * each), runs the one-second tick (clients that never say hello or sit idle, the rate
 * behind samples_per_s, the systemd watchdog), and takes everything down in order on
 * stop: the listener, the connections and their streams, the cache keepers, then the
 * server's own handles once the last stream's running work has come back.
 *
 * A connection is the lease holder: the streams it opened and the slots it holds are
 * closed and released when it goes away, whatever the reason. */
#include "server_internal.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "proto_socket.h"
#include "ring.h"

static void server_maybe_done(server *srv);

void server_closed_one(server *srv)
{
    srv->pending_closes--;
    if (srv->pending_closes == 0 && srv->stopping && !srv->set && srv->done) {
        void (*done)(void *) = srv->done;
        srv->done = NULL;
        done(srv->done_ctx);
    }
}

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

static int server_bind(server *srv, const char *path, char *errbuf)
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

/* A connection that never says hello (or sends part of a frame, then nothing), or that
 * holds no stream and sends nothing for a long time, only takes a client slot: close it. */
static void server_expire_idle(server *srv, uint64_t now)
{
    const struct config *cfg = srv->cfg;
    char err[LD_ERRMSG_MAX];
    for (conn *c = srv->conns; c; c = c->next) {
        if (c->state != CONN_OPEN)
            continue;
        if (!c->hello && now - c->connected_ns >= (uint64_t)cfg->hello_timeout_s * 1000000000u) {
            snprintf(err, sizeof err, "no hello within %u s of connecting (server.hello_timeout); closing the "
                     "connection", cfg->hello_timeout_s);
            server_conn_fatal(c, LD_ETIMEDOUT, err);
        } else if (c->hello && cfg->idle_timeout_s && !c->streams && !c->out_head &&
                   now - c->last_frame_ns >= (uint64_t)cfg->idle_timeout_s * 1000000000u) {
            snprintf(err, sizeof err, "idle for %u s without a stream (server.idle_timeout); closing the "
                     "connection", cfg->idle_timeout_s);
            server_conn_fatal(c, LD_ETIMEDOUT, err);
        }
    }
}

static void server_tick(uv_timer_t *t)
{
    server *srv = t->data;
    uint64_t now = uv_hrtime();
    if (!srv->stopping) {
        server_expire_idle(srv, now);
        server_reap_old_keepers(srv);
        server_declare_reap(srv);
    }
    srv->rate_pos = (srv->rate_pos + 1) % SERVER_RATE_WINDOW;
    server_ops_settle(srv);
    srv->rate_samples[srv->rate_pos] = srv->samples_served;
    srv->rate_ns[srv->rate_pos] = now;
    if (srv->watchdog_ns && now - srv->last_watchdog_ns >= srv->watchdog_ns / 2) {
        notify_send("WATCHDOG=1");
        srv->last_watchdog_ns = now;
    }
    if (srv->stopping)
        server_maybe_done(srv);
}

int server_new(uv_loop_t *loop, hub *h, struct config *cfg, dataset *const *datasets, char *const *why,
               pool *workers, server **ret_server, char *errbuf)
{
    server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        return LD_ENOMEM;
    }
    srv->loop = loop;
    srv->cfg = cfg;
    srv->workers = workers;
    srv->started_ns = uv_hrtime();
    srv->hub = h;
    int rc = stream_set_new(h, workers, &srv->set);
    if (rc < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "cannot set up the streams: %s", ld_strerror(rc));
        free(srv);
        return rc;
    }
    uv_pipe_init(loop, &srv->listener, 0);
    srv->listener.data = srv;
    srv->listening = true;
    uv_timer_init(loop, &srv->tick);
    srv->tick.data = srv;
    uv_prepare_init(loop, &srv->flusher);
    srv->flusher.data = srv;
    /* The metrics listener first: once the control socket answers, it is there too. */
    rc = cfg->metrics_listen
             ? metrics_http_new(loop, cfg->metrics_listen, server_metrics_render, srv, &srv->metrics, errbuf)
             : 0;
    if (rc == 0)
        rc = server_bind(srv, cfg->socket_path, errbuf);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&srv->listener, 128, server_conn_accept);
        if (rc < 0)
            snprintf(errbuf, LD_ERRMSG_MAX, "cannot listen on '%s': %s", srv->socket_path, uv_strerror(rc));
    }
    if (rc == 0)
        rc = server_install_datasets(srv, datasets, why, errbuf); /* nothing to undo when it fails */
    if (rc < 0) {
        if (srv->metrics)
            metrics_http_close(srv->metrics, NULL, NULL);
        srv->metrics = NULL;
        if (srv->owns_socket_file)
            unlink(srv->socket_path);
        srv->owns_socket_file = false;
        uv_close((uv_handle_t *)&srv->listener, NULL);
        uv_close((uv_handle_t *)&srv->tick, NULL);
        uv_close((uv_handle_t *)&srv->flusher, NULL);
        stream_set_free(srv->set);
        uv_run(loop, UV_RUN_NOWAIT); /* let the handles close before srv goes */
        free(srv);
        return rc;
    }
    srv->watchdog_ns = notify_watchdog_usec() * 1000;
    uv_timer_start(&srv->tick, server_tick, 1000, 1000);
    server_tick(&srv->tick);
    *ret_server = srv;
    return 0;
}

static void server_handle_closed(uv_handle_t *h)
{
    server_closed_one(h->data);
}

/* Called while stopping: once every stream's running work is back, close the rest. */
static void server_maybe_done(server *srv)
{
    if (stream_set_live(srv->set) > 0 || !uv_is_active((uv_handle_t *)&srv->tick))
        return;
    uv_timer_stop(&srv->tick);
    stream_set_free(srv->set);
    srv->set = NULL;
    srv->pending_closes += 2;
    uv_close((uv_handle_t *)&srv->flusher, server_handle_closed);
    uv_close((uv_handle_t *)&srv->tick, server_handle_closed);
}

void server_part_closed(void *ctx)
{
    server_closed_one(ctx);
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
        uv_close((uv_handle_t *)&srv->listener, server_handle_closed);
    }
    if (srv->owns_socket_file) {
        unlink(srv->socket_path);
        srv->owns_socket_file = false;
    }
    if (srv->metrics) {
        srv->pending_closes++;
        metrics_http_close(srv->metrics, server_part_closed, srv);
        srv->metrics = NULL;
    }
    while (srv->conns)
        server_conn_close(srv->conns);
    for (size_t i = 0; i < srv->n_datasets; i++) {
        if (srv->keepers[i]) {
            srv->pending_closes++;
            cache_keeper_close(srv->keepers[i], server_part_closed, srv);
        }
    }
    server_close_old_keepers(srv);
    server_declare_close(srv);
    /* Streams with work still running are freed as it comes back; the tick checks. */
    uv_timer_stop(&srv->tick);
    uv_timer_start(&srv->tick, server_tick, 10, 10);
    server_maybe_done(srv);
}

void server_free(server *srv)
{
    if (!srv)
        return;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        cache_keeper_free(srv->keepers[i]);
        dataset_watch_free(srv->watches[i]);
    }
    /* The reloads' leftovers first: their keepers point at retired datasets. */
    server_reload_free(srv);
    server_declare_free(srv);
    for (size_t i = 0; i < srv->n_datasets; i++)
        dataset_free(srv->datasets[i]);
    free(srv->datasets);
    free(srv->defs);
    free(srv->keepers);
    free(srv->watches);
    free(srv->unavailable);
    config_free(srv->cfg);
    free(srv);
}

const char *server_socket_path(const server *srv)
{
    return srv->socket_path;
}
