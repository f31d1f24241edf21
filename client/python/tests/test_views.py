"""Batch views against a real loaderd: zero copy, writes that stay in this process, and
when a batch's slot goes back to the daemon (release, views dying, views kept)."""
import ctypes
import os
import time

import numpy as np
import pytest

import support
from conftest import REC

import loaderclient
from batch_checks import (mapping_of, library_pointer, assert_zero_copy, file_of, check_rec_batch, READ_AHEAD,
                          SLOTS_BEYOND_PREFETCH, DEFAULT_PREFETCH, stream_entry, leased_on_daemon, slot_generation,
                          assert_held)


# -- zero copy ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("safe", [True, False])
def test_zero_copy(client, safe):
    with client.open("rec", 64, keep_views_safe=safe) as s:
        for _ in range(s.slot_count + 2):   # every slot, and reused aliases
            b = s.next()
            x, y = b["data"], b["label"]
            assert_zero_copy(b, "data", x.ctypes.data)
            assert_zero_copy(b, "label", y.ctypes.data)
            t = b.torch("data")
            assert t.data_ptr() == x.ctypes.data
            assert x.ctypes.data != library_pointer(b, "data")   # a mapping of our own
            del x, y, t
        assert s.dropped_pages == 0          # nothing written: no page dropped on reuse


# -- writes through views ----------------------------------------------------------------------------

def library_bytes(batch, name, nbytes):
    """The field's first bytes as the C library sees them: its read-only shared mapping of
    the ring, i.e. the daemon's memory."""
    return np.frombuffer(ctypes.string_at(library_pointer(batch, name), nbytes), np.uint8)


