/* Unit tests for the tar reader (tar.c) and the shards' member index (tar_index.c):
 * ustar names and prefixes, pax paths and sizes, GNU long names, entries that are not
 * files stepped over, base-256 sizes; every corrupt archive (a bad checksum, a cut
 * header, data cut short, a malformed pax record, an extended header with no member)
 * refused with the byte offset; an index saved and loaded whole with its small members'
 * bytes, and an index file that is cut, flipped or absent ignored. Shards written by
 * Python's tarfile are read end to end in client/python/tests/test_sources_tar.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <sys/mman.h>

#include "ld_error.h"
#include "ld_wire.h"
#include "tar.h"
#include "tar_index.h"
#include "tar_fixtures.h"

#define CAP (64 * 1024)

struct seen {
    char names[8][TAR_NAME_MAX];
    uint64_t offset[8], size[8], header[8];
    int n;
};

static int collect(void *ctx, const struct tar_member *m)
{
    struct seen *s = ctx;
    assert_true(s->n < 8);
    snprintf(s->names[s->n], TAR_NAME_MAX, "%s", m->name);
    s->offset[s->n] = m->offset;
    s->size[s->n] = m->size;
    s->header[s->n] = m->header_offset;
    s->n++;
    return 0;
}

/* A memfd holding len bytes of buf. */
static int memfile(const uint8_t *buf, size_t len)
{
    int fd = memfd_create("test_tar", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, buf, len, 0), (ssize_t)len);
    return fd;
}

static int walk(const uint8_t *buf, size_t len, struct seen *s, char *err)
{
    int fd = memfile(buf, len);
    memset(s, 0, sizeof *s);
    err[0] = '\0';
    int r = tar_walk(fd, len, collect, s, err);
    close(fd);
    return r;
}

static void test_members(void **state)
{
    (void)state;
    static uint8_t buf[CAP];
    size_t len = 0;
    char longname[300], err[LD_ERRMSG_MAX];
    memset(longname, 'a', 250);
    strcpy(longname + 250, "/000001.jpg");
    tar_fixture_add(buf, &len, CAP, "dir/", NULL, 0, '5');
    long a = tar_fixture_add(buf, &len, CAP, "000000.cls", "7", 1, '0');
    long p = tar_fixture_add_pax(buf, &len, CAP, "path", longname, "short.jpg", "JPEGDATA", 8);
    /* A GNU long name, then an old-style regular file (type NUL). */
    tar_fixture_add(buf, &len, CAP, "././@LongLink", "x/000002.seg.npy", 17, 'L');
    tar_fixture_add(buf, &len, CAP, "ignored", "NPY", 3, '\0');
    tar_fixture_add(buf, &len, CAP, "link", NULL, 0, '2');
    tar_fixture_end(buf, &len, CAP);
    struct seen s;
    assert_int_equal(walk(buf, len, &s, err), 0);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.names[0], "000000.cls");
    assert_int_equal(s.offset[0], (uint64_t)a + 512);
    assert_int_equal(s.size[0], 1);
    assert_string_equal(s.names[1], longname);
    assert_int_equal(s.header[1], (uint64_t)p - 1024);       /* its pax header's */
    assert_int_equal(s.offset[1], (uint64_t)p + 512);
    assert_int_equal(s.size[1], 8);
    assert_memory_equal(buf + s.offset[1], "JPEGDATA", 8);
    assert_string_equal(s.names[2], "x/000002.seg.npy");
    assert_memory_equal(buf + s.offset[2], "NPY", 3);
    /* No end marker at all: accepted at a header boundary. */
    assert_int_equal(walk(buf, len - 1024, &s, err), 0);
    assert_int_equal(s.n, 3);
}

static void test_sizes(void **state)
{
    (void)state;
    static uint8_t buf[CAP];
    size_t len = 0;
    char err[LD_ERRMSG_MAX];
    struct seen s;
    /* pax `size` overrides the header's (which says 0 here). */
    long at = tar_fixture_add(buf, &len, CAP, "PaxHeader", "12 size=600\n", 12, 'x');
    (void)at;
    tar_fixture_header(buf + len, "big.bin", 0, '0');
    len += 512;
    memset(buf + len, 'z', 1024);
    len += 1024;
    tar_fixture_end(buf, &len, CAP);
    assert_int_equal(walk(buf, len, &s, err), 0);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.size[0], 600);
    /* A base-256 size. */
    len = 0;
    tar_fixture_add(buf, &len, CAP, "b256.bin", "abcdefgh", 8, '0');
    memset(buf + 124, 0, 12);
    buf[124] = 0x80;
    buf[135] = 8;
    memset(buf + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += buf[i];
    snprintf((char *)buf + 148, 8, "%06o", sum);
    tar_fixture_end(buf, &len, CAP);
    assert_int_equal(walk(buf, len, &s, err), 0);
    assert_int_equal(s.size[0], 8);
}

static void refused(const uint8_t *buf, size_t len, const char *needle)
{
    char err[LD_ERRMSG_MAX];
    struct seen s;
    int r = walk(buf, len, &s, err);
    assert_int_equal(r, LD_EDATASET);
    if (!strstr(err, needle))
        fail_msg("'%s' does not say '%s'", err, needle);
}

