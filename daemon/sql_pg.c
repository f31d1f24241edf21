/* sql_pg — the `sql` kind's PostgreSQL engine (sql_backend.h), through libpq: the
 * dataset's `connection` is a libpq connection string ("host=/run/postgresql
 * dbname=records", "postgresql://user@db.example/records") or a service name from
 * pg_service.conf.
 *
 * Every statement is a round trip to a server, so samples are fetched in blocks: one
 * statement prepared per connection, SELECT key, blobs ... WHERE key = ANY($1), bound to
 * the keys of a block (a worker's chunk of a batch, or the next keys of the cache's
 * first pass), its result in binary so that bytea arrives as its bytes. The scan at
 * open and the version query run in text, which every type has. The scan reads the key
 * list through a server-side cursor, PG_SCAN_ROWS rows per FETCH, in a read-only
 * transaction of its own: a table of millions of rows never sits in the daemon's memory
 * twice (libpq's result of the whole query beside the kind's arrays).
 *
 * A connection lost mid-query (the server restarted, a network cut) is reset and the
 * statement run again, with a backoff between tries; when the server stays away the read
 * fails with the server's last message and the dataset's name, and the daemon keeps
 * serving. The password of a connection string is never shown: sd->where, which
 * messages and `loaderctl datasets` show, has it as `***` (libpq's own messages do not
 * repeat it). Prefer a ~/.pgpass or PGPASSFILE to a password in the config. */
#include "sql_backend.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* Tries of a statement whose connection was lost (a reset before each retry), and the
 * first wait between them, doubled each time: 0.1 + 0.2 + 0.4 + 0.8 s. */
#define PG_TRIES 5
#define PG_BACKOFF_MS 100
#define PG_FETCH_NAME "loaderd_fetch"
/* The scan's cursor, and the rows of one FETCH from it. */
#define PG_SCAN_CURSOR "loaderd_scan"
#define PG_SCAN_ROWS 10000
#define PG_SCAN_FETCH "FETCH FORWARD 10000 FROM " PG_SCAN_CURSOR     /* PG_SCAN_ROWS */

/* Type OIDs (catalog/pg_type.h is server-side; these never change). */
enum {
    PG_BOOL = 16, PG_BYTEA = 17, PG_INT8 = 20, PG_INT2 = 21, PG_INT4 = 23, PG_OID = 26,
    PG_FLOAT4 = 700, PG_FLOAT8 = 701, PG_NUMERIC = 1700,
};

struct pg_conn {
    struct sql_conn base;
    PGconn *pg;
    bool prepared;                  /* the fetch statement, on this session */
    PGresult *res;                  /* of the statement run() started */
    int row, rows, cols;
    bool version;
    bool scanning;                  /* the scan's transaction and cursor are open */
    char *keys;                     /* the fetch's array of keys, as text */
    size_t keys_cap;
};

/* libpq's message without its trailing newline, in buf. */
static const char *pg_message(const char *msg, char *buf, size_t size)
{
    snprintf(buf, size, "%s", msg && *msg ? msg : "no message from libpq");
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    /* One line: libpq's continuation lines ("\n\tIs the server running...") joined. */
    char *out = buf;
    for (const char *p = buf; *p; p++) {
        char ch = *p == '\n' || *p == '\t' ? ' ' : *p;
        if (ch != ' ' || (out > buf && out[-1] != ' '))
            *out++ = ch;
    }
    *out = '\0';
    return buf;
}

/* Appends `s`, quoted as a connection string value when it needs it. */
static int pg_append_value(char **out, size_t *len, size_t *cap, const char *s)
{
    bool quote = !*s || strpbrk(s, " '\\\t\n") != NULL;
    size_t need = *len + 2 * strlen(s) + 4;
    if (need > *cap) {
        char *t = realloc(*out, need * 2);
        if (!t)
            return LD_ENOMEM;
        *out = t;
        *cap = need * 2;
    }
    char *p = *out + *len;
    if (quote)
        *p++ = '\'';
    for (; *s; s++) {
        if (quote && (*s == '\'' || *s == '\\'))
            *p++ = '\\';
        *p++ = *s;
    }
    if (quote)
        *p++ = '\'';
    *p = '\0';
    *len = (size_t)(p - *out);
    return 0;
}

