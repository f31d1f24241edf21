/* image_backend — private to the image decoder (image.c and its backends
 * image_jpeg.c, image_png.c): what one format's backend provides.
 *
 * image.c tells the format by its first bytes (each backend's sniff), then hands the
 * sample to that backend's probe or decode; everything a backend keeps between samples
 * (decoder handles) lives in the worker's struct image_buf and is freed by its
 * buf_close. All of it runs on one worker thread with that thread's own buffer. */
#ifndef LD_IMAGE_BACKEND_H
#define LD_IMAGE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"

struct image_backend {
    enum image_format format;
    const char *name;                   /* "JPEG", for messages */
    /* Whether data starts with this format's signature. Never reads past len. */
    bool (*sniff)(const uint8_t *data, size_t len);
    /* The header's size without decoding pixels (image_probe's contract). */
    int (*probe)(const uint8_t *data, size_t len, struct image_buf *b, struct image_info *ret_info,
                 char *errbuf);
    /* Decodes into b: b->data, width, height, org_*, src_*, scale_*, format (image_decode's
     * contract). LD_ESAMPLE with a sentence in errbuf for bad data, LD_ENOMEM. */
    int (*decode)(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                  struct image_buf *b, char *errbuf);
    /* Frees what the backend keeps in b (decoder handles); NULL when it keeps nothing. */
    void (*buf_close)(struct image_buf *b);
};

extern const struct image_backend image_jpeg_backend;
extern const struct image_backend image_png_backend;

/* Grows the block at *p to at least `bytes` (contents are not kept); LD_ENOMEM. */
int image_mem_reserve(uint8_t **p, size_t *cap, size_t bytes);

/* opts->max_pixels, or the default when opts is NULL or says 0. */
static inline uint64_t image_max_pixels(const struct image_decode_opts *opts)
{
    return opts && opts->max_pixels ? opts->max_pixels : IMAGE_DEFAULT_MAX_PIXELS;
}

#endif
