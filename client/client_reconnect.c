/* client_reconnect — a trainer's streams survive a daemon restart (an upgrade, a crash,
 * a systemd restart).
 *
 * When the daemon hangs up without saying why (end of file, a reset, a broken pipe: what
 * a dying or stopping daemon looks like; a daemon that closes the connection on purpose
 * sends an error frame first, and that still ends the connection for good), the
 * connection is marked lost instead of broken. Nothing is retried in the call that saw
 * it, except by lc_stream_next; the next call that needs the daemon connects again to
 * the same socket, with a growing pause between attempts (20 ms doubling up to 1 s,
 * with some jitter so that the clients of a node do not all knock at once), for at most
 * the client's reconnect time (LOADERD_RECONNECT seconds, lc_client_set_reconnect; 60 s
 * by default; 0 turns it off). Each attempt is a whole lc_connect: the identity check
 * and the hello included. Past that time the connection is broken as before, with a
 * message that says how long it tried and why the last attempt failed.
 *
 * Every stream is then opened again at the exact batch its trainer had reached: the
 * sampler computes any batch on its own, so (epoch, start_batch) of the batch after the
 * last one handed out, with the epochs left, give the same sequence the old daemon would
 * have gone on with. Answers that were on their way (read-ahead) died with the old
 * daemon and are asked for again. The reopen must find the same dataset: the same
 * batches and samples per epoch and the same fields; otherwise the stream fails with
 * LC_EDATASET rather than mix two datasets into one epoch.
 *
 * Batches the trainer still held when the connection died stay readable: their ring
 * (struct client_old_ring) stays mapped until the last of them is released, and
 * releasing them sends nothing (the daemon that leased them is gone). Nobody writes that
 * ring any more, so lc_batch_valid stays exact: a held batch stays valid.
 *
 * A call's timeout still bounds the call: one that ends while the daemon is away
 * returns LC_ETIMEDOUT (lc_client_reconnecting() is then 1), and the next call goes
 * on where it left off, as with a batch that comes late. */
#include "client_device.h"
#include "client_internal.h"
#include "ld_mix.h"
#include "proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CLIENT_BACKOFF_FIRST_MS 20
#define CLIENT_BACKOFF_MAX_MS 1000
#define CLIENT_RECONNECT_MAX_S 2147483 /* what an int of milliseconds holds */

/* Batches whose ring could not be given a record of its own (out of memory when the
 * connection died): their mapping is left in place for good rather than pulled from
 * under them. Never freed. */
static struct client_old_ring client_unowned_ring;

LC_EXPORT int lc_client_set_reconnect(lc_client *c, int timeout_ms)
{
    if (!c)
        return LC_EINVAL;
    if (timeout_ms < 0) {
        client_seterr(c, "lc_client_set_reconnect: expected milliseconds >= 0 (0: never reconnect), got %d",
                      timeout_ms);
        return LC_EINVAL;
    }
    c->reconnect_ms = timeout_ms;
    return 0;
}

LC_EXPORT int lc_client_reconnecting(const lc_client *c)
{
    return c && c->lost && !c->broken;
}

LC_EXPORT uint64_t lc_client_reconnects(const lc_client *c)
{
    return c ? c->reconnects : 0;
}

LC_EXPORT uint64_t lc_stream_reopens(const lc_stream *s)
{
    return s ? s->reopens : 0;
}

int client_reconnect_init(lc_client *c, char *errbuf, size_t errbuf_size)
{
    const char *env = getenv("LOADERD_RECONNECT");
    c->reconnect_ms = CLIENT_RECONNECT_DEFAULT_MS;
    if (!env || !*env)
        return 0;
    char *end;
    errno = 0;
    double v = strtod(env, &end);
    if (end == env || *end || errno || !(v >= 0) || v > CLIENT_RECONNECT_MAX_S) {
        snprintf(errbuf, errbuf_size,
                 "LOADERD_RECONNECT='%s': expected the seconds to keep reconnecting after loaderd went away, "
                 "from 0 (never) to %d",
                 env, CLIENT_RECONNECT_MAX_S);
        return LC_EINVAL;
    }
    c->reconnect_ms = (int)(v * 1000 + 0.5);
    if (v > 0 && c->reconnect_ms == 0)
        c->reconnect_ms = 1;
    return 0;
}

