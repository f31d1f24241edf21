"""`files` datasets with `format: npy`, read end to end: arrays written by numpy itself
(np.save, the versions and dtypes it picks), served by a real loaderd as typed fields and
compared with what numpy loads from the same files: exact cover per epoch, across ranks,
from a resumed batch and from the cache; a file of another shape fails its batch under
on_error: fail with a message that names it and both layouts."""
import os
import time

import numpy as np
import pytest

import support
import loaderclient

N, CLASSES, SHAPE = 120, 4, (3, 8, 8)


def _tree(root):
    """N float32 arrays of SHAPE in CLASSES folders; element [0, 0, 0] is the sample's number."""
    rng = np.random.default_rng(7)
    arrays = {}
    for i in range(N):
        a = rng.standard_normal(SHAPE).astype(np.float32)
        a[0, 0, 0] = i
        d = os.path.join(root, "c%d" % (i % CLASSES))
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "%04d.npy" % i), a)
        arrays[i] = a
    return arrays


@pytest.fixture(scope="module")
def npy_daemon():
    d = support.short_tmpdir("lc-npy.")
    arrays = _tree(os.path.join(d, "arr"))
    # A second tree with a scalar int64 per file and one file saved by numpy with its
    # version 2.0 header (np.lib.format.write_array), which must read the same.
    os.makedirs(os.path.join(d, "sc"))
    for i in range(10):
        path = os.path.join(d, "sc", "%02d.npy" % i)
        if i == 3:
            with open(path, "wb") as f:
                np.lib.format.write_array(f, np.array(1000 + i, np.int64), version=(2, 0))
        else:
            np.save(path, np.array(1000 + i, np.int64))
    # The same arrays as `arr`, one of them saved with another shape.
    os.makedirs(os.path.join(d, "odd"))
    for i in range(8):
        a = np.full((4, 2) if i == 5 else (2, 4), i, np.float16)
        np.save(os.path.join(d, "odd", "%d.npy" % i), a)
    dm = support.Daemon(d, "  arr:\n    kind: files\n    path: arr\n    format: npy\n"
                           "  arrc:\n    kind: files\n    path: arr\n    format: npy\n"
                           "    cache:\n      path: arr.cache\n"
                           "  sc:\n    kind: files\n    path: sc\n    format: npy\n"
                           "  odd:\n    kind: files\n    path: odd\n    format: npy\n    on_error: fail\n")
    dm.start()
    try:
        yield dm, d, arrays
    finally:
        try:
            dm.stop_clean()
        finally:
            support.rmtree(d)


def _check(batch, arrays):
    x, y = batch["data"], batch["label"]
    assert x.dtype == np.float32 and x.shape == (batch.rows,) + SHAPE
    got = []
    for r in range(batch.rows):
        i = int(x[r, 0, 0, 0])
        assert np.array_equal(x[r], arrays[i]), "sample %d differs from numpy's load" % i
        assert y[r] == i % CLASSES
        got.append(i)
    return got


def test_typed_field_exact_cover(npy_daemon):
    dm, _, arrays = npy_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        with c.open("arr", 16, seed=5, epochs=2) as s:
            assert s.fields[0] == {"name": "data", "dtype": "float32", "shape": list(SHAPE), "ragged": False}
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += _check(b, arrays)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(N))
        assert seen[0] != seen[1]
        # Ranks: disjoint parts whose union is the epoch; a resumed stream is the tail.
        parts = []
        for rank in (0, 1, 2):
            with c.open("arr", 8, seed=5, epochs=1, rank=rank, world_size=3) as s:
                parts.append([i for b in s for i in _check(b, arrays)])
        assert sorted(sum(parts, [])) == list(range(N))
        with c.open("arr", 8, seed=5, epochs=1, rank=1, world_size=3, start_batch=2) as s:
            assert [i for b in s for i in _check(b, arrays)] == parts[1][16:]


def test_typed_field_through_the_cache(npy_daemon):
    dm, d, arrays = npy_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        deadline = time.monotonic() + 20
        info = c.request({"op": "cache_info", "dataset": "arrc"})
        while info["state"] == "checking" and time.monotonic() < deadline:
            time.sleep(0.02)
            info = c.request({"op": "cache_info", "dataset": "arrc"})
        c.request({"op": "cache_build", "dataset": "arrc"})
        while info["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.02)
            info = c.request({"op": "cache_info", "dataset": "arrc"})
        assert info["state"] == "ready", info
        # The cache holds the arrays only: 768 bytes a sample, not the 896-byte files.
        assert info["file"]["count"] == N and info["file"]["data_bytes"] == N * 768
        # A stream reads the source until the cache is proven current, then the cache:
        # streams (each checked whole) until one has read from the cache, within 20 s.
        deadline = time.monotonic() + 20
        for _ in range(100):
            with c.open("arrc", 32, seed=1, epochs=2) as s:
                seen = [i for b in s for i in _check(b, arrays)]
            assert sorted(seen) == sorted(list(range(N)) * 2)
            info = c.request({"op": "cache_info", "dataset": "arrc"})
            if info["hits"] > 0 or time.monotonic() > deadline:
                break
        assert info["hits"] > 0, info      # served from the cache
        assert c.request({"op": "cache_verify", "dataset": "arrc"})["ok"] is True


def test_scalars_and_version_2(npy_daemon):
    dm, _, _ = npy_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c, c.open("sc", 10, shuffle=False, epochs=1) as s:
        assert s.fields[0] == {"name": "data", "dtype": "int64", "shape": [], "ragged": False}
        b = s.next()
        assert b["data"].tolist() == [1000 + i for i in range(10)]


def test_other_shape_fails_its_batch(npy_daemon):
    dm, _, _ = npy_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c, c.open("odd", 4, shuffle=False, epochs=1) as s:
        b = s.next()
        assert b["data"].dtype == np.float16 and b["data"].shape == (4, 2, 4)
        assert [float(b["data"][r, 0, 0]) for r in range(4)] == [0, 1, 2, 3]
        b.release()
        with pytest.raises(loaderclient.SampleError) as ei:
            s.next()
        assert "5.npy" in ei.value.message and "float16[4,2]" in ei.value.message
        assert "float16[2,4]" in ei.value.message
