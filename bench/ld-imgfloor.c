/* ld-imgfloor — the image benchmark's floor: the fastest known way to do, on one core,
 * the work loaderd's image pipeline does per sample, with no daemon around it.
 *
 *   ld-imgfloor DIR [--pattern GLOB] [--size N] [--limit N] [--repeat R] [--seed S]
 *               [--epoch E] [--dct-scaling] [--mode MODE] [--json]
 *
 * Finds the files under DIR whose name matches GLOB (default "*.jpg"), in sorted path
 * order; --limit N keeps N of them spread evenly over that order (the generator draws
 * sizes per index, so a stride keeps the size mix). Every file is read into memory
 * first (that pass is timed on its own), then, on this one thread, each file goes
 * through each mode in turn, one mode per pass:
 *
 *   decode         image_decode of the whole image at full size: what PIL (and so
 *                  torchvision's ImageFolder) decodes for every sample
 *   decode_resize  that full decode, then the whole image resized to N x N with the
 *                  daemon's resampler (the floor before region decoding; context only)
 *   crop           THE FLOOR: the daemon's own per-sample path, transform_apply of the
 *                  bench's pipeline (decode, random_resized_crop N, random_flip 0.5,
 *                  to_dtype uint8 CHW) with the sample's index, seed and epoch: the
 *                  crop is drawn on the header's size, only the rows and iMCU columns
 *                  around it are decoded, at the scale the pipeline's planner chooses
 *                  (full size by default, as in the bench's config; with
 *                  --dct-scaling, decode.dct_scaling: true), then resized, flipped and
 *                  written CHW. The scale is chosen by the same planning code as in
 *                  loaderd, so the floor follows any change of that choice.
 *
 * The crop mode produces the same output as loaderd (the same pixels for the same
 * draws) and as torchvision's RandomResizedCrop + flip within the decoder's rounding;
 * it is not the same steps as PIL: PIL decodes every pixel of the image, loaderd (and
 * this floor) only the region that the crop reads, at a reduced scale when the crop is
 * large. "The same work" means the same output. loaderd's workers add to this floor
 * the file reads, the scheduling and the hand-off of the batch, so loaderd per worker
 * thread cannot be faster than the floor per core.
 *
 * --mode MODE runs that mode alone (a profiler then sees nothing else; the warm-up
 * pass stays).
 *
 * A pass is repeated R times (default 1) and the fastest kept, so that a moment of
 * interference from elsewhere on the machine does not count. Both wall-clock and this
 * thread's CPU time are reported; images/s is wall-clock. It links the daemon's core
 * library (the decoder, resampler and pipeline), as the unit tests do. */
#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "image.h"
#include "ld_error.h"
#include "proto.h"
#include "resample.h"
#include "transform.h"

#define IMGFLOOR_MAX_FILE (64u << 20)   /* larger files are skipped with an error */

struct file_list {
    char **paths;
    size_t n, cap;
};

struct sample {
    uint8_t *data;
    size_t len;
};

enum mode_kind { MODE_DECODE, MODE_DECODE_RESIZE, MODE_CROP };

struct mode {
    const char *name;
    enum mode_kind kind;
};

static const struct mode modes[] = {
    {"decode", MODE_DECODE},
    {"decode_resize", MODE_DECODE_RESIZE},
    {"crop", MODE_CROP},
};

/* What the crop mode runs, and the draws it uses. */
struct crop_ctx {
    const transform_pipeline *pipeline;
    uint64_t seed, epoch;
    size_t n_total;             /* files found: a chosen file's index is its place among them */
};
#define N_MODES (sizeof modes / sizeof modes[0])

struct result {
    double wall_s, cpu_s;           /* of the fastest pass */
    uint64_t src_pixels, decoded_pixels;
    uint64_t scale_count[4];        /* decoded at 1/1, 1/2, 1/4, 1/8 */
};

/* nftw has no user pointer: the walk fills these. */
static struct file_list walk_list;
static const char *walk_pattern;
static int walk_error;

static int usage(const char *msg)
{
    fprintf(stderr, "ld-imgfloor: %s\nusage: ld-imgfloor DIR [--pattern GLOB] [--size N] [--limit N] "
                    "[--repeat R] [--seed S] [--epoch E] [--dct-scaling] [--mode MODE] [--json]\n", msg);
    return 2;
}

