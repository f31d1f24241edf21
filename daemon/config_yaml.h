/* config_yaml — private to the config loader (config.c, config_table.c): the YAML
 * document of one config file and the value parsers, each error message starting with
 * "FILE:LINE:COLUMN: ". Every function that fails returns LD_ECONFIG (LD_ENOMEM, or
 * -errno for a file that cannot be read) with the message in l->errbuf. */
#ifndef LD_CONFIG_YAML_H
#define LD_CONFIG_YAML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>
#include <cJSON.h>

/* One load of one file. */
struct config_loader {
    const char *file;
    char *errbuf;                   /* LD_ERRMSG_MAX bytes, or NULL */
    char *dir;                      /* absolute directory of the config file, for relative paths */
    yaml_document_t *doc;
};

/* Reads l->file (at most CONFIG_MAX_FILE_BYTES), rejects syntax errors, anchors,
 * aliases, a second document and deep nesting, then loads the document into *doc and
 * sets l->dir and l->doc. */
int config_yaml_open(struct config_loader *l, yaml_document_t *doc);
/* The same for a text in memory (len bytes; l->file names it in messages); relative
 * paths in it resolve against dir. */
int config_yaml_open_text(struct config_loader *l, const char *text, size_t len, const char *dir,
                          yaml_document_t *doc);
/* Frees what config_yaml_open set (the document, the directory). */
void config_yaml_close(struct config_loader *l);

/* Formats "FILE:LINE:COLUMN: message" into l->errbuf and returns LD_ECONFIG. */
int config_yaml_fail(const struct config_loader *l, yaml_mark_t mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The start of the file (1:1), for what has no node. */
yaml_mark_t config_yaml_start_mark(void);

/* ---- nodes --------------------------------------------------------------------- */

yaml_node_t *config_yaml_node(const struct config_loader *l, int index);
/* A plain scalar that YAML reads as null: empty, ~, null. */
bool config_yaml_is_null(const yaml_node_t *n);
/* What a node is, for "got ..." in messages: "a mapping", "'abc'" (cut at 60). */
const char *config_yaml_describe(const yaml_node_t *n, char *buf, size_t size);
/* A mapping key's text, or an error when the key is not a scalar. */
int config_yaml_key_text(const struct config_loader *l, const yaml_node_t *k, const char *where,
                         const char **ret_text);
/* An error when an earlier pair of `map` has the key `text`: "<prefix>duplicate <what>
 * 'x' (first at line L, column C)". */
int config_yaml_check_duplicate(const struct config_loader *l, const yaml_node_t *map,
                                const yaml_node_pair_t *pair, const char *text, const char *prefix,
                                const char *what);

/* ---- values -------------------------------------------------------------------- */

/* Strict decimal: optional sign, digits, nothing else. */
bool config_yaml_parse_int(const char *s, int64_t *ret);
/* Bytes, or an integer with a binary suffix (K, M, G, T, KiB, ...), optionally after one space. */
bool config_yaml_parse_size(const char *s, int64_t *ret);
/* "4 GiB", or the plain number when no unit divides it. */
const char *config_yaml_format_size(uint64_t v, char *buf, size_t size);

/* Typed values of node v; `where` names it in messages ("datasets.im.transforms[0].p"). */
/* The scalar text, or NULL with *ret set to the error when v is not a non-null scalar. */
const char *config_yaml_text(const struct config_loader *l, const yaml_node_t *v, const char *where,
                             int *ret);
int config_yaml_int(const struct config_loader *l, const yaml_node_t *v, const char *where, int64_t min,
                    int64_t max, int64_t *ret);
/* A finite number. */
int config_yaml_double(const struct config_loader *l, const yaml_node_t *v, const char *where, double *ret);
/* true, false, yes or no. */
int config_yaml_bool(const struct config_loader *l, const yaml_node_t *v, const char *where, bool *ret);
/* A list of min_n..max_n numbers (a single number counts as a list of one when min_n <= 1). */
int config_yaml_doubles(const struct config_loader *l, const yaml_node_t *v, const char *where, int min_n,
                        int max_n, double *out, int *ret_n);
/* Any node as JSON (numbers, booleans and null as such, other scalars as strings);
 * NULL when out of memory, too deep, or a key is not a scalar. */
cJSON *config_yaml_json(const struct config_loader *l, const yaml_node_t *v, int depth);

#endif
