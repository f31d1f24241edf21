/* hub — completions handed to the loop thread (see hub.h for the contract).
 *
 * One FIFO of intrusive completions under a mutex. A post from another thread appends
 * and wakes the loop through a uv_async handle, whose callback runs the queue; a post
 * from the loop thread appends and starts a uv_idle handle instead: an active idle
 * handle makes the loop poll without blocking, and its callback runs the queue on the
 * loop's next turn, before the prepare phase (where the server flushes its replies), so
 * answers posted while a read is handled still leave in the same write as the others.
 *
 * A run takes only the completions queued when it started, one at a time under the
 * lock (so a completion may cancel one queued behind it), and leaves what was posted
 * meanwhile to the next turn: a completion that posts itself again cannot starve I/O.
 */
#include "hub.h"

#include <pthread.h>
#include <stdlib.h>

#include "ld_error.h"

struct hub {
    uv_loop_t *loop;
    pthread_t loop_thread;
    uv_async_t async;               /* posts from other threads */
    uv_idle_t idle;                 /* posts from the loop thread, and leftovers of a run */
    pthread_mutex_t lock;
    struct hub_completion *head, *tail; /* under lock */
    unsigned n;                     /* queued, under lock */
    int open_handles;
};

static void hub_unlink(hub *h, struct hub_completion *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        h->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        h->tail = c->prev;
    c->next = c->prev = NULL;
    c->queued = false;
    h->n--;
}

static void hub_idle_cb(uv_idle_t *idle);

/* Runs the completions queued now, oldest first. Loop thread. */
static void hub_run(hub *h)
{
    pthread_mutex_lock(&h->lock);
    unsigned budget = h->n;
    pthread_mutex_unlock(&h->lock);
    while (budget--) {
        pthread_mutex_lock(&h->lock);
        struct hub_completion *c = h->head;
        if (c)
            hub_unlink(h, c);
        pthread_mutex_unlock(&h->lock);
        if (!c)
            break; /* cancelled meanwhile */
        c->done(c);
    }
    pthread_mutex_lock(&h->lock);
    bool more = h->n > 0;
    pthread_mutex_unlock(&h->lock);
    if (more)
        uv_idle_start(&h->idle, hub_idle_cb);
    else
        uv_idle_stop(&h->idle);
}

static void hub_async_cb(uv_async_t *a)
{
    hub_run(a->data);
}

static void hub_idle_cb(uv_idle_t *idle)
{
    hub_run(idle->data);
}

int hub_new(uv_loop_t *loop, hub **ret_hub)
{
    hub *h = calloc(1, sizeof *h);
    if (!h)
        return LD_ENOMEM;
    h->loop = loop;
    h->loop_thread = pthread_self();
    int rc = pthread_mutex_init(&h->lock, NULL);
    if (rc != 0) {
        free(h);
        return ld_from_errno(rc);
    }
    rc = uv_async_init(loop, &h->async, hub_async_cb);
    if (rc < 0) {
        pthread_mutex_destroy(&h->lock);
        free(h);
        return rc;
    }
    uv_idle_init(loop, &h->idle); /* cannot fail on Unix */
    h->async.data = h;
    h->idle.data = h;
    h->open_handles = 2;
    *ret_hub = h;
    return 0;
}

static void hub_closed(uv_handle_t *handle)
{
    hub *h = handle->data;
    if (--h->open_handles > 0)
        return;
    pthread_mutex_destroy(&h->lock);
    free(h);
}

void hub_close(hub *h)
{
    if (!h)
        return;
    /* Waits out a thread between its append and its uv_async_send (hub_post sends
     * under the lock), so the handle is not closed under it; and forgets the rest. */
    pthread_mutex_lock(&h->lock);
    while (h->head)
        hub_unlink(h, h->head);
    pthread_mutex_unlock(&h->lock);
    uv_close((uv_handle_t *)&h->async, hub_closed);
    uv_close((uv_handle_t *)&h->idle, hub_closed);
}

void hub_post(hub *h, struct hub_completion *c)
{
    bool local = pthread_equal(pthread_self(), h->loop_thread);
    pthread_mutex_lock(&h->lock);
    if (c->queued) {
        pthread_mutex_unlock(&h->lock);
        return;
    }
    c->queued = true;
    c->next = NULL;
    c->prev = h->tail;
    if (h->tail)
        h->tail->next = c;
    else
        h->head = c;
    h->tail = c;
    h->n++;
    /* Sent under the lock: hub_close takes it too, so the hub cannot be closed and
     * freed between our append and our send (a worker preempted at shutdown). */
    if (!local)
        uv_async_send(&h->async);
    pthread_mutex_unlock(&h->lock);
    if (local)
        uv_idle_start(&h->idle, hub_idle_cb);
}

bool hub_cancel(hub *h, struct hub_completion *c)
{
    pthread_mutex_lock(&h->lock);
    bool was = c->queued;
    if (was)
        hub_unlink(h, c);
    pthread_mutex_unlock(&h->lock);
    return was;
}

unsigned hub_pending(hub *h)
{
    pthread_mutex_lock(&h->lock);
    unsigned n = h->n;
    pthread_mutex_unlock(&h->lock);
    return n;
}
