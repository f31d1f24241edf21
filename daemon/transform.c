/* transform — builds a dataset's image pipeline from its spec and runs it on one
 * sample (see transform.h for the transforms and their semantics).
 *
 * A sample goes through three phases:
 *  1. plan: on the header's size, before anything is decoded, the list becomes a few
 *     stages over integer rectangles: a resample (resize, or the crop + resize of
 *     random_resized_crop), a pad (center_crop larger than the image) or a plug-in
 *     call. Crops only move the rectangle the next stage reads; a horizontal flip is
 *     a pending bit that mirrors the crops drawn after it and is applied when pixels
 *     are written (it commutes with the symmetric resize filter). Random draws happen
 *     here, on full-size coordinates, so they never depend on the decode scale.
 *  2. decode: at the DCT scale the first resample allows (transform.h).
 *  3. execute: each stage computes only what the next one reads (a resize followed
 *     by a center crop resamples just the crop), and the last one streams its rows
 *     into the emitter, which applies the flip, normalize, dtype and layout while
 *     writing into the batch slot. No full-size intermediate copy is ever made.
 * Buffers come from the worker's struct image_buf: the decoded image, then two image
 * slots used alternately by the stages. */
#include "transform.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ld_error.h"
#include "proto.h"
#include "resample.h"

/* Planned sizes beyond this (a shorter-side resize of a 1-pixel-high strip) are
 * refused rather than overflow an int. */
#define PLAN_MAX_SIDE (1 << 24)

/* With decode.dct_scaling, the DCT reduction leaves at least this many decoded pixels
 * per output pixel of the first resize, so that the resize still filters.
 *
 * Why scaled decoding is off by default: libjpeg's reduced IDCT keeps only the low
 * frequencies of each 8x8 block. On smooth content that is close to averaging, but a
 * sharp edge rings inside its block and content above the new Nyquist frequency is
 * dropped where PIL's triangle filter keeps its side lobes, so the result differs from
 * a full-size decode + PIL's antialiased resize. Measured against exactly that (PIL
 * 9.4, RandomResizedCrop 224 and Resize 256 + CenterCrop 224, JPEG q75-95 photographs
 * of 500x375 to 6000x4000 px and synthetic stripes, zone plates and checkerboards),
 * by the least remaining factor allowed: 1 (the old rule): max 72 levels, mean up to
 * 4.6 per image; 2: max 22 (photographs 14), mean up to 2.1 (photographs 0.18); 3:
 * max 18; 4: max 15; 6: max 3; 8: max 1, where a reduction is almost never possible.
 * The full-size decode stays within +-1, and costs 0-35% more CPU (none for images
 * under twice the output size, the ImageNet case; README "Image pipelines"). */
#define TRANSFORM_DCT_MIN_FACTOR 2.0

struct tstep {
    struct transform_spec spec;
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
    size_t key_base;                /* 1 when the list starts with decode (see rng_step) */
    struct image_decode_opts decode;
    bool dct_scaling;
    bool has_normalize;
    struct transform_output out;
    float lut32[3][256];
    uint16_t lut16[3][256];
};

static const char *const kind_names[] = {
    [TRANSFORM_DECODE] = "decode",
    [TRANSFORM_RESIZE] = "resize",
    [TRANSFORM_CENTER_CROP] = "center_crop",
    [TRANSFORM_RANDOM_RESIZED_CROP] = "random_resized_crop",
    [TRANSFORM_RANDOM_FLIP] = "random_flip",
    [TRANSFORM_NORMALIZE] = "normalize",
    [TRANSFORM_TO_DTYPE] = "to_dtype",
    [TRANSFORM_PLUGIN] = "plugin",
};
#define KIND_COUNT (sizeof kind_names / sizeof kind_names[0])

const char *transform_kind_name(enum transform_kind kind)
{
    if ((unsigned)kind >= KIND_COUNT)
        return NULL;
    return kind_names[kind];
}

