"""The `tar_shards` kind against WebDataset shards written by Python's tarfile (ustar, GNU
and pax, long names and all): samples grouped by key, their bytes, arrays and labels equal
to what was written, exact cover per epoch, across ranks and from a resumed batch; an image
pipeline whose pixels equal those of the same JPEGs served from a folder, also through the
cache; the member index kept next to the cache and reused; a corrupt or truncated shard
refused with the shard's name and the byte offset; a shard rewritten under the daemon
fails the reads that would use stale offsets, and the next stream sees the new shard."""
import io
import os
import subprocess
import tarfile
import time

import numpy as np
import pytest

import support
import loaderclient

N, PER_SHARD = 90, 32
FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]


def _add(tf, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 1700000000
    tf.addfile(ti, io.BytesIO(data))


def _payload(i):
    rng = np.random.default_rng(i)
    size = 40 + (i * 37) % 300
    return i.to_bytes(4, "little") + rng.integers(0, 256, size - 4, dtype=np.uint8).tobytes()


def _array(i):
    a = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
    a[0, 0] = i
    return a


def _npy(a):
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def _write_shards(d, n=N, per=PER_SHARD, prefix="s"):
    """Samples i: KEY.bin (bytes), KEY.seg.npy (float32[3,4]), KEY.cls (i % 7); each
    shard in another tar format; the keys of the pax shard are longer than ustar's 100
    bytes. A directory entry and a member without a suffix are not samples."""
    os.makedirs(d, exist_ok=True)
    for s in range(0, (n + per - 1) // per):
        fmt = FORMATS[s % 3]
        with tarfile.open(os.path.join(d, "%s-%03d.tar" % (prefix, s)), "w", format=fmt) as tf:
            ti = tarfile.TarInfo("meta")
            ti.type = tarfile.DIRTYPE
            tf.addfile(ti)
            _add(tf, "meta/README", b"not a sample")
            for i in range(s * per, min(n, (s + 1) * per)):
                key = ("k" * 120 + "/%06d" if fmt == tarfile.PAX_FORMAT else "%06d") % i
                _add(tf, key + ".bin", _payload(i))
                _add(tf, key + ".seg.npy", _npy(_array(i)))
                _add(tf, key + ".cls", b"%d\n" % (i % 7))


def _check(b):
    got = []
    for r in range(b.rows):
        blob = bytes(b["bin"][r])
        i = int.from_bytes(blob[:4], "little")
        assert blob == _payload(i)
        assert np.array_equal(b["seg.npy"][r], _array(i))
        assert b["label"][r] == i % 7
        got.append(i)
    return got


def _jpegs(n):
    from PIL import Image
    out = []
    for i in range(n):
        y, x = np.mgrid[0:60, 0:80]
        rgb = np.stack([(x * 3 + i * 11) % 256, (y * 4 + i * 5) % 256, ((x + y) * 2 + i) % 256], -1).astype(np.uint8)
        f = io.BytesIO()
        Image.fromarray(rgb).save(f, format="JPEG", quality=90)
        out.append(f.getvalue())
    return out


@pytest.fixture(scope="module")
def tar_daemon():
    pytest.importorskip("PIL")
    d = support.short_tmpdir("lc-tar.")
    _write_shards(os.path.join(d, "shards"))
    # The same JPEGs as a folder (class_C/NNN.jpg, sorted as the shards are) and as shards.
    imgs = _jpegs(40)
    os.makedirs(os.path.join(d, "wds"))
    for c in range(4):
        os.makedirs(os.path.join(d, "folder", "class_%d" % c))
    order = sorted(("class_%d/%03d.jpg" % (i % 4, i), i) for i in range(40))
    for rel, i in order:
        with open(os.path.join(d, "folder", rel), "wb") as f:
            f.write(imgs[i])
    for s in range(2):
        with tarfile.open(os.path.join(d, "wds", "img-%d.tar" % s), "w") as tf:
            for rel, i in order[s * 20:(s + 1) * 20]:
                key = rel[:-4]
                _add(tf, key + ".jpg", imgs[i])
                _add(tf, key + ".cls", b"%d" % (i % 4))
    pipe = ("    transforms:\n      - random_resized_crop: {size: 24}\n      - random_flip: {}\n"
            "      - to_dtype: {dtype: uint8, layout: HWC}\n")
    dm = support.Daemon(d, "  tar:\n    kind: tar_shards\n    path: shards\n"
                           "  one:\n    kind: tar_shards\n    path: shards/s-001.tar\n"
                           "    fields: {bin: bytes, cls: label}\n"
                           "  folder:\n    kind: image_folder\n    path: folder\n" + pipe +
                           "  wds:\n    kind: tar_shards\n    path: wds\n" + pipe +
                           "  wdsc:\n    kind: tar_shards\n    path: wds\n    cache: {path: wds.ldc}\n" + pipe)
    dm.start()
    try:
        yield dm, d
    finally:
        try:
            dm.stop_clean()
        finally:
            support.rmtree(d)


def test_samples_exact_cover(tar_daemon):
    dm, _ = tar_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["tar"]["kind"] == "tar_shards" and ds["tar"]["samples"] == N
        assert ds["one"]["samples"] == PER_SHARD
        with c.open("tar", 16, seed=9, epochs=2) as s:
            assert [f["name"] for f in s.fields] == ["bin", "seg.npy", "label"]
            assert s.fields[1] == {"name": "seg.npy", "dtype": "float32", "shape": [3, 4], "ragged": False}
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += _check(b)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(N))
        assert seen[0] != seen[1]
        with c.open("tar", 20, shuffle=False, epochs=1) as s:          # shard order, then member order
            assert [i for b in s for i in _check(b)] == list(range(N))
        parts = []
        for rank in range(3):
            with c.open("tar", 8, seed=5, epochs=1, rank=rank, world_size=3) as s:
                parts.append([i for b in s for i in _check(b)])
        assert sorted(sum(parts, [])) == list(range(N))
        assert len(parts[0]) == len(parts[1]) == len(parts[2])
        with c.open("tar", 8, seed=5, epochs=1, rank=1, world_size=3, start_batch=2) as s:
            assert [i for b in s for i in _check(b)] == parts[1][16:]
        with c.open("one", 32, shuffle=False, epochs=1) as s:          # one shard, two fields by name
            b = s.next()
            assert [f["name"] for f in s.fields] == ["bin", "label"]
            assert [int.from_bytes(bytes(b["bin"][r][:4]), "little") for r in range(32)] == list(range(32, 64))


def test_images_equal_a_folder_and_the_cache(tar_daemon):
    dm, d = tar_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        def epoch(name, seed):
            with c.open(name, 8, seed=seed, epochs=1) as s:
                return [(np.array(b["image"]), np.array(b["label"])) for b in s]
        ref = epoch("folder", 3)
        for name in ("wds", "wdsc"):
            got = epoch(name, 3)
            assert len(got) == len(ref) == 5
            for (gi, gl), (ri, rl) in zip(got, ref):
                assert gi.shape == (8, 24, 24, 3) and np.array_equal(gi, ri)
                assert np.array_equal(gl, rl)
        deadline = time.monotonic() + 20
        info = c.request({"op": "cache_info", "dataset": "wdsc"})
        while info["state"] == "checking" and time.monotonic() < deadline:
            time.sleep(0.02)
            info = c.request({"op": "cache_info", "dataset": "wdsc"})
        if info["state"] != "ready":        # the streams above may have built it already
            try:
                c.request({"op": "cache_build", "dataset": "wdsc"})
            except loaderclient.LoaderdError as e:
                assert "is valid" in str(e) or "build" in str(e), e
        while info["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.02)
            info = c.request({"op": "cache_info", "dataset": "wdsc"})
        assert info["state"] == "ready", info
        assert os.path.exists(os.path.join(d, "wds.ldc.tarindex"))
        for _ in range(100):
            got = epoch("wdsc", 3)
            for (gi, gl), (ri, rl) in zip(got, ref):
                assert np.array_equal(gi, ri) and np.array_equal(gl, rl)
            info = c.request({"op": "cache_info", "dataset": "wdsc"})
            if info["hits"] > 0 or time.monotonic() > deadline:
                break
        assert info["hits"] > 0, info


def _check_fails(d, datasets, *needles):
    cfg = support.Daemon(d, datasets)
    p = subprocess.run([cfg.bin, "--config", cfg.config, "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    for n in needles:
        assert n in p.stderr, p.stderr


def test_corrupt_and_truncated_shards(scratch):
    d = str(scratch)
    _write_shards(os.path.join(d, "a"), n=10, per=10)
    raw = open(os.path.join(d, "a", "s-000.tar"), "rb").read()
    # A header whose checksum fails: the fourth member's (after the directory, README, ...).
    bad = bytearray(raw)
    with tarfile.open(os.path.join(d, "a", "s-000.tar")) as tf:
        victim = tf.getmembers()[3]
    bad[victim.offset + 10] ^= 0x55
    os.makedirs(os.path.join(d, "b"))
    open(os.path.join(d, "b", "s-000.tar"), "wb").write(bytes(bad))
    _check_fails(d, "  b:\n    kind: tar_shards\n    path: b\n", "dataset 'b'", "shard 's-000.tar'",
                 "offset %d: not a tar header (bad checksum)" % victim.offset)
    # Cut in the middle of a member's data.
    os.makedirs(os.path.join(d, "c"))
    open(os.path.join(d, "c", "s-000.tar"), "wb").write(raw[:victim.offset_data + 5])
    _check_fails(d, "  c:\n    kind: tar_shards\n    path: c\n", "shard 's-000.tar'",
                 "offset %d: truncated" % victim.offset)
    # Not a tar at all, and a directory without shards.
    os.makedirs(os.path.join(d, "e"))
    open(os.path.join(d, "e", "x.tar"), "wb").write(b"\x89PNG" + b"\0" * 600)
    _check_fails(d, "  e:\n    kind: tar_shards\n    path: e\n", "shard 'x.tar'", "offset 0: not a tar header")
    _check_fails(d, "  f:\n    kind: tar_shards\n    path: a\n    pattern: '*.tgz'\n", "no shard matches '*.tgz'")
    # An image field needs transforms.
    _check_fails(d, "  g:\n    kind: tar_shards\n    path: a\n    fields: {bin: image}\n", "fields.bin is an image")


def test_index_reused_and_shard_changed(scratch):
    d = str(scratch)
    _write_shards(os.path.join(d, "sh"), n=40, per=20)
    ds = "  t:\n    kind: tar_shards\n    path: sh\n    index: t.idx\n    on_error: fail\n"
    idx = os.path.join(d, "t.idx")
    for run in range(2):        # the second run reads the index the first one wrote
        dm = support.Daemon(d, ds)
        dm.start()
        try:
            if run == 1:        # every shard as indexed: nothing scanned, the index not written again
                assert os.stat(idx).st_mtime_ns == written
            with loaderclient.Client(dm.socket, timeout=10) as c:
                with c.open("t", 10, seed=1, epochs=1) as s:
                    assert sorted(i for b in s for i in _check(b)) == list(range(40))
                if run == 1:
                    # Rewrite shard 1 in place: other payloads, other offsets.
                    path = os.path.join(d, "sh", "s-001.tar")
                    with c.open("t", 1, shuffle=False, epochs=1, start_batch=20, prefetch=1) as s:
                        b = s.next()
                        b.release()
                        time.sleep(0.05)
                        with tarfile.open(path + ".new", "w") as tf:
                            for i in range(20, 45):
                                _add(tf, "x%06d.bin" % i, b"%d" % i * 3)
                                _add(tf, "x%06d.cls" % i, b"1")
                                _add(tf, "x%06d.seg.npy" % i, _npy(_array(i)))
                        data = open(path + ".new", "rb").read()
                        os.unlink(path + ".new")
                        with open(path, "r+b") as f:
                            f.write(data)
                            f.truncate()
                        st = os.stat(path)
                        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000000))
                        with pytest.raises(loaderclient.LoaderdError) as ei:
                            for _ in range(19):
                                s.next().release()
                        assert "shard 's-001.tar' changed since it was indexed" in str(ei.value)
                    # A new stream indexes it again: 20 + 25 samples.
                    with c.open("t", 5, shuffle=False, epochs=1) as s:
                        rows = [bytes(b["bin"][r]) for b in s for r in range(b.rows)]
                    assert len(rows) == 45 and rows[20] == b"202020"
        finally:
            dm.stop_clean()
        written = os.stat(idx).st_mtime_ns


def test_declared_and_templates(scratch):
    """Shards are the operator's: a trainer may refine a configured tar_shards dataset (its
    own on_error) but not point its index or fields elsewhere, nor declare one."""
    d = str(scratch)
    _write_shards(os.path.join(d, "sh"), n=20, per=10)
    dm = support.Daemon(d, "  t:\n    kind: tar_shards\n    path: sh\n"
                           "access:\n  declare: {roots: [%s]}\n" % d)
    dm.start()
    try:
        with loaderclient.Client(dm.socket, timeout=10) as c:
            with c.open(template="t", spec={"on_error": "fail"}, batch_size=5, epochs=1) as s:
                assert sorted(i for b in s for i in _check(b)) == list(range(20))
            for key, value in (("index", os.path.join(d, "elsewhere.idx")), ("fields", {"bin": "bytes"})):
                with pytest.raises(loaderclient.PermissionDenied, match="the source of template 't'"):
                    c.open(template="t", spec={key: value}, batch_size=5)
            assert not os.path.exists(os.path.join(d, "elsewhere.idx"))
            with pytest.raises(loaderclient.LoaderdError, match="a tar_shards dataset is configured by the operator"):
                c.open(spec={"kind": "tar_shards", "path": "sh"}, batch_size=5)
    finally:
        dm.stop_clean()
