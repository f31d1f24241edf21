/* config — reads loaderd's YAML configuration into struct config.
 *
 * The file is read whole (at most CONFIG_MAX_FILE_BYTES) and parsed twice by libyaml:
 * a first pass over the event stream rejects syntax errors, anchors and aliases (an
 * alias can multiply a small file into a huge tree), more than one document and deep
 * nesting, each with its position; a second pass loads the document tree, which is
 * then walked against the key tables below. Each table row carries a key's type,
 * bounds, default and target field, so adding a key is adding a row, and every
 * message can say what was expected. Every content error starts with
 * "FILE:LINE:COLUMN: " (1-based, from libyaml's marks) and returns LD_ECONFIG; the
 * caller decides whether that is fatal (start) or keeps the old config (reload). */
#include "config.h"
#include "proto_socket.h"

#include <math.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>
#include <cJSON.h>

#include "ld_error.h"
#include "log.h"
#include "metrics_http.h"
#include "proto.h"

/* Our schema is three levels deep; anything much deeper is a mistake, and a cap keeps
 * a hostile file from growing libyaml's stacks. */
#define CONFIG_MAX_DEPTH 16
#define SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

/* ---- the key tables ----------------------------------------------------------- */

enum key_type {
    KEY_STRING, /* non-empty string, copied into a char * */
    KEY_PATH,   /* a string; relative paths are resolved against the config's directory */
    KEY_SOCKET, /* a string that fits in sockaddr_un.sun_path */
    KEY_INT,    /* decimal integer in [min, max], into a uint32_t */
    KEY_SIZE,   /* bytes, plain or with a binary suffix, in [min, max], into uint32/64 */
    KEY_ENUM,   /* one of `choices`, mapped to an int by from_name */
    KEY_TABLE,  /* a nested mapping, walked against `sub` into the same struct */
    KEY_TRANSFORMS, /* image_folder's list of transforms (load_transforms) */
    KEY_FRACTION,   /* a number in [0, 1], into a double; default def_frac */
    KEY_LISTEN,     /* a metrics listen address (metrics_http_parse_listen), copied into a char * */
};

#define KEY_REQUIRED 1u

struct key {
    const char *name;
    enum key_type type;
    int64_t min, max;                   /* KEY_INT, KEY_SIZE */
    int64_t def;                        /* numeric default (KEY_INT, KEY_SIZE, KEY_ENUM) */
    double def_frac;                    /* KEY_FRACTION's default */
    const char *def_str;                /* string default; NULL: none or computed later */
    size_t offset, width;               /* the target field in struct config(_dataset) */
    int (*from_name)(const char *name); /* KEY_ENUM: the value, or <0 when unknown */
    const char *choices;                /* KEY_ENUM: the accepted names, for messages */
    unsigned flags;                     /* KEY_REQUIRED */
    unsigned kinds;                     /* dataset keys: bit (1 << kind) per accepting kind */
    const struct key *sub;              /* KEY_TABLE: the nested mapping's keys */
    size_t n_sub;
};

#define SERVER_AT(f) .offset = offsetof(struct config, f), .width = sizeof(((struct config *)0)->f)
#define DATASET_AT(f)                                                                    \
    .offset = offsetof(struct config_dataset, f),                                        \
    .width = sizeof(((struct config_dataset *)0)->f)
#define FILES (1u << CONFIG_DATASET_FILES)
#define TOKENS (1u << CONFIG_DATASET_TOKEN_WINDOWS)
#define PACKED (1u << CONFIG_DATASET_PACKED)
#define IMAGES (1u << CONFIG_DATASET_IMAGE_FOLDER)

static int kind_from_name(const char *name);
static int dtype_from_name(const char *name);
static int cache_mode_from_name(const char *name);
static int on_error_from_name(const char *name);
static int fingerprint_from_name(const char *name);
static int follow_links_from_name(const char *name);

/* datasets.NAME.cache (files only). Present means mode auto unless it says otherwise. */
static const struct key cache_keys[] = {
    {.name = "path", .type = KEY_PATH, DATASET_AT(cache_path), .flags = KEY_REQUIRED},
    {.name = "mode", .type = KEY_ENUM, .def = CONFIG_CACHE_AUTO, DATASET_AT(cache_mode),
     .from_name = cache_mode_from_name, .choices = "auto, off, rebuild"},
    {.name = "fingerprint", .type = KEY_ENUM, .def = 0, DATASET_AT(cache_fingerprint),
     .from_name = fingerprint_from_name, .choices = "stat, content"},
};

/* server.metrics: the optional HTTP scrape endpoint. */
static const struct key metrics_keys[] = {
    {.name = "listen", .type = KEY_LISTEN, SERVER_AT(metrics_listen), .flags = KEY_REQUIRED},
};

/* workers = 0 and the socket's NULL default are resolved after the walk (one thread
 * per online core; config_default_socket). */
static const struct key server_keys[] = {
    {.name = "socket", .type = KEY_SOCKET, SERVER_AT(socket_path)},
    {.name = "workers", .type = KEY_INT, .min = 0, .max = LD_WORKERS_MAX, .def = 0, SERVER_AT(workers)},
    {.name = "memory_budget", .type = KEY_SIZE, .min = (int64_t)MIB, .max = (int64_t)TIB,
     .def = (int64_t)GIB, SERVER_AT(memory_budget)},
    {.name = "max_clients", .type = KEY_INT, .min = 1, .max = 4096, .def = 64,
     SERVER_AT(max_clients)},
    {.name = "max_streams", .type = KEY_INT, .min = 1, .max = 4096, .def = 64,
     SERVER_AT(max_streams)},
    {.name = "max_frame", .type = KEY_SIZE, .min = LD_FRAME_MIN_LIMIT, .max = LD_FRAME_MAX_LIMIT,
     .def = LD_FRAME_DEFAULT_LIMIT, SERVER_AT(max_frame)},
    {.name = "prefetch", .type = KEY_INT, .min = 1, .max = LD_PREFETCH_MAX, .def = 4, SERVER_AT(prefetch)},
    {.name = "log_level", .type = KEY_ENUM, .def = LD_LOG_INFO, SERVER_AT(log_level),
     .from_name = ld_log_level_from_name, .choices = "error, warn, info, debug"},
    {.name = "socket_group", .type = KEY_STRING, SERVER_AT(socket_group)},
    {.name = "hello_timeout", .type = KEY_INT, .min = 1, .max = 3600, .def = 10, SERVER_AT(hello_timeout_s)},
    {.name = "idle_timeout", .type = KEY_INT, .min = 0, .max = 7 * 86400, .def = 600, SERVER_AT(idle_timeout_s)},
    {.name = "max_reply_bytes", .type = KEY_SIZE, .min = 64 * 1024, .max = (int64_t)GIB, .def = 8 * (int64_t)MIB,
     SERVER_AT(max_reply_bytes)},
    {.name = "max_total_reply_bytes", .type = KEY_SIZE, .min = 64 * 1024, .max = 16 * (int64_t)GIB,
     .def = 64 * (int64_t)MIB, SERVER_AT(max_total_reply_bytes)},
    {.name = "metrics", .type = KEY_TABLE, .sub = metrics_keys, .n_sub = sizeof metrics_keys / sizeof metrics_keys[0]},
};

