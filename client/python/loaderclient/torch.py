"""LoaderdDataLoader: loaderd's batches where a torch DataLoader was.

    from loaderclient.torch import LoaderdDataLoader
    loader = LoaderdDataLoader("records", batch_size=64, shuffle=True, seed=0)
    for epoch in range(10):
        loader.set_epoch(epoch)             # optional: epochs advance by themselves
        for data, label in loader:          # (data, label): the dataset's field order
            ...

One daemon stream serves consecutive epochs (it is opened with epochs=0, unbounded, and
each ``iter()`` consumes exactly ``len(loader)`` batches of it, so the daemon prefetches
across the epoch boundary); a jump to another epoch, or an epoch abandoned midway,
reopens it at the right place.

Tensors share the slot's memory (no copy) and are valid until the next batch is asked
for, in this epoch or the next, or the loader is closed. In-place operations on them work
(``x.mul_(0.7)``): the pages they write become private copies of this process, dropped
before the slot holds another batch; the daemon's memory is never changed. Fields with one
value per sample (labels) are
small and always copied, so keeping them (e.g. for metrics) is safe; fields of a dtype
torch lacks (uint16, uint32 tokens) are converted to int64 copies.
"""
import time

import torch

from .client import Client, RaggedField, _Closes, _TORCH_DTYPES
from .errors import InvalidArgument, LoaderdError

__all__ = ["LoaderdDataLoader"]


def _dist_rank_world():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None, None


