"""What writable (copy-on-write) slot mappings cost per batch.

    LOADERCLIENT_LIB=build/lib/libloaderclient.so /usr/bin/python3 client/python/benchmarks/cow_cost.py

Starts a loaderd of its own (build/bin/loaderd, or $LOADERD_BIN) on a generated `files`
dataset (default 2048 samples of 16 KiB, batches of 64: 1 MiB; --count, --size, --batch)
and times, on one leased slot (so that the daemon's speed does not enter the figures), a
batch's life as the consumer sees it: read every byte; with or without the drop step that
runs before the slot shows its next batch (the pagemap read, plus the madvise when pages
were written); written in place (numpy, torch) or computed out of place. The in-place
cycles include the page copies the kernel makes at the first write of each page (the price
of a private copy) and the re-faults of the next read after the drop.
"""
import argparse
import mmap
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import numpy as np  # noqa: E402

import support  # noqa: E402
import loaderclient  # noqa: E402
from loaderclient import _slots  # noqa: E402

ROUNDS = 5


def main():
    global N, SIZE, BATCH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=16384, help="bytes per sample (default 16384)")
    ap.add_argument("--batch", type=int, default=64, help="samples per batch (default 64)")
    ap.add_argument("--count", type=int, default=2048, help="samples in the dataset (default 2048)")
    a = ap.parse_args()
    N, SIZE, BATCH = a.count, a.size, a.batch
    d = support.short_tmpdir("lc-cow.")
    try:
        gendata = support.binaries()[1]
        subprocess.run([gendata, "files", os.path.join(d, "big"), "--count", str(N), "--size", str(SIZE)],
                       check=True, stdout=subprocess.DEVNULL)
        dm = support.Daemon(d, "  big:\n    kind: files\n    path: big\n",
                            server_extra="  workers: 2\n  memory_budget: 512MiB\n")
        dm.start()
        try:
            run(dm)
        finally:
            dm.stop()
    finally:
        support.rmtree(d)


def timed(fn, k):
    """Median over 5 rounds of the mean time of fn() over k calls, in microseconds."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        rounds.append((time.perf_counter() - t0) / k * 1e6)
    return statistics.median(rounds), min(rounds), max(rounds)


def first_touch(size):
    m = mmap.mmap(-1, size)
    for off in range(0, size, mmap.PAGESIZE):
        m[off] = 1
    m.close()


def run(dm):
    with loaderclient.Client(dm.socket, timeout=30) as c, c.open("big", BATCH, seed=1, prefetch=8) as s:
        b = s.next()
        size = s._ring.alias_len
        addr = b._state.addr
        x = b["data"]
        t = b.torch("data")
        y = np.empty_like(x)
        x.sum()
        print("slot mapping: %d KiB (%d pages), batch %d x %d B, on one leased slot:"
              % (size // 1024, size // 4096, BATCH, SIZE))
        assert s.writable_views, s.private_reason

        def drop():
            _slots._drop_written(addr, size, [None], 0)   # [None]: never known clean, always looked up

        def copy_then_mul():
            z = np.array(x)
            np.multiply(z, 3, out=z)
        cycles = [
            ("read (x.sum()), no drop step [the read-only design]", lambda: x.sum()),
            ("read + drop step, nothing written", lambda: (x.sum(), drop())),
            ("read + numpy in place (x *= 3) + drop step", lambda: (x.sum(), np.multiply(x, 3, out=x), drop())),
            ("read + torch in place (t.mul_(3)) + drop step", lambda: (x.sum(), t.mul_(3), drop())),
            ("read + out of place (x * 3, a new array)", lambda: (x.sum(), x * 3)),
            ("read + out of place into a buffer (np.multiply(x, 3, out=y))",
             lambda: (x.sum(), np.multiply(x, 3, out=y))),
            ("read + copy, then in place on the copy (copy=True)", lambda: (x.sum(), copy_then_mul())),
            ("[first-touch writes of a fresh anonymous mapping, for scale]", lambda: first_touch(size)),
        ]
        k = max(20, 20000 // (size // 4096))
        for what, fn in cycles:
            med, lo, hi = timed(fn, k)
            print("  %-62s %8.1f us/batch (min %.1f, max %.1f)" % (what, med, lo, hi))
        before = s.dropped_pages
        x[:] = 1
        t.mul_(2)
        x = t = cycles = None
        s.next()
        for _ in range(3 * s.slot_count):
            nb = s.next()
            if nb.slot == b.slot:
                break
        print("pages dropped when the written slot came back: %d of %d" % (s.dropped_pages - before, size // 4096))


if __name__ == "__main__":
    main()
