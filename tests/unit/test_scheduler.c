/* Unit tests for the scheduling policy (daemon/scheduler.c), on a simulated pool: fake
 * tasks of known cost, a fake clock, N simulated workers that pick a task whenever they
 * are free and report its cost when it ends. Everything is deterministic, so the shares
 * are checked against tight bounds: weighted fair share whatever the task costs,
 * priority to a waiting trainer that stays within its slack, no starvation, no credit
 * banked while idle, caps per group, and the bookkeeping of take/free. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"
#include "scheduler.h"

#define MS 1000000ull
#define US 1000ull
#define MAX_FLOWS 4
#define MAX_WORKERS 4
#define TASKS_PER_FLOW 64

struct fake_task {
    struct scheduler_item item; /* first */
    int flow;
    uint64_t cost;
    bool in_use;
};

struct sim {
    scheduler *s;
    unsigned workers;
    uint64_t now;
    scheduler_flow *f[MAX_FLOWS];
    int n_flows;
    struct fake_task tasks[MAX_FLOWS][TASKS_PER_FLOW];
    uint64_t cost[MAX_FLOWS];       /* of each task of the flow */
    uint32_t backlog[MAX_FLOWS];    /* keep this many queued (0: only what the test pushes) */
    uint64_t served[MAX_FLOWS];     /* worker ns of finished tasks */
    uint64_t picks[MAX_FLOWS];
    uint64_t last_start[MAX_FLOWS]; /* when its latest task started */
    int pick_log[4096];             /* flows in pick order */
    size_t n_log;
    struct {
        bool busy;
        uint64_t end;
        struct scheduler_ticket t;
        struct fake_task *task;
    } w[MAX_WORKERS];
    bool idle_seen;                 /* a worker found nothing it may run while work was queued */
};

static void sim_init(struct sim *m, unsigned workers)
{
    memset(m, 0, sizeof *m);
    m->workers = workers;
    assert_int_equal(scheduler_new(workers, &m->s), 0);
}

static int sim_flow(struct sim *m, uint32_t weight, uint64_t cost, uint32_t backlog, const char *g0, double cap0,
                    const char *g1, double cap1)
{
    int i = m->n_flows++;
    struct scheduler_flow_params p = {.weight = weight, .group = {g0, g1}, .cap = {cap0, cap1}};
    assert_int_equal(scheduler_flow_new(m->s, &p, &m->f[i]), 0);
    m->cost[i] = cost;
    m->backlog[i] = backlog;
    return i;
}

static void sim_push(struct sim *m, int fl, uint64_t cost)
{
    for (int k = 0; k < TASKS_PER_FLOW; k++) {
        struct fake_task *t = &m->tasks[fl][k];
        if (t->in_use)
            continue;
        t->in_use = true;
        t->flow = fl;
        t->cost = cost;
        t->item.units = 1;
        scheduler_push(m->s, m->f[fl], &t->item);
        return;
    }
    fail_msg("flow %d: no free fake task", fl);
}

static void sim_top_up(struct sim *m)
{
    for (int i = 0; i < m->n_flows; i++) {
        struct scheduler_flow_stats st;
        scheduler_flow_get_stats(m->f[i], &st);
        for (uint32_t q = st.queued; q < m->backlog[i]; q++)
            sim_push(m, i, m->cost[i]);
    }
}

/* Runs the simulated pool until `until` (absolute fake time). */
static void sim_run(struct sim *m, uint64_t until)
{
    for (;;) {
        sim_top_up(m);
        uint64_t wake = until;
        for (unsigned w = 0; w < m->workers; w++) {
            if (m->w[w].busy)
                continue;
            uint64_t wait = 0;
            struct scheduler_ticket t;
            struct scheduler_item *it = scheduler_pick(m->s, m->now, &t, &wait);
            if (!it) {
                if (wait) {
                    m->idle_seen = true;
                    if (m->now + wait < wake)
                        wake = m->now + wait;
                }
                break;
            }
            struct fake_task *ft = (struct fake_task *)it;
            m->w[w].busy = true;
            m->w[w].end = m->now + ft->cost;
            m->w[w].t = t;
            m->w[w].task = ft;
            m->picks[ft->flow]++;
            m->last_start[ft->flow] = m->now;
            if (m->n_log < sizeof m->pick_log / sizeof m->pick_log[0])
                m->pick_log[m->n_log++] = ft->flow;
            sim_top_up(m);
        }
        for (unsigned w = 0; w < m->workers; w++)
            if (m->w[w].busy && m->w[w].end < wake)
                wake = m->w[w].end;
        if (wake > until || (wake == until && m->now == until))
            break;
        m->now = wake;
        for (unsigned w = 0; w < m->workers; w++) {
            if (!m->w[w].busy || m->w[w].end != m->now)
                continue;
            struct fake_task *ft = m->w[w].task;
            scheduler_done(m->s, &m->w[w].t, ft->cost);
            m->served[ft->flow] += ft->cost;
            ft->in_use = false;
            m->w[w].busy = false;
        }
        if (m->now >= until)
            break;
    }
    m->now = until;
}

