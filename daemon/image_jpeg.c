/* image_jpeg — the JPEG backend of the image decoder (image_backend.h): libjpeg-turbo's
 * TurboJPEG API for whole images, libjpeg's own API for a region.
 *
 * TurboJPEG reads the header, our own marker walk tells whether the image is
 * progressive or multi-scan (libjpeg then holds the whole image's coefficients in
 * memory, whatever the output scale) and whether an Adobe marker says CMYK is stored
 * inverted, then TurboJPEG decodes straight into the output at the chosen DCT scale.
 * Only the power-of-two reductions are offered: libjpeg-turbo has SIMD inverse DCTs
 * for 8x8, 4x4 and 2x2 blocks (1x1 is the DC term alone), while 7/8, 3/4 and the
 * like run in plain C and are slower than a full-size SIMD decode. When the caller
 * needs only a rectangle, a baseline JPEG is decoded from the rows and iMCU columns
 * around it only (see "JPEG regions" below). This is the hot path of an image
 * pipeline: a worker calls it once per sample with its own struct image_buf, so the
 * decoder handles and buffers are reused from sample to sample. */
#include "image_backend.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
/* jpeglib.h needs FILE and size_t first. */
#include <jpeglib.h>
#include <jerror.h>

#include "ld_error.h"

#define JPEG_SCALES_MAX 4
/* Rows asked of jpeg_read_scanlines at a time in a region: one iMCU row of the most
 * subsampled image. */
#define JPEG_REGION_ROWS 16

/* TurboJPEG takes lengths as unsigned long. */
_Static_assert(sizeof(size_t) <= sizeof(unsigned long), "size_t fits unsigned long");

/* ---- JPEG ------------------------------------------------------------------------ */

struct jpeg_markers {
    bool progressive;       /* SOF2/6/10/14, or a first scan without every component */
    bool adobe;             /* an APP14 "Adobe" marker: CMYK is stored inverted */
    bool sof;               /* a frame header was found; its size: */
    uint32_t sof_w, sof_h;
};

static uint32_t be16(const uint8_t *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}

/* Walks the markers up to the first scan. It only informs memory policy and color
 * conversion: anything it cannot parse is left for libjpeg to report. */
static void jpeg_scan_markers(const uint8_t *d, size_t len, struct jpeg_markers *m)
{
    memset(m, 0, sizeof *m);
    size_t pos = 2;
    int n_frame_comps = 0;
    while (pos + 4 <= len) {
        if (d[pos] != 0xff)
            return;
        uint8_t marker = d[pos + 1];
        if (marker == 0xff) { /* fill byte */
            pos++;
            continue;
        }
        if (marker == 0x01 || (marker >= 0xd0 && marker <= 0xd8)) {
            pos += 2;
            continue;
        }
        if (marker == 0xd9)
            return;
        uint32_t seg = be16(d + pos + 2);
        if (seg < 2 || pos + 2 + seg > len)
            return;
        const uint8_t *p = d + pos + 4;
        uint32_t plen = seg - 2;
        bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 &&
                   marker != 0xcc;
        if (sof) {
            if (marker == 0xc2 || marker == 0xc6 || marker == 0xca || marker == 0xce)
                m->progressive = true;
            if (plen >= 6) {
                n_frame_comps = p[5];
                m->sof = true;
                m->sof_h = be16(p + 1);
                m->sof_w = be16(p + 3);
            }
        } else if (marker == 0xee && plen >= 12 && memcmp(p, "Adobe", 5) == 0) {
            m->adobe = true;
        } else if (marker == 0xda) {
            /* A first scan with fewer components than the frame: non-interleaved,
             * so libjpeg buffers the whole image's coefficients. */
            if (plen >= 1 && n_frame_comps > 0 && p[0] < n_frame_comps)
                m->progressive = true;
            return;
        }
        pos += 2 + seg;
    }
}

/* Whether the data ends with an end-of-image marker (trailing zero padding aside). It
 * only names an error: a JPEG that fails to decode and lacks one was cut short. */
static bool jpeg_has_eoi(const uint8_t *d, size_t len)
{
    while (len > 2 && d[len - 1] == 0)
        len--;
    return len >= 4 && d[len - 2] == 0xff && d[len - 1] == 0xd9;
}

