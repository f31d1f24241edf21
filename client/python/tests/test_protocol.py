"""proto/PROTOCOL.md says what the daemon does: its error table, its ops, and the replies of
the cache requests (against a real loaderd with a cache)."""
import os
import re
import time

import pytest

import support

import loaderclient
from loaderclient import errors

DOC = os.path.join(support.REPO, "proto", "PROTOCOL.md")


def doc_text():
    with open(DOC) as f:
        return f.read()


def test_error_table_names_and_numbers():
    rows = re.findall(r"^\| `(\w+)` \| (-\d+) \|", doc_text(), re.M)
    assert len(rows) >= 20
    for name, code in rows:
        assert errors.CODE_NAMES.get(int(code)) == name, "PROTOCOL.md: %s %s" % (name, code)
    listed = {name for name, _ in rows}
    # What open and the cache requests answer, each with its row.
    assert {"out_of_range", "over_budget", "not_supported", "not_found", "exists", "cache_corrupt",
            "busy", "canceled"} <= listed


def test_open_bounds_are_the_librarys_limits():
    """The open request's table states the bounds the daemon enforces: the library's limits."""
    text = doc_text()
    lim = loaderclient.LIMITS
    assert "| `batch_size` | int [1, %d] |" % lim["batch_size_max"] in text
    assert "rank < world_size ≤ %d |" % lim["world_size_max"] in text
    assert "| `prefetch` | int [1, %d] |" % lim["prefetch_max"] in text
    assert lim["epoch_max"] == 2 ** 53 - 1 and "| `epoch` | int [0, 2^53) |" in text


def test_every_op_has_a_section():
    with open(os.path.join(support.REPO, "proto", "ld_wire.h")) as f:
        ops = re.findall(r'#define LD_OP_\w+ "(\w+)"', f.read())
    assert "cache_verify" in ops
    sections = set(re.findall(r"^### (\w+)$", doc_text(), re.M))
    assert set(ops) <= sections, set(ops) - sections


INFO_KEYS = {"dataset", "state", "path", "mode", "hits", "hit_bytes"}
FILE_KEYS = {"path", "version", "flags", "count", "fingerprint", "kind", "name", "source", "label_field",
             "build_time", "build_time_unix", "file_size", "data_bytes", "sample_bytes", "max_sample_bytes",
             "hits", "hit_bytes", "fields"}


def test_cache_requests_as_documented(scratch):
    """cache_info, cache_build and cache_verify: the replies' fields and the errors of the
    PROTOCOL.md sections."""
    d = str(scratch)
    support.gen_files(os.path.join(d, "rec"), 40, 64, 2)
    dm = support.Daemon(d, "  rec:\n    kind: files\n    path: rec\n    cache: {path: %s/rec.ldcache}\n"
                           "  plain:\n    kind: files\n    path: rec\n" % d)
    dm.start()
    try:
        with loaderclient.Client(dm.socket, timeout=10) as c:
            deadline = time.monotonic() + 10
            info = c.request({"op": "cache_info", "dataset": "rec"})
            while info["state"] == "checking" and time.monotonic() < deadline:
                time.sleep(0.02)
                info = c.request({"op": "cache_info", "dataset": "rec"})
            assert info["state"] == "absent" and INFO_KEYS <= set(info) and "file" not in info
            with pytest.raises(loaderclient.LoaderdError) as ei:
                c.request({"op": "cache_verify", "dataset": "rec"})
            assert ei.value.name == "not_found" and "no cache to verify" in ei.value.message
            r = c.request({"op": "cache_build", "dataset": "rec"})
            assert r["state"] in ("building", "ready") and (INFO_KEYS - {"dataset"}) <= set(r)
            while info["state"] != "ready" and time.monotonic() < deadline:
                time.sleep(0.02)
                info = c.request({"op": "cache_info", "dataset": "rec"})
            assert info["state"] == "ready" and set(info["file"]) == FILE_KEYS
            assert info["file"]["count"] == 40 and re.fullmatch(r"[0-9a-f]{16}", info["file"]["fingerprint"])
            assert info["file"]["label_field"] == 1
            with pytest.raises(loaderclient.LoaderdError) as ei:
                c.request({"op": "cache_build", "dataset": "rec"})
            assert ei.value.name == "exists" and "force" in ei.value.message
            r = c.request({"op": "cache_verify", "dataset": "rec"})   # answers once every sample was read
            assert r["ok"] is True and set(r) == {"id", "ok"}
            with pytest.raises(loaderclient.InvalidArgument, match="force"):
                c.request({"op": "cache_build", "dataset": "rec", "force": 1})
            with pytest.raises(loaderclient.LoaderdError) as ei:
                c.request({"op": "cache_info", "dataset": "plain"})
            assert ei.value.name == "not_supported"
            with pytest.raises(loaderclient.DatasetNotFound):
                c.request({"op": "cache_info", "dataset": "nope"})
            st = c.status()
            assert [x["dataset"] for x in st["caches"]] == ["rec"] and "file" not in st["caches"][0]
            assert {"bad_samples", "replaced_samples", "socket", "datasets"} <= set(st)
    finally:
        assert dm.stop() == 0
