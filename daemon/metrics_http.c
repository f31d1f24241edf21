/* metrics_http — serves the metrics text to a scraper over HTTP/1.0, on the loop thread.
 *
 * A scrape is one short connection: the request line and headers arrive (we read at most
 * METRICS_HTTP_MAX_REQUEST bytes and look only at the request line), one reply leaves
 * with Content-Length and `Connection: close`, and we close. That is all Prometheus
 * needs, so there is no keep-alive, no chunking and no request body. A connection that
 * does not complete its request in METRICS_HTTP_TIMEOUT_MS, or sends too much, is
 * answered with an error status (or just closed) so that it cannot hold a slot; past
 * METRICS_HTTP_MAX_CONNS connections at once, new ones are closed at once.
 *
 * The listener is a loopback TCP socket or a Unix socket: metrics name datasets and
 * clients, so they are not offered to the network (metrics_http_parse_listen refuses
 * other addresses when the config is loaded). */
#include "metrics_http.h"
#include "proto_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ld_error.h"
#include "log.h"
#include "metrics.h"
#include "proto.h"

struct metrics_http_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_timer_t timer;
    uv_write_t write;
    metrics_http *m;
    struct metrics_http_conn *prev, *next;
    int open_handles;               /* h and timer: freed when both are closed */
    bool closing, answered;
    size_t len;
    char *reply;
    char req[METRICS_HTTP_MAX_REQUEST];
};

struct metrics_http {
    uv_loop_t *loop;
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } listener;
    struct metrics_listen where;
    bool owns_socket_file;
    metrics_http_render render;
    void *ctx;
    struct metrics_http_conn *conns;
    unsigned n_conns;
    int open_handles;               /* the listener and every connection's handles */
    bool closing;
    void (*done)(void *ctx);
    void *done_ctx;
};

/* ---- the listen value ----------------------------------------------------------- */

int metrics_http_parse_listen(const char *spec, struct metrics_listen *ret_listen, char *errbuf)
{
    static const char accepted[] = "expected unix:/ABSOLUTE/PATH, 127.0.0.1:PORT, localhost:PORT or [::1]:PORT";
    struct metrics_listen l;
    memset(&l, 0, sizeof l);
    if (strncmp(spec, "unix:", 5) == 0) {
        const char *path = spec + 5;
        if (path[0] != '/') {
            ld_errorf(errbuf, "'%s': a Unix socket needs an absolute path (%s)", spec, accepted);
            return LD_EINVAL;
        }
        if (strlen(path) >= sizeof l.path) {
            ld_errorf(errbuf, "'%s': the path is %zu bytes long; a Unix socket path holds at most %zu", spec,
                      strlen(path), sizeof l.path - 1);
            return LD_EINVAL;
        }
        l.is_unix = true;
        memcpy(l.path, path, strlen(path) + 1);
        *ret_listen = l;
        return 0;
    }
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec) {
        ld_errorf(errbuf, "'%s': %s", spec, accepted);
        return LD_EINVAL;
    }
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port < 1 || port > 65535) {
        ld_errorf(errbuf, "'%s': the port must be an integer in [1, 65535] (%s)", spec, accepted);
        return LD_EINVAL;
    }
    char host[64];
    size_t hl = (size_t)(colon - spec);
    if (hl >= sizeof host) {
        ld_errorf(errbuf, "'%s': %s", spec, accepted);
        return LD_EINVAL;
    }
    memcpy(host, spec, hl);
    host[hl] = '\0';
    struct sockaddr_in *in4 = (struct sockaddr_in *)&l.addr;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&l.addr;
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        if ((ntohl(in4->sin_addr.s_addr) >> 24) != 127) {
            ld_errorf(errbuf, "'%s': %s is not a loopback address; metrics are served on the loopback or a "
                      "Unix socket only (%s)", spec, host, accepted);
            return LD_EINVAL;
        }
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
    } else if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        if (inet_pton(AF_INET6, host + 1, &in6->sin6_addr) != 1) {
            ld_errorf(errbuf, "'%s': '%s' is not an IPv6 address (%s)", spec, host + 1, accepted);
            return LD_EINVAL;
        }
        if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
            ld_errorf(errbuf, "'%s': %s is not a loopback address; metrics are served on the loopback or a "
                      "Unix socket only (%s)", spec, host + 1, accepted);
            return LD_EINVAL;
        }
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
    } else {
        ld_errorf(errbuf, "'%s': '%s' is not a loopback address (%s)", spec, host, accepted);
        return LD_EINVAL;
    }
    *ret_listen = l;
    return 0;
}

/* ---- connections ------------------------------------------------------------------ */

