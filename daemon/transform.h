/* transform — a dataset's image pipeline: decode, geometry, values, written straight
 * into the sample's row of the batch slot.
 *
 * The config module turns a dataset's `transforms:` list into an array of struct
 * transform_spec (start each with transform_spec_init for the defaults; each kind's
 * parameters are published in transform_schema.h) and calls transform_pipeline_new
 * once at daemon start; workers then call transform_apply for every sample,
 * concurrently, each with its own struct image_buf.
 *
 * The transforms (parameters and defaults; torchvision's names and semantics):
 *   decode               optional, first: max_pixels (IMAGE_DEFAULT_MAX_PIXELS), fast
 *                        (false: the accurate integer DCT and fancy upsampling, as PIL), strict
 *                        (false: libjpeg's corrupt-data warnings are tolerated, a
 *                        truncated file never is), dct_scaling (false: full-size decode,
 *                        PIL's pixels; see transform_plan.c for what true costs in accuracy).
 *   resize               size: the shorter side becomes `size`, the longer
 *                        int(size * long / short); or height + width: exactly that.
 *                        Bilinear, antialiased when shrinking (PIL's filter, resample.h).
 *   center_crop          height, width. Pads with zeros when the image is smaller
 *                        (torchvision's CenterCrop); offsets round half to even.
 *   random_resized_crop  height, width, scale [0.08, 1], ratio [3/4, 4/3]: torchvision's
 *                        rule (transform_random_resized_crop_params), then the crop is
 *                        resized to height x width in one pass from the source.
 *   random_flip          p (0.5): horizontal.
 *   normalize            mean, std (1 or 3 values), on the 0..1 scale as in torchvision:
 *                        out = (v / 255 - mean) / std. Needs a float output.
 *   to_dtype             dtype uint8 | float16 | float32 (uint8, or float32 when the
 *                        list has a normalize), layout CHW | HWC (CHW). A float output
 *                        without normalize is v / 255.
 *   plugin               path (must contain a '/'), params (JSON object text): see
 *                        transform_plugin.h.
 * normalize and to_dtype act when the sample is written, so nothing but random_flip
 * may follow them. The list must end with a fixed size (center_crop,
 * random_resized_crop or an exact resize after the last shorter-side resize), since
 * every sample of a batch has the same shape.
 *
 * Scaled decoding (decode.dct_scaling: true): the pipeline is planned on the header's
 * size before decoding (the random crop is drawn on the full-size image, so the draws
 * never depend on the scale). When the first geometric step that consumes the image is
 * a resize or a random_resized_crop, the JPEG is decoded at the largest DCT reduction
 * (1/2, 1/4, 1/8) that still leaves at least two decoded pixels per output pixel in
 * the region it resizes (scale >= 2 * max(out_w / region_w, out_h / region_h)); the
 * region is then mapped onto the smaller image with fractional coordinates. A crop, pad or plug-in that
 * comes first needs the full-size image's scale. Whatever comes first, only the
 * rectangle it reads is asked of the decoder (image_decode_opts.region_*): a baseline
 * JPEG then decodes just those rows and iMCU columns, with the same pixels there.
 *
 * Randomness: transform i (0-based, a leading decode not counted) of sample `index`
 * draws from ld_prng_for(seed, epoch, index, i): bit-identical results whatever the
 * thread, and the same crops whatever the decode options. */
#ifndef LD_TRANSFORM_H
#define LD_TRANSFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "transform_plugin.h"

#define TRANSFORM_MAX 32                /* transforms per pipeline */
#define TRANSFORM_MAX_SIDE 16384        /* largest output height or width */

enum transform_kind {
    TRANSFORM_DECODE = 1,
    TRANSFORM_RESIZE,
    TRANSFORM_CENTER_CROP,
    TRANSFORM_RANDOM_RESIZED_CROP,
    TRANSFORM_RANDOM_FLIP,
    TRANSFORM_NORMALIZE,
    TRANSFORM_TO_DTYPE,
    TRANSFORM_PLUGIN,
};

enum transform_layout { TRANSFORM_LAYOUT_CHW = 1, TRANSFORM_LAYOUT_HWC = 2 };

