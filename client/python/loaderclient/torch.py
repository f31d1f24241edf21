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
from __future__ import annotations

import warnings
from time import perf_counter as _clock
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

import torch

from .client import Client, RaggedField, Stream, _Closes, _TORCH_DTYPES
from ._batch import TorchPlan
from . import errors
from .errors import EDEVICE, DeviceError, InvalidArgument, LoaderdError

_from_numpy = torch.from_numpy

__all__ = ["LoaderdDataLoader", "ShareChanged"]

# DataLoader's arguments that mean nothing here: a one-time warning each.
_IGNORED = {
    "num_workers": "loaderd's own workers read and decode (server.workers in its config)",
    "worker_init_fn": "no worker process of this loader runs code",
    "multiprocessing_context": "no worker process of this loader is started",
    "pin_memory_device": "use device= to have batches copied to a device",
}
_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


class ShareChanged(RuntimeError):
    """The loader delivered batches as one rank / world size, and torch.distributed now
    says another: the batches so far were not this rank's share."""


def _dist_rank_world():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None, None


_KINDS = {"images": "image_folder", "image_folder": "image_folder", "files": "files"}


def _declared_spec(dataset, root, kind, transforms, pattern, spec):
    """Client.open's dataset arguments for LoaderdDataLoader's description."""
    if root is None and spec is None and transforms is None:
        if dataset is None:
            raise InvalidArgument(-4003, "LoaderdDataLoader needs a configured dataset's name, or root= (a "
                                  "folder to declare)")
        return {"dataset": dataset}
    if dataset is not None:
        if root is not None:
            raise InvalidArgument(-4003, "give either dataset=%r (configured) or root=%r (declared), not both"
                                  % (dataset, root))
        return {"template": dataset, "transforms": transforms, "spec": spec}
    if kind not in _KINDS:
        raise InvalidArgument(-4003, "kind must be one of %s, got %r" % (", ".join(sorted(_KINDS)), kind))
    obj: Dict[str, Any] = {"kind": _KINDS[kind]}
    if root is not None:
        obj["path"] = str(root)
    if pattern is not None:
        obj["pattern"] = pattern
    obj.update(spec or {})
    if obj["kind"] == "image_folder" and transforms is None and "transforms" not in obj:
        raise InvalidArgument(-4003, "kind=%r needs transforms= (e.g. [Resize(256), CenterCrop(224)]): every "
                              "image of a batch must come out the same size" % (kind,))
    return {"spec": obj, "transforms": transforms}