/* The connection string as shown: every option set, the password as ***. */
static int pg_configure(struct sql_dataset *sd, const struct config_dataset *cfg, char *errbuf)
{
    const char *conn = cfg->sql_connection;
    char *err = NULL, why[LD_ERRMSG_MAX];
    /* A bare word is a service name (pg_service.conf). */
    bool service = !strchr(conn, '=') && strncmp(conn, "postgresql://", 13) != 0 && strncmp(conn, "postgres://", 11) != 0;
    if (asprintf(&sd->target, "%s%s", service ? "service=" : "", conn) < 0) {
        sd->target = NULL;
        return source_sql_oom(sd, errbuf);
    }
    PQconninfoOption *opts = PQconninfoParse(sd->target, &err);
    if (!opts) {
        ld_errorf(errbuf, "dataset '%s': connection: %s", cfg->name,
                  pg_message(err ? err : "out of memory", why, sizeof why));
        PQfreemem(err);
        return LD_EDATASET;
    }
    size_t len = 0, cap = 0;
    int r = 0;
    for (const PQconninfoOption *o = opts; o->keyword && r == 0; o++) {
        if (!o->val || !*o->val)
            continue;
        bool secret = !strcmp(o->keyword, "password");
        size_t need = len + strlen(o->keyword) + 3;
        if (need > cap) {
            char *t = realloc(sd->where, need * 2);
            if (!t) {
                r = LD_ENOMEM;
                break;
            }
            sd->where = t;
            cap = need * 2;
        }
        len += (size_t)snprintf(sd->where + len, cap - len, "%s%s=", len ? " " : "", o->keyword);
        r = pg_append_value(&sd->where, &len, &cap, secret ? "***" : o->val);
    }
    PQconninfoFree(opts);
    if (r == 0 && !sd->where && !(sd->where = strdup("(libpq defaults)")))
        r = LD_ENOMEM;
    return r < 0 ? source_sql_oom(sd, errbuf) : 0;
}

static void pg_close(struct sql_conn *base)
{
    struct pg_conn *c = (struct pg_conn *)base;
    if (!c)
        return;
    PQclear(c->res);
    PQfinish(c->pg);
    free(c->keys);
    free(c);
}

static int pg_prepare(const struct sql_dataset *sd, struct pg_conn *c, char *errbuf)
{
    char why[LD_ERRMSG_MAX];
    char *text = source_sql_text(sd, SQL_STMT_FETCH, "WHERE {K} = ANY($1)");
    if (!text)
        return source_sql_oom(sd, errbuf);
    PGresult *res = PQprepare(c->pg, PG_FETCH_NAME, text, 1, NULL);
    free(text);
    int r = 0;
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        r = source_sql_fail(sd, errbuf, LD_EDATASET, "the query cannot run on",
                            pg_message(PQresultErrorMessage(res), why, sizeof why));
    else
        c->prepared = true;
    PQclear(res);
    return r;
}

/* The server's notices and warnings ("terminating connection due to ...") go to the
 * daemon's log, not to libpq's default, stderr. */
static void pg_notice(void *arg, const char *message)
{
    const struct sql_dataset *sd = arg;
    char buf[LD_ERRMSG_MAX];
    ld_log(LD_LOG_DEBUG, "dataset '%s': the server says: %s", sd->base.name, pg_message(message, buf, sizeof buf));
}

