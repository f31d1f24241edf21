/* metrics — loaderd's counters as a Prometheus text exposition (format 0.0.4).
 *
 * The server fills a struct metrics_snapshot on the loop thread (from the same numbers
 * `status` and `streams` show) and metrics_format() writes it as text; nothing here
 * touches a socket, so the format is tested alone. The text is served by the `metrics`
 * op (`loaderctl metrics`) and by the optional HTTP listener (metrics_http.h).
 *
 * Every name starts with `loaderd_`; counters end in `_total`; values are in base units
 * (seconds, bytes). Labels: dataset, stream (the stream id), client (the connection
 * id; loaderd_client_info maps it to the name the client gave in hello), state. */
#ifndef LD_METRICS_H
#define LD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring.h"

/* What an HTTP reply and the `metrics` op say the text is. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics_stream {
    uint64_t id;
    const char *dataset;
    uint64_t client_id;
    uint64_t batches, samples, bytes;
    double wait_s;                            /* the client waited for a batch */
    uint32_t slots[RING_STATES];              /* by enum ring_state */
    double worker_cpu_s;                      /* workers' CPU time on its batches */
    double stall;                             /* wait_s over the time since its first next */
    double samples_per_s_now, samples_per_s;  /* the last seconds; since its first next */
    uint32_t prefetch_depth;                  /* batches FILLING or READY */
};

struct metrics_client {
    uint64_t id;
    const char *name;                         /* from hello; may be empty */
    uint32_t streams;
    uint64_t batches, samples, bytes;         /* over the connection's life */
    double wait_s;                            /* its streams' wait, closed ones included */
    double worker_cpu_s;                      /* the same for the workers' CPU time */
    double connected_s;
    double samples_per_s_now;                 /* its open streams' together */
};

/* A shared stream's group: its batches are prepared once for all its consumers, so
 * their workers' CPU time is the group's, here, and not any consumer's or client's. */
struct metrics_share {
    const char *name;
    uint64_t producer;                        /* the producer's stream id */
    uint32_t consumers;
    double worker_cpu_s;
};

struct metrics_dataset {
    const char *name;
    uint64_t bad_samples, replaced_samples;
    const char *cache_state;                  /* NULL: no cache configured */
    uint64_t cache_samples, cache_bytes;      /* served from the cache file */
};

struct metrics_snapshot {
    const char *version;
    double uptime_s;
    uint32_t clients, streams, workers;
    uint64_t batches, samples, bytes;
    double wait_s, worker_busy_s;
    uint64_t memory_budget, memory_used, queued_reply_bytes;
    uint32_t slots[RING_STATES];
    bool have_process;                        /* rss_bytes and cpu_s were read */
    uint64_t rss_bytes;
    double cpu_s;
    const struct metrics_stream *stream;
    size_t n_streams;
    const struct metrics_client *client;
    size_t n_clients;
    const struct metrics_share *share;
    size_t n_shares;
    const struct metrics_dataset *dataset;
    size_t n_datasets;
    const char *const *unavailable;           /* configured datasets that could not be opened */
    size_t n_unavailable;
};

/* The exposition of s into a malloc'ed NUL-terminated text (*ret_len bytes without
 * the NUL). LD_ENOMEM; nothing is returned then. */
int metrics_format(const struct metrics_snapshot *s, char **ret_text, size_t *ret_len);

/* Parses the text of /proc/PID/stat: resident set in bytes and user+system CPU
 * seconds, given the page size and clock ticks per second. LD_EINVAL when the text
 * does not have the fields. */
int metrics_parse_proc_stat(const char *text, long page_size, long ticks_per_s, uint64_t *ret_rss,
                            double *ret_cpu_s);
/* The same for this process, from /proc/self/stat; a negative code when it cannot be
 * read (not Linux, no /proc). */
int metrics_read_self(uint64_t *ret_rss, double *ret_cpu_s);

#endif
