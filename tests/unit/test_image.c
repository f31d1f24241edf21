/* Unit tests for image: JPEG and PNG fixtures are encoded in memory from known pixels,
 * then decoded: PNG (lossless) must give the pixels back exactly in every color type,
 * JPEG within a tolerance; grayscale and CMYK JPEGs come out as RGB; the DCT scale
 * follows the caller's hint; the pixel limit is enforced from the header before any
 * large allocation; bad data of every kind gets a specific error. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jpeglib.h needs FILE and size_t first. */
#include <jpeglib.h>

#include "image.h"
#include "image_backend.h"
#include "image_fixtures.h"
#include "ld_error.h"
#include "proto.h"

/* Largest and mean absolute difference between two byte arrays. */
static void diff_stats(const uint8_t *a, const uint8_t *b, size_t n, int *ret_max, double *ret_mean)
{
    int mx = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > mx)
            mx = d;
        sum += d;
    }
    *ret_max = mx;
    *ret_mean = sum / (double)n;
}

static void decode_ok(const struct blob *b, const struct image_decode_opts *o, struct image_buf *buf)
{
    char err[LD_ERRMSG_MAX] = "";
    int r = image_decode(b->data, b->len, o, buf, err);
    if (r != 0)
        fail_msg("decode failed (%d): %s", r, err);
}

/* Decodes and expects LD_ESAMPLE with `needle` in the message. */
static void decode_fails(const uint8_t *data, size_t len, const struct image_decode_opts *o,
                         const char *needle)
{
    struct image_buf buf;
    image_buf_init(&buf);
    char err[LD_ERRMSG_MAX] = "";
    int r = image_decode(data, len, o, &buf, err);
    if (r != LD_ESAMPLE || !strstr(err, needle))
        fail_msg("expected LD_ESAMPLE with '%s', got %d: '%s'", needle, r, err);
    image_buf_close(&buf);
}

static void test_detect(void **state)
{
    (void)state;
    static const uint8_t jpg[] = {0xff, 0xd8, 0xff, 0xe0};
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    assert_int_equal(image_detect(jpg, sizeof jpg), IMAGE_FORMAT_JPEG);
    assert_int_equal(image_detect(png, sizeof png), IMAGE_FORMAT_PNG);
    assert_int_equal(image_detect(png, 7), IMAGE_FORMAT_UNKNOWN);
    assert_int_equal(image_detect(jpg, 2), IMAGE_FORMAT_UNKNOWN);
    assert_int_equal(image_detect((const uint8_t *)"GIF89a", 6), IMAGE_FORMAT_UNKNOWN);
    assert_string_equal(image_format_name(IMAGE_FORMAT_JPEG), "JPEG");
    assert_string_equal(image_format_name(IMAGE_FORMAT_PNG), "PNG");

    decode_fails((const uint8_t *)"GIF89a\x01\x00\x01\x00", 10, NULL, "unsupported image format GIF");
    decode_fails((const uint8_t *)"RIFF\0\0\0\0WEBPVP8 ", 16, NULL, "unsupported image format WebP");
    decode_fails((const uint8_t *)"BM\0\0\0\0", 6, NULL, "unsupported image format BMP");
    decode_fails((const uint8_t *)"", 0, NULL, "empty file");
    decode_fails((const uint8_t *)"hello world", 11, NULL,
                 "not a JPEG or PNG image (11 bytes, starting with 68 65 6c 6c 6f 20 77 6f)");

    /* The extension is irrelevant: only bytes are looked at, so a PNG is a PNG. */
    uint8_t px[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct blob b = png_encode_rgb(px, 2, 2);
    struct image_buf buf;
    image_buf_init(&buf);
    struct image_info info;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(image_probe(b.data, b.len, &buf, &info, err), 0);
    assert_int_equal(info.format, IMAGE_FORMAT_PNG);
    assert_int_equal(info.width, 2);
    assert_int_equal(info.height, 2);
    image_buf_close(&buf);
    blob_free(&b);
}

static void test_jpeg_rgb(void **state)
{
    (void)state;
    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_444, 100, 0);
    struct image_buf buf;
    image_buf_init(&buf);
    decode_ok(&b, NULL, &buf);
    assert_int_equal(buf.width, w);
    assert_int_equal(buf.height, h);
    assert_int_equal(buf.src_width, w);
    assert_int_equal(buf.scale_num, 1);
    assert_int_equal(buf.scale_denom, 1);
    assert_int_equal(buf.format, IMAGE_FORMAT_JPEG);
    int mx;
    double mean;
    diff_stats(buf.data, px, (size_t)w * h * 3, &mx, &mean);
    assert_true(mx <= 8);
    assert_true(mean < 1.5);

    /* A second decode of the same size reuses the buffer: no allocation per sample. */
    uint8_t *first = buf.data;
    size_t cap = buf.cap;
    decode_ok(&b, NULL, &buf);
    assert_ptr_equal(buf.data, first);
    assert_int_equal(buf.cap, cap);

    struct image_info info;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(image_probe(b.data, b.len, &buf, &info, err), 0);
    assert_int_equal(info.format, IMAGE_FORMAT_JPEG);
    assert_int_equal(info.width, w);
    assert_int_equal(info.height, h);
    assert_false(info.progressive);
    image_buf_close(&buf);
    blob_free(&b);

    /* Progressive JPEGs decode too, and the probe says what they are. */
    b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 95, TJFLAG_PROGRESSIVE);
    image_buf_init(&buf);
    assert_int_equal(image_probe(b.data, b.len, &buf, &info, err), 0);
    assert_true(info.progressive);
    decode_ok(&b, NULL, &buf);
    diff_stats(buf.data, px, (size_t)w * h * 3, &mx, &mean);
    assert_true(mean < 3.0);
    image_buf_close(&buf);
    blob_free(&b);
    free(px);
}