static void metrics_http_maybe_done(metrics_http *m)
{
    if (!m->closing || m->open_handles > 0)
        return;
    void (*done)(void *) = m->done;
    void *ctx = m->done_ctx;
    free(m);
    if (done)
        done(ctx);
}

static void metrics_http_conn_closed(uv_handle_t *h)
{
    struct metrics_http_conn *c = h->data;
    metrics_http *m = c->m;
    if (--c->open_handles > 0)
        return;
    free(c->reply);
    free(c);
    m->open_handles--;
    metrics_http_maybe_done(m);
}

static void metrics_http_conn_close(struct metrics_http_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    metrics_http *m = c->m;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    m->n_conns--;
    uv_close(&c->h.handle, metrics_http_conn_closed);
    uv_close((uv_handle_t *)&c->timer, metrics_http_conn_closed);
}

static void metrics_http_timeout(uv_timer_t *t);

static void metrics_http_written(uv_write_t *req, int status)
{
    metrics_http_conn_close(req->data);
}

/* Sends status line, headers and body (body may be NULL), then closes. */
static void metrics_http_reply(struct metrics_http_conn *c, const char *status, const char *type, char *body,
                               size_t body_len, bool head)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
                     type, body_len);
    size_t send_body = head ? 0 : body_len;
    c->answered = true;
    uv_read_stop(&c->h.stream);
    /* A client that does not read its reply is dropped after the same timeout. */
    uv_timer_start(&c->timer, metrics_http_timeout, METRICS_HTTP_TIMEOUT_MS, 0);
    c->reply = malloc((size_t)n + send_body);
    if (!c->reply) {
        free(body);
        metrics_http_conn_close(c);
        return;
    }
    memcpy(c->reply, hdr, (size_t)n);
    if (send_body)
        memcpy(c->reply + n, body, send_body);
    free(body);
    uv_buf_t buf = uv_buf_init(c->reply, (unsigned)((size_t)n + send_body));
    c->write.data = c;
    if (uv_write(&c->write, &c->h.stream, &buf, 1, metrics_http_written) < 0)
        metrics_http_conn_close(c);
}

static void metrics_http_error(struct metrics_http_conn *c, const char *status, const char *message)
{
    char *body = NULL;
    size_t len = strlen(message);
    if ((body = malloc(len + 1)) != NULL)
        memcpy(body, message, len + 1);
    metrics_http_reply(c, status, "text/plain; charset=utf-8", body, body ? len : 0, false);
}

/* The request is whole: look at its first line. */
static void metrics_http_handle(struct metrics_http_conn *c)
{
    char *eol = memchr(c->req, '\n', c->len);
    size_t line_len = (size_t)(eol - c->req);
    if (line_len && c->req[line_len - 1] == '\r')
        line_len--;
    char line[512];
    if (line_len >= sizeof line) {
        metrics_http_error(c, "414 URI Too Long", "request line too long\n");
        return;
    }
    memcpy(line, c->req, line_len);
    line[line_len] = '\0';
    char *method = line, *target = strchr(line, ' ');
    char *version = target ? strchr(target + 1, ' ') : NULL;
    if (!target || !version || strncmp(version + 1, "HTTP/1.", 7) != 0) {
        metrics_http_error(c, "400 Bad Request", "expected: GET /metrics HTTP/1.0\n");
        return;
    }
    *target++ = '\0';
    *version = '\0';
    bool head = strcmp(method, "HEAD") == 0;
    if (strcmp(method, "GET") != 0 && !head) {
        metrics_http_error(c, "405 Method Not Allowed", "only GET and HEAD are served\n");
        return;
    }
    size_t tl = strcspn(target, "?");
    if (tl != 8 || strncmp(target, "/metrics", 8) != 0) {
        metrics_http_error(c, "404 Not Found", "loaderd serves /metrics only\n");
        return;
    }
    char *text = NULL;
    size_t len = 0;
    if (c->m->render(c->m->ctx, &text, &len) < 0) {
        metrics_http_error(c, "500 Internal Server Error", "cannot format the metrics\n");
        return;
    }
    metrics_http_reply(c, "200 OK", METRICS_CONTENT_TYPE, text, len, head);
}

static void metrics_http_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct metrics_http_conn *c = h->data;
    /* Never past the request buffer: a request that fills it is answered 431. */
    size_t room = sizeof c->req - c->len;
    *buf = uv_buf_init(c->req + c->len, (unsigned)room);
}

