/* stream — the flow of a batch, from "a slot is free" to "the trainer holds it".
 *
 *   schedule()     loop thread: while fewer than `prefetch` batches are FILLING or
 *                  READY, take a FREE slot, number it with the next sequence, write its
 *                  header (and, for ragged fields, the offsets) and cut its rows into
 *                  chunks for the pool.
 *   chunk_run()    worker thread: for each row, ask the sampler which sample it is and
 *                  let the dataset write that sample straight into its place in the
 *                  slot. The last chunk of a slot to finish hands the slot to the hub.
 *   slot_filled()  loop thread (woken by the hub): the slot becomes READY, or the
 *                  stream records the failure at that sequence number.
 *   start_copy()   loop thread: the filled slot goes through the stream's device stage
 *                  (device.h): COPYING while a copy to the GPU runs, reported through
 *                  the hub (slot_copied); the host stage completes at once.
 *   deliver()      loop thread (from a hub completion, or returned by stream_next;
 *                  stream_deliver.c): the slot holding the next sequence is leased to
 *                  the `next` request.
 *
 * Nothing but sample bytes is touched by workers; every state change happens on the
 * loop thread, so the ring needs no lock — except on the direct path.
 *
 * The direct path (stream_direct.c). A stream whose batches go to a started hand-off in
 * shared memory (handoff.h), filled on the host and not shared, runs the steps above
 * from slot_filled to deliver on the worker that finishes the slot, under the stream's
 * lock, and refills from there (schedule and start_fill, the batch's cache reference and
 * read-ahead included); the loop only comes by for what is not the steady state. While
 * it is on, every call here takes that lock (stream_lock), so the flow is the same
 * whichever thread runs it.
 *
 * The dataset's cache. A stream gets a ticket from the dataset's cache keeper when it
 * opens, and each batch asks the keeper, when it is cut into chunks, which cache it
 * may read with that ticket: none until a check started after the stream opened has
 * proven the cache matches the source (so a stream opened after a change never reads a
 * byte of the old cache), and a reference that the batch holds until its last chunk is
 * back (so a replaced cache is unmapped only once no worker can read it). On the direct
 * path a worker takes and gives back those references itself; a cache found bad and
 * the last reference to a replaced one stay the loop's (cache_keeper.h). A closing
 * stream cancels its queued chunks and is freed when the chunks already running have
 * come back.
 *
 * Nothing here calls back inside the call that caused it: stream_next returns an
 * answer that is known at once and calls back only for one that is not, from
 * slot_filled(), the stalled-read scan or stream_end's completion, which are hub
 * completions run by the loop; stream_close calls nobody.
 */
#include "stream_internal.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_keeper.h"
#include "dataset_watch.h"
#include "hub.h"
#include "ld_format.h"
#include "log.h"
#include "prefetch.h"
#include "sampler.h"

/* A batch is cut into chunks so that several workers can fill it at once (first-batch
 * latency, big batches); each chunk costs a hand-off to a worker and back, so a chunk
 * carries at least this much work: bytes written plus the dataset's per-sample
 * overhead (system calls) counted in bytes. */
#define CHUNK_MIN_BYTES (256u * 1024u)
/* Slots beyond `prefetch`: the batch the trainer holds and the two that libloaderclient
 * asks for ahead while it holds one, so that asking ahead never eats into prefetch. */
#define SLOTS_BEYOND_PREFETCH 3u
/* A batch whose ragged layout went stale (a sample was found bad while it filled, and
 * its substitute has another length) is laid out and filled again; each time one more
 * sample is known bad, so this bound is only reached by a source going bad wholesale. */
#define MAX_RELAYOUTS 1000u
/* A chunk also carries at most about this much worker time (the flow's measured cost
 * per row), so that a heavy stream's chunk never holds a worker for long: another
 * stream's batch waits for a free worker at most about that long. */
#define CHUNK_MAX_NS (2u * 1000u * 1000u)
#define MAX_TIMED_CHUNKS 64u
/* A chunk computes its rows' sample indices this many at a time (sampler_indices: the
 * more side by side, the cheaper each), once each; one reading a mapping prefetches them
 * CHUNK_PREFETCH_ROWS at a time (cache_prefetch for a cache, the kind's prefetch op for
 * a packed file or a token corpus): their data (and a cache's index entries) lie
 * scattered over the file, and each read would otherwise wait for memory on its own.
 * Groups of 8 measured the same as 16, and so did prefetching a group ahead (the next 8
 * rows while the current 8 are copied). */
