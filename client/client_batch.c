/* client_batch — a leased batch as the trainer sees it: field views into the mapped
 * slot (checked against the slot's bounds, ragged offsets included), the batch's
 * metadata, its validity (the slot's generation in shared memory), and giving the slot
 * back with a pipelined release.
 *
 * A batch is a lease on one slot: its views stay valid until lc_batch_release, and
 * lc_stream_close frees the batches still held (they are invalid afterwards: never
 * release a batch after closing its stream). Releases are sent with the next request
 * (client_transport.c); when the trainer is down to one batch of the stream, the
 * release also asks ahead for the next ones (client_next.c). */
#include "client_device.h"
#include "client_internal.h"
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void client_unlink_batch(lc_batch *b)
{
    lc_stream *s = b->stream;
    if (b->prev)
        b->prev->next = b->next;
    else
        s->batches = b->next;
    if (b->next)
        b->next->prev = b->prev;
}

int client_fill_batch(lc_stream *s, lc_batch *b, char *msg)
{
    for (int i = 0; i < s->n_fields; i++) {
        const struct client_field *f = &s->fields[i];
        lc_field *v = &b->fields[i];
        memset(v, 0, sizeof *v);
        v->name = f->name;
        v->dtype = f->dtype;
        v->data = b->base + f->offset;
        v->shape[0] = b->rows;
        if (!f->ragged) {
            v->ndim = 1 + f->ndim;
            for (int d = 0; d < f->ndim; d++)
                v->shape[1 + d] = f->shape[d];
            v->nbytes = (size_t)(b->rows * f->row_bytes);
            continue;
        }
        const int64_t *off = (const int64_t *)(const void *)(b->base + f->offsets_offset);
        v->ndim = 1;
        v->offsets = off;
        int64_t prev = 0;
        for (uint32_t r = 0; r <= b->rows; r++) {
            int64_t o = off[r];
            if (o < prev || (uint64_t)o > f->capacity) {
                snprintf(msg, LD_ERRMSG_MAX,
                         "ragged field '%s' of slot %d: offsets[%u] = %lld is outside [%lld, %llu]", f->name,
                         b->slot, r, (long long)o, (long long)prev, (unsigned long long)f->capacity);
                return LC_EPROTO;
            }
            prev = o;
        }
        v->nbytes = (size_t)off[b->rows];
    }
    return 0;
}

LC_EXPORT uint32_t lc_batch_rows(const lc_batch *b) { return b ? b->rows : 0; }
LC_EXPORT uint64_t lc_batch_epoch(const lc_batch *b) { return b ? b->epoch : 0; }
LC_EXPORT uint64_t lc_batch_index(const lc_batch *b) { return b ? b->index : 0; }
LC_EXPORT int lc_batch_slot(const lc_batch *b) { return b ? b->slot : LC_EINVAL; }
LC_EXPORT uint64_t lc_batch_generation(const lc_batch *b) { return b ? b->generation : 0; }
LC_EXPORT int lc_batch_describe_sized(const lc_batch *b, lc_batch_info *ret_info, size_t info_size)
{
    if (!b || !ret_info)
        return LC_EINVAL;
    lc_batch_info r;
    memset(&r, 0, sizeof r);
    r.slot = b->slot;
    r.rows = b->rows;
    r.generation = b->generation;
    r.epoch = b->epoch;
    r.index = b->index;
    r.slot_offset = b->slot_offset;
    r.reopens = b->reopens;
    return client_copy_struct_out(ret_info, info_size, &r, sizeof r, CLIENT_BATCH_INFO_V0_SIZE);
}

LC_EXPORT int lc_batch_field_count(const lc_batch *b) { return b ? b->stream->n_fields : 0; }

LC_EXPORT int lc_batch_field_sized(const lc_batch *b, int i, lc_field *ret_field, size_t field_size)
{
    if (!b || !ret_field || i < 0 || i >= b->stream->n_fields)
        return LC_EINVAL;
    return client_copy_struct_out(ret_field, field_size, &b->fields[i], sizeof b->fields[i], CLIENT_FIELD_V0_SIZE);
}

