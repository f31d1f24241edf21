/* loaderctl — the operator's view into a running loaderd, and its benchmark client.
 *
 * This file holds main, the usage, what every command shares (loaderctl.h) and the
 * read-only commands (status, datasets, streams, metrics) and reload: each sends one
 * request through libloaderclient's lc_request_json and prints the reply as a table, or
 * as JSON with --json. `read`, the benchmark client, is in loaderctl_read.c; `cache` in
 * loaderctl_cache.c; `top` in loaderctl_top.c.
 *
 * Errors print "loaderctl: <what failed>: <message>" on stderr and exit 1; a bad
 * command line prints the usage and exits 2. */
#include "ld_format.h"
#include "loaderclient.h"
#include "loaderctl.h"
#include "loaderctl_top.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Each command's synopsis and what it does: the overall usage lists them all, and
 * `loaderctl COMMAND --help` prints its own. */
static const struct {
    const char *name;
    const char *usage;
} ctl_commands[] = {
    {"status", "  status [--json]        the daemon's counters: clients, streams, throughput, memory\n"},
    {"datasets", "  datasets [--json]      the configured datasets and their fields\n"},
    {"streams", "  streams [--json]       the open streams\n"},
    {"metrics", "  metrics [--json]       the counters in the Prometheus text format (0.0.4)\n"},
    {"reload", "  reload [--json]        re-read loaderd's config file: datasets added, changed and\n"
               "                         removed (open streams of a changed one finish on the old\n"
               "                         definition); a config with errors is refused (exit 1)\n"},
    {"top", CTL_TOP_USAGE},
    {"read", "  read DATASET [--epochs N] [--batch-size B] [--no-shuffle] [--seed S] [--epoch E]\n"
             "       [--rank R] [--world-size W] [--drop-last] [--start-batch K] [--prefetch P]\n"
             "       [--handoff shm|socket] [--touch] [--json] [--spec JSON] [--share NAME]\n"
             "                         attach as a trainer, consume N epochs (default 1, batch 64),\n"
             "                         print samples/s; --touch reads every byte of each batch;\n"
             "                         --spec: a dataset declared as the trainer would (no DATASET),\n"
             "                         or the keys that refine DATASET (access.declare allows it);\n"
             "                         --handoff socket: a next and a release message per batch\n"
             "                         instead of the queues in shared memory (default shm);\n"
             "                         --share: read the shared stream NAME (or auto)\n"},
    {"cache", "  cache build DATASET [--force]   build the dataset's cache file now (--force: even\n"
              "                         over a valid one) and wait for it, showing progress\n"
              "  cache verify DATASET   check every sample of the cache against its checksum\n"
              "  cache info DATASET     the cache's state, header fields, size and hits\n"},
};

static const char ctl_options_usage[] =
    "options (before the command):\n"
    "  --socket PATH          loaderd's socket; without it: server.socket of the --config\n"
    "                         file, else $LOADERD_SOCKET, else server.socket of\n"
    "                         $LOADERD_CONFIG, else the default (%s)\n"
    "  --config FILE          loaderd's config file: connect to its server.socket (an error\n"
    "                         when the file does not name an absolute socket path); like\n"
    "                         --socket, it beats the environment\n"
    "  --timeout MS           per-request timeout (default: %d)\n"
    "  --daemon-uid UID       the user loaderd must run as (a number or a name; default:\n"
    "                         $LOADERD_UID, else this user or root)\n"
    "  --json                 print JSON instead of text\n"
    "  --version              print loaderctl's version (the client library's) and exit\n"
    "  --help                 print this and exit\n"
    "\nenvironment:\n"
    "  LOADERD_SOCKET         the socket when neither --socket nor --config is given\n"
    "  LOADERD_CONFIG         the config whose server.socket is used when neither --socket,\n"
    "                         --config nor LOADERD_SOCKET is given\n"
    "  LOADERD_RECONNECT      seconds `read` keeps reconnecting to a daemon that went away\n"
    "                         (a restart), then goes on at the batch it had reached\n"
    "                         (default 60; 0: never)\n"
    "  LOADERD_UID            the default of --daemon-uid\n"
    "  LOADERD_HANDOFF        socket: the default of read's --handoff (else shm)\n"
    "  (the default socket is $XDG_RUNTIME_DIR/loaderd.sock when that is a private\n"
    "  directory, else /tmp/loaderd-UID/loaderd.sock)\n"
    "\nexit status: 0 on success, 1 when the daemon or a request failed, 2 for a bad command line\n";

