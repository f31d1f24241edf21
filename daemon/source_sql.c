/* source_sql — the `sql` dataset kind: one sample per row of a query on an SQLite
 * database.
 *
 * The dataset declares a query that returns one row per sample, the column that is each
 * row's key, and which columns become which fields (`columns:`, in order): blob (the
 * column's bytes, uint8: a fixed row when every value has one length, ragged
 * otherwise; text is served as its bytes), label (integers, or class names numbered in
 * sorted order), int64 and float32 numbers. open() runs the query once, ordered by the
 * key, and keeps what the layout needs: the keys (sample i is the i-th key), each blob's
 * length, and the label and numbers, which are small; a key that appears twice, a NULL
 * or a value of the wrong type is refused at start with the key it was found at. The
 * blobs are read later, by key, through statements prepared once per connection:
 *
 *   - the first pass, which builds the single-file cache (cache_build.c reads samples in
 *     index order, which is key order), reads ranges of keys, up to SQL_BLOCK_BYTES of
 *     blobs at a time, with one statement step per row, not a query per sample;
 *   - a stream that reads the database itself (no cache, or not built yet) reads one row
 *     by key, a prepared statement bound again: SQLite is a library, so this is a
 *     function call, not a round trip.
 *
 * Connections are opened read-only, one per concurrent reader, and kept in a small pool;
 * a connection is used by one thread at a time. A row whose blob changed length since
 * open, or that is gone, is a bad sample (on_error); a database that cannot be read at
 * all fails the read with the database's message and the dataset's name. The cache's
 * fingerprint is the declared version query's result (e.g. SELECT max(updated_at)
 * FROM t) or, without one, the query's text and its row count. */
#include "dataset.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "log.h"

extern const struct dataset_ops source_sql_multi_ops;

/* The most blob bytes one range read of the first pass holds. */
#define SQL_BLOCK_BYTES (8u << 20)
/* Room for an integer key as text. */
#define SQL_KEY_NAME 24
/* Connections kept open (more concurrent readers open and close their own). */
#define SQL_POOL_MAX 64

struct sql_conn {
    sqlite3 *db;
    sqlite3_stmt *by_key;           /* the blob columns of one key */
    sqlite3_stmt *range;            /* key and blob 0 of keys in [?1, ?2], in key order */
    /* The last range read: blob 0 of samples [block_lo, block_lo + block_n). */
    uint64_t block_lo, block_n;
    uint64_t *block_off;            /* block_n + 1 offsets into block_buf; UINT64_MAX: row absent */
    uint8_t *block_buf;
    size_t block_cap;
    struct sql_conn *next;
};

struct sql_dataset {
    struct dataset base;
    char *db_path;
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

/* "id" with its double quotes doubled, as SQL quotes an identifier. */
static char *sql_ident(const char *name)
{
    size_t n = strlen(name), q = 0;
    for (size_t i = 0; i < n; i++)
        q += name[i] == '"';
    char *s = malloc(n + q + 3), *p = s;
    if (!s)
        return NULL;
    *p++ = '"';
    for (size_t i = 0; i < n; i++) {
        if (name[i] == '"')
            *p++ = '"';
        *p++ = name[i];
    }
    *p++ = '"';
    *p = '\0';
    return s;
}

/* The SELECT list "k", "a", "b" (key first when with_key), each quoted. */
static char *sql_select(const struct sql_dataset *sd, bool with_key, bool blobs_only, bool lengths, int only)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = '\0';
    for (int f = -1; f < sd->base.n_fields; f++) {
        const char *name;
        if (f < 0) {
            if (!with_key)
                continue;
            name = sd->key_name;
        } else {
            if (blobs_only && sd->blob_slot[f] < 0)
                continue;
            if (only >= 0 && f != only)
                continue;
            name = sd->col_names[f];
        }
        char *q = sql_ident(name);
        if (!q) {
            free(s);
            return NULL;
        }
        size_t need = len + strlen(q) + 32;
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            char *t = realloc(s, cap);
            if (!t) {
                free(q);
                free(s);
                return NULL;
            }
            s = t;
        }
        bool blob_len = lengths && f >= 0 && sd->blob_slot[f] >= 0;
        /* length() counts a text's characters; the cast makes it count bytes. */
        len += (size_t)snprintf(s + len, cap - len, "%s%s%s%s", len ? ", " : "", blob_len ? "length(CAST(" : "", q,
                                blob_len ? " AS BLOB))" : "");
        free(q);
    }
    return s;
}

