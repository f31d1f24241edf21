/* loaderclient._speedups: what the extension's two files share. Private to the
 * extension: _speedups.c is the module (leases, their state, take, arrays, the
 * give-back), _speedups_pages.c the written-page drop.
 */
#ifndef LOADERCLIENT_SPEEDUPS_H
#define LOADERCLIENT_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

/* A Python int that must fit a C int (a descriptor): 0, or -1 with an exception set. */
int speedups_as_int(PyObject *o, int *ret);

/* Drops the pages written in the private mapping [addr, addr + size); *ret_dropped:
 * pages given to madvise. Returns 0, or an errno > 0 when madvise failed. */
int speedups_drop(int fd, uintptr_t addr, size_t size, size_t *ret_dropped);

/* Raises the package's exception of a failed drop for errno `e` (speedups_drop_error,
 * set by set_hooks; OSError before that). */
extern PyObject *speedups_drop_error;
void speedups_raise_drop_error(int e);

/* drop_written(fd, addr, size) -> pages given to madvise. */
PyObject *speedups_drop_written(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
