/* loaderclient._speedups: the per-batch steps of the Python client, in C.
 *
 * Optional. The package's Python code (_slots.py, _batch.py, client.py) is the reference
 * and the fallback: it is used when this module is not built, fails to import, or was
 * built from another version of this file (API_VERSION), and when LOADERCLIENT_PURE=1.
 * What is here does the same work as the Python it stands in for, without its
 * interpreter frames:
 *
 * - drop_written() (_speedups_pages.c): before a slot's private mapping shows the
 *   slot's next batch, the pages this process wrote through it are found in
 *   /proc/self/pagemap and dropped with madvise(MADV_DONTNEED) (_slots._drop_written_py
 *   says why);
 * - LeaseState: _slots.LeaseState's members as a struct (what a lease needs once its
 *   views die, seen by the stream);
 * - Lease: the buffer a batch's views hang off (its reference count says whether a
 *   view of the batch is alive); when it dies it gives the slot back (_slots.py,
 *   "Keeping views honest"): client.py's _lease_dead in its steady state, done here
 *   (speedups_give_back), else that function, called with the lease's state;
 * - take(): SlotRing.lease's steady state in one call: a batch's lease in its slot's
 *   warm mapping (written pages dropped, the state and the lease made, the stream's
 *   record of held batches kept);
 * - arrays(): a batch's fields as numpy arrays whose base is the lease (or copies), each
 *   passed through a converter (torch.from_numpy) when one is given: LoaderdDataLoader's
 *   per-batch tensors in one call.
 *
 * - next_info(): lc_stream_next_info_sized, called straight from C, without ctypes'
 *   argument conversion, the GIL released as ctypes does; a batch given back in the
 *   steady state is released the same way (about 0.7 µs a batch less here).
 *
 * Nothing here talks to the daemon or links the C library: the package hands over the
 * addresses of the two library functions it loaded (set_library, from its ctypes
 * binding); without them a batch is released through that binding (the owner module's
 * `lib`). Releases happen under the client's lock, and every error message is the
 * package's (a failed drop's exception is made by its function, set_hooks).
 */
#include "_speedups.h"

#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <sys/mman.h>

/* What the package checks before using this module: a module built from another
 * version of this file is not used (the Python path is). */
#define SPEEDUPS_API_VERSION 3

/* A dtype's item size: a member of the descriptor before numpy 2, a function since. */
#if NPY_ABI_VERSION >= 0x02000000
#define SPEEDUPS_ITEMSIZE(d) PyDataType_ELSIZE(d)
#else
#define SPEEDUPS_ITEMSIZE(d) ((d)->elsize)
#endif

/* Set once by the package (set_hooks): the finalizer every dying lease calls with its
 * state (where the steady-state give-back below does not apply), the function that
 * makes the exception of a failed drop from an errno, and the module whose `lib` is the
 * library binding that releases a batch (looked up at each release, as Python does). */
static PyObject *speedups_on_dead;
static PyObject *speedups_owner;

/* Set by the package (set_library): lc_stream_next_info_sized and lc_batch_release of
 * the library its binding loaded; NULL until then (next_info refuses, a give-back goes
 * through owner.lib). */
typedef int (*speedups_next_fn)(void *stream, int timeout_ms, void **ret_batch, void *ret_info, size_t info_size);
typedef int (*speedups_release_fn)(void *batch);
static speedups_next_fn speedups_lib_next;
static speedups_release_fn speedups_lib_release;

/* Attribute names read here, interned once. */
static PyObject *speedups_str_alias, *speedups_str_alias_len, *speedups_str_held,
    *speedups_str_dropped_pages, *speedups_str_client, *speedups_str_lock, *speedups_str_acquire,
    *speedups_str_release, *speedups_str_closed_stream, *speedups_str_lib, *speedups_str_lc_batch_release,
    *speedups_str_closed, *speedups_str_recycle, *speedups_str_deferred, *speedups_str_run_deferred;

/* ---- LeaseState ------------------------------------------------------------------- */