static void test_jpeg_gray(void **state)
{
    (void)state;
    int w = 40, h = 24;
    uint8_t *g = malloc((size_t)w * h);
    for (int i = 0; i < w * h; i++)
        g[i] = (uint8_t)(i % w * 6 + i / w);
    struct blob b = jpeg_encode(g, w, h, TJPF_GRAY, TJSAMP_GRAY, 100, 0);
    struct image_buf buf;
    image_buf_init(&buf);
    decode_ok(&b, NULL, &buf);
    assert_int_equal(buf.width, w);
    assert_int_equal(buf.height, h);
    for (int i = 0; i < w * h; i++) {
        const uint8_t *p = buf.data + 3 * i;
        assert_int_equal(p[0], p[1]);
        assert_int_equal(p[1], p[2]);
        assert_true(abs(p[0] - g[i]) <= 3);
    }
    image_buf_close(&buf);
    blob_free(&b);
    free(g);
}

/* TurboJPEG's CMYK (like Adobe's files) stores 255 for "no ink": C = R, M = G, Y = B
 * with K = 255 is the RGB picture itself; K = 128 darkens it to about half. */
static void test_jpeg_cmyk(void **state)
{
    (void)state;
    int w = 32, h = 16;
    uint8_t *rgb = picture_rgb(w, h);
    uint8_t *cmyk = malloc((size_t)w * h * 4);
    for (int k = 0; k < 2; k++) {
        int kv = k ? 128 : 255;
        for (int i = 0; i < w * h; i++) {
            memcpy(cmyk + 4 * i, rgb + 3 * i, 3);
            cmyk[4 * i + 3] = (uint8_t)kv;
        }
        struct blob b = jpeg_encode(cmyk, w, h, TJPF_CMYK, TJSAMP_444, 100, 0);
        struct image_buf buf;
        image_buf_init(&buf);
        decode_ok(&b, NULL, &buf);
        assert_int_equal(buf.width, w);
        double sum = 0;
        int mx = 0;
        for (int i = 0; i < w * h * 3; i++) {
            int want = rgb[i] * kv / 255;
            int d = abs(buf.data[i] - want);
            mx = d > mx ? d : mx;
            sum += d;
        }
        assert_true(mx <= 10);
        assert_true(sum / (w * h * 3) < 2.0);
        image_buf_close(&buf);
        blob_free(&b);
    }
    free(cmyk);
    free(rgb);
}

static void expect_png(const struct blob *b, int w, int h, const uint8_t *want_rgb)
{
    struct image_buf buf;
    image_buf_init(&buf);
    decode_ok(b, NULL, &buf);
    assert_int_equal(buf.width, w);
    assert_int_equal(buf.height, h);
    assert_int_equal(buf.format, IMAGE_FORMAT_PNG);
    assert_int_equal(buf.scale_denom, 1);
    assert_memory_equal(buf.data, want_rgb, (size_t)w * h * 3);
    image_buf_close(&buf);
}

static void test_png_color_types(void **state)
{
    (void)state;
    enum { W = 5, H = 3, N = W * H };
    uint8_t rgb[N * 3], want[N * 3], raw[N * 8];
    for (int i = 0; i < N * 3; i++)
        rgb[i] = (uint8_t)(i * 17 + 3);

    /* RGB, plain and interlaced. */
    struct blob b = png_encode_rgb(rgb, W, H);
    expect_png(&b, W, H, rgb);
    blob_free(&b);
    b = png_encode(rgb, W * 3, W, H, PNG_COLOR_TYPE_RGB, 8, NULL, 0, NULL, 0, 1);
    expect_png(&b, W, H, rgb);
    blob_free(&b);

    /* RGBA: alpha dropped (PIL's convert("RGB")), not blended. */
    for (int i = 0; i < N; i++) {
        memcpy(raw + 4 * i, rgb + 3 * i, 3);
        raw[4 * i + 3] = (uint8_t)(i * 16);
    }
    b = png_encode(raw, W * 4, W, H, PNG_COLOR_TYPE_RGB_ALPHA, 8, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, rgb);
    blob_free(&b);

    /* 16-bit RGB: the high byte of each sample. */
    for (int i = 0; i < N * 3; i++) {
        raw[2 * i] = rgb[i];
        raw[2 * i + 1] = (uint8_t)(255 - rgb[i]);
    }
    b = png_encode(raw, W * 6, W, H, PNG_COLOR_TYPE_RGB, 16, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, rgb);
    blob_free(&b);

    /* 8-bit gray, gray + alpha, 16-bit gray: R = G = B = the gray level. */
    for (int i = 0; i < N; i++) {
        uint8_t g = (uint8_t)(i * 13 + 7);
        raw[i] = g;
        want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = g;
    }
    b = png_encode(raw, W, W, H, PNG_COLOR_TYPE_GRAY, 8, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);
    uint8_t ga[N * 2], g16[N * 2];
    for (int i = 0; i < N; i++) {
        ga[2 * i] = raw[i];
        ga[2 * i + 1] = 77;
        g16[2 * i] = raw[i];
        g16[2 * i + 1] = 0xab;
    }
    b = png_encode(ga, W * 2, W, H, PNG_COLOR_TYPE_GRAY_ALPHA, 8, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);
    b = png_encode(g16, W * 2, W, H, PNG_COLOR_TYPE_GRAY, 16, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);

    /* 1-bit gray: 0 -> 0, 1 -> 255. Rows are packed MSB first. */
    uint8_t bits[H];
    for (int y = 0; y < H; y++) {
        bits[y] = 0;
        for (int x = 0; x < W; x++) {
            int on = (x + y) % 2;
            bits[y] |= (uint8_t)(on << (7 - x));
            memset(want + 3 * (y * W + x), on ? 255 : 0, 3);
        }
    }
    b = png_encode(bits, 1, W, H, PNG_COLOR_TYPE_GRAY, 1, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);

    /* 4-bit gray: v -> v * 17. */
    uint8_t nib[H * 3];
    memset(nib, 0, sizeof nib);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int v = (x * 3 + y) & 15;
            nib[y * 3 + x / 2] |= (uint8_t)(v << (x % 2 ? 0 : 4));
            memset(want + 3 * (y * W + x), v * 17, 3);
        }
    b = png_encode(nib, 3, W, H, PNG_COLOR_TYPE_GRAY, 4, NULL, 0, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);

    /* Palette, with and without transparency: the palette's colors. */
    uint8_t pal[4 * 3] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
    uint8_t trns[4] = {0, 128, 255, 7};
    uint8_t idx[N];
    for (int i = 0; i < N; i++) {
        idx[i] = (uint8_t)(i % 4);
        memcpy(want + 3 * i, pal + 3 * (i % 4), 3);
    }
    b = png_encode(idx, W, W, H, PNG_COLOR_TYPE_PALETTE, 8, pal, 4, NULL, 0, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);
    b = png_encode(idx, W, W, H, PNG_COLOR_TYPE_PALETTE, 8, pal, 4, trns, 4, 0);
    expect_png(&b, W, H, want);
    blob_free(&b);
}