#define CHUNK_INDEX_ROWS 64u
#define CHUNK_PREFETCH_ROWS 16u

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* ---- the set ------------------------------------------------------------------- */

static void slot_filled(stream *s, uint32_t slot);
static void slot_copied(stream *s, uint32_t slot, int rc);

static void chunk_done(struct hub_completion *c)
{
    struct stream_task *k = (struct stream_task *)((char *)c - offsetof(struct stream_task, done));
    stream *s = k->s;
    /* Closing turns the direct path off first: a stream that slot_filled may free is
     * never locked here. */
    bool locked = stream_lock(s);
    slot_filled(s, k->slot);
    stream_unlock(s, locked);
}

/* A dataset's read stalled: streams waiting on it get their answer now. */
static void set_stalled(struct hub_completion *c)
{
    stream_set *set = (stream_set *)((char *)c - offsetof(stream_set, stalled));
    for (stream *s = set->streams, *next; s; s = next) {
        next = s->set_next;
        if ((s->w_count || s->group) && atomic_load_explicit(&s->ds->stalled_reads, memory_order_relaxed))
            stream_deliver(s);
    }
}

/* Watcher thread (dataset_deadline.c). */
static void set_notify_stalled(void *ctx)
{
    stream_set *set = ctx;
    hub_post(set->hub, &set->stalled);
}

int stream_set_new(hub *h, pool *workers, stream_set **ret_set)
{
    stream_set *set = calloc(1, sizeof *set);
    if (!set)
        return LD_ENOMEM;
    set->hub = h;
    set->workers = workers;
    set->stalled.done = set_stalled;
    dataset_deadline_notify(set_notify_stalled, set);
    *ret_set = set;
    return 0;
}

void stream_set_free(stream_set *set)
{
    if (!set)
        return;
    dataset_deadline_notify(NULL, NULL); /* no more posts of set->stalled once it returns */
    hub_cancel(set->hub, &set->stalled);
    free(set);
}

uint32_t stream_set_live(const stream_set *set)
{
    return set->live;
}

/* The device stage's thread: a copy ended. The slot is busy until the loop sees it. */
static void stream_copied(void *ctx, uint32_t slot, int rc)
{
    stream *s = ctx;
    atomic_store(&s->slots[slot].copy_rc, rc);
    hub_post(s->set->hub, &s->slots[slot].copy_done);
}

/* The loop thread, from the hub: a device copy ended. */
static void slot_copy_done(struct hub_completion *c)
{
    struct stream_slot *sl = (struct stream_slot *)((char *)c - offsetof(struct stream_slot, copy_done));
    slot_copied(sl->copy_stream, sl->copy_slot, atomic_load(&sl->copy_rc));
}
/* ---- workers --------------------------------------------------------------------- */

