/* source_images — the `image_folder` dataset kind: class sub-folders of JPEG and PNG
 * files (the ImageNet layout), each sample decoded and augmented by the dataset's
 * transform pipeline straight into its row of the batch slot.
 *
 * The folder is scanned by the `files` kind (sorted paths, label = sorted class
 * index), which this kind wraps: its raw bytes (the encoded image) come from the file,
 * or from the dataset's cache when one is attached, and transform_apply turns them into
 * `image[C, H, W]` (or HWC) of the configured dtype. Each worker thread keeps one
 * image_scratch (image_scratch.h) for all its samples. Augmentations draw from
 * (seed, epoch, sample index), so a batch is the same whatever thread decodes it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "dataset.h"
#include "image_scratch.h"
#include "transform.h"

#define IMAGES_MAX_ENCODED (256u << 20) /* larger files are refused, not read */

struct images {
    dataset base;                   /* first: the daemon holds a dataset * */
    dataset *files;                 /* the scan, the raw bytes, the fingerprint */
    transform_pipeline *pipeline;
};

static void images_free(dataset *d)
{
    struct images *im = (struct images *)d;
    if (!im)
        return;
    transform_pipeline_free(im->pipeline);
    dataset_free(im->files);
    free(im);
}

static int images_open(const struct config_dataset *cfg, dataset **ret_dataset, char *errbuf)
{
    char err[LD_ERRMSG_MAX];
    struct images *im = calloc(1, sizeof *im);
    if (!im) {
        ld_errorf(errbuf, "dataset '%s': out of memory", cfg->name);
        return LD_ENOMEM;
    }
    struct transform_output out;
    int rc = transform_pipeline_new(cfg->transforms, cfg->n_transforms, &im->pipeline, &out, err);
    if (rc < 0) {
        ld_errorf(errbuf, "dataset '%s': %s", cfg->name, err);
        free(im);
        return rc;
    }
    struct config_dataset fcfg = *cfg;
    fcfg.kind = CONFIG_DATASET_FILES;
    rc = source_files_ops.open(&fcfg, &im->files, errbuf);
    if (rc < 0) {
        transform_pipeline_free(im->pipeline);
        free(im);
        return rc;
    }
    dataset *d = &im->base;
    d->ops = &source_images_ops;
    snprintf(d->name, sizeof d->name, "%s", cfg->name);
    snprintf(d->source, sizeof d->source, "%s", cfg->path);
    d->count = im->files->count;
    d->sample_overhead = 1u << 20; /* a decode costs about what a megabyte of copying does */
    d->class_names = im->files->class_names;
    d->n_classes = im->files->n_classes;
    d->n_fields = 2;
    struct dataset_field *f = &d->fields[0];
    snprintf(f->name, sizeof f->name, "image");
    f->dtype = out.dtype;
    f->ndim = 3;
    for (int i = 0; i < 3; i++)
        f->shape[i] = out.shape[i];
    struct dataset_field *label = &d->fields[1];
    snprintf(label->name, sizeof label->name, "label");
    label->dtype = LD_DTYPE_INT64;
    label->ndim = 0;
    *ret_dataset = d;
    return 0;
}

/* Decodes and transforms one encoded image into dst. */
static int images_transform(const struct images *im, uint64_t index, const uint8_t *raw, uint64_t len,
                            uint64_t seed, uint64_t epoch, void *dst, struct image_scratch *sc, char *errbuf)
{
    char err[LD_ERRMSG_MAX];
    int rc = transform_apply(im->pipeline, raw, len, seed, epoch, index, dst, &sc->img, err);
    if (rc < 0) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %s", index, dataset_sample_name(im->files, index), err);
        return rc == LD_ENOMEM ? rc : LD_ESAMPLE;
    }
    return 0;
}

static int images_read_ctx(const dataset *d, uint64_t index, const struct dataset_read_ctx *ctx, void *const dst[],
                           char *errbuf)
{
    const struct images *im = (const struct images *)d;
    uint64_t len = 0;
    int64_t label = -1;
    uint64_t need = im->files->ops->raw_bytes(im->files, index);
    if (need > IMAGES_MAX_ENCODED) {
        ld_errorf(errbuf, "sample %" PRIu64 " (%s): %" PRIu64 " bytes, more than an image may have (%u MiB)",
                  index, dataset_sample_name(im->files, index), need, IMAGES_MAX_ENCODED >> 20);
        return LD_ESAMPLE;
    }
    struct image_scratch *sc = image_scratch_get(need);
    if (!sc) {
        ld_errorf(errbuf, "out of memory");
        return LD_ENOMEM;
    }
    /* From the cache when the batch may read it: copied out (checked against the
     * sample's checksum, safe from a truncated file) before the decoder sees it; a
     * sample the cache cannot give is read from the file. */
    char cerr[LD_ERRMSG_MAX];
    if (!ctx->cache || cache_read(ctx->cache, index, sc->raw, sc->raw_cap, &len, &label, true, cerr) < 0 ||
        len != need) {
        int rc = im->files->ops->read_raw(im->files, index, sc->raw, sc->raw_cap, &len, &label, errbuf);
        if (rc < 0)
            return rc;
    }
    const uint8_t *raw = sc->raw;
    int rc = images_transform(im, index, raw, len, ctx->seed, ctx->epoch, dst[0], sc, errbuf);
    if (rc < 0)
        return rc;
    memcpy(dst[1], &label, sizeof label);
    return 0;
}

static const char *images_sample_name(const dataset *d, uint64_t index)
{
    const struct images *im = (const struct images *)d;
    return dataset_sample_name(im->files, index);
}

static int images_fingerprint(const dataset *d, int mode, uint64_t *ret, char *errbuf)
{
    const struct images *im = (const struct images *)d;
    return im->files->ops->fingerprint(im->files, mode, ret, errbuf);
}

static uint64_t images_raw_bytes(const dataset *d, uint64_t index)
{
    const struct images *im = (const struct images *)d;
    return im->files->ops->raw_bytes(im->files, index);
}

static int images_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap, uint64_t *ret_len,
                           int64_t *ret_label, char *errbuf)
{
    const struct images *im = (const struct images *)d;
    return im->files->ops->read_raw(im->files, index, buf, cap, ret_len, ret_label, errbuf);
}

const struct dataset_ops source_images_ops = {
    .kind = "image_folder",
    .open = images_open,
    .free = images_free,
    .read_ctx = images_read_ctx,
    .sample_name = images_sample_name,
    .fingerprint = images_fingerprint,
    .raw_bytes = images_raw_bytes,
    .read_raw = images_read_raw,
};