static void test_bad_jpeg(void **state)
{
    (void)state;
    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);

    size_t scan = 0;
    for (size_t i = 2; i + 1 < b.len && !scan; i++)
        if (b.data[i] == 0xff && b.data[i + 1] == 0xda)
            scan = i;
    assert_true(scan > 0 && scan + 100 < b.len);
    /* Cut in the image data, then in the header. */
    decode_fails(b.data, scan + (b.len - scan) / 2, NULL, "truncated JPEG: Premature end of JPEG file");
    decode_fails(b.data, scan / 2, NULL, "truncated JPEG: ");
    decode_fails(b.data, 100, NULL, "truncated JPEG");
    decode_fails(b.data, 3, NULL, "truncated JPEG");

    /* 12-bit precision in the frame header: this libjpeg cannot decode it. */
    struct blob bad = {malloc(b.len), b.len};
    memcpy(bad.data, b.data, b.len);
    for (size_t i = 2; i + 4 < bad.len; i++)
        if (bad.data[i] == 0xff && bad.data[i + 1] == 0xc0) {
            bad.data[i + 4] = 12;
            break;
        }
    decode_fails(bad.data, bad.len, NULL, "corrupt JPEG header: Unsupported JPEG data precision 12");

    /* Garbage in the entropy-coded data: a warning that strict mode refuses. */
    memcpy(bad.data, b.data, b.len);
    size_t sos = 0;
    for (size_t i = 2; i + 1 < bad.len; i++)
        if (bad.data[i] == 0xff && bad.data[i + 1] == 0xda) {
            sos = i;
            break;
        }
    assert_true(sos > 0);
    for (size_t i = sos + 20; i < sos + 80; i++)
        bad.data[i] = (uint8_t)(i * 37);
    /* Keep marker-like bytes out so the damage stays "corrupt data". */
    for (size_t i = sos + 20; i < sos + 80; i++)
        if (bad.data[i] == 0xff)
            bad.data[i] = 0xfe;
    struct image_decode_opts strict = {.strict = true};
    decode_fails(bad.data, bad.len, &strict, "corrupt JPEG: ");
    /* Tolerated by default, like PIL does: the image keeps its size. */
    struct image_buf buf;
    image_buf_init(&buf);
    char err[LD_ERRMSG_MAX] = "";
    int r = image_decode(bad.data, bad.len, NULL, &buf, err);
    if (r == 0) {
        assert_int_equal(buf.width, w);
    } else {
        /* A fatal error is acceptable too, as long as it is reported as such. */
        assert_int_equal(r, LD_ESAMPLE);
        assert_non_null(strstr(err, "corrupt JPEG"));
    }
    image_buf_close(&buf);
    blob_free(&bad);
    blob_free(&b);
    free(px);
}

static void test_bad_png(void **state)
{
    (void)state;
    int w = 16, h = 16;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = png_encode_rgb(px, w, h);
    decode_fails(b.data, b.len - 20, NULL, "truncated PNG: ");
    decode_fails(b.data, 20, NULL, "truncated PNG");

    /* A flipped byte in the image data breaks the chunk's CRC. */
    struct blob bad = {malloc(b.len), b.len};
    memcpy(bad.data, b.data, b.len);
    uint8_t *idat = memmem(bad.data, bad.len, "IDAT", 4);
    assert_non_null(idat);
    idat[10] ^= 0x55;
    decode_fails(bad.data, bad.len, NULL, "corrupt PNG: IDAT: ");
    /* A damaged CRC alone is caught as such. */
    memcpy(bad.data, b.data, b.len);
    idat = memmem(bad.data, bad.len, "IDAT", 4);
    uint32_t idat_len = (uint32_t)idat[-4] << 24 | (uint32_t)idat[-3] << 16 |
                        (uint32_t)idat[-2] << 8 | idat[-1];
    idat[4 + idat_len] ^= 0x01;
    decode_fails(bad.data, bad.len, NULL, "corrupt PNG: IDAT: CRC error");

    /* An impossible size in IHDR (CRC fixed up, so libpng judges the value). */
    memcpy(bad.data, b.data, b.len);
    png_patch_size(&bad, 0, 16);
    decode_fails(bad.data, bad.len, NULL, "corrupt PNG: ");
    struct image_buf buf;
    image_buf_init(&buf);
    struct image_info info;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(image_probe(bad.data, bad.len, &buf, &info, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "invalid size 0x16"));
    image_buf_close(&buf);
    blob_free(&bad);
    blob_free(&b);
    free(px);
}

