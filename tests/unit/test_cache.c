/* Unit tests for the single-file dataset cache (cache_build.c, cache.c, the file part
 * of cache_report.c) and for the `files` kind's cache hooks (fingerprint, raw_bytes,
 * read_raw). Each test writes a small tree of files in its own temporary directory,
 * opens it through dataset_open(), builds a cache next to it and reads it back; then it
 * damages the file in every section, cuts it short, kills builders at several points,
 * changes the source, and checks that each case is refused with its own code and
 * message. The keeper has its own tests (test_cache_keeper.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cache_fixtures.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>
#include <uv.h>
#include <xxhash.h>

#include "cache.h"
#include "cache_hash.h"
#include "cache_report.h"
#include "dataset.h"
#include "log.h"

static uint64_t fingerprint(const dataset *d, int mode)
{
    char err[LD_ERRMSG_MAX] = "";
    uint64_t fp = 0;
    int r = d->ops->fingerprint(d, mode, &fp, err);
    if (r != 0)
        fail_msg("fingerprint: %d %s", r, err);
    assert_true(fp != 0);
    return fp;
}

/* ---- the cache ----------------------------------------------------------------------- */

static void build_ok(const dataset *d, const char *path, uint64_t fp)
{
    char err[LD_ERRMSG_MAX] = "";
    int r = cache_build(d, path, fp, NULL, NULL, NULL, err);
    if (r != 0)
        fail_msg("cache_build: %d %s", r, err);
}

static cache *open_ok(const char *path, uint64_t fp)
{
    char err[LD_ERRMSG_MAX] = "";
    cache *c = (cache *)0x1;
    int r = cache_open(path, fp, &c, err);
    if (r != 0)
        fail_msg("cache_open: %d %s", r, err);
    assert_true(c && c != (cache *)0x1);
    return c;
}

/* Opens expecting `code` with `needle` in the message; ret_cache stays untouched. */
static void open_fails(const char *path, uint64_t fp, int code, const char *needle)
{
    char err[LD_ERRMSG_MAX] = "";
    cache *c = (cache *)0x1;
    int r = cache_open(path, fp, &c, err);
    if (r != code || !strstr(err, needle))
        fail_msg("cache_open: expected %d '%s', got %d '%s'", code, needle, r, err);
    assert_ptr_equal(c, (cache *)0x1);
    assert_non_null(strstr(err, path));   /* every message names the file */
}

static void verify_ok(const cache *c)
{
    char err[LD_ERRMSG_MAX] = "";
    int r = cache_verify(c, NULL, NULL, NULL, err);
    if (r != 0)
        fail_msg("cache_verify: %d %s", r, err);
}

/* Every sample of the cache equals what the dataset's own read() gives, byte for byte,
 * with the same label; pointers are aligned. */
static void check_equal(const dataset *d, cache *c)
{
    assert_int_equal(cache_meta(c)->count, d->count);
    for (uint64_t i = 0; i < d->count; i++) {
        uint64_t size = d->ops->item_bytes(d, i, 0);
        uint8_t *buf = malloc(size + 1);
        int64_t label = 999;
        char err[LD_ERRMSG_MAX] = "";
        void *dst[2] = {buf, &label};
        assert_int_equal(d->ops->read(d, i, dst, err), 0);

        const void *p = NULL;
        uint64_t len = 0;
        int64_t lab = 999;
        assert_int_equal(cache_sample(c, i, &p, &len, &lab), 0);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % CACHE_ALIGN, 0);
        assert_int_equal(len, size);
        assert_int_equal(lab, label);
        if (memcmp(p, buf, size) != 0)
            fail_msg("sample %" PRIu64 " differs from its source", i);
        free(buf);
    }
}




static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}


/* The whole file, to restore it between damages. */
static uint8_t *slurp(const char *path, uint64_t *ret_size)
{
    uint64_t size = file_size(path);
    uint8_t *buf = malloc(size);
    file_read_at(path, 0, buf, size);
    *ret_size = size;
    return buf;
}

static void restore(const char *path, const uint8_t *buf, uint64_t size)
{
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, size), (ssize_t)size);
    close(fd);
}

static void header_reseal(struct cache_header *h)
{
    h->header_checksum = XXH3_64bits(h, offsetof(struct cache_header, header_checksum));
}

static void footer_reseal(struct cache_footer *f)
{
    f->footer_checksum = XXH3_64bits(f, offsetof(struct cache_footer, footer_checksum));
}

/* Files in dir whose name holds ".tmp.". */
static int count_temps(const char *dir)
{
    DIR *dp = opendir(dir);
    int n = 0;
    assert_non_null(dp);
    for (struct dirent *de; (de = readdir(dp));)
        if (strstr(de->d_name, ".tmp."))
            n++;
    closedir(dp);
    return n;
}

/* ---- round trips ------------------------------------------------------------------- */

struct progress_log {
    int stages[16];
    int n_stages;
    uint64_t last_done, last_total;
    int read_calls;
};

static void log_progress(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total)
{
    struct progress_log *pl = ctx;
    if (pl->n_stages == 0 || pl->stages[pl->n_stages - 1] != (int)stage) {
        if (pl->n_stages < 16)
            pl->stages[pl->n_stages++] = (int)stage;
    }
    if (stage == CACHE_STAGE_READ || stage == CACHE_STAGE_VERIFY) {
        pl->read_calls++;
        assert_true(done <= total);
        assert_true(done >= pl->last_done);
    }
    pl->last_done = done;
    pl->last_total = total;
}

