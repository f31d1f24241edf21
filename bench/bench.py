#!/usr/bin/python3
"""loaderd against PyTorch's DataLoader, doing the same work in the same run.

Generates two datasets with ld-gendata (many small files; one flat token file), warms
the page cache, starts one loaderd, then runs every configuration several times,
interleaved: loaderd read by a Python trainer through loaderclient, loaderd read by
`loaderctl read --touch`, and torch.utils.data.DataLoader at 0, 1 and 2 workers; plus,
for token windows, `loaderctl read` without --touch (the hand-off alone: no byte read)
(persistent, with a prefetch factor). Every trainer is a fresh process running the same
loop (`child_main`): epoch 0 untimed, then the timed epochs, every byte of every batch
read. Reported per configuration: median samples/s and its spread, CPU seconds per
1,000 samples of everything the side runs (daemon + trainer, or DataLoader's main
process + workers) and samples per CPU-second, peak RSS and PSS of the same processes.
Prints a table and writes bench/results/latest.{md,json} (bench/run.py gathers them into
the dated result file). What is measured and how is explained in bench/README.md.

Run with Debian's /usr/bin/python3 (numpy, torch). `make bench` runs it with no
arguments; pass arguments through the environment: `make bench BENCH_ARGS=--quick`.
"""

import argparse
import fnmatch
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
from measure import (  # noqa: E402  (bench/measure.py: process accounting, shared)
    MB, MIB, PSS_EVERY, REPO, ensure_system_python, fail, fmt,
    loaderctl_json, log, log_tail, machine_info, machine_line, median, pid_cpu_delta, read_proc_kib,
    reset_peak_rss, run_monitored, shm_loaderd_objects, socket_accepts, tail, tree_cpu, tree_pids)
from bench_report import add_ratios, console_table, render  # noqa: E402  (the tables of a run)

# 100M tokens (97,656 windows): three runs of five configurations stay within minutes
FULL = {"files": 100_000, "file_size": 3072, "classes": 100, "tokens": 100_000_000}
QUICK = {"files": 20_000, "file_size": 3072, "classes": 100, "tokens": 20_000_000}

CONTEXT = 1024          # tokens dataset: a sample is CONTEXT + 1 tokens
RECORDS_BATCH = 64
TOKENS_BATCH = 32
SEED = 0


# ---------------------------------------------------------------------------------------
# Small helpers


def list_files(root, pattern):
    """Sorted paths relative to root whose relative path matches pattern (fnmatch, as
    the daemon's `files` kind does: '*' also matches '/')."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if fnmatch.fnmatchcase(rel, pattern):
                out.append(rel)
    out.sort()
    return out


# ---------------------------------------------------------------------------------------
# Data generation and page cache

def generate(args, gendata):
    os.makedirs(args.data_dir, exist_ok=True)
    rec_dir = os.path.join(args.data_dir,
                           f"records-{args.files}x{args.file_size}-c{args.classes}")
    tok_file = os.path.join(args.data_dir, f"tokens-{args.tokens}.u16.bin")
    steps = [
        ("records", [gendata, "files", rec_dir, "--count", str(args.files),
                     "--size", str(args.file_size), "--classes", str(args.classes)]),
        ("tokens", [gendata, "tokens", tok_file, "--count", str(args.tokens),
                    "--dtype", "uint16"]),
    ]
    for name, cmd in steps:
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            fail(f"{shlex.join(cmd)} exited {r.returncode}:\n"
                 + r.stdout.decode(errors="replace")[-2000:])
        log(f"bench: {name} data ready in {time.perf_counter() - t0:.1f} s")
    files = list_files(rec_dir, "*.bin")
    if len(files) != args.files:
        fail(f"{rec_dir} holds {len(files)} *.bin files, expected {args.files}")
    size = os.path.getsize(tok_file)
    if size != 2 * args.tokens:
        fail(f"{tok_file} is {size} bytes, expected {2 * args.tokens}")
    return rec_dir, tok_file, files


def warm_page_cache(rec_dir, files, tok_file):
    """Reads every byte once so that every loader below reads from memory."""
    t0 = time.perf_counter()
    total = 0
    for rel in files:
        with open(os.path.join(rec_dir, rel), "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 16)
                if not b:
                    break
                total += len(b)
    with open(tok_file, "rb", buffering=0) as f:
        while True:
            b = f.read(16 << 20)
            if not b:
                break
            total += len(b)
    dt = time.perf_counter() - t0
    log(f"bench: page cache warmed: {total / MIB:.0f} MiB in {dt:.1f} s")
    return {"bytes": total, "seconds": dt}


# ---------------------------------------------------------------------------------------
# loaderd

def expected_samples(args, ds):
    """Samples in one epoch: a file each, or a window each (windows start every CONTEXT
    tokens and hold CONTEXT + 1)."""
    if ds == "records":
        return args.files
    return (args.tokens - (CONTEXT + 1)) // CONTEXT + 1


def write_config(path, sock, rec_dir, tok_file):
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    text = f"""# Written by bench/bench.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: 2
  memory_budget: 1GiB
  log_level: warn