/* _slots.LeaseState: what a batch's lease needs once its views die. */
typedef struct {
    PyObject_HEAD
    PyObject *stream, *ring, *bptr, *slot, *addr, *size, *mapping;
    char batch_released, given_back, views_dead, materialized, owns_addr;
} speedups_state;

static PyTypeObject speedups_state_type;

static speedups_state *speedups_state_make(PyObject *stream, PyObject *ring, PyObject *bptr, PyObject *slot,
                                           PyObject *addr, PyObject *size, int owns_addr, PyObject *mapping)
{
    speedups_state *st = PyObject_GC_New(speedups_state, &speedups_state_type);
    if (st == NULL)
        return NULL;
    st->stream = Py_NewRef(stream);
    st->ring = Py_NewRef(ring);
    st->bptr = Py_NewRef(bptr);
    st->slot = Py_NewRef(slot);
    st->addr = Py_NewRef(addr);
    st->size = Py_NewRef(size);
    st->mapping = Py_NewRef(mapping);
    st->batch_released = st->given_back = st->views_dead = st->materialized = 0;
    st->owns_addr = owns_addr != 0;
    PyObject_GC_Track(st);
    return st;
}

static PyObject *speedups_state_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"stream", "ring", "bptr", "slot", "addr", "size", "owns_addr", "mapping", NULL};
    PyObject *stream, *ring, *bptr, *slot, *addr, *size, *mapping = Py_None;
    int owns_addr;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOp|O:LeaseState", names, &stream, &ring, &bptr, &slot, &addr,
                                     &size, &owns_addr, &mapping))
        return NULL;
    return (PyObject *)speedups_state_make(stream, ring, bptr, slot, addr, size, owns_addr, mapping);
}

static int speedups_state_traverse(PyObject *self, visitproc visit, void *arg)
{
    speedups_state *st = (speedups_state *)self;
    Py_VISIT(st->stream);
    Py_VISIT(st->ring);
    Py_VISIT(st->bptr);
    Py_VISIT(st->slot);
    Py_VISIT(st->addr);
    Py_VISIT(st->size);
    Py_VISIT(st->mapping);
    return 0;
}

static int speedups_state_clear(PyObject *self)
{
    speedups_state *st = (speedups_state *)self;
    Py_CLEAR(st->stream);
    Py_CLEAR(st->ring);
    Py_CLEAR(st->bptr);
    Py_CLEAR(st->slot);
    Py_CLEAR(st->addr);
    Py_CLEAR(st->size);
    Py_CLEAR(st->mapping);
    return 0;
}

static void speedups_state_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    speedups_state_clear(self);
    PyObject_GC_Del(self);
}

/* Read-only from Python: the C code counts on them (a deleted member would be NULL). */
#define SPEEDUPS_OBJ(name) {#name, T_OBJECT, offsetof(speedups_state, name), READONLY, NULL}
#define SPEEDUPS_FLAG(name) {#name, T_BOOL, offsetof(speedups_state, name), 0, NULL}
static PyMemberDef speedups_state_members[] = {
    SPEEDUPS_OBJ(stream), SPEEDUPS_OBJ(ring), SPEEDUPS_OBJ(bptr), SPEEDUPS_OBJ(slot), SPEEDUPS_OBJ(addr),
    SPEEDUPS_OBJ(size), SPEEDUPS_OBJ(mapping), SPEEDUPS_FLAG(batch_released), SPEEDUPS_FLAG(given_back),
    SPEEDUPS_FLAG(views_dead), SPEEDUPS_FLAG(materialized), SPEEDUPS_FLAG(owns_addr),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject speedups_state_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loaderclient._speedups.LeaseState",
    .tp_doc = "LeaseState(stream, ring, bptr, slot, addr, size, owns_addr, mapping=None): what a batch's lease "
              "needs once its views die (_slots.LeaseState).",
    .tp_basicsize = sizeof(speedups_state),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = speedups_state_new,
    .tp_dealloc = speedups_state_dealloc,
    .tp_traverse = speedups_state_traverse,
    .tp_clear = speedups_state_clear,
    .tp_members = speedups_state_members,
};