/* A decoder handle that failed once is never used again. TurboJPEG 2.1 can leave its
 * libjpeg object stuck in the middle of a header after an error (a frame header that
 * declares 0x0 makes every later call on that handle fail with "Bogus marker
 * length"), which would turn one bad file into a worker that fails every good JPEG.
 * Bad files are rare: a new handle for the next one costs nothing that matters. */
static void jpeg_handle_drop(struct image_buf *b)
{
    if (b->tj) {
        tjDestroy(b->tj);
        b->tj = NULL;
    }
}

static int jpeg_handle(struct image_buf *b, char *errbuf)
{
    if (b->tj)
        return 0;
    b->tj = tjInitDecompress();
    if (!b->tj) {
        ld_errorf(errbuf, "cannot create a JPEG decoder: %s", tjGetErrorStr2(NULL));
        return LD_ENOMEM;
    }
    return 0;
}

/* The frame's size and colour space (TurboJPEG), and the markers that decide how to
 * decode it (progressive, Adobe), for probe and decode alike. */
static int jpeg_header(const uint8_t *data, size_t len, struct image_buf *b, int *ret_w,
                       int *ret_h, int *ret_cs, struct jpeg_markers *ret_mk, char *errbuf)
{
    int r = jpeg_handle(b, errbuf);
    if (r < 0)
        return r;
    struct jpeg_markers mk;
    jpeg_scan_markers(data, len, &mk);
    /* TurboJPEG 2.1 returns success and leaves the outputs alone when the data ends
     * before a frame header, so they start at 0 and are checked. */
    int w = 0, h = 0, subsamp = 0, cs = 0;
    if (tjDecompressHeader3(b->tj, data, (unsigned long)len, &w, &h, &subsamp, &cs) < 0) {
        /* libjpeg's words for an empty frame ("Empty JPEG image (DNL not supported)")
         * do not say what is wrong; the frame header does. */
        if (mk.sof && (mk.sof_w == 0 || mk.sof_h == 0))
            ld_errorf(errbuf, "corrupt JPEG header: the frame declares %" PRIu32 "x%" PRIu32 " pixels (%s)",
                      mk.sof_w, mk.sof_h, tjGetErrorStr2(b->tj));
        else
            ld_errorf(errbuf, "%s: %s", jpeg_has_eoi(data, len) ? "corrupt JPEG header" : "truncated JPEG",
                      tjGetErrorStr2(b->tj));
        jpeg_handle_drop(b);
        return LD_ESAMPLE;
    }
    if (w <= 0 || h <= 0) {
        ld_errorf(errbuf, "truncated JPEG: the data (%zu bytes) ends before the image header", len);
        jpeg_handle_drop(b);
        return LD_ESAMPLE;
    }
    *ret_w = w;
    *ret_h = h;
    *ret_cs = cs;
    *ret_mk = mk;
    return 0;
}

static int scaled(int dim, int num, int denom)
{
    return (int)(((int64_t)dim * num + denom - 1) / denom);
}

int image_jpeg_scale(int w, int h, const struct image_decode_opts *opts, int *ret_num,
                     int *ret_denom, char *errbuf)
{
    uint64_t max_px = image_max_pixels(opts);
    int min_w = opts ? opts->min_width : 0, min_h = opts ? opts->min_height : 0;
    /* 1/1, 1/2, 1/4, 1/8 as far as this libjpeg-turbo offers them, largest first. */
    int denoms[JPEG_SCALES_MAX];
    int n = 0;
    int nsf = 0;
    tjscalingfactor *sf = tjGetScalingFactors(&nsf);
    for (int want = 1; want <= 8; want *= 2)
        for (int i = 0; sf && i < nsf; i++)
            if (sf[i].num == 1 && sf[i].denom == want && n < JPEG_SCALES_MAX)
                denoms[n++] = want;
    if (n == 0)
        denoms[n++] = 1;
    /* The largest reduction that still gives the caller what it asked for... */
    int pick = 0;
    if (min_w > 0 && min_h > 0)
        for (int i = n - 1; i >= 0; i--)
            if (scaled(w, 1, denoms[i]) >= min_w && scaled(h, 1, denoms[i]) >= min_h) {
                pick = i;
                break;
            }
    /* ...or more, when the pixel limit says so. */
    while ((uint64_t)scaled(w, 1, denoms[pick]) * (uint64_t)scaled(h, 1, denoms[pick]) > max_px) {
        if (++pick == n) {
            ld_errorf(errbuf, "image too large: %dx%d pixels, over the limit of %" PRIu64
                      " even at 1/%d scale", w, h, max_px, denoms[n - 1]);
            return LD_ESAMPLE;
        }
    }
    *ret_num = 1;
    *ret_denom = denoms[pick];
    return 0;
}

