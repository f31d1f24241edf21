#!/usr/bin/python3
"""loaderd against PyTorch's DataLoader, doing the same work in the same run.

Generates two datasets with ld-gendata (many small files; one flat token file), warms
the page cache, then reads each dataset with `loaderctl read` against a running loaderd
and with torch.utils.data.DataLoader at 0, 1 and 2 workers, each DataLoader
configuration in its own process so that the peak memory of its process tree can be
measured. Prints a table and writes bench/results/latest.{md,json}. What is measured
and how is explained in bench/README.md.

Run with Debian's /usr/bin/python3 (numpy, torch). `make bench` runs it with no
arguments; pass arguments through the environment: `make bench BENCH_ARGS=--quick`.
"""

import argparse
import datetime
import fnmatch
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SYSTEM_PYTHON = "/usr/bin/python3"

FULL = {"files": 100_000, "file_size": 3072, "classes": 100, "tokens": 200_000_000}
QUICK = {"files": 20_000, "file_size": 3072, "classes": 100, "tokens": 20_000_000}

CONTEXT = 1024          # tokens dataset: a sample is CONTEXT + 1 tokens
RECORDS_BATCH = 64
TOKENS_BATCH = 32
SEED = 0
POLL_S = 0.05           # memory sampling period (VmRSS)
PSS_EVERY = 4           # PSS every 4th sample only: reading smaps_rollup costs ~1 ms for a
                        # process with torch loaded or the token file mapped, and takes its
                        # mmap lock, which the measured process's page faults also need
MB = 1e6                # MB/s is decimal megabytes, computed the same way for every row
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------
# Small helpers

def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fail(msg):
    log("bench: error: " + msg)
    sys.exit(1)


def read_proc_kib(pid, field, fname="status"):
    """A `Field:   1234 kB` value of /proc/PID/{status,smaps_rollup} in KiB, or None."""
    try:
        with open(f"/proc/{pid}/{fname}", "rb") as f:
            for line in f:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_status(pid):
    """VmRSS and VmHWM of /proc/PID/status in KiB (0 when gone). VmHWM is the peak of this
    process image: a fresh count after exec, unlike wait4's ru_maxrss, which also holds
    the RSS of the process that spawned it (here, this Python)."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss, hwm


def tree_pids(root):
    """root and all its descendants, found through /proc/PID/task/TID/children."""
    out, i = [root], 0
    while i < len(out):
        pid = out[i]
        i += 1
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split() if int(c) not in out)
            except (OSError, ValueError):
                pass
    return out


class TreeMemory:
    """Peak over time of the summed VmRSS (and PSS) of some process trees.

    Summed VmRSS counts a page shared by several processes (library code, shared memory,
    pages a forked worker still shares with its parent) once per process: it is an upper
    bound, and the measure the task asks for. PSS divides each shared page among its
    sharers, so summed PSS is the tree's actual footprint; both are kept."""

    def __init__(self, roots, pss_every):
        self.roots = list(roots)
        self.pss_every = pss_every
        self.peak_rss_kib = 0
        self.peak_pss_kib = 0
        self.max_procs = 0
        self.samples = 0
        self.hwm_kib = {}           # pid -> largest VmHWM seen

    def sample(self):
        pids = []
        for r in self.roots:
            pids.extend(p for p in tree_pids(r) if p not in pids)
        rss = 0
        for p in pids:
            r, h = read_status(p)
            rss += r
            self.hwm_kib[p] = max(self.hwm_kib.get(p, 0), h)
        self.peak_rss_kib = max(self.peak_rss_kib, rss)
        if self.pss_every and self.samples % self.pss_every == 0:
            pss = sum(read_proc_kib(p, "Pss", "smaps_rollup") or 0 for p in pids)
            self.peak_pss_kib = max(self.peak_pss_kib, pss)
        self.max_procs = max(self.max_procs, len(pids))
        self.samples += 1


