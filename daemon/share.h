/* share — one stream, many consumers: trainers that ask for the same batches (a
 * hyper-parameter sweep on one dataset and seed, train and evaluation readers) read one
 * ring, and each batch is prepared once.
 *
 * A group is opened by name (`share` in the open request) with the first consumer's
 * settings; the stream it opens, the producer, fills the ring as any stream does. Every
 * consumer is a stream of its own for the server (its own id, requests, counters), made
 * by stream_consumer_new, that reads the producer's slots at its own place.
 *
 * Leases. The first consumer to take a batch turns its slot LEASED; from then on the
 * group keeps the slot while any consumer holds it, and while any attached consumer has
 * not reached it yet. The slot goes back FREE (its generation moves on when it is filled
 * again) when the last holder releases it and every attached consumer is past it. The
 * counting is in share_book (pure, unit-tested); this file ties it to the streams.
 *
 * Lag. A consumer that falls more than `max_lag` batches behind the group's front would
 * hold the ring for everyone: it is detached. Its next request is answered `detached`
 * with the exact position to reopen at (the client library reopens it, unshared, at
 * that batch, so its batches stay identical), and the slots it holds stay its own until
 * it releases them.
 *
 * Everything here runs on the loop thread. */
#ifndef LD_SHARE_H
#define LD_SHARE_H

#include <stdbool.h>
#include <stdint.h>
#include <cJSON.h>

typedef struct stream stream;
typedef struct stream_set stream_set;
typedef struct share_group share_group;
typedef struct share_member share_member;
struct stream_params;
struct dataset;

/* The name that shares by settings alone: every open with share "auto" and the same
 * dataset and settings joins one group. */
#define SHARE_AUTO "auto"
/* The group a stream opened on d with p and share `name` joins: *ret_group is that
 * group, or NULL when there is none yet (the caller opens it). LD_EINVAL with the
 * first setting that differs in errbuf when the group named `name` reads other batches
 * (dataset, batch_size, shuffle, seed, epoch, epochs, rank, world_size, drop_last). */
int share_find(stream_set *set, const char *name, const struct dataset *d, const struct stream_params *p,
               share_group **ret_group, char *errbuf);
/* A new group around `producer` (opened by the caller with extra_slots = max_lag; the
 * group owns it from now on and closes it with its last consumer). */
int share_group_new(stream_set *set, const char *name, stream *producer, uint32_t max_lag, share_group **ret_group);
/* A new consumer stream `id`, attached at the group's front (the first batch no
 * consumer has taken yet). LD_ENOMEM closes a group that has no consumer then. */
int share_attach(share_group *g, uint64_t id, stream **ret_consumer);
/* The epoch of the group's front: a late joiner that asks for the whole epoch opens a
 * stream of its own at batch 0 of it. */
uint64_t share_front_epoch(const share_group *g);
/* The ring bytes the group holds (charged once to the memory budget). */
uint64_t share_ring_bytes(const share_group *g);
uint32_t share_consumers(const share_group *g);
/* The producer's stream id: the one in the ring's header. */
uint64_t share_producer_id(const share_group *g);
const char *share_name(const share_group *g);

/* ---- for stream.c ---- */
/* The producer filled a slot (or a read stalled): consumers' waiting nexts are answered. */
void share_ready(share_group *g);
/* The consumer took slot `slot` (READY or LEASED, holding its next batch) and moved past
 * it; consumers now too far behind are detached. */
void share_take(share_member *m, uint32_t slot);
/* A consumer's release: 0, LD_EINVAL (slot out of range), LD_ENOTLEASED (not held by
 * this consumer), LD_ESTALE (not the slot's generation). */
int share_release(share_member *m, uint32_t slot, uint64_t generation);
/* The consumer waits for a batch not ready yet (or no longer). */
void share_waiting(share_member *m, bool waiting);
/* The consumer goes: what it holds is released; the last one closes the producer. */
void share_leave(share_member *m);
/* Where the consumer starts (or is now): its next batch's epoch and index. */
void share_position(const stream *consumer, uint64_t *ret_epoch, uint64_t *ret_batch);
/* Whether the consumer stream was detached and holds nothing any more: the server
 * closes it (its trainer reads on in a stream of its own). */
bool share_done(const stream *consumer);
/* Adds the `share` object (name, consumers, whether detached) to a `streams` entry. */
void share_describe(const share_member *m, cJSON *o);

#endif
