/* stream_report — what a stream shows of itself: the layout in the `open` reply (the
 * client maps the ring with it), the `streams` entry, and the statistics behind
 * `loaderctl top` and the metrics (what the trainer got and how long it waited, over
 * its whole life and over the last window). Loop thread, like the rest of the stream; on
 * a stream whose batches go the direct path (stream_direct.c) under the stream's lock.
 */
#include "stream_internal.h"

#include <cJSON.h>

#include "ring.h"

static const char *stream_state_name(const stream *s)
{
    if (s->closing || s->src->closing)
        return "closing";
    if (s->next_deliver >= s->failed_seq)
        return s->fail_rc == LD_EDETACHED ? "detached" : "failed";
    if (s->next_deliver >= s->src->failed_seq)
        return "failed";
    if (s->next_deliver >= s->total_seq)
        return "ended";
    return "running";
}

void stream_describe_layout(const stream *s, cJSON *o)
{
    cJSON_AddNumberToObject(o, "stream", (double)s->id);
    cJSON_AddStringToObject(o, "shm", ring_name(s->ring));
    cJSON_AddNumberToObject(o, "shm_size", (double)ring_total_size(s->ring));
    cJSON_AddNumberToObject(o, "slot_count", ring_slot_count(s->ring));
    cJSON_AddNumberToObject(o, "slot_size", (double)ring_slot_size(s->ring));
    cJSON_AddNumberToObject(o, "slot_offset", (double)ring_slot_offset(s->ring));
    cJSON_AddNumberToObject(o, "batch_size", s->p.batch_size);
    cJSON_AddNumberToObject(o, "batches_per_epoch", (double)sampler_batches(&s->smp));
    cJSON_AddNumberToObject(o, "samples_per_epoch", (double)sampler_samples(&s->smp));
    cJSON *fields = cJSON_AddArrayToObject(o, "fields");
    for (int f = 0; f < s->ds->n_fields; f++) {
        const struct dataset_field *df = &s->ds->fields[f];
        cJSON *jf = cJSON_CreateObject();
        cJSON_AddStringToObject(jf, "name", df->name);
        cJSON_AddStringToObject(jf, "dtype", proto_dtype_name(df->dtype));
        cJSON *shape = cJSON_AddArrayToObject(jf, "shape");
        for (int i = 0; i < df->ndim; i++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)df->shape[i]));
        cJSON_AddBoolToObject(jf, "ragged", df->ragged);
        cJSON_AddNumberToObject(jf, "offset", (double)s->layout[f].offset);
        if (df->ragged) {
            cJSON_AddNumberToObject(jf, "offsets_offset", (double)s->layout[f].offsets_offset);
            cJSON_AddNumberToObject(jf, "capacity", (double)s->layout[f].capacity);
        } else {
            cJSON_AddNumberToObject(jf, "row_bytes", (double)s->layout[f].row_bytes);
        }
        cJSON_AddItemToArray(fields, jf);
    }
    device_describe(s->dev, &s->p.device, o);
}