static void ctl_usage(FILE *f)
{
    fprintf(f, "usage: loaderctl [--socket PATH | --config FILE] [--timeout MS] [--daemon-uid UID] [--json] COMMAND [ARGS]\n"
               "       loaderctl COMMAND --help\n\ncommands:\n");
    for (size_t k = 0; k < sizeof ctl_commands / sizeof ctl_commands[0]; k++)
        fputs(ctl_commands[k].usage, f);
    fputs("\n", f);
    fprintf(f, ctl_options_usage, lc_default_socket(), CTL_DEFAULT_TIMEOUT_MS);
}

/* `loaderctl CMD --help`: 0 after printing CMD's usage, -1 for an unknown command. */
static int ctl_command_usage(const char *cmd)
{
    for (size_t k = 0; k < sizeof ctl_commands / sizeof ctl_commands[0]; k++) {
        if (strcmp(ctl_commands[k].name, cmd) == 0) {
            printf("usage: loaderctl [OPTIONS] ...\n");
            fputs(ctl_commands[k].usage, stdout);
            printf("\n");
            printf(ctl_options_usage, lc_default_socket(), CTL_DEFAULT_TIMEOUT_MS);
            return 0;
        }
    }
    return -1;
}

int ctl_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loaderctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
    ctl_usage(stderr);
    return 2;
}

int ctl_fail(const char *what, const char *msg)
{
    fprintf(stderr, "loaderctl: %s: %s\n", what, msg && *msg ? msg : "failed");
    return 1;
}

/* Parses an unsigned decimal in [min, max]. */
int ctl_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *ret = v;
    return 0;
}

lc_client *ctl_connect(const struct ctl_opts *o)
{
    char err[1024], path[PATH_MAX];
    lc_client *c = NULL;
    /* --socket, else --config's server.socket, else $LOADERD_SOCKET, else
     * $LOADERD_CONFIG's server.socket, else the default. */
    int r = lc_socket_resolve(o->socket, o->config, path, sizeof path, err, sizeof err);
    if (r == 0)
        r = lc_connect(path, o->timeout_ms, "loaderctl", &c, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "loaderctl: %s\n", err);
        return NULL;
    }
    return c;
}

/* Sends a request (JSON text) and returns the parsed reply (ok:true), or NULL after
 * printing why, naming it `what`. */
cJSON *ctl_request_text(lc_client *c, const char *req, const char *what)
{
    char *text = NULL;
    int r = lc_request_json(c, req, &text);
    if (r < 0) {
        ctl_fail(what, lc_client_error(c));
        return NULL;
    }
    cJSON *reply = cJSON_Parse(text);
    lc_free(text);
    if (!cJSON_IsObject(reply)) {
        cJSON_Delete(reply);
        ctl_fail(what, "the reply is not a JSON object");
        return NULL;
    }
    return reply;
}

/* Sends {"op": op}. */
static cJSON *ctl_request(lc_client *c, const char *op)
{
    char req[64];
    snprintf(req, sizeof req, "{\"op\":\"%s\"}", op);
    return ctl_request_text(c, req, op);
}

/* Prints a reply as pretty JSON without the envelope (id, ok). */
void ctl_print_json(cJSON *obj)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "id");
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "ok");
    char *s = cJSON_Print(obj);
    if (s) {
        puts(s);
        cJSON_free(s);
    }
}

/* ---- field access that tolerates a daemon newer or older than this tool ---------- */

