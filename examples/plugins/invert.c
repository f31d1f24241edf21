/* ld-plugin-invert — an example transform plug-in: inverts the image's colors with
 * probability p, and optionally adds deterministic noise drawn from the PRNG loaderd
 * hands it, so the same (seed, epoch, sample) always gives the same pixels.
 *
 * Parameters (a JSON object; both optional):
 *   p      probability of inverting, in [0, 1] (default 1: always)
 *   noise  maximum amplitude of uniform noise added to each byte, 0..255 (default 0)
 * The parameters are parsed by hand to keep the example free of dependencies; a real
 * plug-in would use a JSON library.
 *
 * Build: cc -shared -fPIC -I<loaderd>/daemon -o ld-plugin-invert.so invert.c
 * Use:   transforms: [..., {plugin: {path: ./ld-plugin-invert.so, params: {p: 0.5}}}, ...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transform_plugin.h"

struct invert_state {
    double p;
    int noise;
};

/* The number after "key": in a flat JSON object, or the default. Returns -1 on a
 * malformed value. */
static int json_number(const char *json, const char *key, double dflt, double *ret)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *at = strstr(json, quoted);
    if (!at) {
        *ret = dflt;
        return 0;
    }
    at += strlen(quoted);
    while (*at == ' ' || *at == '\t' || *at == '\n')
        at++;
    if (*at++ != ':')
        return -1;
    char *end;
    double v = strtod(at, &end);
    if (end == at)
        return -1;
    *ret = v;
    return 0;
}

static int invert_init(const char *params_json, void **ret_state, char *err)
{
    double p, noise;
    if (json_number(params_json, "p", 1.0, &p) < 0 || json_number(params_json, "noise", 0, &noise) < 0) {
        snprintf(err, LD_PLUGIN_ERR_MAX, "params must be a JSON object of numbers, got %s",
                 params_json);
        return 1;
    }
    if (!(p >= 0.0 && p <= 1.0)) {
        snprintf(err, LD_PLUGIN_ERR_MAX, "p = %g must be in [0, 1]", p);
        return 1;
    }
    if (!(noise >= 0.0 && noise <= 255.0) || noise != (int)noise) {
        snprintf(err, LD_PLUGIN_ERR_MAX, "noise = %g must be an integer in [0, 255]", noise);
        return 1;
    }
    struct invert_state *s = malloc(sizeof *s);
    if (!s) {
        snprintf(err, LD_PLUGIN_ERR_MAX, "out of memory");
        return 1;
    }
    s->p = p;
    s->noise = (int)noise;
    *ret_state = s;
    return 0;
}

static int invert_apply(void *state, struct ld_image *img, struct ld_prng *rng,
                        const struct ld_sample_info *info, char *err)
{
    const struct invert_state *s = state;
    (void)info;
    (void)err;
    /* Always draw, so the noise below does not depend on whether p is 0 or 1. */
    int invert = ld_prng_uniform(rng) < s->p;
    for (int y = 0; y < img->height; y++) {
        uint8_t *row = img->data + (size_t)y * img->stride;
        for (size_t i = 0; i < (size_t)img->width * 3; i++) {
            int v = invert ? 255 - row[i] : row[i];
            if (s->noise) {
                v += (int)ld_prng_below(rng, 2u * (unsigned)s->noise + 1) - s->noise;
                v = v < 0 ? 0 : v > 255 ? 255 : v;
            }
            row[i] = (uint8_t)v;
        }
    }
    return 0;
}

static void invert_free(void *state)
{
    free(state);
}

static const struct ld_transform_plugin_v1 invert_plugin = {
    .abi_version = LD_TRANSFORM_PLUGIN_ABI_V1,
    .struct_size = sizeof(struct ld_transform_plugin_v1),
    .name = "invert",
    .init = invert_init,
    .apply = invert_apply,
    .free = invert_free,
};

const struct ld_transform_plugin_v1 *ld_transform_plugin_v1(void)
{
    return &invert_plugin;
}
