/* server_reload_access — what a reload's `access:` rules do to what is already open.
 *
 * A reload applies its access rules to new requests at once (server_ops.c checks each
 * against srv->cfg); this file applies them to what the old rules let in, once the new
 * config is installed (server_reload.c calls server_reload_recheck_access):
 *   - a connection whose peer access.connect no longer lets in is ended with a last
 *     permission_denied frame naming the rule (server_conn_fatal); its streams end with
 *     it;
 *   - a stream on a dataset its peer may no longer read (access.datasets.<name>; for a
 *     declared dataset, access.declare) is ended: its ring is freed, its waiting nexts
 *     are answered permission_denied with the reason, and the connection remembers the
 *     reason (struct conn_revoked) so that every later `next` naming the stream gets it
 *     too, while its `release` and `close` succeed (nothing is left to give back). A
 *     stream served through the shared-memory hand-off gets the hand-off's end entry
 *     first (handoff_end), which wakes a sleeping client and sends it to the socket for
 *     the reason, so it learns at once rather than after its timeout.
 * The connection and its other streams serve on. Loop thread. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* Whether peer may still read from d under cfg's access rules (when not, why says so):
 * a configured dataset's rule is access.datasets.<name>; a refined template's is its
 * template's, and it must still pass an access.declare entry, as a whole spec must.
 * (Whether a declared spec's directory still lies beneath a root the peer is granted is
 * not looked at again: the dataset holds the directory as the kernel names it, which
 * need not begin with the root as the config spells it.) */
static bool server_reload_still_allowed(const struct config *cfg, const dataset *d, const struct access_peer *peer,
                                        char *why)
{
    char name[LD_NAME_MAX], who[160], allowed[224];
    uint32_t self = (uint32_t)getuid();
    snprintf(name, sizeof name, "%s", d->name);
    char *plus = d->owned_config ? strstr(name, "+spec") : NULL;
    if (plus)
        *plus = '\0';
    access_describe_peer(peer, who, sizeof who);
    if (!d->owned_config || plus) {
        const struct access_rule *r = access_dataset_rule(&cfg->access, name);
        if (r && !access_allows(r, peer, self)) {
            access_describe_rule(r, allowed, sizeof allowed);
            ld_errorf(why, "permission denied: %s may no longer read dataset '%s': a reload narrowed "
                      "access.datasets.%s (it allows %s); the stream was closed", who, name, name, allowed);
            return false;
        }
    }
    size_t pos = 0;
    if (d->owned_config && !access_declare_next(&cfg->access, peer, self, &pos)) {
        ld_errorf(why, "permission denied: %s may no longer declare datasets: a reload narrowed "
                  "access.declare; the stream on '%s' was closed", who, d->name);
        return false;
    }
    return true;
}

/* Ends a stream the peer may no longer read: its waiting nexts, and every later next
 * that names it, are answered permission_denied with why (server_ops.c lets its
 * releases and its close succeed). */
static void server_reload_revoke_stream(conn *c, struct conn_stream *cs, const char *why)
{
    struct conn_revoked *rv = calloc(1, sizeof *rv);
    if (rv) { /* without it, later requests get "not open on this connection" */
        rv->id = cs->id;
        snprintf(rv->message, sizeof rv->message, "%s", why);
        rv->next = c->revoked;
        c->revoked = rv;
    }
    for (struct reply *r = c->out_head; r; r = r->next)
        if (r->cs == cs && !r->frame) {
            r->cs = NULL;
            server_reply_fill(c, r, proto_reply_error(r->id, LD_EDENIED, why));
        }
    ld_log(LD_LOG_WARN, "client %" PRIu64 " (%s, pid %d), stream %" PRIu64 ": %s", c->id, c->name, c->pid, cs->id,
           why);
    handoff_end(cs->ho); /* a client asleep on the hand-off wakes and asks the socket why */
    server_ops_close_stream(c, cs);
}

void server_reload_recheck_access(server *srv, int *ret_conns, int *ret_streams)
{
    int conns = 0, streams = 0;
    for (conn *c = srv->conns; c; c = c->next) {
        if (c->state != CONN_OPEN)
            continue;
        struct access_peer peer = server_conn_peer(c);
        char why[LD_ERRMSG_MAX];
        if (!access_allows(&srv->cfg->access.connect, &peer, (uint32_t)getuid())) {
            char who[160], allowed[224];
            access_describe_peer(&peer, who, sizeof who);
            access_describe_rule(&srv->cfg->access.connect, allowed, sizeof allowed);
            ld_errorf(why, "permission denied: %s (pid %d) may no longer connect to this daemon: a "
                      "reload narrowed access.connect (it allows %s)", who, c->pid, allowed);
            /* Its streams end with it. A client asleep on a hand-off looks at the socket
             * between its slices of sleep, and finds the frame there. */
            server_conn_fatal(c, LD_EDENIED, why);
            conns++;
            continue;
        }
        struct conn_stream *cs = c->streams;
        while (cs) {
            struct conn_stream *next = cs->next;
            if (!server_reload_still_allowed(srv->cfg, stream_dataset(cs->s), &peer, why)) {
                server_reload_revoke_stream(c, cs, why);
                streams++;
            }
            cs = next;
        }
    }
    *ret_conns = conns;
    *ret_streams = streams;
}

const char *server_revoked_message(const conn *c, uint64_t stream_id)
{
    for (const struct conn_revoked *rv = c->revoked; rv; rv = rv->next)
        if (rv->id == stream_id)
            return rv->message;
    return NULL;
}

bool server_revoked_forget(conn *c, uint64_t stream_id)
{
    for (struct conn_revoked **pp = &c->revoked; *pp; pp = &(*pp)->next)
        if ((*pp)->id == stream_id) {
            struct conn_revoked *rv = *pp;
            *pp = rv->next;
            free(rv);
            return true;
        }
    return false;
}

void server_revoked_free(conn *c)
{
    while (c->revoked) {
        struct conn_revoked *rv = c->revoked;
        c->revoked = rv->next;
        free(rv);
    }
}
