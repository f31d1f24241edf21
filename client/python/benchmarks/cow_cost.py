"""What writable (copy-on-write) slot mappings cost per batch.

    LOADERCLIENT_LIB=build/lib/libloaderclient.so /usr/bin/python3 client/python/benchmarks/cow_cost.py

Starts a loaderd of its own (build/bin/loaderd, or $LOADERD_BIN) on a generated `files`
dataset of 16 KiB samples, reads batches of 64 (1 MiB) and prints, per batch:
  - the work this package adds before a slot shows its next batch: the pagemap read of a
    batch nobody wrote, and of one whose every page was written (plus the madvise);
  - a consumer that reads every byte (x.sum()), writes in place (numpy x *= 3, torch
    t.mul_(3)), or computes out of place (x * 3: a new array), each over whole epochs.
The in-place figures include the page copies the kernel makes on the first write of each
page (the price of a private copy) and the re-faults after the drop.
"""
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
from loaderclient import client as lcc  # noqa: E402

N, SIZE, BATCH, ROUNDS = 2048, 16384, 64, 5


def per_batch(stream, work, batches):
    t0 = time.perf_counter()
    for _ in range(batches):
        work(stream.next())
    return (time.perf_counter() - t0) / batches * 1e6


def main():
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


def run(dm):
    import torch
    with loaderclient.Client(dm.socket, timeout=30) as c, c.open("big", BATCH, seed=1, prefetch=8) as s:
        b = s.next()
        size = s._alias_len
        addr = b._state.addr
        x = b["data"]
        x.sum()
        # The drop step alone, on this slot's mapping.
        k = 2000
        t0 = time.perf_counter()
        for _ in range(k):
            lcc._drop_written(addr, size)
        clean = (time.perf_counter() - t0) / k * 1e6
        dirty = []
        for _ in range(50):
            x[:] = 1                                   # every page a private copy
            t0 = time.perf_counter()
            lcc._drop_written(addr, size)
            dirty.append(time.perf_counter() - t0)
        dirty_us = statistics.median(dirty) * 1e6
        del x
        print("slot mapping: %d KiB (%d pages), batch %d x %d B" % (size // 1024, size // 4096, BATCH, SIZE))
        print("drop step, nothing written:   %6.1f us/batch" % clean)
        print("drop step, every page written: %6.1f us/batch (pagemap read + madvise)" % dirty_us)

        works = {
            "read every byte (x.sum())": lambda b: b["data"].sum(),
            "numpy in place (x *= 3)": lambda b: np.multiply(b["data"], 3, out=b["data"]),
            "torch in place (t.mul_(3))": lambda b: b.torch("data").mul_(3),
            "out of place (y = x * 3)": lambda b: b["data"] * 3,
        }
        batches = 2 * N // BATCH
        res = {w: [] for w in works}
        for _ in range(ROUNDS):
            for w, fn in works.items():
                res[w].append(per_batch(s, fn, batches))
        for w, v in res.items():
            print("%-28s %7.1f us/batch (median of %d x %d batches, min %.1f max %.1f)"
                  % (w, statistics.median(v), ROUNDS, batches, min(v), max(v)))
        print("pages dropped: %d" % s.dropped_pages)
        del torch


if __name__ == "__main__":
    main()
