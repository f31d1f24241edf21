"""The `sql` kind against a real SQLite database written by Python's sqlite3 module: rows
served as samples (blob bytes and labels equal to the rows, exact cover per epoch, across
ranks and from a resumed batch); with a cache, the first pass reads the database and later
epochs read the cache, which keeps serving after the database file is removed; bad
queries refuse the start with SQLite's message and the dataset's name."""
import os
import sqlite3
import subprocess
import time

import numpy as np
import pytest

import support
import loaderclient

N = 150


def table_rows():
    """The rows of table rec (id, payload, diag, split), as the PostgreSQL tests write them too."""
    rng = np.random.default_rng(11)
    out = []
    for k in range(N + 30):
        i = 1000 + 3 * k
        size = 64 + (k * 13) % 200
        blob = i.to_bytes(4, "little") + rng.integers(0, 256, size - 4, dtype=np.uint8).tobytes()
        out.append((i, blob, ["flu", "cold", "ok"][k % 3], "test" if k % 6 == 5 else "train"))
    return out


def train_rows(table):
    """What the datasets serve: {id: (payload, diag)} of the rows of split 'train'."""
    return {i: (blob, diag) for i, blob, diag, split in table if split == "train"}


def _make_db(path):
    table = table_rows()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE rec (id INTEGER PRIMARY KEY, payload BLOB, diag TEXT, split TEXT)")
    con.executemany("INSERT INTO rec VALUES (?, ?, ?, ?)", table)
    con.commit()
    con.close()
    return train_rows(table)


@pytest.fixture(scope="module")
def sql_daemon():
    d = support.short_tmpdir("lc-sql.")
    rows = _make_db(os.path.join(d, "rec.db"))
    q = "SELECT id, payload, diag FROM rec WHERE split = 'train'"
    dm = support.Daemon(d, "  rec:\n    kind: sql\n    path: rec.db\n    query: \"%s\"\n    key: id\n"
                           "    columns: {payload: blob, diag: label}\n"
                           "  recc:\n    kind: sql\n    path: rec.db\n    query: \"%s\"\n    key: id\n"
                           "    columns: {payload: blob, diag: label}\n    cache: {path: recc.ldc}\n" % (q, q))
    dm.start()
    try:
        yield dm, d, rows
    finally:
        rc = dm.stop()
        left = support.shm_left(dm.pid)
        dm.kill()
        support.rmtree(d)
        assert rc == 0, dm.log_text()
        assert left == []


CLASSES = sorted(["flu", "cold", "ok"])


def check_batch(b, rows):
    got = []
    rf = b["payload"]
    for r in range(b.rows):
        blob = bytes(rf[r])
        i = int.from_bytes(blob[:4], "little")
        assert blob == rows[i][0]
        assert b["label"][r] == CLASSES.index(rows[i][1])
        got.append(i)
    return got


def test_rows_exact_cover(sql_daemon):
    dm, _, rows = sql_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["rec"]["kind"] == "sql" and ds["rec"]["samples"] == len(rows)
        assert ds["rec"]["classes"] == CLASSES and ds["rec"]["source"].endswith("rec.db")
        exact_cover(c, "rec", rows)


def exact_cover(c, name, rows):
    """Every row once per epoch, bytes and labels equal, in two orders, in key order
    without shuffle, across two ranks and from a resumed batch."""
    keys = sorted(rows)
    with c.open(name, 16, seed=9, epochs=2) as s:
        seen = {0: [], 1: []}
        for b in s:
            seen[b.epoch] += check_batch(b, rows)
    assert sorted(seen[0]) == sorted(seen[1]) == keys
    assert seen[0] != seen[1]
    with c.open(name, 20, shuffle=False, epochs=1) as s:      # key order
        assert [i for b in s for i in check_batch(b, rows)] == keys
    parts = []
    for rank in range(2):
        with c.open(name, 8, seed=5, epochs=1, rank=rank, world_size=2) as s:
            parts.append([i for b in s for i in check_batch(b, rows)])
    assert sorted(parts[0] + parts[1]) == keys
    with c.open(name, 8, seed=5, epochs=1, rank=1, world_size=2, start_batch=3) as s:
        assert [i for b in s for i in check_batch(b, rows)] == parts[1][24:]


def build_cache(c, name, count, timeout=20):
    """Asks for the cache of `name` once its check is done and waits until it is ready
    with `count` samples; its cache_info."""
    deadline = time.monotonic() + timeout
    info = c.request({"op": "cache_info", "dataset": name})
    while info["state"] == "checking" and time.monotonic() < deadline:
        time.sleep(0.02)
        info = c.request({"op": "cache_info", "dataset": name})
    c.request({"op": "cache_build", "dataset": name})
    while info["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.02)
        info = c.request({"op": "cache_info", "dataset": name})
    assert info["state"] == "ready", info
    assert info["file"]["count"] == count
    return info


def test_cache_then_database_removed(sql_daemon):
    dm, d, rows = sql_daemon
    keys = sorted(rows)
    with loaderclient.Client(dm.socket, timeout=10) as c:
        info = build_cache(c, "recc", len(rows))
        assert info["file"]["data_bytes"] >= sum(len(b) for b, _ in rows.values())   # aligned
        with c.open("recc", 32, seed=3, epochs=1) as s:
            first = [i for b in s for i in check_batch(b, rows)]
        assert sorted(first) == keys
        hits = c.request({"op": "cache_info", "dataset": "recc"})["hits"]
        # The database goes away mid-epoch: the cache keeps serving every sample, bit for bit.
        seen = []
        with c.open("recc", 32, seed=3, epochs=2) as s:
            for n, b in enumerate(s):
                seen += check_batch(b, rows)
                if n == 1:
                    os.unlink(os.path.join(d, "rec.db"))
        assert sorted(seen) == sorted(keys * 2)
        # A stream reads the source until the cache is proven current, then the cache:
        # with the database gone, streams (each checked whole) until one read the cache.
        deadline = time.monotonic() + 20
        while c.request({"op": "cache_info", "dataset": "recc"})["hits"] == hits and time.monotonic() < deadline:
            with c.open("recc", 32, seed=4, epochs=1) as s:
                assert sorted(i for b in s for i in check_batch(b, rows)) == keys
        assert c.request({"op": "cache_info", "dataset": "recc"})["hits"] > hits


def test_bad_query_refuses_the_start(scratch):
    d = str(scratch)
    _make_db(os.path.join(d, "x.db"))
    cfg = support.Daemon(d, "  bad:\n    kind: sql\n    path: x.db\n    query: SELECT id, payload FROM records\n"
                            "    key: id\n    columns: {payload: blob}\n")
    # --check refuses it; the daemon itself serves it as unavailable (itest_reload).
    p = subprocess.run([cfg.bin, "--config", cfg.config, "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "dataset 'bad'" in p.stderr and "no such table: records" in p.stderr, p.stderr
