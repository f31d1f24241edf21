/* ld-imgfloor — the image benchmark's floor: what one core does per image with
 * libjpeg-turbo and loaderd's resampler alone, no daemon around it.
 *
 *   ld-imgfloor DIR [--pattern GLOB] [--size N] [--limit N] [--repeat R] [--json]
 *
 * Finds the files under DIR whose name matches GLOB (default "*.jpg"), in sorted path
 * order; --limit N keeps N of them spread evenly over that order (the generator draws
 * sizes per index, so a stride keeps the size mix). Every file is read into memory
 * first (that pass is timed on its own), then, on this one thread, each file goes
 * through each mode in turn, one mode per pass:
 *
 *   decode                image_decode at full size
 *   decode_resize         transform_decode_resize: full-size decode, then the whole
 *                         image resized to N x N (the floor of random_resized_crop,
 *                         which decodes at full size unless the crop is at least twice
 *                         the output on both sides)
 *   decode_scaled         image_decode with min N x N: the largest DCT reduction that
 *                         still gives N x N pixels
 *   decode_resize_scaled  the same decode, then resized to N x N (the floor of a
 *                         pipeline that resizes the whole image)
 *
 * A pass is repeated R times (default 1) and the fastest kept, so that a moment of
 * interference from elsewhere on the machine does not count. Both wall-clock and this
 * thread's CPU time are reported; images/s is wall-clock. Why a separate tool: the
 * benchmark compares loaderd's samples/s per worker thread with what the decoder
 * itself allows per core, so the floor must use the same decoder and resampler
 * (linked from the daemon's core library) on the same files. */
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

enum mode_kind { MODE_DECODE, MODE_DECODE_RESIZE };

struct mode {
    const char *name;
    enum mode_kind kind;
    bool scaled;
};

static const struct mode modes[] = {
    {"decode", MODE_DECODE, false},
    {"decode_resize", MODE_DECODE_RESIZE, false},
    {"decode_scaled", MODE_DECODE, true},
    {"decode_resize_scaled", MODE_DECODE_RESIZE, true},
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
                    "[--repeat R] [--json]\n", msg);
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

/* One pass of one mode over every sample. Returns 0 or the first error, with its
 * message in errbuf naming the file. */
static int run_pass(const struct mode *m, int size, const struct sample *samples, char *const *paths,
                    size_t n, struct image_buf *buf, uint8_t *out, struct result *ret_result, char *errbuf)
{
    struct result res = {0};
    struct image_decode_opts opts = {0};
    if (m->scaled) {
        opts.min_width = size;
        opts.min_height = size;
    }
    char msg[LD_ERRMSG_MAX];
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = 0; i < n; i++) {
        msg[0] = '\0';
        int r = m->kind == MODE_DECODE
                    ? image_decode(samples[i].data, samples[i].len, &opts, buf, msg)
                    : transform_decode_resize(samples[i].data, samples[i].len, &opts, size, size, out, buf, msg);
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

static void print_json(const char *dir, int size, size_t n_total, size_t n, uint64_t bytes, double read_s,
                       int repeat, const struct result *res)
{
    printf("{\"dir\": \"");
    for (const char *p = dir; *p; p++) {
        if (*p == '"' || *p == '\\')
            putchar('\\');
        if ((unsigned char)*p >= 0x20)
            putchar(*p);
    }
    printf("\", \"size\": %d, \"files_found\": %zu, \"images\": %zu, \"bytes\": %llu, \"repeat\": %d, "
           "\"read_s\": %.6f, \"read_ms_per_image\": %.6f, \"modes\": {",
           size, n_total, n, (unsigned long long)bytes, repeat, read_s, read_s * 1e3 / (double)n);
    for (size_t k = 0; k < N_MODES; k++) {
        const struct result *r = &res[k];
        printf("%s\"%s\": {\"wall_s\": %.6f, \"cpu_s\": %.6f, \"ms_per_image\": %.6f, "
               "\"cpu_ms_per_image\": %.6f, \"images_per_s\": %.3f, \"mean_src_megapixels\": %.6f, "
               "\"mean_decoded_megapixels\": %.6f, \"scales\": {\"1/1\": %llu, \"1/2\": %llu, \"1/4\": %llu, "
               "\"1/8\": %llu}}",
               k ? ", " : "", modes[k].name, r->wall_s, r->cpu_s, r->wall_s * 1e3 / (double)n,
               r->cpu_s * 1e3 / (double)n, (double)n / r->wall_s, (double)r->src_pixels / 1e6 / (double)n,
               (double)r->decoded_pixels / 1e6 / (double)n, (unsigned long long)r->scale_count[0],
               (unsigned long long)r->scale_count[1], (unsigned long long)r->scale_count[2],
               (unsigned long long)r->scale_count[3]);
    }
    printf("}}\n");
}

static void print_table(int size, size_t n, uint64_t bytes, double read_s, const struct result *res)
{
    printf("ld-imgfloor: %zu images, %.1f KiB each on average; one thread; output %dx%d\n", n,
           (double)bytes / 1024.0 / (double)n, size, size);
    printf("  read (from memory after)  %8.3f ms/image\n", read_s * 1e3 / (double)n);
    printf("  %-22s %10s %10s %12s %14s\n", "mode", "ms/image", "cpu ms", "images/s", "decoded MP");
    for (size_t k = 0; k < N_MODES; k++) {
        const struct result *r = &res[k];
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
    long size = 224, limit = 0, repeat = 1;
    bool json = false;
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
    out = malloc((size_t)size * (size_t)size * 3);
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
    struct result res[N_MODES], pass;
    for (size_t k = 0; k < N_MODES; k++)
        if (run_pass(&modes[k], (int)size, samples, chosen, n < 16 ? n : 16, &buf, out, &pass, errbuf) < 0)
            goto fail;
    for (size_t k = 0; k < N_MODES; k++) {
        for (long t = 0; t < repeat; t++) {
            if (run_pass(&modes[k], (int)size, samples, chosen, n, &buf, out, &pass, errbuf) < 0)
                goto fail;
            if (t == 0 || pass.wall_s < res[k].wall_s)
                res[k] = pass;
        }
    }
    if (json)
        print_json(dir, (int)size, walk_list.n, n, bytes, read_s, (int)repeat, res);
    else
        print_table((int)size, n, bytes, read_s, res);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "ld-imgfloor: %s\n", errbuf);
out:
    image_buf_close(&buf);
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