def run_monitored(cmd, out_path, err_path, timeout_s, pss_every, extra_roots=(), env=None):
    """Runs cmd in its own session, sampling the memory of its tree (and of extra_roots)
    every POLL_S. Returns (exit code, pid, TreeMemory, wall seconds).
    Past timeout_s the command's process group is killed and the code is -SIGKILL."""
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    mem = TreeMemory([proc.pid, *extra_roots], pss_every)
    status, killed = None, False
    try:
        while True:
            mem.sample()
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.perf_counter() - t0 > timeout_s and not killed:
                log(f"bench: {os.path.basename(cmd[0])} ran past {timeout_s:.0f} s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            time.sleep(POLL_S)
    except BaseException:
        # Interrupted: take the child's process group (its workers) down with us.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
        except OSError:
            pass
        raise
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, proc.pid, mem, wall


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def log_tail(path):
    t = tail(path).rstrip()
    return f"; {path} ends with:\n{t}" if t else ""


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


def shm_loaderd_objects():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("loaderd.")}
    except OSError:
        return set()


def socket_accepts(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def reset_peak_rss(pid):
    """Resets /proc/PID/status VmHWM to the current RSS (clear_refs, Linux >= 4.0), so
    that each dataset's peak is its own. False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def loaderctl_json(loaderctl, sock, *argv, timeout=30):
    r = subprocess.run([loaderctl, "--socket", sock, *argv], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"loaderctl {' '.join(argv)} exited {r.returncode}: "
                           + r.stderr.decode(errors="replace").strip())
    return json.loads(r.stdout)


def run_loaderd(args, bins, rec_dir, tok_file, results_dir):
    """Starts loaderd, reads both datasets with loaderctl, stops it. Returns
    (rows, info, ok)."""
    loaderd, loaderctl = bins["loaderd"], bins["loaderctl"]
    rows, info, ok = [], {"errors": []}, True
    tmp = tempfile.mkdtemp(prefix="ld-bench-")
    sock = os.path.join(tmp, "loaderd.sock")
    cfg = os.path.join(results_dir, "bench.yaml")
    write_config(cfg, sock, rec_dir, tok_file)
    daemon_log = os.path.join(results_dir, "loaderd.log")
    shm_before = shm_loaderd_objects()
    daemon = None

    def err(msg):
        nonlocal ok
        ok = False
        info["errors"].append(msg)
        log("bench: loaderd: " + msg)

    try:
        with open(daemon_log, "wb") as lf:
            t0 = time.perf_counter()
            daemon = subprocess.Popen([loaderd, "--config", cfg], stdout=lf, stderr=lf,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        info["pid"] = daemon.pid
        while True:
            if daemon.poll() is not None:
                err(f"loaderd exited {daemon.returncode} during start-up" + log_tail(daemon_log))
                return rows, info, ok
            if os.path.exists(sock) and socket_accepts(sock):
                break
            if time.perf_counter() - t0 > args.startup_timeout:
                err(f"socket {sock} not up after {args.startup_timeout:.0f} s")
                return rows, info, ok
            time.sleep(0.02)
        info["startup_s"] = time.perf_counter() - t0
        info["idle_rss_kib"] = read_proc_kib(daemon.pid, "VmRSS")
        log(f"bench: loaderd up in {info['startup_s']:.2f} s (pid {daemon.pid})")
        try:
            info["status_start"] = loaderctl_json(loaderctl, sock, "--json", "status")
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            err(f"status: {e}")

        for ds, batch in (("records", RECORDS_BATCH), ("tokens", TOKENS_BATCH)):
            hwm_reset = reset_peak_rss(daemon.pid)
            idle_kib = read_proc_kib(daemon.pid, "VmRSS")
            cmd = [loaderctl, "--socket", sock, "read", ds, "--epochs", str(args.loaderd_epochs),
                   "--batch-size", str(batch), "--seed", str(SEED), "--json"]
            if args.prefetch:
                cmd[-1:-1] = ["--prefetch", str(args.prefetch)]
            out_p = os.path.join(results_dir, f"loaderctl-{ds}.json")
            err_p = os.path.join(results_dir, f"loaderctl-{ds}.err")
            log(f"bench: loaderd {ds}: {shlex.join(cmd[1:])}")
            code, ctl_pid, mem, wall = run_monitored(cmd, out_p, err_p, args.read_timeout,
                                                     PSS_EVERY, extra_roots=[daemon.pid])
            if code != 0:
                err(f"loaderctl read {ds} exited {code}: {tail(err_p).strip()}")
                continue
            try:
                with open(out_p) as f:
                    res = json.load(f)
                epochs = res["epochs"]
                if len(epochs) != args.loaderd_epochs:
                    raise ValueError(f"{len(epochs)} epochs reported, "
                                     f"asked for {args.loaderd_epochs}")
            except (OSError, ValueError, KeyError, TypeError) as e:
                err(f"loaderctl read {ds}: unreadable output ({e}): {tail(out_p, 3)}")
                continue
            want = expected_samples(args, ds)
            short = [e["epoch"] for e in epochs if e["samples"] != want]
            if short:
                # a loader that skips samples would look fast: that is a failure, not a result
                err(f"loaderctl read {ds}: epochs {short} did not deliver {want} samples: "
                     + ", ".join(str(e["samples"]) for e in epochs))
            hwm_kib = read_proc_kib(daemon.pid, "VmHWM") or 0
            steady = epochs[1:]
            s_samples = sum(e["samples"] for e in steady)
            s_bytes = sum(e["bytes"] for e in steady)
            s_secs = sum(e["seconds"] for e in steady)
            e0 = epochs[0]
            try:
                status = loaderctl_json(loaderctl, sock, "--json", "status")
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                status = None
                err(f"status after {ds}: {e}")
            rows.append({
                "dataset": ds, "loader": "loaderd", "workers": 2, "batch_size": batch,
                "samples_per_s": s_samples / s_secs if s_secs > 0 else 0.0,
                "mb_per_s": s_bytes / s_secs / MB if s_secs > 0 else 0.0,
                "first_batch_ms": res.get("first_batch_ms"),
                "steady_epochs": [e["epoch"] for e in steady],
                "steady_samples": s_samples, "steady_seconds": s_secs,
                "epoch0_samples_per_s": e0["samples"] / e0["seconds"] if e0["seconds"] > 0 else 0.0,
                "epoch0_seconds": e0["seconds"],
                "epoch_seconds": [e["seconds"] for e in epochs],
                "samples_per_epoch": e0["samples"],
                "measured_batches_per_epoch": e0["batches"],
                "partial": False,
                # daemon's VmHWM over this read + loaderctl's: both processes map the
                # ring, so its pages are counted twice, as summed VmRSS does.
                "peak_rss_mib": (hwm_kib + mem.hwm_kib.get(ctl_pid, 0)) / 1024,
                "peak_rss_method": ("daemon VmHWM (reset before the read) + loaderctl VmHWM"
                                    if hwm_reset else
                                    "daemon VmHWM since start (reset not allowed) + loaderctl VmHWM"),
                "polled_peak_rss_mib": mem.peak_rss_kib / 1024,
                "peak_pss_mib": mem.peak_pss_kib / 1024,
                "idle_rss_mib": (idle_kib or 0) / 1024,
                "wall_s": wall,
                "loaderctl": res,
                "status_after": status,
            })
            r = rows[-1]
            log(f"bench: loaderd {ds}: {r['samples_per_s']:,.0f} samples/s "
                f"(epoch 0: {r['epoch0_samples_per_s']:,.0f}), first batch "
                f"{fmt(r['first_batch_ms'], '.1f')} ms, peak RSS {r['peak_rss_mib']:.0f} MiB")
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                rc = daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
                rc = None
            info["exit_code"] = rc
            if rc != 0:
                err(f"loaderd did not exit 0 on SIGTERM (exit {rc})" + log_tail(daemon_log))
        elif daemon is not None:
            info["exit_code"] = daemon.returncode
        if daemon is not None:
            left = sorted(shm_loaderd_objects() - shm_before)
            ours = [n for n in left if f".{daemon.pid}." in n]
            if ours:
                err("left in /dev/shm after a clean stop: " + ", ".join(ours))
            elif left:
                log("bench: warning: new loaderd.* objects in /dev/shm, not named with our "
                    "daemon's pid (another loaderd running?): " + ", ".join(left))
            info["shm_left"] = ours
        try:
            os.unlink(sock)
        except OSError:
            pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass
    return rows, info, ok


# ---------------------------------------------------------------------------------------
# PyTorch DataLoader (child process side)

def child_main(spec):
    """One DataLoader configuration; prints its measurements as one JSON line."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(spec["seed"])

    class FileDataset(Dataset):
        """A file per sample: raw bytes as uint8, label = index of the class folder."""

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
            data = np.fromfile(os.path.join(self.root, self.files[i]), dtype=np.uint8)
            return torch.from_numpy(data), self.labels[i]

    class TokenWindows(Dataset):
        """Window i = tokens [i*context, i*context + context + 1), as int64 (nanoGPT's
        get_batch: torch 1.13 has no uint16 tensor)."""

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
            return torch.from_numpy(self.data[s:s + self.context + 1].astype(np.int64))

    if spec["dataset"] == "records":
        ds = FileDataset(spec["path"], "*.bin")
    else:
        ds = TokenWindows(spec["path"], spec["context"])
    loader = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True,
                        num_workers=spec["workers"], persistent_workers=False)
    baseline_kib = read_proc_kib(os.getpid(), "VmRSS")
    epochs = []
    for epoch in range(spec["epochs"]):
        samples = nbytes = batches = 0
        t0 = time.perf_counter()
        it = iter(loader)
        first_ms = None
        partial = False
        for batch in it:
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1000
            parts = batch if isinstance(batch, (list, tuple)) else [batch]
            samples += parts[0].shape[0]
            nbytes += sum(p.element_size() * p.numel() for p in parts)
            batches += 1
            if batches < len(loader) and (
                    samples >= spec["max_samples"]
                    or time.perf_counter() - t0 >= spec["max_seconds"]):
                partial = True
                break
        secs = time.perf_counter() - t0
        del it                      # shuts the workers down; not timed
        epochs.append({"epoch": epoch, "samples": samples, "batches": batches,
                       "bytes": nbytes, "seconds": secs, "first_batch_ms": first_ms,
                       "partial": partial,
                       "samples_per_s": samples / secs if secs > 0 else 0.0})
    print(json.dumps({"samples_per_epoch": len(ds), "batches_per_epoch": len(loader),
                      "baseline_rss_kib": baseline_kib, "torch": torch.__version__,
                      "torch_threads": torch.get_num_threads(), "epochs": epochs}))
    return 0


