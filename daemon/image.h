/* image — one JPEG or PNG sample decoded into 8-bit RGB.
 *
 * The format is told by the first bytes, never by a file name. JPEG goes through
 * libjpeg-turbo's TurboJPEG API and may be decoded at a reduced DCT scale (1/2, 1/4,
 * 1/8) when the caller says it needs fewer pixels; grayscale and CMYK/YCCK JPEGs come
 * out as RGB. When the caller needs only a rectangle, a baseline JPEG goes through
 * libjpeg's own API instead and only the rows and iMCU columns around it are decoded,
 * with the full decode's pixels in the rectangle. PNG goes through libpng; palette, gray, alpha and 16-bit images come out
 * as 8-bit RGB (alpha is dropped, 16-bit samples keep their high byte: what PIL's
 * convert("RGB") gives, so results match torchvision's ImageFolder loader).
 *
 * Memory is bounded before anything is allocated: the header's dimensions are checked
 * against a pixel limit. A baseline JPEG larger than the limit is decoded at the
 * largest reduction that brings it under the limit (libjpeg then needs memory only for
 * a few rows); a progressive or multi-scan JPEG (whose decoder keeps every coefficient
 * of the full-size image) or a PNG above the limit is refused.
 *
 * Errors are data errors (LD_ESAMPLE) with a sentence in errbuf such as
 * "truncated JPEG: Premature end of JPEG file"; the caller, which knows the sample
 * index and path, puts them in front ("sample 12 (cat/x.jpg): ..."). */
#ifndef LD_IMAGE_H
#define LD_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 40 megapixels: a 24 MP camera photo passes; 3 bytes a pixel, so at most 120 MB of
 * decoded image per worker. */
#define IMAGE_DEFAULT_MAX_PIXELS 40000000ull

enum image_format { IMAGE_FORMAT_UNKNOWN = 0, IMAGE_FORMAT_JPEG = 1, IMAGE_FORMAT_PNG = 2 };

/* A reusable block of scratch memory: grows, never shrinks, freed by image_buf_close. */
struct image_mem {
    uint8_t *p;
    size_t cap;
};

/* Scratch slots of struct image_buf: the decoder's backends own IMAGE_AUX_DECODE; the transform
 * pipeline owns the others. */
enum { IMAGE_AUX_DECODE = 0, IMAGE_AUX_COEF, IMAGE_AUX_TMP, IMAGE_AUX_IMG_A, IMAGE_AUX_IMG_B,
       IMAGE_AUX_ROW, IMAGE_AUX_COUNT };

/* One per worker thread, reused for every sample: after warm-up a decode allocates
 * none of the large buffers again (libjpeg and libpng still make their own small
 * per-image allocations). Not shared between threads. Zero-initialize it (or call
 * image_buf_init) before first use and end it with image_buf_close. */
struct image_buf {
    /* The last decoded image: width x height RGB pixels, rows of width * 3 bytes,
     * no padding. Owned by the buffer; valid until the next decode or close. */
    uint8_t *data;
    int width, height;
    /* The source image's size from its header, and the scale it was decoded at
     * (scale_num / scale_denom; 1/1 for PNG). */
    int src_width, src_height;
    int scale_num, scale_denom;
    enum image_format format;
    /* Where the buffer's pixel (0, 0) lies in the whole image decoded at that scale:
     * 0, 0 unless opts->region_w/region_h asked for part of it (then width x height
     * covers at least that region, at the decoded scale). */
    int org_x, org_y;
    size_t cap;                        /* bytes allocated at data */
    void *tj;                          /* TurboJPEG decompressor, made on first use */
    void *jd;                          /* libjpeg decompressor for regions, made on first use */
    struct image_mem aux[IMAGE_AUX_COUNT];
};

struct image_decode_opts {
    /* The smallest decoded size the caller can use. A JPEG is decoded at the largest
     * DCT reduction (1/8, 1/4, 1/2) whose output still has at least min_width columns
     * and min_height rows. Either one <= 0: full size. */
    int min_width, min_height;
    /* Limit on decoded pixels (width * height); 0 means IMAGE_DEFAULT_MAX_PIXELS. */
    uint64_t max_pixels;
    /* libjpeg's warnings about corrupt data (which PIL ignores too) are accepted unless
     * strict. A truncated JPEG is always an error. */
    bool strict;
    /* The fast integer DCT and plain upsampling: about 15% quicker, slightly different
     * pixels from PIL's (which uses the accurate ones). */
    bool fast;
    /* When region_w and region_h are > 0, only this rectangle of the image is needed
     * (full-size header coordinates). A baseline JPEG is then decoded from the rows and
     * iMCU columns around it only (see image_jpeg.c for when the whole image is decoded
     * anyway); the scale is chosen as without a region. */
    int region_x, region_y, region_w, region_h;
};

/* What the header says, without decoding. */
struct image_info {
    enum image_format format;
    int width, height;
    bool progressive;                  /* JPEG: progressive or multi-scan (needs full-size memory) */
};

void image_buf_init(struct image_buf *b);
/* Frees every buffer and the decoder handle; the struct may be reused after
 * image_buf_init. Accepts a zeroed struct. */
void image_buf_close(struct image_buf *b);
/* Makes aux slot `slot` at least `bytes` long; *ret_p is its memory (contents are not
 * kept across growth). LD_ENOMEM on failure. */
int image_buf_reserve(struct image_buf *b, int slot, size_t bytes, uint8_t **ret_p);

/* The format from the magic bytes, IMAGE_FORMAT_UNKNOWN otherwise. */
enum image_format image_detect(const uint8_t *data, size_t len);
const char *image_format_name(enum image_format f);
/* Reads the header only. LD_ESAMPLE with a message when the data is not a JPEG/PNG
 * or its header is corrupt. `b` provides the decoder handle. */
int image_probe(const uint8_t *data, size_t len, struct image_buf *b, struct image_info *ret_info,
                char *errbuf);
/* The DCT scale a JPEG of w x h would be decoded at under opts (ignoring whether it
 * is progressive); LD_ESAMPLE when even 1/8 is over the pixel limit. */
int image_jpeg_scale(int w, int h, const struct image_decode_opts *opts, int *ret_num,
                     int *ret_denom, char *errbuf);
/* Decodes into b (see struct image_buf). On failure b->data's contents are undefined
 * and the return is LD_ESAMPLE (bad data, errbuf says what) or LD_ENOMEM. */
int image_decode(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                 struct image_buf *b, char *errbuf);

#endif
