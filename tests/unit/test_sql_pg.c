/* Unit tests for the `sql` kind on PostgreSQL (sql_pg.c): a real server started once for
 * the whole group (scripts/pg-test-server.sh: initdb in a temporary directory, a Unix
 * socket only, a role with a password, run as nobody when we are root; the tests skip,
 * saying so, where PostgreSQL is not installed). Rows as samples with bytea, text
 * labels, integer and numeric columns; a worker's chunk fetched in one statement, never
 * one per sample (counted in the server's statement log); the cache's first pass in
 * blocks; the fingerprint from a version query; bad password, unknown table, no server:
 * clear errors that name the dataset and carry the server's message, never the
 * password; the server stopped under an open dataset (a clear error after the retries,
 * no crash) and started again (the next read reconnects). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sql_fixtures.h"
#include "testfs.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "ld_error.h"

#define PASSWORD "Pg-s3cret-7Q"
#define ROWS 300

static struct {
    char dir[64];
    char conn[512];                 /* with the password */
    bool up;
    const char *skip;               /* why the tests cannot run */
} srv;

static int pg_script(const char *cmd)
{
    char line[512];
    snprintf(line, sizeof line, "PG_TEST_OPTIONS='-c log_statement=all' scripts/pg-test-server.sh %s %s %s",
             cmd, srv.dir, !strcmp(cmd, "start") ? PASSWORD : "");
    FILE *p = popen(line, "r");
    if (!p)
        return -1;
    char out[200] = "";
    if (!fgets(out, sizeof out, p))
        out[0] = '\0';
    int st = pclose(p);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    out[strcspn(out, "\n")] = '\0';
    if (rc == 0 && out[0])
        snprintf(srv.conn, sizeof srv.conn, "%s password=%s", out, PASSWORD);
    return rc;
}

