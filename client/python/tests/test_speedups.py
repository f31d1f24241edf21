"""The optional extension (loaderclient._speedups) and the Python path it stands in for:
which one runs, the same results from both, the written-page drop (a write by another process included),
errors with their messages, and nothing left behind over many batches.

The key files (views, torch, this one) run again in a child pytest with
LOADERCLIENT_PURE=1, so that both paths pass them in every run."""
import ctypes
import gc
import mmap
import os
import subprocess
import sys
import sysconfig
import threading
import tracemalloc

import numpy as np
import pytest

import loaderclient
from conftest import REC
from loaderclient import _lib, _slots

HERE = os.path.dirname(os.path.abspath(__file__))
PURE = os.environ.get("LOADERCLIENT_PURE", "") not in ("", "0")
EXT = _lib.speedups

# The two implementations of the drop step, each with its pagemap descriptor handling.
DROPS = [pytest.param(_slots._drop_written_py, id="python")]
if EXT is not None:
    DROPS.append(pytest.param(_slots._drop_written_ext, id="extension"))


def _headers_present():
    import numpy
    return (os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
            and os.path.exists(os.path.join(numpy.get_include(), "numpy", "arrayobject.h")))


def test_the_extension_is_used_when_built():
    """`make` builds the extension wherever Python's and numpy's headers are (deps.sh
    installs python3-dev for the tests): then it is the path in use, unless
    LOADERCLIENT_PURE=1 asks for the Python one."""
    if PURE:
        assert loaderclient.speedups_path is None and "LOADERCLIENT_PURE" in loaderclient.speedups_note
        assert _slots.LeaseState.__module__ == "loaderclient._slots"
        return
    if not _headers_present():
        pytest.skip("no Python or numpy headers here: the extension is not built (%s)" % loaderclient.speedups_note)
    assert loaderclient.speedups_path is not None, loaderclient.speedups_note
    assert loaderclient.speedups_note is None
    assert os.path.basename(loaderclient.speedups_path).startswith("_speedups")
    assert sys.modules["loaderclient._speedups"] is EXT and EXT.API_VERSION == _lib.SPEEDUPS_API_VERSION
    assert _slots.LeaseState is EXT.LeaseState


