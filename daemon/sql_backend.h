/* sql_backend — what the `sql` kind (source_sql.c) asks of a database engine, and what
 * it shares with the engines (sql_sqlite.c: an SQLite file; sql_pg.c: a PostgreSQL
 * server through libpq).
 *
 * The kind owns everything that is the same for every engine: the dataset's keys,
 * lengths, labels and numbers scanned at open, the connection pool, the blocks of rows
 * fetched by key, the fingerprint and the messages. An engine opens connections, turns
 * the kind's three statements into its dialect, runs them and hands back each row's
 * values. This header is private to those files. */
#ifndef LD_SQL_BACKEND_H
#define LD_SQL_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dataset.h"

/* The statements every engine prepares on each connection. */
enum sql_stmt {
    /* The key, each blob's byte length, the label and numbers of every row, ordered by
     * the key. No parameters. */
    SQL_STMT_SCAN = 0,
    /* The key and the blob columns (in field order) of the rows of some samples: run()
     * gets their indices, sorted and unique; rows may come in any order, rows of other
     * keys are ignored. */
    SQL_STMT_FETCH = 1,
    /* The version query, or the query's row count: one row, every column as text (at
     * most LD_MAX_FIELDS), then a value of type SQL_END. */
    SQL_STMT_VERSION = 2,
};

/* One value of a row. */
enum sql_type {
    SQL_NULL = 0,
    SQL_INT = 1,                    /* i */
    SQL_FLOAT = 2,                  /* f */
    SQL_TEXT = 3,                   /* p, len (not counting a NUL that may follow) */
    SQL_BLOB = 4,                   /* p, len */
    SQL_END = 5,                    /* after the last column of an SQL_STMT_VERSION row */
};

struct sql_value {
    int type;                       /* enum sql_type */
    int64_t i;
    double f;
    const void *p;
    uint64_t len;
};

/* A connection: the engine's struct embeds this first. The block (the rows last
 * fetched on it) is the kind's. A connection is used by one thread at a time. */
struct sql_conn {
    uint64_t *block_idx;            /* the samples fetched, sorted */
    uint64_t block_n;
    uint64_t *block_off;            /* block_n * n_blobs offsets into block_buf; UINT64_MAX: row absent */
    uint64_t *block_len;            /* block_n * n_blobs lengths as found */
    uint8_t *block_buf;
    size_t block_cap, idx_cap;
    bool block_ahead;               /* fetched by the cache's pass (read_raw), which may reuse it */
    struct sql_conn *next;          /* in the pool */
};

struct sql_backend;

struct sql_dataset {
    struct dataset base;
    const struct sql_backend *be;
    char *target;                   /* what the engine opens: a file path, a libpq connection string */
    char *where;                    /* the same for messages and `loaderctl datasets` (no password) */
    char *query;                    /* the dataset's query, as configured */
    char *version_query;            /* NULL: the fingerprint is the query's text and row count */
    char *key_name;
    int types[LD_MAX_FIELDS];       /* CONFIG_COLUMN_* */
    char *col_names[LD_MAX_FIELDS];
    int n_blobs;
    int blob_slot[LD_MAX_FIELDS];   /* field -> index among the blob columns, or -1 */
    bool int_keys;
    int64_t *ikeys;                 /* count keys, when every key is an integer */
    char **skeys;                   /* otherwise, text keys */
    char *knames;                   /* integer keys as text, for messages: count * SQL_KEY_NAME bytes */
    uint64_t *lens;                 /* count * n_blobs */
    uint64_t *values;               /* count * n_fields: label and numbers */
    pthread_mutex_t lock;
    pthread_cond_t returned;        /* a connection went back to the pool */
    bool lock_ready, cond_ready;
    struct sql_conn *pool;          /* idle connections */
    int pooled;
    int open_conns;                 /* alive, pooled or in use */
};

