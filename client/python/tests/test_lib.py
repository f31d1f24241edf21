"""The library search, the error table, and the ctypes structures against the C header."""
import errno
import os
import re

import pytest

import support

import loaderclient
from loaderclient import _lib, errors


def test_library_not_found_message(scratch):
    missing = os.path.join(str(scratch), "nope", "libloaderclient.so")
    r = support.run_python("import loaderclient", env={"LOADERCLIENT_LIB": missing})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr
    assert missing in r.stderr and "no such file" in r.stderr
    assert "LOADERCLIENT_LIB" in r.stderr and "make" in r.stderr
    # An ImportError, so `except ImportError` works for optional use.
    r = support.run_python("try:\n import loaderclient\nexcept ImportError as e:\n print('caught', type(e).__name__)",
                           env={"LOADERCLIENT_LIB": missing})
    assert r.returncode == 0 and "caught LibraryNotFoundError" in r.stdout


def test_library_not_loadable(scratch):
    bad = scratch / "libloaderclient.so"
    bad.write_bytes(b"not an ELF file")
    r = support.run_python("import loaderclient", env={"LOADERCLIENT_LIB": str(bad)})
    assert r.returncode != 0 and str(bad) in r.stderr and "LOADERCLIENT_LIB" in r.stderr


def test_search_order(monkeypatch):
    monkeypatch.delenv("LOADERCLIENT_LIB", raising=False)
    c = _lib._candidates()
    pkg = os.path.dirname(os.path.abspath(_lib.__file__))
    assert c[0][1] == os.path.join(pkg, "libloaderclient.so")
    assert c[1][1] == os.path.join(support.REPO, "build", "lib", "libloaderclient.so")
    assert c[-1][1] == "libloaderclient.so"
    monkeypatch.setenv("LOADERCLIENT_LIB", "/x/libloaderclient.so")
    assert _lib._candidates() == [("$LOADERCLIENT_LIB", "/x/libloaderclient.so")]


def test_loaded_the_library_under_test():
    want = os.environ.get("LOADERCLIENT_LIB")
    if want:
        assert os.path.samefile(loaderclient.library_path, want)
    assert loaderclient.library_version == "0.1.0"


def test_error_table_matches_ld_error_h():
    path = os.path.join(support.REPO, "proto", "ld_error.h")
    text = open(path).read()
    table = {}
    for name, value, wire in re.findall(r'X\((\w+),\s*(-?\w+),\s*"(\w+)"', text):
        code = -getattr(errno, value[1:]) if value.startswith("-E") else int(value)
        table[code] = wire
    assert len(table) > 40
    assert table == errors.CODE_NAMES
    for code, wire in table.items():
        assert loaderclient.error_name(code) == wire


def test_header_codes_and_dtypes_match():
    text = open(os.path.join(support.REPO, "client", "loaderclient.h")).read()
    codes = {n: int(v) for n, v in re.findall(r"#define LC_(E\w+) \((-\d+)\)", text)}
    assert codes["EINVAL"] == errors.EINVAL and codes["EEND"] == errors.EEND
    assert codes["ENODATASET"] == errors.ENODATASET and codes["ESAMPLE"] == errors.ESAMPLE
    assert codes["ECLOSED"] == errors.ECLOSED and codes["ETIMEDOUT"] == errors.ETIMEDOUT
    assert codes["EFIELD"] == errors.EFIELD and codes["ECONNRESET"] == errors.ECONNRESET
    for c in codes.values():
        assert c in errors.CODE_NAMES
    from loaderclient.client import _DTYPES
    dtypes = {n.lower(): int(v) for n, v in re.findall(r"#define LC_DTYPE_(\w+) (\d+)", text)}
    assert {name: num for num, (_, name) in _DTYPES.items()} == dtypes
    assert int(re.search(r"#define LC_MAX_DIMS (\d+)", text).group(1)) == _lib.LC_MAX_DIMS


def test_exception_classes():
    e = errors.make_error(-4004, "no dataset named 'x'")
    assert isinstance(e, loaderclient.DatasetNotFound) and isinstance(e, LookupError)
    assert (e.code, e.name, e.message) == (-4004, "no_such_dataset", "no dataset named 'x'")
    assert "no_such_dataset" in str(e) and "no dataset named 'x'" in str(e)
    assert isinstance(errors.make_error(-4003, ""), loaderclient.InvalidArgument)
    assert isinstance(errors.make_error(-22, ""), ValueError)
    assert isinstance(errors.make_error(-104, ""), loaderclient.ConnectionLost)
    assert isinstance(errors.make_error(-4015, ""), ConnectionError)
    assert isinstance(errors.make_error(-110, ""), TimeoutError)
    assert isinstance(errors.make_error(-4010, ""), loaderclient.SampleError)
    assert isinstance(errors.make_error(-4008, ""), loaderclient.EndOfStream)
    e = errors.make_error(-34, "no batch is left")
    assert type(e) is loaderclient.OutOfRange and isinstance(e, loaderclient.InvalidArgument)
    assert e.name == "out_of_range"
    e = errors.make_error(-4009, "budget")
    assert type(e) is loaderclient.OverBudget and e.name == "over_budget"
    e = errors.make_error(-4012, "too many")
    assert type(e) is loaderclient.LoaderdError and e.name == "limit_reached"
    assert errors.make_error(-99999, "?").name == "unknown_error"


def test_gendata_formulas_match_ld_gendata(scratch):
    """The Python writer of the tests is the same data as ld-gendata's (when it is built)."""
    gendata = support.binaries()[1]
    if not os.path.exists(gendata):
        pytest.skip("ld-gendata not built next to loaderd")
    import subprocess
    import numpy as np
    subprocess.run([gendata, "files", str(scratch / "f"), "--count", "30", "--size", "100", "--classes", "3",
                    "--vary"], check=True, capture_output=True)
    subprocess.run([gendata, "tokens", str(scratch / "t.bin"), "--count", "5000", "--vocab", "1000"],
                   check=True, capture_output=True)
    for i in range(30):
        got = (scratch / "f" / ("class_%03d" % (i % 3)) / ("%07d.bin" % i)).read_bytes()
        assert got == support.file_bytes(i, 100, vary=True).tobytes()
    assert (np.fromfile(scratch / "t.bin", np.uint16) == support.tokens(0, 5000, 1000)).all()
