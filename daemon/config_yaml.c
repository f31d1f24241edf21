/* config_yaml — the YAML side of the config loader: the file read whole and parsed by
 * libyaml, and the value parsers, every message placed at its FILE:LINE:COLUMN.
 *
 * The file is read whole (at most CONFIG_MAX_FILE_BYTES) and parsed twice: a first
 * pass over the event stream rejects syntax errors, anchors and aliases (an alias can
 * multiply a small file into a huge tree), more than one document and deep nesting,
 * each with its position; a second pass loads the document tree that config_table.c
 * walks against the schema (config.c). The value parsers here are strict (a size is
 * digits and a binary suffix, an integer has no trailing text) and say what they got
 * ("got 'abc'", "got a sequence") so that every message can name the culprit. Every
 * message starts with "FILE:LINE:COLUMN: " (1-based, from libyaml's marks). */
#include "config_yaml.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "ld_error.h"
#include "proto.h"

/* Our schema is three levels deep; anything much deeper is a mistake, and a cap keeps
 * a hostile file from growing libyaml's stacks. */
#define CONFIG_MAX_DEPTH 16

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

/* ---- errors ------------------------------------------------------------------- */

/* Formats "FILE:LINE:COLUMN: message" and returns LD_ECONFIG. */
int config_yaml_fail(const struct config_loader *l, yaml_mark_t mark, const char *fmt, ...)
{
    if (!l->errbuf)
        return LD_ECONFIG;
    int n = snprintf(l->errbuf, LD_ERRMSG_MAX, "%s:%zu:%zu: ", l->file, mark.line + 1,
                     mark.column + 1);
    if (n < 0 || n >= LD_ERRMSG_MAX)
        return LD_ECONFIG;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->errbuf + n, LD_ERRMSG_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    return LD_ECONFIG;
}

yaml_mark_t config_yaml_start_mark(void)
{
    yaml_mark_t m = {0, 0, 0};
    return m;
}

/* libyaml's reader errors carry a byte offset but no mark; count our own. */
static yaml_mark_t mark_of_offset(const unsigned char *buf, size_t len, size_t offset)
{
    yaml_mark_t m = {offset, 0, 0};
    for (size_t i = 0; i < offset && i < len; i++) {
        if (buf[i] == '\n') {
            m.line++;
            m.column = 0;
        } else if ((buf[i] & 0xc0) != 0x80) {
            m.column++;
        }
    }
    return m;
}

static int syntax_error(const struct config_loader *l, const yaml_parser_t *p, const unsigned char *buf,
                        size_t len)
{
    if (p->error == YAML_MEMORY_ERROR) {
        ld_errorf(l->errbuf, "%s: out of memory while parsing", l->file);
        return LD_ENOMEM;
    }
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR) {
        yaml_mark_t m = mark_of_offset(buf, len, p->problem_offset);
        if (p->problem_value >= 0)
            return config_yaml_fail(l, m, "YAML syntax error: %s (byte 0x%02x)", problem,
                                    (unsigned)p->problem_value);
        return config_yaml_fail(l, m, "YAML syntax error: %s", problem);
    }
    if (p->context)
        return config_yaml_fail(l, p->problem_mark, "YAML syntax error: %s (%s at line %zu, column %zu)",
                                problem, p->context, p->context_mark.line + 1,
                                p->context_mark.column + 1);
    return config_yaml_fail(l, p->problem_mark, "YAML syntax error: %s", problem);
}

/* ---- pass 1: the event stream ------------------------------------------------- */

static int check_anchor(const struct config_loader *l, const yaml_event_t *ev, const yaml_char_t *anchor)
{
    if (!anchor)
        return 0;
    return config_yaml_fail(l, ev->start_mark, "anchors and aliases are not allowed (found anchor '&%s')",
                            (const char *)anchor);
}

