"""`files` datasets at an s3:// location, against a real S3-compatible server (moto,
installed into build/s3venv on first use; s3server.py) that checks every signature:
objects served byte for byte with their folder labels, exact cover per epoch, across
ranks and from a resumed batch; keys signed with a credentials file or the environment;
the packed cache built from the store serves the rest of a run after the store went
away; a missing object is a bad sample named by its key; bad credentials and a store
that cannot be reached refuse the dataset with S3's error code, and no secret is ever
in a message. `tar_shards` at an s3:// location: the shards copied once into the folder
next to the index or cache, then served exactly as the same shards on a disk (cover,
ranks, resume, arrays, and the pixels of an image pipeline); a later run fetches only the
shards that changed in the store; a corrupt shard is named by its object and byte
offset; a prefix without shards, a missing bucket and bad credentials refuse the
dataset."""
import io
import os
import subprocess
import tarfile
import time

import numpy as np

import pytest

import support
import s3server
import loaderclient
import test_sources_tar as tartest

N, SIZE, CLASSES = 90, 300, 3
BUCKET = "data"

pytestmark = pytest.mark.deadline(600)   # the first use may install the server (pip)


BAD = {}
NPY_N = 10


def _npy_array(i):
    return np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * i
PIPE = ("    transforms:\n      - random_resized_crop: {size: 24}\n      - random_flip: {}\n"
        "      - to_dtype: {dtype: uint8, layout: HWC}\n")


def _have_pil():
    try:
        import PIL  # noqa: F401
        return True
    except ImportError:
        return False


def _write_jpeg_shards(d):
    imgs = tartest._jpegs(40)
    os.makedirs(d)
    for s in range(2):
        with tarfile.open(os.path.join(d, "img-%d.tar" % s), "w") as tf:
            for i in range(s * 20, (s + 1) * 20):
                tartest._add(tf, "%03d.jpg" % i, imgs[i])
                tartest._add(tf, "%03d.cls" % i, b"%d" % (i % 4))


def _corrupt_shard(d):
    """A shard whose fourth member's header fails its checksum; (path, that offset)."""
    tartest._write_shards(os.path.join(d, "badsrc"), n=10, per=10)
    path = os.path.join(d, "badsrc", "s-000.tar")
    with tarfile.open(path) as tf:
        victim = tf.getmembers()[3]
    raw = bytearray(open(path, "rb").read())
    raw[victim.offset + 10] ^= 0x55
    open(path, "wb").write(bytes(raw))
    return path, victim.offset


@pytest.fixture(scope="module")
def store():
    binary, why = s3server.ensure_installed()
    if not binary:
        pytest.skip("no S3-compatible server for the tests: " + why)
    d = support.short_tmpdir("lc-s3.")
    support.gen_files(os.path.join(d, "train"), N, SIZE, CLASSES, vary=True)
    objects = {}
    for root, _, files in os.walk(os.path.join(d, "train")):
        for f in files:
            p = os.path.join(root, f)
            objects["train/" + os.path.relpath(p, os.path.join(d, "train"))] = p
    # Not samples: a hidden object, a folder marker, an empty object, another prefix.
    extra = os.path.join(d, "extra.bin")
    with open(extra, "wb") as f:
        f.write(b"not a sample")
    empty = os.path.join(d, "empty.bin")
    open(empty, "wb").close()
    objects.update({"train/.hidden/x.bin": extra, "train/class_000/.swp": extra, "train/empty/": empty,
                    "train/class_001/zero.bin": empty, "trainee/x.bin": extra})
    for i in range(6):
        objects["miss/%d.bin" % i] = extra
    for i in range(3):
        objects["ttla/%d.bin" % i] = objects["ttlb/%d.bin" % i] = extra
    # .npy objects: float32[3,4] in two folders; in npybad/ one of another shape.
    os.makedirs(os.path.join(d, "npy"))
    for i in range(NPY_N):
        p = os.path.join(d, "npy", "%02d.npy" % i)
        np.save(p, _npy_array(i))
        objects["npy/c%d/%02d.npy" % (i % 2, i)] = objects["npybad/%02d.npy" % i] = p
    np.save(os.path.join(d, "npy", "odd.npy"), np.zeros(2, np.float32))
    objects["npybad/05.npy"] = os.path.join(d, "npy", "odd.npy")
    # Shards: three of tartest's (bytes, arrays, labels), JPEG shards also read from a
    # local folder, and a corrupt one. Not shards: one in a folder below, a hidden one.
    tartest._write_shards(os.path.join(d, "shards"))
    for name in sorted(os.listdir(os.path.join(d, "shards"))):
        objects["shards/" + name] = os.path.join(d, "shards", name)
    objects.update({"shards/sub/s-009.tar": os.path.join(d, "shards", "s-000.tar"), "shards/.s-008.tar": extra})
    if _have_pil():
        _write_jpeg_shards(os.path.join(d, "wds"))
        for name in sorted(os.listdir(os.path.join(d, "wds"))):
            objects["wds/" + name] = os.path.join(d, "wds", name)
    objects["bad/s-000.tar"], BAD["offset"] = _corrupt_shard(d)
    tartest._write_shards(os.path.join(d, "again"), n=60, per=20)
    for name in sorted(os.listdir(os.path.join(d, "again"))):
        objects["again/" + name] = os.path.join(d, "again", name)
    srv = s3server.Server(binary, BUCKET, objects, os.path.join(d, "moto.log"))
    try:
        yield srv, d
    finally:
        srv.stop()
        support.rmtree(d)