bool client_stream_over(const lc_stream *s)
{
    return s->opts.epochs && s->next_epoch - s->opts.epoch >= s->opts.epochs;
}

/* Adds the JSON object text `json` (NULL: nothing) to req under `key`; false when it
 * is not an object or memory is short. */
static bool client_add_object(cJSON *req, const char *key, const char *json)
{
    if (!json)
        return true;
    cJSON *o = cJSON_Parse(json);
    if (cJSON_IsObject(o) && cJSON_AddItemToObject(req, key, o))
        return true;
    cJSON_Delete(o);
    return false;
}

cJSON *client_open_request(const char *dataset, const lc_stream_options *o, uint64_t epoch, uint64_t start_batch,
                           uint64_t epochs, bool handoff)
{
    cJSON *req = cJSON_CreateObject();
    /* A declared dataset: the spec, refining `dataset` when there is one (a template). */
    if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_OPEN) ||
        (dataset && !cJSON_AddStringToObject(req, o->spec ? "template" : "dataset", dataset)) ||
        !cJSON_AddNumberToObject(req, "batch_size", o->batch_size) ||
        !cJSON_AddBoolToObject(req, "shuffle", o->shuffle != 0) ||
        !cJSON_AddNumberToObject(req, "seed", (double)o->seed) ||
        !cJSON_AddNumberToObject(req, "epoch", (double)epoch) ||
        !cJSON_AddNumberToObject(req, "rank", o->rank) ||
        !cJSON_AddNumberToObject(req, "world_size", o->world_size) ||
        !cJSON_AddBoolToObject(req, "drop_last", o->drop_last != 0) ||
        !cJSON_AddNumberToObject(req, "start_batch", (double)start_batch) ||
        (o->prefetch && !cJSON_AddNumberToObject(req, "prefetch", o->prefetch)) ||
        !cJSON_AddNumberToObject(req, "epochs", (double)epochs) ||
        (o->device && !cJSON_AddStringToObject(req, "device", o->device)) ||
        (o->device && !cJSON_AddStringToObject(req, "transfer", o->transfer == LC_TRANSFER_CLIENT
                                                                    ? LD_TRANSFER_CLIENT : LD_TRANSFER_IPC)) ||
        (o->share && !cJSON_AddStringToObject(req, "share", o->share)) ||
        (o->share && !cJSON_AddStringToObject(req, "share_join", o->share_join == LC_SHARE_JOIN_EPOCH_START
                                                                     ? "epoch_start" : "current")) ||
        (handoff && !cJSON_AddNumberToObject(req, "handoff", LD_HANDOFF_VERSION))) {
        cJSON_Delete(req);
        return NULL;
    }
    /* Checked to be JSON objects by lc_stream_open. */
    if (!client_add_object(req, "spec", o->spec) || !client_add_object(req, "device_normalize", o->device_normalize)) {
        cJSON_Delete(req);
        return NULL;
    }
    return req;
}

void client_batch_free(lc_batch *b)
{
    if (!b)
        return;
    struct client_old_ring *r = b->old;
    if (r && r != &client_unowned_ring && --r->refs == 0) {
        munmap((void *)r->map, r->map_size);
        if (r->fd >= 0)
            close(r->fd);
        free(r);
    }
    free(b);
}

/* The connection died: the stream's ring goes to the batches still held of it (or is
 * unmapped), its answers in flight are forgotten, and it waits for a reopen. */
