/* loaderctl.h — private to loaderctl: what its command files (loaderctl.c with the
 * read-only commands and main, loaderctl_read.c, loaderctl_cache.c) share: the global
 * options, the connection, the request helpers, the error printers and the reply field
 * accessors that tolerate a daemon newer or older than the tool. */
#ifndef LD_LOADERCTL_H
#define LD_LOADERCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "loaderclient.h"

#define CTL_DEFAULT_TIMEOUT_MS 30000

struct ctl_opts {
    const char *socket;
    const char *config;         /* --config: loaderd's config, for its server.socket */
    int timeout_ms;
    bool json;
};

/* Prints "loaderctl: <message>" and the usage on stderr; returns 2, the exit status of
 * a bad command line. */
int ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "loaderctl: <what>: <msg>" on stderr; returns 1. */
int ctl_fail(const char *what, const char *msg);
/* Parses an unsigned decimal in [min, max] into *ret; -1 (and *ret untouched) otherwise. */
int ctl_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);
/* Connects as the options say; NULL after printing why. */
lc_client *ctl_connect(const struct ctl_opts *o);
/* Sends a request (JSON text) and returns the parsed reply (ok:true), or NULL after
 * printing why, naming it `what`. */
cJSON *ctl_request_text(lc_client *c, const char *req, const char *what);
/* Prints a reply as pretty JSON without the envelope (id, ok). */
void ctl_print_json(cJSON *obj);
/* A reply's field, or def when it is missing or of another type. */
double ctl_num(const cJSON *o, const char *key, double def);
const char *ctl_str(const cJSON *o, const char *key, const char *def);
/* A byte count from a reply as "1.5 MiB". */
void ctl_fmt_bytes(double b, char *buf, size_t size);
/* A cache's state for a person: "ready", "building 42%", "failed (why)", ... */
void ctl_cache_state(const cJSON *cache, char *buf, size_t size);

/* The commands with arguments of their own (argv[0] is the command's name). Each
 * connects through *pc (the caller closes it) and returns the exit status. */
int ctl_cmd_read(lc_client **pc, struct ctl_opts *o, int argc, char **argv);
int ctl_cmd_cache(lc_client **pc, struct ctl_opts *o, int argc, char **argv);

#endif
