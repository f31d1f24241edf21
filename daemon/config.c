/* config — loaderd's configuration schema: the key tables of every section and the
 * sections themselves, read from YAML into struct config (config.h).
 *
 * Each table row carries a key's type, bounds, default and target field, so adding a
 * key is adding a row; config_table.c walks the rows generically and config_yaml.c
 * reads the file and parses the values, each message placed at its FILE:LINE:COLUMN.
 * The transforms of an image_folder dataset are not listed here: each transform
 * publishes its own parameter schema (transform.h). Defaults that depend on the
 * machine (the socket path, one worker per core) are resolved after the walk. Every
 * content error returns LD_ECONFIG; the caller decides whether that is fatal (start)
 * or keeps the old config (reload). */
#include "config.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <pwd.h>
#include <unistd.h>

#include "config_access.h"
#include "config_table.h"
#include "cpus.h"
#include "config_yaml.h"
#include "ld_error.h"
#include "log.h"
#include "manifest.h"
#include "proto.h"
#include "proto_socket.h"
#include "s3.h"

#define SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/* Weights multiply (dataset x client), and the scheduler takes up to 10^6. */
#define CONFIG_WEIGHT_MAX 1000

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

/* ---- the key tables ----------------------------------------------------------- */

#define SERVER_AT(f) .offset = offsetof(struct config, f), .width = sizeof(((struct config *)0)->f)
#define DATASET_AT(f)                                                                    \
    .offset = offsetof(struct config_dataset, f),                                        \
    .width = sizeof(((struct config_dataset *)0)->f)
#define FILES (1u << CONFIG_DATASET_FILES)
#define TOKENS (1u << CONFIG_DATASET_TOKEN_WINDOWS)
#define PACKED (1u << CONFIG_DATASET_PACKED)
#define IMAGES (1u << CONFIG_DATASET_IMAGE_FOLDER)
#define SQL (1u << CONFIG_DATASET_SQL)
#define TAR (1u << CONFIG_DATASET_TAR_SHARDS)

static int kind_from_name(const char *name);
static int dtype_from_name(const char *name);
static int cache_mode_from_name(const char *name);
static int on_error_from_name(const char *name);
static int fingerprint_from_name(const char *name);
static int follow_links_from_name(const char *name);
static int format_from_name(const char *name);
static int manifest_format_from_name(const char *name);
static int s3_addressing_from_name(const char *name);

/* datasets.NAME.cache (files only). Present means mode auto unless it says otherwise. */
static const struct config_key cache_keys[] = {
    {.name = "path", .type = CONFIG_KEY_PATH, DATASET_AT(cache_path), .flags = CONFIG_KEY_REQUIRED},
    {.name = "mode", .type = CONFIG_KEY_ENUM, .def = CONFIG_CACHE_AUTO, DATASET_AT(cache_mode),
     .from_name = cache_mode_from_name, .choices = "auto, off, rebuild"},
    {.name = "fingerprint", .type = CONFIG_KEY_ENUM, .def = 0, DATASET_AT(cache_fingerprint),
     .from_name = fingerprint_from_name, .choices = "stat, content"},
};

/* datasets.NAME.manifest (files only): the samples from a CSV or JSONL file. */
static const struct config_key manifest_keys[] = {
    {.name = "path", .type = CONFIG_KEY_PATH, DATASET_AT(manifest_path), .flags = CONFIG_KEY_REQUIRED},
    {.name = "format", .type = CONFIG_KEY_ENUM, .def = MANIFEST_AUTO, DATASET_AT(manifest_format),
     .from_name = manifest_format_from_name, .choices = "csv, jsonl"},
    {.name = "columns", .type = CONFIG_KEY_COLUMNS, .flags = CONFIG_KEY_REQUIRED},
};

/* datasets.NAME.s3 (files or tar_shards at an s3:// path): the object store and how to read it. Its
 * defaults apply also when the mapping is absent (load_dataset). */
