/* client — libloaderclient: a trainer's blocking, timeout-bounded view of loaderd.
 *
 * One lc_client is one Unix-socket connection. The socket is non-blocking from the
 * start and every read and write goes through poll() against a deadline, so each call
 * honours its timeout whatever the daemon does. Requests carry increasing ids and the
 * daemon answers in order; the requests still owed a reply are kept in a FIFO
 * (c->pending), and whichever call is reading replies settles the ones in front of
 * its own:
 *  - a release is pipelined: lc_batch_release queues its frame and returns; queued
 *    frames go out in the same write as the next request (in a training loop, the
 *    read-ahead `next`), so a batch costs the daemon one wake-up, not two. When its reply
 *    turns out to be an error, we keep the message in lc_client_error() and count it
 *    (c->release_errors), but we do not fail the unrelated call that happened to read
 *    it: that call did succeed, and a failed release changes nothing on the daemon
 *    (the slot is freed with the stream or the connection at the latest). The next
 *    lc_batch_release or lc_stream_close returns it, once, so the caller does learn of it;
 *  - a next that timed out stays outstanding; its reply, when it comes, is kept on its
 *    stream and the stream's next lc_stream_next returns it instead of asking again;
 *  - any other call that timed out is forgotten: its late reply is dropped.
 * Because replies keep request order, a request made while a timed-out next is still
 * outstanding waits behind it: it completes only once that batch is ready (and the
 * batch is then kept for the stream), so a trainer that holds every slot of a stream
 * must release one before anything else on that connection can be answered.
 * A reply whose id is not the one expected, or a peer that hangs up, breaks the
 * connection: the fd is closed, and every later call fails with LC_ECLOSED and a
 * message naming the original failure.
 *
 * A stream maps its shared-memory ring read-only; a batch is a lease on one slot and
 * its fields are views into the mapping. lc_stream_close frees the batches still held
 * (they are invalid afterwards: never release a batch after closing its stream), and
 * lc_client_close does the same for every stream without a round trip per stream,
 * since closing the connection makes the daemon tear everything down.
 *
 * Library code: nothing here prints; every failure is a code and a message. */
#include "loaderclient.h"
#include "client_internal.h"
#include "proto.h"
#include "proto_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* The public LC_E* codes and the daemon's LD_E* codes are generated from one list
 * (loaderclient_errors.h); these only guard the generation itself. */
_Static_assert((int)LC_EFIELD == (int)LD_EFIELD && (int)LC_ECANCELED == (int)LD_ECANCELED, "one error table");
_Static_assert(LD_SLOT_COUNT_MAX <= UINT32_MAX, "slot counts are uint32_t");

/* The version comes from the VERSION file, through the Makefile. */
#if !defined(LD_VERSION) || !defined(LD_VERSION_NUMBER)
#error "LD_VERSION and LD_VERSION_NUMBER are defined by the Makefile (from VERSION)"
#endif
_Static_assert(LC_DTYPE_UINT8 == LD_DTYPE_UINT8, "LC_DTYPE_UINT8");
_Static_assert(LC_DTYPE_UINT16 == LD_DTYPE_UINT16, "LC_DTYPE_UINT16");
_Static_assert(LC_DTYPE_UINT32 == LD_DTYPE_UINT32, "LC_DTYPE_UINT32");
_Static_assert(LC_DTYPE_INT32 == LD_DTYPE_INT32, "LC_DTYPE_INT32");
_Static_assert(LC_DTYPE_INT64 == LD_DTYPE_INT64, "LC_DTYPE_INT64");
_Static_assert(LC_DTYPE_FLOAT16 == LD_DTYPE_FLOAT16, "LC_DTYPE_FLOAT16");
_Static_assert(LC_DTYPE_FLOAT32 == LD_DTYPE_FLOAT32, "LC_DTYPE_FLOAT32");
_Static_assert(LC_MAX_DIMS == LD_MAX_DIMS + 1, "lc_field.shape holds the batch dim + a sample's dims");

/* ---- small helpers ------------------------------------------------------------------ */