double ctl_num(const cJSON *o, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

const char *ctl_str(const cJSON *o, const char *key, const char *def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : def;
}

/* A byte count from a reply as "1.5 MiB" (ld_format_bytes, as the daemon's messages
 * write sizes). JSON numbers are doubles: one that is not a count shows as 0 B. */
void ctl_fmt_bytes(double b, char *buf, size_t size)
{
    ld_format_bytes(b >= 0 && b < 0x1p64 ? (uint64_t)b : 0, buf, size);
}

/* ---- reload ------------------------------------------------------------------------ */

/* One line of names from an array of strings or of {name, streams} objects. */
static void ctl_reload_names(const cJSON *r, const char *key, const char *label)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(r, key), *e;
    if (cJSON_GetArraySize(list) <= 0)
        return;
    printf("%-10s", label);
    int k = 0;
    cJSON_ArrayForEach(e, list) {
        const char *name = cJSON_IsString(e) ? e->valuestring : ctl_str(e, "name", "?");
        int streams = (int)ctl_num(e, "streams", 0);
        printf("%s %s", k++ ? "," : "", name);
        if (streams)
            printf(" (%d open stream%s finish%s on the old definition)", streams, streams == 1 ? "" : "s",
                   streams == 1 ? "es" : "");
    }
    printf("\n");
}

static int ctl_reload(const cJSON *r)
{
    const cJSON *e;
    printf("reloaded: %.0f datasets served\n", ctl_num(r, "datasets", 0));
    ctl_reload_names(r, "added", "added:");
    ctl_reload_names(r, "changed", "changed:");
    ctl_reload_names(r, "removed", "removed:");
    ctl_reload_names(r, "unchanged", "unchanged:");
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r, "unavailable"))
        printf("unavailable: %s: %s\n", ctl_str(e, "name", "?"), ctl_str(e, "reason", "?"));
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r, "live"))
        printf("%s: %.0f (was %.0f)\n", ctl_str(e, "key", "?"), ctl_num(e, "now", 0), ctl_num(e, "was", 0));
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r, "restart_needed"))
        printf("%s: the file says '%s' but that takes a restart; still '%s'\n", ctl_str(e, "key", "?"),
               ctl_str(e, "file", "?"), ctl_str(e, "running", "?"));
    double conns = ctl_num(r, "connections_denied", 0), streams = ctl_num(r, "streams_denied", 0);
    if (conns > 0 || streams > 0)
        printf("denied:   %.0f connection%s and %.0f stream%s that the new access rules no longer allow were "
               "ended (the log names them)\n", conns, conns == 1 ? "" : "s", streams, streams == 1 ? "" : "s");
    return 0;
}

/* ---- metrics ----------------------------------------------------------------------- */

/* Prints the exposition as it came, for a scraper's textfile collector or a person. */
static int ctl_metrics(const cJSON *r)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "text");
    if (!cJSON_IsString(t))
        return ctl_fail("metrics", "the reply has no text (is loaderd older than this loaderctl?)");
    fputs(t->valuestring, stdout);
    return fflush(stdout) == 0 ? 0 : ctl_fail("metrics", strerror(errno));
}

/* ---- status ------------------------------------------------------------------------ */

/* A connection's credentials for a person: "alice(1000)/users(100)", the names as this
 * machine's user database knows them (the daemon reports numbers). */
static void ctl_peer_ids(const cJSON *o, char *buf, size_t size)
{
    double uid = ctl_num(o, "uid", -1), gid = ctl_num(o, "gid", -1);
    if (uid < 0) {
        snprintf(buf, size, "?");
        return;
    }
    struct passwd *pw = getpwuid((uid_t)uid);
    struct group *gr = getgrgid((gid_t)gid);
    char u[64], g[64];
    if (pw)
        snprintf(u, sizeof u, "%s(%.0f)", pw->pw_name, uid);
    else
        snprintf(u, sizeof u, "%.0f", uid);
    if (gr)
        snprintf(g, sizeof g, "%s(%.0f)", gr->gr_name, gid);
    else
        snprintf(g, sizeof g, "%.0f", gid);
    snprintf(buf, size, "%s/%s", u, g);
}

