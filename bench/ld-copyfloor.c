/* ld-copyfloor — the floor of `make bench`'s pre-decoded workloads: the least work per
 * sample that any loader must do on one core to put the sample in a batch, with no
 * loader around it.
 *
 *   ld-copyfloor files DIR [--pattern GLOB] [--batch B] [--seed S] [--repeat R] [--json]
 *   ld-copyfloor windows FILE --context C [--dtype-bytes N] [--batch B] [--seed S]
 *                [--repeat R] [--json]
 *
 * files: the files under DIR whose name matches GLOB (default "*.bin"), in a shuffled
 * order; each is opened, read into its row of a batch buffer with one pread of its
 * size, and closed (the sizes are known beforehand, as a loader knows them from its
 * scan). windows: FILE mapped; window i is the C + 1 tokens from token i * C (N bytes a
 * token, default 2), copied in a shuffled order into its row of a batch buffer.
 *
 * A pass covers every sample once; it is repeated R times (default 3) and the fastest
 * kept. Reported: this thread's CPU time and wall time per sample. The page cache is
 * expected warm (`make bench` reads everything first): this measures system calls and
 * copies, not the disk. */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct entry {
    char *path;
    size_t size;
};

static struct {
    struct entry *v;
    size_t n, cap;
    const char *pattern;
    size_t max_size;
} found;

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: a seeded shuffle, the same order for the same seed. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void shuffle(uint64_t *idx, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(next_rand(&seed) % i);
        uint64_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (type != FTW_F || !S_ISREG(st->st_mode) || fnmatch(found.pattern, path + ftw->base, 0) != 0)
        return 0;
    if (found.n == found.cap) {
        size_t cap = found.cap ? found.cap * 2 : 1024;
        struct entry *v = realloc(found.v, cap * sizeof *v);
        if (!v)
            return -1;
        found.v = v;
        found.cap = cap;
    }
    found.v[found.n].path = strdup(path);
    if (!found.v[found.n].path)
        return -1;
    found.v[found.n++].size = (size_t)st->st_size;
    if ((size_t)st->st_size > found.max_size)
        found.max_size = (size_t)st->st_size;
    return 0;
}

/* One pass over every file; returns 0 or -1 with the reason printed. */
static int pass_files(const uint64_t *order, uint8_t *batch, unsigned bsize)
{
    for (size_t k = 0; k < found.n; k++) {
        const struct entry *e = &found.v[order[k]];
        int fd = open(e->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "ld-copyfloor: %s: %s\n", e->path, strerror(errno));
            return -1;
        }
        ssize_t got = pread(fd, batch + (k % bsize) * found.max_size, e->size, 0);
        close(fd);
        if (got != (ssize_t)e->size) {
            fprintf(stderr, "ld-copyfloor: %s: read %zd of %zu bytes\n", e->path, got, e->size);
            return -1;
        }
    }
    return 0;
}

static void pass_windows(const uint64_t *order, size_t n, const uint8_t *map, size_t stride, size_t len,
                         uint8_t *batch, unsigned bsize)
{
    for (size_t k = 0; k < n; k++)
        memcpy(batch + (k % bsize) * len, map + order[k] * stride, len);
}

static int usage(void)
{
    fprintf(stderr, "usage: ld-copyfloor files DIR [--pattern GLOB] [--batch B] [--seed S] [--repeat R] [--json]\n"
                    "       ld-copyfloor windows FILE --context C [--dtype-bytes N] [--batch B] [--seed S]"
                    " [--repeat R] [--json]\n");
    return 2;
}