/* stride's default 0 means "same as context" (min is 1, so YAML cannot say 0). */
static const struct key dataset_keys[] = {
    {.name = "kind", .type = KEY_ENUM, DATASET_AT(kind), .from_name = kind_from_name,
     .choices = "files, token_windows, packed, image_folder", .flags = KEY_REQUIRED,
     .kinds = FILES | TOKENS | PACKED | IMAGES},
    {.name = "path", .type = KEY_PATH, DATASET_AT(path), .flags = KEY_REQUIRED,
     .kinds = FILES | TOKENS | PACKED | IMAGES},
    {.name = "pattern", .type = KEY_STRING, .def_str = "*", DATASET_AT(pattern), .kinds = FILES | IMAGES},
    {.name = "on_error", .type = KEY_ENUM, .def = CONFIG_ON_ERROR_REPLACE, DATASET_AT(on_error),
     .from_name = on_error_from_name, .choices = "replace, fail", .kinds = FILES | IMAGES},
    {.name = "on_error_warn_fraction", .type = KEY_FRACTION, .def_frac = 0.001,
     DATASET_AT(on_error_warn_fraction), .kinds = FILES | IMAGES},
    {.name = "transforms", .type = KEY_TRANSFORMS, .kinds = IMAGES, .flags = KEY_REQUIRED},
    {.name = "dtype", .type = KEY_ENUM, .def = LD_DTYPE_UINT16, DATASET_AT(token_dtype),
     .from_name = dtype_from_name, .choices = "uint16, uint32", .kinds = TOKENS},
    {.name = "context", .type = KEY_INT, .min = 1, .max = 1 << 20, DATASET_AT(context),
     .flags = KEY_REQUIRED, .kinds = TOKENS},
    {.name = "stride", .type = KEY_INT, .min = 1, .max = 1 << 30, .def = 0, DATASET_AT(stride),
     .kinds = TOKENS},
    {.name = "cache", .type = KEY_TABLE, .sub = cache_keys, .n_sub = sizeof cache_keys / sizeof cache_keys[0],
     .kinds = FILES | IMAGES},
    {.name = "follow_links", .type = KEY_ENUM, .def = CONFIG_FOLLOW_LINKS_INSIDE, DATASET_AT(follow_links),
     .from_name = follow_links_from_name, .choices = "inside, outside", .kinds = FILES | IMAGES},
    /* 0 (the default, which YAML cannot say) means "the largest sample". */
    {.name = "max_sample_bytes", .type = KEY_SIZE, .min = 1, .max = (int64_t)TIB, .def = 0,
     DATASET_AT(max_sample_bytes), .kinds = FILES | PACKED},
    {.name = "read_timeout", .type = KEY_INT, .min = 1, .max = 86400, .def = 30, DATASET_AT(read_timeout),
     .kinds = FILES | IMAGES | PACKED},
};

#define N_KEYS(t) (sizeof(t) / sizeof((t)[0]))
/* load_table marks the keys it has seen in a 64-bit mask. */
_Static_assert(N_KEYS(server_keys) <= 64 && N_KEYS(dataset_keys) <= 64, "key tables too long");
#define KIND_KEY (&dataset_keys[0])

static const char *const kind_names[] = {
    [CONFIG_DATASET_FILES] = "files",
    [CONFIG_DATASET_TOKEN_WINDOWS] = "token_windows",
    [CONFIG_DATASET_PACKED] = "packed",
    [CONFIG_DATASET_IMAGE_FOLDER] = "image_folder",
};

static int on_error_from_name(const char *name)
{
    if (strcmp(name, "replace") == 0)
        return CONFIG_ON_ERROR_REPLACE;
    if (strcmp(name, "fail") == 0)
        return CONFIG_ON_ERROR_FAIL;
    return -1;
}

static int follow_links_from_name(const char *name)
{
    if (strcmp(name, "inside") == 0)
        return CONFIG_FOLLOW_LINKS_INSIDE;
    if (strcmp(name, "outside") == 0)
        return CONFIG_FOLLOW_LINKS_OUTSIDE;
    return -1;
}

static int cache_mode_from_name(const char *name)
{
    if (strcmp(name, "auto") == 0)
        return CONFIG_CACHE_AUTO;
    if (strcmp(name, "off") == 0)
        return CONFIG_CACHE_OFF;
    if (strcmp(name, "rebuild") == 0)
        return CONFIG_CACHE_REBUILD;
    return -1;
}

static int fingerprint_from_name(const char *name)
{
    if (strcmp(name, "stat") == 0)
        return 0;
    if (strcmp(name, "content") == 0)
        return 1;
    return -1;
}

static int kind_from_name(const char *name)
{
    for (size_t i = 0; i < N_KEYS(kind_names); i++)
        if (kind_names[i] && strcmp(name, kind_names[i]) == 0)
            return (int)i;
    return -1;
}

static int dtype_from_name(const char *name)
{
    if (strcmp(name, "uint16") == 0)
        return LD_DTYPE_UINT16;
    if (strcmp(name, "uint32") == 0)
        return LD_DTYPE_UINT32;
    return -1;
}

/* ---- errors ------------------------------------------------------------------- */

struct loader {
    const char *file;
    char *errbuf;
    char *dir; /* absolute directory of the config file, for relative dataset paths */
    yaml_document_t *doc;
};

/* Formats "FILE:LINE:COLUMN: message" and returns LD_ECONFIG. */
static int fail_at(const struct loader *l, yaml_mark_t mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(const struct loader *l, yaml_mark_t mark, const char *fmt, ...)
{
    if (!l->errbuf)
        return LD_ECONFIG;
    int n = snprintf(l->errbuf, LD_ERRMSG_MAX, "%s:%zu:%zu: ", l->file, mark.line + 1,
                     mark.column + 1);
    if (n < 0 || n >= LD_ERRMSG_MAX)
        return LD_ECONFIG;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->errbuf + n, LD_ERRMSG_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    return LD_ECONFIG;
}

static yaml_mark_t start_mark(void)
{
    yaml_mark_t m = {0, 0, 0};
    return m;
}

/* libyaml's reader errors carry a byte offset but no mark; count our own. */
static yaml_mark_t mark_of_offset(const unsigned char *buf, size_t len, size_t offset)
{
    yaml_mark_t m = {offset, 0, 0};
    for (size_t i = 0; i < offset && i < len; i++) {
        if (buf[i] == '\n') {
            m.line++;
            m.column = 0;
        } else if ((buf[i] & 0xc0) != 0x80) {
            m.column++;
        }
    }
    return m;
}

static int syntax_error(const struct loader *l, const yaml_parser_t *p, const unsigned char *buf,
                        size_t len)
{
    if (p->error == YAML_MEMORY_ERROR) {
        ld_errorf(l->errbuf, "%s: out of memory while parsing", l->file);
        return LD_ENOMEM;
    }
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR) {
        yaml_mark_t m = mark_of_offset(buf, len, p->problem_offset);
        if (p->problem_value >= 0)
            return fail_at(l, m, "YAML syntax error: %s (byte 0x%02x)", problem,
                           (unsigned)p->problem_value);
        return fail_at(l, m, "YAML syntax error: %s", problem);
    }
    if (p->context)
        return fail_at(l, p->problem_mark, "YAML syntax error: %s (%s at line %zu, column %zu)",
                       problem, p->context, p->context_mark.line + 1,
                       p->context_mark.column + 1);
    return fail_at(l, p->problem_mark, "YAML syntax error: %s", problem);
}

