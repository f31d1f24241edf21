"""How this process sees a stream's slots: private mappings of the ring, and the leases
that keep a batch's views honest. Private to the package; client.py builds the public
API (Client, Stream, Batch) on it.

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

One SlotRing per ring: a stream gets a new ring when the library reopens it after the
daemon restarted (``lc_stream_reopens``). Batches keep the SlotRing they were leased from
(its layout and mappings) until they are given back; the old ring is closed at once, so
its idle mappings go and each remaining one goes with its batch.

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

So an array handed out by this package never shows another batch's data: it is either
the slot the daemon still leases to us, or our private copy. The cost in the steady state
is one pagemap read per batch beyond creating the views (mappings are reused).
``keep_views_safe=False`` skips the deferral: the slot is released at once, and a kept view
may show later batches (and a write through it, the slot's current batch in this process).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading

import numpy as np

from . import _lib
from ._lib import lib, libc, speedups as _ext
from . import errors
from .errors import LoaderdError, make_error

# Released batches whose views may stay alive at once before the oldest is copied. One is
# the usual training loop: `x` of step n is still bound while step n+1's batch is fetched.
# The daemon's ring has prefetch + 3 slots. libloaderclient keeps two `next` requests in
# flight while the trainer holds at most one batch of the stream, and asks no more ahead
# while it holds two: the current batch plus the read-ahead's two slots, or plus one
# deferred batch and the one read-ahead left, is three leased slots either way, so one
# deferred slot does not shorten the prefetch.
MAX_DEFERRED = 1

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

_pagemap_fd = None   # this process's /proc/self/pagemap (-1: not readable), opened at first use
_pagemap_lock = threading.Lock()


def _open_pagemap():
    global _pagemap_fd
    with _pagemap_lock:
        if _pagemap_fd is None:
            try:
                _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                _pagemap_fd = -1
        return _pagemap_fd


def _forget_pagemap():
    # In a forked child: the descriptor reads the parent's page tables (/proc/self was
    # resolved when it was opened); the child opens its own at its first use.
    global _pagemap_fd, _pagemap_lock
    fd, _pagemap_fd = _pagemap_fd, None
    _pagemap_lock = threading.Lock()
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_pagemap)


def _drop_written_py(addr, size):
    """Drops the private copies of the pages this process wrote in a private file mapping
    of a slot: the next reads see the shared memory's (the daemon's) bytes. Returns the
    number of pages given to madvise. Which pages were written is read from
    /proc/self/pagemap (every page is dropped when it cannot be told); once per batch, so
    it is one function. It is read every time: no cheaper sign says that nothing was
    written (a page written by another process, through process_vm_writev or
    /proc/PID/mem, counts its page fault in the writer, not in this process)."""
    n = size // _PAGE
    fd = _pagemap_fd
    if fd is None:
        fd = _open_pagemap()
    raw = None
    if fd >= 0:
        try:
            raw = os.pread(fd, 8 * n, addr // _PAGE * 8)
        except OSError:
            pass
    if raw is not None and len(raw) == 8 * n:
        # Each entry's top byte (little-endian) holds bits 56-63: one marker byte per page.
        marks = raw[7::8].translate(_WRITTEN_BY_TOP_BYTE)
        first = marks.find(1)
        if first < 0:
            return 0
        end = marks.rfind(1) + 1
    else:
        first, end = 0, n
    if libc.madvise(addr + first * _PAGE, (end - first) * _PAGE, _MADV_DONTNEED) != 0:
        e = ctypes.get_errno()
        raise _drop_error(e)
    return end - first


def _drop_error(e):
    return LoaderdError(-e if e else errors.EINVAL, "cannot drop the pages written in a slot's mapping: %s"
                        % os.strerror(e))


def _drop_written_ext(addr, size):
    """_drop_written_py in C (loaderclient._speedups): the same pages dropped, the same
    error."""
    fd = _pagemap_fd
    if fd is None:
        fd = _open_pagemap()
    return _ext_drop_written(fd, addr, size)


if _ext is not None:
    _ext_drop_written = _ext.drop_written
    _drop_written = _drop_written_ext
else:
    _drop_written = _drop_written_py


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


class FieldLayout:
    """One field of a ring's slots, relative to the slot's start (constant per ring), as
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


