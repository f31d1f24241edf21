"""Exceptions of the loaderd client, and the error table they are built from.

Every error that comes from the C library or the daemon carries ``.code`` (the negative
number of proto/ld_error.h, the same in the C API and on the wire), ``.name`` (the wire
name, e.g. ``"no_such_dataset"``) and ``.message`` (the daemon's or the library's own
sentence). ``CODE_NAMES`` must list exactly the table of proto/ld_error.h; a test reads
that header to keep them in sync.
"""

# code -> wire name: proto/ld_error.h's LD_ERROR_MAP, in the same order.
CODE_NAMES = {
    -1: "not_permitted",
    -2: "not_found",
    -5: "io_error",
    -9: "bad_descriptor",
    -11: "try_again",
    -12: "out_of_memory",
    -13: "access_denied",
    -16: "busy",
    -17: "exists",
    -20: "not_a_directory",
    -21: "is_a_directory",
    -22: "invalid_argument",
    -24: "too_many_files",
    -27: "too_big",
    -28: "no_space",
    -32: "broken_pipe",
    -34: "out_of_range",
    -36: "name_too_long",
    -38: "not_implemented",
    -74: "bad_message",
    -71: "protocol_error",
    -90: "frame_too_large",
    -95: "not_supported",
    -98: "address_in_use",
    -104: "connection_reset",
    -107: "not_connected",
    -110: "timed_out",
    -111: "connection_refused",
    -4001: "version_mismatch",
    -4002: "unknown_op",
    -4003: "bad_field",
    -4004: "no_such_dataset",
    -4005: "no_such_stream",
    -4006: "not_leased",
    -4007: "stale_generation",
    -4008: "end_of_stream",
    -4009: "over_budget",
    -4010: "bad_sample",
    -4011: "bad_config",
    -4012: "limit_reached",
    -4013: "shm_error",
    -4014: "hello_required",
    -4015: "closed",
    -4016: "bad_dataset",
    -4017: "cache_corrupt",
    -4018: "cache_stale",
    -4019: "cache_version",
    -125: "canceled",
}
NAME_CODES = {v: k for k, v in CODE_NAMES.items()}

# The codes the classes below are chosen by (also in loaderclient.h as LC_E*).
EINVAL, ENOENT, EPIPE, ETIMEDOUT, ECONNREFUSED, ECONNRESET, ENOTCONN = -22, -2, -32, -110, -111, -104, -107
EFIELD, ENODATASET, EEND, ESAMPLE, ECLOSED = -4003, -4004, -4008, -4010, -4015
ERANGE, EBUDGET = -34, -4009


def error_name(code):
    """The wire name of a code ("unknown_error" when it is not in the table)."""
    return CODE_NAMES.get(code, "unknown_error")


class LoaderdError(Exception):
    """Base of every error of this package: ``code`` (negative int), ``name``, ``message``."""

    def __init__(self, code, message):
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


class ReleasedError(LoaderdError):
    """A Batch (or a Stream / Client) was used after it was released or closed."""

    def __init__(self, message):
        super().__init__(ECLOSED, message)


_BY_CODE = {
    ENODATASET: DatasetNotFound,
    EFIELD: InvalidArgument,
    EINVAL: InvalidArgument,
    ERANGE: OutOfRange,
    EBUDGET: OverBudget,
    EEND: EndOfStream,
    ESAMPLE: SampleError,
    ETIMEDOUT: Timeout,
    ECONNRESET: ConnectionLost,
    ECLOSED: ConnectionLost,
    EPIPE: ConnectionLost,
    ENOTCONN: ConnectionLost,
}


def make_error(code, message):
    """The exception for a code returned by the C library (or the daemon)."""
    return _BY_CODE.get(code, LoaderdError)(code, message)