static void chunk_run(struct pool_task *t)
{
    struct stream_task *k = (struct stream_task *)t;
    stream *s = k->s;
    struct stream_slot *sl = &s->slots[k->slot];
    uint8_t *base = ring_slot(s->ring, k->slot);
    const dataset *d = s->ds;
    void *dst[LD_MAX_FIELDS];
    uint64_t lens[LD_MAX_FIELDS] = {0};
    char err[LD_ERRMSG_MAX];
    struct cache_tally hits = {0, 0};
    const struct dataset_read_ctx rctx = {.seed = s->p.seed, .epoch = sl->epoch, .cache = sl->cache, .tally = &hits};
    /* A kind that fetches in blocks (a database server) learns the chunk's samples. */
    uint64_t *run = d->ops->run_begin && !sl->cache ? malloc((k->row_end - k->row_begin) * sizeof *run) : NULL;
    if (run) {
        sampler_indices(&s->smp, sl->epoch, sl->batch, k->row_begin, k->row_end - k->row_begin, run);
        d->ops->run_begin(d, run, k->row_end - k->row_begin);
    }

    uint64_t ahead[CHUNK_INDEX_ROWS];
    const uint64_t *idxs = ahead;
    uint32_t ahead_from = k->row_begin, ahead_n = 0;
    for (uint32_t row = k->row_begin; row < k->row_end; row++) {
        if (atomic_load_explicit(&sl->err, memory_order_relaxed))
            break; /* another chunk failed: the batch will not be delivered */
        if (row == ahead_from + ahead_n) {
            ahead_from = row;
            ahead_n = k->row_end - row < CHUNK_INDEX_ROWS ? k->row_end - row : CHUNK_INDEX_ROWS;
            if (run)
                idxs = run + (row - k->row_begin);
            else
                sampler_indices(&s->smp, sl->epoch, sl->batch, row, ahead_n, ahead);
        }
        uint32_t at = row - ahead_from;
        if (at % CHUNK_PREFETCH_ROWS == 0) {
            uint32_t pn = ahead_n - at < CHUNK_PREFETCH_ROWS ? ahead_n - at : CHUNK_PREFETCH_ROWS;
            if (sl->cache)
                cache_prefetch(sl->cache, idxs + at, pn);
            else if (d->ops->prefetch)
                d->ops->prefetch(d, idxs + at, pn);
        }
        uint64_t idx = idxs[at];
        for (int f = 0; f < d->n_fields; f++) {
            const struct field_layout *l = &s->layout[f];
            if (d->fields[f].ragged) {
                const int64_t *offs = (const int64_t *)(base + l->offsets_offset);
                dst[f] = base + l->offset + (uint64_t)offs[row];
                lens[f] = (uint64_t)(offs[row + 1] - offs[row]);
            } else {
                dst[f] = base + l->offset + (uint64_t)row * l->row_bytes;
            }
        }
        int rc = dataset_read(d, idx, &rctx, dst, lens, err);
        if (rc < 0) {
            int expected = 0;
            if (atomic_compare_exchange_strong(&sl->err, &expected, rc))
                snprintf(sl->errmsg, sizeof sl->errmsg, "%s", err);
            break;
        }
    }
    if (run) {
        d->ops->run_end(d);
        free(run);
    }
    if (sl->cache)
        cache_count_tally(sl->cache, &hits); /* while the batch still holds the cache */
    /* The slot is busy until it is handed on, so s lives until then; after that the
     * stream may be closed and freed at any time: s is not touched again. */
    if (atomic_fetch_sub(&sl->chunks_left, 1) == 1 &&
        !(atomic_load_explicit(&s->direct, memory_order_acquire) && stream_direct_filled(s, k->slot)))
        hub_post(s->set->hub, &k->done);
}

/* ---- loop thread ----------------------------------------------------------------- */

static void stream_free(stream *s)
{
    if (!s)
        return;
    if (s->member) {
        free(s); /* a consumer: everything else is its producer's */
        return;
    }
    stream_direct_fini(s);
    if (s->slots) {
        for (uint32_t i = 0; i < s->n_slots; i++)
            free(s->slots[i].tasks);
        free(s->slots);
    }
    device_close(s->dev); /* before the ring: it unpins the mapping */
    stream_commit_stop(s);
    ring_free(s->ring);
    pool_flow_close(s->workers, s->flow); /* freed when its last running chunk returns */
    coldread_forget(s->ds->ahead, s); /* the samples it read ahead and will not use */
    if (s->set) {
        s->set->live--;
        for (stream **link = &s->set->streams; *link; link = &(*link)->set_next) {
            if (*link == s) {
                *link = s->set_next;
                break;
            }
        }
        dataset_release(s->ds); /* a dataset replaced by a rescan goes with its last stream */
    }
    free(s);
}

uint64_t stream_batch_bytes(stream *s, uint32_t slot, uint32_t rows)
{
    uint64_t bytes = 0;
    uint8_t *base = ring_slot(s->ring, slot);
    for (int f = 0; f < s->ds->n_fields; f++) {
        if (s->ds->fields[f].ragged)
            bytes += (uint64_t)((const int64_t *)(base + s->layout[f].offsets_offset))[rows];
        else
            bytes += (uint64_t)rows * s->layout[f].row_bytes;
    }
    return bytes;
}

