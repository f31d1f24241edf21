"""Client, Stream and Batch against a real loaderd: bytes, zero-copy, release, errors."""
import ctypes
import json
import mmap
import os
import signal
import threading
import time
from contextlib import nullcontext

import numpy as np
import pytest

import support
from conftest import REC, TOK, VAR

import loaderclient
from loaderclient import _lib


# -- helpers ------------------------------------------------------------------------------------

def mapping_of(addr):
    """The /proc/self/maps entry holding addr."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return {"start": lo, "end": hi, "perms": parts[1], "offset": int(parts[2], 16),
                        "file": (parts[3], int(parts[4])), "path": parts[5].strip() if len(parts) > 5 else ""}
    return None


def shm_position(addr):
    """(file identity, offset in the file) of the shared memory behind addr."""
    m = mapping_of(addr)
    assert m is not None, "address 0x%x is not mapped" % addr
    return m["file"], addr - m["start"] + m["offset"], m


def library_pointer(batch, name):
    f = _lib.LcField()
    assert _lib.lib.lc_batch_field_by_name_sized(batch._state.bptr, name.encode(), ctypes.byref(f),
                                                 ctypes.sizeof(f)) == 0
    return f.data


def page_flags(addr):
    """(present, file page) of the page holding addr, from /proc/self/pagemap."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // mmap.PAGESIZE * 8)
        e = int.from_bytes(f.read(8), "little")
    return bool(e >> 63 & 1), bool(e >> 61 & 1)


def assert_zero_copy(batch, name, addr):
    """addr (an array's data) is the very shared memory the C library sees for the field:
    the same object at the same offset, mapped copy-on-write, and the page not copied."""
    lib_ptr = library_pointer(batch, name)
    base, size = batch._stream.ring
    assert base <= lib_ptr < base + size
    ours, lib_side = shm_position(addr), shm_position(lib_ptr)
    assert ours[0] == lib_side[0], "not the same shared-memory object"
    assert ours[1] == lib_side[1], "not the same offset in it"
    assert "loaderd." in ours[2]["path"] and ours[2]["perms"] == "rw-p"
    assert lib_side[2]["perms"] == "r--s"
    ctypes.c_uint8.from_address(addr).value           # fault the page in (a read)
    assert page_flags(addr) == (True, True), "the page is a private copy, not the shared memory"


def file_of(row, index):
    return index[int(np.frombuffer(row[:8].tobytes(), "<u8")[0])]


def check_rec_batch(b, index):
    x, y = b["data"], b["label"]
    assert x.shape == (b.rows, REC["size"]) and x.dtype == np.uint8
    assert y.shape == (b.rows,) and y.dtype == np.int64
    got = []
    for r in range(b.rows):
        i = file_of(x[r], index)
        assert (x[r] == support.file_bytes(i, REC["size"])).all()
        assert y[r] == i % REC["classes"]
        got.append(i)
    return got


# The C library's read-ahead (CLIENT_READ_AHEAD in client/client_internal.h): while the
# trainer holds at most one batch of a stream, the library keeps this many `next` requests
# in flight, whose answers lease slots before the trainer asks for them. Holding more, it
# asks no more ahead.
READ_AHEAD = 2
# Slots of a stream's ring beyond `prefetch` (SLOTS_BEYOND_PREFETCH in daemon/stream.c):
# the batch the trainer holds and the read-ahead's (or a deferred batch's) slots.
SLOTS_BEYOND_PREFETCH = 3
DEFAULT_PREFETCH = 4   # server.prefetch: the tests' daemon does not set it


def stream_entry(client, stream, timeout=5.0):
    """The stream's entry of the `streams` reply, once the daemon is settled: no fill in
    progress. The daemon builds the reply when it reads the request but sends it after the
    replies owed before it (request order), so a read-ahead `next` still waiting for its
    batch would not be counted yet. With nothing FILLING, no `next` waits (its batch would
    be filling, or its slot free for a fill) unless every slot is leased: the counts then
    include every `next` sent, and the library has read their answers. Releases queued in
    the C library (and by this package) go out before the request."""
    deadline = time.monotonic() + timeout
    while True:
        st = [x for x in client.streams() if x["id"] == stream.id]
        assert st, "stream %d not listed" % stream.id
        if st[0]["filling"] == 0 or time.monotonic() > deadline:
            assert st[0]["filling"] == 0, "the daemon did not settle: %r" % st[0]
            return st[0]
        time.sleep(0.005)


def leased_on_daemon(client, stream):
    """Slots of the stream leased to us, as the settled daemon counts them: the batches we
    hold (held_batches(), kept ones included), plus the answered read-ahead requests."""
    return stream_entry(client, stream)["leased"]


def slot_generation(stream, slot):
    """The generation in a slot's header, read through the C library's mapping of the ring.
    The daemon bumps it when it starts filling the slot again: a slot whose generation has
    not changed was not given back (or not reused yet)."""
    base, _ = stream.ring
    return ctypes.c_uint64.from_address(base + _lib.lib.lc_stream_slot_offset(stream._h, slot)).value


# The tests that count the daemon's leases use the socket path, where what the daemon
# leases is what the library holds plus what it asked for ahead; through the hand-off the
# daemon also leases every batch it has put in the ready queue (test_handoff_* below and
# itest_handoff cover that path).
def assert_held(client, stream, n):
    assert stream.held_batches() == n
    # Holding at most one batch, the library has up to READ_AHEAD answers in hand.
    assert leased_on_daemon(client, stream) in (range(n, n + READ_AHEAD + 1) if n <= 1 else (n,))