/* CMYK as TurboJPEG hands it out, to RGB. Adobe's (Photoshop's) files store the ink
 * amounts inverted (255 = no ink), which is nearly every CMYK JPEG there is; the same
 * formula as PIL's CMYK conversion either way. 255 is odd, so (x + 127) / 255 rounds
 * to nearest without ties. */
static void cmyk_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels, bool inverted)
{
    for (size_t i = 0; i < pixels; i++, src += 4, dst += 3) {
        unsigned c = src[0], m = src[1], y = src[2], k = src[3];
        if (!inverted) {
            c = 255 - c;
            m = 255 - m;
            y = 255 - y;
            k = 255 - k;
        }
        dst[0] = (uint8_t)((c * k + 127) / 255);
        dst[1] = (uint8_t)((m * k + 127) / 255);
        dst[2] = (uint8_t)((y * k + 127) / 255);
    }
}

/* ---- JPEG regions ------------------------------------------------------------------ *
 *
 * When the pipeline needs only a rectangle of the image (a random_resized_crop draws
 * one on the header's size before decoding), libjpeg proper decodes just that: the rows
 * above it are skipped (jpeg_skip_scanlines: entropy-decoded, not transformed), its
 * columns rounded out to iMCU boundaries (jpeg_crop_scanline), and decoding stops after
 * its last row. The rectangle is widened by one decoded pixel on every side first: fancy
 * upsampling replicates the edge column or row of a cropped or skipped window where the
 * full decode would use its neighbour, so only the window's outermost pixels may differ
 * from the full decode, and with the margin they never lie in the region itself.
 *
 * The whole image goes through TurboJPEG as before when a region would not be cheaper
 * or would change what is reported: progressive and multi-scan files (their decoder
 * reads every scan of the whole image anyway), `strict` decodes (a corrupt-data warning
 * below the region must still fail the sample), data that does not end with an EOI
 * marker (it is truncated: the full decode names that), and regions that cover
 * everything. In lenient mode a fatal error in the data after the region's last row
 * goes unseen: that sample decodes, with exactly the pixels it would have otherwise. */

struct jpeg_region_dec {
    struct jpeg_decompress_struct cinfo;    /* first: error handlers cast back from it */
    struct jpeg_error_mgr err;
    jmp_buf jmp;
    bool created;
    bool warned, eof;                       /* any warning; a "Premature end" one */
    char msg[JMSG_LENGTH_MAX];              /* the error, else the first warning */
};

static void jr_error_exit(j_common_ptr c)
{
    struct jpeg_region_dec *jd = (struct jpeg_region_dec *)(void *)c;
    (*c->err->format_message)(c, jd->msg);
    longjmp(jd->jmp, 1);
}

/* libjpeg's default prints warnings to stderr; a worker only records them. */
static void jr_emit_message(j_common_ptr c, int level)
{
    struct jpeg_region_dec *jd = (struct jpeg_region_dec *)(void *)c;
    if (level >= 0)
        return;
    if (c->err->msg_code == JWRN_JPEG_EOF)
        jd->eof = true;
    if (!jd->warned)
        (*c->err->format_message)(c, jd->msg);
    jd->warned = true;
    c->err->num_warnings++;
}

static void jr_output_message(j_common_ptr c)
{
    (void)c;
}

static void jpeg_region_dec_free(void *p)
{
    struct jpeg_region_dec *jd = p;
    if (!jd)
        return;
    if (jd->created)
        jpeg_destroy_decompress(&jd->cinfo);
    free(jd);
}

/* jpeg_create_decompress reports running out of memory through error_exit. */
static int jr_create(struct jpeg_region_dec *jd)
{
    jd->cinfo.err = jpeg_std_error(&jd->err);
    jd->err.error_exit = jr_error_exit;
    jd->err.emit_message = jr_emit_message;
    jd->err.output_message = jr_output_message;
    if (setjmp(jd->jmp))
        return -1;
    jpeg_create_decompress(&jd->cinfo);
    jd->created = true;
    return 0;
}

static void jpeg_region_dec_reset(struct jpeg_region_dec *jd)
{
    if (jd->created)
        jpeg_destroy_decompress(&jd->cinfo);
    jd->created = false;
}