/* SELECT <list> FROM (<query>) <tail>, prepared on db. */
static int sql_prepare(const struct sql_dataset *sd, sqlite3 *db, const char *list, const char *tail,
                       sqlite3_stmt **ret, char *errbuf)
{
    char *key = sql_ident(sd->key_name);
    char *text = NULL;
    if (!key || asprintf(&text, "SELECT %s FROM (%s) %s", list, sd->query, tail ? tail : "") < 0) {
        free(key);
        ld_errorf(errbuf, "dataset '%s': out of memory", sd->base.name);
        return LD_ENOMEM;
    }
    /* The tail names the key as {K}. */
    char *at;
    while ((at = strstr(text, "{K}"))) {
        char *t = NULL;
        *at = '\0';
        if (asprintf(&t, "%s%s%s", text, key, at + 3) < 0) {
            free(text);
            free(key);
            return LD_ENOMEM;
        }
        free(text);
        text = t;
    }
    free(key);
    int rc = sqlite3_prepare_v3(db, text, -1, SQLITE_PREPARE_PERSISTENT, ret, NULL);
    free(text);
    if (rc != SQLITE_OK) {
        ld_errorf(errbuf, "dataset '%s': the query cannot run on '%s': %s", sd->base.name, sd->db_path,
                  sqlite3_errmsg(db));
        return LD_EDATASET;
    }
    return 0;
}

static void sql_conn_close(struct sql_conn *c)
{
    if (!c)
        return;
    sqlite3_finalize(c->by_key);
    sqlite3_finalize(c->range);
    sqlite3_close(c->db);
    free(c->block_off);
    free(c->block_buf);
    free(c);
}

static int sql_conn_open(const struct sql_dataset *sd, struct sql_conn **ret, char *errbuf)
{
    struct sql_conn *c = calloc(1, sizeof *c);
    char *blobs = NULL, *range = NULL;
    int r = 0;
    if (!c) {
        ld_errorf(errbuf, "dataset '%s': out of memory", sd->base.name);
        return LD_ENOMEM;
    }
    int rc = sqlite3_open_v2(sd->db_path, &c->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        ld_errorf(errbuf, "dataset '%s': cannot open the database '%s': %s", sd->base.name, sd->db_path,
                  c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        r = LD_EDATASET;
        goto out;
    }
    sqlite3_busy_timeout(c->db, 5000);
    /* SQLite reads a double-quoted name that is no column as a string: a misspelt
     * column would then be a constant. Turn that off, so it is "no such column". */
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_DQS_DML, 0, (int *)NULL);
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_DQS_DDL, 0, (int *)NULL);
    blobs = sql_select(sd, false, true, false, -1);
    range = sql_select(sd, true, true, false, 0);
    if (!blobs || !range) {
        ld_errorf(errbuf, "dataset '%s': out of memory", sd->base.name);
        r = LD_ENOMEM;
        goto out;
    }
    if ((r = sql_prepare(sd, c->db, blobs, "WHERE {K} = ?1", &c->by_key, errbuf)) < 0)
        goto out;
    if ((r = sql_prepare(sd, c->db, range, "WHERE {K} >= ?1 AND {K} <= ?2 ORDER BY {K}", &c->range, errbuf)) < 0)
        goto out;
    *ret = c;
    c = NULL;
out:
    free(blobs);
    free(range);
    sql_conn_close(c);
    return r;
}

/* A connection for this thread: a pooled one, else a new one. When a new one cannot be
 * opened (the database file was removed or replaced) while others are alive, it waits
 * up to SQL_WAIT_S for one of them: they still read the file they opened. */
