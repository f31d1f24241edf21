"""`files` datasets with a `manifest:`: samples, labels and several fields per sample from a
CSV (written by Python's csv module) or JSONL file, served by a real loaderd: an input file
and its target array (saved by numpy) and a label per row, checked against the manifest
row by row: exact cover per epoch, across ranks and from a resumed batch; the cache for a
file-and-label manifest; a bad row refuses the start with its file:line."""
import csv
import json
import os
import subprocess

import numpy as np
import pytest

import support
import loaderclient

N = 90


@pytest.fixture(scope="module")
def man_daemon():
    d = support.short_tmpdir("lc-man.")
    root = os.path.join(d, "data")
    os.makedirs(os.path.join(root, "in"))
    os.makedirs(os.path.join(root, "tgt"))
    rows = []
    rng = np.random.default_rng(3)
    for i in range(N):
        size = 40 + (i * 7) % 50                      # ragged inputs
        blob = bytes([i]) + rng.integers(0, 256, size - 1, dtype=np.uint8).tobytes()
        with open(os.path.join(root, "in", "s%03d.bin" % i), "wb") as f:
            f.write(blob)
        target = rng.standard_normal(5).astype(np.float32)
        np.save(os.path.join(root, "tgt", "s%03d.npy" % i), target)
        rows.append(dict(input="in/s%03d.bin" % i, target="tgt/s%03d.npy" % i,
                         cls=["cat", "dog", "emu"][i % 3], weight=i / 4, blob=blob, array=target))
    order = list(range(N))
    rng.shuffle(order)                                 # the manifest's order is the dataset's
    with open(os.path.join(d, "train.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["weight", "input", "note", "target", "cls"])
        for i in order:
            r = rows[i]
            w.writerow([r["weight"], r["input"], 'a "quoted", note\nover two lines', r["target"], r["cls"]])
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for i in order:
            f.write(json.dumps({"path": rows[i]["input"], "label": i % 4}) + "\n")
    dm = support.Daemon(d, "  multi:\n    kind: files\n    path: data\n"
                           "    manifest:\n      path: train.csv\n"
                           "      columns: {input: file, target: npy, cls: label, weight: float32}\n"
                           "  single:\n    kind: files\n    path: data\n    cache: {path: single.ldc}\n"
                           "    manifest: {path: train.jsonl, columns: {path: file, label: label}}\n")
    dm.start()
    try:
        yield dm, d, rows, order
    finally:
        try:
            dm.stop_clean()
        finally:
            support.rmtree(d)


def _check_multi(b, rows):
    got = []
    for r in range(b.rows):
        blob = bytes(b["input"][r])
        i = blob[0]
        assert blob == rows[i]["blob"]
        assert np.array_equal(b["target"][r], rows[i]["array"])
        assert b["label"][r] == i % 3                 # cat, dog, emu: sorted names
        assert b["weight"][r] == np.float32(i / 4)
        got.append(i)
    return got


def test_fields_from_the_manifest(man_daemon):
    dm, _, rows, order = man_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["multi"]["classes"] == ["cat", "dog", "emu"]
        assert "classes" not in ds["single"]                 # integer labels
        with c.open("multi", 16, seed=2, epochs=2) as s:
            assert [f["name"] for f in s.fields] == ["input", "target", "label", "weight"]
            assert s.fields[1] == {"name": "target", "dtype": "float32", "shape": [5], "ragged": False}
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += _check_multi(b, rows)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(N))
        with c.open("multi", 10, shuffle=False, epochs=1) as s:   # the manifest's order
            assert [i for b in s for i in _check_multi(b, rows)] == order
        parts = []
        for rank in range(3):
            with c.open("multi", 8, seed=4, epochs=1, rank=rank, world_size=3) as s:
                parts.append([i for b in s for i in _check_multi(b, rows)])
        assert sorted(sum(parts, [])) == list(range(N))
        with c.open("multi", 8, seed=4, epochs=1, rank=2, world_size=3, start_batch=1) as s:
            assert [i for b in s for i in _check_multi(b, rows)] == parts[2][8:]


def test_jsonl_manifest_through_the_cache(man_daemon):
    dm, _, rows, _ = man_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        for _ in range(2):
            with c.open("single", 32, seed=1, epochs=1) as s:
                seen = []
                for b in s:
                    for r in range(b.rows):
                        blob = bytes(b["path"][r])
                        assert blob == rows[blob[0]]["blob"] and b["label"][r] == blob[0] % 4
                        seen.append(blob[0])
            assert sorted(seen) == list(range(N))
        r = c.request({"op": "cache_build", "dataset": "single", "force": True})
        assert r["state"] in ("building", "ready")


def test_bad_row_refuses_the_start(scratch):
    d = str(scratch)
    os.makedirs(os.path.join(d, "data"))
    with open(os.path.join(d, "data", "a.bin"), "wb") as f:
        f.write(b"x" * 10)
    with open(os.path.join(d, "m.csv"), "w") as f:
        f.write("path,w\na.bin,1.5\na.bin,oops\n")
    dm = support.Daemon(d, "  m:\n    kind: files\n    path: data\n"
                           "    manifest: {path: m.csv, columns: {path: file, w: float32}}\n")
    # --check refuses it; the daemon itself serves it as unavailable (itest_reload).
    p = subprocess.run([dm.bin, "--config", dm.config, "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "dataset 'm': " in p.stderr and "m.csv:3: column 'w': 'oops' is not a finite float32" in p.stderr, p.stderr