/* "ready", "building 42%", "failed: why", ... */
void ctl_cache_state(const cJSON *cache, char *buf, size_t size)
{
    const char *state = ctl_str(cache, "state", "?");
    const cJSON *progress = cJSON_GetObjectItemCaseSensitive(cache, "progress");
    const char *error = ctl_str(cache, "error", NULL);
    if (strcmp(state, "building") == 0 && cJSON_IsNumber(progress))
        snprintf(buf, size, "building %.0f%%", 100 * progress->valuedouble);
    else if (error && strcmp(state, "ready") != 0)
        snprintf(buf, size, "%s (%s)", state, error);
    else
        snprintf(buf, size, "%s", state);
}

/* Prints the `status` reply for a person. */
static int ctl_status(const cJSON *r)
{
    char used[32], budget[32], bytes[32];
    double mem_used = ctl_num(r, "memory_used", 0), mem_budget = ctl_num(r, "memory_budget", 0);
    ctl_fmt_bytes(mem_used, used, sizeof used);
    ctl_fmt_bytes(mem_budget, budget, sizeof budget);
    ctl_fmt_bytes(ctl_num(r, "bytes_served", 0), bytes, sizeof bytes);
    printf("%-16s %s (pid %.0f)\n", "server", ctl_str(r, "server", "loaderd"), ctl_num(r, "pid", 0));
    printf("%-16s %.1f s\n", "uptime", ctl_num(r, "uptime_s", 0));
    printf("%-16s %.0f\n", "clients", ctl_num(r, "clients", 0));
    printf("%-16s %.0f\n", "streams", ctl_num(r, "streams", 0));
    printf("%-16s %.0f\n", "workers", ctl_num(r, "workers", 0));
    printf("%-16s %.0f\n", "batches served", ctl_num(r, "batches_served", 0));
    printf("%-16s %.0f\n", "samples served", ctl_num(r, "samples_served", 0));
    printf("%-16s %.0f (%s)\n", "bytes served", ctl_num(r, "bytes_served", 0), bytes);
    printf("%-16s %.1f\n", "samples/s", ctl_num(r, "samples_per_s", 0));
    printf("%-16s %.2f s\n", "worker busy", ctl_num(r, "worker_busy_s", 0));
    printf("%-16s %.2f s\n", "client wait", ctl_num(r, "client_wait_s", 0));
    printf("%-16s %s used of %s budget (%.1f%%)\n", "memory", used, budget,
           mem_budget > 0 ? 100.0 * mem_used / mem_budget : 0.0);
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(r, "slots");
    printf("%-16s %.0f free, %.0f filling, %.0f ready, %.0f leased\n", "slots", ctl_num(slots, "free", 0),
           ctl_num(slots, "filling", 0), ctl_num(slots, "ready", 0), ctl_num(slots, "leased", 0));
    printf("%-16s %.0f unreadable, %.0f replaced by another sample\n", "bad samples", ctl_num(r, "bad_samples", 0),
           ctl_num(r, "replaced_samples", 0));
    const cJSON *cache;
    cJSON_ArrayForEach(cache, cJSON_GetObjectItemCaseSensitive(r, "caches")) {
        char line[160], hb[32];
        ctl_cache_state(cache, line, sizeof line);
        ctl_fmt_bytes(ctl_num(cache, "hit_bytes", 0), hb, sizeof hb);
        printf("%-16s %s: %s, %.0f samples (%s) served from it\n", "cache", ctl_str(cache, "dataset", "?"), line,
               ctl_num(cache, "hits", 0), hb);
    }
    const cJSON *conn;
    cJSON_ArrayForEach(conn, cJSON_GetObjectItemCaseSensitive(r, "connections")) {
        char ids[160];
        ctl_peer_ids(conn, ids, sizeof ids);
        printf("%-16s %.0f %s: uid/gid %s, pid %.0f (%s), %.0f streams%s\n", "connection", ctl_num(conn, "id", 0),
               ctl_str(conn, "client", "?"), ids, ctl_num(conn, "pid", 0), ctl_str(conn, "process", "?"),
               ctl_num(conn, "streams", 0), cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conn, "self")) ? " (this one)" : "");
    }
    return 0;
}

/* ---- tables ------------------------------------------------------------------------ */

#define CTL_MAX_COLS 16