#define SQL_WAIT_S 5
static int sql_conn_take(const struct sql_dataset *sd, struct sql_conn **ret, char *errbuf)
{
    struct sql_dataset *m = (struct sql_dataset *)sd; /* the pool is guarded by its lock */
    pthread_mutex_lock(&m->lock);
    struct sql_conn *c = m->pool;
    if (c) {
        m->pool = c->next;
        m->pooled--;
    } else {
        m->open_conns++;
    }
    pthread_mutex_unlock(&m->lock);
    if (c) {
        *ret = c;
        return 0;
    }
    int r = sql_conn_open(sd, &c, errbuf);
    pthread_mutex_lock(&m->lock);
    if (r < 0) {
        m->open_conns--;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += SQL_WAIT_S;
        while (m->open_conns > 0 && !m->pool &&
               pthread_cond_timedwait(&m->returned, &m->lock, &until) == 0)
            ;
        if ((c = m->pool)) {
            m->pool = c->next;
            m->pooled--;
            r = 0;
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (r == 0)
        *ret = c;
    return r;
}

static void sql_conn_give(const struct sql_dataset *sd, struct sql_conn *c)
{
    struct sql_dataset *m = (struct sql_dataset *)sd;
    pthread_mutex_lock(&m->lock);
    bool keep = m->pooled < SQL_POOL_MAX;
    if (keep) {
        c->next = m->pool;
        m->pool = c;
        m->pooled++;
        pthread_cond_signal(&m->returned);
    } else {
        m->open_conns--;
    }
    pthread_mutex_unlock(&m->lock);
    if (!keep)
        sql_conn_close(c);
}

static void sql_free(dataset *d)
{
    struct sql_dataset *sd = (struct sql_dataset *)d;
    if (!sd)
        return;
    while (sd->pool) {
        struct sql_conn *c = sd->pool;
        sd->pool = c->next;
        sql_conn_close(c);
    }
    if (sd->lock_ready)
        pthread_mutex_destroy(&sd->lock);
    if (sd->cond_ready)
        pthread_cond_destroy(&sd->returned);
    for (uint64_t i = 0; sd->skeys && i < d->count; i++)
        free(sd->skeys[i]);
    free(sd->skeys);
    free(sd->ikeys);
    free(sd->knames);
    free(sd->lens);
    free(sd->values);
    for (int f = 0; f < LD_MAX_FIELDS; f++)
        free(sd->col_names[f]);
    for (size_t k = 0; d->class_names && k < d->n_classes; k++)
        free(d->class_names[k]);
    free(d->class_names);
    free(sd->db_path);
    free(sd->query);
    free(sd->version_query);
    free(sd->key_name);
    free(sd);
}

/* The key of sample i, for messages. */
static const char *sql_key_text(const struct sql_dataset *sd, uint64_t i, char *buf, size_t size)
{
    if (sd->int_keys)
        snprintf(buf, size, "%" PRId64, sd->ikeys[i]);
    else
        snprintf(buf, size, "'%.80s'", sd->skeys[i]);
    return buf;
}

static void sql_bind_key(const struct sql_dataset *sd, sqlite3_stmt *st, int param, uint64_t i)
{
    if (sd->int_keys)
        sqlite3_bind_int64(st, param, sd->ikeys[i]);
    else
        sqlite3_bind_text(st, param, sd->skeys[i], -1, SQLITE_STATIC);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Class names for a text label column: sorted, each row's label its rank. */
static int sql_label_names(struct sql_dataset *sd, int field, char **texts, char *errbuf)
{
    dataset *d = &sd->base;
    const char **names = malloc(d->count * sizeof *names);
    if (!names)
        goto oom;
    for (uint64_t i = 0; i < d->count; i++)
        names[i] = texts[i];
    qsort(names, d->count, sizeof *names, cmp_str);
    size_t n = 0;
    for (uint64_t i = 0; i < d->count; i++)
        if (n == 0 || strcmp(names[n - 1], names[i]) != 0)
            names[n++] = names[i];
    if (!(d->class_names = calloc(n, sizeof *d->class_names))) {
        free(names);
        goto oom;
    }
    d->n_classes = n;
    for (size_t k = 0; k < n; k++)
        if (!(d->class_names[k] = strdup(names[k]))) {
            free(names);
            goto oom;
        }
    for (uint64_t i = 0; i < d->count; i++) {
        const char **hit = bsearch(&texts[i], names, n, sizeof *names, cmp_str);
        sd->values[i * (uint64_t)d->n_fields + (uint64_t)field] = (uint64_t)(hit - names);
    }
    free(names);
    return 0;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
    return LD_ENOMEM;
}

static int grow(void **array, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1024;
    while (n < need)
        n *= 2;
    void *p = realloc(*array, n * elem);
    if (!p)
        return LD_ENOMEM;
    *array = p;
    *cap = n;
    return 0;
}

/* Runs the query once, in key order: the keys, the blobs' lengths, labels and numbers. */
static int sql_scan(struct sql_dataset *sd, sqlite3 *db, char *errbuf)
{
    dataset *d = &sd->base;
    char *list = sql_select(sd, true, false, true, -1), kbuf[128];
    sqlite3_stmt *st = NULL;
    char **label_texts = NULL;
    size_t cap_keys = 0, cap_lens = 0, cap_values = 0, cap_texts = 0;
    int label_field = -1, r = 0;
    bool text_labels = false;

    if (!list) {
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
        return LD_ENOMEM;
    }
    if ((r = sql_prepare(sd, db, list, "ORDER BY {K}", &st, errbuf)) < 0)
        goto out;
    for (int f = 0; f < d->n_fields; f++)
        if (sd->types[f] == CONFIG_COLUMN_LABEL)
            label_field = f;
    uint64_t n = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int kt = sqlite3_column_type(st, 0);
        if (n == 0)
            sd->int_keys = kt == SQLITE_INTEGER;
        if (kt == SQLITE_NULL || (sd->int_keys != (kt == SQLITE_INTEGER)) || kt == SQLITE_FLOAT) {
            ld_errorf(errbuf, "dataset '%s': row %" PRIu64 " of the query (in key order): the key column '%s' is %s; "
                      "keys are all integers or all text, never NULL", d->name, n + 1, sd->key_name,
                      kt == SQLITE_NULL ? "NULL" : kt == SQLITE_FLOAT ? "a float" : "of another type than the first");
            r = LD_EDATASET;
            goto out;
        }
        if ((sd->int_keys ? grow((void **)&sd->ikeys, &cap_keys, n + 1, sizeof *sd->ikeys)
                          : grow((void **)&sd->skeys, &cap_keys, n + 1, sizeof *sd->skeys)) < 0 ||
            grow((void **)&sd->lens, &cap_lens, (n + 1) * (size_t)(sd->n_blobs ? sd->n_blobs : 1), sizeof *sd->lens) < 0 ||
            grow((void **)&sd->values, &cap_values, (n + 1) * (size_t)d->n_fields, sizeof *sd->values) < 0 ||
            (label_field >= 0 && grow((void **)&label_texts, &cap_texts, n + 1, sizeof *label_texts) < 0))
            goto oom;
        if (label_field >= 0)
            label_texts[n] = NULL;
        if (sd->int_keys) {
            sd->ikeys[n] = sqlite3_column_int64(st, 0);
        } else {
            const char *k = (const char *)sqlite3_column_text(st, 0);
            if (!k || !(sd->skeys[n] = strdup(k)))
                goto oom;
        }
        d->count = n + 1; /* what sql_free must free */
        bool dup = n > 0 && (sd->int_keys ? sd->ikeys[n] == sd->ikeys[n - 1] : strcmp(sd->skeys[n], sd->skeys[n - 1]) == 0);
        if (dup) {
            ld_errorf(errbuf, "dataset '%s': the key column '%s' is not unique: key %s is on two rows", d->name,
                      sd->key_name, sql_key_text(sd, n, kbuf, sizeof kbuf));
            r = LD_EDATASET;
            goto out;
        }
        for (int f = 0; f < d->n_fields; f++) {
            int ct = sqlite3_column_type(st, f + 1);
            uint64_t *v = &sd->values[n * (uint64_t)d->n_fields + (uint64_t)f];
            const char *want = NULL;
            *v = 0;
            if (sd->blob_slot[f] >= 0) {
                if (ct == SQLITE_NULL)
                    want = "a blob or text, not NULL";
                else
                    sd->lens[n * (uint64_t)sd->n_blobs + (uint64_t)sd->blob_slot[f]] = (uint64_t)sqlite3_column_int64(st, f + 1);
            } else if (sd->types[f] == CONFIG_COLUMN_LABEL) {
                if (ct == SQLITE_INTEGER && !text_labels) {
                    *v = (uint64_t)sqlite3_column_int64(st, f + 1);
                } else if (ct == SQLITE_TEXT) {
                    text_labels = true;
                    const char *t = (const char *)sqlite3_column_text(st, f + 1);
                    if (!t || !(label_texts[n] = strdup(t)))
                        goto oom;
                } else {
                    want = "an integer or a class name";
                }
            } else if (sd->types[f] == CONFIG_COLUMN_INT64) {
                if (ct == SQLITE_INTEGER)
                    *v = (uint64_t)sqlite3_column_int64(st, f + 1);
                else
                    want = "an integer";
            } else {
                double x = sqlite3_column_double(st, f + 1);
                float y = (float)x;
                if ((ct == SQLITE_INTEGER || ct == SQLITE_FLOAT) && isfinite(y))
                    memcpy(v, &y, sizeof y);
                else
                    want = "a finite number";
            }
            if (want) {
                ld_errorf(errbuf, "dataset '%s': key %s: column '%s' is %s, expected %s", d->name,
                          sql_key_text(sd, n, kbuf, sizeof kbuf), sd->col_names[f],
                          ct == SQLITE_NULL ? "NULL" : ct == SQLITE_INTEGER ? "an integer" : ct == SQLITE_FLOAT ? "a float"
                          : ct == SQLITE_TEXT ? "text" : "a blob", want);
                r = LD_EDATASET;
                goto out;
            }
        }
        n++;
    }
    if (rc != SQLITE_DONE) {
        ld_errorf(errbuf, "dataset '%s': the query failed on '%s': %s", d->name, sd->db_path, sqlite3_errmsg(db));
        r = LD_EDATASET;
        goto out;
    }
    if (n == 0) {
        ld_errorf(errbuf, "dataset '%s': the query returns no row", d->name);
        r = LD_EDATASET;
        goto out;
    }
    if (text_labels) {
        for (uint64_t i = 0; i < n; i++)
            if (!label_texts[i]) {
                ld_errorf(errbuf, "dataset '%s': key %s: column '%s' is an integer where other rows hold class names",
                          d->name, sql_key_text(sd, i, kbuf, sizeof kbuf), sd->col_names[label_field]);
                r = LD_EDATASET;
                goto out;
            }
        if ((r = sql_label_names(sd, label_field, label_texts, errbuf)) < 0)
            goto out;
    }
    goto out;
oom:
    ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
    r = LD_ENOMEM;
out:
    for (uint64_t i = 0; label_texts && i < d->count; i++)
        free(label_texts[i]);
    free(label_texts);
    sqlite3_finalize(st);
    free(list);
    return r;
}

static int sql_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    struct sql_dataset *sd = calloc(1, sizeof *sd);
    struct sql_conn *c = NULL;
    int r;
    if (!sd) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    dataset *d = &sd->base;
    /* The cache holds field 0's bytes and the label: only such a dataset can use it. */
    bool cacheable = true;
    for (size_t f = 0; f < cfg->n_columns; f++)
        cacheable &= f == 0 ? cfg->columns[f].type == CONFIG_COLUMN_BLOB : cfg->columns[f].type == CONFIG_COLUMN_LABEL;
    d->ops = cacheable ? &source_sql_ops : &source_sql_multi_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->n_fields = (int)cfg->n_columns;
    if (pthread_mutex_init(&sd->lock, NULL) == 0)
        sd->lock_ready = true;
    if (pthread_cond_init(&sd->returned, NULL) == 0)
        sd->cond_ready = true;
    sd->db_path = strdup(cfg->path);
    sd->query = strdup(cfg->sql_query);
    sd->key_name = strdup(cfg->sql_key);
    sd->version_query = cfg->sql_version_query ? strdup(cfg->sql_version_query) : NULL;
    bool oom = !sd->lock_ready || !sd->cond_ready || !sd->db_path || !sd->query || !sd->key_name ||
               (cfg->sql_version_query && !sd->version_query);
    for (int f = 0; f < d->n_fields; f++) {
        sd->types[f] = cfg->columns[f].type;
        oom |= !(sd->col_names[f] = strdup(cfg->columns[f].name));
        sd->blob_slot[f] = sd->types[f] == CONFIG_COLUMN_BLOB ? sd->n_blobs++ : -1;
        struct dataset_field *fl = &d->fields[f];
        snprintf(fl->name, sizeof fl->name, "%s", sd->types[f] == CONFIG_COLUMN_LABEL ? "label" : cfg->columns[f].name);
        fl->dtype = sd->types[f] == CONFIG_COLUMN_BLOB ? LD_DTYPE_UINT8
                  : sd->types[f] == CONFIG_COLUMN_FLOAT32 ? LD_DTYPE_FLOAT32 : LD_DTYPE_INT64;
    }
    if (oom) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        r = LD_ENOMEM;
        goto fail;
    }
    if (cfg->cache_path && !cacheable) {
        ld_errorf(errbuf, "dataset '%s': a cache holds one blob column and a label; this dataset's columns are "
                  "more: remove `cache:`", cfg->name);
        r = LD_EDATASET;
        goto fail;
    }
    if ((r = sql_conn_open(sd, &c, errbuf)) < 0)
        goto fail;
    sd->open_conns = 1;
    if ((r = sql_scan(sd, c->db, errbuf)) < 0)
        goto fail;
    if (sd->int_keys) {
        if (!(sd->knames = malloc(d->count * SQL_KEY_NAME))) {
            ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
            r = LD_ENOMEM;
            goto fail;
        }
        for (uint64_t i = 0; i < d->count; i++)
            snprintf(sd->knames + i * SQL_KEY_NAME, SQL_KEY_NAME, "key %" PRId64, sd->ikeys[i]);
    }
    for (int f = 0; f < d->n_fields; f++) {
        int slot = sd->blob_slot[f];
        if (slot < 0)
            continue;
        uint64_t max = 0;
        bool same = true;
        for (uint64_t i = 0; i < d->count; i++) {
            uint64_t len = sd->lens[i * (uint64_t)sd->n_blobs + (uint64_t)slot];
            same &= i == 0 || len == sd->lens[(i - 1) * (uint64_t)sd->n_blobs + (uint64_t)slot];
            max = len > max ? len : max;
        }
        if (max == 0) {
            ld_errorf(errbuf, "dataset '%s': column '%s' is empty on every row", d->name, sd->col_names[f]);
            r = LD_EDATASET;
            goto fail;
        }
        struct dataset_field *fl = &d->fields[f];
        fl->max_item_bytes = max;
        fl->ragged = !same;
        fl->ndim = same ? 1 : 0;
        fl->shape[0] = same ? (int64_t)max : 0;
    }
    d->sample_overhead = 8 * 1024;
    sql_conn_give(sd, c);
    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " rows from '%s'", d->name, d->count, sd->db_path);
    *ret_dataset = d;
    return 0;
