/* sql_fetch — how the `sql` kind (source_sql.c) reads rows after open: the pool of
 * connections, and the blocks of rows fetched by key.
 *
 * A read is served from a block: the rows of up to SQL_BLOCK_BYTES of samples, fetched
 * by one statement of the engine (sql_backend.h), kept on the connection that fetched
 * them. Which samples a block holds depends on who reads:
 *   - a worker that announced its chunk (run_begin) holds one connection for the whole
 *     chunk; its first read fetches the chunk's samples from that one on, together;
 *   - the cache's first pass (read_raw, in index order) fetches the next samples;
 *   - any other read fetches its sample alone.
 * Rows are matched to samples by key, so an engine may return them in any order; a row
 * that is gone, NULL or of another length than at open is a bad sample that says so. */
#include "sql_backend.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"

/* The most blob bytes one block of rows holds. */
#define SQL_BLOCK_BYTES (8u << 20)
/* Connections kept open (more concurrent readers open and close their own). */
#define SQL_POOL_MAX 64
/* block_len of a row the fetch did not return, and of a NULL. */
#define SQL_ABSENT UINT64_MAX
#define SQL_ISNULL (UINT64_MAX - 1)

void sql_fetch_close(const struct sql_dataset *sd, struct sql_conn *c)
{
    if (!c)
        return;
    free(c->block_idx);
    free(c->block_off);
    free(c->block_len);
    free(c->block_buf);
    sd->be->close(c);
}

/* A connection for this thread: a pooled one, else a new one. When a new one cannot be
 * opened (an SQLite file removed or replaced, a server gone) while others are alive, it
 * waits up to SQL_WAIT_S for one of them: they may still read. */
#define SQL_WAIT_S 5
int sql_fetch_take(const struct sql_dataset *sd, struct sql_conn **ret, char *errbuf)
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
    int r = sd->be->connect(sd, &c, errbuf);
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

void sql_fetch_give(const struct sql_dataset *sd, struct sql_conn *c)
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
        sql_fetch_close(sd, c);
}

uint64_t sql_fetch_item_bytes(const dataset *d, uint64_t index, int field)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    if (index >= d->count || field < 0 || field >= d->n_fields)
        return 0;
    if (sd->blob_slot[field] >= 0)
        return sd->lens[index * (uint64_t)sd->n_blobs + (uint64_t)sd->blob_slot[field]];
    return sd->types[field] == CONFIG_COLUMN_FLOAT32 ? 4 : 8;
}

/* Sample i's key against a key value from the database: <0, 0, >0. */
static int sql_key_cmp(const struct sql_dataset *sd, uint64_t i, const struct sql_value *v)
{
    if (sd->int_keys)
        return (sd->ikeys[i] > v->i) - (sd->ikeys[i] < v->i);
    size_t n = strlen(sd->skeys[i]);
    int c = memcmp(sd->skeys[i], v->p, n < v->len ? n : (size_t)v->len);
    return c ? c : (n > v->len) - (n < v->len);
}

/* The sample whose key is v, or UINT64_MAX. */
static uint64_t sql_key_find(const struct sql_dataset *sd, const struct sql_value *v)
{
    if (sd->int_keys ? v->type != SQL_INT : v->type != SQL_TEXT && v->type != SQL_BLOB)
        return UINT64_MAX;
    uint64_t lo = 0, hi = sd->base.count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = sql_key_cmp(sd, mid, v);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return UINT64_MAX;
}

/* The blob bytes of sample i (every blob column). */
static uint64_t sql_row_bytes(const struct sql_dataset *sd, uint64_t i)
{
    uint64_t b = 0;
    for (int s = 0; s < sd->n_blobs; s++)
        b += sd->lens[i * (uint64_t)sd->n_blobs + (uint64_t)s];
    return b;
}

/* Room in c's block for n samples. */
static int sql_block_room(struct sql_conn *c, size_t n)
{
    return arena_grow((void **)&c->block_idx, &c->idx_cap, n, sizeof *c->block_idx);
}