static void start_fill(stream *s, uint32_t slot, uint64_t seq)
{
    struct stream_slot *sl = &s->slots[slot];
    uint64_t pos = s->p.start_batch + seq;
    uint64_t bpe = sampler_batches(&s->smp);
    sl->seq = seq;
    sl->epoch = s->p.epoch + pos / bpe;
    sl->batch = pos % bpe;
    sl->rows = sampler_batch_rows(&s->smp, sl->batch);
    atomic_store(&sl->err, 0);
    sl->errmsg[0] = '\0';

    uint8_t *base = ring_slot(s->ring, slot);
    struct ld_slot_header *hdr = (struct ld_slot_header *)base;
    hdr->epoch = sl->epoch;
    hdr->batch = sl->batch;
    hdr->rows = sl->rows;

    bool advise = false;
    if (!s->ds->keeper)
        sl->cache = NULL;
    else if (stream_on_direct_worker())
        sl->cache = stream_direct_acquire(s, &advise);
    else
        sl->cache = cache_keeper_acquire(s->ds->keeper, s->ds, s->cache_ticket, &advise);
    /* A cache much larger than memory: tell the kernel which samples this batch will
     * read, a prefetch depth before the workers get to them. */
    struct cache *cached = sl->cache;
    /* Without a cache, samples that are not in the page cache are read ahead, many at
     * once (coldread.h), while the workers read them in order. */
    bool ahead = !cached && s->ds->ahead && coldread_wanted(s->ds->ahead);
    if ((cached && advise) || ahead) {
        uint64_t idx[256];
        for (uint32_t row = 0, n; row < sl->rows; row += n) {
            n = sl->rows - row < 256 ? sl->rows - row : 256;
            sampler_indices(&s->smp, sl->epoch, sl->batch, row, n, idx);
            if (cached)
                cache_advise(cached, idx, n);
            else
                coldread_submit(s->ds->ahead, s, idx, n); /* a hint: without it the workers read as usual */
        }
    }

    /* Ragged fields: the offsets come from the sizes known since the dataset was
     * opened, so every worker can write its samples at their final place at once. */
    for (int f = 0; f < s->ds->n_fields; f++) {
        if (!s->ds->fields[f].ragged)
            continue;
        int64_t *offs = (int64_t *)(base + s->layout[f].offsets_offset);
        offs[0] = 0;
        for (uint32_t row = 0; row < sl->rows; row++) {
            uint64_t idx = sampler_index(&s->smp, sl->epoch, sl->batch, row);
            offs[row + 1] = offs[row] + (int64_t)dataset_item_bytes(s->ds, idx, f);
        }
    }

    uint64_t cost = stream_batch_bytes(s, slot, sl->rows) + (uint64_t)sl->rows * s->ds->sample_overhead;
    uint64_t n64 = cost / CHUNK_MIN_BYTES;
    uint32_t n = n64 > sl->rows ? sl->rows : (uint32_t)n64;
    if (n > pool_threads(s->workers))
        n = pool_threads(s->workers);
    struct scheduler_flow_stats st;
    pool_flow_get_stats(s->workers, s->flow, &st);
    /* Until a chunk has come back the cost is unknown: cut finely, so that the first
     * batches of a heavy stream (all queued at open) hold no worker for long either. */
    uint64_t nt = st.tasks ? st.unit_cost_ns * sl->rows / CHUNK_MAX_NS : sl->rows;
    if (nt > n)
        n = (uint32_t)(nt < s->max_chunks ? nt : s->max_chunks);
    if (n > sl->rows)
        n = sl->rows;
    if (n == 0)
        n = 1;
    sl->n_chunks = n;
    sl->busy = true;
    s->busy_slots++;
    atomic_store(&sl->chunks_left, n);
    for (uint32_t c = 0; c < n; c++) {
        struct stream_task *t = &sl->tasks[c];
        t->base.run = chunk_run;
        t->done.done = chunk_done;
        t->s = s;
        t->slot = slot;
        t->row_begin = (uint32_t)((uint64_t)sl->rows * c / n);
        t->row_end = (uint32_t)((uint64_t)sl->rows * (c + 1) / n);
        t->base.item.units = t->row_end - t->row_begin;
        pool_submit(s->workers, s->flow, &t->base);
    }
}

