/* hub — the one way for finished work to come back to the loop thread.
 *
 * Whatever runs off the loop (a worker filling a slot, a watcher thread, a device
 * stage, a cache job) and whatever the loop thread wants to finish later (the answer
 * to a request that is known at once) hands the loop a completion: a struct
 * hub_completion embedded in the caller's own object, with the function that finishes
 * the work. The hub runs it on the loop thread, from the loop itself: never inside the
 * call that posted it (libuv's rule), so a completion may close, free or answer
 * anything without the poster's call chain seeing it happen.
 *
 * Completions run in the order they were posted. Posting one that is already queued
 * does nothing (like uv_async_send, several posts may run once). The hub allocates
 * nothing per completion. One hub per loop. */
#ifndef LD_HUB_H
#define LD_HUB_H

#include <stdbool.h>
#include <uv.h>

typedef struct hub hub;

/* Zero it before its first post (the object that embeds it is usually calloc'd). */
struct hub_completion {
    /* Runs on the loop thread, from the loop, once per time the completion was
     * queued. It may post this completion again, post others, cancel others, and
     * free the object that embeds it. */
    void (*done)(struct hub_completion *c);
    /* The hub's own bookkeeping, under its lock: do not touch. */
    struct hub_completion *next, *prev;
    bool queued;
};

/* The hub of `loop`: call on the thread that runs the loop (the loop thread). */
int hub_new(uv_loop_t *loop, hub **ret_hub);
/* Stops the hub: completions still queued never run (their owners must be gone, or not
 * care). No hub_post may run during or after this call; one running on another thread
 * when it starts is waited out. Frees the hub once its handles are closed (on a later
 * turn of the loop). Accepts NULL. */
void hub_close(hub *h);

/* Queues c to run on the loop thread. Any thread. From the loop thread it runs on the
 * loop's next turn, before the loop waits for I/O again; from another thread it wakes
 * the loop. c->done must be set; c must stay valid until it has run or been cancelled. */
void hub_post(hub *h, struct hub_completion *c);
/* Takes c off the queue if it is there (it will not run). Loop thread only. Returns
 * whether it was queued. */
bool hub_cancel(hub *h, struct hub_completion *c);
/* Completions queued now (loop thread: for tests and shutdown checks). */
unsigned hub_pending(hub *h);

#endif
