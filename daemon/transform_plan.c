/* transform_plan — turns a pipeline into one sample's plan, on the image header's
 * size, before anything is decoded.
 *
 * The list becomes a few stages over integer rectangles: a resample (resize, or the
 * crop + resize of random_resized_crop), a pad (center_crop larger than the image) or
 * a plug-in call. Crops only move the rectangle the next stage reads; a horizontal
 * flip is a pending bit that mirrors the crops drawn after it and is applied when
 * pixels are written (it commutes with the symmetric resize filter). Random draws
 * happen here, on full-size coordinates, so they never depend on the decode scale.
 * The plan also tells the decoder what it may skip: the DCT scale the first resample
 * allows and the rectangle the first stage reads (transform_plan_decode_hint).
 * transform_emit.c executes the plan. */
#include "transform_internal.h"

#include <math.h>

#include "ld_error.h"

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

/* ---- planning ---------------------------------------------------------------------- */

int transform_plan_build(const transform_pipeline *p, int w0, int h0, uint64_t seed, uint64_t epoch,
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
            struct ld_prng rng = ld_prng_for(seed, epoch, index, transform_rng_step(p, i));
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
            struct ld_prng rng = ld_prng_for(seed, epoch, index, transform_rng_step(p, i));
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

/* The smallest decode the plan allows: full size unless dct_scaling, then at least
 * TRANSFORM_DCT_MIN_FACTOR decoded pixels per output pixel of the first resample; full
 * size when anything else reads the decoded image first (the pixel limit may still
 * force a reduction: image_jpeg_scale). The region is the rectangle the first stage
 * (or the final write) reads: the decoder may leave out what lies around it. */
void transform_plan_decode_hint(const transform_pipeline *p, const struct plan *pl, int w0, int h0,
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