/* Position of sample i in c's block, or -1. */
static int64_t sql_block_find(const struct sql_conn *c, uint64_t i)
{
    uint64_t lo = 0, hi = c->block_n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (c->block_idx[mid] == i)
            return (int64_t)mid;
        if (c->block_idx[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Fetches the rows of the samples c->block_idx[0..n) (any order, duplicates allowed)
 * into c's block, in one statement. On failure the block is empty. */
static int sql_fetch_block(const struct sql_dataset *sd, struct sql_conn *c, uint64_t n, char *errbuf)
{
    uint64_t nb = (uint64_t)sd->n_blobs, bytes = 0, m = 0;
    qsort(c->block_idx, n, sizeof *c->block_idx, cmp_u64);
    for (uint64_t k = 0; k < n; k++)
        if (m == 0 || c->block_idx[m - 1] != c->block_idx[k])
            c->block_idx[m++] = c->block_idx[k];
    c->block_n = 0;
    uint64_t *off = realloc(c->block_off, m * nb * sizeof *off);
    if (off)
        c->block_off = off;
    uint64_t *len = off ? realloc(c->block_len, m * nb * sizeof *len) : NULL;
    if (!len)
        return source_sql_oom(sd, errbuf);
    c->block_len = len;
    for (uint64_t k = 0; k < m; k++)
        for (uint64_t s = 0; s < nb; s++) {
            off[k * nb + s] = bytes;
            len[k * nb + s] = SQL_ABSENT;
            bytes += sd->lens[c->block_idx[k] * nb + s];
        }
    if (bytes > c->block_cap) {
        uint8_t *b = realloc(c->block_buf, (size_t)bytes);
        if (!b)
            return source_sql_oom(sd, errbuf);
        c->block_buf = b;
        c->block_cap = (size_t)bytes;
    }
    struct sql_value vals[1 + LD_MAX_FIELDS];
    int r = sd->be->run(sd, c, SQL_STMT_FETCH, c->block_idx, (size_t)m, errbuf);
    c->block_n = m; /* what lookups during the walk below see */
    while (r == 0 && (r = sd->be->next(sd, c, vals, errbuf)) == 1) {
        r = 0;
        uint64_t i = sql_key_find(sd, &vals[0]);
        int64_t k = i == UINT64_MAX ? -1 : sql_block_find(c, i);
        if (k < 0)
            continue; /* a row of another key (a duplicate since open, a key we did not ask for) */
        for (uint64_t s = 0; s < nb; s++) {
            const struct sql_value *v = &vals[1 + s];
            uint64_t at = (uint64_t)k * nb + s;
            if (v->type != SQL_TEXT && v->type != SQL_BLOB) {
                len[at] = SQL_ISNULL;
                continue;
            }
            len[at] = v->len;
            if (v->len == sd->lens[i * nb + s] && v->len)
                memcpy(c->block_buf + off[at], v->p, (size_t)v->len);
        }
    }
    sd->be->end(c);
    if (r < 0)
        c->block_n = 0;
    return r < 0 ? r : 0;
}

/* The samples a worker thread is about to read (run_begin .. run_end), and the
 * connection it holds meanwhile. One per thread: a worker runs one chunk at a time. */
struct sql_run {
    const struct sql_dataset *sd;
    const uint64_t *idx;
    size_t n, pos;
    struct sql_conn *conn;
};
static _Thread_local struct sql_run sql_run;

void sql_fetch_run_begin(const dataset *d, const uint64_t *idx, size_t n)
{
    sql_run = (struct sql_run){.sd = (const struct sql_dataset *)d, .idx = idx, .n = n};
}

void sql_fetch_run_end(const dataset *d)
{
    if (sql_run.sd == (const struct sql_dataset *)d && sql_run.conn)
        sql_fetch_give(sql_run.sd, sql_run.conn);
    sql_run = (struct sql_run){0};
}

/* Plans the block that serves sample i on c: the rest of this thread's run from i, the
 * next samples in index order (`ahead`, the cache's first pass), or i alone; up to
 * SQL_BLOCK_BYTES. Returns the number of samples planned, or a negative code. */
static int64_t sql_plan(const struct sql_dataset *sd, struct sql_conn *c, uint64_t i, bool ahead)
{
    const struct sql_run *run = &sql_run;
    size_t p = run->pos;
    bool in_run = run->sd == sd && run->n;
    if (in_run) {
        while (p < run->n && run->idx[p] != i)
            p++;
        if (p == run->n)
            for (p = 0; p < run->pos && run->idx[p] != i; p++)
                ;
        in_run = p < run->n && run->idx[p] == i;
    }
    uint64_t n = 0, bytes = 0;
    for (;;) {
        uint64_t j = in_run ? (p + n < run->n ? run->idx[p + n] : UINT64_MAX)
                   : ahead ? i + n : (n ? UINT64_MAX : i);
        if (j >= sd->base.count || (n && bytes + sql_row_bytes(sd, j) > SQL_BLOCK_BYTES))
            break;
        if (sql_block_room(c, (size_t)n + 1) < 0)
            return LD_ENOMEM;
        c->block_idx[n++] = j;
        bytes += sql_row_bytes(sd, j);
    }
    if (in_run)
        sql_run.pos = p + n;
    return (int64_t)n;
}

/* A connection whose block holds sample i: this thread's run's, else a pooled one.
 * *ret_give says whether the caller gives it back. */
static int sql_block_for(const struct sql_dataset *sd, uint64_t i, bool ahead, struct sql_conn **ret_conn,
                         int64_t *ret_pos, bool *ret_give, char *errbuf)
{
    bool in_run = sql_run.sd == sd, taken = false;
    struct sql_conn *c = in_run ? sql_run.conn : NULL;
    int r = 0;
    if (!c) {
        if ((r = sql_fetch_take(sd, &c, errbuf)) < 0)
            return r;
        taken = true;
        if (in_run)
            sql_run.conn = c;
    }
    /* A block serves the run or the pass that fetched it, never a later reader: rows
     * may have changed since. */
    int64_t k = (in_run && !taken) || (!in_run && ahead && c->block_ahead) ? sql_block_find(c, i) : -1;
    if (k < 0) {
        int64_t n = sql_plan(sd, c, i, ahead);
        r = n < 0 ? source_sql_oom(sd, errbuf) : sql_fetch_block(sd, c, (uint64_t)n, errbuf);
        k = r < 0 ? -1 : sql_block_find(c, i);
        c->block_ahead = ahead && !in_run;
    }
    if (r < 0 && !in_run) {
        sql_fetch_give(sd, c);
        return r;
    }
    if (r < 0)
        return r;
    *ret_conn = c;
    *ret_pos = k;
    *ret_give = !in_run;
    return 0;
}

/* Blob column `slot` of block row k, which is sample i's, checked against its length at
 * open; LD_ESAMPLE naming the key when the row is gone or changed. */
static int sql_block_blob(const struct sql_dataset *sd, const struct sql_conn *c, int64_t k, uint64_t i, int field,
                          const uint8_t **ret_p, char *errbuf)
{
    char kbuf[128];
    uint64_t at = (uint64_t)k * (uint64_t)sd->n_blobs + (uint64_t)sd->blob_slot[field];
    uint64_t want = sql_fetch_item_bytes(&sd->base, i, field), got = c->block_len[at];
    source_sql_key_text(sd, i, kbuf, sizeof kbuf);
    if (got == SQL_ABSENT) {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): no longer returned by the query", i, kbuf);
        return LD_ESAMPLE;
    }
    if (got == SQL_ISNULL) {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): column '%s' is NULL, %" PRIu64 " bytes at open", i, kbuf,
                  sd->col_names[field], want);
        return LD_ESAMPLE;
    }
    if (got != want) {
        ld_errorf(errbuf, "sample %" PRIu64 " (key %s): column '%s' has %" PRIu64 " bytes, %" PRIu64 " at open", i,
                  kbuf, sd->col_names[field], got, want);
        return LD_ESAMPLE;
    }
    *ret_p = c->block_buf + c->block_off[at];
    return 0;
}

