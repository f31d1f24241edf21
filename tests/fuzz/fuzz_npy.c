/* fuzz_npy — libFuzzer harness for the .npy header parser and reader (daemon/npy.c),
 * which a worker runs on every file of a `format: npy` dataset.
 *
 * Each input is a whole file. npy_parse sees it in a buffer of exactly its size, so a
 * read past the header's real end is an ASan report; a header it accepts must describe
 * a layout we can serve (at most LD_MAX_DIMS dimensions, a known dtype, data within
 * NPY_DATA_MAX, an offset within the input). The same bytes are then read as a file
 * (a memfd) by npy_read against the parsed layout, which must serve exactly the data
 * that follows the header or refuse. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ld_error.h"
#include "npy.h"
#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static int memfd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[LD_ERRMSG_MAX], desc[128];
    struct npy_header h;
    uint8_t *copy = malloc(size ? size : 1);
    check(copy != NULL);
    memcpy(copy, data, size);
    int r = npy_parse(copy, size, &h, err);
    free(copy);
    if (r < 0) {
        check(r == LD_ESAMPLE || r == LD_ENOTSUP);
        check(err[0] != '\0');
        return 0;
    }
    check(h.ndim >= 0 && h.ndim <= LD_MAX_DIMS);
    check(proto_dtype_size(h.dtype) > 0);
    check(h.data_bytes <= NPY_DATA_MAX);
    check(h.data_offset <= size && h.data_offset <= NPY_HEADER_MAX);
    check(strlen(npy_describe(&h, desc, sizeof desc)) < sizeof desc);

    if (h.data_bytes > (1u << 20))
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_npy", MFD_CLOEXEC);
        check(memfd >= 0);
    }
    check(ftruncate(memfd, 0) == 0);
    check(pwrite(memfd, data, size, 0) == (ssize_t)size);
    uint8_t *out = malloc(h.data_bytes ? h.data_bytes : 1);
    check(out != NULL);
    r = npy_read(memfd, size, &h, out, err);
    if (r == 0) {
        check(h.data_offset + h.data_bytes == size);
        check(memcmp(out, data + h.data_offset, h.data_bytes) == 0);
    } else {
        check(r == LD_ESAMPLE && h.data_offset + h.data_bytes != size);
    }
    free(out);
    return 0;
}
