/* client_next — asking for batches: lc_stream_next and the read-ahead behind it.
 *
 * Each stream keeps up to CLIENT_READ_AHEAD `next` requests in flight while the
 * trainer holds at most one of its batches, so that the reply is already on the socket
 * when the trainer comes back for it. A next that times out stays outstanding (its
 * reply is kept on the stream by whichever call reads it). A reply is checked against
 * the slot's header in shared memory (generation, epoch, batch, rows) before the batch
 * is handed out; its field views are built by client_batch.c. */
#include "client_internal.h"
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sends `next` for stream s; its reply is collected by lc_stream_next (or stashed on
 * the stream by whichever call reads it first). */
static int client_next_send(lc_stream *s, int64_t deadline, int timeout_ms)
{
    lc_client *c = s->client;
    cJSON *req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_NEXT) ||
        !cJSON_AddNumberToObject(req, "stream", (double)s->id)) {
        cJSON_Delete(req);
        client_seterr(c, "out of memory building 'next'");
        return LC_ENOMEM;
    }
    int64_t id;
    int ret = client_send(c, req, CLIENT_PENDING_NEXT, LD_OP_NEXT, s, deadline, timeout_ms, &id);
    if (ret == 0) {
        unsigned i = (s->ahead_head + s->ahead_count) % CLIENT_READ_AHEAD;
        s->ahead_id[i] = id;
        s->ahead_reply[i] = NULL;
        s->ahead_count++;
    }
    return ret;
}

/* Tops the stream's read-ahead up to CLIENT_READ_AHEAD requests, unless an answer said
 * the stream is over (or failed). A send that fails breaks the connection, and the next
 * call reports it. */
void client_next_read_ahead(lc_stream *s, int64_t deadline, int timeout_ms)
{
    /* Not while the stream waits for its reopen: its id on the new daemon is not known;
     * not while the hand-off in shared memory brings its batches. */
    if ((s->ho && !s->ho_over) || s->ahead_stop || s->client->lost || s->needs_reopen || s->reopen_id >= 0 || s->failed || !s->map)
        return;
    while (s->ahead_count < CLIENT_READ_AHEAD && !s->client->broken && client_next_send(s, deadline, timeout_ms) == 0)
        ;
}

