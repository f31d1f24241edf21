/* Unit tests for npy: headers as numpy writes them (versions 1.0, 2.0 and 3.0, the
 * padding, trailing commas, either quote) parse to the right dtype and shape; every
 * hostile or unsupported header (wrong magic, truncated, a header length that lies,
 * a shape that overflows, Fortran order, object, structured and big-endian dtypes,
 * unknown and duplicate keys) is refused with a message that says which; npy_read
 * serves exactly the array and refuses a file of another layout or size. Files
 * written by numpy itself are read end to end in client/python/tests/test_sources_npy.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testfs.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ld_error.h"
#include "npy.h"

/* A .npy file as numpy lays it out: magic, version, header length, the dict padded
 * with spaces to a multiple of 64 and ended by '\n'. Returns its length in out. */
static size_t make_npy(uint8_t *out, size_t cap, int major, const char *dict)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t dlen = strlen(dict);
    size_t total = (prefix + dlen + 1 + 63) / 64 * 64;
    assert_true(total <= cap);
    size_t hlen = total - prefix;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    out[8] = (uint8_t)hlen;
    out[9] = (uint8_t)(hlen >> 8);
    if (major != 1) {
        out[10] = (uint8_t)(hlen >> 16);
        out[11] = (uint8_t)(hlen >> 24);
    }
    memcpy(out + prefix, dict, dlen);
    memset(out + prefix + dlen, ' ', total - prefix - dlen - 1);
    out[total - 1] = '\n';
    return total;
}

static int parse(const char *dict, int major, struct npy_header *h, char *err)
{
    uint8_t buf[512];
    size_t n = make_npy(buf, sizeof buf, major, dict);
    err[0] = '\0';
    return npy_parse(buf, n, h, err);
}

/* Expects `code` and a message that contains `needle`. */
static void refused(const char *dict, int code, const char *needle)
{
    struct npy_header h;
    char err[LD_ERRMSG_MAX];
    int r = parse(dict, 1, &h, err);
    if (r != code || !strstr(err, needle))
        fail_msg("%s: got %d '%s', expected %d with '%s'", dict, r, err, code, needle);
}

static void test_parse_numpy_headers(void **state)
{
    (void)state;
    struct npy_header h;
    char err[LD_ERRMSG_MAX], desc[64];

    /* Exactly what numpy 1.24 writes for np.zeros((3, 32, 32), np.float32). */
    assert_int_equal(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 32, 32), }", 1, &h, err), 0);
    assert_int_equal(h.dtype, LD_DTYPE_FLOAT32);
    assert_int_equal(h.ndim, 3);
    assert_int_equal(h.shape[0], 3);
    assert_int_equal(h.shape[2], 32);
    assert_int_equal(h.data_offset, 128);
    assert_int_equal(h.data_bytes, 3 * 32 * 32 * 4);
    assert_string_equal(npy_describe(&h, desc, sizeof desc), "float32[3,32,32]");

    /* A one-element tuple, a scalar, the other versions, double quotes, no trailing comma. */
    assert_int_equal(parse("{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }", 2, &h, err), 0);
    assert_int_equal(h.dtype, LD_DTYPE_UINT8);
    assert_int_equal(h.ndim, 1);
    assert_int_equal(h.shape[0], 5);
    assert_int_equal(h.data_offset, 128);
    assert_int_equal(parse("{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": ()}", 3, &h, err), 0);
    assert_int_equal(h.dtype, LD_DTYPE_INT64);
    assert_int_equal(h.ndim, 0);
    assert_int_equal(h.data_bytes, 8);
    assert_string_equal(npy_describe(&h, desc, sizeof desc), "int64[]");
    /* Keys in another order; bool is served as uint8; Fortran order of a vector is C order. */
    assert_int_equal(parse("{'shape': (7,), 'fortran_order': True, 'descr': '|b1'}", 1, &h, err), 0);
    assert_int_equal(h.dtype, LD_DTYPE_UINT8);
    assert_int_equal(parse("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3, 4, 5), }", 1, &h, err), 0);
    assert_int_equal(h.dtype, LD_DTYPE_FLOAT16);
    assert_int_equal(h.data_bytes, 2 * 3 * 4 * 5 * 2);
    assert_int_equal(parse("{'descr': '<u2', 'fortran_order': False, 'shape': (0, 4), }", 1, &h, err), 0);
    assert_int_equal(h.data_bytes, 0);
}

static void test_parse_refuses_unsupported(void **state)
{
    (void)state;
    refused("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", LD_ENOTSUP, "Fortran");
    refused("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", LD_ENOTSUP, "object array");
    refused("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (3,), }", LD_ENOTSUP,
            "structured");
    refused("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", LD_ENOTSUP, "big-endian");
    refused("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", LD_ENOTSUP, "astype(np.float32)");
    refused("{'descr': '<U5', 'fortran_order': False, 'shape': (3,), }", LD_ENOTSUP, "not one loaderd serves");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 4, 5), }", LD_ENOTSUP,
            "more than 4 dimensions");
}

