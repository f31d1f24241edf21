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
 * daemon answers on the socket; replaces a stale socket file. errbuf says why. */
int server_new(uv_loop_t *loop, hub *h, const struct config *cfg, dataset **datasets, size_t n_datasets,
               pool *workers, server **ret_server, char *errbuf);
/* Stops accepting, closes every connection and stream; `done` runs on the loop thread
 * once every handle of the server is closed and every stream freed. */
void server_stop(server *s, void (*done)(void *ctx), void *ctx);
/* Frees what is left after the loop has finished. Accepts NULL. */
void server_free(server *s);
const char *server_socket_path(const server *s);

#endif
