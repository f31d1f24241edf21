"""Finding and binding libloaderclient (ctypes), plus the few libc calls the slot mappings need.

Everything that talks to loaderd goes through the C library: this module only declares
its functions' prototypes. The search order for the library is documented in
``find_library`` and in client/python/README.md.
"""
import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import os
import sys

from typing import Dict, List, Optional, Tuple

__all__ = ["lib", "libc", "LibraryNotFoundError", "library_path", "LcField", "LcStreamOptions", "LcRingInfo",
           "LcFieldLayout", "LcBatchInfo", "LIMITS", "library_version", "library_version_number", "speedups",
           "speedups_path", "speedups_note"]

ENV_VAR = "LOADERCLIENT_LIB"
PURE_ENV_VAR = "LOADERCLIENT_PURE"
_SONAME = "libloaderclient.so"
_HERE = os.path.dirname(os.path.abspath(__file__))


class LibraryNotFoundError(ImportError):
    """libloaderclient.so could not be found or loaded. The message lists every place tried."""


def _candidates() -> List[Tuple[str, str]]:
    """(description, path) in search order; path None means "ask the dynamic loader"."""
    env = os.environ.get(ENV_VAR)
    if env:
        # An explicit choice is never second-guessed: no fallback to another copy.
        return [("$%s" % ENV_VAR, env)]
    out = [("inside the package", os.path.join(_HERE, _SONAME)),
           ("the build tree", os.path.normpath(os.path.join(_HERE, "..", "..", "..", "build", "lib", _SONAME)))]
    found = ctypes.util.find_library("loaderclient")
    if found:
        out.append(("the system library path (ctypes.util.find_library)", found))
    out.append(("the system library path (dlopen %s)" % _SONAME, _SONAME))
    return out


def find_library() -> Tuple[ctypes.CDLL, str]:
    """Loads the library: $LOADERCLIENT_LIB (a file path; when set, only it is tried), else a
    copy inside this package (``pip install`` puts one there), else the build tree
    (<repo>/build/lib/libloaderclient.so relative to this file, for a source checkout), else
    the system path (``make install`` and ldconfig). Returns (CDLL, path)."""
    tried = []
    for what, path in _candidates():
        is_file_path = os.sep in path
        if is_file_path and not os.path.exists(path):
            tried.append("  %s: %s (no such file)" % (what, path))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("  %s: %s (%s)" % (what, path, e))
    raise LibraryNotFoundError(
        "loaderclient: cannot load %s. Looked in:\n%s\n"
        "Fix: build it with `make` at the repository root (it lands in build/lib/), or set "
        "%s to the full path of libloaderclient.so (e.g. %s=$PWD/build/lib/%s)."
        % (_SONAME, "\n".join(tried), ENV_VAR, ENV_VAR, _SONAME))


LC_MAX_DIMS = 5


class LcField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * LC_MAX_DIMS),
                ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t),
                ("offsets", ctypes.c_void_p)]


# The layout structs of loaderclient.h. The library writes as many bytes as these have
# (the _sized calls are passed ctypes.sizeof), so a newer library with more members at
# the end works unchanged.
class LcRingInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64),
                ("slot_count", ctypes.c_uint32),
                ("slot_size", ctypes.c_uint64),
                ("slot_header_size", ctypes.c_uint64),
                ("field_count", ctypes.c_int)]


class LcFieldLayout(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("dtype", ctypes.c_int),
                ("ragged", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * LC_MAX_DIMS),
                ("offset", ctypes.c_uint64),
                ("row_bytes", ctypes.c_uint64),
                ("offsets_offset", ctypes.c_uint64),
                ("capacity", ctypes.c_uint64)]


class LcBatchInfo(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int),
                ("rows", ctypes.c_uint32),
                ("generation", ctypes.c_uint64),
                ("epoch", ctypes.c_uint64),
                ("index", ctypes.c_uint64),
                ("slot_offset", ctypes.c_uint64),
                ("reopens", ctypes.c_uint64)]