/* ---- pass 1: the event stream ------------------------------------------------- */

static int check_anchor(const struct loader *l, const yaml_event_t *ev, const yaml_char_t *anchor)
{
    if (!anchor)
        return 0;
    return fail_at(l, ev->start_mark, "anchors and aliases are not allowed (found anchor '&%s')",
                   (const char *)anchor);
}

static int check_events(const struct loader *l, const unsigned char *buf, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int ret = 0, docs = 0, depth = 0;
    bool done = false;

    memset(&ev, 0, sizeof ev);
    if (!yaml_parser_initialize(&parser)) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, buf, len);
    while (!done) {
        if (!yaml_parser_parse(&parser, &ev)) {
            ret = syntax_error(l, &parser, buf, len);
            goto out;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                ret = fail_at(l, ev.start_mark,
                              "a second YAML document ('---'); the config is one document");
                goto out;
            }
            break;
        case YAML_ALIAS_EVENT:
            ret = fail_at(l, ev.start_mark, "anchors and aliases are not allowed (found alias '*%s')",
                          (const char *)ev.data.alias.anchor);
            goto out;
        case YAML_SCALAR_EVENT:
            ret = check_anchor(l, &ev, ev.data.scalar.anchor);
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            ret = check_anchor(l, &ev,
                               ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.anchor
                                                                   : ev.data.mapping_start.anchor);
            if (ret == 0 && ++depth > CONFIG_MAX_DEPTH)
                ret = fail_at(l, ev.start_mark, "nested deeper than %d levels", CONFIG_MAX_DEPTH);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        default:
            break;
        }
        if (ret < 0)
            goto out;
        yaml_event_delete(&ev);
    }
    if (docs == 0)
        ret = fail_at(l, start_mark(),
                      "the file is empty: expected a mapping with a 'datasets' key");
out:
    yaml_event_delete(&ev);
    yaml_parser_delete(&parser);
    return ret;
}

/* ---- node helpers ------------------------------------------------------------- */

static yaml_node_t *node(const struct loader *l, int index)
{
    return yaml_document_get_node(l->doc, index);
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

/* What a node is, for "got ..." in messages. */
static const char *describe(const yaml_node_t *n, char *buf, size_t size)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a sequence";
    if (is_null(n))
        return "nothing (null)";
    const char *v = (const char *)n->data.scalar.value;
    if (strlen(v) > 60)
        snprintf(buf, size, "'%.60s...'", v);
    else
        snprintf(buf, size, "'%s'", v);
    return buf;
}

/* A mapping key's text, or an error when the key is not a scalar. */
static int key_text(const struct loader *l, const yaml_node_t *k, const char *where,
                    const char **ret_text)
{
    char got[80];
    if (k->type != YAML_SCALAR_NODE)
        return fail_at(l, k->start_mark, "%s: expected a key name, got %s", where,
                       describe(k, got, sizeof got));
    *ret_text = (const char *)k->data.scalar.value;
    return 0;
}

/* An earlier pair of `map` (before index i) with the same key text, or NULL. */
static const yaml_node_t *earlier_key(const struct loader *l, const yaml_node_t *map,
                                      const yaml_node_pair_t *pair, const char *text)
{
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < pair; p++) {
        const yaml_node_t *k = node(l, p->key);
        if (k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, text) == 0)
            return k;
    }
    return NULL;
}

/* `prefix` names the mapping ("server: ", "" at the top), `what` the thing ("key"). */
static int check_duplicate(const struct loader *l, const yaml_node_t *map,
                           const yaml_node_pair_t *pair, const char *text, const char *prefix,
                           const char *what)
{
    const yaml_node_t *first = earlier_key(l, map, pair, text);
    if (!first)
        return 0;
    return fail_at(l, node(l, pair->key)->start_mark,
                   "%sduplicate %s '%s' (first at line %zu, column %zu)", prefix, what, text,
                   first->start_mark.line + 1, first->start_mark.column + 1);
}

/* ---- values ------------------------------------------------------------------- */

/* Strict decimal: optional sign, digits, nothing else. */
static bool parse_int(const char *s, int64_t *ret)
{
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (*p < '0' || *p > '9')
        return false;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return false;
    *ret = v;
    return true;
}

/* Bytes, or an integer with a binary-unit suffix, optionally after one space. */
static bool parse_size(const char *s, int64_t *ret)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"K", KIB}, {"M", MIB}, {"G", GIB}, {"T", TIB},
                 {"KiB", KIB}, {"MiB", MIB}, {"GiB", GIB}, {"TiB", TIB}};
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    if (n == 0 || n > 18)
        return false;
    char digits[20];
    memcpy(digits, s, n);
    digits[n] = '\0';
    int64_t v;
    if (!parse_int(digits, &v))
        return false;
    const char *suffix = s + n;
    if (*suffix == ' ')
        suffix++;
    if (!*suffix) {
        if (suffix != s + n)
            return false; /* "12 " */
        *ret = v;
        return true;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(suffix, units[i].suffix) == 0) {
            if ((uint64_t)v > (uint64_t)INT64_MAX / units[i].mult)
                return false;
            *ret = (int64_t)((uint64_t)v * units[i].mult);
            return true;
        }
    }
    return false;
}

static const char *format_size(uint64_t v, char *buf, size_t size)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {{"TiB", TIB}, {"GiB", GIB}, {"MiB", MIB}, {"KiB", KIB}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (v >= units[i].mult && v % units[i].mult == 0) {
            snprintf(buf, size, "%llu %s", (unsigned long long)(v / units[i].mult),
                     units[i].name);
            return buf;
        }
    }
    snprintf(buf, size, "%llu", (unsigned long long)v);
    return buf;
}

static void store_uint(void *base, const struct key *k, uint64_t v)
{
    char *p = (char *)base + k->offset;
    if (k->width == sizeof(uint64_t)) {
        uint64_t x = v;
        memcpy(p, &x, sizeof x);
    } else {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, sizeof x);
    }
}

static void store_string(void *base, const struct key *k, char *s)
{
    char **p = (char **)((char *)base + k->offset);
    free(*p);
    *p = s;
}

static int store_path(const struct loader *l, void *base, const struct key *k, const char *v)
{
    char *s = NULL;
    if (v[0] == '/' || !l->dir) {
        s = strdup(v);
    } else {
        size_t dl = strlen(l->dir);
        const char *sep = dl && l->dir[dl - 1] == '/' ? "" : "/";
        if (asprintf(&s, "%s%s%s", l->dir, sep, v) < 0)
            s = NULL;
    }
    if (!s) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    store_string(base, k, s);
    return 0;
}

/* Parses one value node against its row and stores it into base + k->offset. */
static int apply_defaults(const struct loader *l, const struct key *table, size_t n,
                          unsigned kinds, void *base);
static int load_table(const struct loader *l, const yaml_node_t *map, const struct key *table,
                      size_t n, int kind, const char *where, yaml_mark_t missing_at, void *base);

static int load_transforms(const struct loader *l, const yaml_node_t *key, const yaml_node_t *v,
                           const char *where, void *base);