void stream_schedule(stream *s)
{
    s = s->src; /* a shared stream's consumer: its producer fills the slots */
    if (s->closing)
        return;
    bool locked = stream_lock(s);
    while (s->next_fill < s->total_seq && s->next_fill < s->failed_seq) {
        uint32_t ahead = ring_count(s->ring, RING_FILLING) + ring_count(s->ring, RING_COPYING) +
                         ring_count(s->ring, RING_READY) + s->handed_ahead;
        if (ahead >= stream_prefetch_target(s))
            break;
        uint32_t slot;
        uint64_t gen;
        if (ring_acquire(s->ring, &slot, &gen) < 0)
            break; /* every slot is leased or busy: the trainer holds them */
        s->slots[slot].relayouts = 0;
        start_fill(s, slot, s->next_fill++);
    }
    stream_unlock(s, locked);
}

/* Records that the stream fails at sequence `seq` (the earliest failure wins). */
void stream_fail(stream *s, uint64_t seq, int rc, const char *msg)
{
    if (seq >= s->failed_seq)
        return;
    uint64_t pos = s->p.start_batch + seq, bpe = sampler_batches(&s->smp);
    s->failed_seq = seq;
    s->fail_rc = rc;
    snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
    ld_log(LD_LOG_WARN, "stream %" PRIu64 " (dataset '%s'): epoch %" PRIu64 " batch %" PRIu64 ": %s", s->id,
           s->ds->name, s->p.epoch + pos / bpe, pos % bpe, msg);
}

/* The slot's last chunk is back (run or cancelled): nothing reads its cache any more. */
void stream_slot_idle(stream *s, struct stream_slot *sl)
{
    sl->busy = false;
    s->busy_slots--;
    if (sl->cache)
        cache_keeper_release(s->ds->keeper, sl->cache);
    sl->cache = NULL;
}

/* Bytes of the slot that the batch in it uses: its header, and each field up to its
 * last row (ragged: its offsets and its bytes). A copy moves no more. */
static uint64_t slot_used_bytes(stream *s, uint32_t slot, uint32_t rows)
{
    uint64_t end = sizeof(struct ld_slot_header);
    uint8_t *base = ring_slot(s->ring, slot);
    for (int f = 0; f < s->ds->n_fields; f++) {
        const struct field_layout *l = &s->layout[f];
        uint64_t e;
        if (s->ds->fields[f].ragged)
            e = l->offset + (uint64_t)((const int64_t *)(base + l->offsets_offset))[rows];
        else
            e = l->offset + (uint64_t)rows * l->row_bytes;
        if (e > end)
            end = e;
    }
    return end;
}

/* A filled slot goes through the device stage: READY now (the host stage) or once
 * its copy is reported (slot_copied). */
static void start_copy(stream *s, uint32_t slot)
{
    struct stream_slot *sl = &s->slots[slot];
    int copying = ring_copying(s->ring, slot);
    ld_require(copying == 0); /* else a slot we were filling is not FILLING: the bookkeeping is broken */
    int rc = device_submit(s->dev, slot, slot_used_bytes(s, slot, sl->rows), sl->rows);
    if (rc == 1) {
        int copied = ring_copied(s->ring, slot);
        ld_require(copied == 0);
        return;
    }
    if (rc == 0) {
        sl->busy = true;
        s->busy_slots++;
        return;
    }
    /* Not queued: the slot goes back FREE through the legal path, nothing delivers it. */
    int back = ring_copied(s->ring, slot) || ring_lease(s->ring, slot) ||
               ring_release(s->ring, slot, ring_generation(s->ring, slot));
    ld_require(back == 0);
    stream_fail(s, sl->seq, rc, "the copy of the batch to the device could not be queued (see the daemon's log)");
}