def wait_stopped(pid, timeout=5.0):
    """Waits until every thread of a process that was sent SIGSTOP is stopped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(st in "Tt" for st in states):
            return
        time.sleep(0.005)
    raise AssertionError("process %d did not stop" % pid)


# -- information ------------------------------------------------------------------------------------

def test_datasets_and_status(client, daemon):
    ds = {d["name"]: d for d in client.datasets()}
    assert set(ds) == {"rec", "var", "tok"}
    assert ds["rec"]["samples"] == REC["n"] and ds["rec"]["kind"] == "files"
    assert [f["name"] for f in ds["rec"]["fields"]] == ["data", "label"]
    assert ds["var"]["fields"][0]["ragged"] is True
    assert ds["tok"]["fields"] == [{"name": "tokens", "dtype": "uint16", "shape": [TOK["context"] + 1],
                                    "ragged": False}]
    st = client.status()
    assert st["pid"] == daemon.pid and "id" not in st and st["clients"] >= 1
    assert client.request({"op": "status"})["ok"] is True


def test_default_socket_follows_env(monkeypatch):
    monkeypatch.setenv("LOADERD_SOCKET", "/tmp/some.sock")
    assert loaderclient.default_socket() == "/tmp/some.sock"


def test_default_socket_from_the_daemons_config(daemon, scratch, monkeypatch):
    """Without a socket, the library's resolution decides: LOADERD_SOCKET, else the config
    named by LOADERD_CONFIG (its server.socket), else the default; a config that names no
    usable socket is an error naming the file and line."""
    monkeypatch.delenv("LOADERD_SOCKET", raising=False)
    monkeypatch.delenv("LOADERD_CONFIG", raising=False)
    plain = loaderclient.default_socket()
    assert plain == _lib.lib.lc_default_socket().decode()
    monkeypatch.setenv("LOADERD_CONFIG", daemon.config)
    assert loaderclient.default_socket() == daemon.socket
    with loaderclient.Client(timeout=10) as c:            # found through the config
        assert c.socket == daemon.socket and c.status()["pid"] == daemon.pid
    monkeypatch.setenv("LOADERD_SOCKET", "/tmp/else.sock")
    assert loaderclient.default_socket() == "/tmp/else.sock"
    monkeypatch.delenv("LOADERD_SOCKET")
    bad = scratch / "bad.yaml"
    bad.write_text("server:\n  workers: 2\n")
    monkeypatch.setenv("LOADERD_CONFIG", str(bad))
    with pytest.raises(loaderclient.LoaderdError, match=r"bad\.yaml:2:3: no server\.socket") as e:
        loaderclient.default_socket()
    assert e.value.name == "bad_config"
    with pytest.raises(loaderclient.ConnectError, match=r"bad\.yaml:2:3: no server\.socket"):
        loaderclient.Client(timeout=1)


def test_loaderctl_finds_the_daemon_by_its_config(daemon, scratch):
    """loaderctl --config FILE (or LOADERD_CONFIG) connects to FILE's server.socket; flags
    beat the environment: --socket beats --config, --config beats LOADERD_SOCKET, which
    beats LOADERD_CONFIG; --help says so."""
    import subprocess
    ctl = os.path.join(os.path.dirname(support.binaries()[0]), "loaderctl")
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERD_SOCKET", "LOADERD_CONFIG")}

    def run(*args, **extra):
        return subprocess.run([ctl] + list(args), capture_output=True, text=True, timeout=30, env=dict(env, **extra))
    r = run("--config", daemon.config, "status", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == daemon.pid
    r = run("status", "--json", LOADERD_CONFIG=daemon.config)
    assert r.returncode == 0 and json.loads(r.stdout)["pid"] == daemon.pid, r.stderr
    nowhere = str(scratch / "nowhere.sock")
    r = run("--socket", nowhere, "--config", daemon.config, "status")
    assert r.returncode == 1 and nowhere in r.stderr
    r = run("--config", daemon.config, "status", "--json", LOADERD_SOCKET=nowhere)
    assert r.returncode == 0 and json.loads(r.stdout)["pid"] == daemon.pid, r.stderr
    r = run("status", LOADERD_SOCKET=nowhere, LOADERD_CONFIG=daemon.config)
    assert r.returncode == 1 and nowhere in r.stderr
    rel = scratch / "rel.yaml"
    rel.write_text("server:\n  socket: here.sock\n")
    r = run("--config", str(rel), "status")
    assert r.returncode == 1 and "rel.yaml:2:11: server.socket 'here.sock' is a relative path" in r.stderr, r.stderr
    r = run("--help")
    assert r.returncode == 0 and "--config FILE" in r.stdout and "LOADERD_CONFIG" in r.stdout
    assert "it beats the environment" in r.stdout


def test_daemon_of_another_user_refused(daemon, monkeypatch):
    """The library checks who listens on the socket before saying hello; LOADERD_UID names
    the user the daemon must run as."""
    other = 4242 if os.getuid() != 4242 else 4243
    monkeypatch.setenv("LOADERD_UID", str(other))
    with pytest.raises(loaderclient.LoaderdError, match="runs as uid %d, but loaderd is expected to run as uid %d"
                       % (os.getuid(), other)) as e:
        loaderclient.Client(daemon.socket, timeout=5)
    assert e.value.code == -1
    monkeypatch.setenv("LOADERD_UID", str(os.getuid()))
    loaderclient.Client(daemon.socket, timeout=5).close()


# -- content ----------------------------------------------------------------------------------------

def test_views_match_the_files(client, rec_index):
    with client.open("rec", 64, seed=3, epochs=2) as s:
        assert (s.batches_per_epoch, s.samples_per_epoch) == (16, REC["n"])
        assert s.fields == [{"name": "data", "dtype": "uint8", "shape": [REC["size"]], "ragged": False},
                            {"name": "label", "dtype": "int64", "shape": [], "ragged": False}]
        seen = {0: [], 1: []}
        for b in s:
            assert b.index == len(seen[b.epoch]) // 64 and b.valid
            assert b.rows == (64 if b.index < 15 else REC["n"] - 15 * 64)
            seen[b.epoch] += check_rec_batch(b, rec_index)
            x = b["data"]
            assert x.flags.writeable and not x.flags.owndata     # copy-on-write view
            x[:, :8] ^= 0xFF       # a write: later batches in this slot are checked all the same
    for e in (0, 1):
        assert sorted(seen[e]) == list(range(REC["n"]))   # each epoch exactly once
    assert seen[0] != seen[1]                             # shuffled differently
    assert seen[0] != sorted(seen[0])


def test_unshuffled_order_and_options(client, rec_index):
    # start_batch, epochs, prefetch and drop_last all reach the daemon (the options struct).
    with client.open("rec", 100, shuffle=False, start_batch=3, epochs=1, prefetch=1, drop_last=True) as s:
        st = [x for x in client.streams() if x["id"] == s.id][0]
        # "batch": the next one the daemon hands out; through the hand-off, batch 3 may
        # already be in the ready queue (prefetch 1).
        assert st["prefetch"] == 1 and st["slots"] == 1 + 3 and st["batch"] in (3, 4)
        got = [(b.epoch, b.index, check_rec_batch(b, rec_index)) for b in s]
    assert [(e, i) for e, i, _ in got] == [(0, i) for i in range(3, 10)]
    # Dataset order is path order: class_003/ holds files 3, 13, ..., 993 (positions 300-399).
    assert got[0][2] == list(range(3, REC["n"], 10))
    with client.open("rec", 64, drop_last=True, world_size=3, rank=2, epochs=1) as s:
        assert s.samples_per_epoch == REC["n"] // 3 and s.batches_per_epoch == (REC["n"] // 3) // 64


def test_shared_stream(client, rec_index):
    # share=: two streams of one share read one ring, the batches of a stream of its own.
    with client.open("rec", 64, seed=5, epochs=1) as own:
        ref = [(b.epoch, b.index, check_rec_batch(b, rec_index)) for b in own]
    with client.open("rec", 64, seed=5, epochs=1, share="py") as a, \
            client.open("rec", 64, seed=5, epochs=1, share="py") as b:
        info = [x for x in client.streams() if x["id"] in (a.id, b.id)]
        assert [x["share"]["name"] for x in info] == ["py", "py"] and info[0]["share"]["consumers"] == 2
        got_a, got_b = [], []
        for x, y in zip(a, b):
            got_a.append((x.epoch, x.index, check_rec_batch(x, rec_index)))
            got_b.append((y.epoch, y.index, check_rec_batch(y, rec_index)))
        assert got_a == ref and got_b == ref
    with pytest.raises(loaderclient.InvalidArgument):
        client.open("rec", 64, share="py", share_join="later")


def test_handoff_modes_deliver_the_same(client, rec_index):
    # The queues in shared memory (the default) and a message per batch: the same batches.
    def epoch(handoff):
        with client.open("rec", 64, seed=5, epochs=1, handoff=handoff) as s:
            return [(b.epoch, b.index, check_rec_batch(b, rec_index)) for b in s]
    shm, sock = epoch("shm"), epoch("socket")
    assert shm == sock and len(shm) == (REC["n"] + 63) // 64
    assert sorted(i for _, _, rows in shm for i in rows) == list(range(REC["n"]))
    with pytest.raises(loaderclient.InvalidArgument, match="handoff must be 'shm' or 'socket'"):
        client.open("rec", 64, handoff="pipe")


def test_ragged_field(client):
    n, size = VAR["n"], VAR["size"]
    index = {support.file_word0(i): i for i in range(n)}
    seen = []
    with client.open("var", 32, seed=1, epochs=2) as s:   # the ring turns: written slots come back
        for b in s:
            rf = b["data"]
            assert isinstance(rf, loaderclient.RaggedField) and len(rf) == b.rows
            assert rf.offsets.dtype == np.int64 and rf.offsets.shape == (b.rows + 1,) and rf.offsets[0] == 0
            assert rf.data.dtype == np.uint8 and len(rf.data) == rf.offsets[-1]
            assert not rf.offsets.flags.owndata and not rf.data.flags.owndata
            as_bytes = rf.tolist()
            for r in range(b.rows):
                i = file_of(rf[r], index)
                want = support.file_bytes(i, size, vary=True)
                assert len(rf[r]) == len(want) == rf.lengths()[r]
                assert (rf[r] == want).all() and as_bytes[r] == want.tobytes()
                assert b["label"][r] == i % VAR["classes"]
                seen.append(i)
            assert (rf[-1] == rf[b.rows - 1]).all()
            with pytest.raises(IndexError):
                rf[b.rows]
            assert_zero_copy(b, "data", rf.data.ctypes.data)
            t = b.torch("data")
            assert t.data.dtype.__str__() == "torch.uint8" and bytes(t[0].numpy()) == as_bytes[0]
            kept = b.copy()["data"]
            rf.data[:] = 0xAB          # writes, offsets included: this batch's view only
            rf.offsets[:] = 0
            assert len(rf[0]) == 0 and (b["data"].data[:4] == 0xAB).all()
        assert kept.tolist() == as_bytes
    assert sorted(seen) == sorted(list(range(n)) * 2)


def test_tokens_uint16(client):
    ctx = TOK["context"]
    with client.open("tok", 8, shuffle=False, epochs=1) as s:
        b = s.next()
        x = b["tokens"]
        assert x.dtype == np.uint16 and x.shape == (8, ctx + 1)
        for r in range(8):
            assert (x[r] == support.tokens(r * ctx, ctx + 1)).all()
        with pytest.raises(TypeError, match=r"uint16.*numpy\('tokens'\).*copy=True"):
            b.torch("tokens")
        t = b.torch("tokens", copy=True)
        assert str(t.dtype) == "torch.int64" and (t.numpy() == x.astype(np.int64)).all()


# -- zero copy ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("safe", [True, False])
def test_zero_copy(client, safe):
    with client.open("rec", 64, keep_views_safe=safe) as s:
        for _ in range(s.slot_count + 2):   # every slot, and reused aliases
            b = s.next()
            x, y = b["data"], b["label"]
            assert_zero_copy(b, "data", x.ctypes.data)
            assert_zero_copy(b, "label", y.ctypes.data)
            t = b.torch("data")
            assert t.data_ptr() == x.ctypes.data
            assert x.ctypes.data != library_pointer(b, "data")   # a mapping of our own
            del x, y, t
        assert s.dropped_pages == 0          # nothing written: no page dropped on reuse


# -- writes through views ----------------------------------------------------------------------------

def library_bytes(batch, name, nbytes):
    """The field's first bytes as the C library sees them: its read-only shared mapping of
    the ring, i.e. the daemon's memory."""
    return np.frombuffer(ctypes.string_at(library_pointer(batch, name), nbytes), np.uint8)


