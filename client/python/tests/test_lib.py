"""The library search, the error table, and the ctypes structures against the C header."""
import ctypes
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


def test_one_version():
    """VERSION is the only statement of the version: the library (lc_version and
    lc_version_number), its soname and the Python package all report it."""
    with open(os.path.join(support.REPO, "VERSION")) as f:
        version = f.read().strip()
    major, minor, patch = (int(x) for x in version.split("."))
    assert loaderclient.library_version == version
    assert loaderclient.library_version_number == major * 10000 + minor * 100 + patch
    assert loaderclient.__version__ == version
    with open(os.path.join(support.REPO, "client", "python", "pyproject.toml")) as f:
        pyproject = f.read()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert re.search(r'^version = \{file = "VERSION"\}', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)
    assert os.path.realpath(os.path.join(support.REPO, "client", "python", "VERSION")) == \
        os.path.realpath(os.path.join(support.REPO, "VERSION"))
    lib_dir = os.path.dirname(os.path.realpath(loaderclient.library_path))
    soname = os.path.join(lib_dir, "libloaderclient.so.%d" % major)
    if os.path.exists(soname):  # in a build tree: the soname link points at the versioned file
        assert os.path.basename(os.path.realpath(soname)) == "libloaderclient.so." + version


def _header_table():
    path = os.path.join(support.REPO, "client", "loaderclient_errors.h")
    table = {}
    for name, value, wire in re.findall(r'X\((\w+),\s*(-?\w+),\s*"(\w+)"', open(path).read()):
        code = -getattr(errno, value[1:]) if value.startswith("-E") else int(value)
        table[code] = (name, wire)
    return table


def test_error_table_comes_from_the_library():
    """CODE_NAMES and MESSAGES are the library's table, which is the header's list."""
    table = _header_table()
    assert len(table) > 40
    assert {c: w for c, (_, w) in table.items()} == errors.CODE_NAMES
    for code, (name, wire) in table.items():
        assert loaderclient.error_name(code) == wire
        assert errors.MESSAGES[code] == _lib.lib.lc_strerror(code).decode()
        assert errors.MESSAGES[code] != "unknown error"
    assert errors.EFIELD == -4003 and errors.ENODATASET == -4004 and errors.ETIMEDOUT == -errno.ETIMEDOUT
    # errors.py states no code of its own: every number in it comes from the library.
    src = open(errors.__file__).read()
    assert not re.search(r"-\d{2,}", src), "errors.py restates a code"


def test_limits_come_from_the_library():
    text = open(os.path.join(support.REPO, "proto", "ld_wire.h")).read()
    defines = dict(re.findall(r"^#define (LD_\w+) (\d+)\b", text, re.M))
    mapped = re.findall(r'X\("(\w+)", (LD_\w+)\)', text)
    assert len(mapped) >= 8
    for name, macro in mapped:
        if macro in defines:
            assert loaderclient.LIMITS[name] == int(defines[macro]), name
    assert loaderclient.LIMITS["batch_size_max"] == 65536
    assert loaderclient.LIMITS["prefetch_max"] == 64
    assert loaderclient.LIMITS["epoch_max"] == 2 ** 53 - 1
    assert set(loaderclient.LIMITS) == {n for n, _ in mapped}
    assert _lib.lib.lc_limit(b"no_such_limit") == errors.EINVAL


def test_structs_match_the_library():
    """lc_stream_options_init writes the library's sizeof into struct_size: the ctypes
    struct must be the same size, or the library would read past it or ignore members."""
    o = _lib.LcStreamOptions()
    _lib.lib.lc_stream_options_init(ctypes.byref(o))
    assert o.struct_size == ctypes.sizeof(_lib.LcStreamOptions)
    assert (o.shuffle, o.world_size, o.batch_size) == (1, 1, 0)


def test_header_dtypes_match():
    text = open(os.path.join(support.REPO, "client", "loaderclient.h")).read()
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