/* Loads value v of key k (the node `key`, for messages about the key as a whole). */
static int load_value(const struct loader *l, const struct key *k, const yaml_node_t *key,
                      const yaml_node_t *v, const char *where, void *base)
{
    char got[80], lo[32], hi[32];
    const char *text = v->type == YAML_SCALAR_NODE && !is_null(v)
                           ? (const char *)v->data.scalar.value : NULL;
    int64_t num;

    switch (k->type) {
    case KEY_INT:
        if (!text || !parse_int(text, &num) || num < k->min || num > k->max)
            return fail_at(l, v->start_mark, "%s.%s: expected an integer in [%lld, %lld], got %s",
                           where, k->name, (long long)k->min, (long long)k->max,
                           describe(v, got, sizeof got));
        store_uint(base, k, (uint64_t)num);
        return 0;
    case KEY_SIZE:
        if (!text || !parse_size(text, &num) || num < k->min || num > k->max)
            return fail_at(l, v->start_mark,
                           "%s.%s: expected a size in [%s, %s] (bytes, or an integer with a "
                           "suffix K, M, G, T, KiB, MiB, GiB, TiB; all binary), got %s",
                           where, k->name, format_size((uint64_t)k->min, lo, sizeof lo),
                           format_size((uint64_t)k->max, hi, sizeof hi),
                           describe(v, got, sizeof got));
        store_uint(base, k, (uint64_t)num);
        return 0;
    case KEY_ENUM: {
        int e = text ? k->from_name(text) : -1;
        if (e < 0)
            return fail_at(l, v->start_mark, "%s.%s: expected one of %s, got %s", where, k->name,
                           k->choices, describe(v, got, sizeof got));
        memcpy((char *)base + k->offset, &e, sizeof e);
        return 0;
    }
    case KEY_TABLE: {
        char sub_where[LD_NAME_MAX + 40];
        snprintf(sub_where, sizeof sub_where, "%s.%s", where, k->name);
        if (v->type != YAML_MAPPING_NODE)
            return fail_at(l, v->start_mark, "%s: expected a mapping, got %s", sub_where,
                           describe(v, got, sizeof got));
        int ret = apply_defaults(l, k->sub, k->n_sub, 0, base);
        if (ret < 0)
            return ret;
        return load_table(l, v, k->sub, k->n_sub, 0, sub_where, v->start_mark, base);
    }
    case KEY_TRANSFORMS:
        return load_transforms(l, key, v, where, base);
    case KEY_FRACTION: {
        char *end = NULL;
        double f = text ? strtod(text, &end) : NAN;
        if (!text || end == text || *end || !(f >= 0.0 && f <= 1.0))
            return fail_at(l, v->start_mark, "%s.%s: expected a number in [0, 1], got %s", where, k->name,
                           describe(v, got, sizeof got));
        memcpy((char *)base + k->offset, &f, sizeof f);
        return 0;
    }
    case KEY_STRING:
    case KEY_PATH:
    case KEY_SOCKET:
    case KEY_LISTEN:
        break;
    }

    /* The string kinds. */
    if (!text || !*text)
        return fail_at(l, v->start_mark, "%s.%s: expected a non-empty string, got %s", where,
                       k->name, text ? "''" : describe(v, got, sizeof got));
    if (strlen(text) != v->data.scalar.length)
        return fail_at(l, v->start_mark, "%s.%s: the string contains a NUL character", where,
                       k->name);
    if (k->type == KEY_SOCKET && strlen(text) > SOCKET_PATH_MAX)
        return fail_at(l, v->start_mark,
                       "%s.%s: the path is %zu bytes long; a Unix socket path holds at most %zu",
                       where, k->name, strlen(text), SOCKET_PATH_MAX);
    if (k->type == KEY_LISTEN) {
        struct metrics_listen ml;
        char why[LD_ERRMSG_MAX];
        if (metrics_http_parse_listen(text, &ml, why) < 0)
            return fail_at(l, v->start_mark, "%s.%s: %s", where, k->name, why);
    }
    if (k->type == KEY_PATH)
        return store_path(l, base, k, text);
    char *s = strdup(text);
    if (!s) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    store_string(base, k, s);
    return 0;
}

/* ---- image_folder transforms ------------------------------------------------- */

/* The scalar text of a parameter, or NULL (a message is set) when it is not a scalar. */
static const char *param_text(const struct loader *l, const yaml_node_t *v, const char *where, int *ret)
{
    char got[80];
    if (v->type != YAML_SCALAR_NODE || is_null(v)) {
        *ret = fail_at(l, v->start_mark, "%s: expected a value, got %s", where, describe(v, got, sizeof got));
        return NULL;
    }
    return (const char *)v->data.scalar.value;
}

static int param_int(const struct loader *l, const yaml_node_t *v, const char *where, int64_t min, int64_t max,
                     int64_t *ret)
{
    char got[80];
    int rc = 0;
    const char *t = param_text(l, v, where, &rc);
    if (!t)
        return rc;
    if (!parse_int(t, ret) || *ret < min || *ret > max)
        return fail_at(l, v->start_mark, "%s: expected an integer in [%lld, %lld], got %s", where, (long long)min,
                       (long long)max, describe(v, got, sizeof got));
    return 0;
}

static int param_double(const struct loader *l, const yaml_node_t *v, const char *where, double *ret)
{
    char got[80], *end = NULL;
    int rc = 0;
    const char *t = param_text(l, v, where, &rc);
    if (!t)
        return rc;
    errno = 0;
    double d = strtod(t, &end);
    if (errno || end == t || *end || d != d || d > 1e300 || d < -1e300)
        return fail_at(l, v->start_mark, "%s: expected a number, got %s", where, describe(v, got, sizeof got));
    *ret = d;
    return 0;
}

static int param_bool(const struct loader *l, const yaml_node_t *v, const char *where, bool *ret)
{
    char got[80];
    int rc = 0;
    const char *t = param_text(l, v, where, &rc);
    if (!t)
        return rc;
    if (!strcmp(t, "true") || !strcmp(t, "yes"))
        *ret = true;
    else if (!strcmp(t, "false") || !strcmp(t, "no"))
        *ret = false;
    else
        return fail_at(l, v->start_mark, "%s: expected true or false, got %s", where, describe(v, got, sizeof got));
    return 0;
}

/* A list of 1..max numbers (a single number counts as a list of one). */
static int param_doubles(const struct loader *l, const yaml_node_t *v, const char *where, int min_n, int max_n,
                         double *out, int *ret_n)
{
    char got[80];
    if (v->type == YAML_SCALAR_NODE && min_n <= 1) {
        *ret_n = 1;
        return param_double(l, v, where, out);
    }
    if (v->type != YAML_SEQUENCE_NODE)
        return fail_at(l, v->start_mark, "%s: expected a list of %d to %d numbers, got %s", where, min_n, max_n,
                       describe(v, got, sizeof got));
    int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n < min_n || n > max_n)
        return fail_at(l, v->start_mark, "%s: expected a list of %d to %d numbers, got %d", where, min_n, max_n, n);
    for (int i = 0; i < n; i++) {
        int rc = param_double(l, node(l, v->data.sequence.items.start[i]), where, &out[i]);
        if (rc < 0)
            return rc;
    }
    *ret_n = n;
    return 0;
}

/* A YAML node as JSON text (a plug-in's params): mappings, sequences, scalars (numbers,
 * booleans and null as such, everything else as strings). */