fail:
    sql_conn_close(c);
    sql_free(d);
    return r;
}

static uint64_t sql_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    if (index >= d->count || field < 0 || field >= d->n_fields)
        return 0;
    if (sd->blob_slot[field] >= 0)
        return sd->lens[index * (uint64_t)sd->n_blobs + (uint64_t)sd->blob_slot[field]];
    return sd->types[field] == CONFIG_COLUMN_FLOAT32 ? 4 : 8;
}

/* A blob as the statement's column `col` holds it, checked against the length at open. */
static int sql_copy_blob(const struct sql_dataset *sd, sqlite3_stmt *st, int col, uint64_t index, int field,
                         void *dst, char *errbuf)
{
    char kbuf[128];
    const void *p = sqlite3_column_type(st, col) == SQLITE_TEXT ? (const void *)sqlite3_column_text(st, col)
                                                                 : sqlite3_column_blob(st, col);
    uint64_t len = (uint64_t)sqlite3_column_bytes(st, col);
    uint64_t want = sql_item_bytes(&sd->base, index, field);
    if (len != want || (!p && len)) {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): column '%s' has %" PRIu64 " bytes, %" PRIu64 " at open",
                  index, sql_key_text(sd, index, kbuf, sizeof kbuf), sd->col_names[field], len, want);
        return LD_ESAMPLE;
    }
    if (len)
        memcpy(dst, p, (size_t)len);
    return 0;
}

