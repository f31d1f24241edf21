/* transform — the transform kinds and the building of a dataset's image pipeline from
 * its spec (see transform.h for the transforms and their semantics).
 *
 * Each kind is one descriptor below: its name and parameter schema (which the config
 * loader walks, so the names are written only here), its defaults and the check that
 * folds one step into the pipeline being built (output size, dtype, layout, what may
 * follow what). The plug-in kind lives with its loader in transform_plugin.c. Building
 * runs once per dataset on the main thread; the per-sample work is planned in
 * transform_plan.c and executed in transform_emit.c. */
#include "transform_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ld_error.h"
#include "proto.h"

/* The target of a parameter in struct transform_spec. */
#define SPEC_AT(f) .offset = offsetof(struct transform_spec, f), .width = sizeof(((struct transform_spec *)0)->f)
#define N_PARAMS(t) (sizeof(t) / sizeof((t)[0]))
#define SIZE_RULE "give either size or height and width, not both"

int transform_build_fail(struct transform_build *b, const char *param, const char *fmt, ...)
{
    char msg[LD_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ld_errorf(b->errbuf, "transforms[%zu] (%s): %s", b->i, b->name, msg);
    b->at->index = b->i;
    b->at->param = param;
    return LD_ECONFIG;
}

static bool size_ok(int v)
{
    return v >= 1 && v <= TRANSFORM_MAX_SIDE;
}

/* ---- decode ------------------------------------------------------------------------ */

static const struct transform_param decode_params[] = {
    {.name = "max_pixels", .type = TRANSFORM_PARAM_INT, .min = 1, .max = INT64_MAX, SPEC_AT(decode.max_pixels)},
    {.name = "strict", .type = TRANSFORM_PARAM_BOOL, SPEC_AT(decode.strict)},
    {.name = "dct_scaling", .type = TRANSFORM_PARAM_BOOL, SPEC_AT(decode.dct_scaling)},
    {.name = "fast", .type = TRANSFORM_PARAM_BOOL, SPEC_AT(decode.fast)},
};

static int decode_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    transform_pipeline *p = b->p;
    if (b->i != 0)
        return transform_build_fail(b, NULL, "must be the first transform");
    p->decode.max_pixels = sp->decode.max_pixels ? sp->decode.max_pixels : IMAGE_DEFAULT_MAX_PIXELS;
    p->decode.strict = sp->decode.strict;
    p->decode.fast = sp->decode.fast;
    p->dct_scaling = sp->decode.dct_scaling;
    return 0;
}

static const struct transform_kind_desc decode_kind = {
    .schema = {.kind = TRANSFORM_DECODE, .name = "decode", .params = decode_params,
               .n_params = N_PARAMS(decode_params)},
    .defaults = {.kind = TRANSFORM_DECODE},
    .check = decode_check,
};

/* ---- resize ------------------------------------------------------------------------ */

static const struct transform_param resize_params[] = {
    {.name = "size", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE, SPEC_AT(resize.size),
     .flags = TRANSFORM_PARAM_EITHER_A},
    {.name = "height", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE, SPEC_AT(resize.height),
     .flags = TRANSFORM_PARAM_EITHER_B},
    {.name = "width", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE, SPEC_AT(resize.width),
     .flags = TRANSFORM_PARAM_EITHER_B},
};

static int resize_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    if (sp->resize.size > 0) {
        if (sp->resize.height || sp->resize.width)
            return transform_build_fail(b, "size", "give either size (the shorter side) or height and width, not both");
        if (!size_ok(sp->resize.size))
            return transform_build_fail(b, "size", "size %d out of range [1, %d]", sp->resize.size,
                                        TRANSFORM_MAX_SIDE);
        b->fixed = false;
        return 0;
    }
    if (sp->resize.size < 0)
        return transform_build_fail(b, "size", "size %d out of range [1, %d]", sp->resize.size, TRANSFORM_MAX_SIDE);
    if (!size_ok(sp->resize.height) || !size_ok(sp->resize.width))
        return transform_build_fail(b, !size_ok(sp->resize.height) ? "height" : "width",
                                    "height %d and width %d must be in [1, %d] (or give size)",
                                    sp->resize.height, sp->resize.width, TRANSFORM_MAX_SIDE);
    b->fixed = true;
    b->out_h = sp->resize.height;
    b->out_w = sp->resize.width;
    return 0;
}

