"""Client, Stream, Batch: loaderd's batches as zero-copy numpy arrays and torch tensors.

A thin layer over libloaderclient (ctypes): the C library speaks the protocol, maps the
stream's ring read-only and leases slots; this module turns a leased slot into arrays.

Two things are done here rather than in C: how a slot is seen, and keeping views honest.

How a slot is seen. Each slot is seen through a mapping of its own of the ring's shared
memory: *private, writable and copy-on-write* (``mmap(MAP_PRIVATE, PROT_READ|PROT_WRITE)``
of the ring's file, opened read-only), made once per slot and reused:

- reading maps the daemon's own pages (no copy: the zero-copy path);
- writing (``x.mul_(0.7)``, ``x *= 2``, a mixup recipe) first copies the page it touches
  into this process: the daemon's memory, and so every other client, never see the write;
- before a slot's mapping shows the slot's next batch, the pages this process wrote through
  it are dropped (``madvise(MADV_DONTNEED)``: on a private file mapping it discards the
  private copies), so the next batch reads the daemon's bytes again. Which pages were
  written is read from /proc/self/pagemap (a written page is no longer a file page), so a
  batch nobody wrote costs one small read and no page fault.

The ring's file is the one the C library mapped, and so is its layout: the library hands
out a descriptor of the ring (``lc_stream_ring_fd``), each slot's offset
(``lc_stream_slot_offset``), each field's offsets within a slot (``lc_stream_field_layout``)
and each batch's slot, generation, epoch, index and rows (``lc_batch_describe``), all of it
checked against the daemon's reply. Nothing here restates the ring's or a slot's header.

Keeping views honest. A numpy array cannot be revoked, so "arrays of a released batch must
not be used" cannot be enforced by checking on access. Instead (``keep_views_safe=True``,
the default):

- a batch's arrays and tensors hang off one buffer object, its *lease*, whose reference
  count therefore says whether any view of the batch is still alive;
- releasing a batch (the next ``next()``, ``release()``, a ``with`` block's end) gives
  the slot back to the daemon only once no view of it is left: usually at once, or as
  soon as the training loop drops its last tensor of the batch;
- if views are kept longer (more than ``MAX_DEFERRED`` released batches still viewed
  when the next batch is asked for), the oldest one is *materialized*: its slot mapping is
  atomically replaced (``mremap(MREMAP_FIXED)``) by a private copy (what the views showed,
  their own writes included), and the slot goes back to the daemon. The kept arrays go on
  reading the same bytes; the slot gets a new mapping for its next batch.

So an array handed out by this module never shows another batch's data: it is either
the slot the daemon still leases to us, or our private copy. The cost in the steady state
is one pagemap read per batch beyond creating the views (mappings are reused).
``keep_views_safe=False`` skips the deferral: the slot is released at once, and a kept view
may show later batches (and a write through it, the slot's current batch in this process).
"""
from __future__ import annotations

import collections
import ctypes
import json
import mmap
import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

import numpy as np

from . import _lib
from ._lib import LcStreamOptions, lib, libc
from . import errors
from .errors import (ConnectError, EndOfStream, InvalidArgument, LoaderdError, ReleasedError, Timeout,
                     make_error)

__all__ = ["Client", "Stream", "Batch", "RaggedField", "MAX_DEFERRED", "default_socket"]

# Released batches whose views may stay alive at once before the oldest is copied. One is
# the usual training loop: `x` of step n is still bound while step n+1's batch is fetched.
# The daemon's ring has prefetch + 3 slots. libloaderclient keeps two `next` requests in
# flight while the trainer holds at most one batch of the stream, and asks no more ahead
# while it holds two: the current batch plus the read-ahead's two slots, or plus one
# deferred batch and the one read-ahead left, is three leased slots either way, so one
# deferred slot does not shorten the prefetch.
MAX_DEFERRED = 1

# Slices of a long wait for a batch, so that Ctrl-C interrupts it within this long.
_WAIT_SLICE_MS = 250

_PAGE = mmap.PAGESIZE
_PROT_READ, _PROT_WRITE = 1, 2
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MADV_DONTNEED = 4
# /proc/self/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst): 63 present,
# 62 swapped, 61 file page or shared anonymous. A page of a private file mapping that was
# written is an anonymous page: present or swapped, and not a file page.
_WRITTEN_BY_TOP_BYTE = bytes(1 if (v & 0xC0) and not (v & 0x20) else 0 for v in range(256))
_MAP_FAILED = ctypes.c_void_p(-1).value

# LC_DTYPE_* -> (numpy dtype, wire name)
_DTYPES = {
    1: (np.dtype(np.uint8), "uint8"),
    2: (np.dtype(np.uint16), "uint16"),
    3: (np.dtype(np.uint32), "uint32"),
    4: (np.dtype(np.int32), "int32"),
    5: (np.dtype(np.int64), "int64"),
    6: (np.dtype(np.float16), "float16"),
    7: (np.dtype(np.float32), "float32"),
}
_TORCH_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.int32, np.int64, np.float16, np.float32))
_INT64 = np.dtype(np.int64)
_UINT8 = np.dtype(np.uint8)