def test_pure_is_forced_by_the_environment(daemon):
    code = ("import loaderclient, sys\n"
            "from loaderclient import _slots\n"
            "assert loaderclient.speedups_path is None, loaderclient.speedups_path\n"
            "assert 'loaderclient._speedups' not in sys.modules\n"
            "c = loaderclient.Client(sys.argv[1], timeout=10)\n"
            "s = c.open('rec', 10, epochs=1)\n"
            "b = s.next()\n"
            "assert type(b._lease).__name__ == '_Lease' and type(b._state) is _slots.LeaseState\n"
            "print(loaderclient.speedups_note, b.rows)\n")
    env = dict(os.environ, LOADERCLIENT_PURE="1", PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-c", code, daemon.socket], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["$LOADERCLIENT_PURE=1", "10"]


@pytest.mark.deadline(240)
def test_key_files_pass_on_the_python_path():
    """The views, torch and extension tests again with LOADERCLIENT_PURE=1 (a child pytest
    with a daemon of its own): the Python path stays the reference."""
    if PURE or EXT is None:
        pytest.skip("this run is the Python path already")
    env = dict(os.environ, LOADERCLIENT_PURE="1", LOADERCLIENT_LIB=os.path.abspath(_lib.library_path))
    files = [os.path.join(HERE, f) for f in ("test_views.py", "test_torch.py", "test_speedups.py")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"] + files,
                       env=env, capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


# -- the drop of written pages --------------------------------------------------------------

PAGES = 8


@pytest.fixture
def private_mapping(scratch):
    """A private writable mapping of a file of PAGES pages of known bytes, every page read
    once: (mmap, its address, the file's bytes)."""
    path = scratch / "pages"
    want = np.arange(PAGES * mmap.PAGESIZE, dtype=np.uint32).astype(np.uint8)
    path.write_bytes(want.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, PAGES * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    view = np.frombuffer(m, np.uint8)
    assert (view == want).all()
    yield m, addr, want
    del view
    gc.collect()
    m.close()


@pytest.mark.parametrize("drop", DROPS)
def test_written_pages_are_dropped(private_mapping, drop):
    m, addr, want = private_mapping
    size = PAGES * mmap.PAGESIZE
    assert drop(addr, size) == 0                           # nothing written
    view = np.frombuffer(m, np.uint8)
    view[3 * mmap.PAGESIZE] ^= 0xFF
    view[5 * mmap.PAGESIZE + 7] ^= 0xFF
    assert drop(addr, size) == 3                           # pages 3 to 5, one madvise
    assert (view == want).all()                            # the file's bytes again

    # A write from another thread: seen.
    t = threading.Thread(target=lambda: view.__setitem__(6 * mmap.PAGESIZE, 1))
    t.start()
    t.join()
    assert view[6 * mmap.PAGESIZE] == 1
    assert drop(addr, size) == 1
    assert (view == want).all()


@pytest.mark.parametrize("drop", DROPS)
def test_a_page_written_by_another_process_is_dropped(private_mapping, drop):
    """A write into the mapping by another process (here through /proc/PID/mem, as a
    debugger or process_vm_writev would) faults in that process, not in this one: the
    pagemap is read at every drop all the same, so the write is dropped."""
    m, addr, want = private_mapping
    size = PAGES * mmap.PAGESIZE
    assert drop(addr, size) == 0
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:            # the reader: its pages in and found clean, then the parent's write
        code = 3
        try:
            os.close(go_w)
            os.close(done_r)
            view = np.frombuffer(m, np.uint8)
            ok = (view == want).all() and drop(addr, size) == 0
            os.write(done_w, b"r")
            os.read(go_r, 1)
            ok = ok and view[2 * mmap.PAGESIZE] == (want[2 * mmap.PAGESIZE] ^ 0xFF)
            ok = ok and drop(addr, size) == 1 and (view == want).all()
            code = 0 if ok else 4
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(done_w)
    os.read(done_r, 1)      # the child found its mapping clean: now the write
    try:
        fd = os.open("/proc/%d/mem" % pid, os.O_RDWR)
    except OSError as e:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        pytest.skip("cannot write into a child's memory here: %s" % e)
    try:
        os.pwrite(fd, bytes([want[2 * mmap.PAGESIZE] ^ 0xFF]), addr + 2 * mmap.PAGESIZE)
    finally:
        os.close(fd)
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    os.close(go_w)
    os.close(done_r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize("drop", DROPS)
def test_an_unreadable_pagemap_drops_every_page(private_mapping, drop, monkeypatch):
    """With the pagemap unreadable, every page is dropped at every look."""
    m, addr, want = private_mapping
    size = PAGES * mmap.PAGESIZE
    monkeypatch.setattr(_slots, "_pagemap_fd", -1)
    for _ in range(3):
        assert drop(addr, size) == PAGES
        assert (np.frombuffer(m, np.uint8) == want).all()


@pytest.mark.parametrize("drop", DROPS)
def test_a_failed_drop_says_why(drop, monkeypatch):
    """madvise failing (here: a range no longer mapped, with the pagemap unreadable so
    every page is dropped) raises LoaderdError with the reason."""
    m = mmap.mmap(-1, PAGES * mmap.PAGESIZE)
    c = ctypes.c_char.from_buffer(m)
    addr = ctypes.addressof(c)
    del c
    m.close()   # after the address was taken: the range is unmapped now
    monkeypatch.setattr(_slots, "_pagemap_fd", -1)
    with pytest.raises(loaderclient.LoaderdError) as e:
        drop(addr, PAGES * mmap.PAGESIZE)
    assert "cannot drop the pages written in a slot's mapping: %s" % os.strerror(12) in str(e.value)
    assert e.value.code == -12


# -- the extension's own checks --------------------------------------------------------------

@pytest.mark.skipif(EXT is None, reason="the extension is not in use")
def test_arrays_stay_inside_the_lease():
    buf = (ctypes.c_uint8 * 4096)()
    lease = EXT.lease(ctypes.addressof(buf), 4096, None)
    (a,) = EXT.arrays(lease, 0, 4, ((np.dtype(np.int64), (2,), 4032, 0),), None)
    assert a.shape == (4, 2) and a.base is lease and a.flags.writeable
    a[...] = 7
    assert bytes(buf[4032:4096]) == np.full(8, 7, np.int64).tobytes()
    with pytest.raises(ValueError, match="does not fit in the lease's 4096"):
        EXT.arrays(lease, 0, 4, ((np.dtype(np.int64), (2,), 4040, 0),), None)
    with pytest.raises(ValueError, match="does not fit"):
        EXT.arrays(lease, 4090, 1, ((np.dtype(np.uint8), (), 8, 1),), None)
    (c,) = EXT.arrays(lease, 0, 4, ((np.dtype(np.uint16), (), 0, 2),), None)
    assert c.dtype == np.int64 and c.base is None      # a copy, converted
    del a, lease


# -- nothing left behind -----------------------------------------------------------------------

def test_nothing_accumulates_over_many_batches(daemon):
    """Leases, their states and batches go with their batches: the same objects, memory
    and references after 300 batches as after 60 (both paths: see the child run)."""
    from loaderclient.torch import LoaderdDataLoader
    kinds = {"Lease", "_Lease", "LeaseState", "Batch"}

    def alive():
        gc.collect()
        return sum(type(o).__name__ in kinds for o in gc.get_objects())

    with LoaderdDataLoader("rec", batch_size=10, shuffle=True, socket=daemon.socket, timeout=10) as loader:
        it = iter(loader)

        def run(n):
            nonlocal it
            for _ in range(n):
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(loader)
                    x, y = next(it)
            return x, y

        keep = run(60)
        stream = loader.stream
        refs, objs = sys.getrefcount(stream), alive()
        tracemalloc.start()
        snap = tracemalloc.take_snapshot()
        keep = run(240)
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap, "filename"))
        tracemalloc.stop()
        del keep
        assert sys.getrefcount(stream) == refs
        assert alive() <= objs
        assert grown < 64 * 1024, grown
        assert stream.held_batches() <= 1


# -- the library called from C ----------------------------------------------------------------

needs_ext = pytest.mark.skipif(EXT is None, reason="the Python path: no extension loaded")


@needs_ext
def test_set_library_and_next_info_check_their_arguments():
    with pytest.raises(TypeError, match="takes 2 arguments"):
        EXT.set_library(1)
    with pytest.raises(TypeError, match="must be an int"):
        EXT.set_library("1", 2)
    with pytest.raises(ValueError, match="both functions, or neither"):
        EXT.set_library(0, 1)
    with pytest.raises(OverflowError):
        EXT.set_library(-1, 1)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        EXT.next_info(1, 2, 3, 4)
    bp, info = ctypes.c_void_p(), _lib.LcBatchInfo()
    at = (ctypes.addressof(bp), ctypes.addressof(info), ctypes.sizeof(info))
    with pytest.raises(ValueError, match="null stream"):
        EXT.next_info(0, 10, *at)
    with pytest.raises(ValueError, match="null stream, batch or info"):
        EXT.next_info(1, 10, 0, at[1], at[2])
    EXT.set_library(0, 0)
    try:
        with pytest.raises(RuntimeError, match="no library set"):
            EXT.next_info(1, 10, *at)
    finally:
        EXT.set_library(*_lib.library_functions())
    # The addresses handed over are the library's own (as the dynamic linker resolves them).
    fresh = ctypes.CDLL(_lib.library_path)
    assert _lib.library_functions() == (ctypes.cast(fresh.lc_stream_next_info_sized, ctypes.c_void_p).value,
                                        ctypes.cast(fresh.lc_batch_release, ctypes.c_void_p).value)


class _CountingLib:
    """The package's binding, its two per-batch calls counted."""

    def __init__(self, real):
        self._real, self.next_calls, self.releases = real, 0, 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def lc_stream_next_info_sized(self, *a):
        self.next_calls += 1
        return self._real.lc_stream_next_info_sized(*a)

    def lc_batch_release(self, b):
        self.releases += 1
        return self._real.lc_batch_release(b)


def test_batches_come_and_go_through_the_library(daemon, monkeypatch, rec_index):
    """A whole epoch, 20 times the stream's slots: every batch the right one, every slot
    given back (else the ring would run dry). With the extension, next() and the
    steady-state give-back call the library from C: the ctypes binding sees neither; on
    the Python path it sees both for every batch."""
    import loaderclient.client as lcc
    from batch_checks import check_rec_batch
    counting = _CountingLib(lcc.lib)
    monkeypatch.setattr(lcc, "lib", counting)
    monkeypatch.setattr(lcc, "_WAIT_SLICE_MS", 60000)   # one call per batch, however long it waits
    with loaderclient.Client(daemon.socket, timeout=10) as c:
        s = c.open("rec", 10, epochs=1, prefetch=2)
        assert s.slot_count == 5
        seen = []
        for b in s:
            seen += check_rec_batch(b, rec_index)
        assert sorted(seen) == list(range(REC["n"]))
        s.close()
    if EXT is None:
        assert counting.next_calls >= REC["n"] // 10 and counting.releases >= REC["n"] // 10 - 1
    else:
        assert counting.next_calls == 0 and counting.releases == 0


@needs_ext
def test_without_the_library_a_give_back_goes_through_the_binding(daemon, monkeypatch):
    """set_library(0, 0): a batch whose last view dies is released through the package's
    binding (owner.lib), once; the slot is back with the daemon (the stream goes on past
    its ring's size after the library is set again)."""
    import loaderclient.client as lcc
    counting = _CountingLib(lcc.lib)
    monkeypatch.setattr(lcc, "lib", counting)
    monkeypatch.setattr(lcc, "_WAIT_SLICE_MS", 60000)
    with loaderclient.Client(daemon.socket, timeout=10) as c:
        s = c.open("rec", 10, prefetch=2)
        b = s.next()
        x = b["data"]
        b.release()                # released; its view x keeps the slot
        del b
        EXT.set_library(0, 0)
        try:
            assert counting.releases == 0
            del x                  # the last view dies: the give-back, through the binding
            assert counting.releases == 1
        finally:
            EXT.set_library(*_lib.library_functions())
        for _ in range(3 * s.slot_count):
            s.next()
        assert counting.releases == 1 and counting.next_calls == 0
        s.close()


def test_other_threads_run_while_next_waits(spare_daemon, monkeypatch):
    """next() waits in the library with the GIL released (as a ctypes call does): while it
    waits, in one call, on a stopped daemon, another Python thread runs and wakes the
    daemon, and the batch comes. With the GIL held through the call that thread could not
    run, and next() would time out."""
    import signal
    import loaderclient.client as lcc
    from batch_checks import SLOTS_BEYOND_PREFETCH, wait_stopped
    monkeypatch.setattr(lcc, "_WAIT_SLICE_MS", 60000)   # the whole wait is one library call
    with loaderclient.Client(spare_daemon.socket, timeout=30) as c:
        s = c.open("rec", 16, prefetch=1, auto_release=False, handoff="socket")
        assert s.slot_count == 1 + SLOTS_BEYOND_PREFETCH
        held = [s.next() for _ in range(s.slot_count - 1)]   # as test_ctrl_c_interrupts_a_wait
        entered = threading.Event()
        real_next = lcc._next_info if lcc._next_info is not None else lcc.lib.lc_stream_next_info_sized

        def waker():
            entered.wait(10)
            for _ in range(20):           # Python bytecode, between the library call's start and its end
                threading.Event().wait(0.005)
            os.kill(spare_daemon.pid, signal.SIGCONT)

        def marking_next(*a):
            entered.set()
            return real_next(*a)

        if lcc._next_info is not None:
            monkeypatch.setattr(lcc, "_next_info", marking_next)
        else:
            monkeypatch.setattr(lcc, "lib", _Marking(lcc.lib, marking_next))
        os.kill(spare_daemon.pid, signal.SIGSTOP)
        t = threading.Thread(target=waker)
        try:
            wait_stopped(spare_daemon.pid)
            t.start()
            b = s.next(timeout=8)
        finally:
            t.join()
            os.kill(spare_daemon.pid, signal.SIGCONT)
        assert b.rows == 16
        for x in held + [b]:
            x.release()
        s.close()


class _Marking:
    """A binding whose lc_stream_next_info_sized is `fn` (the Python path's)."""

    def __init__(self, real, fn):
        self._real, self.lc_stream_next_info_sized = real, fn

    def __getattr__(self, name):
        return getattr(self._real, name)