int sql_fetch_read(const dataset *d, uint64_t index, void *const dst[], char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    struct sql_conn *c = NULL;
    int64_t k;
    bool give;
    if (index >= d->count) {
        ld_errorf(errbuf, "sample %" PRIu64 ": out of range (dataset '%s' has %" PRIu64 ")", index, d->name, d->count);
        return LD_EINVAL;
    }
    int r = sql_block_for(sd, index, false, &c, &k, &give, errbuf);
    if (r < 0)
        return r;
    for (int f = 0; f < d->n_fields && r == 0; f++) {
        const uint8_t *p;
        if (sd->blob_slot[f] < 0)
            memcpy(dst[f], &sd->values[index * (uint64_t)d->n_fields + (uint64_t)f],
                   sd->types[f] == CONFIG_COLUMN_FLOAT32 ? 4 : 8);
        else if ((r = sql_block_blob(sd, c, k, index, f, &p, errbuf)) == 0)
            memcpy(dst[f], p, (size_t)sql_fetch_item_bytes(d, index, f));
    }
    if (give)
        sql_fetch_give(sd, c);
    return r;
}

int sql_fetch_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                        int64_t *ret_label, char *errbuf)
{
    const struct sql_dataset *sd = (const struct sql_dataset *)d;
    struct sql_conn *c = NULL;
    const uint8_t *p;
    int64_t k;
    bool give;
    if (index >= d->count)
        return LD_EINVAL;
    uint64_t len = sql_fetch_item_bytes(d, index, 0);
    if (len > cap) {
        ld_errorf(errbuf, "sample %" PRIu64 ": %" PRIu64 " bytes do not fit a buffer of %" PRIu64, index, len, cap);
        return LD_ERANGE;
    }
    int r = sql_block_for(sd, index, true, &c, &k, &give, errbuf);
    if (r < 0)
        return r;
    if ((r = sql_block_blob(sd, c, k, index, 0, &p, errbuf)) == 0) {
        memcpy(buf, p, (size_t)len);
        int lf = dataset_label_field(d);
        *ret_len = len;
        *ret_label = lf >= 0 ? (int64_t)sd->values[index * (uint64_t)d->n_fields + (uint64_t)lf] : -1;
    }
    if (give)
        sql_fetch_give(sd, c);
    return r;
}