int transform_kind_from_name(const char *name)
{
    for (size_t k = 1; name && k < KIND_COUNT; k++)
        if (strcmp(name, kind_names[k]) == 0)
            return (int)k;
    return LD_EINVAL;
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
    memset(s, 0, sizeof *s);
    s->kind = kind;
    switch (kind) {
    case TRANSFORM_RANDOM_RESIZED_CROP:
        s->random_resized_crop.scale[0] = 0.08;
        s->random_resized_crop.scale[1] = 1.0;
        s->random_resized_crop.ratio[0] = 3.0 / 4.0;
        s->random_resized_crop.ratio[1] = 4.0 / 3.0;
        break;
    case TRANSFORM_RANDOM_FLIP:
        s->random_flip.p = 0.5;
        break;
    case TRANSFORM_TO_DTYPE:
        s->to_dtype.dtype = LD_DTYPE_UINT8;
        s->to_dtype.layout = TRANSFORM_LAYOUT_CHW;
        break;
    default:
        break;
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

/* Python's round() for x >= 0: half to even, independent of the FPU's rounding mode. */
static double round_half_even(double x)
{
    double r = floor(x);
    double d = x - r;
    if (d > 0.5 || (d == 0.5 && fmod(r, 2.0) != 0.0))
        r += 1.0;
    return r;
}

/* round((n - c) / 2) for an integer n - c >= 0, half to even (torchvision's center crop). */
static int half_even_div2(int d)
{
    int q = d / 2;
    if (d % 2 && (q & 1))
        q++;
    return q;
}

void transform_random_resized_crop_params(int width, int height, const double scale[2],
                                          const double ratio[2], struct ld_prng *rng,
                                          struct transform_rect *ret)
{
    double area = (double)width * (double)height;
    double lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale[0] + (scale[1] - scale[0]) * ld_prng_uniform(rng));
        double ar = exp(lr0 + (lr1 - lr0) * ld_prng_uniform(rng));
        double w = round_half_even(sqrt(target * ar));
        double h = round_half_even(sqrt(target / ar));
        if (w > 0 && w <= width && h > 0 && h <= height) {
            ret->width = (int)w;
            ret->height = (int)h;
            ret->y = (int)ld_prng_below(rng, (uint64_t)(height - ret->height) + 1);
            ret->x = (int)ld_prng_below(rng, (uint64_t)(width - ret->width) + 1);
            return;
        }
    }
    /* Fallback: the whole image, cut to the nearest allowed ratio. */
    double in_ratio = (double)width / (double)height;
    int w = width, h = height;
    if (in_ratio < ratio[0])
        h = (int)round_half_even(w / ratio[0]);
    else if (in_ratio > ratio[1])
        w = (int)round_half_even(h * ratio[1]);
    if (h < 1)
        h = 1;
    if (w < 1)
        w = 1;
    if (h > height)
        h = height;
    if (w > width)
        w = width;
    ret->width = w;
    ret->height = h;
    ret->y = (height - h) / 2;
    ret->x = (width - w) / 2;
}

/* ---- building the pipeline --------------------------------------------------------- */

static bool size_ok(int v)
{
    return v >= 1 && v <= TRANSFORM_MAX_SIDE;
}

/* An error in transform i, about its parameter `param_` (NULL: the transform itself):
 * "transforms[2] (normalize): ...", numbered from 0 as the config's positions are. */
#define STEP_ERR(param_, ...)                                                           \
    do {                                                                                \
        char msg_[LD_ERRMSG_MAX];                                                       \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                       \
        ld_errorf(errbuf, "transforms[%zu] (%s): %s", i, name, msg_);                   \
        at->index = i;                                                                  \
        at->param = (param_);                                                           \
        return LD_ECONFIG;                                                              \
    } while (0)

/* What can be said of a plug-in step without loading it. */
static int plugin_check(const char *path, size_t i, struct transform_error *at, char *errbuf)
{
    const char *name = "plugin";
    if (!path || !*path)
        STEP_ERR(NULL, "path is required");
    if (!strchr(path, '/'))
        STEP_ERR("path", "path '%s' must contain a '/' (a bare name would be searched for in "
                 "the system's library path)", path);
    return 0;
}

