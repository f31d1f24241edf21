/* Unit tests for source_sql: a real SQLite database written here through libsqlite3,
 * opened as an `sql` dataset: samples in key order with their blobs (fixed and
 * ragged), labels (integers and class names) and numbers; the first pass's range reads
 * give the same bytes as reads by key; the fingerprint follows the row count or the
 * version query; bad queries, NULLs, duplicate keys and a missing database are refused
 * with the database's message; rows changed or deleted after open are bad samples; the
 * database file removed under an open dataset; readers on four threads at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sql_fixtures.h"
#include "testfs.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset.h"
#include "ld_error.h"

struct tdir {
    char root[256];
    char db[300];
};

static int setup(void **state)
{
    struct tdir *t = calloc(1, sizeof *t);
    if (testfs_mkdtemp("ld-test-sql", t->root, sizeof t->root) < 0) {
        free(t);
        return -1;
    }
    snprintf(t->db, sizeof t->db, "%s/d.db", t->root);
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    struct tdir *t = *state;
    int r = testfs_rmtree(t->root);
    free(t);
    return r;
}

static void exec(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    char *err = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    if (sqlite3_exec(h, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err);
    sqlite3_close(h);
}

/* 60 rows, ids inserted out of order; payload of id i: 20 + i % 7 bytes testfs_byte(i). */
#define ROWS 60
static void make_db(const char *db)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "CREATE TABLE rec(id INTEGER PRIMARY KEY, payload BLOB, cls TEXT, n INTEGER,"
                                     " score REAL); CREATE TABLE meta(v INTEGER); INSERT INTO meta VALUES (1);",
                                  NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, "INSERT INTO rec VALUES (?, ?, ?, ?, ?)", -1, &st, NULL), SQLITE_OK);
    for (int k = 0; k < ROWS; k++) {
        int id = (k * 37) % ROWS + 1; /* 37 is prime to 60: every id once */
        uint8_t blob[32];
        size_t len = 20 + (size_t)id % 7;
        for (size_t j = 0; j < len; j++)
            blob[j] = testfs_byte((unsigned)id, j);
        sqlite3_bind_int(st, 1, id);
        sqlite3_bind_blob(st, 2, blob, (int)len, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 3, id % 3 == 0 ? "zebra" : id % 3 == 1 ? "ant" : "mole", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, id * 10);
        sqlite3_bind_double(st, 5, id / 8.0);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
}

static struct config_dataset sql_cfg(struct tdir *t, const char *query, struct config_column *cols, size_t n)
{
    return (struct config_dataset){.name = "q", .kind = CONFIG_DATASET_SQL, .path = t->db, .sql_query = (char *)query,
                                   .sql_key = "id", .columns = cols, .n_columns = n,
                                   .on_error = CONFIG_ON_ERROR_FAIL};
}

static void open_fails(const struct config_dataset *cfg, const char *needle)
{
    open_fails_without(cfg, needle, NULL);
}

static void test_rows_as_samples(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX];
    make_db(t->db);
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = sql_cfg(t, "SELECT id, payload, cls FROM rec WHERE id % 10 != 0", cols, 2);
    dataset *d = open_ok(&cfg);
    assert_string_equal(dataset_kind(d), "sql");
    assert_int_equal(d->count, 54);
    assert_true(d->fields[0].ragged);
    assert_int_equal(d->fields[0].max_item_bytes, 26);
    assert_string_equal(d->fields[1].name, "label");
    assert_int_equal(d->n_classes, 3);
    assert_string_equal(d->class_names[0], "ant");
    assert_string_equal(d->class_names[2], "zebra");
    assert_non_null(d->ops->fingerprint);

    /* Key order: sample i is the i-th id that the WHERE keeps. */
    int id = 0;
    for (uint64_t i = 0; i < d->count; i++) {
        do
            id++;
        while (id % 10 == 0);
        check_row(d, i, id);
        /* The first pass's range reads: the same bytes, the same label. */
        uint8_t buf[32];
        int64_t lab = id % 3 == 0 ? 2 : id % 3 == 1 ? 0 : 1;
        uint64_t len;
        int64_t lab2;
        memset(buf, 0, sizeof buf);
        assert_int_equal(d->ops->read_raw(d, i, buf, sizeof buf, &len, &lab2, err), 0);
        check_blob(buf, len, id);
        assert_int_equal(lab2, lab);
    }
    /* Reads out of order after the range reads, from the same pooled connection. */
    uint8_t buf[32];
    uint64_t len;
    int64_t lab;
    assert_int_equal(d->ops->read_raw(d, 3, buf, sizeof buf, &len, &lab, err), 0);
    check_blob(buf, len, 4);
    assert_int_equal(d->ops->read_raw(d, 3, buf, 8, &len, &lab, err), LD_ERANGE);

    /* The fingerprint: the query's text and its row count. An update keeps it, an insert
     * (a row the query returns) changes it. */
    uint64_t fp1, fp2, fp3;
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp1, err), 0);
    exec(t->db, "UPDATE rec SET cls = 'ant' WHERE id = 1");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp2, err), 0);
    assert_true(fp1 == fp2);
    exec(t->db, "INSERT INTO rec VALUES (99, x'00', 'ant', 1, 1.0)");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp3, err), 0);
    assert_true(fp3 != fp1);

    /* A row changed or deleted since open is a bad sample that says so. */
    exec(t->db, "UPDATE rec SET payload = x'0102' WHERE id = 2; DELETE FROM rec WHERE id = 3");
    uint8_t b2[32];
    void *dst[2] = {b2, &lab};
    assert_int_equal(d->ops->read(d, 1, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "key 2"));
    assert_non_null(strstr(err, "has 2 bytes, 22 at open"));
    assert_int_equal(d->ops->read(d, 2, dst, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "key 3): no longer returned by the query"));
    /* ... and under on_error: replace another row takes its place. */
    dataset_free(d);
    cfg.on_error = CONFIG_ON_ERROR_REPLACE;
    exec(t->db, "DELETE FROM rec WHERE id = 99");
    d = open_ok(&cfg);
    exec(t->db, "DELETE FROM rec WHERE id = 5");
    uint64_t want = dataset_item_bytes(d, 3, 0);
    uint64_t lens[2] = {want, 0};
    int r = dataset_read(d, 3, NULL, dst, lens, err);
    assert_true(r == LD_ESTALE || r == 0);
    if (r == LD_ESTALE) {
        lens[0] = dataset_item_bytes(d, 3, 0);
        assert_int_equal(dataset_read(d, 3, NULL, dst, lens, err), 0);
    }
    assert_int_equal(atomic_load(&d->bad_samples), 1);
    dataset_free(d);
}

