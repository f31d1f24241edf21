/* source_sql — the `sql` dataset kind: one sample per row of a query on a database,
 * SQLite (sql_sqlite.c) or PostgreSQL (sql_pg.c), behind the engine table of
 * sql_backend.h.
 *
 * The dataset declares a query that returns one row per sample, the column that is each
 * row's key, and which columns become which fields (`columns:`, in order): blob (the
 * column's bytes, uint8: a fixed row when every value has one length, ragged
 * otherwise; text is served as its bytes), label (integers, or class names numbered in
 * sorted order), int64 and float32 numbers. open() runs the query once and keeps what
 * the layout needs: the keys in order (sample i is the i-th key; integers by value, text
 * by its bytes, whatever the server's collation), each blob's length, and the label and
 * numbers, which are small; a key that appears twice, a NULL or a value of the wrong
 * type is refused at start with the key it was found at.
 *
 * The blobs are read later (sql_fetch.c) in blocks of rows fetched by key, up to SQL_BLOCK_BYTES at a
 * time, never one query per sample on a server:
 *   - the first pass, which builds the single-file cache (cache_build.c reads samples in
 *     index order), fetches the next keys in order;
 *   - a stream that reads the database itself tells the kind which samples a worker is
 *     about to read (run_begin, one chunk of a batch); the first read of the chunk
 *     fetches the rows of the chunk together, the others are served from that block.
 * Connections are kept in a small pool; a connection (and its block) is used by one
 * thread at a time. A row whose blob changed length since open, or that is gone, is a
 * bad sample (on_error); a database that cannot be read at all fails the read with the
 * engine's message and the dataset's name. The cache's fingerprint is the declared
 * version query's result (e.g. SELECT max(updated_at) FROM t) or, without one, the
 * query's text and its row count. */
#include "sql_backend.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "arena.h"
#include "log.h"

/* Room for an integer key as text. */
#define SQL_KEY_NAME 24

int source_sql_fail(const struct sql_dataset *sd, char *errbuf, int code, const char *what, const char *why)
{
    ld_errorf(errbuf, "dataset '%s': %s '%s': %s", sd->base.name, what, sd->where, why);
    return code;
}

int source_sql_oom(const struct sql_dataset *sd, char *errbuf)
{
    ld_errorf(errbuf, "dataset '%s': out of memory", sd->base.name);
    return LD_ENOMEM;
}

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

/* Appends printf output to the malloc'd *s; false when memory is short (*s freed). */
static bool sql_append(char **s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool sql_append(char **s, const char *fmt, ...)
{
    va_list ap;
    char *more = NULL, *t = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&more, fmt, ap);
    va_end(ap);
    if (n < 0 || asprintf(&t, "%s%s", *s ? *s : "", more) < 0)
        t = NULL;
    free(more);
    free(*s);
    *s = t;
    return t != NULL;
}

char *source_sql_text(const struct sql_dataset *sd, enum sql_stmt stmt, const char *tail)
{
    char *s = NULL;
    if (stmt == SQL_STMT_VERSION) {
        if (sd->version_query)
            return strdup(sd->version_query);
        return sql_append(&s, "SELECT count(*) FROM (%s) AS loaderd_q", sd->query) ? s : NULL;
    }
    char *key = sql_ident(sd->key_name);
    bool ok = key && sql_append(&s, "SELECT %s", key);
    for (int f = 0; ok && f < sd->base.n_fields; f++) {
        bool blob = sd->blob_slot[f] >= 0;
        if (stmt == SQL_STMT_FETCH && !blob)
            continue;
        char *q = sql_ident(sd->col_names[f]);
        ok = q && sql_append(&s, ", ");
        if (ok && stmt == SQL_STMT_SCAN && blob)
            ok = sql_append(&s, "%s%s%s", sd->be->length_open, q, sd->be->length_close);
        else if (ok)
            ok = sql_append(&s, "%s", q);
        free(q);
    }
    ok = ok && sql_append(&s, " FROM (%s) AS loaderd_q ", sd->query);
    /* The tail names the key as {K}. */
    if (stmt == SQL_STMT_SCAN || !tail)
        tail = "ORDER BY {K}";
    for (const char *at; ok && *tail; tail = at + 3) {
        if (!(at = strstr(tail, "{K}"))) {
            ok = sql_append(&s, "%s", tail);
            break;
        }
        ok = sql_append(&s, "%.*s%s", (int)(at - tail), tail, key);
    }
    free(key);
    if (!ok) {
        free(s);
        return NULL;
    }
    return s;
}