static void slot_filled(stream *s, uint32_t slot)
{
    struct stream_slot *sl = &s->slots[slot];
    stream_slot_idle(s, sl);
    if (s->closing) {
        if (s->busy_slots == 0)
            stream_free(s);
        return;
    }
    int err = atomic_load(&sl->err);
    if (err == LD_ESTALE && sl->relayouts < MAX_RELAYOUTS) {
        sl->relayouts++;
        start_fill(s, slot, sl->seq); /* the new layout makes room for the substitutes */
        return;
    }
    if (err == LD_ESTALE)
        snprintf(sl->errmsg, sizeof sl->errmsg, "epoch %" PRIu64 " batch %" PRIu64 ": laid out %u times and "
                 "still finding bad samples: giving up", sl->epoch, sl->batch, sl->relayouts);
    if (err < 0) {
        /* A shortage, a stalled storage or a source that cannot be served keeps its own
         * code: the sample is not at fault. */
        stream_fail(s, sl->seq, dataset_sample_error(err) ? LD_ESAMPLE : err, sl->errmsg);
        ring_discard(s->ring, slot);
    } else {
        start_copy(s, slot);
    }
    stream_deliver(s);
    stream_commit_start(s); /* the first batch is done: now the other slots */
    stream_schedule(s);
}

/* The slot's copy ended (a device stage that works asynchronously): it is READY. */
static void slot_copied(stream *s, uint32_t slot, int rc)
{
    struct stream_slot *sl = &s->slots[slot];
    sl->busy = false;
    s->busy_slots--;
    if (s->closing) {
        if (s->busy_slots == 0)
            stream_free(s);
        return;
    }
    int copied = ring_copied(s->ring, slot);
    ld_require(copied == 0); /* else a slot being copied is not COPYING: the bookkeeping is broken */
    if (rc < 0) {
        stream_fail(s, sl->seq, rc, "the copy of the batch to the device failed (see the daemon's log)");
        ring_lease(s->ring, slot); /* READY -> LEASED -> FREE: nothing may deliver it */
        ring_release(s->ring, slot, ring_generation(s->ring, slot));
    }
    stream_deliver(s);
    stream_schedule(s);
}

static void chunk_cancelled(struct pool_task *t)
{
    struct stream_task *k = (struct stream_task *)t;
    struct stream_slot *sl = &k->s->slots[k->slot];
    if (atomic_fetch_sub(&sl->chunks_left, 1) == 1)
        stream_slot_idle(k->s, sl);
}

