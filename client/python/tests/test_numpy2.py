"""The package under numpy 2, the numpy most trainers have (Debian 12's is 1.24, which
every other test here uses): `pip install` of the package's sources with the python of a
virtual environment that has numpy 2 from PyPI (np2env.py; into a folder of the test's)
builds the extension against numpy 2's headers, and a reader there gets the same values
as this interpreter with numpy 1.24, through the Batch
views (fixed-size and ragged fields), through the extension's per-batch arrays (the path
LoaderdDataLoader takes: shared fields and copied ones), and with the extension turned
off (LOADERCLIENT_PURE=1).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

import np2env
import support

# The first run may download numpy 2 (np2env's own timeouts bound it) and builds the
# package: more than the default deadline.
pytestmark = pytest.mark.deadline(900)

# Reads one epoch of each dataset, unshuffled, and prints a digest of every value with
# its shape (as int64, so that a field copied as int64 compares with its view).
READER = r"""
import hashlib, json, sys
import numpy as np
import loaderclient
from loaderclient._batch import TorchPlan
from loaderclient._slots import _TORCH_DTYPES

def feed(h, v):
    if isinstance(v, loaderclient.RaggedField):
        feed(h, v.offsets)
        feed(h, v.data)
        return
    h.update(repr(v.shape).encode())
    h.update(np.ascontiguousarray(v, dtype=np.int64).tobytes())

out = {"numpy": np.__version__, "speedups": loaderclient.speedups_path, "note": loaderclient.speedups_note,
       "views": {}, "arrays": {}}
with loaderclient.Client(sys.argv[1], timeout=10) as c:
    for name, bs in (("rec", 64), ("var", 50), ("tok", 32)):
        h = hashlib.sha256()
        with c.open(name, batch_size=bs, epochs=1, shuffle=False) as s:
            rows = 0
            for b in s:
                for f in b.fields:
                    feed(h, b[f])
                rows += b.rows
        out["views"][name] = [rows, h.hexdigest()]
    for name, bs in (("rec", 64), ("tok", 32)):
        h = hashlib.sha256()
        with c.open(name, batch_size=bs, epochs=1, shuffle=False) as s:
            b = s.next()
            ring = b._state.ring
            # As LoaderdDataLoader plans it: labels and dtypes torch lacks copied (the
            # latter as int64: tok's uint16), the rest shared.
            plan = TorchPlan([(f, f.shape == () or f.dtype not in _TORCH_DTYPES) for f in ring.layout], ring)
            if plan.spec is None:       # no extension: nothing of its own to check
                break
            for f in b.fields:
                feed(h, b[f])
            b.release()
            rows, made = b.rows, 0
            for _ in range(s.batches_per_epoch - 1):
                got = s._next(10000, plan, None)
                assert isinstance(got, tuple), got   # the extension's path, not a Batch
                arrays, epoch, index = got
                for a in arrays:
                    assert isinstance(a, np.ndarray), type(a)
                    feed(h, a)
                rows += len(arrays[0])
                made += 1
        out["arrays"][name] = [rows, h.hexdigest(), made]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def np2():
    py, why = np2env.ensure_installed()
    if not py:
        pytest.skip("no numpy 2 here: " + why)
    return py


def _read(py, socket, env, cwd=None):
    r = subprocess.run([py, "-c", READER, socket], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_same_values_under_numpy2(np2, daemon):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHONPATH")}
    # The library under test goes into the package.
    env["LOADERCLIENT_LIB"] = os.path.abspath(os.environ.get("LOADERCLIENT_LIB") or
                                              os.path.join(support.REPO, "build", "lib", "libloaderclient.so"))
    here = support.short_tmpdir("lc-np2.")   # not the checkout: the installed package is read
    try:
        # Built from a copy of the package's sources (pip builds in the source tree, where
        # test_install's pip may be building at the same time), into a folder of this
        # test's (the shared environment stays as np2env made it).
        src, site = os.path.join(here, "src"), os.path.join(here, "site")
        shutil.copytree(os.path.join(support.REPO, "client", "python"), src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "tests", "__pycache__", "*.so"))
        r = subprocess.run([np2, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index", "--no-deps",
                            "--target", site, src], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        env.pop("LOADERCLIENT_LIB", None)
        env["PYTHONPATH"] = site
        ours = _read(sys.executable, daemon.socket, support._python_env(None))
        theirs = _read(np2, daemon.socket, env, here)
        pure = _read(np2, daemon.socket, dict(env, LOADERCLIENT_PURE="1"), here)
    finally:
        support.rmtree(here)
    assert int(theirs["numpy"].split(".")[0]) >= 2, theirs["numpy"]
    if int(ours["numpy"].split(".")[0]) >= 2:
        pytest.skip("this interpreter has numpy %s already: no numpy 1 to compare with" % ours["numpy"])
    # The extension was built there, against numpy 2, and used; and turned off for `pure`.
    assert theirs["speedups"] and theirs["speedups"].startswith(os.path.join(here, "site")), theirs
    assert pure["speedups"] is None and "LOADERCLIENT_PURE" in pure["note"], pure
    assert ours["views"]["rec"][0] == 1000 and ours["views"]["var"][0] == 300, ours
    assert theirs["views"] == ours["views"] == pure["views"]
    assert sorted(theirs["arrays"]) == ["rec", "tok"] and pure["arrays"] == {}
    for name, (rows, digest, made) in theirs["arrays"].items():
        assert [rows, digest] == ours["views"][name], name   # the extension's arrays hold the views' values
        assert made > 0
