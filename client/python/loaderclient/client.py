"""Client, Stream, Batch: loaderd's batches as zero-copy numpy arrays and torch tensors.

A thin layer over libloaderclient (ctypes): the C library speaks the protocol, maps the
stream's ring read-only, leases slots, and rides through a daemon restart (it reconnects
and reopens each stream at the batch it had reached); this module holds the connection
and its streams, and turns a leased slot into a Batch (_batch.py: its numpy and torch
views). How a slot is seen (private copy-on-write mappings of the ring) and how views
are kept honest (a batch's slot goes back only once no view of it is alive) is _slots.py;
this file is the public API on top of it.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._lib import LcStreamOptions, lib
from . import _lib
from . import errors
from . import _batch
from ._batch import Batch, RaggedField, _Closes, _ContextManaged  # noqa: F401 (RaggedField: kept here too)
from ._slots import _DTYPES, _TORCH_DTYPES, MAX_DEFERRED, SlotRing  # noqa: F401 (the package's names, kept here)
from . import _slots
from .errors import ConnectError, EndOfStream, InvalidArgument, LoaderdError, ReleasedError, Timeout, make_error

__all__ = ["Client", "Stream", "Batch", "RaggedField", "MAX_DEFERRED", "default_socket"]

# Slices of a long wait for a batch, so that Ctrl-C interrupts it within this long.
_WAIT_SLICE_MS = 250

_BATCH_INFO_SIZE = ctypes.sizeof(_lib.LcBatchInfo)
_take = _lib.speedups.take if _lib.speedups is not None else None
_arrays = _lib.speedups.arrays if _lib.speedups is not None else None
# lc_stream_next_info_sized called from C (the extension), else through ctypes.
_next_info = _lib.speedups.next_info if _lib.speedups is not None else None
_check_signals = ctypes.pythonapi.PyErr_CheckSignals   # PyDLL: raises what a handler raised
_check_signals.restype = ctypes.c_int
_check_signals.argtypes = []


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


def _declared(dataset, spec, template, transforms):
    """For Client.open: the name passed to lc_stream_open (bytes or None), the spec as
    JSON (bytes or None) and the stream's label."""
    if template is not None and dataset is not None and template != dataset:
        raise InvalidArgument(errors.EFIELD, "give the template's name once (template=%r, dataset=%r)"
                              % (template, dataset))
    name = template if template is not None else dataset
    if spec is None and transforms is None:
        if template is not None:
            raise InvalidArgument(errors.EFIELD, "template=%r: give transforms= or spec= (the keys to change)"
                                  % (template,))
        if name is None:
            raise InvalidArgument(errors.EFIELD, "a dataset name or spec= (a dataset you declare) is required")
        return str(name).encode(), None, str(name)
    if spec is not None and not isinstance(spec, dict):
        raise InvalidArgument(errors.EFIELD, "spec must be a dict (the keys of a dataset), got %s"
                              % type(spec).__name__)
    obj = dict(spec or {})
    if transforms is not None:
        from .transforms import to_specs
        obj["transforms"] = to_specs(transforms)
    if name is None:
        label = "spec:%s" % os.path.basename(str(obj.get("path", "")).rstrip("/"))
        return None, json.dumps(obj, separators=(",", ":")).encode(), label
    return str(name).encode(), json.dumps(obj, separators=(",", ":")).encode(), "%s+spec" % name


