/* ld-gendata — deterministic datasets for loaderd's tests, demo and benchmarks.
 *
 *   ld-gendata files DIR --count N --size BYTES [--classes K] [--vary]
 *   ld-gendata tokens FILE --count NTOKENS [--dtype uint16|uint32] [--vocab V]
 *
 * Every byte is a pure function of its position, so a test or a benchmark can recompute
 * what any sample must contain without reading a reference copy. The rules (never
 * change them without changing GENDATA_VERSION, since .complete markers record it):
 *
 *   ld_splitmix64(x) (proto/ld_mix.h):
 *                   z = x + 0x9E3779B97F4A7C15
 *                   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
 *                   z = (z ^ (z >> 27)) * 0x94D049BB133111EB
 *                   return z ^ (z >> 31)                       (all mod 2^64)
 *
 *   files:   file i (0 <= i < N) is DIR/class_CCC/IIIIIII.bin with CCC = i % K, or
 *            DIR/IIIIIII.bin when K = 0 (numbers zero-padded to 3 and 7 digits, more
 *            when K or N need them, so that bytewise order is numeric order);
 *            its size is BYTES, or with --vary
 *                BYTES/2 + ld_splitmix64(i ^ 0x5A5A5A5A5A5A5A5A) % (BYTES + 1)
 *            (so in [BYTES/2, BYTES*3/2], integer division);
 *            byte j of it is (ld_splitmix64(i * 1000003 + j / 8) >> (8 * (j % 8))) & 0xFF,
 *            i.e. the little-endian bytes of the words ld_splitmix64(i * 1000003 + w).
 *   tokens:  token k (0 <= k < NTOKENS) is ld_splitmix64(k) % V, stored as uint16 or
 *            uint32 in the machine's byte order (little-endian on x86-64 and arm64).
 *
 * A run that finds its output complete with the same parameters does nothing (`make
 * bench` runs it every time): a files directory holds DIR/.complete, a token file the
 * sidecar FILE.params, each written last and holding the parameters. A files run
 * writes DIR/.partial first and renames it to .complete at the end, so an interrupted
 * or differently-sized earlier run is recognised and its files removed before the new
 * ones are written; a non-empty DIR that ld-gendata did not make is refused.
 *
 * Standalone on purpose: only libc, so it builds and runs where the daemon does not. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ld_mix.h"

#define GENDATA_VERSION 1
#define MAX_FILE_SIZE (1ull << 30)          /* --size (times 3/2 with --vary) */
#define MAX_CLASSES 1000000ull
#define TOKEN_CHUNK 65536                   /* tokens per write() */

static const char usage_text[] =
    "usage: ld-gendata files DIR --count N --size BYTES [--classes K] [--vary]\n"
    "       ld-gendata tokens FILE --count NTOKENS [--dtype uint16|uint32] [--vocab V]\n"
    "  files:  N files of BYTES bytes (--vary: BYTES/2..BYTES*3/2) spread over K class\n"
    "          folders DIR/class_000.. (default K=10; 0 puts them directly in DIR)\n"
    "  tokens: NTOKENS tokens below V (default 50257), uint16 (default) or uint32\n"
    "  Content is deterministic (see tools/gendata.c); a run whose output is already\n"
    "  complete with the same parameters does nothing.\n";

static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ld-gendata: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n%s", usage_text);
    va_end(ap);
    return 2;
}

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "ld-gendata: %s '%s': %s\n", what, path, strerror(errno));
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A whole decimal number in [min, max]; false otherwise. */
static bool parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *ret = v;
    return true;
}

static unsigned digits(uint64_t v)
{
    unsigned n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Writes `text` to `path` through a temporary name and a rename, so a reader sees the
 * old content or the new, never half. */
static int write_text_file(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (write_all(fd, text, strlen(text)) < 0 || close(fd) < 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return rename(tmp, path);
}

/* The first line of a small file into buf; false if it cannot be read. */
static bool read_text_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok;
}

/* ---- files ------------------------------------------------------------------------ */

struct files_params {
    uint64_t count, size, classes;
    int vary;
};

static void files_describe(const struct files_params *p, char *buf, size_t size)
{
    snprintf(buf, size, "ld-gendata files v%d count=%" PRIu64 " size=%" PRIu64
             " classes=%" PRIu64 " vary=%d\n", GENDATA_VERSION, p->count, p->size,
             p->classes, p->vary);
}

static bool files_parse_marker(const char *text, struct files_params *p)
{
    int version;
    return sscanf(text, "ld-gendata files v%d count=%" SCNu64 " size=%" SCNu64
                  " classes=%" SCNu64 " vary=%d", &version, &p->count, &p->size,
                  &p->classes, &p->vary) == 5 && p->classes <= MAX_CLASSES;
}

static uint64_t file_size(const struct files_params *p, uint64_t i)
{
    if (!p->vary)
        return p->size;
    return p->size / 2 + ld_splitmix64(i ^ 0x5A5A5A5A5A5A5A5Aull) % (p->size + 1);
}

static void file_path(const char *dir, const struct files_params *p, uint64_t i, char *buf,
                      size_t size)
{
    int fw = (int)(digits(p->count ? p->count - 1 : 0) > 7 ? digits(p->count - 1) : 7);
    if (p->classes == 0) {
        snprintf(buf, size, "%s/%0*" PRIu64 ".bin", dir, fw, i);
    } else {
        int cw = (int)(digits(p->classes - 1) > 3 ? digits(p->classes - 1) : 3);
        snprintf(buf, size, "%s/class_%0*" PRIu64 "/%0*" PRIu64 ".bin", dir, cw,
                 i % p->classes, fw, i);
    }
}

static void class_path(const char *dir, const struct files_params *p, uint64_t c, char *buf,
                       size_t size)
{
    int cw = (int)(digits(p->classes - 1) > 3 ? digits(p->classes - 1) : 3);
    snprintf(buf, size, "%s/class_%0*" PRIu64, dir, cw, c);
}

/* Removes what an earlier run with parameters `old` wrote (missing files are fine:
 * that run may have been interrupted). Folders that hold anything else stay. */
static void files_remove_old(const char *dir, const struct files_params *old)
{
    char path[4200];
    for (uint64_t i = 0; i < old->count; i++) {
        file_path(dir, old, i, path, sizeof path);
        unlink(path);
    }
    for (uint64_t c = 0; c < old->classes; c++) {
        class_path(dir, old, c, path, sizeof path);
        rmdir(path);
    }
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *de;
    bool empty = true;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            empty = false;
            break;
        }
    closedir(d);
    return empty;
}