datasets:
  records:
    kind: files
    path: {q(rec_dir)}
    pattern: "*.bin"
  tokens:
    kind: token_windows
    path: {q(tok_file)}
    dtype: uint16
    context: {CONTEXT}
"""
    with open(path, "w") as f:
        f.write(text)


class Daemon:
    """A loaderd for the whole of bench.py: started once, as it would be on a training
    node, and stopped with SIGTERM at the end (it must exit 0 and leave no shared
    memory). Start-up (scanning the files) is not timed."""

    def __init__(self, args, bins, rec_dir, tok_file, results_dir):
        self.args, self.bins = args, bins
        self.tmp = tempfile.mkdtemp(prefix="ld-bench-")
        self.sock = os.path.join(self.tmp, "loaderd.sock")
        self.cfg = os.path.join(results_dir, "bench.yaml")
        write_config(self.cfg, self.sock, rec_dir, tok_file)
        self.log_path = os.path.join(results_dir, "loaderd.log")
        self.shm_before = shm_loaderd_objects()
        self.proc = None
        self.info = {"errors": []}

    def err(self, msg):
        self.info["errors"].append(msg)
        log("bench: loaderd: " + msg)

    def start(self):
        with open(self.log_path, "wb") as lf:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen([self.bins["loaderd"], "--config", self.cfg], stdout=lf, stderr=lf,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.info["pid"] = self.proc.pid
        while True:
            if self.proc.poll() is not None:
                self.err(f"loaderd exited {self.proc.returncode} during start-up" + log_tail(self.log_path))
                return False
            if os.path.exists(self.sock) and socket_accepts(self.sock):
                break
            if time.perf_counter() - t0 > self.args.startup_timeout:
                self.err(f"socket {self.sock} not up after {self.args.startup_timeout:.0f} s")
                return False
            time.sleep(0.02)
        self.info["startup_s"] = time.perf_counter() - t0
        self.info["idle_rss_kib"] = read_proc_kib(self.proc.pid, "VmRSS")
        log(f"bench: loaderd up in {self.info['startup_s']:.2f} s (pid {self.proc.pid})")
        return True

    def status(self):
        try:
            return loaderctl_json(self.bins["loaderctl"], self.sock, "--json", "status")
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            self.err(f"status: {e}")
            return None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
            self.info["exit_code"] = rc
            if rc != 0:
                self.err(f"loaderd did not exit 0 on SIGTERM (exit {rc})" + log_tail(self.log_path))
        elif self.proc is not None:
            self.info["exit_code"] = self.proc.returncode
        if self.proc is not None:
            left = sorted(shm_loaderd_objects() - self.shm_before)
            ours = [n for n in left if f".{self.proc.pid}." in n]
            if ours:
                self.err("left in /dev/shm after a clean stop: " + ", ".join(ours))
            elif left:
                log("bench: warning: new loaderd.* objects in /dev/shm, not named with our "
                    "daemon's pid (another loaderd running?): " + ", ".join(left))
            self.info["shm_left"] = ours
        for path, rm in ((self.sock, os.unlink), (self.tmp, os.rmdir)):
            try:
                rm(path)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------
# The trainer process (child side): the same loop for DataLoader and for loaderd's
# Python client, so that both sides pay for the same consumer.

def consume(parts, how):
    """What the training loop does with a batch here, the same on both sides: read every
    byte of every tensor. "copy" (default) copies each tensor (`t.clone()`: what the host
    side of `.to(device)` or a pinned-memory copy does, at memory speed); "sum" adds up
    its elements (torch widens uint8 and int16 to int64; about 1 ns a byte in torch 1.13,
    more than the loaders' own cost per sample)."""
    if how == "sum":
        return sum(int(t.sum()) for t in parts)
    for t in parts:
        t.clone()
    return 0


def child_main(spec):
    """One run of one configuration, in a trainer process of its own: epoch 0 (warm-up:
    worker start, first touch of the ring), then the timed epochs back to back; the CPU
    of every process of that side is read at the start and at the end of the timed
    epochs. Prints one JSON line.

    spec: loader ("DataLoader" or "loaderd"), kind ("records": a directory of *.bin
    files in class folders; "tokens": a uint16 token file with windows of context + 1),
    path, context, batch_size, seed, epochs (epoch 0 + the timed ones), expect (samples
    per epoch), consume ("copy" or "sum"); DataLoader: workers, prefetch_factor;
    loaderd: socket, dataset (its name in the daemon), daemon_pid, lib (the client
    library), pkg (the directory holding the loaderclient package)."""
    import warnings
    import numpy as np
    import torch

    # Read-only buffers (bytes, a read-only memmap, the read-only ring mapping) give
    # tensors torch warns about once; nothing writes to them here.
    warnings.filterwarnings("ignore", message="The given (NumPy array|buffer) is not writable")
    torch.manual_seed(spec["seed"])
    epochs_total = spec["epochs"]
    roots = [os.getpid()] + ([spec["daemon_pid"]] if spec.get("daemon_pid") else [])

    if spec["loader"] == "DataLoader":
        from torch.utils.data import DataLoader, Dataset

        class FileDataset(Dataset):
            """A file per sample, read the way users write it; label = class folder index."""

            def __init__(self, root, pattern):
                self.root = root
                self.files = list_files(root, pattern)
                classes = sorted({f.split(os.sep, 1)[0] for f in self.files if os.sep in f})
                index = {c: i for i, c in enumerate(classes)}
                self.labels = [index.get(f.split(os.sep, 1)[0], 0) if os.sep in f else 0
                               for f in self.files]

            def __len__(self):
                return len(self.files)

            def __getitem__(self, i):
                with open(os.path.join(self.root, self.files[i]), "rb") as f:
                    data = f.read()
                return torch.frombuffer(data, dtype=torch.uint8), self.labels[i]

        class TokenWindows(Dataset):
            """Window i = tokens [i*context, i*context + context + 1), kept 2 bytes a token
            as loaderd delivers them (viewed as int16: torch 1.13 has no uint16)."""

            def __init__(self, path, context):
                self.path = path
                self.context = context
                n_tokens = os.path.getsize(path) // 2
                self.n = (n_tokens - (context + 1)) // context + 1 if n_tokens > context else 0
                self.data = None        # opened lazily, once per process (each worker)

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                if self.data is None:
                    self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
                s = i * self.context
                return torch.from_numpy(self.data[s:s + self.context + 1].view(np.int16))

        if spec["kind"] == "records":
            ds = FileDataset(spec["path"], "*.bin")
        else:
            ds = TokenWindows(spec["path"], spec["context"])
        kw = {}
        if spec["workers"] > 0:
            kw = {"persistent_workers": True, "prefetch_factor": spec["prefetch_factor"]}
        loader = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True,
                            num_workers=spec["workers"], **kw)
        samples_per_epoch, batches_per_epoch = len(ds), len(loader)

        def batches():
            for _ in range(epochs_total):
                for b in loader:
                    yield b, (b if isinstance(b, (list, tuple)) else [b])
                yield None, None        # end of epoch
    else:
        sys.path.insert(0, spec["pkg"])
        os.environ["LOADERCLIENT_LIB"] = spec["lib"]
        import loaderclient

        client = loaderclient.Client(spec["socket"])
        stream = client.open(spec["dataset"], spec["batch_size"], shuffle=True, seed=spec["seed"],
                             epochs=epochs_total)
        samples_per_epoch = batches_per_epoch = None

        def tensors(b):
            out = []
            for name in b.keys():
                a = b.numpy(name)
                if a.dtype == np.uint16:
                    a = a.view(np.int16)        # as the DataLoader side: same bytes, same dtype
                out.append(torch.from_numpy(a))
            return out

        def batches():
            # An epoch ends after its last batch is consumed, as on the DataLoader side
            # (not when the next epoch's first batch arrives).
            n = 0
            for b in stream:
                yield b, tensors(b)
                n += b.rows
                if n == spec["expect"]:
                    n = 0
                    yield None, None

    baseline_kib = read_proc_kib(os.getpid(), "VmRSS")
    epochs, cur = [], None
    checksum = 0
    cpu_at = {}
    t_mark = time.perf_counter()
    for b, parts in batches():
        if b is None:
            now = time.perf_counter()
            cur["seconds"] = now - t_mark
            epochs.append(cur)
            cur = None
            t_mark = now
            if len(epochs) == 1:
                cpu_at["start"] = (now, tree_cpu(roots))
            elif len(epochs) == epochs_total:
                cpu_at["end"] = (now, tree_cpu(roots))
            continue
        if cur is None:
            cur = {"epoch": len(epochs), "samples": 0, "batches": 0, "bytes": 0,
                   "first_batch_ms": (time.perf_counter() - t_mark) * 1000}
        checksum += consume(parts, spec["consume"])
        cur["samples"] += int(parts[0].shape[0])
        cur["bytes"] += sum(t.element_size() * t.numel() for t in parts)
        cur["batches"] += 1
    if spec["loader"] == "DataLoader":
        workers = [p for p in tree_pids(os.getpid()) if p != os.getpid()]
        del loader                      # shuts the persistent workers down; not timed
    else:
        workers = []
        stream.close()
        client.close()
    (t0, c0), (t1, c1) = cpu_at["start"], cpu_at["end"]
    self_pid = os.getpid()
    daemon = spec.get("daemon_pid")
    cpu = {"trainer": pid_cpu_delta(c0, c1, self_pid),
           "daemon": pid_cpu_delta(c0, c1, daemon) if daemon else 0.0,
           "workers": sum(pid_cpu_delta(c0, c1, p) for p in c1 if p not in (self_pid, daemon)),
           "processes_seen": len(c1)}
    cpu["total"] = cpu["trainer"] + cpu["daemon"] + cpu["workers"]
    print(json.dumps({"samples_per_epoch": samples_per_epoch or epochs[0]["samples"],
                      "batches_per_epoch": batches_per_epoch or epochs[0]["batches"],
                      "baseline_rss_kib": baseline_kib, "torch": torch.__version__,
                      "torch_threads": torch.get_num_threads(), "worker_pids": workers,
                      "timed_seconds": t1 - t0, "cpu_s": cpu, "checksum": checksum,
                      "epochs": epochs}))
    return 0