static const struct config_key s3_keys[] = {
    {.name = "endpoint", .type = CONFIG_KEY_STRING, DATASET_AT(s3_endpoint)},
    {.name = "region", .type = CONFIG_KEY_STRING, DATASET_AT(s3_region)},
    {.name = "addressing", .type = CONFIG_KEY_ENUM, .def = S3_ADDRESSING_AUTO, DATASET_AT(s3_addressing),
     .from_name = s3_addressing_from_name, .choices = "auto, path, virtual"},
    {.name = "profile", .type = CONFIG_KEY_STRING, DATASET_AT(s3_profile)},
    {.name = "credentials_file", .type = CONFIG_KEY_PATH, DATASET_AT(s3_credentials_file)},
    {.name = "part_size", .type = CONFIG_KEY_SIZE, .min = 64 * 1024, .max = 5 * (int64_t)GIB, .def = 8 * (int64_t)MIB,
     DATASET_AT(s3_part_size)},
    {.name = "parallel", .type = CONFIG_KEY_INT, .min = 1, .max = 256, .def = 16, DATASET_AT(s3_parallel)},
    {.name = "retries", .type = CONFIG_KEY_INT, .min = 0, .max = 20, .def = 3, DATASET_AT(s3_retries)},
    {.name = "timeout", .type = CONFIG_KEY_INT, .min = 1, .max = 3600, .def = 20, DATASET_AT(s3_timeout)},
    {.name = "connect_timeout", .type = CONFIG_KEY_INT, .min = 1, .max = 600, .def = 5, DATASET_AT(s3_connect_timeout)},
    {.name = "list_ttl", .type = CONFIG_KEY_INT, .min = 0, .max = 86400, .def = 30, DATASET_AT(s3_list_ttl)},
};

/* server.metrics: the optional HTTP scrape endpoint. */
static const struct config_key metrics_keys[] = {
    {.name = "listen", .type = CONFIG_KEY_LISTEN, SERVER_AT(metrics_listen), .flags = CONFIG_KEY_REQUIRED},
};

/* workers = 0 and the socket's NULL default are resolved after the walk (one thread
 * per online core; config_default_socket). */
static const struct config_key server_keys[] = {
    {.name = "socket", .type = CONFIG_KEY_SOCKET, SERVER_AT(socket_path)},
    {.name = "workers", .type = CONFIG_KEY_INT, .min = 0, .max = LD_WORKERS_MAX, .def = 0, SERVER_AT(workers),
     .flags = CONFIG_KEY_AUTO},
    {.name = "memory_budget", .type = CONFIG_KEY_SIZE, .min = (int64_t)MIB, .max = (int64_t)TIB,
     .def = (int64_t)GIB, SERVER_AT(memory_budget)},
    {.name = "device_memory_budget", .type = CONFIG_KEY_SIZE, .min = (int64_t)MIB, .max = 64 * (int64_t)TIB,
     .def = 4 * (int64_t)GIB, SERVER_AT(device_memory_budget)},
    {.name = "max_clients", .type = CONFIG_KEY_INT, .min = 1, .max = 4096, .def = 64,
     SERVER_AT(max_clients)},
    {.name = "max_streams", .type = CONFIG_KEY_INT, .min = 1, .max = 4096, .def = 64,
     SERVER_AT(max_streams)},
    {.name = "max_frame", .type = CONFIG_KEY_SIZE, .min = LD_FRAME_MIN_LIMIT, .max = LD_FRAME_MAX_LIMIT,
     .def = LD_FRAME_DEFAULT_LIMIT, SERVER_AT(max_frame)},
    {.name = "prefetch", .type = CONFIG_KEY_INT, .min = 1, .max = LD_PREFETCH_MAX, .def = 0, SERVER_AT(prefetch),
     .flags = CONFIG_KEY_AUTO},
    {.name = "log_level", .type = CONFIG_KEY_ENUM, .def = LD_LOG_INFO, SERVER_AT(log_level),
     .from_name = ld_log_level_from_name, .choices = "error, warn, info, debug"},
    {.name = "socket_group", .type = CONFIG_KEY_STRING, SERVER_AT(socket_group)},
    {.name = "hello_timeout", .type = CONFIG_KEY_INT, .min = 1, .max = 3600, .def = 10, SERVER_AT(hello_timeout_s)},
    {.name = "idle_timeout", .type = CONFIG_KEY_INT, .min = 0, .max = 7 * 86400, .def = 600, SERVER_AT(idle_timeout_s)},
    {.name = "max_reply_bytes", .type = CONFIG_KEY_SIZE, .min = 64 * 1024, .max = (int64_t)GIB, .def = 8 * (int64_t)MIB,
     SERVER_AT(max_reply_bytes)},
    {.name = "max_total_reply_bytes", .type = CONFIG_KEY_SIZE, .min = 64 * 1024, .max = 16 * (int64_t)GIB,
     .def = 64 * (int64_t)MIB, SERVER_AT(max_total_reply_bytes)},
    {.name = "share_max_lag", .type = CONFIG_KEY_INT, .min = 1, .max = LD_PREFETCH_MAX, .def = 8,
     SERVER_AT(share_max_lag)},
    {.name = "metrics", .type = CONFIG_KEY_TABLE, .sub = metrics_keys,
     .n_sub = sizeof metrics_keys / sizeof metrics_keys[0]},
};