static int plugin_load(struct tstep *s, size_t i, struct transform_error *at, char *errbuf)
{
    const char *name = "plugin";
    int r = plugin_check(s->path, i, at, errbuf);
    if (r < 0)
        return r;
    dlerror();
    s->dl = dlopen(s->path, RTLD_NOW | RTLD_LOCAL);
    if (!s->dl) {
        const char *e = dlerror();
        STEP_ERR("path", "cannot load '%s': %s", s->path, e ? e : "unknown error");
    }
    void *sym = dlsym(s->dl, LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    if (!sym) {
        for (int v = 9; v >= 2; v--) {
            char other[64];
            snprintf(other, sizeof other, "ld_transform_plugin_v%d", v);
            if (dlsym(s->dl, other))
                STEP_ERR("path", "'%s' was built for plug-in ABI v%d (it exports %s); this loaderd "
                         "supports v%u", s->path, v, other, LD_TRANSFORM_PLUGIN_ABI_V1);
        }
        STEP_ERR("path", "'%s' is not a loaderd transform plug-in: it has no symbol %s", s->path,
                 LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    }
    ld_transform_plugin_v1_fn entry;
    memcpy(&entry, &sym, sizeof entry);     /* POSIX: a data pointer holds a function's address */
    const struct ld_transform_plugin_v1 *d = entry();
    if (!d)
        STEP_ERR("path", "'%s': %s() returned NULL", s->path, LD_TRANSFORM_PLUGIN_SYMBOL_V1);
    if (d->abi_version != LD_TRANSFORM_PLUGIN_ABI_V1)
        STEP_ERR("path", "'%s' declares plug-in ABI version %u; this loaderd supports %u", s->path,
                 d->abi_version, LD_TRANSFORM_PLUGIN_ABI_V1);
    if (d->struct_size < sizeof(struct ld_transform_plugin_v1))
        STEP_ERR("path", "'%s' declares a descriptor of %u bytes, %zu expected", s->path,
                 d->struct_size, sizeof(struct ld_transform_plugin_v1));
    if (!d->apply)
        STEP_ERR("path", "'%s' has no apply function", s->path);
    s->plugin = d;
    if (d->init) {
        char perr[LD_PLUGIN_ERR_MAX] = "";
        void *state = NULL;
        if (d->init(s->params ? s->params : "{}", &state, perr) != 0) {
            perr[sizeof perr - 1] = '\0';
            s->plugin = NULL;       /* init failed: free() must not see its state */
            STEP_ERR("params", "plug-in '%s' (%s) refused its parameters: %s",
                     d->name ? d->name : "?", s->path, perr[0] ? perr : "init failed");
        }
        s->state = state;
    }
    return 0;
}

/* Checks transform i and folds it into the pipeline's state; loads a plug-in only when
 * load_plugins. */
static int check_step(transform_pipeline *p, size_t i, bool load_plugins, bool *fixed, int *out_h,
                      int *out_w, int *dtype, int *layout, bool *value_stage_seen,
                      struct transform_error *at, char *errbuf)
{
    struct tstep *s = &p->steps[i];
    const struct transform_spec *sp = &s->spec;
    const char *name = transform_kind_name(sp->kind);
    if (!name) {
        ld_errorf(errbuf, "transforms[%zu]: unknown kind %d", i, (int)sp->kind);
        at->index = i;
        at->param = NULL;
        return LD_ECONFIG;
    }
    bool geometric = sp->kind == TRANSFORM_RESIZE || sp->kind == TRANSFORM_CENTER_CROP ||
                     sp->kind == TRANSFORM_RANDOM_RESIZED_CROP || sp->kind == TRANSFORM_PLUGIN;
    if (geometric && *value_stage_seen)
        STEP_ERR(NULL, "must come before normalize and to_dtype, which act when the sample is "
                 "written");
    switch (sp->kind) {
    case TRANSFORM_DECODE:
        if (i != 0)
            STEP_ERR(NULL, "must be the first transform");
        p->decode.max_pixels = sp->decode.max_pixels ? sp->decode.max_pixels
                                                     : IMAGE_DEFAULT_MAX_PIXELS;
        p->decode.strict = sp->decode.strict;
        p->decode.fast = sp->decode.fast;
        p->dct_scaling = sp->decode.dct_scaling;
        break;
    case TRANSFORM_RESIZE:
        if (sp->resize.size > 0) {
            if (sp->resize.height || sp->resize.width)
                STEP_ERR("size", "give either size (the shorter side) or height and width, not both");
            if (!size_ok(sp->resize.size))
                STEP_ERR("size", "size %d out of range [1, %d]", sp->resize.size, TRANSFORM_MAX_SIDE);
            *fixed = false;
        } else {
            if (sp->resize.size < 0)
                STEP_ERR("size", "size %d out of range [1, %d]", sp->resize.size, TRANSFORM_MAX_SIDE);
            if (!size_ok(sp->resize.height) || !size_ok(sp->resize.width))
                STEP_ERR(!size_ok(sp->resize.height) ? "height" : "width", "height %d and width %d must be in [1, %d] (or give size)",
                         sp->resize.height, sp->resize.width, TRANSFORM_MAX_SIDE);
            *fixed = true;
            *out_h = sp->resize.height;
            *out_w = sp->resize.width;
        }
        break;
    case TRANSFORM_CENTER_CROP:
        if (!size_ok(sp->center_crop.height) || !size_ok(sp->center_crop.width))
            STEP_ERR(!size_ok(sp->center_crop.height) ? "height" : "width", "height %d and width %d must be in [1, %d]", sp->center_crop.height,
                     sp->center_crop.width, TRANSFORM_MAX_SIDE);
        *fixed = true;
        *out_h = sp->center_crop.height;
        *out_w = sp->center_crop.width;
        break;
    case TRANSFORM_RANDOM_RESIZED_CROP: {
        const double *sc = sp->random_resized_crop.scale, *ra = sp->random_resized_crop.ratio;
        if (!size_ok(sp->random_resized_crop.height) || !size_ok(sp->random_resized_crop.width))
            STEP_ERR(!size_ok(sp->random_resized_crop.height) ? "height" : "width", "height %d and width %d must be in [1, %d]", sp->random_resized_crop.height,
                     sp->random_resized_crop.width, TRANSFORM_MAX_SIDE);
        if (!(sc[0] > 0 && sc[0] <= sc[1] && sc[1] <= 1.0))
            STEP_ERR("scale", "scale [%g, %g] must satisfy 0 < min <= max <= 1", sc[0], sc[1]);
        if (!(ra[0] > 0 && ra[0] <= ra[1] && isfinite(ra[1]) && ra[1] <= 1e6 && ra[0] >= 1e-6))
            STEP_ERR("ratio", "ratio [%g, %g] must satisfy 1e-6 <= min <= max <= 1e6", ra[0], ra[1]);
        *fixed = true;
        *out_h = sp->random_resized_crop.height;
        *out_w = sp->random_resized_crop.width;
        break;
    }
    case TRANSFORM_RANDOM_FLIP:
        if (!(sp->random_flip.p >= 0.0 && sp->random_flip.p <= 1.0))
            STEP_ERR("p", "p %g must be in [0, 1]", sp->random_flip.p);
        break;
    case TRANSFORM_NORMALIZE: {
        if (p->has_normalize)
            STEP_ERR(NULL, "normalize appears twice");
        int nm = sp->normalize.n_mean, ns = sp->normalize.n_std;
        if (nm != 1 && nm != 3)
            STEP_ERR("mean", "mean has %d values, expected 3 (or 1 for every channel)", nm);
        if (ns != 1 && ns != 3)
            STEP_ERR("std", "std has %d values, expected 3 (or 1 for every channel)", ns);
        for (int c = 0; c < 3; c++) {
            double m = sp->normalize.mean[nm == 1 ? 0 : c], sd = sp->normalize.std[ns == 1 ? 0 : c];
            if (!isfinite(m))
                STEP_ERR("mean", "mean[%d] is not a finite number", c);
            if (!isfinite(sd) || sd == 0.0)
                STEP_ERR("std", "std[%d] is %g: it must be a finite non-zero number", c, sd);
        }
        p->has_normalize = true;
        *value_stage_seen = true;
        break;
    }
    case TRANSFORM_TO_DTYPE:
        if (*dtype)
            STEP_ERR(NULL, "to_dtype appears twice");
        if (sp->to_dtype.dtype != LD_DTYPE_UINT8 && sp->to_dtype.dtype != LD_DTYPE_FLOAT16 &&
            sp->to_dtype.dtype != LD_DTYPE_FLOAT32) {
            const char *dn = proto_dtype_name(sp->to_dtype.dtype);
            STEP_ERR("dtype", "dtype %s is not an image output: uint8, float16 or float32",
                     dn ? dn : "(unknown)");
        }
        if (sp->to_dtype.layout != TRANSFORM_LAYOUT_CHW && sp->to_dtype.layout != TRANSFORM_LAYOUT_HWC)
            STEP_ERR("layout", "layout must be CHW or HWC");
        *dtype = sp->to_dtype.dtype;
        *layout = sp->to_dtype.layout;
        *value_stage_seen = true;
        break;
    case TRANSFORM_PLUGIN:
        return load_plugins ? plugin_load(s, i, at, errbuf) : plugin_check(s->path, i, at, errbuf);
    }
    return 0;
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
    bool fixed = false, value_seen = false;
    int out_h = 0, out_w = 0, dtype = 0, layout = TRANSFORM_LAYOUT_CHW;
    const struct transform_spec *norm = NULL;
    p->key_base = specs[0].kind == TRANSFORM_DECODE ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        r = check_step(p, i, load_plugins, &fixed, &out_h, &out_w, &dtype, &layout, &value_seen,
                       at, errbuf);
        if (r < 0)
            goto fail;
        if (specs[i].kind == TRANSFORM_NORMALIZE)
            norm = &specs[i];
    }
    if (!fixed) {
        ld_errorf(errbuf, "transforms: the output size depends on the image; end the list with "
                  "center_crop, random_resized_crop or resize with height and width");
        r = LD_ECONFIG;
        goto fail;
    }
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
        if (s->plugin && s->plugin->free)
            s->plugin->free(s->state);
        if (s->dl)
            dlclose(s->dl);
        free(s->path);
        free(s->params);
    }
    free(p);
}