# ---------------------------------------------------------------------------------------
# PyTorch DataLoader (parent side)

def run_dataloader(args, ds, path, batch, workers, results_dir):
    spec = {"dataset": ds, "path": path, "batch_size": batch, "workers": workers,
            "context": CONTEXT, "seed": SEED, "epochs": args.torch_epochs,
            "max_samples": args.max_samples, "max_seconds": args.max_seconds}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    out_p = os.path.join(results_dir, f"dataloader-{ds}-w{workers}.json")
    err_p = os.path.join(results_dir, f"dataloader-{ds}-w{workers}.err")
    log(f"bench: DataLoader {ds}, num_workers={workers}")
    budget = 120 + args.torch_epochs * (args.max_seconds + 60)
    code, pid, mem, wall = run_monitored(cmd, out_p, err_p, budget, PSS_EVERY)
    if code != 0:
        log(f"bench: DataLoader {ds} w={workers} exited {code}:\n{tail(err_p)}")
        return None
    try:
        with open(out_p) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        log(f"bench: DataLoader {ds} w={workers}: unreadable output ({e})")
        return None
    if res["samples_per_epoch"] != expected_samples(args, ds):
        log(f"bench: DataLoader {ds}: {res['samples_per_epoch']} samples per epoch, expected "
            f"{expected_samples(args, ds)}")
        return None
    epochs = res["epochs"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    s_samples = sum(e["samples"] for e in steady)
    s_bytes = sum(e["bytes"] for e in steady)
    s_secs = sum(e["seconds"] for e in steady)
    e0 = epochs[0]
    row = {
        "dataset": ds, "loader": "DataLoader", "workers": workers, "batch_size": batch,
        "samples_per_s": s_samples / s_secs if s_secs > 0 else 0.0,
        "mb_per_s": s_bytes / s_secs / MB if s_secs > 0 else 0.0,
        # the steady-state epoch's own time to first batch (workers start per epoch)
        "first_batch_ms": steady[0]["first_batch_ms"],
        "steady_epochs": [e["epoch"] for e in steady],
        "steady_samples": s_samples, "steady_seconds": s_secs,
        "epoch0_samples_per_s": e0["samples_per_s"],
        "epoch0_first_batch_ms": e0["first_batch_ms"],
        "epoch0_seconds": e0["seconds"],
        "epoch_seconds": [e["seconds"] for e in epochs],
        "samples_per_epoch": res["samples_per_epoch"],
        "measured_batches_per_epoch": steady[0]["batches"],
        "partial": any(e["partial"] for e in epochs),
        # summed VmRSS of the process tree (main + workers), sampled every POLL_S; the
        # main process's own exact peak (VmHWM) is a floor for it.
        "peak_rss_mib": max(mem.peak_rss_kib, mem.hwm_kib.get(pid, 0)) / 1024,
        "peak_rss_method": f"summed VmRSS of the process tree, polled every {POLL_S * 1000:.0f} ms",
        "polled_peak_rss_mib": mem.peak_rss_kib / 1024,
        "peak_pss_mib": mem.peak_pss_kib / 1024,
        "idle_rss_mib": (res.get("baseline_rss_kib") or 0) / 1024,
        "max_processes": mem.max_procs,
        "wall_s": wall,
        "child": res,
    }
    log(f"bench: DataLoader {ds} w={workers}: {row['samples_per_s']:,.0f} samples/s "
        f"(epoch 0: {row['epoch0_samples_per_s']:,.0f}), first batch "
        f"{row['first_batch_ms']:.1f} ms, peak RSS {row['peak_rss_mib']:.0f} MiB")
    return row


# ---------------------------------------------------------------------------------------
# Report

def mem_total_kib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def machine_info(rows):
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import importlib.metadata as md
    versions = {}
    for pkg in ("numpy", "torch"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    # torch.__version__ as the DataLoader processes saw it, when they ran
    torch_ver = next((r["child"]["torch"] for r in rows if "child" in r), versions["torch"])
    np_ver = versions["numpy"]
    return {
        "nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
        "cpu_model": model, "mem_total_mib": mem_total_kib() // 1024,
        "kernel": platform.release(), "python": platform.python_version(),
        "numpy": np_ver, "torch": torch_ver,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def add_ratios(rows):
    for ds in ("records", "tokens"):
        dls = [r for r in rows if r["dataset"] == ds and r["loader"] == "DataLoader"]
        best = max((r["samples_per_s"] for r in dls), default=0.0)
        ld = next((r for r in rows if r["dataset"] == ds and r["loader"] == "loaderd"), None)
        for r in rows:
            if r["dataset"] != ds:
                continue
            r["ratio_vs_best_dataloader"] = r["samples_per_s"] / best if best > 0 else None
        if ld is not None:
            ld["ratio_vs_dataloader"] = {str(r["workers"]): ld["samples_per_s"] / r["samples_per_s"]
                                         for r in dls if r["samples_per_s"] > 0}


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def steady_desc(n):
    """Which epochs of n make the steady state: all but epoch 0 (epoch 0 alone if n is 1)."""
    if n == 1:
        return "epoch 0 of 1"
    if n == 2:
        return "epoch 1 of 2"
    return f"epochs 1–{n - 1} of {n}"


def render(rows, meta):
    lines = []
    m = meta["machine"]
    lines.append(f"# loaderd vs PyTorch DataLoader — {m['date']}")
    lines.append("")
    lines.append(f"Machine: {m['nproc']} CPUs usable ({m['cpu_model']}), "
                 f"{m['mem_total_mib']} MiB RAM, Linux {m['kernel']}; "
                 f"Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}.")
    p = meta["params"]
    lines.append(f"Data{' (--quick)' if p['quick'] else ''}: records = {p['files']:,} files × "
                 f"{p['file_size']} B in {p['classes']} classes (batch {RECORDS_BATCH}); "
                 f"tokens = {p['tokens']:,} uint16 tokens, context {CONTEXT} "
                 f"(windows of {CONTEXT + 1}, batch {TOKENS_BATCH}). Page cache warm; shuffle on.")
    lines.append("")
    lines.append(f"samples/s and MB/s: steady state (loaderd: {steady_desc(p['loaderd_epochs'])}; "
                 f"DataLoader: {steady_desc(p['torch_epochs'])}, at most {p['max_samples']:,} samples or "
                 f"{p['max_seconds']:g} s per epoch). First batch: time to the first batch of "
                 "that stream (loaderd) or of the measured epoch's iter() (DataLoader).")
    lines.append("")
    hdr = ["dataset", "loader", "workers", "samples/s", "MB/s", "first batch ms",
           "peak RSS MiB", "ratio vs best DataLoader"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(hdr) - 2)) + "|")
    for r in rows:
        ratio = r.get("ratio_vs_best_dataloader")
        part = " (partial epochs)" if r["partial"] else ""
        wk = f"{r['workers']} threads" if r["loader"] == "loaderd" else str(r["workers"])
        lines.append("| " + " | ".join([
            r["dataset"], r["loader"] + part, wk,
            fmt(r["samples_per_s"], ",.0f"), fmt(r["mb_per_s"], ",.1f"),
            fmt(r["first_batch_ms"], ",.1f"), fmt(r["peak_rss_mib"], ",.0f"),
            (f"**{ratio:.2f}×**" if r["loader"] == "loaderd" else f"{ratio:.2f}×")
            if ratio is not None else "—"]) + " |")
    lines.append("")
    for r in rows:
        if r["loader"] == "loaderd" and r.get("ratio_vs_dataloader"):
            vs = ", ".join(f"{v:.2f}× vs {k} worker{'s' if k != '1' else ''}"
                           for k, v in r["ratio_vs_dataloader"].items())
            rates = [r["samples_per_epoch"] / t for t in r["epoch_seconds"][1:] if t > 0]
            spread = (f" Steady epochs ranged {min(rates):,.0f}–{max(rates):,.0f} samples/s "
                      f"(median {sorted(rates)[len(rates) // 2]:,.0f}): the table shows their mean."
                      if rates else "")
            lines.append(f"- {r['dataset']}: loaderd samples/s = {vs}.{spread}")
    lines.append("")
    lines.append("First epoch (loaderd: the stream's epoch 0; DataLoader: epoch 0, including "
                 "worker start-up):")
    lines.append("")
    lines.append("| dataset | loader | workers | epoch 0 samples/s | epoch 0 s | epoch 0 first batch ms |")
    lines.append("|---|---|---:|---:|---:|---:|")
    for r in rows:
        fb = r["first_batch_ms"] if r["loader"] == "loaderd" else r.get("epoch0_first_batch_ms")
        lines.append(f"| {r['dataset']} | {r['loader']} | {r['workers']} | "
                     f"{fmt(r['epoch0_samples_per_s'], ',.0f')} | {fmt(r['epoch0_seconds'], '.2f')} | "
                     f"{fmt(fb, ',.1f')} |")
    lines.append("")
    lines.append("Memory (MiB): idle = before reading (loaderd: the daemon alone; DataLoader: the "
                 "process after importing torch and building the Dataset); peak RSS as in the "
                 "table; peak PSS = summed proportional set size of the same processes (shared "
                 f"pages counted once), polled every {POLL_S * PSS_EVERY * 1000:.0f} ms (a read "
                 "that lasts only a few periods may show less than its peak).")
    lines.append("")
    lines.append("| dataset | loader | workers | idle RSS | peak RSS | peak PSS | how peak RSS is measured |")
    lines.append("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['loader']} | {r['workers']} | "
                     f"{r['idle_rss_mib']:,.0f} | {r['peak_rss_mib']:,.0f} | "
                     f"{r['peak_pss_mib']:,.0f} | {r['peak_rss_method']} |")
    if meta.get("failures"):
        lines.append("")
        lines.append("**FAILURES:**")
        for f in meta["failures"]:
            lines.append(f"- {f}")
    lines.append("")
    return "\n".join(lines)


def console_table(rows):
    hdr = ["dataset", "loader", "workers", "samples/s", "MB/s", "first batch ms",
           "peak RSS MiB", "ratio vs best DL"]
    body = []
    for r in rows:
        ratio = r.get("ratio_vs_best_dataloader")
        body.append([r["dataset"], r["loader"] + ("*" if r["partial"] else ""),
                     str(r["workers"]), fmt(r["samples_per_s"], ",.0f"),
                     fmt(r["mb_per_s"], ",.1f"), fmt(r["first_batch_ms"], ",.1f"),
                     fmt(r["peak_rss_mib"], ",.0f"),
                     f"{ratio:.2f}x" if ratio is not None else "-"])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(hdr, widths)))]
    for b in body:
        out.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(b, widths))))
    if any(r["partial"] for r in rows):
        out.append("* measured over a bounded part of each epoch (see --max-samples/--max-seconds)")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Main

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="loaderd vs PyTorch DataLoader (see bench/README.md). Extra arguments "
                    "may also come from the BENCH_ARGS environment variable.")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller data: {QUICK['files']:,} files, {QUICK['tokens']:,} tokens")
    p.add_argument("--files", type=int, help="number of record files (default 100,000)")
    p.add_argument("--file-size", type=int, help="bytes per record file (default 3072)")
    p.add_argument("--classes", type=int, help="class folders (default 100)")
    p.add_argument("--tokens", type=int, help="uint16 tokens in tokens.bin (default 200,000,000)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"),
                   help="where bin/loaderd, bin/loaderctl, bin/ld-gendata are (default build, "
                        "relative to the repository)")
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", default="0,1,2",
                   help="DataLoader num_workers values to measure (default 0,1,2)")
    p.add_argument("--loaderd-epochs", type=int, default=8,
                   help="epochs per loaderctl read; epochs >= 1 are the steady state")
    p.add_argument("--torch-epochs", type=int, default=2,
                   help="DataLoader epochs per configuration; epochs >= 1 are the steady state")
    p.add_argument("--max-samples", type=int, default=200_000,
                   help="DataLoader: stop an epoch after this many samples (default 200,000)")
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="DataLoader: stop an epoch after this many seconds (default 20)")
    p.add_argument("--prefetch", type=int, default=0,
                   help="loaderctl read --prefetch (default: the daemon's server.prefetch)")
    p.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds to wait for loaderd's socket")
    p.add_argument("--read-timeout", type=float, default=600.0,
                   help="seconds allowed for one loaderctl read")
    p.add_argument("--skip-loaderd", action="store_true", help="DataLoader rows only")
    p.add_argument("--skip-torch", action="store_true", help="loaderd rows only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    base = QUICK if a.quick else FULL
    for k in ("files", "file_size", "classes", "tokens"):
        if getattr(a, k) is None:
            setattr(a, k, base[k])
    if a.files < 1 or a.file_size < 1 or a.classes < 1 or a.tokens < 2 * (CONTEXT + 1):
        p.error("--files, --file-size and --classes must be >= 1, --tokens >= 2 windows")
    try:
        a.workers = [int(w) for w in a.workers.split(",") if w.strip() != ""]
    except ValueError:
        p.error("--workers: a comma-separated list of integers")
    if a.torch_epochs < 1 or a.max_samples < 1 or a.max_seconds <= 0:
        p.error("--torch-epochs, --max-samples, --max-seconds must be positive")
    if a.loaderd_epochs < 2:
        p.error("--loaderd-epochs must be at least 2 (epoch 0 is not the steady state)")
    return a


def ensure_system_python(modules=("numpy", "torch"), script=None):
    """Re-runs `script` (default: this file) under Debian's python3 when the running python
    lacks `modules` (a pyenv python first on PATH may). find_spec, not import: the parent
    stays small (its RSS is no part of any figure, and `import torch` costs ~230 MiB)."""
    import importlib.util
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(script or __file__), *sys.argv[1:]])
    fail(f"{' and '.join(modules)} are needed: run with {SYSTEM_PYTHON} "
         f"(apt-get install {' '.join('python3-' + m for m in modules)})")