static const struct transform_kind_desc resize_kind = {
    .schema = {.kind = TRANSFORM_RESIZE, .name = "resize", .params = resize_params,
               .n_params = N_PARAMS(resize_params), .either = SIZE_RULE},
    .defaults = {.kind = TRANSFORM_RESIZE},
    .geometric = true,
    .check = resize_check,
};

/* ---- center_crop ------------------------------------------------------------------- */

static const struct transform_param center_crop_params[] = {
    {.name = "size", .type = TRANSFORM_PARAM_SQUARE, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(center_crop.height), .offset2 = offsetof(struct transform_spec, center_crop.width),
     .flags = TRANSFORM_PARAM_EITHER_A},
    {.name = "height", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(center_crop.height), .flags = TRANSFORM_PARAM_EITHER_B},
    {.name = "width", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(center_crop.width), .flags = TRANSFORM_PARAM_EITHER_B},
};

static int center_crop_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    if (!size_ok(sp->center_crop.height) || !size_ok(sp->center_crop.width))
        return transform_build_fail(b, !size_ok(sp->center_crop.height) ? "height" : "width",
                                    "height %d and width %d must be in [1, %d]", sp->center_crop.height,
                                    sp->center_crop.width, TRANSFORM_MAX_SIDE);
    b->fixed = true;
    b->out_h = sp->center_crop.height;
    b->out_w = sp->center_crop.width;
    return 0;
}

static const struct transform_kind_desc center_crop_kind = {
    .schema = {.kind = TRANSFORM_CENTER_CROP, .name = "center_crop", .params = center_crop_params,
               .n_params = N_PARAMS(center_crop_params), .either = SIZE_RULE},
    .defaults = {.kind = TRANSFORM_CENTER_CROP},
    .geometric = true,
    .check = center_crop_check,
};

/* ---- random_resized_crop ----------------------------------------------------------- */

static const struct transform_param random_resized_crop_params[] = {
    {.name = "size", .type = TRANSFORM_PARAM_SQUARE, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(random_resized_crop.height), .offset2 = offsetof(struct transform_spec, random_resized_crop.width),
     .flags = TRANSFORM_PARAM_EITHER_A},
    {.name = "height", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(random_resized_crop.height), .flags = TRANSFORM_PARAM_EITHER_B},
    {.name = "width", .type = TRANSFORM_PARAM_INT, .min = 1, .max = TRANSFORM_MAX_SIDE,
     SPEC_AT(random_resized_crop.width), .flags = TRANSFORM_PARAM_EITHER_B},
    {.name = "scale", .type = TRANSFORM_PARAM_NUMBERS, .min = 2, .max = 2, SPEC_AT(random_resized_crop.scale)},
    {.name = "ratio", .type = TRANSFORM_PARAM_NUMBERS, .min = 2, .max = 2, SPEC_AT(random_resized_crop.ratio)},
};

static int random_resized_crop_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    const double *sc = sp->random_resized_crop.scale, *ra = sp->random_resized_crop.ratio;
    if (!size_ok(sp->random_resized_crop.height) || !size_ok(sp->random_resized_crop.width))
        return transform_build_fail(b, !size_ok(sp->random_resized_crop.height) ? "height" : "width",
                                    "height %d and width %d must be in [1, %d]", sp->random_resized_crop.height,
                                    sp->random_resized_crop.width, TRANSFORM_MAX_SIDE);
    if (!(sc[0] > 0 && sc[0] <= sc[1] && sc[1] <= 1.0))
        return transform_build_fail(b, "scale", "scale [%g, %g] must satisfy 0 < min <= max <= 1", sc[0], sc[1]);
    if (!(ra[0] > 0 && ra[0] <= ra[1] && isfinite(ra[1]) && ra[1] <= 1e6 && ra[0] >= 1e-6))
        return transform_build_fail(b, "ratio", "ratio [%g, %g] must satisfy 1e-6 <= min <= max <= 1e6", ra[0],
                                    ra[1]);
    b->fixed = true;
    b->out_h = sp->random_resized_crop.height;
    b->out_w = sp->random_resized_crop.width;
    return 0;
}