static int pg_connect(const struct sql_dataset *sd, struct sql_conn **ret_conn, char *errbuf)
{
    struct pg_conn *c = calloc(1, sizeof *c);
    char why[LD_ERRMSG_MAX];
    if (!c)
        return source_sql_oom(sd, errbuf);
    /* Keywords are taken in order, the last value kept: the connection string (expanded
     * from dbname) may override the timeout and the name. */
    const char *const kw[] = {"connect_timeout", "fallback_application_name", "dbname", NULL};
    const char *const val[] = {"10", "loaderd", sd->target, NULL};
    c->pg = PQconnectdbParams(kw, val, 1);
    if (c->pg)
        PQsetNoticeProcessor(c->pg, pg_notice, (void *)sd);
    int r = 0;
    if (!c->pg)
        r = source_sql_fail(sd, errbuf, LD_ENOMEM, "cannot open the database", "out of memory");
    else if (PQstatus(c->pg) != CONNECTION_OK)
        r = source_sql_fail(sd, errbuf, LD_EDATASET, "cannot open the database",
                            pg_message(PQerrorMessage(c->pg), why, sizeof why));
    else
        r = pg_prepare(sd, c, errbuf);
    if (r < 0) {
        pg_close(&c->base);
        return r;
    }
    *ret_conn = &c->base;
    return 0;
}

/* The keys of samples idx[0..n) as an array literal: {1,2,3} or {"a","b"}. */
static int pg_key_array(const struct sql_dataset *sd, struct pg_conn *c, const uint64_t *idx, size_t n)
{
    size_t len = 0;
    for (size_t k = 0; k <= n; k++) {
        size_t need = len + 4 + (k < n ? (sd->int_keys ? 24 : 2 * strlen(sd->skeys[idx[k]]) + 2) : 0);
        if (need > c->keys_cap) {
            char *t = realloc(c->keys, need * 2);
            if (!t)
                return LD_ENOMEM;
            c->keys = t;
            c->keys_cap = need * 2;
        }
        char *p = c->keys + len;
        *p++ = k == 0 ? '{' : k == n ? '}' : ',';
        if (k == n) {
            if (n == 0)
                *p++ = '}';
            *p = '\0';
            break;
        }
        if (sd->int_keys) {
            p += sprintf(p, "%" PRId64, sd->ikeys[idx[k]]);
        } else {
            *p++ = '"';
            for (const char *s = sd->skeys[idx[k]]; *s; s++) {
                if (*s == '"' || *s == '\\')
                    *p++ = '\\';
                *p++ = *s;
            }
            *p++ = '"';
        }
        len = (size_t)(p - c->keys);
    }
    return 0;
}

static void pg_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Whether a failed statement lost the connection: libpq says so, or the error is not
 * the server's (libpq's own errors have no SQLSTATE; a write to a closed socket leaves
 * the status OK until the next read), or the server ended the session (class 08,
 * connection exception; 57P01..57P03, shut down). */
static bool pg_lost(const struct pg_conn *c)
{
    const char *state = c->res ? PQresultErrorField(c->res, PG_DIAG_SQLSTATE) : NULL;
    return PQstatus(c->pg) != CONNECTION_OK || !state || !strncmp(state, "08", 2) || !strncmp(state, "57P0", 4);
}

/* Ends the scan's transaction (which closes its cursor): COMMIT after the last row,
 * else ROLLBACK, on a connection that is still there. */
static void pg_scan_close(struct pg_conn *c, bool done)
{
    c->scanning = false;
    if (PQstatus(c->pg) == CONNECTION_OK)
        PQclear(PQexec(c->pg, done ? "COMMIT" : "ROLLBACK"));
}

/* The next rows of the scan's cursor. */
static PGresult *pg_scan_fetch(struct pg_conn *c)
{
    return PQexec(c->pg, PG_SCAN_FETCH);
}

/* Opens the scan's transaction and cursor over `text`, and fetches the first rows: the
 * result of the first statement that failed, else that of the FETCH. */
static PGresult *pg_scan_open(struct pg_conn *c, const char *text)
{
    char *declare = NULL;
    PGresult *res = PQexec(c->pg, "BEGIN READ ONLY");
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        return res;
    PQclear(res);
    c->scanning = true;
    if (asprintf(&declare, "DECLARE " PG_SCAN_CURSOR " NO SCROLL CURSOR FOR %s", text) < 0)
        return NULL;            /* read as a lost connection: tried again */
    res = PQexec(c->pg, declare);
    free(declare);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        return res;
    PQclear(res);
    return pg_scan_fetch(c);
}

