"""A training loop survives a daemon restart: the daemon is stopped (SIGTERM) or killed
(SIGKILL) under a reading Stream and under a LoaderdDataLoader loop, and restarted on the
same socket; the loop sees a pause, never an exception, and every sample of each epoch
exactly once. A daemon that does not come back ends the loop with ConnectionLost after the
reconnect time, saying how long it tried. Nothing leaks: descriptors, mappings, /dev/shm."""
import os
import threading
import time

import numpy as np
import pytest

import support
from conftest import REC

import loaderclient


def fds():
    """This process's open descriptors (the pagemap one is opened once and kept)."""
    out = []
    for n in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink("/proc/self/fd/" + n))
        except OSError:
            pass
    return sorted(t for t in out if t != "/proc/%d/pagemap" % os.getpid())


def ring_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/dev/shm/loaderd." in line)


def file_of(row, index):
    return index[int(np.frombuffer(np.asarray(row)[:8].tobytes(), "<u8")[0])]


class Epochs:
    """Every sample seen, per epoch; each batch must be the next in order."""

    def __init__(self, batches_per_epoch, index):
        self.bpe = batches_per_epoch
        self.index = index
        self.seen = {}
        self.pos = (0, 0)

    def add(self, epoch, index, data):
        assert (epoch, index) == self.pos, "expected batch %d of epoch %d, got %d of %d" % (
            self.pos[1], self.pos[0], index, epoch)
        got = self.seen.setdefault(epoch, [])
        got += [file_of(data[r], self.index) for r in range(data.shape[0])]
        self.pos = (epoch + 1, 0) if index + 1 == self.bpe else (epoch, index + 1)

    def check(self, epochs):
        assert sorted(self.seen) == list(range(epochs))
        for e in range(epochs):
            assert sorted(self.seen[e]) == list(range(REC["n"])), "epoch %d: duplicates or gaps" % e


def restart_later(daemon, delay):
    """Starts the daemon again after `delay` s, from a thread (the reader is blocked)."""
    t = threading.Thread(target=lambda: (time.sleep(delay), daemon.start()))
    t.start()
    return t


def test_stream_rides_through_restarts(spare_daemon, rec_index):
    base_fds, base_maps = fds(), ring_maps()
    c = loaderclient.Client(spare_daemon.socket, timeout=10, reconnect=30)
    s = c.open("rec", 64, seed=3, epochs=2)
    seen = Epochs(s.batches_per_epoch, rec_index)
    first_id = s.id
    n = 0
    kept = None
    for b in s:
        seen.add(b.epoch, b.index, b["data"])
        n += 1
        if n == 3:
            # A view kept across the stop: it goes on showing its batch.
            kept = b["data"]
            kept_files = [file_of(kept[r], rec_index) for r in range(kept.shape[0])]
            dead = spare_daemon.pid
            assert spare_daemon.stop() == 0          # SIGTERM: a clean stop
            assert support.shm_left(dead) == []
            restarter = restart_later(spare_daemon, 0.3)
        elif n == 10:
            restarter.join()
            dead = spare_daemon.pid
            spare_daemon.kill()                     # SIGKILL, in the middle of the first epoch
            restarter = restart_later(spare_daemon, 0.3)
        elif n == s.batches_per_epoch + 2:
            restarter.join()
            spare_daemon.kill()                     # and in the second
            restarter = restart_later(spare_daemon, 0.1)
    restarter.join()
    seen.check(2)
    assert [file_of(kept[r], rec_index) for r in range(kept.shape[0])] == kept_files
    assert c.reconnects == 3 and s.reopens == 3 and s.id >= 1
    assert first_id >= 1
    del kept
    s.close()
    c.close()
    assert fds() == base_fds
    assert ring_maps() == base_maps
    pid = spare_daemon.pid
    assert spare_daemon.stop() == 0
    assert support.shm_left(pid) == []


def test_dataloader_loop_rides_through_restarts(spare_daemon, rec_index):
    from loaderclient.torch import LoaderdDataLoader
    base_fds = fds()
    loader = LoaderdDataLoader("rec", batch_size=50, shuffle=True, seed=5, socket=spare_daemon.socket, timeout=10,
                               reconnect=30)
    bpe = len(loader)
    seen = Epochs(bpe, rec_index)
    restarter = None
    for epoch in range(2):
        for i, (data, label) in enumerate(loader):
            seen.add(epoch, i, data.numpy())
            assert (label.numpy() == [file_of(data[r].numpy(), rec_index) % REC["classes"]
                                      for r in range(data.shape[0])]).all()
            if (epoch, i) in ((0, 4), (0, bpe - 1), (1, 2)):
                # SIGTERM mid-epoch, SIGKILL at the last batch of an epoch (the next one is
                # the first of the next epoch, from a reopened stream) and mid-epoch
                if restarter:
                    restarter.join()
                if (epoch, i) == (0, 4):
                    assert spare_daemon.stop() == 0
                else:
                    spare_daemon.kill()
                restarter = restart_later(spare_daemon, 0.2)
    restarter.join()
    seen.check(2)
    assert loader.stream.reopens == 3
    assert loader.reopens == 0          # the loader's own stream is the same one throughout
    loader.close()
    assert fds() == base_fds


