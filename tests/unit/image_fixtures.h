/* Image fixtures for test_image and test_transform: JPEG and PNG files encoded in
 * memory from known pixels (tjCompress2, libpng), so no binary fixture is committed.
 * Include after <cmocka.h>. */
#ifndef LD_TEST_IMAGE_FIXTURES_H
#define LD_TEST_IMAGE_FIXTURES_H

#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#define FIXTURE_UNUSED __attribute__((unused))

struct blob {
    uint8_t *data;
    size_t len;
};

FIXTURE_UNUSED static void blob_free(struct blob *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

/* Pixels in TurboJPEG pixel format pf (TJPF_RGB, TJPF_GRAY, TJPF_CMYK) to a JPEG. */
FIXTURE_UNUSED static struct blob jpeg_encode(const uint8_t *px, int w, int h, int pf, int subsamp,
                                              int quality, int flags)
{
    tjhandle c = tjInitCompress();
    assert_non_null(c);
    unsigned char *out = NULL;
    unsigned long len = 0;
    int r = tjCompress2(c, px, w, 0, h, pf, &out, &len, subsamp, quality, flags);
    if (r != 0)
        fail_msg("tjCompress2: %s", tjGetErrorStr2(c));
    struct blob b = {malloc(len), len};
    assert_non_null(b.data);
    memcpy(b.data, out, len);
    tjFree(out);
    tjDestroy(c);
    return b;
}

/* A smooth, non-trivial RGB test picture (JPEG-friendly). */
FIXTURE_UNUSED static uint8_t *picture_rgb(int w, int h)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    assert_non_null(px);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 255 / (w > 1 ? w - 1 : 1));
            p[1] = (uint8_t)(y * 255 / (h > 1 ? h - 1 : 1));
            p[2] = (uint8_t)((x * x + y * y) * 255 / (w * w + h * h));
        }
    return px;
}

struct png_sink {
    struct blob b;
    size_t cap;
};

static void fixture_png_write(png_structp png, png_bytep data, size_t n)
{
    struct png_sink *s = png_get_io_ptr(png);
    if (s->b.len + n > s->cap) {
        size_t cap = (s->b.len + n) * 2 + 1024;
        uint8_t *p = realloc(s->b.data, cap);
        if (!p)
            png_error(png, "oom");
        s->b.data = p;
        s->cap = cap;
    }
    memcpy(s->b.data + s->b.len, data, n);
    s->b.len += n;
}

static void fixture_png_flush(png_structp png)
{
    (void)png;
}

/* Rows of raw PNG samples (PNG byte order: 16-bit big-endian, sub-byte packed) to a
 * PNG file. palette: n_palette RGB triples; trns: n_trns alpha values (palette) or
 * NULL. */
FIXTURE_UNUSED static struct blob png_encode(const uint8_t *raw, size_t row_bytes, int w, int h,
                                             int color_type, int bit_depth, const uint8_t *palette,
                                             int n_palette, const uint8_t *trns, int n_trns,
                                             int interlace)
{
    struct png_sink sink = {{NULL, 0}, 0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    assert_non_null(png);
    png_infop info = png_create_info_struct(png);
    assert_non_null(info);
    png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)h);
    assert_non_null(rows);
    if (setjmp(png_jmpbuf(png)))
        fail_msg("libpng write failed");
    png_set_write_fn(png, &sink, fixture_png_write, fixture_png_flush);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, bit_depth, color_type,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) {
        png_color pal[256];
        for (int i = 0; i < n_palette; i++) {
            pal[i].red = palette[3 * i];
            pal[i].green = palette[3 * i + 1];
            pal[i].blue = palette[3 * i + 2];
        }
        png_set_PLTE(png, info, pal, n_palette);
    }
    if (trns)
        png_set_tRNS(png, info, trns, n_trns, NULL);
    png_write_info(png, info);
    for (int y = 0; y < h; y++)
        rows[y] = (png_bytep)(uintptr_t)(raw + (size_t)y * row_bytes);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return sink.b;
}

/* 8-bit RGB pixels to a PNG (lossless: decoding must give them back exactly). */
FIXTURE_UNUSED static struct blob png_encode_rgb(const uint8_t *px, int w, int h)
{
    return png_encode(px, (size_t)w * 3, w, h, PNG_COLOR_TYPE_RGB, 8, NULL, 0, NULL, 0, 0);
}

/* CRC-32 as PNG uses it, for patching chunks. */
FIXTURE_UNUSED static uint32_t fixture_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

static void fixture_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Rewrites a PNG's IHDR size (and its CRC). */
FIXTURE_UNUSED static void png_patch_size(struct blob *b, uint32_t w, uint32_t h)
{
    assert_true(b->len > 33 && memcmp(b->data + 12, "IHDR", 4) == 0);
    fixture_put_be32(b->data + 16, w);
    fixture_put_be32(b->data + 20, h);
    fixture_put_be32(b->data + 29, fixture_crc32(b->data + 12, 17));
}

/* Rewrites a JPEG's frame header (SOF0/SOF2) size; returns the SOF marker found. */
FIXTURE_UNUSED static int jpeg_patch_size(struct blob *b, int w, int h)
{
    for (size_t i = 2; i + 9 < b->len; i++) {
        if (b->data[i] == 0xff && (b->data[i + 1] == 0xc0 || b->data[i + 1] == 0xc2)) {
            b->data[i + 5] = (uint8_t)(h >> 8);
            b->data[i + 6] = (uint8_t)h;
            b->data[i + 7] = (uint8_t)(w >> 8);
            b->data[i + 8] = (uint8_t)w;
            return b->data[i + 1];
        }
    }
    fail_msg("no SOF0/SOF2 marker");
    return -1;
}