def _datasets(srv, creds):
    ep = "{endpoint: \"%s\", profile: %s, credentials_file: %s, retries: 1, timeout: 5}" % (
        srv.endpoint, srv.credentials_file(creds), creds)
    return ("  s3:\n    kind: files\n    path: s3://%s/train/\n    s3: %s\n"
            "  s3c:\n    kind: files\n    path: s3://%s/train\n    pattern: \"*.bin\"\n    s3: %s\n"
            "    cache: {path: s3c.ldc}\n"
            "  miss:\n    kind: files\n    path: s3://%s/miss/\n    on_error: fail\n    s3: %s\n"
            "  missr:\n    kind: files\n    path: s3://%s/miss/\n    s3: %s\n"
            "  tars:\n    kind: tar_shards\n    path: s3://%s/shards\n    index: tars.idx\n    s3: %s\n"
            ) % (BUCKET, ep, BUCKET, ep, BUCKET, ep, BUCKET, ep, BUCKET, ep) + "".join(
            "  %s:\n    kind: files\n    path: s3://%s/%s/\n    cache: {path: %s.ldc}\n    s3: %s, list_ttl: %d}\n" % (
                name, BUCKET, name, name, ep[:-1], ttl) for name, ttl in (("ttla", 3600), ("ttlb", 0))) + (
            "  npy:\n    kind: files\n    path: s3://%s/npy\n    format: npy\n    s3: %s\n"
            "  npyc:\n    kind: files\n    path: s3://%s/npy\n    format: npy\n    cache: {path: npyc.ldc}\n    s3: %s\n"
            "  npybad:\n    kind: files\n    path: s3://%s/npybad\n    format: npy\n    on_error: fail\n    s3: %s\n"
            % (BUCKET, ep, BUCKET, ep, BUCKET, ep)) + (
            "  wdss3:\n    kind: tar_shards\n    path: s3://%s/wds/\n    cache: {path: wdss3.ldc}\n    s3: %s\n%s"
            "  wdsloc:\n    kind: tar_shards\n    path: wds\n%s" % (BUCKET, ep, PIPE, PIPE) if _have_pil() else "")


@pytest.fixture(scope="module")
def s3_daemon(store):
    srv, d = store
    dm = support.Daemon(d, _datasets(srv, os.path.join(d, "credentials")))
    dm.start(timeout=60)
    try:
        yield dm, srv, d
    finally:
        dm.stop_clean()


def _expect():
    """bytes -> (index, label) of every sample."""
    return {support.file_bytes(i, SIZE, True).tobytes(): (i, i % CLASSES) for i in range(N)}


