"""loaderclient — Python client of loaderd: zero-copy numpy/torch views of its batches.

    import loaderclient
    with loaderclient.Client() as c:
        with c.open("records", batch_size=64, epochs=1) as stream:
            for batch in stream:
                x = batch["data"]          # read-only numpy view of the shared-memory slot
                y = batch.torch("label")   # torch tensor, no copy

The PyTorch drop-in is loaderclient.torch.LoaderdDataLoader. A ctypes binding over
libloaderclient.so (found through $LOADERCLIENT_LIB, the package directory, the build tree
or the system path; see client/python/README.md). The per-batch steps run in C when the
optional extension loaderclient._speedups is built (``speedups_path`` names its file; else
``speedups_note`` says why the Python path runs); LOADERCLIENT_PURE=1 forces the Python path.
"""
from ._lib import (LIMITS, LibraryNotFoundError, library_path, library_version, library_version_number, speedups_note,
                   speedups_path)
from .errors import (CODE_NAMES, ConfigError, ConnectError, ConnectionLost, DatasetNotFound, DeviceError,
                     EndOfStream, InvalidArgument, LoaderdError, OutOfRange, OverBudget, PermissionDenied,
                     ReleasedError, SampleError, Timeout, error_name)
from .client import MAX_DEFERRED, Batch, Client, RaggedField, Stream, default_socket


def _package_version() -> str:
    # Installed: the version pip recorded (pyproject.toml reads the repository's VERSION
    # file). From a source checkout: the library's, which the Makefile took from the same file.
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(__name__)
        except PackageNotFoundError:
            pass
    except ImportError:  # Python < 3.8
        pass
    return library_version


__version__: str = _package_version()

__all__ = ["Client", "Stream", "Batch", "RaggedField", "LoaderdError", "ConfigError", "ConnectError",
           "ConnectionLost", "DatasetNotFound", "InvalidArgument", "OutOfRange", "OverBudget", "PermissionDenied",
           "EndOfStream", "SampleError", "Timeout", "ReleasedError", "DeviceError",
           "LibraryNotFoundError", "CODE_NAMES", "error_name", "default_socket", "library_path",
           "library_version", "library_version_number", "LIMITS", "MAX_DEFERRED", "speedups_path", "speedups_note"]