static int check_events(const struct config_loader *l, const unsigned char *buf, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int ret = 0, docs = 0, depth = 0;
    bool done = false;

    memset(&ev, 0, sizeof ev);
    if (!yaml_parser_initialize(&parser)) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, buf, len);
    while (!done) {
        if (!yaml_parser_parse(&parser, &ev)) {
            ret = syntax_error(l, &parser, buf, len);
            goto out;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                ret = config_yaml_fail(l, ev.start_mark,
                                       "a second YAML document ('---'); the config is one document");
                goto out;
            }
            break;
        case YAML_ALIAS_EVENT:
            ret = config_yaml_fail(l, ev.start_mark, "anchors and aliases are not allowed (found alias '*%s')",
                                   (const char *)ev.data.alias.anchor);
            goto out;
        case YAML_SCALAR_EVENT:
            ret = check_anchor(l, &ev, ev.data.scalar.anchor);
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            ret = check_anchor(l, &ev,
                               ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.anchor
                                                                   : ev.data.mapping_start.anchor);
            if (ret == 0 && ++depth > CONFIG_MAX_DEPTH)
                ret = config_yaml_fail(l, ev.start_mark, "nested deeper than %d levels", CONFIG_MAX_DEPTH);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        default:
            break;
        }
        if (ret < 0)
            goto out;
        yaml_event_delete(&ev);
    }
    if (docs == 0)
        ret = config_yaml_fail(l, config_yaml_start_mark(),
                               "the file is empty: expected a mapping with a 'datasets' key");
out:
    yaml_event_delete(&ev);
    yaml_parser_delete(&parser);
    return ret;
}

/* ---- node helpers ------------------------------------------------------------- */

yaml_node_t *config_yaml_node(const struct config_loader *l, int index)
{
    return yaml_document_get_node(l->doc, index);
}

bool config_yaml_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

/* What a node is, for "got ..." in messages. */
const char *config_yaml_describe(const yaml_node_t *n, char *buf, size_t size)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a sequence";
    if (config_yaml_is_null(n))
        return "nothing (null)";
    const char *v = (const char *)n->data.scalar.value;
    if (strlen(v) > 60)
        snprintf(buf, size, "'%.60s...'", v);
    else
        snprintf(buf, size, "'%s'", v);
    return buf;
}

/* A mapping key's text, or an error when the key is not a scalar. */
int config_yaml_key_text(const struct config_loader *l, const yaml_node_t *k, const char *where,
                         const char **ret_text)
{
    char got[80];
    if (k->type != YAML_SCALAR_NODE)
        return config_yaml_fail(l, k->start_mark, "%s: expected a key name, got %s", where,
                                config_yaml_describe(k, got, sizeof got));
    *ret_text = (const char *)k->data.scalar.value;
    return 0;
}

/* An earlier pair of `map` (before index i) with the same key text, or NULL. */
static const yaml_node_t *earlier_key(const struct config_loader *l, const yaml_node_t *map,
                                      const yaml_node_pair_t *pair, const char *text)
{
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < pair; p++) {
        const yaml_node_t *k = config_yaml_node(l, p->key);
        if (k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, text) == 0)
            return k;
    }
    return NULL;
}

/* `prefix` names the mapping ("server: ", "" at the top), `what` the thing ("key"). */
int config_yaml_check_duplicate(const struct config_loader *l, const yaml_node_t *map,
                                const yaml_node_pair_t *pair, const char *text, const char *prefix,
                                const char *what)
{
    const yaml_node_t *first = earlier_key(l, map, pair, text);
    if (!first)
        return 0;
    return config_yaml_fail(l, config_yaml_node(l, pair->key)->start_mark,
                            "%sduplicate %s '%s' (first at line %zu, column %zu)", prefix, what, text,
                            first->start_mark.line + 1, first->start_mark.column + 1);
}

/* ---- values ------------------------------------------------------------------- */