static cJSON *node_json(const struct loader *l, const yaml_node_t *v, int depth)
{
    if (depth > CONFIG_MAX_DEPTH)
        return NULL;
    if (v->type == YAML_MAPPING_NODE) {
        cJSON *o = cJSON_CreateObject();
        for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; o && p < v->data.mapping.pairs.top; p++) {
            const yaml_node_t *k = node(l, p->key);
            cJSON *val = node_json(l, node(l, p->value), depth + 1);
            if (k->type != YAML_SCALAR_NODE || !val) {
                cJSON_Delete(val);
                cJSON_Delete(o);
                return NULL;
            }
            cJSON_AddItemToObject(o, (const char *)k->data.scalar.value, val);
        }
        return o;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        cJSON *a = cJSON_CreateArray();
        for (const yaml_node_item_t *i = v->data.sequence.items.start; a && i < v->data.sequence.items.top; i++) {
            cJSON *val = node_json(l, node(l, *i), depth + 1);
            if (!val) {
                cJSON_Delete(a);
                return NULL;
            }
            cJSON_AddItemToArray(a, val);
        }
        return a;
    }
    const char *t = (const char *)v->data.scalar.value;
    char *end = NULL;
    if (is_null(v))
        return cJSON_CreateNull();
    if (!strcmp(t, "true") || !strcmp(t, "false"))
        return cJSON_CreateBool(t[0] == 't');
    double d = strtod(t, &end);
    if (v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && end != t && !*end)
        return cJSON_CreateNumber(d);
    return cJSON_CreateString(t);
}

/* The parameters each transform takes, for messages (load_transform reads them). */
static const char *const transform_params[] = {
    [TRANSFORM_DECODE] = "max_pixels, strict, dct_scaling, fast",
    [TRANSFORM_RESIZE] = "size, height, width",
    [TRANSFORM_CENTER_CROP] = "size, height, width",
    [TRANSFORM_RANDOM_RESIZED_CROP] = "size, height, width, scale, ratio",
    [TRANSFORM_RANDOM_FLIP] = "p",
    [TRANSFORM_NORMALIZE] = "mean, std",
    [TRANSFORM_TO_DTYPE] = "dtype, layout",
    [TRANSFORM_PLUGIN] = "path, params",
};

/* One `- name: {params}` item of `transforms:`. */
static int load_transform(const struct loader *l, const yaml_node_t *item, const char *where,
                          struct transform_spec *t)
{
    char got[80], pw[160];
    if (item->type != YAML_MAPPING_NODE || item->data.mapping.pairs.top - item->data.mapping.pairs.start != 1)
        return fail_at(l, item->start_mark, "%s: expected a mapping with one transform name (e.g. "
                       "'- random_flip: {p: 0.5}'), got %s", where, describe(item, got, sizeof got));
    const yaml_node_pair_t *pair = item->data.mapping.pairs.start;
    const yaml_node_t *kn = node(l, pair->key), *params = node(l, pair->value);
    const char *name = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "";
    int kind = transform_kind_from_name(name);
    if (kind < 0)
        return fail_at(l, kn->start_mark, "%s: unknown transform '%s' (expected one of: decode, resize, "
                       "center_crop, random_resized_crop, random_flip, normalize, to_dtype, plugin)", where, name);
    transform_spec_init(t, (enum transform_kind)kind);
    if (!is_null(params) && params->type != YAML_MAPPING_NODE)
        return fail_at(l, params->start_mark, "%s.%s: expected a mapping of parameters, got %s", where, name,
                       describe(params, got, sizeof got));
    bool have_size = false, have_hw = false;
    yaml_mark_t size_conflict = kn->start_mark;     /* the second of size and height/width */
    for (const yaml_node_pair_t *p = is_null(params) ? NULL : params->data.mapping.pairs.start;
         p && p < params->data.mapping.pairs.top; p++) {
        const yaml_node_t *pk = node(l, p->key), *pv = node(l, p->value);
        const char *key = pk->type == YAML_SCALAR_NODE ? (const char *)pk->data.scalar.value : "";
        snprintf(pw, sizeof pw, "%s.%s.%s", where, name, key);
        int64_t iv;
        int rc = LD_ECONFIG, n;
        bool known = true;
        switch (t->kind) {
        case TRANSFORM_DECODE:
            if (!strcmp(key, "max_pixels")) {
                if ((rc = param_int(l, pv, pw, 1, INT64_MAX, &iv)) == 0)
                    t->decode.max_pixels = (uint64_t)iv;
            } else if (!strcmp(key, "strict")) {
                rc = param_bool(l, pv, pw, &t->decode.strict);
            } else if (!strcmp(key, "dct_scaling")) {
                rc = param_bool(l, pv, pw, &t->decode.dct_scaling);
            } else if (!strcmp(key, "fast")) {
                rc = param_bool(l, pv, pw, &t->decode.fast);
            } else {
                known = false;
            }
            break;
        case TRANSFORM_RESIZE:
        case TRANSFORM_CENTER_CROP:
        case TRANSFORM_RANDOM_RESIZED_CROP: {
            int *h = t->kind == TRANSFORM_RESIZE ? &t->resize.height
                     : t->kind == TRANSFORM_CENTER_CROP ? &t->center_crop.height : &t->random_resized_crop.height;
            int *w = t->kind == TRANSFORM_RESIZE ? &t->resize.width
                     : t->kind == TRANSFORM_CENTER_CROP ? &t->center_crop.width : &t->random_resized_crop.width;
            if (!strcmp(key, "size")) {
                if ((rc = param_int(l, pv, pw, 1, TRANSFORM_MAX_SIDE, &iv)) == 0) {
                    if (have_hw && !have_size)
                        size_conflict = pk->start_mark;
                    have_size = true;
                    if (t->kind == TRANSFORM_RESIZE)
                        t->resize.size = (int)iv;
                    else
                        *h = *w = (int)iv;
                }
            } else if (!strcmp(key, "height") || !strcmp(key, "width")) {
                if ((rc = param_int(l, pv, pw, 1, TRANSFORM_MAX_SIDE, &iv)) == 0) {
                    if (have_size && !have_hw)
                        size_conflict = pk->start_mark;
                    have_hw = true;
                    *(key[0] == 'h' ? h : w) = (int)iv;
                }
            } else if (t->kind == TRANSFORM_RANDOM_RESIZED_CROP && !strcmp(key, "scale")) {
                rc = param_doubles(l, pv, pw, 2, 2, t->random_resized_crop.scale, &n);
            } else if (t->kind == TRANSFORM_RANDOM_RESIZED_CROP && !strcmp(key, "ratio")) {
                rc = param_doubles(l, pv, pw, 2, 2, t->random_resized_crop.ratio, &n);
            } else {
                known = false;
            }
            break;
        }
        case TRANSFORM_RANDOM_FLIP:
            if (!strcmp(key, "p"))
                rc = param_double(l, pv, pw, &t->random_flip.p);
            else
                known = false;
            break;
        case TRANSFORM_NORMALIZE:
            if (!strcmp(key, "mean"))
                rc = param_doubles(l, pv, pw, 1, 4, t->normalize.mean, &t->normalize.n_mean);
            else if (!strcmp(key, "std"))
                rc = param_doubles(l, pv, pw, 1, 4, t->normalize.std, &t->normalize.n_std);
            else
                known = false;
            break;
        case TRANSFORM_TO_DTYPE: {
            if (strcmp(key, "dtype") && strcmp(key, "layout")) {
                known = false;
                break;
            }
            const char *text = param_text(l, pv, pw, &rc);
            if (!strcmp(key, "dtype")) {
                int dt = text ? proto_dtype_from_name(text) : -1;
                if (text && dt != LD_DTYPE_UINT8 && dt != LD_DTYPE_FLOAT16 && dt != LD_DTYPE_FLOAT32)
                    return fail_at(l, pv->start_mark, "%s: expected one of uint8, float16, float32, got %s", pw,
                                   describe(pv, got, sizeof got));
                if (text) {
                    t->to_dtype.dtype = dt;
                    rc = 0;
                }
            } else if (!strcmp(key, "layout")) {
                int lay = text ? transform_layout_from_name(text) : -1;
                if (text && lay < 0)
                    return fail_at(l, pv->start_mark, "%s: expected CHW or HWC, got %s", pw,
                                   describe(pv, got, sizeof got));
                if (text) {
                    t->to_dtype.layout = (enum transform_layout)lay;
                    rc = 0;
                }
            }
            break;
        }
        case TRANSFORM_PLUGIN:
            if (!strcmp(key, "path")) {
                const char *text = param_text(l, pv, pw, &rc);
                char *full = NULL;
                if (!text)
                    break;
                if (text[0] != '/' && l->dir) {
                    if (asprintf(&full, "%s/%s", l->dir, text) < 0)
                        full = NULL;
                } else {
                    full = strdup(text);
                }
                if (!full)
                    return LD_ENOMEM;
                free((char *)t->plugin.path);
                t->plugin.path = full;
                rc = 0;
            } else if (!strcmp(key, "params")) {
                cJSON *j = node_json(l, pv, 0);
                char *text = j ? cJSON_PrintUnformatted(j) : NULL;
                cJSON_Delete(j);
                if (!text)
                    return fail_at(l, pv->start_mark, "%s: cannot turn the parameters into JSON", pw);
                free((char *)t->plugin.params_json);
                t->plugin.params_json = text;
                rc = 0;
            } else {
                known = false;
            }
            break;
        }
        if (!known)
            return fail_at(l, pk->start_mark, "%s.%s: unknown parameter '%s' (expected one of: %s)",
                           where, name, key, transform_params[t->kind]);
        if (rc < 0)
            return rc;
    }
    if (have_size && have_hw)
        return fail_at(l, size_conflict, "%s.%s: give either size or height and width, not both", where, name);
    if (t->kind == TRANSFORM_PLUGIN && !t->plugin.path)
        return fail_at(l, kn->start_mark, "%s.plugin: missing required parameter 'path'", where);
    return 0;
}