class Stream(_ContextManaged):
    """An ordered sequence of batches of one dataset (see Client.open). Iterating yields
    Batch objects until the stream ends (``epochs`` > 0); by default each ``next()``
    releases the batch the previous one returned.

    When the daemon restarts, the library reopens the stream on the new daemon at the batch
    after the last one ``next()`` returned (see Client): ``next()`` only takes longer, and
    the stream's ``id``, ring and slots are the new ones from then on (``reopens`` counts).
    Batches held across the restart stay readable."""

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
        ordinal = lib.lc_stream_device(handle)
        #: The GPU ordinal of a device stream (Client.open(device=...)), else None.
        self.device_index = ordinal if ordinal >= 0 else None
        self.private_reason = None
        self.dropped_pages = 0                                   # pages given to MADV_DONTNEED
        self._ring = SlotRing(handle, self.id, keep_views_safe)  # the current ring's slot mappings
        self._reopens = lib.lc_stream_reopens(handle)
        self._held = {}                                          # id(state) -> state, not given back (in order)
        self._current = None
        self._closed = False
        self._bp = ctypes.c_void_p()
        self._bp_ref = ctypes.byref(self._bp)
        self._binfo = _lib.LcBatchInfo()
        self._binfo_ref = ctypes.byref(self._binfo)
        self._bp_at = ctypes.addressof(self._bp)                # the same two, for _next_info
        self._binfo_at = ctypes.addressof(self._binfo)
        self.position = (epoch, start_batch)                     # (epoch, batch) of the next batch

    # -- info -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def slot_count(self) -> int:
        """Slots of the stream's ring (the daemon's prefetch + 3)."""
        return self._ring.slot_count

    @property
    def reopens(self) -> int:
        """How many times the library reopened the stream after the daemon restarted."""
        return self._reopens

    @property
    def ring(self) -> Tuple[int, int]:
        """(base address, size) of the C library's read-only mapping of the ring."""
        return self._ring.base, self._ring.size

    @property
    def writable_views(self) -> bool:
        """True: views are private copy-on-write mappings of the ring's descriptor (from the
        C library), so writes work and stay in this process. Kept for compatibility
        (``private_reason`` is None)."""
        return True

    @property
    def fields(self) -> List[Dict[str, Any]]:
        """[{name, dtype, shape, ragged}] of the dataset, in its order."""
        return [f.describe() for f in self._ring.layout]

    @property
    def _by_name(self):
        return self._ring.by_name

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
        could not be read, ConnectionLost when the daemon went away and did not come back
        within the client's reconnect time (time spent waiting for it to come back does not
        count against `timeout`), LoaderdError ``bad_dataset`` when it came back with
        another dataset under the name."""
        return self._next(self._client._timeout_ms if timeout is None else _ms(timeout, "timeout"))

    def _next(self, total_ms, plan=None, convert=None):
        # next() with the timeout in milliseconds (LoaderdDataLoader's per-batch path). In the
        # steady state: one call into the library (lc_stream_next_info: the batch and its
        # slot, rows, epoch, index, generation and ring), the slot's mapping, the Batch.
        # With a TorchPlan of this ring that the extension makes (LoaderdDataLoader's, on a
        # guarded stream that releases each batch at the next): no Batch object, but
        # ([convert(array) of each field], epoch, index); the batch's lease is then what
        # the next call releases. A Batch still when the plan is of another ring (the
        # daemon restarted): the caller makes a plan of the new one.
        if self._closed:
            raise ReleasedError("stream %d is closed" % self.id)
        cur = self._current
        if cur is not None:
            self._current = None
            if type(cur) is not Batch:
                # A lease of the plan path (such a stream releases automatically).
                cur.state.batch_released = True
                cur = None       # may run its finalizer here: no view left
            elif self.auto_release and cur._lease is not None:
                if self.keep_views_safe:
                    # Batch.release, inline: its views' dicts dropped, then the lease (which
                    # may run its finalizer here: no view left).
                    cur._views = cur._tensors = cur._ro = None
                    cur._state.batch_released = True
                    cur._lease = None
                else:
                    cur.release()
        client = self._client
        with client._lock:
            if client._deferred:
                client._run_deferred()
            if self._closed:
                raise ReleasedError("stream %d is closed" % self.id)
            if len(self._held) > MAX_DEFERRED:
                self._make_room()
            ms = total_ms if total_ms < _WAIT_SLICE_MS else _WAIT_SLICE_MS
            if _next_info is not None:
                rc = _next_info(self._h, ms, self._bp_at, self._binfo_at, _BATCH_INFO_SIZE)
            else:
                rc = lib.lc_stream_next_info_sized(self._h, ms, self._bp_ref, self._binfo_ref, _BATCH_INFO_SIZE)
            if rc:
                self._wait(rc, total_ms)
            bptr = self._bp.value
            info = self._binfo
            if info.reopens != self._reopens:
                try:
                    self._remap()
                except BaseException:
                    lib.lc_batch_release(bptr)
                    raise
            if plan is not None and plan.ring is self._ring:
                slot = info.slot
                lease = self._lease_of(bptr, slot)
                epoch, index, rows = info.epoch, info.index, info.rows
                b = None
            else:
                b = self._wrap(bptr, info)
        if client._deferred:
            client._run_deferred_unlocked()
        if b is None:
            self.position = (epoch + 1, 0) if index + 1 >= self.batches_per_epoch else (epoch, index + 1)
            self._current = lease
            return _arrays(lease, lease.state.ring.delta[slot], rows, plan.spec, convert), epoch, index
        if b.index + 1 >= self.batches_per_epoch:
            self.position = (b.epoch + 1, 0)
        else:
            self.position = (b.epoch, b.index + 1)
        self._current = b
        return b

    def _wait(self, rc, total_ms):
        # Under the client lock: the first slice of the wait ended with `rc`. Waits on in
        # slices until a batch comes (returns) or `total_ms` ran out (raises Timeout), or
        # raises the library's error. Short slices, and the signal handlers run between
        # them, so that Ctrl-C ends a long wait (explicitly: a signal caught by another
        # thread is otherwise only noticed by the main thread's next eval-breaker check).
        # A slice spent while the daemon is away does not count: the library bounds that
        # by the reconnect time.
        client = self._client
        step = min(total_ms, _WAIT_SLICE_MS)
        waited = 0 if lib.lc_client_reconnecting(client._h) else step
        while rc == errors.ETIMEDOUT and waited < total_ms:
            client._lock.release()
            client._lock.acquire()
            _check_signals()
            if self._closed:
                raise ReleasedError("stream %d is closed" % self.id)
            step = min(total_ms - waited, _WAIT_SLICE_MS)
            rc = lib.lc_stream_next_info_sized(self._h, step, self._bp_ref, self._binfo_ref, _BATCH_INFO_SIZE)
            if not lib.lc_client_reconnecting(client._h):
                waited += step
        if rc < 0:
            if rc == errors.ETIMEDOUT:
                raise Timeout(rc, "no batch from loaderd within %.3g s (stream %d of %r); the request stays "
                              "outstanding: call next() again to keep waiting" % (total_ms / 1000, self.id,
                                                                                   self.dataset))
            raise client._error(rc)

    def _remap(self):
        # Under the client lock. The library reopened the stream on a restarted daemon: a
        # new ring, new slots. Batches of the old ring keep their SlotRing; its idle
        # mappings and descriptor go now.
        new = SlotRing(self._h, lib.lc_stream_id(self._h), self.keep_views_safe)
        old, self._ring = self._ring, new
        old.close()
        self.id = lib.lc_stream_id(self._h)
        self._reopens = lib.lc_stream_reopens(self._h)

    def _wrap(self, bptr, info):
        # Under the client lock. The batch's slot and header, which the library has just
        # checked against the daemon's announcement (`info`, lc_stream_next_info's).
        slot = info.slot
        lease = self._lease_of(bptr, slot)
        return Batch(self, lease.state, lease, info.epoch, info.index, info.rows, slot, info.generation)

    def _lease_of(self, bptr, slot):
        # Under the client lock: the lease of a batch just leased in `slot`, recorded in
        # _held; on failure the batch is released and the error raised.
        ring = self._ring
        try:
            # The extension's take(): the steady state (a warm mapping) in one call, the
            # batch recorded in _held; else (None) the slot's first batch or an unguarded
            # stream, as below.
            lease = _take(ring, self, bptr, slot, _slots._pagemap_fd) if _take is not None else None
            if lease is None:
                lease = ring.lease(self, bptr, slot)
                st = lease.state
                self._held[id(st)] = st
        except BaseException:
            lib.lc_batch_release(bptr)
            raise
        return lease

    def _make_room(self):
        # Under the client lock. Released batches whose views live on: keep at most
        # MAX_DEFERRED of them leased; copy the oldest out of the ring beyond that.
        deferred = [st for st in self._held.values() if st.batch_released and not st.given_back]
        for st in deferred[:max(0, len(deferred) - MAX_DEFERRED)]:
            self._materialize(st)
        ring = self._ring
        if sum(1 for st in self._held.values() if st.ring is ring) >= ring.slot_count:
            raise LoaderdError(errors.ELIMIT, "all %d slots of stream %d are held by batches not released (auto_release="
                               "False?): release one before asking for the next" % (ring.slot_count, self.id))

    def _materialize(self, st):
        # Under the client lock: the views go on reading a private copy, and the slot goes back.
        st.ring.materialize(st)
        self._give_back_locked(st)

    def _batch_released(self, st):
        # Guarded streams give the slot back when the lease dies (_lease_dead), which
        # Batch.release may just have caused; unguarded ones at once.
        if not self.keep_views_safe:
            self._client._defer_or_run(self, st)

    def _give_back_locked(self, st):
        # Under the client lock. A batch of a ring from before a daemon restart is released
        # too: the library sends nothing for it and lets go of its old ring.
        if st.given_back:
            return
        st.given_back = True
        self._held.pop(id(st), None)
        if not self._closed:
            lib.lc_batch_release(st.bptr)   # pipelined: does not wait for the daemon's reply
        if st.views_dead:
            st.ring.recycle(st)

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
            if type(cur) is Batch:
                cur._views = cur._tensors = cur._ro = None
                cur._lease = None
            self._current = None
        self._closed = True
        self._ring.closed = True
        for st in list(self._held.values()):
            self._give_back_locked(st)   # no release sent: the stream's close frees the slots
        self._ring.close()
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
    Client per thread.

    ``reconnect``: seconds to keep trying when the daemon goes away (a restart, an
    upgrade, a crash); 0 never tries; default $LOADERD_RECONNECT, else 60. Meanwhile
    ``Stream.next()`` waits (that time does not count against its timeout) and then goes on
    at the batch after the last one it returned: no batch is repeated or skipped. Other
    calls that were waiting for a reply raise ConnectionLost and the next call reconnects.
    Past the reconnect time, ConnectionLost says how long it tried."""

    def __init__(self, socket: Optional[str] = None, timeout: Optional[float] = 30.0, name: str = "python",
                 reconnect: Optional[float] = None) -> None:
        self._h = None
        if reconnect is not None and (isinstance(reconnect, bool) or not isinstance(reconnect, (int, float))
                                      or not 0 <= reconnect <= 2147483):
            raise InvalidArgument(errors.EINVAL, "reconnect must be a number of seconds in [0, 2147483] (0: never), "
                                  "got %r" % (reconnect,))
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
        if reconnect is not None:
            lib.lc_client_set_reconnect(self._h, int(reconnect * 1000 + 0.5) if reconnect else 0)

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

    def open(self, dataset: Optional[str] = None, batch_size: Optional[int] = None, shuffle: bool = True,
             seed: int = 0, epoch: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None,
             drop_last: bool = False, start_batch: int = 0, prefetch: Optional[int] = None, epochs: int = 0,
             keep_views_safe: bool = True, auto_release: bool = True, device: Optional[str] = None,
             transfer: str = "ipc", device_normalize: Optional[Dict[str, Any]] = None,
             spec: Optional[Dict[str, Any]] = None, template: Optional[str] = None,
             transforms: Optional[Sequence[Any]] = None, share: Optional[str] = None,
             share_join: str = "current", handoff: str = "shm") -> Stream:
        """Opens a stream of `dataset` (a configured dataset's name), or of a dataset this
        trainer declares: spec={"kind": "image_folder", "path": "/data/x/train", "transforms":
        [...], ...} (the keys of a dataset in the daemon's config), or a configured dataset
        refined: template="imagenet" (or dataset=) with transforms=[...] and/or spec={keys to
        change}. Transforms are loaderclient.transforms objects (RandomResizedCrop(224), ...)
        or the config's dicts; Decode() goes first when missing. The daemon's access.declare
        must allow it: PermissionDenied names what it refused (a path outside the allowed
        roots, a file this user cannot read, ...); a wrong key raises ConfigError with
        "spec.KEY: ...". Then: batches of `batch_size`, shuffled with (seed, epoch)
        unless shuffle=False, this rank's share (rank, world_size; default 0, 1), starting at
        batch `start_batch` of `epoch`, `prefetch` batches prepared ahead (default: the
        daemon's), `epochs` epochs then end (0: unbounded). See the module documentation for
        keep_views_safe; auto_release=False keeps every batch until batch.release().
        device="cuda:N": batches are also on GPU N (batch.torch(name, device="cuda")); transfer
        "ipc" (the daemon copies, default) or "client" (this process copies, where CUDA IPC
        is not possible); device_normalize={"field", "mean", "std", "dtype", "layout"}: the
        daemon's GPU casts and normalizes that uint8 image field (see the README's GPU
        section). Raises DeviceError with the reason when the GPU cannot be used.
        share="NAME" (or "auto"): streams opened with the same name, dataset and settings
        read one ring, each batch prepared once (host batches only); a stream joining a
        running one starts at its next batch, or with share_join="epoch_start" in a stream
        of its own at batch 0 of the epoch it is in (see the README's shared streams).
        handoff="shm" (default): batches are announced and given back through queues in
        shared memory, no socket message per batch; "socket": a next and a release message
        per batch (LOADERD_HANDOFF=socket makes that the default)."""
        self._check()
        if batch_size is None:
            raise InvalidArgument(errors.EFIELD, "batch_size is required")
        name, spec_json, label = _declared(dataset, spec, template, transforms)
        o = LcStreamOptions()
        lib.lc_stream_options_init(ctypes.byref(o))
        o.spec = spec_json
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
        dev_name = None
        if device is not None:
            dev_name = str(device).encode()
            o.device = dev_name
            if transfer not in ("ipc", "client"):
                raise InvalidArgument(errors.EFIELD, "transfer must be 'ipc' or 'client', got %r" % (transfer,))
            o.transfer = 1 if transfer == "client" else 0
        if handoff not in ("shm", "socket"):
            raise InvalidArgument(errors.EFIELD, "handoff must be 'shm' or 'socket', got %r" % (handoff,))
        o.handoff = 1 if handoff == "socket" else 0
        norm_json = None
        if device_normalize is not None:
            norm_json = json.dumps(device_normalize).encode()
            o.device_normalize = norm_json
        share_name = None
        if share is not None:
            share_name = str(share).encode()
            o.share = share_name
            if share_join not in ("current", "epoch_start"):
                raise InvalidArgument(errors.EFIELD, "share_join must be 'current' or 'epoch_start', got %r"
                                      % (share_join,))
            o.share_join = 1 if share_join == "epoch_start" else 0
        h = ctypes.c_void_p()
        with self._lock:
            self._run_deferred()
            rc = lib.lc_stream_open(self._h, name, ctypes.byref(o), ctypes.byref(h))
            if rc < 0:
                raise self._error(rc)
            try:
                s = Stream(self, h.value, label, int(batch_size), int(epoch), int(start_batch),
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

    @property
    def reconnects(self) -> int:
        """How many times the connection was made again after the daemon went away."""
        return 0 if self._h is None else int(lib.lc_client_reconnects(self._h))

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


def _lease_dead(st):
    # The lease's finalizer (the extension does the steady state below in C: the same
    # steps, _speedups.c's speedups_give_back): the last view of a batch is gone (or the
    # batch never had any). Any thread, wherever the last reference was dropped: never
    # blocks. `views_dead` is set before `given_back` is read here, and _give_back_locked
    # sets `given_back` before it reads `views_dead`, so of two racing threads at least one
    # sees both and frees the mapping (drop_mapping is idempotent).
    st.views_dead = True
    if st.given_back:
        st.ring.views_dead_after_give_back(st)
        return
    if not st.batch_released:
        return
    # Client._defer_or_run and Stream._give_back_locked, inline: the steady state of a
    # training loop comes here for every batch.
    stream = st.stream
    client = stream._client
    lock = client._lock
    if not lock.acquire(False):
        client._deferred.append((stream, st))
        return
    try:
        if not st.given_back:
            st.given_back = True
            stream._held.pop(id(st), None)
            if not stream._closed:
                lib.lc_batch_release(st.bptr)   # pipelined: does not wait for the daemon's reply
            ring = st.ring
            if st.owns_addr and not st.materialized and not ring.closed and ring.alias[st.slot] is None:
                # SlotRing.recycle, inline and without its lock: the mapping goes back to the
                # slot. Nothing else can take it now: this is the lease's one finalizer, and
                # every other path to it (_give_back_locked, close, a restart) holds the
                # client's lock.
                st.owns_addr = False
                ring.alias[st.slot] = st.addr
            else:
                ring.recycle(st)
        if client._deferred:
            client._run_deferred()
    finally:
        lock.release()


_slots.set_lease_finalizer(_lease_dead, sys.modules[__name__])

# Batch's hints name Stream; typing.get_type_hints resolves them in _batch's namespace.
_batch.Stream = Stream