/* A table held as strings, printed with each column as wide as its widest cell. */
struct ctl_table {
    int ncols, nrows, cap;
    char **cells; /* nrows * ncols, row-major; row 0 is the header */
};

static int ctl_table_add(struct ctl_table *t, const char *const *row)
{
    if (t->nrows == t->cap) {
        int cap = t->cap ? t->cap * 2 : 16;
        char **cells = realloc(t->cells, (size_t)cap * (size_t)t->ncols * sizeof *cells);
        if (!cells)
            return -1;
        t->cells = cells;
        t->cap = cap;
    }
    for (int i = 0; i < t->ncols; i++) {
        char *s = strdup(row[i] ? row[i] : "");
        if (!s)
            return -1;
        t->cells[t->nrows * t->ncols + i] = s;
    }
    t->nrows++;
    return 0;
}

static void ctl_table_print(const struct ctl_table *t)
{
    size_t w[CTL_MAX_COLS] = { 0 };
    for (int r = 0; r < t->nrows; r++)
        for (int i = 0; i < t->ncols; i++) {
            size_t l = strlen(t->cells[r * t->ncols + i]);
            if (l > w[i])
                w[i] = l;
        }
    for (int r = 0; r < t->nrows; r++) {
        for (int i = 0; i < t->ncols; i++) {
            const char *s = t->cells[r * t->ncols + i];
            if (i == t->ncols - 1)
                printf("%s\n", s);
            else
                printf("%-*s  ", (int)w[i], s);
        }
    }
}

static void ctl_table_free(struct ctl_table *t)
{
    for (int i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
}

/* "data uint8[3072], label int64" */
static void ctl_fields_summary(const cJSON *fields, char *buf, size_t size)
{
    size_t len = 0;
    const cJSON *f;
    buf[0] = '\0';
    cJSON_ArrayForEach(f, fields) {
        char dims[128] = "";
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(f, "shape");
        const cJSON *d;
        size_t dl = 0;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "ragged"))) {
            snprintf(dims, sizeof dims, "[ragged, <= %.0f bytes]", ctl_num(f, "slot_bytes", ctl_num(f, "max_bytes", 0)));
        } else if (cJSON_GetArraySize(shape) > 0) {
            cJSON_ArrayForEach(d, shape) {
                int n = snprintf(dims + dl, sizeof dims - dl, "%s%.0f", dl ? "," : "[", d->valuedouble);
                if (n < 0 || (size_t)n >= sizeof dims - dl)
                    break;
                dl += (size_t)n;
            }
            if (dl + 1 < sizeof dims)
                strcat(dims, "]");
        }
        int n = snprintf(buf + len, size - len, "%s%s %s%s", len ? ", " : "", ctl_str(f, "name", "?"),
                         ctl_str(f, "dtype", "?"), dims);
        if (n < 0 || (size_t)n >= size - len)
            break;
        len += (size_t)n;
    }
}

/* Prints the `datasets` reply for a person. */
static int ctl_datasets(const cJSON *r)
{
    struct ctl_table t = { .ncols = 5 };
    const char *hdr[] = { "NAME", "KIND", "SAMPLES", "FIELDS", "SOURCE" };
    int ret = ctl_table_add(&t, hdr);
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r, "datasets")) {
        char samples[32], fields[512], source[1024];
        const char *why = ctl_str(d, "unavailable", NULL);
        snprintf(samples, sizeof samples, why ? "-" : "%.0f", ctl_num(d, "samples", 0));
        ctl_fields_summary(cJSON_GetObjectItemCaseSensitive(d, "fields"), fields, sizeof fields);
        snprintf(source, sizeof source, "%s%s", why ? "UNAVAILABLE: " : "", why ? why : ctl_str(d, "source", ""));
        const char *row[] = { ctl_str(d, "name", "?"), ctl_str(d, "kind", why ? "-" : "?"), samples, fields,
                              source };
        if (ret == 0)
            ret = ctl_table_add(&t, row);
    }
    if (ret == 0)
        ctl_table_print(&t);
    /* Class names under the table: the label of a class is its position. */
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r, "datasets")) {
        const cJSON *classes = cJSON_GetObjectItemCaseSensitive(d, "classes"), *cl;
        int n = cJSON_GetArraySize(classes), k = 0;
        if (n <= 0)
            continue;
        printf("\n%s: %d classes (label: name):", ctl_str(d, "name", "?"), n);
        cJSON_ArrayForEach(cl, classes) {
            if (k == 20) {
                printf(" ... (loaderctl --json datasets lists all)");
                break;
            }
            printf("%s %d: %s", k ? "," : "", k, cJSON_GetStringValue(cl) ? cJSON_GetStringValue(cl) : "?");
            k++;
        }
        printf("\n");
    }
    ctl_table_free(&t);
    return ret == 0 ? 0 : ctl_fail("datasets", "out of memory");
}