/* stride's default 0 means "same as context" (min is 1, so YAML cannot say 0). */
static const struct config_key dataset_keys[] = {
    {.name = "kind", .type = CONFIG_KEY_ENUM, DATASET_AT(kind), .from_name = kind_from_name,
     .choices = "files, token_windows, packed, image_folder, sql, tar_shards", .flags = CONFIG_KEY_REQUIRED,
     .kinds = FILES | TOKENS | PACKED | IMAGES | SQL | TAR},
    /* Required, except by an sql dataset with a `connection` (load_dataset checks). */
    {.name = "path", .type = CONFIG_KEY_PATH, DATASET_AT(path), .kinds = FILES | TOKENS | PACKED | IMAGES | SQL | TAR},
    {.name = "connection", .type = CONFIG_KEY_STRING, DATASET_AT(sql_connection), .kinds = SQL},
    {.name = "query", .type = CONFIG_KEY_STRING, DATASET_AT(sql_query), .flags = CONFIG_KEY_REQUIRED, .kinds = SQL},
    {.name = "key", .type = CONFIG_KEY_STRING, DATASET_AT(sql_key), .flags = CONFIG_KEY_REQUIRED, .kinds = SQL},
    {.name = "columns", .type = CONFIG_KEY_COLUMNS, .flags = CONFIG_KEY_REQUIRED, .kinds = SQL},
    {.name = "version_query", .type = CONFIG_KEY_STRING, DATASET_AT(sql_version_query), .kinds = SQL},
    {.name = "pattern", .type = CONFIG_KEY_STRING, .def_str = "*", DATASET_AT(pattern), .kinds = FILES | IMAGES},
    /* tar_shards: the same key, another default (a row per kind; config_table_load takes the row of the kind). */
    {.name = "pattern", .type = CONFIG_KEY_STRING, .def_str = "*.tar", DATASET_AT(pattern), .kinds = TAR},
    {.name = "fields", .type = CONFIG_KEY_COLUMNS, .kinds = TAR},
    {.name = "index", .type = CONFIG_KEY_PATH, DATASET_AT(index_path), .kinds = TAR},
    {.name = "format", .type = CONFIG_KEY_ENUM, .def = CONFIG_FORMAT_RAW, DATASET_AT(format),
     .from_name = format_from_name, .choices = "raw, npy", .kinds = FILES},
    {.name = "manifest", .type = CONFIG_KEY_TABLE, .sub = manifest_keys, .n_sub = sizeof manifest_keys / sizeof manifest_keys[0],
     .kinds = FILES},
    {.name = "on_error", .type = CONFIG_KEY_ENUM, .def = CONFIG_ON_ERROR_REPLACE, DATASET_AT(on_error),
     .from_name = on_error_from_name, .choices = "replace, fail", .kinds = FILES | IMAGES | SQL | TAR},
    {.name = "on_error_warn_fraction", .type = CONFIG_KEY_FRACTION, .def_frac = 0.001,
     DATASET_AT(on_error_warn_fraction), .kinds = FILES | IMAGES | SQL | TAR},
    {.name = "transforms", .type = CONFIG_KEY_TRANSFORMS, .kinds = IMAGES, .flags = CONFIG_KEY_REQUIRED},
    /* tar_shards: optional (members mapped to `image` need it). */
    {.name = "transforms", .type = CONFIG_KEY_TRANSFORMS, .kinds = TAR},
    {.name = "dtype", .type = CONFIG_KEY_ENUM, .def = LD_DTYPE_UINT16, DATASET_AT(token_dtype),
     .from_name = dtype_from_name, .choices = "uint16, uint32", .kinds = TOKENS},
    {.name = "context", .type = CONFIG_KEY_INT, .min = 1, .max = 1 << 20, DATASET_AT(context),
     .flags = CONFIG_KEY_REQUIRED, .kinds = TOKENS},
    {.name = "stride", .type = CONFIG_KEY_INT, .min = 1, .max = 1 << 30, .def = 0, DATASET_AT(stride),
     .kinds = TOKENS},
    {.name = "cache", .type = CONFIG_KEY_TABLE, .sub = cache_keys, .n_sub = sizeof cache_keys / sizeof cache_keys[0],
     .kinds = FILES | IMAGES | SQL | TAR},
    {.name = "follow_links", .type = CONFIG_KEY_ENUM, .def = CONFIG_FOLLOW_LINKS_INSIDE, DATASET_AT(follow_links),
     .from_name = follow_links_from_name, .choices = "inside, outside", .kinds = FILES | IMAGES},
    /* 0 (the default, which YAML cannot say) means "the largest sample". */
    {.name = "max_sample_bytes", .type = CONFIG_KEY_SIZE, .min = 1, .max = (int64_t)TIB, .def = 0,
     DATASET_AT(max_sample_bytes), .kinds = FILES | PACKED | TAR},
    {.name = "read_timeout", .type = CONFIG_KEY_INT, .min = 1, .max = 86400, .def = 30, DATASET_AT(read_timeout),
     .kinds = FILES | IMAGES | PACKED | SQL | TAR},
    {.name = "read_ahead", .type = CONFIG_KEY_INT, .min = 0, .max = 1024, .def = 32, DATASET_AT(read_ahead),
     .kinds = FILES},
    {.name = "weight", .type = CONFIG_KEY_INT, .min = 1, .max = CONFIG_WEIGHT_MAX, .def = 1, DATASET_AT(weight),
     .kinds = FILES | TOKENS | PACKED | IMAGES | SQL | TAR},
    {.name = "max_share", .type = CONFIG_KEY_FRACTION, .def_frac = 1.0, DATASET_AT(max_share),
     .kinds = FILES | TOKENS | PACKED | IMAGES | SQL | TAR},
    {.name = "s3", .type = CONFIG_KEY_TABLE, .sub = s3_keys, .n_sub = sizeof s3_keys / sizeof s3_keys[0],
     .kinds = FILES | TAR},
};

