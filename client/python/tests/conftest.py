"""Fixtures: small datasets with known bytes, one loaderd for the session (stopped with
SIGTERM at the end: it must exit 0 and leave nothing in /dev/shm), and a client per test.

Environment (set by scripts/run-tests.sh): LOADERCLIENT_LIB, the library under test;
LOADERD_BIN, the daemon (both default to the build tree, build/...).
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the package, in place
sys.path.insert(0, HERE)

import support  # noqa: E402

pytest_plugins = ["deadline"]   # a time limit per test: a deadlock fails instead of hanging

REC = dict(n=1000, size=256, classes=10)
VAR = dict(n=300, size=200, classes=5)
TOK = dict(n=20000, context=31)

DATASETS = """\
  rec:
    kind: files
    path: rec
    pattern: "*.bin"
  var:
    kind: files
    path: var
  tok:
    kind: token_windows
    path: tok.bin
    dtype: uint16
    context: %d
""" % TOK["context"]


@pytest.fixture(scope="session")
def data_dir():
    d = support.short_tmpdir()
    support.gen_files(os.path.join(d, "rec"), REC["n"], REC["size"], REC["classes"])
    support.gen_files(os.path.join(d, "var"), VAR["n"], VAR["size"], VAR["classes"], vary=True)
    support.gen_tokens(os.path.join(d, "tok.bin"), TOK["n"])
    yield d
    support.rmtree(d)


@pytest.fixture(scope="session")
def daemon(data_dir):
    dm = support.Daemon(data_dir, DATASETS)
    dm.start()
    yield dm
    dm.stop_clean()


@pytest.fixture
def client(daemon):
    import loaderclient
    c = loaderclient.Client(daemon.socket, timeout=10)
    yield c
    c.close()


@pytest.fixture
def scratch():
    """A temporary directory removed after the test (pytest's tmp_path would be kept)."""
    import pathlib
    d = support.short_tmpdir("lc-scratch.")
    yield pathlib.Path(d)
    support.rmtree(d)


@pytest.fixture(scope="session")
def rec_index():
    """first 8 bytes of a file -> its index, for the rec dataset."""
    return {support.file_word0(i): i for i in range(REC["n"])}


@pytest.fixture
def spare_daemon(data_dir):
    """A daemon of its own, for tests that kill or stop it."""
    d = support.short_tmpdir("lc-spare.")
    os.symlink(os.path.join(data_dir, "rec"), os.path.join(d, "rec"))
    dm = support.Daemon(d, "  rec:\n    kind: files\n    path: rec\n")
    dm.start()
    yield dm
    dm.kill()
    support.rmtree(d)