static void test_numbers_and_version(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX];
    make_db(t->db);
    /* Text keys; a fixed-length blob (text served as bytes); numbers; a version query. */
    struct config_column cols[] = {{"code", CONFIG_COLUMN_BLOB}, {"n", CONFIG_COLUMN_INT64},
                                   {"score", CONFIG_COLUMN_FLOAT32}};
    struct config_dataset cfg = sql_cfg(t, "SELECT printf('k%03d', id) AS id, printf('%05d', id) AS code, n, score "
                                           "FROM rec", cols, 3);
    cfg.sql_version_query = "SELECT v FROM meta";
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, ROWS);
    assert_false(d->fields[0].ragged);
    assert_int_equal(d->fields[0].shape[0], 5);
    assert_int_equal(d->fields[1].dtype, LD_DTYPE_INT64);
    assert_int_equal(d->fields[2].dtype, LD_DTYPE_FLOAT32);
    assert_null(d->ops->fingerprint); /* numbers besides the blob: the cache could not hold them */
    char code[8] = "";
    int64_t n;
    float score;
    void *dst[3] = {code, &n, &score};
    assert_int_equal(d->ops->read(d, 6, dst, err), 0);
    assert_memory_equal(code, "00007", 5);
    assert_int_equal(n, 70);
    assert_true(score == 7 / 8.0f);
    dataset_free(d);
    /* The version query decides the fingerprint; a cache is refused for more than blob + label. */
    struct config_column two[] = {{"code", CONFIG_COLUMN_BLOB}, {"n", CONFIG_COLUMN_LABEL}};
    cfg.columns = two;
    cfg.n_columns = 2;
    d = open_ok(&cfg);
    uint64_t fp1, fp2, fp3;
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp1, err), 0);
    exec(t->db, "INSERT INTO rec VALUES (100, x'00', 'ant', 1, 1.0)");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp2, err), 0);
    assert_true(fp1 == fp2); /* the version says nothing changed */
    exec(t->db, "UPDATE meta SET v = 2");
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_STAT, &fp3, err), 0);
    assert_true(fp3 != fp1);
    dataset_free(d);
    cfg.columns = cols;
    cfg.n_columns = 3;
    cfg.cache_path = "/nonexistent/q.ldc";
    open_fails(&cfg, "a cache holds one blob column and a label");
}

/* Text keys that the query's collation orders otherwise than their bytes: samples are
 * numbered by the bytes all the same (a server's collation must not reorder them). */