static void client_stream_detach(lc_stream *s)
{
    /* The device ring went with the daemon: its handles are closed (and the mapping
     * unpinned while it is still mapped); a reopen imports the new ones. */
    client_device_close(s);
    client_handoff_close(s); /* the new connection serves the stream through the socket */
    for (unsigned k = 0; k < CLIENT_READ_AHEAD; k++) {
        cJSON_Delete(s->ahead_reply[k]);
        s->ahead_reply[k] = NULL;
    }
    s->ahead_count = 0;
    s->ahead_head = 0;
    s->ahead_stop = false;
    s->reopen_id = -1;
    if (s->map) {
        unsigned n = 0;
        for (lc_batch *b = s->batches; b; b = b->next)
            n += !b->old;
        struct client_old_ring *r = n ? calloc(1, sizeof *r) : NULL;
        if (r) {
            r->map = s->map;
            r->map_size = s->map_size;
            r->fd = s->ring_fd;
            r->refs = n;
        } else if (n) {
            r = &client_unowned_ring;
            if (s->ring_fd >= 0)
                close(s->ring_fd);
        } else {
            munmap((void *)s->map, s->map_size);
            if (s->ring_fd >= 0)
                close(s->ring_fd);
        }
        for (lc_batch *b = s->batches; b; b = b->next)
            if (!b->old)
                b->old = r;
    }
    s->map = NULL;
    s->map_size = 0;
    s->ring_fd = -1;
    if (!s->failed && !client_stream_over(s))
        s->needs_reopen = true;
}

int client_stream_detached(lc_stream *s)
{
    lc_client *c = s->client;
    uint64_t old_id = s->id;
    /* The read-ahead's answers still on their way say "detached" too: dropped. */
    client_pending_forget_stream(c, s);
    lc_batch *first = NULL;
    for (lc_batch *b = s->batches; b && !first; b = b->next)
        if (!b->old)
            first = b;
    client_stream_detach(s);
    /* The batches still held of the shared ring stay leased to the old stream id until
     * they are released, which the daemon hears of. */
    if (first && first->old && first->old != &client_unowned_ring) {
        first->old->release = true;
        first->old->release_id = old_id;
    }
    return s->needs_reopen ? 0 : LC_EDETACHED;
}

int client_lost(lc_client *c, const char *fmt, ...)
{
    char msg[CLIENT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->reconnect_ms <= 0 || c->broken || !c->socket_path)
        return client_break(c, LC_ECONNRESET, "%s", msg);
    if (!c->lost) {
        int64_t now = client_now_ms();
        c->lost = true;
        if (!c->lost_since) {
            c->lost_since = now;
            c->attempts = 0;
            c->retry_msg[0] = '\0';
        }
        c->next_try = now;
        snprintf(c->lost_msg, sizeof c->lost_msg, "%s", msg);
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
        client_fds_reset(c);
        /* Whatever was owed a reply, or waited to be sent, was for the daemon that left. */
        c->pending_head = c->pending_len = 0;
        c->deferred_len = 0;
        c->deferred_frames = 0;
        for (lc_stream *s = c->streams; s; s = s->next)
            client_stream_detach(s);
    }
    client_seterr(c, "%s; reconnecting to loaderd at %s", msg, c->socket_path);
    return LC_ECONNRESET;
}

static void client_sleep_ms(int64_t ms)
{
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL); /* a signal cuts it short: the caller looks at the clock again */
}

/* The pause before attempt n + 1: doubling, capped, +-25 % jitter. */
static int64_t client_backoff_ms(lc_client *c)
{
    int64_t ms = CLIENT_BACKOFF_FIRST_MS;
    for (unsigned i = 1; i < c->attempts && ms < CLIENT_BACKOFF_MAX_MS; i++)
        ms *= 2;
    if (ms > CLIENT_BACKOFF_MAX_MS)
        ms = CLIENT_BACKOFF_MAX_MS;
    uint64_t r = ld_splitmix64((uint64_t)client_now_ms() ^ ((uint64_t)getpid() << 32) ^ c->attempts);
    return ms * 3 / 4 + (int64_t)(r % (uint64_t)(ms / 2 + 1));
}

/* An outage is over once every stream is reopened (or has failed): a later loss starts
 * a reconnect time of its own. Until then a daemon that dies again at each reopen is
 * still the same outage. */
static void client_outage_check(lc_client *c)
{
    if (c->lost || !c->lost_since)
        return;
    for (lc_stream *s = c->streams; s; s = s->next)
        if (!s->failed && (s->needs_reopen || s->reopen_id >= 0))
            return;
    c->lost_since = 0;
    c->attempts = 0;
    c->retry_msg[0] = '\0';
}