def _check(b, expect):
    got = []
    for r in range(b.rows):
        blob = bytes(b["data"][r])
        i, label = expect[blob]
        assert b["label"][r] == label
        got.append(i)
    return got


def test_objects_exact_cover_ranks_resume(s3_daemon):
    dm, srv, _ = s3_daemon
    expect = _expect()
    with loaderclient.Client(dm.socket, timeout=20) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["s3"]["kind"] == "files" and ds["s3"]["samples"] == N, ds["s3"]
        assert ds["s3"]["source"] == "s3://data/train/"
        assert ds["s3"]["classes"] == ["class_000", "class_001", "class_002"]
        with c.open("s3", 16, seed=9, epochs=2) as s:
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += _check(b, expect)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(N))
        assert seen[0] != seen[1]
        parts = []
        for rank in range(3):
            with c.open("s3", 5, seed=5, epochs=1, rank=rank, world_size=3) as s:
                parts.append([i for b in s for i in _check(b, expect)])
        assert sorted(parts[0] + parts[1] + parts[2]) == list(range(N))
        with c.open("s3", 5, seed=5, epochs=1, rank=2, world_size=3, start_batch=2) as s:
            assert [i for b in s for i in _check(b, expect)] == parts[2][10:]
    # Nothing the daemon said shows the secret.
    assert srv.secret not in dm.log_text()


def test_tar_shards_exact_cover_ranks_resume(s3_daemon):
    dm, srv, d = s3_daemon
    with loaderclient.Client(dm.socket, timeout=20) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["tars"]["kind"] == "tar_shards" and ds["tars"]["samples"] == tartest.N, ds["tars"]
        assert ds["tars"]["source"] == "s3://data/shards"
        with c.open("tars", 16, seed=9, epochs=2) as s:
            assert [f["name"] for f in s.fields] == ["bin", "seg.npy", "label"]
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += tartest._check(b)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(tartest.N))
        assert seen[0] != seen[1]
        parts = []
        for rank in range(3):
            with c.open("tars", 5, seed=5, epochs=1, rank=rank, world_size=3) as s:
                parts.append([i for b in s for i in tartest._check(b)])
        assert sorted(parts[0] + parts[1] + parts[2]) == list(range(tartest.N))
        with c.open("tars", 5, seed=5, epochs=1, rank=1, world_size=3, start_batch=3) as s:
            assert [i for b in s for i in tartest._check(b)] == parts[1][15:]
    # The copies, byte for byte, and what was copied; nothing of the folder below.
    local = os.path.join(d, "tars.idx.shards")
    names = sorted(n for n in os.listdir(local))
    assert names == [".listing", "s-000.tar", "s-001.tar", "s-002.tar"], names
    for n in names[1:]:
        assert open(os.path.join(local, n), "rb").read() == open(os.path.join(d, "shards", n), "rb").read()
    assert os.path.exists(os.path.join(d, "tars.idx"))
    assert srv.secret not in dm.log_text()


def test_tar_shards_images_equal_the_local_shards(s3_daemon):
    dm, _, d = s3_daemon
    if not _have_pil():
        pytest.skip("PIL is needed to write the JPEGs")
    with loaderclient.Client(dm.socket, timeout=20) as c:
        def epoch(name, seed):
            with c.open(name, 8, seed=seed, epochs=1) as s:
                return [(np.array(b["image"]), np.array(b["label"])) for b in s]
        ref = epoch("wdsloc", 4)
        for _ in range(2):      # the second pass may read the cache built from the copies
            got = epoch("wdss3", 4)
            assert len(got) == len(ref) == 5
            for (gi, gl), (ri, rl) in zip(got, ref):
                assert gi.shape == (8, 24, 24, 3) and np.array_equal(gi, ri) and np.array_equal(gl, rl)
    assert sorted(os.listdir(os.path.join(d, "wdss3.ldc.shards"))) == [".listing", "img-0.tar", "img-1.tar"]