/* Strict decimal: optional sign, digits, nothing else. */
bool config_yaml_parse_int(const char *s, int64_t *ret)
{
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    if (*p < '0' || *p > '9')
        return false;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return false;
    *ret = v;
    return true;
}

/* Bytes, or an integer with a binary-unit suffix, optionally after one space. */
bool config_yaml_parse_size(const char *s, int64_t *ret)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"K", KIB}, {"M", MIB}, {"G", GIB}, {"T", TIB},
                 {"KiB", KIB}, {"MiB", MIB}, {"GiB", GIB}, {"TiB", TIB}};
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    if (n == 0 || n > 18)
        return false;
    char digits[20];
    memcpy(digits, s, n);
    digits[n] = '\0';
    int64_t v;
    if (!config_yaml_parse_int(digits, &v))
        return false;
    const char *suffix = s + n;
    if (*suffix == ' ')
        suffix++;
    if (!*suffix) {
        if (suffix != s + n)
            return false; /* "12 " */
        *ret = v;
        return true;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(suffix, units[i].suffix) == 0) {
            if ((uint64_t)v > (uint64_t)INT64_MAX / units[i].mult)
                return false;
            *ret = (int64_t)((uint64_t)v * units[i].mult);
            return true;
        }
    }
    return false;
}

const char *config_yaml_format_size(uint64_t v, char *buf, size_t size)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {{"TiB", TIB}, {"GiB", GIB}, {"MiB", MIB}, {"KiB", KIB}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (v >= units[i].mult && v % units[i].mult == 0) {
            snprintf(buf, size, "%llu %s", (unsigned long long)(v / units[i].mult),
                     units[i].name);
            return buf;
        }
    }
    snprintf(buf, size, "%llu", (unsigned long long)v);
    return buf;
}

/* ---- typed values (transform parameters) --------------------------------------- */

/* The scalar text of a parameter, or NULL (a message is set) when it is not a scalar. */
const char *config_yaml_text(const struct config_loader *l, const yaml_node_t *v, const char *where, int *ret)
{
    char got[80];
    if (v->type != YAML_SCALAR_NODE || config_yaml_is_null(v)) {
        *ret = config_yaml_fail(l, v->start_mark, "%s: expected a value, got %s", where,
                                config_yaml_describe(v, got, sizeof got));
        return NULL;
    }
    return (const char *)v->data.scalar.value;
}

int config_yaml_int(const struct config_loader *l, const yaml_node_t *v, const char *where, int64_t min, int64_t max,
                     int64_t *ret)
{
    char got[80];
    int rc = 0;
    const char *t = config_yaml_text(l, v, where, &rc);
    if (!t)
        return rc;
    if (!config_yaml_parse_int(t, ret) || *ret < min || *ret > max)
        return config_yaml_fail(l, v->start_mark, "%s: expected an integer in [%lld, %lld], got %s", where,
                                (long long)min, (long long)max, config_yaml_describe(v, got, sizeof got));
    return 0;
}

int config_yaml_double(const struct config_loader *l, const yaml_node_t *v, const char *where, double *ret)
{
    char got[80], *end = NULL;
    int rc = 0;
    const char *t = config_yaml_text(l, v, where, &rc);
    if (!t)
        return rc;
    errno = 0;
    double d = strtod(t, &end);
    if (errno || end == t || *end || d != d || d > 1e300 || d < -1e300)
        return config_yaml_fail(l, v->start_mark, "%s: expected a number, got %s", where,
                                config_yaml_describe(v, got, sizeof got));
    *ret = d;
    return 0;
}

int config_yaml_bool(const struct config_loader *l, const yaml_node_t *v, const char *where, bool *ret)
{
    char got[80];
    int rc = 0;
    const char *t = config_yaml_text(l, v, where, &rc);
    if (!t)
        return rc;
    if (!strcmp(t, "true") || !strcmp(t, "yes"))
        *ret = true;
    else if (!strcmp(t, "false") || !strcmp(t, "no"))
        *ret = false;
    else
        return config_yaml_fail(l, v->start_mark, "%s: expected true or false, got %s", where,
                                config_yaml_describe(v, got, sizeof got));
    return 0;
}