class LoaderdDataLoader(_Closes):
    """An iterable over one epoch of a loaderd dataset per ``iter()``, yielding tuples of
    torch tensors in the dataset's field order (or of `fields`, in that order; a bare
    tensor when there is one field; dicts with as_dict=True).

    dataset, batch_size, shuffle, seed, drop_last, prefetch: as Client.open (`dataset` is
        the name of a dataset configured in loaderd).
    root, kind, transforms, pattern: a dataset this script declares instead, with no edit
        of the daemon's config (its access.declare must allow it): the folder `root`, of
        kind "images" (class sub-folders of JPEG/PNG: the pipeline `transforms`, e.g.
        [RandomResizedCrop(224), RandomHorizontalFlip()] from loaderclient.transforms, a
        Decode() first when missing) or "files" (raw bytes), `pattern` a glob on the paths
        (default "*"). With `dataset` as well, `transforms` refines that configured dataset
        (its folder and cache stay the operator's). spec={...}: any other key of a dataset,
        merged over what these give. A train and a validation split are two loaders:
            train = LoaderdDataLoader(root="/data/imagenet/train", kind="images", batch_size=256,
                                      transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
            val = LoaderdDataLoader(root="/data/imagenet/val", kind="images", batch_size=256,
                                    transforms=[Resize(256), CenterCrop(224)], shuffle=False)
    rank, world_size: this process's share. Default: torch.distributed's, read at the first
        ``iter()`` (so a loader built before ``init_process_group`` gets the right share), else
        0 and 1. A process group that appears after batches were delivered with another
        share raises ShareChanged.
    socket, timeout: the daemon's socket (default: Client's default) and the per-call
        timeout in seconds; timeout=0 (DataLoader's default) waits for batches without limit.
    reconnect: seconds to wait for a daemon that went away to come back (a restart): the
        loop only pauses, and goes on with the very next batch. 0 never waits (the loop
        raises ConnectionLost); default $LOADERD_RECONNECT, else 60 (see Client).
    device: "cuda" or "cuda:N": the daemon puts each batch on that GPU (transfer "ipc", or
        "client" where CUDA IPC is not possible) and the tensors are CUDA tensors on its
        device memory, with torch's current stream made to wait for each batch; a batch
        stays leased while its tensors live. Without CUDA (in torch, the driver, or the
        daemon) it raises DeviceError. Another device: each batch is copied there
        (``tensor.to(device, non_blocking=True)``) and the slot is given back at once. None
        or "cpu": zero-copy tensors of the shared slot.
    pin_memory: return pinned copies (tensor.pin_memory()). Without CUDA it warns and is
        off, as DataLoader does.
    copy: return tensors that own their memory (safe to keep; costs one copy).
    check: connect and open the stream now, so that a wrong dataset name, no daemon, or a
        batch the daemon refuses raise here rather than at the first ``iter()`` (see check()).

    DataLoader's other arguments are accepted: prefetch_factor (times max(1, num_workers))
    sets `prefetch` when that is not given; generator sets `seed` (its initial_seed()) when
    that is not given; persistent_workers is what this loader does anyway; collate_fn may be
    None or default_collate (batches arrive collated); num_workers, worker_init_fn,
    multiprocessing_context and pin_memory_device are ignored with a one-time warning.
    sampler and batch_sampler raise InvalidArgument: the daemon samples (shuffle, seed, rank,
    world_size).
    """

    def __init__(self, dataset: Optional[str] = None, batch_size: int = 1, shuffle: bool = True,
                 seed: Optional[int] = None, socket: Optional[str] = None, drop_last: bool = False, prefetch: Optional[int] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None, fields: Optional[Sequence[str]] = None,
                 device: Union[str, torch.device, None] = None, pin_memory: bool = False, copy: bool = False,
                 as_dict: bool = False, timeout: Optional[float] = 30.0, keep_views_safe: bool = True,
                 name: str = "loaderd-torch", check: bool = True, sampler: Any = None, batch_sampler: Any = None,
                 num_workers: int = 0, collate_fn: Optional[Callable[..., Any]] = None,
                 worker_init_fn: Optional[Callable[..., Any]] = None, multiprocessing_context: Any = None,
                 generator: Optional[torch.Generator] = None, prefetch_factor: Optional[int] = None,
                 persistent_workers: bool = False, pin_memory_device: str = "",
                 reconnect: Optional[float] = None, transfer: str = "ipc", root: Optional[str] = None,
                 kind: str = "images", transforms: Optional[Sequence[Any]] = None, pattern: Optional[str] = None,
                 spec: Optional[Dict[str, Any]] = None) -> None:
        if dataset is not None and not isinstance(dataset, str):
            raise InvalidArgument(-4003, "dataset must be the name of a dataset configured in loaderd (a str), "
                                  "got %s: loaderd reads and samples the data itself; to read a folder of your "
                                  "own, give root= (and kind=, transforms=)" % type(dataset).__name__)
        self._declare = _declared_spec(dataset, root, kind, transforms, pattern, spec)
        if sampler is not None or batch_sampler is not None:
            raise InvalidArgument(-4003, "%s is not supported: loaderd samples in the daemon; use shuffle, seed, "
                                  "rank and world_size (DistributedSampler's arguments) instead"
                                  % ("sampler" if sampler is not None else "batch_sampler"))
        if collate_fn is not None and collate_fn is not getattr(torch.utils.data, "default_collate", None):
            raise InvalidArgument(-4003, "collate_fn %r is not supported: loaderd delivers batches already "
                                  "collated (one tensor per field); apply your function to each batch in the "
                                  "training loop" % (getattr(collate_fn, "__name__", collate_fn),))
        given = {"num_workers": num_workers, "worker_init_fn": worker_init_fn,
                 "multiprocessing_context": multiprocessing_context, "pin_memory_device": pin_memory_device}
        for k, v in given.items():
            if v:
                _warn_once(k, "LoaderdDataLoader: %s=%r is ignored: %s" % (k, v, _IGNORED[k]))
        if prefetch is None and prefetch_factor is not None:
            prefetch = max(1, min(64, int(prefetch_factor) * max(1, int(num_workers or 0))))
        if seed is None:
            seed = int(generator.initial_seed()) % (1 << 53) if generator is not None else 0
        self._gpu = None          # "cuda:N" when the daemon puts batches on the GPU
        if device is not None:
            device = torch.device(device)
            if device.type == "cpu":
                device = None
            elif device.type == "cuda":
                if not torch.cuda.is_available():
                    raise DeviceError(EDEVICE, "LoaderdDataLoader(device=%r): torch has no usable CUDA here "
                                      "(torch.cuda.is_available() is False)" % (str(device),))
                index = device.index if device.index is not None else torch.cuda.current_device()
                self._gpu = "cuda:%d" % index
                if transfer not in ("ipc", "client"):
                    raise InvalidArgument(-4003, "transfer must be 'ipc' or 'client', got %r" % (transfer,))
        self._transfer = transfer
        if pin_memory and not torch.cuda.is_available():
            _warn_once("pin_memory", "LoaderdDataLoader: pin_memory=True but CUDA is not available here: "
                       "batches are not pinned (loaderd's slots are shared host memory)")
            pin_memory = False
        if timeout is None or timeout == 0:
            timeout, self._next_ms = 30.0, 2**31 - 1   # DataLoader's 0: no limit
        else:
            self._next_ms = None                       # the client's timeout, set when it connects
        self.dataset = dataset if dataset is not None else "spec:%s" % str(root or "").rstrip("/").split("/")[-1]
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.prefetch = prefetch
        self._rank_arg = rank
        self._world_arg = world_size
        self._share = None        # (rank, world_size) of the open stream
        self._delivered = None    # (rank, world_size) of batches already handed out
        self.device = device
        self.pin_memory = bool(pin_memory)
        self.copy = bool(copy)
        self.as_dict = bool(as_dict)
        self.keep_views_safe = keep_views_safe
        self._want_fields = list(fields) if fields is not None else None
        self._socket = socket
        self._timeout = timeout
        self._reconnect = reconnect
        self._name = name
        self._client = None
        self._stream = None
        self._plan = None         # TorchPlan: (field layout, copy?) resolved at a stream's first batch
        self._fast = None         # the plan again when Stream._next makes the tensors itself
        self._epoch = 0           # the epoch the next iter() delivers
        self._active = None       # the iterator allowed to consume the stream
        self.reopens = 0          # streams opened after the first (for tests and curiosity)
        self.wait_s = 0.0         # time spent blocked waiting for batches
        self.batches = 0
        if check:
            try:
                self.check()
            except BaseException:
                self.close()
                raise

    # -- this rank's share ----------------------------------------------------------------------

    def _current_share(self):
        """(rank, world_size) as things stand: the arguments, else torch.distributed's, else 0, 1."""
        drank, dworld = (None, None) if self._rank_arg is not None and self._world_arg is not None \
            else _dist_rank_world()
        rank = self._rank_arg if self._rank_arg is not None else (drank if drank is not None else 0)
        world = self._world_arg if self._world_arg is not None else (dworld if dworld is not None else 1)
        return rank, world

    @property
    def rank(self) -> int:
        """This process's rank: the one batches were delivered for, else as things stand."""
        return (self._delivered or self._current_share())[0]

    @property
    def world_size(self) -> int:
        return (self._delivered or self._current_share())[1]

    def check(self) -> Dict[str, Any]:
        """Connects and opens the stream for the share known now (the daemon checks the
        dataset name, the batch size against the data and the memory budget); raises what
        the first ``iter()`` would. Returns {dataset, rank, world_size, batches_per_epoch,
        samples_per_epoch, fields}. The stream is the one the first epoch then reads (it is
        reopened if torch.distributed gives another share by then)."""
        s = self._stream_at(self._epoch, self._current_share())
        return {"dataset": self.dataset, "rank": self._share[0], "world_size": self._share[1],
                "batches_per_epoch": int(s.batches_per_epoch), "samples_per_epoch": int(s.samples_per_epoch),
                "fields": s.fields}

    # -- the stream ----------------------------------------------------------------------------

    def _open(self, epoch, share):
        if self._client is None:
            self._client = Client(self._socket, timeout=self._timeout, name=self._name, reconnect=self._reconnect)
            if self._next_ms is None:
                self._next_ms = self._client._timeout_ms
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self.reopens += 1
        self._stream = self._client.open(batch_size=self.batch_size, shuffle=self.shuffle, seed=self.seed,
                                         epoch=epoch, rank=share[0], world_size=share[1],
                                         drop_last=self.drop_last, prefetch=self.prefetch, epochs=0,
                                         keep_views_safe=self.keep_views_safe, device=self._gpu,
                                         transfer=self._transfer, **self._declare)
        self._share = share
        return self._stream

    def _stream_at(self, epoch, share):
        s = self._stream
        if s is None or s.closed or s.position != (epoch, 0) or self._share != share:
            s = self._open(epoch, share)
        return s

    @property
    def stream(self) -> Optional[Stream]:
        """The daemon stream in use (None before the first use)."""
        return self._stream

    def __len__(self) -> int:
        share = self._pinned_share()
        s = self._stream
        if s is None or s.closed or self._share != share:
            s = self._stream_at(self._epoch, share)
        return int(s.batches_per_epoch)

    def _pinned_share(self):
        """The share of the next epoch: the one batches were delivered for (a process group
        that appeared since with another one is refused), else the current one."""
        share = self._current_share()
        if self._delivered is not None and share != self._delivered:
            raise ShareChanged(
                "LoaderdDataLoader(%r) delivered batches as rank %d of %d, and torch.distributed now says rank %d "
                "of %d: those batches were not this rank's share. Create the loader after "
                "init_process_group() (or iterate it only after), or pass rank= and world_size="
                % ((self.dataset,) + self._delivered + share))
        return share

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iter() delivers (like DistributedSampler.set_epoch). Without it,
        each iter() delivers the epoch after the previous one's."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(-4003, "epoch must be a non-negative integer, got %r" % (epoch,))
        self._epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        e = self._epoch
        share = self._pinned_share()
        it = _EpochIterator(self, e, self._stream_at(e, share))
        self._epoch = e + 1
        self._active = it
        return it

    # -- batch -> tensors ------------------------------------------------------------------------

    def _resolve(self, batch):
        layout = batch._state.ring.by_name
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
        self._plan = TorchPlan(plan, batch._state.ring)
        self._names = [f.name for f, _ in plan]
        self._all_owned = self._gpu is None and (all(own for _, own in plan) or self.device is not None or
                                                 self.pin_memory)
        # The stream's per-batch path without a Batch object (Stream._next with a plan):
        # tensors on the host, shared until the next batch, made by the extension.
        s = batch._stream
        self._fast = self._plan if (self._gpu is None and not self._all_owned and self._plan.spec is not None
                                    and s.keep_views_safe and s.auto_release) else None

    def _convert(self, batch):
        # A plan holds the field offsets of one ring: a new stream, or a stream reopened
        # after a daemon restart, gets its own.
        if self._plan is None or self._plan.ring is not batch._state.ring:
            self._resolve(batch)
        dev = self.device
        if self._gpu is not None:
            # On the daemon's device memory; each tensor keeps the batch leased.
            out = [batch.torch(f.name, device=self._gpu) for f, _ in self._plan.fields]
        else:
            out = batch._torch_plan(self._plan)
            if dev is not None:
                out = [_map(t, lambda x: x.to(dev, non_blocking=True)) for t in out]
            elif self.pin_memory:
                out = [_map(t, lambda x: x.pin_memory()) for t in out]
        if self._all_owned:
            batch.release()
        return self._shape(out)

    def _shape(self, out):
        if self.as_dict:
            return dict(zip(self._names, out))
        return out[0] if len(out) == 1 else tuple(out)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the stream and the connection; tensors still shared become invalid for
        the loader (they keep their bytes, see the README). Idempotent."""
        self._active = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def __repr__(self) -> str:
        rank, world = self._delivered or self._share or (self._rank_arg, self._world_arg)
        return "<LoaderdDataLoader %r batch_size=%d rank=%s/%s epoch=%d>" % (
            self.dataset, self.batch_size, rank, world, self._epoch)


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
        t0 = _clock()
        fast = ld._fast
        # With a plan: the tensors, made in the same call (their few µs count as waiting).
        b = self._stream._next(ld._next_ms) if fast is None else self._stream._next(ld._next_ms, fast, _from_numpy)
        ld.wait_s += _clock() - t0
        ld.batches += 1
        ld._delivered = ld._share
        if type(b) is tuple:
            out, epoch, index = b
        else:
            epoch, index = b.epoch, b.index
        if index != self._n or epoch != self.epoch:
            raise LoaderdError(errors.EPROTO, "expected batch %d of epoch %d, loaderd sent batch %d of epoch %d"
                               % (self._n, self.epoch, index, epoch))
        self._n += 1
        return ld._shape(out) if type(b) is tuple else ld._convert(b)
