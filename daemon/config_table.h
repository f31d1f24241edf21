/* config_table — private to the config loader: the row type of the key tables
 * (config.c holds the tables) and the generic walker that loads a YAML mapping
 * against one, including a dataset's transform list against each transform's own
 * parameter schema (transform.h). */
#ifndef LD_CONFIG_TABLE_H
#define LD_CONFIG_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "config_yaml.h"

enum config_key_type {
    CONFIG_KEY_STRING,      /* non-empty string, copied into a char * */
    CONFIG_KEY_PATH,        /* a string; relative paths are resolved against the config's directory */
    CONFIG_KEY_SOCKET,      /* a string that fits in sockaddr_un.sun_path */
    CONFIG_KEY_INT,         /* decimal integer in [min, max], into a uint32_t */
    CONFIG_KEY_SIZE,        /* bytes, plain or with a binary suffix, in [min, max], into uint32/64 */
    CONFIG_KEY_ENUM,        /* one of `choices`, mapped to an int by from_name */
    CONFIG_KEY_TABLE,       /* a nested mapping, walked against `sub` into the same struct */
    CONFIG_KEY_TRANSFORMS,  /* image_folder's list of transforms, into struct config_dataset */
    CONFIG_KEY_FRACTION,    /* a number in [0, 1], into a double; default def_frac */
    CONFIG_KEY_LISTEN,      /* a metrics listen address (metrics_http_parse_listen), copied into a char * */
    CONFIG_KEY_COLUMNS,     /* a manifest's columns: name -> type, in order, into struct config_dataset */
};

#define CONFIG_KEY_REQUIRED 1u
#define CONFIG_KEY_AUTO 2u          /* INT: also "auto", stored as 0 */

/* One key of a mapping: its type, bounds, default and target field. */
struct config_key {
    const char *name;
    enum config_key_type type;
    int64_t min, max;                   /* INT, SIZE */
    int64_t def;                        /* numeric default (INT, SIZE, ENUM) */
    double def_frac;                    /* FRACTION's default */
    const char *def_str;                /* string default; NULL: none or computed later */
    size_t offset, width;               /* the target field in struct config(_dataset) */
    int (*from_name)(const char *name); /* ENUM: the value, or <0 when unknown */
    const char *choices;                /* ENUM: the accepted names, for messages */
    unsigned flags;                     /* CONFIG_KEY_REQUIRED, CONFIG_KEY_AUTO */
    unsigned kinds;                     /* dataset keys: bit (1 << kind) per accepting kind */
    const struct config_key *sub;       /* TABLE: the nested mapping's keys */
    size_t n_sub;
};

/* config_table_load marks the keys it has seen in a 64-bit mask. */
#define CONFIG_TABLE_MAX_KEYS 64

/* Sets the defaults of the rows that apply to `kinds` (0: all rows) into base. */
int config_table_defaults(const struct config_loader *l, const struct config_key *table, size_t n,
                          unsigned kinds, void *base);
/* Loads value v of key k (the node `key`, for messages about the key as a whole) into
 * base; `where` names the mapping ("datasets.a"). */
int config_table_value(const struct config_loader *l, const struct config_key *k, const yaml_node_t *key,
                       const yaml_node_t *v, const char *where, void *base);
/* Walks mapping `map` against `table` into `base`: unknown and duplicate keys are
 * errors, required keys must be there. `kinds` (1 << dataset kind; 0 for the server)
 * selects the rows that apply, `kind_name` names it in messages; `missing_at` is where
 * to point when a required key is absent. */
int config_table_load(const struct config_loader *l, const yaml_node_t *map, const struct config_key *table,
                      size_t n, unsigned kinds, const char *kind_name, const char *where,
                      yaml_mark_t missing_at, void *base);

#endif
