"""LoaderdDataLoader against a real loaderd."""
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

import support
from conftest import REC, TOK, VAR
from batch_checks import file_of, mapping_of

import loaderclient
from loaderclient.torch import LoaderdDataLoader


@pytest.fixture
def make_loader(daemon):
    made = []

    def make(dataset="rec", batch_size=64, **kw):
        kw.setdefault("timeout", 10)
        ld = LoaderdDataLoader(dataset, batch_size, socket=daemon.socket, **kw)
        made.append(ld)
        return ld
    yield make
    for ld in made:
        ld.close()


def epoch_ids(loader, index):
    ids = []
    for data, label in loader:
        x = data.numpy()
        for r in range(x.shape[0]):
            i = file_of(x[r], index)
            assert (x[r] == support.file_bytes(i, REC["size"])).all()
            assert label[r].item() == i % REC["classes"]
            ids.append(i)
    return ids


def in_ring(t):
    m = mapping_of(t.data_ptr())
    return m is not None and "loaderd." in m["path"]


def test_len_types_and_zero_copy(make_loader, rec_index):
    ld = make_loader()
    assert len(ld) == 16
    assert len(make_loader(drop_last=True)) == REC["n"] // 64
    n = 0
    for data, label in ld:
        assert data.dtype == torch.uint8 and data.shape[1:] == (REC["size"],)
        assert label.dtype == torch.int64 and label.shape == (data.shape[0],)
        assert in_ring(data)            # zero-copy: the shared slot
        assert not in_ring(label)       # labels are copied (safe to keep)
        n += data.shape[0]
    assert n == REC["n"] and ld.batches == 16
    # The last batch of the epoch is short (1000 = 15 x 64 + 40), views and copies alike.
    assert data.shape[0] == label.shape[0] == REC["n"] - 15 * 64
    ids = [file_of(data[r].numpy(), rec_index) for r in range(data.shape[0])]
    assert label.tolist() == [i % REC["classes"] for i in ids]


def test_one_stream_across_epochs(make_loader, rec_index):
    ld = make_loader(seed=4)
    e0 = epoch_ids(ld, rec_index)
    sid = ld.stream.id
    e1 = epoch_ids(ld, rec_index)           # epochs advance by themselves
    assert ld.stream.id == sid and ld.reopens == 0
    assert sorted(e0) == sorted(e1) == list(range(REC["n"])) and e0 != e1
    ld.set_epoch(2)
    epoch_ids(ld, rec_index)
    assert ld.stream.id == sid and ld.reopens == 0
    # Same seed and epoch from a fresh loader: the same order.
    other = make_loader(seed=4)
    other.set_epoch(1)
    assert epoch_ids(other, rec_index) == e1
    other.set_epoch(0)                       # a jump back: the stream is reopened
    # (twice: the stream opened by the constructor, for epoch 0, was replaced for epoch 1)
    assert epoch_ids(other, rec_index) == e0 and other.reopens == 2
    assert epoch_ids(make_loader(seed=5), rec_index) != e0


def test_set_epoch_and_abandoned_epoch(make_loader, rec_index):
    ld = make_loader(seed=2)
    ld.set_epoch(3)
    full3 = epoch_ids(ld, rec_index)
    ld.set_epoch(5)
    it = iter(ld)
    next(it)
    next(it)                                 # abandoned after two batches
    ld.set_epoch(5)
    five = epoch_ids(ld, rec_index)          # reopened: all of epoch 5, from its first batch
    assert sorted(five) == list(range(REC["n"])) and five != full3
    assert ld.reopens == 3                   # 0 -> 3 (the constructor's), 3 -> 5, the abandoned 5
    ld.set_epoch(3)
    assert epoch_ids(ld, rec_index) == full3
    with pytest.raises(loaderclient.InvalidArgument):
        ld.set_epoch(-1)


def test_superseded_iterator(make_loader):
    ld = make_loader()
    it1 = iter(ld)
    next(it1)
    it2 = iter(ld)
    next(it2)
    with pytest.raises(RuntimeError, match="superseded"):
        next(it1)


def test_ranks_split_the_epoch(make_loader, rec_index):
    a = epoch_ids(make_loader(rank=0, world_size=2, seed=1), rec_index)
    b = epoch_ids(make_loader(rank=1, world_size=2, seed=1), rec_index)
    assert len(a) == len(b) == REC["n"] // 2
    assert sorted(a + b) == list(range(REC["n"]))