/* clients.UID_OR_NAME (scheduling per user). */
#define CLIENT_AT(f) .offset = offsetof(struct config_client, f), .width = sizeof(((struct config_client *)0)->f)
static const struct config_key client_keys[] = {
    {.name = "weight", .type = CONFIG_KEY_INT, .min = 1, .max = CONFIG_WEIGHT_MAX, .def = 1, CLIENT_AT(weight)},
    {.name = "max_share", .type = CONFIG_KEY_FRACTION, .def_frac = 1.0, CLIENT_AT(max_share)},
};

#define N_KEYS(t) (sizeof(t) / sizeof((t)[0]))
/* config_table_load marks the keys it has seen in a 64-bit mask. */
_Static_assert(N_KEYS(server_keys) <= CONFIG_TABLE_MAX_KEYS && N_KEYS(dataset_keys) <= CONFIG_TABLE_MAX_KEYS,
               "key tables too long");
#define KIND_KEY (&dataset_keys[0])

static const char *const kind_names[] = {
    [CONFIG_DATASET_FILES] = "files",
    [CONFIG_DATASET_TOKEN_WINDOWS] = "token_windows",
    [CONFIG_DATASET_PACKED] = "packed",
    [CONFIG_DATASET_IMAGE_FOLDER] = "image_folder",
    [CONFIG_DATASET_SQL] = "sql",
    [CONFIG_DATASET_TAR_SHARDS] = "tar_shards",
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

static int format_from_name(const char *name)
{
    if (strcmp(name, "raw") == 0)
        return CONFIG_FORMAT_RAW;
    if (strcmp(name, "npy") == 0)
        return CONFIG_FORMAT_NPY;
    return -1;
}

static int s3_addressing_from_name(const char *name)
{
    if (strcmp(name, "auto") == 0)
        return S3_ADDRESSING_AUTO;
    if (strcmp(name, "path") == 0)
        return S3_ADDRESSING_PATH;
    if (strcmp(name, "virtual") == 0)
        return S3_ADDRESSING_VIRTUAL;
    return -1;
}

static int manifest_format_from_name(const char *name)
{
    if (strcmp(name, "csv") == 0)
        return MANIFEST_CSV;
    if (strcmp(name, "jsonl") == 0)
        return MANIFEST_JSONL;
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

/* ---- sections ----------------------------------------------------------------- */

static int load_server(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                       struct config *c)
{
    char got[80];
    if (config_yaml_is_null(v))
        return 0; /* "server:" with every key commented out: all defaults */
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "server: expected a mapping, got %s",
                                config_yaml_describe(v, got, sizeof got));
    return config_table_load(l, v, server_keys, N_KEYS(server_keys), 0, NULL, "server", key->start_mark, c);
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

/* The value node of `name` in mapping v (its mark), else v's. */
static yaml_mark_t value_mark(const struct config_loader *l, const yaml_node_t *v, const char *name)
{
    for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = config_yaml_node(l, p->key);
        if (k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, name))
            return config_yaml_node(l, p->value)->start_mark;
    }
    return v->start_mark;
}

/* An s3:// path is for the daemon's own `files` datasets: a dataset a trainer declares
 * would read the store with the daemon's credentials. The s3 keys need such a path. */