LC_EXPORT int lc_stream_next(lc_stream *s, int timeout_ms, lc_batch **ret_batch)
{
    char msg[LD_ERRMSG_MAX];
    cJSON *reply = NULL;
    lc_batch *b = NULL;
    int ret;
    if (!s)
        return LC_EINVAL;
    lc_client *c = s->client;
    if (!ret_batch) {
        client_seterr(c, "lc_stream_next: ret_batch is required");
        return LC_EINVAL;
    }
    timeout_ms = client_effective_timeout(c, timeout_ms);
    int64_t deadline = client_now_ms() + timeout_ms;
    unsigned head;
    int64_t slot, gen, epoch, batch, rows;
    /* A daemon that goes away under us is reconnected to and the stream reopened at the
     * batch it had reached (client_reconnect.c); the request then goes to the new one. */
again:
    for (;;) {
        if (client_stream_over(s)) {
            /* Every epoch was delivered (perhaps before the daemon went: nothing to reopen). */
            client_seterr(c, "the stream has delivered all its epochs");
            return LC_EEND;
        }
        if ((ret = client_stream_ready(s, deadline, timeout_ms)) < 0)
            return ret;
        if (s->ho && !s->ho_over) {
            /* The hand-off in shared memory: no request, no reply (client_handoff.c). */
            struct ld_handoff_ready e;
            ret = client_handoff_next(s, deadline, timeout_ms, &e);
            if (ret < 0 && c->lost)
                continue;
            if (ret < 0)
                return ret;
            if (ret == 0) {
                slot = e.slot, gen = (int64_t)e.generation, epoch = (int64_t)e.epoch, batch = (int64_t)e.batch;
                rows = e.rows;
                goto hand_out;
            }
            s->ho_over = true; /* the stream ended or failed: a next on the socket says which */
        }
        if (!s->ahead_count) {
            ret = client_next_send(s, deadline, timeout_ms);
            if (ret < 0 && c->lost)
                continue;
            if (ret < 0)
                return ret;
        }
        head = s->ahead_head;
        if (!s->ahead_reply[head]) {
            ret = client_wait(c, s->ahead_id[head], deadline, timeout_ms, &s->ahead_reply[head]);
            if (ret < 0 && c->lost)
                continue;
            if (ret < 0)
                return ret; /* on a timeout the request stays outstanding for the next call */
        }
        break;
    }
    reply = s->ahead_reply[head];
    s->ahead_reply[head] = NULL;
    s->ahead_head = (head + 1) % CLIENT_READ_AHEAD;
    s->ahead_count--;
    ret = proto_reply_status(reply, msg);
    if (ret == LC_EDETACHED && client_stream_detached(s) == 0) {
        /* It fell behind its shared stream: on in a stream of its own, same batches. */
        cJSON_Delete(reply);
        reply = NULL;
        goto again;
    }
    if (ret < 0) {
        s->ahead_stop = true; /* end of stream or a failed stream: every later answer is the same */
        client_seterr(c, "%s", msg);
        goto out;
    }
    if (proto_get_int(reply, "slot", 0, (int64_t)s->slot_count - 1, &slot, msg) < 0 ||
        proto_get_int(reply, "generation", 0, LD_JSON_SAFE_INT, &gen, msg) < 0 ||
        proto_get_int(reply, "epoch", 0, LD_JSON_SAFE_INT, &epoch, msg) < 0 ||
        proto_get_int(reply, "batch", 0, LD_JSON_SAFE_INT, &batch, msg) < 0 ||
        proto_get_int(reply, "rows", 1, s->batch_size, &rows, msg) < 0) {
        ret = LC_EPROTO;
        client_seterr(c, "malformed next reply from loaderd: %s", msg);
        goto out;
    }
hand_out:
    b = calloc(1, sizeof *b);
    if (!b) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory");
        goto out;
    }
    b->stream = s;
    b->slot = (int)slot;
    b->generation = (uint64_t)gen;
    b->epoch = (uint64_t)epoch;
    b->index = (uint64_t)batch;
    b->rows = (uint32_t)rows;
    b->slot_offset = s->slot_offset + (uint64_t)b->slot * s->slot_size;
    b->reopens = s->reopens;
    b->base = (const uint8_t *)client_stream_slot(s, b->slot);
    /* Release semantics: the slot's contents were written before the generation. */
    const struct ld_slot_header *h = client_stream_slot(s, b->slot);
    uint64_t hgen = __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
    if (hgen != b->generation || h->epoch != b->epoch || h->batch != b->index || h->rows != b->rows) {
        ret = LC_EPROTO;
        client_seterr(c,
                      "slot %d of stream %llu holds generation %llu (epoch %llu batch %llu, %u rows), "
                      "loaderd said generation %llu (epoch %llu batch %llu, %u rows)",
                      b->slot, (unsigned long long)s->id, (unsigned long long)hgen,
                      (unsigned long long)h->epoch, (unsigned long long)h->batch, h->rows,
                      (unsigned long long)b->generation, (unsigned long long)b->epoch,
                      (unsigned long long)b->index, b->rows);
        goto out;
    }
    ret = client_fill_batch(s, b, msg);
    if (ret < 0) {
        client_seterr(c, "%s", msg);
        goto out;
    }
    b->next = s->batches;
    if (s->batches)
        s->batches->prev = b;
    s->batches = b;
    *ret_batch = b;
    /* Where a reopen would start: the batch after the last one handed out. */
    if (b->index + 1 >= s->batches_per_epoch) {
        s->next_epoch = b->epoch + 1;
        s->next_batch = 0;
    } else {
        s->next_epoch = b->epoch;
        s->next_batch = b->index + 1;
    }
    b = NULL;
    ret = 0;
    /* Read-ahead: ask for the following batch now, so that its reply is already on the
     * socket when the trainer comes back for it and no call waits a whole round trip.
     * Only while the trainer holds just this batch of the stream: one that keeps batches
     * never has a request waiting on the daemon for a slot that it holds itself. A send
     * that fails here breaks the connection, and the next call reports it. */
    if (!s->batches->next)
        client_next_read_ahead(s, deadline, timeout_ms);
out:
    /* A batch we could not hand out still holds its slot on the daemon: give it back. */
    if (b) {
        b->next = s->batches;
        if (s->batches)
            s->batches->prev = b;
        s->batches = b;
        char saved[CLIENT_ERRMSG_MAX];
        snprintf(saved, sizeof saved, "%s", c->error);
        lc_batch_release(b);
        snprintf(c->error, sizeof c->error, "%s", saved);
    }
    cJSON_Delete(reply);
    return ret;
}

LC_EXPORT int lc_stream_next_info_sized(lc_stream *s, int timeout_ms, lc_batch **ret_batch, lc_batch_info *ret_info,
                                        size_t info_size)
{
    lc_batch *b;
    if (!s)
        return LC_EINVAL;
    if (!ret_batch || !ret_info || info_size < CLIENT_BATCH_INFO_V0_SIZE) {
        client_seterr(s->client, "lc_stream_next_info: ret_batch and ret_info (%zu bytes, at least %zu) are required",
                      info_size, (size_t)CLIENT_BATCH_INFO_V0_SIZE);
        return LC_EINVAL;
    }
    int ret = lc_stream_next(s, timeout_ms, &b);
    if (ret < 0)
        return ret;
    lc_batch_describe_sized(b, ret_info, info_size); /* cannot fail: b and the size were checked */
    *ret_batch = b;
    return 0;
}