/* Lets the running tasks finish (and nothing new start): the flows become idle. */
static void sim_drain(struct sim *m)
{
    for (int i = 0; i < m->n_flows; i++) {
        m->backlog[i] = 0;
        struct scheduler_item *it = scheduler_flow_take(m->s, m->f[i]);
        while (it) {
            struct scheduler_item *n = it->next;
            ((struct fake_task *)it)->in_use = false;
            it = n;
        }
    }
    for (unsigned w = 0; w < m->workers; w++) {
        if (!m->w[w].busy)
            continue;
        if (m->w[w].end > m->now)
            m->now = m->w[w].end;
        scheduler_done(m->s, &m->w[w].t, m->w[w].task->cost);
        m->served[m->w[w].task->flow] += m->w[w].task->cost;
        m->w[w].task->in_use = false;
        m->w[w].busy = false;
    }
}

static void sim_free(struct sim *m)
{
    sim_drain(m);
    for (int i = 0; i < m->n_flows; i++) {
        assert_true(scheduler_flow_idle(m->f[i]));
        scheduler_flow_free(m->s, m->f[i]);
    }
    scheduler_free(m->s);
}

static double share(const struct sim *m, int fl, const uint64_t *before)
{
    uint64_t total = 0, mine = m->served[fl] - (before ? before[fl] : 0);
    for (int i = 0; i < m->n_flows; i++)
        total += m->served[i] - (before ? before[i] : 0);
    return total ? (double)mine / (double)total : 0;
}

static void test_bad_params(void **state)
{
    (void)state;
    scheduler *s = (scheduler *)0x1;
    assert_int_equal(scheduler_new(0, &s), LD_EINVAL);
    assert_int_equal(scheduler_new(2, NULL), LD_EINVAL);
    assert_ptr_equal(s, (scheduler *)0x1);
    assert_int_equal(scheduler_new(2, &s), 0);
    scheduler_flow *f = (scheduler_flow *)0x1;
    struct scheduler_flow_params p = {.weight = SCHEDULER_WEIGHT_MAX + 1};
    assert_int_equal(scheduler_flow_new(s, &p, &f), LD_EINVAL);
    assert_ptr_equal(f, (scheduler_flow *)0x1);
    /* Nothing queued: no item and no wait. */
    struct scheduler_ticket t;
    uint64_t wait = 99;
    assert_null(scheduler_pick(s, 0, &t, &wait));
    assert_int_equal(wait, 0);
    scheduler_free(s);
    scheduler_free(NULL);
}

/* Two saturating flows, tasks 20x apart in cost: each gets half of the worker time,
 * not half of the tasks (FIFO or round robin by task would give the heavy one 95%). */
static void test_equal_share_unequal_costs(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int heavy = sim_flow(&m, 1, 1 * MS, 8, NULL, 0, NULL, 0);
    int light = sim_flow(&m, 1, 50 * US, 8, NULL, 0, NULL, 0);
    sim_run(&m, 2000 * MS);
    assert_in_range((long)(share(&m, heavy, NULL) * 1000), 490, 510);
    assert_in_range((long)(share(&m, light, NULL) * 1000), 490, 510);
    /* Work-conserving: both workers were busy all along (within the last tasks). */
    assert_true(m.served[heavy] + m.served[light] >= 2 * 2000 * MS - 2 * MS);
    sim_free(&m);
}

static void test_weighted_share(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int a = sim_flow(&m, 3, 200 * US, 8, NULL, 0, NULL, 0);
    int b = sim_flow(&m, 1, 1 * MS, 8, NULL, 0, NULL, 0);
    int c = sim_flow(&m, 4, 700 * US, 8, NULL, 0, NULL, 0);
    sim_run(&m, 3000 * MS);
    assert_in_range((long)(share(&m, a, NULL) * 1000), 365, 385); /* 3/8 */
    assert_in_range((long)(share(&m, b, NULL) * 1000), 115, 135); /* 1/8 */
    assert_in_range((long)(share(&m, c, NULL) * 1000), 490, 510); /* 4/8 */
    sim_free(&m);
}

/* A heavy flow keeps 8 tasks of 20 ms queued on 2 workers. A light flow's single task
 * starts as soon as a worker is free, not after the heavy queue (FIFO: 80 ms). */