static void sql_free(dataset *d)
{
    struct sql_dataset *sd = (struct sql_dataset *)d;
    if (!sd)
        return;
    while (sd->pool) {
        struct sql_conn *c = sd->pool;
        sd->pool = c->next;
        sql_fetch_close(sd, c);
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
    free(sd->target);
    free(sd->where);
    free(sd->query);
    free(sd->version_query);
    free(sd->key_name);
    free(sd);
}

/* ---- keys ------------------------------------------------------------------------ */

/* The key of sample i, for messages. */
const char *source_sql_key_text(const struct sql_dataset *sd, uint64_t i, char *buf, size_t size)
{
    if (sd->int_keys)
        snprintf(buf, size, "%" PRId64, sd->ikeys[i]);
    else
        snprintf(buf, size, "'%.80s'", sd->skeys[i]);
    return buf;
}

static int sql_perm_cmp(const void *a, const void *b, void *arg)
{
    const struct sql_dataset *sd = arg;
    uint64_t i = *(const uint64_t *)a, j = *(const uint64_t *)b;
    if (sd->int_keys)
        return (sd->ikeys[i] > sd->ikeys[j]) - (sd->ikeys[i] < sd->ikeys[j]);
    return strcmp(sd->skeys[i], sd->skeys[j]);
}

/* Moves n elements of `width` words from *array into the order of perm. */
static int sql_permute(uint64_t **array, const uint64_t *perm, uint64_t n, size_t width)
{
    uint64_t *out = malloc(n * width * sizeof *out);
    if (!out)
        return LD_ENOMEM;
    for (uint64_t i = 0; i < n; i++)
        memcpy(out + i * width, *array + perm[i] * width, width * sizeof *out);
    free(*array);
    *array = out;
    return 0;
}

/* Puts the scanned rows in key order when the database's order was another (a
 * server's text collation): samples are numbered by the keys' bytes everywhere. */
static int sql_sort(struct sql_dataset *sd, char ***label_texts)
{
    uint64_t n = sd->base.count, *perm = NULL;
    bool sorted = true;
    for (uint64_t i = 1; i < n && sorted; i++) {
        uint64_t a[2] = {i - 1, i};
        sorted = sql_perm_cmp(&a[0], &a[1], sd) <= 0;
    }
    if (sorted)
        return 0;
    if (!(perm = malloc(n * sizeof *perm)))
        return LD_ENOMEM;
    for (uint64_t i = 0; i < n; i++)
        perm[i] = i;
    qsort_r(perm, n, sizeof *perm, sql_perm_cmp, sd);
    size_t nb = sd->n_blobs ? (size_t)sd->n_blobs : 1;
    int r = sd->int_keys ? sql_permute((uint64_t **)&sd->ikeys, perm, n, 1) : sql_permute((uint64_t **)&sd->skeys, perm, n, 1);
    if (r == 0)
        r = sql_permute(&sd->lens, perm, n, nb);
    if (r == 0)
        r = sql_permute(&sd->values, perm, n, (size_t)sd->base.n_fields);
    if (r == 0 && *label_texts)
        r = sql_permute((uint64_t **)label_texts, perm, n, 1);
    free(perm);
    return r;
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
        return source_sql_oom(sd, errbuf);
    for (uint64_t i = 0; i < d->count; i++)
        names[i] = texts[i];
    qsort(names, d->count, sizeof *names, cmp_str);
    size_t n = 0;
    for (uint64_t i = 0; i < d->count; i++)
        if (n == 0 || strcmp(names[n - 1], names[i]) != 0)
            names[n++] = names[i];
    if (!(d->class_names = calloc(n, sizeof *d->class_names))) {
        free(names);
        return source_sql_oom(sd, errbuf);
    }
    d->n_classes = n;
    for (size_t k = 0; k < n; k++)
        if (!(d->class_names[k] = strdup(names[k]))) {
            free(names);
            return source_sql_oom(sd, errbuf);
        }
    for (uint64_t i = 0; i < d->count; i++) {
        const char **hit = bsearch(&texts[i], names, n, sizeof *names, cmp_str);
        sd->values[i * (uint64_t)d->n_fields + (uint64_t)field] = (uint64_t)(hit - names);
    }
    free(names);
    return 0;
}

static const char *sql_type_name(int t)
{
    return t == SQL_NULL ? "NULL" : t == SQL_INT ? "an integer" : t == SQL_FLOAT ? "a float"
         : t == SQL_TEXT ? "text" : "a blob";
}

/* One scanned row's fields (vals[1..]) into row n's lengths and values. */
static int sql_scan_fields(struct sql_dataset *sd, uint64_t n, const struct sql_value *vals, char **label_text,
                           bool *text_labels, char *errbuf)
{
    dataset *d = &sd->base;
    char kbuf[128];
    for (int f = 0; f < d->n_fields; f++) {
        const struct sql_value *v = &vals[f + 1];
        uint64_t *out = &sd->values[n * (uint64_t)d->n_fields + (uint64_t)f];
        const char *want = NULL;
        *out = 0;
        if (sd->blob_slot[f] >= 0) {
            if (v->type == SQL_INT)
                sd->lens[n * (uint64_t)sd->n_blobs + (uint64_t)sd->blob_slot[f]] = (uint64_t)v->i;
            else
                want = "a blob or text, not NULL";
        } else if (sd->types[f] == CONFIG_COLUMN_LABEL) {
            if (v->type == SQL_INT && !*text_labels) {
                *out = (uint64_t)v->i;
            } else if (v->type == SQL_TEXT) {
                *text_labels = true;
                if (!(*label_text = strndup(v->p, (size_t)v->len)))
                    return source_sql_oom(sd, errbuf);
            } else {
                want = "an integer or a class name";
            }
        } else if (sd->types[f] == CONFIG_COLUMN_INT64) {
            if (v->type == SQL_INT)
                *out = (uint64_t)v->i;
            else
                want = "an integer";
        } else {
            float y = (float)(v->type == SQL_INT ? (double)v->i : v->f);
            if ((v->type == SQL_INT || v->type == SQL_FLOAT) && isfinite(y))
                memcpy(out, &y, sizeof y);
            else
                want = "a finite number";
        }
        if (want) {
            ld_errorf(errbuf, "dataset '%s': key %s: column '%s' is %s, expected %s", d->name,
                      source_sql_key_text(sd, n, kbuf, sizeof kbuf), sd->col_names[f], sql_type_name(v->type), want);
            return LD_EDATASET;
        }
    }
    return 0;
}

/* Runs the query once: the keys, the blobs' lengths, labels and numbers, in key order. */
static int sql_scan(struct sql_dataset *sd, struct sql_conn *c, char *errbuf)
{
    dataset *d = &sd->base;
    char kbuf[128];
    char **label_texts = NULL;
    size_t cap_keys = 0, cap_lens = 0, cap_values = 0, cap_texts = 0;
    int label_field = -1, r;
    bool text_labels = false;
    struct sql_value vals[1 + LD_MAX_FIELDS];

    for (int f = 0; f < d->n_fields; f++)
        if (sd->types[f] == CONFIG_COLUMN_LABEL)
            label_field = f;
    if ((r = sd->be->run(sd, c, SQL_STMT_SCAN, NULL, 0, errbuf)) < 0)
        return r;
    uint64_t n = 0;
    while ((r = sd->be->next(sd, c, vals, errbuf)) == 1) {
        int kt = vals[0].type;
        if (n == 0)
            sd->int_keys = kt == SQL_INT;
        if ((kt != SQL_INT && kt != SQL_TEXT) || sd->int_keys != (kt == SQL_INT)) {
            ld_errorf(errbuf, "dataset '%s': row %" PRIu64 " of the query: the key column '%s' is %s; "
                      "keys are all integers or all text, never NULL", d->name, n + 1, sd->key_name,
                      kt == SQL_NULL ? "NULL" : kt == SQL_FLOAT ? "a float" : "of another type than the first");
            r = LD_EDATASET;
            break;
        }
        if ((sd->int_keys ? arena_grow((void **)&sd->ikeys, &cap_keys, n + 1, sizeof *sd->ikeys)
                          : arena_grow((void **)&sd->skeys, &cap_keys, n + 1, sizeof *sd->skeys)) < 0 ||
            arena_grow((void **)&sd->lens, &cap_lens, (n + 1) * (size_t)(sd->n_blobs ? sd->n_blobs : 1),
                       sizeof *sd->lens) < 0 ||
            arena_grow((void **)&sd->values, &cap_values, (n + 1) * (size_t)d->n_fields, sizeof *sd->values) < 0 ||
            (label_field >= 0 && arena_grow((void **)&label_texts, &cap_texts, n + 1, sizeof *label_texts) < 0)) {
            r = source_sql_oom(sd, errbuf);
            break;
        }
        if (label_field >= 0)
            label_texts[n] = NULL;
        if (sd->int_keys)
            sd->ikeys[n] = vals[0].i;
        else if (!(sd->skeys[n] = strndup(vals[0].p, (size_t)vals[0].len))) {
            r = source_sql_oom(sd, errbuf);
            break;
        }
        d->count = n + 1; /* what sql_free must free */
        if ((r = sql_scan_fields(sd, n, vals, label_field >= 0 ? &label_texts[n] : NULL, &text_labels, errbuf)) < 0)
            break;
        n++;
    }
    sd->be->end(c);
    if (r < 0)
        goto out;
    if (n == 0) {
        ld_errorf(errbuf, "dataset '%s': the query returns no row", d->name);
        r = LD_EDATASET;
        goto out;
    }
    if ((r = sql_sort(sd, &label_texts)) < 0) {
        r = source_sql_oom(sd, errbuf);
        goto out;
    }
    for (uint64_t i = 1; i < n; i++) {
        uint64_t a[2] = {i - 1, i};
        if (sql_perm_cmp(&a[0], &a[1], sd) == 0) {
            ld_errorf(errbuf, "dataset '%s': the key column '%s' is not unique: key %s is on two rows", d->name,
                      sd->key_name, source_sql_key_text(sd, i, kbuf, sizeof kbuf));
            r = LD_EDATASET;
            goto out;
        }
    }
    if (text_labels) {
        for (uint64_t i = 0; i < n; i++)
            if (!label_texts[i]) {
                ld_errorf(errbuf, "dataset '%s': key %s: column '%s' is an integer where other rows hold class names",
                          d->name, source_sql_key_text(sd, i, kbuf, sizeof kbuf), sd->col_names[label_field]);
                r = LD_EDATASET;
                goto out;
            }
        r = sql_label_names(sd, label_field, label_texts, errbuf);
    }
out:
    for (uint64_t i = 0; label_texts && i < d->count; i++)
        free(label_texts[i]);
    free(label_texts);
    return r;
}

/* The blobs' shapes: a fixed row when every value of a column has one length. */
static int sql_shapes(struct sql_dataset *sd, char *errbuf)
{
    dataset *d = &sd->base;
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
            return LD_EDATASET;
        }
        struct dataset_field *fl = &d->fields[f];
        fl->max_item_bytes = max;
        fl->ragged = !same;
        fl->ndim = same ? 1 : 0;
        fl->shape[0] = same ? (int64_t)max : 0;
    }
    if (sd->int_keys) {
        if (!(sd->knames = malloc(d->count * SQL_KEY_NAME)))
            return source_sql_oom(sd, errbuf);
        for (uint64_t i = 0; i < d->count; i++)
            snprintf(sd->knames + i * SQL_KEY_NAME, SQL_KEY_NAME, "key %" PRId64, sd->ikeys[i]);
    }
    return 0;
}

