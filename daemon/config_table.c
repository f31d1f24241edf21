/* config_table — the generic walker of the config's key tables (config.c) and of each
 * transform's parameter schema (transform.h).
 *
 * A table row says a key's type, bounds, default and target field, so adding a key is
 * adding a row, and every message can say what was expected: "datasets.a.context:
 * expected an integer in [1, 1048576], got 'x'". The same walk reads a dataset's
 * `transforms:` list: the transform's name selects its schema (written once, next to
 * the transform), whose rows say each parameter's type and target in struct
 * transform_spec. What only the list as a whole can tell (order, output size) is then
 * checked by transform_specs_check, and its message is placed at the transform or
 * parameter it blames. Every message starts with "FILE:LINE:COLUMN: ". */
#include "config_table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "config.h"
#include "ld_error.h"
#include "metrics_http.h"
#include "proto.h"
#include "transform.h"
#include "transform_schema.h"

#define SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/* ---- storing values ----------------------------------------------------------- */

static void store_uint(void *base, const struct config_key *k, uint64_t v)
{
    char *p = (char *)base + k->offset;
    if (k->width == sizeof(uint64_t)) {
        uint64_t x = v;
        memcpy(p, &x, sizeof x);
    } else {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, sizeof x);
    }
}

static void store_string(void *base, const struct config_key *k, char *s)
{
    char **p = (char **)((char *)base + k->offset);
    free(*p);
    *p = s;
}

static int store_path(const struct config_loader *l, void *base, const struct config_key *k, const char *v)
{
    char *s = NULL;
    /* An object store's location (s3.h) is not a file name: it stays as written. */
    if (v[0] == '/' || !l->dir || strncmp(v, "s3://", 5) == 0) {
        s = strdup(v);
    } else {
        size_t dl = strlen(l->dir);
        const char *sep = dl && l->dir[dl - 1] == '/' ? "" : "/";
        if (asprintf(&s, "%s%s%s", l->dir, sep, v) < 0)
            s = NULL;
    }
    if (!s) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    store_string(base, k, s);
    return 0;
}

/* ---- one value ---------------------------------------------------------------- */

static int out_of_memory(const struct config_loader *l);

static int column_type_from_name(const char *name)
{
    static const char *const names[] = {
        [CONFIG_COLUMN_FILE] = "file", [CONFIG_COLUMN_NPY] = "npy", [CONFIG_COLUMN_LABEL] = "label",
        [CONFIG_COLUMN_INT64] = "int64", [CONFIG_COLUMN_FLOAT32] = "float32", [CONFIG_COLUMN_BLOB] = "blob",
    };
    for (size_t i = 1; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return (int)i;
    return -1;
}

/* A tar_shards dataset's `fields:`: member suffix (what follows the sample's key and
 * its dot: "jpg", "seg.npy") to type, in order, which are the sample's fields. Several
 * suffixes may be images (alternatives: a sample has one of them, e.g. jpg and png);
 * one label at most. */
static int load_tar_fields(const struct config_loader *l, const yaml_node_t *v, const char *where,
                           struct config_dataset *d)
{
    static const char *const types[] = {"image", "label", "npy", "bytes"};
    static const int codes[] = {CONFIG_COLUMN_IMAGE, CONFIG_COLUMN_LABEL, CONFIG_COLUMN_NPY, CONFIG_COLUMN_BYTES};
    char got[80];
    if (v->type != YAML_MAPPING_NODE || v->data.mapping.pairs.top == v->data.mapping.pairs.start)
        return config_yaml_fail(l, v->start_mark, "%s.fields: expected a mapping of member suffix to type (image, "
                                "label, npy, bytes), got %s", where, config_yaml_describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > 2 * LD_MAX_FIELDS)
        return config_yaml_fail(l, v->start_mark, "%s.fields: more than %d suffixes", where, 2 * LD_MAX_FIELDS);
    for (size_t i = 0; i < d->n_columns; i++)
        free(d->columns[i].name);
    free(d->columns);
    d->n_columns = 0;
    if (!(d->columns = calloc(n, sizeof *d->columns)))
        return out_of_memory(l);
    int labels = 0, ret, fields = 0;
    bool image = false;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = config_yaml_node(l, pair->key), *t = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, where, &name)) < 0)
            return ret;
        if ((ret = config_yaml_check_duplicate(l, v, pair, name, "", "suffix")) < 0)
            return ret;
        bool ok = *name && strlen(name) < LD_NAME_MAX && name[0] != '.' && !strchr(name, '/');
        for (const char *c = name; ok && *c; c++)
            ok = !(*c >= 'A' && *c <= 'Z');
        if (!ok)
            return config_yaml_fail(l, k->start_mark, "%s.fields: a member suffix of 1 to %d bytes, lower case, "
                                    "without '/' or a leading '.' (e.g. jpg, cls, seg.npy), got %s", where,
                                    LD_NAME_MAX - 1, config_yaml_describe(k, got, sizeof got));
        const char *text = t->type == YAML_SCALAR_NODE ? (const char *)t->data.scalar.value : "";
        int type = -1;
        for (size_t j = 0; j < sizeof types / sizeof types[0]; j++)
            if (strcmp(text, types[j]) == 0)
                type = codes[j];
        if (type < 0)
            return config_yaml_fail(l, t->start_mark, "%s.fields.%s: expected one of image, label, npy, bytes, got %s",
                                    where, name, config_yaml_describe(t, got, sizeof got));
        if (type == CONFIG_COLUMN_LABEL && ++labels > 1)
            return config_yaml_fail(l, t->start_mark, "%s.fields.%s: a second label suffix", where, name);
        if (type != CONFIG_COLUMN_IMAGE || !image)
            fields++;
        image |= type == CONFIG_COLUMN_IMAGE;
        if (fields > LD_MAX_FIELDS)
            return config_yaml_fail(l, k->start_mark, "%s.fields.%s: more than %d fields (a sample has at most %d)",
                                    where, name, LD_MAX_FIELDS, LD_MAX_FIELDS);
        if (!(d->columns[i].name = strdup(name)))
            return out_of_memory(l);
        d->columns[i].type = type;
        d->n_columns = i + 1;
    }
    return 0;
}

