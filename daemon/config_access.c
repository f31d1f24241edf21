/* config_access — the `access:` section of the config (access.h): who may connect, who
 * may run operator commands, and who may open streams on which dataset.
 *
 *     access:
 *       connect:   {users: [alice, 1001], groups: [trainers]}
 *       operators: {users: [ops], groups: [loaderd-admin]}
 *       datasets:
 *         imagenet: {groups: [vision]}
 *       declare:
 *         - {groups: [vision], roots: [/data/vision], caches: true,
 *            cache_dir: /var/cache/loaderd/declared, cache_quota: 200GiB}
 *         - {users: [alice], roots: [/home/alice/data], plugins: true}
 *
 * Users and groups are names or numbers; names are resolved when the config loads, so
 * that a typo fails at start rather than never matching. A dataset named under
 * access.datasets must be one the config defines (checked once every section is read,
 * whatever their order in the file).
 *
 * access.declare is a list of grants (one mapping counts as a list of one): who may
 * open streams on datasets they declare beneath which roots, with a cache or a
 * transform plug-in or not (both default to false). An entry with caches: true names
 * the directory the daemon writes them in (cache_dir, absolute) and the bytes of caches
 * each user may keep there (cache_quota); both are required then, and refused
 * without it, so that a grant says in one place what it gives. An entry without users or groups
 * grants everyone who may connect. Roots are absolute directories, kept without a
 * trailing slash; "." and ".." are refused so that a root is what it says. */
#include "config_access.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_yaml.h"
#include "declare_cache.h"
#include "ld_error.h"
#include "proto.h"

static int config_access_oom(const struct config_loader *l)
{
    ld_errorf(l->errbuf, "%s: out of memory", l->file);
    return LD_ENOMEM;
}

/* One id of a users or groups list: a number, or a name this machine knows. */
static int config_access_id(const struct config_loader *l, const yaml_node_t *v, const char *where, bool group,
                            uint32_t *ret)
{
    int rc = 0;
    const char *text = config_yaml_text(l, v, where, &rc);
    if (!text)
        return rc;
    int64_t id;
    if (config_yaml_parse_int(text, &id)) {
        if (id < 0 || id > (int64_t)UINT32_MAX - 1)
            return config_yaml_fail(l, v->start_mark, "%s: %s %s is out of range", where, group ? "gid" : "uid", text);
        *ret = (uint32_t)id;
        return 0;
    }
    char buf[4096];
    if (group) {
        struct group gr, *found = NULL;
        if (getgrnam_r(text, &gr, buf, sizeof buf, &found) != 0 || !found)
            return config_yaml_fail(l, v->start_mark, "%s: no group named '%s' (give a group name or a gid)", where,
                                    text);
        *ret = (uint32_t)found->gr_gid;
    } else {
        struct passwd pw, *found = NULL;
        if (getpwnam_r(text, &pw, buf, sizeof buf, &found) != 0 || !found)
            return config_yaml_fail(l, v->start_mark, "%s: no user named '%s' (give a user name or a uid)", where,
                                    text);
        *ret = (uint32_t)found->pw_uid;
    }
    return 0;
}

/* Reads one item of a list into ret (config_access_list). */
typedef int (*config_access_item_fn)(const struct config_loader *l, const yaml_node_t *v, const char *where,
                                     const void *ctx, void *ret);

/* A list of at most ACCESS_MAX_IDS items of `size` bytes each, read by fn (a single
 * scalar counts as a list of one, null as an empty one); `expected` names the items for
 * the message of a wrong type. */
static int config_access_list(const struct config_loader *l, const yaml_node_t *v, const char *where,
                              const char *expected, size_t size, config_access_item_fn fn, const void *ctx,
                              void **ret_items, size_t *ret_n)
{
    char got[80], at[LD_NAME_MAX + 96];
    if (config_yaml_is_null(v))
        return 0;
    bool one = v->type == YAML_SCALAR_NODE;
    if (!one && v->type != YAML_SEQUENCE_NODE)
        return config_yaml_fail(l, v->start_mark, "%s: expected a list of %s, got %s", where, expected,
                                config_yaml_describe(v, got, sizeof got));
    size_t n = one ? 1 : (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > ACCESS_MAX_IDS)
        return config_yaml_fail(l, v->start_mark, "%s: more than %d entries", where, ACCESS_MAX_IDS);
    if (!(*ret_items = calloc(n ? n : 1, size)))
        return config_access_oom(l);
    for (size_t i = 0; i < n; i++) {
        snprintf(at, sizeof at, "%s[%zu]", where, i);
        int rc = fn(l, one ? v : config_yaml_node(l, v->data.sequence.items.start[i]), one ? where : at, ctx,
                    (char *)*ret_items + i * size);
        if (rc < 0)
            return rc;
        (*ret_n)++;
    }
    return 0;
}