static void test_fixed_roundtrip(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 40, 1000);
    testfs_write(t->src, "root.bin", 77, 1000);        /* in no class folder: label -1 */
    dataset *d = open_dataset(t);
    assert_int_equal(d->count, 41);
    uint64_t fp = fingerprint(d, DATASET_FINGERPRINT_STAT);

    struct progress_log pl = {0};
    assert_int_equal(cache_build(d, t->cache, fp, log_progress, &pl, NULL, err), 0);
    int want[] = {CACHE_STAGE_READ, CACHE_STAGE_SYNC, CACHE_STAGE_RENAME, CACHE_STAGE_RENAMED,
                  CACHE_STAGE_DONE};
    assert_int_equal(pl.n_stages, 5);
    assert_memory_equal(pl.stages, want, sizeof want);
    assert_true(pl.read_calls >= 41 && pl.read_calls <= 101);
    assert_int_equal(count_temps(t->out), 0);
    /* Header page + 41 samples of 1000 bytes padded to 1024 + index + footer. */
    assert_int_equal(file_size(t->cache), 4096 + 41 * 1024 + 41 * 32 + 64);

    cache *c = open_ok(t->cache, fp);
    const struct cache_meta *m = cache_meta(c);
    assert_int_equal(m->version, CACHE_VERSION);
    assert_int_equal(m->flags, 0);
    assert_int_equal(m->fingerprint, fp);
    assert_string_equal(m->kind, "files");
    assert_string_equal(m->name, "ds");
    assert_string_equal(m->source, t->src);
    assert_int_equal(m->n_fields, 2);
    assert_int_equal(m->label_field, 1);
    assert_string_equal(m->fields[0].name, "data");
    assert_int_equal(m->fields[0].dtype, LD_DTYPE_UINT8);
    assert_false(m->fields[0].ragged);
    assert_int_equal(m->fields[0].ndim, 1);
    assert_int_equal(m->fields[0].shape[0], 1000);
    assert_string_equal(m->fields[1].name, "label");
    assert_int_equal(m->fields[1].dtype, LD_DTYPE_INT64);
    assert_int_equal(m->sample_bytes, 41 * 1000);
    assert_int_equal(m->data_bytes, 41 * 1024);
    assert_string_equal(cache_path(c), t->cache);
    check_equal(d, c);

    /* The label of the file in the root, and the class folders' labels. */
    const void *p;
    uint64_t len;
    int64_t label;
    assert_int_equal(cache_sample(c, 40, &p, &len, &label), 0);   /* "root.bin" sorts last */
    assert_int_equal(label, -1);
    assert_int_equal(cache_sample(c, 0, &p, &len, &label), 0);
    assert_int_equal(label, 0);
    assert_int_equal(cache_sample(c, 41, &p, &len, &label), LD_ERANGE);

    /* Copies, with and without the checksum; a small buffer and a bad index fail. */
    uint8_t buf[1000];
    assert_int_equal(cache_read(c, 5, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(len, 1000);
    assert_int_equal(cache_sample(c, 5, &p, &len, &label), 0);
    assert_memory_equal(buf, p, 1000);
    assert_int_equal(cache_read(c, 5, buf, 999, &len, &label, false, err), LD_ERANGE);
    assert_non_null(strstr(err, "sample 5"));
    assert_int_equal(cache_read(c, 41, buf, sizeof buf, &len, &label, false, err), LD_ERANGE);

    /* Hits: 41 (check_equal) + 3 samples + 1 read; failed calls count nothing. */
    uint64_t hits, bytes;
    cache_hits(c, &hits, &bytes);
    assert_int_equal(hits, 45);
    assert_int_equal(bytes, 45 * 1000);

    struct progress_log vl = {0};
    assert_int_equal(cache_verify(c, log_progress, &vl, NULL, err), 0);
    assert_int_equal(vl.stages[0], CACHE_STAGE_VERIFY);
    assert_int_equal(vl.last_done, 41);
    assert_int_equal(vl.last_total, 41);

    cJSON *info = cJSON_CreateObject();
    assert_int_equal(cache_report_file(c, info), 0);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, fp);
    assert_string_equal(cJSON_GetObjectItem(info, "fingerprint")->valuestring, hex);
    assert_int_equal(cJSON_GetObjectItem(info, "count")->valuedouble, 41);
    assert_string_equal(cJSON_GetObjectItem(info, "kind")->valuestring, "files");
    assert_int_equal(cJSON_GetObjectItem(info, "file_size")->valuedouble, file_size(t->cache));
    assert_int_equal(cJSON_GetObjectItem(info, "hits")->valuedouble, 45);
    const char *when = cJSON_GetObjectItem(info, "build_time")->valuestring;
    assert_true(strlen(when) == 30 && when[29] == 'Z' && when[10] == 'T');
    cJSON *fields = cJSON_GetObjectItem(info, "fields");
    assert_int_equal(cJSON_GetArraySize(fields), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(fields, 0), "dtype")->valuestring,
                        "uint8");
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(fields, 0), "shape"),
                                        0)->valuedouble, 1000);
    cJSON_Delete(info);

    /* A `packed` source does not know the fingerprint: 0 skips the check. */
    cache *c2 = open_ok(t->cache, 0);
    cache_free(c2);
    cache_free(c);
    dataset_free(d);
}

static void test_ragged_roundtrip(void **state)
{
    struct tdir *t = *state;
    /* Sizes around the alignment, an empty file and one larger than the build buffer. */
    static const size_t sizes[] = {0, 1, 63, 64, 65, 4095, 4097, (9u << 20) + 3, 100, 7};
    char rel[64];
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(rel, sizeof rel, "c%u/%02u.bin", i % 2, i);
        testfs_write(t->src, rel, i + 1, sizes[i]);
    }
    dataset *d = open_dataset(t);
    assert_true(d->fields[0].ragged);
    uint64_t fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    build_ok(d, t->cache, fp);

    cache *c = open_ok(t->cache, fp);
    const struct cache_meta *m = cache_meta(c);
    assert_int_equal(m->flags, CACHE_FLAG_RAGGED);
    assert_true(m->fields[0].ragged);
    assert_int_equal(m->fields[0].max_item_bytes, (9u << 20) + 3);
    assert_int_equal(m->max_sample_bytes, (9u << 20) + 3);
    check_equal(d, c);
    verify_ok(c);

    /* Between samples, only zeros: the file's bytes depend on the samples alone. */
    uint64_t size;
    uint8_t *file = slurp(t->cache, &size);
    const struct cache_header *h = (const struct cache_header *)file;
    uint64_t pos = CACHE_HEADER_SIZE;
    for (uint64_t i = 0; i < h->count; i++) {
        const struct cache_index_entry *e =
            (const struct cache_index_entry *)(file + h->index_offset) + i;
        assert_int_equal(e->offset, pos);
        for (uint64_t j = e->offset + e->length; j < (e->offset + e->length + 63) / 64 * 64; j++)
            if (file[j])
                fail_msg("padding byte %" PRIu64 " after sample %" PRIu64 " is not 0", j, i);
        pos = (e->offset + e->length + 63) / 64 * 64;
    }
    assert_int_equal(pos, h->index_offset);
    free(file);
    cache_free(c);
    dataset_free(d);
}

/* Building over an existing cache replaces it atomically; a reader that has the old
 * one mapped keeps reading the old bytes. */
static void test_rebuild_while_mapped(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 6, 300);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 111);
    cache *old = open_ok(t->cache, 111);
    const void *p;
    uint64_t len;
    int64_t label;
    assert_int_equal(cache_sample(old, 2, &p, &len, &label), 0);
    uint8_t before[300];
    memcpy(before, p, 300);

    dataset_free(d);
    testfs_write(t->src, "class_1/0001.bin", 99, 300);   /* new content for sample 2 */
    d = open_dataset(t);
    build_ok(d, t->cache, 222);

    assert_int_equal(cache_sample(old, 2, &p, &len, &label), 0);
    assert_memory_equal(p, before, 300);
    verify_ok(old);
    open_fails(t->cache, 111, LD_ECACHESTALE, "stale");
    cache *cur = open_ok(t->cache, 222);
    check_equal(d, cur);
    assert_int_equal(cache_sample(cur, 2, &p, &len, &label), 0);
    assert_memory_not_equal(p, before, 300);
    cache_free(cur);
    cache_free(old);
    dataset_free(d);
}