/* A manifest's `columns:`: a mapping of column name to type, in order, which are the
 * sample's fields. The first names the sample (a file or npy column); one label at
 * most; the name "label" is the label column's field, so no other column takes it. */
static int load_columns(const struct config_loader *l, const yaml_node_t *v, const char *where, void *base)
{
    struct config_dataset *d = base;
    char got[80];
    bool sql = d->kind == CONFIG_DATASET_SQL, tar = d->kind == CONFIG_DATASET_TAR_SHARDS;
    const char *types = sql ? "blob, label, int64, float32" : tar ? "image, label, npy, bytes"
                                                                 : "file, npy, label, int64, float32";
    const char *first = sql ? "blob" : "file or npy";
    if (tar)
        return load_tar_fields(l, v, where, d);
    if (v->type != YAML_MAPPING_NODE || v->data.mapping.pairs.top == v->data.mapping.pairs.start)
        return config_yaml_fail(l, v->start_mark, "%s.columns: expected a mapping of column name to type (%s), got %s",
                                where, types, config_yaml_describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > LD_MAX_FIELDS)
        return config_yaml_fail(l, config_yaml_node(l, v->data.mapping.pairs.start[LD_MAX_FIELDS].key)->start_mark,
                                "%s.columns: more than %d columns (a sample has at most %d fields)", where,
                                LD_MAX_FIELDS, LD_MAX_FIELDS);
    for (size_t i = 0; i < d->n_columns; i++)
        free(d->columns[i].name);
    free(d->columns);
    d->n_columns = 0;
    if (!(d->columns = calloc(n, sizeof *d->columns))) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    int labels = 0, ret;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_pair_t *pair = &v->data.mapping.pairs.start[i];
        const yaml_node_t *k = config_yaml_node(l, pair->key), *t = config_yaml_node(l, pair->value);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, where, &name)) < 0)
            return ret;
        if ((ret = config_yaml_check_duplicate(l, v, pair, name, "", "column")) < 0)
            return ret;
        if (!*name || strlen(name) >= LD_NAME_MAX)
            return config_yaml_fail(l, k->start_mark, "%s.columns: a column name of 1 to %d bytes, got %s", where,
                                    LD_NAME_MAX - 1, config_yaml_describe(k, got, sizeof got));
        const char *text = t->type == YAML_SCALAR_NODE ? (const char *)t->data.scalar.value : NULL;
        int type = text ? column_type_from_name(text) : -1;
        if (sql ? type == CONFIG_COLUMN_FILE || type == CONFIG_COLUMN_NPY : type == CONFIG_COLUMN_BLOB)
            type = -1;
        if (type < 0)
            return config_yaml_fail(l, t->start_mark, "%s.columns.%s: expected one of %s, got %s", where, name, types,
                                    config_yaml_describe(t, got, sizeof got));
        if (i == 0 && type != CONFIG_COLUMN_FILE && type != CONFIG_COLUMN_NPY && type != CONFIG_COLUMN_BLOB)
            return config_yaml_fail(l, t->start_mark, "%s.columns.%s: the first column must be a %s column "
                                    "(the sample's bytes), got %s", where, name, first, text);
        if (type == CONFIG_COLUMN_LABEL && ++labels > 1)
            return config_yaml_fail(l, k->start_mark, "%s.columns.%s: a second label column", where, name);
        if (type != CONFIG_COLUMN_LABEL && strcmp(name, "label") == 0)
            return config_yaml_fail(l, t->start_mark, "%s.columns.label: the field 'label' is the label column's: "
                                    "give it the type label", where);
        if (!(d->columns[i].name = strdup(name))) {
            ld_errorf(l->errbuf, "%s: out of memory", l->file);
            return LD_ENOMEM;
        }
        d->columns[i].type = type;
        d->n_columns = i + 1;
    }
    return 0;
}