static int config_access_id_item(const struct config_loader *l, const yaml_node_t *v, const char *where,
                                 const void *ctx, void *ret)
{
    return config_access_id(l, v, where, *(const bool *)ctx, ret);
}

/* A users or groups list. */
static int config_access_ids(const struct config_loader *l, const yaml_node_t *v, const char *where, bool group,
                             uint32_t **ret_ids, size_t *ret_n)
{
    void *items = NULL;
    int rc = config_access_list(l, v, where, group ? "group names or numbers" : "user names or numbers",
                                sizeof **ret_ids, config_access_id_item, &group, &items, ret_n);
    *ret_ids = items; /* also on failure: the caller's clear frees it */
    return rc;
}

/* The key `name` of a rule's mapping: 1 when it is users or groups (read into r), 0
 * when it is another, or an error. */
static int config_access_rule_key(const struct config_loader *l, const char *name, const yaml_node_t *val,
                                  const char *at, struct access_rule *r)
{
    int rc;
    if (strcmp(name, "users") == 0)
        rc = config_access_ids(l, val, at, false, &r->uids, &r->n_uids);
    else if (strcmp(name, "groups") == 0)
        rc = config_access_ids(l, val, at, true, &r->gids, &r->n_gids);
    else
        return 0;
    return rc < 0 ? rc : 1;
}

/* A rule: {users: [...], groups: [...]}. Present means set, even when both are empty
 * (then only root and the daemon's user pass). */