/* Where in `item` (a `- name: {params}` of the list) to point for an error about its
 * parameter `param` (NULL: the transform's name). */
static yaml_mark_t transform_mark(const struct loader *l, const yaml_node_t *item, const char *param)
{
    if (item->type != YAML_MAPPING_NODE || item->data.mapping.pairs.top == item->data.mapping.pairs.start)
        return item->start_mark;
    const yaml_node_pair_t *pair = item->data.mapping.pairs.start;
    const yaml_node_t *kn = node(l, pair->key), *params = node(l, pair->value);
    if (param && params->type == YAML_MAPPING_NODE)
        for (const yaml_node_pair_t *p = params->data.mapping.pairs.start; p < params->data.mapping.pairs.top;
             p++) {
            const yaml_node_t *pk = node(l, p->key);
            if (pk->type == YAML_SCALAR_NODE && !strcmp((const char *)pk->data.scalar.value, param))
                return pk->start_mark;
        }
    /* `size` stands for height and width. */
    if (param && (!strcmp(param, "height") || !strcmp(param, "width")))
        return transform_mark(l, item, "size");
    return kn->start_mark;
}

static int load_transforms(const struct loader *l, const yaml_node_t *key, const yaml_node_t *v,
                           const char *where, void *base)
{
    struct config_dataset *d = base;
    char got[80], iw[LD_NAME_MAX + 48];
    if (v->type != YAML_SEQUENCE_NODE)
        return fail_at(l, v->start_mark, "%s.transforms: expected a list of transforms, got %s", where,
                       describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0 || n > TRANSFORM_MAX)
        return fail_at(l, v->start_mark, "%s.transforms: expected 1 to %d transforms, got %zu", where, TRANSFORM_MAX,
                       n);
    d->transforms = calloc(n, sizeof *d->transforms);
    if (!d->transforms)
        return LD_ENOMEM;
    d->n_transforms = n;
    for (size_t i = 0; i < n; i++) {
        yaml_mark_t m = transform_mark(l, node(l, v->data.sequence.items.start[i]), NULL);
        d->transform_at[i] = (struct config_pos){(int)m.line + 1, (int)m.column + 1};
        snprintf(iw, sizeof iw, "%s.transforms[%zu]", where, i);
        int rc = load_transform(l, node(l, v->data.sequence.items.start[i]), iw, &d->transforms[i]);
        if (rc < 0)
            return rc;
    }
    /* The list as a whole (order, output size, normalize with uint8, ...), checked here
     * rather than when the dataset opens so that the message points at the transform
     * or parameter at fault. Loading plug-ins waits for the dataset. */
    struct transform_error at;
    char err[LD_ERRMSG_MAX];
    int rc = transform_specs_check(d->transforms, n, &at, err);
    if (rc == LD_ENOMEM) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return rc;
    }
    if (rc < 0) {
        yaml_mark_t m = at.index < n ? transform_mark(l, node(l, v->data.sequence.items.start[at.index]), at.param)
                                     : key->start_mark;
        return fail_at(l, m, "%s.%s", where, err);
    }
    return 0;
}

/* Sets the defaults of the rows that apply to `kinds` (0: all rows). */
static int apply_defaults(const struct loader *l, const struct key *table, size_t n,
                          unsigned kinds, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const struct key *k = &table[i];
        if (kinds && !(k->kinds & kinds))
            continue;
        if (k->type == KEY_INT || k->type == KEY_SIZE) {
            store_uint(base, k, (uint64_t)k->def);
        } else if (k->type == KEY_FRACTION) {
            memcpy((char *)base + k->offset, &k->def_frac, sizeof k->def_frac);
        } else if (k->type == KEY_ENUM) {
            if (k->flags & KEY_REQUIRED)
                continue; /* no default; for a dataset's kind, already parsed */
            int e = (int)k->def;
            memcpy((char *)base + k->offset, &e, sizeof e);
        } else if (k->def_str) {
            char *s = strdup(k->def_str);
            if (!s) {
                ld_errorf(l->errbuf, "%s: out of memory", l->file);
                return LD_ENOMEM;
            }
            store_string(base, k, s);
        }
    }
    return 0;
}

