/* scheduler — the policy that decides which stream's work a free worker takes next.
 *
 * Several trainers on one node share one pool of workers. First come, first served
 * lets a stream of heavy batches (JPEG decoding) queue so much work that a light stream
 * waits behind it for every batch. Here each stream is a flow with its own queue, and
 * the pool asks scheduler_pick for the next task:
 *
 *  - Fair share. Each flow has a virtual time: the worker time it received divided by
 *    its weight. The flow with work and the least virtual time goes next (start-time
 *    fair queueing, the exact form of deficit round robin for tasks whose cost is only
 *    known afterwards). A task is charged its flow's recent cost per unit when it is
 *    picked, so two workers do not both pick the flow that looks cheapest, and the
 *    difference to its measured cost when it is done.
 *  - No banking. A flow that had nothing queued comes back at the current virtual time
 *    (the start of the task picked last), not at its old one: idling earns no credit to
 *    spend later at the others' expense, and a light flow that comes back is next.
 *  - Priority to a waiting trainer. A flow marked urgent (its trainer waits in `next`
 *    and nothing is READY) is ranked SCHEDULER_URGENT_SLACK_NS of its own worker time
 *    earlier. It runs first, but cannot get further than that ahead of its share: a
 *    heavy stream whose trainer always waits still only gets its share.
 *  - Caps. A group (the dataset, the client's uid) may be capped at a fraction of the
 *    workers' time: its credit grows with wall time at cap x workers, is spent by its
 *    flows' tasks, and a flow of a group in debt is skipped until the credit is back
 *    (even when workers are idle: a cap is a ceiling, not a share).
 *
 * Everything is in integers of nanoseconds except the virtual times and credits, which
 * are doubles (weights divide them); IEEE arithmetic keeps the result deterministic. */
#include "scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"
#include "log.h"

struct scheduler_group {
    struct scheduler_group *next;
    char name[SCHEDULER_GROUP_NAME_MAX];
    uint32_t refs;
    double cap;                     /* fraction of the workers; 0: none */
    double credit_ns;               /* worker time it may still use; negative: in debt */
    uint64_t last_ns;               /* when the credit was last refilled */
    bool started;                   /* the first pick fills the bucket */
};

struct scheduler_flow {
    scheduler_flow *prev, *next;
    struct scheduler_item *head, *tail;
    uint32_t queued, running;
    double weight;
    double vtime;                   /* worker ns received / weight, plus charges in flight */
    bool urgent;
    uint64_t seq;                   /* creation order: ties go to the older flow */
    struct scheduler_group *groups[SCHEDULER_MAX_GROUPS];
    uint64_t cpu_ns, tasks;
    double unit_cost_ns;            /* moving average of a unit's cost; 0: none measured */
};

struct scheduler {
    unsigned workers;
    scheduler_flow *flows;
    struct scheduler_group *groups;
    double vclock;                  /* virtual start of the last picked task */
    size_t queued;
    uint64_t next_seq;
};

int scheduler_new(unsigned workers, scheduler **ret_sched)
{
    if (workers == 0 || !ret_sched)
        return LD_EINVAL;
    scheduler *s = calloc(1, sizeof *s);
    if (!s)
        return LD_ENOMEM;
    s->workers = workers;
    *ret_sched = s;
    return 0;
}

static void group_unref(scheduler *s, struct scheduler_group *g)
{
    if (!g || --g->refs)
        return;
    for (struct scheduler_group **link = &s->groups; *link; link = &(*link)->next) {
        if (*link == g) {
            *link = g->next;
            break;
        }
    }
    free(g);
}

void scheduler_free(scheduler *s)
{
    if (!s)
        return;
    while (s->flows) {
        scheduler_flow *f = s->flows;
        s->flows = f->next;
        for (int i = 0; i < SCHEDULER_MAX_GROUPS; i++)
            group_unref(s, f->groups[i]);
        free(f);
    }
    while (s->groups) {
        struct scheduler_group *g = s->groups;
        s->groups = g->next;
        free(g);
    }
    free(s);
}

static struct scheduler_group *group_get(scheduler *s, const char *name, double cap)
{
    struct scheduler_group *g;
    for (g = s->groups; g; g = g->next)
        if (strcmp(g->name, name) == 0)
            break;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g)
            return NULL;
        snprintf(g->name, sizeof g->name, "%s", name);
        g->next = s->groups;
        s->groups = g;
    }
    g->refs++;
    double c = cap > 0 && cap < 1 ? cap : 0;
    if (c != g->cap) {
        g->cap = c;
        g->started = false; /* a new cap starts with a full bucket */
    }
    return g;
}

int scheduler_flow_new(scheduler *s, const struct scheduler_flow_params *p, scheduler_flow **ret_flow)
{
    if (!s || !p || !ret_flow || p->weight > SCHEDULER_WEIGHT_MAX)
        return LD_EINVAL;
    scheduler_flow *f = calloc(1, sizeof *f);
    if (!f)
        return LD_ENOMEM;
    f->weight = p->weight ? p->weight : 1;
    f->vtime = s->vclock;
    f->seq = s->next_seq++;
    for (int i = 0; i < SCHEDULER_MAX_GROUPS; i++) {
        if (!p->group[i])
            continue;
        if (!(f->groups[i] = group_get(s, p->group[i], p->cap[i]))) {
            for (int j = 0; j < i; j++)
                group_unref(s, f->groups[j]);
            free(f);
            return LD_ENOMEM;
        }
    }
    f->next = s->flows;
    if (s->flows)
        s->flows->prev = f;
    s->flows = f;
    *ret_flow = f;
    return 0;
}

