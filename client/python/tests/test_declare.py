"""Datasets declared from Python: Client.open(spec=...), a configured dataset refined with
template= and transforms=, LoaderdDataLoader built from root=, kind=, transforms= (a train
and a validation split in one script), a declared cache built and read again by the next
open of the same spec, and the errors a trainer gets (README, "Pipelines declared by the
trainer")."""
import glob
import os

import numpy as np
import pytest

import support

N = 48
SIZE = 64


def _write_images(d, classes=2, per_class=6):
    from PIL import Image
    for c in range(classes):
        os.makedirs(os.path.join(d, "c%d" % c))
        for i in range(per_class):
            rng = np.random.default_rng(c * 100 + i)
            px = rng.integers(0, 256, size=(20 + i, 24, 3), dtype=np.uint8)
            Image.fromarray(px).save(os.path.join(d, "c%d" % c, "%02d.png" % i))


@pytest.fixture(scope="module")
def declare_daemon():
    d = support.short_tmpdir("lc-decl.")
    data = os.path.join(d, "data")
    os.makedirs(data)
    support.gen_files(os.path.join(data, "train"), N, SIZE, classes=0)
    images = False
    try:
        _write_images(os.path.join(data, "img"))
        images = True
    except ImportError:
        pass
    datasets = "  rec:\n    kind: files\n    path: data/train\n"
    if images:
        datasets += ("  imgs:\n    kind: image_folder\n    path: data/img\n    transforms:\n"
                     "      - decode: {}\n      - resize: {height: 16, width: 16}\n")
    datasets += ("access:\n  declare: {roots: [%s], caches: true, cache_dir: %s, cache_quota: 1MiB}\n"
                 % (data, os.path.join(d, "dcache")))
    dm = support.Daemon(d, datasets)
    dm.start()
    dm.images = images
    yield dm
    dm.stop_clean()
    support.rmtree(d)


@pytest.fixture
def dclient(declare_daemon):
    import loaderclient
    c = loaderclient.Client(declare_daemon.socket, timeout=10)
    yield c
    c.close()


def _needs_images(dm):
    if not dm.images:
        pytest.skip("PIL is not installed: no images to declare")


def test_open_spec_reads_every_file(dclient, declare_daemon):
    path = os.path.join(declare_daemon.dir, "data", "train")
    with dclient.open(spec={"kind": "files", "path": path, "pattern": "*.bin"}, batch_size=8, shuffle=False,
                      epochs=1) as s:
        rows = [bytes(row) for b in s for row in b["data"]]
    assert rows == [bytes(support.file_bytes(i, SIZE)) for i in range(N)]
    # Relative to the first allowed root, shuffled: the same files, each once.
    with dclient.open(spec={"kind": "files", "path": "train"}, batch_size=8, seed=3, epochs=1) as s:
        rows = sorted(bytes(row) for b in s for row in b["data"])
    assert rows == sorted(bytes(support.file_bytes(i, SIZE)) for i in range(N))


def test_errors_name_what_was_wrong(dclient, declare_daemon):
    import loaderclient
    with pytest.raises(loaderclient.PermissionDenied, match="spec.path '/etc' is outside the roots"):
        dclient.open(spec={"kind": "files", "path": "/etc"}, batch_size=4)
    with pytest.raises(loaderclient.PermissionDenied, match="has a '..' component"):
        dclient.open(spec={"kind": "files", "path": "train/../../"}, batch_size=4)
    with pytest.raises(loaderclient.ConfigError, match="unknown key 'patern' in 'spec'"):
        dclient.open(spec={"kind": "files", "path": "train", "patern": "*"}, batch_size=4)
    with pytest.raises(loaderclient.PermissionDenied, match="the source of template 'rec'"):
        dclient.open(template="rec", spec={"path": "/etc"}, batch_size=4)
    with pytest.raises(loaderclient.InvalidArgument, match="batch_size is required"):
        dclient.open(spec={"kind": "files", "path": "train"})
    # The client goes on.
    with dclient.open("rec", batch_size=8, epochs=1) as s:
        assert sum(b.rows for b in s) == N