const struct transform_output *transform_pipeline_output(const transform_pipeline *p)
{
    return &p->out;
}

/* ---- planning ---------------------------------------------------------------------- */

/* The PRNG stream of transform i: its position, not counting a leading decode, so that
 * adding decode options (max_pixels, dct_scaling) never changes the augmentation. */
static uint64_t rng_step(const transform_pipeline *p, size_t i)
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

static int plan_build(const transform_pipeline *p, int w0, int h0, uint64_t seed, uint64_t epoch,
                      uint64_t index, struct plan *pl, char *errbuf)
{
    struct transform_rect R = {0, 0, w0, h0};
    bool flip = false;
    pl->n = 0;
    for (size_t i = 0; i < p->n; i++) {
        const struct transform_spec *sp = &p->steps[i].spec;
        struct stage *st = &pl->st[pl->n];
        switch (sp->kind) {
        case TRANSFORM_RESIZE: {
            int ow = sp->resize.width, oh = sp->resize.height;
            if (sp->resize.size > 0) {
                bool wide = R.width > R.height;
                double s = sp->resize.size;
                double lng = floor(s * (wide ? R.width : R.height) / (wide ? R.height : R.width));
                if (lng > PLAN_MAX_SIDE) {
                    ld_errorf(errbuf, "a %dx%d image resized to %d on its shorter side would be "
                              "%.0f pixels long", R.width, R.height, sp->resize.size, lng);
                    return LD_ESAMPLE;
                }
                ow = wide ? (int)lng : sp->resize.size;
                oh = wide ? sp->resize.size : (int)lng;
                if (ow < 1)
                    ow = 1;
                if (oh < 1)
                    oh = 1;
            }
            *st = (struct stage){.kind = STAGE_RESAMPLE, .in = R, .out_w = ow, .out_h = oh};
            pl->n++;
            R = (struct transform_rect){0, 0, ow, oh};
            break;
        }
        case TRANSFORM_CENTER_CROP: {
            int cw = sp->center_crop.width, ch = sp->center_crop.height;
            struct transform_rect in = R;
            int pad_x = 0, pad_y = 0;
            if (cw <= R.width) {
                int x = half_even_div2(R.width - cw);
                in.x = R.x + (flip ? R.width - x - cw : x);
                in.width = cw;
            } else {
                pad_x = (cw - R.width) / 2;
                if (flip)
                    pad_x = cw - R.width - pad_x;
            }
            if (ch <= R.height) {
                in.y = R.y + half_even_div2(R.height - ch);
                in.height = ch;
            } else {
                pad_y = (ch - R.height) / 2;
            }
            if (cw <= R.width && ch <= R.height) {
                R = in;
                break;
            }
            *st = (struct stage){.kind = STAGE_PAD, .in = in, .out_w = cw, .out_h = ch,
                                 .pad_x = pad_x, .pad_y = pad_y};
            pl->n++;
            R = (struct transform_rect){0, 0, cw, ch};
            break;
        }
        case TRANSFORM_RANDOM_RESIZED_CROP: {
            struct ld_prng rng = ld_prng_for(seed, epoch, index, rng_step(p, i));
            struct transform_rect c;
            transform_random_resized_crop_params(R.width, R.height, sp->random_resized_crop.scale,
                                                 sp->random_resized_crop.ratio, &rng, &c);
            if (flip)
                c.x = R.width - c.x - c.width;
            c.x += R.x;
            c.y += R.y;
            *st = (struct stage){.kind = STAGE_RESAMPLE, .in = c,
                                 .out_w = sp->random_resized_crop.width,
                                 .out_h = sp->random_resized_crop.height};
            pl->n++;
            R = (struct transform_rect){0, 0, st->out_w, st->out_h};
            break;
        }
        case TRANSFORM_RANDOM_FLIP: {
            struct ld_prng rng = ld_prng_for(seed, epoch, index, rng_step(p, i));
            if (ld_prng_uniform(&rng) < sp->random_flip.p)
                flip = !flip;
            break;
        }
        case TRANSFORM_PLUGIN:
            *st = (struct stage){.kind = STAGE_PLUGIN, .in = R, .out_w = R.width,
                                 .out_h = R.height, .flip = flip, .step = i};
            pl->n++;
            flip = false;
            R = (struct transform_rect){0, 0, st->out_w, st->out_h};
            break;
        default:
            break;
        }
    }
    pl->final = R;
    pl->flip = flip;
    return 0;
}