static int load_transforms(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                           const char *where, void *base);
static int load_columns(const struct config_loader *l, const yaml_node_t *v, const char *where, void *base);

/* Loads value v of key k (the node `key`, for messages about the key as a whole). */
int config_table_value(const struct config_loader *l, const struct config_key *k, const yaml_node_t *key,
                       const yaml_node_t *v, const char *where, void *base)
{
    char got[80], lo[32], hi[32];
    const char *text = v->type == YAML_SCALAR_NODE && !config_yaml_is_null(v)
                           ? (const char *)v->data.scalar.value : NULL;
    int64_t num;

    switch (k->type) {
    case CONFIG_KEY_INT:
        if (text && (k->flags & CONFIG_KEY_AUTO) && strcmp(text, "auto") == 0) {
            store_uint(base, k, 0);
            return 0;
        }
        if (!text || !config_yaml_parse_int(text, &num) || num < k->min || num > k->max)
            return config_yaml_fail(l, v->start_mark, "%s.%s: expected an integer in [%lld, %lld]%s, got %s",
                                    where, k->name, (long long)k->min, (long long)k->max,
                                    (k->flags & CONFIG_KEY_AUTO) ? " or auto" : "",
                                    config_yaml_describe(v, got, sizeof got));
        store_uint(base, k, (uint64_t)num);
        return 0;
    case CONFIG_KEY_SIZE:
        if (!text || !config_yaml_parse_size(text, &num) || num < k->min || num > k->max)
            return config_yaml_fail(l, v->start_mark,
                                    "%s.%s: expected a size in [%s, %s] (bytes, or an integer with a "
                                    "suffix K, M, G, T, KiB, MiB, GiB, TiB; all binary), got %s",
                                    where, k->name, config_yaml_format_size((uint64_t)k->min, lo, sizeof lo),
                                    config_yaml_format_size((uint64_t)k->max, hi, sizeof hi),
                                    config_yaml_describe(v, got, sizeof got));
        store_uint(base, k, (uint64_t)num);
        return 0;
    case CONFIG_KEY_ENUM: {
        int e = text ? k->from_name(text) : -1;
        if (e < 0)
            return config_yaml_fail(l, v->start_mark, "%s.%s: expected one of %s, got %s", where, k->name,
                                    k->choices, config_yaml_describe(v, got, sizeof got));
        memcpy((char *)base + k->offset, &e, sizeof e);
        return 0;
    }
    case CONFIG_KEY_TABLE: {
        char sub_where[LD_NAME_MAX + 40];
        snprintf(sub_where, sizeof sub_where, "%s.%s", where, k->name);
        if (v->type != YAML_MAPPING_NODE)
            return config_yaml_fail(l, v->start_mark, "%s: expected a mapping, got %s", sub_where,
                                    config_yaml_describe(v, got, sizeof got));
        int ret = config_table_defaults(l, k->sub, k->n_sub, 0, base);
        if (ret < 0)
            return ret;
        return config_table_load(l, v, k->sub, k->n_sub, 0, NULL, sub_where, v->start_mark, base);
    }
    case CONFIG_KEY_TRANSFORMS:
        return load_transforms(l, key, v, where, base);
    case CONFIG_KEY_COLUMNS:
        return load_columns(l, v, where, base);
    case CONFIG_KEY_FRACTION: {
        char *end = NULL;
        double f = text ? strtod(text, &end) : NAN;
        if (!text || end == text || *end || !(f >= 0.0 && f <= 1.0))
            return config_yaml_fail(l, v->start_mark, "%s.%s: expected a number in [0, 1], got %s", where, k->name,
                                    config_yaml_describe(v, got, sizeof got));
        memcpy((char *)base + k->offset, &f, sizeof f);
        return 0;
    }
    case CONFIG_KEY_STRING:
    case CONFIG_KEY_PATH:
    case CONFIG_KEY_SOCKET:
    case CONFIG_KEY_LISTEN:
        break;
    }

    /* The string kinds. */
    if (!text || !*text)
        return config_yaml_fail(l, v->start_mark, "%s.%s: expected a non-empty string, got %s", where,
                                k->name, text ? "''" : config_yaml_describe(v, got, sizeof got));
    if (strlen(text) != v->data.scalar.length)
        return config_yaml_fail(l, v->start_mark, "%s.%s: the string contains a NUL character", where,
                                k->name);
    if (k->type == CONFIG_KEY_SOCKET && strlen(text) > SOCKET_PATH_MAX)
        return config_yaml_fail(l, v->start_mark,
                                "%s.%s: the path is %zu bytes long; a Unix socket path holds at most %zu",
                                where, k->name, strlen(text), SOCKET_PATH_MAX);
    if (k->type == CONFIG_KEY_LISTEN) {
        struct metrics_listen ml;
        char why[LD_ERRMSG_MAX];
        if (metrics_http_parse_listen(text, &ml, why) < 0)
            return config_yaml_fail(l, v->start_mark, "%s.%s: %s", where, k->name, why);
    }
    if (k->type == CONFIG_KEY_PATH)
        return store_path(l, base, k, text);
    char *s = strdup(text);
    if (!s) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    store_string(base, k, s);
    return 0;
}