def main():
    argv = sys.argv[1:]
    if "--child" not in argv:
        argv = shlex.split(os.environ.get("BENCH_ARGS", "")) + argv
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    # A SIGTERM (timeout, CI cancel) unwinds like Ctrl-C, so that the finally clauses stop
    # loaderd and the DataLoader process groups instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    ensure_system_python()

    build = args.build_dir if os.path.isabs(args.build_dir) else os.path.join(REPO, args.build_dir)
    bins = {n: os.path.join(build, "bin", n) for n in ("loaderd", "loaderctl", "ld-gendata")}
    need = ["ld-gendata"] + ([] if args.skip_loaderd else ["loaderd", "loaderctl"])
    for n in need:
        if not os.access(bins[n], os.X_OK):
            fail(f"{bins[n]} not found: build first (make all)")
    args.data_dir = os.path.abspath(args.data_dir)
    args.results_dir = os.path.abspath(args.results_dir)
    os.makedirs(args.results_dir, exist_ok=True)

    rec_dir, tok_file, files = generate(args, bins["ld-gendata"])
    warm = warm_page_cache(rec_dir, files, tok_file)

    failures, rows, ld_info = [], [], None
    if not args.skip_loaderd:
        ld_rows, ld_info, ok = run_loaderd(args, bins, rec_dir, tok_file, args.results_dir)
        rows.extend(ld_rows)
        if not ok:
            failures.extend("loaderd: " + e for e in ld_info["errors"])
    if not args.skip_torch:
        for ds, path, batch in (("records", rec_dir, RECORDS_BATCH),
                                ("tokens", tok_file, TOKENS_BATCH)):
            for w in args.workers:
                r = run_dataloader(args, ds, path, batch, w, args.results_dir)
                if r is None:
                    failures.append(f"DataLoader {ds} num_workers={w} failed")
                else:
                    rows.append(r)
    order = {"records": 0, "tokens": 1}
    rows.sort(key=lambda r: (order[r["dataset"]], r["loader"] != "loaderd", r["workers"]))
    add_ratios(rows)

    meta = {
        "machine": machine_info(rows),
        "params": {"quick": args.quick, "files": args.files, "file_size": args.file_size,
                   "classes": args.classes, "tokens": args.tokens, "context": CONTEXT,
                   "records_batch": RECORDS_BATCH, "tokens_batch": TOKENS_BATCH,
                   "loaderd_epochs": args.loaderd_epochs, "torch_epochs": args.torch_epochs,
                   "max_samples": args.max_samples, "max_seconds": args.max_seconds,
                   "workers": args.workers, "seed": SEED, "build_dir": args.build_dir},
        "page_cache_warm": warm,
        "loaderd": ld_info,
        "failures": failures,
    }
    md = render(rows, meta)
    with open(os.path.join(args.results_dir, "latest.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.results_dir, "latest.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=2)
        f.write("\n")
    sys.stderr.flush()
    print()
    print(f"{meta['machine']['date']}  {meta['machine']['nproc']} CPUs "
          f"({meta['machine']['cpu_model']}), torch {meta['machine']['torch']}")
    print(console_table(rows))
    for r in rows:
        if r["loader"] == "loaderd" and r.get("ratio_vs_dataloader"):
            vs = ", ".join(f"{v:.2f}x vs w={k}" for k, v in r["ratio_vs_dataloader"].items())
            print(f"{r['dataset']}: loaderd {vs}")
    print(f"results: {os.path.join(args.results_dir, 'latest.md')}, latest.json", flush=True)
    if failures:
        log("bench: FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