static double now(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int walk_visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (type != FTW_F || !S_ISREG(st->st_mode))
        return 0;
    const char *name = path + ftw->base;
    if (name[0] == '.' || fnmatch(walk_pattern, name, 0) != 0)
        return 0;
    if (walk_list.n == walk_list.cap) {
        size_t cap = walk_list.cap ? walk_list.cap * 2 : 1024;
        char **p = realloc(walk_list.paths, cap * sizeof *p);
        if (!p) {
            walk_error = ENOMEM;
            return 1;
        }
        walk_list.paths = p;
        walk_list.cap = cap;
    }
    walk_list.paths[walk_list.n] = strdup(path);
    if (!walk_list.paths[walk_list.n]) {
        walk_error = ENOMEM;
        return 1;
    }
    walk_list.n++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_file(const char *path, struct sample *ret_sample)
{
    int r = 0;
    uint8_t *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ld_from_errno(errno);
    struct stat st;
    if (fstat(fileno(f), &st) < 0) {
        r = ld_from_errno(errno);
        goto out;
    }
    if (st.st_size <= 0 || (uint64_t)st.st_size > IMGFLOOR_MAX_FILE) {
        r = LD_EINVAL;
        goto out;
    }
    buf = malloc((size_t)st.st_size);
    if (!buf) {
        r = LD_ENOMEM;
        goto out;
    }
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        r = LD_EIO;
        goto out;
    }
    ret_sample->data = buf;
    ret_sample->len = (size_t)st.st_size;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return r;
}

static int scale_slot(int num, int denom)
{
    int d = num > 0 ? denom / num : 0;
    return d >= 8 ? 3 : d >= 4 ? 2 : d >= 2 ? 1 : 0;
}

/* The full-size decode resized whole to size x size, uint8 HWC into out. */
static int decode_resize(const struct sample *smp, int size, struct image_buf *buf, uint8_t *out, char *errbuf)
{
    struct image_decode_opts opts = {0};
    int r = image_decode(smp->data, smp->len, &opts, buf, errbuf);
    if (r < 0)
        return r;
    struct resample_job job = {
        .src = buf->data, .src_stride = (size_t)buf->width * 3, .src_w = buf->width, .src_h = buf->height,
        .box_x0 = 0, .box_y0 = 0, .box_w = buf->width, .box_h = buf->height,
        .clamp_x0 = 0, .clamp_y0 = 0, .clamp_x1 = buf->width, .clamp_y1 = buf->height,
        .out_w = size, .out_h = size, .rect_x0 = 0, .rect_y0 = 0, .rect_w = size, .rect_h = size,
    };
    return resample_run(&job, buf, out, (size_t)size * 3, NULL, NULL);
}

/* One pass of one mode over every sample. Returns 0 or the first error, with its
 * message in errbuf naming the file. */
static int run_pass(const struct mode *m, int size, const struct crop_ctx *cc, const struct sample *samples,
                    char *const *paths, size_t n, size_t n_chosen, struct image_buf *buf, uint8_t *out,
                    struct result *ret_result, char *errbuf)
{
    struct result res = {0};
    struct image_decode_opts opts = {0};
    char msg[LD_ERRMSG_MAX];
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = 0; i < n; i++) {
        msg[0] = '\0';
        int r;
        switch (m->kind) {
        case MODE_DECODE:
            r = image_decode(samples[i].data, samples[i].len, &opts, buf, msg);
            break;
        case MODE_DECODE_RESIZE:
            r = decode_resize(&samples[i], size, buf, out, msg);
            break;
        default:
            /* the sample's index in the dataset: its place among all the files found */
            r = transform_apply(cc->pipeline, samples[i].data, samples[i].len, cc->seed, cc->epoch,
                                (uint64_t)(i * cc->n_total / n_chosen), out, buf, msg);
            break;
        }
        if (r < 0) {
            ld_errorf(errbuf, "%s: %s: %s", paths[i], m->name, msg[0] ? msg : ld_strerror(r));
            return r;
        }
        res.src_pixels += (uint64_t)buf->src_width * (uint64_t)buf->src_height;
        res.decoded_pixels += (uint64_t)buf->width * (uint64_t)buf->height;
        res.scale_count[scale_slot(buf->scale_num, buf->scale_denom)]++;
    }
    res.cpu_s = now(CLOCK_THREAD_CPUTIME_ID) - c0;
    res.wall_s = now(CLOCK_MONOTONIC) - w0;
    *ret_result = res;
    return 0;
}

/* The bench's image pipeline: decode (its defaults, as in the bench's config, unless
 * --dct-scaling), random_resized_crop size x size (torchvision's defaults), random_flip
 * 0.5, to_dtype uint8 CHW. */
static int make_pipeline(int size, bool dct_scaling, transform_pipeline **ret_p, struct transform_output *ret_out,
                         char *errbuf)
{
    struct transform_spec specs[4];
    transform_spec_init(&specs[0], TRANSFORM_DECODE);
    if (dct_scaling)
        specs[0].decode.dct_scaling = true;
    transform_spec_init(&specs[1], TRANSFORM_RANDOM_RESIZED_CROP);
    specs[1].random_resized_crop.height = size;
    specs[1].random_resized_crop.width = size;
    transform_spec_init(&specs[2], TRANSFORM_RANDOM_FLIP);
    transform_spec_init(&specs[3], TRANSFORM_TO_DTYPE);
    specs[3].to_dtype.dtype = LD_DTYPE_UINT8;
    specs[3].to_dtype.layout = TRANSFORM_LAYOUT_CHW;
    return transform_pipeline_new(specs, 4, ret_p, ret_out, errbuf);
}