static bool parse_u64(const char *s, uint64_t *ret)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return false;
    *ret = v;
    return true;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return usage();
    const char *mode = argv[1], *target = argv[2];
    bool files = strcmp(mode, "files") == 0, json = false;
    if (!files && strcmp(mode, "windows") != 0)
        return usage();
    uint64_t batch = files ? 64 : 32, seed = 0, repeat = 3, context = 0, dtype_bytes = 2;
    found.pattern = "*.bin";
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *num = strcmp(a, "--batch") == 0 ? &batch : strcmp(a, "--seed") == 0 ? &seed
                        : strcmp(a, "--repeat") == 0 ? &repeat : strcmp(a, "--context") == 0 ? &context
                        : strcmp(a, "--dtype-bytes") == 0 ? &dtype_bytes : NULL;
        if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--pattern") == 0 && i + 1 < argc) {
            found.pattern = argv[++i];
        } else if (num && i + 1 < argc) {
            if (!parse_u64(argv[++i], num)) {
                fprintf(stderr, "ld-copyfloor: %s: not a number: %s\n", a, argv[i]);
                return 2;
            }
        } else {
            return usage();
        }
    }
    if (batch == 0 || batch > 65536 || repeat == 0 || repeat > 100 || dtype_bytes == 0 || dtype_bytes > 16) {
        fprintf(stderr, "ld-copyfloor: --batch 1..65536, --repeat 1..100, --dtype-bytes 1..16\n");
        return 2;
    }

    size_t n = 0, sample_bytes = 0, len = 0, stride = 0;
    uint8_t *map = NULL;
    size_t map_size = 0;
    if (files) {
        if (nftw(target, visit, 64, FTW_PHYS) != 0 || found.n == 0) {
            fprintf(stderr, "ld-copyfloor: %s: no file matches %s (or it cannot be walked)\n", target, found.pattern);
            return 1;
        }
        n = found.n;
    } else {
        if (context == 0) {
            fprintf(stderr, "ld-copyfloor: windows needs --context C (C >= 1)\n");
            return 2;
        }
        int fd = open(target, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            fprintf(stderr, "ld-copyfloor: %s: %s\n", target, strerror(errno));
            return 1;
        }
        map_size = (size_t)st.st_size;
        uint64_t tokens = map_size / dtype_bytes;
        if (tokens < context + 1) {
            fprintf(stderr, "ld-copyfloor: %s holds %llu tokens, fewer than one window\n", target,
                    (unsigned long long)tokens);
            return 1;
        }
        map = mmap(NULL, map_size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED) {
            fprintf(stderr, "ld-copyfloor: %s: mmap: %s\n", target, strerror(errno));
            return 1;
        }
        n = (size_t)((tokens - (context + 1)) / context + 1);
        stride = (size_t)(context * dtype_bytes);
        len = (size_t)((context + 1) * dtype_bytes);
    }
    uint64_t *order = malloc(n * sizeof *order);
    uint8_t *buf = calloc(batch, files ? found.max_size : len);
    if (!order || !buf) {
        fprintf(stderr, "ld-copyfloor: out of memory\n");
        return 1;
    }
    shuffle(order, n, seed);

    uint64_t best_cpu = UINT64_MAX, best_wall = UINT64_MAX, bytes = 0;
    for (uint64_t r = 0; r <= repeat; r++) { /* pass 0 warms up, untimed */
        uint64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (files) {
            if (pass_files(order, buf, (unsigned)batch) < 0)
                return 1;
        } else {
            pass_windows(order, n, map, stride, len, buf, (unsigned)batch);
        }
        uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0, wall = clock_ns(CLOCK_MONOTONIC) - w0;
        if (r && cpu < best_cpu)
            best_cpu = cpu;
        if (r && wall < best_wall)
            best_wall = wall;
    }
    if (files)
        for (size_t i = 0; i < n; i++)
            bytes += found.v[i].size;
    else
        bytes = (uint64_t)n * len;
    sample_bytes = (size_t)(bytes / n);
    double cpu_us = best_cpu / 1e3 / (double)n, wall_us = best_wall / 1e3 / (double)n;
    if (json)
        printf("{\"mode\": \"%s\", \"samples\": %zu, \"mean_sample_bytes\": %zu, \"repeat\": %llu, "
               "\"cpu_us_per_sample\": %.4f, \"wall_us_per_sample\": %.4f, \"samples_per_cpu_s\": %.0f, "
               "\"mb_per_cpu_s\": %.1f}\n", mode, n, sample_bytes, (unsigned long long)repeat, cpu_us, wall_us,
               1e6 / cpu_us, (double)bytes / (best_cpu / 1e9) / 1e6);
    else
        printf("%s: %zu samples of %zu B: %.3f us CPU a sample (%.0f a CPU-second), %.3f us wall\n", mode, n,
               sample_bytes, cpu_us, 1e6 / cpu_us, wall_us);
    for (size_t i = 0; i < found.n; i++)
        free(found.v[i].path);
    free(found.v);
    free(order);
    free(buf);
    if (map)
        munmap(map, map_size);
    return 0;
}