/* ---- damage ------------------------------------------------------------------------- */

static void read_entry(const char *path, uint64_t i, struct cache_index_entry *ret)
{
    struct cache_header h;
    file_read_at(path, 0, &h, sizeof h);
    file_read_at(path, h.index_offset + i * sizeof *ret, ret, sizeof *ret);
}

static void test_corrupt_data(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 12, 500);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 5);
    struct cache_index_entry e;
    read_entry(t->cache, 7, &e);
    flip_byte(t->cache, e.offset + 123);

    /* Open does not read the data; verify finds the sample and names it. */
    cache *c = open_ok(t->cache, 5);
    assert_int_equal(cache_verify(c, NULL, NULL, NULL, err), LD_ECACHE);
    assert_non_null(strstr(err, "sample 7 "));
    assert_non_null(strstr(err, "checksum mismatch"));
    uint8_t buf[500];
    uint64_t len;
    int64_t label;
    assert_int_equal(cache_read(c, 7, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_non_null(strstr(err, "sample 7 "));
    assert_int_equal(cache_read(c, 6, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(cache_read(c, 7, buf, sizeof buf, &len, &label, false, err), 0);
    uint8_t orig[500];
    void *dst[2] = {orig, &label};
    assert_int_equal(d->ops->read(d, 7, dst, err), 0);
    assert_int_equal(buf[123], orig[123] ^ 0x5a);
    buf[123] = orig[123];
    assert_memory_equal(buf, orig, 500);
    uint64_t hits, hit_bytes;
    cache_hits(c, &hits, NULL);
    assert_int_equal(hits, 2);                                 /* the refused read is no hit */

    /* A reader's tally: dataset_read counts its hits there, and the cache's counters see
     * them when the tally is added; the corrupt sample, served by the source, is none. */
    struct cache_tally tally = {0, 0};
    struct dataset_read_ctx ctx = {.cache = c, .tally = &tally};
    assert_int_equal(dataset_read(d, 6, &ctx, dst, NULL, err), 0);
    assert_int_equal(dataset_read(d, 5, &ctx, dst, NULL, err), 0);
    assert_int_equal(dataset_read(d, 7, &ctx, dst, NULL, err), 0);
    assert_memory_equal(orig, buf, 500);                       /* sample 7: the source's bytes */
    assert_int_equal(tally.samples, 2);
    assert_int_equal(tally.bytes, 2 * 500);
    cache_hits(c, &hits, &hit_bytes);
    assert_int_equal(hits, 2);
    cache_count_tally(c, &tally);
    assert_int_equal(tally.samples, 0);
    assert_int_equal(tally.bytes, 0);
    cache_hits(c, &hits, &hit_bytes);
    assert_int_equal(hits, 4);
    assert_int_equal(hit_bytes, 4 * 500);
    cache_free(c);
    dataset_free(d);
}

static void test_corrupt_index(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 10, 200);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 5);
    uint64_t size;
    uint8_t *pristine = slurp(t->cache, &size);
    struct cache_header h;
    memcpy(&h, pristine, sizeof h);

    /* A flipped byte anywhere in the index. */
    for (uint64_t off = 0; off < h.index_bytes; off += 37) {
        flip_byte(t->cache, h.index_offset + off);
        open_fails(t->cache, 5, LD_ECACHE, "index checksum mismatch");
        restore(t->cache, pristine, size);
    }

    /* An entry that points out of the data section, with every checksum made to match:
     * the bounds check still refuses it. */
    struct cache_index_entry e;
    struct cache_footer f;
    read_entry(t->cache, 3, &e);
    e.offset = h.index_offset;                               /* into the index */
    file_write_at(t->cache, h.index_offset + 3 * sizeof e, &e, sizeof e);
    memcpy(&f, pristine + size - sizeof f, sizeof f);
    uint8_t *index = malloc(h.index_bytes);
    file_read_at(t->cache, h.index_offset, index, h.index_bytes);
    f.index_checksum = XXH3_64bits(index, h.index_bytes);
    footer_reseal(&f);
    file_write_at(t->cache, size - sizeof f, &f, sizeof f);
    open_fails(t->cache, 5, LD_ECACHE, "index entry 3 ");

    /* An entry whose length disagrees with the fixed layout. */
    restore(t->cache, pristine, size);
    read_entry(t->cache, 4, &e);
    e.length = 100;
    file_write_at(t->cache, h.index_offset + 4 * sizeof e, &e, sizeof e);
    file_read_at(t->cache, h.index_offset, index, h.index_bytes);
    f.index_checksum = XXH3_64bits(index, h.index_bytes);
    footer_reseal(&f);
    file_write_at(t->cache, size - sizeof f, &f, sizeof f);
    open_fails(t->cache, 5, LD_ECACHE, "index entry 4 ");

    restore(t->cache, pristine, size);
    cache_free(open_ok(t->cache, 5));
    free(index);
    free(pristine);
    dataset_free(d);
}

static void test_corrupt_header(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 10, 200);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 5);
    uint64_t size;
    uint8_t *pristine = slurp(t->cache, &size);
    struct cache_header h;

    /* Flipped bytes: the magic, then fields and reserved bytes under the checksum. */
    flip_byte(t->cache, 3);
    open_fails(t->cache, 5, LD_ECACHE, "bad magic");
    restore(t->cache, pristine, size);
    static const uint64_t offs[] = {12, 16, 24, 40, 56, 100, 130, 300, 1300, 3000, 4087, 4090};
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        flip_byte(t->cache, offs[k]);
        open_fails(t->cache, 5, LD_ECACHE, "header checksum mismatch");
        restore(t->cache, pristine, size);
    }

    /* Another version: refused before the checksum, whose place it may have moved. */
    memcpy(&h, pristine, sizeof h);
    h.version = 2;
    file_write_at(t->cache, 0, &h, sizeof h);
    open_fails(t->cache, 5, LD_ECACHEVERSION, "format version 2");

    /* A flag this build does not know, checksum resealed. */
    memcpy(&h, pristine, sizeof h);
    h.flags |= 0x80;
    header_reseal(&h);
    file_write_at(t->cache, 0, &h, sizeof h);
    open_fails(t->cache, 5, LD_ECACHEVERSION, "flags");

    /* Sections that do not add up, checksum resealed. */
    memcpy(&h, pristine, sizeof h);
    h.data_bytes += 64;
    header_reseal(&h);
    file_write_at(t->cache, 0, &h, sizeof h);
    open_fails(t->cache, 5, LD_ECACHE, "header inconsistent");

    memcpy(&h, pristine, sizeof h);
    h.fields[0].shape[0] = 201;
    header_reseal(&h);
    file_write_at(t->cache, 0, &h, sizeof h);
    open_fails(t->cache, 5, LD_ECACHE, "header inconsistent");

    /* A consistent header that the footer does not vouch for. */
    memcpy(&h, pristine, sizeof h);
    h.build_time_ns += 1;
    header_reseal(&h);
    file_write_at(t->cache, 0, &h, sizeof h);
    open_fails(t->cache, 5, LD_ECACHE, "footer does not match the header");

    restore(t->cache, pristine, size);
    cache_free(open_ok(t->cache, 5));
    free(pristine);
    dataset_free(d);
}