/* ---- Lease ------------------------------------------------------------------------ */

/* The buffer a batch's views hang off: `size` writable bytes at `addr` (the slot's
 * private mapping, owned by the state), and the state the finalizer gets. */
typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t size;
    PyObject *state;
} speedups_lease;

static PyTypeObject speedups_lease_type;
static speedups_lease *speedups_lease_make(void *addr, Py_ssize_t size, PyObject *state);

/* lease(addr, size, state) -> Lease. */
static PyObject *speedups_lease_new(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "lease() takes 3 arguments (addr, size, state), got %zd", nargs);
        return NULL;
    }
    void *addr = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (addr == NULL || size < 0) {
        PyErr_SetString(PyExc_ValueError, "lease(): a null address or a negative size");
        return NULL;
    }
    return (PyObject *)speedups_lease_make(addr, size, args[2]);
}

static int speedups_give_back(speedups_state *st);

/* Runs once (PEP 442), before the lease is cleared or freed, wherever its last
 * reference went: gives the slot back (speedups_give_back in the steady state, else the
 * package's finalizer). Never raises: what went wrong is dropped, as the Python path's
 * __del__ does (interpreter shutdown). */
static void speedups_lease_finalize(PyObject *self)
{
    speedups_lease *l = (speedups_lease *)self;
    PyObject *fn = speedups_on_dead, *state = l->state;
    if (fn == NULL || state == NULL || state == Py_None)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!Py_IS_TYPE(state, &speedups_state_type) || speedups_give_back((speedups_state *)state) == 0) {
        PyObject *r = PyObject_CallOneArg(fn, state);
        if (r == NULL)
            PyErr_Clear();
        else
            Py_DECREF(r);
    }
    PyErr_Restore(type, value, tb);
}

static int speedups_lease_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((speedups_lease *)self)->state);
    return 0;
}

static int speedups_lease_clear(PyObject *self)
{
    Py_CLEAR(((speedups_lease *)self)->state);
    return 0;
}

static void speedups_lease_dealloc(PyObject *self)
{
    if (PyObject_CallFinalizerFromDealloc(self) < 0)
        return;   /* resurrected by the finalizer */
    PyObject_GC_UnTrack(self);
    speedups_lease_clear(self);
    PyObject_GC_Del(self);
}

static int speedups_lease_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    speedups_lease *l = (speedups_lease *)self;
    return PyBuffer_FillInfo(view, self, l->addr, l->size, 0, flags);
}

static PyBufferProcs speedups_lease_buffer = {
    .bf_getbuffer = speedups_lease_getbuffer,
};

static PyObject *speedups_lease_get_state(PyObject *self, void *closure)
{
    PyObject *s = ((speedups_lease *)self)->state;
    return Py_NewRef(s ? s : Py_None);
}

static int speedups_lease_set_state(PyObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a lease's state cannot be deleted");
        return -1;
    }
    Py_XSETREF(((speedups_lease *)self)->state, Py_NewRef(value));
    return 0;
}

static PyGetSetDef speedups_lease_getset[] = {
    {"state", speedups_lease_get_state, speedups_lease_set_state, "what the finalizer is called with", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject speedups_lease_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loaderclient._speedups.Lease",
    .tp_doc = "The buffer a batch's views hang off; gives the slot back (through the finalizer) when it dies.",
    .tp_basicsize = sizeof(speedups_lease),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = speedups_lease_dealloc,
    .tp_finalize = speedups_lease_finalize,
    .tp_traverse = speedups_lease_traverse,
    .tp_clear = speedups_lease_clear,
    .tp_as_buffer = &speedups_lease_buffer,
    .tp_getset = speedups_lease_getset,
};

/* set_hooks(finalizer, drop_error, owner): a dying lease calls finalizer(state) where
 * speedups_give_back does not apply; a failed drop raises drop_error(errno); owner.lib
 * releases a batch (owner None: every give-back goes through the finalizer). */
static PyObject *speedups_set_hooks(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_hooks() takes two callables and a module (finalizer, drop_error, "
                        "owner)");
        return NULL;
    }
    Py_XSETREF(speedups_on_dead, Py_NewRef(args[0]));
    Py_XSETREF(speedups_drop_error, Py_NewRef(args[1]));
    Py_XSETREF(speedups_owner, args[2] == Py_None ? NULL : Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* A Python int that is an address (0 allowed): 0, or -1 with an exception set. */
static int speedups_as_address(PyObject *o, uintptr_t *ret)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "an address must be an int, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (v > UINTPTR_MAX) {
        PyErr_SetString(PyExc_OverflowError, "an address wider than a pointer");
        return -1;
    }
    *ret = (uintptr_t)v;
    return 0;
}