int stream_open(stream_set *set, dataset *d, uint64_t id, const struct stream_params *p,
                uint64_t budget_left, stream **ret_stream, char *errbuf)
{
    int rc = 0;
    stream *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        return LD_ENOMEM;
    }
    s->ds = d;
    s->id = id;
    s->p = *p;
    s->failed_seq = UINT64_MAX;
    s->src = s;
    stream_direct_init(s);

    struct sampler_params sp = {
        .n = d->count, .seed = p->seed, .shuffle = p->shuffle, .batch_size = p->batch_size,
        .rank = p->rank, .world_size = p->world_size, .drop_last = p->drop_last,
    };
    rc = sampler_init(&s->smp, &sp);
    if (rc == LD_ERANGE) {
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "dataset '%s' has %" PRIu64 " samples: with batch_size %u, world_size %u and "
                 "drop_last no batch is left", d->name, d->count, p->batch_size, p->world_size);
        goto fail;
    }
    if (rc < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "invalid sampler settings (rank %u, world_size %u, batch_size %u)",
                 p->rank, p->world_size, p->batch_size);
        goto fail;
    }
    uint64_t bpe = sampler_batches(&s->smp);
    if (p->start_batch >= bpe) {
        snprintf(errbuf, LD_ERRMSG_MAX, "start_batch %" PRIu64 " is past the epoch (%" PRIu64 " batches)",
                 p->start_batch, bpe);
        rc = LD_EINVAL;
        goto fail;
    }
    if (p->epochs == 0 || p->epochs > (UINT64_MAX - 1) / bpe)
        s->total_seq = UINT64_MAX; /* unbounded, or more batches than 64 bits count */
    else
        s->total_seq = p->epochs * bpe - p->start_batch;

    /* Slot layout: header, then each field on a 64-byte boundary. */
    uint64_t off = sizeof(struct ld_slot_header);
    for (int f = 0; f < d->n_fields; f++) {
        struct field_layout *l = &s->layout[f];
        if (d->fields[f].ragged) {
            l->offsets_offset = align_up(off, LD_FIELD_ALIGN);
            off = l->offsets_offset + ((uint64_t)p->batch_size + 1) * sizeof(int64_t);
            l->offset = align_up(off, LD_FIELD_ALIGN);
            l->capacity = (uint64_t)p->batch_size * dataset_slot_item_bytes(d, f);
            off = l->offset + l->capacity;
        } else {
            l->row_bytes = dataset_row_bytes(d, f);
            l->offset = align_up(off, LD_FIELD_ALIGN);
            off = l->offset + (uint64_t)p->batch_size * l->row_bytes;
        }
    }
    uint64_t slot_bytes = align_up(off, LD_RING_ALIGN);
    if (p->prefetch == 0) {
        /* auto: a ring for up to PREFETCH_AUTO_MAX ahead, or what the budget left holds */
        uint64_t fit = budget_left > LD_RING_ALIGN ? (budget_left - LD_RING_ALIGN) / slot_bytes : 0;
        uint64_t max = fit > SLOTS_BEYOND_PREFETCH ? fit - SLOTS_BEYOND_PREFETCH : 1;
        s->p.prefetch = max < PREFETCH_AUTO_MAX ? (uint32_t)max : PREFETCH_AUTO_MAX;
        s->prefetch_auto = true;
        prefetch_init(&s->pf, s->p.prefetch);
        p = &s->p;
    }
    s->n_slots = p->prefetch + SLOTS_BEYOND_PREFETCH + p->extra_slots;
    uint64_t need = LD_RING_ALIGN + (uint64_t)s->n_slots * slot_bytes;
    if (need > budget_left) {
        char a[LD_FORMAT_BYTES_MAX], b[LD_FORMAT_BYTES_MAX], c[LD_FORMAT_BYTES_MAX];
        ld_format_bytes(need, a, sizeof a);
        ld_format_bytes(slot_bytes, b, sizeof b);
        ld_format_bytes(budget_left, c, sizeof c);
        char m[LD_FORMAT_BYTES_MAX] = "";
        int rf = -1;
        for (int f = 0; f < d->n_fields && rf < 0; f++)
            if (d->fields[f].ragged)
                rf = f;
        if (rf >= 0)
            ld_format_bytes(dataset_slot_item_bytes(d, rf), m, sizeof m);
        snprintf(errbuf, LD_ERRMSG_MAX,
                 "the stream needs %s of shared memory (%u slots of %s for batch_size %u) but only %s "
                 "is left of server.memory_budget: lower batch_size or prefetch, or raise the budget%s%s%s%s%s",
                 a, s->n_slots, b, p->batch_size, c,
                 rf >= 0 ? "; a ragged field reserves batch_size x its largest sample (" : "", m,
                 rf >= 0 ? ") per slot: set datasets." : "", rf >= 0 ? d->name : "",
                 rf >= 0 ? ".max_sample_bytes to bound it (larger samples then follow on_error)" : "");
        rc = LD_EBUDGET;
        goto fail;
    }
    /* The first slot now, the others in the background once the first batch is done
     * (stream_commit.c); a device stage registers the whole mapping at once. */
    rc = ring_open_partial("loaderd", id, s->n_slots, slot_bytes, 0600,
                           p->device.kind == DEVICE_HOST ? 1 : s->n_slots, &s->ring, errbuf);
    if (rc < 0)
        goto fail;
    s->slot_used = off;

    s->workers = set->workers;
    s->max_chunks = pool_threads(set->workers);
    if (s->max_chunks < MAX_TIMED_CHUNKS)
        s->max_chunks = MAX_TIMED_CHUNKS;
    char dgroup[SCHEDULER_GROUP_NAME_MAX], ugroup[32];
    snprintf(dgroup, sizeof dgroup, "dataset:%s", d->name);
    snprintf(ugroup, sizeof ugroup, "uid:%u", p->uid);
    struct scheduler_flow_params fp = {
        .weight = d->weight * (p->client_weight ? p->client_weight : 1),
        .group = {dgroup, ugroup},
        .cap = {d->max_share, p->client_max_share},
    };
    s->weight = fp.weight;
    if ((rc = pool_flow_new(set->workers, &fp, &s->flow)) < 0) {
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        goto fail;
    }
    s->slots = calloc(s->n_slots, sizeof *s->slots);
    if (!s->slots) {
        rc = LD_ENOMEM;
        snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        s->slots[i].tasks = calloc(s->max_chunks, sizeof(struct stream_task));
        if (!s->slots[i].tasks) {
            rc = LD_ENOMEM;
            snprintf(errbuf, LD_ERRMSG_MAX, "out of memory");
            goto fail;
        }
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        s->slots[i].copy_done.done = slot_copy_done;
        s->slots[i].copy_stream = s;
        s->slots[i].copy_slot = i;
    }
    const struct device_normalize *norm = p->norm && p->norm->field >= 0 ? p->norm : NULL;
    const struct device_stream_params dp = {
        .stream_id = id,
        .ring_base = (uint8_t *)ring_slot(s->ring, 0) - ring_slot_offset(s->ring),
        .ring_size = ring_total_size(s->ring),
        .slot_offset = ring_slot_offset(s->ring),
        .slot_size = ring_slot_size(s->ring),
        .slot_count = s->n_slots,
        .slot_bytes = s->slot_used,
        .budget = p->device_budget,
        .batch_size = p->batch_size,
        .norm = norm,
        .norm_src_offset = norm ? s->layout[norm->field].offset : 0,
        .norm_name = norm ? d->fields[norm->field].name : NULL,
    };
    rc = device_open(&p->device, &dp, stream_copied, s, &s->dev, errbuf);
    if (rc < 0)
        goto fail;
    s->set = set;
    set->live++;
    dataset_hold(d);
    if (d->keeper)
        s->cache_ticket = cache_keeper_stream_opened(d->keeper);
    s->set_next = set->streams;
    set->streams = s;
    stream_schedule(s);
    *ret_stream = s;
    return 0;