static const struct transform_kind_desc random_resized_crop_kind = {
    .schema = {.kind = TRANSFORM_RANDOM_RESIZED_CROP, .name = "random_resized_crop",
               .params = random_resized_crop_params, .n_params = N_PARAMS(random_resized_crop_params),
               .either = SIZE_RULE},
    /* torchvision's defaults */
    .defaults = {.kind = TRANSFORM_RANDOM_RESIZED_CROP,
                 .random_resized_crop = {.scale = {0.08, 1.0}, .ratio = {3.0 / 4.0, 4.0 / 3.0}}},
    .geometric = true,
    .check = random_resized_crop_check,
};

/* ---- random_flip ------------------------------------------------------------------- */

static const struct transform_param random_flip_params[] = {
    {.name = "p", .type = TRANSFORM_PARAM_NUMBER, SPEC_AT(random_flip.p)},
};

static int random_flip_check(struct transform_build *b, struct tstep *s)
{
    double p = s->spec.random_flip.p;
    if (!(p >= 0.0 && p <= 1.0))
        return transform_build_fail(b, "p", "p %g must be in [0, 1]", p);
    return 0;
}

static const struct transform_kind_desc random_flip_kind = {
    .schema = {.kind = TRANSFORM_RANDOM_FLIP, .name = "random_flip", .params = random_flip_params,
               .n_params = N_PARAMS(random_flip_params)},
    .defaults = {.kind = TRANSFORM_RANDOM_FLIP, .random_flip = {.p = 0.5}},
    .check = random_flip_check,
};

/* ---- normalize --------------------------------------------------------------------- */

static const struct transform_param normalize_params[] = {
    {.name = "mean", .type = TRANSFORM_PARAM_NUMBERS, .min = 1, .max = 4, SPEC_AT(normalize.mean),
     .offset2 = offsetof(struct transform_spec, normalize.n_mean), .flags = TRANSFORM_PARAM_COUNTED},
    {.name = "std", .type = TRANSFORM_PARAM_NUMBERS, .min = 1, .max = 4, SPEC_AT(normalize.std),
     .offset2 = offsetof(struct transform_spec, normalize.n_std), .flags = TRANSFORM_PARAM_COUNTED},
};

static int normalize_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    if (b->p->has_normalize)
        return transform_build_fail(b, NULL, "normalize appears twice");
    int nm = sp->normalize.n_mean, ns = sp->normalize.n_std;
    if (nm != 1 && nm != 3)
        return transform_build_fail(b, "mean", "mean has %d values, expected 3 (or 1 for every channel)", nm);
    if (ns != 1 && ns != 3)
        return transform_build_fail(b, "std", "std has %d values, expected 3 (or 1 for every channel)", ns);
    for (int c = 0; c < 3; c++) {
        double m = sp->normalize.mean[nm == 1 ? 0 : c], sd = sp->normalize.std[ns == 1 ? 0 : c];
        if (!isfinite(m))
            return transform_build_fail(b, "mean", "mean[%d] is not a finite number", c);
        if (!isfinite(sd) || sd == 0.0)
            return transform_build_fail(b, "std", "std[%d] is %g: it must be a finite non-zero number", c, sd);
    }
    b->p->has_normalize = true;
    b->value_stage_seen = true;
    return 0;
}

static const struct transform_kind_desc normalize_kind = {
    .schema = {.kind = TRANSFORM_NORMALIZE, .name = "normalize", .params = normalize_params,
               .n_params = N_PARAMS(normalize_params)},
    .defaults = {.kind = TRANSFORM_NORMALIZE},
    .check = normalize_check,
};

/* ---- to_dtype ---------------------------------------------------------------------- */

/* The dtypes an image sample can be written as. */
static int image_dtype_from_name(const char *name)
{
    int dt = proto_dtype_from_name(name);
    return dt == LD_DTYPE_UINT8 || dt == LD_DTYPE_FLOAT16 || dt == LD_DTYPE_FLOAT32 ? dt : -1;
}

static const struct transform_param to_dtype_params[] = {
    {.name = "dtype", .type = TRANSFORM_PARAM_ENUM, SPEC_AT(to_dtype.dtype), .from_name = image_dtype_from_name,
     .choices = "one of uint8, float16, float32"},
    {.name = "layout", .type = TRANSFORM_PARAM_ENUM, SPEC_AT(to_dtype.layout),
     .from_name = transform_layout_from_name, .choices = "CHW or HWC"},
};