/* An engine. Every member may block (they talk to a database) and is called from the
 * thread that holds the connection: open() at daemon start, worker threads and the
 * cache's builder later. Messages go to errbuf (LD_ERRMSG_MAX), written whole through
 * source_sql_fail() so that they name the dataset and sd->where, never a password. */
struct sql_backend {
    const char *name;               /* "SQLite", "PostgreSQL" */
    /* An SQL expression for a column's byte length: open, the column, close. */
    const char *length_open, *length_close;
    /* Sets sd->target and sd->where from the config (may refuse it: LD_EDATASET). */
    int (*configure)(struct sql_dataset *sd, const struct config_dataset *cfg, char *errbuf);
    /* Opens a connection to sd->target and prepares the three statements; LD_EDATASET
     * with the engine's message when it cannot. */
    int (*connect)(const struct sql_dataset *sd, struct sql_conn **ret_conn, char *errbuf);
    /* Ends the connection and frees it (not the block: source_sql.c does). Accepts NULL. */
    void (*close)(struct sql_conn *c);
    /* Runs a statement; its rows then come from next(), until end(). For SQL_STMT_FETCH,
     * idx[0..n) are the samples (sorted, unique), whose keys the engine takes from sd. */
    int (*run)(const struct sql_dataset *sd, struct sql_conn *c, enum sql_stmt stmt, const uint64_t *idx, size_t n,
               char *errbuf);
    /* The next row into vals[0..1 + columns): 1, or 0 after the last, or a negative code.
     * Pointers in vals stay valid until the next call of next() or end(). */
    int (*next)(const struct sql_dataset *sd, struct sql_conn *c, struct sql_value *vals, char *errbuf);
    /* Ends what run() started, also after an error. */
    void (*end)(struct sql_conn *c);
};

extern const struct sql_backend sql_sqlite_backend;
extern const struct sql_backend sql_pg_backend;

/* The text of a statement of sd on its engine: SELECT <list> FROM (<query>) AS q <tail>,
 * with {K} in tail standing for the quoted key column (SQL_STMT_SCAN's tail: ORDER BY
 * the key). SQL_STMT_SCAN's list is the key, each blob's length and the other columns;
 * SQL_STMT_FETCH's the key and the blobs; SQL_STMT_VERSION is the version query itself
 * or the row count. A malloc'd string, or NULL when memory is short. */
char *source_sql_text(const struct sql_dataset *sd, enum sql_stmt stmt, const char *tail);
/* Writes "dataset 'NAME': WHAT 'WHERE': WHY" to errbuf and returns code. */
int source_sql_fail(const struct sql_dataset *sd, char *errbuf, int code, const char *what, const char *why);
/* Writes "dataset 'NAME': out of memory" to errbuf and returns LD_ENOMEM. */
int source_sql_oom(const struct sql_dataset *sd, char *errbuf);
/* The key of sample i, for messages: 42 or 'text'. */
const char *source_sql_key_text(const struct sql_dataset *sd, uint64_t i, char *buf, size_t size);

/* sql_fetch.c: the pool of connections. take() gives this thread a pooled or a new
 * connection (waiting up to 5 s for one in use when a new one cannot be opened);
 * give() puts it back; close() ends one (and its block). */
int sql_fetch_take(const struct sql_dataset *sd, struct sql_conn **ret_conn, char *errbuf);
void sql_fetch_give(const struct sql_dataset *sd, struct sql_conn *c);
void sql_fetch_close(const struct sql_dataset *sd, struct sql_conn *c);
/* sql_fetch.c: the dataset_ops members that read rows after open (dataset.h). */
uint64_t sql_fetch_item_bytes(const dataset *d, uint64_t index, int field);
int sql_fetch_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf);
int sql_fetch_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                       int64_t *ret_label, char *errbuf);
void sql_fetch_run_begin(const dataset *d, const uint64_t *idx, size_t n);
void sql_fetch_run_end(const dataset *d);

#endif