class LcStreamOptions(ctypes.Structure):
    # struct_size first: lc_stream_options_init sets it to the library's size, and the
    # library reads only as many bytes as this struct has (see loaderclient.h).
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("batch_size", ctypes.c_uint32),
                ("shuffle", ctypes.c_int),
                ("seed", ctypes.c_uint64),
                ("epoch", ctypes.c_uint64),
                ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32),
                ("drop_last", ctypes.c_int),
                ("start_batch", ctypes.c_uint64),
                ("prefetch", ctypes.c_uint32),
                ("epochs", ctypes.c_uint64),
                ("device", ctypes.c_char_p),
                ("transfer", ctypes.c_int),
                ("device_normalize", ctypes.c_char_p),
                ("spec", ctypes.c_char_p),
                ("share", ctypes.c_char_p),
                ("share_join", ctypes.c_int),
                ("handoff", ctypes.c_int)]


class LcDeviceField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * LC_MAX_DIMS),
                ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t),
                ("device", ctypes.c_int),
                ("offsets", ctypes.c_void_p)]


def _bind(l):
    P = ctypes.c_void_p
    i, u32, u64, sz = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t
    protos = {
        "lc_version": (ctypes.c_char_p, []),
        "lc_version_number": (i, []),
        "lc_strerror": (ctypes.c_char_p, [i]),
        "lc_error_name": (ctypes.c_char_p, [i]),
        "lc_error_code": (i, [i]),
        "lc_limit": (ctypes.c_int64, [ctypes.c_char_p]),
        "lc_limit_name": (ctypes.c_char_p, [i]),
        "lc_default_socket": (ctypes.c_char_p, []),
        "lc_socket_resolve": (i, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, sz, ctypes.c_char_p, sz]),
        "lc_socket_from_config": (i, [ctypes.c_char_p, ctypes.c_char_p, sz, ctypes.c_char_p, sz]),
        "lc_connect": (i, [ctypes.c_char_p, i, ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_char_p, sz]),
        "lc_client_close": (None, [P]),
        "lc_client_error": (ctypes.c_char_p, [P]),
        "lc_client_set_reconnect": (i, [P, i]),
        "lc_client_reconnecting": (i, [P]),
        "lc_client_reconnects": (u64, [P]),
        "lc_stream_reopens": (u64, [P]),
        "lc_request_json": (i, [P, ctypes.c_char_p, ctypes.POINTER(P)]),
        "lc_free": (None, [P]),
        "lc_stream_options_init": (None, [ctypes.POINTER(LcStreamOptions)]),
        "lc_stream_device": (i, [P]),
        "lc_batch_device_field_by_name_sized": (i, [P, ctypes.c_char_p, ctypes.POINTER(LcDeviceField), sz]),
        "lc_batch_device_wait": (i, [P, P]),
        "lc_stream_open": (i, [P, ctypes.c_char_p, ctypes.POINTER(LcStreamOptions), ctypes.POINTER(P)]),
        "lc_stream_batches_per_epoch": (u64, [P]),
        "lc_stream_samples_per_epoch": (u64, [P]),
        "lc_stream_id": (u64, [P]),
        "lc_stream_ring": (P, [P, ctypes.POINTER(sz)]),
        "lc_stream_ring_info_sized": (i, [P, ctypes.POINTER(LcRingInfo), sz]),
        "lc_stream_field_layout_sized": (i, [P, i, ctypes.POINTER(LcFieldLayout), sz]),
        "lc_stream_slot_offset": (ctypes.c_int64, [P, i]),
        "lc_stream_ring_fd": (i, [P]),
        "lc_stream_next": (i, [P, i, ctypes.POINTER(P)]),
        "lc_stream_next_info_sized": (i, [P, i, ctypes.POINTER(P), ctypes.POINTER(LcBatchInfo), sz]),
        "lc_stream_close": (i, [P]),
        "lc_batch_rows": (u32, [P]),
        "lc_batch_epoch": (u64, [P]),
        "lc_batch_index": (u64, [P]),
        "lc_batch_slot": (i, [P]),
        "lc_batch_generation": (u64, [P]),
        "lc_batch_describe_sized": (i, [P, ctypes.POINTER(LcBatchInfo), sz]),
        "lc_batch_field_count": (i, [P]),
        "lc_batch_field_sized": (i, [P, i, ctypes.POINTER(LcField), sz]),
        "lc_batch_field_by_name_sized": (i, [P, ctypes.c_char_p, ctypes.POINTER(LcField), sz]),
        "lc_batch_valid": (i, [P]),
        "lc_batch_release": (i, [P]),
    }
    for name, (res, args) in protos.items():
        f = getattr(l, name)
        f.restype = res
        f.argtypes = args


