"""`files` datasets at an s3:// location, against a real S3-compatible server (moto,
installed into build/s3venv on first use; s3server.py) that checks every signature:
objects served byte for byte with their folder labels, exact cover per epoch, across
ranks and from a resumed batch; keys signed with a credentials file or the environment;
the packed cache built from the store serves the rest of a run after the store went
away; a missing object is a bad sample named by its key; bad credentials and a store
that cannot be reached refuse the dataset with S3's error code, and no secret is ever
in a message."""
import os
import subprocess
import time

import pytest

import support
import s3server
import loaderclient

N, SIZE, CLASSES = 90, 300, 3
BUCKET = "data"

pytestmark = pytest.mark.deadline(600)   # the first use may install the server (pip)


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
            "  missr:\n    kind: files\n    path: s3://%s/miss/\n    s3: %s\n") % (BUCKET, ep, BUCKET, ep, BUCKET, ep,
                                                                             BUCKET, ep)


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


def _run_check(dm, env):
    p = subprocess.run([dm.bin, "--config", dm.config, "--check"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **env))
    return p.returncode, p.stderr


def test_bad_credentials_name_the_bucket_and_the_code(store, scratch):
    srv, _ = store
    ds = "  b:\n    kind: files\n    path: s3://%s/train/\n    s3: {endpoint: \"%s\", retries: 0}\n" % (BUCKET, srv.endpoint)
    dm = support.Daemon(str(scratch), ds)
    rc, err = _run_check(dm, {"AWS_ACCESS_KEY_ID": srv.key_id, "AWS_SECRET_ACCESS_KEY": "x" + srv.secret[1:]})
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