static void test_parse_refuses_hostile(void **state)
{
    (void)state;
    /* A shape whose product overflows, and one merely too large to be a sample. */
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387903, 4611686018427387903), }",
            LD_ESAMPLE, "holds more than");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }", LD_ESAMPLE,
            "holds more than");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", LD_ESAMPLE,
            "too large");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", LD_ESAMPLE, "dimension");
    refused("{'descr': '<f4', 'fortran_order': False, }", LD_ESAMPLE, "lacks 'shape'");
    refused("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", LD_ESAMPLE,
            "duplicate key 'descr'");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'evil': 1}", LD_ESAMPLE,
            "unknown key 'evil'");
    refused("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (3,), }", LD_ESAMPLE, "True or False");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } junk", LD_ESAMPLE, "only padding");
    refused("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3,), }", LD_ESAMPLE, "without escapes");
    refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3,", LD_ESAMPLE, "expected");
    refused("__import__('os').system('true')", LD_ESAMPLE, "'{' (a dict)");

    struct npy_header h;
    char err[LD_ERRMSG_MAX];
    uint8_t buf[512];
    size_t n = make_npy(buf, sizeof buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
    /* Not a .npy file; an unknown version; cut inside the prefix and inside the header. */
    assert_int_equal(npy_parse("PK\3\4 a zip file", 16, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "magic"));
    buf[6] = 4;
    assert_int_equal(npy_parse(buf, n, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "version 4.0"));
    buf[6] = 1;
    assert_int_equal(npy_parse(buf, 9, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "truncated"));
    assert_int_equal(npy_parse(buf, n - 1, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "truncated"));
    /* A header length that lies: longer than the file, and (version 2) past our bound. */
    buf[8] = 0xff;
    buf[9] = 0x7f;
    assert_int_equal(npy_parse(buf, n, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "truncated"));
    n = make_npy(buf, sizeof buf, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
    buf[11] = 0x80;
    uint64_t total;
    assert_int_equal(npy_header_length(buf, n, &total, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "over the"));
    /* A header length that is short: the dict is cut, which is an error, not a read past it. */
    n = make_npy(buf, sizeof buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
    buf[8] = 20;
    buf[9] = 0;
    assert_int_equal(npy_parse(buf, n, &h, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "end of the header"));
}

static int write_file(const char *dir, const char *name, const void *a, size_t na, const void *b, size_t nb)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, a, na), (ssize_t)na);
    if (nb)
        assert_int_equal(write(fd, b, nb), (ssize_t)nb);
    return fd;
}

static void test_read(void **state)
{
    (void)state;
    char dir[256], err[LD_ERRMSG_MAX];
    assert_int_equal(testfs_mkdtemp("ld-test-npy", dir, sizeof dir), 0);
    uint8_t head[512];
    float data[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 42.0f}, out[7];
    size_t n = make_npy(head, sizeof head, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    int fd = write_file(dir, "a.npy", head, n, data, sizeof data);
    struct npy_header want;
    assert_int_equal(npy_read_header(fd, n + sizeof data, &want, err), 0);
    memset(out, 0x55, sizeof out);
    assert_int_equal(npy_read(fd, n + sizeof data, &want, out, err), 0);
    assert_memory_equal(out, data, sizeof data);
    uint32_t canary;
    memcpy(&canary, &out[6], sizeof canary);
    assert_int_equal(canary, 0x55555555u); /* nothing past the array */
    /* The file claims more (or less) than it holds. */
    assert_int_equal(npy_read(fd, n + sizeof data - 4, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "promises"));
    close(fd);

    /* Another shape, another dtype: the message names both layouts. */
    n = make_npy(head, sizeof head, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }");
    fd = write_file(dir, "b.npy", head, n, data, sizeof data);
    assert_int_equal(npy_read(fd, n + sizeof data, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "float32[3,2], the dataset's field is float32[2,3]"));
    close(fd);
    n = make_npy(head, sizeof head, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }");
    fd = write_file(dir, "c.npy", head, n, data, sizeof data);
    assert_int_equal(npy_read(fd, n + sizeof data, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "int32[2,3]"));
    close(fd);
    /* Fortran order met at read time is a bad sample, not "unsupported". */
    n = make_npy(head, sizeof head, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }");
    fd = write_file(dir, "d.npy", head, n, data, sizeof data);
    assert_int_equal(npy_read(fd, n + sizeof data, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "Fortran"));
    close(fd);

    /* A long header (over the first page read): version 2, 5000 bytes of padding. */
    static uint8_t longhead[8192];
    memcpy(longhead, "\x93NUMPY\2\0", 8);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    size_t total = 5056, hlen = total - 12;
    longhead[8] = (uint8_t)hlen;
    longhead[9] = (uint8_t)(hlen >> 8);
    longhead[10] = longhead[11] = 0;
    memset(longhead + 12, ' ', hlen);
    memcpy(longhead + 12, dict, strlen(dict));
    longhead[total - 1] = '\n';
    fd = write_file(dir, "e.npy", longhead, total, data, sizeof data);
    assert_int_equal(npy_read(fd, total + sizeof data, &want, out, err), 0);
    assert_memory_equal(out, data, sizeof data);
    /* The same file cut inside its long header. */
    assert_int_equal(ftruncate(fd, 4500), 0);
    assert_int_equal(npy_read(fd, 4500, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "truncated"));
    close(fd);
    /* An empty file. */
    fd = write_file(dir, "f.npy", "", 0, NULL, 0);
    assert_int_equal(npy_read(fd, 0, &want, out, err), LD_ESAMPLE);
    assert_non_null(strstr(err, "magic"));
    close(fd);
    assert_int_equal(testfs_rmtree(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_numpy_headers),
        cmocka_unit_test(test_parse_refuses_unsupported),
        cmocka_unit_test(test_parse_refuses_hostile),
        cmocka_unit_test(test_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