/* A list of 1..max numbers (a single number counts as a list of one). */
int config_yaml_doubles(const struct config_loader *l, const yaml_node_t *v, const char *where, int min_n, int max_n,
                         double *out, int *ret_n)
{
    char got[80];
    if (v->type == YAML_SCALAR_NODE && min_n <= 1) {
        *ret_n = 1;
        return config_yaml_double(l, v, where, out);
    }
    if (v->type != YAML_SEQUENCE_NODE)
        return config_yaml_fail(l, v->start_mark, "%s: expected a list of %d to %d numbers, got %s", where,
                                min_n, max_n, config_yaml_describe(v, got, sizeof got));
    int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n < min_n || n > max_n)
        return config_yaml_fail(l, v->start_mark, "%s: expected a list of %d to %d numbers, got %d", where,
                                min_n, max_n, n);
    for (int i = 0; i < n; i++) {
        int rc = config_yaml_double(l, config_yaml_node(l, v->data.sequence.items.start[i]), where, &out[i]);
        if (rc < 0)
            return rc;
    }
    *ret_n = n;
    return 0;
}

/* A YAML node as JSON text (a plug-in's params): mappings, sequences, scalars (numbers,
 * booleans and null as such, everything else as strings). */
cJSON *config_yaml_json(const struct config_loader *l, const yaml_node_t *v, int depth)
{
    if (depth > CONFIG_MAX_DEPTH)
        return NULL;
    if (v->type == YAML_MAPPING_NODE) {
        cJSON *o = cJSON_CreateObject();
        for (const yaml_node_pair_t *p = v->data.mapping.pairs.start; o && p < v->data.mapping.pairs.top; p++) {
            const yaml_node_t *k = config_yaml_node(l, p->key);
            cJSON *val = config_yaml_json(l, config_yaml_node(l, p->value), depth + 1);
            if (k->type != YAML_SCALAR_NODE || !val) {
                cJSON_Delete(val);
                cJSON_Delete(o);
                return NULL;
            }
            cJSON_AddItemToObject(o, (const char *)k->data.scalar.value, val);
        }
        return o;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        cJSON *a = cJSON_CreateArray();
        for (const yaml_node_item_t *i = v->data.sequence.items.start; a && i < v->data.sequence.items.top; i++) {
            cJSON *val = config_yaml_json(l, config_yaml_node(l, *i), depth + 1);
            if (!val) {
                cJSON_Delete(a);
                return NULL;
            }
            cJSON_AddItemToArray(a, val);
        }
        return a;
    }
    const char *t = (const char *)v->data.scalar.value;
    char *end = NULL;
    if (config_yaml_is_null(v))
        return cJSON_CreateNull();
    if (!strcmp(t, "true") || !strcmp(t, "false"))
        return cJSON_CreateBool(t[0] == 't');
    double d = strtod(t, &end);
    if (v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && end != t && !*end)
        return cJSON_CreateNumber(d);
    return cJSON_CreateString(t);
}

/* ---- the file ------------------------------------------------------------------ */