/* ---- image_folder transforms ------------------------------------------------- */

static int out_of_memory(const struct config_loader *l)
{
    ld_errorf(l->errbuf, "%s: out of memory", l->file);
    return LD_ENOMEM;
}

/* Stores a malloc'd string into the char * at `field`, freeing what was there. */
static void store_param_string(char *field, char *s)
{
    char *old;
    memcpy(&old, field, sizeof old);
    free(old);
    memcpy(field, &s, sizeof s);
}

/* Loads parameter value pv of row pr into spec t; pw names it in messages. */
static int load_param(const struct config_loader *l, const struct transform_param *pr, const yaml_node_t *pv,
                      const char *pw, struct transform_spec *t)
{
    char got[80];
    char *field = (char *)t + pr->offset;
    int64_t iv;
    int rc = 0, n;
    switch (pr->type) {
    case TRANSFORM_PARAM_INT:
        if ((rc = config_yaml_int(l, pv, pw, pr->min, pr->max, &iv)) < 0)
            return rc;
        if (pr->width == sizeof(int64_t)) {
            memcpy(field, &iv, sizeof iv);
        } else {
            int v = (int)iv;
            memcpy(field, &v, sizeof v);
        }
        return 0;
    case TRANSFORM_PARAM_SQUARE: {
        if ((rc = config_yaml_int(l, pv, pw, pr->min, pr->max, &iv)) < 0)
            return rc;
        int v = (int)iv;
        memcpy(field, &v, sizeof v);
        memcpy((char *)t + pr->offset2, &v, sizeof v);
        return 0;
    }
    case TRANSFORM_PARAM_BOOL: {
        bool v;
        if ((rc = config_yaml_bool(l, pv, pw, &v)) < 0)
            return rc;
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case TRANSFORM_PARAM_NUMBER: {
        double v;
        if ((rc = config_yaml_double(l, pv, pw, &v)) < 0)
            return rc;
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case TRANSFORM_PARAM_NUMBERS: {
        double v[8];
        if (pr->max > 8 || (size_t)pr->max * sizeof(double) > pr->width)
            return config_yaml_fail(l, pv->start_mark, "%s: internal error: bad parameter table", pw);
        if ((rc = config_yaml_doubles(l, pv, pw, (int)pr->min, (int)pr->max, v, &n)) < 0)
            return rc;
        memcpy(field, v, (size_t)n * sizeof v[0]);
        if (pr->flags & TRANSFORM_PARAM_COUNTED)
            memcpy((char *)t + pr->offset2, &n, sizeof n);
        return 0;
    }
    case TRANSFORM_PARAM_ENUM: {
        const char *text = config_yaml_text(l, pv, pw, &rc);
        if (!text)
            return rc;
        int e = pr->from_name(text);
        if (e < 0)
            return config_yaml_fail(l, pv->start_mark, "%s: expected %s, got %s", pw, pr->choices,
                                    config_yaml_describe(pv, got, sizeof got));
        memcpy(field, &e, sizeof e);
        return 0;
    }
    case TRANSFORM_PARAM_PATH: {
        const char *text = config_yaml_text(l, pv, pw, &rc);
        char *full = NULL;
        if (!text)
            return rc;
        if (text[0] != '/' && l->dir) {
            if (asprintf(&full, "%s/%s", l->dir, text) < 0)
                full = NULL;
        } else {
            full = strdup(text);
        }
        if (!full)
            return out_of_memory(l);
        store_param_string(field, full);
        return 0;
    }
    case TRANSFORM_PARAM_JSON: {
        cJSON *j = config_yaml_json(l, pv, 0);
        char *text = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        if (!text)
            return config_yaml_fail(l, pv->start_mark, "%s: cannot turn the parameters into JSON", pw);
        store_param_string(field, text);
        return 0;
    }
    }
    return config_yaml_fail(l, pv->start_mark, "%s: internal error: bad parameter type", pw);
}

static const struct transform_param *find_param(const struct transform_schema *sc, const char *name)
{
    for (size_t i = 0; sc && name && i < sc->n_params; i++)
        if (strcmp(sc->params[i].name, name) == 0)
            return &sc->params[i];
    return NULL;
}

/* The names of a schema's parameters, comma-separated, for messages. */
static const char *param_list(const struct transform_schema *sc, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sc->n_params && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", sc->params[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

#define EITHER_GROUPS (TRANSFORM_PARAM_EITHER_A | TRANSFORM_PARAM_EITHER_B)

/* One `- name: {params}` item of `transforms:`, against the schema its name selects. */
static int load_transform(const struct config_loader *l, const yaml_node_t *item, const char *where,
                          struct transform_spec *t)
{
    char got[80], pw[160], list[256];
    if (item->type != YAML_MAPPING_NODE || item->data.mapping.pairs.top - item->data.mapping.pairs.start != 1)
        return config_yaml_fail(l, item->start_mark, "%s: expected a mapping with one transform name (e.g. "
                                "'- random_flip: {p: 0.5}'), got %s", where,
                                config_yaml_describe(item, got, sizeof got));
    const yaml_node_pair_t *pair = item->data.mapping.pairs.start;
    const yaml_node_t *kn = config_yaml_node(l, pair->key), *params = config_yaml_node(l, pair->value);
    const char *name = kn->type == YAML_SCALAR_NODE ? (const char *)kn->data.scalar.value : "";
    const struct transform_schema *sc = transform_schema_find(name);
    if (!sc)
        return config_yaml_fail(l, kn->start_mark, "%s: unknown transform '%s' (expected one of: %s)", where, name,
                                transform_names(list, sizeof list));
    transform_spec_init(t, sc->kind);
    if (!config_yaml_is_null(params) && params->type != YAML_MAPPING_NODE)
        return config_yaml_fail(l, params->start_mark, "%s.%s: expected a mapping of parameters, got %s", where,
                                name, config_yaml_describe(params, got, sizeof got));
    unsigned groups = 0;                        /* the `either` groups given */
    yaml_mark_t either_at = kn->start_mark;     /* the first key of the second group */
    uint64_t seen = 0;
    for (const yaml_node_pair_t *p = config_yaml_is_null(params) ? NULL : params->data.mapping.pairs.start;
         p && p < params->data.mapping.pairs.top; p++) {
        const yaml_node_t *pk = config_yaml_node(l, p->key), *pv = config_yaml_node(l, p->value);
        const char *key = pk->type == YAML_SCALAR_NODE ? (const char *)pk->data.scalar.value : "";
        const struct transform_param *pr = find_param(sc, key);
        if (!pr)
            return config_yaml_fail(l, pk->start_mark, "%s.%s: unknown parameter '%s' (expected one of: %s)",
                                    where, name, key, param_list(sc, list, sizeof list));
        snprintf(pw, sizeof pw, "%s.%s.%s", where, name, key);
        int rc = load_param(l, pr, pv, pw, t);
        if (rc < 0)
            return rc;
        unsigned g = pr->flags & EITHER_GROUPS;
        if (g && !(groups & g) && (groups & EITHER_GROUPS))
            either_at = pk->start_mark;
        groups |= g;
        seen |= UINT64_C(1) << (pr - sc->params);
    }
    if ((groups & EITHER_GROUPS) == EITHER_GROUPS)
        return config_yaml_fail(l, either_at, "%s.%s: %s", where, name, sc->either);
    for (size_t i = 0; i < sc->n_params; i++)
        if ((sc->params[i].flags & TRANSFORM_PARAM_REQUIRED) && !(seen & (UINT64_C(1) << i)))
            return config_yaml_fail(l, kn->start_mark, "%s.%s: missing required parameter '%s'", where, name,
                                    sc->params[i].name);
    return 0;
}

/* The key node of parameter `param` in mapping `params`, or NULL. */
static const yaml_node_t *param_key(const struct config_loader *l, const yaml_node_t *params, const char *param)
{
    if (params->type != YAML_MAPPING_NODE)
        return NULL;
    for (const yaml_node_pair_t *p = params->data.mapping.pairs.start; p < params->data.mapping.pairs.top; p++) {
        const yaml_node_t *pk = config_yaml_node(l, p->key);
        if (pk->type == YAML_SCALAR_NODE && !strcmp((const char *)pk->data.scalar.value, param))
            return pk;
    }
    return NULL;
}

/* Where in `item` (a `- name: {params}` of the list) to point for an error about its
 * parameter `param` (NULL: the transform's name). */
static yaml_mark_t transform_mark(const struct config_loader *l, const yaml_node_t *item, const char *param)
{
    if (item->type != YAML_MAPPING_NODE || item->data.mapping.pairs.top == item->data.mapping.pairs.start)
        return item->start_mark;
    const yaml_node_pair_t *pair = item->data.mapping.pairs.start;
    const yaml_node_t *kn = config_yaml_node(l, pair->key), *params = config_yaml_node(l, pair->value);
    if (!param)
        return kn->start_mark;
    const yaml_node_t *pk = param_key(l, params, param);
    if (pk)
        return pk->start_mark;
    /* A parameter not given may stand for one of the other `either` group that was
     * (height and width for `size`). */
    const struct transform_schema *sc =
        kn->type == YAML_SCALAR_NODE ? transform_schema_find((const char *)kn->data.scalar.value) : NULL;
    const struct transform_param *pr = find_param(sc, param);
    unsigned g = pr ? pr->flags & EITHER_GROUPS : 0;
    for (size_t i = 0; g && i < sc->n_params; i++)
        if ((sc->params[i].flags & EITHER_GROUPS & ~g) && (pk = param_key(l, params, sc->params[i].name)))
            return pk->start_mark;
    return kn->start_mark;
}

static int load_transforms(const struct config_loader *l, const yaml_node_t *key, const yaml_node_t *v,
                           const char *where, void *base)
{
    struct config_dataset *d = base;
    char got[80], iw[LD_NAME_MAX + 48];
    if (v->type != YAML_SEQUENCE_NODE)
        return config_yaml_fail(l, v->start_mark, "%s.transforms: expected a list of transforms, got %s", where,
                                config_yaml_describe(v, got, sizeof got));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0 || n > TRANSFORM_MAX)
        return config_yaml_fail(l, v->start_mark, "%s.transforms: expected 1 to %d transforms, got %zu", where,
                                TRANSFORM_MAX, n);
    d->transforms = calloc(n, sizeof *d->transforms);
    if (!d->transforms)
        return LD_ENOMEM;
    d->n_transforms = n;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *item = config_yaml_node(l, v->data.sequence.items.start[i]);
        yaml_mark_t m = transform_mark(l, item, NULL);
        d->transform_at[i] = (struct config_pos){(int)m.line + 1, (int)m.column + 1};
        snprintf(iw, sizeof iw, "%s.transforms[%zu]", where, i);
        int rc = load_transform(l, item, iw, &d->transforms[i]);
        if (rc < 0)
            return rc;
    }
    /* The list as a whole (order, output size, normalize with uint8, ...), checked here
     * rather than when the dataset opens so that the message points at the transform
     * or parameter at fault. Loading plug-ins waits for the dataset. */
    struct transform_error at;
    char err[LD_ERRMSG_MAX];
    int rc = transform_specs_check(d->transforms, n, &at, err);
    if (rc == LD_ENOMEM)
        return out_of_memory(l);
    if (rc < 0) {
        yaml_mark_t m = at.index < n
                            ? transform_mark(l, config_yaml_node(l, v->data.sequence.items.start[at.index]), at.param)
                            : key->start_mark;
        return config_yaml_fail(l, m, "%s.%s", where, err);
    }
    return 0;
}

/* ---- tables -------------------------------------------------------------------- */

/* Sets the defaults of the rows that apply to `kinds` (0: all rows). */
int config_table_defaults(const struct config_loader *l, const struct config_key *table, size_t n,
                          unsigned kinds, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const struct config_key *k = &table[i];
        if (kinds && !(k->kinds & kinds))
            continue;
        if (k->type == CONFIG_KEY_INT || k->type == CONFIG_KEY_SIZE) {
            store_uint(base, k, (uint64_t)k->def);
        } else if (k->type == CONFIG_KEY_FRACTION) {
            memcpy((char *)base + k->offset, &k->def_frac, sizeof k->def_frac);
        } else if (k->type == CONFIG_KEY_ENUM) {
            if (k->flags & CONFIG_KEY_REQUIRED)
                continue; /* no default; for a dataset's kind, already parsed */
            int e = (int)k->def;
            memcpy((char *)base + k->offset, &e, sizeof e);
        } else if (k->def_str) {
            char *s = strdup(k->def_str);
            if (!s) {
                ld_errorf(l->errbuf, "%s: out of memory", l->file);
                return LD_ENOMEM;
            }
            store_string(base, k, s);
        }
    }
    return 0;
}