static int config_access_rule(const struct config_loader *l, const yaml_node_t *v, const char *where,
                              struct access_rule *r)
{
    char got[80], at[LD_NAME_MAX + 64];
    int rc;
    r->set = true;
    if (config_yaml_is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "%s: expected a mapping with users and groups, got %s", where,
                                config_yaml_describe(v, got, sizeof got));
    for (const yaml_node_pair_t *pair = v->data.mapping.pairs.start; pair < v->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = config_yaml_node(l, pair->key), *val = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((rc = config_yaml_key_text(l, k, where, &name)) < 0 ||
            (rc = config_yaml_check_duplicate(l, v, pair, name, "", "key")) < 0)
            return rc;
        snprintf(at, sizeof at, "%s.%s", where, name);
        if ((rc = config_access_rule_key(l, name, val, at, r)) == 0)
            rc = config_yaml_fail(l, k->start_mark, "%s: unknown key '%s' (expected users or groups)", where, name);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* One root of access.declare: absolute, no "." or ".." component, not "/" itself;
 * repeated slashes and a trailing one are dropped. */
static int config_access_root(const struct config_loader *l, const yaml_node_t *v, const char *where, char **ret)
{
    int rc = 0;
    const char *text = config_yaml_text(l, v, where, &rc);
    if (!text)
        return rc;
    if (text[0] != '/')
        return config_yaml_fail(l, v->start_mark, "%s: expected an absolute directory, got '%s'", where, text);
    char *out = malloc(strlen(text) + 1);
    if (!out)
        return config_access_oom(l);
    size_t n = 0;
    for (const char *p = text; *p;) {
        while (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if (!len)
            break;
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) {
            free(out);
            return config_yaml_fail(l, v->start_mark, "%s: '%s' has a '%.*s' component: write the directory "
                                    "itself", where, text, (int)len, p);
        }
        out[n++] = '/';
        memcpy(out + n, p, len);
        n += len;
        p += len;
    }
    out[n] = '\0';
    if (!n) {
        free(out);
        return config_yaml_fail(l, v->start_mark, "%s: '/' cannot be a root: name the directories trainers "
                                "may declare datasets in", where);
    }
    *ret = out;
    return 0;
}

static int config_access_root_item(const struct config_loader *l, const yaml_node_t *v, const char *where,
                                   const void *ctx, void *ret)
{
    (void)ctx;
    return config_access_root(l, v, where, ret);
}

/* One grant of access.declare: {users, groups, roots, caches, cache_dir, cache_quota,
 * plugins}. */
static int config_access_declare_entry(const struct config_loader *l, const yaml_node_t *v, const char *where,
                                       struct access_declare *e)
{
    char got[80], at[LD_NAME_MAX + 32];
    int rc;
    e->line = (int)v->start_mark.line + 1;
    e->column = (int)v->start_mark.column + 1;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "%s: expected a mapping with roots (and users, groups, caches, "
                                "cache_dir, cache_quota, plugins), got %s", where,
                                config_yaml_describe(v, got, sizeof got));
    bool have_roots = false, have_quota = false;
    const yaml_node_t *cache_key = NULL, *cache_val = NULL;
    for (const yaml_node_pair_t *pair = v->data.mapping.pairs.start; pair < v->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = config_yaml_node(l, pair->key), *val = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((rc = config_yaml_key_text(l, k, where, &name)) < 0 ||
            (rc = config_yaml_check_duplicate(l, v, pair, name, "", "key")) < 0)
            return rc;
        snprintf(at, sizeof at, "%s.%s", where, name);
        if ((rc = config_access_rule_key(l, name, val, at, &e->rule)) != 0) {
            e->rule.set = true; /* a grant names whom it is for, or is everyone's */
        } else if (strcmp(name, "roots") == 0) {
            have_roots = true;
            void *items = NULL;
            rc = config_access_list(l, val, at, "directories", sizeof *e->roots, config_access_root_item, NULL,
                                    &items, &e->n_roots);
            e->roots = items;
        } else if (strcmp(name, "caches") == 0) {
            rc = config_yaml_bool(l, val, at, &e->caches);
        } else if (strcmp(name, "cache_dir") == 0) {
            cache_key = k;
            cache_val = val;
            rc = config_access_root(l, val, at, &e->cache_dir);
        } else if (strcmp(name, "cache_quota") == 0) {
            const char *text = config_yaml_text(l, val, at, &rc);
            int64_t bytes = 0;
            if (text && (!config_yaml_parse_size(text, &bytes) || bytes <= 0))
                rc = config_yaml_fail(l, val->start_mark, "%s: expected a size in bytes above 0 (e.g. 200GiB), "
                                      "got '%s'", at, text);
            e->cache_quota = (uint64_t)bytes;
            have_quota = true;
        } else if (strcmp(name, "plugins") == 0) {
            rc = config_yaml_bool(l, val, at, &e->plugins);
        } else {
            rc = config_yaml_fail(l, k->start_mark, "%s: unknown key '%s' (expected users, groups, roots, caches, "
                                  "cache_dir, cache_quota or plugins)", where, name);
        }
        if (rc < 0)
            return rc;
    }
    if (!have_roots || !e->n_roots)
        return config_yaml_fail(l, v->start_mark, "%s: missing required key 'roots' (the directories trainers "
                                "may declare datasets in)", where);
    if (e->caches && (!e->cache_dir || !have_quota))
        return config_yaml_fail(l, v->start_mark, "%s: caches: true needs cache_dir (the directory the daemon "
                                "writes declared caches in, one subdirectory per user) and cache_quota (the bytes "
                                "of caches each user may keep there)", where);
    if (!e->caches && (e->cache_dir || have_quota))
        return config_yaml_fail(l, cache_key ? cache_key->start_mark : v->start_mark, "%s: cache_dir and "
                                "cache_quota belong to a grant with caches: true", where);
    /* A cache_dir that exists must be the daemon's and closed to others' writes now,
     * not at a trainer's first cache; a missing one is created (mode 0700) then. */
    struct stat st;
    if (e->caches && lstat(e->cache_dir, &st) == 0) {
        char why[LD_ERRMSG_MAX];
        int fd = -1;
        if (declare_cache_open_dir(e->cache_dir, &fd, why, sizeof why) < 0)
            return config_yaml_fail(l, cache_val->start_mark, "%s.cache_dir: '%s' %s", where, e->cache_dir, why);
        close(fd);
    }
    return 0;
}

static int config_access_declare(const struct config_loader *l, const yaml_node_t *v, struct access_config *a)
{
    char at[64];
    if (config_yaml_is_null(v))
        return 0;
    bool one = v->type != YAML_SEQUENCE_NODE;
    size_t n = one ? 1 : (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > ACCESS_MAX_IDS)
        return config_yaml_fail(l, v->start_mark, "access.declare: more than %d entries", ACCESS_MAX_IDS);
    if (!(a->declare = calloc(n ? n : 1, sizeof *a->declare)))
        return config_access_oom(l);
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *e = one ? v : config_yaml_node(l, v->data.sequence.items.start[i]);
        if (one)
            snprintf(at, sizeof at, "access.declare");
        else
            snprintf(at, sizeof at, "access.declare[%zu]", i);
        a->n_declare++;
        int rc = config_access_declare_entry(l, e, at, &a->declare[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int config_access_datasets(const struct config_loader *l, const yaml_node_t *v, struct access_config *a)
{
    char got[80], at[LD_NAME_MAX + 64];
    int rc;
    if (config_yaml_is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "access.datasets: expected a mapping of dataset name to "
                                "{users, groups}, got %s", config_yaml_describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (!(a->datasets = calloc(n ? n : 1, sizeof *a->datasets)))
        return config_access_oom(l);
    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = config_yaml_node(l, pair->key);
        const char *name = NULL;
        if ((rc = config_yaml_key_text(l, k, "access.datasets", &name)) < 0 ||
            (rc = config_yaml_check_duplicate(l, v, pair, name, "access.datasets: ", "dataset")) < 0)
            return rc;
        struct access_dataset_rule *d = &a->datasets[a->n_datasets];
        if (!(d->dataset = strdup(name)))
            return config_access_oom(l);
        a->n_datasets++;
        d->line = (int)k->start_mark.line + 1;
        d->column = (int)k->start_mark.column + 1;
        snprintf(at, sizeof at, "access.datasets.%.*s", LD_NAME_MAX - 1, name);
        if ((rc = config_access_rule(l, config_yaml_node(l, pair->value), at, &d->rule)) < 0)
            return rc;
    }
    return 0;
}

int config_access_load(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                       struct access_config *a)
{
    char got[80];
    int rc;
    (void)key;
    if (config_yaml_is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, v->start_mark, "access: expected a mapping (connect, operators, datasets, "
                                "declare), got %s",
                                config_yaml_describe(v, got, sizeof got));
    for (const yaml_node_pair_t *pair = v->data.mapping.pairs.start; pair < v->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = config_yaml_node(l, pair->key), *val = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((rc = config_yaml_key_text(l, k, "access", &name)) < 0 ||
            (rc = config_yaml_check_duplicate(l, v, pair, name, "access: ", "key")) < 0)
            return rc;
        if (strcmp(name, "connect") == 0)
            rc = config_access_rule(l, val, "access.connect", &a->connect);
        else if (strcmp(name, "operators") == 0)
            rc = config_access_rule(l, val, "access.operators", &a->operators);
        else if (strcmp(name, "datasets") == 0)
            rc = config_access_datasets(l, val, a);
        else if (strcmp(name, "declare") == 0)
            rc = config_access_declare(l, val, a);
        else
            rc = config_yaml_fail(l, k->start_mark,
                                  "access: unknown key '%s' (expected connect, operators, datasets or declare)",
                                  name);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int config_access_check(const struct config_loader *l, const struct access_config *a, const char *const *names,
                        size_t n_names)
{
    for (size_t i = 0; i < a->n_datasets; i++) {
        size_t j = 0;
        while (j < n_names && strcmp(names[j], a->datasets[i].dataset) != 0)
            j++;
        if (j == n_names) {
            ld_errorf(l->errbuf, "%s:%d:%d: access.datasets: no dataset named '%s' under datasets:", l->file,
                      a->datasets[i].line, a->datasets[i].column, a->datasets[i].dataset);
            return LD_ECONFIG;
        }
    }
    return 0;
}
