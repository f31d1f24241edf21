/* sql_sqlite — the `sql` kind's SQLite engine (sql_backend.h): the dataset's `path` is
 * a database file, opened read-only, one connection per concurrent reader.
 *
 * SQLite is a library, so a statement is a function call, not a round trip: a block of
 * consecutive samples (the cache's first pass) is one range statement over their keys,
 * any other block is the statement by key bound again for each sample. Both are
 * prepared once per connection. */
#include "sql_backend.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct sqlite_conn {
    struct sql_conn base;
    sqlite3 *db;
    sqlite3_stmt *by_key;           /* the blob columns of one key */
    sqlite3_stmt *range;            /* the same for keys in [?1, ?2] */
    sqlite3_stmt *adhoc;            /* the scan or the version query, while it runs */
    sqlite3_stmt *cur;              /* the statement run() started */
    const uint64_t *idx;            /* by key: the samples left to step through */
    size_t n_idx;
    int columns;                    /* of cur */
    bool version;
};

static int sqlite_configure(struct sql_dataset *sd, const struct config_dataset *cfg, char *errbuf)
{
    sd->target = strdup(cfg->path);
    sd->where = strdup(cfg->path);
    if (!sd->target || !sd->where) {
        return source_sql_oom(sd, errbuf);
    }
    return 0;
}

static int sqlite_prepare(const struct sql_dataset *sd, struct sqlite_conn *c, const char *text, unsigned flags,
                          sqlite3_stmt **ret, char *errbuf)
{
    if (!text)
        return source_sql_oom(sd, errbuf);
    if (sqlite3_prepare_v3(c->db, text, -1, flags, ret, NULL) != SQLITE_OK)
        return source_sql_fail(sd, errbuf, LD_EDATASET, "the query cannot run on", sqlite3_errmsg(c->db));
    return 0;
}

static void sqlite_close(struct sql_conn *base)
{
    struct sqlite_conn *c = (struct sqlite_conn *)base;
    if (!c)
        return;
    sqlite3_finalize(c->by_key);
    sqlite3_finalize(c->range);
    sqlite3_finalize(c->adhoc);
    sqlite3_close(c->db);
    free(c);
}

static int sqlite_connect(const struct sql_dataset *sd, struct sql_conn **ret_conn, char *errbuf)
{
    struct sqlite_conn *c = calloc(1, sizeof *c);
    char *by_key = NULL, *range = NULL;
    int r = 0;
    if (!c)
        return source_sql_oom(sd, errbuf);
    int rc = sqlite3_open_v2(sd->target, &c->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        r = source_sql_fail(sd, errbuf, LD_EDATASET, "cannot open the database",
                            c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        goto out;
    }
    sqlite3_busy_timeout(c->db, 5000);
    /* SQLite reads a double-quoted name that is no column as a string: a misspelt
     * column would then be a constant. Turn that off, so it is "no such column". */
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_DQS_DML, 0, (int *)NULL);
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_DQS_DDL, 0, (int *)NULL);
    by_key = source_sql_text(sd, SQL_STMT_FETCH, "WHERE {K} = ?1");
    range = source_sql_text(sd, SQL_STMT_FETCH, "WHERE {K} >= ?1 AND {K} <= ?2 ORDER BY {K}");
    if ((r = sqlite_prepare(sd, c, by_key, SQLITE_PREPARE_PERSISTENT, &c->by_key, errbuf)) < 0 ||
        (r = sqlite_prepare(sd, c, range, SQLITE_PREPARE_PERSISTENT, &c->range, errbuf)) < 0)
        goto out;
    *ret_conn = &c->base;
    c = NULL;
out:
    free(by_key);
    free(range);
    sqlite_close(c ? &c->base : NULL);
    return r;
}

static void sqlite_bind_key(const struct sql_dataset *sd, sqlite3_stmt *st, int param, uint64_t i)
{
    if (sd->int_keys)
        sqlite3_bind_int64(st, param, sd->ikeys[i]);
    else
        sqlite3_bind_text(st, param, sd->skeys[i], -1, SQLITE_STATIC);
}