/* The decoder picks the largest reduction that still meets the hint. */
static void test_jpeg_scale_choice(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    int num, den;
    struct image_decode_opts o = {0};
    struct {
        int w, h, min_w, min_h, want_den;
    } cases[] = {
        {64, 48, 0, 0, 1},      {64, 48, 64, 48, 1},   {64, 48, 33, 10, 1},
        {64, 48, 32, 24, 2},    {64, 48, 17, 12, 2},   {64, 48, 16, 12, 4},
        {64, 48, 8, 6, 8},      {64, 48, 1, 1, 8},     {100, 75, 13, 10, 8},
        {100, 75, 14, 10, 4},   {500, 375, 224, 224, 1}, {500, 375, 224, 168, 2},
        {1000, 750, 224, 224, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o.min_width = cases[i].min_w;
        o.min_height = cases[i].min_h;
        assert_int_equal(image_jpeg_scale(cases[i].w, cases[i].h, &o, &num, &den, err), 0);
        assert_int_equal(num, 1);
        if (den != cases[i].want_den)
            fail_msg("case %zu: %dx%d for %dx%d: 1/%d, expected 1/%d", i, cases[i].w, cases[i].h,
                     cases[i].min_w, cases[i].min_h, den, cases[i].want_den);
    }

    /* And the decode uses it: 1/4 of 64x48 is 16x12, close to the 4x4 block means. */
    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_444, 100, 0);
    struct image_buf buf;
    image_buf_init(&buf);
    o.min_width = 16;
    o.min_height = 12;
    decode_ok(&b, &o, &buf);
    assert_int_equal(buf.width, 16);
    assert_int_equal(buf.height, 12);
    assert_int_equal(buf.scale_denom, 4);
    assert_int_equal(buf.src_width, 64);
    assert_int_equal(buf.src_height, 48);
    for (int y = 0; y < 12; y++)
        for (int x = 0; x < 16; x++)
            for (int c = 0; c < 3; c++) {
                int sum = 0;
                for (int dy = 0; dy < 4; dy++)
                    for (int dx = 0; dx < 4; dx++)
                        sum += px[((size_t)(4 * y + dy) * w + 4 * x + dx) * 3 + c];
                int d = abs(buf.data[(y * 16 + x) * 3 + c] - (sum + 8) / 16);
                if (d > 8)
                    fail_msg("1/4 pixel (%d,%d,%d) off by %d", x, y, c, d);
            }
    image_buf_close(&buf);
    blob_free(&b);
    free(px);
}

/* A header claiming 20000x20000 must never lead to a 1.2 GB buffer: baseline is decoded
 * at a reduced scale under the limit, progressive and PNG are refused. */
static void test_pixel_limit(void **state)
{
    (void)state;
    char err[LD_ERRMSG_MAX];
    int num, den;
    assert_int_equal(image_jpeg_scale(20000, 20000, NULL, &num, &den, err), 0);
    assert_int_equal(den, 4);                  /* 5000x5000 = 25 MP <= 40 MP */
    struct image_decode_opts small = {.max_pixels = 1000000};
    assert_int_equal(image_jpeg_scale(20000, 20000, &small, &num, &den, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "image too large: 20000x20000 pixels, over the limit of 1000000"));
    /* The limit overrides the hint: 2000x2000 asked at full size is given 1/2. */
    struct image_decode_opts hint = {.min_width = 2000, .min_height = 2000, .max_pixels = 1000000};
    assert_int_equal(image_jpeg_scale(2000, 2000, &hint, &num, &den, err), 0);
    assert_int_equal(den, 2);

    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    assert_int_equal(jpeg_patch_size(&b, 20000, 20000), 0xc0);
    struct image_buf buf;
    image_buf_init(&buf);
    struct image_info info;
    assert_int_equal(image_probe(b.data, b.len, &buf, &info, err), 0);
    assert_int_equal(info.width, 20000);
    assert_int_equal(info.height, 20000);
    /* Under a 7 MP limit: decoded at 1/8, into a 2500x2500 buffer. The scan ends long
     * before the last row: tolerated by default (as PIL does), refused when strict. */
    struct image_decode_opts seven = {.max_pixels = 7000000};
    assert_int_equal(image_decode(b.data, b.len, &seven, &buf, err), 0);
    assert_int_equal(buf.width, 2500);
    assert_int_equal(buf.height, 2500);
    assert_int_equal(buf.scale_denom, 8);
    assert_true(buf.cap <= (size_t)2500 * 2500 * 3 * 2);
    seven.strict = true;
    assert_int_equal(image_decode(b.data, b.len, &seven, &buf, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "corrupt JPEG: Corrupt JPEG data: premature end of data segment"));
    image_buf_close(&buf);
    /* Under a small limit: refused before any allocation. */
    image_buf_init(&buf);
    assert_int_equal(image_decode(b.data, b.len, &small, &buf, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "image too large"));
    assert_int_equal(buf.cap, 0);
    image_buf_close(&buf);
    blob_free(&b);

    /* Progressive: libjpeg would hold every coefficient of the full image: refused. */
    b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE);
    assert_int_equal(jpeg_patch_size(&b, 20000, 20000), 0xc2);
    image_buf_init(&buf);
    assert_int_equal(image_decode(b.data, b.len, NULL, &buf, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "image too large: 20000x20000"));
    assert_non_null(strstr(err, "progressive"));
    assert_int_equal(buf.cap, 0);
    image_buf_close(&buf);
    blob_free(&b);

    /* PNG: no reduced decode, so over the limit is refused. */
    b = png_encode_rgb(px, w, h);
    png_patch_size(&b, 20000, 20000);
    image_buf_init(&buf);
    assert_int_equal(image_probe(b.data, b.len, &buf, &info, err), 0);
    assert_int_equal(info.width, 20000);
    assert_int_equal(image_decode(b.data, b.len, NULL, &buf, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "image too large: 20000x20000 pixels"));
    assert_int_equal(buf.cap, 0);
    image_buf_close(&buf);
    blob_free(&b);
    free(px);
}

/* Decodes `b` whole and with `region` (full-size coordinates) under `o`, and checks that
 * the region decode covers the region (plus its one-pixel margin, clipped) at the same
 * scale, with the full decode's pixels in the region, differing by at most `tol`. Returns
 * whether the region decode was smaller than the image (the cropped path ran). */
