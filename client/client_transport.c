/* client_transport — libloaderclient's connection: framing requests onto the Unix
 * socket, reading replies, and matching them to the requests that wait for them.
 *
 * The socket is non-blocking from the start and every read and write goes through
 * poll() against a deadline, so each call honours its timeout whatever the daemon does.
 * Requests carry increasing ids and the daemon answers in order; the requests still
 * owed a reply are kept in a FIFO (c->pending), and whichever call is reading replies
 * settles the ones in front of its own:
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
 * A reply whose id is not the one expected, or an error frame the daemon sends as it
 * closes the connection, breaks the connection: the fd is closed, and every later call
 * fails with LC_ECLOSED and a message naming the original failure. A peer that just
 * hangs up (a daemon that stops or dies) is client_lost instead: the connection is
 * made again and the streams reopened (client_reconnect.c), unless reconnecting is off.
 *
 * A reply may come with a descriptor (the hand-off's memory, which has no name), sent as
 * SCM_RIGHTS with its frame's first byte: every read takes the descriptors that come
 * (client_recv), in order, and a reply whose "handoff" object says "fd" claims the oldest
 * one, which waits for the call that reads that reply (client_take_passed_fd).
 *
 * Connecting and saying hello is client_connect.c; streams, next and batches are built
 * on client_send / client_wait / client_call here. Library code: nothing here prints;
 * every failure is a code and a message. */
#include "client_internal.h"
#include "proto.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------------------ */

int64_t client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before deadline, for poll(): never negative. */
int client_remaining_ms(int64_t deadline)
{
    int64_t left = deadline - client_now_ms();
    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

int client_effective_timeout(const lc_client *c, int timeout_ms)
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
void client_msgf(char *msg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_fmt(msg, LD_ERRMSG_MAX, fmt, ap);
    va_end(ap);
}

void client_seterr(lc_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_fmt(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
}

/* Marks the connection broken: later calls fail with LC_ECLOSED quoting this. */
int client_break(lc_client *c, int code, const char *fmt, ...)
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
        client_fds_reset(c);
    }
    return code;
}

/* ---- descriptors that come with replies -------------------------------------------- */

ssize_t client_recv(lc_client *c, void *buf, size_t len)
{
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * CLIENT_FDS_IN)];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof ctl.space};
    ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    if (m.msg_flags & MSG_CTRUNC)
        c->fds_lost = true;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
            if (c->n_fds_in < CLIENT_FDS_IN) {
                c->fds_in[c->n_fds_in++] = fd;
            } else {
                close(fd);
                c->fds_lost = true;
            }
        }
    }
    return n;
}

/* A reply that says a descriptor comes with it claims the oldest one received. */
static int client_claim_fd(lc_client *c, const cJSON *reply, int64_t id)
{
    const cJSON *ho = cJSON_GetObjectItemCaseSensitive(reply, "handoff");
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ho, "fd")))
        return 0;
    if (c->n_fds_in == 0)
        return client_break(c, LC_EPROTO, "loaderd's reply %lld says a descriptor comes with it, and none came%s",
                            (long long)id, c->fds_lost ? " (some were dropped: too many at once)" : "");
    if (c->passed_fd >= 0)
        close(c->passed_fd); /* its reply was not read by a call that wanted it (a timed-out open) */
    c->passed_fd = c->fds_in[0];
    c->passed_id = id;
    memmove(c->fds_in, c->fds_in + 1, --c->n_fds_in * sizeof c->fds_in[0]);
    return 0;
}

int client_take_passed_fd(lc_client *c, int64_t id)
{
    if (c->passed_fd < 0 || c->passed_id != id)
        return -1;
    int fd = c->passed_fd;
    c->passed_fd = -1;
    return fd;
}

void client_fds_reset(lc_client *c)
{
    while (c->n_fds_in)
        close(c->fds_in[--c->n_fds_in]);
    if (c->passed_fd >= 0)
        close(c->passed_fd);
    c->passed_fd = -1;
    c->fds_lost = false;
}

int client_check_usable(lc_client *c)
{
    if (c->lost) {
        client_seterr(c, "%s; reconnecting to loaderd at %s", c->lost_msg, c->socket_path);
        return LC_ECONNRESET;
    }
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

struct client_pending *client_pending_find(lc_client *c, int64_t id)
{
    for (size_t i = c->pending_head; i < c->pending_len; i++)
        if (c->pending[i].id == id)
            return &c->pending[i];
    return NULL;
}

/* A stream going away: replies owed to it are dropped when they come. */
void client_pending_forget_stream(lc_client *c, const lc_stream *s)
{
    /* A reopen keeps its kind: its reply names a stream that must still be closed. */
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
    while ((n = client_recv(c, buf, sizeof buf)) > 0)
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
    return client_lost(c, "loaderd closed the connection");
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
int client_flush_deferred(lc_client *c, int64_t deadline, int timeout_ms)
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
int client_send_ex(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s,
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
                 * take our frame back so the FIFO and the buffer agree. A lost
                 * connection emptied the buffer already. */
                if (!c->lost && c->deferred_len >= frame_len) {
                    c->deferred_len -= frame_len;
                    c->deferred_frames--;
                }
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

int client_send(lc_client *c, cJSON *msg, int kind, const char *op, lc_stream *s,
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
    case CLIENT_PENDING_REOPEN:
        client_stream_reopened_or_orphan(c, p->stream, reply);
        reply = NULL;
        break;
    default:
        break;
    }
    cJSON_Delete(reply);
}

/* A release the daemon refused, reported once to the caller of a later release or of
 * lc_stream_close (releases are pipelined: the refusal arrives after the call that
 * sent it has returned). */
int client_take_release_failure(lc_client *c)
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
        if ((r = client_claim_fd(c, reply, id)) < 0) {
            cJSON_Delete(reply);
            return r;
        }
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
int client_wait(lc_client *c, int64_t want, int64_t deadline, int timeout_ms, cJSON **ret_reply)
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
        ssize_t n = client_recv(c, buf, sizeof buf);
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
            return client_lost(c, "loaderd closed the connection");
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET)
            return client_lost(c, "loaderd closed the connection");
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
int client_call(lc_client *c, cJSON *msg, const char *op, int timeout_ms, cJSON **ret_reply)
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