void scheduler_flow_free(scheduler *s, scheduler_flow *f)
{
    if (!f)
        return;
    /* Its tasks would settle their charges on freed memory. */
    ld_require(!f->queued && !f->running);
    if (f->prev)
        f->prev->next = f->next;
    else
        s->flows = f->next;
    if (f->next)
        f->next->prev = f->prev;
    for (int i = 0; i < SCHEDULER_MAX_GROUPS; i++)
        group_unref(s, f->groups[i]);
    free(f);
}

void scheduler_flow_set_urgent(scheduler_flow *f, bool urgent)
{
    f->urgent = urgent;
}

void scheduler_flow_get_stats(const scheduler_flow *f, struct scheduler_flow_stats *ret_stats)
{
    *ret_stats = (struct scheduler_flow_stats){
        .cpu_ns = f->cpu_ns, .tasks = f->tasks, .queued = f->queued, .running = f->running,
        .unit_cost_ns = (uint64_t)f->unit_cost_ns,
    };
}

bool scheduler_flow_idle(const scheduler_flow *f)
{
    return !f->queued && !f->running;
}

struct scheduler_item *scheduler_flow_take(scheduler *s, scheduler_flow *f)
{
    struct scheduler_item *list = f->head;
    s->queued -= f->queued;
    f->queued = 0;
    f->head = f->tail = NULL;
    return list;
}

void scheduler_push(scheduler *s, scheduler_flow *f, struct scheduler_item *it)
{
    /* Back from idle: no credit for the time it had nothing to do. */
    if (!f->queued && f->vtime < s->vclock)
        f->vtime = s->vclock;
    it->next = NULL;
    if (f->tail)
        f->tail->next = it;
    else
        f->head = it;
    f->tail = it;
    f->queued++;
    s->queued++;
}

size_t scheduler_queued(const scheduler *s)
{
    return s->queued;
}

static double group_rate(const scheduler *s, const struct scheduler_group *g)
{
    return g->cap * s->workers; /* worker ns per wall ns */
}

static void group_refill(const scheduler *s, struct scheduler_group *g, uint64_t now)
{
    double burst = group_rate(s, g) * SCHEDULER_CAP_BURST_NS;
    if (!g->started) {
        g->started = true;
        g->credit_ns = burst;
        g->last_ns = now;
        return;
    }
    if (now > g->last_ns) {
        g->credit_ns += group_rate(s, g) * (double)(now - g->last_ns);
        if (g->credit_ns > burst)
            g->credit_ns = burst;
        g->last_ns = now;
    }
}

/* 0 when every capped group of f has credit, else the wall ns until all have. */
static uint64_t flow_blocked_for(const scheduler *s, const scheduler_flow *f)
{
    uint64_t wait = 0;
    for (int i = 0; i < SCHEDULER_MAX_GROUPS; i++) {
        const struct scheduler_group *g = f->groups[i];
        if (!g || !g->cap || g->credit_ns > 0)
            continue;
        uint64_t w = (uint64_t)(-g->credit_ns / group_rate(s, g)) + 1;
        if (w > wait)
            wait = w;
    }
    return wait;
}

static double charge_of(const scheduler_flow *f, uint32_t units)
{
    return f->unit_cost_ns * units;
}

static void charge(scheduler_flow *f, double ns)
{
    f->vtime += ns / f->weight;
    for (int i = 0; i < SCHEDULER_MAX_GROUPS; i++)
        if (f->groups[i] && f->groups[i]->cap)
            f->groups[i]->credit_ns -= ns;
}

struct scheduler_item *scheduler_pick(scheduler *s, uint64_t now_ns, struct scheduler_ticket *ret_ticket, uint64_t *ret_wait_ns)
{
    *ret_wait_ns = 0;
    if (!s->queued)
        return NULL;
    for (struct scheduler_group *g = s->groups; g; g = g->next)
        if (g->cap)
            group_refill(s, g, now_ns);

    scheduler_flow *best = NULL;
    double best_key = 0;
    uint64_t wait = UINT64_MAX;
    for (scheduler_flow *f = s->flows; f; f = f->next) {
        if (!f->queued)
            continue;
        uint64_t w = flow_blocked_for(s, f);
        if (w) {
            if (w < wait)
                wait = w;
            continue;
        }
        double key = f->vtime - (f->urgent ? SCHEDULER_URGENT_SLACK_NS / f->weight : 0);
        if (!best || key < best_key || (key == best_key && f->seq < best->seq)) {
            best = f;
            best_key = key;
        }
    }
    if (!best) {
        *ret_wait_ns = wait;
        return NULL;
    }

    struct scheduler_item *it = best->head;
    best->head = it->next;
    if (!best->head)
        best->tail = NULL;
    it->next = NULL;
    best->queued--;
    s->queued--;
    best->running++;
    if (best->vtime > s->vclock)
        s->vclock = best->vtime;
    double c = (double)(uint64_t)charge_of(best, it->units);
    charge(best, c);
    *ret_ticket = (struct scheduler_ticket){.flow = best, .charged_ns = (uint64_t)c, .units = it->units};
    return it;
}

void scheduler_done(scheduler *s, const struct scheduler_ticket *t, uint64_t cost_ns)
{
    (void)s;
    scheduler_flow *f = t->flow;
    charge(f, (double)cost_ns - (double)t->charged_ns);
    f->running--;
    f->cpu_ns += cost_ns;
    f->tasks++;
    if (t->units) {
        double per = (double)cost_ns / t->units;
        /* An average over the last few tasks: follows a change of pipeline or cache
         * state within a batch or two, without jumping at one slow read. */
        f->unit_cost_ns = f->unit_cost_ns ? f->unit_cost_ns + (per - f->unit_cost_ns) / 8 : per;
    }
}
