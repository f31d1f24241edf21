"""LoaderdDataLoader against a real loaderd."""
import pytest

torch = pytest.importorskip("torch")

import support
from conftest import REC, TOK, VAR
from test_client import file_of, mapping_of

import loaderclient
from loaderclient.torch import LoaderdDataLoader


@pytest.fixture
def make_loader(daemon):
    made = []

    def make(dataset="rec", batch_size=64, **kw):
        ld = LoaderdDataLoader(dataset, batch_size, socket=daemon.socket, timeout=10, **kw)
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
    assert epoch_ids(other, rec_index) == e0 and other.reopens == 1
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
    assert ld.reopens == 2                   # 3 -> 5 (a jump), then the abandoned 5
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


def test_rank_from_torch_distributed(make_loader, monkeypatch):
    import loaderclient.torch as lt
    monkeypatch.setattr(lt, "_dist_rank_world", lambda: (1, 4))
    ld = make_loader()
    assert (ld.rank, ld.world_size) == (1, 4) and len(ld) == 4    # 250 samples, batch 64
    ld2 = make_loader(rank=0, world_size=1)
    assert (ld2.rank, ld2.world_size) == (0, 1)


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
        with pytest.raises(RuntimeError, match="pin_memory=True needs CUDA"):
            LoaderdDataLoader("rec", 64, pin_memory=True)


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
    for data, label in ld:
        loss = torch.nn.functional.cross_entropy(model(data.float() / 255), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    assert ld.wait_s >= 0 and ld.batches == len(ld)


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