/* The names of the rows that apply to `kinds`, comma-separated, for messages. */
static const char *key_list(const struct key *table, size_t n, unsigned kinds, char *buf,
                            size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < size; i++) {
        if (kinds && !(table[i].kinds & kinds))
            continue;
        int w = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", table[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* Walks mapping `map` against `table` into `base`. `kind` is the dataset kind
 * (0 for the server section); `where` names the mapping in messages; `missing_at` is
 * where to point when a required key is absent. */
static int load_table(const struct loader *l, const yaml_node_t *map, const struct key *table,
                      size_t n, int kind, const char *where, yaml_mark_t missing_at, void *base)
{
    char list[256];
    unsigned kinds = kind ? 1u << kind : 0;
    uint64_t seen = 0;
    int ret;

    for (const yaml_node_pair_t *pair = map->data.mapping.pairs.start;
         pair < map->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = node(l, pair->key);
        const char *name = NULL;
        if ((ret = key_text(l, k, where, &name)) < 0)
            return ret;
        char prefix[LD_NAME_MAX + 24];
        snprintf(prefix, sizeof prefix, "%s: ", where);
        if ((ret = check_duplicate(l, map, pair, name, prefix, "key")) < 0)
            return ret;
        size_t i = 0;
        while (i < n && strcmp(table[i].name, name) != 0)
            i++;
        if (i == n)
            return fail_at(l, k->start_mark, "unknown key '%s' in '%s' (expected one of: %s)",
                           name, where, key_list(table, n, kinds, list, sizeof list));
        if (kinds && !(table[i].kinds & kinds))
            return fail_at(l, k->start_mark,
                           "%s: key '%s' is not valid for kind '%s' (expected one of: %s)", where,
                           name, kind_names[kind], key_list(table, n, kinds, list, sizeof list));
        if ((ret = load_value(l, &table[i], k, node(l, pair->value), where, base)) < 0)
            return ret;
        seen |= UINT64_C(1) << i;
    }
    for (size_t i = 0; i < n; i++) {
        if ((table[i].flags & KEY_REQUIRED) && !(seen & (UINT64_C(1) << i)) &&
            (!kinds || (table[i].kinds & kinds)))
            return fail_at(l, missing_at, "%s: missing required key '%s'", where, table[i].name);
    }
    return 0;
}

/* ---- sections ----------------------------------------------------------------- */

static int load_server(const struct loader *l, const yaml_node_t *key, const yaml_node_t *v,
                       struct config *c)
{
    char got[80];
    if (is_null(v))
        return 0; /* "server:" with every key commented out: all defaults */
    if (v->type != YAML_MAPPING_NODE)
        return fail_at(l, v->start_mark, "server: expected a mapping, got %s",
                       describe(v, got, sizeof got));
    return load_table(l, v, server_keys, N_KEYS(server_keys), 0, "server", key->start_mark, c);
}

static bool valid_dataset_name(const char *s, size_t len)
{
    if (len == 0 || len >= LD_NAME_MAX || strlen(s) != len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

static int load_dataset(const struct loader *l, const yaml_node_t *key, const yaml_node_t *v,
                        struct config_dataset *d)
{
    char where[LD_NAME_MAX + 16], got[80];
    int ret;

    snprintf(where, sizeof where, "datasets.%s", d->name);
    d->line = (int)key->start_mark.line + 1;
    d->column = (int)key->start_mark.column + 1;
    if (v->type != YAML_MAPPING_NODE)
        return fail_at(l, v->start_mark, "%s: expected a mapping with 'kind' and 'path', got %s",
                       where, describe(v, got, sizeof got));

    /* The kind decides which keys are valid, so it is read before the others. */
    const yaml_node_t *kind_node = NULL, *kind_key = NULL;
    for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *k = node(l, p->key);
        if (k->type != YAML_SCALAR_NODE)
            continue;
        if (!strcmp((const char *)k->data.scalar.value, "kind") && !kind_node) {
            kind_node = node(l, p->value);
            kind_key = k;
        } else if (!strcmp((const char *)k->data.scalar.value, "path")) {
            d->path_at = (struct config_pos){(int)k->start_mark.line + 1, (int)k->start_mark.column + 1};
        }
    }
    if (!kind_node)
        return fail_at(l, key->start_mark, "%s: missing required key 'kind' (one of %s)", where,
                       KIND_KEY->choices);
    if ((ret = load_value(l, KIND_KEY, kind_key, kind_node, where, d)) < 0)
        return ret;
    if ((ret = apply_defaults(l, dataset_keys, N_KEYS(dataset_keys), 1u << d->kind, d)) < 0)
        return ret;
    if ((ret = load_table(l, v, dataset_keys, N_KEYS(dataset_keys), d->kind, where,
                          key->start_mark, d)) < 0)
        return ret;
    if (d->kind == CONFIG_DATASET_TOKEN_WINDOWS && d->stride == 0)
        d->stride = d->context;
    return 0;
}

static int load_datasets(const struct loader *l, const yaml_node_t *key, const yaml_node_t *v,
                         struct config *c)
{
    char got[80];
    int ret;

    if (v->type != YAML_MAPPING_NODE && !is_null(v))
        return fail_at(l, v->start_mark, "datasets: expected a mapping of name to dataset, got %s",
                       describe(v, got, sizeof got));
    size_t n = is_null(v) ? 0 : (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n == 0)
        return fail_at(l, is_null(v) ? key->start_mark : v->start_mark,
                       "datasets: at least one dataset is required");
    if (n > CONFIG_MAX_DATASETS)
        return fail_at(l, node(l, v->data.mapping.pairs.start[CONFIG_MAX_DATASETS].key)->start_mark,
                       "datasets: more than %d datasets", CONFIG_MAX_DATASETS);
    c->datasets = calloc(n, sizeof *c->datasets);
    if (!c->datasets) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    c->n_datasets = n; /* zeroed entries: config_free copes with the half-built ones */

    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = node(l, pair->key);
        const char *name = NULL;
        if ((ret = key_text(l, k, "datasets", &name)) < 0)
            return ret;
        if (!valid_dataset_name(name, k->data.scalar.length))
            return fail_at(l, k->start_mark,
                           "datasets: invalid dataset name %s (1 to %d characters from A-Z a-z "
                           "0-9 _ . -)",
                           describe(k, got, sizeof got), LD_NAME_MAX - 1);
        if ((ret = check_duplicate(l, v, pair, name, "datasets: ", "dataset")) < 0)
            return ret;
        if (!(c->datasets[i].name = strdup(name))) {
            ld_errorf(l->errbuf, "%s: out of memory", l->file);
            return LD_ENOMEM;
        }
        if ((ret = load_dataset(l, k, node(l, pair->value), &c->datasets[i])) < 0)
            return ret;
    }
    return 0;
}

static const struct section {
    const char *name;
    bool required;
    int (*load)(const struct loader *l, const yaml_node_t *key, const yaml_node_t *value,
                struct config *c);
} sections[] = {
    {"server", false, load_server},
    {"datasets", true, load_datasets},
};

static int load_root(const struct loader *l, struct config *c)
{
    char got[80], list[64];
    const yaml_node_t *root = yaml_document_get_root_node(l->doc);
    bool seen[N_KEYS(sections)] = {false};
    int ret;

    if (!root)
        return fail_at(l, start_mark(),
                       "the file is empty: expected a mapping with a 'datasets' key");
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(l, root->start_mark,
                       "the top level must be a mapping with a 'datasets' key, got %s",
                       describe(root, got, sizeof got));
    for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start;
         pair < root->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = node(l, pair->key);
        const char *name = NULL;
        if ((ret = key_text(l, k, "top level", &name)) < 0)
            return ret;
        if ((ret = check_duplicate(l, root, pair, name, "", "top-level key")) < 0)
            return ret;
        size_t i = 0;
        while (i < N_KEYS(sections) && strcmp(sections[i].name, name) != 0)
            i++;
        if (i == N_KEYS(sections)) {
            list[0] = '\0';
            for (size_t j = 0; j < N_KEYS(sections); j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "",
                         sections[j].name);
            return fail_at(l, k->start_mark, "unknown top-level key '%s' (expected one of: %s)",
                           name, list);
        }
        if ((ret = sections[i].load(l, k, node(l, pair->value), c)) < 0)
            return ret;
        seen[i] = true;
    }
    for (size_t i = 0; i < N_KEYS(sections); i++)
        if (sections[i].required && !seen[i])
            return fail_at(l, root->start_mark, "missing required top-level key '%s'",
                           sections[i].name);
    return 0;
}

