/* config — loaderd's YAML configuration, read with libyaml into typed structs.
 *
 * Each key is a row of a table (type, bounds, default, target); unknown keys, wrong
 * types and out-of-range values are errors whose message starts with
 * "FILE:LINE:COLUMN: ". Aliases are rejected and the file size is capped. */
#ifndef LD_CONFIG_H
#define LD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "access.h"
#include "transform.h"

#define CONFIG_MAX_FILE_BYTES (1u << 20)
#define CONFIG_MAX_DATASETS 256
#define CONFIG_MAX_CLIENTS 1024

enum config_dataset_kind {
    CONFIG_DATASET_FILES = 1,
    CONFIG_DATASET_TOKEN_WINDOWS = 2,
    CONFIG_DATASET_PACKED = 3,
    CONFIG_DATASET_IMAGE_FOLDER = 4,
    CONFIG_DATASET_SQL = 5,
    CONFIG_DATASET_TAR_SHARDS = 6,
};

/* on_error: what a sample that cannot be read or decoded does to its batch. */
enum config_on_error {
    CONFIG_ON_ERROR_REPLACE = 0,    /* another sample, chosen deterministically, takes its place */
    CONFIG_ON_ERROR_FAIL = 1,       /* the stream fails with an error naming the file */
};

/* format (files): what a file holds. */
enum config_format {
    CONFIG_FORMAT_RAW = 0,          /* its bytes, served as they are (uint8) */
    CONFIG_FORMAT_NPY = 1,          /* a numpy .npy array, served as a typed field (npy.h) */
};

/* manifest.columns: what a manifest column becomes (source_manifest.c). */
enum config_column_type {
    CONFIG_COLUMN_FILE = 1,         /* a path: the file's bytes */
    CONFIG_COLUMN_NPY = 2,          /* a path: the file's .npy array, a typed field */
    CONFIG_COLUMN_LABEL = 3,        /* the int64 field "label": integers, or class names by rank */
    CONFIG_COLUMN_INT64 = 4,        /* a number, an int64 scalar field */
    CONFIG_COLUMN_FLOAT32 = 5,      /* a number, a float32 scalar field */
    CONFIG_COLUMN_BLOB = 6,         /* sql: the value's bytes */
    CONFIG_COLUMN_IMAGE = 7,        /* tar_shards: an encoded image, through the dataset's transforms */
    CONFIG_COLUMN_BYTES = 8,        /* tar_shards: the member's bytes (uint8) */
};

struct config_column {
    char *name;                     /* the manifest's column, and the field's name */
    int type;                       /* enum config_column_type */
};

/* follow_links: where a symbolic link found in a dataset's tree may lead. */
enum config_follow_links {
    CONFIG_FOLLOW_LINKS_INSIDE = 0, /* to a file beneath the dataset's directory only */
    CONFIG_FOLLOW_LINKS_OUTSIDE = 1,/* anywhere (the operator vouches for the tree) */
};

/* cache.mode: off (no `cache:` section), auto (build when a stream first needs it,
 * serve it once valid), rebuild (build a new one once per daemon run, even over a
 * valid one: the forced re-cache). */
enum config_cache_mode {
    CONFIG_CACHE_OFF = 0,
    CONFIG_CACHE_AUTO = 1,
    CONFIG_CACHE_REBUILD = 2,
};

/* A place in the config file, 1-based; 0, 0 when unknown. */
struct config_pos {
    int line, column;
};

struct config_dataset {
    char *name;                     /* the key under `datasets:` */
    int kind;                       /* enum config_dataset_kind */
    char *path;                     /* files: directory; token_windows: the token file; packed: the cache file;
                                     * tar_shards: the directory of shards, or one shard */
    int line, column;               /* where the dataset is defined, for later messages */
    struct config_pos path_at;      /* the `path` key */
    struct config_pos transform_at[TRANSFORM_MAX]; /* each transform's name */
    /* files */
    char *pattern;                  /* fnmatch(3) glob on the path relative to `path`; default "*" */
    int format;                     /* enum config_format */
    /* files: the manifest that lists the samples instead of the tree (NULL: none) */
    char *manifest_path;
    int manifest_format;            /* MANIFEST_* (manifest.h); 0: from the file name */
    struct config_column *columns;  /* manifest.columns (sql: columns; tar_shards: fields), in order: the
                                     * sample's fields */
    size_t n_columns;
    /* sql: the PostgreSQL connection string or service name (NULL: SQLite, `path`), the
     * query (one row per sample), its key column, the cache's version query */
    char *sql_connection;
    char *sql_query;
    char *sql_key;
    char *sql_version_query;
    /* tar_shards: the file that keeps the shards' member index (NULL: <cache.path>.tarindex
     * when there is a cache, else none) */
    char *index_path;
    /* files at an s3://BUCKET/PREFIX path: the object store (the `s3:` mapping; s3.h) */
    char *s3_endpoint;              /* NULL: AWS's endpoint for the region */
    char *s3_region;                /* NULL: $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1 */
    int s3_addressing;              /* enum s3_addressing */
    char *s3_profile;               /* NULL: $AWS_PROFILE or "default" */
    char *s3_credentials_file;      /* NULL: $AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials */
    uint64_t s3_part_size;          /* bytes per ranged GET */
    uint32_t s3_parallel;           /* GETs in flight per read (the cache build's read-ahead) */
    uint32_t s3_retries;            /* attempts after the first */
    uint32_t s3_timeout;            /* seconds per attempt */
    uint32_t s3_connect_timeout;    /* seconds */
    uint32_t s3_list_ttl;           /* seconds a listing proves the cache's fingerprint; 0: each check lists */
    /* token_windows */
    int token_dtype;                /* LD_DTYPE_UINT16 or LD_DTYPE_UINT32 */
    uint32_t context;               /* N: a sample is N+1 tokens */
    uint32_t stride;                /* tokens between window starts; default = context */
    /* files: the single-file cache (the `cache:` mapping) */
    char *cache_path;               /* cache.path: the packed file (NULL: no cache) */
    int cache_mode;                 /* enum config_cache_mode */
    int cache_fingerprint;          /* DATASET_FINGERPRINT_STAT (0) or _CONTENT (1) */
    int on_error;                   /* enum config_on_error (files, image_folder) */
    /* on_error: replace: more replaced samples than this fraction of the dataset in one
     * epoch is logged as a warning (files, image_folder) */
    double on_error_warn_fraction;
    int follow_links;               /* enum config_follow_links (files, image_folder) */
    uint64_t max_sample_bytes;      /* ragged samples (files, packed): the largest served; 0: no bound */
    uint32_t read_timeout;          /* seconds a read of a sample may take (files, image_folder, packed) */
    uint32_t read_ahead;            /* files: reads in flight for samples not in the page cache; 0: none */
    /* image_folder: the pipeline, in order (plug-in paths and params are owned here) */
    struct transform_spec *transforms;
    size_t n_transforms;
    /* Scheduling (scheduler.h): the weight of each of its streams in the share of worker
     * time, and the fraction of the workers all its streams together may use (1: no cap). */
    uint32_t weight;
    double max_share;
};