static void test_corrupt_footer(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 10, 200);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 5);
    uint64_t size;
    uint8_t *pristine = slurp(t->cache, &size);
    struct cache_footer f;
    const uint64_t at = size - sizeof f;

    flip_byte(t->cache, at + 2);
    open_fails(t->cache, 5, LD_ECACHE, "footer corrupt (bad magic)");
    restore(t->cache, pristine, size);
    for (uint64_t off = 8; off < sizeof f; off += 7) {
        flip_byte(t->cache, at + off);
        open_fails(t->cache, 5, LD_ECACHE, "footer checksum mismatch");
        restore(t->cache, pristine, size);
    }

    /* Resealed footers that disagree with the header, or with the index. */
    size_t member[] = {offsetof(struct cache_footer, count),
                       offsetof(struct cache_footer, fingerprint),
                       offsetof(struct cache_footer, index_offset),
                       offsetof(struct cache_footer, header_checksum),
                       offsetof(struct cache_footer, file_size)};
    for (size_t k = 0; k < sizeof member / sizeof member[0]; k++) {
        memcpy(&f, pristine + at, sizeof f);
        ((uint8_t *)&f)[member[k]] ^= 1;
        footer_reseal(&f);
        file_write_at(t->cache, at, &f, sizeof f);
        open_fails(t->cache, 5, LD_ECACHE, "footer does not match the header");
    }
    memcpy(&f, pristine + at, sizeof f);
    f.index_checksum ^= 1;
    footer_reseal(&f);
    file_write_at(t->cache, at, &f, sizeof f);
    open_fails(t->cache, 5, LD_ECACHE, "index checksum mismatch");

    restore(t->cache, pristine, size);
    cache_free(open_ok(t->cache, 5));
    free(pristine);
    dataset_free(d);
}

/* The served samples' checksum (cache_hash.c: xxHash's AVX2 code compiled in where the
 * CPU has it) is the library's XXH3_64bits on every length class (0-16, 17-128,
 * 129-240, the long loop, its last partial stripe) and alignment, and on 1 MiB. */
static void test_sample_hash_is_xxh3(void **state)
{
    (void)state;
    size_t big = 1u << 20;
    uint8_t *buf = malloc(big + 64);
    assert_non_null(buf);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < big + 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    for (size_t n = 0; n <= 4200; n++)
        for (size_t off = 0; off < 64; off += 21)
            assert_int_equal(cache_hash_sample(buf + off, n), XXH3_64bits(buf + off, n));
    assert_int_equal(cache_hash_sample(buf + 3, big), XXH3_64bits(buf + 3, big));
    assert_int_equal(cache_hash_sample(NULL, 0), XXH3_64bits(NULL, 0));
#if defined(__x86_64__)
    /* The AVX2 copy is built on x86-64 (the Makefile's -mavx2), and right where it runs. */
    assert_int_equal(cache_hash_avx2_built, 1);
    if (__builtin_cpu_supports("avx2")) {
        for (size_t n = 0; n <= 4200; n += 7)
            assert_int_equal(cache_hash_avx2(buf + 1, n), XXH3_64bits(buf + 1, n));
        assert_int_equal(cache_hash_avx2(buf, big), XXH3_64bits(buf, big));
    }
#endif
    free(buf);
}

static void test_truncated(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 10, 200);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 5);
    uint64_t size;
    uint8_t *pristine = slurp(t->cache, &size);
    struct cache_header h;
    memcpy(&h, pristine, sizeof h);

    const uint64_t cuts[] = {0, 1, 100, 4095, 4096, 4096 + 64 + 1, 4096 + 1000,
                             h.index_offset, h.index_offset + 5, size - 64, size - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        restore(t->cache, pristine, size);
        assert_int_equal(truncate(t->cache, (off_t)cuts[k]), 0);
        open_fails(t->cache, 5, LD_ECACHE, "truncated");
    }
    /* Bytes after the footer: no longer the file that was written. */
    restore(t->cache, pristine, size);
    int fd = open(t->cache, O_WRONLY | O_APPEND);
    assert_int_equal(write(fd, "x", 1), 1);
    close(fd);
    open_fails(t->cache, 5, LD_ECACHE, "longer than");

    restore(t->cache, pristine, size);
    cache_free(open_ok(t->cache, 5));
    free(pristine);
    dataset_free(d);
}

