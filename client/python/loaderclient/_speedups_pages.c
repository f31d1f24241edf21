/* loaderclient._speedups: the written-page drop of a slot's private mapping (part of
 * the extension; _speedups.c is the module). The Python reference is
 * _slots._drop_written_py: the same pages are dropped, the same error raised.
 *
 * The pagemap is read at every drop. Skipping it when this process took no page fault
 * since the mapping was last clean is not sound: a write by another process
 * (process_vm_writev, /proc/PID/mem, a debugger) makes the page private with a fault
 * counted in the writer, not here. */
#include "_speedups.h"

#include <errno.h>
#include <limits.h>
#include <sys/mman.h>
#include <unistd.h>

/* Pages looked up in /proc/self/pagemap per read (8 bytes each). */
#define SPEEDUPS_PAGEMAP_CHUNK 512

/* The function that makes the exception of a failed drop from an errno (set_hooks). */
PyObject *speedups_drop_error;

/* A Python int that must fit a C int (a descriptor): 0, or -1 with an exception set. */
int speedups_as_int(PyObject *o, int *ret)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%ld does not fit a C int", v);
        return -1;
    }
    *ret = (int)v;
    return 0;
}

/* ---- drop_written ----------------------------------------------------------------- */

/* A pagemap entry of a page this process wrote in a private file mapping: present
 * (bit 63) or swapped (bit 62), and not a file page (bit 61). */
static int speedups_written(uint64_t e)
{
    return (e >> 62) != 0 && !(e & (UINT64_C(1) << 61));
}

/* Drops the pages written in the private mapping [addr, addr + size); *ret_dropped:
 * pages given to madvise. Returns 0, or an errno > 0 when madvise failed. fd < 0, or a
 * pagemap that cannot be read in full: every page is dropped, as in the Python path. */
int speedups_drop(int fd, uintptr_t addr, size_t size, size_t *ret_dropped)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n = size / page, first = n, end = 0;
    int known = fd >= 0;
    uint64_t buf[SPEEDUPS_PAGEMAP_CHUNK];
    for (size_t done = 0; known && done < n;) {
        size_t k = n - done < SPEEDUPS_PAGEMAP_CHUNK ? n - done : SPEEDUPS_PAGEMAP_CHUNK;
        off_t at = (off_t)((addr / page + done) * sizeof(uint64_t));
        ssize_t r = pread(fd, buf, k * sizeof(uint64_t), at);
        if (r != (ssize_t)(k * sizeof(uint64_t))) {
            known = 0;
            break;
        }
        for (size_t i = 0; i < k; i++) {
            if (speedups_written(buf[i])) {
                if (first == n)
                    first = done + i;
                end = done + i + 1;
            }
        }
        done += k;
    }
    if (!known) {
        first = 0;
        end = n;
    }
    if (first < end && madvise((void *)(addr + first * page), (end - first) * page, MADV_DONTNEED) != 0) {
        return errno ? errno : EINVAL;
    }
    *ret_dropped = first < end ? end - first : 0;
    return 0;
}

/* Raises the package's exception of a failed drop (set_hooks) for errno `e`. */
void speedups_raise_drop_error(int e)
{
    if (speedups_drop_error == NULL) {
        errno = e;
        PyErr_SetFromErrno(PyExc_OSError);
        return;
    }
    PyObject *exc = PyObject_CallFunction(speedups_drop_error, "i", e);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* drop_written(fd, addr, size) -> pages given to madvise. Raises the
 * package's error (set_hooks) when madvise failed. */
PyObject *speedups_drop_written(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "drop_written() takes 3 arguments (fd, addr, size), got %zd", nargs);
        return NULL;
    }
    int fd;
    if (speedups_as_int(args[0], &fd) < 0)
        return NULL;
    uintptr_t addr = (uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
    size_t size = (size_t)PyLong_AsSize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    size_t dropped;
    int rc = speedups_drop(fd, addr, size, &dropped);
    if (rc > 0)
        speedups_raise_drop_error(rc);
    if (rc != 0)
        return NULL;
    return PyLong_FromSize_t(dropped);
}
