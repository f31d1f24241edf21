/* client_connect — making and ending a connection to loaderd: the socket connect
 * against a deadline, the check of who listens (SO_PEERCRED), the hello that settles
 * the protocol version and frame limit, and the raw-JSON request used for the daemon's
 * read-only ops.
 *
 * Which socket to connect to (explicit path, $LOADERD_SOCKET, the daemon's config,
 * the default) is client_socket.c; the request/reply machinery is client_transport.c.
 * Closing a client frees its streams here without a round trip per stream, since
 * closing the connection makes the daemon tear everything down. */
#include "client_internal.h"
#include "proto.h"
#include "proto_socket.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

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

/* Frees the client and every stream of it, without a word to the daemon: closing the
 * connection makes it tear everything down. */
void client_free(lc_client *c)
{
    if (!c)
        return;
    while (c->streams) {
        lc_stream *s = c->streams;
        c->streams = s->next;
        client_stream_free(s);
    }
    if (c->fd >= 0)
        close(c->fd);
    client_fds_reset(c);
    proto_reader_free(c->reader);
    free(c->pending);
    free(c->deferred);
    free(c->socket_path);
    free(c->name);
    free(c);
}

/* A new connection to path: connect, check who listens, say hello. Used by lc_connect
 * and, after the daemon went away, by client_reconnect (which takes the connection over
 * from the client returned here). */
int client_dial(const char *socket_path, int64_t deadline, int timeout_ms, const char *client_name,
                lc_client **ret_client, char *errbuf, size_t errbuf_size)
{
    lc_client *c = NULL;
    cJSON *hello = NULL, *reply = NULL;
    int ret;
    /* The default socket's directory must be ours alone; a missing one is left to the
     * connect, whose message says whether loaderd runs. */
    char dirmsg[LD_ERRMSG_MAX];
    ret = proto_socket_check_path(socket_path, false, dirmsg);
    if (ret < 0 && ret != LD_ENOENT) {
        snprintf(errbuf, errbuf_size, "%s", dirmsg);
        return ret;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        ret = LC_ENOMEM;
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    c->fd = -1;
    c->passed_fd = -1;
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

LC_EXPORT int lc_connect(const char *socket_path, int timeout_ms, const char *client_name,
                         lc_client **ret_client, char *errbuf, size_t errbuf_size)
{
    char scratch[8];
    lc_client *c = NULL;
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
    /* No path: $LOADERD_SOCKET, the config's server.socket, or the default
     * (client_socket.c). */
    char resolved[PATH_MAX];
    if (!socket_path) {
        ret = lc_socket_resolve(NULL, NULL, resolved, sizeof resolved, errbuf, errbuf_size);
        if (ret < 0)
            return ret;
        socket_path = resolved;
    }
    if (timeout_ms <= 0)
        timeout_ms = CLIENT_DEFAULT_TIMEOUT_MS;
    int64_t deadline = client_now_ms() + timeout_ms;
    ret = client_dial(socket_path, deadline, timeout_ms, client_name, &c, errbuf, errbuf_size);
    if (ret < 0)
        return ret;
    /* What a reconnection needs: the same socket (not resolved again: the environment
     * may have changed), the same name. */
    c->socket_path = strdup(socket_path);
    c->name = client_name ? strdup(client_name) : NULL;
    if (!c->socket_path || (client_name && !c->name)) {
        ret = LC_ENOMEM;
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    ret = client_reconnect_init(c, errbuf, errbuf_size);
    if (ret < 0)
        goto out;
    *ret_client = c;
    c = NULL;
out:
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
    /* A daemon that went away since the last call: connect again first. */
    if ((ret = client_reconnect(c, client_now_ms() + c->timeout_ms, c->timeout_ms)) < 0) {
        cJSON_Delete(req);
        return ret;
    }
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