static void test_key_order_is_bytes(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX];
    make_db(t->db);
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"n", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = sql_cfg(t, "SELECT printf('%s%03d', CASE WHEN id % 2 THEN 'a' ELSE 'B' END, id) "
                                           "COLLATE NOCASE AS id, payload, n FROM rec", cols, 2);
    dataset *d = open_ok(&cfg);
    assert_int_equal(d->count, ROWS);
    /* 'B002' ... 'B060' first, then 'a001' ... 'a059'. */
    for (uint64_t i = 0; i < d->count; i++) {
        int id = i < ROWS / 2 ? 2 * (int)i + 2 : 2 * (int)(i - ROWS / 2) + 1;
        char name[16];
        snprintf(name, sizeof name, "%c%03d", id % 2 ? 'a' : 'B', id);
        assert_string_equal(dataset_sample_name(d, i), name);
        uint8_t buf[32];
        int64_t lab;
        void *dst[2] = {buf, &lab};
        assert_int_equal(d->ops->read(d, i, dst, err), 0);
        check_blob(buf, dataset_item_bytes(d, i, 0), id);
        assert_int_equal(lab, id * 10);
    }
    dataset_free(d);
}

static void test_refused(void **state)
{
    struct tdir *t = *state;
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = sql_cfg(t, "SELECT id, payload, cls FROM rec", cols, 2);
    open_fails(&cfg, "cannot open the database");
    make_db(t->db);
    cfg.sql_query = "SELECT id, payload, cls FROM nope";
    open_fails(&cfg, "no such table: nope");
    cfg.sql_query = "SELECT id % 7 AS id, payload, cls FROM rec";
    open_fails(&cfg, "the key column 'id' is not unique");
    cfg.sql_query = "SELECT id, NULL AS payload, cls FROM rec";
    open_fails(&cfg, "column 'payload' is NULL, expected a blob or text");
    cfg.sql_query = "SELECT id, payload, 1.5 AS cls FROM rec";
    open_fails(&cfg, "column 'cls' is a float, expected an integer or a class name");
    cfg.sql_query = "SELECT id, payload, cls FROM rec WHERE id > 1000";
    open_fails(&cfg, "the query returns no row");
    cfg.sql_query = "SELECT id, payload FROM rec";
    open_fails(&cfg, "no such column");
}

static void test_database_removed(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX];
    make_db(t->db);
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = sql_cfg(t, "SELECT id, payload, cls FROM rec", cols, 2);
    dataset *d = open_ok(&cfg);
    assert_int_equal(unlink(t->db), 0);
    /* The open connection still reads the file it opened; a new one (the fingerprint's,
     * while the pooled one is busy, or after it) says what is wrong. */
    uint8_t buf[32];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    assert_int_equal(d->ops->read(d, 0, dst, err), 0);
    check_blob(buf, dataset_item_bytes(d, 0, 0), 1);
    dataset_free(d);
    char e2[LD_ERRMSG_MAX];
    d = (dataset *)0x1;
    assert_int_equal(dataset_open(&cfg, &d, e2), LD_EDATASET);
    assert_non_null(strstr(e2, "dataset 'q': cannot open the database"));
}

/* Readers on several threads share the connection pool: each gets its own connection
 * (or a pooled one) and the same bytes, by key, in the cache's blocks and in blocks of
 * an announced chunk; run under TSan by make test. */
struct reader {
    const dataset *d;
    int bad;
};

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    const dataset *d = rd->d;
    char err[LD_ERRMSG_MAX];
    uint64_t run[ROWS];
    for (int round = 0; round < 4; round++) {
        /* Round 3 announces its reads as a worker's chunk does (run_begin .. run_end). */
        for (uint64_t i = 0; i < d->count && i < ROWS; i++)
            run[i] = (i * 7 + (uint64_t)round) % d->count;
        if (round == 3)
            d->ops->run_begin(d, run, d->count);
        for (uint64_t i = 0; i < d->count; i++) {
            uint64_t k = run[i];
            uint8_t buf[32];
            int64_t lab;
            void *dst[2] = {buf, &lab};
            uint64_t len = 0;
            int r = round == 1 ? d->ops->read_raw(d, k, buf, sizeof buf, &len, &lab, err) : d->ops->read(d, k, dst, err);
            if (r != 0) {
                rd->bad++;
                continue;
            }
            int id = (int)k + 1;
            for (uint64_t j = 0; j < (uint64_t)(20 + id % 7); j++)
                rd->bad += buf[j] != testfs_byte((unsigned)id, j);
        }
        if (round == 3)
            d->ops->run_end(d);
    }
    return NULL;
}

static void test_concurrent_reads(void **state)
{
    struct tdir *t = *state;
    make_db(t->db);
    struct config_column cols[] = {{"payload", CONFIG_COLUMN_BLOB}, {"cls", CONFIG_COLUMN_LABEL}};
    struct config_dataset cfg = sql_cfg(t, "SELECT id, payload, cls FROM rec", cols, 2);
    dataset *d = open_ok(&cfg);
    pthread_t th[4];
    struct reader rd[4];
    for (int i = 0; i < 4; i++) {
        rd[i] = (struct reader){.d = d};
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &rd[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(rd[i].bad, 0);
    }
    dataset_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rows_as_samples, setup, teardown),
        cmocka_unit_test_setup_teardown(test_numbers_and_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_order_is_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_database_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_reads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