static bool region_matches(const struct blob *b, struct image_decode_opts o, int rx, int ry,
                           int rw, int rh, int tol)
{
    struct image_buf full, part;
    image_buf_init(&full);
    image_buf_init(&part);
    decode_ok(b, &o, &full);
    assert_int_equal(full.org_x, 0);
    assert_int_equal(full.org_y, 0);
    o.region_x = rx;
    o.region_y = ry;
    o.region_w = rw;
    o.region_h = rh;
    decode_ok(b, &o, &part);
    assert_int_equal(part.scale_denom, full.scale_denom);
    assert_int_equal(part.src_width, full.src_width);
    assert_int_equal(part.src_height, full.src_height);
    int d = full.scale_denom;
    /* The decoded pixels the region touches, one more on each side, within the image. */
    int x0 = rx / d - 1, y0 = ry / d - 1;
    int x1 = (rx + rw + d - 1) / d + 1, y1 = (ry + rh + d - 1) / d + 1;
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > full.width ? full.width : x1;
    y1 = y1 > full.height ? full.height : y1;
    if (part.org_x > x0 || part.org_y > y0 || part.org_x + part.width < x1 ||
        part.org_y + part.height < y1 || part.org_x + part.width > full.width ||
        part.org_y + part.height > full.height)
        fail_msg("region buffer (%d,%d %dx%d) does not cover (%d,%d)-(%d,%d) in %dx%d",
                 part.org_x, part.org_y, part.width, part.height, x0, y0, x1, y1, full.width,
                 full.height);
    /* The pixels must match in the region itself; the margin is libjpeg's window edge,
     * where fancy upsampling replicates instead of interpolating. */
    int mx = 0;
    for (int y = ry / d; y < (ry + rh + d - 1) / d; y++)
        for (int x = rx / d; x < (rx + rw + d - 1) / d; x++)
            for (int c = 0; c < 3; c++) {
                int a = full.data[((size_t)y * full.width + x) * 3 + c];
                int e = part.data[((size_t)(y - part.org_y) * part.width + x - part.org_x) * 3 + c];
                if (abs(a - e) > mx && getenv("REGION_DEBUG"))
                    fprintf(stderr, "diff %d at %d,%d (buf org %d,%d %dx%d)\n", abs(a - e), x, y,
                            part.org_x, part.org_y, part.width, part.height);
                mx = abs(a - e) > mx ? abs(a - e) : mx;
            }
    if (mx > tol)
        fail_msg("region (%d,%d %dx%d) at 1/%d differs from the full decode by %d", rx, ry, rw,
                 rh, d, mx);
    bool cropped = part.width < full.width || part.height < full.height;
    image_buf_close(&full);
    image_buf_close(&part);
    return cropped;
}

/* libjpeg's own encoder, for what TurboJPEG 2.1 cannot ask for: restart markers every
 * `restart_rows` MCU rows, or every `restart_mcus` MCUs (either 0). */
static struct blob jpeg_encode_restart(const uint8_t *px, int w, int h, int restart_rows,
                                       int restart_mcus)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr err;
    ci.err = jpeg_std_error(&err);
    jpeg_create_compress(&ci);
    unsigned char *out = NULL;
    unsigned long len = 0;
    jpeg_mem_dest(&ci, &out, &len);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 90, TRUE);
    ci.restart_in_rows = restart_rows;
    ci.restart_interval = (unsigned)restart_mcus;
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * w * 3);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    struct blob b = {malloc(len), len};
    assert_non_null(b.data);
    memcpy(b.data, out, len);
    free(out);
    /* A DRI marker (FF DD) is in the header. */
    bool dri = false;
    for (size_t i = 0; i + 1 < b.len && !dri; i++)
        dri = b.data[i] == 0xff && b.data[i + 1] == 0xdd;
    assert_true(dri);
    return b;
}

/* The cropped decode (rows skipped, columns cropped to iMCUs, stopped after the last
 * row) gives the full decode's pixels in the region: every subsampling, gray and CMYK,
 * both DCT modes, reduced scales, regions on the image's edges, restart markers. Progressive files and
 * strict decodes take the full decode; truncation is still reported. */