static int to_dtype_check(struct transform_build *b, struct tstep *s)
{
    const struct transform_spec *sp = &s->spec;
    if (b->dtype)
        return transform_build_fail(b, NULL, "to_dtype appears twice");
    if (sp->to_dtype.dtype != LD_DTYPE_UINT8 && sp->to_dtype.dtype != LD_DTYPE_FLOAT16 &&
        sp->to_dtype.dtype != LD_DTYPE_FLOAT32) {
        const char *dn = proto_dtype_name(sp->to_dtype.dtype);
        return transform_build_fail(b, "dtype", "dtype %s is not an image output: uint8, float16 or float32",
                                    dn ? dn : "(unknown)");
    }
    if (sp->to_dtype.layout != TRANSFORM_LAYOUT_CHW && sp->to_dtype.layout != TRANSFORM_LAYOUT_HWC)
        return transform_build_fail(b, "layout", "layout must be CHW or HWC");
    b->dtype = sp->to_dtype.dtype;
    b->layout = sp->to_dtype.layout;
    b->value_stage_seen = true;
    return 0;
}

static const struct transform_kind_desc to_dtype_kind = {
    .schema = {.kind = TRANSFORM_TO_DTYPE, .name = "to_dtype", .params = to_dtype_params,
               .n_params = N_PARAMS(to_dtype_params)},
    .defaults = {.kind = TRANSFORM_TO_DTYPE, .to_dtype = {.dtype = LD_DTYPE_UINT8, .layout = TRANSFORM_LAYOUT_CHW}},
    .check = to_dtype_check,
};

/* ---- the kinds ------------------------------------------------------------------- */

/* Every kind, by enum transform_kind; the order is the one messages list them in. */
static const struct transform_kind_desc *const kinds[] = {
    [TRANSFORM_DECODE] = &decode_kind,
    [TRANSFORM_RESIZE] = &resize_kind,
    [TRANSFORM_CENTER_CROP] = &center_crop_kind,
    [TRANSFORM_RANDOM_RESIZED_CROP] = &random_resized_crop_kind,
    [TRANSFORM_RANDOM_FLIP] = &random_flip_kind,
    [TRANSFORM_NORMALIZE] = &normalize_kind,
    [TRANSFORM_TO_DTYPE] = &to_dtype_kind,
    [TRANSFORM_PLUGIN] = &transform_plugin_kind,
};
#define KIND_COUNT (sizeof kinds / sizeof kinds[0])

static const struct transform_kind_desc *kind_desc(enum transform_kind kind)
{
    return (unsigned)kind < KIND_COUNT ? kinds[kind] : NULL;
}

const struct transform_schema *transform_schema_of(enum transform_kind kind)
{
    const struct transform_kind_desc *d = kind_desc(kind);
    return d ? &d->schema : NULL;
}

const struct transform_schema *transform_schema_find(const char *name)
{
    for (size_t k = 0; name && k < KIND_COUNT; k++)
        if (kinds[k] && strcmp(name, kinds[k]->schema.name) == 0)
            return &kinds[k]->schema;
    return NULL;
}

