/* config_diff — compares the running config with one loaded again for a reload
 * (server_reload.c): a dataset whose definition is the same keeps its open dataset and
 * its streams; a restart-only server key that changed is reported and keeps its
 * running value. Positions in the file are not part of a definition: moving a dataset
 * in the file, or adding a comment above it, changes nothing. */
#include "config_diff.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sizeof(struct config_dataset) on x86-64 when config_dataset_same was last brought up
 * to date with it. */
#define CONFIG_DIFF_DATASET_SIZE 552

static bool config_diff_str_same(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

static bool config_diff_transform_same(const struct transform_spec *a, const struct transform_spec *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == TRANSFORM_PLUGIN)
        return config_diff_str_same(a->plugin.path, b->plugin.path) &&
               config_diff_str_same(a->plugin.params_json, b->plugin.params_json);
    /* The other kinds hold numbers only, in specs the config zeroes before it fills them. */
    return memcmp(a, b, sizeof *a) == 0;
}

/* A member added to struct config_dataset must be compared above, or a reload would keep
 * the old definition of a dataset whose new key changed: this fails the build until it is
 * (then update the size). */
#if UINTPTR_MAX == 0xffffffffffffffffu && defined(__x86_64__)
_Static_assert(sizeof(struct config_dataset) == CONFIG_DIFF_DATASET_SIZE,
               "struct config_dataset changed: compare the new member in config_dataset_same, then update "
               "CONFIG_DIFF_DATASET_SIZE");
#endif

bool config_dataset_same(const struct config_dataset *a, const struct config_dataset *b)
{
    if (!config_diff_str_same(a->name, b->name) || a->kind != b->kind || !config_diff_str_same(a->path, b->path) ||
        !config_diff_str_same(a->pattern, b->pattern) || a->format != b->format ||
        a->token_dtype != b->token_dtype || a->context != b->context || a->stride != b->stride ||
        !config_diff_str_same(a->cache_path, b->cache_path) || a->cache_mode != b->cache_mode ||
        a->cache_fingerprint != b->cache_fingerprint || a->on_error != b->on_error ||
        a->on_error_warn_fraction != b->on_error_warn_fraction || a->follow_links != b->follow_links ||
        a->max_sample_bytes != b->max_sample_bytes || a->read_timeout != b->read_timeout ||
        a->read_ahead != b->read_ahead ||
        a->n_transforms != b->n_transforms || a->weight != b->weight || a->max_share != b->max_share ||
        !config_diff_str_same(a->manifest_path, b->manifest_path) || a->manifest_format != b->manifest_format ||
        a->n_columns != b->n_columns || !config_diff_str_same(a->sql_query, b->sql_query) ||
        !config_diff_str_same(a->sql_key, b->sql_key) || !config_diff_str_same(a->sql_connection, b->sql_connection) ||
        !config_diff_str_same(a->sql_version_query, b->sql_version_query) ||
        !config_diff_str_same(a->index_path, b->index_path))
        return false;
    if (!config_diff_str_same(a->s3_endpoint, b->s3_endpoint) || !config_diff_str_same(a->s3_region, b->s3_region) ||
        a->s3_addressing != b->s3_addressing || !config_diff_str_same(a->s3_profile, b->s3_profile) ||
        !config_diff_str_same(a->s3_credentials_file, b->s3_credentials_file) || a->s3_part_size != b->s3_part_size ||
        a->s3_parallel != b->s3_parallel || a->s3_retries != b->s3_retries || a->s3_timeout != b->s3_timeout ||
        a->s3_connect_timeout != b->s3_connect_timeout || a->s3_list_ttl != b->s3_list_ttl)
        return false;
    for (size_t k = 0; k < a->n_columns; k++)
        if (!config_diff_str_same(a->columns[k].name, b->columns[k].name) || a->columns[k].type != b->columns[k].type)
            return false;
    for (size_t t = 0; t < a->n_transforms; t++)
        if (!config_diff_transform_same(&a->transforms[t], &b->transforms[t]))
            return false;
    return true;
}

/* One string key: reported when it differs, then the loaded config takes a copy of the
 * running value (kept as it was when memory is short: the report stands). */
static int config_diff_str_key(const char *key, const char *running, char **loaded,
                               void (*fn)(void *, const char *, const char *, const char *), void *ctx)
{
    if (config_diff_str_same(running, *loaded))
        return 0;
    fn(ctx, key, running ? running : "(none)", *loaded ? *loaded : "(none)");
    char *copy = running ? strdup(running) : NULL;
    if (!running || copy) {
        free(*loaded);
        *loaded = copy;
    }
    return 1;
}

int config_diff_restart_keys(const struct config *running, struct config *loaded,
                             void (*fn)(void *ctx, const char *key, const char *running_value,
                                        const char *loaded_value),
                             void *ctx)
{
    int n = 0;
    n += config_diff_str_key("server.socket", running->socket_path, &loaded->socket_path, fn, ctx);
    n += config_diff_str_key("server.socket_group", running->socket_group, &loaded->socket_group, fn, ctx);
    n += config_diff_str_key("server.metrics.listen", running->metrics_listen, &loaded->metrics_listen, fn, ctx);
    if (running->workers != loaded->workers) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%" PRIu32, running->workers);
        snprintf(b, sizeof b, "%" PRIu32, loaded->workers);
        fn(ctx, "server.workers", a, b);
        loaded->workers = running->workers;
        n++;
    }
    return n;
}