def test_tar_shards_fetched_once_and_again_when_changed(store, scratch):
    srv, _ = store
    d = str(scratch)
    ep = "{endpoint: \"%s\", profile: %s, credentials_file: %s, retries: 1, timeout: 5}" % (
        srv.endpoint, srv.credentials_file(os.path.join(d, "credentials")), os.path.join(d, "credentials"))
    ds = "  t:\n    kind: tar_shards\n    path: s3://%s/again\n    index: t.idx\n    on_error: fail\n    s3: %s\n" % (
        BUCKET, ep)
    local = os.path.join(d, "t.idx.shards")
    stamps = None
    for run in range(2):
        if run == 1:
            # In the store: shard 1 rewritten (25 samples of other bytes), shard 2 gone.
            with tarfile.open(os.path.join(d, "new.tar"), "w") as tf:
                for i in range(20, 45):
                    tartest._add(tf, "x%06d.bin" % i, b"%d" % i * 3)
                    tartest._add(tf, "x%06d.cls" % i, b"1")
                    tartest._add(tf, "x%06d.seg.npy" % i, tartest._npy(tartest._array(i)))
            srv.update({"again/s-001.tar": os.path.join(d, "new.tar"), "again/s-002.tar": None})
        dm = support.Daemon(d, ds)
        dm.start(timeout=60)
        try:
            with loaderclient.Client(dm.socket, timeout=20) as c:
                with c.open("t", 5, shuffle=False, epochs=1) as s:
                    rows = [bytes(b["bin"][r]) for b in s for r in range(b.rows)]
        finally:
            dm.stop_clean()
        now = {n: os.stat(os.path.join(local, n)).st_mtime_ns for n in os.listdir(local) if not n.startswith(".")}
        if run == 0:
            assert rows == [tartest._payload(i) for i in range(60)]
            assert sorted(now) == ["s-000.tar", "s-001.tar", "s-002.tar"]
        else:
            assert len(rows) == 45 and rows[:20] == [tartest._payload(i) for i in range(20)] and rows[20] == b"202020"
            assert sorted(now) == ["s-000.tar", "s-001.tar"]          # the copy of shard 2 removed
            assert now["s-000.tar"] == stamps["s-000.tar"]            # not fetched again
            assert now["s-001.tar"] != stamps["s-001.tar"]
        stamps = now


def test_tar_shards_refused(store, scratch):
    srv, _ = store
    d = str(scratch)
    creds = os.path.join(d, "credentials")
    ep = "{endpoint: \"%s\", profile: %s, credentials_file: %s, retries: 0}" % (
        srv.endpoint, srv.credentials_file(creds), creds)

    def check(path, *needles, extra="    index: x.idx\n", env=None):
        dm = support.Daemon(d, "  x:\n    kind: tar_shards\n    path: %s\n%s    s3: %s\n" % (path, extra, ep))
        rc, err = _run_check(dm, env or {})
        assert rc != 0
        for n in needles:
            assert n in err, err
        assert srv.secret not in err
    check("s3://data/bad/", "dataset 'x'", "shard 's3://data/bad/s-000.tar'",
          "offset %d: not a tar header (bad checksum)" % BAD["offset"])
    check("s3://data/nothing/", "no shard matches '*.tar' under s3://data/nothing/")
    check("s3://nosuchbucket/shards/", "dataset 'x'", "NoSuchBucket")
    check("s3://data/shards/", "x.path", "index:", "cache:", extra="")
    # Bad keys: the environment's, the credentials file's profile left out.
    dm = support.Daemon(d, "  x:\n    kind: tar_shards\n    path: s3://data/shards/\n    index: y.idx\n"
                           "    s3: {endpoint: \"%s\", retries: 0}\n" % srv.endpoint)
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": srv.key_id, "AWS_SECRET_ACCESS_KEY": _wrong(srv.secret)})
    assert rc != 0 and "403 SignatureDoesNotMatch" in err and srv.secret[1:] not in err, err
    assert not os.path.exists(os.path.join(d, "y.idx.shards"))