/* ---- pictures that look like photographs, and synthetic worst cases -------------------- */

FIXTURE_UNUSED static uint32_t fixture_hash(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* Value noise in [0, 1) on a lattice `cell` pixels apart, smoothly interpolated. */
FIXTURE_UNUSED static double fixture_noise(uint32_t seed, int px, int py, double cell)
{
    double x = px / cell, y = py / cell;
    int xi = (int)floor(x), yi = (int)floor(y);
    double fx = x - xi, fy = y - yi;
    fx = fx * fx * (3 - 2 * fx);
    fy = fy * fy * (3 - 2 * fy);
    double v[4];
    for (int k = 0; k < 4; k++)
        v[k] = fixture_hash(seed ^ fixture_hash((uint32_t)(xi + (k & 1)) * 73856093u ^
                                                (uint32_t)(yi + (k >> 1)) * 19349663u)) /
               4294967296.0;
    return (v[0] * (1 - fx) + v[1] * fx) * (1 - fy) + (v[2] * (1 - fx) + v[3] * fx) * fy;
}

FIXTURE_UNUSED static uint8_t fixture_clamp(double v)
{
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)lrint(v);
}

/* What a photograph has that a gradient lacks: a smooth two-colour background, texture
 * at three scales and grain, and sharp-edged ellipses, rectangles and thin lines at any
 * angle. A function of (w, h, seed). */
FIXTURE_UNUSED static uint8_t *photo_rgb(int w, int h, uint32_t seed)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    assert_non_null(px);
    double c0[3], c1[3];
    for (int k = 0; k < 3; k++) {
        c0[k] = fixture_hash(seed * 3 + (uint32_t)k) % 200 + 20;
        c1[k] = fixture_hash(seed * 5 + (uint32_t)k + 99) % 200 + 20;
    }
    enum { MAX_SHAPES = 12 };
    struct {
        double cx, cy, rx, ry, s, c, half;
        int kind;
        uint8_t col[3];
    } sh[MAX_SHAPES];
    int ns = 6 + (int)(fixture_hash(seed + 7) % 6);
    for (int i = 0; i < ns; i++) {
        uint32_t q = fixture_hash(seed * 1000 + (uint32_t)i);
        sh[i].cx = q % (uint32_t)w;
        sh[i].cy = (q >> 8) % (uint32_t)h;
        sh[i].rx = 6 + fixture_hash(q + 1) % (uint32_t)(w / 4 + 1);
        sh[i].ry = 6 + fixture_hash(q + 2) % (uint32_t)(h / 4 + 1);
        sh[i].kind = (int)(fixture_hash(q + 3) % 3);
        sh[i].s = sin(q % 628 / 100.0);
        sh[i].c = cos(q % 628 / 100.0);
        sh[i].half = 0.5 + q % 3;
        for (int k = 0; k < 3; k++)
            sh[i].col[k] = (uint8_t)(fixture_hash(q + 10 + (uint32_t)k) % 256);
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double t = (double)(x + y) / (w + h);
            double tex = 40 * (fixture_noise(seed + 1, x, y, w / 6.0 + 1) - 0.5) +
                         24 * (fixture_noise(seed + 2, x, y, 12) - 0.5) +
                         14 * (fixture_noise(seed + 3, x, y, 3) - 0.5) +
                         8 * (fixture_hash(seed ^ fixture_hash((uint32_t)(y * w + x))) / 4294967296.0 - 0.5);
            double col[3];
            for (int k = 0; k < 3; k++)
                col[k] = c0[k] * (1 - t) + c1[k] * t + tex * (k == 1 ? 1.0 : 0.8);
            for (int i = 0; i < ns; i++) {
                double dx = x - sh[i].cx, dy = y - sh[i].cy;
                bool in = sh[i].kind == 0 ? dx * dx / (sh[i].rx * sh[i].rx) + dy * dy / (sh[i].ry * sh[i].ry) < 1
                        : sh[i].kind == 1 ? fabs(dx) < sh[i].rx && fabs(dy) < sh[i].ry
                                          : fabs(dx * sh[i].s - dy * sh[i].c) < sh[i].half && fabs(dx) < 2 * sh[i].rx;
                if (in)
                    for (int k = 0; k < 3; k++)
                        col[k] = sh[i].col[k] + tex * 0.5;
            }
            for (int k = 0; k < 3; k++)
                px[((size_t)y * w + x) * 3 + k] = fixture_clamp(col[k]);
        }
    return px;
}

/* Synthetic worst cases for resampling and reduced-scale decoding: kind 0 a one-pixel
 * checkerboard; 1 a zone plate (every frequency up to Nyquist); 2 bands of stripes one
 * to six pixels wide, with hard colour edges across them. */
FIXTURE_UNUSED static uint8_t *synthetic_rgb(int w, int h, int kind)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    assert_non_null(px);
    int side = w > h ? w : h;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * 3;
            if (kind == 0) {
                p[0] = p[1] = p[2] = (x + y) % 2 ? 255 : 0;
            } else if (kind == 1) {
                double dx = x - w / 2.0, dy = y - h / 2.0;
                p[0] = p[1] = p[2] = fixture_clamp(127.5 + 127.5 * cos((dx * dx + dy * dy) * M_PI / (2.0 * side)));
            } else {
                int period = 1 + (x / 64) % 6;
                p[0] = (x / period) % 2 ? 250 : 5;
                p[1] = (y / 37) % 2 ? 200 : 30;
                p[2] = (x + y) / 51 % 2 ? 240 : 10;
            }
        }
    return px;
}

#endif