class LoaderdDataLoader(_Closes):
    """An iterable over one epoch of a loaderd dataset per ``iter()``, yielding tuples of
    torch tensors in the dataset's field order (or of `fields`, in that order; a bare
    tensor when there is one field; dicts with as_dict=True).

    dataset, batch_size, shuffle, seed, drop_last, prefetch: as Client.open.
    rank, world_size: this process's share; default torch.distributed's when it is
        initialized, else 0 and 1.
    socket, timeout: the daemon's socket (default: Client's default) and the per-call
        timeout in seconds.
    device: copy each batch there (``tensor.to(device, non_blocking=True)``); the slot is
        given back at once. None or "cpu": zero-copy tensors of the shared slot.
    pin_memory: return pinned copies (tensor.pin_memory(); needs CUDA). loaderd's slots are
        shared memory, not pinned: pinning and device copies done by the daemon belong to
        its device stage (not in this version).
    copy: return tensors that own their memory (safe to keep; costs one copy).
    """

    def __init__(self, dataset, batch_size, shuffle=True, seed=0, socket=None, drop_last=False, prefetch=None,
                 rank=None, world_size=None, fields=None, device=None, pin_memory=False, copy=False,
                 as_dict=False, timeout=30.0, keep_views_safe=True, name="loaderd-torch"):
        if rank is None or world_size is None:
            drank, dworld = _dist_rank_world()
            if rank is None:
                rank = drank if drank is not None else 0
            if world_size is None:
                world_size = dworld if dworld is not None else 1
        if device is not None:
            device = torch.device(device)
            if device.type == "cpu":
                device = None
        if pin_memory and not torch.cuda.is_available():
            raise RuntimeError("pin_memory=True needs CUDA (torch.cuda.is_available() is False here); loaderd's "
                               "slots are shared host memory already: leave pin_memory off on a CPU-only machine")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.pin_memory = bool(pin_memory)
        self.copy = bool(copy)
        self.as_dict = bool(as_dict)
        self.keep_views_safe = keep_views_safe
        self._want_fields = list(fields) if fields is not None else None
        self._socket = socket
        self._timeout = timeout
        self._name = name
        self._client = None
        self._stream = None
        self._plan = None         # [(field layout, copy?)] resolved at a stream's first batch
        self._plan_stream = None
        self._epoch = 0           # the epoch the next iter() delivers
        self._active = None       # the iterator allowed to consume the stream
        self.reopens = 0          # streams opened after the first (for tests and curiosity)
        self.wait_s = 0.0         # time spent blocked waiting for batches
        self.batches = 0

    # -- the stream ----------------------------------------------------------------------------

    def _open(self, epoch):
        if self._client is None:
            self._client = Client(self._socket, timeout=self._timeout, name=self._name)
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self.reopens += 1
        self._stream = self._client.open(self.dataset, self.batch_size, shuffle=self.shuffle, seed=self.seed,
                                         epoch=epoch, rank=self.rank, world_size=self.world_size,
                                         drop_last=self.drop_last, prefetch=self.prefetch, epochs=0,
                                         keep_views_safe=self.keep_views_safe)
        return self._stream

    def _stream_at(self, epoch):
        s = self._stream
        if s is None or s.closed or s.position != (epoch, 0):
            s = self._open(epoch)
        return s

    @property
    def stream(self):
        """The daemon stream in use (None before the first use)."""
        return self._stream

    def __len__(self):
        s = self._stream if self._stream is not None and not self._stream.closed else self._open(self._epoch)
        return int(s.batches_per_epoch)

    def set_epoch(self, epoch):
        """The epoch the next iter() delivers (like DistributedSampler.set_epoch). Without it,
        each iter() delivers the epoch after the previous one's."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(-4003, "epoch must be a non-negative integer, got %r" % (epoch,))
        self._epoch = epoch

    def __iter__(self):
        e = self._epoch
        self._epoch = e + 1
        it = _EpochIterator(self, e, self._stream_at(e))
        self._active = it
        return it

    # -- batch -> tensors ------------------------------------------------------------------------

    def _resolve(self, batch):
        layout = batch._stream._by_name
        names = self._want_fields if self._want_fields is not None else batch.fields
        plan = []
        for n in names:
            f = layout.get(n)
            if f is None:
                raise InvalidArgument(-4003, "dataset %r has no field %r (fields: %s)"
                                      % (self.dataset, n, ", ".join(batch.fields)))
            # Per-sample scalars (labels) and dtypes torch lacks are copied; the rest shared.
            own = self.copy or (not f.ragged and (f.shape == () or f.dtype not in _TORCH_DTYPES))
            plan.append((f, own))
        self._plan = plan
        self._names = [f.name for f, _ in plan]
        self._all_owned = all(own for _, own in plan) or self.device is not None or self.pin_memory

    def _convert(self, batch):
        if self._plan is None or self._plan_stream is not batch._stream:
            self._resolve(batch)
            self._plan_stream = batch._stream
        out = batch._torch_plan(self._plan)
        dev = self.device
        if dev is not None:
            out = [_map(t, lambda x: x.to(dev, non_blocking=True)) for t in out]
        elif self.pin_memory:
            out = [_map(t, lambda x: x.pin_memory()) for t in out]
        if self._all_owned:
            batch.release()
        if self.as_dict:
            return dict(zip(self._names, out))
        return out[0] if len(out) == 1 else tuple(out)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self):
        """Closes the stream and the connection; tensors still shared become invalid for
        the loader (they keep their bytes, see the README). Idempotent."""
        self._active = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def __repr__(self):
        return "<LoaderdDataLoader %r batch_size=%d rank=%d/%d epoch=%d>" % (
            self.dataset, self.batch_size, self.rank, self.world_size, self._epoch)


def _map(t, fn):
    if isinstance(t, RaggedField):
        return RaggedField(fn(t.offsets), fn(t.data), t.name)
    return fn(t)


class _EpochIterator:
    """One epoch: exactly len(loader) batches of the loader's stream."""

    def __init__(self, loader, epoch, stream):
        self._loader = loader
        self.epoch = epoch
        self._stream = stream
        self._n = 0
        self._len = int(stream.batches_per_epoch)

    def __iter__(self):
        return self

    def __len__(self):
        return self._len - self._n

    def __next__(self):
        ld = self._loader
        if self._n >= self._len:
            if ld._active is self:
                ld._active = None
            raise StopIteration
        if ld._active is not self or ld._stream is not self._stream:
            raise RuntimeError("this epoch's iterator was superseded by a newer iter(loader) or close()")
        t0 = time.perf_counter()
        b = self._stream.next()
        ld.wait_s += time.perf_counter() - t0
        ld.batches += 1
        if b.epoch != self.epoch or b.index != self._n:
            raise LoaderdError(-71, "expected batch %d of epoch %d, loaderd sent batch %d of epoch %d"
                               % (self._n, self.epoch, b.index, b.epoch))
        self._n += 1
        return ld._convert(b)