static void test_light_not_behind_queue(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int heavy = sim_flow(&m, 1, 20 * MS, 8, NULL, 0, NULL, 0);
    int light = sim_flow(&m, 1, 0, 0, NULL, 0, NULL, 0);
    sim_run(&m, 1000 * MS);
    for (int round = 0; round < 20; round++) {
        uint64_t at = m.now + 3 * MS + (uint64_t)round * 1 * MS; /* at various phases of the heavy tasks */
        sim_run(&m, at);
        uint64_t picks = m.picks[light];
        sim_push(&m, light, 100 * US);
        sim_run(&m, at + 20 * MS);
        assert_int_equal(m.picks[light], picks + 1);
        assert_true(m.last_start[light] - at <= 20 * MS);
        sim_run(&m, m.now + 17 * MS);
    }
    assert_true(m.picks[heavy] > 0);
    sim_free(&m);
}

/* Urgency: equal flows alternate; the one whose trainer waits goes first for about
 * SCHEDULER_URGENT_SLACK_NS of its own worker time, then they alternate again: over a long
 * run the shares stay equal. */
static void test_urgent_first_but_bounded(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1);
    int a = sim_flow(&m, 1, 1 * MS, 4, NULL, 0, NULL, 0);
    int b = sim_flow(&m, 1, 1 * MS, 4, NULL, 0, NULL, 0);
    sim_run(&m, 100 * MS);
    /* Alternating: no flow ran twice in a row after the start. */
    for (size_t i = 2; i < m.n_log; i++)
        assert_int_not_equal(m.pick_log[i], m.pick_log[i - 1]);
    size_t from = m.n_log;
    scheduler_flow_set_urgent(m.f[b], true);
    sim_run(&m, m.now + 200 * MS);
    /* b ran the next ~SCHEDULER_URGENT_SLACK_NS / 1 ms tasks in a row... */
    size_t slack_tasks = SCHEDULER_URGENT_SLACK_NS / MS;
    for (size_t i = from + 1; i < from + slack_tasks - 1; i++)
        assert_int_equal(m.pick_log[i], b);
    /* ...and then no more than its share: alternating again. */
    for (size_t i = from + slack_tasks + 3; i < m.n_log; i++)
        assert_int_not_equal(m.pick_log[i], m.pick_log[i - 1]);
    uint64_t before[MAX_FLOWS];
    memcpy(before, m.served, sizeof before);
    sim_run(&m, m.now + 2000 * MS);
    assert_in_range((long)(share(&m, a, before) * 1000), 495, 505);
    /* Both waiting: still equal. */
    scheduler_flow_set_urgent(m.f[a], true);
    memcpy(before, m.served, sizeof before);
    sim_run(&m, m.now + 2000 * MS);
    assert_in_range((long)(share(&m, a, before) * 1000), 495, 505);
    sim_free(&m);
}

/* A flow with a tiny weight still runs, regularly, at its share. */
static void test_no_starvation(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1);
    int big = sim_flow(&m, 100, 1 * MS, 4, NULL, 0, NULL, 0);
    int small = sim_flow(&m, 1, 1 * MS, 4, NULL, 0, NULL, 0);
    scheduler_flow_set_urgent(m.f[big], true); /* even against a trainer that always waits */
    sim_run(&m, 4000 * MS);
    assert_in_range((long)m.picks[small], 36, 44); /* 4000 / 101 */
    /* The longest run of picks without the small flow, after the slack is spent. */
    size_t gap = 0, worst = 0;
    for (size_t i = 200; i < m.n_log; i++) {
        gap = m.pick_log[i] == small ? 0 : gap + 1;
        if (gap > worst)
            worst = gap;
    }
    assert_true(worst <= 101);
    (void)big;
    sim_free(&m);
}

/* Idle time earns no credit: a flow that comes back after a pause, or arrives while
 * another has run for a long time, gets its share from then on, not everything. */
static void test_no_banking(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int a = sim_flow(&m, 1, 1 * MS, 8, NULL, 0, NULL, 0);
    sim_run(&m, 1000 * MS);
    int b = sim_flow(&m, 1, 1 * MS, 8, NULL, 0, NULL, 0);
    uint64_t before[MAX_FLOWS];
    memcpy(before, m.served, sizeof before);
    sim_run(&m, m.now + 100 * MS);
    assert_in_range((long)(share(&m, b, before) * 1000), 450, 550);
    /* b pauses for a second (its last tasks finish), a runs alone, b comes back. */
    m.backlog[b] = 0;
    struct scheduler_item *it = scheduler_flow_take(m.s, m.f[b]);
    for (; it; it = it->next)
        ((struct fake_task *)it)->in_use = false;
    sim_run(&m, m.now + 1000 * MS);
    m.backlog[b] = 8;
    memcpy(before, m.served, sizeof before);
    sim_run(&m, m.now + 100 * MS);
    assert_in_range((long)(share(&m, b, before) * 1000), 450, 550);
    (void)a;
    sim_free(&m);
}