LC_EXPORT int lc_batch_field_by_name_sized(const lc_batch *b, const char *name, lc_field *ret_field,
                                           size_t field_size)
{
    if (!b || !name || !ret_field)
        return LC_EINVAL;
    for (int i = 0; i < b->stream->n_fields; i++)
        if (strcmp(b->fields[i].name, name) == 0)
            return client_copy_struct_out(ret_field, field_size, &b->fields[i], sizeof b->fields[i], CLIENT_FIELD_V0_SIZE);
    return LC_EINVAL;
}

LC_EXPORT int lc_batch_valid(const lc_batch *b)
{
    if (!b)
        return 0;
    /* Its own ring's header, which may be a ring of a connection gone since. */
    const struct ld_slot_header *h = (const struct ld_slot_header *)(const void *)b->base;
    return __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE) == b->generation;
}

LC_EXPORT int lc_batch_release(lc_batch *b)
{
    int ret = 0;
    if (!b)
        return 0;
    lc_stream *s = b->stream;
    lc_client *c = s->client;
    client_unlink_batch(b);
    if ((b->old && !b->old->release) || c->lost) {
        /* A batch of a connection that is gone: the daemon that leased it is gone too,
         * and nothing is owed to the new one. Its ring stays mapped while other batches
         * of it are held. */
        client_batch_free(b);
        return client_take_release_failure(c);
    }
    uint64_t sid = b->old ? b->old->release_id : s->id;
    if (s->dev && !b->old) {
        char msg[LD_ERRMSG_MAX];
        int dret = client_device_release(b, msg);
        if (dret < 0) {
            /* The slot cannot be handed back safely: the daemon could overwrite what
             * the trainer's stream still reads. It stays leased; the stream's close frees it. */
            client_seterr(c, "lc_batch_release: %s", msg);
            client_batch_free(b);
            return dret;
        }
    }
    /* Through the hand-off while it runs; once the stream has delivered its last batch
     * the daemon fills nothing more and would not come by the queue: a release message
     * then (which takes the queue with it). */
    if (s->ho && !s->ho_over && !client_stream_over(s) && !c->broken) {
        ret = client_handoff_release(s, b->slot, b->generation); /* no message: client_handoff.c */
    } else if (!c->broken) {
        int64_t deadline = client_now_ms() + c->timeout_ms;
        int64_t id = -1;
        cJSON *req = cJSON_CreateObject();
        if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_RELEASE) ||
            !cJSON_AddNumberToObject(req, "stream", (double)sid) ||
            !cJSON_AddNumberToObject(req, "slot", b->slot) ||
            !cJSON_AddNumberToObject(req, "generation", (double)b->generation)) {
            cJSON_Delete(req);
            client_seterr(c, "out of memory building 'release'");
            ret = LC_ENOMEM;
        } else {
            ret = client_send_ex(c, req, CLIENT_PENDING_RELEASE, LD_OP_RELEASE, NULL, deadline, c->timeout_ms,
                                 true, &id);
        }
        if (ret == 0) {
            struct client_pending *p = client_pending_find(c, id);
            if (p) {
                p->stream_id = sid;
                p->slot = b->slot;
                p->generation = b->generation;
            }
            /* The trainer is down to at most one batch of this stream (a training loop that
             * keeps the previous batch's tensors until the next step): ask ahead now,
             * in the same write as the release. */
            if (!s->batches || !s->batches->next)
                client_next_read_ahead(s, deadline, c->timeout_ms);
            /* A trainer that only releases: send them now and then, and settle the
             * replies that have arrived so they do not pile up. */
            if (c->deferred_frames >= CLIENT_DEFER_MAX_FRAMES && client_flush_deferred(c, deadline, c->timeout_ms) == 0)
                client_wait(c, -1, 0, 0, NULL);
        }
    } else {
        ret = client_check_usable(c);
    }
    client_batch_free(b);
    /* The connection was found gone while telling the daemon (the hand-off's wake-up is
     * sent at once): the lease went with it, as for a batch of a connection already
     * gone above, and the reconnect reopens the stream where the trainer is. */
    if (ret == LC_ECONNRESET && c->lost)
        ret = 0;
    return ret < 0 ? ret : client_take_release_failure(c);
}
