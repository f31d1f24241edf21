/* ring — one stream's batch slots in one POSIX shared-memory object.
 *
 * The object is created with a name that carries the daemon's identity and an
 * unguessable part, its pages are committed at open (posix_fallocate), so a
 * /dev/shm too small for it fails here with a message naming /dev/shm and the size
 * instead of a SIGBUS later, and it is mapped read-write by the daemon (clients map
 * it read-only). Layout: see struct ld_ring_header in proto/ld_wire.h.
 *
 * Slot state machine, driven by one thread at a time (the loop thread, or a worker that
 * holds its stream's lock on the direct path; no locking here). The getters (state,
 * count, generation) may be called from the loop while a worker drives it, for reports:
 * each value read is one that was current, the set of them may not be consistent.
 *   FREE -acquire-> FILLING -ready-> READY -lease-> LEASED -release-> FREE
 *                   FILLING -copying-> COPYING -copied-> READY
 * acquire bumps the slot's generation; release must quote the current generation.
 * COPYING covers the device stage (device.h): the slot is filled on the host and its
 * copy to the device is under way; it is not deliverable and cannot be discarded
 * (the copy engine reads it) until the copy is reported. */
#ifndef LD_RING_H
#define LD_RING_H

#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

#include "ld_wire.h"

enum ring_state { RING_FREE = 0, RING_FILLING = 1, RING_READY = 2, RING_LEASED = 3, RING_COPYING = 4 };
/* How many states there are: enum ring_state runs from 0 to RING_STATES - 1, so an array
 * indexed by state (counts per state) has RING_STATES entries. */
#define RING_STATES 5
_Static_assert(RING_COPYING + 1 == RING_STATES, "RING_STATES counts every enum ring_state");
#define RING_NAME_MAX LD_SHM_NAME_MAX /* the name clients accept, NUL included */

typedef struct ring ring;

/* Creates `/<prefix>.<pid>.<stream_id>.<16 random hex>` with `slot_count` slots of
 * `slot_bytes` (rounded up to LD_RING_ALIGN), mode `mode` (plus group read and the
 * shared group when ring_share_with_group set one). LD_ENOSPC with an errbuf message
 * naming /dev/shm and the size when the pages cannot be committed. */
int ring_open(const char *prefix, uint64_t stream_id, uint32_t slot_count, uint64_t slot_bytes,
              unsigned mode, ring **ret_ring, char *errbuf);
/* The same with only the header and the first `commit_slots` (>= 1) slots committed
 * now: ring_acquire hands out committed slots only, and ring_commit commits the rest.
 * A ring larger than /dev/shm's free space is still refused here. */
int ring_open_partial(const char *prefix, uint64_t stream_id, uint32_t slot_count, uint64_t slot_bytes,
                      unsigned mode, uint32_t commit_slots, ring **ret_ring, char *errbuf);
/* Commits slots up to `upto` (excluded; at most the slot count). Blocks (tens of ms for
 * tens of MiB): call it from a thread that may block, one at a time per ring, never
 * concurrently with ring_free; any other ring call may run meanwhile on the loop thread.
 * LD_ENOSPC with the same message as ring_open when /dev/shm has no room left; the
 * slots committed before stay usable. */
int ring_commit(ring *r, uint32_t upto, char *errbuf);
/* Slots [0, this) are committed. Any thread. */
uint32_t ring_committed(const ring *r);
/* Rings created from now on belong to group `gid` and are readable by it (mode 0640
 * from 0600): for a daemon that serves the members of a group (its socket's group).
 * (gid_t)-1 goes back to private rings. Called at start-up, from the loop thread. */
void ring_share_with_group(gid_t gid);
/* Unmaps and removes the name if still present. Accepts NULL. */
void ring_free(ring *r);
/* Removes the name now (once the client has mapped it); idempotent. */
int ring_unlink(ring *r);

const char *ring_name(const ring *r);
uint32_t ring_slot_count(const ring *r);
uint64_t ring_slot_size(const ring *r);
uint64_t ring_slot_offset(const ring *r);
uint64_t ring_total_size(const ring *r);
/* Start of slot s (its struct ld_slot_header). */
void *ring_slot(ring *r, uint32_t slot);

/* State machine. Each returns 0, or LD_EINVAL for a slot out of range, or
 * LD_EAGAIN (acquire: no FREE slot), LD_EBUSY (wrong state for the transition),
 * LD_ENOTLEASED (release of a slot that is not LEASED), LD_ESTALE (release with a
 * generation that is not current). A failed call changes nothing. */
int ring_acquire(ring *r, uint32_t *ret_slot, uint64_t *ret_generation);
int ring_ready(ring *r, uint32_t slot);
int ring_copying(ring *r, uint32_t slot);  /* FILLING -> COPYING */
int ring_copied(ring *r, uint32_t slot);   /* COPYING -> READY */
int ring_lease(ring *r, uint32_t slot);
int ring_release(ring *r, uint32_t slot, uint64_t generation);
/* FILLING or READY back to FREE (stream teardown, cancelled fill). */
int ring_discard(ring *r, uint32_t slot);
enum ring_state ring_state(const ring *r, uint32_t slot);
uint64_t ring_generation(const ring *r, uint32_t slot);
uint32_t ring_count(const ring *r, enum ring_state state);
/* The state's name as status, streams and metrics show it: "free", "filling", "ready",
 * "leased", "copying"; "?" for a value that is not a state. */
const char *ring_state_name(enum ring_state state);

/* Removes /dev/shm objects named `<prefix>.<pid>.*` whose pid is not a live process
 * (left by a crashed daemon). Returns how many were removed. */
int ring_sweep(const char *prefix);

#endif