extern const struct dataset_ops source_sql_multi_ops;

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
    sd->be = cfg->sql_connection ? &sql_pg_backend : &sql_sqlite_backend;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    d->n_fields = (int)cfg->n_columns;
    if (pthread_mutex_init(&sd->lock, NULL) == 0)
        sd->lock_ready = true;
    if (pthread_cond_init(&sd->returned, NULL) == 0)
        sd->cond_ready = true;
    sd->query = strdup(cfg->sql_query);
    sd->key_name = strdup(cfg->sql_key);
    sd->version_query = cfg->sql_version_query ? strdup(cfg->sql_version_query) : NULL;
    bool oom = !sd->lock_ready || !sd->cond_ready || !sd->query || !sd->key_name ||
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
        r = source_sql_oom(sd, errbuf);
        goto fail;
    }
    if ((r = sd->be->configure(sd, cfg, errbuf)) < 0)
        goto fail;
    snprintf(d->source, sizeof d->source, "%s", sd->where);
    if (cfg->cache_path && !cacheable) {
        ld_errorf(errbuf, "dataset '%s': a cache holds one blob column and a label; this dataset's columns are "
                  "more: remove `cache:`", cfg->name);
        r = LD_EDATASET;
        goto fail;
    }
    if ((r = sd->be->connect(sd, &c, errbuf)) < 0)
        goto fail;
    sd->open_conns = 1;
    if ((r = sql_scan(sd, c, errbuf)) < 0 || (r = sql_shapes(sd, errbuf)) < 0)
        goto fail;
    d->sample_overhead = 8 * 1024;
    sql_fetch_give(sd, c);
    ld_log(LD_LOG_DEBUG, "dataset '%s': %" PRIu64 " rows from %s '%s'", d->name, d->count, sd->be->name, sd->where);
    *ret_dataset = d;
    return 0;