/* Prints the `streams` reply for a person. */
static int ctl_streams(const cJSON *r)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(r, "streams");
    if (cJSON_GetArraySize(list) == 0) {
        puts("no open streams");
        return 0;
    }
    struct ctl_table t = { .ncols = 14 };
    const char *hdr[] = { "ID", "DATASET", "CLIENT", "UID/GID", "PID", "PROCESS", "BATCH", "POSITION", "PREFETCH",
                          "SLOTS free/fill/ready/leased", "BATCHES", "SAMPLES", "WAIT_S", "STATE" };
    int ret = ctl_table_add(&t, hdr);
    const cJSON *s;
    cJSON_ArrayForEach(s, list) {
        char id[32], bs[32], pos[96], pf[32], slots[96], batches[32], samples[32], wait[32], ids[160], pid[32];
        snprintf(id, sizeof id, "%.0f", ctl_num(s, "id", 0));
        ctl_peer_ids(s, ids, sizeof ids);
        snprintf(pid, sizeof pid, "%.0f", ctl_num(s, "pid", 0));
        snprintf(bs, sizeof bs, "%.0f", ctl_num(s, "batch_size", 0));
        snprintf(pos, sizeof pos, "epoch %.0f batch %.0f/%.0f", ctl_num(s, "epoch", 0), ctl_num(s, "batch", 0),
                 ctl_num(s, "batches_per_epoch", 0));
        snprintf(pf, sizeof pf, "%.0f", ctl_num(s, "prefetch", 0));
        snprintf(slots, sizeof slots, "%.0f: %.0f/%.0f/%.0f/%.0f", ctl_num(s, "slots", 0), ctl_num(s, "free", 0),
                 ctl_num(s, "filling", 0), ctl_num(s, "ready", 0), ctl_num(s, "leased", 0));
        snprintf(batches, sizeof batches, "%.0f", ctl_num(s, "batches_served", 0));
        snprintf(samples, sizeof samples, "%.0f", ctl_num(s, "samples_served", 0));
        snprintf(wait, sizeof wait, "%.3f", ctl_num(s, "client_wait_s", 0));
        const char *row[] = { id, ctl_str(s, "dataset", "?"), ctl_str(s, "client", ""), ids, pid,
                              ctl_str(s, "process", ""), bs, pos, pf, slots,
                              batches, samples, wait, ctl_str(s, "state", "?") };
        if (ret == 0)
            ret = ctl_table_add(&t, row);
    }
    if (ret == 0)
        ctl_table_print(&t);
    ctl_table_free(&t);
    /* Streams with a device ring: where it is, its share of the GPU's budget, the copies. */
    cJSON_ArrayForEach(s, list) {
        const char *dev = ctl_str(s, "device", NULL);
        if (!dev)
            continue;
        printf("stream %.0f on %s: device ring %.1f MiB, %.1f of %.1f MiB used on the GPU, %.0f copies, "
               "%.3f ms per batch, %.2f GB/s host to device, %.0f copying\n", ctl_num(s, "id", 0), dev,
               ctl_num(s, "device_memory", 0) / 1048576.0, ctl_num(s, "device_memory_used", 0) / 1048576.0,
               ctl_num(s, "device_memory_budget", 0) / 1048576.0, ctl_num(s, "device_copies", 0),
               ctl_num(s, "copy_ms_per_batch", 0), ctl_num(s, "h2d_gbps", 0), ctl_num(s, "copying", 0));
    }
    /* Consumers of a shared stream: the group, and how far behind its front each one is. */
    cJSON_ArrayForEach(s, list) {
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(s, "share");
        if (!cJSON_IsObject(sh))
            continue;
        printf("stream %.0f reads shared stream '%s' (prepared by stream %.0f; %.0f consumers, %.0f attached): "
               "%.0f batches behind its front (max %.0f)%s\n", ctl_num(s, "id", 0), ctl_str(sh, "name", "?"),
               ctl_num(sh, "producer", 0), ctl_num(sh, "consumers", 0), ctl_num(sh, "attached", 0),
               ctl_num(sh, "lag", 0), ctl_num(sh, "max_lag", 0),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sh, "detached")) ? ", detached" : "");
    }
    return ret == 0 ? 0 : ctl_fail("streams", "out of memory");
}