static int64_t client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before deadline, for poll(): never negative. */
static int client_remaining_ms(int64_t deadline)
{
    int64_t left = deadline - client_now_ms();
    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

static int client_effective_timeout(const lc_client *c, int timeout_ms)
{
    return timeout_ms > 0 ? timeout_ms : c->timeout_ms;
}

static void client_fmt(char *buf, size_t size, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void client_fmt(char *buf, size_t size, const char *fmt, va_list ap)
{
    if (buf && size > 0)
        vsnprintf(buf, size, fmt, ap);
}

/* Formats into a LD_ERRMSG_MAX buffer; long messages are cut, which is fine for errors. */
static void client_msgf(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void client_msgf(char *msg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_fmt(msg, LD_ERRMSG_MAX, fmt, ap);
    va_end(ap);
}

static void client_seterr(lc_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void client_seterr(lc_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_fmt(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
}

/* Marks the connection broken: later calls fail with LC_ECLOSED quoting this. */
static int client_break(lc_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int client_break(lc_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_fmt(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    if (!c->broken) {
        c->broken = code;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", c->error);
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
    }
    return code;
}

static int client_check_usable(lc_client *c)
{
    if (!c->broken)
        return 0;
    client_seterr(c, "connection to loaderd is closed: %s", c->broken_msg);
    return LC_ECLOSED;
}

/* ---- the pending-reply FIFO ------------------------------------------------------- */

/* Makes room for one more entry, so that after a successful send the push cannot fail. */
static int client_pending_reserve(lc_client *c)
{
    if (c->pending_len < c->pending_cap)
        return 0;
    if (c->pending_head > 0) {
        memmove(c->pending, c->pending + c->pending_head,
                (c->pending_len - c->pending_head) * sizeof *c->pending);
        c->pending_len -= c->pending_head;
        c->pending_head = 0;
        return 0;
    }
    size_t cap = c->pending_cap ? c->pending_cap * 2 : 16;
    struct client_pending *p = realloc(c->pending, cap * sizeof *p);
    if (!p)
        return LC_ENOMEM;
    c->pending = p;
    c->pending_cap = cap;
    return 0;
}

static struct client_pending *client_pending_find(lc_client *c, int64_t id)
{
    for (size_t i = c->pending_head; i < c->pending_len; i++)
        if (c->pending[i].id == id)
            return &c->pending[i];
    return NULL;
}

/* A stream going away: replies owed to it are dropped when they come. */
static void client_pending_forget_stream(lc_client *c, const lc_stream *s)
{
    for (size_t i = c->pending_head; i < c->pending_len; i++) {
        if (c->pending[i].stream == s) {
            c->pending[i].stream = NULL;
            if (c->pending[i].kind == CLIENT_PENDING_NEXT)
                c->pending[i].kind = CLIENT_PENDING_IGNORE;
        }
    }
}

/* ---- sending ------------------------------------------------------------------------ */

/* The daemon hung up while we were sending: it may have said why first (a full
 * daemon, a deadline), in an error frame that is already in our receive queue. */
static int client_break_closed(lc_client *c)
{
    char buf[4096], msg[LD_ERRMSG_MAX];
    ssize_t n;
    while ((n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
        if (proto_reader_feed(c->reader, buf, (size_t)n) < 0)
            break;
    const char *payload;
    size_t len;
    while (proto_reader_next(c->reader, &payload, &len) == 1) {
        cJSON *reply = NULL;
        if (proto_parse(payload, len, &reply, msg) == 0 && proto_request_id(reply) < 0) {
            int st = proto_reply_status(reply, msg);
            cJSON_Delete(reply);
            if (st < 0)
                return client_break(c, st, "loaderd closed the connection: %s", msg);
            continue;
        }
        cJSON_Delete(reply);
    }
    return client_break(c, LC_ECONNRESET, "loaderd closed the connection");
}

/* Writes all of buf before the deadline. A partial frame left behind means the framing
 * is lost, so that breaks the connection; nothing sent at all does not. */
static int client_send_all(lc_client *c, const char *buf, size_t len, int64_t deadline,
                           const char *op, int timeout_ms)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(c->fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = { .fd = c->fd, .events = POLLOUT };
            int left = client_remaining_ms(deadline);
            int r = left > 0 ? poll(&pfd, 1, left) : 0;
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                return client_break(c, ld_from_errno(errno), "poll on the loaderd socket: %s",
                                    strerror(errno));
            if (r == 0) {
                if (done == 0) {
                    client_seterr(c, "timed out after %d ms sending '%s' to loaderd", timeout_ms, op);
                    return LC_ETIMEDOUT;
                }
                return client_break(c, LC_ETIMEDOUT,
                                    "timed out after %d ms sending '%s' to loaderd (request cut short)",
                                    timeout_ms, op);
            }
            continue;
        }
        int e = n < 0 ? errno : EPIPE;
        if (e == EPIPE || e == ECONNRESET)
            return client_break_closed(c);
        return client_break(c, ld_from_errno(e), "sending '%s' to loaderd: %s", op, strerror(e));
    }
    return 0;
}

/* Adds an id to msg (taking ownership of msg), sends it and queues what to do with its
 * reply. On success *ret_id is the request's id. */
/* Appends a frame to the deferred buffer. */
static int client_defer(lc_client *c, const char *frame, size_t len)
{
    if (c->deferred_len + len > c->deferred_cap) {
        size_t cap = c->deferred_cap ? c->deferred_cap : 4096;
        while (cap < c->deferred_len + len)
            cap *= 2;
        char *p = realloc(c->deferred, cap);
        if (!p)
            return LC_ENOMEM;
        c->deferred = p;
        c->deferred_cap = cap;
    }
    memcpy(c->deferred + c->deferred_len, frame, len);
    c->deferred_len += len;
    c->deferred_frames++;
    return 0;
}

/* Sends the deferred frames (and nothing else). */
static int client_flush_deferred(lc_client *c, int64_t deadline, int timeout_ms)
{
    if (!c->deferred_len)
        return 0;
    int ret = client_send_all(c, c->deferred, c->deferred_len, deadline, "release", timeout_ms);
    if (ret == 0) {
        c->deferred_len = 0;
        c->deferred_frames = 0;
    }
    return ret;
}

/* Adds an id to msg (taking ownership of msg) and sends it, after the deferred frames
 * in the same write; with `defer`, queues it among them instead. Either way the FIFO
 * learns what to do with its reply. On success *ret_id is the request's id. */
static int client_send_ex(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s,
                          int64_t deadline, int timeout_ms, bool defer, int64_t *ret_id)
{
    char *frame = NULL;
    size_t frame_len = 0;
    int64_t id = c->next_id;
    int ret = client_check_usable(c);
    if (ret < 0)
        goto out;
    if (!msg || !cJSON_AddNumberToObject(msg, "id", (double)id)) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory building '%s'", op);
        goto out;
    }
    ret = proto_encode(msg, &frame, &frame_len);
    if (ret < 0) {
        client_seterr(c, "cannot encode '%s': %s", op, ld_strerror(ret));
        goto out;
    }
    if (frame_len - LD_FRAME_HEADER_SIZE > c->max_frame) {
        ret = LC_EINVAL;
        client_seterr(c, "request '%s' of %zu bytes is over loaderd's frame limit of %u bytes", op,
                      frame_len - LD_FRAME_HEADER_SIZE, c->max_frame);
        goto out;
    }
    ret = client_pending_reserve(c);
    if (ret < 0) {
        client_seterr(c, "out of memory queueing '%s'", op);
        goto out;
    }
    if (defer || c->deferred_len) {
        ret = client_defer(c, frame, frame_len);
        if (ret < 0) {
            client_seterr(c, "out of memory queueing '%s'", op);
            goto out;
        }
        if (!defer) {
            ret = client_flush_deferred(c, deadline, timeout_ms);
            if (ret < 0) {
                /* Nothing of it went out (a partial write breaks the connection):
                 * take our frame back so the FIFO and the buffer agree. */
                c->deferred_len -= frame_len;
                c->deferred_frames--;
                goto out;
            }
        }
    } else {
        ret = client_send_all(c, frame, frame_len, deadline, op, timeout_ms);
        if (ret < 0)
            goto out;
    }
    struct client_pending *p = &c->pending[c->pending_len++];
    memset(p, 0, sizeof *p);
    p->id = id;
    p->kind = kind;
    p->stream = s;
    snprintf(p->op, sizeof p->op, "%s", op);
    c->next_id++;
    *ret_id = id;
out:
    free(frame);
    cJSON_Delete(msg);
    return ret;
}

static int client_send(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s,
                       int64_t deadline, int timeout_ms, int64_t *ret_id)
{
    return client_send_ex(c, msg, kind, op, s, deadline, timeout_ms, false, ret_id);
}

/* ---- receiving ---------------------------------------------------------------------- */

/* Settles one reply that is not the one being waited for. Takes ownership of reply. */
static void client_settle(lc_client *c, const struct client_pending *p, cJSON *reply)
{
    char msg[LD_ERRMSG_MAX];
    switch (p->kind) {
    case CLIENT_PENDING_RELEASE: {
        int st = proto_reply_status(reply, msg);
        if (st < 0) {
            c->release_errors++;
            client_seterr(c, "release of slot %d (generation %llu) of stream %llu failed: %s", p->slot,
                          (unsigned long long)p->generation, (unsigned long long)p->stream_id, msg);
            if (!c->release_failed) { /* the first one not yet reported to the caller */
                c->release_failed = st;
                snprintf(c->release_msg, sizeof c->release_msg, "%s", c->error);
            }
        }
        break;
    }
    case CLIENT_PENDING_NEXT:
        if (p->stream) {
            lc_stream *st = p->stream;
            for (unsigned k = 0; k < st->ahead_count; k++) {
                unsigned i = (st->ahead_head + k) % CLIENT_READ_AHEAD;
                if (st->ahead_id[i] == p->id && !st->ahead_reply[i]) {
                    st->ahead_reply[i] = reply;
                    reply = NULL;
                    break;
                }
            }
        }
        break;
    default:
        break;
    }
    cJSON_Delete(reply);
}

/* A release the daemon refused, reported once to the caller of a later release or of
 * lc_stream_close (releases are pipelined: the refusal arrives after the call that
 * sent it has returned). */
static int client_take_release_failure(lc_client *c)
{
    int rc = c->release_failed;
    if (rc < 0) {
        c->release_failed = 0;
        client_seterr(c, "%s", c->release_msg);
    }
    return rc;
}

/* Takes every complete frame out of the reader. Stops at the one with id `want`
 * (returned in *ret_reply, owned by the caller) or when no whole frame is left. */
static int client_take_frames(lc_client *c, int64_t want, cJSON **ret_reply)
{
    for (;;) {
        const char *payload = NULL;
        size_t len = 0;
        char msg[LD_ERRMSG_MAX];
        int r = proto_reader_next(c->reader, &payload, &len);
        if (r < 0)
            return client_break(c, LC_EPROTO, "bad frame from loaderd: %s", ld_strerror(r));
        if (r == 0)
            return 0;
        cJSON *reply = NULL;
        r = proto_parse(payload, len, &reply, msg);
        if (r < 0)
            return client_break(c, LC_EPROTO, "malformed reply from loaderd: %s", msg);
        int64_t id = proto_request_id(reply);
        if (c->pending_head == c->pending_len || id != c->pending[c->pending_head].id) {
            /* A reply with a null id is the daemon ending the connection (the framing
             * broke, a limit, a deadline): its code and message say why. */
            int code = LC_EPROTO, st;
            if (id < 0 && (st = proto_reply_status(reply, msg)) < 0)
                client_break(c, code = st, "loaderd closed the connection: %s", msg);
            else if (c->pending_head == c->pending_len)
                client_break(c, code, "unexpected reply from loaderd (id %lld, no request outstanding)",
                             (long long)id);
            else
                client_break(c, code, "reply out of order from loaderd: id %lld, expected %lld",
                             (long long)id, (long long)c->pending[c->pending_head].id);
            cJSON_Delete(reply);
            return code;
        }
        struct client_pending p = c->pending[c->pending_head++];
        if (c->pending_head == c->pending_len)
            c->pending_head = c->pending_len = 0;
        if (id == want) {
            *ret_reply = reply;
            return 1;
        }
        client_settle(c, &p, reply);
    }
}

/* Reads replies until the one with id `want` arrives (returned in *ret_reply) or the
 * deadline passes (LC_ETIMEDOUT; the request stays in the FIFO). want = -1 settles what
 * has arrived and returns 0 at the deadline. */
static int client_wait(lc_client *c, int64_t want, int64_t deadline, int timeout_ms, cJSON **ret_reply)
{
    char buf[65536];
    for (;;) {
        cJSON *reply = NULL;
        int r = client_take_frames(c, want, &reply);
        if (r < 0)
            return r;
        if (r == 1) {
            *ret_reply = reply;
            return 0;
        }
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            r = proto_reader_feed(c->reader, buf, (size_t)n);
            if (r == LD_EMSGSIZE)
                return client_break(c, LC_EPROTO, "reply from loaderd larger than %u bytes",
                                    (unsigned)CLIENT_REPLY_LIMIT);
            if (r < 0)
                return client_break(c, r, "reading loaderd's reply: %s", ld_strerror(r));
            continue;
        }
        if (n == 0)
            return client_break(c, LC_ECONNRESET, "loaderd closed the connection");
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET)
            return client_break(c, LC_ECONNRESET, "loaderd closed the connection");
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return client_break(c, ld_from_errno(errno), "reading from loaderd: %s", strerror(errno));
        int left = client_remaining_ms(deadline);
        if (left == 0) {
            if (want < 0)
                return 0;
            struct client_pending *p = client_pending_find(c, want);
            client_seterr(c, "timed out after %d ms waiting for loaderd's reply to '%s'", timeout_ms,
                          p ? p->op : "request");
            return LC_ETIMEDOUT;
        }
        /* About to block: a queued release may be what the daemon needs to answer. */
        if (c->deferred_len && (r = client_flush_deferred(c, deadline, timeout_ms)) < 0)
            return r;
        struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
        if (poll(&pfd, 1, left) < 0 && errno != EINTR)
            return client_break(c, ld_from_errno(errno), "poll on the loaderd socket: %s", strerror(errno));
    }
}

/* One request and its reply. A reply that says ok:false is returned as its code with
 * the daemon's message in c->error (and *ret_reply is not set). When the call times
 * out, its late reply will be dropped. */
static int client_call(lc_client *c, cJSON *msg, const char *op, int timeout_ms, cJSON **ret_reply)
{
    int64_t deadline = client_now_ms() + timeout_ms;
    int64_t id = -1;
    cJSON *reply = NULL;
    char msgbuf[LD_ERRMSG_MAX];
    int ret = client_send(c, msg, CLIENT_PENDING_CALL, op, NULL, deadline, timeout_ms, &id);
    if (ret < 0)
        return ret;
    ret = client_wait(c, id, deadline, timeout_ms, &reply);
    if (ret == LC_ETIMEDOUT) {
        struct client_pending *p = client_pending_find(c, id);
        if (p)
            p->kind = CLIENT_PENDING_IGNORE;
    }
    if (ret < 0)
        return ret;
    ret = proto_reply_status(reply, msgbuf);
    if (ret < 0) {
        client_seterr(c, "%s", msgbuf);
        cJSON_Delete(reply);
        return ret;
    }
    *ret_reply = reply;
    return 0;
}

/* ---- versions, errors, defaults ------------------------------------------------------ */

LC_EXPORT const char *lc_version(void)
{
    return LD_VERSION;
}

LC_EXPORT int lc_version_number(void)
{
    return LD_VERSION_NUMBER;
}

LC_EXPORT const char *lc_strerror(int code)
{
    return ld_strerror(code);
}

LC_EXPORT const char *lc_error_name(int code)
{
    return ld_error_name(code);
}

static const int client_error_codes[] = {
#define CLIENT_ERROR_CODE(name, value, wire, msg) (value),
    LC_ERROR_MAP(CLIENT_ERROR_CODE)
#undef CLIENT_ERROR_CODE
};

LC_EXPORT int lc_error_code(int index)
{
    if (index < 0 || (size_t)index >= sizeof client_error_codes / sizeof client_error_codes[0])
        return 0;
    return client_error_codes[index];
}

static const struct {
    const char *name;
    int64_t value;
} client_limits[] = {
#define CLIENT_LIMIT(name, value) {name, (int64_t)(value)},
    LD_LIMIT_MAP(CLIENT_LIMIT)
#undef CLIENT_LIMIT
};

LC_EXPORT int64_t lc_limit(const char *name)
{
    for (size_t i = 0; name && i < sizeof client_limits / sizeof client_limits[0]; i++)
        if (strcmp(client_limits[i].name, name) == 0)
            return client_limits[i].value;
    return LC_EINVAL;
}

LC_EXPORT const char *lc_limit_name(int index)
{
    if (index < 0 || (size_t)index >= sizeof client_limits / sizeof client_limits[0])
        return NULL;
    return client_limits[index].name;
}

LC_EXPORT const char *lc_default_socket(void)
{
    /* Thread-local, so that two threads asking at once do not scribble on each other.
     * The daemon computes its default with the same function. */
    static _Thread_local char buf[PATH_MAX];
    (void)proto_socket_default(buf, sizeof buf);
    return buf;
}

LC_EXPORT const char *lc_client_error(const lc_client *c)
{
    return c ? c->error : "";
}

LC_EXPORT void lc_free(void *p)
{
    free(p);
}

/* ---- connect -------------------------------------------------------------------------- */

static int client_connect_socket(const char *path, int64_t deadline, int timeout_ms, int *ret_fd,
                                 char *errbuf, size_t errbuf_size)
{
    struct sockaddr_un sa;
    size_t plen = strlen(path);
    int fd = -1;
    int ret;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (plen >= sizeof sa.sun_path) {
        snprintf(errbuf, errbuf_size, "socket path too long (%zu bytes, max %zu): %s", plen,
                 sizeof sa.sun_path - 1, path);
        return LC_EINVAL;
    }
    if (plen == 0) {
        snprintf(errbuf, errbuf_size, "empty socket path");
        return LC_EINVAL;
    }
    memcpy(sa.sun_path, path, plen + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        ret = ld_from_errno(errno);
        snprintf(errbuf, errbuf_size, "cannot create a socket: %s", strerror(errno));
        goto out;
    }
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            break;
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN || e == EINPROGRESS) {
            /* EAGAIN on a Unix socket: the daemon's backlog is full; try again shortly.
             * EINPROGRESS: wait for writability, then read the outcome. */
            int left = client_remaining_ms(deadline);
            if (left == 0) {
                ret = LC_ETIMEDOUT;
                snprintf(errbuf, errbuf_size, "cannot connect to %s: timed out after %d ms", path,
                         timeout_ms);
                goto out;
            }
            if (e == EAGAIN) {
                struct timespec ts = { 0, 2 * 1000 * 1000 };
                nanosleep(&ts, NULL);
                continue;
            }
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            int r = poll(&pfd, 1, left);
            if (r <= 0)
                continue;
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                soerr = errno;
            if (soerr == 0)
                break;
            e = soerr;
        }
        ret = ld_from_errno(e);
        snprintf(errbuf, errbuf_size, "cannot connect to %s: %s%s", path, strerror(e),
                 (e == ENOENT || e == ECONNREFUSED) ? " (is loaderd running?)" : "");
        goto out;
    }
    *ret_fd = fd;
    fd = -1;
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

/* The uids a daemon may run as: $LOADERD_UID (a number or a user name) when set, else
 * this user or root. A wrong LOADERD_UID is an error, not a silent default. */
static int client_expected_uids(uid_t ret_uids[2], int *ret_n, char *errbuf, size_t errbuf_size)
{
    const char *env = getenv("LOADERD_UID");
    if (!env || !*env) {
        ret_uids[0] = getuid();
        ret_uids[1] = 0;
        *ret_n = 2;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long v = strtoul(env, &end, 10);
    if (env[0] >= '0' && env[0] <= '9' && *end == '\0' && errno == 0 && v < (uid_t)-1) {
        ret_uids[0] = (uid_t)v;
        *ret_n = 1;
        return 0;
    }
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwnam_r(env, &pw, buf, sizeof buf, &found) != 0 || !found) {
        snprintf(errbuf, errbuf_size, "LOADERD_UID='%s' is neither a uid nor a user name", env);
        return LC_EINVAL;
    }
    ret_uids[0] = found->pw_uid;
    *ret_n = 1;
    return 0;
}

/* Who listens on the socket (SO_PEERCRED): another user may have bound the path first,
 * and would then be trusted with everything the trainer reads. */
static int client_check_peer(int fd, const char *path, uid_t *ret_uid, char *errbuf, size_t errbuf_size)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    uid_t want[2];
    int n = 0, ret;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        ret = ld_from_errno(errno);
        snprintf(errbuf, errbuf_size, "cannot tell who listens on %s (SO_PEERCRED): %s", path, strerror(errno));
        return ret;
    }
    if ((ret = client_expected_uids(want, &n, errbuf, errbuf_size)) < 0)
        return ret;
    for (int i = 0; i < n; i++)
        if (cred.uid == want[i]) {
            *ret_uid = cred.uid;
            return 0;
        }
    if (n == 2)
        snprintf(errbuf, errbuf_size,
                 "the process listening on %s (pid %d) runs as uid %u, but loaderd is expected to run as uid %u "
                 "(this user) or 0 (root): refusing to talk to it; if that daemon is the right one, set "
                 "LOADERD_UID=%u",
                 path, (int)cred.pid, (unsigned)cred.uid, (unsigned)want[0], (unsigned)cred.uid);
    else
        snprintf(errbuf, errbuf_size,
                 "the process listening on %s (pid %d) runs as uid %u, but loaderd is expected to run as uid %u "
                 "(LOADERD_UID): refusing to talk to it",
                 path, (int)cred.pid, (unsigned)cred.uid, (unsigned)want[0]);
    return LC_EPERM;
}

static void client_free(lc_client *c)
{
    if (!c)
        return;
    while (c->streams) {
        lc_stream *s = c->streams;
        c->streams = s->next;
        while (s->batches) {
            lc_batch *b = s->batches;
            s->batches = b->next;
            free(b);
        }
        if (s->map)
            munmap((void *)s->map, s->map_size);
        for (unsigned k = 0; k < CLIENT_READ_AHEAD; k++)
            cJSON_Delete(s->ahead_reply[k]);
        free(s);
    }
    if (c->fd >= 0)
        close(c->fd);
    proto_reader_free(c->reader);
    free(c->pending);
    free(c->deferred);
    free(c);
}

LC_EXPORT int lc_connect(const char *socket_path, int timeout_ms, const char *client_name,
                         lc_client **ret_client, char *errbuf, size_t errbuf_size)
{
    char scratch[8];
    lc_client *c = NULL;
    cJSON *hello = NULL, *reply = NULL;
    int ret;
    if (!errbuf || errbuf_size == 0) {
        errbuf = scratch;
        errbuf_size = sizeof scratch;
    }
    errbuf[0] = '\0';
    if (!ret_client) {
        snprintf(errbuf, errbuf_size, "lc_connect: ret_client is NULL");
        return LC_EINVAL;
    }
    if (!socket_path)
        socket_path = lc_default_socket();
    /* The default socket's directory must be ours alone; a missing one is left to the
     * connect, whose message says whether loaderd runs. */
    char dirmsg[LD_ERRMSG_MAX];
    ret = proto_socket_check_path(socket_path, false, dirmsg);
    if (ret < 0 && ret != LD_ENOENT) {
        snprintf(errbuf, errbuf_size, "%s", dirmsg);
        return ret;
    }
    if (timeout_ms <= 0)
        timeout_ms = CLIENT_DEFAULT_TIMEOUT_MS;
    int64_t deadline = client_now_ms() + timeout_ms;

    c = calloc(1, sizeof *c);
    if (!c) {
        ret = LC_ENOMEM;
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    c->fd = -1;
    c->timeout_ms = timeout_ms;
    c->max_frame = LD_FRAME_MAX_LIMIT;
    ret = proto_reader_new(CLIENT_REPLY_LIMIT, &c->reader);
    if (ret < 0) {
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    ret = client_connect_socket(socket_path, deadline, timeout_ms, &c->fd, errbuf, errbuf_size);
    if (ret < 0)
        goto out;
    ret = client_check_peer(c->fd, socket_path, &c->server_uid, errbuf, errbuf_size);
    if (ret < 0)
        goto out;

    hello = cJSON_CreateObject();
    if (!hello || !cJSON_AddStringToObject(hello, "op", LD_OP_HELLO) ||
        !cJSON_AddNumberToObject(hello, "version", LD_PROTO_VERSION) ||
        (client_name && !cJSON_AddStringToObject(hello, "client", client_name))) {
        ret = LC_ENOMEM;
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    int64_t id = -1;
    ret = client_send(c, hello, CLIENT_PENDING_CALL, LD_OP_HELLO, NULL, deadline, timeout_ms, &id);
    hello = NULL;
    if (ret == 0)
        ret = client_wait(c, id, deadline, timeout_ms, &reply);
    if (ret < 0) {
        snprintf(errbuf, errbuf_size, "hello to loaderd at %s: %s", socket_path, c->error);
        goto out;
    }
    char msg[LD_ERRMSG_MAX];
    ret = proto_reply_status(reply, msg);
    if (ret < 0) {
        snprintf(errbuf, errbuf_size, "loaderd at %s refused hello: %s", socket_path, msg);
        goto out;
    }
    int64_t version = 0, max_frame = 0, pid = 0;
    ret = proto_get_int(reply, "version", 0, INT32_MAX, &version, msg);
    if (ret == 0 && version != LD_PROTO_VERSION) {
        ret = LC_EVERSION;
        snprintf(errbuf, errbuf_size, "loaderd at %s speaks protocol version %lld, this client %d",
                 socket_path, (long long)version, LD_PROTO_VERSION);
        goto out;
    }
    if (ret == 0)
        ret = proto_opt_int(reply, "max_frame", LD_FRAME_MIN_LIMIT, LD_FRAME_MAX_LIMIT,
                            LD_FRAME_DEFAULT_LIMIT, &max_frame, msg);
    if (ret == 0)
        ret = proto_opt_int(reply, "pid", 0, INT32_MAX, 0, &pid, msg);
    if (ret < 0) {
        ret = LC_EPROTO;
        snprintf(errbuf, errbuf_size, "malformed hello reply from loaderd at %s: %s", socket_path, msg);
        goto out;
    }
    c->max_frame = (uint32_t)max_frame;
    c->server_pid = pid;
    *ret_client = c;
    c = NULL;
    ret = 0;
out:
    cJSON_Delete(hello);
    cJSON_Delete(reply);
    client_free(c);
    return ret;
}

LC_EXPORT void lc_client_close(lc_client *c)
{
    /* No close per stream: the daemon tears down every stream and lease of a
     * connection when it closes, and that cannot hang on a stuck daemon. */
    client_free(c);
}

LC_EXPORT int lc_request_json(lc_client *c, const char *request_json, char **ret_reply_json)
{
    char msg[LD_ERRMSG_MAX];
    cJSON *req = NULL, *reply = NULL;
    char op[LD_OP_NAME_MAX + 1] = "request";
    int ret;
    if (!c)
        return LC_EINVAL;
    if (!request_json || !ret_reply_json) {
        client_seterr(c, "lc_request_json: request_json and ret_reply_json are required");
        return LC_EINVAL;
    }
    ret = proto_parse(request_json, strlen(request_json), &req, msg);
    if (ret < 0) {
        client_seterr(c, "request is not a JSON object: %s", msg);
        return LC_EINVAL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(req, "id");
    const cJSON *jop = cJSON_GetObjectItemCaseSensitive(req, "op");
    if (cJSON_IsString(jop))
        snprintf(op, sizeof op, "%s", jop->valuestring);
    ret = client_call(c, req, op, c->timeout_ms, &reply);
    req = NULL;
    if (ret < 0)
        goto out;
    char *printed = cJSON_PrintUnformatted(reply);
    char *copy = printed ? strdup(printed) : NULL; /* lc_free is free(), whatever cJSON's hooks */
    cJSON_free(printed);
    if (!copy) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory printing the reply");
        goto out;
    }
    *ret_reply_json = copy;
    ret = 0;
out:
    cJSON_Delete(reply);
    return ret;
}

/* ---- streams ---------------------------------------------------------------------------- */

LC_EXPORT void lc_stream_options_init(lc_stream_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->shuffle = 1;
    o->world_size = 1;
}

/* The first published layouts: a caller's struct_size may not be smaller. */
#define CLIENT_OPTIONS_V0_SIZE (offsetof(lc_stream_options, epochs) + sizeof(uint64_t))
#define CLIENT_FIELD_V0_SIZE (offsetof(lc_field, offsets) + sizeof(const int64_t *))

/* Copies a caller's versioned struct of `theirs` bytes into ours (`ours` bytes, already
 * holding the defaults): the common prefix is copied, members the caller does not know
 * keep their defaults, and members we do not know must be zero (their default, as far
 * as a newer header is concerned) or we would silently ignore what was asked. */
static int client_copy_struct_in(void *dst, size_t ours, const void *src, size_t theirs, size_t min,
                                 const char *what, char *msg)
{
    if (theirs < min) {
        client_msgf(msg, "%s.struct_size is %zu, below the smallest layout (%zu bytes): initialise it with "
                    "%s_init()", what, theirs, min, what);
        return LC_EINVAL;
    }
    memcpy(dst, src, theirs < ours ? theirs : ours);
    for (size_t i = ours; i < theirs; i++) {
        if (((const unsigned char *)src)[i] != 0) {
            client_msgf(msg, "%s sets a member at byte %zu that this library (%s, %zu-byte struct) does not "
                        "know: the trainer was built against a newer loaderclient.h", what, i, LD_VERSION, ours);
            return LC_ENOTSUP;
        }
    }
    ((size_t *)dst)[0] = ours;
    return 0;
}

LC_EXPORT uint64_t lc_stream_batches_per_epoch(const lc_stream *s) { return s ? s->batches_per_epoch : 0; }
LC_EXPORT uint64_t lc_stream_samples_per_epoch(const lc_stream *s) { return s ? s->samples_per_epoch : 0; }
LC_EXPORT uint64_t lc_stream_id(const lc_stream *s) { return s ? s->id : 0; }

LC_EXPORT const void *lc_stream_ring(const lc_stream *s, size_t *ret_size)
{
    if (!s)
        return NULL;
    if (ret_size)
        *ret_size = s->map_size;
    return s->map;
}

/* Reads one entry of the open reply's "fields" and checks it fits a slot. */
static int client_parse_field(const cJSON *jf, int i, const struct lc_stream *s, struct client_field *f,
                              char *msg)
{
    const char *name = NULL, *dtype_name = NULL;
    bool ragged = false;
    int64_t offset = 0, v = 0;
    char sub[LD_ERRMSG_MAX];
    int ret;
    memset(f, 0, sizeof *f);
    if (!cJSON_IsObject(jf)) {
        client_msgf(msg, "fields[%d] is not an object", i);
        return LC_EPROTO;
    }
    if ((ret = proto_get_str(jf, "name", LD_NAME_MAX - 1, &name, sub)) < 0 ||
        (ret = proto_get_str(jf, "dtype", 15, &dtype_name, sub)) < 0 ||
        (ret = proto_get_bool(jf, "ragged", &ragged, sub)) < 0 ||
        (ret = proto_get_int(jf, "offset", (int64_t)sizeof(struct ld_slot_header), (int64_t)s->slot_size,
                             &offset, sub)) < 0) {
        client_msgf(msg, "fields[%d]: %s", i, sub);
        return LC_EPROTO;
    }
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = proto_dtype_from_name(dtype_name);
    if (f->dtype < 0) {
        client_msgf(msg, "field '%s': unknown dtype '%s'", name, dtype_name);
        return LC_EPROTO;
    }
    f->ragged = ragged;
    f->offset = (uint64_t)offset;
    if (f->offset % LD_FIELD_ALIGN) {
        client_msgf(msg, "field '%s': offset %llu is not a multiple of %u", name,
                 (unsigned long long)f->offset, LD_FIELD_ALIGN);
        return LC_EPROTO;
    }
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(jf, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > LD_MAX_DIMS) {
        client_msgf(msg, "field '%s': 'shape' must be an array of at most %d integers", name,
                 LD_MAX_DIMS);
        return LC_EPROTO;
    }
    uint64_t row = proto_dtype_size(f->dtype);
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        /* Each dim below 2^31 and the running product below 2^40 keeps every size
         * computation here far from overflow. */
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > (double)INT32_MAX ||
            d->valuedouble != (double)(int64_t)d->valuedouble) {
            client_msgf(msg, "field '%s': 'shape' must hold integers in [0, %d]", name, INT32_MAX);
            return LC_EPROTO;
        }
        f->shape[f->ndim++] = (int64_t)d->valuedouble;
        row *= (uint64_t)(int64_t)d->valuedouble;
        if (row > (1ull << 40)) {
            client_msgf(msg, "field '%s': a sample is implausibly large", name);
            return LC_EPROTO;
        }
    }
    if (!ragged) {
        f->row_bytes = row;
        if (f->offset + row * s->batch_size > s->slot_size) {
            client_msgf(msg, "field '%s': %u rows of %llu bytes at offset %llu overrun the %llu-byte slot",
                     name, s->batch_size, (unsigned long long)row, (unsigned long long)f->offset,
                     (unsigned long long)s->slot_size);
            return LC_EPROTO;
        }
        return 0;
    }
    if (f->ndim != 0) {
        client_msgf(msg, "field '%s': a ragged field must have shape []", name);
        return LC_EPROTO;
    }
    if ((ret = proto_get_int(jf, "offsets_offset", (int64_t)sizeof(struct ld_slot_header),
                             (int64_t)s->slot_size, &v, sub)) < 0) {
        client_msgf(msg, "field '%s': %s", name, sub);
        return LC_EPROTO;
    }
    f->offsets_offset = (uint64_t)v;
    if ((ret = proto_get_int(jf, "capacity", 0, (int64_t)s->slot_size, &v, sub)) < 0) {
        client_msgf(msg, "field '%s': %s", name, sub);
        return LC_EPROTO;
    }
    f->capacity = (uint64_t)v;
    if (f->offsets_offset % LD_FIELD_ALIGN ||
        f->offsets_offset + ((uint64_t)s->batch_size + 1) * sizeof(int64_t) > s->slot_size ||
        f->offset + f->capacity > s->slot_size) {
        snprintf(msg, LD_ERRMSG_MAX,
                 "field '%s': offsets at %llu or %llu bytes of data at %llu do not fit the %llu-byte slot",
                 name, (unsigned long long)f->offsets_offset, (unsigned long long)f->capacity,
                 (unsigned long long)f->offset, (unsigned long long)s->slot_size);
        return LC_EPROTO;
    }
    return 0;
}

/* Reads the open reply into s (everything but the mapping). */
static int client_parse_open(const cJSON *reply, uint32_t batch_size, lc_stream *s, const char **ret_shm,
                             int64_t *ret_shm_size, char *msg)
{
    int64_t v[8];
    const char *shm = NULL;
    char sub[LD_ERRMSG_MAX];
    int ret;
    if ((ret = proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &v[0], sub)) < 0 ||
        (ret = proto_get_str(reply, "shm", LD_SHM_NAME_MAX - 1, &shm, sub)) < 0 ||
        (ret = proto_get_int(reply, "shm_size", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[1], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_count", 1, LD_SLOT_COUNT_MAX, &v[2], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_size", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[3], sub)) < 0 ||
        (ret = proto_get_int(reply, "slot_offset", (int64_t)LD_RING_ALIGN, INT64_MAX / 2, &v[4], sub)) < 0 ||
        (ret = proto_get_int(reply, "batches_per_epoch", 0, LD_JSON_SAFE_INT, &v[5], sub)) < 0 ||
        (ret = proto_get_int(reply, "samples_per_epoch", 0, LD_JSON_SAFE_INT, &v[6], sub)) < 0 ||
        (ret = proto_opt_int(reply, "batch_size", 1, 65536, batch_size, &v[7], sub)) < 0) {
        client_msgf(msg, "%s", sub);
        return LC_EPROTO;
    }
    if (shm[0] != '/' || strchr(shm + 1, '/')) {
        client_msgf(msg, "'shm' is not a shared-memory name: %s", shm);
        return LC_EPROTO;
    }
    if (v[7] != batch_size) {
        client_msgf(msg, "batch_size %lld, asked for %u", (long long)v[7], batch_size);
        return LC_EPROTO;
    }
    s->id = (uint64_t)v[0];
    s->slot_count = (uint32_t)v[2];
    s->slot_size = (uint64_t)v[3];
    s->slot_offset = (uint64_t)v[4];
    s->batches_per_epoch = (uint64_t)v[5];
    s->samples_per_epoch = (uint64_t)v[6];
    s->batch_size = batch_size;
    /* slot_count <= LD_SLOT_COUNT_MAX and slot_size < 2^62 could still overflow: divide instead. */
    if (s->slot_size % LD_RING_ALIGN || s->slot_offset % LD_RING_ALIGN ||
        s->slot_offset > (uint64_t)v[1] ||
        s->slot_size > ((uint64_t)v[1] - s->slot_offset) / s->slot_count) {
        client_msgf(msg, "%u slots of %llu bytes at offset %llu do not fit shm_size %lld",
                 s->slot_count, (unsigned long long)s->slot_size, (unsigned long long)s->slot_offset,
                 (long long)v[1]);
        return LC_EPROTO;
    }
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(reply, "fields");
    int n = cJSON_IsArray(fields) ? cJSON_GetArraySize(fields) : -1;
    if (n < 1 || n > LD_MAX_FIELDS) {
        client_msgf(msg, "'fields' must be an array of 1 to %d fields", LD_MAX_FIELDS);
        return LC_EPROTO;
    }
    for (int i = 0; i < n; i++) {
        ret = client_parse_field(cJSON_GetArrayItem(fields, i), i, s, &s->fields[i], msg);
        if (ret < 0)
            return ret;
        for (int j = 0; j < i; j++) {
            if (strcmp(s->fields[j].name, s->fields[i].name) == 0) {
                client_msgf(msg, "field '%s' appears twice", s->fields[i].name);
                return LC_EPROTO;
            }
        }
    }
    s->n_fields = n;
    *ret_shm = shm;
    *ret_shm_size = v[1];
    return 0;
}

/* Maps the ring read-only and checks its header against the open reply. */
static int client_map_ring(lc_stream *s, const char *shm, uint64_t shm_size, char *msg)
{
    struct stat st;
    void *map = MAP_FAILED;
    int ret;
    int fd = shm_open(shm, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot open shared memory %s: %s", shm, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot stat shared memory %s: %s", shm, strerror(errno));
        goto out;
    }
    /* Only the daemon may have made it, and only the daemon may write it: a batch is
     * read in place, and anyone who could write the object could change it. */
    if (st.st_uid != s->client->server_uid || (st.st_mode & 0022)) {
        ret = LC_EPERM;
        client_msgf(msg, "shared memory %s belongs to uid %u with mode 0%03o; expected loaderd's uid %u and no "
                    "write access for group or others: refusing to map it",
                    shm, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)s->client->server_uid);
        goto out;
    }
    /* Mapping past the object's end would turn a short object into a SIGBUS later. */
    if ((uint64_t)st.st_size < shm_size) {
        ret = LC_EPROTO;
        client_msgf(msg, "shared memory %s holds %lld bytes, loaderd said %llu", shm,
                 (long long)st.st_size, (unsigned long long)shm_size);
        goto out;
    }
    map = mmap(NULL, shm_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = ld_from_errno(errno);
        client_msgf(msg, "cannot map shared memory %s (%llu bytes): %s", shm,
                 (unsigned long long)shm_size, strerror(errno));
        goto out;
    }
    const struct ld_ring_header *h = map;
    if (h->magic != LD_RING_MAGIC || h->version != LD_RING_VERSION || h->slot_count != s->slot_count ||
        h->slot_size != s->slot_size || h->slot_offset != s->slot_offset || h->total_size != shm_size ||
        h->stream_id != s->id) {
        ret = LC_EPROTO;
        snprintf(msg, LD_ERRMSG_MAX,
                 "ring header of %s does not match the open reply (magic 0x%08x version %u, %u slots of "
                 "%llu bytes at %llu, total %llu, stream %llu)",
                 shm, h->magic, h->version, h->slot_count, (unsigned long long)h->slot_size,
                 (unsigned long long)h->slot_offset, (unsigned long long)h->total_size,
                 (unsigned long long)h->stream_id);
        goto out;
    }
    s->map = map;
    s->map_size = shm_size;
    map = MAP_FAILED;
    ret = 0;