struct transform_spec {
    enum transform_kind kind;
    union {
        struct {
            uint64_t max_pixels;        /* 0: IMAGE_DEFAULT_MAX_PIXELS */
            bool strict;
            bool dct_scaling;
            bool fast;                  /* libjpeg's fast DCT and upsampling: quicker, not PIL's bytes */
        } decode;
        struct {
            int size;                   /* > 0: shorter side; 0: height x width */
            int height, width;
        } resize;
        struct {
            int height, width;
        } center_crop;
        struct {
            int height, width;
            double scale[2];
            double ratio[2];
        } random_resized_crop;
        struct {
            double p;
        } random_flip;
        struct {
            int n_mean, n_std;          /* how many values the config gave (the first 4 are kept) */
            double mean[4], std[4];
        } normalize;
        struct {
            int dtype;                  /* LD_DTYPE_UINT8, _FLOAT16, _FLOAT32 */
            enum transform_layout layout;
        } to_dtype;
        struct {
            const char *path;           /* copied by transform_pipeline_new */
            const char *params_json;    /* NULL or a JSON object's text; copied */
        } plugin;
    };
};

/* What one sample becomes. */
struct transform_output {
    int dtype;                          /* LD_DTYPE_* */
    enum transform_layout layout;
    int channels, height, width;        /* channels is 3 */
    int64_t shape[3];                   /* (C, H, W) or (H, W, C) */
    size_t sample_bytes;                /* bytes of one sample */
    uint64_t max_pixels;                /* the decode limit in force */
};

/* A rectangle of pixels. */
struct transform_rect {
    int x, y, width, height;
};

typedef struct transform_pipeline transform_pipeline;

/* Fills the defaults of `kind` (everything else zero). */
void transform_spec_init(struct transform_spec *s, enum transform_kind kind);
/* Frees what the config loader allocated into s (its PATH and JSON parameters). */
void transform_spec_clear(struct transform_spec *s);
/* "random_resized_crop" etc.; NULL for an unknown kind. */
const char *transform_kind_name(enum transform_kind kind);
/* TRANSFORM_* for a name, or LD_EINVAL. */
int transform_kind_from_name(const char *name);
/* TRANSFORM_LAYOUT_* for "CHW"/"HWC" (case-insensitive), or LD_EINVAL. */
int transform_layout_from_name(const char *name);

/* Where a spec list is wrong: transform `index` (0-based; n: the list as a whole, e.g.
 * no fixed output size), and the parameter at fault (a name of the config's, such as
 * "mean"; NULL: the transform itself). */
struct transform_error {
    size_t index;
    const char *param;
};

/* Checks the list, loads plug-ins and builds the pipeline. On failure returns
 * LD_ECONFIG (or LD_ENOMEM) with errbuf naming the transform, counted from 0 as the
 * config's positions are: "transforms[2] (normalize): mean has 2 values, expected 3
 * (or 1 for every channel)". Main thread. */
int transform_pipeline_new(const struct transform_spec *specs, size_t n,
                           transform_pipeline **ret_pipeline, struct transform_output *ret_output,
                           char *errbuf);
/* Everything transform_pipeline_new checks except what needs a plug-in loaded, for the
 * config loader, which points at the place *ret_at names. LD_ECONFIG (or LD_ENOMEM). */
int transform_specs_check(const struct transform_spec *specs, size_t n,
                          struct transform_error *ret_at, char *errbuf);
/* Frees the pipeline (plug-ins' free(), dlclose). Accepts NULL. */
void transform_pipeline_free(transform_pipeline *p);
const struct transform_output *transform_pipeline_output(const transform_pipeline *p);

/* Decodes one JPEG/PNG and writes the transformed sample to dst (output.sample_bytes
 * bytes). Thread-safe for a shared pipeline; scratch is the calling worker's own.
 * After a success scratch->scale_num/scale_denom say the decode scale used. Returns
 * LD_ESAMPLE with errbuf ("truncated JPEG: ...", without the sample's name: the
 * caller adds it) for bad data or a plug-in's failure, LD_ENOMEM. */
int transform_apply(const transform_pipeline *p, const uint8_t *data, size_t len, uint64_t seed,
                    uint64_t epoch, uint64_t index, void *dst, struct image_buf *scratch,
                    char *errbuf);

/* torchvision's RandomResizedCrop.get_params on a width x height image: up to ten
 * tries of an area fraction uniform in scale and a log-uniform aspect ratio in ratio
 * (w = round(sqrt(area * r)), h = round(sqrt(area / r)), half to even), accepted when
 * it fits, at a uniform position; else a center crop with the ratio clamped into range. */
void transform_random_resized_crop_params(int width, int height, const double scale[2],
                                          const double ratio[2], struct ld_prng *rng,
                                          struct transform_rect *ret_rect);

/* IEEE 754 binary16 bits nearest to v (ties to even; overflow to infinity). */
uint16_t transform_half_from_double(double v);

#endif
