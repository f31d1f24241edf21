/* ld-genimages — a deterministic ImageFolder of JPEGs for loaderd's tests, demo and
 * benchmarks.
 *
 *   ld-genimages DIR --count N [--classes K] [--min PX] [--max PX] [--quality Q]
 *
 * Image i goes to DIR/class_CCC/IIIIIII.jpg (CCC = i % K). Its width and height are
 * drawn in [min, max] from ld_splitmix64(i); its content looks like a photograph more than
 * noise does (which matters for decode speed): a smooth two-colour gradient, a few
 * filled ellipses and bars, and a little grain, all functions of i. Encoded with
 * libjpeg-turbo at quality Q (4:2:0). A run that finds DIR/.complete with the same
 * parameters does nothing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include "ld_mix.h"

static int clamp(int v)
{
    return v < 0 ? 0 : v > 255 ? 255 : v;
}

static void paint(uint64_t i, int w, int h, uint8_t *rgb)
{
    uint64_t r = ld_splitmix64(i * 7919 + 1);
    int c0[3], c1[3];
    for (int k = 0; k < 3; k++) {
        c0[k] = (int)((r >> (8 * k)) & 0xff);
        c1[k] = (int)((r >> (8 * k + 24)) & 0xff);
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int t = (x + y) * 256 / (w + h);
            for (int k = 0; k < 3; k++)
                rgb[((size_t)y * w + x) * 3 + k] = (uint8_t)((c0[k] * (256 - t) + c1[k] * t) >> 8);
        }
    int shapes = 3 + (int)(ld_splitmix64(i * 31 + 2) % 6);
    for (int s = 0; s < shapes; s++) {
        uint64_t q = ld_splitmix64(i * 1000 + (uint64_t)s + 3);
        int cx = (int)(q % (uint64_t)w), cy = (int)((q >> 16) % (uint64_t)h);
        int rx = 8 + (int)((q >> 32) % (uint64_t)(w / 3 + 1)), ry = 8 + (int)((q >> 40) % (uint64_t)(h / 3 + 1));
        int col[3] = {(int)((q >> 48) & 0xff), (int)((q >> 56) & 0xff), (int)((q >> 4) & 0xff)};
        bool bar = (q >> 12) & 1;
        for (int y = cy - ry; y < cy + ry; y++) {
            if (y < 0 || y >= h)
                continue;
            for (int x = cx - rx; x < cx + rx; x++) {
                if (x < 0 || x >= w)
                    continue;
                double dx = (double)(x - cx) / rx, dy = (double)(y - cy) / ry;
                if (!bar && dx * dx + dy * dy > 1)
                    continue;
                for (int k = 0; k < 3; k++)
                    rgb[((size_t)y * w + x) * 3 + k] = (uint8_t)col[k];
            }
        }
    }
    uint64_t g = ld_splitmix64(i * 17 + 5);
    for (size_t p = 0; p < (size_t)w * h * 3; p++) {
        g = g * 6364136223846793005ull + 1442695040888963407ull;
        rgb[p] = (uint8_t)clamp(rgb[p] + (int)((g >> 60) & 7) - 4);
    }
}

static int usage(const char *msg)
{
    fprintf(stderr, "ld-genimages: %s\nusage: ld-genimages DIR --count N [--classes K] [--min PX] [--max PX] "
                    "[--quality Q]\n", msg);
    return 2;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long count = 0, classes = 10, minpx = 256, maxpx = 500, quality = 90;
    for (int a = 1; a < argc; a++) {
        long *target = NULL;
        if (!strcmp(argv[a], "--count")) target = &count;
        else if (!strcmp(argv[a], "--classes")) target = &classes;
        else if (!strcmp(argv[a], "--min")) target = &minpx;
        else if (!strcmp(argv[a], "--max")) target = &maxpx;
        else if (!strcmp(argv[a], "--quality")) target = &quality;
        else if (argv[a][0] == '-') return usage("unknown option");
        else if (dir) return usage("one directory only");
        else dir = argv[a];
        if (target) {
            char *end;
            if (a + 1 >= argc || (*target = strtol(argv[++a], &end, 10), *end) || *target < 1)
                return usage("options take whole numbers >= 1");
        }
    }
    if (!dir || count < 1 || minpx > maxpx || maxpx > 8192 || quality > 100)
        return usage("need DIR and --count; min <= max <= 8192; quality <= 100");
    char path[4096], params[256];
    snprintf(params, sizeof params, "genimages 1 count %ld classes %ld min %ld max %ld quality %ld\n", count, classes,
             minpx, maxpx, quality);
    snprintf(path, sizeof path, "%s/.complete", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        char got[256] = "";
        size_t n = fread(got, 1, sizeof got - 1, f);
        fclose(f);
        got[n] = '\0';
        if (!strcmp(got, params)) {
            printf("ld-genimages: %s is already complete\n", dir);
            return 0;
        }
        remove(path);
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "ld-genimages: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    tjhandle tj = tjInitCompress();
    uint8_t *rgb = malloc((size_t)maxpx * maxpx * 3);
    if (!tj || !rgb)
        return 1;
    uint64_t bytes = 0;
    for (long i = 0; i < count; i++) {
        uint64_t r = ld_splitmix64((uint64_t)i);
        int w = (int)(minpx + (long)(r % (uint64_t)(maxpx - minpx + 1)));
        int h = (int)(minpx + (long)((r >> 32) % (uint64_t)(maxpx - minpx + 1)));
        paint((uint64_t)i, w, h, rgb);
        unsigned char *jpeg = NULL;
        unsigned long len = 0;
        if (tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, &jpeg, &len, TJSAMP_420, (int)quality, TJFLAG_ACCURATEDCT) < 0) {
            fprintf(stderr, "ld-genimages: encode: %s\n", tjGetErrorStr2(tj));
            return 1;
        }
        snprintf(path, sizeof path, "%s/class_%03ld", dir, i % classes);
        mkdir(path, 0755);
        snprintf(path, sizeof path, "%s/class_%03ld/%07ld.jpg", dir, i % classes, i);
        f = fopen(path, "wb");
        if (!f || fwrite(jpeg, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "ld-genimages: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        bytes += len;
        tjFree(jpeg);
    }
    snprintf(path, sizeof path, "%s/.complete", dir);
    f = fopen(path, "w");
    if (!f || fputs(params, f) < 0 || fclose(f) != 0)
        return 1;
    printf("ld-genimages: wrote %ld JPEGs (%.1f MiB) in %ld classes under %s\n", count, (double)bytes / (1 << 20),
           classes, dir);
    free(rgb);
    tjDestroy(tj);
    return 0;
}