/* ---- file --------------------------------------------------------------------- */

/* Reads the whole file, refusing more than CONFIG_MAX_FILE_BYTES. */
static int read_file(const struct loader *l, unsigned char **ret_buf, size_t *ret_len)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    struct stat st;
    int ret = 0;
    int fd = open(l->file, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(l->errbuf, "%s: cannot open: %s", l->file, strerror(-ret));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(l->errbuf, "%s: cannot stat: %s", l->file, strerror(-ret));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        ret = LD_EISDIR;
        ld_errorf(l->errbuf, "%s: is a directory, not a config file", l->file);
        goto out;
    }
    /* One byte over the cap tells "too big" from "exactly at the cap". */
    buf = malloc(CONFIG_MAX_FILE_BYTES + 1);
    if (!buf) {
        ret = LD_ENOMEM;
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        goto out;
    }
    while (len <= CONFIG_MAX_FILE_BYTES) {
        ssize_t r = read(fd, buf + len, CONFIG_MAX_FILE_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            ret = ld_from_errno(errno);
            ld_errorf(l->errbuf, "%s: cannot read: %s", l->file, strerror(-ret));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (len > CONFIG_MAX_FILE_BYTES) {
        ret = LD_ECONFIG;
        ld_errorf(l->errbuf, "%s: the file is larger than the %u bytes a config may have",
                  l->file, CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    *ret_buf = buf;
    *ret_len = len;
    buf = NULL;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return ret;
}

/* The config file's directory as an absolute path, so dataset paths survive a chdir. */
static int config_dir(const char *file, char **ret_dir)
{
    const char *slash = strrchr(file, '/');
    char *cwd = NULL, *dir = NULL;
    int ret = 0;

    if (file[0] != '/') {
        cwd = getcwd(NULL, 0);
        if (!cwd) {
            ret = ld_from_errno(errno);
            goto out;
        }
    }
    int dlen = slash ? (int)(slash - file) : 0;
    if (slash == file)
        dlen = 1; /* "/x.yaml": the root */
    int r;
    if (!cwd)
        r = asprintf(&dir, "%.*s", dlen, file);
    else if (dlen)
        r = asprintf(&dir, "%s/%.*s", cwd, dlen, file);
    else
        r = asprintf(&dir, "%s", cwd);
    if (r < 0) {
        dir = NULL;
        ret = LD_ENOMEM;
        goto out;
    }
    *ret_dir = dir;
out:
    free(cwd);
    return ret;
}

void config_default_socket(char *buf, size_t size)
{
    /* The same function the client library uses, so both meet by default. */
    (void)proto_socket_default(buf, size);
}

/* Defaults that depend on the machine rather than the file. */
static int resolve_server(const struct loader *l, struct config *c)
{
    if (!c->socket_path) {
        char buf[PATH_MAX];
        config_default_socket(buf, sizeof buf);
        if (strlen(buf) > SOCKET_PATH_MAX) {
            ld_errorf(l->errbuf,
                      "%s: the default socket path '%s' is longer than the %zu bytes a Unix "
                      "socket path holds; set server.socket",
                      l->file, buf, SOCKET_PATH_MAX);
            return LD_ECONFIG;
        }
        if (!(c->socket_path = strdup(buf))) {
            ld_errorf(l->errbuf, "%s: out of memory", l->file);
            return LD_ENOMEM;
        }
    }
    if (c->workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->workers = n < 1 ? 1 : n > LD_WORKERS_MAX ? LD_WORKERS_MAX : (uint32_t)n;
    }
    return 0;
}

int config_load(const char *path, struct config **ret_config, char *errbuf)
{
    struct loader l = {.file = path, .errbuf = errbuf};
    yaml_parser_t parser;
    yaml_document_t doc;
    bool have_parser = false, have_doc = false;
    unsigned char *buf = NULL;
    size_t len = 0;
    struct config *c = NULL;
    int ret;

    if (errbuf)
        errbuf[0] = '\0';
    if ((ret = read_file(&l, &buf, &len)) < 0)
        goto out;
    if ((ret = config_dir(path, &l.dir)) < 0) {
        ld_errorf(errbuf, "%s: cannot resolve the config's directory: %s", path,
                  ld_strerror(ret));
        goto out;
    }
    if ((ret = check_events(&l, buf, len)) < 0)
        goto out;

    if (!yaml_parser_initialize(&parser)) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "%s: out of memory", path);
        goto out;
    }
    have_parser = true;
    yaml_parser_set_input_string(&parser, buf, len);
    if (!yaml_parser_load(&parser, &doc)) {
        ret = syntax_error(&l, &parser, buf, len);
        goto out;
    }
    have_doc = true;
    l.doc = &doc;

    c = calloc(1, sizeof *c);
    if (!c || !(c->file = strdup(path))) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "%s: out of memory", path);
        goto out;
    }
    if ((ret = apply_defaults(&l, server_keys, N_KEYS(server_keys), 0, c)) < 0)
        goto out;
    if ((ret = load_root(&l, c)) < 0)
        goto out;
    if ((ret = resolve_server(&l, c)) < 0)
        goto out;
    *ret_config = c;
    c = NULL;
out:
    config_free(c);
    if (have_doc)
        yaml_document_delete(&doc);
    if (have_parser)
        yaml_parser_delete(&parser);
    free(l.dir);
    free(buf);
    return ret;
}

void config_free(struct config *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->datasets && i < c->n_datasets; i++) {
        free(c->datasets[i].name);
        free(c->datasets[i].path);
        free(c->datasets[i].pattern);
        free(c->datasets[i].cache_path);
        for (size_t t = 0; t < c->datasets[i].n_transforms; t++) {
            if (c->datasets[i].transforms[t].kind == TRANSFORM_PLUGIN) {
                free((char *)c->datasets[i].transforms[t].plugin.path);
                free((char *)c->datasets[i].transforms[t].plugin.params_json);
            }
        }
        free(c->datasets[i].transforms);
    }
    free(c->datasets);
    free(c->socket_path);
    free(c->socket_group);
    free(c->metrics_listen);
    free(c->file);
    free(c);
}

struct config_pos config_dataset_error_at(const struct config_dataset *d, const char *msg)
{
    /* transform.c names a transform "transforms[N] (kind)" (transform.h). */
    const char *t = msg ? strstr(msg, "transforms[") : NULL;
    char *end = NULL;
    unsigned long i = t ? strtoul(t + strlen("transforms["), &end, 10) : 0;
    if (t && end && *end == ']' && i < d->n_transforms && i < TRANSFORM_MAX && d->transform_at[i].line)
        return d->transform_at[i];
    if (d->path_at.line)
        return d->path_at;
    return (struct config_pos){d->line, d->column};
}
