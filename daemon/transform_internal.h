/* transform_internal — private to the transform module's files (transform.c,
 * transform_plan.c, transform_emit.c, transform_plugin.c); nothing else includes it.
 *
 * A pipeline is built once (transform.c: each kind's schema, defaults and check, with
 * the plug-in kind in transform_plugin.c), then for every sample planned on the
 * header's size (transform_plan.c) and executed, its last stage streaming rows into
 * the batch slot (transform_emit.c). */
#ifndef LD_TRANSFORM_INTERNAL_H
#define LD_TRANSFORM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transform.h"
#include "transform_schema.h"

/* One transform of a built pipeline. */
struct tstep {
    struct transform_spec spec;         /* plug-in: path and params_json are NULL here */
    /* plugin */
    char *path;
    char *params;
    void *dl;
    const struct ld_transform_plugin_v1 *plugin;
    void *state;
};

struct transform_pipeline {
    size_t n;
    struct tstep steps[TRANSFORM_MAX];
    size_t key_base;                /* 1 when the list starts with decode (see transform_rng_step) */
    struct image_decode_opts decode;
    bool dct_scaling;
    bool has_normalize;
    struct transform_output out;
    float lut32[3][256];
    uint16_t lut16[3][256];
};

/* ---- building (transform.c, transform_plugin.c) ---------------------------------- */

/* The state of a pipeline being checked and built, step by step. */
struct transform_build {
    transform_pipeline *p;
    bool load_plugins;              /* false: check what can be checked without dlopen */
    bool fixed;                     /* the output size so far does not depend on the image */
    int out_h, out_w;
    int dtype, layout;              /* set by to_dtype (dtype 0: not yet) */
    bool value_stage_seen;          /* normalize or to_dtype came already */
    /* The step being checked, for transform_build_fail. */
    size_t i;
    const char *name;
    struct transform_error *at;
    char *errbuf;
};

/* A transform kind: its schema (the config's names), its defaults and its check. */
struct transform_kind_desc {
    struct transform_schema schema;
    struct transform_spec defaults;
    bool geometric;                 /* changes the image's geometry: must come before normalize/to_dtype */
    /* Checks step b->i of b->p (b->p->steps[b->i]) and folds it into b. Main thread. */
    int (*check)(struct transform_build *b, struct tstep *s);
};

/* "transforms[i] (name): <message>" into b->errbuf, blaming parameter `param` (NULL:
 * the transform itself); returns LD_ECONFIG. */
int transform_build_fail(struct transform_build *b, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The plug-in kind (transform_plugin.c); its check loads the plug-in when
 * b->load_plugins. */
extern const struct transform_kind_desc transform_plugin_kind;
/* Ends a step's plug-in: its free(), dlclose. Accepts a step without one. */
void transform_plugin_close(struct tstep *s);

/* ---- planning (transform_plan.c) ------------------------------------------------- */

/* The PRNG stream of transform i: its position, not counting a leading decode, so that
 * adding decode options (max_pixels, dct_scaling) never changes the augmentation. */
static inline uint64_t transform_rng_step(const transform_pipeline *p, size_t i)
{
    return (uint64_t)(i - p->key_base);
}

enum stage_kind { STAGE_RESAMPLE = 1, STAGE_PAD, STAGE_PLUGIN };

/* A stage reads rectangle `in` of the previous image (in that image's coordinates;
 * the decoded image's are full-size coordinates) and makes an image out_w x out_h, of
 * which only the rectangle the next stage reads is computed. */
struct stage {
    enum stage_kind kind;
    struct transform_rect in;
    int out_w, out_h;
    int pad_x, pad_y;               /* PAD: where `in` lands */
    bool flip;                      /* PLUGIN: mirror the image before the call */
    size_t step;                    /* PLUGIN: which transform */
};

struct plan {
    int n;
    struct stage st[TRANSFORM_MAX];
    struct transform_rect final;    /* what is written, in the last image */
    bool flip;                      /* mirror it while writing */
};

/* The plan of one sample on a w0 x h0 image: LD_ESAMPLE (errbuf) when a planned size
 * is absurd. Draws the sample's random crops and flips. */
int transform_plan_build(const transform_pipeline *p, int w0, int h0, uint64_t seed,
                         uint64_t epoch, uint64_t index, struct plan *pl, char *errbuf);
/* The decode options the plan allows: the smallest DCT scale and the region read. */
void transform_plan_decode_hint(const transform_pipeline *p, const struct plan *pl, int w0,
                                int h0, struct image_decode_opts *o);

#endif