_BATCH_INFO_SIZE = ctypes.sizeof(_lib.LcBatchInfo)
_torch = None
_check_signals = ctypes.pythonapi.PyErr_CheckSignals   # PyDLL: raises what a handler raised
_check_signals.restype = ctypes.c_int
_check_signals.argtypes = []


def _import_torch():
    global _torch
    if _torch is None:
        import torch as t
        _torch = t
    return _torch


def _resolve_socket(config=None):
    """(code, path or message) from the C library's lc_socket_resolve."""
    buf = ctypes.create_string_buffer(4096)
    err = ctypes.create_string_buffer(1024)
    rc = lib.lc_socket_resolve(None, None if config is None else os.fsencode(config), buf, len(buf), err, len(err))
    if rc < 0:
        return rc, err.value.decode(errors="replace")
    return 0, os.fsdecode(buf.value)


def default_socket() -> str:
    """The socket a Client connects to when none is given, as the C library resolves it:
    $LOADERD_SOCKET, else ``server.socket`` of the daemon's config named by
    $LOADERD_CONFIG, else $XDG_RUNTIME_DIR/loaderd.sock when that directory is ours with
    mode 0700, else /tmp/loaderd-<uid>/loaderd.sock (the daemon's default). A config that
    names no usable socket raises (LoaderdError, ``name`` "bad_config", the message
    naming FILE:LINE:COLUMN)."""
    rc, out = _resolve_socket()
    if rc < 0:
        raise make_error(rc, out)
    return out


def _ms(seconds, what):
    if seconds is None:
        return 0
    if not isinstance(seconds, (int, float)) or seconds != seconds or seconds <= 0:
        raise InvalidArgument(errors.EINVAL, "%s must be a positive number of seconds, got %r" % (what, seconds))
    return max(1, min(int(seconds * 1000 + 0.999), 2**31 - 1))


def _uint(name, v, bits):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 or v >= 1 << bits:
        raise InvalidArgument(errors.EFIELD, "field '%s': expected an integer in [0, %d], got %r"
                              % (name, (1 << bits) - 1, v))
    return int(v)


_pagemap = {"pid": None, "fd": -1}
_pagemap_lock = threading.Lock()


def _pagemap_fd():
    # /proc/self is resolved when opened: a forked child must open its own.
    pid = os.getpid()
    if _pagemap["pid"] != pid:
        with _pagemap_lock:
            if _pagemap["pid"] != pid:
                try:
                    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    fd = -1
                _pagemap["fd"], _pagemap["pid"] = fd, pid
    return _pagemap["fd"]