# ---------------------------------------------------------------------------------------
# One run of one configuration (parent side)

def run_trainer(args, ds, path, batch, loader, workers, results_dir, tag, daemon=None):
    """Runs one trainer process (DataLoader or loaderd's Python client) and returns its
    row, or None when it failed. Memory: the process tree (and the daemon) polled."""
    spec = {"loader": loader, "kind": ds, "dataset": ds, "path": path, "batch_size": batch, "workers": workers,
            "prefetch_factor": getattr(args, "prefetch_factor", 2), "context": CONTEXT, "seed": SEED,
            "epochs": 1 + args.timed_epochs, "expect": expected_samples(args, ds),
            "consume": getattr(args, "consume", "copy")}
    roots = []
    if daemon is not None:
        spec.update({"socket": daemon.sock, "daemon_pid": daemon.proc.pid,
                     "lib": os.path.join(args.build_abs, "lib", "libloaderclient.so"),
                     "pkg": os.path.join(REPO, "client", "python")})
        roots = [daemon.proc.pid]
        reset_peak_rss(daemon.proc.pid)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    out_p = os.path.join(results_dir, f"{tag}.json")
    err_p = os.path.join(results_dir, f"{tag}.err")
    code, pid, mem, wall = run_monitored(cmd, out_p, err_p, args.run_timeout, PSS_EVERY, extra_roots=roots)
    what = f"{loader} {ds} " + (f"num_workers={workers}" if loader == "DataLoader" else "(Python client)")
    if code != 0:
        log(f"bench: {what} exited {code}:\n{tail(err_p)}")
        return None
    try:
        with open(out_p) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        log(f"bench: {what}: unreadable output ({e})")
        return None
    want = expected_samples(args, ds)
    eps = res["epochs"]
    bad = [e["epoch"] for e in eps if e["samples"] != want]
    if len(eps) != spec["epochs"] or bad:
        # a loader that skips samples would look fast: that is a failure, not a result
        log(f"bench: {what}: {len(eps)} epochs, epochs {bad} did not deliver {want} samples")
        return None
    timed = eps[1:]
    n = sum(e["samples"] for e in timed)
    secs = sum(e["seconds"] for e in timed)
    cpu = res["cpu_s"]
    row = {
        "dataset": ds, "loader": "loaderd" if loader == "loaderd" else "DataLoader",
        "client": "python" if loader == "loaderd" else None,
        "workers": 2 if loader == "loaderd" else workers, "batch_size": batch,
        "samples_per_s": n / secs if secs > 0 else 0.0,
        "mb_per_s": sum(e["bytes"] for e in timed) / secs / MB if secs > 0 else 0.0,
        "epoch_samples_per_s": [e["samples"] / e["seconds"] for e in timed if e["seconds"] > 0],
        "timed_samples": n, "timed_seconds": secs,
        "cpu_s": cpu,
        "cpu_s_per_1000": cpu["total"] / n * 1000 if n else None,
        "first_batch_ms": eps[0]["first_batch_ms"],
        "epoch0_seconds": eps[0]["seconds"],
        "peak_rss_mib": mem.peak_rss_kib / 1024,
        "peak_pss_mib": mem.peak_pss_kib / 1024,
        "max_processes": mem.max_procs,
        "wall_s": wall,
        "child": res,
    }
    log(f"bench: {tag}: {row['samples_per_s']:,.0f} samples/s, "
        f"{fmt(row['cpu_s_per_1000'], '.3f')} CPU s / 1,000 samples, peak RSS {row['peak_rss_mib']:.0f} MiB, "
        f"PSS {row['peak_pss_mib']:.0f} MiB")
    return row