static void test_open_errors(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    cache *c = (cache *)0x1;
    assert_int_equal(cache_open(t->cache, 0, &c, err), LD_ENOENT);
    assert_non_null(strstr(err, t->cache));
    assert_int_equal(cache_open(t->out, 0, &c, err), LD_EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    assert_ptr_equal(c, (cache *)0x1);

    /* Something else entirely, large enough to hold a header. */
    uint8_t junk[10000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = testfs_byte(3, i);
    int fd = open(t->cache, O_WRONLY | O_CREAT, 0644);
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    open_fails(t->cache, 0, LD_ECACHE, "not a loaderd cache file");
}

/* ---- invalidation ------------------------------------------------------------------- */

static void set_mtime(const char *path, time_t sec, long nsec)
{
    struct timespec ts[2] = {{sec, nsec}, {sec, nsec}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void test_fingerprint(void **state)
{
    struct tdir *t = *state;
    char path[512];
    uint64_t seen[16];
    int n_seen = 0;
    write_fixed_tree(t->src, 9, 128);
    snprintf(path, sizeof path, "%s/class_1/0004.bin", t->src);
    set_mtime(path, 1600000000, 0);

    dataset *d = open_dataset(t);
    uint64_t fp0 = fingerprint(d, DATASET_FINGERPRINT_STAT);
    uint64_t cfp0 = fingerprint(d, DATASET_FINGERPRINT_CONTENT);
    assert_true(fp0 != cfp0);
    seen[n_seen++] = fp0;
    build_ok(d, t->cache, fp0);

    /* The same tree, scanned again, has the same fingerprint, and its cache is served. */
    dataset_free(d);
    d = open_dataset(t);
    assert_int_equal(fingerprint(d, DATASET_FINGERPRINT_STAT), fp0);
    assert_int_equal(fingerprint(d, DATASET_FINGERPRINT_CONTENT), cfp0);
    cache_free(open_ok(t->cache, fp0));

    /* Touched (a new mtime, by a nanosecond): stale, even without a new scan. */
    set_mtime(path, 1600000000, 1);
    uint64_t fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    assert_true(fp != fp0);
    seen[n_seen++] = fp;
    open_fails(t->cache, fp, LD_ECACHESTALE, "stale");
    /* ... but its content has not changed. */
    assert_int_equal(fingerprint(d, DATASET_FINGERPRINT_CONTENT), cfp0);

    /* Same size, same mtime, other bytes: only the content fingerprint sees it. */
    testfs_write(t->src, "class_1/0004.bin", 200, 128);
    set_mtime(path, 1600000000, 1);
    assert_int_equal(fingerprint(d, DATASET_FINGERPRINT_STAT), fp);
    uint64_t cfp = fingerprint(d, DATASET_FINGERPRINT_CONTENT);
    assert_true(cfp != cfp0);

    /* Resized, with the old mtime put back: the size alone changes it. */
    testfs_write(t->src, "class_1/0004.bin", 4, 129);
    set_mtime(path, 1600000000, 1);
    dataset_free(d);
    d = open_dataset(t);
    fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    seen[n_seen++] = fp;
    open_fails(t->cache, fp, LD_ECACHESTALE, "stale");

    /* A file added. */
    testfs_write(t->src, "class_0/0100.bin", 100, 128);
    dataset_free(d);
    d = open_dataset(t);
    fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    seen[n_seen++] = fp;
    open_fails(t->cache, fp, LD_ECACHESTALE, "stale");

    /* A file removed: seen at once (it is gone from disk) and after a new scan. */
    char gone[512];
    snprintf(gone, sizeof gone, "%s/class_2/0005.bin", t->src);
    assert_int_equal(unlink(gone), 0);
    fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    seen[n_seen++] = fp;
    dataset_free(d);
    d = open_dataset(t);
    fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    seen[n_seen++] = fp;
    open_fails(t->cache, fp, LD_ECACHESTALE, "stale");

    /* A moved tree keeps its fingerprint: the root's path is not part of it. */
    char moved[512];
    snprintf(moved, sizeof moved, "%s/moved", t->root);
    assert_int_equal(rename(t->src, moved), 0);
    struct config_dataset cfg = {.name = "ds", .kind = CONFIG_DATASET_FILES, .path = moved,
                                 .pattern = "*"};
    char err[LD_ERRMSG_MAX] = "";
    dataset *dm = NULL;
    assert_int_equal(dataset_open(&cfg, &dm, err), 0);
    assert_int_equal(fingerprint(dm, DATASET_FINGERPRINT_STAT), fp);
    uint64_t bad = 0;
    assert_int_equal(dm->ops->fingerprint(dm, 7, &bad, err), LD_EINVAL);
    assert_int_equal(bad, 0);
    dataset_free(dm);
    assert_int_equal(rename(moved, t->src), 0);

    /* A sample that cannot be read: content mode says which, stat mode just differs. */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    seen[n_seen++] = fp;
    uint64_t untouched = 77;
    assert_int_equal(d->ops->fingerprint(d, DATASET_FINGERPRINT_CONTENT, &untouched, err),
                     LD_EISDIR);
    assert_int_equal(untouched, 77);
    assert_non_null(strstr(err, "class_1/0004.bin"));
    assert_int_equal(rmdir(path), 0);

    for (int i = 0; i < n_seen; i++)
        for (int j = i + 1; j < n_seen; j++)
            if (seen[i] == seen[j])
                fail_msg("fingerprints %d and %d are equal", i, j);
    dataset_free(d);
}

/* ---- crash safety ------------------------------------------------------------------- */

struct kill_point {
    enum cache_stage stage;
    unsigned percent;               /* CACHE_STAGE_READ: when this share is done */
};

static void kill_at(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total)
{
    const struct kill_point *kp = ctx;
    if (stage != kp->stage)
        return;
    if (stage == CACHE_STAGE_READ && done * 100 < (uint64_t)kp->percent * total)
        return;
    kill(getpid(), SIGKILL);
}

/* Forks a builder that SIGKILLs itself at kp; waits for it. */
static void build_and_die(const dataset *d, const char *path, uint64_t fp,
                          const struct kill_point *kp)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[LD_ERRMSG_MAX];
        cache_build(d, path, fp, kill_at, (void *)kp, NULL, err);
        _exit(3);                   /* not reached: the callback kills us */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

static void test_crash_points(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 100, 200);             /* 100 samples: one per percent */
    dataset *d = open_dataset(t);
    static const struct kill_point points[] = {
        {CACHE_STAGE_READ, 10}, {CACHE_STAGE_READ, 50}, {CACHE_STAGE_READ, 99},
        {CACHE_STAGE_SYNC, 0},  {CACHE_STAGE_RENAME, 0}, {CACHE_STAGE_RENAMED, 0},
    };
    const size_t n = sizeof points / sizeof points[0];
    int temps = 0;

    /* No cache yet: a kill before the rename leaves none, one after leaves a whole one. */
    for (size_t k = 0; k < n; k++) {
        build_and_die(d, t->cache, 1000 + k, &points[k]);
        if (points[k].stage == CACHE_STAGE_RENAMED) {
            cache *c = open_ok(t->cache, 1000 + k);
            verify_ok(c);
            cache_free(c);
            assert_int_equal(unlink(t->cache), 0);
        } else {
            assert_false(exists(t->cache));
            temps++;
        }
    }
    assert_int_equal(count_temps(t->out), temps);

    /* An old cache in place: a kill before the rename leaves the old one, whole. */
    build_ok(d, t->cache, 42);
    for (size_t k = 0; k < n; k++) {
        build_and_die(d, t->cache, 2000 + k, &points[k]);
        uint64_t want = points[k].stage == CACHE_STAGE_RENAMED ? 2000 + k : 42;
        cache *c = open_ok(t->cache, want);
        verify_ok(c);
        check_equal(d, c);
        cache_free(c);
        if (points[k].stage != CACHE_STAGE_RENAMED)
            temps++;
    }
    assert_int_equal(count_temps(t->out), temps);

    /* The dead builders' temporary files are swept; the cache stays. */
    assert_int_equal(cache_sweep_temps(t->out, err), temps);
    assert_int_equal(count_temps(t->out), 0);
    cache_free(open_ok(t->cache, 2000 + n - 1));
    dataset_free(d);
}

static void cancel_at_half(void *ctx, enum cache_stage stage, uint64_t done, uint64_t total)
{
    if (stage == CACHE_STAGE_READ && done * 2 >= total)
        atomic_store((atomic_int *)ctx, 1);
}

static void test_cancel(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 20, 100);
    dataset *d = open_dataset(t);
    atomic_int cancel = 0;

    assert_int_equal(cache_build(d, t->cache, 9, cancel_at_half, &cancel, &cancel, err),
                     LD_ECANCELED);
    assert_non_null(strstr(err, "canceled at sample 10 "));
    assert_false(exists(t->cache));
    assert_int_equal(count_temps(t->out), 0);

    /* Over an old cache: canceled from the start, the old cache is untouched. */
    build_ok(d, t->cache, 8);
    atomic_store(&cancel, 1);
    assert_int_equal(cache_build(d, t->cache, 9, NULL, NULL, &cancel, err), LD_ECANCELED);
    assert_int_equal(count_temps(t->out), 0);
    cache *c = open_ok(t->cache, 8);
    assert_int_equal(cache_verify(c, NULL, NULL, &cancel, err), LD_ECANCELED);
    atomic_store(&cancel, 0);
    assert_int_equal(cache_verify(c, NULL, NULL, &cancel, err), 0);
    cache_free(c);
    dataset_free(d);
}

static void test_unwritable_dir(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    char path[700], dir[512];
    write_fixed_tree(t->src, 3, 100);
    dataset *d = open_dataset(t);

    snprintf(dir, sizeof dir, "%s/missing/deeper", t->root);
    snprintf(path, sizeof path, "%s/x.ldcache", dir);
    assert_int_equal(cache_build(d, path, 1, NULL, NULL, NULL, err), LD_ENOENT);
    assert_non_null(strstr(err, "directory"));
    assert_non_null(strstr(err, dir));

    /* A "directory" that is a file. */
    snprintf(dir, sizeof dir, "%s/class_0/0000.bin", t->src);
    snprintf(path, sizeof path, "%s/x.ldcache", dir);
    assert_int_equal(cache_build(d, path, 1, NULL, NULL, NULL, err), LD_ENOTDIR);
    assert_non_null(strstr(err, dir));

    /* Permissions bind everyone but root. */
    if (geteuid() != 0) {
        assert_int_equal(chmod(t->out, 0555), 0);
        assert_int_equal(cache_build(d, t->cache, 1, NULL, NULL, NULL, err), LD_EACCES);
        assert_non_null(strstr(err, t->out));
        assert_int_equal(chmod(t->out, 0755), 0);
    }
    assert_false(exists(t->cache));
    assert_int_equal(count_temps(t->out), 0);
    dataset_free(d);
}

static void test_sweep(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    char name[600], path[4096];
    const char *hex = "0123456789abcdef";
    pid_t dead = testfs_dead_pid();

    snprintf(name, sizeof name, "a.ldcache.tmp.%d.%s", (int)dead, hex);
    testfs_write(t->out, name, 0, 0);                             /* removed */
    char keep[8][300];
    int nk = 0;
    snprintf(keep[nk++], 300, "a.ldcache.tmp.%d.%s", (int)getpid(), hex);   /* alive */
    snprintf(keep[nk++], 300, "a.ldcache.tmp.%d.%s", (int)dead, "0123456789abcdeg");
    snprintf(keep[nk++], 300, "a.ldcache.tmp.%d.%s", (int)dead, "0123456789abcde");
    snprintf(keep[nk++], 300, "a.ldcache.tmp.%dx.%s", (int)dead, hex);
    snprintf(keep[nk++], 300, ".tmp.%d.%s", (int)dead, hex);
    snprintf(keep[nk++], 300, "a.ldcache");
    for (int i = 0; i < nk; i++)
        testfs_write(t->out, keep[i], 0, 0);
    snprintf(keep[nk], 300, "b.ldcache.tmp.%d.%s", (int)dead, hex);   /* a directory */
    snprintf(path, sizeof path, "%s/%s", t->out, keep[nk++]);
    assert_int_equal(mkdir(path, 0755), 0);

    assert_int_equal(cache_sweep_temps(t->out, err), 1);
    snprintf(path, sizeof path, "%s/%s", t->out, name);
    assert_false(exists(path));
    for (int i = 0; i < nk; i++) {
        snprintf(path, sizeof path, "%s/%s", t->out, keep[i]);
        if (!exists(path))
            fail_msg("sweep removed '%s'", keep[i]);
    }
    assert_int_equal(cache_sweep_temps(t->out, err), 0);

    snprintf(path, sizeof path, "%s/nope", t->root);
    assert_int_equal(cache_sweep_temps(path, err), LD_ENOENT);
    assert_non_null(strstr(err, path));
}

static void test_set_aside(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    char bad[512], why[512], text[256] = "";
    snprintf(bad, sizeof bad, "%s.bad", t->cache);
    snprintf(why, sizeof why, "%s.bad.reason", t->cache);
    write_fixed_tree(t->src, 4, 100);
    dataset *d = open_dataset(t);

    build_ok(d, t->cache, 1);
    assert_int_equal(cache_set_aside(t->cache, "index checksum mismatch", err), 0);
    assert_false(exists(t->cache));
    cache_free(open_ok(bad, 1));
    FILE *f = fopen(why, "r");
    assert_non_null(f);
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_non_null(strstr(text, "index checksum mismatch"));

    /* One is kept: the next set-aside replaces it. */
    build_ok(d, t->cache, 2);
    assert_int_equal(cache_set_aside(t->cache, "again", err), 0);
    cache_free(open_ok(bad, 2));
    assert_int_equal(cache_set_aside(t->cache, "gone", err), LD_ENOENT);
    assert_non_null(strstr(err, t->cache));
    dataset_free(d);
}

static void test_advise(void **state)
{
    struct tdir *t = *state;
    /* Samples 0-2 small, 3 is 2 MiB, 4-5 small: 0 and 5 are far apart. */
    static const size_t sizes[] = {100, 200, 300, 2u << 20, 400, 500};
    char rel[64];
    for (unsigned i = 0; i < 6; i++) {
        snprintf(rel, sizeof rel, "c/%02u.bin", i);
        testfs_write(t->src, rel, i, sizes[i]);
    }
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 3);
    cache *c = open_ok(t->cache, 3);

    assert_int_equal(cache_advise(c, NULL, 0), 0);
    uint64_t none[] = {6, 7, UINT64_MAX};
    assert_int_equal(cache_advise(c, none, 3), 0);
    uint64_t near[] = {2, 0, 1, 1, 99};
    assert_int_equal(cache_advise(c, near, 5), 1);        /* one range for the three */
    uint64_t far[] = {5, 0};
    assert_int_equal(cache_advise(c, far, 2), 2);         /* 2 MiB apart: two ranges */
    uint64_t all[] = {5, 4, 3, 2, 1, 0};
    assert_int_equal(cache_advise(c, all, 6), 1);
    uint64_t many[1000];
    for (int i = 0; i < 1000; i++)
        many[i] = (uint64_t)(i * 7919) % 9;               /* in range and out */
    assert_true(cache_advise(c, many, 1000) >= 1);
    uint64_t hits;
    cache_hits(c, &hits, NULL);
    assert_int_equal(hits, 0);                            /* advice is not service */
    check_equal(d, c);
    cache_free(c);
    dataset_free(d);
}

/* ---- datasets that cannot be cached ------------------------------------------------- */

struct fake {
    struct dataset base;
    int fail_at;                    /* read_raw fails at this sample (-1: never) */
    bool short_read;
};

static uint64_t fake_raw_bytes(const dataset *d, uint64_t index)
{
    return 10 + index;
}

static int fake_read_raw(const dataset *d, uint64_t index, void *buf, uint64_t cap,
                         uint64_t *ret_len, int64_t *ret_label, char *errbuf)
{
    const struct fake *f = (const struct fake *)d;
    if ((int)index == f->fail_at) {
        ld_errorf(errbuf, "sample %" PRIu64 " (gone.bin): No such file or directory", index);
        return LD_ESAMPLE;
    }
    memset(buf, (int)index, 10 + index);
    *ret_len = f->short_read ? 5 : 10 + index;
    *ret_label = (int64_t)index;
    return 0;
}

static const struct dataset_ops fake_ops = {
    .kind = "fake",
    .raw_bytes = fake_raw_bytes,
    .read_raw = fake_read_raw,
};
static const struct dataset_ops fake_ops_uncacheable = {.kind = "token_windows"};

static void test_refused(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    struct fake f = {.base = {.ops = &fake_ops, .name = "fake", .count = 0, .n_fields = 1},
                     .fail_at = -1};
    f.base.fields[0] = (struct dataset_field){.name = "bytes", .dtype = LD_DTYPE_UINT8,
                                              .ragged = true, .max_item_bytes = 100};

    assert_int_equal(cache_build(&f.base, t->cache, 1, NULL, NULL, NULL, err), LD_EINVAL);
    assert_non_null(strstr(err, "no samples"));

    f.base.ops = &fake_ops_uncacheable;
    f.base.count = 5;
    assert_int_equal(cache_build(&f.base, t->cache, 1, NULL, NULL, NULL, err), LD_ENOTSUP);
    assert_non_null(strstr(err, "cannot be cached"));

    /* A sample that cannot be read fails the build with its own message. */
    f.base.ops = &fake_ops;
    f.fail_at = 3;
    assert_int_equal(cache_build(&f.base, t->cache, 1, NULL, NULL, NULL, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "sample 3 (gone.bin)"));
    f.fail_at = -1;
    f.short_read = true;
    assert_int_equal(cache_build(&f.base, t->cache, 1, NULL, NULL, NULL, err), LD_EDATASET);
    assert_non_null(strstr(err, "sample 0 read 5 bytes"));
    assert_false(exists(t->cache));
    assert_int_equal(count_temps(t->out), 0);

    /* A layout without a label field: labels as the kind gave them, label_field -1. */
    f.short_read = false;
    build_ok(&f.base, t->cache, 1);
    cache *c = open_ok(t->cache, 1);
    assert_int_equal(cache_meta(c)->label_field, -1);
    assert_string_equal(cache_meta(c)->kind, "fake");
    const void *p;
    uint64_t len;
    int64_t label;
    assert_int_equal(cache_sample(c, 4, &p, &len, &label), 0);
    assert_int_equal(len, 14);
    assert_int_equal(label, 4);
    assert_int_equal(((const uint8_t *)p)[13], 4);
    verify_ok(c);
    cache_free(c);
}

/* ---- threads ------------------------------------------------------------------------ */

struct reader {
    pthread_t thread;
    cache *c;
    int bad;
};

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    for (int round = 0; round < 20; round++)
        for (uint64_t i = 0; i < cache_meta(rd->c)->count; i++) {
            const void *p;
            uint64_t len;
            int64_t label;
            if (cache_sample(rd->c, i, &p, &len, &label) != 0 || len != 256 ||
                ((const uint8_t *)p)[255] != testfs_byte((unsigned)i, 255))
                rd->bad++;
            cache_advise(rd->c, &i, 1);
        }
    return NULL;
}