/* set_library(next_info_sized, release): the addresses of lc_stream_next_info_sized and
 * lc_batch_release in the library the package loaded, or of stand-ins with the same
 * signatures (bench/ld-clientshim.c). Both 0 (tests): next_info refuses, and a give-back
 * releases through owner.lib. */
static PyObject *speedups_set_library(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "set_library() takes 2 arguments (next_info_sized, release), got %zd", nargs);
        return NULL;
    }
    uintptr_t next, release;
    if (speedups_as_address(args[0], &next) < 0 || speedups_as_address(args[1], &release) < 0)
        return NULL;
    if ((next == 0) != (release == 0)) {
        PyErr_SetString(PyExc_ValueError, "set_library(): both functions, or neither (0, 0)");
        return NULL;
    }
    speedups_lib_next = (speedups_next_fn)next;
    speedups_lib_release = (speedups_release_fn)release;
    Py_RETURN_NONE;
}

/* next_info(stream, timeout_ms, batch_at, info_at, info_size) -> the library's return
 * code: lc_stream_next_info_sized(stream, timeout_ms, batch_at, info_at, info_size) with
 * the GIL released, each pointer an address (ctypes.addressof of the caller's c_void_p
 * and LcBatchInfo). */
static PyObject *speedups_next_info(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "next_info() takes 5 arguments (stream, timeout_ms, batch_at, info_at, "
                     "info_size), got %zd", nargs);
        return NULL;
    }
    speedups_next_fn next = speedups_lib_next;
    if (next == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "next_info(): no library set (set_library)");
        return NULL;
    }
    uintptr_t stream, batch_at, info_at;
    int timeout_ms;
    if (speedups_as_address(args[0], &stream) < 0 || speedups_as_int(args[1], &timeout_ms) < 0 ||
        speedups_as_address(args[2], &batch_at) < 0 || speedups_as_address(args[3], &info_at) < 0)
        return NULL;
    size_t info_size = PyLong_AsSize_t(args[4]);
    if (info_size == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (stream == 0 || batch_at == 0 || info_at == 0) {
        PyErr_SetString(PyExc_ValueError, "next_info(): a null stream, batch or info address");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = next((void *)stream, timeout_ms, (void **)batch_at, (void *)info_at, info_size);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static speedups_lease *speedups_lease_make(void *addr, Py_ssize_t size, PyObject *state)
{
    speedups_lease *l = PyObject_GC_New(speedups_lease, &speedups_lease_type);
    if (l == NULL)
        return NULL;
    l->addr = addr;
    l->size = size;
    l->state = Py_NewRef(state);
    PyObject_GC_Track(l);
    return l;
}

/* ---- the give-back ------------------------------------------------------------------ */

/* client.py's _lease_dead in its steady state: a released batch whose last view just
 * died, its client's lock free. Returns 0 when that is not the case, having changed
 * nothing (the package's finalizer then does all of it), else 1: the batch given back
 * (given_back set, dropped from the stream's _held, released through the library unless
 * the stream is closed), its mapping back to the slot (SlotRing.recycle), the client's
 * deferred give-backs run, the lock released. Errors after the lock was taken are
 * dropped (the lock is released), as the Python finalizer drops them. */
static int speedups_give_back(speedups_state *st)
{
    if (st->given_back || !st->batch_released || speedups_owner == NULL)
        return 0;
    PyObject *stream = st->stream, *client = NULL, *lock = NULL, *got = NULL;
    int handled = 0;
    client = PyObject_GetAttr(stream, speedups_str_client);
    lock = client ? PyObject_GetAttr(client, speedups_str_lock) : NULL;
    got = lock ? PyObject_CallMethodOneArg(lock, speedups_str_acquire, Py_False) : NULL;
    if (got != Py_True) {
        PyErr_Clear();
        goto cleanup;   /* busy (or odd): the Python finalizer defers it */
    }
    handled = 1;
    st->views_dead = 1;
    if (!st->given_back) {
        st->given_back = 1;
        PyObject *held = PyObject_GetAttr(stream, speedups_str_held);
        PyObject *key = PyLong_FromVoidPtr(st);
        if (held == NULL || key == NULL || PyDict_Check(held) == 0 || PyDict_DelItem(held, key) < 0)
            PyErr_Clear();
        Py_XDECREF(held);
        Py_XDECREF(key);
        PyObject *closed = PyObject_GetAttr(stream, speedups_str_closed_stream);
        int is_closed = closed ? PyObject_IsTrue(closed) : -1;
        Py_XDECREF(closed);
        if (is_closed == 0) {
            /* Pipelined: does not wait for the daemon's reply. */
            speedups_release_fn release = speedups_lib_release;
            void *b = release != NULL ? PyLong_AsVoidPtr(st->bptr) : NULL;
            if (b != NULL) {
                Py_BEGIN_ALLOW_THREADS
                release(b);
                Py_END_ALLOW_THREADS
            } else {
                PyErr_Clear();   /* a bptr that is no address: the binding says what it makes of it */
                PyObject *lib = PyObject_GetAttr(speedups_owner, speedups_str_lib);
                PyObject *r = lib ? PyObject_CallMethodOneArg(lib, speedups_str_lc_batch_release, st->bptr) : NULL;
                Py_XDECREF(r);
                Py_XDECREF(lib);
            }
        }
        PyErr_Clear();
        /* SlotRing.recycle, without its lock, as _lease_dead does: this is the lease's one
         * finalizer, and every other path to the mapping holds the client's lock. */
        PyObject *ring = st->ring, *alias = NULL, *ring_closed = PyObject_GetAttr(ring, speedups_str_closed);
        int fast = ring_closed != NULL && PyObject_IsTrue(ring_closed) == 0 && st->owns_addr && !st->materialized;
        Py_ssize_t slot = fast ? PyLong_AsSsize_t(st->slot) : -1;
        alias = fast ? PyObject_GetAttr(ring, speedups_str_alias) : NULL;
        if (alias != NULL && PyList_Check(alias) && slot >= 0 && slot < PyList_GET_SIZE(alias) &&
            PyList_GET_ITEM(alias, slot) == Py_None) {
            st->owns_addr = 0;
            PyList_SetItem(alias, slot, Py_NewRef(st->addr));
        } else {
            PyErr_Clear();
            PyObject *r = PyObject_CallMethodOneArg(ring, speedups_str_recycle, (PyObject *)st);
            Py_XDECREF(r);
        }
        Py_XDECREF(alias);
        Py_XDECREF(ring_closed);
        PyErr_Clear();
    }
    PyObject *deferred = PyObject_GetAttr(client, speedups_str_deferred);
    Py_ssize_t waiting = deferred ? PyObject_Length(deferred) : -1;
    Py_XDECREF(deferred);
    if (waiting > 0) {
        PyObject *r = PyObject_CallMethodNoArgs(client, speedups_str_run_deferred);
        Py_XDECREF(r);
    }
    PyErr_Clear();
    PyObject *r = PyObject_CallMethodNoArgs(lock, speedups_str_release);
    Py_XDECREF(r);
    PyErr_Clear();
cleanup:
    Py_XDECREF(got);
    Py_XDECREF(lock);
    Py_XDECREF(client);
    return handled;
}

/* ---- take ------------------------------------------------------------------------- */

/* take(ring, stream, bptr, slot, pagemap_fd) -> the Lease of a batch just leased in
 * `slot` of a guarded stream's ring, in the slot's warm mapping (ring.alias[slot]),
 * with its LeaseState recorded in stream._held; None when the slot has no warm mapping
 * (or pagemap_fd is None): SlotRing.lease does it then. Raises as SlotRing.lease does
 * (the mapping unmapped), without releasing the batch. */
static PyObject *speedups_take(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "take() takes 5 arguments (ring, stream, bptr, slot, pagemap_fd), got %zd",
                     nargs);
        return NULL;
    }
    PyObject *ring = args[0], *stream = args[1], *bptr = args[2], *slot_obj = args[3];
    if (args[4] == Py_None)
        Py_RETURN_NONE;
    int fd;
    if (speedups_as_int(args[4], &fd) < 0)
        return NULL;
    Py_ssize_t slot = PyLong_AsSsize_t(slot_obj);
    if (PyErr_Occurred())
        return NULL;
    PyObject *alias = NULL, *size_obj = NULL, *addr_obj = NULL, *held = NULL, *key = NULL;
    speedups_state *st = NULL;
    speedups_lease *lease = NULL;
    PyObject *ret = NULL;
    alias = PyObject_GetAttr(ring, speedups_str_alias);
    if (alias == NULL)
        goto cleanup;
    if (!PyList_Check(alias) || slot < 0 || slot >= PyList_GET_SIZE(alias)) {
        PyErr_Format(PyExc_IndexError, "take(): slot %zd is not one of the ring's", slot);
        goto cleanup;
    }
    if (PyList_GET_ITEM(alias, slot) == Py_None) {
        ret = Py_NewRef(Py_None);
        goto cleanup;
    }
    size_obj = PyObject_GetAttr(ring, speedups_str_alias_len);
    held = size_obj ? PyObject_GetAttr(stream, speedups_str_held) : NULL;
    if (held == NULL)
        goto cleanup;
    if (!PyDict_Check(held)) {
        PyErr_SetString(PyExc_TypeError, "take(): the stream's _held must be a dict");
        goto cleanup;
    }
    Py_ssize_t size = PyLong_AsSsize_t(size_obj);
    if (size < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "take(): a negative mapping size");
        goto cleanup;
    }
    /* From here the mapping is the lease's, or unmapped on failure (as in Python). */
    addr_obj = Py_NewRef(PyList_GET_ITEM(alias, slot));
    void *addr = PyLong_AsVoidPtr(addr_obj);
    if (addr == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "take(): slot %zd's mapping has no address", slot);
        goto cleanup;   /* not an address: left alone */
    }
    PyList_SetItem(alias, slot, Py_NewRef(Py_None));
    size_t dropped;
    int rc = speedups_drop(fd, (uintptr_t)addr, (size_t)size, &dropped);
    if (rc != 0) {
        munmap(addr, (size_t)size);
        if (rc > 0)
            speedups_raise_drop_error(rc);
        goto cleanup;
    }
    if (dropped) {
        PyObject *was = PyObject_GetAttr(stream, speedups_str_dropped_pages);
        PyObject *sum = NULL, *n = was ? PyLong_FromSize_t(dropped) : NULL;
        if (n != NULL)
            sum = PyNumber_Add(was, n);
        int bad = sum == NULL || PyObject_SetAttr(stream, speedups_str_dropped_pages, sum) < 0;
        Py_XDECREF(was);
        Py_XDECREF(n);
        Py_XDECREF(sum);
        if (bad) {
            munmap(addr, (size_t)size);
            goto cleanup;
        }
    }
    st = speedups_state_make(stream, ring, bptr, slot_obj, addr_obj, size_obj, 1, Py_None);
    lease = st ? speedups_lease_make(addr, size, (PyObject *)st) : NULL;
    key = lease ? PyLong_FromVoidPtr(st) : NULL;
    if (key == NULL || PyDict_SetItem(held, key, (PyObject *)st) < 0) {
        if (lease != NULL)
            Py_CLEAR(lease->state);   /* no finalizer call: the batch was never handed out */
        if (st != NULL)
            st->owns_addr = 0;
        munmap(addr, (size_t)size);
        goto cleanup;
    }
    ret = (PyObject *)lease;
    lease = NULL;