def _written_pages(addr, size):
    """(first, end) page numbers within [addr, addr + size) spanning every page this
    process wrote (a private copy), (0, 0) if none; every page when it cannot be told."""
    n = size // _PAGE
    fd = _pagemap_fd()
    if fd < 0:
        return 0, n
    try:
        raw = os.pread(fd, 8 * n, addr // _PAGE * 8)
    except OSError:
        return 0, n
    if len(raw) != 8 * n:
        return 0, n
    # Each entry's top byte (little-endian) holds bits 56-63: one marker byte per page.
    marks = raw[7::8].translate(_WRITTEN_BY_TOP_BYTE)
    first = marks.find(1)
    if first < 0:
        return 0, 0
    return first, marks.rfind(1) + 1


def _drop_written(addr, size):
    """Drops the private copies of the pages this process wrote in a private file mapping
    of a slot: the next reads see the shared memory's (the daemon's) bytes. Returns the
    number of pages given to madvise."""
    first, end = _written_pages(addr, size)
    if end == first:
        return 0
    if libc.madvise(addr + first * _PAGE, (end - first) * _PAGE, _MADV_DONTNEED) != 0:
        e = ctypes.get_errno()
        raise LoaderdError(-e if e else errors.EINVAL, "cannot drop the pages written in a slot's mapping: %s"
                           % os.strerror(e))
    return end - first


class _SlotMapping:
    """An unguarded stream's mapping of one slot, shared by the stream and the leases of
    the batches seen through it: unmapped when the last of them lets go of it (views of
    those batches may outlive the stream)."""
    __slots__ = ("addr", "size")

    def __init__(self, addr, size):
        self.addr = addr
        self.size = size

    def __del__(self):
        try:
            libc.munmap(self.addr, self.size)
        except Exception:   # interpreter shutdown
            pass


class _FieldLayout:
    """One field of a stream's slots, relative to the slot's start (constant per stream), as
    the C library's lc_stream_field_layout gives it."""
    __slots__ = ("name", "index", "dtype", "wire", "shape", "ragged", "offset", "offsets_offset", "row_bytes")

    def __init__(self, index, f):
        self.name = f.name.decode()
        self.index = index
        self.dtype, self.wire = _DTYPES[f.dtype]
        self.ragged = bool(f.ragged)
        self.shape = tuple(f.shape[d] for d in range(f.ndim)) if not self.ragged else ()
        self.offset = f.offset
        self.offsets_offset = f.offsets_offset if self.ragged else None
        self.row_bytes = f.row_bytes

    def describe(self):
        return {"name": self.name, "dtype": self.wire, "shape": list(self.shape), "ragged": self.ragged}


class _LeaseState:
    """What a batch's lease needs once its views die: owned by the lease, seen by the stream."""
    __slots__ = ("stream", "bptr", "slot", "addr", "size", "batch_released", "given_back", "views_dead",
                 "materialized", "owns_addr", "mapping")

    def __init__(self, stream, bptr, slot, addr, size, owns_addr, mapping=None):
        self.stream = stream
        self.bptr = bptr
        self.slot = slot
        self.addr = addr          # start of the alias (or of the library's slot, unguarded)
        self.size = size
        self.batch_released = False
        self.given_back = False   # lc_batch_release done (or the stream closed)
        self.views_dead = False
        self.materialized = False
        self.owns_addr = owns_addr  # the alias is ours to unmap / return to the slot cache
        self.mapping = mapping      # an unguarded stream's _SlotMapping, kept alive by the lease


_mapping_lock = threading.Lock()


def _take_mapping(st):
    """Takes the address range away from a lease state (True once)."""
    with _mapping_lock:
        if not st.owns_addr:
            return False
        st.owns_addr = False
        return True


def _drop_mapping(st):
    """Unmaps a lease state's alias or private copy, once, whichever thread asks."""
    if _take_mapping(st):
        libc.munmap(st.addr, st.size)


def _lease_del(self):
    # The last view of a batch is gone (or the batch never had any). Runs wherever the last
    # reference was dropped, in whatever thread: no blocking here.
    try:
        st = self.state
    except AttributeError:
        return
    try:
        st.views_dead = True
        st.stream._views_dead(st)
    except Exception:  # interpreter shutdown, or a bug: never raise from a finalizer
        pass


_Self = TypeVar("_Self", bound="_ContextManaged")
#: What a field reads as: a numpy array, or for a ragged field a RaggedField.
FieldValue = Union[np.ndarray, "RaggedField"]


class _ContextManaged:
    """`with x:` closes x at the end of the block."""

    __slots__ = ()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Closes(_ContextManaged):
    """... and so does garbage collection, quietly."""

    __slots__ = ()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class RaggedField:
    """A ragged field of a batch: ``offsets`` (int64, rows + 1) and ``data`` (uint8): sample i
    is ``data[offsets[i]:offsets[i+1]]``. Both are numpy arrays, or torch tensors when it comes
    from ``Batch.torch``; they are views of the slot with the same lifetime as other views."""
    __slots__ = ("offsets", "data", "name")

    def __init__(self, offsets: Any, data: Any, name: str = "data") -> None:
        self.offsets = offsets
        self.data = data
        self.name = name

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        n = len(self.offsets) - 1
        if not isinstance(i, (int, np.integer)):
            raise TypeError("RaggedField indices must be integers, got %s" % type(i).__name__)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("sample %d out of range for a batch of %d" % (i, n))
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def lengths(self) -> Any:
        """Bytes of each sample."""
        return self.offsets[1:] - self.offsets[:-1]

    def tolist(self) -> List[bytes]:
        """Every sample as ``bytes`` (a copy)."""
        data = self.data if isinstance(self.data, np.ndarray) else self.data.numpy()
        off = self.offsets.tolist()
        return [data[off[i]:off[i + 1]].tobytes() for i in range(len(off) - 1)]

    def copy(self) -> RaggedField:
        """A RaggedField that owns its memory (safe to keep)."""
        return RaggedField(self.offsets.copy() if isinstance(self.offsets, np.ndarray) else self.offsets.clone(),
                           self.data.copy() if isinstance(self.data, np.ndarray) else self.data.clone(), self.name)

    def __repr__(self) -> str:
        return "RaggedField(%r, %d samples, %d bytes)" % (self.name, len(self), len(self.data))


class Batch(_Closes):
    """One leased batch. ``epoch``, ``index`` (batch number within the epoch), ``rows``,
    ``slot``, ``generation``; fields by name: ``batch["data"]`` / ``numpy(name)`` (numpy
    view, or RaggedField), ``torch(name)`` (tensor sharing the memory). Views are writable
    copy-on-write: a write stays in this process and this batch (see the module
    documentation).

    After ``release()`` (done by the stream's next ``next()`` unless auto_release=False),
    every field access raises ReleasedError; arrays taken before stay readable and keep
    this batch's bytes (see the module documentation), but prefer ``copy()`` for data you
    keep."""
    __slots__ = ("_stream", "_state", "_lease", "_ro", "_views", "_tensors", "epoch", "index", "rows", "slot",
                 "generation", "__weakref__")

    def __init__(self, stream: Stream, state: Any, lease: Any, epoch: int, index: int, rows: int, slot: int,
                 generation: int) -> None:
        self._stream = stream
        self._state = state
        self._lease = lease
        self._ro = None
        self._views = {}
        self._tensors = {}
        self.epoch = epoch
        self.index = index
        self.rows = rows
        self.slot = slot
        self.generation = generation

    # -- lifetime ---------------------------------------------------------------------

    @property
    def released(self) -> bool:
        return self._lease is None or self._state.given_back

    def release(self) -> None:
        """Ends this batch: the Batch refuses access from now on, and the slot goes back to
        the daemon as soon as no array or tensor of it is alive. Idempotent."""
        if self._lease is None:
            return
        st = self._state
        self._views = self._tensors = None
        self._ro = None
        st.batch_released = True
        self._lease = None     # may run the lease's finalizer right here (no view left)
        self._stream._batch_released(st)

    close = release

    def _check(self):
        if self._lease is None or self._state.given_back:
            raise ReleasedError("batch %d of epoch %d (slot %d) was released; copy what you keep "
                                "(batch.copy(), np.array(view), tensor.clone()) before releasing"
                                % (self.index, self.epoch, self.slot))

    @property
    def valid(self) -> bool:
        """True while the slot still holds this batch (its generation matches)."""
        if self.released:
            return False
        return bool(lib.lc_batch_valid(self._state.bptr))

    # -- fields -------------------------------------------------------------------------

    @property
    def fields(self) -> List[str]:
        """Field names, in the dataset's order."""
        return [f.name for f in self._stream._layout]

    def keys(self) -> List[str]:
        return self.fields

    def __contains__(self, name: object) -> bool:
        return name in self._stream._by_name

    def __getitem__(self, name: str) -> FieldValue:
        return self.numpy(name)

    def _field(self, name):
        self._check()
        f = self._stream._by_name.get(name)
        if f is None:
            raise KeyError("no field %r in this batch (fields: %s)" % (name, ", ".join(self.fields)))
        if not lib.lc_batch_valid(self._state.bptr):
            raise make_error(errors.ESTALE,
                             "slot %d no longer holds batch %d of epoch %d (generation %d)"
                             % (self.slot, self.index, self.epoch, self.generation))
        return f

    def _make(self, f, buf):
        off = self._stream._delta[self.slot]
        if not f.ragged:
            return np.ndarray((self.rows,) + f.shape, f.dtype, buffer=buf, offset=off + f.offset)
        offsets = np.ndarray((self.rows + 1,), _INT64, buffer=buf, offset=off + f.offsets_offset)
        data = np.ndarray((int(offsets[self.rows]),), _UINT8, buffer=buf, offset=off + f.offset)
        return RaggedField(offsets, data, f.name)

    def numpy(self, name: str) -> FieldValue:
        """A numpy view of field `name` (shape (rows, *sample shape)); for a ragged field, a
        RaggedField of views. No copy. Writable copy-on-write: writes change this process's
        view of this batch only (read-only where the ring's file cannot be mapped privately)."""
        if self._lease is None or self._state.given_back:
            self._check()
        v = self._views.get(name)
        if v is not None:
            return v
        f = self._field(name)
        if self._ro is None:
            self._ro = self._lease
        v = self._make(f, self._ro)
        self._views[name] = v
        return v

    def torch(self, name: str, copy: bool = False) -> Any:
        """Field `name` as a torch tensor sharing the slot's memory (no copy), or with
        copy=True a tensor of its own. In-place operations on a shared tensor work: the
        pages they write are private copies of this process, dropped before the slot holds
        its next batch (the daemon's memory is never changed). torch has no uint16/uint32
        (1.13): such fields raise TypeError unless copy=True, which converts them to int64.
        A ragged field gives a RaggedField of tensors."""
        t = _import_torch()
        if self._lease is None or self._state.given_back:
            self._check()
        if not copy:
            v = self._tensors.get(name)
            if v is not None:
                return v
        f = self._field(name)
        if copy:
            v = self._make(f, self._lease)
            if f.ragged:
                return RaggedField(t.from_numpy(v.offsets.copy()), t.from_numpy(v.data.copy()), f.name)
            if f.dtype not in _TORCH_DTYPES:
                return t.from_numpy(v.astype(np.int64))
            return t.from_numpy(v.copy())
        if not f.ragged and f.dtype not in _TORCH_DTYPES:
            raise TypeError("field %r is %s, which torch %s has no tensor type for: use batch.numpy(%r) "
                            "(zero-copy) or batch.torch(%r, copy=True) (an int64 copy)"
                            % (name, f.wire, t.__version__, name, name))
        v = self._make(f, self._lease)
        if f.ragged:
            v = RaggedField(t.from_numpy(v.offsets), t.from_numpy(v.data), f.name)
        else:
            v = t.from_numpy(v)
        self._tensors[name] = v
        return v

    def _torch_plan(self, plan):
        """Tensors for [(field layout, copy?)] in one go: LoaderdDataLoader's per-batch path
        (the checks of torch() done once per batch, no per-field cache)."""
        t = _torch or _import_torch()
        self._check()
        if not lib.lc_batch_valid(self._state.bptr):
            self._field(plan[0][0].name)   # raises the stale-generation error
        lease = self._lease
        base = self._stream._delta[self.slot]
        rows = self.rows
        out = []
        for f, own in plan:
            if f.ragged:
                out.append(self.torch(f.name, copy=own))
                continue
            a = np.ndarray((rows,) + f.shape, f.dtype, buffer=lease, offset=base + f.offset)
            if own:
                a = a.copy() if f.dtype in _TORCH_DTYPES else a.astype(np.int64)
            out.append(t.from_numpy(a))
        return out

    def as_dict(self) -> Dict[str, FieldValue]:
        """{name: numpy view} for every field."""
        return {n: self.numpy(n) for n in self.fields}

    def copy(self) -> Dict[str, FieldValue]:
        """{name: numpy array (or RaggedField) owning its memory}: safe to keep after release."""
        out = {}
        for n in self.fields:
            v = self.numpy(n)
            out[n] = v.copy() if isinstance(v, RaggedField) else np.array(v)
        return out

    def __repr__(self) -> str:
        state = "released" if self.released else "leased"
        return "<Batch epoch=%d index=%d rows=%d slot=%d %s>" % (self.epoch, self.index, self.rows, self.slot, state)


class Stream(_ContextManaged):
    """An ordered sequence of batches of one dataset (see Client.open). Iterating yields
    Batch objects until the stream ends (``epochs`` > 0); by default each ``next()``
    releases the batch the previous one returned."""

    def __init__(self, client: Client, handle: int, dataset: str, batch_size: int, epoch: int, start_batch: int,
                 keep_views_safe: bool, auto_release: bool) -> None:
        self._client = client
        self._h = handle
        self.dataset = dataset
        self.batch_size = batch_size
        self.keep_views_safe = keep_views_safe
        self.auto_release = auto_release
        self.id = lib.lc_stream_id(handle)
        self.batches_per_epoch = lib.lc_stream_batches_per_epoch(handle)
        self.samples_per_epoch = lib.lc_stream_samples_per_epoch(handle)
        size = ctypes.c_size_t()
        self._ring_base = lib.lc_stream_ring(handle, ctypes.byref(size))
        self._ring_size = size.value
        info = _lib.LcRingInfo()
        if lib.lc_stream_ring_info_sized(handle, ctypes.byref(info), ctypes.sizeof(info)) < 0:
            raise LoaderdError(errors.EINVAL, "the layout of stream %d's ring cannot be read" % self.id)
        self.slot_count = info.slot_count
        self._slot_size = info.slot_size
        # Each slot is mapped from the page holding its start: its offset in the ring, and
        # where the slot starts within that mapping.
        offsets = [lib.lc_stream_slot_offset(handle, s) for s in range(info.slot_count)]
        self._delta = [off % _PAGE for off in offsets]             # slot start within its mapping
        self._map_off = [off - off % _PAGE for off in offsets]     # the mapping's offset in the ring
        self._alias_len = max(-(-(d + info.slot_size) // _PAGE) * _PAGE for d in self._delta)
        self._alias = [None] * info.slot_count                     # warm, idle slot mappings
        self._slot_maps = [None] * info.slot_count                 # unguarded: _SlotMapping by slot
        self._layout = self._read_layout(handle, info.field_count)
        self._by_name = {fl.name: fl for fl in self._layout}
        self.private_reason = None
        self.dropped_pages = 0                                     # pages given to MADV_DONTNEED
        fd = lib.lc_stream_ring_fd(handle)                         # last: nothing below can fail
        if fd < 0:
            raise make_error(fd, "cannot get a descriptor of stream %d's ring: %s"
                             % (self.id, errors.MESSAGES.get(fd, "error %d" % fd)))
        self._fd = fd                                              # for private copy-on-write mappings
        self._lease_type = type("_Lease", (ctypes.c_uint8 * self._alias_len,),
                                {"__slots__": ("state",), "__del__": _lease_del})
        self._held = collections.OrderedDict()                   # id(state) -> state, not given back
        self._current = None
        self._closed = False
        self._bp = ctypes.c_void_p()
        self._bp_ref = ctypes.byref(self._bp)
        self._binfo = _lib.LcBatchInfo()
        self._binfo_ref = ctypes.byref(self._binfo)
        self.position = (epoch, start_batch)                     # (epoch, batch) of the next batch

    # -- info -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ring(self) -> Tuple[int, int]:
        """(base address, size) of the C library's read-only mapping of the ring."""
        return self._ring_base, self._ring_size

    @property
    def writable_views(self) -> bool:
        """True: views are private copy-on-write mappings of the ring's descriptor (from the
        C library), so writes work and stay in this process. Kept for compatibility
        (``private_reason`` is None)."""
        return True

    @property
    def fields(self) -> List[Dict[str, Any]]:
        """[{name, dtype, shape, ragged}] of the dataset, in its order."""
        return [f.describe() for f in self._layout]

    def held_batches(self) -> int:
        """Batches of this stream whose slot is still leased (including released batches
        whose views are alive)."""
        return len(self._held)

    def __repr__(self) -> str:
        return "<Stream %d of %r batch_size=%d%s>" % (self.id, self.dataset, self.batch_size,
                                                     " closed" if self._closed else "")

    # -- batches ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        try:
            return self.next()
        except EndOfStream:
            raise StopIteration from None

    def next(self, timeout: Optional[float] = None) -> Batch:
        """The next batch (a Batch). `timeout` in seconds (default: the client's timeout);
        raises Timeout when it did not come in time (the request stays outstanding: call
        again to keep waiting), EndOfStream after the last epoch, SampleError when a sample
        could not be read, ConnectionLost when the daemon went away."""
        if self._closed:
            raise ReleasedError("stream %d is closed" % self.id)
        cur = self._current
        if cur is not None:
            self._current = None
            if self.auto_release:
                cur.release()
        client = self._client
        total_ms = _ms(timeout, "timeout") if timeout is not None else client._timeout_ms
        bp = self._bp
        with client._lock:
            if client._deferred:
                client._run_deferred()
            if self._closed:
                raise ReleasedError("stream %d is closed" % self.id)
            if len(self._held) > MAX_DEFERRED:
                self._make_room()
            rc = lib.lc_stream_next(self._h, min(total_ms, _WAIT_SLICE_MS), self._bp_ref)
            waited = _WAIT_SLICE_MS
            while rc == errors.ETIMEDOUT and waited < total_ms:
                # Short slices, and the signal handlers run between them, so that Ctrl-C
                # ends a long wait (explicitly: a signal caught by another thread is
                # otherwise only noticed by the main thread's next eval-breaker check).
                client._lock.release()
                client._lock.acquire()
                _check_signals()
                if self._closed:
                    raise ReleasedError("stream %d is closed" % self.id)
                step = min(total_ms - waited, _WAIT_SLICE_MS)
                rc = lib.lc_stream_next(self._h, step, self._bp_ref)
                waited += step
            if rc < 0:
                if rc == errors.ETIMEDOUT:
                    raise Timeout(rc, "no batch from loaderd within %.3g s (stream %d of %r); the request stays "
                                  "outstanding: call next() again to keep waiting" % (total_ms / 1000, self.id,
                                                                                       self.dataset))
                raise client._error(rc)
            b = self._wrap(bp.value)
        if client._deferred:
            client._run_deferred_unlocked()
        if b.index + 1 >= self.batches_per_epoch:
            self.position = (b.epoch + 1, 0)
        else:
            self.position = (b.epoch, b.index + 1)
        self._current = b
        return b

    def _wrap(self, bptr):
        # Under the client lock. The batch's slot and header, which the library has just
        # checked against the daemon's reply: one call.
        info = self._binfo
        lib.lc_batch_describe_sized(bptr, self._binfo_ref, _BATCH_INFO_SIZE)
        slot = info.slot
        try:
            if self.keep_views_safe:
                addr = self._alias[slot]
                if addr is None:
                    addr = self._map_slot(slot)
                else:
                    self._alias[slot] = None
                    try:
                        self._drop_written(addr)
                    except BaseException:
                        libc.munmap(addr, self._alias_len)
                        raise
                st = _LeaseState(self, bptr, slot, addr, self._alias_len, True)
            else:
                m = self._slot_maps[slot]
                if m is None:
                    m = self._slot_maps[slot] = _SlotMapping(self._map_slot(slot), self._alias_len)
                else:
                    self._drop_written(m.addr)
                st = _LeaseState(self, bptr, slot, m.addr, self._alias_len, False, m)
        except BaseException:
            lib.lc_batch_release(bptr)
            raise
        self._held[id(st)] = st
        lease = self._lease_type.from_address(st.addr)
        lease.state = st
        return Batch(self, st, lease, info.epoch, info.index, info.rows, slot, info.generation)

    def _map_slot(self, slot):
        # A new mapping of a slot (its pages, from the page holding the slot's start): private
        # copy-on-write of the ring's descriptor.
        addr = libc.mmap(None, self._alias_len, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE, self._fd,
                         self._map_off[slot])
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise LoaderdError(-e if e else errors.ENOMEM, "cannot map a view of slot %d: %s" % (slot, os.strerror(e)))
        return addr

    def _drop_written(self, addr):
        # Before a slot's mapping shows its next batch: the pages written through it go.
        self.dropped_pages += _drop_written(addr, self._alias_len)

    def _read_layout(self, handle, n):
        f = _lib.LcFieldLayout()
        layout = []
        for i in range(n):
            if lib.lc_stream_field_layout_sized(handle, i, ctypes.byref(f), ctypes.sizeof(f)) < 0:
                raise LoaderdError(errors.EINVAL, "field %d of stream %d cannot be read" % (i, self.id))
            if f.dtype not in _DTYPES:
                raise LoaderdError(errors.EPROTO, "field %r has an unknown dtype %d" % (f.name, f.dtype))
            layout.append(_FieldLayout(i, f))
        return layout

    def _make_room(self):
        # Under the client lock. Released batches whose views live on: keep at most
        # MAX_DEFERRED of them leased; copy the oldest out of the ring beyond that.
        deferred = [st for st in self._held.values() if st.batch_released and not st.given_back]
        for st in deferred[:max(0, len(deferred) - MAX_DEFERRED)]:
            self._materialize(st)
        if len(self._held) >= self.slot_count:
            raise LoaderdError(errors.ELIMIT, "all %d slots of stream %d are held by batches not released (auto_release="
                               "False?): release one before asking for the next" % (self.slot_count, self.id))

    def _materialize(self, st):
        # Under the client lock: replace the slot mapping under the live views by a private
        # copy (writable like the views: what they wrote is copied too), then give the slot
        # back. Atomic for the views: mremap(MREMAP_FIXED) swaps the pages behind st.addr in
        # one step.
        size = st.size
        new = libc.mmap(None, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
        if new is None or new == _MAP_FAILED:
            raise LoaderdError(errors.ENOMEM, "cannot copy a kept batch out of the ring: %s" % os.strerror(ctypes.get_errno()))
        ctypes.memmove(new, st.addr, size)
        r = libc.mremap(new, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, st.addr)
        if r != st.addr:
            e = ctypes.get_errno()
            libc.munmap(new, size)
            raise LoaderdError(-e if e else errors.ENOMEM, "cannot swap a kept batch's copy in: %s" % os.strerror(e))
        st.materialized = True
        self._give_back_locked(st)

    def _batch_released(self, st):
        # Guarded streams give the slot back when the lease dies (_views_dead), which
        # Batch.release may just have caused; unguarded ones at once.
        if not self.keep_views_safe:
            self._client._defer_or_run(self, st)

    def _views_dead(self, st):
        # Any thread (the lease's finalizer). `views_dead` is set before `given_back` is
        # read here, and _give_back_locked sets `given_back` before it reads `views_dead`,
        # so of two racing threads at least one sees both and frees the mapping
        # (_drop_mapping is idempotent).
        if st.given_back:
            if st.materialized or self._closed:
                _drop_mapping(st)
            return
        if st.batch_released:
            self._client._defer_or_run(self, st)

    def _give_back_locked(self, st):
        # Under the client lock.
        if st.given_back:
            return
        st.given_back = True
        self._held.pop(id(st), None)
        if not self._closed:
            lib.lc_batch_release(st.bptr)   # pipelined: does not wait for the daemon's reply
        if st.views_dead:
            if st.materialized or self._closed:
                _drop_mapping(st)
            elif _take_mapping(st):
                if self._alias[st.slot] is not None:   # cannot happen: one lease per slot at a time
                    libc.munmap(self._alias[st.slot], self._alias_len)
                self._alias[st.slot] = st.addr   # warm for the slot's next batch

    def close(self) -> None:
        """Closes the stream (its batches are released). Arrays of its batches that are still
        alive stay readable (the daemon does not write to a closed stream's leased slots).
        Idempotent."""
        if self._closed:
            return
        with self._client._lock:
            self._close_locked(remote=True)

    def _close_locked(self, remote):
        if self._closed:
            return
        cur = self._current
        if cur is not None:
            cur._views = cur._tensors = cur._ro = None
            cur._lease = None
            self._current = None
        self._closed = True
        for st in list(self._held.values()):
            self._give_back_locked(st)   # no release sent: the stream's close frees the slots
        for s, addr in enumerate(self._alias):
            if addr is not None:
                libc.munmap(addr, self._alias_len)
                self._alias[s] = None
        self._slot_maps = [None] * self.slot_count   # each unmapped once no lease holds it
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remote:
            lib.lc_stream_close(self._h)
        self._client._streams.discard(self)
        self._h = None



class Client(_Closes):
    """One connection to loaderd. ``socket``: its path (default: ``default_socket()``, which
    also reads the daemon's config named by $LOADERD_CONFIG); the
    daemon must run as this user, root or $LOADERD_UID; ``timeout`` in seconds
    bounds the connect and every later call; ``name`` shows in ``loaderctl streams``.
    Usable from several threads (calls are serialized); for parallel streams use one
    Client per thread."""

    def __init__(self, socket: Optional[str] = None, timeout: Optional[float] = 30.0, name: str = "python") -> None:
        self._h = None
        self._lock = threading.Lock()
        self._deferred = collections.deque()
        self._streams = set()   # strong: a stream lives until closed, or its client is
        self._timeout_ms = _ms(timeout, "timeout")
        self.timeout = timeout
        if socket is None:
            rc, socket = _resolve_socket()     # LOADERD_SOCKET, LOADERD_CONFIG, the default
            if rc < 0:
                raise ConnectError(rc, socket)
        self.socket = os.fspath(socket)
        errbuf = ctypes.create_string_buffer(1024)
        h = ctypes.c_void_p()
        rc = lib.lc_connect(self.socket.encode(), self._timeout_ms, str(name).encode()[:63], ctypes.byref(h),
                            errbuf, len(errbuf))
        if rc < 0:
            msg = errbuf.value.decode(errors="replace")
            if rc == errors.ETIMEDOUT:
                raise Timeout(rc, msg)
            raise ConnectError(rc, msg)
        self._h = h.value

    # -- plumbing -----------------------------------------------------------------------------

    def _error(self, rc):
        # Under the lock: the library's message of the last failure.
        return make_error(rc, lib.lc_client_error(self._h).decode(errors="replace"))

    def _check(self):
        if self._h is None:
            raise ReleasedError("the client is closed")

    def _defer_or_run(self, stream, st):
        # Give a slot back now when the connection is free, else at the next call. Never waits
        # for the lock or for a reply: lc_batch_release queues the release, or writes it at once
        # with the read-ahead `next`s it sends when the stream is left holding one batch.
        if self._lock.acquire(blocking=False):
            try:
                stream._give_back_locked(st)
                self._run_deferred()
            finally:
                self._lock.release()
        else:
            self._deferred.append((stream, st))

    def _run_deferred(self):
        # Under the lock.
        while self._deferred:
            stream, st = self._deferred.popleft()
            stream._give_back_locked(st)   # a closed stream: only the mapping is dealt with

    def _run_deferred_unlocked(self):
        if self._deferred and self._lock.acquire(blocking=False):
            try:
                self._run_deferred()
            finally:
                self._lock.release()

    # -- requests -------------------------------------------------------------------------------

    def request(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        """Sends one request (a dict without "id") and returns the reply as a dict. Daemon
        errors raise. For the read-only ops: status, datasets, streams."""
        self._check()
        out = ctypes.c_void_p()
        with self._lock:
            self._run_deferred()
            rc = lib.lc_request_json(self._h, json.dumps(obj).encode(), ctypes.byref(out))
            if rc < 0:
                raise self._error(rc)
        try:
            return json.loads(ctypes.string_at(out.value).decode())
        finally:
            lib.lc_free(out)

    def datasets(self) -> List[Dict[str, Any]]:
        """The daemon's datasets: [{name, kind, source, samples, fields: [{name, dtype, shape, ragged}]}]."""
        return self.request({"op": "datasets"})["datasets"]

    def status(self) -> Dict[str, Any]:
        """The daemon's status (server, pid, uptime_s, clients, streams, samples_per_s, slots, ...)."""
        r = self.request({"op": "status"})
        r.pop("id", None)
        r.pop("ok", None)
        return r

    def streams(self) -> List[Dict[str, Any]]:
        """Every stream of the daemon, with its slot states."""
        return self.request({"op": "streams"})["streams"]

    def open(self, dataset: str, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
             rank: Optional[int] = None, world_size: Optional[int] = None, drop_last: bool = False,
             start_batch: int = 0, prefetch: Optional[int] = None, epochs: int = 0, keep_views_safe: bool = True,
             auto_release: bool = True) -> Stream:
        """Opens a stream of `dataset`: batches of `batch_size`, shuffled with (seed, epoch)
        unless shuffle=False, this rank's share (rank, world_size; default 0, 1), starting at
        batch `start_batch` of `epoch`, `prefetch` batches prepared ahead (default: the
        daemon's), `epochs` epochs then end (0: unbounded). See the module documentation for
        keep_views_safe; auto_release=False keeps every batch until batch.release()."""
        self._check()
        o = LcStreamOptions()
        lib.lc_stream_options_init(ctypes.byref(o))
        o.batch_size = _uint("batch_size", batch_size, 32)
        o.shuffle = 1 if shuffle else 0
        o.seed = _uint("seed", seed, 64)
        o.epoch = _uint("epoch", epoch, 64)
        if rank is not None:
            o.rank = _uint("rank", rank, 31)
        if world_size is not None:
            o.world_size = _uint("world_size", world_size, 31)
        o.drop_last = 1 if drop_last else 0
        o.start_batch = _uint("start_batch", start_batch, 64)
        if prefetch is not None:
            o.prefetch = _uint("prefetch", prefetch, 32)
            if o.prefetch == 0:
                raise InvalidArgument(errors.EFIELD, "field 'prefetch': expected an integer in [1, %d], got 0"
                                      % _lib.LIMITS["prefetch_max"])
        o.epochs = _uint("epochs", epochs, 64)
        h = ctypes.c_void_p()
        with self._lock:
            self._run_deferred()
            rc = lib.lc_stream_open(self._h, str(dataset).encode(), ctypes.byref(o), ctypes.byref(h))
            if rc < 0:
                raise self._error(rc)
            try:
                s = Stream(self, h.value, str(dataset), int(batch_size), int(epoch), int(start_batch),
                           bool(keep_views_safe), bool(auto_release))
            except BaseException:
                lib.lc_stream_close(h.value)
                raise
            self._streams.add(s)
        return s

    # -- lifetime -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Closes every stream and the connection. Idempotent."""
        if self._h is None:
            return
        with self._lock:
            for s in list(self._streams):
                s._close_locked(remote=False)
            self._deferred.clear()
            lib.lc_client_close(self._h)
            self._h = None

    def __repr__(self) -> str:
        return "<loaderclient.Client %s%s>" % (self.socket, " closed" if self._h is None else "")
