/* server — the control channel: a libuv Unix-socket listener, one connection per client,
 * framing, request dispatch, and the daemon-wide counters that `status` shows.
 *
 * A connection is the lease holder: the streams it opened and the slots it holds are
 * closed and released when it goes away, whatever the reason. */
#ifndef LD_SERVER_H
#define LD_SERVER_H

#include <uv.h>

#include "config.h"
#include "dataset.h"
#include "hub.h"
#include "pool.h"

typedef struct server server;

/* Binds and listens (or adopts a socket passed by systemd). Work for the streams comes
 * back through h, which must outlive the server (close it after `done` has run). Refuses when another live
 * daemon answers on the socket; replaces a stale socket file. errbuf says why.
 * datasets[i] is cfg->datasets[i] opened, or NULL when it could not be (its path is
 * missing or unreadable): why[i] says why, and the dataset is served as unavailable
 * until a reload opens it. On success the server owns cfg and the datasets (the arrays
 * stay the caller's); server_free frees them. */
int server_new(uv_loop_t *loop, hub *h, struct config *cfg, dataset *const *datasets, char *const *why,
               pool *workers, server **ret_server, char *errbuf);
/* Reads the config file again and applies it (server_reload.c): SIGHUP. Logs what
 * changed, or the errors of a config that is refused (the running one stays). */
void server_reload_signal(server *s);
/* Stops accepting, closes every connection and stream; `done` runs on the loop thread
 * once every handle of the server is closed and every stream freed. */
void server_stop(server *s, void (*done)(void *ctx), void *ctx);
/* Frees what is left after the loop has finished. Accepts NULL. */
void server_free(server *s);
const char *server_socket_path(const server *s);

#endif