const char *transform_names(char *buf, size_t size)
{
    size_t used = 0;
    if (size)
        buf[0] = '\0';
    for (size_t k = 0; k < KIND_COUNT && used < size; k++) {
        if (!kinds[k])
            continue;
        int w = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", kinds[k]->schema.name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

const char *transform_kind_name(enum transform_kind kind)
{
    const struct transform_schema *s = transform_schema_of(kind);
    return s ? s->name : NULL;
}

int transform_kind_from_name(const char *name)
{
    const struct transform_schema *s = transform_schema_find(name);
    return s ? (int)s->kind : LD_EINVAL;
}

int transform_layout_from_name(const char *name)
{
    if (name && strcasecmp(name, "CHW") == 0)
        return TRANSFORM_LAYOUT_CHW;
    if (name && strcasecmp(name, "HWC") == 0)
        return TRANSFORM_LAYOUT_HWC;
    return LD_EINVAL;
}

void transform_spec_init(struct transform_spec *s, enum transform_kind kind)
{
    const struct transform_kind_desc *d = kind_desc(kind);
    if (d) {
        *s = d->defaults;
    } else {
        memset(s, 0, sizeof *s);
        s->kind = kind;
    }
}

void transform_spec_clear(struct transform_spec *s)
{
    const struct transform_schema *sc = s ? transform_schema_of(s->kind) : NULL;
    for (size_t i = 0; sc && i < sc->n_params; i++) {
        const struct transform_param *pr = &sc->params[i];
        if (pr->type != TRANSFORM_PARAM_PATH && pr->type != TRANSFORM_PARAM_JSON)
            continue;
        char *v;
        memcpy(&v, (char *)s + pr->offset, sizeof v);
        free(v);
        v = NULL;
        memcpy((char *)s + pr->offset, &v, sizeof v);
    }
}

/* ---- numbers --------------------------------------------------------------------- */

uint16_t transform_half_from_double(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    uint16_t sign = (uint16_t)((b >> 48) & 0x8000u);
    int exp = (int)((b >> 52) & 0x7ff);
    uint64_t mant = b & ((UINT64_C(1) << 52) - 1);
    if (exp == 0x7ff)
        return sign | (mant ? 0x7e00 : 0x7c00);
    int e = exp - 1023 + 15;            /* the half's biased exponent */
    if (e >= 31)
        return sign | 0x7c00;
    uint64_t m;
    int shift;
    if (e >= 1) {
        m = mant;
        shift = 42;                     /* 52 - 10 mantissa bits */
    } else {
        if (exp == 0)                   /* a double subnormal is far below half's range */
            return sign;
        m = mant | (UINT64_C(1) << 52);
        shift = 42 + 1 - e;
        if (shift > 53)                 /* below half the smallest subnormal */
            return sign;
        e = 0;
    }
    uint64_t q = m >> shift;
    uint64_t rem = m & ((UINT64_C(1) << shift) - 1);
    uint64_t halfway = UINT64_C(1) << (shift - 1);
    /* A carry out of the mantissa lands in the exponent, which is what rounding up to
     * the next binade (or to infinity) needs. */
    uint32_t h = ((uint32_t)e << 10) + (uint32_t)q;
    if (rem > halfway || (rem == halfway && (q & 1)))
        h++;
    return sign | (uint16_t)h;
}

/* ---- building the pipeline --------------------------------------------------------- */

/* Checks transform b->i and folds it into the pipeline's state. */
static int check_step(struct transform_build *b)
{
    struct tstep *s = &b->p->steps[b->i];
    const struct transform_kind_desc *d = kind_desc(s->spec.kind);
    if (!d) {
        ld_errorf(b->errbuf, "transforms[%zu]: unknown kind %d", b->i, (int)s->spec.kind);
        b->at->index = b->i;
        b->at->param = NULL;
        return LD_ECONFIG;
    }
    b->name = d->schema.name;
    if (d->geometric && b->value_stage_seen)
        return transform_build_fail(b, NULL, "must come before normalize and to_dtype, which act when the "
                                    "sample is written");
    return d->check(b, s);
}

static void build_luts(transform_pipeline *p, const struct transform_spec *norm)
{
    for (int c = 0; c < 3; c++) {
        double mean = 0.0, sd = 1.0;
        if (norm) {
            mean = norm->normalize.mean[norm->normalize.n_mean == 1 ? 0 : c];
            sd = norm->normalize.std[norm->normalize.n_std == 1 ? 0 : c];
        }
        for (int v = 0; v < 256; v++) {
            double x = ((double)v / 255.0 - mean) / sd;
            p->lut32[c][v] = (float)x;
            p->lut16[c][v] = transform_half_from_double(x);
        }
    }
}

/* Checks the list and builds the pipeline; plug-ins are loaded only when load_plugins.
 * On failure *at says where the fault is. */
static int pipeline_build(const struct transform_spec *specs, size_t n, bool load_plugins,
                          transform_pipeline **ret_pipeline, struct transform_error *at,
                          char *errbuf)
{
    at->index = n;                  /* the list as a whole, until a step is blamed */
    at->param = NULL;
    if (n == 0 || !specs) {
        ld_errorf(errbuf, "transforms: the list is empty; it must at least give the output "
                  "size (center_crop, random_resized_crop or resize with height and width)");
        return LD_ECONFIG;
    }
    if (n > TRANSFORM_MAX) {
        ld_errorf(errbuf, "transforms: %zu transforms, at most %d", n, TRANSFORM_MAX);
        return LD_ECONFIG;
    }
    transform_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    int r = 0;
    p->n = n;
    p->decode.max_pixels = IMAGE_DEFAULT_MAX_PIXELS;
    p->dct_scaling = false;
    for (size_t i = 0; i < n; i++) {
        p->steps[i].spec = specs[i];
        if (specs[i].kind == TRANSFORM_PLUGIN) {
            /* Copies, so the config may be freed; the spec's pointers are not used again. */
            p->steps[i].path = specs[i].plugin.path ? strdup(specs[i].plugin.path) : NULL;
            p->steps[i].params = specs[i].plugin.params_json ? strdup(specs[i].plugin.params_json)
                                                             : NULL;
            p->steps[i].spec.plugin.path = NULL;
            p->steps[i].spec.plugin.params_json = NULL;
            if ((specs[i].plugin.path && !p->steps[i].path) ||
                (specs[i].plugin.params_json && !p->steps[i].params)) {
                ld_errorf(errbuf, "out of memory");
                r = LD_ENOMEM;
                goto fail;
            }
        }
    }
    struct transform_build b = {.p = p, .load_plugins = load_plugins, .layout = TRANSFORM_LAYOUT_CHW,
                                .at = at, .errbuf = errbuf};
    const struct transform_spec *norm = NULL;
    p->key_base = specs[0].kind == TRANSFORM_DECODE ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        b.i = i;
        r = check_step(&b);
        if (r < 0)
            goto fail;
        if (specs[i].kind == TRANSFORM_NORMALIZE)
            norm = &specs[i];
    }
    if (!b.fixed) {
        ld_errorf(errbuf, "transforms: the output size depends on the image; end the list with "
                  "center_crop, random_resized_crop or resize with height and width");
        r = LD_ECONFIG;
        goto fail;
    }
    int dtype = b.dtype, layout = b.layout, out_h = b.out_h, out_w = b.out_w;
    if (!dtype)
        dtype = norm ? LD_DTYPE_FLOAT32 : LD_DTYPE_UINT8;
    if (norm && dtype == LD_DTYPE_UINT8) {
        for (size_t i = 0; i < n; i++)
            if (specs[i].kind == TRANSFORM_NORMALIZE) {
                ld_errorf(errbuf, "transforms[%zu] (normalize): the output dtype is uint8, which "
                          "cannot hold normalized values; use to_dtype float32 or float16", i);
                at->index = i;
            }
        r = LD_ECONFIG;
        goto fail;
    }
    if ((uint64_t)out_w * (uint64_t)out_h > p->decode.max_pixels) {
        ld_errorf(errbuf, "transforms: the output %dx%d is over the pixel limit of %llu", out_w,
                  out_h, (unsigned long long)p->decode.max_pixels);
        r = LD_ECONFIG;
        goto fail;
    }
    build_luts(p, norm);
    struct transform_output *o = &p->out;
    o->dtype = dtype;
    o->layout = (enum transform_layout)layout;
    o->channels = 3;
    o->height = out_h;
    o->width = out_w;
    if (layout == TRANSFORM_LAYOUT_CHW) {
        o->shape[0] = 3;
        o->shape[1] = out_h;
        o->shape[2] = out_w;
    } else {
        o->shape[0] = out_h;
        o->shape[1] = out_w;
        o->shape[2] = 3;
    }
    o->sample_bytes = (size_t)out_h * (size_t)out_w * 3 * proto_dtype_size(dtype);
    o->max_pixels = p->decode.max_pixels;
    *ret_pipeline = p;
    return 0;
fail:
    transform_pipeline_free(p);
    return r;
}

int transform_pipeline_new(const struct transform_spec *specs, size_t n,
                           transform_pipeline **ret_pipeline, struct transform_output *ret_output,
                           char *errbuf)
{
    struct transform_error at;
    transform_pipeline *p;
    int r = pipeline_build(specs, n, true, &p, &at, errbuf);
    if (r < 0)
        return r;
    if (ret_output)
        *ret_output = p->out;
    *ret_pipeline = p;
    return 0;
}

int transform_specs_check(const struct transform_spec *specs, size_t n,
                          struct transform_error *ret_at, char *errbuf)
{
    struct transform_error at;
    transform_pipeline *p;
    int r = pipeline_build(specs, n, false, &p, &at, errbuf);
    if (r < 0) {
        if (ret_at)
            *ret_at = at;
        return r;
    }
    transform_pipeline_free(p);
    return 0;
}

void transform_pipeline_free(transform_pipeline *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        struct tstep *s = &p->steps[i];
        transform_plugin_close(s);
        free(s->path);
        free(s->params);
    }
    free(p);
}

const struct transform_output *transform_pipeline_output(const transform_pipeline *p)
{
    return &p->out;
}
