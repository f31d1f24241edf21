/* metrics_http — the optional scrape endpoint: HTTP/1.0 `GET /metrics` on a Unix socket
 * or a loopback TCP port (server.metrics.listen), served by the daemon's libuv loop.
 *
 * Deliberately minimal: one request per connection, at most METRICS_HTTP_MAX_REQUEST
 * bytes of request line and headers, METRICS_HTTP_MAX_CONNS connections at once, each
 * closed after its reply or after METRICS_HTTP_TIMEOUT_MS without a whole request. Only
 * loopback addresses are accepted (the text names datasets and clients); a Prometheus
 * elsewhere scrapes through a proxy of the operator's choice. All calls on the loop
 * thread. */
#ifndef LD_METRICS_HTTP_H
#define LD_METRICS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <uv.h>

#define METRICS_HTTP_MAX_REQUEST 4096
#define METRICS_HTTP_MAX_CONNS 16
#define METRICS_HTTP_TIMEOUT_MS 3000

/* A parsed `listen` value. */
struct metrics_listen {
    bool is_unix;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* is_unix */
    struct sockaddr_storage addr;                          /* !is_unix: 127.0.0.0/8 or ::1, with the port */
};

/* Parses `unix:/ABSOLUTE/PATH`, `127.0.0.1:PORT` (any 127.x.y.z), `localhost:PORT` or
 * `[::1]:PORT`. LD_EINVAL with a sentence in errbuf (LD_ERRMSG_MAX bytes) saying what is
 * accepted; a non-loopback address is refused by name. */
int metrics_http_parse_listen(const char *spec, struct metrics_listen *ret_listen, char *errbuf);

typedef struct metrics_http metrics_http;

/* Produces the text of one reply, on the loop thread: a malloc'ed body the listener
 * frees, or a negative code (the client gets 500). */
typedef int (*metrics_http_render)(void *ctx, char **ret_text, size_t *ret_len);

/* Binds and listens on `spec` (a Unix socket file that no live process answers on is
 * replaced; it is made mode 0660). errbuf says why not; nothing is left open then (the
 * caller runs the loop once to let closed handles go). */
int metrics_http_new(uv_loop_t *loop, const char *spec, metrics_http_render render, void *ctx,
                     metrics_http **ret_http, char *errbuf);
/* Stops listening, drops every connection, removes the socket file; `done` runs on the
 * loop once every handle is closed, and m is freed then. */
void metrics_http_close(metrics_http *m, void (*done)(void *ctx), void *ctx);

#endif
