/* transform_schema — what the config loader needs to read a transform: each kind's
 * name and the table of parameters it takes, published by the transform itself
 * (transform.c, transform_plugin.c). The loader (config_table.c) walks a table
 * generically for the mapping under the transform's name, so a transform's name and
 * parameters are written once, where the transform is defined. */
#ifndef LD_TRANSFORM_SCHEMA_H
#define LD_TRANSFORM_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "transform.h"

enum transform_param_type {
    TRANSFORM_PARAM_INT,        /* an integer in [min, max], into an int (width 4) or a 64-bit field */
    TRANSFORM_PARAM_SQUARE,     /* the same, into two ints: offset and offset2 (size = height = width) */
    TRANSFORM_PARAM_BOOL,       /* true, false, yes or no, into a bool */
    TRANSFORM_PARAM_NUMBER,     /* a finite number, into a double */
    TRANSFORM_PARAM_NUMBERS,    /* a list of min..max numbers (one alone when min <= 1), into double[] */
    TRANSFORM_PARAM_ENUM,       /* a name that from_name maps to an int (>= 0) */
    TRANSFORM_PARAM_PATH,       /* a file path, relative ones against the config's directory: a malloc'd char * */
    TRANSFORM_PARAM_JSON,       /* any YAML value as JSON text: a malloc'd char * */
};

#define TRANSFORM_PARAM_REQUIRED 1u     /* must be given */
#define TRANSFORM_PARAM_COUNTED 2u      /* NUMBERS: how many values were given, into the int at offset2 */
#define TRANSFORM_PARAM_EITHER_A 4u     /* the two groups of the schema's `either` rule */
#define TRANSFORM_PARAM_EITHER_B 8u

struct transform_param {
    const char *name;
    enum transform_param_type type;
    int64_t min, max;                   /* INT, SQUARE: bounds; NUMBERS: how many values */
    size_t offset, width;               /* the target in struct transform_spec */
    size_t offset2;                     /* SQUARE: the second int; NUMBERS + COUNTED: the count */
    int (*from_name)(const char *name); /* ENUM */
    const char *choices;                /* ENUM: what "expected ..." says, e.g. "CHW or HWC" */
    unsigned flags;                     /* TRANSFORM_PARAM_* flags */
};

struct transform_schema {
    enum transform_kind kind;
    const char *name;                   /* as the config writes it: "random_resized_crop" */
    const struct transform_param *params;
    size_t n_params;
    /* Parameters of group A and of group B exclude each other; this says so. */
    const char *either;
};

/* The schema of a kind, or NULL. */
const struct transform_schema *transform_schema_of(enum transform_kind kind);
/* The schema of a name, or NULL when no transform is called that. */
const struct transform_schema *transform_schema_find(const char *name);
/* Every transform's name, comma-separated, into buf (for "expected one of: ..."). */
const char *transform_names(char *buf, size_t size);

#endif