def _npy_rows(b):
    got = []
    for r in range(b.rows):
        a = np.array(b["data"][r])
        i = int(a[0, 0]) // 100
        assert np.array_equal(a, _npy_array(i)) and b["label"][r] == i % 2
        got.append(i)
    return got


def test_npy_objects_typed_and_cached(s3_daemon):
    dm, _, _ = s3_daemon
    with loaderclient.Client(dm.socket, timeout=20) as c:
        with c.open("npy", 4, seed=3, epochs=2) as s:
            assert s.fields[0] == {"name": "data", "dtype": "float32", "shape": [3, 4], "ragged": False}
            seen = {0: [], 1: []}
            for b in s:
                seen[b.epoch] += _npy_rows(b)
        assert sorted(seen[0]) == sorted(seen[1]) == list(range(NPY_N))
        # The cache holds the arrays: its epochs equal the store's.
        with c.open("npyc", 4, seed=3, epochs=1) as s:
            assert sorted(i for b in s for i in _npy_rows(b)) == list(range(NPY_N))
        deadline = time.monotonic() + 30
        info = c.request({"op": "cache_info", "dataset": "npyc"})
        while info["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.02)
            info = c.request({"op": "cache_info", "dataset": "npyc"})
        assert info["state"] == "ready" and info["file"]["count"] == NPY_N, info
        with c.open("npyc", 4, seed=3, epochs=1) as s:
            assert sorted(i for b in s for i in _npy_rows(b)) == list(range(NPY_N))
        assert c.request({"op": "cache_info", "dataset": "npyc"})["hits"] > 0
        # An object of another shape is a bad sample named by its key.
        with pytest.raises(loaderclient.LoaderdError) as e:
            with c.open("npybad", 5, shuffle=False, epochs=1) as s:
                for _ in s:
                    pass
        assert "05.npy" in str(e.value) and ".npy array is float32[2]" in str(e.value), str(e.value)


def _listings(d, prefix):
    """The ListObjectsV2 requests for `prefix` the store has answered (its request log)."""
    with open(os.path.join(d, "moto.log"), errors="replace") as f:
        return sum(1 for line in f if "list-type=2" in line and "prefix=" + prefix in line)


def test_listing_reused_within_list_ttl(s3_daemon):
    """Each stream open checks the cache's fingerprint: within s3.list_ttl of the last
    listing (the one at open) the check reuses it; with list_ttl 0 every check lists."""
    dm, _, d = s3_daemon
    with loaderclient.Client(dm.socket, timeout=20) as c:
        before = {p: _listings(d, p) for p in ("ttla", "ttlb")}
        for _ in range(3):
            for name in ("ttla", "ttlb"):
                with c.open(name, 3, seed=1, epochs=1) as s:
                    assert sum(b.rows for b in s) == 3
        for name in ("ttla", "ttlb"):
            deadline = time.monotonic() + 30
            info = c.request({"op": "cache_info", "dataset": name})
            while info["state"] != "ready" and time.monotonic() < deadline:
                time.sleep(0.02)
                info = c.request({"op": "cache_info", "dataset": name})
            assert info["state"] == "ready", info
        after = {p: _listings(d, p) for p in ("ttla", "ttlb")}
    assert before["ttla"] == after["ttla"] == 1, (before, after)     # the open's listing only
    assert after["ttlb"] >= before["ttlb"] + 1, (before, after)


def test_missing_object_is_a_bad_sample(s3_daemon):
    dm, srv, _ = s3_daemon
    srv.delete("miss/3.bin")
    with loaderclient.Client(dm.socket, timeout=20) as c:
        with pytest.raises(loaderclient.LoaderdError) as e:
            with c.open("miss", 6, shuffle=False, epochs=1) as s:
                for _ in s:
                    pass
        msg = str(e.value)
        assert "3.bin" in msg and "s3://data/miss/3.bin" in msg and "404 NoSuchKey" in msg, msg
        with c.open("missr", 2, seed=1, epochs=1) as s:
            rows = [bytes(b["data"][r]) for b in s for r in range(b.rows)]
        assert len(rows) == 6 and set(rows) == {b"not a sample"}
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["missr"]["bad_samples"] == 1 and ds["missr"]["replaced_samples"] >= 1


def _wrong(secret):
    """The secret with its first character changed (the server's secret is random: it may
    start with the character put in its place)."""
    return ("y" if secret[0] == "x" else "x") + secret[1:]


def _run_check(dm, env):
    p = subprocess.run([dm.bin, "--config", dm.config, "--check"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **env))
    return p.returncode, p.stderr


def test_bad_credentials_name_the_bucket_and_the_code(store, scratch):
    srv, _ = store
    ds = "  b:\n    kind: files\n    path: s3://%s/train/\n    s3: {endpoint: \"%s\", retries: 0}\n" % (BUCKET, srv.endpoint)
    dm = support.Daemon(str(scratch), ds)
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": srv.key_id, "AWS_SECRET_ACCESS_KEY": _wrong(srv.secret)})
    assert rc != 0
    assert "dataset 'b'" in err and "s3://data/train/" in err and "403 SignatureDoesNotMatch" in err, err
    assert srv.secret[1:] not in err
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000", "AWS_SECRET_ACCESS_KEY": srv.secret})
    assert rc != 0 and "403 InvalidAccessKeyId" in err and srv.secret not in err, err
    # No keys anywhere: says where it looked.
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "HOME": str(scratch),
                              "AWS_SHARED_CREDENTIALS_FILE": ""})
    assert rc != 0 and "no S3 credentials" in err and os.path.join(str(scratch), ".aws/credentials") in err, err
    # The right keys from the environment.
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": srv.key_id, "AWS_SECRET_ACCESS_KEY": srv.secret})
    assert rc == 0, err