static int jpeg_region_dec_get(struct image_buf *b, struct jpeg_region_dec **ret_jd, char *errbuf)
{
    struct jpeg_region_dec *jd = b->jd;
    if (!jd) {
        jd = calloc(1, sizeof *jd);
        if (!jd) {
            ld_errorf(errbuf, "cannot create a JPEG decoder: out of memory");
            return LD_ENOMEM;
        }
        b->jd = jd;
    }
    if (!jd->created && jr_create(jd) < 0) {
        ld_errorf(errbuf, "cannot create a JPEG decoder: %s", jd->msg);
        return LD_ENOMEM;
    }
    jd->warned = jd->eof = false;
    jd->msg[0] = '\0';
    jd->err.num_warnings = 0;
    *ret_jd = jd;
    return 0;
}

/* Everything region_run touches after setjmp lives here, behind a pointer. */
struct region_job {
    struct jpeg_region_dec *jd;
    const uint8_t *data;
    size_t len;
    int w, h, num, denom;                   /* header size, decode scale */
    bool fast, adobe;
    int x0, y0, x1, y1;                     /* wanted, decoded coordinates, margins included */
    struct image_buf *b;
    int result;                             /* set before a non-libjpeg failure */
    char *errbuf;
};

/* Returns 0, or -1 after a libjpeg error (jd->msg) or a failure of ours (j->result). */
static int region_run(struct region_job *j)
{
    struct jpeg_decompress_struct *ci = &j->jd->cinfo;
    struct image_buf *b = j->b;
    if (setjmp(j->jd->jmp))
        return -1;
    jpeg_mem_src(ci, j->data, (unsigned long)j->len);
    jpeg_read_header(ci, TRUE);
    bool cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    /* What TurboJPEG sets for TJPF_RGB / TJPF_CMYK and its flags, so that the pixels
     * are the full decode's. */
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
    ci->scale_num = (unsigned)j->num;
    ci->scale_denom = (unsigned)j->denom;
    ci->dct_method = j->fast ? JDCT_IFAST : JDCT_ISLOW;
    ci->do_fancy_upsampling = j->fast ? FALSE : TRUE;
    jpeg_start_decompress(ci);
    if ((int)ci->image_width != j->w || (int)ci->image_height != j->h ||
        (int)ci->output_width != scaled(j->w, j->num, j->denom) ||
        (int)ci->output_height != scaled(j->h, j->num, j->denom) ||
        ci->output_components != (cmyk ? 4 : 3)) {
        ld_errorf(j->errbuf, "corrupt JPEG: the decoder's %ux%u output differs from the header's "
                  "%dx%d at scale %d/%d", (unsigned)ci->output_width, (unsigned)ci->output_height,
                  j->w, j->h, j->num, j->denom);
        j->result = LD_ESAMPLE;
        return -1;
    }
    JDIMENSION xoff = (JDIMENSION)j->x0, cw = (JDIMENSION)(j->x1 - j->x0);
    if (cw < ci->output_width)
        jpeg_crop_scanline(ci, &xoff, &cw);     /* rounds out to iMCU columns */
    int rows = j->y1 - j->y0;
    size_t pixels = (size_t)cw * (size_t)rows;
    if (image_mem_reserve(&b->data, &b->cap, pixels * 3) < 0) {
        ld_errorf(j->errbuf, "out of memory for a %ux%d image region", (unsigned)cw, rows);
        j->result = LD_ENOMEM;
        return -1;
    }
    uint8_t *out = b->data;
    if (cmyk && image_buf_reserve(b, IMAGE_AUX_DECODE, pixels * 4, &out) < 0) {
        ld_errorf(j->errbuf, "out of memory for a %ux%d CMYK image region", (unsigned)cw, rows);
        j->result = LD_ENOMEM;
        return -1;
    }
    if (j->y0 > 0 && jpeg_skip_scanlines(ci, (JDIMENSION)j->y0) != (JDIMENSION)j->y0) {
        ld_errorf(j->errbuf, "corrupt JPEG: cannot skip to row %d", j->y0);
        j->result = LD_ESAMPLE;
        return -1;
    }
    size_t stride = (size_t)cw * (cmyk ? 4 : 3);
    /* Several rows a call: libjpeg then upsamples and converts straight into them
     * (with one row at a time, a 4:2:0 image's rows go through a spare row first). */
    while ((int)ci->output_scanline < j->y1) {
        JSAMPROW rowp[JPEG_REGION_ROWS];
        int first = (int)ci->output_scanline - j->y0;
        int want = j->y1 - (int)ci->output_scanline;
        want = want < JPEG_REGION_ROWS ? want : JPEG_REGION_ROWS;
        for (int r = 0; r < want; r++)
            rowp[r] = out + (size_t)(first + r) * stride;
        if (jpeg_read_scanlines(ci, rowp, (JDIMENSION)want) == 0) {
            ld_errorf(j->errbuf, "corrupt JPEG: no data for row %u", (unsigned)ci->output_scanline);
            j->result = LD_ESAMPLE;
            return -1;
        }
    }
    if (cmyk)
        cmyk_to_rgb(out, b->data, pixels, j->adobe);
    b->width = (int)cw;
    b->height = rows;
    b->org_x = (int)xoff;
    b->org_y = j->y0;
    return 0;
}