cleanup:
    Py_XDECREF(alias);
    Py_XDECREF(size_obj);
    Py_XDECREF(held);
    Py_XDECREF(addr_obj);
    Py_XDECREF(key);
    Py_XDECREF(lease);
    Py_XDECREF(st);
    return ret;
}

/* ---- arrays ----------------------------------------------------------------------- */

enum { SPEEDUPS_VIEW = 0, SPEEDUPS_COPY = 1, SPEEDUPS_INT64 = 2 };

/* One field as an array: a view of the lease (its base), or a copy of that view. */
static PyObject *speedups_field(speedups_lease *l, Py_ssize_t base, npy_intp rows, PyObject *spec)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4) {
        PyErr_SetString(PyExc_TypeError, "arrays(): each field is (dtype, shape, offset, mode)");
        return NULL;
    }
    PyObject *dt = PyTuple_GET_ITEM(spec, 0), *shape = PyTuple_GET_ITEM(spec, 1);
    Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    long mode = PyLong_AsLong(PyTuple_GET_ITEM(spec, 3));
    if (PyErr_Occurred())
        return NULL;
    if (!PyArray_DescrCheck(dt) || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) >= NPY_MAXDIMS) {
        PyErr_SetString(PyExc_TypeError, "arrays(): a field's dtype must be a numpy dtype and its shape a tuple");
        return NULL;
    }
    PyArray_Descr *descr = (PyArray_Descr *)dt;
    int nd = 1 + (int)PyTuple_GET_SIZE(shape);
    npy_intp dims[NPY_MAXDIMS];
    npy_intp bytes = rows * SPEEDUPS_ITEMSIZE(descr);
    dims[0] = rows;
    for (int d = 1; d < nd; d++) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d - 1));
        if (dims[d] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "arrays(): a negative dimension");
            return NULL;
        }
        bytes *= dims[d];
    }
    /* The views must stay inside the lease: an error here is a bug of the caller, but
     * it must not become a read out of bounds. */
    if (base < 0 || off < 0 || rows < 0 || base + off > l->size || bytes > l->size - base - off) {
        PyErr_Format(PyExc_ValueError, "arrays(): a field of %zd bytes at %zd does not fit in the lease's %zd",
                     (Py_ssize_t)bytes, base + off, l->size);
        return NULL;
    }
    Py_INCREF(descr);   /* PyArray_NewFromDescr steals it */
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, (char *)l->addr + base + off,
                                       NPY_ARRAY_CARRAY, NULL);
    if (a == NULL)
        return NULL;
    Py_INCREF(l);
    if (PyArray_SetBaseObject((PyArrayObject *)a, (PyObject *)l) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    if (mode == SPEEDUPS_VIEW)
        return a;
    PyObject *c;
    if (mode == SPEEDUPS_INT64)
        c = PyArray_CastToType((PyArrayObject *)a, PyArray_DescrFromType(NPY_INT64), 0);
    else
        c = PyArray_NewCopy((PyArrayObject *)a, NPY_CORDER);
    Py_DECREF(a);
    return c;
}

