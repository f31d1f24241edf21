"""Checks that the client tests share: where a view's bytes live (zero copy), a batch's
rows against the files they came from, and the daemon's count of a stream's leased slots."""
import ctypes
import mmap
import os
import time

import numpy as np

import support
from conftest import REC

from loaderclient import _lib


def mapping_of(addr):
    """The /proc/self/maps entry holding addr."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return {"start": lo, "end": hi, "perms": parts[1], "offset": int(parts[2], 16),
                        "file": (parts[3], int(parts[4])), "path": parts[5].strip() if len(parts) > 5 else ""}
    return None


def shm_position(addr):
    """(file identity, offset in the file) of the shared memory behind addr."""
    m = mapping_of(addr)
    assert m is not None, "address 0x%x is not mapped" % addr
    return m["file"], addr - m["start"] + m["offset"], m


def library_pointer(batch, name):
    f = _lib.LcField()
    assert _lib.lib.lc_batch_field_by_name_sized(batch._state.bptr, name.encode(), ctypes.byref(f),
                                                 ctypes.sizeof(f)) == 0
    return f.data


def page_flags(addr):
    """(present, file page) of the page holding addr, from /proc/self/pagemap."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // mmap.PAGESIZE * 8)
        e = int.from_bytes(f.read(8), "little")
    return bool(e >> 63 & 1), bool(e >> 61 & 1)


def assert_zero_copy(batch, name, addr):
    """addr (an array's data) is the very shared memory the C library sees for the field:
    the same object at the same offset, mapped copy-on-write, and the page not copied."""
    lib_ptr = library_pointer(batch, name)
    base, size = batch._stream.ring
    assert base <= lib_ptr < base + size
    ours, lib_side = shm_position(addr), shm_position(lib_ptr)
    assert ours[0] == lib_side[0], "not the same shared-memory object"
    assert ours[1] == lib_side[1], "not the same offset in it"
    assert "loaderd." in ours[2]["path"] and ours[2]["perms"] == "rw-p"
    assert lib_side[2]["perms"] == "r--s"
    ctypes.c_uint8.from_address(addr).value           # fault the page in (a read)
    assert page_flags(addr) == (True, True), "the page is a private copy, not the shared memory"


def file_of(row, index):
    return index[int(np.frombuffer(row[:8].tobytes(), "<u8")[0])]


def check_rec_batch(b, index):
    x, y = b["data"], b["label"]
    assert x.shape == (b.rows, REC["size"]) and x.dtype == np.uint8
    assert y.shape == (b.rows,) and y.dtype == np.int64
    got = []
    for r in range(b.rows):
        i = file_of(x[r], index)
        assert (x[r] == support.file_bytes(i, REC["size"])).all()
        assert y[r] == i % REC["classes"]
        got.append(i)
    return got


# The C library's read-ahead (CLIENT_READ_AHEAD in client/client_internal.h): while the
# trainer holds at most one batch of a stream, the library keeps this many `next` requests
# in flight, whose answers lease slots before the trainer asks for them. Holding more, it
# asks no more ahead.
READ_AHEAD = 2
# Slots of a stream's ring beyond `prefetch` (SLOTS_BEYOND_PREFETCH in daemon/stream.c):
# the batch the trainer holds and the read-ahead's (or a deferred batch's) slots.
SLOTS_BEYOND_PREFETCH = 3
DEFAULT_PREFETCH = 4   # server.prefetch as the tests' daemon sets it (the daemon's own default is auto)


def stream_entry(client, stream, timeout=5.0):
    """The stream's entry of the `streams` reply, once the daemon is settled: no fill in
    progress. The daemon builds the reply when it reads the request but sends it after the
    replies owed before it (request order), so a read-ahead `next` still waiting for its
    batch would not be counted yet. With nothing FILLING, no `next` waits (its batch would
    be filling, or its slot free for a fill) unless every slot is leased: the counts then
    include every `next` sent, and the library has read their answers. Releases queued in
    the C library (and by this package) go out before the request."""
    deadline = time.monotonic() + timeout
    while True:
        st = [x for x in client.streams() if x["id"] == stream.id]
        assert st, "stream %d not listed" % stream.id
        if st[0]["filling"] == 0 or time.monotonic() > deadline:
            assert st[0]["filling"] == 0, "the daemon did not settle: %r" % st[0]
            return st[0]
        time.sleep(0.005)


def leased_on_daemon(client, stream):
    """Slots of the stream leased to us, as the settled daemon counts them: the batches we
    hold (held_batches(), kept ones included), plus the answered read-ahead requests."""
    return stream_entry(client, stream)["leased"]


def slot_generation(stream, slot):
    """The generation in a slot's header, read through the C library's mapping of the ring.
    The daemon bumps it when it starts filling the slot again: a slot whose generation has
    not changed was not given back (or not reused yet)."""
    base, _ = stream.ring
    return ctypes.c_uint64.from_address(base + _lib.lib.lc_stream_slot_offset(stream._h, slot)).value


# The tests that count the daemon's leases use the socket path, where what the daemon
# leases is what the library holds plus what it asked for ahead; through the hand-off the
# daemon also leases every batch it has put in the ready queue (test_handoff_* below and
# itest_handoff cover that path).
def assert_held(client, stream, n):
    assert stream.held_batches() == n
    # Holding at most one batch, the library has up to READ_AHEAD answers in hand.
    assert leased_on_daemon(client, stream) in (range(n, n + READ_AHEAD + 1) if n <= 1 else (n,))


def wait_stopped(pid, timeout=5.0):
    """Waits until every thread of a process that was sent SIGSTOP is stopped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(st in "Tt" for st in states):
            return
        time.sleep(0.005)
    raise AssertionError("process %d did not stop" % pid)
