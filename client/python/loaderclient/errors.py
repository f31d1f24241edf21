"""Exceptions of the loaderd client, and the error table they are chosen from.

Every error that comes from the C library or the daemon carries ``.code`` (the negative
number of the C API's ``LC_E*`` codes, the same on the wire), ``.name`` (the wire name,
e.g. ``"no_such_dataset"``) and ``.message`` (the daemon's or the library's own sentence).

The table is not restated here: ``CODE_NAMES`` and ``MESSAGES`` are read from
libloaderclient (``lc_error_code``, ``lc_error_name``, ``lc_strerror``), which generates
them from the one list the daemon uses too (client/loaderclient_errors.h). Exception
classes are chosen by wire name.
"""
from typing import Dict, Optional, Type

from ._lib import lib


def _read_table():
    names, messages = {}, {}
    i = 0
    while True:
        code = lib.lc_error_code(i)
        if code == 0:
            return names, messages
        names[code] = lib.lc_error_name(code).decode()
        messages[code] = lib.lc_strerror(code).decode()
        i += 1


#: code -> wire name, for every code the daemon can send (from the library).
CODE_NAMES: Dict[int, str]
#: code -> the library's sentence for it.
MESSAGES: Dict[int, str]
CODE_NAMES, MESSAGES = _read_table()
#: wire name -> code.
NAME_CODES: Dict[str, int] = {v: k for k, v in CODE_NAMES.items()}

# The codes this package tests for, by wire name (a missing name fails at import).
EINVAL = NAME_CODES["invalid_argument"]
ENOENT = NAME_CODES["not_found"]
EPIPE = NAME_CODES["broken_pipe"]
ETIMEDOUT = NAME_CODES["timed_out"]
ECONNREFUSED = NAME_CODES["connection_refused"]
ECONNRESET = NAME_CODES["connection_reset"]
ENOTCONN = NAME_CODES["not_connected"]
ERANGE = NAME_CODES["out_of_range"]
EFIELD = NAME_CODES["bad_field"]
ENODATASET = NAME_CODES["no_such_dataset"]
EEND = NAME_CODES["end_of_stream"]
EBUDGET = NAME_CODES["over_budget"]
ESAMPLE = NAME_CODES["bad_sample"]
ECLOSED = NAME_CODES["closed"]
ENOMEM = NAME_CODES["out_of_memory"]
EPROTO = NAME_CODES["protocol_error"]
ESTALE = NAME_CODES["stale_generation"]
ELIMIT = NAME_CODES["limit_reached"]
EDEVICE = NAME_CODES["device_error"]


def error_name(code: int) -> str:
    """The wire name of a code ("unknown_error" when it is not in the table)."""
    return CODE_NAMES.get(code, "unknown_error")


class LoaderdError(Exception):
    """Base of every error of this package: ``code`` (negative int), ``name``, ``message``."""

    def __init__(self, code: Optional[int], message: str) -> None:
        self.code = code
        self.name = error_name(code) if code is not None else "error"
        self.message = message
        super().__init__("%s (%s): %s" % (self.name, code, message) if code is not None else message)


class ConnectError(LoaderdError, ConnectionError):
    """Could not connect to loaderd (no socket, nobody listening, refused hello)."""


class ConnectionLost(LoaderdError, ConnectionError):
    """The connection to loaderd broke (the daemon went away or the stream is unusable)."""


class Timeout(LoaderdError, TimeoutError):
    """loaderd did not answer in time. For next(): the request stays outstanding, so
    calling next() again picks its batch up."""


class DatasetNotFound(LoaderdError, LookupError):
    """The dataset is not configured in the daemon (``no_such_dataset``)."""


class InvalidArgument(LoaderdError, ValueError):
    """A request field or a combination of them was refused (``bad_field``, ``invalid_argument``)."""


class OutOfRange(InvalidArgument):
    """``out_of_range``: from ``open``, the batch is larger than this rank's share of the
    dataset with drop_last (no batch would be left): lower batch_size or world_size, or
    set drop_last=False."""


class OverBudget(LoaderdError):
    """``over_budget``: the stream's ring would exceed the daemon's server.memory_budget
    (the message says how much it needs): lower batch_size or prefetch, or raise the budget."""


class SampleError(LoaderdError):
    """A sample could not be read (``bad_sample``; the message names the file). The stream
    stays failed: every later next() raises it too."""


class EndOfStream(LoaderdError):
    """The stream delivered all its epochs. Iteration turns it into StopIteration."""


class DeviceError(LoaderdError):
    """A GPU cannot be used: no driver, no such device, a driver too old, no CUDA in this
    build or in torch, or a stream opened without a device. The message says which."""


class PermissionDenied(LoaderdError, PermissionError):
    """``permission_denied``: the daemon's ``access:`` rules do not let this user do that
    (the message names what, for whom, and who may). The connection stays usable."""


class ConfigError(LoaderdError, ValueError):
    """A dataset spec (Client.open(spec=...)) is wrong; the message names the key:
    "spec.transforms[1].size: ...", as the daemon's config file would get."""


class ReleasedError(LoaderdError):
    """A Batch (or a Stream / Client) was used after it was released or closed."""

    def __init__(self, message: str) -> None:
        super().__init__(ECLOSED, message)


# wire name -> class; every other code is a plain LoaderdError.
_BY_NAME: Dict[str, Type[LoaderdError]] = {
    "no_such_dataset": DatasetNotFound,
    "bad_field": InvalidArgument,
    "invalid_argument": InvalidArgument,
    "out_of_range": OutOfRange,
    "over_budget": OverBudget,
    "end_of_stream": EndOfStream,
    "bad_sample": SampleError,
    "permission_denied": PermissionDenied,
    "bad_config": ConfigError,
    "timed_out": Timeout,
    "connection_reset": ConnectionLost,
    "closed": ConnectionLost,
    "broken_pipe": ConnectionLost,
    "not_connected": ConnectionLost,
    "device_error": DeviceError,
}
_unknown = set(_BY_NAME) - set(NAME_CODES)
if _unknown:  # a renamed wire name must not silently turn an exception class off
    raise ImportError("loaderclient: the library's error table lacks %s" % sorted(_unknown))


def make_error(code: int, message: str) -> LoaderdError:
    """The exception for a code returned by the C library (or the daemon)."""
    return _BY_NAME.get(error_name(code), LoaderdError)(code, message)