/* clients.UID_OR_NAME: the scheduling of the streams a user's connections open. */
struct config_client {
    uint32_t uid;
    uint32_t weight;                /* multiplies the dataset's */
    double max_share;               /* of the workers, for all of this uid's streams; 1: no cap */
};

struct config {
    char *file;                     /* the path it was loaded from */
    char *socket_path;              /* default: $LOADERD_SOCKET, else $XDG_RUNTIME_DIR/loaderd.sock, else /tmp/loaderd-$UID.sock */
    uint32_t workers;               /* worker threads; 0 or auto in YAML: one per usable CPU (cpus.h) */
    uint64_t memory_budget;         /* bytes of shared-memory rings across all streams */
    uint64_t device_memory_budget;  /* bytes of device rings per GPU, across its streams */
    uint32_t max_clients;
    uint32_t max_streams;           /* per daemon */
    uint32_t max_frame;             /* bytes, LD_FRAME_MIN_LIMIT..LD_FRAME_MAX_LIMIT */
    uint32_t prefetch;              /* default prefetch for streams that do not say; 0: auto (prefetch.h) */
    uint32_t share_max_lag;         /* batches a shared stream's consumer may fall behind (share.h) */
    char *socket_group;             /* group given the socket and the rings (0640); NULL: none */
    char *metrics_listen;           /* server.metrics.listen (metrics_http.h); NULL: no listener */
    uint32_t hello_timeout_s;       /* a connection must say hello within this */
    uint32_t idle_timeout_s;        /* a connection without streams is closed after this; 0: never */
    uint64_t max_reply_bytes;       /* replies queued unread per connection */
    uint64_t max_total_reply_bytes; /* the same across every connection */
    int log_level;                  /* LD_LOG_* */
    struct config_dataset *datasets;
    size_t n_datasets;
    /* Per dataset, its definition as written (compact JSON, paths as written): what a
     * trainer refines when it opens the dataset as a template (declare.h). */
    char **dataset_json;
    struct config_client *clients;
    size_t n_clients;
    struct access_config access;    /* the `access:` section (access.h); all unset: everyone */
};

/* Loads and validates `path`. On failure returns LD_ECONFIG (or -errno when the file
 * cannot be read) with a message in errbuf (LD_ERRMSG_MAX bytes) that starts with
 * "path:line:column: " where a position is known. */
int config_load(const char *path, struct config **ret_config, char *errbuf);
void config_free(struct config *c);
/* Where a message about dataset d that the config could not check (dataset_open's: a
 * source that cannot be read, a plug-in that cannot be loaded) should point: the
 * transform that a "transforms[N]" in msg names, else the dataset's `path`. */
struct config_pos config_dataset_error_at(const struct config_dataset *d, const char *msg);
/* The `clients:` entry for uid, or NULL (weight 1, no cap). */
const struct config_client *config_client_for_uid(const struct config *c, uint32_t uid);
/* A dataset that a trainer declares (a JSON object: kind, path, pattern, transforms,
 * cache... as under `datasets:`), read by the same tables as the config file, into a
 * config whose one dataset is named "spec"; relative paths resolve against dir. On
 * failure the message is the one the config file would get, placed at the spec's key
 * instead of a file position: "spec.transforms[1].size: expected ...". LD_ECONFIG,
 * LD_ENOMEM. */
int config_load_spec(const char *spec_json, size_t len, const char *dir, struct config **ret_config,
                     char *errbuf);
/* The default socket path for a user run, into buf (size bytes). */
void config_default_socket(char *buf, size_t size);

#endif