static int check_s3(const struct config_loader *l, const yaml_node_t *v, const char *where,
                    const struct config_dataset *d)
{
    bool url = s3_is_url(d->path);
    yaml_mark_t at = value_mark(l, v, "path");
    if (url && d->kind != CONFIG_DATASET_FILES && d->kind != CONFIG_DATASET_TAR_SHARDS)
        return config_yaml_fail(l, at, "%s.path: an s3:// location is read by the files and tar_shards kinds only, "
                                "not %s", where, kind_names[d->kind]);
    if (url && d->kind == CONFIG_DATASET_TAR_SHARDS && !d->index_path && !d->cache_path)
        return config_yaml_fail(l, at, "%s.path: the shards of an s3:// location are copied to this node, next to "
                                "the dataset's `index:` (INDEX.shards/) or `cache:` (PATH.shards/): give one of them",
                                where);
    if (url && strcmp(l->file, "spec") == 0)
        return config_yaml_fail(l, at, "%s.path: an s3:// location may be used only by datasets of the daemon's "
                                "config (a declared dataset would read the store with the daemon's credentials)",
                                where);
    if (url && d->manifest_path)
        return config_yaml_fail(l, value_mark(l, v, "manifest"), "%s.manifest: does not apply to an s3:// location "
                                "(a manifest's paths are files of this node)", where);
    if (url) {
        char bucket[64], msg[LD_ERRMSG_MAX];
        const char *prefix;
        if (s3_url_split(d->path, bucket, sizeof bucket, &prefix, msg) < 0)
            return config_yaml_fail(l, at, "%s.path: %s", where, msg);
    }
    if (!url && (d->kind == CONFIG_DATASET_FILES || d->kind == CONFIG_DATASET_TAR_SHARDS)) {
        for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
            const yaml_node_t *k = config_yaml_node(l, p->key);
            if (k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, "s3"))
                return config_yaml_fail(l, k->start_mark, "%s.s3: applies to an s3://BUCKET/PREFIX path only", where);
        }
    }
    return 0;
}

static int load_dataset(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                        struct config_dataset *d)
{
    char where[LD_NAME_MAX + 16], got[80];
    int ret;

    snprintf(where, sizeof where, "datasets.%s", d->name);
    d->line = (int)key->start_mark.line + 1;
    d->column = (int)key->start_mark.column + 1;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "%s: expected a mapping with 'kind' and 'path', got %s",
                                where, config_yaml_describe(v, got, sizeof got));

    /* The kind decides which keys are valid, so it is read before the others. */
    const yaml_node_t *kind_node = NULL, *kind_key = NULL;
    for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *k = config_yaml_node(l, p->key);
        if (k->type != YAML_SCALAR_NODE)
            continue;
        if (!strcmp((const char *)k->data.scalar.value, "kind") && !kind_node) {
            kind_node = config_yaml_node(l, p->value);
            kind_key = k;
        } else if (!strcmp((const char *)k->data.scalar.value, "path")) {
            d->path_at = (struct config_pos){(int)k->start_mark.line + 1, (int)k->start_mark.column + 1};
        }
    }
    if (!kind_node)
        return config_yaml_fail(l, key->start_mark, "%s: missing required key 'kind' (one of %s)", where,
                                KIND_KEY->choices);
    if ((ret = config_table_value(l, KIND_KEY, kind_key, kind_node, where, d)) < 0)
        return ret;
    if ((ret = config_table_defaults(l, dataset_keys, N_KEYS(dataset_keys), 1u << d->kind, d)) < 0)
        return ret;
    if ((d->kind == CONFIG_DATASET_FILES || d->kind == CONFIG_DATASET_TAR_SHARDS) &&
        (ret = config_table_defaults(l, s3_keys, N_KEYS(s3_keys), 0, d)) < 0)
        return ret;
    if ((ret = config_table_load(l, v, dataset_keys, N_KEYS(dataset_keys), 1u << d->kind,
                                 kind_names[d->kind], where, key->start_mark, d)) < 0)
        return ret;
    if (!d->path && !d->sql_connection)
        return config_yaml_fail(l, key->start_mark, "%s: missing required key 'path'%s", where,
                                d->kind == CONFIG_DATASET_SQL ? " (an SQLite file) or 'connection' (PostgreSQL)" : "");
    if (d->path && d->sql_connection)
        return config_yaml_fail(l, value_mark(l, v, "connection"), "%s: 'path' (an SQLite file) and 'connection' "
                                "(a PostgreSQL server) exclude each other", where);
    if (d->kind == CONFIG_DATASET_TOKEN_WINDOWS && d->stride == 0)
        d->stride = d->context;
    if ((ret = check_s3(l, v, where, d)) < 0)
        return ret;
    if (d->manifest_path && d->format != CONFIG_FORMAT_RAW)
        return config_yaml_fail(l, key->start_mark, "%s: 'format' does not apply with a manifest: give each "
                                "column its type (file or npy) under manifest.columns", where);
    if (d->max_share <= 0)
        return config_yaml_fail(l, value_mark(l, v, "max_share"), "%s.max_share: expected a fraction above 0 "
                                "(1: no cap), got 0: a dataset that may use no worker time could never deliver a "
                                "batch", where);
    return 0;
}

