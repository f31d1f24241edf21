/* stream_commit — a stream's ring committed in the background.
 *
 * A ring holds prefetch + 3 slots of a whole batch each: for an image stream, tens of
 * megabytes whose pages take tens of milliseconds to commit (posix_fallocate zeroes
 * them), which the trainer would wait for before its first batch. So stream_open
 * commits the header and the first slot only (ring_open_partial), the first batch is
 * filled there by every worker at once, and when it is ready this thread commits the
 * other slots one by one, telling the loop after each (the stream's commit_done
 * completion), which then fills it: from the second batch on the stream runs at its
 * full depth. The thread commits; it touches nothing else of the stream. When /dev/shm
 * runs out meanwhile, the stream goes on with the slots it has and the log says why.
 * A device stream commits everything at open: its stage registers the whole mapping. */
#include "stream_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hub.h"
#include "log.h"

static void *stream_commit_main(void *arg)
{
    stream *s = arg;
    for (uint32_t n = ring_committed(s->ring) + 1; n <= s->n_slots; n++) {
        if (atomic_load_explicit(&s->commit_stop, memory_order_relaxed))
            break;
        int rc = ring_commit(s->ring, n, s->commit_err);
        if (rc < 0) {
            atomic_store_explicit(&s->commit_rc, rc, memory_order_release);
            hub_post(s->set->hub, &s->commit_done);
            break;
        }
        hub_post(s->set->hub, &s->commit_done);
    }
    return NULL;
}

/* The loop thread: one more slot is committed, or the committer stopped at an error. */
static void stream_commit_done(struct hub_completion *c)
{
    stream *s = (stream *)((char *)c - offsetof(stream, commit_done));
    if (atomic_load_explicit(&s->commit_rc, memory_order_acquire) < 0 && !s->commit_warned) {
        s->commit_warned = true;
        ld_log(LD_LOG_WARN, "stream %" PRIu64 ": %s; it goes on with the %" PRIu32 " of %" PRIu32 " slots committed",
               s->id, s->commit_err, ring_committed(s->ring), s->n_slots);
    }
    if (!s->closing)
        stream_schedule(s);
}

void stream_commit_start(stream *s)
{
    if (s->commit_started || ring_committed(s->ring) >= s->n_slots)
        return;
    s->commit_started = true;
    s->commit_done.done = stream_commit_done;
    int err = pthread_create(&s->committer, NULL, stream_commit_main, s);
    if (err == 0) {
        s->commit_joinable = true;
        return;
    }
    /* No thread: commit here, once, rather than run the stream on one slot. */
    char ebuf[128];
    ld_log(LD_LOG_WARN, "stream %" PRIu64 ": cannot start the thread that commits its slots (%s); committing them now",
           s->id, strerror_r(err, ebuf, sizeof ebuf));
    int rc = ring_commit(s->ring, s->n_slots, s->commit_err);
    if (rc < 0)
        atomic_store_explicit(&s->commit_rc, rc, memory_order_release);
    hub_post(s->set->hub, &s->commit_done);
}

void stream_commit_stop(stream *s)
{
    if (s->commit_joinable) {
        atomic_store_explicit(&s->commit_stop, true, memory_order_relaxed);
        pthread_join(s->committer, NULL);
        s->commit_joinable = false;
    }
    if (s->set)
        hub_cancel(s->set->hub, &s->commit_done);
}