out:
    if (map != MAP_FAILED)
        munmap(map, shm_size);
    if (fd >= 0)
        close(fd);
    return ret;
}

/* Closes stream `id` on the daemon, for an open whose reply we could not use. */
static void client_close_remote(lc_client *c, uint64_t id)
{
    cJSON *msg = cJSON_CreateObject(), *reply = NULL;
    char saved[CLIENT_ERRMSG_MAX];
    snprintf(saved, sizeof saved, "%s", c->error);
    if (msg && cJSON_AddStringToObject(msg, "op", LD_OP_CLOSE) &&
        cJSON_AddNumberToObject(msg, "stream", (double)id)) {
        if (client_call(c, msg, LD_OP_CLOSE, c->timeout_ms, &reply) == 0)
            cJSON_Delete(reply);
    } else {
        cJSON_Delete(msg);
    }
    snprintf(c->error, sizeof c->error, "%s", saved);
}

/* Values sent as JSON numbers must survive the trip through a double. */
static int client_check_u64(lc_client *c, const char *name, uint64_t v)
{
    if (v <= (uint64_t)LD_JSON_SAFE_INT)
        return 0;
    client_seterr(c, "field '%s': expected an integer in [0, %lld], got %llu", name, LD_JSON_SAFE_INT,
                  (unsigned long long)v);
    return LC_EFIELD;
}