static void test_corrupt(void **state)
{
    (void)state;
    static uint8_t buf[CAP], bad[CAP];
    size_t len = 0;
    tar_fixture_add(buf, &len, CAP, "a.bin", "0123456789", 10, '0');
    long b = tar_fixture_add(buf, &len, CAP, "b.bin", "abc", 3, '0');
    tar_fixture_end(buf, &len, CAP);
    memcpy(bad, buf, len);
    bad[b + 3] ^= 1;
    char want[128];
    snprintf(want, sizeof want, "offset %ld: not a tar header (bad checksum)", b);
    refused(bad, len, want);
    snprintf(want, sizeof want, "offset %ld: truncated: 100 bytes", b);
    refused(buf, (size_t)b + 100, want);
    snprintf(want, sizeof want, "offset %ld: truncated: the member claims 3 bytes, the file has 2", b);
    refused(buf, (size_t)b + 514, want);
    refused(buf, (size_t)b + 600, "cut short");
    /* A size field that is not octal. */
    memcpy(bad, buf, len);
    memcpy(bad + b + 124, "00000000x03", 11);
    memset(bad + b + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += bad[b + i];
    snprintf((char *)bad + b + 148, 8, "%06o", sum);
    refused(bad, len, "bad size field");
    /* pax: a record whose length lies, one without '=', and a header with no member. */
    len = 0;
    tar_fixture_add(buf, &len, CAP, "PaxHeader", "99 path=x\n", 10, 'x');
    tar_fixture_add(buf, &len, CAP, "x", "1", 1, '0');
    refused(buf, len, "offset 0: malformed pax extended header record");
    len = 0;
    tar_fixture_add(buf, &len, CAP, "PaxHeader", "8 pathx\n", 8, 'x');
    tar_fixture_add(buf, &len, CAP, "x", "1", 1, '0');
    refused(buf, len, "without '='");
    len = 0;
    tar_fixture_add(buf, &len, CAP, "PaxHeader", "10 path=x\n", 10, 'x');
    refused(buf, len, "ends after an extended header");
    /* Garbage. */
    memset(bad, 0x41, 2048);
    refused(bad, 2048, "offset 0: not a tar header");
}

static void test_index_file(void **state)
{
    (void)state;
    static uint8_t buf[CAP];
    char dir[256], path[300], err[LD_ERRMSG_MAX];
    size_t len = 0;
    assert_int_equal(testfs_mkdtemp("test_tar", dir, sizeof dir), 0);
    tar_fixture_add(buf, &len, CAP, "k1.jpg", "JPEG-ONE", 8, '0');
    tar_fixture_add(buf, &len, CAP, "k1.cls", "3\n", 2, '0');
    static uint8_t large[100];
    memset(large, 'L', sizeof large);
    tar_fixture_add(buf, &len, CAP, "k2.bin", large, sizeof large, '0');
    tar_fixture_end(buf, &len, CAP);
    int fd = memfile(buf, len);
    struct tar_shard_index s[2] = {{0}};
    s[0].name = strdup("a.tar");
    s[0].size = len;
    s[0].mtime = (struct timespec){1700000000, 42};
    assert_int_equal(tar_index_scan(fd, len, &s[0], err), 0);
    close(fd);
    assert_int_equal(s[0].n_entries, 3);
    assert_int_equal(s[0].entries[2].data_off, TAR_INDEX_NONE);     /* larger than TAR_INDEX_INLINE */
    s[1].name = strdup("empty.tar");
    snprintf(path, sizeof path, "%s/x.tarindex", dir);
    assert_int_equal(tar_index_save(path, s, 2, err), 0);

    struct tar_shard_index *got = NULL;
    size_t n = 0;
    assert_int_equal(tar_index_load(path, &got, &n, err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(got[0].name, "a.tar");
    assert_int_equal(got[0].size, len);
    assert_int_equal(got[0].mtime.tv_nsec, 42);
    assert_int_equal(got[0].n_entries, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(got[0].entries[i].offset, s[0].entries[i].offset);
        assert_int_equal(got[0].entries[i].size, s[0].entries[i].size);
        assert_string_equal(got[0].pool + got[0].entries[i].name_off, s[0].pool + s[0].entries[i].name_off);
    }
    assert_memory_equal(got[0].pool + got[0].entries[1].data_off, "3\n", 2);
    assert_int_equal(got[1].n_entries, 0);
    tar_index_free(got, n);

    /* Flipped, cut or absent: no shard, and a reason. */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    int wfd = open(path, O_RDWR);
    uint8_t c;
    assert_int_equal(pread(wfd, &c, 1, 40), 1);
    c ^= 0xff;
    assert_int_equal(pwrite(wfd, &c, 1, 40), 1);
    got = NULL;
    assert_int_equal(tar_index_load(path, &got, &n, err), 0);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "checksum"));
    tar_index_free(got, n);
    assert_int_equal(ftruncate(wfd, st.st_size / 2), 0);
    close(wfd);
    assert_int_equal(tar_index_load(path, &got, &n, err), 0);
    assert_int_equal(n, 0);
    tar_index_free(got, n);
    unlink(path);
    assert_int_equal(tar_index_load(path, &got, &n, err), 0);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "cannot open"));
    tar_index_free(got, n);
    tar_shard_index_clear(&s[0]);
    tar_shard_index_clear(&s[1]);
    testfs_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_members),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_index_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
