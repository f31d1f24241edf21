/* image — the decode entry point: one JPEG or PNG sample into 8-bit RGB (see image.h
 * for the contract), the format told by its first bytes and handed to its backend
 * (image_jpeg.c, image_png.c; the interface is image_backend.h).
 *
 * This is the first half of the image pipeline's hot path: a worker calls it once per
 * sample with its own struct image_buf, so nothing here is shared between threads and
 * the large buffers (the decoded image, the CMYK staging area, PNG row pointers) are
 * reused from sample to sample. Data that is neither format gets an error naming what
 * it looks like (a GIF, a file cut short) rather than a hex dump alone. */
#include "image_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ld_error.h"
#include "proto.h"

/* Every backend, tried in order on a sample's first bytes. */
static const struct image_backend *const backends[] = {&image_jpeg_backend, &image_png_backend};
#define N_BACKENDS (sizeof backends / sizeof backends[0])

void image_buf_init(struct image_buf *b)
{
    memset(b, 0, sizeof *b);
}

void image_buf_close(struct image_buf *b)
{
    if (!b)
        return;
    free(b->data);
    for (int i = 0; i < IMAGE_AUX_COUNT; i++)
        free(b->aux[i].p);
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backends[i]->buf_close)
            backends[i]->buf_close(b);
    memset(b, 0, sizeof *b);
}

int image_mem_reserve(uint8_t **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    /* Round up a little so that sizes that creep up by a few rows do not realloc
     * every time; free + malloc because the old contents are not needed. */
    size_t n = bytes + bytes / 8 + 4096;
    uint8_t *q = malloc(n);
    if (!q)
        return LD_ENOMEM;
    free(*p);
    *p = q;
    *cap = n;
    return 0;
}

int image_buf_reserve(struct image_buf *b, int slot, size_t bytes, uint8_t **ret_p)
{
    if (slot < 0 || slot >= IMAGE_AUX_COUNT)
        return LD_EINVAL;
    int r = image_mem_reserve(&b->aux[slot].p, &b->aux[slot].cap, bytes);
    if (r < 0)
        return r;
    *ret_p = b->aux[slot].p;
    return 0;
}

static const struct image_backend *backend_for(const uint8_t *data, size_t len)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backends[i]->sniff(data, len))
            return backends[i];
    return NULL;
}

enum image_format image_detect(const uint8_t *data, size_t len)
{
    const struct image_backend *be = backend_for(data, len);
    return be ? be->format : IMAGE_FORMAT_UNKNOWN;
}

const char *image_format_name(enum image_format f)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backends[i]->format == f)
            return backends[i]->name;
    return "unknown";
}

/* Names the formats people actually feed an image loader by mistake, so the error
 * says "GIF" rather than a hex dump. */
static void describe_unknown(const uint8_t *data, size_t len, char *errbuf)
{
    const char *name = NULL;
    if (len == 0) {
        ld_errorf(errbuf, "empty file: not a JPEG or PNG image");
        return;
    }
    /* The start of a JPEG or PNG signature and nothing more: a file cut short. */
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len < 3 && data[0] == 0xff && (len < 2 || data[1] == 0xd8)) {
        ld_errorf(errbuf, "truncated JPEG: the file ends after %zu bytes", len);
        return;
    }
    if (len < 8 && memcmp(data, png_magic, len) == 0) {
        ld_errorf(errbuf, "truncated PNG: the file ends after %zu bytes", len);
        return;
    }
    if (len >= 6 && (memcmp(data, "GIF87a", 6) == 0 || memcmp(data, "GIF89a", 6) == 0))
        name = "GIF";
    else if (len >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0)
        name = "WebP";
    else if (len >= 2 && memcmp(data, "BM", 2) == 0)
        name = "BMP";
    else if (len >= 4 && (memcmp(data, "II*\0", 4) == 0 || memcmp(data, "MM\0*", 4) == 0))
        name = "TIFF";
    else if (len >= 12 && memcmp(data + 4, "ftyp", 4) == 0)
        name = "HEIF/AVIF/MP4";
    else if (len >= 12 && memcmp(data, "\0\0\0\x0cjP  ", 8) == 0)
        name = "JPEG 2000";
    if (name) {
        ld_errorf(errbuf, "unsupported image format %s: only JPEG and PNG are decoded", name);
        return;
    }
    char hex[3 * 8 + 1] = "";
    size_t n = len < 8 ? len : 8, at = 0;
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(hex + at, sizeof hex - at, "%s%02x", i ? " " : "", data[i]);
    ld_errorf(errbuf, "not a JPEG or PNG image (%zu bytes, starting with %s)", len, hex);
}

int image_probe(const uint8_t *data, size_t len, struct image_buf *b, struct image_info *ret_info,
                char *errbuf)
{
    const struct image_backend *be = backend_for(data, len);
    if (!be) {
        describe_unknown(data, len, errbuf);
        return LD_ESAMPLE;
    }
    return be->probe(data, len, b, ret_info, errbuf);
}

int image_decode(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                 struct image_buf *b, char *errbuf)
{
    const struct image_backend *be = backend_for(data, len);
    if (!be) {
        describe_unknown(data, len, errbuf);
        return LD_ESAMPLE;
    }
    return be->decode(data, len, opts, b, errbuf);
}