static void sql_exec(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

/* rec(id, payload bytea of 20 + id % 7 bytes testfs_byte(id), cls text, n bigint,
 * amount numeric, score real), ids 1..ROWS inserted out of order; meta(v). */
static void make_db(void)
{
    PGconn *pg = PQconnectdb(srv.conn);
    if (PQstatus(pg) != CONNECTION_OK)
        fail_msg("%s", PQerrorMessage(pg));
    sql_exec(pg, "SET client_min_messages = warning; DROP TABLE IF EXISTS rec, meta; CREATE TABLE rec(id int PRIMARY KEY, payload bytea, cls text, n bigint, amount numeric, score real);"
                 "CREATE TABLE meta(v int); INSERT INTO meta VALUES (1); BEGIN");
    for (int k = 0; k < ROWS; k++) {
        int id = (k * 37) % ROWS + 1; /* 37 is prime to 300: every id once */
        char idt[16], nt[24], amt[32], sct[32];
        uint8_t blob[32];
        size_t len = 20 + (size_t)id % 7;
        for (size_t j = 0; j < len; j++)
            blob[j] = testfs_byte((unsigned)id, j);
        snprintf(idt, sizeof idt, "%d", id);
        snprintf(nt, sizeof nt, "%d", id * 10);
        snprintf(amt, sizeof amt, "%d", id * 3);
        snprintf(sct, sizeof sct, "%g", id / 8.0);
        const char *vals[] = {idt, (const char *)blob, id % 3 == 0 ? "zebra" : id % 3 == 1 ? "ant" : "mole", nt, amt, sct};
        int lens[] = {0, (int)len, 0, 0, 0, 0}, fmts[] = {0, 1, 0, 0, 0, 0};
        PGresult *r = PQexecParams(pg, "INSERT INTO rec VALUES ($1, $2, $3, $4, $5, $6)", 6, NULL, vals, lens, fmts, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            fail_msg("insert: %s", PQresultErrorMessage(r));
        PQclear(r);
    }
    sql_exec(pg, "COMMIT");
    PQfinish(pg);
}

static int group_setup(void **state)
{
    if (testfs_mkdtemp("ld-pg", srv.dir, sizeof srv.dir) < 0)
        return -1;
    int rc = pg_script("start");
    if (rc == 2) {
        srv.skip = "PostgreSQL is not installed (apt-get install postgresql): the PostgreSQL tests are skipped";
        return 0;
    }
    if (rc != 0)
        return -1;
    srv.up = true;
    return 0;
}

static int group_teardown(void **state)
{
    if (srv.up)
        pg_script("stop");
    return testfs_rmtree(srv.dir);
}

#define NEED_SERVER()                                                                                                \
    do {                                                                                                             \
        if (srv.skip) {                                                                                              \
            print_message("%s\n", srv.skip);                                                                         \
            skip();                                                                                                  \
        }                                                                                                            \
    } while (0)

static struct config_dataset pg_cfg(const char *query, struct config_column *cols, size_t n)
{
    return (struct config_dataset){.name = "q", .kind = CONFIG_DATASET_SQL, .sql_connection = srv.conn,
                                   .sql_query = (char *)query, .sql_key = "id", .columns = cols, .n_columns = n,
                                   .on_error = CONFIG_ON_ERROR_FAIL};
}

static void open_fails(const struct config_dataset *cfg, const char *needle)
{
    open_fails_without(cfg, needle, PASSWORD);
}

/* How many times the server ran the fetch statement so far (its statement log). */
static int fetches(void)
{
    char path[128], line[4096];
    snprintf(path, sizeof path, "%s/server.log", srv.dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, "execute loaderd_fetch") != NULL;
    if (f)
        fclose(f);
    return n;
}

static void test_rows_in_blocks(void **state)
{
    NEED_SERVER();
    char err[LD_ERRMSG_MAX];
    make_db();
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = pg_cfg("SELECT id, payload, cls FROM rec WHERE id % 10 != 0", cols, 2);
    cfg.sql_version_query = "SELECT v FROM meta";
    dataset *d = open_ok(&cfg);
    /* What `loaderctl datasets` shows: the connection, its password hidden. */
    assert_null(strstr(d->source, PASSWORD));
    assert_non_null(strstr(d->source, "password=***"));
    assert_non_null(strstr(d->source, "user=loaderd"));
    assert_int_equal(d->count, 270);
    assert_true(d->fields[0].ragged);
    assert_int_equal(d->n_classes, 3);
    assert_string_equal(d->class_names[0], "ant");

    /* A worker's chunk, in shuffled order: one fetch for all of it. */
    uint64_t run[200];
    for (uint64_t k = 0; k < 200; k++)
        run[k] = (k * 89) % d->count;
    int before = fetches();
    d->ops->run_begin(d, run, 200);
    for (uint64_t k = 0; k < 200; k++)
        check_row(d, run[k], (int)(run[k] + run[k] / 9 + 1)); /* the i-th id that is no multiple of 10 */
    /* A substitute's read in the middle of the chunk (a sample not in it) is served too. */
    uint64_t other = 0;
    for (bool in = true; in; other += in) {
        in = false;
        for (uint64_t k = 0; k < 200; k++)
            in |= run[k] == other;
    }
    uint8_t buf[32];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    assert_int_equal(d->ops->read(d, other, dst, err), 0);
    check_blob(buf, dataset_item_bytes(d, other, 0), (int)(other + other / 9 + 1));
    d->ops->run_end(d);
    int used = fetches() - before;
    if (used < 1 || used > 2)
        fail_msg("200 samples and a substitute took %d fetches, expected 2", used);

    /* The cache's first pass: index order, in blocks. */
    before = fetches();
    for (uint64_t i = 0; i < d->count; i++) {
        uint64_t len;
        int64_t lab2;
        assert_int_equal(d->ops->read_raw(d, i, buf, sizeof buf, &len, &lab2, err), 0);
        check_blob(buf, len, (int)(i + i / 9 + 1));
    }
    assert_int_equal(fetches() - before, 1);

    /* The version query decides the fingerprint. */
    uint64_t fp1, fp2, fp3;
    if (d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp1, err) != 0)
        fail_msg("fingerprint: %s", err);
    PGconn *pg = PQconnectdb(srv.conn);
    sql_exec(pg, "UPDATE rec SET cls = 'ant' WHERE id = 1");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp2, err), 0);
    assert_true(fp1 == fp2);
    sql_exec(pg, "UPDATE meta SET v = 2");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp3, err), 0);
    assert_true(fp3 != fp1);

    /* Rows changed or deleted since open are bad samples that say so. */
    sql_exec(pg, "UPDATE rec SET payload = '\\x0102' WHERE id = 2; DELETE FROM rec WHERE id = 3");
    assert_int_equal(d->ops->read(d, 1, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "key 2): column 'payload' has 2 bytes, 22 at open"));
    assert_int_equal(d->ops->read(d, 2, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "key 3): no longer returned by the query"));
    sql_exec(pg, "DROP TABLE rec; DROP TABLE meta");
    PQfinish(pg);
    dataset_free(d);
}