static int client_stream_fail(lc_stream *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int client_stream_fail(lc_stream *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->failed_msg, sizeof s->failed_msg, fmt, ap);
    va_end(ap);
    s->failed = code;
    s->needs_reopen = false;
    s->reopen_id = -1;
    return code;
}

static int client_reopen_send(lc_stream *s, int64_t deadline, int timeout_ms)
{
    lc_client *c = s->client;
    uint64_t epochs = s->opts.epochs ? s->opts.epochs - (s->next_epoch - s->opts.epoch) : 0;
    /* A reopened stream is served through the socket: mapping a hand-off needs a
     * request of its own, which the reply's arrival (inside another call) cannot make. */
    cJSON *req = client_open_request(s->spec && !s->spec_template ? NULL : s->dataset, &s->opts, s->next_epoch,
                                     s->next_batch, epochs, false);
    if (!req) {
        client_seterr(c, "out of memory building 'open'");
        return LC_ENOMEM;
    }
    int64_t id = -1;
    int ret = client_send(c, req, CLIENT_PENDING_REOPEN, LD_OP_OPEN, s, deadline, timeout_ms, &id);
    if (ret == 0) {
        s->reopen_id = id;
        s->needs_reopen = false;
    }
    return ret;
}

/* Takes the new connection over from n (a client of its own, as client_dial made it). */
static void client_take_over(lc_client *c, lc_client *n)
{
    client_fds_reset(c); /* whatever came on the old connection */
    c->fd = n->fd;
    n->fd = -1;
    proto_reader *r = c->reader;
    c->reader = n->reader;
    n->reader = r;
    c->max_frame = n->max_frame;
    c->server_uid = n->server_uid;
    c->server_pid = n->server_pid;
    c->pending_head = c->pending_len = 0;
    c->deferred_len = 0;
    c->deferred_frames = 0;
    client_free(n);
}

static int client_reconnect_timeout(lc_client *c, int timeout_ms)
{
    int64_t now = client_now_ms();
    client_seterr(c,
                  "timed out after %d ms: %s %.1f s ago, and loaderd at %s has not come back yet (still trying, "
                  "for up to %.1f s in all%s%s)",
                  timeout_ms, c->lost_msg, (double)(now - c->lost_since) / 1000, c->socket_path,
                  (double)c->reconnect_ms / 1000, c->retry_msg[0] ? "; the last attempt: " : "", c->retry_msg);
    return LC_ETIMEDOUT;
}

int client_reconnect(lc_client *c, int64_t deadline, int timeout_ms)
{
    while (c->lost) {
        int64_t now = client_now_ms();
        int64_t give_up = c->lost_since + c->reconnect_ms;
        if (now >= give_up) {
            c->lost = false;
            return client_break(c, LC_ECONNRESET,
                                "%s; gave up reconnecting to loaderd at %s after %.1f s (%u attempt%s; the last: %s)",
                                c->lost_msg, c->socket_path, (double)(now - c->lost_since) / 1000, c->attempts,
                                c->attempts == 1 ? "" : "s", c->retry_msg[0] ? c->retry_msg : "none");
        }
        if (c->next_try > now) {
            int64_t until = c->next_try < give_up ? c->next_try : give_up;
            if (until > deadline)
                until = deadline;
            if (until > now)
                client_sleep_ms(until - now);
            if (client_now_ms() >= deadline && client_now_ms() < give_up)
                return client_reconnect_timeout(c, timeout_ms);
            continue;
        }
        if (now >= deadline)
            return client_reconnect_timeout(c, timeout_ms);
        int64_t try_deadline = deadline < give_up ? deadline : give_up;
        char err[CLIENT_ERRMSG_MAX];
        lc_client *n = NULL;
        int ret = client_dial(c->socket_path, try_deadline, (int)(try_deadline - now), c->name, &n, err, sizeof err);
        if (ret == LC_EPERM || ret == LC_EACCES || ret == LC_EVERSION || ret == LC_EINVAL || ret == LC_ENAMETOOLONG) {
            /* Not a daemon that is still starting: one we must not or cannot talk to. */
            c->lost = false;
            return client_break(c, ret, "%s; reconnecting to loaderd at %s failed: %s", c->lost_msg, c->socket_path,
                                err);
        }
        if (ret < 0) {
            c->attempts++;
            snprintf(c->retry_msg, sizeof c->retry_msg, "%s", err);
            c->next_try = client_now_ms() + client_backoff_ms(c);
            continue;
        }
        client_take_over(c, n);
        c->lost = false;
        c->reconnects++;
        /* Ask for every stream at once; the replies are taken as they come. */
        for (lc_stream *s = c->streams; s && !c->lost; s = s->next) {
            if (!s->needs_reopen)
                continue;
            ret = client_reopen_send(s, deadline, timeout_ms);
            if (ret < 0 && !c->lost && !c->broken)
                client_stream_fail(s, ret, "cannot reopen the stream of '%s' after loaderd came back: %s",
                                   s->dataset, c->error);
        }
        client_outage_check(c);
    }
    return client_check_usable(c);
}

