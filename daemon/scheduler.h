/* scheduler — which queued task a free worker runs next.
 *
 * Work is queued per flow (one flow per stream). A free worker takes the head task of
 * the flow that has received the least worker time for its weight, measured in CPU
 * time per task (start-time fair queueing on virtual time: the equivalent of deficit
 * round robin with a quantum of one task, but exact for tasks of very different cost).
 * A flow whose trainer is waiting right now is ranked as if it had received
 * SCHEDULER_URGENT_SLACK_NS less: it goes first, yet can only get that far ahead of its
 * share, so two urgent flows still share by weight and none starves.
 *
 * Flows belong to groups (the dataset, the client's uid). A group may carry a cap, a
 * fraction of the pool's worker time that all its flows together may use, enforced
 * even when the other workers are idle (a token bucket refilled with wall time).
 *
 * Pure policy: no threads, no clock and no lock of its own. The caller (pool.c) holds
 * its lock around every call and passes the time, so tests drive it with fake tasks of
 * known cost on a fake clock and get the same answer every time.
 */
#ifndef LD_SCHED_H
#define LD_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SCHEDULER_MAX_GROUPS 2
#define SCHEDULER_GROUP_NAME_MAX 96
#define SCHEDULER_WEIGHT_MAX 1000000u
/* How far ahead of its share priority can take a waiting trainer's flow, in its own
 * worker time: about one heavy batch's worth. */
#define SCHEDULER_URGENT_SLACK_NS (20u * 1000u * 1000u)
/* A capped group saves at most this much wall time's worth of credit while idle. */
#define SCHEDULER_CAP_BURST_NS (100u * 1000u * 1000u)

typedef struct scheduler scheduler;
typedef struct scheduler_flow scheduler_flow;

/* A queued unit of work, embedded in the caller's task. */
struct scheduler_item {
    struct scheduler_item *next;
    uint32_t units;                 /* the work it carries (rows), for the cost per unit */
};

/* What a pick charged, to be settled by scheduler_done once the task's cost is known (the
 * item itself may be gone by then). */
struct scheduler_ticket {
    scheduler_flow *flow;
    uint64_t charged_ns;
    uint32_t units;
};

struct scheduler_flow_params {
    uint32_t weight;                /* 1..SCHEDULER_WEIGHT_MAX; 0 counts as 1 */
    /* Groups by name (NULL: none) and their cap: a fraction of the workers in (0, 1];
     * 0 or >= 1 is no cap. A group that exists takes the newest cap given. */
    const char *group[SCHEDULER_MAX_GROUPS];
    double cap[SCHEDULER_MAX_GROUPS];
};

struct scheduler_flow_stats {
    uint64_t cpu_ns;                /* measured worker time of its finished tasks */
    uint64_t tasks;                 /* finished */
    uint32_t queued, running;
    uint64_t unit_cost_ns;          /* recent average cost of one unit, 0 before the first */
};

int scheduler_new(unsigned workers, scheduler **ret_sched);
/* Frees the scheduler and every flow and group left (their items belong to the caller).
 * Accepts NULL. */
void scheduler_free(scheduler *s);

int scheduler_flow_new(scheduler *s, const struct scheduler_flow_params *p, scheduler_flow **ret_flow);
/* Frees a flow with nothing queued and nothing running (abort otherwise: its tasks
 * would charge freed memory). */
void scheduler_flow_free(scheduler *s, scheduler_flow *f);
void scheduler_flow_set_urgent(scheduler_flow *f, bool urgent);
void scheduler_flow_get_stats(const scheduler_flow *f, struct scheduler_flow_stats *ret_stats);
/* Detaches the flow's queued items and returns them as a list (oldest first). */
struct scheduler_item *scheduler_flow_take(scheduler *s, scheduler_flow *f);
/* Nothing queued and nothing running. */
bool scheduler_flow_idle(const scheduler_flow *f);

void scheduler_push(scheduler *s, scheduler_flow *f, struct scheduler_item *it);
/* The next item to run, or NULL: nothing is queued (*ret_wait_ns = 0) or every flow
 * with work is over its cap (*ret_wait_ns: when the first may go). */
struct scheduler_item *scheduler_pick(scheduler *s, uint64_t now_ns, struct scheduler_ticket *ret_ticket, uint64_t *ret_wait_ns);
/* The picked task took cost_ns of worker time. */
void scheduler_done(scheduler *s, const struct scheduler_ticket *t, uint64_t cost_ns);
/* Items queued in all flows. */
size_t scheduler_queued(const scheduler *s);

#endif