int main(int argc, char **argv)
{
    struct ctl_opts o = { .socket = NULL, .timeout_ms = CTL_DEFAULT_TIMEOUT_MS, .json = false };
    lc_client *c = NULL;
    int i = 1, ret;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--socket") == 0 && i + 1 < argc) {
            o.socket = argv[++i];
        } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
            o.config = argv[++i];
        } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
            uint64_t v;
            if (ctl_parse_u64(argv[++i], 1, 86400000, &v) < 0)
                return ctl_usage_error("--timeout needs milliseconds in [1, 86400000]");
            o.timeout_ms = (int)v;
        } else if (strcmp(a, "--daemon-uid") == 0 && i + 1 < argc) {
            /* The library reads it when it checks who answers on the socket. */
            setenv("LOADERD_UID", argv[++i], 1);
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            ctl_usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("loaderctl %s\n", lc_version());
            return 0;
        } else if (a[0] == '-') {
            return ctl_usage_error("unknown or incomplete option %s", a);
        } else {
            break;
        }
    }
    if (i == argc)
        return ctl_usage_error("no command");
    const char *cmd = argv[i];
    int cargc = argc - i;
    char **cargv = argv + i;
    for (int k = 1; k < cargc; k++)
        if (strcmp(cargv[k], "--help") == 0 || strcmp(cargv[k], "-h") == 0) {
            if (ctl_command_usage(cmd) < 0)
                return ctl_usage_error("unknown command %s", cmd);
            return 0;
        }
    if (strcmp(cmd, "read") == 0) {
        ret = ctl_cmd_read(&c, &o, cargc, cargv);
        lc_client_close(c);
        return ret;
    }
    if (strcmp(cmd, "top") == 0) {
        if (!(c = ctl_connect(&o)))
            return 1;
        ret = ctl_top(c, cargc, cargv, o.json);
        lc_client_close(c);
        return ret;
    }
    if (strcmp(cmd, "cache") == 0) {
        ret = ctl_cmd_cache(&c, &o, cargc, cargv);
        lc_client_close(c);
        return ret;
    }
    /* The read-only commands: one request, its reply as JSON or for a person. */
    int (*print)(const cJSON *r) = NULL;
    if (strcmp(cmd, "status") == 0)
        print = ctl_status;
    else if (strcmp(cmd, "datasets") == 0)
        print = ctl_datasets;
    else if (strcmp(cmd, "streams") == 0)
        print = ctl_streams;
    else if (strcmp(cmd, "metrics") == 0)
        print = ctl_metrics;
    else if (strcmp(cmd, "reload") == 0)
        print = ctl_reload;
    else
        return ctl_usage_error("unknown command %s", cmd);
    for (int k = 1; k < cargc; k++) {
        if (strcmp(cargv[k], "--json") == 0)
            o.json = true;
        else
            return ctl_usage_error("%s takes no argument %s", cmd, cargv[k]);
    }
    c = ctl_connect(&o);
    if (!c)
        return 1;
    cJSON *r = ctl_request(c, cmd);
    ret = !r ? 1 : o.json ? (ctl_print_json(r), 0) : print(r);
    cJSON_Delete(r);
    lc_client_close(c);
    return ret;
}
