/* client_socket — which socket a client connects to when the caller names none.
 *
 * The order, from the most explicit to the least, flags before the environment: a path
 * the caller gives (lc_connect's socket_path, `loaderctl --socket`), then `server.socket`
 * of a config file the caller names (`loaderctl --config FILE`), then $LOADERD_SOCKET,
 * then `server.socket` of $LOADERD_CONFIG, then the default. The default itself ($XDG_RUNTIME_DIR or
 * /tmp/loaderd-<uid>) is computed by proto_socket_default, the very function the daemon
 * uses, so that both ends agree; the config step lets a client find a daemon that
 * listens elsewhere from the same file the daemon was started with.
 *
 * Reading the config here is deliberately small: only `server.socket` is looked at (the
 * daemon validates the rest when it loads the file), but a config that does not give
 * a usable socket is an error naming FILE:LINE:COLUMN, never a silent fall back to
 * the default: the caller asked for that daemon, not for whichever listens by default.
 * Library code: it returns codes and messages and never prints. */
#include "client_internal.h"
#include "proto_socket.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <yaml.h>

/* A Unix socket address holds this many bytes of path (the daemon's limit too). */
#define CLIENT_SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

LC_EXPORT const char *lc_default_socket(void)
{
    /* Thread-local, so that two threads asking at once do not scribble on each other.
     * The daemon computes its default with the same function. */
    static _Thread_local char buf[PATH_MAX];
    (void)proto_socket_default(buf, sizeof buf);
    return buf;
}

static int client_socket_fail(char *errbuf, size_t errbuf_size, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int client_socket_fail(char *errbuf, size_t errbuf_size, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errbuf && errbuf_size)
        vsnprintf(errbuf, errbuf_size, fmt, ap);
    va_end(ap);
    return code;
}

/* The value of `key` in a mapping node (NULL when absent); a key given twice is an
 * error, as it is for the daemon. */
static int client_socket_lookup(yaml_document_t *doc, yaml_node_t *map, const char *key, const char *file,
                                yaml_node_t **ret, char *errbuf, size_t errbuf_size)
{
    *ret = NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (!k || k->type != YAML_SCALAR_NODE || strcmp((const char *)k->data.scalar.value, key) != 0)
            continue;
        if (*ret)
            return client_socket_fail(errbuf, errbuf_size, LC_ECONFIG, "%s:%zu:%zu: '%s' appears twice", file,
                                      k->start_mark.line + 1, k->start_mark.column + 1, key);
        *ret = yaml_document_get_node(doc, p->value);
    }
    return 0;
}

