/* sql_fixtures — what the `sql` kind's unit tests (test_sql.c on SQLite, test_sql_pg.c
 * on PostgreSQL) share: both fill a table rec whose row `id` has a payload of
 * 20 + id % 7 bytes testfs_byte(id, j), and open it as dataset 'q'. Include after
 * <cmocka.h>; everything here is static. */
#ifndef LD_SQL_FIXTURES_H
#define LD_SQL_FIXTURES_H

#include <string.h>

#include "dataset.h"
#include "ld_error.h"
#include "testfs.h"

static inline dataset *open_ok(const struct config_dataset *cfg)
{
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = NULL;
    if (dataset_open(cfg, &d, err) != 0)
        fail_msg("dataset_open: %s", err);
    return d;
}

/* Opening cfg fails with LD_EDATASET and a message that names dataset 'q', holds needle
 * and never `secret` (may be NULL). */
static inline void open_fails_without(const struct config_dataset *cfg, const char *needle, const char *secret)
{
    char err[LD_ERRMSG_MAX] = "";
    dataset *d = (dataset *)0x1;
    int r = dataset_open(cfg, &d, err);
    if (r != LD_EDATASET || !strstr(err, needle) || !strstr(err, "dataset 'q'") || (secret && strstr(err, secret)))
        fail_msg("got %d '%s', expected '%s'", r, err, needle);
    assert_ptr_equal(d, (dataset *)0x1);
}

/* The payload of row `id`. */
static inline void check_blob(const uint8_t *b, uint64_t len, int id)
{
    assert_int_equal(len, 20 + id % 7);
    for (uint64_t j = 0; j < len; j++)
        assert_int_equal(b[j], testfs_byte((unsigned)id, j));
}

/* Sample i of a dataset of (payload, class name) is row `id`: its payload, and its label
 * the rank of its class (id % 3: 0 zebra, 1 ant, 2 mole; sorted ant, mole, zebra). */
static inline void check_row(const dataset *d, uint64_t i, int id)
{
    char err[LD_ERRMSG_MAX];
    uint8_t buf[32];
    int64_t lab;
    void *dst[2] = {buf, &lab};
    if (d->ops->read(d, i, dst, err) != 0)
        fail_msg("sample %llu: %s", (unsigned long long)i, err);
    check_blob(buf, dataset_item_bytes(d, i, 0), id);
    assert_int_equal(lab, id % 3 == 0 ? 2 : id % 3 == 1 ? 0 : 1);
}

#endif