/* The names of the rows that apply to `kinds`, comma-separated, for messages. */
static const char *key_list(const struct config_key *table, size_t n, unsigned kinds, char *buf,
                            size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < size; i++) {
        if (kinds && !(table[i].kinds & kinds))
            continue;
        int w = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", table[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* Walks mapping `map` against `table` into `base` (config_table.h). */
int config_table_load(const struct config_loader *l, const yaml_node_t *map, const struct config_key *table,
                      size_t n, unsigned kinds, const char *kind_name, const char *where,
                      yaml_mark_t missing_at, void *base)
{
    char list[256];
    uint64_t seen = 0;
    int ret;

    for (const yaml_node_pair_t *pair = map->data.mapping.pairs.start;
         pair < map->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = config_yaml_node(l, pair->key);
        const char *name = NULL;
        if ((ret = config_yaml_key_text(l, k, where, &name)) < 0)
            return ret;
        char prefix[LD_NAME_MAX + 24];
        snprintf(prefix, sizeof prefix, "%s: ", where);
        if ((ret = config_yaml_check_duplicate(l, map, pair, name, prefix, "key")) < 0)
            return ret;
        /* A key may have a row per kind (another default): the row of this kind, else
         * the first of that name (for the message). */
        size_t i = 0;
        while (i < n && (strcmp(table[i].name, name) != 0 || (kinds && !(table[i].kinds & kinds))))
            i++;
        if (i == n) {
            i = 0;
            while (i < n && strcmp(table[i].name, name) != 0)
                i++;
        }
        if (i == n)
            return config_yaml_fail(l, k->start_mark, "unknown key '%s' in '%s' (expected one of: %s)",
                                    name, where, key_list(table, n, kinds, list, sizeof list));
        if (kinds && !(table[i].kinds & kinds))
            return config_yaml_fail(l, k->start_mark,
                                    "%s: key '%s' is not valid for kind '%s' (expected one of: %s)", where,
                                    name, kind_name ? kind_name : "?", key_list(table, n, kinds, list, sizeof list));
        if ((ret = config_table_value(l, &table[i], k, config_yaml_node(l, pair->value), where, base)) < 0)
            return ret;
        seen |= UINT64_C(1) << i;
    }
    for (size_t i = 0; i < n; i++) {
        if ((table[i].flags & CONFIG_KEY_REQUIRED) && !(seen & (UINT64_C(1) << i)) &&
            (!kinds || (table[i].kinds & kinds)))
            return config_yaml_fail(l, missing_at, "%s: missing required key '%s'", where, table[i].name);
    }
    return 0;
}