LC_EXPORT int lc_stream_open(lc_client *c, const char *dataset, const lc_stream_options *opts,
                             lc_stream **ret_stream)
{
    char msg[LD_ERRMSG_MAX];
    lc_stream_options opt;
    const lc_stream_options *o = &opt;
    cJSON *req = NULL, *reply = NULL;
    lc_stream *s = NULL;
    bool remote = false;
    int64_t sid = -1, shm_size = 0;
    const char *shm = NULL;
    int ret;
    if (!c)
        return LC_EINVAL;
    if (!dataset || !opts || !ret_stream) {
        client_seterr(c, "lc_stream_open: dataset, options and ret_stream are required");
        return LC_EINVAL;
    }
    lc_stream_options_init(&opt);
    if ((ret = client_copy_struct_in(&opt, sizeof opt, opts, opts->struct_size, CLIENT_OPTIONS_V0_SIZE,
                                     "lc_stream_options", msg)) < 0) {
        client_seterr(c, "lc_stream_open: %s", msg);
        return ret;
    }
    if ((ret = client_check_usable(c)) < 0)
        return ret;
    if ((ret = client_check_u64(c, "seed", o->seed)) < 0 || (ret = client_check_u64(c, "epoch", o->epoch)) < 0 ||
        (ret = client_check_u64(c, "start_batch", o->start_batch)) < 0 ||
        (ret = client_check_u64(c, "epochs", o->epochs)) < 0)
        return ret;
    req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_OPEN) ||
        !cJSON_AddStringToObject(req, "dataset", dataset) ||
        !cJSON_AddNumberToObject(req, "batch_size", o->batch_size) ||
        !cJSON_AddBoolToObject(req, "shuffle", o->shuffle != 0) ||
        !cJSON_AddNumberToObject(req, "seed", (double)o->seed) ||
        !cJSON_AddNumberToObject(req, "epoch", (double)o->epoch) ||
        !cJSON_AddNumberToObject(req, "rank", o->rank) ||
        !cJSON_AddNumberToObject(req, "world_size", o->world_size) ||
        !cJSON_AddBoolToObject(req, "drop_last", o->drop_last != 0) ||
        !cJSON_AddNumberToObject(req, "start_batch", (double)o->start_batch) ||
        (o->prefetch && !cJSON_AddNumberToObject(req, "prefetch", o->prefetch)) ||
        !cJSON_AddNumberToObject(req, "epochs", (double)o->epochs)) {
        cJSON_Delete(req);
        client_seterr(c, "out of memory building 'open'");
        return LC_ENOMEM;
    }
    ret = client_call(c, req, LD_OP_OPEN, c->timeout_ms, &reply);
    if (ret < 0)
        goto out;
    s = calloc(1, sizeof *s);
    if (!s) {
        ret = LC_ENOMEM;
        client_seterr(c, "out of memory");
        goto out;
    }
    s->client = c;
    /* Once the daemon holds a stream for us, every failure below must close it. */
    if (proto_get_int(reply, "stream", 0, LD_JSON_SAFE_INT, &sid, msg) == 0)
        remote = true;
    ret = client_parse_open(reply, o->batch_size, s, &shm, &shm_size, msg);
    if (ret < 0) {
        client_seterr(c, "malformed open reply from loaderd: %s", msg);
        goto out;
    }
    if ((uint64_t)shm_size > SIZE_MAX) {
        ret = LC_EPROTO;
        client_seterr(c, "ring of %lld bytes cannot be mapped here", (long long)shm_size);
        goto out;
    }
    ret = client_map_ring(s, shm, (uint64_t)shm_size, msg);
    if (ret < 0) {
        client_seterr(c, "%s", msg);
        goto out;
    }
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    *ret_stream = s;
    s = NULL;
    remote = false;
    ret = 0;