static int sql_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    struct sql_conn *c = NULL;
    char kbuf[128];
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name, d->count);
        return LD_EINVAL;
    }
    int r = sql_conn_take(sd, &c, errbuf);
    if (r < 0)
        return r;
    sqlite3_stmt *st = c->by_key;
    sql_bind_key(sd, st, 1, index);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        for (int f = 0, col = 0; f < d->n_fields && r == 0; f++) {
            if (sd->blob_slot[f] >= 0)
                r = sql_copy_blob(sd, st, col++, index, f, dst[f], errbuf);
            else
                memcpy(dst[f], &sd->values[index * (uint64_t)d->n_fields + (uint64_t)f],
                       sd->types[f] == CONFIG_COLUMN_FLOAT32 ? 4 : 8);
        }
    } else if (rc == SQLITE_DONE) {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): no longer returned by the query", index,
                  sql_key_text(sd, index, kbuf, sizeof kbuf));
        r = LD_ESAMPLE;
    } else {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): dataset '%s': database error: %s", index,
                  sql_key_text(sd, index, kbuf, sizeof kbuf), d->name, sqlite3_errmsg(c->db));
        r = rc == SQLITE_NOMEM ? LD_ENOMEM : rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? LD_EAGAIN : LD_EDATASET;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    sql_conn_give(sd, c);
    return r;
}