static void test_jpeg_region(void **state)
{
    (void)state;
    int w = 203, h = 157;                   /* not multiples of an iMCU */
    uint8_t *px = picture_rgb(w, h);
    uint8_t *cmyk = malloc((size_t)w * h * 4);
    for (int i = 0; i < w * h; i++) {
        memcpy(cmyk + 4 * i, px + 3 * i, 3);
        cmyk[4 * i + 3] = (uint8_t)(200 + i % 50);
    }
    struct { const uint8_t *px; int pf, samp; } kinds[] = {
        {px, TJPF_RGB, TJSAMP_420}, {px, TJPF_RGB, TJSAMP_422}, {px, TJPF_RGB, TJSAMP_444},
        {px, TJPF_RGB, TJSAMP_440}, {px, TJPF_RGB, TJSAMP_411}, {px, TJPF_RGB, TJSAMP_GRAY},
        {cmyk, TJPF_CMYK, TJSAMP_420},
    };
    /* interior; top-left corner; bottom-right corner; full width; one pixel */
    static const int regions[][4] = {
        {37, 41, 90, 70}, {0, 0, 50, 33}, {150, 120, 53, 37}, {0, 60, 203, 20}, {101, 77, 1, 1},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        struct blob b = jpeg_encode(kinds[k].px, w, h, kinds[k].pf, kinds[k].samp, 90, 0);
        for (int fast = 0; fast < 2; fast++)
            for (int sc = 0; sc < 3; sc++) {
                /* min size for 1/1, 1/2, 1/4 */
                struct image_decode_opts o = {.fast = fast, .min_width = sc ? w / (1 << sc) : 0,
                                              .min_height = sc ? h / (1 << sc) : 0};
                for (size_t r = 0; r < sizeof regions / sizeof regions[0]; r++) {
                    bool cropped = region_matches(&b, o, regions[r][0], regions[r][1],
                                                  regions[r][2], regions[r][3], 0);
                    /* A region well inside the image needs fewer rows. */
                    if (r == 0 || r == 2 || r == 4)
                        assert_true(cropped);
                }
            }
        blob_free(&b);
    }

    /* Restart markers (every MCU row, every 5 MCUs: mid-row), which the skipped rows
     * must count through. */
    for (int k = 0; k < 2; k++) {
        struct blob rb = jpeg_encode_restart(px, w, h, k ? 0 : 1, k ? 5 : 0);
        for (int sc = 0; sc < 2; sc++) {
            struct image_decode_opts o = {.min_width = sc ? w / 2 : 0, .min_height = sc ? h / 2 : 0};
            for (size_t r = 0; r < sizeof regions / sizeof regions[0]; r++) {
                bool cropped = region_matches(&rb, o, regions[r][0], regions[r][1], regions[r][2],
                                              regions[r][3], 0);
                if (r == 0 || r == 2 || r == 4)
                    assert_true(cropped);
            }
        }
        blob_free(&rb);
    }

    /* Progressive: decoded whole, the region is in it. Strict: the same. */
    struct blob b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE);
    assert_false(region_matches(&b, (struct image_decode_opts){0}, 37, 41, 90, 70, 0));
    blob_free(&b);
    b = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    assert_false(region_matches(&b, (struct image_decode_opts){.strict = true}, 37, 41, 90, 70, 0));
    /* A region covering everything is a full decode. */
    assert_false(region_matches(&b, (struct image_decode_opts){0}, 0, 0, w, h, 0));

    /* Truncated data fails whatever the region, even one above the cut. */
    struct image_decode_opts o = {.region_x = 10, .region_y = 0, .region_w = 20, .region_h = 8};
    decode_fails(b.data, b.len - 40, &o, "truncated JPEG: Premature end of JPEG file");
    /* The buffer is reused from one region to the next. */
    struct image_buf buf;
    image_buf_init(&buf);
    decode_ok(&b, &o, &buf);
    assert_true(buf.height < h && buf.width < w);
    o.region_y = 100;
    decode_ok(&b, &o, &buf);
    assert_true(buf.org_y > 0);
    image_buf_close(&buf);
    blob_free(&b);
    free(cmyk);
    free(px);
}

/* ---- one bad file must not spoil the next ------------------------------------------ */

/* A marker segment of a JPEG: where its 0xFF is, the marker, and its length field. */
struct jseg {
    size_t pos;
    uint8_t marker;
    size_t len;                         /* the length field (2 + payload) */
};

/* The segments from SOI's successor up to and including the first SOS. */
static size_t jpeg_segments(const struct blob *b, struct jseg *segs, size_t max)
{
    size_t n = 0, pos = 2;
    while (pos + 4 <= b->len && n < max) {
        assert_int_equal(b->data[pos], 0xff);
        uint8_t m = b->data[pos + 1];
        size_t len = (size_t)b->data[pos + 2] << 8 | b->data[pos + 3];
        segs[n++] = (struct jseg){pos, m, len};
        if (m == 0xda)
            break;
        pos += 2 + len;
    }
    return n;
}

static const struct jseg *jpeg_find(const struct jseg *segs, size_t n, uint8_t marker)
{
    for (size_t i = 0; i < n; i++)
        if (segs[i].marker == marker)
            return &segs[i];
    fail_msg("no marker 0x%02x", marker);
    return NULL;
}

static struct blob blob_copy(const struct blob *b)
{
    struct blob c = {malloc(b->len), b->len};
    assert_non_null(c.data);
    memcpy(c.data, b->data, b->len);
    return c;
}

/* `bad` fails on `buf` with `needle` in the message (probe and decode, whole and with a
 * region, accurate and fast), and then the good image decodes on that same buffer to
 * exactly the pixels a fresh buffer gives, whole and by regions. */
static void bad_then_good(struct image_buf *buf, const uint8_t *bad, size_t bad_len,
                          const char *needle, const struct blob *good, const uint8_t *want,
                          const uint8_t *want_fast, int w, int h, bool strict_only)
{
    char err[LD_ERRMSG_MAX];
    struct image_decode_opts opts[] = {
        {0},
        {.fast = true},
        {.region_x = 9, .region_y = 17, .region_w = 30, .region_h = 20},
        {.fast = true, .region_x = 9, .region_y = 17, .region_w = 30, .region_h = 20},
        {.strict = true},
    };
    for (size_t k = strict_only ? 4 : 0; k < sizeof opts / sizeof opts[0]; k++) {
        struct image_info info;
        err[0] = '\0';
        int r = image_probe(bad, bad_len, buf, &info, err);
        if (r == 0)
            r = image_decode(bad, bad_len, &opts[k], buf, err);
        if (r != LD_ESAMPLE || !strstr(err, needle))
            fail_msg("'%s', options %zu: expected LD_ESAMPLE with '%s', got %d: '%s'", needle, k,
                     needle, r, err);
        /* The very next good file on this buffer decodes, whatever path it takes. */
        size_t j = (k + 1) % (sizeof opts / sizeof opts[0]);
        if (image_probe(good->data, good->len, buf, &info, err) != 0)
            fail_msg("after '%s': probing a good JPEG failed: %s", needle, err);
        assert_int_equal(info.width, w);
        assert_int_equal(info.height, h);
        if (image_decode(good->data, good->len, &opts[j], buf, err) != 0)
            fail_msg("after '%s' (options %zu): a good JPEG failed: %s", needle, k, err);
        /* Whole image, or the region (its one-pixel margin is libjpeg's window edge). */
        const uint8_t *ref = opts[j].fast ? want_fast : want;
        struct image_decode_opts *o = &opts[j];
        int x0 = o->region_w ? o->region_x : 0, y0 = o->region_w ? o->region_y : 0;
        int cw = o->region_w ? o->region_w : w, ch = o->region_w ? o->region_h : h;
        assert_true(buf->org_x <= x0 && buf->org_y <= y0);
        assert_true(buf->org_x + buf->width >= x0 + cw && buf->org_y + buf->height >= y0 + ch);
        for (int y = y0; y < y0 + ch; y++)
            if (memcmp(buf->data + ((size_t)(y - buf->org_y) * buf->width + x0 - buf->org_x) * 3,
                       ref + ((size_t)y * w + x0) * 3, (size_t)cw * 3) != 0)
                fail_msg("after '%s': row %d of a good JPEG differs (options %zu)", needle, y, j);
    }
}