# Timed epochs of the hand-off row: its epochs are short (0.03 s of token windows), and
# its CPU covers epoch 0 too (ring pages touched the first time), so it reads more.
HANDOFF_TIMED_EPOCHS = 10


def run_loaderctl(args, ds, batch, daemon, results_dir, tag, touch=True):
    """loaderd read by `loaderctl read --touch` (the C client, every byte read): a
    reference for what the Python layer costs. CPU = daemon (/proc) + loaderctl (wait4's
    rusage) over the whole read, epoch 0 included (loaderctl is not stopped between
    epochs); samples/s over the timed epochs only. touch=False: the hand-off alone
    (batches announced, leased and given back, no byte read by the client), over
    HANDOFF_TIMED_EPOCHS timed epochs."""
    timed_epochs = args.timed_epochs if touch else max(args.timed_epochs, HANDOFF_TIMED_EPOCHS)
    reset_peak_rss(daemon.proc.pid)
    cmd = [daemon.bins["loaderctl"], "--socket", daemon.sock, "read", ds, "--epochs",
           str(1 + timed_epochs), "--batch-size", str(batch), "--seed", str(SEED), "--json"]
    if touch:
        cmd.insert(-1, "--touch")
    out_p = os.path.join(results_dir, f"{tag}.json")
    err_p = os.path.join(results_dir, f"{tag}.err")
    c0 = tree_cpu([daemon.proc.pid])
    code, pid, mem, wall = run_monitored(cmd, out_p, err_p, args.run_timeout, PSS_EVERY,
                                             extra_roots=[daemon.proc.pid])
    c1 = tree_cpu([daemon.proc.pid])
    ru = mem.rusage
    if code != 0:
        daemon.err(f"loaderctl read {ds} exited {code}: {tail(err_p).strip()}")
        return None
    try:
        with open(out_p) as f:
            res = json.load(f)
        eps = res["epochs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        daemon.err(f"loaderctl read {ds}: unreadable output ({e}): {tail(out_p, 3)}")
        return None
    want = expected_samples(args, ds)
    bad = [e["epoch"] for e in eps if e["samples"] != want]
    if len(eps) != 1 + timed_epochs or bad:
        daemon.err(f"loaderctl read {ds}: {len(eps)} epochs, epochs {bad} did not deliver {want} samples")
        return None
    timed = eps[1:]
    n = sum(e["samples"] for e in timed)
    secs = sum(e["seconds"] for e in timed)
    total_n = sum(e["samples"] for e in eps)
    cpu = {"daemon": pid_cpu_delta(c0, c1, daemon.proc.pid), "trainer": ru.ru_utime + ru.ru_stime, "workers": 0.0}
    cpu["total"] = cpu["daemon"] + cpu["trainer"]
    row = {
        "dataset": ds, "loader": "loaderd", "client": "C (loaderctl --touch)" if touch else "C (loaderctl, no touch)",
        "touch": touch, "workers": 2,
        "batch_size": batch,
        "samples_per_s": n / secs if secs > 0 else 0.0,
        "mb_per_s": sum(e["bytes"] for e in timed) / secs / MB if secs > 0 else 0.0,
        "epoch_samples_per_s": [e["samples"] / e["seconds"] for e in timed if e["seconds"] > 0],
        "timed_samples": n, "timed_seconds": secs,
        "cpu_s": cpu, "cpu_s_per_1000": cpu["total"] / total_n * 1000 if total_n else None,
        "cpu_includes_epoch0": True,
        "first_batch_ms": res.get("first_batch_ms"), "epoch0_seconds": eps[0]["seconds"],
        "peak_rss_mib": mem.peak_rss_kib / 1024, "peak_pss_mib": mem.peak_pss_kib / 1024,
        "max_processes": mem.max_procs, "wall_s": wall, "loaderctl": res,
    }
    log(f"bench: {tag}: {row['samples_per_s']:,.0f} samples/s, "
        f"{fmt(row['cpu_s_per_1000'], '.3f')} CPU s / 1,000 samples")
    return row


def run_dataloader(args, ds, path, batch, workers, results_dir, runs=1):
    """DataLoader rows for other benchmarks (bench_cache.py): `runs` runs of one
    configuration, as bench.py measures its own, summarised like its rows."""
    ns = argparse.Namespace(**vars(args))
    for k, v in (("timed_epochs", 3), ("prefetch_factor", 4), ("run_timeout", 600.0)):
        if not hasattr(ns, k):
            setattr(ns, k, v)
    got = [run_trainer(ns, ds, path, batch, "DataLoader", workers, results_dir,
                       f"dataloader-{ds}-w{workers}-run{i + 1}") for i in range(runs)]
    got = [r for r in got if r is not None]
    return summarize_runs(got) if got else None


def summarize_runs(runs):
    """One row from several runs of a configuration: medians, the spread (min–max) of
    samples/s, and every run kept under "runs"."""
    first = runs[0]
    sps = [r["samples_per_s"] for r in runs]
    cpu = [r["cpu_s_per_1000"] for r in runs if r["cpu_s_per_1000"] is not None]
    row = {k: first[k] for k in ("dataset", "loader", "client", "workers", "batch_size")}
    row["touch"] = first.get("touch", True)
    row.update({
        "samples_per_s": median(sps), "samples_per_s_min": min(sps), "samples_per_s_max": max(sps),
        "mb_per_s": median([r["mb_per_s"] for r in runs]),
        "cpu_s_per_1000": median(cpu) if cpu else None,
        "cpu_s_per_1000_min": min(cpu) if cpu else None, "cpu_s_per_1000_max": max(cpu) if cpu else None,
        "cpu_split_s_per_1000": {k: median([r["cpu_s"][k] / r["timed_samples"] * 1000 for r in runs])
                                 for k in ("trainer", "daemon", "workers")},
        "first_batch_ms": median([r["first_batch_ms"] for r in runs if r["first_batch_ms"] is not None]),
        "peak_rss_mib": median([r["peak_rss_mib"] for r in runs]),
        "peak_pss_mib": median([r["peak_pss_mib"] for r in runs]),
        "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        "peak_pss_mib_max": max(r["peak_pss_mib"] for r in runs),
        "cpu_includes_epoch0": first.get("cpu_includes_epoch0", False),
        "partial": False, "n_runs": len(runs), "runs": runs,
    })
    c = row["cpu_s_per_1000"]
    row["samples_per_cpu_s"] = 1000 / c if c else None
    return row


# ---------------------------------------------------------------------------------------
# Main

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="loaderd vs PyTorch DataLoader (see bench/README.md). Extra arguments "
                    "may also come from the BENCH_ARGS environment variable.")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller data: {QUICK['files']:,} files, {QUICK['tokens']:,} tokens; 1 run")
    p.add_argument("--files", type=int, help=f"number of record files (default {FULL['files']:,})")
    p.add_argument("--file-size", type=int, help="bytes per record file (default 3072)")
    p.add_argument("--classes", type=int, help="class folders (default 100)")
    p.add_argument("--tokens", type=int, help=f"uint16 tokens in the token file (default {FULL['tokens']:,})")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"),
                   help="where bin/loaderd, bin/loaderctl, bin/ld-gendata, lib/libloaderclient.so are "
                        "(default build, relative to the repository)")
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", default="0,1,2",
                   help="DataLoader num_workers values to measure (default 0,1,2)")
    p.add_argument("--prefetch-factor", type=int, default=4,
                   help="DataLoader prefetch_factor with workers (default 4; torch's default is 2)")
    p.add_argument("--runs", type=int, help="runs of every configuration (default 3; --quick: 1)")
    p.add_argument("--timed-epochs", type=int, default=3,
                   help="timed epochs per run, after an untimed epoch 0 (default 3)")
    p.add_argument("--consume", choices=("copy", "sum"), default="copy",
                   help="how the trainer reads every byte of a batch, on both sides: copy each tensor "
                        "(default) or sum its elements")
    p.add_argument("--no-c-client", action="store_true", help="skip the loaderctl rows (--touch, and the hand-off)")
    p.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds to wait for loaderd's socket")
    p.add_argument("--run-timeout", type=float, default=300.0,
                   help="seconds allowed for one run of one configuration")
    p.add_argument("--skip-loaderd", action="store_true", help="DataLoader rows only")
    p.add_argument("--skip-torch", action="store_true", help="loaderd rows only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    base = QUICK if a.quick else FULL
    for k in ("files", "file_size", "classes", "tokens"):
        if getattr(a, k) is None:
            setattr(a, k, base[k])
    if a.runs is None:
        a.runs = 1 if a.quick else 3
    if a.files < 1 or a.file_size < 1 or a.classes < 1 or a.tokens < 2 * (CONTEXT + 1):
        p.error("--files, --file-size and --classes must be >= 1, --tokens >= 2 windows")
    try:
        a.workers = [int(w) for w in a.workers.split(",") if w.strip() != ""]
    except ValueError:
        p.error("--workers: a comma-separated list of integers")
    if a.runs < 1 or a.timed_epochs < 1 or a.prefetch_factor < 1:
        p.error("--runs, --timed-epochs and --prefetch-factor must be at least 1")
    return a


def run_floor(args, rec_dir, tok_file, failures):
    """The floor of each workload on one core (bench/ld-copyfloor.c): a file opened, read
    and closed per sample, a window copied from the mapped token file per sample. None
    when the program is not built."""
    prog = os.path.join(args.build_abs, "bin", "ld-copyfloor")
    if not os.access(prog, os.X_OK):
        failures.append(f"{prog} not found: the floor is not measured (make all builds it)")
        return None
    out = {}
    for ds, cmd in (("records", [prog, "files", rec_dir, "--batch", str(RECORDS_BATCH), "--json"]),
                    ("tokens", [prog, "windows", tok_file, "--context", str(CONTEXT), "--dtype-bytes", "2",
                                "--batch", str(TOKENS_BATCH), "--json"])):
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=300)
        except subprocess.TimeoutExpired:
            failures.append(f"ld-copyfloor {ds} ran past 300 s")
            continue
        if r.returncode != 0:
            failures.append(f"ld-copyfloor {ds} exited {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
            continue
        out[ds] = {**json.loads(r.stdout), "command": " ".join(shlex.quote(c) for c in cmd)}
    return out


def main():
    argv = sys.argv[1:]
    if "--child" not in argv:
        argv = shlex.split(os.environ.get("BENCH_ARGS", "")) + argv
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    # A SIGTERM (timeout, CI cancel) unwinds like Ctrl-C, so that the finally clauses stop
    # loaderd and the trainer process groups instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    ensure_system_python()

    build = args.build_dir if os.path.isabs(args.build_dir) else os.path.join(REPO, args.build_dir)
    args.build_abs = build
    bins = {n: os.path.join(build, "bin", n) for n in ("loaderd", "loaderctl", "ld-gendata")}
    need = ["ld-gendata"] + ([] if args.skip_loaderd else ["loaderd", "loaderctl"])
    for n in need:
        if not os.access(bins[n], os.X_OK):
            fail(f"{bins[n]} not found: build first (make all)")
    args.data_dir = os.path.abspath(args.data_dir)
    args.results_dir = os.path.abspath(args.results_dir)
    raw_dir = os.path.join(args.results_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    t_start = time.perf_counter()

    rec_dir, tok_file, files = generate(args, bins["ld-gendata"])
    warm = warm_page_cache(rec_dir, files, tok_file)

    configs = []            # (dataset, path, batch, loader, workers)
    for ds, path, batch in (("records", rec_dir, RECORDS_BATCH), ("tokens", tok_file, TOKENS_BATCH)):
        if not args.skip_loaderd:
            configs.append((ds, path, batch, "loaderd", 2))
            if not args.no_c_client:
                configs.append((ds, path, batch, "loaderctl", 2))
                if ds == "tokens":
                    configs.append((ds, path, batch, "handoff", 2))
        if not args.skip_torch:
            configs += [(ds, path, batch, "DataLoader", w) for w in args.workers]

    failures, runs = [], {c: [] for c in configs}
    daemon = None
    try:
        if not args.skip_loaderd:
            daemon = Daemon(args, bins, rec_dir, tok_file, raw_dir)
            if not daemon.start():
                configs = [c for c in configs if c[3] == "DataLoader"]
        # Interleaved: run 1 of every configuration, then run 2, ..., so that a slow phase of
        # a shared machine spreads over all of them instead of hitting one.
        for i in range(args.runs):
            for c in configs:
                ds, path, batch, loader, w = c
                tag = f"{ds}-{loader}" + (f"-w{w}" if loader == "DataLoader" else "") + f"-run{i + 1}"
                if loader in ("loaderctl", "handoff"):
                    r = run_loaderctl(args, ds, batch, daemon, raw_dir, tag, touch=loader == "loaderctl")
                else:
                    r = run_trainer(args, ds, path, batch, loader, w, raw_dir, tag,
                                    daemon if loader == "loaderd" else None)
                if r is None:
                    failures.append(f"{tag} failed")
                else:
                    if loader == "DataLoader" and w:
                        r["prefetch_factor"] = args.prefetch_factor
                    runs[c].append(r)
        if daemon is not None and daemon.proc is not None and daemon.proc.poll() is None:
            daemon.info["status_end"] = daemon.status()
    finally:
        if daemon is not None:
            daemon.stop()
            failures.extend("loaderd: " + e for e in daemon.info["errors"])
    floor = run_floor(args, rec_dir, tok_file, failures)

    rows = []
    for c in configs:
        if runs[c]:
            row = summarize_runs(runs[c])
            row["prefetch_factor"] = runs[c][0].get("prefetch_factor")
            rows.append(row)
    add_ratios(rows)

    meta = {
        "machine": machine_info([r for c in configs for r in runs[c]]),
        "command": " ".join(([f"BENCH_ARGS={shlex.quote(os.environ['BENCH_ARGS'])}"] if os.environ.get("BENCH_ARGS")
                             else []) + ["/usr/bin/python3 bench/bench.py"] + [shlex.quote(x) for x in sys.argv[1:]]),
        "params": {"quick": args.quick, "files": args.files, "file_size": args.file_size,
                   "classes": args.classes, "tokens": args.tokens, "context": CONTEXT,
                   "records_batch": RECORDS_BATCH, "tokens_batch": TOKENS_BATCH,
                   "runs": args.runs, "timed_epochs": args.timed_epochs,
                   "prefetch_factor": args.prefetch_factor, "workers": args.workers, "seed": SEED,
                   "consume": args.consume,
                   "daemon_workers": 2, "build_dir": args.build_dir},
        "page_cache_warm": warm,
        "floor": floor,
        "loaderd": daemon.info if daemon is not None else None,
        "seconds": time.perf_counter() - t_start,
        "failures": failures,
    }
    md = render(rows, meta)
    with open(os.path.join(args.results_dir, "latest.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.results_dir, "latest.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
        f.write("\n")
    sys.stderr.flush()
    print()
    print(machine_line(meta["machine"]))
    print(console_table(rows))
    print(f"results: {os.path.join(args.results_dir, 'latest.md')}, latest.json", flush=True)
    if failures:
        log("bench: FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
