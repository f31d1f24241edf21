/* image_png — the PNG backend of the image decoder (image_backend.h), on libpng.
 *
 * libpng's transforms (palette and low-bit gray expansion, gray to RGB, 16 to 8 bits,
 * alpha stripped) make every image 8-bit RGB, what PIL's convert("RGB") gives. PNG
 * has no reduced-scale decode, so an image over the pixel limit is refused from its
 * header. libpng reports errors by longjmp, so everything that must survive one lives
 * behind a pointer (struct png_job). */
#include "image_backend.h"

#include <inttypes.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "ld_error.h"

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Everything the libpng calls touch after setjmp lives here, behind a pointer. */
struct png_job {
    png_structp png;
    png_infop info;
    const uint8_t *data;
    size_t len, pos;
    bool eof;                        /* the read callback ran out of data */
    char msg[200];                   /* libpng's error message */
    const struct image_decode_opts *opts;
    struct image_buf *b;
    png_uint_32 width, height;
    int result;                      /* set before a non-libpng failure leaves png_run */
    char *errbuf;
};

static void png_read_cb(png_structp png, png_bytep out, size_t n)
{
    struct png_job *j = png_get_io_ptr(png);
    if (n > j->len - j->pos) {
        j->eof = true;
        png_error(png, "unexpected end of data");
    }
    memcpy(out, j->data + j->pos, n);
    j->pos += n;
}

static void png_error_cb(png_structp png, png_const_charp msg)
{
    struct png_job *j = png_get_error_ptr(png);
    snprintf(j->msg, sizeof j->msg, "%s", msg ? msg : "unknown error");
    png_longjmp(png, 1);
}

static void png_warning_cb(png_structp png, png_const_charp msg)
{
    /* Warnings (a bad ancillary chunk, a CRC error in one) do not affect the pixels. */
    (void)png;
    (void)msg;
}

/* Returns 0, or -1 after a libpng error (j->msg) or a failure of ours (j->result). */
static int png_run(struct png_job *j)
{
    if (setjmp(png_jmpbuf(j->png)))
        return -1;
    png_set_read_fn(j->png, j, png_read_cb);
    png_read_info(j->png, j->info);
    int bit_depth, color_type, interlace;
    png_get_IHDR(j->png, j->info, &j->width, &j->height, &bit_depth, &color_type, &interlace,
                 NULL, NULL);
    uint64_t max_px = image_max_pixels(j->opts);
    if ((uint64_t)j->width * j->height > max_px) {
        ld_errorf(j->errbuf, "image too large: %ux%u pixels, over the limit of %" PRIu64
                  " (PNG cannot be decoded at a reduced scale)",
                  (unsigned)j->width, (unsigned)j->height, max_px);
        j->result = LD_ESAMPLE;
        return -1;
    }
    if (bit_depth == 16)
        png_set_strip_16(j->png);
    if (color_type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(j->png);
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8)
        png_set_expand_gray_1_2_4_to_8(j->png);
    if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(j->png);
    /* palette_to_rgb also expands tRNS into an alpha channel: strip that one too. */
    png_set_strip_alpha(j->png);
    png_set_interlace_handling(j->png);
    png_read_update_info(j->png, j->info);
    if (png_get_channels(j->png, j->info) != 3 || png_get_bit_depth(j->png, j->info) != 8 ||
        png_get_rowbytes(j->png, j->info) != (size_t)j->width * 3) {
        ld_errorf(j->errbuf, "unsupported PNG layout (color type %d, %d bits)", color_type,
                  bit_depth);
        j->result = LD_ESAMPLE;
        return -1;
    }
    struct image_buf *b = j->b;
    size_t row = (size_t)j->width * 3;
    uint8_t *rows_mem;
    if (image_mem_reserve(&b->data, &b->cap, row * j->height) < 0 ||
        image_buf_reserve(b, IMAGE_AUX_DECODE, sizeof(png_bytep) * j->height, &rows_mem) < 0) {
        ld_errorf(j->errbuf, "out of memory for a %ux%u image", (unsigned)j->width,
                  (unsigned)j->height);
        j->result = LD_ENOMEM;
        return -1;
    }
    png_bytepp rows = (png_bytepp)(void *)rows_mem;
    for (png_uint_32 y = 0; y < j->height; y++)
        rows[y] = b->data + (size_t)y * row;
    png_read_image(j->png, rows);
    return 0;
}

static int decode_png(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                      struct image_buf *b, char *errbuf)
{
    struct png_job j = {.data = data, .len = len, .opts = opts, .b = b, .errbuf = errbuf};
    j.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &j, png_error_cb, png_warning_cb);
    if (!j.png) {
        ld_errorf(errbuf, "cannot create a PNG decoder");
        return LD_ENOMEM;
    }
    j.info = png_create_info_struct(j.png);
    int r = 0;
    if (!j.info) {
        ld_errorf(errbuf, "cannot create a PNG decoder");
        r = LD_ENOMEM;
        goto out;
    }
    if (png_run(&j) < 0) {
        if (j.result < 0)
            r = j.result;
        else {
            ld_errorf(errbuf, "%s PNG: %s", j.eof ? "truncated" : "corrupt", j.msg);
            r = LD_ESAMPLE;
        }
        goto out;
    }
    b->width = (int)j.width;
    b->height = (int)j.height;
    b->org_x = b->org_y = 0;
    b->src_width = b->width;
    b->src_height = b->height;
    b->scale_num = b->scale_denom = 1;
    b->format = IMAGE_FORMAT_PNG;
out:
    png_destroy_read_struct(&j.png, j.info ? &j.info : NULL, NULL);
    return r;
}

/* The header's dimensions without decoding anything (libpng reads IHDR, the first chunk). */
static int png_probe(const uint8_t *data, size_t len, struct image_info *ret_info, char *errbuf)
{
    if (len < 8 + 8 + 13 || memcmp(data + 12, "IHDR", 4) != 0) {
        ld_errorf(errbuf, "%s PNG: no IHDR chunk at the start", len < 33 ? "truncated" : "corrupt");
        return LD_ESAMPLE;
    }
    uint32_t w = be32(data + 16);
    uint32_t h = be32(data + 20);
    if (w == 0 || h == 0 || w > 0x7fffffffu || h > 0x7fffffffu) {
        ld_errorf(errbuf, "corrupt PNG: invalid size %" PRIu32 "x%" PRIu32, w, h);
        return LD_ESAMPLE;
    }
    ret_info->format = IMAGE_FORMAT_PNG;
    ret_info->width = (int)w;
    ret_info->height = (int)h;
    ret_info->progressive = false;
    return 0;
}

static bool png_sniff(const uint8_t *data, size_t len)
{
    return len >= 8 && memcmp(data, png_magic, 8) == 0;
}

static int png_probe_info(const uint8_t *data, size_t len, struct image_buf *b, struct image_info *ret_info,
                          char *errbuf)
{
    (void)b;
    return png_probe(data, len, ret_info, errbuf);
}

const struct image_backend image_png_backend = {
    .format = IMAGE_FORMAT_PNG,
    .name = "PNG",
    .sniff = png_sniff,
    .probe = png_probe_info,
    .decode = decode_png,
};
