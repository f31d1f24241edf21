/* server_metrics — the Prometheus text of the daemon's counters, for the `metrics`
 * request and the server.metrics.listen endpoint (metrics_http.c) alike.
 *
 * It gathers a metrics_snapshot (metrics.h) from the server, its connections and their
 * streams, and the datasets' caches; metrics_format writes the text. Per-stream and
 * cache values are read from the same describe() objects that `streams` and `status`
 * show, so the three always agree. */
#include "server_internal.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "cache_report.h"
#include "metrics.h"
#include "ring.h"

/* A number from a describe() object (stream or cache keeper); 0 when absent. */
static double server_json_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The group of a shared stream's consumer (its `streams` entry's share object), added
 * to sh[] unless another consumer of the group added it already. */
static void server_metrics_share(const cJSON *js, struct metrics_share *sh, size_t *n)
{
    if (!js)
        return;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    uint64_t producer = (uint64_t)server_json_num(js, "producer");
    for (size_t i = 0; i < *n; i++)
        if (sh[i].producer == producer)
            return;
    sh[(*n)++] = (struct metrics_share){
        .name = cJSON_IsString(name) ? name->valuestring : "", .producer = producer,
        .consumers = (uint32_t)server_json_num(js, "consumers"), .worker_cpu_s = server_json_num(js, "worker_cpu_s"),
    };
}

int server_metrics_text(server *srv, char **ret_text, size_t *ret_len)
{
    struct metrics_snapshot m = {0};
    struct metrics_stream *st = calloc(srv->n_streams ? srv->n_streams : 1, sizeof *st);
    struct metrics_client *cl = calloc(srv->n_conns ? srv->n_conns : 1, sizeof *cl);
    struct metrics_dataset *ds = calloc(srv->n_datasets ? srv->n_datasets : 1, sizeof *ds);
    const char **unavailable = calloc(srv->n_unavailable ? srv->n_unavailable : 1, sizeof *unavailable);
    /* At most one group per consumer stream. */
    struct metrics_share *sh = calloc(srv->n_streams ? srv->n_streams : 1, sizeof *sh);
    cJSON *held = cJSON_CreateArray(); /* keeps the describe() objects whose strings we point at */
    int rc = LD_ENOMEM;
    if (!st || !cl || !ds || !unavailable || !sh || !held)
        goto out;
    server_ops_settle(srv);
    m.version = LD_VERSION;
    m.uptime_s = (double)(uv_hrtime() - srv->started_ns) / 1e9;
    m.clients = srv->n_conns;
    m.streams = srv->n_streams;
    m.workers = pool_threads(srv->workers);
    m.batches = srv->batches_served;
    m.samples = srv->samples_served;
    m.bytes = srv->bytes_served;
    m.worker_busy_s = (double)pool_busy_ns(srv->workers) / 1e9;
    m.memory_budget = srv->cfg->memory_budget;
    m.memory_used = srv->memory_used;
    m.queued_reply_bytes = srv->queued_bytes;
    m.have_process = metrics_read_self(&m.rss_bytes, &m.cpu_s) == 0;
    uint64_t wait = srv->closed_wait_ns;
    for (conn *k = srv->conns; k && m.n_clients < srv->n_conns; k = k->next) {
        struct metrics_client *mc = &cl[m.n_clients++];
        uint64_t cwait = k->closed_wait_ns;
        mc->id = k->id;
        mc->name = k->name;
        mc->batches = k->batches_served;
        mc->samples = k->samples_served;
        mc->bytes = k->bytes_served;
        mc->worker_cpu_s = k->closed_cpu_s;
        mc->connected_s = (double)(uv_hrtime() - k->connected_ns) / 1e9;
        for (struct conn_stream *cs = k->streams; cs && m.n_streams < srv->n_streams; cs = cs->next) {
            cJSON *js = cJSON_CreateObject();
            if (!js)
                goto out;
            cJSON_AddItemToArray(held, js);
            stream_describe_state(cs->s, js);
            struct metrics_stream *ms = &st[m.n_streams++];
            const cJSON *dn = cJSON_GetObjectItemCaseSensitive(js, "dataset");
            ms->id = cs->id;
            ms->dataset = cJSON_IsString(dn) ? dn->valuestring : "";
            ms->client_id = k->id;
            ms->batches = (uint64_t)server_json_num(js, "batches_served");
            ms->samples = (uint64_t)server_json_num(js, "samples_served");
            ms->bytes = (uint64_t)server_json_num(js, "bytes_served");
            ms->wait_s = (double)stream_wait_ns(cs->s) / 1e9;
            struct stream_stats sst;
            stream_get_stats(cs->s, &sst);
            ms->worker_cpu_s = sst.worker_cpu_s;
            ms->stall = sst.stall;
            ms->samples_per_s_now = sst.samples_per_s_now;
            ms->samples_per_s = sst.samples_per_s;
            ms->prefetch_depth = sst.prefetch_depth;
            mc->worker_cpu_s += sst.worker_cpu_s; /* a consumer's is its group's: counted below, once */
            server_metrics_share(cJSON_GetObjectItemCaseSensitive(js, "share"), sh, &m.n_shares);
            mc->samples_per_s_now += sst.samples_per_s_now;
            for (int state = 0; state < RING_STATES; state++) {
                ms->slots[state] = ring_count(stream_ring(cs->s), (enum ring_state)state);
                m.slots[state] += ms->slots[state];
            }
            mc->streams++;
            cwait += stream_wait_ns(cs->s);
        }
        mc->wait_s = (double)cwait / 1e9;
        wait += cwait - k->closed_wait_ns;
    }
    m.wait_s = (double)wait / 1e9;
    for (size_t i = 0; i < srv->n_datasets; i++) {
        ds[i].name = srv->datasets[i]->name;
        ds[i].bad_samples = atomic_load(&srv->datasets[i]->bad_samples);
        ds[i].replaced_samples = atomic_load(&srv->datasets[i]->replaced_samples);
        if (srv->keepers[i]) {
            cJSON *jc = cJSON_CreateObject();
            if (!jc)
                goto out;
            cJSON_AddItemToArray(held, jc);
            cache_report_keeper(srv->keepers[i], jc);
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(jc, "state");
            ds[i].cache_state = cJSON_IsString(state) ? state->valuestring : "unknown";
            ds[i].cache_samples = (uint64_t)server_json_num(jc, "hits");
            ds[i].cache_bytes = (uint64_t)server_json_num(jc, "hit_bytes");
        }
    }
    m.n_datasets = srv->n_datasets;
    for (size_t i = 0; i < srv->n_unavailable; i++)
        unavailable[i] = srv->unavailable[i].name;
    m.unavailable = unavailable;
    m.n_unavailable = srv->n_unavailable;
    m.stream = st;
    m.client = cl;
    m.dataset = ds;
    m.share = sh;
    rc = metrics_format(&m, ret_text, ret_len);
out:
    cJSON_Delete(held);
    free(st);
    free(cl);
    free(ds);
    free(unavailable);
    free(sh);
    return rc;
}

int server_metrics_render(void *ctx, char **ret_text, size_t *ret_len)
{
    return server_metrics_text(ctx, ret_text, ret_len);
}