void stream_describe_state(const stream *s, cJSON *o)
{
    bool locked = stream_lock((stream *)s); /* counters a worker moves on the direct path */
    uint64_t bpe = sampler_batches(&s->smp);
    uint64_t pos = s->p.start_batch + s->next_deliver;
    cJSON_AddNumberToObject(o, "id", (double)s->id);
    cJSON_AddStringToObject(o, "dataset", s->ds->name);
    cJSON_AddStringToObject(o, "state", stream_state_name(s));
    cJSON_AddNumberToObject(o, "batch_size", s->p.batch_size);
    cJSON_AddNumberToObject(o, "epoch", (double)(s->p.epoch + pos / bpe));
    cJSON_AddNumberToObject(o, "batch", (double)(pos % bpe));
    cJSON_AddNumberToObject(o, "batches_per_epoch", (double)bpe);
    cJSON_AddNumberToObject(o, "rank", s->p.rank);
    cJSON_AddNumberToObject(o, "world_size", s->p.world_size);
    cJSON_AddNumberToObject(o, "prefetch", stream_prefetch_target(s));
    cJSON_AddBoolToObject(o, "prefetch_auto", s->prefetch_auto);
    if (s->prefetch_auto)
        cJSON_AddNumberToObject(o, "prefetch_max", s->p.prefetch);
    cJSON_AddNumberToObject(o, "slots", s->n_slots);
    for (int st = 0; st < RING_STATES; st++)
        cJSON_AddNumberToObject(o, ring_state_name((enum ring_state)st), ring_count(s->ring, (enum ring_state)st));
    cJSON_AddNumberToObject(o, "batches_served", (double)s->batches_served);
    cJSON_AddNumberToObject(o, "samples_served", (double)s->samples_served);
    cJSON_AddNumberToObject(o, "bytes_served", (double)s->bytes_served);
    struct stream_stats st;
    stream_get_stats(s, &st);
    cJSON_AddNumberToObject(o, "client_wait_s", st.wait_s);
    cJSON_AddNumberToObject(o, "active_s", st.active_s);
    cJSON_AddNumberToObject(o, "stall", st.stall);
    cJSON_AddNumberToObject(o, "stall_now", st.stall_now);
    cJSON_AddNumberToObject(o, "samples_per_s", st.samples_per_s);
    cJSON_AddNumberToObject(o, "samples_per_s_now", st.samples_per_s_now);
    cJSON_AddNumberToObject(o, "worker_cpu_s", st.worker_cpu_s);
    cJSON_AddNumberToObject(o, "prefetch_depth", st.prefetch_depth);
    cJSON_AddNumberToObject(o, "weight", s->weight);
    if (s->member) {
        share_describe(s->member, o);
        /* The group's CPU time, the same for every consumer: counted once per group. */
        cJSON_AddNumberToObject(cJSON_GetObjectItemCaseSensitive(o, "share"), "worker_cpu_s", st.shared_cpu_s);
    }
    device_stats(s->dev, o);
    stream_unlock((stream *)s, locked);
}

void stream_get_stats(const stream *s, struct stream_stats *ret)
{
    bool locked = stream_lock((stream *)s);
    uint64_t now = stream_now_ns(), wait = stream_wait_ns(s);
    uint64_t active = s->first_next_ns ? now - s->first_next_ns : 0;
    struct scheduler_flow_stats fs;
    pool_flow_get_stats(s->workers, s->flow, &fs);
    *ret = (struct stream_stats){
        .batches = s->batches_served, .samples = s->samples_served, .bytes = s->bytes_served,
        .active_s = (double)active / 1e9, .wait_s = (double)wait / 1e9,
        .worker_cpu_s = s->member ? 0 : (double)fs.cpu_ns / 1e9,
        .shared_cpu_s = s->member ? (double)fs.cpu_ns / 1e9 : 0,
        .prefetch_depth = ring_count(s->ring, RING_FILLING) + ring_count(s->ring, RING_COPYING) +
                          ring_count(s->ring, RING_READY) + s->handed_ahead,
    };
    if (active) {
        ret->stall = (double)wait / (double)active;
        ret->samples_per_s = (double)s->samples_served * 1e9 / (double)active;
    }
    /* Now: the current window once it is long enough (a trainer that stopped asking
     * decays towards 0), else the previous one, else everything so far. */
    struct stats_mark w = s->last;
    if (s->mark.ns && (now - s->mark.ns >= STREAM_STATS_WINDOW_NS || !w.ns))
        w = (struct stats_mark){now - s->mark.ns, s->samples_served - s->mark.samples, wait - s->mark.wait_ns};
    if (w.ns) {
        ret->stall_now = (double)w.wait_ns / (double)w.ns;
        ret->samples_per_s_now = (double)w.samples * 1e9 / (double)w.ns;
    }
    if (ret->stall > 1)
        ret->stall = 1; /* rounding: a wait is one interval, never longer than the time */
    if (ret->stall_now > 1)
        ret->stall_now = 1;
    stream_unlock((stream *)s, locked);
}

const dataset *stream_dataset(const stream *s)
{
    return s->ds;
}

uint64_t stream_ring_bytes(const stream *s)
{
    return ring_total_size(s->ring);
}

const ring *stream_ring(const stream *s)
{
    return s->ring;
}

uint64_t stream_wait_ns(const stream *s)
{
    bool locked = stream_lock((stream *)s);
    uint64_t ns = s->wait_ns + (s->w_count && s->wait_start_ns ? stream_now_ns() - s->wait_start_ns : 0);
    stream_unlock((stream *)s, locked);
    return ns;
}