out:
    if (remote)
        client_close_remote(c, (uint64_t)sid);
    free(s);
    cJSON_Delete(reply);
    return ret;
}

/* Fills b's field views from the slot, checking every ragged offset array. */
static int client_fill_batch(lc_stream *s, lc_batch *b, char *msg)
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

static const struct ld_slot_header *client_slot_header(const lc_stream *s, int slot)
{
    return (const struct ld_slot_header *)(const void *)(s->map + s->slot_offset + (uint64_t)slot * s->slot_size);
}

/* Sends `next` for stream s; its reply is collected by lc_stream_next (or stashed on
 * the stream by whichever call reads it first). */
static int client_send_next(lc_stream *s, int64_t deadline, int timeout_ms)
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
    if (!s->ahead_count) {
        if ((ret = client_check_usable(c)) < 0)
            return ret;
        ret = client_send_next(s, deadline, timeout_ms);
        if (ret < 0)
            return ret;
    }
    unsigned head = s->ahead_head;
    if (!s->ahead_reply[head]) {
        if ((ret = client_check_usable(c)) < 0)
            return ret;
        ret = client_wait(c, s->ahead_id[head], deadline, timeout_ms, &s->ahead_reply[head]);
        if (ret < 0)
            return ret; /* on a timeout the request stays outstanding for the next call */
    }
    reply = s->ahead_reply[head];
    s->ahead_reply[head] = NULL;
    s->ahead_head = (head + 1) % CLIENT_READ_AHEAD;
    s->ahead_count--;
    ret = proto_reply_status(reply, msg);
    if (ret < 0) {
        s->ahead_stop = true; /* end of stream or a failed stream: every later answer is the same */
        client_seterr(c, "%s", msg);
        goto out;
    }
    int64_t slot, gen, epoch, batch, rows;
    if (proto_get_int(reply, "slot", 0, (int64_t)s->slot_count - 1, &slot, msg) < 0 ||
        proto_get_int(reply, "generation", 0, LD_JSON_SAFE_INT, &gen, msg) < 0 ||
        proto_get_int(reply, "epoch", 0, LD_JSON_SAFE_INT, &epoch, msg) < 0 ||
        proto_get_int(reply, "batch", 0, LD_JSON_SAFE_INT, &batch, msg) < 0 ||
        proto_get_int(reply, "rows", 1, s->batch_size, &rows, msg) < 0) {
        ret = LC_EPROTO;
        client_seterr(c, "malformed next reply from loaderd: %s", msg);
        goto out;
    }
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
    b->base = (const uint8_t *)client_slot_header(s, b->slot);
    /* Release semantics: the slot's contents were written before the generation. */
    const struct ld_slot_header *h = client_slot_header(s, b->slot);
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
    b = NULL;
    ret = 0;
    /* Read-ahead: ask for the following batch now, so that its reply is already on the
     * socket when the trainer comes back for it and no call waits a whole round trip.
     * Only while the trainer holds just this batch of the stream: one that keeps batches
     * never has a request waiting on the daemon for a slot that it holds itself. A send
     * that fails here breaks the connection, and the next call reports it. */
    if (!s->batches->next && !s->ahead_stop)
        while (s->ahead_count < CLIENT_READ_AHEAD && !c->broken && client_send_next(s, deadline, timeout_ms) == 0)
            ;
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