class LeaseState:
    """What a batch's lease needs once its views die: owned by the lease, seen by the stream."""
    __slots__ = ("stream", "ring", "bptr", "slot", "addr", "size", "batch_released", "given_back", "views_dead",
                 "materialized", "owns_addr", "mapping")

    def __init__(self, stream, ring, bptr, slot, addr, size, owns_addr, mapping=None):
        self.stream = stream
        self.ring = ring          # the SlotRing it was leased from
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


if _ext is not None:
    LeaseState = _ext.LeaseState  # noqa: F811 (the same members, as a C struct)


_mapping_lock = threading.Lock()


def _take_mapping(st):
    """Takes the address range away from a lease state (True once)."""
    with _mapping_lock:
        if not st.owns_addr:
            return False
        st.owns_addr = False
        return True


def drop_mapping(st):
    """Unmaps a lease state's alias or private copy, once, whichever thread asks."""
    if _take_mapping(st):
        libc.munmap(st.addr, st.size)


def _lease_dead(st):
    # The last view of a batch is gone (or the batch never had any): client.py's
    # _lease_dead, set by set_lease_finalizer. Runs wherever the last reference was
    # dropped, in whatever thread: no blocking there.
    raise RuntimeError("loaderclient: no lease finalizer set")


def _lease_del(self):
    # The Python path's lease finalizer (the extension's Lease calls _lease_dead itself,
    # and drops what it raises likewise).
    try:
        st = self.state
    except AttributeError:
        return
    try:
        _lease_dead(st)
    except Exception:  # interpreter shutdown, or a bug: never raise from a finalizer
        pass


def set_lease_finalizer(fn, owner):
    """What a lease calls with its LeaseState when it dies (client.py's _lease_dead); the
    extension does its steady state itself, releasing through ``owner.lib``."""
    global _lease_dead
    _lease_dead = fn
    if _ext is not None:
        _ext.set_hooks(fn, _drop_error, owner)


if _ext is not None:
    _ext_lease = _ext.lease


