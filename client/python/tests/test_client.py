"""Client, Stream and Batch against a real loaderd: bytes, options, errors, concurrency (the
batch views and when their slots go back: test_views.py)."""
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import support
from conftest import REC, TOK, VAR

import loaderclient
from loaderclient import _lib
from batch_checks import (assert_zero_copy, file_of, check_rec_batch, READ_AHEAD, SLOTS_BEYOND_PREFETCH,
                          leased_on_daemon, slot_generation, wait_stopped)


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