/* ---- writing the sample ------------------------------------------------------------ */

struct emitter {
    const transform_pipeline *p;
    uint8_t *dst;
    int w, h;
    bool flip;
};

/* Writes one output row: pixel x comes from pixel x of `row`, or w - 1 - x when
 * flipping; values through the dtype's table (uint8 as is); HWC or one row of each
 * CHW plane. */
/* The flip test is hoisted out of the pixel loop and the planes are restrict, so the
 * compiler can vectorise each variant (this loop is a tenth of a sample's time). */
#define EMIT_PIXELS(T, value, src_x)                                                    \
    do {                                                                                \
        if (chw) {                                                                      \
            T *restrict r = d + (size_t)y * w, *restrict g = r + plane, *restrict b = g + plane; \
            for (int x = 0; x < w; x++) {                                               \
                const uint8_t *s = src + (size_t)(src_x) * 3;                           \
                r[x] = value(0, s[0]);                                                  \
                g[x] = value(1, s[1]);                                                  \
                b[x] = value(2, s[2]);                                                  \
            }                                                                           \
        } else {                                                                        \
            T *restrict o = d + (size_t)y * w * 3;                                      \
            for (int x = 0; x < w; x++) {                                               \
                const uint8_t *s = src + (size_t)(src_x) * 3;                           \
                o[3 * x] = value(0, s[0]);                                              \
                o[3 * x + 1] = value(1, s[1]);                                          \
                o[3 * x + 2] = value(2, s[2]);                                          \
            }                                                                           \
        }                                                                               \
    } while (0)
#define EMIT_LOOP(T, value)                                                             \
    do {                                                                                \
        T *d = (T *)(void *)e->dst;                                                     \
        const uint8_t *restrict src = row;                                              \
        if (e->flip)                                                                    \
            EMIT_PIXELS(T, value, w - 1 - x);                                           \
        else                                                                            \
            EMIT_PIXELS(T, value, x);                                                   \
    } while (0)