/* Decodes the region of opts (full-size coordinates) at num/denom. Returns 1 when the
 * whole image should be decoded instead (see above), else 0 or a negative LD_*. */
static int decode_jpeg_region(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                              int w, int h, int num, int denom, bool adobe, struct image_buf *b,
                              char *errbuf)
{
    int sw = scaled(w, num, denom), sh = scaled(h, num, denom);
    int64_t rx0 = opts->region_x, ry0 = opts->region_y;
    int64_t rx1 = rx0 + opts->region_w, ry1 = ry0 + opts->region_h;
    /* Decoded pixel i covers full-size [i * denom / num, (i + 1) * denom / num): the
     * decoded pixels that touch the region, one more on each side. */
    int64_t x0 = rx0 * num / denom - 1, y0 = ry0 * num / denom - 1;
    int64_t x1 = (rx1 * num + denom - 1) / denom + 1, y1 = (ry1 * num + denom - 1) / denom + 1;
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > sw ? sw : x1;
    y1 = y1 > sh ? sh : y1;
    if (x0 >= x1 || y0 >= y1 || (x0 == 0 && y0 == 0 && x1 == sw && y1 == sh))
        return 1;
    struct jpeg_region_dec *jd;
    int r = jpeg_region_dec_get(b, &jd, errbuf);
    if (r < 0)
        return r;
    struct region_job j = {.jd = jd, .data = data, .len = len, .w = w, .h = h, .num = num,
                           .denom = denom, .fast = opts->fast, .adobe = adobe, .x0 = (int)x0,
                           .y0 = (int)y0, .x1 = (int)x1, .y1 = (int)y1, .b = b, .errbuf = errbuf};
    if (region_run(&j) < 0) {
        r = j.result;
        if (r == 0) {
            ld_errorf(errbuf, "corrupt JPEG: %s", jd->msg);
            r = LD_ESAMPLE;
        }
    } else if (jd->eof) {
        /* Cannot happen with an EOI at the end of the data, which the caller checked. */
        ld_errorf(errbuf, "truncated JPEG: %s", jd->msg);
        r = LD_ESAMPLE;
    }
    /* Stops after the region's last row: the object is reusable. */
    jpeg_abort_decompress(&jd->cinfo);
    /* jpeg_abort frees the color converter and quantizer but leaves their pointers,
     * and libjpeg-turbo before 3.1.2 reads and writes through the stale converter in
     * jpeg_skip_scanlines when the next image uses merged upsampling (`fast` with
     * 4:2:0 or 4:2:2 after any other decode): a use after free that corrupted the
     * live decoder's tables and painted crops in wrong colors. Those modules are
     * created anew by every jpeg_start_decompress that needs them. */
    jd->cinfo.cconvert = NULL;
    jd->cinfo.cquantize = NULL;
    /* After an error (or a warning) the object starts over, as the TurboJPEG handle
     * does (jpeg_handle_drop). */
    if (r < 0 || jd->warned)
        jpeg_region_dec_reset(jd);
    return r;
}