LC_EXPORT int lc_stream_close(lc_stream *s)
{
    cJSON *reply = NULL;
    int ret = 0;
    if (!s)
        return 0;
    lc_client *c = s->client;
    /* The daemon releases every slot of a closed stream: no release per batch. */
    while (s->batches) {
        lc_batch *b = s->batches;
        s->batches = b->next;
        free(b);
    }
    client_pending_forget_stream(c, s);
    for (unsigned k = 0; k < CLIENT_READ_AHEAD; k++) {
        cJSON_Delete(s->ahead_reply[k]);
        s->ahead_reply[k] = NULL;
    }
    s->ahead_count = 0;
    if (!c->broken) {
        cJSON *req = cJSON_CreateObject();
        if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_CLOSE) ||
            !cJSON_AddNumberToObject(req, "stream", (double)s->id)) {
            cJSON_Delete(req);
            client_seterr(c, "out of memory building 'close'");
            ret = LC_ENOMEM;
        } else {
            ret = client_call(c, req, LD_OP_CLOSE, c->timeout_ms, &reply);
            cJSON_Delete(reply);
        }
    }
    /* The close's reply came after those of every release sent before it. */
    if (ret == 0)
        ret = client_take_release_failure(c);
    if (s->map)
        munmap((void *)s->map, s->map_size);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
    return ret;
}