def test_daemon_that_does_not_come_back(spare_daemon):
    base_fds = fds()
    c = loaderclient.Client(spare_daemon.socket, timeout=5, reconnect=0.5)
    s = c.open("rec", 16)
    x = s.next()["data"]
    before = x.copy()
    spare_daemon.kill()
    t0 = time.monotonic()
    with pytest.raises(loaderclient.ConnectionLost) as ei:
        for _ in range(100):
            s.next()
    waited = time.monotonic() - t0
    assert 0.4 < waited < 4, waited
    msg = ei.value.message
    assert "gave up reconnecting" in msg and "after 0.5 s" in msg, msg
    with pytest.raises(loaderclient.ConnectionLost):
        c.status()
    assert (x == before).all()        # still readable
    del x
    c.close()
    assert fds() == base_fds


def test_reconnect_argument():
    for bad in (-1, "soon", True, 1e12):
        with pytest.raises(loaderclient.InvalidArgument):
            loaderclient.Client("/nonexistent/s.sock", reconnect=bad)


def test_reconnect_environment(spare_daemon):
    r = support.run_python("import loaderclient, sys\n"
                           "try:\n"
                           "    loaderclient.Client(sys.argv[1] if len(sys.argv) > 1 else %r)\n"
                           "except loaderclient.ConnectError as e:\n"
                           "    print(e.code, e.message)\n" % spare_daemon.socket,
                           env={"LOADERD_RECONNECT": "later"})
    assert r.returncode == 0, r.stderr
    assert "LOADERD_RECONNECT='later'" in r.stdout, r.stdout


def test_daemon_back_with_another_dataset(spare_daemon, data_dir):
    """The name now serves another tree (300 files, not 1000): next() refuses to go on
    with a clear error instead of mixing the two in one epoch."""
    c = loaderclient.Client(spare_daemon.socket, timeout=5, reconnect=10)
    s = c.open("rec", 16, shuffle=False)
    s.next()
    assert spare_daemon.stop() == 0
    os.symlink(os.path.join(data_dir, "var"), os.path.join(spare_daemon.dir, "var"))
    other = support.Daemon(spare_daemon.dir, "  rec:\n    kind: files\n    path: var\n")
    other.start()
    try:
        with pytest.raises(loaderclient.LoaderdError) as ei:
            # The batches already leased to us come first: the read-ahead's replies, or
            # with the shared-memory hand-off every batch the old daemon had published,
            # which is at most the ring's slots.
            for _ in range(s.slot_count + 1):
                s.next()
        assert ei.value.name == "bad_dataset", ei.value
        assert "dataset 'rec' changed" in ei.value.message and "1000" in ei.value.message
        with pytest.raises(loaderclient.LoaderdError):
            s.next()                    # it stays failed
        assert c.status()["streams"] == 0   # the stream the new daemon opened was closed
        c.close()
    finally:
        other.kill()


def test_restart_with_another_ring(spare_daemon, rec_index):
    """The daemon comes back with another prefetch (its default): the reopened stream's
    ring has other slots, which the package maps afresh; batches held from the old ring
    keep their bytes, and the epoch still comes exactly once."""
    c = loaderclient.Client(spare_daemon.socket, timeout=10, reconnect=10)
    s = c.open("rec", 32, seed=9, epochs=1, auto_release=False)
    seen = Epochs(s.batches_per_epoch, rec_index)
    held = [s.next() for _ in range(2)]
    for b in held:
        seen.add(b.epoch, b.index, b["data"])
    kept = [(b, b["data"], b["data"].copy()) for b in held]
    slots_before = s.slot_count
    assert spare_daemon.stop() == 0
    bigger = support.Daemon(spare_daemon.dir, "  rec:\n    kind: files\n    path: rec\n",
                            server_extra="  workers: 2\n  memory_budget: 128MiB\n  prefetch: 8\n")
    bigger.start()
    try:
        for b in s:
            seen.add(b.epoch, b.index, b["data"])
            b.release()
        seen.check(1)
        assert s.reopens == 1 and s.slot_count == 8 + 3 != slots_before
        for b, view, copy in kept:
            assert b.valid and (view == copy).all()
            b.release()
        c.close()
    finally:
        bigger.kill()