static void test_typed_columns(void **state)
{
    NEED_SERVER();
    char err[LD_ERRMSG_MAX];
    make_db();
    /* Text keys; text served as bytes; bigint, numeric and real as numbers. */
    struct config_column cols[] = {{"code", CONFIG_COLUMN_BLOB}, {"n", CONFIG_COLUMN_INT64},
                                   {"amount", CONFIG_COLUMN_INT64}, {"score", CONFIG_COLUMN_FLOAT32},
                                   {"amount", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = pg_cfg("SELECT 'k' || lpad(id::text, 3, '0') AS id, lpad(id::text, 5, '0') AS code, n, "
                                       "amount, score FROM rec", cols, 5);
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, ROWS);
    assert_false(d->fields[0].ragged);
    assert_int_equal(d->fields[0].shape[0], 5);
    char code[8] = "";
    int64_t n, amount, label;
    float score;
    void *dst[5] = {code, &n, &amount, &score, &label};
    assert_int_equal(d->ops->read(d, 6, dst, err), 0);
    assert_memory_equal(code, "00007", 5);
    assert_int_equal(n, 70);
    assert_int_equal(amount, 21);
    assert_int_equal(label, 21);
    assert_true(score == 7 / 8.0f);
    assert_string_equal(dataset_sample_name(d, 6), "k007");
    dataset_free(d);
    /* A fractional numeric is no int64. */
    cfg.sql_query = "SELECT 'k' || id AS id, lpad(id::text, 5, '0') AS code, amount / 7 AS amount FROM rec";
    cfg.columns = (struct config_column[]){{"code", CONFIG_COLUMN_BLOB}, {"amount", CONFIG_COLUMN_INT64}};
    cfg.n_columns = 2;
    open_fails(&cfg, "column 'amount' is a float, expected an integer");
    PGconn *pg = PQconnectdb(srv.conn);
    sql_exec(pg, "DROP TABLE rec; DROP TABLE meta");
    PQfinish(pg);
}

static void test_refused(void **state)
{
    NEED_SERVER();
    make_db();
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = pg_cfg("SELECT id, payload, cls FROM nope", cols, 2);
    open_fails(&cfg, "relation \"nope\" does not exist");
    cfg.sql_query = "SELECT id, payload FROM rec";
    open_fails(&cfg, "column \"cls\" does not exist");
    cfg.sql_query = "SELECT id % 7 AS id, payload, cls FROM rec";
    open_fails(&cfg, "the key column 'id' is not unique");
    cfg.sql_query = "SELECT id, payload, cls FROM rec";
    char conn[300];
    snprintf(conn, sizeof conn, "host=%s dbname=postgres user=loaderd password=wrong-%s", srv.dir, PASSWORD);
    cfg.sql_connection = conn;
    open_fails(&cfg, "password authentication failed for user \"loaderd\"");
    snprintf(conn, sizeof conn, "host=%s/none dbname=postgres user=loaderd password=%s", srv.dir, PASSWORD);
    open_fails(&cfg, "none/.s.PGSQL.5432\" failed: No such file or directory");
    cfg.sql_connection = "no-such-service";
    open_fails(&cfg, "definition of service \"no-such-service\" not found");
    cfg.sql_connection = "host=/x bogus=1";
    open_fails(&cfg, "connection: invalid connection option \"bogus\"");
    /* A URI works too, its password hidden all the same. */
    snprintf(conn, sizeof conn, "postgresql://loaderd:%s@/postgres?host=%s", PASSWORD, srv.dir);
    cfg.sql_connection = conn;
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, ROWS);
    assert_null(strstr(d->source, PASSWORD));
    assert_non_null(strstr(d->source, "password=***"));
    dataset_free(d);
    PGconn *pg = PQconnectdb(srv.conn);
    sql_exec(pg, "DROP TABLE rec; DROP TABLE meta");
    PQfinish(pg);
}

/* The server goes away under an open dataset, then comes back. */
static void test_server_lost(void **state)
{
    NEED_SERVER();
    char err[LD_ERRMSG_MAX];
    make_db();
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = pg_cfg("SELECT id, payload, cls FROM rec", cols, 2);
    dataset *d = open_ok(&cfg);
    uint8_t buf[32];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    assert_int_equal(d->ops->read(d, 0, dst, err), 0);
    assert_int_equal(pg_script("stop"), 0);
    srv.up = false;
    int r = d->ops->read(d, 1, dst, err);
    if (r != LD_EDATASET || !strstr(err, "dataset 'q'") || !strstr(err, "could not connect again") ||
        strstr(err, PASSWORD))
        fail_msg("got %d '%s'", r, err);
    assert_int_equal(pg_script("up"), 0);
    srv.up = true;
    /* The pooled connection is reset and the read succeeds. */
    assert_int_equal(d->ops->read(d, 1, dst, err), 0);
    check_blob(buf, dataset_item_bytes(d, 1, 0), 2);
    dataset_free(d);
    PGconn *pg = PQconnectdb(srv.conn);
    sql_exec(pg, "DROP TABLE rec; DROP TABLE meta");
    PQfinish(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_in_blocks),
        cmocka_unit_test(test_typed_columns),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_server_lost),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