fail:
    stream_free(s);
    return rc;
}

void stream_close(stream *s)
{
    if (!s || s->closing)
        return;
    stream_clear_direct(s); /* no worker publishes past this: the loop has it all */
    hub_cancel(s->set->hub, &s->ended); /* an end's answers are forgotten with the rest */
    hub_cancel(s->set->hub, &s->cache_bad); /* the keeper may close before the stream goes */
    if (s->member) {
        share_leave(s->member); /* gives back what it held; the last one closes the producer */
        stream_free(s);
        return;
    }
    s->closing = true;
    /* The name goes now, even while workers still fill slots of the ring (its memory
     * goes with the last of them): a trainer killed before its first next leaves
     * nothing in /dev/shm. */
    if (!s->unlinked) {
        ring_unlink(s->ring);
        s->unlinked = true;
    }
    s->w_count = 0; /* forgotten: their callbacks never run (stream.h) */
    pool_cancel(s->workers, s->flow, chunk_cancelled);
    if (s->busy_slots == 0)
        stream_free(s);
    /* else: the last running chunk's slot_filled() frees it */
}

int stream_release(stream *s, uint32_t slot, uint64_t generation)
{
    if (s->member)
        return share_release(s->member, slot, generation);
    bool locked = stream_lock(s);
    int rc = ring_release(s->ring, slot, generation);
    if (rc == 0)
        stream_schedule(s);
    stream_unlock(s, locked);
    return rc;
}

int stream_consumer_new(stream *src, uint64_t id, uint64_t seq, stream **ret_consumer)
{
    stream *s = malloc(sizeof *s);
    if (!s)
        return LD_ENOMEM;
    /* Its producer's layout, ring, slots and flow, borrowed; its own place and counters. */
    *s = (struct stream){
        .set = src->set, .ds = src->ds, .id = id, .p = src->p, .smp = src->smp, .ring = src->ring,
        .dev = src->dev, .slot_used = src->slot_used, .n_slots = src->n_slots, .max_chunks = src->max_chunks,
        .workers = src->workers, .flow = src->flow, .weight = src->weight, .slots = src->slots,
        .total_seq = src->total_seq, .next_fill = seq, .next_deliver = seq, .failed_seq = UINT64_MAX,
        .unlinked = true, /* the producer's name stays for consumers joining later */
        .src = src,
    };
    s->p.prefetch = src->prefetch_auto ? src->pf.depth : src->p.prefetch;
    memcpy(s->layout, src->layout, sizeof s->layout);
    *ret_consumer = s;
    return 0;
}