static const char *sql_sample_name(const dataset *d, uint64_t index)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    if (index >= d->count)
        return NULL;
    return sd->int_keys ? sd->knames + index * SQL_KEY_NAME : sd->skeys[index];
}

/* ---- the cache ------------------------------------------------------------------ */

static uint64_t sql_raw_bytes(const dataset *d, uint64_t index)
{
    return sql_item_bytes(d, index, 0);
}

/* Reads blob 0 of samples [lo, hi) in one range query into c's block. */
static int sql_fetch_block(const struct sql_dataset *sd, struct sql_conn *c, uint64_t lo, char *errbuf)
{
    const dataset *d = &sd->base;
    uint64_t hi = lo, bytes = 0;
    while (hi < d->count && (hi == lo || bytes + sql_item_bytes(d, hi, 0) <= SQL_BLOCK_BYTES))
        bytes += sql_item_bytes(d, hi++, 0);
    c->block_n = 0;
    uint64_t *off = realloc(c->block_off, (hi - lo + 1) * sizeof *off);
    if (!off)
        return LD_ENOMEM;
    c->block_off = off;
    if (bytes > c->block_cap) {
        uint8_t *b = realloc(c->block_buf, (size_t)bytes);
        if (!b)
            return LD_ENOMEM;
        c->block_buf = b;
        c->block_cap = (size_t)bytes;
    }
    for (uint64_t i = lo; i < hi; i++)
        off[i - lo] = UINT64_MAX;
    sqlite3_stmt *st = c->range;
    sql_bind_key(sd, st, 1, lo);
    sql_bind_key(sd, st, 2, hi - 1);
    uint64_t i = lo, used = 0;
    int rc, r = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        /* Rows come in key order: walk our keys to this row's (rows gone since are skipped). */
        for (; i < hi; i++) {
            int cmp = sd->int_keys ? (sd->ikeys[i] > sqlite3_column_int64(st, 0)) - (sd->ikeys[i] < sqlite3_column_int64(st, 0))
                                   : strcmp(sd->skeys[i], (const char *)sqlite3_column_text(st, 0));
            if (cmp >= 0) {
                if (cmp == 0 && (uint64_t)sqlite3_column_bytes(st, 1) == sql_item_bytes(d, i, 0)) {
                    const void *p = sqlite3_column_type(st, 1) == SQLITE_TEXT ? (const void *)sqlite3_column_text(st, 1)
                                                                              : sqlite3_column_blob(st, 1);
                    uint64_t len = sql_item_bytes(d, i, 0);
                    if (len)
                        memcpy(c->block_buf + used, p, (size_t)len);
                    off[i - lo] = used;
                    used += len;
                    i++;
                }
                break;
            }
        }
    }
    if (rc != SQLITE_DONE) {
        ld_errorf(errbuf, "dataset '%s': database error: %s", d->name, sqlite3_errmsg(c->db));
        r = LD_EDATASET;
    } else {
        c->block_lo = lo;
        c->block_n = hi - lo;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return r;
}