/* A JPEG whose header is damaged in one place (a frame of 0x0, a bad frame header,
 * huge dimensions, bad tables, cut at every marker) is refused with a specific error,
 * and the same worker buffer then decodes good JPEGs exactly: a failed decoder handle
 * is never reused (before, a 0x0 frame left TurboJPEG's handle failing every later
 * file with "Bogus marker length"). */
static void test_bad_jpeg_then_good(void **state)
{
    (void)state;
    int w = 64, h = 48;
    uint8_t *px = picture_rgb(w, h);
    struct blob good = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    /* Reference pixels from fresh buffers. */
    struct image_buf ref, ref_fast;
    image_buf_init(&ref);
    image_buf_init(&ref_fast);
    decode_ok(&good, NULL, &ref);
    decode_ok(&good, &(struct image_decode_opts){.fast = true}, &ref_fast);

    struct jseg segs[32];
    size_t n = jpeg_segments(&good, segs, 32);
    const struct jseg *sof = jpeg_find(segs, n, 0xc0), *dht = jpeg_find(segs, n, 0xc4);
    const struct jseg *dqt = jpeg_find(segs, n, 0xdb), *sos = jpeg_find(segs, n, 0xda);
    struct image_buf buf;
    image_buf_init(&buf);
    struct blob bad = blob_copy(&good);
#define BAD(needle) bad_then_good(&buf, bad.data, bad.len, needle, &good, ref.data, ref_fast.data, w, h, false)
    /* The frame: SOF0 = FF C0, length, precision, height, width, components, then
     * per component id, sampling factors, table. */
    uint8_t *f = bad.data + sof->pos;
    memset(f + 5, 0, 4);                                    /* 0x0 */
    BAD("corrupt JPEG header: the frame declares 0x0 pixels (Empty JPEG image");
    memcpy(bad.data, good.data, good.len);
    f[7] = f[8] = 0;                                        /* width 0 */
    BAD("corrupt JPEG header: the frame declares 0x48 pixels");
    memcpy(bad.data, good.data, good.len);
    f[3] = 5;                                               /* length shorter than the frame */
    BAD("corrupt JPEG header: Bogus marker length");
    memcpy(bad.data, good.data, good.len);
    f[9] = 0;                                               /* no components */
    BAD("corrupt JPEG header: ");
    memcpy(bad.data, good.data, good.len);
    f[11] = 0x00;                                           /* sampling factors 0x0 */
    BAD("corrupt JPEG header: Bogus sampling factors");
    memcpy(bad.data, good.data, good.len);
    f[11] = 0x55;                                           /* 5x5: over libjpeg's limit */
    BAD("corrupt JPEG header: Bogus sampling factors");
    memcpy(bad.data, good.data, good.len);
    f[5] = f[6] = f[7] = f[8] = 0xff;                       /* 65535 x 65535 */
    BAD("corrupt JPEG header: Maximum supported image dimension is 65500 pixels");
    f[6] = f[8] = 0xdc;                                     /* 65500 x 65500 */
    BAD("image too large: 65500x65500 pixels");
    /* 20000 x 20000 (under the pixel limit at 1/4) over 64x48 worth of data: libjpeg
     * meets the end of the data early and paints the rest gray, a warning that a
     * lenient decode accepts as PIL does; a strict one refuses it. */
    f[5] = f[7] = 0x4e;
    f[6] = f[8] = 0x20;
    char err[LD_ERRMSG_MAX];
    assert_int_equal(image_decode(bad.data, bad.len, NULL, &buf, err), 0);
    assert_int_equal(buf.src_width, 20000);
    assert_int_equal(buf.scale_denom, 4);              /* 5000 x 5000: 25 M pixels */
    bad_then_good(&buf, bad.data, bad.len, "corrupt JPEG: Corrupt JPEG data: premature end of data segment",
                  &good, ref.data, ref_fast.data, w, h, true);
    /* Tables: a quantization table slot past the four there are; a Huffman table
     * whose code counts add up to more than 256 codes. */
    memcpy(bad.data, good.data, good.len);
    bad.data[dqt->pos + 4] = 0x07;
    BAD("corrupt JPEG header: Bogus DQT index 7");
    memcpy(bad.data, good.data, good.len);
    memset(bad.data + dht->pos + 5, 0xff, 16);
    BAD("Bogus Huffman table definition");
    /* The scan names a component the frame does not have. */
    memcpy(bad.data, good.data, good.len);
    bad.data[sos->pos + 5] = 0x09;
    BAD("corrupt JPEG");
    /* Cut at every marker of the header, and in the middle of each segment. */
    for (size_t i = 0; i < n; i++) {
        size_t cuts[3] = {segs[i].pos, segs[i].pos + 3, segs[i].pos + 2 + segs[i].len / 2};
        for (int c = 0; c < 3; c++) {
            memcpy(bad.data, good.data, good.len);
            bad_then_good(&buf, bad.data, cuts[c], "truncated JPEG", &good, ref.data,
                          ref_fast.data, w, h, false);
        }
    }
#undef BAD
    blob_free(&bad);
    image_buf_close(&buf);
    image_buf_close(&ref);
    image_buf_close(&ref_fast);
    blob_free(&good);
    free(px);
}