static const char *client_dtype_name(int dtype)
{
    const char *n = proto_dtype_name(dtype);
    return n ? n : "unknown dtype";
}

/* Why the dataset behind a reopened stream is not the one it had: "" when it is. */
static bool client_dataset_changed(const lc_stream *s, const lc_stream *t, char *msg)
{
    if (t->samples_per_epoch != s->samples_per_epoch || t->batches_per_epoch != s->batches_per_epoch) {
        client_msgf(msg, "%llu samples in %llu batches per epoch before, %llu in %llu now",
                    (unsigned long long)s->samples_per_epoch, (unsigned long long)s->batches_per_epoch,
                    (unsigned long long)t->samples_per_epoch, (unsigned long long)t->batches_per_epoch);
        return true;
    }
    if (t->n_fields != s->n_fields) {
        client_msgf(msg, "%d fields before, %d now", s->n_fields, t->n_fields);
        return true;
    }
    for (int i = 0; i < s->n_fields; i++) {
        const struct client_field *a = &s->fields[i], *b = &t->fields[i];
        bool same = strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ragged == b->ragged &&
                    a->ndim == b->ndim;
        for (int d = 0; same && d < a->ndim; d++)
            same = a->shape[d] == b->shape[d];
        if (!same) {
            client_msgf(msg, "field %d was '%s' (%s%s, %d dims), now '%s' (%s%s, %d dims)", i, a->name,
                        client_dtype_name(a->dtype), a->ragged ? ", ragged" : "", a->ndim, b->name,
                        client_dtype_name(b->dtype), b->ragged ? ", ragged" : "", b->ndim);
            return true;
        }
    }
    return false;
}

/* A stream the daemon opened for us that nobody will use: closed with the next request
 * (pipelined, its reply dropped), without blocking the call that read the reply. */
static void client_close_orphan(lc_client *c, int64_t sid)
{
    char saved[CLIENT_ERRMSG_MAX];
    snprintf(saved, sizeof saved, "%s", c->error);
    cJSON *req = cJSON_CreateObject();
    int64_t id;
    if (req && cJSON_AddStringToObject(req, "op", LD_OP_CLOSE) && cJSON_AddNumberToObject(req, "stream", (double)sid))
        (void)client_send_ex(c, req, CLIENT_PENDING_IGNORE, LD_OP_CLOSE, NULL, client_now_ms() + c->timeout_ms,
                             c->timeout_ms, true, &id);
    else
        cJSON_Delete(req);
    snprintf(c->error, sizeof c->error, "%s", saved);
}