#define VALUE_U8(c, v) (v)
#define VALUE_F32(c, v) (p->lut32[c][v])
#define VALUE_F16(c, v) (p->lut16[c][v])

static void emit_row(void *ctx, int y, const uint8_t *row)
{
    const struct emitter *e = ctx;
    const transform_pipeline *p = e->p;
    int w = e->w;
    size_t plane = (size_t)e->w * (size_t)e->h;
    bool chw = p->out.layout == TRANSFORM_LAYOUT_CHW;
    switch (p->out.dtype) {
    case LD_DTYPE_UINT8:
        if (!chw && !e->flip)
            memcpy(e->dst + (size_t)y * w * 3, row, (size_t)w * 3);
        else
            EMIT_LOOP(uint8_t, VALUE_U8);
        break;
    case LD_DTYPE_FLOAT32:
        EMIT_LOOP(float, VALUE_F32);
        break;
    case LD_DTYPE_FLOAT16:
        EMIT_LOOP(uint16_t, VALUE_F16);
        break;
    default:
        break;
    }
}

/* ---- executing the plan ------------------------------------------------------------ */

/* The current image: `base` is its pixel (0, 0) in the coordinates the plan uses,
 * `scale` maps those onto the buffer (< 1 only for the decoded image). */
struct cur_image {
    const uint8_t *buf;             /* the buffer's own origin */
    size_t stride;
    int buf_w, buf_h;               /* the buffer's pixels */
    int org_x, org_y;               /* plan coordinates of the buffer's (0, 0) */
    double scale;
    int slot;                       /* IMAGE_AUX_IMG_A/B, or -1 for the decoded image */
};

static bool rect_in_buffer(const struct cur_image *c, const struct transform_rect *r)
{
    int x = r->x - c->org_x, y = r->y - c->org_y;
    return x >= 0 && y >= 0 && r->width > 0 && r->height > 0 && x <= c->buf_w - r->width &&
           y <= c->buf_h - r->height;
}

static const uint8_t *rect_ptr(const struct cur_image *c, const struct transform_rect *r)
{
    return c->buf + (size_t)(r->y - c->org_y) * c->stride + (size_t)(r->x - c->org_x) * 3;
}

static int other_slot(int slot)
{
    return slot == IMAGE_AUX_IMG_A ? IMAGE_AUX_IMG_B : IMAGE_AUX_IMG_A;
}

static void flip_rows(uint8_t *px, size_t stride, int w, int h)
{
    for (int y = 0; y < h; y++) {
        uint8_t *a = px + (size_t)y * stride, *b = a + (size_t)(w - 1) * 3;
        for (; a < b; a += 3, b -= 3)
            for (int c = 0; c < 3; c++) {
                uint8_t t = a[c];
                a[c] = b[c];
                b[c] = t;
            }
    }
}

static int internal_error(char *errbuf, const char *what)
{
    ld_errorf(errbuf, "internal error in the image pipeline: %s", what);
    return LD_EINVAL;
}

/* Runs a resample stage. `next` is the rectangle of its output the next stage reads;
 * when `em` is set the rows go to the emitter (or straight to em->dst when no
 * conversion is needed) instead of a buffer. */
static int run_resample(const struct stage *st, const struct transform_rect *next,
                        struct cur_image *cur, struct image_buf *scratch, struct emitter *em,
                        bool direct, uint64_t max_pixels, char *errbuf)
{
    struct resample_job j = {
        .src = cur->buf, .src_stride = cur->stride, .src_w = cur->buf_w, .src_h = cur->buf_h,
        .out_w = st->out_w, .out_h = st->out_h,
        .rect_x0 = next->x, .rect_y0 = next->y, .rect_w = next->width, .rect_h = next->height,
    };
    double f = cur->scale;
    j.box_x0 = (st->in.x - cur->org_x) * f;
    j.box_y0 = (st->in.y - cur->org_y) * f;
    j.box_w = st->in.width * f;
    j.box_h = st->in.height * f;
    j.clamp_x0 = (int)floor(j.box_x0);
    j.clamp_y0 = (int)floor(j.box_y0);
    j.clamp_x1 = (int)ceil(j.box_x0 + j.box_w);
    j.clamp_y1 = (int)ceil(j.box_y0 + j.box_h);
    if (j.clamp_x1 > cur->buf_w)
        j.clamp_x1 = cur->buf_w;
    if (j.clamp_y1 > cur->buf_h)
        j.clamp_y1 = cur->buf_h;
    if (j.clamp_x0 >= j.clamp_x1)
        j.clamp_x0 = j.clamp_x1 - 1;
    if (j.clamp_y0 >= j.clamp_y1)
        j.clamp_y0 = j.clamp_y1 - 1;
    int r;
    if (em) {
        r = resample_run(&j, scratch, direct ? em->dst : NULL, (size_t)next->width * 3,
                         direct ? NULL : emit_row, em);
    } else {
        if ((uint64_t)next->width * (uint64_t)next->height > max_pixels) {
            ld_errorf(errbuf, "an intermediate image of %dx%d pixels is over the limit of %llu",
                      next->width, next->height, (unsigned long long)max_pixels);
            return LD_ESAMPLE;
        }
        int slot = other_slot(cur->slot);
        uint8_t *out;
        size_t stride = (size_t)next->width * 3;
        r = image_buf_reserve(scratch, slot, stride * (size_t)next->height, &out);
        if (r == 0)
            r = resample_run(&j, scratch, out, stride, NULL, NULL);
        if (r == 0)
            *cur = (struct cur_image){.buf = out, .stride = stride, .buf_w = next->width,
                                      .buf_h = next->height, .org_x = next->x,
                                      .org_y = next->y, .scale = 1.0, .slot = slot};
    }
    if (r == LD_ENOMEM)
        ld_errorf(errbuf, "out of memory resizing to %dx%d", next->width, next->height);
    else if (r < 0)
        return internal_error(errbuf, "bad resample");
    return r;
}