def _bind_libc():
    c = ctypes.CDLL(None, use_errno=True)
    P, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    c.mmap.restype = P
    c.mmap.argtypes = [P, sz, i, i, i, ctypes.c_long]
    c.munmap.restype = i
    c.munmap.argtypes = [P, sz]
    c.mremap.restype = P
    c.mremap.argtypes = [P, sz, sz, i, P]   # variadic in glibc; the 5th is the new address
    c.mprotect.restype = i
    c.mprotect.argtypes = [P, sz, i]
    c.madvise.restype = i
    c.madvise.argtypes = [P, sz, i]
    return c


def _read_limits(l) -> Dict[str, int]:
    out = {}
    i = 0
    while True:
        name = l.lc_limit_name(i)
        if name is None:
            return out
        out[name.decode()] = int(l.lc_limit(name))
        i += 1


lib, library_path = find_library()
_bind(lib)
libc = _bind_libc()
#: The protocol's limits by name ("batch_size_max", "prefetch_max", ...), from the library.
LIMITS: Dict[str, int] = _read_limits(lib)
library_version: str = lib.lc_version().decode()
library_version_number: int = lib.lc_version_number()


# The optional extension module (_speedups.c) that does the per-batch steps in C.
SPEEDUPS_API_VERSION = 3
_SPEEDUPS = "loaderclient._speedups"


def _load_speedups():
    """(module or None, its file or None, why the Python path is used or None). Looked for
    inside the package (``pip install`` builds it there), else next to the library in use
    (``make`` builds it into build/lib/ beside libloaderclient.so). Not used with
    $LOADERCLIENT_PURE=1, nor when it was built from another version of _speedups.c."""
    if os.environ.get(PURE_ENV_VAR, "") not in ("", "0"):
        return None, None, "$%s=%s" % (PURE_ENV_VAR, os.environ[PURE_ENV_VAR])
    places = [_HERE]
    lib_dir = os.path.dirname(os.path.abspath(library_path)) if os.sep in library_path else None
    if lib_dir and lib_dir != _HERE:
        places.append(lib_dir)
    tried = []
    for d in places:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(d, "_speedups" + suffix)
            if not os.path.exists(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location(_SPEEDUPS, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            except ImportError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            if getattr(mod, "API_VERSION", None) != SPEEDUPS_API_VERSION:
                tried.append("%s (API version %r, this package needs %d: rebuild it)"
                             % (path, getattr(mod, "API_VERSION", None), SPEEDUPS_API_VERSION))
                continue
            sys.modules[_SPEEDUPS] = mod
            return mod, path, None
    if tried:
        return None, None, "not usable: " + "; ".join(tried)
    return None, None, "not built (looked in %s)" % ", ".join(places)


#: The extension module in use (loaderclient._speedups), or None: the pure-Python path.
#: speedups_path: its file; speedups_note: why the Python path is used (None when not).
speedups, speedups_path, speedups_note = _load_speedups()


def library_functions():
    """The addresses of lc_stream_next_info_sized and lc_batch_release in the library this
    binding loaded: what the extension calls directly (set_library), without ctypes."""
    return (ctypes.cast(lib.lc_stream_next_info_sized, ctypes.c_void_p).value,
            ctypes.cast(lib.lc_batch_release, ctypes.c_void_p).value)


if speedups is not None:
    try:
        speedups.set_library(*library_functions())
    except Exception as e:   # the Python path then, as for a module that fails to import
        sys.modules.pop(_SPEEDUPS, None)
        speedups, speedups_path, speedups_note = None, None, "not usable: set_library failed (%s)" % e