fail:
    sql_fetch_close(sd, c);
    sql_free(d);
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
    return sql_fetch_item_bytes(d, index, 0);
}

/* What a fingerprint hashes: the kind, the mode, the query's text and columns and then
 * either the version query's result or the query's row count now. */
static int sql_fingerprint(const dataset *d, int mode, uint64_t *ret_fingerprint, char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    static const char tag[] = "loaderd sql fingerprint v1";
    struct sql_conn *c = NULL;
    struct sql_value vals[1 + LD_MAX_FIELDS];
    int r = sql_fetch_take(sd, &c, errbuf);
    if (r < 0)
        return r;
    XXH3_state_t *h = XXH3_createState();
    if (!h) {
        r = source_sql_oom(sd, errbuf);
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
    if ((r = sd->be->run(sd, c, SQL_STMT_VERSION, NULL, 0, errbuf)) == 0 &&
        (r = sd->be->next(sd, c, vals, errbuf)) == 0) {
        source_sql_fail(sd, errbuf, 0, sd->version_query ? "the version query returns no row on" : "no row count from",
                        "empty result");
        r = LD_EDATASET;
    }
    /* The engine answers every column as text, then SQL_END. */
    for (int k = 0; r == 1 && k <= LD_MAX_FIELDS && vals[k].type != SQL_END; k++) {
        if (vals[k].type == SQL_TEXT)
            XXH3_64bits_update(h, vals[k].p, (size_t)vals[k].len + 1);
        else
            XXH3_64bits_update(h, "\x01NULL", 6);
    }
    sd->be->end(c);
    if (r == 1) {
        uint64_t fp = XXH3_64bits_digest(h);
        *ret_fingerprint = fp ? fp : 1;
        r = 0;
    }
out:
    XXH3_freeState(h);
    sql_fetch_give(sd, c);
    return r;
}

#define SQL_OPS_COMMON                                                                                               \
    .kind = "sql", .open = sql_open, .free = sql_free, .item_bytes = sql_fetch_item_bytes, .read = sql_fetch_read,               \
    .sample_name = sql_sample_name, .run_begin = sql_fetch_run_begin, .run_end = sql_fetch_run_end

const struct dataset_ops source_sql_ops = {
    SQL_OPS_COMMON,
    .fingerprint = sql_fingerprint,
    .raw_bytes = sql_raw_bytes,
    .read_raw = sql_fetch_read_raw,
};

/* Columns beyond one blob and a label: the cache could not hold them. */
const struct dataset_ops source_sql_multi_ops = {SQL_OPS_COMMON};