static int sql_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                        int64_t *ret_label, char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    struct sql_conn *c = NULL;
    char kbuf[128];
    if (index >= d->count)
        return LD_EINVAL;
    uint64_t len = sql_item_bytes(d, index, 0);
    if (len > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 ": %" PRIu64 " bytes do not fit a buffer of %" PRIu64, index, len, cap);
        return LD_ERANGE;
    }
    int r = sql_conn_take(sd, &c, errbuf);
    if (r < 0)
        return r;
    if (!c->block_n || index < c->block_lo || index >= c->block_lo + c->block_n)
        r = sql_fetch_block(sd, c, index, errbuf);
    if (r == 0) {
        uint64_t off = c->block_off[index - c->block_lo];
        if (off == UINT64_MAX) {
            ld_errorf(errbuf, "sample %" PRIu64 " (key %s): no longer returned by the query, or changed length",
                      index, sql_key_text(sd, index, kbuf, sizeof kbuf));
            r = LD_ESAMPLE;
        } else {
            memcpy(buf, c->block_buf + off, (size_t)len);
            int lf = dataset_label_field(d);
            *ret_len = len;
            *ret_label = lf >= 0 ? (int64_t)sd->values[index * (uint64_t)d->n_fields + (uint64_t)lf] : -1;
        }
    }
    sql_conn_give(sd, c);
    return r;
}

