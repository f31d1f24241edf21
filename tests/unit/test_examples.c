/* Unit tests for the files users copy from: the commented example configuration
 * (config/loaderd.yaml) must load through the daemon's own config loader, with the
 * datasets, cache sections and image pipeline it shows, so that the example cannot drift
 * from the schema. Run from the repository root (as scripts/run-tests.sh does). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "config.h"
#include "ld_error.h"
#include "proto.h"

static const struct config_dataset *find(const struct config *c, const char *name)
{
    for (size_t i = 0; i < c->n_datasets; i++)
        if (strcmp(c->datasets[i].name, name) == 0)
            return &c->datasets[i];
    return NULL;
}

static void test_example_config_loads(void **state)
{
    (void)state;
    struct config *c = NULL;
    char err[LD_ERRMSG_MAX] = "";
    int rc = config_load("config/loaderd.yaml", &c, err);
    if (rc != 0)
        fail_msg("config/loaderd.yaml: %s", err);
    assert_non_null(c);

    const struct config_dataset *records = find(c, "records");
    assert_non_null(records);
    assert_int_equal(records->kind, CONFIG_DATASET_FILES);
    assert_null(records->cache_path);

    const struct config_dataset *tokens = find(c, "tokens");
    assert_non_null(tokens);
    assert_int_equal(tokens->kind, CONFIG_DATASET_TOKEN_WINDOWS);
    assert_int_equal(tokens->context, 1024);

    /* The example shows a cache: section with every key. */
    const struct config_dataset *cached = find(c, "records_cached");
    assert_non_null(cached);
    assert_int_equal(cached->kind, CONFIG_DATASET_FILES);
    assert_non_null(cached->cache_path);
    assert_non_null(strstr(cached->cache_path, "records.ldcache"));
    assert_int_equal(cached->cache_mode, CONFIG_CACHE_AUTO);
    assert_int_equal(cached->on_error, CONFIG_ON_ERROR_REPLACE);

    /* ... and an image pipeline with its cache. */
    const struct config_dataset *images = find(c, "images");
    assert_non_null(images);
    assert_int_equal(images->kind, CONFIG_DATASET_IMAGE_FOLDER);
    assert_non_null(images->cache_path);
    assert_int_equal(images->n_transforms, 5);
    config_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_config_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