static int run_pad(const struct stage *st, struct cur_image *cur, struct image_buf *scratch,
                   uint64_t max_pixels, char *errbuf)
{
    if (cur->scale != 1.0 || !rect_in_buffer(cur, &st->in))
        return internal_error(errbuf, "pad outside the image");
    if ((uint64_t)st->out_w * (uint64_t)st->out_h > max_pixels) {
        ld_errorf(errbuf, "a padded image of %dx%d pixels is over the limit of %llu", st->out_w,
                  st->out_h, (unsigned long long)max_pixels);
        return LD_ESAMPLE;
    }
    int slot = other_slot(cur->slot);
    size_t stride = (size_t)st->out_w * 3;
    uint8_t *out;
    int r = image_buf_reserve(scratch, slot, stride * (size_t)st->out_h, &out);
    if (r < 0) {
        ld_errorf(errbuf, "out of memory padding to %dx%d", st->out_w, st->out_h);
        return r;
    }
    memset(out, 0, stride * (size_t)st->out_h);
    const uint8_t *src = rect_ptr(cur, &st->in);
    for (int y = 0; y < st->in.height; y++)
        memcpy(out + (size_t)(st->pad_y + y) * stride + (size_t)st->pad_x * 3,
               src + (size_t)y * cur->stride, (size_t)st->in.width * 3);
    *cur = (struct cur_image){.buf = out, .stride = stride, .buf_w = st->out_w,
                              .buf_h = st->out_h, .scale = 1.0, .slot = slot};
    return 0;
}

static int run_plugin(const transform_pipeline *p, const struct stage *st, struct cur_image *cur,
                      uint64_t seed, uint64_t epoch, uint64_t index, char *errbuf)
{
    if (cur->scale != 1.0 || !rect_in_buffer(cur, &st->in))
        return internal_error(errbuf, "plug-in region outside the image");
    /* The plan's images are scratch memory of this worker: the plug-in works in place. */
    uint8_t *px = (uint8_t *)(uintptr_t)rect_ptr(cur, &st->in);
    if (st->flip)
        flip_rows(px, cur->stride, st->in.width, st->in.height);
    const struct tstep *s = &p->steps[st->step];
    struct ld_image img = {.data = px, .width = st->in.width, .height = st->in.height,
                           .stride = cur->stride};
    struct ld_prng rng = ld_prng_for(seed, epoch, index, rng_step(p, st->step));
    struct ld_sample_info info = {.seed = seed, .epoch = epoch, .index = index,
                                  .step = (uint32_t)rng_step(p, st->step)};
    char perr[LD_PLUGIN_ERR_MAX] = "";
    if (s->plugin->apply(s->state, &img, &rng, &info, perr) != 0) {
        perr[sizeof perr - 1] = '\0';
        ld_errorf(errbuf, "transforms[%zu] (plug-in %s): %s", st->step,
                  s->plugin->name ? s->plugin->name : "?", perr[0] ? perr : "failed");
        return LD_ESAMPLE;
    }
    *cur = (struct cur_image){.buf = px, .stride = cur->stride, .buf_w = st->in.width,
                              .buf_h = st->in.height, .scale = 1.0, .slot = cur->slot};
    return 0;
}

/* The smallest decode the plan allows: full size unless dct_scaling, then at least
 * TRANSFORM_DCT_MIN_FACTOR decoded pixels per output pixel of the first resample; full
 * size when anything else reads the decoded image first (the pixel limit may still
 * force a reduction: image_jpeg_scale). The
 * region is the rectangle the first stage (or the final write) reads: the decoder may
 * leave out what lies around it. */