static int sqlite_run(const struct sql_dataset *sd, struct sql_conn *base, enum sql_stmt stmt, const uint64_t *idx,
                      size_t n, char *errbuf)
{
    struct sqlite_conn *c = (struct sqlite_conn *)base;
    c->idx = NULL;
    c->n_idx = 0;
    c->version = stmt == SQL_STMT_VERSION;
    if (stmt != SQL_STMT_FETCH) {
        char *text = source_sql_text(sd, stmt, NULL);
        int r = sqlite_prepare(sd, c, text, 0, &c->adhoc, errbuf);
        free(text);
        if (r < 0)
            return r;
        c->cur = c->adhoc;
    } else if (n > 1 && idx[n - 1] - idx[0] == n - 1) {
        c->cur = c->range;
        sqlite_bind_key(sd, c->range, 1, idx[0]);
        sqlite_bind_key(sd, c->range, 2, idx[n - 1]);
    } else {
        c->cur = c->by_key;
        c->idx = idx;
        c->n_idx = n;
    }
    c->columns = sqlite3_column_count(c->cur);
    return 0;
}

static int sqlite_next(const struct sql_dataset *sd, struct sql_conn *base, struct sql_value *vals, char *errbuf)
{
    struct sqlite_conn *c = (struct sqlite_conn *)base;
    int rc;
    for (;;) {
        if (c->idx) {
            /* By key: step through the samples, one bound statement each. */
            if (!c->n_idx)
                return 0;
            sqlite3_reset(c->cur);
            sqlite_bind_key(sd, c->cur, 1, *c->idx);
            c->idx++;
            c->n_idx--;
        }
        rc = sqlite3_step(c->cur);
        if (rc != SQLITE_DONE || !c->idx)
            break;
    }
    if (rc == SQLITE_DONE)
        return 0;
    if (rc != SQLITE_ROW) {
        source_sql_fail(sd, errbuf, 0, "database error on", sqlite3_errmsg(c->db));
        return rc == SQLITE_NOMEM ? LD_ENOMEM : rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? LD_EAGAIN : LD_EDATASET;
    }
    int n = c->columns < LD_MAX_FIELDS + 1 ? c->columns : LD_MAX_FIELDS + 1;
    if (c->version && n > LD_MAX_FIELDS)
        n = LD_MAX_FIELDS;
    for (int k = 0; k < n; k++) {
        struct sql_value *v = &vals[k];
        int t = sqlite3_column_type(c->cur, k);
        *v = (struct sql_value){.type = SQL_NULL};
        if (t == SQLITE_NULL)
            continue;
        if (c->version || t == SQLITE_TEXT) {
            v->type = SQL_TEXT;
            v->p = sqlite3_column_text(c->cur, k);
        } else if (t == SQLITE_INTEGER) {
            v->type = SQL_INT;
            v->i = sqlite3_column_int64(c->cur, k);
        } else if (t == SQLITE_FLOAT) {
            v->type = SQL_FLOAT;
            v->f = sqlite3_column_double(c->cur, k);
        } else {
            v->type = SQL_BLOB;
            v->p = sqlite3_column_blob(c->cur, k);
        }
        if (v->type >= SQL_TEXT)
            v->len = (uint64_t)sqlite3_column_bytes(c->cur, k);
    }
    if (c->version)
        vals[n].type = SQL_END;
    return 1;
}

static void sqlite_end(struct sql_conn *base)
{
    struct sqlite_conn *c = (struct sqlite_conn *)base;
    if (c->cur) {
        sqlite3_reset(c->cur);
        sqlite3_clear_bindings(c->cur);
    }
    sqlite3_finalize(c->adhoc);
    c->adhoc = c->cur = NULL;
    c->idx = NULL;
}

const struct sql_backend sql_sqlite_backend = {
    .name = "SQLite",
    /* length() counts a text's characters; the cast makes it count bytes. */
    .length_open = "length(CAST(",
    .length_close = " AS BLOB))",
    .configure = sqlite_configure,
    .connect = sqlite_connect,
    .close = sqlite_close,
    .run = sqlite_run,
    .next = sqlite_next,
    .end = sqlite_end,
};
