/* metrics — writes a snapshot of loaderd's counters in the Prometheus text format 0.0.4.
 *
 * The format, in the parts we use: a family is announced once by `# HELP name text`
 * and `# TYPE name counter|gauge`, and all of its samples follow together, one per
 * line, `name{label="value",...} number`. Label values escape backslash, double quote
 * and newline; HELP text escapes backslash and newline. A family may appear with no
 * samples (no stream open). Counter values are printed as exact integers where they
 * are integers, so a scraper can compare them with `status` without rounding.
 *
 * The text grows in one malloc'ed buffer; the first allocation failure is remembered
 * and reported once at the end, so the writers below need no error paths. */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ld_error.h"

struct metrics_buf {
    char *p;
    size_t len, cap;
    bool failed;
};

static bool metrics_reserve(struct metrics_buf *b, size_t more)
{
    if (b->failed)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void metrics_put(struct metrics_buf *b, const char *s, size_t n)
{
    if (!metrics_reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void metrics_printf(struct metrics_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void metrics_printf(struct metrics_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        metrics_put(b, small, (size_t)n);
        return;
    }
    if (!metrics_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Escapes for a label value (quote too) or a HELP text (quote stays). */
static void metrics_escaped(struct metrics_buf *b, const char *s, bool label)
{
    for (; s && *s; s++) {
        if (*s == '\\')
            metrics_put(b, "\\\\", 2);
        else if (*s == '\n')
            metrics_put(b, "\\n", 2);
        else if (*s == '"' && label)
            metrics_put(b, "\\\"", 2);
        else
            metrics_put(b, s, 1);
    }
}

static void metrics_family(struct metrics_buf *b, const char *name, const char *type, const char *help)
{
    metrics_printf(b, "# HELP %s ", name);
    metrics_escaped(b, help, false);
    metrics_printf(b, "\n# TYPE %s %s\n", name, type);
}

/* One label set, pairs of name and value, ended by a NULL name. */
static void metrics_labels(struct metrics_buf *b, const char *const *kv)
{
    if (!kv || !kv[0])
        return;
    metrics_put(b, "{", 1);
    for (size_t i = 0; kv[i]; i += 2) {
        metrics_printf(b, "%s%s=\"", i ? "," : "", kv[i]);
        metrics_escaped(b, kv[i + 1], true);
        metrics_put(b, "\"", 1);
    }
    metrics_put(b, "}", 1);
}

static void metrics_u64(struct metrics_buf *b, const char *name, const char *const *kv, uint64_t v)
{
    metrics_printf(b, "%s", name);
    metrics_labels(b, kv);
    metrics_printf(b, " %" PRIu64 "\n", v);
}

static void metrics_f64(struct metrics_buf *b, const char *name, const char *const *kv, double v)
{
    metrics_printf(b, "%s", name);
    metrics_labels(b, kv);
    metrics_printf(b, " %.9g\n", v);
}

/* A family with one unlabelled sample. */
static void metrics_one_u64(struct metrics_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    metrics_family(b, name, type, help);
    metrics_u64(b, name, NULL, v);
}

static void metrics_one_f64(struct metrics_buf *b, const char *name, const char *type, const char *help, double v)
{
    metrics_family(b, name, type, help);
    metrics_f64(b, name, NULL, v);
}

/* ---- per stream and per client ------------------------------------------------- */

enum metrics_field { MF_BATCHES, MF_SAMPLES, MF_BYTES, MF_WAIT };

static const struct {
    const char *suffix;
    const char *help;
} metrics_counters[] = {
    [MF_BATCHES] = {"batches_served_total", "Batches handed to the client."},
    [MF_SAMPLES] = {"samples_served_total", "Samples in the batches handed to the client."},
    [MF_BYTES] = {"bytes_served_total", "Payload bytes of the batches handed to the client."},
    [MF_WAIT] = {"wait_seconds_total", "Seconds the client waited for a batch that was not ready (stalls)."},
};

/* The labels of a stream's series: dataset, stream and client, and room for one more
 * pair (the slot state). kv points into the struct. */
struct metrics_stream_labels {
    char sid[24], cid[24];
    const char *kv[9];
};

static void metrics_stream_labels(struct metrics_stream_labels *l, const struct metrics_stream *st)
{
    snprintf(l->sid, sizeof l->sid, "%" PRIu64, st->id);
    snprintf(l->cid, sizeof l->cid, "%" PRIu64, st->client_id);
    const char *kv[] = {"dataset", st->dataset, "stream", l->sid, "client", l->cid, NULL, NULL, NULL};
    memcpy(l->kv, kv, sizeof kv);
}

static void metrics_streams(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    char name[96];
    for (int f = MF_BATCHES; f <= MF_WAIT; f++) {
        snprintf(name, sizeof name, "loaderd_stream_%s", metrics_counters[f].suffix);
        metrics_family(b, name, "counter", metrics_counters[f].help);
        for (size_t i = 0; i < s->n_streams; i++) {
            const struct metrics_stream *st = &s->stream[i];
            struct metrics_stream_labels l;
            metrics_stream_labels(&l, st);
            if (f == MF_WAIT)
                metrics_f64(b, name, l.kv, st->wait_s);
            else
                metrics_u64(b, name, l.kv, f == MF_BATCHES ? st->batches : f == MF_SAMPLES ? st->samples : st->bytes);
        }
    }
    metrics_family(b, "loaderd_stream_slots", "gauge", "Slots of the stream's ring by state.");
    for (size_t i = 0; i < s->n_streams; i++) {
        const struct metrics_stream *st = &s->stream[i];
        struct metrics_stream_labels l;
        metrics_stream_labels(&l, st);
        l.kv[6] = "state";
        for (int k = 0; k < RING_STATES; k++) {
            l.kv[7] = ring_state_name((enum ring_state)k);
            metrics_u64(b, "loaderd_stream_slots", l.kv, st->slots[k]);
        }
    }
}

/* The scheduling and data-stall series of a stream: one family each. */
enum metrics_stream_gauge { MG_CPU, MG_STALL, MG_RATE_NOW, MG_RATE, MG_DEPTH, MG_COUNT };

static const struct {
    const char *name, *type, *help;
} metrics_stream_gauges[MG_COUNT] = {
    [MG_CPU] = {"loaderd_stream_worker_cpu_seconds_total", "counter",
                "CPU seconds the workers spent preparing the stream's batches (0 for a shared stream's "
                "consumer: see loaderd_share_worker_cpu_seconds_total)."},
    [MG_STALL] = {"loaderd_stream_stall_ratio", "gauge",
                  "Fraction of the time since the trainer's first next spent waiting inside next (data stall)."},
    [MG_RATE_NOW] = {"loaderd_stream_samples_per_second", "gauge", "Samples delivered per second, the last seconds."},
    [MG_RATE] = {"loaderd_stream_samples_per_second_average", "gauge",
                 "Samples delivered per second since the trainer's first next."},
    [MG_DEPTH] = {"loaderd_stream_prefetch_depth", "gauge", "Batches being prepared or ready ahead of the trainer."},
};

static void metrics_stream_sched(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    for (int g = 0; g < MG_COUNT; g++) {
        const char *name = metrics_stream_gauges[g].name;
        metrics_family(b, name, metrics_stream_gauges[g].type, metrics_stream_gauges[g].help);
        for (size_t i = 0; i < s->n_streams; i++) {
            const struct metrics_stream *st = &s->stream[i];
            struct metrics_stream_labels l;
            metrics_stream_labels(&l, st);
            if (g == MG_DEPTH)
                metrics_u64(b, name, l.kv, st->prefetch_depth);
            else
                metrics_f64(b, name, l.kv, g == MG_CPU ? st->worker_cpu_s : g == MG_STALL ? st->stall
                                           : g == MG_RATE_NOW ? st->samples_per_s_now : st->samples_per_s);
        }
    }
}

static void metrics_clients(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    char name[96], cid[24];
    metrics_family(b, "loaderd_client_info", "gauge", "A connected client: its id and the name it gave in hello.");
    for (size_t i = 0; i < s->n_clients; i++) {
        snprintf(cid, sizeof cid, "%" PRIu64, s->client[i].id);
        const char *kv[] = {"client", cid, "client_name", s->client[i].name, NULL};
        metrics_u64(b, "loaderd_client_info", kv, 1);
    }
    metrics_family(b, "loaderd_client_streams", "gauge", "Streams the client has open.");
    for (size_t i = 0; i < s->n_clients; i++) {
        snprintf(cid, sizeof cid, "%" PRIu64, s->client[i].id);
        const char *kv[] = {"client", cid, NULL};
        metrics_u64(b, "loaderd_client_streams", kv, s->client[i].streams);
    }
    for (int f = MF_BATCHES; f <= MF_WAIT; f++) {
        snprintf(name, sizeof name, "loaderd_client_%s", metrics_counters[f].suffix);
        metrics_family(b, name, "counter", metrics_counters[f].help);
        for (size_t i = 0; i < s->n_clients; i++) {
            const struct metrics_client *c = &s->client[i];
            snprintf(cid, sizeof cid, "%" PRIu64, c->id);
            const char *kv[] = {"client", cid, NULL};
            if (f == MF_WAIT)
                metrics_f64(b, name, kv, c->wait_s);
            else
                metrics_u64(b, name, kv, f == MF_BATCHES ? c->batches : f == MF_SAMPLES ? c->samples : c->bytes);
        }
    }
}

static void metrics_clients_sched(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    char cid[24];
    metrics_family(b, "loaderd_client_worker_cpu_seconds_total", "counter",
                   "CPU seconds the workers spent on the client's streams, closed ones included (shared "
                   "streams' preparation is counted under loaderd_share_worker_cpu_seconds_total instead).");
    for (size_t i = 0; i < s->n_clients; i++) {
        snprintf(cid, sizeof cid, "%" PRIu64, s->client[i].id);
        const char *kv[] = {"client", cid, NULL};
        metrics_f64(b, "loaderd_client_worker_cpu_seconds_total", kv, s->client[i].worker_cpu_s);
    }
    metrics_family(b, "loaderd_client_stall_ratio", "gauge",
                   "Seconds the client's streams waited inside next per second connected (data stall).");
    for (size_t i = 0; i < s->n_clients; i++) {
        snprintf(cid, sizeof cid, "%" PRIu64, s->client[i].id);
        const char *kv[] = {"client", cid, NULL};
        const struct metrics_client *c = &s->client[i];
        metrics_f64(b, "loaderd_client_stall_ratio", kv, c->connected_s > 0 ? c->wait_s / c->connected_s : 0);
    }
    metrics_family(b, "loaderd_client_samples_per_second", "gauge",
                   "Samples delivered per second to the client's open streams, the last seconds.");
    for (size_t i = 0; i < s->n_clients; i++) {
        snprintf(cid, sizeof cid, "%" PRIu64, s->client[i].id);
        const char *kv[] = {"client", cid, NULL};
        metrics_f64(b, "loaderd_client_samples_per_second", kv, s->client[i].samples_per_s_now);
    }
}

/* A shared stream's batches are prepared once: their CPU time is the group's, one
 * series per group, so that summing streams, clients and shares counts it once. */
static void metrics_shares(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    char pid[24];
    metrics_family(b, "loaderd_share_consumers", "gauge", "Consumers attached to a shared stream.");
    for (size_t i = 0; i < s->n_shares; i++) {
        snprintf(pid, sizeof pid, "%" PRIu64, s->share[i].producer);
        const char *kv[] = {"share", s->share[i].name, "producer", pid, NULL};
        metrics_u64(b, "loaderd_share_consumers", kv, s->share[i].consumers);
    }
    metrics_family(b, "loaderd_share_worker_cpu_seconds_total", "counter",
                   "CPU seconds the workers spent preparing a shared stream's batches, once for all its "
                   "consumers (producer: the stream id that prepares them).");
    for (size_t i = 0; i < s->n_shares; i++) {
        snprintf(pid, sizeof pid, "%" PRIu64, s->share[i].producer);
        const char *kv[] = {"share", s->share[i].name, "producer", pid, NULL};
        metrics_f64(b, "loaderd_share_worker_cpu_seconds_total", kv, s->share[i].worker_cpu_s);
    }
}

static void metrics_datasets(struct metrics_buf *b, const struct metrics_snapshot *s)
{
    metrics_family(b, "loaderd_dataset_available", "gauge",
                   "1 for a configured dataset that is served, 0 for one that could not be opened (its path "
                   "is missing or unreadable: `loaderctl datasets` says why; each reload tries it again).");
    for (size_t i = 0; i < s->n_datasets; i++) {
        const char *kv[] = {"dataset", s->dataset[i].name, NULL};
        metrics_u64(b, "loaderd_dataset_available", kv, 1);
    }
    for (size_t i = 0; i < s->n_unavailable; i++) {
        const char *kv[] = {"dataset", s->unavailable[i], NULL};
        metrics_u64(b, "loaderd_dataset_available", kv, 0);
    }
    metrics_family(b, "loaderd_bad_samples_total", "counter",
                   "Samples that could not be read or prepared (unreadable, corrupt).");
    for (size_t i = 0; i < s->n_datasets; i++) {
        const char *kv[] = {"dataset", s->dataset[i].name, NULL};
        metrics_u64(b, "loaderd_bad_samples_total", kv, s->dataset[i].bad_samples);
    }
    metrics_family(b, "loaderd_replaced_samples_total", "counter",
                   "Bad samples replaced by another sample of the dataset (on_error: replace).");
    for (size_t i = 0; i < s->n_datasets; i++) {
        const char *kv[] = {"dataset", s->dataset[i].name, NULL};
        metrics_u64(b, "loaderd_replaced_samples_total", kv, s->dataset[i].replaced_samples);
    }
    metrics_family(b, "loaderd_cache_state", "gauge",
                   "The dataset cache's state (the series with value 1): absent, checking, building, "
                   "ready, stale, failed or off.");
    for (size_t i = 0; i < s->n_datasets; i++) {
        if (!s->dataset[i].cache_state)
            continue;
        const char *kv[] = {"dataset", s->dataset[i].name, "state", s->dataset[i].cache_state, NULL};
        metrics_u64(b, "loaderd_cache_state", kv, 1);
    }
    metrics_family(b, "loaderd_cache_samples_total", "counter", "Samples read from the dataset's cache file.");
    for (size_t i = 0; i < s->n_datasets; i++) {
        if (!s->dataset[i].cache_state)
            continue;
        const char *kv[] = {"dataset", s->dataset[i].name, NULL};
        metrics_u64(b, "loaderd_cache_samples_total", kv, s->dataset[i].cache_samples);
    }
    metrics_family(b, "loaderd_cache_bytes_total", "counter", "Bytes read from the dataset's cache file.");
    for (size_t i = 0; i < s->n_datasets; i++) {
        if (!s->dataset[i].cache_state)
            continue;
        const char *kv[] = {"dataset", s->dataset[i].name, NULL};
        metrics_u64(b, "loaderd_cache_bytes_total", kv, s->dataset[i].cache_bytes);
    }
}

int metrics_format(const struct metrics_snapshot *s, char **ret_text, size_t *ret_len)
{
    struct metrics_buf b = {0};
    metrics_family(&b, "loaderd_build_info", "gauge", "The daemon's version, as a label.");
    const char *kv[] = {"version", s->version ? s->version : "", NULL};
    metrics_u64(&b, "loaderd_build_info", kv, 1);
    metrics_one_f64(&b, "loaderd_uptime_seconds", "gauge", "Seconds since the daemon started.", s->uptime_s);
    metrics_one_u64(&b, "loaderd_clients", "gauge", "Clients connected.", s->clients);
    metrics_one_u64(&b, "loaderd_streams", "gauge", "Streams open.", s->streams);
    metrics_one_u64(&b, "loaderd_workers", "gauge", "Worker threads.", s->workers);
    metrics_one_u64(&b, "loaderd_batches_served_total", "counter", "Batches handed to clients.", s->batches);
    metrics_one_u64(&b, "loaderd_samples_served_total", "counter", "Samples in the batches handed to clients.",
                    s->samples);
    metrics_one_u64(&b, "loaderd_bytes_served_total", "counter", "Payload bytes of the batches handed to clients.",
                    s->bytes);
    metrics_one_f64(&b, "loaderd_wait_seconds_total", "counter",
                    "Seconds clients waited for batches that were not ready, all streams together.", s->wait_s);
    metrics_one_f64(&b, "loaderd_worker_busy_seconds_total", "counter",
                    "Seconds worker threads spent preparing samples, all workers together.", s->worker_busy_s);
    metrics_one_u64(&b, "loaderd_memory_budget_bytes", "gauge", "The shared-memory budget for stream rings.",
                    s->memory_budget);
    metrics_one_u64(&b, "loaderd_memory_used_bytes", "gauge", "Bytes of the budget held by open streams' rings.",
                    s->memory_used);
    metrics_one_u64(&b, "loaderd_queued_reply_bytes", "gauge", "Reply bytes queued for clients, not yet read.",
                    s->queued_reply_bytes);
    metrics_family(&b, "loaderd_slots", "gauge", "Ring slots of all open streams by state.");
    for (int k = 0; k < RING_STATES; k++) {
        const char *skv[] = {"state", ring_state_name((enum ring_state)k), NULL};
        metrics_u64(&b, "loaderd_slots", skv, s->slots[k]);
    }
    if (s->have_process) {
        metrics_one_u64(&b, "loaderd_process_resident_memory_bytes", "gauge", "The daemon's resident set size.",
                        s->rss_bytes);
        metrics_one_f64(&b, "loaderd_process_cpu_seconds_total", "counter",
                        "User and system CPU seconds of the daemon, all threads.", s->cpu_s);
    }
    metrics_datasets(&b, s);
    metrics_streams(&b, s);
    metrics_stream_sched(&b, s);
    metrics_clients(&b, s);
    metrics_clients_sched(&b, s);
    metrics_shares(&b, s);
    if (b.failed || !b.p) {
        free(b.p);
        return LD_ENOMEM;
    }
    *ret_text = b.p;
    *ret_len = b.len;
    return 0;
}

/* ---- /proc/self/stat ------------------------------------------------------------ */

int metrics_parse_proc_stat(const char *text, long page_size, long ticks_per_s, uint64_t *ret_rss,
                            double *ret_cpu_s)
{
    /* The command name (field 2) is in parentheses and may itself hold spaces and
     * parentheses: the fields we want are counted from the last ')'. */
    const char *p = text ? strrchr(text, ')') : NULL;
    if (!p || page_size <= 0 || ticks_per_s <= 0)
        return LD_EINVAL;
    p++;
    unsigned long long utime = 0, stime = 0, rss = 0;
    /* After ')': state is field 3; utime 14, stime 15, rss 24. */
    for (int field = 3; field <= 24; field++) {
        while (*p == ' ')
            p++;
        if (!*p || *p == '\n')
            return LD_EINVAL;
        const char *start = p;
        while (*p && *p != ' ' && *p != '\n')
            p++;
        if (field == 14 || field == 15 || field == 24) {
            char *end;
            unsigned long long v = strtoull(start, &end, 10);
            if (end != p)
                return LD_EINVAL;
            if (field == 14)
                utime = v;
            else if (field == 15)
                stime = v;
            else
                rss = v;
        }
    }
    *ret_rss = (uint64_t)rss * (uint64_t)page_size;
    *ret_cpu_s = (double)(utime + stime) / (double)ticks_per_s;
    return 0;
}

int metrics_read_self(uint64_t *ret_rss, double *ret_cpu_s)
{
    char text[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return ld_from_errno(errno);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return metrics_parse_proc_stat(text, sysconf(_SC_PAGESIZE), sysconf(_SC_CLK_TCK), ret_rss, ret_cpu_s);
}