static void plan_decode_hint(const transform_pipeline *p, const struct plan *pl, int w0, int h0,
                             struct image_decode_opts *o)
{
    *o = p->decode;
    o->min_width = o->min_height = 0;
    const struct transform_rect *X = pl->n > 0 ? &pl->st[0].in : &pl->final;
    o->region_x = o->region_y = o->region_w = o->region_h = 0;
    if (X->width < w0 || X->height < h0) {
        o->region_x = X->x;
        o->region_y = X->y;
        o->region_w = X->width;
        o->region_h = X->height;
    }
    if (!p->dct_scaling || pl->n == 0 || pl->st[0].kind != STAGE_RESAMPLE)
        return;
    const struct stage *st = &pl->st[0];
    double need = fmax((double)st->out_w / st->in.width, (double)st->out_h / st->in.height) *
                  TRANSFORM_DCT_MIN_FACTOR;
    if (need >= 1.0)
        return;
    o->min_width = (int)ceil(w0 * need - 1e-9);
    o->min_height = (int)ceil(h0 * need - 1e-9);
    if (o->min_width < 1)
        o->min_width = 1;
    if (o->min_height < 1)
        o->min_height = 1;
}

int transform_apply(const transform_pipeline *p, const uint8_t *data, size_t len, uint64_t seed,
                    uint64_t epoch, uint64_t index, void *dst, struct image_buf *scratch,
                    char *errbuf)
{
    struct image_info info;
    int r = image_probe(data, len, scratch, &info, errbuf);
    if (r < 0)
        return r;
    struct plan pl;
    r = plan_build(p, info.width, info.height, seed, epoch, index, &pl, errbuf);
    if (r < 0)
        return r;
    struct image_decode_opts opts;
    plan_decode_hint(p, &pl, info.width, info.height, &opts);
    /* Only a resample can take a reduced image; anything else reading the decoded image
     * first needs it whole, which the pixel limit may forbid: say so before decoding. */
    bool full_size = pl.n == 0 || pl.st[0].kind != STAGE_RESAMPLE;
    if (full_size && (uint64_t)info.width * (uint64_t)info.height > opts.max_pixels) {
        ld_errorf(errbuf, "image too large: %dx%d pixels, over the limit of %llu, and the "
                  "pipeline's first transform needs it at full size", info.width, info.height,
                  (unsigned long long)opts.max_pixels);
        return LD_ESAMPLE;
    }
    r = image_decode(data, len, &opts, scratch, errbuf);
    if (r < 0)
        return r;
    if (scratch->src_width != info.width || scratch->src_height != info.height)
        return internal_error(errbuf, "the header changed between probe and decode");
    double f = (double)scratch->scale_num / scratch->scale_denom;
    if (f != 1.0 && full_size)
        return internal_error(errbuf, "reduced decode for a full-size plan");
    /* A region decode's buffer starts at (org_x, org_y) of the decoded image: in plan
     * coordinates that is org * denom / num, whole since num is 1. */
    if (scratch->scale_num != 1 && (scratch->org_x || scratch->org_y))
        return internal_error(errbuf, "region decode at a scale other than 1/n");
    struct cur_image cur = {.buf = scratch->data, .stride = (size_t)scratch->width * 3,
                            .buf_w = scratch->width, .buf_h = scratch->height,
                            .org_x = scratch->org_x * scratch->scale_denom,
                            .org_y = scratch->org_y * scratch->scale_denom, .scale = f,
                            .slot = -1};
    struct emitter em = {.p = p, .dst = dst, .w = pl.final.width, .h = pl.final.height,
                         .flip = pl.flip};
    if (pl.final.width != p->out.width || pl.final.height != p->out.height)
        return internal_error(errbuf, "planned output size differs from the pipeline's");
    bool direct = p->out.dtype == LD_DTYPE_UINT8 && p->out.layout == TRANSFORM_LAYOUT_HWC &&
                  !pl.flip;
    for (int k = 0; k < pl.n; k++) {
        const struct stage *st = &pl.st[k];
        const struct transform_rect *next = k + 1 < pl.n ? &pl.st[k + 1].in : &pl.final;
        switch (st->kind) {
        case STAGE_RESAMPLE:
            /* The last stage streams into the sample; a PAD or plug-in next reads a
             * rectangle of this output too, so it is computed just the same. */
            r = run_resample(st, next, &cur, scratch, k + 1 == pl.n ? &em : NULL, direct,
                             opts.max_pixels, errbuf);
            if (r == 0 && k + 1 == pl.n)
                return 0;
            break;
        case STAGE_PAD:
            r = run_pad(st, &cur, scratch, opts.max_pixels, errbuf);
            break;
        case STAGE_PLUGIN:
            r = run_plugin(p, st, &cur, seed, epoch, index, errbuf);
            break;
        }
        if (r < 0)
            return r;
    }
    /* The last stage was not a resample: write the final rectangle of the current image. */
    if (cur.scale != 1.0 || !rect_in_buffer(&cur, &pl.final))
        return internal_error(errbuf, "final rectangle outside the image");
    const uint8_t *src = rect_ptr(&cur, &pl.final);
    for (int y = 0; y < pl.final.height; y++)
        emit_row(&em, y, src + (size_t)y * cur.stride);
    return 0;
}