/* A worker's region decoder goes from a 4:4:4 image to a 4:2:0 one decoded with merged
 * upsampling (`fast`) and rows skipped: the pixels are the whole decode's. With
 * libjpeg-turbo 2.1, the first decode's color converter stayed referenced after it was
 * freed and jpeg_skip_scanlines wrote through it (seen with valgrind: invalid reads and
 * writes; without a sanitizer, crops in wrong colors). */
static void test_region_decoder_reuse(void **state)
{
    (void)state;
    int w = 203, h = 157;
    uint8_t *px = picture_rgb(w, h);
    struct blob b444 = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_444, 90, 0);
    struct blob b420 = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 75, 0);
    struct image_buf full, buf;
    image_buf_init(&full);
    image_buf_init(&buf);
    struct image_decode_opts fast = {.fast = true};
    decode_ok(&b420, &fast, &full);
    for (int i = 0; i < 8; i++) {
        struct image_decode_opts o = {.fast = i % 2, .region_x = 3 + i, .region_y = 5 + 7 * i,
                                      .region_w = 90, .region_h = 60};
        decode_ok(&b444, &o, &buf);
        o.fast = true;
        decode_ok(&b420, &o, &buf);
        assert_true(buf.org_y > 0);
        for (int y = 0; y < buf.height; y++)
            if (memcmp(buf.data + (size_t)y * buf.width * 3,
                       full.data + ((size_t)(y + buf.org_y) * w + buf.org_x) * 3,
                       (size_t)buf.width * 3) != 0)
                fail_msg("round %d: row %d of the region differs from the whole decode", i,
                         y + buf.org_y);
    }
    image_buf_close(&full);
    image_buf_close(&buf);
    blob_free(&b444);
    blob_free(&b420);
    free(px);
}

static void test_buf_reserve(void **state)
{
    (void)state;
    struct image_buf buf;
    image_buf_init(&buf);
    uint8_t *p, *q;
    assert_int_equal(image_buf_reserve(&buf, IMAGE_AUX_TMP, 1000, &p), 0);
    memset(p, 1, 1000);
    assert_int_equal(image_buf_reserve(&buf, IMAGE_AUX_TMP, 500, &q), 0);
    assert_ptr_equal(p, q);                    /* never shrinks */
    assert_int_equal(image_buf_reserve(&buf, IMAGE_AUX_COUNT, 1, &q), LD_EINVAL);
    assert_int_equal(image_buf_reserve(&buf, -1, 1, &q), LD_EINVAL);
    image_buf_close(&buf);
    image_buf_close(&buf);                     /* a closed buffer is a zeroed one */
    image_buf_close(NULL);
}

/* The decode entry point dispatches on the first bytes to one backend per format
 * (image_backend.h): each backend claims its own signature only, its probe agrees with
 * its decode, and one worker's buffer serves both backends in turn, every decoder
 * handle freed by image_buf_close (ASan reports a leak otherwise). */
static void test_backends(void **state)
{
    (void)state;
    const struct image_backend *be[] = {&image_jpeg_backend, &image_png_backend};
    int w = 67, h = 41;
    uint8_t *px = picture_rgb(w, h);
    struct blob jpg = jpeg_encode(px, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    struct blob png = png_encode_rgb(px, w, h);
    struct blob *blobs[] = {&jpg, &png};
    char err[LD_ERRMSG_MAX];
    struct image_buf buf;
    image_buf_init(&buf);
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(image_format_name(be[i]->format), be[i]->name);
        for (size_t j = 0; j < 2; j++)
            assert_true(be[i]->sniff(blobs[j]->data, blobs[j]->len) == (i == j));
        assert_int_equal(image_detect(blobs[i]->data, blobs[i]->len), be[i]->format);
    }
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < 2; i++) {
            struct image_info info;
            assert_int_equal(image_probe(blobs[i]->data, blobs[i]->len, &buf, &info, err), 0);
            assert_int_equal(info.format, be[i]->format);
            assert_int_equal(info.width, w);
            assert_int_equal(info.height, h);
            /* A region for the JPEG's libjpeg path on the second round. */
            struct image_decode_opts o = {0};
            if (round == 1)
                o = (struct image_decode_opts){.region_x = 20, .region_y = 20, .region_w = 10, .region_h = 10};
            assert_int_equal(image_decode(blobs[i]->data, blobs[i]->len, &o, &buf, err), 0);
            assert_int_equal(buf.format, be[i]->format);
            assert_int_equal(buf.src_width, w);
            assert_int_equal(buf.src_height, h);
        }
    }
    assert_non_null(buf.tj);
    assert_non_null(buf.jd);                   /* the region went through libjpeg */
    image_buf_close(&buf);
    assert_null(buf.tj);
    assert_null(buf.jd);
    /* The PNG header's 32-bit size, beyond 16 bits. */
    png_patch_size(&png, 100000, 3);
    struct image_info info;
    assert_int_equal(image_probe(png.data, png.len, &buf, &info, err), 0);
    assert_int_equal(info.width, 100000);
    assert_int_equal(info.height, 3);
    image_buf_close(&buf);
    blob_free(&jpg);
    blob_free(&png);
    free(px);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_jpeg_rgb),
        cmocka_unit_test(test_jpeg_gray),
        cmocka_unit_test(test_jpeg_cmyk),
        cmocka_unit_test(test_png_color_types),
        cmocka_unit_test(test_bad_jpeg),
        cmocka_unit_test(test_bad_png),
        cmocka_unit_test(test_jpeg_scale_choice),
        cmocka_unit_test(test_pixel_limit),
        cmocka_unit_test(test_buf_reserve),
        cmocka_unit_test(test_jpeg_region),
        cmocka_unit_test(test_bad_jpeg_then_good),
        cmocka_unit_test(test_region_decoder_reuse),
        cmocka_unit_test(test_backends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