/* Runs one statement, resetting a lost connection and retrying with a backoff. */
static int pg_run(const struct sql_dataset *sd, struct sql_conn *base, enum sql_stmt stmt, const uint64_t *idx,
                  size_t n, char *errbuf)
{
    struct pg_conn *c = (struct pg_conn *)base;
    char why[LD_ERRMSG_MAX] = "";
    char *text = NULL;
    int r = 0;
    PQclear(c->res);
    c->res = NULL;
    c->version = stmt == SQL_STMT_VERSION;
    if (stmt == SQL_STMT_FETCH ? pg_key_array(sd, c, idx, n) < 0 : !(text = source_sql_text(sd, stmt, NULL)))
        return source_sql_oom(sd, errbuf);
    bool lost = false;
    for (int attempt = 0; attempt < PG_TRIES; attempt++) {
        if (lost || PQstatus(c->pg) != CONNECTION_OK) {
            if (attempt > 1)
                pg_sleep_ms(PG_BACKOFF_MS << (attempt - 2));
            PQreset(c->pg);
            if (PQstatus(c->pg) != CONNECTION_OK) {
                pg_message(PQerrorMessage(c->pg), why, sizeof why);
                continue;
            }
            c->prepared = false;
            lost = false;
            ld_log(LD_LOG_INFO, "dataset '%s': connected again to '%s'", sd->base.name, sd->where);
        }
        if (stmt == SQL_STMT_FETCH && !c->prepared && (r = pg_prepare(sd, c, errbuf)) < 0) {
            if (PQstatus(c->pg) == CONNECTION_OK)
                break;
            pg_message(PQerrorMessage(c->pg), why, sizeof why);
            lost = true;
            r = 0;
            continue;
        }
        const char *const param[] = {c->keys};
        if (stmt == SQL_STMT_SCAN)
            c->res = pg_scan_open(c, text);
        else
            c->res = stmt == SQL_STMT_FETCH ? PQexecPrepared(c->pg, PG_FETCH_NAME, 1, param, NULL, NULL, 1)
                                            : PQexecParams(c->pg, text, 0, NULL, NULL, NULL, NULL, 0);
        if (PQresultStatus(c->res) == PGRES_TUPLES_OK)
            break;
        if (c->scanning)
            pg_scan_close(c, false);
        pg_message(c->res ? PQresultErrorMessage(c->res) : PQerrorMessage(c->pg), why, sizeof why);
        lost = pg_lost(c);
        PQclear(c->res);
        c->res = NULL;
        if (!lost) {
            r = source_sql_fail(sd, errbuf, LD_EDATASET, stmt == SQL_STMT_VERSION && sd->version_query
                                ? "the version query failed on" : "the query failed on", why);
            break;
        }
        ld_log(LD_LOG_WARN, "dataset '%s': lost the connection to '%s' (%s); connecting again", sd->base.name,
               sd->where, why);
    }
    free(text);
    if (r == 0 && !c->res) {
        char what[96];
        snprintf(what, sizeof what, "lost the connection, and could not connect again (%d tries), to", PG_TRIES - 1);
        r = source_sql_fail(sd, errbuf, LD_EDATASET, what, why);
    }
    if (r < 0)
        return r;
    c->row = 0;
    c->rows = PQntuples(c->res);
    c->cols = PQnfields(c->res);
    return 0;
}

/* A big-endian integer of `len` bytes (a binary int2, int4 or int8). */
static int64_t pg_be_int(const unsigned char *p, int len)
{
    uint64_t v = 0;
    for (int k = 0; k < len; k++)
        v = v << 8 | p[k];
    if (len < 8 && (v >> (8 * len - 1)) & 1)
        v |= ~UINT64_C(0) << (8 * len);
    return (int64_t)v;
}