static int load_datasets(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                         struct config *c)
{
    char got[80];
    int ret;

    if (v->type != YAML_MAPPING_NODE && !config_yaml_is_null(v))
        return config_yaml_fail(l, v->start_mark, "datasets: expected a mapping of name to dataset, got %s",
                                config_yaml_describe(v, got, sizeof got));
    size_t n = config_yaml_is_null(v) ? 0 : (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n == 0)
        return config_yaml_fail(l, config_yaml_is_null(v) ? key->start_mark : v->start_mark,
                                "datasets: at least one dataset is required");
    if (n > CONFIG_MAX_DATASETS)
        return config_yaml_fail(l,
                                config_yaml_node(l, v->data.mapping.pairs.start[CONFIG_MAX_DATASETS].key)->start_mark,
                                "datasets: more than %d datasets", CONFIG_MAX_DATASETS);
    c->datasets = calloc(n, sizeof *c->datasets);
    c->dataset_json = calloc(n, sizeof *c->dataset_json);
    if (!c->datasets || !c->dataset_json) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    c->n_datasets = n; /* zeroed entries: config_free copes with the half-built ones */

    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = config_yaml_node(l, pair->key);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, "datasets", &name)) < 0)
            return ret;
        if (!valid_dataset_name(name, k->data.scalar.length))
            return config_yaml_fail(l, k->start_mark,
                                    "datasets: invalid dataset name %s (1 to %d characters from A-Z a-z "
                                    "0-9 _ . -)",
                                    config_yaml_describe(k, got, sizeof got), LD_NAME_MAX - 1);
        if ((ret = config_yaml_check_duplicate(l, v, pair, name, "datasets: ", "dataset")) < 0)
            return ret;
        if (!(c->datasets[i].name = strdup(name))) {
            ld_errorf(l->errbuf, "%s: out of memory", l->file);
            return LD_ENOMEM;
        }
        if ((ret = load_dataset(l, k, config_yaml_node(l, pair->value), &c->datasets[i])) < 0)
            return ret;
        cJSON *json = config_yaml_json(l, config_yaml_node(l, pair->value), 0);
        c->dataset_json[i] = json ? cJSON_PrintUnformatted(json) : NULL;
        cJSON_Delete(json);
        if (!c->dataset_json[i]) {
            ld_errorf(l->errbuf, "%s: out of memory", l->file);
            return LD_ENOMEM;
        }
    }
    return 0;
}

/* clients: a mapping of uid (a number) or user name to {weight, max_share}. Names are
 * resolved now, so that a typo fails at start rather than never matching. */
static int load_clients(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                        struct config *c)
{
    char got[80], where[LD_NAME_MAX + 16];
    int ret;
    (void)key;
    if (config_yaml_is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "clients: expected a mapping of uid or user name to "
                                "{weight, max_share}, got %s", config_yaml_describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > CONFIG_MAX_CLIENTS)
        return config_yaml_fail(l, v->start_mark, "clients: more than %d entries", CONFIG_MAX_CLIENTS);
    c->clients = calloc(n ? n : 1, sizeof *c->clients);
    if (!c->clients) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = config_yaml_node(l, pair->key), *val = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, "clients", &name)) < 0)
            return ret;
        if ((ret = config_yaml_check_duplicate(l, v, pair, name, "clients: ", "client")) < 0)
            return ret;
        struct config_client *cl = &c->clients[i];
        int64_t uid;
        if (config_yaml_parse_int(name, &uid)) {
            if (uid < 0 || uid > UINT32_MAX - 1)
                return config_yaml_fail(l, k->start_mark, "clients: uid %s is out of range", name);
        } else {
            struct passwd pw, *found = NULL;
            char buf[4096];
            if (getpwnam_r(name, &pw, buf, sizeof buf, &found) != 0 || !found)
                return config_yaml_fail(l, k->start_mark, "clients: no user named '%s' (give a user name or a uid)",
                                        name);
            uid = found->pw_uid;
        }
        for (size_t j = 0; j < i; j++)
            if (c->clients[j].uid == (uint32_t)uid)
                return config_yaml_fail(l, k->start_mark,
                                        "clients: '%s' is uid %lld, which an earlier entry already names", name,
                                        (long long)uid);
        cl->uid = (uint32_t)uid;
        snprintf(where, sizeof where, "clients.%.*s", LD_NAME_MAX - 1, name);
        if ((ret = config_table_defaults(l, client_keys, N_KEYS(client_keys), 0, cl)) < 0)
            return ret;
        if (!config_yaml_is_null(val)) {
            if (val->type != YAML_MAPPING_NODE)
                return config_yaml_fail(l, val->start_mark, "%s: expected a mapping with weight and max_share, got %s",
                                        where, config_yaml_describe(val, got, sizeof got));
            if ((ret = config_table_load(l, val, client_keys, N_KEYS(client_keys), 0, NULL, where, k->start_mark,
                                         cl)) < 0)
                return ret;
            if (cl->max_share <= 0)
                return config_yaml_fail(l, value_mark(l, val, "max_share"), "%s.max_share: expected a fraction "
                                        "above 0 (1: no cap), got 0: its streams could never deliver a batch", where);
        }
        c->n_clients++;
    }
    return 0;
}