static void test_concurrent_reads(void **state)
{
    struct tdir *t = *state;
    char rel[64];
    for (unsigned i = 0; i < 50; i++) {
        snprintf(rel, sizeof rel, "%04u.bin", i);
        testfs_write(t->src, rel, i, 256);
    }
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 1);
    cache *c = open_ok(t->cache, 1);
    struct reader rd[2] = {{.c = c}, {.c = c}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&rd[i].thread, NULL, reader_main, &rd[i]), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(rd[i].thread, NULL), 0);
        assert_int_equal(rd[i].bad, 0);
    }
    uint64_t hits, bytes;
    cache_hits(c, &hits, &bytes);
    assert_int_equal(hits, 2 * 20 * 50);
    assert_int_equal(bytes, 2 * 20 * 50 * 256);
    cache_free(c);
    dataset_free(d);
}



/* ---- two builders, and files cut short under a reader ---------------------------------- */

/* Two processes build the same path at once: each writes its own temporary file and
 * renames it over the path, so the survivor is whole and nothing is left behind. */
static void test_two_builders(void **state)
{
    struct tdir *t = *state;
    write_fixed_tree(t->src, 300, 1000);
    dataset *d = open_dataset(t);
    uint64_t fp = fingerprint(d, DATASET_FINGERPRINT_STAT);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[LD_ERRMSG_MAX];
        _exit(cache_build(d, t->cache, fp, NULL, NULL, NULL, err) == 0 ? 0 : 1);
    }
    build_ok(d, t->cache, fp);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    cache *c = open_ok(t->cache, fp);
    verify_ok(c);
    check_equal(d, c);
    cache_free(c);
    assert_int_equal(count_temps(t->out), 0);
    dataset_free(d);
}