class SlotRing:
    """One ring of a stream as this process sees it: the layout the C library checked, a
    descriptor of the ring's shared memory, and a private mapping per slot, kept warm
    while the slot is idle. ``closed`` once the stream closed or moved to a new ring:
    mappings then go with their batches instead of back to the slot."""

    def __init__(self, handle, stream_id, keep_views_safe):
        self.keep_views_safe = keep_views_safe
        size = ctypes.c_size_t()
        self.base = lib.lc_stream_ring(handle, ctypes.byref(size))
        self.size = size.value
        info = _lib.LcRingInfo()
        if lib.lc_stream_ring_info_sized(handle, ctypes.byref(info), ctypes.sizeof(info)) < 0:
            raise LoaderdError(errors.EINVAL, "the layout of stream %d's ring cannot be read" % stream_id)
        self.slot_count = info.slot_count
        self.slot_size = info.slot_size
        # Each slot is mapped from the page holding its start: its offset in the ring, and
        # where the slot starts within that mapping.
        offsets = [lib.lc_stream_slot_offset(handle, s) for s in range(info.slot_count)]
        self.delta = [off % _PAGE for off in offsets]             # slot start within its mapping
        self.map_off = [off - off % _PAGE for off in offsets]     # the mapping's offset in the ring
        self.alias_len = max(-(-(d + info.slot_size) // _PAGE) * _PAGE for d in self.delta)
        self.alias = [None] * info.slot_count                     # warm, idle slot mappings
        self.slot_maps = [None] * info.slot_count                 # unguarded: _SlotMapping by slot
        self.layout = self._read_layout(handle, info.field_count, stream_id)
        self.by_name = {fl.name: fl for fl in self.layout}
        self.closed = False
        fd = lib.lc_stream_ring_fd(handle)                         # last: nothing below can fail
        if fd < 0:
            raise make_error(fd, "cannot get a descriptor of stream %d's ring: %s"
                             % (stream_id, errors.MESSAGES.get(fd, "error %d" % fd)))
        self.fd = fd                                               # for private copy-on-write mappings
        if _ext is None:
            self.lease_type = type("_Lease", (ctypes.c_uint8 * self.alias_len,),
                                   {"__slots__": ("state",), "__del__": _lease_del})

    @staticmethod
    def _read_layout(handle, n, stream_id):
        f = _lib.LcFieldLayout()
        layout = []
        for i in range(n):
            if lib.lc_stream_field_layout_sized(handle, i, ctypes.byref(f), ctypes.sizeof(f)) < 0:
                raise LoaderdError(errors.EINVAL, "field %d of stream %d cannot be read" % (i, stream_id))
            if f.dtype not in _DTYPES:
                raise LoaderdError(errors.EPROTO, "field %r has an unknown dtype %d" % (f.name, f.dtype))
            layout.append(FieldLayout(i, f))
        return layout

    def lease(self, stream, bptr, slot):
        """The lease of a batch just leased in `slot` (the buffer its views hang off; its
        LeaseState in ``.state``): the slot's warm mapping, its written pages dropped
        (counted in stream.dropped_pages), or a new one. Raises without releasing bptr."""
        if self.keep_views_safe:
            addr = self.alias[slot]
            if addr is None:
                addr = self.map_slot(slot)
            else:
                self.alias[slot] = None
                try:
                    dropped = _drop_written(addr, self.alias_len)
                except BaseException:
                    libc.munmap(addr, self.alias_len)
                    raise
                if dropped:
                    stream.dropped_pages += dropped
            st = LeaseState(stream, self, bptr, slot, addr, self.alias_len, True)
        else:
            st = self._lease_unguarded(stream, bptr, slot)
        if _ext is not None:
            return _ext_lease(st.addr, st.size, st)
        lease = self.lease_type.from_address(st.addr)
        lease.state = st
        return lease

    def _lease_unguarded(self, stream, bptr, slot):
        m = self.slot_maps[slot]
        if m is None:
            m = self.slot_maps[slot] = _SlotMapping(self.map_slot(slot), self.alias_len)
        else:
            dropped = _drop_written(m.addr, self.alias_len)
            if dropped:
                stream.dropped_pages += dropped
        return LeaseState(stream, self, bptr, slot, m.addr, self.alias_len, False, m)

    def map_slot(self, slot):
        # A new mapping of a slot (its pages, from the page holding the slot's start): private
        # copy-on-write of the ring's descriptor.
        addr = libc.mmap(None, self.alias_len, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE, self.fd, self.map_off[slot])
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise LoaderdError(-e if e else errors.ENOMEM, "cannot map a view of slot %d: %s" % (slot, os.strerror(e)))
        return addr

    @staticmethod
    def materialize(st):
        # Replace the slot mapping under the live views by a private copy (writable like the
        # views: what they wrote is copied too). Atomic for the views: mremap(MREMAP_FIXED)
        # swaps the pages behind st.addr in one step.
        size = st.size
        new = libc.mmap(None, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
        if new is None or new == _MAP_FAILED:
            raise LoaderdError(errors.ENOMEM, "cannot copy a kept batch out of the ring: %s"
                               % os.strerror(ctypes.get_errno()))
        ctypes.memmove(new, st.addr, size)
        r = libc.mremap(new, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, st.addr)
        if r != st.addr:
            e = ctypes.get_errno()
            libc.munmap(new, size)
            raise LoaderdError(-e if e else errors.ENOMEM, "cannot swap a kept batch's copy in: %s" % os.strerror(e))
        st.materialized = True

    def recycle(self, st):
        """A given-back batch whose views are dead: its mapping goes back to the slot (warm
        for the slot's next batch), or away when it is a copy or the ring is closed."""
        if st.materialized or self.closed:
            drop_mapping(st)
            return
        with _mapping_lock:                       # _take_mapping, inline
            if not st.owns_addr:
                return
            st.owns_addr = False
        if self.alias[st.slot] is not None:       # cannot happen: one lease per slot at a time
            libc.munmap(self.alias[st.slot], self.alias_len)
        self.alias[st.slot] = st.addr

    def views_dead_after_give_back(self, st):
        # Views dying after the slot went back: only a copy, or a closed ring's mapping, is
        # left to free (a live ring's mapping was recycled when its views died first).
        if st.materialized or self.closed:
            drop_mapping(st)

    def close(self):
        """No more batches from this ring: idle mappings and the descriptor go; mappings
        of batches still held go with them. Idempotent."""
        self.closed = True
        for s, addr in enumerate(self.alias):
            if addr is not None:
                libc.munmap(addr, self.alias_len)
                self.alias[s] = None
        self.slot_maps = [None] * self.slot_count   # each unmapped once no lease holds it
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
