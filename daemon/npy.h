/* npy — numpy's .npy file header, read strictly.
 *
 * A .npy file is a magic string, a version, a header length, a Python dict literal
 * ({'descr': '<f4', 'fortran_order': False, 'shape': (3, 32, 32), }) and the array's
 * bytes. The parser accepts exactly what numpy writes (versions 1.0, 2.0 and 3.0) and
 * maps the element type to one of our dtypes; anything else (Fortran order, object or
 * structured dtypes, big-endian data, a shape that overflows) is refused with a message
 * that says what and why. It never trusts a length it read: every offset is checked
 * against the bytes actually there, so a truncated or lying header is an error, never a
 * read past the buffer. Pure functions, any thread. */
#ifndef LD_NPY_H
#define LD_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ld_wire.h"

/* The fixed part: magic (6), version (2), header length (2 in 1.0, 4 in 2.0 and 3.0). */
#define NPY_PREFIX_MAX 12u
/* The largest header we read (numpy itself refuses more than 10,000 bytes by default). */
#define NPY_HEADER_MAX 65536u
/* The largest array one sample may hold: a header that claims more is refused. */
#define NPY_DATA_MAX (UINT64_C(1) << 40)

struct npy_header {
    int dtype;                      /* LD_DTYPE_* */
    int ndim;                       /* 0 for a scalar */
    int64_t shape[LD_MAX_DIMS];
    uint64_t data_offset;           /* where the array's bytes start in the file */
    uint64_t data_bytes;            /* product of the shape times the element size */
};

/* From the first `len` bytes of a file (at least NPY_PREFIX_MAX, or the whole file when
 * it is shorter): how many bytes the magic, version and header take, so the caller
 * knows how much to read before npy_parse. LD_ESAMPLE with the reason in errbuf
 * (LD_ERRMSG_MAX) for a file that is not a .npy file or claims a header over
 * NPY_HEADER_MAX. */
int npy_header_length(const void *buf, size_t len, uint64_t *ret_total, char *errbuf);
/* Parses the header in buf (len bytes: at least what npy_header_length said). On
 * failure LD_ESAMPLE (or LD_ENOTSUP for a valid header that describes data we cannot
 * serve: Fortran order, object, structured, big-endian or unsupported element types,
 * more than LD_MAX_DIMS dimensions) with the reason in errbuf. */
int npy_parse(const void *buf, size_t len, struct npy_header *ret_header, char *errbuf);
/* Same dtype and shape. */
bool npy_same(const struct npy_header *a, const struct npy_header *b);
/* "float32[3,32,32]" ("int64[]" for a scalar), into buf. */
const char *npy_describe(const struct npy_header *h, char *buf, size_t size);
/* Whether the array h describes is the dataset's (expect: dtype, order, shape) and fills
 * exactly `size` bytes with its header (a "file" or an "object", as `what` says in the
 * message). LD_ESAMPLE with the reason in errbuf. */
int npy_check(const struct npy_header *h, const struct npy_header *expect, uint64_t size, const char *what,
              char *errbuf);
/* Reads the array of the .npy file open at fd (file_size bytes long) into dst, which
 * holds expect->data_bytes: the header must describe the same dtype and shape as
 * expect (LD_ESAMPLE otherwise) and the file must hold exactly its data. Blocking
 * (pread); a failed pread returns -errno (a shortage of descriptors or memory is for
 * the caller to retry). The reason in errbuf. */
int npy_read(int fd, uint64_t file_size, const struct npy_header *expect, void *dst, char *errbuf);
/* Reads and parses only the header of the file open at fd (for the dataset's layout at
 * open). */
int npy_read_header(int fd, uint64_t file_size, struct npy_header *ret_header, char *errbuf);

#endif