/* A cache truncated in place while mapped: reads past the new end fail with LD_EIO and
 * mark the cache bad instead of raising SIGBUS; verify says truncated. */
static void test_truncated_under_reader(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 64, 8192);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 1);
    cache *c = open_ok(t->cache, 1);
    uint8_t buf[8192];
    uint64_t len, bad = 0;
    int64_t label;
    assert_int_equal(cache_read(c, 63, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(cache_bad(c, NULL), CACHE_BAD_NONE);
    assert_int_equal(truncate(t->cache, 3 * 4096), 0);
    /* Prefetching the samples (and the index entries) now past the end is a hint that
     * never faults, even where the index itself is gone. */
    uint64_t all[64];
    for (uint64_t i = 0; i < 64; i++)
        all[i] = 63 - i;
    cache_prefetch(c, all, 64);
    assert_int_equal(cache_read(c, 60, buf, sizeof buf, &len, &label, true, err), LD_EIO);
    assert_non_null(strstr(err, "truncated"));
    assert_int_equal(cache_bad(c, &bad), CACHE_BAD_TRUNCATED);
    assert_true(bad == 60 || bad >= 1); /* the index page itself may be the one gone */
    assert_int_equal(cache_verify(c, NULL, NULL, NULL, err), LD_ECACHE);
    assert_non_null(strstr(err, "truncated"));
    /* The guard is per read: the daemon's other work goes on. */
    assert_int_equal(cache_read(c, 60, buf, sizeof buf, &len, &label, true, err), LD_EIO);
    cache_free(c);
    dataset_free(d);
}

/* A packed file cut short under its dataset: the workers' prefetch (the kind's op)
 * never faults, and the read past the new end is the stream's error. */
static void test_packed_prefetch_truncated(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 64, 8192);
    dataset *src = open_dataset(t);
    build_ok(src, t->cache, 1);
    struct config_dataset cfg = {.name = "pk", .kind = CONFIG_DATASET_PACKED, .path = t->cache,
                                 .on_error = CONFIG_ON_ERROR_FAIL};
    dataset *d = NULL;
    assert_int_equal(dataset_open(&cfg, &d, err), 0);
    assert_non_null(d->ops->prefetch);
    uint64_t all[66];
    for (uint64_t i = 0; i < 66; i++)
        all[i] = 65 - i; /* the first two out of range */
    d->ops->prefetch(d, all, 66);
    assert_int_equal(truncate(t->cache, 3 * 4096), 0);
    d->ops->prefetch(d, all, 66);
    uint8_t buf[8192];
    int64_t label = 0;
    void *dst[2] = {buf, &label};
    assert_int_equal(d->ops->read(d, 60, dst, err), LD_EDATASET);
    assert_non_null(strstr(err, "truncated"));
    dataset_free(d);
    dataset_free(src);
}