const struct config_client *config_client_for_uid(const struct config *c, uint32_t uid)
{
    for (size_t i = 0; i < c->n_clients; i++)
        if (c->clients[i].uid == uid)
            return &c->clients[i];
    return NULL;
}

static int load_access(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                       struct config *c)
{
    return config_access_load(l, key, v, &c->access);
}

/* access.datasets names datasets of the config, whichever section came first. */
static int check_access(const struct config_loader *l, const struct config *c)
{
    const char *names[CONFIG_MAX_DATASETS];
    for (size_t i = 0; i < c->n_datasets && i < CONFIG_MAX_DATASETS; i++)
        names[i] = c->datasets[i].name;
    return config_access_check(l, &c->access, names, c->n_datasets);
}

static const struct section {
    const char *name;
    bool required;
    int (*load)(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *value,
                struct config *c);
} sections[] = {
    {"server", false, load_server},
    {"datasets", true, load_datasets},
    {"clients", false, load_clients},
    {"access", false, load_access},
};

static int load_root(const struct config_loader *l, struct config *c)
{
    char got[80], list[64];
    const yaml_node_t *root = yaml_document_get_root_node(l->doc);
    bool seen[N_KEYS(sections)] = {false};
    int ret;

    if (!root)
        return config_yaml_fail(l, config_yaml_start_mark(),
                                "the file is empty: expected a mapping with a 'datasets' key");
    if (root->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, root->start_mark,
                                "the top level must be a mapping with a 'datasets' key, got %s",
                                config_yaml_describe(root, got, sizeof got));
    for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start;
         pair < root->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = config_yaml_node(l, pair->key);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, "top level", &name)) < 0)
            return ret;
        if ((ret = config_yaml_check_duplicate(l, root, pair, name, "", "top-level key")) < 0)
            return ret;
        size_t i = 0;
        while (i < N_KEYS(sections) && strcmp(sections[i].name, name) != 0)
            i++;
        if (i == N_KEYS(sections)) {
            list[0] = '\0';
            for (size_t j = 0; j < N_KEYS(sections); j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "",
                         sections[j].name);
            return config_yaml_fail(l, k->start_mark, "unknown top-level key '%s' (expected one of: %s)",
                                    name, list);
        }
        if ((ret = sections[i].load(l, k, config_yaml_node(l, pair->value), c)) < 0)
            return ret;
        seen[i] = true;
    }
    for (size_t i = 0; i < N_KEYS(sections); i++)
        if (sections[i].required && !seen[i])
            return config_yaml_fail(l, root->start_mark, "missing required top-level key '%s'",
                                    sections[i].name);
    return 0;
}

void config_default_socket(char *buf, size_t size)
{
    /* The same function the client library uses, so both meet by default. */
    (void)proto_socket_default(buf, size);
}

/* Defaults that depend on the machine rather than the file. */
static int resolve_server(const struct config_loader *l, struct config *c)
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
        /* auto: the CPUs this process may use (affinity, cgroup quota), not the host's */
        struct cpus_info ci;
        cpus_probe(&ci);
        c->workers = ci.usable > LD_WORKERS_MAX ? LD_WORKERS_MAX : ci.usable;
    }
    return 0;
}

int config_load(const char *path, struct config **ret_config, char *errbuf)
{
    struct config_loader l = {.file = path, .errbuf = errbuf};
    yaml_document_t doc;
    struct config *c = NULL;
    int ret;

    if (errbuf)
        errbuf[0] = '\0';
    if ((ret = config_yaml_open(&l, &doc)) < 0)
        goto out;
    c = calloc(1, sizeof *c);
    if (!c || !(c->file = strdup(path))) {
        ret = LD_ENOMEM;
        ld_errorf(errbuf, "%s: out of memory", path);
        goto out;
    }
    if ((ret = config_table_defaults(&l, server_keys, N_KEYS(server_keys), 0, c)) < 0)
        goto out;
    if ((ret = load_root(&l, c)) < 0 || (ret = check_access(&l, c)) < 0)
        goto out;
    if ((ret = resolve_server(&l, c)) < 0)
        goto out;
    *ret_config = c;
    c = NULL;
out:
    config_free(c);
    config_yaml_close(&l);
    return ret;
}