def test_store_unreachable_refuses_the_dataset(scratch):
    port = s3server.free_port()
    ds = ("  b:\n    kind: files\n    path: s3://%s/train/\n"
          "    s3: {endpoint: \"http://127.0.0.1:%d\", retries: 1, connect_timeout: 2}\n") % (BUCKET, port)
    dm = support.Daemon(str(scratch), ds)
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-of-the-test"})
    assert rc != 0
    assert "dataset 'b'" in err and "127.0.0.1:%d" % port in err and "after 2 attempts" in err, err
    assert "secret-of-the-test" not in err


def test_cache_serves_after_the_store_is_gone(s3_daemon):
    """Last in this module: it stops the store."""
    dm, srv, _ = s3_daemon
    expect = _expect()
    with loaderclient.Client(dm.socket, timeout=30) as c, loaderclient.Client(dm.socket, timeout=30) as ctl:
        with c.open("s3c", 10, seed=2, epochs=3) as s:
            it = iter(s)
            seen = {0: [], 1: [], 2: []}
            for _ in range(N // 10):
                b = next(it)
                seen[b.epoch] += _check(b, expect)
            assert sorted(seen[0]) == list(range(N))
            # The first pass built the node-local cache (the build reads the store with
            # its own parallel GETs); once it is ready the store may go away.
            deadline = time.monotonic() + 30
            info = ctl.request({"op": "cache_info", "dataset": "s3c"})
            while info["state"] != "ready" and time.monotonic() < deadline:
                time.sleep(0.05)
                info = ctl.request({"op": "cache_info", "dataset": "s3c"})
            assert info["file"]["count"] == N and info["file"]["source"] == "s3://data/train"
            srv.stop()
            for b in it:
                seen[b.epoch] += _check(b, expect)
            assert sorted(seen[1]) == sorted(seen[2]) == list(range(N))
            assert ctl.request({"op": "cache_info", "dataset": "s3c"})["hits"] > 0
        # Without a cache, a store that is gone fails the stream with a clear error.
        with pytest.raises(loaderclient.LoaderdError) as e:
            with c.open("s3", 8, epochs=1) as s:
                for _ in s:
                    pass
        assert srv.endpoint.split("//")[1] in str(e.value) and "attempts" in str(e.value), str(e.value)