static void metrics_http_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct metrics_http_conn *c = st->data;
    if (c->closing || c->answered)
        return;
    if (nread < 0) {
        metrics_http_conn_close(c); /* EOF before a whole request, or an error */
        return;
    }
    size_t before = c->len;
    c->len += (size_t)nread;
    /* The end of the headers: an empty line (CRLF CRLF, or LF LF from a lenient client). */
    size_t from = before >= 3 ? before - 3 : 0;
    for (size_t i = from; i < c->len; i++) {
        if (c->req[i] != '\n')
            continue;
        if ((i >= 1 && c->req[i - 1] == '\n') || (i >= 3 && memcmp(c->req + i - 3, "\r\n\r\n", 4) == 0)) {
            metrics_http_handle(c);
            return;
        }
    }
    if (c->len == sizeof c->req)
        metrics_http_error(c, "431 Request Header Fields Too Large", "request larger than 4096 bytes\n");
}

static void metrics_http_timeout(uv_timer_t *t)
{
    struct metrics_http_conn *c = t->data;
    if (c->answered)
        metrics_http_conn_close(c);
    else if (c->len)
        metrics_http_error(c, "408 Request Timeout", "the request did not complete in time\n");
    else
        metrics_http_conn_close(c);
}

static void metrics_http_accept(uv_stream_t *listener, int status)
{
    metrics_http *m = listener->data;
    if (status < 0 || m->closing)
        return;
    struct metrics_http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->m = m;
    if (m->where.is_unix)
        uv_pipe_init(m->loop, &c->h.pipe, 0);
    else
        uv_tcp_init(m->loop, &c->h.tcp);
    uv_timer_init(m->loop, &c->timer);
    c->h.handle.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    m->open_handles++;
    c->next = m->conns;
    if (m->conns)
        m->conns->prev = c;
    m->conns = c;
    m->n_conns++;
    if (uv_accept(listener, &c->h.stream) < 0 || m->n_conns > METRICS_HTTP_MAX_CONNS) {
        metrics_http_conn_close(c); /* too many at once: the scraper retries on its next interval */
        return;
    }
    uv_timer_start(&c->timer, metrics_http_timeout, METRICS_HTTP_TIMEOUT_MS, 0);
    if (uv_read_start(&c->h.stream, metrics_http_alloc, metrics_http_read) < 0)
        metrics_http_conn_close(c);
}

/* ---- the listener ------------------------------------------------------------------ */

static void metrics_http_listener_closed(uv_handle_t *h)
{
    metrics_http *m = h->data;
    m->open_handles--;
    metrics_http_maybe_done(m);
}

int metrics_http_new(uv_loop_t *loop, const char *spec, metrics_http_render render, void *ctx,
                     metrics_http **ret_http, char *errbuf)
{
    metrics_http *m = calloc(1, sizeof *m);
    if (!m) {
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    int rc = metrics_http_parse_listen(spec, &m->where, errbuf);
    if (rc < 0) {
        free(m);
        return rc;
    }
    m->loop = loop;
    m->render = render;
    m->ctx = ctx;
    if (m->where.is_unix && (rc = proto_socket_clear_stale(m->where.path, "metrics listener", errbuf)) < 0) {
        free(m);
        return rc;
    }
    if (m->where.is_unix)
        uv_pipe_init(loop, &m->listener.pipe, 0);
    else
        uv_tcp_init(loop, &m->listener.tcp);
    m->listener.handle.data = m;
    m->open_handles = 1;
    if (m->where.is_unix) {
        rc = uv_pipe_bind(&m->listener.pipe, m->where.path);
        if (rc == 0) {
            m->owns_socket_file = true;
            if (chmod(m->where.path, 0660) < 0)
                rc = ld_from_errno(errno);
        }
    } else {
        rc = uv_tcp_bind(&m->listener.tcp, (const struct sockaddr *)&m->where.addr, 0);
    }
    if (rc == 0)
        rc = uv_listen(&m->listener.stream, 16, metrics_http_accept);
    if (rc < 0) {
        ld_errorf(errbuf, "metrics listener: cannot listen on '%s': %s", spec, uv_strerror(rc));
        metrics_http_close(m, NULL, NULL);
        return rc;
    }
    ld_log(LD_LOG_INFO, "serving metrics on %s", spec);
    *ret_http = m;
    return 0;
}

void metrics_http_close(metrics_http *m, void (*done)(void *ctx), void *ctx)
{
    m->closing = true;
    m->done = done;
    m->done_ctx = ctx;
    while (m->conns)
        metrics_http_conn_close(m->conns);
    if (m->owns_socket_file) {
        unlink(m->where.path);
        m->owns_socket_file = false;
    }
    uv_close(&m->listener.handle, metrics_http_listener_closed);
}
