"""Batch and RaggedField: one leased slot of a stream's ring seen as numpy arrays and
torch tensors (host views, or a field already on the device).

Views are private copy-on-write mappings of the slot (_slots.py): a write stays in this
process and this batch, and the slot goes back to the daemon only once no view of it is
alive. Stream (client.py) makes a Batch from each leased slot.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Iterator, List, TypeVar, Union

import numpy as np

from ._lib import LcDeviceField, lib, speedups as _ext
from . import errors
from ._slots import _DTYPES, _TORCH_DTYPES
from .errors import DeviceError, InvalidArgument, ReleasedError, make_error

__all__ = ["Batch", "RaggedField", "TorchPlan"]

# Stream, which Batch's hints name, is set here by client.py once it has defined it
# (client.py imports this module first).

_INT64 = np.dtype(np.int64)
_UINT8 = np.dtype(np.uint8)

_torch = None
_ext_arrays = _ext.arrays if _ext is not None else None


def _import_torch():
    global _torch
    if _torch is None:
        import torch as t
        _torch = t
    return _torch


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
        self._views = None     # {name: numpy view}, made at the first one
        self._tensors = None   # {name: tensor}, likewise
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
        stream = self._stream
        if not stream.keep_views_safe:
            stream._batch_released(st)

    close = release

    def __del__(self):
        # _Closes.__del__ without its two calls: every batch of a training loop ends here.
        try:
            if self._lease is not None:
                self.release()
        except Exception:
            pass

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
        return [f.name for f in self._state.ring.layout]

    def keys(self) -> List[str]:
        return self.fields

    def __contains__(self, name: object) -> bool:
        return name in self._state.ring.by_name

    def __getitem__(self, name: str) -> FieldValue:
        return self.numpy(name)

    def _field(self, name):
        self._check()
        f = self._state.ring.by_name.get(name)
        if f is None:
            raise KeyError("no field %r in this batch (fields: %s)" % (name, ", ".join(self.fields)))
        if not lib.lc_batch_valid(self._state.bptr):
            raise make_error(errors.ESTALE,
                             "slot %d no longer holds batch %d of epoch %d (generation %d)"
                             % (self.slot, self.index, self.epoch, self.generation))
        return f

    def _make(self, f, buf):
        off = self._state.ring.delta[self.slot]
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
        views = self._views
        if views is None:
            views = self._views = {}
        else:
            v = views.get(name)
            if v is not None:
                return v
        f = self._field(name)
        if self._ro is None:
            self._ro = self._lease
        v = self._make(f, self._ro)
        views[name] = v
        return v

    def torch(self, name: str, copy: bool = False, device: Any = None) -> Any:
        """Field `name` as a torch tensor sharing the slot's memory (no copy), or with
        copy=True a tensor of its own. In-place operations on a shared tensor work: the
        pages they write are private copies of this process, dropped before the slot holds
        its next batch (the daemon's memory is never changed). torch has no uint16/uint32
        (1.13): such fields raise TypeError unless copy=True, which converts them to int64.
        A ragged field gives a RaggedField of tensors.

        device="cuda" (or "cuda:N"), for a stream opened with a device: a CUDA tensor on
        the daemon's device memory (no copy), with torch's current stream made to wait for
        the batch (no host synchronisation). It keeps the slot leased like a host view.
        Raises DeviceError when torch has no CUDA or the stream has no device."""
        if device is not None and str(device) != "cpu":
            return self._torch_device(name, device)
        t = _import_torch()
        if self._lease is None or self._state.given_back:
            self._check()
        tensors = self._tensors
        if tensors is None:
            tensors = self._tensors = {}
        elif not copy:
            v = tensors.get(name)
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
        tensors[name] = v
        return v

    def _torch_device(self, name, device):
        t = _import_torch()
        self._check()
        dev = t.device(device)
        if dev.type != "cuda":
            raise InvalidArgument(errors.EINVAL, "device %r: batches go to CUDA devices only ('cuda' or 'cuda:N')"
                                  % (str(device),))
        if not t.cuda.is_available():
            raise DeviceError(errors.EDEVICE, "batch.torch(%r, device=%r): torch has no usable CUDA here "
                              "(torch.cuda.is_available() is False)" % (name, str(device)))
        ordinal = self._stream.device_index
        if ordinal is None:
            raise DeviceError(errors.EDEVICE, "stream %d was opened without a device: open it with "
                              "Client.open(..., device='cuda:N') (or LoaderdDataLoader(device='cuda')) so that "
                              "its batches are on the GPU" % self._stream.id)
        if dev.index is not None and dev.index != ordinal:
            raise InvalidArgument(errors.EINVAL, "batch.torch(%r, device=%r): the stream's batches are on cuda:%d"
                                  % (name, str(device), ordinal))
        f = self._field(name)
        if f.ragged:
            raise TypeError("field %r is ragged: on the device, use batch.numpy(%r) or a fixed-size field" % (name, name))
        bptr = self._state.bptr
        df = LcDeviceField()
        rc = lib.lc_batch_device_field_by_name_sized(bptr, name.encode(), ctypes.byref(df), ctypes.sizeof(df))
        if rc < 0:
            raise self._stream._client._error(rc)
        cs = t.cuda.current_stream(ordinal)
        rc = lib.lc_batch_device_wait(bptr, ctypes.c_void_p(cs.cuda_stream))
        if rc < 0:
            raise self._stream._client._error(rc)
        shape = tuple(int(df.shape[i]) for i in range(df.ndim))
        holder = _CudaView(shape, _DTYPES[df.dtype][0].str, df.data, self._lease)
        return t.as_tensor(holder, device=t.device("cuda", ordinal))

    def _torch_plan(self, plan):
        """Tensors for a TorchPlan in one go: LoaderdDataLoader's per-batch path (the checks
        of torch() done once per batch, no per-field cache). Only for a batch just handed
        out: lc_stream_next_info has checked its slot's generation, and the daemon writes no
        slot leased to us."""
        t = _torch or _import_torch()
        lease = self._lease
        if lease is None or self._state.given_back:
            self._check()
        if plan.spec is not None:
            return _ext_arrays(lease, self._state.ring.delta[self.slot], self.rows, plan.spec, t.from_numpy)
        base = self._state.ring.delta[self.slot]
        rows = self.rows
        from_numpy = t.from_numpy
        out = []
        for f, own in plan.fields:
            if f.ragged:
                out.append(self.torch(f.name, copy=own))
                continue
            a = np.ndarray((rows,) + f.shape, f.dtype, buffer=lease, offset=base + f.offset)
            if own:
                a = a.copy() if f.dtype in _TORCH_DTYPES else a.astype(np.int64)
            out.append(from_numpy(a))
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


class TorchPlan:
    """LoaderdDataLoader's per-batch tensors, resolved once per ring (``ring``, the
    SlotRing whose layout it follows): ``fields``, a list of (field layout, copy?), in the
    order the tensors come; ``spec``, the same for the extension's arrays() (dtype, sample
    shape, offset, 0 shared / 1 copied / 2 copied as int64), or None where the Python path
    makes them (no extension, a ragged field)."""
    __slots__ = ("fields", "spec", "ring")

    def __init__(self, fields: Any, ring: Any = None) -> None:
        self.fields = list(fields)
        self.ring = ring
        self.spec = None
        if _ext is not None and not any(f.ragged for f, _ in self.fields):
            self.spec = tuple((f.dtype, f.shape, f.offset, (1 if f.dtype in _TORCH_DTYPES else 2) if own else 0)
                              for f, own in self.fields)


class _CudaView:
    """A field on the device as __cuda_array_interface__ (version 3) for torch.as_tensor:
    the tensor holds this object, which holds the batch's lease, so the slot stays leased
    while the tensor lives (the same rule as host views). The stream dependency is set
    before (lc_batch_device_wait on torch's current stream), so "stream" is None."""
    __slots__ = ("__cuda_array_interface__", "_lease")

    def __init__(self, shape, typestr, ptr, lease):
        # Not marked read-only (torch refuses read-only device buffers in some versions): a
        # write changes this process's batch only, since the daemon never reads a device
        # slot back and rewrites it before its next batch.
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr or 0, False),
                                         "version": 3, "strides": None, "stream": None}
        self._lease = lease