/* ---- batches ------------------------------------------------------------------------------ */

LC_EXPORT uint32_t lc_batch_rows(const lc_batch *b) { return b ? b->rows : 0; }
LC_EXPORT uint64_t lc_batch_epoch(const lc_batch *b) { return b ? b->epoch : 0; }
LC_EXPORT uint64_t lc_batch_index(const lc_batch *b) { return b ? b->index : 0; }
LC_EXPORT int lc_batch_slot(const lc_batch *b) { return b ? b->slot : LC_EINVAL; }
LC_EXPORT uint64_t lc_batch_generation(const lc_batch *b) { return b ? b->generation : 0; }
LC_EXPORT int lc_batch_field_count(const lc_batch *b) { return b ? b->stream->n_fields : 0; }

/* Hands a field out to a caller whose lc_field is `theirs` bytes: as much of ours as
 * fits; members we do not know (a newer header's) are zero, their "not set". */
static int client_copy_field_out(const lc_field *f, lc_field *ret, size_t theirs)
{
    if (theirs < CLIENT_FIELD_V0_SIZE)
        return LC_EINVAL;
    if (theirs > sizeof *f)
        memset((char *)ret + sizeof *f, 0, theirs - sizeof *f);
    memcpy(ret, f, theirs < sizeof *f ? theirs : sizeof *f);
    return 0;
}