/* A message of the spec's loader, as the trainer should read it: the file position
 * goes ("spec:1:42: ") and the dataset's place ("datasets.spec") is the spec's ("spec"). */
static void config_spec_message(const char *msg, char *errbuf)
{
    char out[LD_ERRMSG_MAX];
    size_t n = 0;
    const char *p = msg;
    if (strncmp(p, "spec:", 5) == 0) {
        const char *sep = strstr(p, ": ");
        if (sep)
            p = sep + 2;
    }
    bool placed = strncmp(p, "datasets.spec", 13) == 0 || strstr(p, "'datasets.spec");
    if (!placed)
        n += (size_t)snprintf(out, sizeof out, "spec: ");
    while (*p && n + 1 < sizeof out) {
        if (strncmp(p, "datasets.spec", 13) == 0) {
            n += (size_t)snprintf(out + n, sizeof out - n, "spec");
            p += 13;
        } else {
            out[n++] = *p++;
        }
    }
    out[n < sizeof out ? n : sizeof out - 1] = '\0';
    snprintf(errbuf, LD_ERRMSG_MAX, "%s", out);
}

int config_load_spec(const char *spec_json, size_t len, const char *dir, struct config **ret_config,
                     char *errbuf)
{
    char msg[LD_ERRMSG_MAX] = "";
    struct config_loader l = {.file = "spec", .errbuf = msg};
    yaml_document_t doc;
    struct config *c = NULL;
    char *text = NULL;
    int ret;

    if (errbuf)
        errbuf[0] = '\0';
    if (memchr(spec_json, '\n', len) || memchr(spec_json, '\r', len) || memchr(spec_json, '\0', len)) {
        /* Compact JSON is one line: a line break could start another top-level key. */
        ret = LD_ECONFIG;
        ld_errorf(msg, "spec: expected one line of compact JSON");
        goto out;
    }
    /* JSON is YAML's flow style: the spec becomes the one dataset of a config. */
    if (asprintf(&text, "datasets:\n  spec: %.*s\n", (int)len, spec_json) < 0) {
        text = NULL;
        ret = LD_ENOMEM;
        ld_errorf(msg, "out of memory");
        goto out;
    }
    if ((ret = config_yaml_open_text(&l, text, strlen(text), dir, &doc)) < 0)
        goto out;
    c = calloc(1, sizeof *c);
    if (!c || !(c->file = strdup("spec"))) {
        ret = LD_ENOMEM;
        ld_errorf(msg, "out of memory");
        goto out;
    }
    if ((ret = config_table_defaults(&l, server_keys, N_KEYS(server_keys), 0, c)) < 0 ||
        (ret = load_root(&l, c)) < 0)
        goto out;
    *ret_config = c;
    c = NULL;
out:
    if (ret < 0 && errbuf)
        config_spec_message(msg, errbuf);
    free(text);
    config_free(c);
    config_yaml_close(&l);
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
        free(c->datasets[i].manifest_path);
        free(c->datasets[i].sql_connection);
        free(c->datasets[i].s3_endpoint);
        free(c->datasets[i].s3_region);
        free(c->datasets[i].s3_profile);
        free(c->datasets[i].s3_credentials_file);
        free(c->datasets[i].sql_query);
        free(c->datasets[i].sql_key);
        free(c->datasets[i].sql_version_query);
        free(c->datasets[i].index_path);
        for (size_t k = 0; k < c->datasets[i].n_columns; k++)
            free(c->datasets[i].columns[k].name);
        free(c->datasets[i].columns);
        for (size_t t = 0; t < c->datasets[i].n_transforms; t++)
            transform_spec_clear(&c->datasets[i].transforms[t]);
        free(c->datasets[i].transforms);
        if (c->dataset_json)
            cJSON_free(c->dataset_json[i]);
    }
    free(c->datasets);
    free(c->dataset_json);
    free(c->clients);
    access_config_clear(&c->access);
    free(c->socket_path);
    free(c->socket_group);
    free(c->metrics_listen);
    free(c->file);
    free(c);
}

struct config_pos config_dataset_error_at(const struct config_dataset *d, const char *msg)
{
    /* The transform module names a transform "transforms[N] (kind)" (transform.h). */
    const char *t = msg ? strstr(msg, "transforms[") : NULL;
    char *end = NULL;
    unsigned long i = t ? strtoul(t + strlen("transforms["), &end, 10) : 0;
    if (t && end && *end == ']' && i < d->n_transforms && i < TRANSFORM_MAX && d->transform_at[i].line)
        return d->transform_at[i];
    if (d->path_at.line)
        return d->path_at;
    return (struct config_pos){d->line, d->column};
}