def test_template_with_own_transforms(dclient, declare_daemon):
    _needs_images(declare_daemon)
    from loaderclient.transforms import CenterCrop, Resize
    with dclient.open("imgs", batch_size=4, epochs=1) as s:
        assert s.fields[0]["shape"] == [3, 16, 16]
    with dclient.open(template="imgs", transforms=[Resize(12), CenterCrop(8)], batch_size=4, shuffle=False,
                      epochs=1) as s:
        shapes, labels = [], []
        for b in s:
            shapes.append(b["image"].shape)
            labels += [int(v) for v in b["label"]]
        assert shapes == [(4, 3, 8, 8)] * 3
        assert labels == [0] * 6 + [1] * 6


def test_loader_train_and_val_splits(declare_daemon):
    _needs_images(declare_daemon)
    torch = pytest.importorskip("torch")
    from loaderclient.torch import LoaderdDataLoader
    from loaderclient.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize
    root = os.path.join(declare_daemon.dir, "data", "img")
    train = LoaderdDataLoader(root=root, kind="images", batch_size=4, socket=declare_daemon.socket, seed=1,
                              transforms=[RandomResizedCrop(8), RandomHorizontalFlip(),
                                          Normalize([0.5] * 3, [0.25] * 3)])
    val = LoaderdDataLoader(root=root, kind="images", batch_size=4, shuffle=False, socket=declare_daemon.socket,
                            transforms=[Resize(10), CenterCrop(8)])
    try:
        assert len(train) == 3 and len(val) == 3
        for epoch in range(2):
            seen = 0
            for x, y in train:
                assert x.shape == (4, 3, 8, 8) and x.dtype == torch.float32
                seen += x.shape[0]
            assert seen == 12
        labels = [int(v) for _, y in val for v in y]
        assert labels == [0] * 6 + [1] * 6
    finally:
        train.close()
        val.close()


def test_transform_specs():
    from loaderclient.transforms import Decode, RandomResizedCrop, Resize, to_specs
    assert RandomResizedCrop(224).spec() == {"random_resized_crop": {"size": 224}}
    assert Resize((10, 12)).spec() == {"resize": {"height": 10, "width": 12}}
    assert to_specs([Resize(8)]) == [{"decode": {}}, {"resize": {"size": 8}}]
    assert to_specs([Decode(fast=True), {"center_crop": {"size": 4}}])[0] == {"decode": {"fast": True}}
    with pytest.raises(TypeError):
        to_specs(["resize"])


def _declared_cache(socket):
    import loaderclient
    with loaderclient.Client(socket, timeout=10) as c:
        found = [x for x in c.status()["caches"] if x.get("declared")]
    return found[0] if found else None


def test_declared_cache_built_then_reused(dclient, declare_daemon):
    want = [bytes(support.file_bytes(i, SIZE)) for i in range(N)]

    def read_until_hits(spec):
        # Epoch after epoch, each exactly the files, until the cache serves them.
        with dclient.open(spec=spec, batch_size=8, shuffle=False, epochs=200) as s:
            rows = []
            for b in s:
                rows += [bytes(row) for row in b["data"]]
                if len(rows) == N:
                    assert rows == want
                    rows = []
                    cache = _declared_cache(declare_daemon.socket)
                    if cache["hits"] > 0:
                        return cache
        raise AssertionError("200 epochs and the declared cache served nothing")

    first = read_until_hits({"kind": "files", "path": "train", "cache": {}})
    assert first["state"] == "ready"
    files = glob.glob(os.path.join(declare_daemon.dir, "dcache", str(os.getuid()), "train-*.ldcache"))
    assert len(files) == 1 and first["path"] == files[0]
    ino = os.stat(files[0]).st_ino
    # Another open of the same spec (other transforms or on_error would not matter) reads it.
    again = read_until_hits({"kind": "files", "path": "train", "on_error": "replace", "cache": {"mode": "auto"}})
    assert again["path"] == files[0] and os.stat(files[0]).st_ino == ino  # not built again: a build renames a new file
    import loaderclient
    with pytest.raises(loaderclient.PermissionDenied, match="spec.cache.path: the daemon places"):
        dclient.open(spec={"kind": "files", "path": "train", "cache": {"path": "mine.ldcache"}}, batch_size=4)