LC_EXPORT int lc_socket_from_config(const char *config_path, char *buf, size_t size, char *errbuf,
                                    size_t errbuf_size)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    bool have_parser = false, have_doc = false;
    FILE *f = NULL;
    int ret;
    if (errbuf && errbuf_size)
        errbuf[0] = '\0';
    if (!config_path || !*config_path || !buf || size == 0)
        return client_socket_fail(errbuf, errbuf_size, LC_EINVAL,
                                  "lc_socket_from_config: a config path and a buffer are required");
    buf[0] = '\0';
    f = fopen(config_path, "re");
    if (!f) {
        int e = errno;
        return client_socket_fail(errbuf, errbuf_size, ld_from_errno(e), "%s: cannot open loaderd's config: %s",
                                  config_path, strerror(e));
    }
    if (!yaml_parser_initialize(&parser)) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ENOMEM, "%s: out of memory", config_path);
        goto out;
    }
    have_parser = true;
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG, "%s:%zu:%zu: not valid YAML: %s", config_path,
                                 parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                                 parser.problem ? parser.problem : "parse error");
        goto out;
    }
    have_doc = true;
    yaml_node_t *root = yaml_document_get_root_node(&doc), *server = NULL, *sock = NULL;
    if (!root || root->type != YAML_MAPPING_NODE) {
        size_t line = root ? root->start_mark.line + 1 : 1, col = root ? root->start_mark.column + 1 : 1;
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: not a loaderd config (expected a mapping with a 'server' section)",
                                 config_path, line, col);
        goto out;
    }
    if ((ret = client_socket_lookup(&doc, root, "server", config_path, &server, errbuf, errbuf_size)) < 0)
        goto out;
    if (server && server->type != YAML_MAPPING_NODE) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG, "%s:%zu:%zu: server: expected a mapping",
                                 config_path, server->start_mark.line + 1, server->start_mark.column + 1);
        goto out;
    }
    if (server && (ret = client_socket_lookup(&doc, server, "socket", config_path, &sock, errbuf, errbuf_size)) < 0)
        goto out;
    if (!sock) {
        /* The daemon then listens on its default socket, which depends on its own
         * environment (LOADERD_SOCKET, XDG_RUNTIME_DIR): we cannot know it from here. */
        const yaml_mark_t *m = server ? &server->start_mark : &root->start_mark;
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: no server.socket: the daemon listens on its default socket, which "
                                 "this file does not name; set server.socket there, or give the socket itself "
                                 "(--socket, LOADERD_SOCKET)",
                                 config_path, m->line + 1, m->column + 1);
        goto out;
    }
    size_t line = sock->start_mark.line + 1, col = sock->start_mark.column + 1;
    if (sock->type != YAML_SCALAR_NODE || sock->data.scalar.length == 0) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: server.socket: expected a socket path, got %s", config_path, line, col,
                                 sock->type == YAML_SCALAR_NODE   ? "an empty string"
                                 : sock->type == YAML_MAPPING_NODE ? "a mapping"
                                                                   : "a sequence");
        goto out;
    }
    const char *path = (const char *)sock->data.scalar.value;
    size_t len = sock->data.scalar.length;
    if (strlen(path) != len) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: server.socket: the path contains a NUL character", config_path, line,
                                 col);
        goto out;
    }
    if (len > CLIENT_SOCKET_PATH_MAX) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: server.socket: the path is %zu bytes long; a Unix socket path holds "
                                 "at most %zu",
                                 config_path, line, col, len, CLIENT_SOCKET_PATH_MAX);
        goto out;
    }
    if (path[0] != '/') {
        /* The daemon takes a relative path from its own working directory. */
        ret = client_socket_fail(errbuf, errbuf_size, LC_ECONFIG,
                                 "%s:%zu:%zu: server.socket '%s' is a relative path, which loaderd resolves "
                                 "against its own working directory: a client cannot tell where that is; use an "
                                 "absolute path, or give the socket itself (--socket, LOADERD_SOCKET)",
                                 config_path, line, col, path);
        goto out;
    }
    if (len >= size) {
        ret = client_socket_fail(errbuf, errbuf_size, LC_ENAMETOOLONG,
                                 "%s:%zu:%zu: server.socket does not fit in %zu bytes", config_path, line, col, size);
        goto out;
    }
    memcpy(buf, path, len + 1);
    ret = 0;
out:
    if (have_doc)
        yaml_document_delete(&doc);
    if (have_parser)
        yaml_parser_delete(&parser);
    fclose(f);
    return ret;
}

LC_EXPORT int lc_socket_resolve(const char *socket_path, const char *config_path, char *buf, size_t size,
                                char *errbuf, size_t errbuf_size)
{
    if (errbuf && errbuf_size)
        errbuf[0] = '\0';
    if (!buf || size == 0)
        return client_socket_fail(errbuf, errbuf_size, LC_EINVAL, "lc_socket_resolve: a buffer is required");
    buf[0] = '\0';
    if (socket_path) {
        if (strlen(socket_path) >= size)
            return client_socket_fail(errbuf, errbuf_size, LC_ENAMETOOLONG, "socket path too long: %s",
                                      socket_path);
        memcpy(buf, socket_path, strlen(socket_path) + 1);
        return 0;
    }
    /* A config the caller names is a flag (--config): it beats the environment. */
    if (config_path)
        return lc_socket_from_config(config_path, buf, size, errbuf, errbuf_size);
    const char *env_socket = getenv("LOADERD_SOCKET");
    if (!env_socket || !*env_socket) {
        config_path = getenv("LOADERD_CONFIG");
        if (config_path && *config_path)
            return lc_socket_from_config(config_path, buf, size, errbuf, errbuf_size);
    }
    /* $LOADERD_SOCKET when set, else the daemon's own default. */
    int ret = proto_socket_default(buf, size);
    if (ret < 0)
        return client_socket_fail(errbuf, errbuf_size, ret, "the default socket path does not fit in %zu bytes",
                                  size);
    return 0;
}