/* arrays(lease, base, rows, fields, convert) -> [array or convert(array)]: each field
 * (dtype, sample shape, offset from `base`, mode: 0 view, 1 copy, 2 int64 copy) with
 * `rows` rows at lease + base + offset. */
static PyObject *speedups_arrays(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "arrays() takes 5 arguments (lease, base, rows, fields, convert), got %zd",
                     nargs);
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &speedups_lease_type) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "arrays(): needs a Lease and a tuple of fields");
        return NULL;
    }
    speedups_lease *l = (speedups_lease *)args[0];
    Py_ssize_t base = PyLong_AsSsize_t(args[1]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *convert = args[4] == Py_None ? NULL : args[4];
    Py_ssize_t n = PyTuple_GET_SIZE(args[3]);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = speedups_field(l, base, (npy_intp)rows, PyTuple_GET_ITEM(args[3], i));
        if (a != NULL && convert != NULL)
            Py_SETREF(a, PyObject_CallOneArg(convert, a));
        if (a == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, a);
    }
    return out;
}

/* ---- module ----------------------------------------------------------------------- */

static PyMethodDef speedups_methods[] = {
    {"drop_written", (PyCFunction)(void (*)(void))speedups_drop_written, METH_FASTCALL,
     "drop_written(fd, addr, size) -> pages dropped (madvise)"},
    {"lease", (PyCFunction)(void (*)(void))speedups_lease_new, METH_FASTCALL,
     "lease(addr, size, state) -> Lease"},
    {"take", (PyCFunction)(void (*)(void))speedups_take, METH_FASTCALL,
     "take(ring, stream, bptr, slot, pagemap_fd) -> Lease in the slot's warm mapping, or None"},
    {"set_hooks", (PyCFunction)(void (*)(void))speedups_set_hooks, METH_FASTCALL,
     "set_hooks(finalizer, drop_error, owner): a dying lease gives its batch back (owner.lib releases it) or calls "
     "finalizer(state); a failed drop raises drop_error(errno)"},
    {"set_library", (PyCFunction)(void (*)(void))speedups_set_library, METH_FASTCALL,
     "set_library(next_info_sized, release): the library functions' addresses (0, 0: none)"},
    {"next_info", (PyCFunction)(void (*)(void))speedups_next_info, METH_FASTCALL,
     "next_info(stream, timeout_ms, batch_at, info_at, info_size) -> lc_stream_next_info_sized's return code"},
    {"arrays", (PyCFunction)(void (*)(void))speedups_arrays, METH_FASTCALL,
     "arrays(lease, base, rows, fields, convert) -> list of arrays (or of convert(array))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "loaderclient._speedups",
    .m_doc = "The Python client's per-batch steps in C (optional; see the package's README).",
    .m_size = -1,
    .m_methods = speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void);

PyMODINIT_FUNC PyInit__speedups(void)
{
    import_array();
    if (PyType_Ready(&speedups_lease_type) < 0 || PyType_Ready(&speedups_state_type) < 0)
        return NULL;
    if ((speedups_str_alias = PyUnicode_InternFromString("alias")) == NULL ||
        (speedups_str_alias_len = PyUnicode_InternFromString("alias_len")) == NULL ||
        (speedups_str_held = PyUnicode_InternFromString("_held")) == NULL ||
        (speedups_str_dropped_pages = PyUnicode_InternFromString("dropped_pages")) == NULL ||
        (speedups_str_client = PyUnicode_InternFromString("_client")) == NULL ||
        (speedups_str_lock = PyUnicode_InternFromString("_lock")) == NULL ||
        (speedups_str_acquire = PyUnicode_InternFromString("acquire")) == NULL ||
        (speedups_str_release = PyUnicode_InternFromString("release")) == NULL ||
        (speedups_str_closed_stream = PyUnicode_InternFromString("_closed")) == NULL ||
        (speedups_str_lib = PyUnicode_InternFromString("lib")) == NULL ||
        (speedups_str_lc_batch_release = PyUnicode_InternFromString("lc_batch_release")) == NULL ||
        (speedups_str_closed = PyUnicode_InternFromString("closed")) == NULL ||
        (speedups_str_recycle = PyUnicode_InternFromString("recycle")) == NULL ||
        (speedups_str_deferred = PyUnicode_InternFromString("_deferred")) == NULL ||
        (speedups_str_run_deferred = PyUnicode_InternFromString("_run_deferred")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "API_VERSION", SPEEDUPS_API_VERSION) < 0 ||
        PyModule_AddObjectRef(m, "Lease", (PyObject *)&speedups_lease_type) < 0 ||
        PyModule_AddObjectRef(m, "LeaseState", (PyObject *)&speedups_state_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