void client_stream_reopened(lc_stream *s, cJSON *reply)
{
    lc_client *c = s->client;
    char msg[LD_ERRMSG_MAX], why[LD_ERRMSG_MAX];
    lc_stream *t = NULL;
    const char *shm = NULL;
    int64_t shm_size = 0, sid = -1;
    bool remote = false;
    int ret;
    s->reopen_id = -1;
    ret = proto_reply_status(reply, msg);
    if (ret < 0) {
        client_stream_fail(s, ret,
                           "loaderd came back but did not reopen the stream of '%s' at epoch %llu batch %llu: %s",
                           s->dataset, (unsigned long long)s->next_epoch, (unsigned long long)s->next_batch, msg);
        goto out;
    }
    remote = proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &sid, msg) == 0;
    t = calloc(1, sizeof *t);
    if (!t) {
        client_stream_fail(s, LC_ENOMEM, "out of memory reopening the stream of '%s'", s->dataset);
        goto out;
    }
    t->client = c;
    t->ring_fd = -1;
    ret = client_parse_open(reply, s->batch_size, t, &shm, &shm_size, msg);
    if (ret < 0) {
        client_stream_fail(s, ret, "malformed open reply from loaderd reopening the stream of '%s': %s", s->dataset,
                           msg);
        goto out;
    }
    if (client_dataset_changed(s, t, why)) {
        client_stream_fail(s, LC_EDATASET,
                           "dataset '%s' changed while loaderd was away (%s): the stream cannot resume at epoch %llu "
                           "batch %llu without mixing two datasets; open a new stream to start over",
                           s->dataset, why, (unsigned long long)s->next_epoch, (unsigned long long)s->next_batch);
        goto out;
    }
    if ((uint64_t)shm_size > SIZE_MAX) {
        client_stream_fail(s, LC_EPROTO, "ring of %lld bytes cannot be mapped here", (long long)shm_size);
        goto out;
    }
    ret = client_map_ring(t, shm, (uint64_t)shm_size, msg);
    if (ret < 0) {
        client_stream_fail(s, ret, "reopening the stream of '%s': %s", s->dataset, msg);
        goto out;
    }
    if (s->dev_ordinal >= 0 && (ret = client_device_open(t, reply, s->dev_ordinal, msg)) < 0) {
        client_stream_fail(s, ret, "reopening the stream of '%s' on cuda:%d: %s", s->dataset, s->dev_ordinal, msg);
        goto out;
    }
    /* The same fields (checked above); where they lie in a slot, and the slots
     * themselves, are the new ring's. */
    s->id = t->id;
    s->ring_id = t->ring_id;
    s->slot_count = t->slot_count;
    s->slot_size = t->slot_size;
    s->slot_offset = t->slot_offset;
    memcpy(s->fields, t->fields, sizeof s->fields);
    s->map = t->map;
    s->map_size = t->map_size;
    s->dev = t->dev;
    t->dev = NULL;
    s->ring_fd = t->ring_fd;
    t->map = NULL;
    t->ring_fd = -1;
    s->reopens++;
    remote = false;
out:
    if (remote)
        client_close_orphan(c, sid);
    client_stream_free(t);
    cJSON_Delete(reply);
    client_outage_check(c);
}

void client_stream_reopened_or_orphan(lc_client *c, lc_stream *s, cJSON *reply)
{
    if (s) {
        client_stream_reopened(s, reply);
        return;
    }
    char msg[LD_ERRMSG_MAX];
    int64_t sid;
    if (proto_reply_status(reply, msg) == 0 && proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &sid, msg) == 0)
        client_close_orphan(c, sid);
    cJSON_Delete(reply);
}

int client_stream_ready(lc_stream *s, int64_t deadline, int timeout_ms)
{
    lc_client *c = s->client;
    int ret;
    for (;;) {
        if (s->failed) {
            client_seterr(c, "%s", s->failed_msg);
            return s->failed;
        }
        if (c->lost) {
            if ((ret = client_reconnect(c, deadline, timeout_ms)) < 0)
                return ret;
            continue;
        }
        if (c->broken)
            return client_check_usable(c);
        if (s->needs_reopen) {
            ret = client_reopen_send(s, deadline, timeout_ms);
            if (ret < 0 && !c->lost)
                return ret;
            continue;
        }
        if (s->reopen_id >= 0) {
            cJSON *reply = NULL;
            ret = client_wait(c, s->reopen_id, deadline, timeout_ms, &reply);
            if (ret == 0) {
                client_stream_reopened(s, reply);
                continue;
            }
            if (c->lost)
                continue;
            if (ret == LC_ETIMEDOUT) {
                /* The reply, when it comes, is applied by whichever call reads it. */
                client_seterr(c, "timed out after %d ms waiting for loaderd to reopen the stream of '%s'", timeout_ms,
                              s->dataset);
            }
            return ret;
        }
        return 0;
    }
}