@pytest.mark.parametrize("safe", [True, False])
def test_in_place_writes_stay_private(daemon, rec_index, safe):
    """In-place operations on numpy views and torch tensors work; the daemon's memory is
    never changed; every later batch in a written slot reads the daemon's bytes again; a
    second client reading meanwhile gets correct batches."""
    torch = pytest.importorskip("torch")
    with loaderclient.Client(daemon.socket, timeout=10) as c, loaderclient.Client(daemon.socket, timeout=10) as c2, \
            c.open("rec", 64, seed=7, epochs=3, keep_views_safe=safe) as s, c2.open("rec", 64, seed=8, epochs=3) as s2:
        assert s.writable_views, s.private_reason
        slots = set()
        n = 0
        for b, other in zip(s, s2):
            check_rec_batch(b, rec_index)      # whatever was written in this slot before
            check_rec_batch(other, rec_index)
            x = b["data"]
            want = np.array(x)
            t = b.torch("data")
            lab = b.torch("label")
            lab_want = lab.clone()
            x[:, :8] ^= 0xFF                   # numpy, in place
            t.mul_(3)                          # torch, in place (uint8 wraps)
            t[: b.rows // 2] = t.flip(0)[: b.rows // 2]   # a mixup-like row swap
            lab.add_(100)
            expect = want.copy()
            expect[:, :8] ^= 0xFF
            expect = (expect.astype(np.uint16) * 3 % 256).astype(np.uint8)
            expect[: b.rows // 2] = expect[::-1][: b.rows // 2]
            assert (x == expect).all() and (t.numpy() == expect).all()
            assert (lab == lab_want + 100).all() and (b["label"] == lab.numpy()).all()
            # The daemon's memory is untouched.
            assert (library_bytes(b, "data", want.size) == want.reshape(-1)).all()
            assert (library_bytes(b, "label", 8 * b.rows).view(np.int64) == lab_want.numpy()).all()
            slots.add(b.slot)
            n += 1
            del x, t, lab
        assert n == 48 and len(slots) == s.slot_count     # every slot written and reused
        assert s.dropped_pages >= n - s.slot_count        # each reuse of a written slot dropped pages


def test_written_kept_view_keeps_its_writes(client, rec_index):
    """A kept batch that is copied out of the ring keeps what was written to it; its slot
    serves the daemon's bytes afterwards."""
    with client.open("rec", 64, seed=5) as s:
        b = s.next()
        slot = b.slot
        x = b["data"]
        x[:] = 7
        s.next()
        b3 = s.next()
        x3 = b3["data"]
        s.next()                                           # x's batch is copied out
        assert "loaderd." not in mapping_of(x.ctypes.data)["path"]
        assert (x == 7).all()
        x[:, 0] = 9                                        # still writable after the copy
        assert (x[:, 0] == 9).all() and (x[:, 1:] == 7).all()
        for _ in range(3 * s.slot_count):
            nb = s.next()
            check_rec_batch(nb, rec_index)
            if nb.slot == slot:
                break
        else:
            raise AssertionError("slot %d never came back" % slot)
        del x, x3


def test_in_place_ops_do_not_crash_the_process(daemon):
    """The trainer's recipe (x.mul_() on the batch's tensor) in a fresh interpreter: it
    used to die of SIGSEGV on the read-only mapping."""
    pytest.importorskip("torch")
    code = """
import loaderclient
with loaderclient.Client(%r) as c:
    for safe in (True, False):
        with c.open("rec", 64, epochs=1, keep_views_safe=safe) as s:
            for b in s:
                t = b.torch("data")
                t.mul_(2)
                b.torch("label").mul_(7)
                b["data"][0] += 1
print("ok")
""" % daemon.socket
    p = support.run_python(code, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])


def test_views_need_no_proc_maps(client, rec_index, monkeypatch):
    """The ring's descriptor and layout come from the C library: a process that cannot read
    /proc/self/maps (and the ring's name is gone after the first batch anyway) still gets
    private copy-on-write views at the library's offsets."""
    import builtins
    real_open = builtins.open

    def no_maps(path, *a, **k):
        if str(path) == "/proc/self/maps":
            raise PermissionError("no /proc/self/maps here")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", no_maps)
    with client.open("rec", 64, seed=2) as s:
        assert s.writable_views and s.private_reason is None
        for i in range(s.slot_count + 1):
            b = s.next()
            check_rec_batch(b, rec_index)
            x = b["data"]
            lib_ptr = library_pointer(b, "data")
            assert lib_ptr != x.ctypes.data
            x[0, 0] ^= 0xFF                             # a private copy: the daemon's bytes stay
            assert ctypes.c_uint8.from_address(lib_ptr).value == x[0, 0] ^ 0xFF
            del x


def test_next_releases_previous(client):
    with client.open("rec", 64, handoff="socket") as s:
        b1 = s.next()
        b1["data"]
        b1.torch("label")
        b2 = s.next()
        assert b1.released and not b2.released
        for access in (lambda: b1["data"], lambda: b1.numpy("label"), lambda: b1.torch("data"), b1.copy,
                       lambda: b1.fields and b1["label"]):
            with pytest.raises(loaderclient.ReleasedError, match="released"):
                access()
        assert not b1.valid
        assert (b1.epoch, b1.index) == (0, 0)     # metadata stays readable
        assert_held(client, s, 1)                 # b1's slot is back: its views died with b1's cache
        assert any(s.next().slot == b1.slot for _ in range(2 * s.slot_count))   # and in use again


def test_explicit_release_and_context_manager(client):
    with client.open("rec", 64, auto_release=False, handoff="socket") as s:
        b = s.next()
        b.release()
        b.release()   # idempotent
        assert b.released
        with pytest.raises(loaderclient.ReleasedError):
            b["data"]
        with s.next() as b2:
            assert b2["data"].shape[0] == 64
        assert b2.released
        assert_held(client, s, 0)
        # Hold every slot, with a release on the way (the daemon fills while batches are
        # held: see test_daemon_refills_while_batches_are_held).
        held = [s.next() for _ in range(4)]
        held.pop().release()
        held += [s.next() for _ in range(s.slot_count - len(held))]
        assert len(held) == s.slot_count and leased_on_daemon(client, s) == s.slot_count
        # Every slot held and nothing released: an error, not a wait for a batch that cannot come.
        with pytest.raises(loaderclient.LoaderdError, match="release one") as ei:
            s.next()
        assert ei.value.code == -4012
        last = held[-1].index
        for h in held:
            h.release()
        assert s.next().index == last + 1


def test_daemon_refills_while_batches_are_held(client):
    """The daemon keeps filling while the trainer holds batches without releasing any: each
    batch it leases makes room for one more ahead."""
    with client.open("rec", 64, prefetch=2, auto_release=False, handoff="socket") as s:
        assert s.slot_count == 2 + SLOTS_BEYOND_PREFETCH
        time.sleep(0.3)   # the first two batches are READY: no fill left to finish
        # Every slot but one held, nothing released: all but the first `prefetch` batches
        # (and the library's read-ahead) exist only if the daemon refilled meanwhile.
        held = [s.next(timeout=1) for _ in range(s.slot_count - 1)]
        assert [(b.epoch, b.index) for b in held] == [(0, i) for i in range(s.slot_count - 1)]
        # Holding that many, the library has no `next` in flight: the last free slot is
        # filled ahead all the same.
        st = stream_entry(client, s)
        assert (st["leased"], st["ready"], st["free"]) == (s.slot_count - 1, 1, 0)


def test_kept_views_keep_their_bytes(client, rec_index):
    """An array kept past its batch's release never shows another batch's data, and kept
    arrays never take more slots than the ring keeps beyond the prefetch."""
    with client.open("rec", 64, seed=5, handoff="socket") as s:
        assert s.slot_count == DEFAULT_PREFETCH + SLOTS_BEYOND_PREFETCH
        b = s.next()
        slot, gen = b.slot, b.generation
        x = b["data"]
        t = b.torch("data")
        want = np.array(x)
        assert check_rec_batch(b, rec_index)
        b2 = s.next()      # b released; x alive: the slot stays leased (deferred)
        assert s.held_batches() == 2
        # b, b2 and one read-ahead answer: holding two batches, the library did not ask
        # ahead again after taking the first answer for b2.
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        del b2
        for _ in range(3 * s.slot_count):   # the ring turns over many times
            nb = s.next()
            nb["data"]
            assert nb.slot != slot           # the kept batch's slot is never handed out again
            assert s.held_batches() == 2     # the kept batch and this one
            assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1 == SLOTS_BEYOND_PREFETCH
        assert slot_generation(s, slot) == gen
        assert (x == want).all() and (t.numpy() == want).all()
        for r in range(x.shape[0]):
            assert (x[r] == support.file_bytes(file_of(x[r], rec_index), REC["size"])).all()
        # One kept batch holds its slot (no copy: still the shared memory).
        assert "loaderd." in mapping_of(x.ctypes.data)["path"]
        # Keep a second one: the oldest is copied out of the ring, its slot given back.
        b3 = s.next()
        x3 = b3["data"]
        s.next()
        assert "loaderd." not in mapping_of(x.ctypes.data)["path"]
        assert "loaderd." in mapping_of(x3.ctypes.data)["path"]
        assert s.held_batches() == 2         # b3 (kept) and the current batch
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        # b's slot is the daemon's again: every slot not leased is filled ahead, so it was
        # refilled (a new generation), while x goes on showing b's bytes.
        assert slot_generation(s, slot) != gen
        assert (x == want).all() and (t.numpy() == want).all()
        del x, t


def test_views_dying_give_the_slot_back(client):
    with client.open("rec", 64, handoff="socket") as s:
        b = s.next()
        slot, gen = b.slot, b.generation
        x = b["data"]
        s.next()
        # b (kept by x), the current batch, and one read-ahead answer.
        assert s.held_batches() == 2
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        assert slot_generation(s, slot) == gen     # not given back: the daemon did not refill it
        del x               # last view of the first batch: its slot goes back now
        assert s.held_batches() == 1
        # The current batch and READ_AHEAD answers: holding one batch again, the library
        # asked ahead with the release. The count alone cannot tell b's slot from the new
        # answer's: its generation does. The ring is full (prefetch + the leased slots),
        # so the daemon refilled b's slot at once.
        assert leased_on_daemon(client, s) == 1 + READ_AHEAD
        assert slot_generation(s, slot) != gen


def test_many_kept_batches(client, rec_index):
    with client.open("rec", 64, seed=9, epochs=1) as s:
        kept = [(b["data"], np.array(b["data"])) for b in s]
        assert len(kept) == 16 and s.held_batches() <= 1
    for view, want in kept:
        assert (view == want).all()
    ids = [file_of(v[r], rec_index) for v, _ in kept for r in range(v.shape[0])]
    assert sorted(ids) == list(range(REC["n"]))


def test_unguarded_release_is_immediate(client):
    """keep_views_safe=False: the slot goes back at once although a view is alive, so the
    view later shows another batch (the documented hazard of that mode)."""
    with client.open("rec", 64, keep_views_safe=False) as s:
        b = s.next()
        x = b["data"]
        want = np.array(x)
        s.next()
        assert b.released and s.held_batches() == 1
        with pytest.raises(loaderclient.ReleasedError):
            b["data"]
        reused = False
        for _ in range(3 * s.slot_count):
            reused = reused or s.next().slot == b.slot
        assert reused                       # the daemon got the slot back and refilled it
        assert not (x == want).all()        # and the kept view shows what it holds now
        del x


def test_stream_and_client_close(daemon):
    c = loaderclient.Client(daemon.socket, timeout=10)
    with c:
        with c.open("rec", 64) as s:
            b = s.next()
            x = b["data"]
            want = np.array(x)
        assert s.closed and b.released
        with pytest.raises(loaderclient.ReleasedError):
            s.next()
        with pytest.raises(loaderclient.ReleasedError):
            b["data"]
        assert (x == want).all()   # a closed stream's slots are not written again
        s2 = c.open("rec", 64)
        b2 = s2.next()
    assert c.closed and s2.closed and b2.released
    with pytest.raises(loaderclient.ReleasedError):
        c.datasets()
    with pytest.raises(loaderclient.ReleasedError):
        c.open("rec", 4)
    c.close()   # idempotent


# -- errors -------------------------------------------------------------------------------------------

def test_error_no_dataset(client):
    with pytest.raises(loaderclient.DatasetNotFound) as ei:
        client.open("nope", 4)
    assert ei.value.code == -4004 and ei.value.name == "no_such_dataset" and "nope" in ei.value.message


def test_error_out_of_range_and_over_budget(client):
    """open's refusals of a batch too large: their own classes and the daemon's sentence."""
    with pytest.raises(loaderclient.OutOfRange) as ei:    # 1000 samples, 2 ranks: 500 each
        client.open("rec", 501, world_size=2, drop_last=True)
    assert (ei.value.code, ei.value.name) == (-34, "out_of_range") and "no batch is left" in ei.value.message
    assert isinstance(ei.value, loaderclient.InvalidArgument)
    client.open("rec", 500, world_size=2, drop_last=True).close()
    with pytest.raises(loaderclient.OverBudget) as ei:
        client.open("rec", 65536, prefetch=64)
    assert ei.value.name == "over_budget" and "memory_budget" in ei.value.message
    assert client.datasets()


@pytest.mark.parametrize("kw, code, name, text", [
    (dict(batch_size=0), -4003, "bad_field", "batch_size"),
    (dict(batch_size=4, rank=2, world_size=2), -22, "invalid_argument", "rank"),
    (dict(batch_size=4, start_batch=10 ** 6), -22, "invalid_argument", "start_batch"),
    (dict(batch_size=4, prefetch=65), -4003, "bad_field", "prefetch"),
    (dict(batch_size=-1), -4003, "bad_field", "batch_size"),      # refused before it wraps around
    (dict(batch_size=4, seed=-5), -4003, "bad_field", "seed"),
    (dict(batch_size=4, seed=2 ** 60), -4003, "bad_field", "seed"),
    (dict(batch_size=4, prefetch=0), -4003, "bad_field", "prefetch"),
])
def test_error_bad_arguments(client, kw, code, name, text):
    with pytest.raises(loaderclient.InvalidArgument) as ei:
        client.open("rec", **kw)
    assert (ei.value.code, ei.value.name) == (code, name) and text in ei.value.message
    assert isinstance(ei.value, ValueError)
    assert client.datasets()   # the connection is still fine


def test_error_connect(scratch):
    with pytest.raises(loaderclient.ConnectError) as ei:
        loaderclient.Client(str(scratch / "none.sock"), timeout=2)
    assert ei.value.code in (-2, -111) and "loaderd running" in ei.value.message
    with pytest.raises(loaderclient.InvalidArgument):
        loaderclient.Client(str(scratch / "none.sock"), timeout=0)


def test_daemon_killed_mid_epoch(spare_daemon, rec_index):
    # Without reconnecting: the death is reported at once (test_reconnect.py has the rest).
    c = loaderclient.Client(spare_daemon.socket, timeout=5, reconnect=0)
    s = c.open("rec", 16)
    b = s.next()
    x = b["data"]
    os.kill(spare_daemon.pid, signal.SIGKILL)
    spare_daemon.proc.wait()
    t0 = time.monotonic()
    with pytest.raises(loaderclient.ConnectionLost) as ei:
        for _ in range(100):
            s.next()
    assert time.monotonic() - t0 < 4
    assert isinstance(ei.value, ConnectionError)
    with pytest.raises(loaderclient.ConnectionLost):
        c.status()
    check_rec_batch_rows = [file_of(x[r], rec_index) for r in range(x.shape[0])]   # still readable
    assert len(check_rec_batch_rows) == 16
    c.close()


def test_daemon_stopped_times_out_then_resumes(spare_daemon):
    c = loaderclient.Client(spare_daemon.socket, timeout=5)
    s = c.open("rec", 16, prefetch=1)
    s.next()
    os.kill(spare_daemon.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(loaderclient.Timeout) as ei:
            for _ in range(10):
                s.next(timeout=0.6)
        assert 0.5 < time.monotonic() - t0 < 3.5
        assert ei.value.code == -110 and isinstance(ei.value, TimeoutError)
    finally:
        os.kill(spare_daemon.pid, signal.SIGCONT)
    b = s.next(timeout=5)   # the outstanding request's batch
    assert b.rows == 16
    c.close()


def test_ctrl_c_interrupts_a_wait(spare_daemon):
    c = loaderclient.Client(spare_daemon.socket, timeout=30)
    s = c.open("rec", 16, prefetch=1, auto_release=False, handoff="socket")   # counts leases (above)
    # Hold every slot but the one the next request is for (the package refuses a next when
    # every slot is held). The library's two read-ahead answers went to the second and third
    # batches, and holding more than one it asks no more ahead: every leased slot is a batch
    # we hold, no answer is owed to us, and a stopped daemon cannot answer the next request.
    # The wait below is a real one.
    assert s.slot_count == 1 + SLOTS_BEYOND_PREFETCH
    held = [s.next() for _ in range(s.slot_count - 1)]
    assert leased_on_daemon(c, s) == s.held_batches() == s.slot_count - 1
    # A shell starts background jobs with SIGINT ignored: make sure Python's handler is in.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(spare_daemon.pid, signal.SIGSTOP)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        wait_stopped(spare_daemon.pid)
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            s.next()            # would wait 30 s: Ctrl-C ends it within a wait slice
        waited = time.monotonic() - t0
        assert 0.25 < waited < 2, waited   # it did wait, until the signal
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        os.kill(spare_daemon.pid, signal.SIGCONT)
    for b in held:
        b.release()
    b = s.next(timeout=5)   # the interrupted request's batch: the next in order
    assert (b.epoch, b.index, b.rows) == (0, s.slot_count - 1, 16)
    c.close()


def test_release_from_a_busy_moment_is_deferred(client):
    """A view dying while the connection is in use (another thread's call, or inside our
    own code) queues its slot's release for the next call instead of blocking."""
    with client.open("rec", 64, handoff="socket") as s:
        b = s.next()
        slot, gen = b.slot, b.generation
        x = b["data"]
        s.next()
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1   # b, the current batch, a read-ahead answer
        with client._lock:          # the connection is busy
            del x
            assert len(client._deferred) == 1
            assert s.held_batches() == 2            # not given back yet
        # Sent before this request (with the read-ahead it lets the library send).
        assert leased_on_daemon(client, s) == 1 + READ_AHEAD
        assert not client._deferred and s.held_batches() == 1
        assert slot_generation(s, slot) != gen      # the daemon has the slot back, refilled


# -- concurrency ----------------------------------------------------------------------------------------

def test_two_clients_in_threads(daemon, rec_index):
    results, failures = {}, []

    def reader(k):
        try:
            with loaderclient.Client(daemon.socket, timeout=10, name="t%d" % k) as c:
                with c.open("rec", 50, seed=k, epochs=2) as s:
                    ids = []
                    for b in s:
                        ids += check_rec_batch(b, rec_index)
                    results[k] = ids
        except BaseException as e:   # reported below
            failures.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    for k in range(2):
        assert sorted(results[k][:REC["n"]]) == list(range(REC["n"]))
        assert sorted(results[k][REC["n"]:]) == list(range(REC["n"]))
    assert results[0] != results[1]


def test_two_processes(daemon):
    code = """
import loaderclient, numpy as np
with loaderclient.Client(%r) as c, c.open("rec", 64, seed=7, epochs=1) as s:
    print(sum(int(b["label"].sum()) for b in s))
""" % daemon.socket
    procs = [support.run_python(code) for _ in range(2)]
    want = sum(i % REC["classes"] for i in range(REC["n"]))
    for p in procs:
        assert p.returncode == 0, p.stderr
        assert int(p.stdout) == want


def test_same_seed_same_order(client, rec_index):
    def order(seed, epoch):
        with client.open("rec", 64, seed=seed, epoch=epoch, epochs=1) as s:
            return [i for b in s for i in check_rec_batch(b, rec_index)]
    a = order(1, 0)
    assert order(1, 0) == a
    assert order(2, 0) != a and order(1, 1) != a


def _maps():
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    return len(lines), sum("loaderd." in ln for ln in lines)


def test_no_mapping_left_behind(client):
    import gc
    gc.collect()
    total0, shm0 = _maps()
    assert shm0 == 0
    with client.open("rec", 64, epochs=3) as s:
        kept = []
        for b in s:
            if b.index % 3 == 0:
                kept.append(b["data"])      # kept views: deferred, then copied out
            if len(kept) > 4:
                kept.pop(0)
        assert _maps()[1] >= 1
    unguarded = client.open("rec", 64, keep_views_safe=False)
    unguarded.next()
    unguarded.close()
    del kept, b
    gc.collect()
    total1, shm1 = _maps()
    assert shm1 == 0
    assert total1 <= total0 + 2, (total0, total1)


def test_views_handed_to_another_thread(client, rec_index):
    """A consumer thread checks and drops views at its own pace while the main thread
    iterates: releases come from finalizers in that thread, kept views get copied out; every
    view it reads holds its batch's bytes."""
    import gc
    import queue
    q = queue.Queue(maxsize=6)
    bad, checked, died = [], [], []

    def consumer():
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                x, ids = item
                time.sleep(0.002 * (len(checked) % 4))
                got = [file_of(x[r], rec_index) for r in range(x.shape[0])]
                if got != ids or any((x[r] != support.file_bytes(i, REC["size"])).any() for r, i in enumerate(got)):
                    bad.append(ids)
                checked.append(len(got))
                del x, item
        except BaseException as e:   # e.g. a view showing bytes of no file: KeyError
            died.append(repr(e))
            raise

    def put(item, within=30.0):
        # Never blocks on a consumer that is gone: a dead consumer fails the test.
        deadline = time.monotonic() + within
        while True:
            assert t.is_alive(), "the consumer thread died: %s" % (died or "without an exception")
            try:
                q.put(item, timeout=0.05)
                return
            except queue.Full:
                assert time.monotonic() < deadline, "the consumer took nothing for %g s" % within

    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    try:
        with client.open("rec", 32, seed=11, epochs=2) as s:
            for b in s:
                x = b["data"]
                put((x, [file_of(x[r], rec_index) for r in range(b.rows)]))
                del x
                assert s.held_batches() <= s.slot_count - 1
    finally:
        if t.is_alive():
            try:
                q.put(None, timeout=5)
            except queue.Full:
                pass
        t.join(10)
    assert not t.is_alive() and not died, died
    assert not bad and sum(checked) == 2 * REC["n"]
    gc.collect()
    assert _maps()[1] == 0


def test_bad_sample_raises_sample_error():
    d = support.short_tmpdir("lc-bad.")
    try:
        support.gen_files(os.path.join(d, "few"), 40, 64, 2)
        dm = support.Daemon(d, "  few:\n    kind: files\n    path: few\n    on_error: fail\n")
        dm.start()
        try:
            victim = os.path.join(d, "few", "class_001", "0000007.bin")
            os.truncate(victim, 0)  # listed at start, empty when read (a removed file leaves the list)
            with loaderclient.Client(dm.socket, timeout=5) as c, c.open("few", 8, shuffle=False) as s:
                with pytest.raises(loaderclient.SampleError) as ei:
                    for _ in range(10):
                        s.next()
                assert ei.value.code == -4010 and ei.value.name == "bad_sample"
                assert "0000007.bin" in ei.value.message
                with pytest.raises(loaderclient.SampleError):
                    s.next()      # the stream stays failed
        finally:
            assert dm.stop() == 0
            assert support.shm_left(dm.pid) == []
    finally:
        support.rmtree(d)
