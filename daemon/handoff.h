/* handoff — batches handed to a client through shared memory instead of one `next` and
 * one `release` message each (an open with "handoff": 1).
 *
 * Per stream and connection, a small shared-memory object beside the ring holds a ready
 * queue (the daemon publishes each batch it leases to the connection, in stream order)
 * and a release queue (the client publishes each slot it gives back); the layout and
 * the sleeping protocol are struct ld_handoff_header's (proto/ld_wire.h). The hand-off
 * keeps one `next` asked of the stream at all times, so a batch is published as soon
 * as it is READY, and takes the releases whenever the loop comes by: at each published
 * batch, at a `release` or `handoff` request of its connection, and when the client
 * wakes an idle daemon (every slot leased, nothing filling) with a `handoff` request.
 *
 * Once started, the hand-off is its stream's direct path (stream.h): the worker that
 * fills the batch next in line publishes it and takes the releases itself, under the
 * stream's lock, and the loop only comes by for what is not the steady state (see
 * handoff.c). Batches published that way are counted to the connection in bulk, when
 * the loop comes by (at least every HANDOFF_SETTLE_BATCHES batches).
 *
 * Nothing the client writes is trusted: a release entry must name a slot the stream has
 * leased at that generation, or the connection is ended with the reason; the leases
 * stay the connection's, so closing it gives back every slot whatever the queues say.
 * The functions below run on the loop thread. */
#ifndef LD_HANDOFF_H
#define LD_HANDOFF_H

#include <stdint.h>
#include <cJSON.h>

#include "stream.h"

typedef struct handoff handoff;

/* Batches published since the last call, with their rows and bytes (for the
 * connection's counters), on the loop thread. */
typedef void (*handoff_batch_cb)(void *ctx, uint64_t batches, uint64_t rows, uint64_t bytes);
/* Called once when the client broke the protocol (a bad release entry): the caller ends
 * the connection with code and message. Never inside handoff_open or handoff_close; may
 * run inside a stream's answer, so it must not close the stream (end the connection
 * through the loop). */
typedef void (*handoff_fail_cb)(void *ctx, int code, const char *message);

/* Creates the shared object for stream s (stream `id`, slot_count slots): memory with no
 * name (a memfd, sealed to its size), reachable only through the descriptor that
 * handoff_take_fd hands out for the open reply. errbuf says why not. */
int handoff_open(stream *s, uint64_t id, uint32_t slot_count, handoff_batch_cb on_batch, handoff_fail_cb on_fail,
                 void *ctx, handoff **ret_handoff, char *errbuf);
/* Stops publishing (the direct path too: it waits for a worker still waking the client),
 * forgets its waiting next, unmaps and closes the descriptor if not taken. Call before the
 * stream is closed. A started hand-off that has not ended
 * publishes an end entry first, so that a client asleep on the queue wakes now and finds
 * why on the socket (the connection's last error, or its close). Accepts NULL.
 *
 * A stream the daemon ends for a reason of its own (stream_end in stream.h) needs nothing
 * from here: the hand-off's waiting next is answered with the reason, which publishes the
 * end entry, and the `next` the client then sends on the socket gets code and message. */
void handoff_close(handoff *h);

/* Publishes the end entry now, before the stream is closed under the client (a reload
 * no longer lets its peer read it): a client asleep on the queue wakes, and its `next`
 * on the socket gets the reason. Nothing is published after it. Accepts NULL. */
void handoff_end(handoff *h);
/* The times of the rule that coalesces a briefly sleeping client's wake-ups (handoff.c):
 * batches published less than gap_ns apart are "coming fast", and a held wake-up goes
 * with the first batch published once it is hold_ns old. gap_ns 0: every batch wakes a
 * sleeping client at once. Defaults 200 µs, 1 ms. */
void handoff_set_coalescing(handoff *h, uint64_t gap_ns, uint64_t hold_ns);
/* Tells the connection now (on_batch) of the batches published on the direct path
 * since the last time, before its counters are read. Accepts NULL. */
void handoff_settle_now(handoff *h);
/* Adds "handoff": {"fd", "size", "capacity", "version"} to an open reply. */
void handoff_describe(const handoff *h, cJSON *obj);
/* The object's descriptor, for the open reply (SCM_RIGHTS): the caller owns it from now
 * on. -1 once taken. */
int handoff_take_fd(handoff *h);
/* The client has mapped the object: publishing starts (the first call) or the release
 * queue is taken (every later one, the client's wake-up). */
void handoff_kick(handoff *h);
/* Takes the release queue now, if the hand-off has started (a release or a next came on
 * the socket). */
void handoff_poll(handoff *h);

/* The reason a release (slot, generation) of stream `id` was refused with rc, as the
 * `release` request and the release queue report it. */
void handoff_release_error(const ring *r, uint64_t id, int64_t slot, int64_t generation, int rc, char *errbuf);

#endif