/* An index entry rewritten in place after open to point outside the file is never
 * followed: the read, the zero-copy view and verify each fail with a message that says
 * so, and the cache is marked bad (the keeper sets it aside). */
static void test_index_entry_outside_file(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 16, 1000);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 1);
    cache *c = open_ok(t->cache, 1);
    uint8_t buf[1000];
    uint64_t len;
    int64_t label;
    assert_int_equal(cache_read(c, 5, buf, sizeof buf, &len, &label, true, err), 0);

    struct cache_header h;
    int fd = open(t->cache, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
    struct cache_index_entry e;
    off_t at = (off_t)(h.index_offset + 5 * sizeof e);
    assert_int_equal(pread(fd, &e, sizeof e, at), (ssize_t)sizeof e);
    e.offset = UINT64_C(1) << 40; /* far past the mapping */
    assert_int_equal(pwrite(fd, &e, sizeof e, at), (ssize_t)sizeof e);
    close(fd);

    assert_int_equal(cache_read(c, 5, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_non_null(strstr(err, "sample 5: its index entry"));
    assert_non_null(strstr(err, "outside the file"));
    uint64_t bad = 0;
    assert_int_equal(cache_bad(c, &bad), CACHE_BAD_INDEX);
    assert_int_equal(bad, 5);
    const void *p = NULL;
    assert_int_equal(cache_sample(c, 5, &p, &len, &label), LD_ECACHE);
    assert_null(p);
    assert_int_equal(cache_verify(c, NULL, NULL, NULL, err), LD_ECACHE);
    assert_non_null(strstr(err, "outside the file"));
    /* An entry whose length runs past the end, the offset inside. */
    fd = open(t->cache, O_RDWR);
    e.offset = h.data_offset;
    e.length = UINT64_MAX - 8;
    assert_int_equal(pwrite(fd, &e, sizeof e, at), (ssize_t)sizeof e);
    close(fd);
    assert_int_equal(cache_read(c, 5, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_non_null(strstr(err, "outside the file"));
    /* The other samples are still served. */
    assert_int_equal(cache_read(c, 6, buf, sizeof buf, &len, &label, true, err), 0);
    cache_free(c);
    dataset_free(d);
}

/* A flipped sample byte is found when the sample is served, not only by verify. */
static void test_checked_when_served(void **state)
{
    struct tdir *t = *state;
    char err[LD_ERRMSG_MAX] = "";
    write_fixed_tree(t->src, 8, 300);
    dataset *d = open_dataset(t);
    build_ok(d, t->cache, 1);
    cache *c = open_ok(t->cache, 1);
    flip_byte(t->cache, CACHE_HEADER_SIZE + 3 * align_to(300) + 17); /* sample 3 */
    unsigned file3 = 0;
    while (sample_of(d, file3) != 3)
        file3++;
    uint8_t buf[300];
    uint64_t len, bad = 99;
    int64_t label;
    assert_int_equal(cache_read(c, 2, buf, sizeof buf, &len, &label, true, err), 0);
    assert_int_equal(cache_read(c, 3, buf, sizeof buf, &len, &label, true, err), LD_ECACHE);
    assert_non_null(strstr(err, "sample 3 "));
    assert_int_equal(cache_bad(c, &bad), CACHE_BAD_CHECKSUM);
    assert_int_equal(bad, 3);
    /* dataset_read given this cache serves the source's bytes instead. */
    int64_t lab2 = -7;
    void *dst[2] = {buf, &lab2};
    struct dataset_read_ctx ctx = {.cache = c};
    assert_int_equal(dataset_read(d, 3, &ctx, dst, NULL, err), 0);
    for (size_t j = 0; j < sizeof buf; j++)
        if (buf[j] != testfs_byte(file3, j))
            fail_msg("byte %zu of sample 3 is not the source's", j);
    cache_free(c);
    dataset_free(d);
}

/* A token_windows file shrunk in place under the mapping: the read fails with
 * LD_EDATASET naming the file, no SIGBUS, and dataset_read does not replace it. */
static void test_tokens_shrunk(void **state)
{
    struct tdir *t = *state;
    char path[600], err[LD_ERRMSG_MAX] = "";
    snprintf(path, sizeof path, "%s/tokens.bin", t->root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (unsigned i = 0; i < 64 * 1024; i++) {
        uint16_t tok = (uint16_t)(i * 7u);
        assert_int_equal(fwrite(&tok, 2, 1, f), 1);
    }
    fclose(f);
    struct config_dataset cfg = {.name = "tok", .kind = CONFIG_DATASET_TOKEN_WINDOWS, .path = path,
                                 .token_dtype = LD_DTYPE_UINT16, .context = 1023, .stride = 1023,
                                 .on_error = CONFIG_ON_ERROR_REPLACE};
    dataset *d = NULL;
    assert_int_equal(dataset_open(&cfg, &d, err), 0);
    uint16_t win[1024];
    void *dst[1] = {win};
    struct dataset_read_ctx ctx = {0};
    uint64_t last = d->count - 1;
    assert_int_equal(dataset_read(d, last, &ctx, dst, NULL, err), 0);
    assert_int_equal(truncate(path, 4096), 0);
    assert_int_equal(dataset_read(d, last, &ctx, dst, NULL, err), LD_EDATASET);
    assert_non_null(strstr(err, "shrank"));
    assert_non_null(strstr(err, path));
    assert_int_equal(atomic_load(&d->replaced_samples), 0);
    assert_int_equal(dataset_read(d, 0, &ctx, dst, NULL, err), 0); /* the first page is still there */
    dataset_free(d);
}

int main(void)
{
    ld_log_set_level(LD_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_hash_is_xxh3),
        cmocka_unit_test_setup_teardown(test_fixed_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebuild_while_mapped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_footer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fingerprint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_advise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_builders, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_under_reader, setup, teardown),
        cmocka_unit_test_setup_teardown(test_packed_prefetch_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_entry_outside_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checked_when_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_shrunk, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