static int decode_jpeg(const uint8_t *data, size_t len, const struct image_decode_opts *opts,
                       struct image_buf *b, char *errbuf)
{
    int w, h, cs;
    struct jpeg_markers mk;
    int r = jpeg_header(data, len, b, &w, &h, &cs, &mk, errbuf);
    if (r < 0)
        return r;
    uint64_t max_px = image_max_pixels(opts);
    if (mk.progressive && (uint64_t)w * (uint64_t)h > max_px) {
        ld_errorf(errbuf, "image too large: %dx%d pixels, over the limit of %" PRIu64
                  ", and progressive (no reduced-scale decode in bounded memory)", w, h, max_px);
        return LD_ESAMPLE;
    }
    int num, denom;
    r = image_jpeg_scale(w, h, opts, &num, &denom, errbuf);
    if (r < 0)
        return r;
    if (opts && opts->region_w > 0 && opts->region_h > 0 && !mk.progressive && !opts->strict &&
        jpeg_has_eoi(data, len)) {
        r = decode_jpeg_region(data, len, opts, w, h, num, denom, mk.adobe, b, errbuf);
        if (r <= 0) {
            if (r == 0) {
                b->src_width = w;
                b->src_height = h;
                b->scale_num = num;
                b->scale_denom = denom;
                b->format = IMAGE_FORMAT_JPEG;
            }
            return r;
        }
    }
    int sw = scaled(w, num, denom), sh = scaled(h, num, denom);
    size_t pixels = (size_t)sw * (size_t)sh;
    r = image_mem_reserve(&b->data, &b->cap, pixels * 3);
    if (r < 0) {
        ld_errorf(errbuf, "out of memory for a %dx%d image", sw, sh);
        return r;
    }
    bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    uint8_t *out = b->data;
    if (cmyk) {
        r = image_buf_reserve(b, IMAGE_AUX_DECODE, pixels * 4, &out);
        if (r < 0) {
            ld_errorf(errbuf, "out of memory for a %dx%d CMYK image", sw, sh);
            return r;
        }
    }
    int pf = cmyk ? TJPF_CMYK : TJPF_RGB;
    int rc = tjDecompress2(b->tj, data, (unsigned long)len, out, sw, sw * tjPixelSize[pf], sh, pf,
                           TJFLAG_LIMITSCANS | (opts && opts->fast ? TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE : 0));
    if (rc < 0) {
        char msg[JMSG_LENGTH_MAX];
        snprintf(msg, sizeof msg, "%s", tjGetErrorStr2(b->tj));
        bool fatal = tjGetErrorCode(b->tj) == TJERR_FATAL;
        /* Even after a mere warning: see jpeg_handle_drop. */
        jpeg_handle_drop(b);
        /* The data ran out: libjpeg paints the missing rows gray. An error, whatever
         * `strict` says (PIL refuses a truncated file too). */
        if (strstr(msg, "Premature end of JPEG file") || !jpeg_has_eoi(data, len)) {
            ld_errorf(errbuf, "truncated JPEG: %s", msg);
            return LD_ESAMPLE;
        }
        if (fatal || (opts && opts->strict)) {
            ld_errorf(errbuf, "corrupt JPEG: %s", msg);
            return LD_ESAMPLE;
        }
        /* A recoverable warning ("Corrupt JPEG data: N extraneous bytes before
         * marker", "... premature end of data segment"): keep the image, as PIL does. */
    }
    if (cmyk)
        cmyk_to_rgb(out, b->data, pixels, mk.adobe);
    b->width = sw;
    b->height = sh;
    b->org_x = b->org_y = 0;
    b->src_width = w;
    b->src_height = h;
    b->scale_num = num;
    b->scale_denom = denom;
    b->format = IMAGE_FORMAT_JPEG;
    return 0;
}

static bool jpeg_sniff(const uint8_t *data, size_t len)
{
    return len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff;
}

static int jpeg_probe(const uint8_t *data, size_t len, struct image_buf *b, struct image_info *ret_info,
                      char *errbuf)
{
    int w, h, cs;
    struct jpeg_markers mk;
    int r = jpeg_header(data, len, b, &w, &h, &cs, &mk, errbuf);
    if (r < 0)
        return r;
    ret_info->format = IMAGE_FORMAT_JPEG;
    ret_info->width = w;
    ret_info->height = h;
    ret_info->progressive = mk.progressive;
    return 0;
}

static void jpeg_buf_close(struct image_buf *b)
{
    if (b->tj)
        tjDestroy(b->tj);
    b->tj = NULL;
    jpeg_region_dec_free(b->jd);
    b->jd = NULL;
}

const struct image_backend image_jpeg_backend = {
    .format = IMAGE_FORMAT_JPEG,
    .name = "JPEG",
    .sniff = jpeg_sniff,
    .probe = jpeg_probe,
    .decode = decode_jpeg,
    .buf_close = jpeg_buf_close,
};