/* What a fingerprint hashes: the kind, the mode, the query's text and then either the
 * version query's result or the query's row count now. */
static int sql_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    static const char tag[] = "loaderd sql fingerprint v1";
    struct sql_conn *c = NULL;
    sqlite3_stmt *st = NULL;
    char *text = NULL;
    int r = sql_conn_take(sd, &c, errbuf);
    if (r < 0)
        return r;
    if (sd->version_query)
        text = strdup(sd->version_query);
    else if (asprintf(&text, "SELECT count(*) FROM (%s)", sd->query) < 0)
        text = NULL;
    if (!text) {
        r = LD_ENOMEM;
        goto out;
    }
    if (sqlite3_prepare_v2(c->db, text, -1, &st, NULL) != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW) {
        ld_errorf(errbuf, "dataset '%s': the %s failed on '%s': %s", d->name,
                  sd->version_query ? "version query" : "row count", sd->db_path, sqlite3_errmsg(c->db));
        r = LD_EDATASET;
        goto out;
    }
    XXH3_state_t *h = XXH3_createState();
    if (!h) {
        r = LD_ENOMEM;
        goto out;
    }
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, tag, sizeof tag);
    XXH3_64bits_update(h, &mode, sizeof mode);
    XXH3_64bits_update(h, sd->query, strlen(sd->query) + 1);
    for (int f = 0; f < d->n_fields; f++) {
        XXH3_64bits_update(h, sd->col_names[f], strlen(sd->col_names[f]) + 1);
        XXH3_64bits_update(h, &sd->types[f], sizeof sd->types[f]);
    }
    int n = sqlite3_column_count(st);
    for (int k = 0; k < n; k++) {
        const unsigned char *v = sqlite3_column_text(st, k);
        XXH3_64bits_update(h, v ? (const char *)v : "\x01NULL", v ? (size_t)sqlite3_column_bytes(st, k) + 1 : 6);
    }
    uint64_t fp = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    *ret_fingerprint = fp ? fp : 1;
out:
    if (r == LD_ENOMEM)
        ld_errorf(errbuf, "dataset '%s': out of memory", d->name);
    sqlite3_finalize(st);
    free(text);
    sql_conn_give(sd, c);
    return r;
}

const struct dataset_ops source_sql_ops = {
    .kind = "sql",
    .open = sql_open,
    .free = sql_free,
    .item_bytes = sql_item_bytes,
    .read = sql_read,
    .sample_name = sql_sample_name,
    .fingerprint = sql_fingerprint,
    .raw_bytes = sql_raw_bytes,
    .read_raw = sql_read_raw,
};

/* Columns beyond one blob and a label: the cache could not hold them. */
const struct dataset_ops source_sql_multi_ops = {
    .kind = "sql",
    .open = sql_open,
    .free = sql_free,
    .item_bytes = sql_item_bytes,
    .read = sql_read,
    .sample_name = sql_sample_name,
};