/* Reads the whole file, refusing more than CONFIG_MAX_FILE_BYTES. */
static int read_file(const struct config_loader *l, unsigned char **ret_buf, size_t *ret_len)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    struct stat st;
    int ret = 0;
    int fd = open(l->file, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(l->errbuf, "%s: cannot open: %s", l->file, strerror(-ret));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        ret = ld_from_errno(errno);
        ld_errorf(l->errbuf, "%s: cannot stat: %s", l->file, strerror(-ret));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        ret = LD_EISDIR;
        ld_errorf(l->errbuf, "%s: is a directory, not a config file", l->file);
        goto out;
    }
    /* One byte over the cap tells "too big" from "exactly at the cap". */
    buf = malloc(CONFIG_MAX_FILE_BYTES + 1);
    if (!buf) {
        ret = LD_ENOMEM;
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        goto out;
    }
    while (len <= CONFIG_MAX_FILE_BYTES) {
        ssize_t r = read(fd, buf + len, CONFIG_MAX_FILE_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            ret = ld_from_errno(errno);
            ld_errorf(l->errbuf, "%s: cannot read: %s", l->file, strerror(-ret));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (len > CONFIG_MAX_FILE_BYTES) {
        ret = LD_ECONFIG;
        ld_errorf(l->errbuf, "%s: the file is larger than the %u bytes a config may have",
                  l->file, CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    *ret_buf = buf;
    *ret_len = len;
    buf = NULL;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return ret;
}

/* The config file's directory as an absolute path, so dataset paths survive a chdir. */
static int config_dir(const char *file, char **ret_dir)
{
    const char *slash = strrchr(file, '/');
    char *cwd = NULL, *dir = NULL;
    int ret = 0;

    if (file[0] != '/') {
        cwd = getcwd(NULL, 0);
        if (!cwd) {
            ret = ld_from_errno(errno);
            goto out;
        }
    }
    int dlen = slash ? (int)(slash - file) : 0;
    if (slash == file)
        dlen = 1; /* "/x.yaml": the root */
    int r;
    if (!cwd)
        r = asprintf(&dir, "%.*s", dlen, file);
    else if (dlen)
        r = asprintf(&dir, "%s/%.*s", cwd, dlen, file);
    else
        r = asprintf(&dir, "%s", cwd);
    if (r < 0) {
        dir = NULL;
        ret = LD_ENOMEM;
        goto out;
    }
    *ret_dir = dir;
out:
    free(cwd);
    return ret;
}

/* Checks the event stream of buf and loads its document into *doc: what a file and a
 * text have in common. */
static int config_yaml_load(struct config_loader *l, const unsigned char *buf, size_t len, yaml_document_t *doc)
{
    yaml_parser_t parser;
    bool have_parser = false;
    int ret;

    if ((ret = check_events(l, buf, len)) < 0)
        goto out;
    if (!yaml_parser_initialize(&parser)) {
        ret = LD_ENOMEM;
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        goto out;
    }
    have_parser = true;
    yaml_parser_set_input_string(&parser, buf, len);
    if (!yaml_parser_load(&parser, doc)) {
        ret = syntax_error(l, &parser, buf, len);
        goto out;
    }
    l->doc = doc;
out:
    if (have_parser)
        yaml_parser_delete(&parser);
    return ret;
}

int config_yaml_open(struct config_loader *l, yaml_document_t *doc)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int ret;

    if ((ret = read_file(l, &buf, &len)) < 0)
        goto out;
    if ((ret = config_dir(l->file, &l->dir)) < 0) {
        ld_errorf(l->errbuf, "%s: cannot resolve the config's directory: %s", l->file,
                  ld_strerror(ret));
        goto out;
    }
    ret = config_yaml_load(l, buf, len, doc);
out:
    free(buf);
    return ret;
}

int config_yaml_open_text(struct config_loader *l, const char *text, size_t len, const char *dir,
                          yaml_document_t *doc)
{
    if (len > CONFIG_MAX_FILE_BYTES) {
        ld_errorf(l->errbuf, "%s: larger than the %u bytes a config may have", l->file, CONFIG_MAX_FILE_BYTES);
        return LD_ECONFIG;
    }
    if (!(l->dir = strdup(dir))) {
        ld_errorf(l->errbuf, "%s: out of memory", l->file);
        return LD_ENOMEM;
    }
    return config_yaml_load(l, (const unsigned char *)text, len, doc);
}

void config_yaml_close(struct config_loader *l)
{
    if (l->doc)
        yaml_document_delete(l->doc);
    l->doc = NULL;
    free(l->dir);
    l->dir = NULL;
}