/* A value in text format, typed by its column's type. */
static void pg_text_value(Oid type, const char *s, uint64_t len, struct sql_value *v)
{
    char *end = NULL;
    v->p = s;
    v->len = len;
    v->type = SQL_TEXT;
    if (type == PG_INT2 || type == PG_INT4 || type == PG_INT8 || type == PG_OID || type == PG_NUMERIC) {
        errno = 0;
        long long i = strtoll(s, &end, 10);
        if (end != s && !*end && errno == 0) {
            v->type = SQL_INT;
            v->i = i;
            return;
        }
    }
    if (type == PG_FLOAT4 || type == PG_FLOAT8 || type == PG_NUMERIC) {
        v->type = SQL_FLOAT;
        v->f = strtod(s, &end);
    } else if (type == PG_BOOL) {
        v->type = SQL_INT;
        v->i = s[0] == 't';
    } else if (type == PG_BYTEA) {
        v->type = SQL_BLOB;
    }
}

static int pg_next(const struct sql_dataset *sd, struct sql_conn *base, struct sql_value *vals, char *errbuf)
{
    struct pg_conn *c = (struct pg_conn *)base;
    /* A full block may have more after it; a shorter one was the last. */
    if (c->scanning && c->res && c->row >= c->rows && c->rows == PG_SCAN_ROWS) {
        PQclear(c->res);
        c->res = pg_scan_fetch(c);
        if (PQresultStatus(c->res) != PGRES_TUPLES_OK) {
            char why[LD_ERRMSG_MAX];
            pg_message(c->res ? PQresultErrorMessage(c->res) : PQerrorMessage(c->pg), why, sizeof why);
            PQclear(c->res);
            c->res = NULL;
            pg_scan_close(c, false);
            return source_sql_fail(sd, errbuf, LD_EDATASET, "the query's keys could not all be read from", why);
        }
        c->row = 0;
        c->rows = PQntuples(c->res);
    }
    if (c->scanning && c->res && c->row >= c->rows)
        pg_scan_close(c, true);
    if (!c->res || c->row >= c->rows)
        return 0;
    bool binary = PQbinaryTuples(c->res);
    int n = c->cols < LD_MAX_FIELDS + 1 ? c->cols : LD_MAX_FIELDS + 1;
    if (c->version && n > LD_MAX_FIELDS)
        n = LD_MAX_FIELDS;
    for (int k = 0; k < n; k++) {
        struct sql_value *v = &vals[k];
        *v = (struct sql_value){.type = SQL_NULL};
        if (PQgetisnull(c->res, c->row, k))
            continue;
        const char *p = PQgetvalue(c->res, c->row, k);
        uint64_t len = (uint64_t)PQgetlength(c->res, c->row, k);
        Oid type = PQftype(c->res, k);
        if (c->version) {
            *v = (struct sql_value){.type = SQL_TEXT, .p = p, .len = len};
        } else if (!binary) {
            pg_text_value(type, p, len, v);
        } else if (type == PG_INT2 || type == PG_INT4 || type == PG_INT8) {
            *v = (struct sql_value){.type = SQL_INT, .i = pg_be_int((const unsigned char *)p, (int)len)};
        } else if (type == PG_OID) {
            *v = (struct sql_value){.type = SQL_INT, .i = (int64_t)(uint64_t)pg_be_int((const unsigned char *)p, 4) & 0xffffffff};
        } else {
            /* bytea, text and the like: their bytes; a key of another type matches no sample. */
            *v = (struct sql_value){.type = k == 0 ? SQL_TEXT : SQL_BLOB, .p = p, .len = len};
        }
    }
    if (c->version)
        vals[n].type = SQL_END;
    c->row++;
    return 1;
}

static void pg_end(struct sql_conn *base)
{
    struct pg_conn *c = (struct pg_conn *)base;
    PQclear(c->res);
    c->res = NULL;
    if (c->scanning)
        pg_scan_close(c, false);    /* stopped before the last row */
}

const struct sql_backend sql_pg_backend = {
    .name = "PostgreSQL",
    .length_open = "octet_length(",
    .length_close = ")",
    .configure = pg_configure,
    .connect = pg_connect,
    .close = pg_close,
    .run = pg_run,
    .next = pg_next,
    .end = pg_end,
};