/* A capped group alone on idle workers uses its cap and no more: the workers wait,
 * and scheduler_pick says for how long. */
static void test_cap_alone(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int a = sim_flow(&m, 1, 1 * MS, 8, "dataset:a", 0.25, NULL, 0);
    sim_run(&m, 2000 * MS);
    /* 0.25 x 2 workers x 2 s = 1 s of worker time, plus the first bucket (50 ms) and
     * the task in flight when the credit ran out. */
    assert_in_range((long)(m.served[a] / MS), 950, 1060);
    assert_true(m.idle_seen);
    sim_free(&m);
}

/* A cap on a group holds for all its flows together, and on either of a flow's two
 * groups; the uncapped flow takes what the others may not. */
static void test_cap_group(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2);
    int a1 = sim_flow(&m, 1, 1 * MS, 8, "dataset:a", 0.5, "uid:1000", 0);
    int a2 = sim_flow(&m, 1, 300 * US, 8, "dataset:a", 0.5, "uid:1001", 0);
    int c = sim_flow(&m, 1, 2 * MS, 8, "dataset:c", 0, "uid:1001", 0);
    sim_run(&m, 3000 * MS);
    /* Fair share would give dataset a two thirds; the cap holds it to one half. */
    double sa = share(&m, a1, NULL) + share(&m, a2, NULL);
    assert_in_range((long)(sa * 1000), 480, 520);
    assert_in_range((long)(share(&m, c, NULL) * 1000), 480, 520);
    assert_in_range((long)(share(&m, a1, NULL) * 1000), 230, 270);
    sim_drain(&m);

    /* The client's cap applies too (the tighter of the two wins): uid 1000 at 0.2. */
    int u = sim_flow(&m, 1, 1 * MS, 8, "dataset:c", 0, "uid:1000", 0.2);
    m.backlog[c] = 8;
    uint64_t before[MAX_FLOWS];
    memcpy(before, m.served, sizeof before);
    sim_run(&m, m.now + 3000 * MS);
    /* uid 1000's cap is now 0.2 for a1 as well (a group takes the newest cap). */
    double s_u = share(&m, u, before) + share(&m, a1, before);
    assert_in_range((long)(s_u * 1000), 0, 215);
    assert_true(m.served[c] - before[c] > 0);
    sim_free(&m);
}

static void test_take_free_stats(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1);
    int a = sim_flow(&m, 1, 0, 0, NULL, 0, NULL, 0);
    int b = sim_flow(&m, 1, 0, 0, NULL, 0, NULL, 0);
    assert_true(scheduler_flow_idle(m.f[a]));
    for (int i = 0; i < 5; i++) {
        sim_push(&m, a, 1 * MS);
        sim_push(&m, b, 1 * MS);
    }
    assert_int_equal(scheduler_queued(m.s), 10);
    assert_false(scheduler_flow_idle(m.f[a]));
    struct scheduler_item *list = scheduler_flow_take(m.s, m.f[a]);
    int n = 0;
    for (struct scheduler_item *it = list; it; it = it->next, n++)
        assert_ptr_equal(it, &m.tasks[a][n].item); /* oldest first */
    assert_int_equal(n, 5);
    assert_int_equal(scheduler_queued(m.s), 5);
    assert_true(scheduler_flow_idle(m.f[a]));
    assert_null(scheduler_flow_take(m.s, m.f[a]));
    for (int i = 0; i < 5; i++)
        m.tasks[a][i].in_use = false;

    /* Only b's tasks run now; their cost is measured per unit. */
    sim_run(&m, 100 * MS);
    struct scheduler_flow_stats st;
    scheduler_flow_get_stats(m.f[b], &st);
    assert_int_equal(st.tasks, 5);
    assert_int_equal(st.cpu_ns, 5 * MS);
    assert_int_equal(st.unit_cost_ns, 1 * MS);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.running, 0);
    scheduler_flow_get_stats(m.f[a], &st);
    assert_int_equal(st.tasks, 0);

    /* A flow freed, the others still scheduled. */
    scheduler_flow_free(m.s, m.f[a]);
    m.f[a] = m.f[b];
    m.n_flows = 1;
    m.tasks[0][0].in_use = false;
    sim_push(&m, 0, 1 * MS);
    sim_run(&m, 200 * MS);
    scheduler_flow_get_stats(m.f[0], &st);
    assert_int_equal(st.tasks, 6);
    sim_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_equal_share_unequal_costs),
        cmocka_unit_test(test_weighted_share),
        cmocka_unit_test(test_light_not_behind_queue),
        cmocka_unit_test(test_urgent_first_but_bounded),
        cmocka_unit_test(test_no_starvation),
        cmocka_unit_test(test_no_banking),
        cmocka_unit_test(test_cap_alone),
        cmocka_unit_test(test_cap_group),
        cmocka_unit_test(test_take_free_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