_DIST_RANK = """
import json, sys
import torch.distributed as dist
from loaderclient.torch import LoaderdDataLoader, ShareChanged
sock, store, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
early = LoaderdDataLoader("rec", 64, socket=sock, seed=3, timeout=20)   # before the process group
n_before = len(early)                                                  # as things stand: 0 of 1
stale = LoaderdDataLoader("rec", 64, socket=sock, seed=3, timeout=20)
next(iter(stale))                                                      # delivered as 0 of 1
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
words = [int.from_bytes(row[:8].numpy().tobytes(), "little") for data, _ in early for row in data]
try:
    iter(stale)
    refused = ""
except ShareChanged as e:
    refused = str(e)
out = {"n_before": n_before, "len": len(early), "share": [early.rank, early.world_size], "words": words,
       "refused": refused, "reopens": early.reopens}
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_share_from_torch_distributed_at_first_iter(daemon, scratch, rec_index):
    """Two processes of a real gloo process group, loaders built before
    init_process_group: each epoch delivers this rank's half; a loader that delivered
    batches before the group existed refuses to go on with another share."""
    import json
    store = scratch / "store"
    procs = [support.start_python(_DIST_RANK, daemon.socket, store, r) for r in (0, 1)]
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                for q in procs:
                    q.kill()
        assert p.returncode == 0, "rank %d: %s" % (r, err[-3000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    halves = []
    for r, o in enumerate(outs):
        assert o["n_before"] == 16                          # 1000 samples, batch 64, world 1
        assert o["len"] == 8 and o["share"] == [r, 2]       # 500 samples each at the first iter()
        assert o["reopens"] == 1                            # the stream opened for 0 of 1 was replaced
        ids = [rec_index[w] for w in o["words"]]
        assert len(ids) == 500
        halves.append(set(ids))
        assert "rank 0 of 1" in o["refused"] and "rank %d of 2" % r in o["refused"]
    assert not halves[0] & halves[1] and halves[0] | halves[1] == set(range(REC["n"]))


def test_explicit_share_wins(make_loader, rec_index):
    ld = make_loader(rank=1, world_size=4)
    assert (ld.rank, ld.world_size) == (1, 4) and len(ld) == 4    # 250 samples, batch 64
    ids = epoch_ids(ld, rec_index)
    assert len(ids) == 250
    others = [set(epoch_ids(make_loader(rank=r, world_size=4), rec_index)) for r in (0, 2, 3)]
    assert set(ids).isdisjoint(set().union(*others)) and len(set(ids).union(*others)) == REC["n"]


def test_copy_device_and_pin_memory(make_loader, rec_index):
    ld = make_loader(copy=True)
    kept = []
    for data, label in ld:
        assert not in_ring(data)
        assert ld.stream.held_batches() == 0      # released at once: nothing shared was handed out
        kept.append(data)
    ids = [file_of(x.numpy()[r], rec_index) for x in kept for r in range(x.shape[0])]
    assert sorted(ids) == list(range(REC["n"]))
    cpu = make_loader(device="cpu")                # the host: zero-copy as without a device
    data, _ = next(iter(cpu))
    assert in_ring(data)
    if not torch.cuda.is_available():
        import loaderclient.torch as lt
        lt._warned.discard("pin_memory")
        with pytest.warns(UserWarning, match="pin_memory=True but CUDA is not available"):
            pinned = make_loader(pin_memory=True)
        assert not pinned.pin_memory
        data, _ = next(iter(pinned))
        assert in_ring(data)                       # as without pin_memory


def test_dicts_fields_and_tokens(make_loader):
    ld = make_loader(as_dict=True)
    d = next(iter(ld))
    assert list(d) == ["data", "label"]
    only = make_loader(fields=["label"])
    lab = next(iter(only))
    assert isinstance(lab, torch.Tensor) and lab.dtype == torch.int64
    with pytest.raises(loaderclient.InvalidArgument, match="no field 'nope'"):
        next(iter(make_loader(fields=["nope"])))
    ctx = TOK["context"]
    tok = make_loader("tok", 8, shuffle=False)
    t = next(iter(tok))                           # one field: a bare tensor, uint16 -> int64
    assert t.dtype == torch.int64 and t.shape == (8, ctx + 1)
    assert (t[1].numpy() == support.tokens(ctx, ctx + 1)).all()


def test_ragged_fields(make_loader):
    index = {support.file_word0(i): i for i in range(VAR["n"])}
    ld = make_loader("var", 32, seed=3)
    seen = []
    for rf, label in ld:
        assert isinstance(rf, loaderclient.RaggedField) and len(rf) == label.shape[0]
        assert isinstance(rf.data, torch.Tensor) and rf.offsets.dtype == torch.int64
        assert in_ring(rf.data)
        for r in range(len(rf)):
            s = rf[r].numpy()
            i = file_of(s, index)
            assert (s == support.file_bytes(i, VAR["size"], vary=True)).all()
            assert label[r].item() == i % VAR["classes"]
            seen.append(i)
    assert sorted(seen) == list(range(VAR["n"]))


def test_training_step_works(make_loader):
    """A tiny model trains from the loader: the usual out-of-place conversion is fine."""
    torch.manual_seed(0)
    model = torch.nn.Linear(REC["size"], REC["classes"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ld = make_loader(seed=0)
    t0 = time.perf_counter()
    for data, label in ld:
        loss = torch.nn.functional.cross_entropy(model(data.float() / 255), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    assert torch.isfinite(loss)
    # wait_s counts the time next() blocked: some, and less than the whole loop took.
    assert 0 < ld.wait_s < elapsed and ld.batches == len(ld)


def test_loader_close(make_loader):
    ld = make_loader()
    data, label = next(iter(ld))
    want = data.clone()
    ld.close()
    assert ld.stream is None
    assert torch.equal(data, want)     # a closed stream's slots are not written again
    ld.close()
    # Usable again: a new connection and stream.
    assert len(ld) == 16


def test_daemon_killed_mid_epoch(spare_daemon, rec_index):
    # reconnect=0: the loop raises ConnectionLost at once; the tensors it had stay readable.
    ld = LoaderdDataLoader("rec", 16, socket=spare_daemon.socket, timeout=5, reconnect=0)
    try:
        it = iter(ld)
        data, label = next(it)
        os.kill(spare_daemon.pid, signal.SIGKILL)
        spare_daemon.proc.wait()
        with pytest.raises(loaderclient.ConnectionLost):
            for _ in range(100):
                data, label = next(it)     # the batches handed over before the death come first
        assert data.shape[0] == 16
        for r in range(16):
            i = file_of(data[r].numpy(), rec_index)
            assert (data[r].numpy() == support.file_bytes(i, REC["size"])).all() and label[r] == i % REC["classes"]
    finally:
        ld.close()


# -- DataLoader's arguments and early errors ---------------------------------------------------------

def test_dataloader_keywords(make_loader, client, rec_index):
    """DataLoader's usual keyword arguments are accepted: mapped, or ignored with one
    warning each (per process), never a TypeError."""
    import warnings
    import loaderclient.torch as lt
    lt._warned.clear()
    gen = torch.Generator().manual_seed(5)
    with pytest.warns(UserWarning) as w:
        ld = make_loader(num_workers=4, prefetch_factor=3, persistent_workers=True, pin_memory=False, timeout=0,
                         worker_init_fn=lambda i: None, generator=gen, multiprocessing_context="spawn",
                         collate_fn=torch.utils.data.default_collate, batch_size=64, shuffle=True)
    said = sorted(str(x.message).split("=")[0].split(": ")[-1] for x in w)
    assert said == ["multiprocessing_context", "num_workers", "worker_init_fn"], said
    assert ld.seed == 5 and ld.prefetch == 12                      # generator's seed; 3 x 4 workers
    st = [x for x in client.streams() if x["id"] == ld.stream.id][0]
    assert st["prefetch"] == 12
    assert epoch_ids(ld, rec_index) == epoch_ids(make_loader(seed=5), rec_index)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                              # once per process: no second warning
        make_loader(num_workers=2, worker_init_fn=print)


@pytest.mark.parametrize("kw, text", [
    (dict(sampler=[0, 1, 2]), "sampler is not supported"),
    (dict(batch_sampler=[[0, 1]]), "batch_sampler is not supported"),
    (dict(collate_fn=lambda samples: samples), "collate_fn .* is not supported"),
])
def test_dataloader_arguments_refused_clearly(make_loader, kw, text):
    with pytest.raises(loaderclient.InvalidArgument, match=text):
        make_loader(**kw)


def test_errors_at_construction(daemon, scratch):
    """A wrong dataset name, no daemon, or a batch the daemon refuses raise when the loader
    is built, not at the first iter(); check=False defers them to check() or iter()."""
    with pytest.raises(loaderclient.DatasetNotFound, match="nope"):
        LoaderdDataLoader("nope", 64, socket=daemon.socket, timeout=10)
    with pytest.raises(loaderclient.ConnectError):
        LoaderdDataLoader("rec", 64, socket=str(scratch / "none.sock"), timeout=2)
    with pytest.raises(loaderclient.OutOfRange, match="no batch is left"):
        LoaderdDataLoader("rec", 501, socket=daemon.socket, rank=0, world_size=2, drop_last=True)
    with pytest.raises(loaderclient.OverBudget, match="memory_budget"):
        LoaderdDataLoader("rec", 65536, socket=daemon.socket, prefetch=64)
    with pytest.raises(loaderclient.InvalidArgument, match="name of a dataset"):
        LoaderdDataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), 2, socket=daemon.socket)
    late = LoaderdDataLoader("nope", 64, socket=daemon.socket, check=False)
    assert late.stream is None
    with pytest.raises(loaderclient.DatasetNotFound):
        late.check()
    with pytest.raises(loaderclient.DatasetNotFound):
        iter(late)
    late.close()
    ok = LoaderdDataLoader("rec", 64, socket=daemon.socket)
    info = ok.check()
    assert info["batches_per_epoch"] == 16 and (info["rank"], info["world_size"]) == (0, 1)
    sid = ok.stream.id
    next(iter(ok))
    assert ok.stream.id == sid and ok.reopens == 0               # the first epoch reads the checked stream
    ok.close()