static void print_json(const char *dir, int size, size_t n_total, size_t n, uint64_t bytes, double read_s,
                       int repeat, const struct result *res, const bool *run)
{
    printf("{\"dir\": \"");
    for (const char *p = dir; *p; p++) {
        if (*p == '"' || *p == '\\')
            putchar('\\');
        if ((unsigned char)*p >= 0x20)
            putchar(*p);
    }
    printf("\", \"size\": %d, \"floor_mode\": \"crop\", \"files_found\": %zu, \"images\": %zu, \"bytes\": %llu, \"repeat\": %d, "
           "\"read_s\": %.6f, \"read_ms_per_image\": %.6f, \"modes\": {",
           size, n_total, n, (unsigned long long)bytes, repeat, read_s, read_s * 1e3 / (double)n);
    bool first = true;
    for (size_t k = 0; k < N_MODES; k++) {
        const struct result *r = &res[k];
        if (!run[k])
            continue;
        printf("%s\"%s\": {\"wall_s\": %.6f, \"cpu_s\": %.6f, \"ms_per_image\": %.6f, "
               "\"cpu_ms_per_image\": %.6f, \"images_per_s\": %.3f, \"mean_src_megapixels\": %.6f, "
               "\"mean_decoded_megapixels\": %.6f, \"scales\": {\"1/1\": %llu, \"1/2\": %llu, \"1/4\": %llu, "
               "\"1/8\": %llu}}",
               first ? "" : ", ", modes[k].name, r->wall_s, r->cpu_s, r->wall_s * 1e3 / (double)n,
               r->cpu_s * 1e3 / (double)n, (double)n / r->wall_s, (double)r->src_pixels / 1e6 / (double)n,
               (double)r->decoded_pixels / 1e6 / (double)n, (unsigned long long)r->scale_count[0],
               (unsigned long long)r->scale_count[1], (unsigned long long)r->scale_count[2],
               (unsigned long long)r->scale_count[3]);
        first = false;
    }
    printf("}}\n");
}

static void print_table(int size, size_t n, uint64_t bytes, double read_s, const struct result *res,
                        const bool *run)
{
    printf("ld-imgfloor: %zu images, %.1f KiB each on average; one thread; output %dx%d\n", n,
           (double)bytes / 1024.0 / (double)n, size, size);
    printf("  read (from memory after)  %8.3f ms/image\n", read_s * 1e3 / (double)n);
    printf("  %-22s %10s %10s %12s %14s\n", "mode", "ms/image", "cpu ms", "images/s", "decoded MP");
    for (size_t k = 0; k < N_MODES; k++) {
        const struct result *r = &res[k];
        if (!run[k])
            continue;
        printf("  %-22s %10.3f %10.3f %12.1f %14.3f\n", modes[k].name, r->wall_s * 1e3 / (double)n,
               r->cpu_s * 1e3 / (double)n, (double)n / r->wall_s, (double)r->decoded_pixels / 1e6 / (double)n);
    }
}

