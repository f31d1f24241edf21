"""The benchmark's own instruments (bench/bench.py, bench/measure.py, bench/ld-imgfloor.c), checked on small
data: both sides of the comparison must do the same work, and what they cost must be
counted for every process they run. A benchmark that quietly skips work on one side or
misses a process's CPU reports a ratio that nobody can reproduce.
"""
import json
import os
import subprocess
import sys
import time

import pytest

import support
from conftest import REC, TOK

BENCH = os.path.join(support.REPO, "bench", "bench.py")
sys.path.insert(0, os.path.dirname(BENCH))
import bench  # noqa: E402
import measure  # noqa: E402

pytest.importorskip("torch")


def trainer(spec, timeout=120):
    """bench.py's trainer process (`--child`), as `make bench` runs it; its JSON line."""
    r = subprocess.run([sys.executable, BENCH, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def specs(daemon, data_dir, kind, dataset, path, batch, expect, context=0):
    base = {"kind": kind, "path": path, "context": context, "batch_size": batch, "seed": 0, "epochs": 3,
            "expect": expect, "consume": "sum"}
    lib = os.environ.get("LOADERCLIENT_LIB", os.path.join(support.REPO, "build", "lib", "libloaderclient.so"))
    return [
        dict(base, loader="DataLoader", workers=1, prefetch_factor=2),
        dict(base, loader="loaderd", dataset=dataset, socket=daemon.socket, daemon_pid=daemon.pid,
             lib=os.path.abspath(lib), pkg=os.path.join(support.REPO, "client", "python")),
    ]


@pytest.mark.parametrize("kind", ["records", "tokens"])
def test_both_sides_read_the_same_bytes(daemon, data_dir, kind):
    """DataLoader (one worker) and loaderd deliver every sample of every epoch and the
    trainer reads all of it: the sums over all bytes (data and labels, in the dtype each side hands to the
    trainer) agree. A side that converted token windows to int64 alone (the ids go above
    32767, so their int16 view sums differently), or that skipped or repeated samples,
    would not."""
    if kind == "records":
        n = REC["n"]
        ss = specs(daemon, data_dir, "records", "rec", os.path.join(data_dir, "rec"), 64, n)
    else:
        n = (TOK["n"] - (TOK["context"] + 1)) // TOK["context"] + 1
        ss = specs(daemon, data_dir, "tokens", "tok", os.path.join(data_dir, "tok.bin"), 32, n,
                   context=TOK["context"])
    results = [trainer(s) for s in ss]
    for s, r in zip(ss, results):
        what = "%s workers=%s" % (s["loader"], s.get("workers"))
        assert [e["samples"] for e in r["epochs"]] == [n] * 3, what
        assert r["cpu_s"]["total"] > 0, what
    # the same data in every epoch, so each side's sum is 3 x one epoch's
    assert len({r["checksum"] for r in results}) == 1, [r["checksum"] for r in results]
    assert results[0]["checksum"] != 0
    dl1, ld = results
    # the worker's and the daemon's CPU are counted, not only the trainer's
    assert dl1["cpu_s"]["workers"] > 0 and len(dl1["worker_pids"]) == 1
    assert ld["cpu_s"]["daemon"] > 0


def test_cpu_seconds_counts_children_and_threads():
    """tree_cpu and cpu_delta see the CPU that a child process and a thread that has
    ended burned."""
    burn = ("import os, threading, time\n"
            "def spin():\n"
            "    t = time.process_time()\n"
            "    while time.process_time() - t < 0.3: pass\n"
            "if os.fork() == 0:\n"
            "    spin(); time.sleep(5); os._exit(0)\n"
            "th = threading.Thread(target=spin); th.start(); th.join()\n"
            "print('ready', flush=True); time.sleep(5)\n")
    p = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 10
        while True:
            c = measure.tree_cpu([p.pid])
            if len(c) == 2 and measure.cpu_delta({}, c) >= 0.5 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(c) == 2, c                       # the process and its child
        # 0.3 s in a thread that has ended + 0.3 s in the child
        assert measure.cpu_delta({}, c) >= 0.5, c
        # nothing runs now: a second snapshot adds (almost) nothing
        assert measure.cpu_delta(c, measure.tree_cpu([p.pid])) < 0.05
    finally:
        p.kill()
        p.wait()


def test_summary_is_median_and_spread():
    runs = [{"dataset": "records", "loader": "DataLoader", "client": None, "workers": 0, "batch_size": 64,
             "samples_per_s": v, "mb_per_s": v / 10, "cpu_s_per_1000": c, "timed_samples": 1000,
             "cpu_s": {"trainer": c, "daemon": 0.0, "workers": 0.0, "total": c}, "first_batch_ms": 1.0,
             "peak_rss_mib": 100.0, "peak_pss_mib": 50.0}
            for v, c in ((300.0, 0.5), (100.0, 2.0), (200.0, 1.0), (400.0, 0.25))]
    row = bench.summarize_runs(runs)
    assert row["samples_per_s"] == 250.0                     # median of an even count
    assert (row["samples_per_s_min"], row["samples_per_s_max"]) == (100.0, 400.0)
    assert row["cpu_s_per_1000"] == 0.75
    assert row["samples_per_cpu_s"] == pytest.approx(1000 / 0.75)
    assert row["n_runs"] == 4 and len(row["runs"]) == 4


def test_image_floor_decodes_only_the_crop(scratch):
    """ld-imgfloor's floor is the daemon's crop path: the same images, fewer pixels decoded
    than the whole-image decode PIL does, at most as many as the full decode per image."""
    loaderd, _ = support.binaries()
    bindir = os.path.dirname(loaderd)
    genimages, imgfloor = os.path.join(bindir, "ld-genimages"), os.path.join(bindir, "ld-imgfloor")
    if not (os.access(genimages, os.X_OK) and os.access(imgfloor, os.X_OK)):
        pytest.skip("ld-genimages / ld-imgfloor not built next to %s" % loaderd)
    d = str(scratch / "img")
    subprocess.run([genimages, d, "--count", "24", "--classes", "2", "--min", "256", "--max", "500"],
                   check=True, stdout=subprocess.DEVNULL, timeout=60)
    def floor(*extra):
        r = subprocess.run([imgfloor, d, "--size", "64", "--json", *extra], stdout=subprocess.PIPE, check=True,
                           timeout=60)
        res = json.loads(r.stdout)
        assert res["floor_mode"] == "crop" and res["images"] == 24
        assert set(res["modes"]) == {"decode", "decode_resize", "crop"}
        return res["modes"]

    modes = floor()
    full, crop = modes["decode"], modes["crop"]
    assert full["mean_decoded_megapixels"] == pytest.approx(full["mean_src_megapixels"])
    # the daemon's default: full-size DCT, only the region around the crop decoded
    assert crop["mean_decoded_megapixels"] < full["mean_decoded_megapixels"]
    assert crop["scales"]["1/1"] == 24
    # with decode.dct_scaling, as the daemon plans it: a 64 x 64 output from 256-500 px
    # images lets some crops be decoded at a reduced scale
    scaled = floor("--dct-scaling")["crop"]
    assert sum(scaled["scales"][k] for k in ("1/2", "1/4", "1/8")) > 0
    assert sum(scaled["scales"].values()) == 24
    assert scaled["mean_decoded_megapixels"] < crop["mean_decoded_megapixels"]


def test_result_file_names_no_path_of_this_machine():
    """bench/run.py writes the committed result file with the repository and the temporary
    directory made neutral: nothing in it says where the run happened."""
    import tempfile
    repo = support.REPO
    res = {"dir": os.path.join(repo, "bench", "data", "images-10000"), "n": 3,
           "runs": [{"socket": os.path.join(tempfile.gettempdir(), "ld-bench-x", "s.sock")}],
           "text": "built in %s" % repo}
    out = measure.scrub(res, measure.path_subs())
    assert out == {"dir": "bench/data/images-10000", "n": 3, "runs": [{"socket": "$TMPDIR/ld-bench-x/s.sock"}],
                   "text": "built in ."}
    assert repo not in json.dumps(out)


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a GPU is present: make bench measures it")
def test_gpu_section_skips_without_a_gpu(scratch):
    """make bench's GPU section says "no GPU: skipped", and why, where there is none: with
    a CUDA build (the probe finds no driver) and with a build that has no CUDA at all."""
    import run
    build = os.path.dirname(os.path.dirname(os.path.abspath(os.environ.get(
        "LOADERCLIENT_LIB", os.path.join(support.REPO, "build", "lib", "libloaderclient.so")))))
    res, md = run.gpu_section(build)
    assert res["skipped"].startswith("no GPU: ")
    assert md.startswith("## GPU") and "no GPU: skipped (" in md
    if os.path.exists(os.path.join(build, "bin", "ld-gpu-check")):
        assert "no NVIDIA driver" in res["skipped"]
    res, md = run.gpu_section(scratch)
    assert res == {"skipped": "no GPU: no ld-gpu-check in the build (built without CUDA)"}


def test_dated_results_name_no_path_of_this_machine(scratch):
    """measure.write_results (bench_cold, bench_peers): this run's files as they are, and
    the dated copy to commit with the machine's paths made neutral."""
    res = {"data": os.path.join(support.REPO, "bench", "data", "cold-5000x3072-c100"), "n": 1}
    dated = measure.write_results(scratch, "cold", res, "read %s\n" % support.REPO)
    assert dated.endswith(measure.host_label() + "-cold") and dated.startswith("20")
    with open(os.path.join(scratch, "cold.json")) as f:
        assert json.load(f) == res
    with open(os.path.join(scratch, dated + ".json")) as f:
        assert json.load(f) == {"data": "bench/data/cold-5000x3072-c100", "n": 1}
    with open(os.path.join(scratch, dated + ".md")) as f:
        assert f.read() == "read .\n"


def test_report_files_and_printed_table(scratch, capsys):
    """measure.write_report (bench_fair, bench_share): stem.json and stem.md where run.py
    gathers them, and the Markdown printed as written."""
    res = {"summary": {"light_kept": 0.5}}
    measure.write_report(scratch, "fair", res, ["## Fairness", "", "| a | b |"])
    with open(os.path.join(scratch, "fair.json")) as f:
        assert json.load(f) == res
    with open(os.path.join(scratch, "fair.md")) as f:
        assert f.read() == "## Fairness\n\n| a | b |\n"
    assert capsys.readouterr().out == "## Fairness\n\n| a | b |\n"


def test_thread_cpu_seconds_counts_named_threads_only():
    """measure.thread_cpu_seconds (bench_fair's workers' CPU time): the run time of the
    threads whose name has the prefix, none of the others'."""
    with open("/proc/self/comm") as f:
        me = f.read().strip()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.05:
        pass
    assert measure.thread_cpu_seconds(os.getpid(), me) >= 0.05
    assert measure.thread_cpu_seconds(os.getpid(), "no-such-thread-") == 0


def test_device_benchmark_skips_without_a_gpu(scratch):
    """bench_device.py (make bench's device stage vs DataLoader(pin_memory=True)) where
    torch has no CUDA: it says why, skips, exits 0 and writes its result files saying so,
    without generating data or starting a daemon."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: make bench measures it")
    script = os.path.join(support.REPO, "bench", "bench_device.py")
    env = dict(os.environ, BENCH_ARGS="", BENCH_DEVICE_ARGS="")
    r = subprocess.run([sys.executable, script, "--results-dir", str(scratch)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "no GPU" in r.stderr and "skipping" in r.stderr
    with open(os.path.join(scratch, "device.json")) as f:
        res = json.load(f)
    assert "CUDA" in res["skipped"] or "torch" in res["skipped"]
    with open(os.path.join(scratch, "device.md")) as f:
        md = f.read()
    assert md.startswith("# Device stage vs DataLoader(pin_memory=True)") and "no GPU: skipped (" in md
    assert not os.path.exists(os.path.join(scratch, "device-raw"))



def test_client_shim_times_the_library_or_answers_with_batches_in_hand(daemon):
    """bench_python's ld-clientshim (bench/ld-clientshim.c), which the extension calls in
    place of the library while the per-batch cost is measured: timing, it passes the
    library's answers through and adds up the time spent in it; holding batches, it
    answers with them in turn, described as the library describes them, and releases
    nothing (the time added up stays)."""
    import ctypes
    import loaderclient
    from loaderclient import _lib
    P = ctypes.c_void_p
    path = os.path.join(os.path.dirname(os.path.dirname(support.binaries()[0])), "lib", "ld-clientshim.so")
    so = ctypes.CDLL(path)
    so.ld_shim_set.argtypes = [P, P, P, P]
    so.ld_shim_hold.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
    so.ld_shim_times.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2
    so.ld_shim_probe.argtypes = [ctypes.c_size_t] + [ctypes.POINTER(ctypes.c_double)] * 2
    so.ld_shim_next.argtypes = [P, ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(_lib.LcBatchInfo), ctypes.c_size_t]
    so.ld_shim_release.argtypes = [P]
    so.ld_shim_next_batch.argtypes = [P, ctypes.c_int, ctypes.POINTER(P)]
    so.ld_shim_set(*_lib.library_functions(), ctypes.cast(_lib.lib.lc_batch_describe_sized, P).value,
                   ctypes.cast(_lib.lib.lc_stream_next, P).value)

    def times():
        w, c = ctypes.c_uint64(), ctypes.c_uint64()
        so.ld_shim_times(ctypes.byref(w), ctypes.byref(c))
        return w.value, c.value

    bp, info = P(), _lib.LcBatchInfo()

    def take(h):
        assert so.ld_shim_next(h, 5000, ctypes.byref(bp), ctypes.byref(info), ctypes.sizeof(info)) == 0
        return bp.value, info.index, info.rows

    with loaderclient.Client(daemon.socket, timeout=10) as c:
        s = c.open("rec", 10, prefetch=2, auto_release=False)
        so.ld_shim_reset()
        first, i0, rows = take(s._h)
        second, i1, _ = take(s._h)
        assert (i0, i1, rows) == (0, 1, 10) and first != second
        w, cpu = times()
        assert w > 0 and cpu > 0
        held = (P * 2)(first, second)
        assert so.ld_shim_hold(held, 2) == 0
        assert [take(s._h)[:2] for _ in range(4)] == [(first, 0), (second, 1)] * 2
        assert so.ld_shim_next_batch(s._h, 0, ctypes.byref(bp)) == 0 and bp.value == first
        assert so.ld_shim_release(first) == 0 and times() == (w, cpu)
        assert so.ld_shim_hold((P * 65)(), 65) == -1          # more than it holds
        assert so.ld_shim_hold(held, 0) == 0
        assert so.ld_shim_release(first) == 0 and so.ld_shim_release(second) == 0
        assert times()[0] > w
        w = times()[0]
        assert so.ld_shim_next_batch(s._h, 5000, ctypes.byref(bp)) == 0     # lc_stream_next, timed
        assert _lib.lib.lc_batch_index(bp.value) == 2 and times()[0] > w   # the stream's next batch
        assert so.ld_shim_release(bp.value) == 0
        w = times()[0]
        pw, pc = ctypes.c_double(), ctypes.c_double()
        so.ld_shim_probe(1000, ctypes.byref(pw), ctypes.byref(pc))
        assert 0 <= pw.value < 100e3 and 0 <= pc.value < 100e3 and times()[0] == w   # ns; the sums kept
        s.close()