static int gen_files(const char *dir, const struct files_params *p)
{
    char want[256], have[256], complete[4200], partial[4200], path[4200];
    uint8_t *buf = NULL;
    int rc = 1;

    if (strlen(dir) > 4000)
        return usage("path too long: %s", dir);
    files_describe(p, want, sizeof want);
    snprintf(complete, sizeof complete, "%s/.complete", dir);
    snprintf(partial, sizeof partial, "%s/.partial", dir);

    if (read_text_file(complete, have, sizeof have) && strcmp(have, want) == 0) {
        printf("ld-gendata: %s is up to date (%" PRIu64 " files of %s%" PRIu64
               " bytes, %" PRIu64 " classes)\n", dir, p->count, p->vary ? "~" : "", p->size,
               p->classes);
        return 0;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return fail("cannot create directory", dir);

    struct files_params old;
    bool ours = false;
    if (read_text_file(complete, have, sizeof have) && files_parse_marker(have, &old)) {
        files_remove_old(dir, &old);
        ours = true;
    }
    if (read_text_file(partial, have, sizeof have) && files_parse_marker(have, &old)) {
        files_remove_old(dir, &old);
        ours = true;
    }
    unlink(complete);
    unlink(partial);
    if (!ours && !dir_is_empty(dir)) {
        fprintf(stderr, "ld-gendata: '%s' exists, is not empty and was not made by "
                "ld-gendata; remove it or choose another directory\n", dir);
        return 1;
    }
    if (!dir_is_empty(dir)) {
        fprintf(stderr, "ld-gendata: '%s' still holds files that an earlier run did not "
                "write; remove them first\n", dir);
        return 1;
    }
    if (write_text_file(partial, want) < 0)
        return fail("cannot write", partial);

    for (uint64_t c = 0; c < p->classes; c++) {
        class_path(dir, p, c, path, sizeof path);
        if (mkdir(path, 0755) < 0 && errno != EEXIST)
            return fail("cannot create directory", path);
    }

    /* One buffer for every file, sized for the largest. */
    uint64_t cap = p->vary ? p->size / 2 + p->size : p->size;
    buf = malloc(cap + 8);
    if (!buf) {
        fprintf(stderr, "ld-gendata: out of memory\n");
        goto out;
    }
    double t0 = now_s();
    uint64_t total = 0;
    for (uint64_t i = 0; i < p->count; i++) {
        uint64_t size = file_size(p, i);
        for (uint64_t w = 0; w * 8 < size; w++) {
            uint64_t v = ld_splitmix64(i * 1000003u + w);
            for (int b = 0; b < 8; b++)
                buf[w * 8 + (uint64_t)b] = (uint8_t)(v >> (8 * b));
        }
        file_path(dir, p, i, path, sizeof path);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fail("cannot create", path);
            goto out;
        }
        if (write_all(fd, buf, size) < 0) {
            fail("cannot write", path);
            close(fd);
            goto out;
        }
        if (close(fd) < 0) {
            fail("cannot write", path);
            goto out;
        }
        total += size;
    }
    if (rename(partial, complete) < 0) {
        fail("cannot rename", partial);
        goto out;
    }
    printf("ld-gendata: wrote %" PRIu64 " files (%" PRIu64 " bytes) in %" PRIu64
           " classes under %s in %.2f s\n", p->count, total, p->classes, dir, now_s() - t0);
    rc = 0;

out:
    free(buf);
    return rc;
}

/* ---- tokens ----------------------------------------------------------------------- */