static int parse_pos(const char *s, long max, long *ret_v)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > max)
        return LD_EINVAL;
    *ret_v = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *pattern = "*.jpg";
    long size = 224, limit = 0, repeat = 1, seed = 0, epoch = 1;
    bool json = false, dct_scaling = false;
    const char *only = NULL;
    for (int a = 1; a < argc; a++) {
        long *target = NULL, max = 0;
        if (!strcmp(argv[a], "--pattern")) {
            if (a + 1 >= argc)
                return usage("--pattern needs a glob");
            pattern = argv[++a];
        } else if (!strcmp(argv[a], "--size")) {
            target = &size;
            max = TRANSFORM_MAX_SIDE;
        } else if (!strcmp(argv[a], "--limit")) {
            target = &limit;
            max = 100000000;
        } else if (!strcmp(argv[a], "--repeat")) {
            target = &repeat;
            max = 100;
        } else if (!strcmp(argv[a], "--seed") || !strcmp(argv[a], "--epoch")) {
            long *v = argv[a][2] == 's' ? &seed : &epoch;
            char *end;
            errno = 0;
            if (a + 1 >= argc || (*v = strtol(argv[++a], &end, 10), errno || *end || *v < 0))
                return usage("--seed and --epoch take whole numbers >= 0");
        } else if (!strcmp(argv[a], "--dct-scaling")) {
            dct_scaling = true;
        } else if (!strcmp(argv[a], "--mode")) {
            if (a + 1 >= argc)
                return usage("--mode needs decode, decode_resize or crop");
            only = argv[++a];
            bool known = false;
            for (size_t k = 0; k < N_MODES; k++)
                known = known || !strcmp(only, modes[k].name);
            if (!known)
                return usage("--mode needs decode, decode_resize or crop");
        } else if (!strcmp(argv[a], "--json")) {
            json = true;
        } else if (argv[a][0] == '-') {
            return usage("unknown option");
        } else if (dir) {
            return usage("one directory only");
        } else {
            dir = argv[a];
        }
        if (target && (a + 1 >= argc || parse_pos(argv[++a], max, target) < 0))
            return usage("--size, --limit and --repeat take whole numbers >= 1");
    }
    if (!dir)
        return usage("need DIR");

    int rc = 1;
    struct sample *samples = NULL;
    char **chosen = NULL;
    uint8_t *out = NULL;
    size_t n = 0;
    transform_pipeline *pipeline = NULL;
    struct transform_output tout;
    struct image_buf buf;
    image_buf_init(&buf);
    char errbuf[LD_ERRMSG_MAX] = "";

    walk_pattern = pattern;
    if (nftw(dir, walk_visit, 32, FTW_PHYS) != 0 || walk_error) {
        fprintf(stderr, "ld-imgfloor: cannot walk %s: %s\n", dir, strerror(walk_error ? walk_error : errno));
        goto out;
    }
    if (walk_list.n == 0) {
        fprintf(stderr, "ld-imgfloor: no file under %s matches %s\n", dir, pattern);
        goto out;
    }
    qsort(walk_list.paths, walk_list.n, sizeof *walk_list.paths, cmp_str);
    size_t want = limit > 0 && (size_t)limit < walk_list.n ? (size_t)limit : walk_list.n;
    samples = calloc(want, sizeof *samples);
    chosen = calloc(want, sizeof *chosen);
    if (make_pipeline((int)size, dct_scaling, &pipeline, &tout, errbuf) < 0)
        goto fail;
    out = malloc(tout.sample_bytes > (size_t)size * (size_t)size * 3 ? tout.sample_bytes
                                                                      : (size_t)size * (size_t)size * 3);
    if (!samples || !chosen || !out) {
        fprintf(stderr, "ld-imgfloor: out of memory\n");
        goto out;
    }
    uint64_t bytes = 0;
    double r0 = now(CLOCK_MONOTONIC);
    for (; n < want; n++) {
        chosen[n] = walk_list.paths[n * walk_list.n / want];
        int r = read_file(chosen[n], &samples[n]);
        if (r < 0) {
            fprintf(stderr, "ld-imgfloor: cannot read %s: %s\n", chosen[n],
                    r == LD_EINVAL ? "empty, or larger than 64 MiB" : ld_strerror(r));
            goto out;
        }
        bytes += samples[n].len;
    }
    double read_s = now(CLOCK_MONOTONIC) - r0;

    /* Warm-up: the decoder handle, the scratch buffers and the code paths, untimed. */
    struct crop_ctx cc = {.pipeline = pipeline, .seed = (uint64_t)seed, .epoch = (uint64_t)epoch,
                          .n_total = walk_list.n};
    struct result res[N_MODES], pass;
    bool run[N_MODES];
    for (size_t k = 0; k < N_MODES; k++)
        run[k] = !only || !strcmp(only, modes[k].name);
    for (size_t k = 0; k < N_MODES; k++)
        if (run[k] && run_pass(&modes[k], (int)size, &cc, samples, chosen, n < 16 ? n : 16, n, &buf, out, &pass, errbuf) < 0)
            goto fail;
    for (size_t k = 0; k < N_MODES; k++) {
        for (long t = 0; run[k] && t < repeat; t++) {
            if (run_pass(&modes[k], (int)size, &cc, samples, chosen, n, n, &buf, out, &pass, errbuf) < 0)
                goto fail;
            if (t == 0 || pass.wall_s < res[k].wall_s)
                res[k] = pass;
        }
    }
    if (json)
        print_json(dir, (int)size, walk_list.n, n, bytes, read_s, (int)repeat, res, run);
    else
        print_table((int)size, n, bytes, read_s, res, run);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "ld-imgfloor: %s\n", errbuf);
out:
    image_buf_close(&buf);
    transform_pipeline_free(pipeline);
    for (size_t i = 0; samples && i < n; i++)
        free(samples[i].data);
    free(samples);
    free(chosen);
    free(out);
    for (size_t i = 0; i < walk_list.n; i++)
        free(walk_list.paths[i]);
    free(walk_list.paths);
    return rc;
}