@pytest.mark.parametrize("safe", [True, False])
def test_in_place_writes_stay_private(daemon, rec_index, safe):
    """In-place operations on numpy views and torch tensors work; the daemon's memory is
    never changed; every later batch in a written slot reads the daemon's bytes again; a
    second client reading meanwhile gets correct batches."""
    torch = pytest.importorskip("torch")
    with loaderclient.Client(daemon.socket, timeout=10) as c, loaderclient.Client(daemon.socket, timeout=10) as c2, \
            c.open("rec", 64, seed=7, epochs=3, keep_views_safe=safe) as s, c2.open("rec", 64, seed=8, epochs=3) as s2:
        assert s.writable_views, s.private_reason
        slots = set()
        n = 0
        for b, other in zip(s, s2):
            check_rec_batch(b, rec_index)      # whatever was written in this slot before
            check_rec_batch(other, rec_index)
            x = b["data"]
            want = np.array(x)
            t = b.torch("data")
            lab = b.torch("label")
            lab_want = lab.clone()
            x[:, :8] ^= 0xFF                   # numpy, in place
            t.mul_(3)                          # torch, in place (uint8 wraps)
            t[: b.rows // 2] = t.flip(0)[: b.rows // 2]   # a mixup-like row swap
            lab.add_(100)
            expect = want.copy()
            expect[:, :8] ^= 0xFF
            expect = (expect.astype(np.uint16) * 3 % 256).astype(np.uint8)
            expect[: b.rows // 2] = expect[::-1][: b.rows // 2]
            assert (x == expect).all() and (t.numpy() == expect).all()
            assert (lab == lab_want + 100).all() and (b["label"] == lab.numpy()).all()
            # The daemon's memory is untouched.
            assert (library_bytes(b, "data", want.size) == want.reshape(-1)).all()
            assert (library_bytes(b, "label", 8 * b.rows).view(np.int64) == lab_want.numpy()).all()
            slots.add(b.slot)
            n += 1
            del x, t, lab
        assert n == 48 and len(slots) == s.slot_count     # every slot written and reused
        assert s.dropped_pages >= n - s.slot_count        # each reuse of a written slot dropped pages


def test_writes_dropped_in_a_forked_child(daemon, rec_index):
    """A process forked after this one read batches finds its own written pages (the
    descriptor of /proc/self/pagemap is the parent's until the child opens its own): every
    batch it reads in a slot it wrote before shows the daemon's bytes."""
    with loaderclient.Client(daemon.socket, timeout=10) as c, c.open("rec", 64, seed=3, epochs=1) as s:
        for b in s:                            # slots reused: this process reads its pagemap
            b["data"][0, 0] ^= 1
        assert s.slot_count < 16 and s.dropped_pages > 0
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with loaderclient.Client(daemon.socket, timeout=10) as c, \
                    c.open("rec", 64, seed=4, epochs=2) as s:
                n = 0
                for b in s:
                    check_rec_batch(b, rec_index)
                    b["data"][:, :16] ^= 0xFF
                    n += 1
                code = 0 if n == 32 and s.dropped_pages >= n - s.slot_count else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_written_kept_view_keeps_its_writes(client, rec_index):
    """A kept batch that is copied out of the ring keeps what was written to it; its slot
    serves the daemon's bytes afterwards."""
    with client.open("rec", 64, seed=5) as s:
        b = s.next()
        slot = b.slot
        x = b["data"]
        x[:] = 7
        s.next()
        b3 = s.next()
        x3 = b3["data"]
        s.next()                                           # x's batch is copied out
        assert "loaderd." not in mapping_of(x.ctypes.data)["path"]
        assert (x == 7).all()
        x[:, 0] = 9                                        # still writable after the copy
        assert (x[:, 0] == 9).all() and (x[:, 1:] == 7).all()
        for _ in range(3 * s.slot_count):
            nb = s.next()
            check_rec_batch(nb, rec_index)
            if nb.slot == slot:
                break
        else:
            raise AssertionError("slot %d never came back" % slot)
        del x, x3


def test_in_place_ops_do_not_crash_the_process(daemon):
    """The trainer's recipe (x.mul_() on the batch's tensor) in a fresh interpreter: it
    used to die of SIGSEGV on the read-only mapping."""
    pytest.importorskip("torch")
    code = """
import loaderclient
with loaderclient.Client(%r) as c:
    for safe in (True, False):
        with c.open("rec", 64, epochs=1, keep_views_safe=safe) as s:
            for b in s:
                t = b.torch("data")
                t.mul_(2)
                b.torch("label").mul_(7)
                b["data"][0] += 1
print("ok")
""" % daemon.socket
    p = support.run_python(code, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])


def test_views_need_no_proc_maps(client, rec_index, monkeypatch):
    """The ring's descriptor and layout come from the C library: a process that cannot read
    /proc/self/maps (and the ring's name is gone after the first batch anyway) still gets
    private copy-on-write views at the library's offsets."""
    import builtins
    real_open = builtins.open

    def no_maps(path, *a, **k):
        if str(path) == "/proc/self/maps":
            raise PermissionError("no /proc/self/maps here")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", no_maps)
    with client.open("rec", 64, seed=2) as s:
        assert s.writable_views and s.private_reason is None
        for i in range(s.slot_count + 1):
            b = s.next()
            check_rec_batch(b, rec_index)
            x = b["data"]
            lib_ptr = library_pointer(b, "data")
            assert lib_ptr != x.ctypes.data
            x[0, 0] ^= 0xFF                             # a private copy: the daemon's bytes stay
            assert ctypes.c_uint8.from_address(lib_ptr).value == x[0, 0] ^ 0xFF
            del x


def test_next_releases_previous(client):
    with client.open("rec", 64, handoff="socket") as s:
        b1 = s.next()
        b1["data"]
        b1.torch("label")
        b2 = s.next()
        assert b1.released and not b2.released
        for access in (lambda: b1["data"], lambda: b1.numpy("label"), lambda: b1.torch("data"), b1.copy,
                       lambda: b1.fields and b1["label"]):
            with pytest.raises(loaderclient.ReleasedError, match="released"):
                access()
        assert not b1.valid
        assert (b1.epoch, b1.index) == (0, 0)     # metadata stays readable
        assert_held(client, s, 1)                 # b1's slot is back: its views died with b1's cache
        assert any(s.next().slot == b1.slot for _ in range(2 * s.slot_count))   # and in use again


def test_explicit_release_and_context_manager(client):
    with client.open("rec", 64, auto_release=False, handoff="socket") as s:
        b = s.next()
        b.release()
        b.release()   # idempotent
        assert b.released
        with pytest.raises(loaderclient.ReleasedError):
            b["data"]
        with s.next() as b2:
            assert b2["data"].shape[0] == 64
        assert b2.released
        assert_held(client, s, 0)
        # Hold every slot, with a release on the way (the daemon fills while batches are
        # held: see test_daemon_refills_while_batches_are_held).
        held = [s.next() for _ in range(4)]
        held.pop().release()
        held += [s.next() for _ in range(s.slot_count - len(held))]
        assert len(held) == s.slot_count and leased_on_daemon(client, s) == s.slot_count
        # Every slot held and nothing released: an error, not a wait for a batch that cannot come.
        with pytest.raises(loaderclient.LoaderdError, match="release one") as ei:
            s.next()
        assert ei.value.code == -4012
        last = held[-1].index
        for h in held:
            h.release()
        assert s.next().index == last + 1


def test_daemon_refills_while_batches_are_held(client):
    """The daemon keeps filling while the trainer holds batches without releasing any: each
    batch it leases makes room for one more ahead."""
    with client.open("rec", 64, prefetch=2, auto_release=False, handoff="socket") as s:
        assert s.slot_count == 2 + SLOTS_BEYOND_PREFETCH
        time.sleep(0.3)   # the first two batches are READY: no fill left to finish
        # Every slot but one held, nothing released: all but the first `prefetch` batches
        # (and the library's read-ahead) exist only if the daemon refilled meanwhile.
        held = [s.next(timeout=1) for _ in range(s.slot_count - 1)]
        assert [(b.epoch, b.index) for b in held] == [(0, i) for i in range(s.slot_count - 1)]
        # Holding that many, the library has no `next` in flight: the last free slot is
        # filled ahead all the same.
        st = stream_entry(client, s)
        assert (st["leased"], st["ready"], st["free"]) == (s.slot_count - 1, 1, 0)


def test_kept_views_keep_their_bytes(client, rec_index):
    """An array kept past its batch's release never shows another batch's data, and kept
    arrays never take more slots than the ring keeps beyond the prefetch."""
    with client.open("rec", 64, seed=5, handoff="socket") as s:
        assert s.slot_count == DEFAULT_PREFETCH + SLOTS_BEYOND_PREFETCH
        b = s.next()
        slot, gen = b.slot, b.generation
        x = b["data"]
        t = b.torch("data")
        want = np.array(x)
        assert check_rec_batch(b, rec_index)
        b2 = s.next()      # b released; x alive: the slot stays leased (deferred)
        assert s.held_batches() == 2
        # b, b2 and one read-ahead answer: holding two batches, the library did not ask
        # ahead again after taking the first answer for b2.
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        del b2
        for _ in range(3 * s.slot_count):   # the ring turns over many times
            nb = s.next()
            nb["data"]
            assert nb.slot != slot           # the kept batch's slot is never handed out again
            assert s.held_batches() == 2     # the kept batch and this one
            assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1 == SLOTS_BEYOND_PREFETCH
        assert slot_generation(s, slot) == gen
        assert (x == want).all() and (t.numpy() == want).all()
        for r in range(x.shape[0]):
            assert (x[r] == support.file_bytes(file_of(x[r], rec_index), REC["size"])).all()
        # One kept batch holds its slot (no copy: still the shared memory).
        assert "loaderd." in mapping_of(x.ctypes.data)["path"]
        # Keep a second one: the oldest is copied out of the ring, its slot given back.
        b3 = s.next()
        x3 = b3["data"]
        s.next()
        assert "loaderd." not in mapping_of(x.ctypes.data)["path"]
        assert "loaderd." in mapping_of(x3.ctypes.data)["path"]
        assert s.held_batches() == 2         # b3 (kept) and the current batch
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        # b's slot is the daemon's again: every slot not leased is filled ahead, so it was
        # refilled (a new generation), while x goes on showing b's bytes.
        assert slot_generation(s, slot) != gen
        assert (x == want).all() and (t.numpy() == want).all()
        del x, t


def test_views_dying_give_the_slot_back(client):
    with client.open("rec", 64, handoff="socket") as s:
        b = s.next()
        slot, gen = b.slot, b.generation
        x = b["data"]
        s.next()
        # b (kept by x), the current batch, and one read-ahead answer.
        assert s.held_batches() == 2
        assert leased_on_daemon(client, s) == 2 + READ_AHEAD - 1
        assert slot_generation(s, slot) == gen     # not given back: the daemon did not refill it
        del x               # last view of the first batch: its slot goes back now
        assert s.held_batches() == 1
        # The current batch and READ_AHEAD answers: holding one batch again, the library
        # asked ahead with the release. The count alone cannot tell b's slot from the new
        # answer's: its generation does. The ring is full (prefetch + the leased slots),
        # so the daemon refilled b's slot at once.
        assert leased_on_daemon(client, s) == 1 + READ_AHEAD
        assert slot_generation(s, slot) != gen


def test_many_kept_batches(client, rec_index):
    with client.open("rec", 64, seed=9, epochs=1) as s:
        kept = [(b["data"], np.array(b["data"])) for b in s]
        assert len(kept) == 16 and s.held_batches() <= 1
    for view, want in kept:
        assert (view == want).all()
    ids = [file_of(v[r], rec_index) for v, _ in kept for r in range(v.shape[0])]
    assert sorted(ids) == list(range(REC["n"]))


def test_unguarded_release_is_immediate(client):
    """keep_views_safe=False: the slot goes back at once although a view is alive, so the
    view later shows another batch (the documented hazard of that mode)."""
    with client.open("rec", 64, keep_views_safe=False) as s:
        b = s.next()
        x = b["data"]
        want = np.array(x)
        s.next()
        assert b.released and s.held_batches() == 1
        with pytest.raises(loaderclient.ReleasedError):
            b["data"]
        reused = False
        for _ in range(3 * s.slot_count):
            reused = reused or s.next().slot == b.slot
        assert reused                       # the daemon got the slot back and refilled it
        assert not (x == want).all()        # and the kept view shows what it holds now
        del x