static int gen_tokens(const char *file, uint64_t count, int tsize, uint64_t vocab)
{
    char want[256], have[256], params[4200], tmp[4200];
    uint8_t *buf = NULL;
    int fd = -1, rc = 1;

    if (strlen(file) > 4000)
        return usage("path too long: %s", file);
    snprintf(want, sizeof want, "ld-gendata tokens v%d count=%" PRIu64 " dtype=uint%d vocab=%"
             PRIu64 "\n", GENDATA_VERSION, count, tsize * 8, vocab);
    snprintf(params, sizeof params, "%s.params", file);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);

    struct stat st;
    if (read_text_file(params, have, sizeof have) && strcmp(have, want) == 0 &&
        stat(file, &st) == 0 && (uint64_t)st.st_size == count * (uint64_t)tsize) {
        printf("ld-gendata: %s is up to date (%" PRIu64 " uint%d tokens, vocab %" PRIu64 ")\n",
               file, count, tsize * 8, vocab);
        return 0;
    }
    /* The sidecar goes first, so no crash below leaves a stale one that matches. */
    if (unlink(params) < 0 && errno != ENOENT)
        return fail("cannot remove", params);

    buf = malloc((size_t)TOKEN_CHUNK * (size_t)tsize);
    if (!buf) {
        fprintf(stderr, "ld-gendata: out of memory\n");
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fail("cannot create", tmp);
        goto out;
    }
    double t0 = now_s();
    for (uint64_t k = 0; k < count;) {
        size_t n = count - k < TOKEN_CHUNK ? (size_t)(count - k) : TOKEN_CHUNK;
        for (size_t j = 0; j < n; j++) {
            uint64_t t = ld_splitmix64(k + j) % vocab;
            if (tsize == 2) {
                uint16_t v = (uint16_t)t;
                memcpy(buf + j * 2, &v, 2);
            } else {
                uint32_t v = (uint32_t)t;
                memcpy(buf + j * 4, &v, 4);
            }
        }
        if (write_all(fd, buf, n * (size_t)tsize) < 0) {
            fail("cannot write", tmp);
            goto out;
        }
        k += n;
    }
    int e = close(fd);
    fd = -1;
    if (e < 0 || rename(tmp, file) < 0) {
        fail("cannot write", file);
        goto out;
    }
    if (write_text_file(params, want) < 0) {
        fail("cannot write", params);
        goto out;
    }
    printf("ld-gendata: wrote %" PRIu64 " uint%d tokens (vocab %" PRIu64 ") to %s in %.2f s\n",
           count, tsize * 8, vocab, file, now_s() - t0);
    rc = 0;

out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(buf);
    return rc;
}

/* ---- command line ----------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *mode = argv[1];
    bool files = strcmp(mode, "files") == 0;
    if (!files && strcmp(mode, "tokens") != 0)
        return usage("unknown mode '%s' (files or tokens)", mode);

    const char *path = NULL;
    uint64_t count = 0, size = 0, classes = 10, vocab = 0;
    bool have_count = false, have_size = false, vary = false;
    int tsize = 2;

    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--count") == 0) {
            if (!parse_u64(v, 1, UINT64_MAX / 8, &count))
                return usage("--count wants a whole number >= 1, not '%s'", v ? v : "");
            have_count = true;
            i++;
        } else if (files && strcmp(a, "--size") == 0) {
            if (!parse_u64(v, 1, MAX_FILE_SIZE, &size))
                return usage("--size wants a byte count in [1, 2^30], not '%s'", v ? v : "");
            have_size = true;
            i++;
        } else if (files && strcmp(a, "--classes") == 0) {
            if (!parse_u64(v, 0, MAX_CLASSES, &classes))
                return usage("--classes wants a number in [0, 1000000], not '%s'", v ? v : "");
            i++;
        } else if (files && strcmp(a, "--vary") == 0) {
            vary = true;
        } else if (!files && strcmp(a, "--dtype") == 0) {
            if (v && strcmp(v, "uint16") == 0)
                tsize = 2;
            else if (v && strcmp(v, "uint32") == 0)
                tsize = 4;
            else
                return usage("--dtype wants uint16 or uint32, not '%s'", v ? v : "");
            i++;
        } else if (!files && strcmp(a, "--vocab") == 0) {
            if (!parse_u64(v, 1, UINT32_MAX + 1ull, &vocab))
                return usage("--vocab wants a number in [1, 2^32], not '%s'", v ? v : "");
            i++;
        } else if (a[0] == '-') {
            return usage("unknown option '%s'", a);
        } else if (path) {
            return usage("one output path only; '%s' is a second one", a);
        } else {
            path = a;
        }
    }
    if (!path)
        return usage("missing the output %s", files ? "DIR" : "FILE");
    if (!have_count)
        return usage("missing --count");

    if (files) {
        if (!have_size)
            return usage("missing --size");
        struct files_params p = {.count = count, .size = size, .classes = classes,
                                 .vary = vary};
        return gen_files(path, &p);
    }
    if (vocab == 0)
        vocab = 50257;   /* GPT-2's vocabulary */
    if (tsize == 2 && vocab > 65536)
        return usage("--vocab %" PRIu64 " does not fit uint16 tokens (at most 65536)", vocab);
    return gen_tokens(path, count, tsize, vocab);
}