LC_EXPORT int lc_batch_field_sized(const lc_batch *b, int i, lc_field *ret_field, size_t field_size)
{
    if (!b || !ret_field || i < 0 || i >= b->stream->n_fields)
        return LC_EINVAL;
    return client_copy_field_out(&b->fields[i], ret_field, field_size);
}

LC_EXPORT int lc_batch_field_by_name_sized(const lc_batch *b, const char *name, lc_field *ret_field,
                                           size_t field_size)
{
    if (!b || !name || !ret_field)
        return LC_EINVAL;
    for (int i = 0; i < b->stream->n_fields; i++)
        if (strcmp(b->fields[i].name, name) == 0)
            return client_copy_field_out(&b->fields[i], ret_field, field_size);
    return LC_EINVAL;
}

LC_EXPORT int lc_batch_valid(const lc_batch *b)
{
    if (!b)
        return 0;
    const struct ld_slot_header *h = client_slot_header(b->stream, b->slot);
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
    if (!c->broken) {
        int64_t deadline = client_now_ms() + c->timeout_ms;
        int64_t id = -1;
        cJSON *req = cJSON_CreateObject();
        if (!req || !cJSON_AddStringToObject(req, "op", LD_OP_RELEASE) ||
            !cJSON_AddNumberToObject(req, "stream", (double)s->id) ||
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
                p->stream_id = s->id;
                p->slot = b->slot;
                p->generation = b->generation;
            }
            /* The trainer is down to at most one batch of this stream (a training loop that
             * keeps the previous batch's tensors until the next step): ask ahead now,
             * in the same write as the release. */
            if ((!s->batches || !s->batches->next) && !s->ahead_stop)
                while (s->ahead_count < CLIENT_READ_AHEAD && !c->broken &&
                       client_send_next(s, deadline, c->timeout_ms) == 0)
                    ;
            /* A trainer that only releases: send them now and then, and settle the
             * replies that have arrived so they do not pile up. */
            if (c->deferred_frames >= CLIENT_DEFER_MAX_FRAMES && client_flush_deferred(c, deadline, c->timeout_ms) == 0)
                client_wait(c, -1, 0, 0, NULL);
        }
    } else {
        ret = client_check_usable(c);
    }
    free(b);
    return ret < 0 ? ret : client_take_release_failure(c);
}
