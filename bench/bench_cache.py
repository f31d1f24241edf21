#!/usr/bin/python3
"""loaderd's single-file dataset cache, against reading the files and against PyTorch.

On the records dataset of bench.py (many 3 KiB files) and on a "large samples" dataset
(files of 1 MiB), in one run:

1. loaderd with a cache (`cache: {mode: auto}`, the cache file removed first): epoch 0 is
   served from the files while the daemon builds the cache in the background; then a
   second stream reads epochs 1..N from the cache. Build time and cache file size.
2. loaderd without a cache: the same files, the same 2 worker threads.
3. Cold page cache, where `echo 3 > /proc/sys/vm/drop_caches` is allowed: one epoch from
   the files and one from the cache, each right after dropping the caches.
4. PyTorch: a Dataset reading the files (DataLoader num_workers 0 and 2), and the common
   "pickle everything into one file and load it" recipe (time to build the pickle, time
   to load it, peak RSS, samples/s from memory at num_workers 0 and 2).
5. This machine's memory bandwidth (numpy copy of 512 MiB, best of 3) and loaderd's
   cached MB/s on the large samples as a fraction of it.

Prints a table and writes bench/results/cache.{md,json}; raw outputs (loaderctl and child
JSON, the daemon's config and log) go to bench/results/cache-raw/. What is measured and
how: bench/README.md, "The cache benchmark". `make bench` runs it after bench.py.

Shares bench.py's DataLoader child over the files by importing it, and bench/measure.py's
process accounting (process-tree memory sampling, CPU time). The pickle recipe's and the
memory bandwidth's child processes are in cache_children.py, the report (ratios, markdown,
console) in cache_report.py. Options: `--help`; the record dataset's options (`--quick`,
`--files`, ...) are also taken from BENCH_ARGS, as bench.py reads them, and options of
this script alone from BENCH_CACHE_ARGS.
"""

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
import bench  # noqa: E402  (bench.py, next to this file: helpers shared with it)
import measure  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)
from cache_children import child_memcpy, child_pickle_build, child_pickle_load  # noqa: E402
from cache_report import console, render, summarize  # noqa: E402  (bench/cache_report.py)

REPO = measure.REPO
MB = measure.MB
MIB = measure.MIB
SEED = bench.SEED
RECORDS_BATCH = bench.RECORDS_BATCH      # 64
LARGE_BATCH = 8
FULL_LARGE = {"large_files": 2000, "large_size": 1 << 20}
QUICK_LARGE = {"large_files": 500, "large_size": 1 << 20}
DAEMON_WORKERS = 2
POLL_BUILD_S = 0.05     # cache info polling while a build runs (not during timed reads)

log = measure.log
fail = measure.fail
fmt = measure.fmt
ratio = measure.ratio


# ---------------------------------------------------------------------------------------
# Data and page cache

def generate(gendata, path, count, size, classes):
    t0 = time.perf_counter()
    cmd = [gendata, "files", path, "--count", str(count), "--size", str(size),
           "--classes", str(classes)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    if r.returncode != 0:
        fail(f"{shlex.join(cmd)} exited {r.returncode}:\n" + r.stdout.decode(errors="replace")[-2000:])
    files = bench.list_files(path, "*.bin")
    if len(files) != count:
        fail(f"{path} holds {len(files)} *.bin files, expected {count}")
    log(f"bench_cache: {os.path.basename(path)} ready in {time.perf_counter() - t0:.1f} s")
    return files


def warm(root, files):
    """Reads every byte once, so that the warm measurements read from the page cache."""
    t0, total = time.perf_counter(), 0
    for rel in files:
        with open(os.path.join(root, rel), "rb", buffering=0) as f:
            while True:
                b = f.read(4 << 20)
                if not b:
                    break
                total += len(b)
    dt = time.perf_counter() - t0
    log(f"bench_cache: page cache warmed: {os.path.basename(root)}, {total / MIB:.0f} MiB in {dt:.1f} s")
    return {"bytes": total, "seconds": dt}


drop_caches = measure.drop_caches


def remove_cache_files(path):
    """The cache file, a set-aside copy and builders' temporary files, so that the first
    epoch really builds."""
    d, base = os.path.split(path)
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for n in names:
        if n == base or n.startswith(base + ".bad") or n.startswith(base + ".tmp."):
            os.unlink(os.path.join(d, n))
            removed.append(n)
    return removed


# ---------------------------------------------------------------------------------------
# The daemon

class Daemon:
    """One loaderd process on a temporary socket: started, asked, stopped and checked
    (exit 0 on SIGTERM, none of its /dev/shm objects left)."""

    def __init__(self, bins, cfg_path, log_path, errors):
        self.bins, self.cfg_path, self.log_path, self.errors = bins, cfg_path, log_path, errors
        self.proc = None
        self.sock = None
        self.tmp = None
        self.info = {}

    def err(self, msg):
        self.errors.append(msg)
        log("bench_cache: loaderd: " + msg)

    def start(self, write_config, timeout_s):
        self.tmp = tempfile.mkdtemp(prefix="ld-bench-cache-")
        self.sock = os.path.join(self.tmp, "loaderd.sock")
        write_config(self.cfg_path, self.sock)
        self.shm_before = measure.shm_loaderd_objects()
        with open(self.log_path, "ab") as lf:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen([self.bins["loaderd"], "--config", self.cfg_path],
                                         stdout=lf, stderr=lf, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.info["pid"] = self.proc.pid
        while True:
            if self.proc.poll() is not None:
                self.err(f"exited {self.proc.returncode} during start-up" + measure.log_tail(self.log_path))
                return False
            if os.path.exists(self.sock) and measure.socket_accepts(self.sock):
                break
            if time.perf_counter() - t0 > timeout_s:
                self.err(f"socket {self.sock} not up after {timeout_s:.0f} s")
                return False
            time.sleep(0.02)
        self.info["startup_s"] = time.perf_counter() - t0
        log(f"bench_cache: loaderd up in {self.info['startup_s']:.2f} s (pid {self.proc.pid})")
        return True

    def ctl(self, *argv, timeout=30):
        return measure.loaderctl_json(self.bins["loaderctl"], self.sock, "--json", *argv, timeout=timeout)

    def cache_info(self, ds):
        return self.ctl("cache", "info", ds)

    def wait_cache(self, ds, until, timeout_s):
        """Polls `cache info` until its state is in `until`; returns (info, seconds waited,
        progress values seen). None as info on time-out."""
        t0 = time.perf_counter()
        seen = []
        while True:
            ci = self.cache_info(ds)
            seen.append((round(time.perf_counter() - t0, 3), ci.get("state"), ci.get("progress")))
            if ci.get("state") in until:
                return ci, time.perf_counter() - t0, seen
            if ci.get("state") == "failed":
                return ci, time.perf_counter() - t0, seen
            if time.perf_counter() - t0 > timeout_s:
                return None, time.perf_counter() - t0, seen
            time.sleep(POLL_BUILD_S)

    def read(self, ds, batch, epochs, start_epoch, out_dir, tag, timeout_s, expect_samples):
        """`loaderctl read` of `epochs` epochs from `start_epoch`, the daemon's and
        loaderctl's memory sampled. Returns the result dict or None (error recorded)."""
        hwm_reset = measure.reset_peak_rss(self.proc.pid)
        cmd = [self.bins["loaderctl"], "--socket", self.sock, "read", ds, "--epochs", str(epochs),
               "--epoch", str(start_epoch), "--batch-size", str(batch), "--seed", str(SEED), "--json"]
        if ds.startswith("records"):
            # compared with DataLoader, whose loop reads every byte: loaderctl does too. The
            # large-sample reads are compared with a memcpy and only map each batch.
            cmd.insert(-1, "--touch")
        out_p = os.path.join(out_dir, f"loaderctl-{tag}.json")
        err_p = os.path.join(out_dir, f"loaderctl-{tag}.err")
        log(f"bench_cache: loaderd {tag}: {shlex.join(cmd[3:])}")
        code, ctl_pid, mem, wall = measure.run_monitored(cmd, out_p, err_p, timeout_s, 0,
                                                       extra_roots=[self.proc.pid])
        if code != 0:
            self.err(f"loaderctl read {ds} ({tag}) exited {code}: {measure.tail(err_p).strip()}")
            return None
        try:
            with open(out_p) as f:
                res = json.load(f)
            eps = res["epochs"]
            if len(eps) != epochs:
                raise ValueError(f"{len(eps)} epochs reported, asked for {epochs}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.err(f"loaderctl read {ds} ({tag}): unreadable output ({e})")
            return None
        short = [e["epoch"] for e in eps if e["samples"] != expect_samples]
        if short:
            self.err(f"loaderctl read {ds} ({tag}): epochs {short} did not deliver {expect_samples} samples")
            return None
        hwm = measure.read_proc_kib(self.proc.pid, "VmHWM") or 0
        return {"epochs": eps, "first_batch_ms": res.get("first_batch_ms"), "wall_s": wall,
                "peak_rss_mib": (hwm + mem.hwm_kib.get(ctl_pid, 0)) / 1024,
                "daemon_hwm_reset": hwm_reset}

    def stop(self):
        """SIGTERM; checks exit 0 and /dev/shm. Safe to call twice."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
        else:
            rc = proc.returncode
        self.info["exit_code"] = rc
        if rc != 0:
            self.err(f"loaderd did not exit 0 on SIGTERM (exit {rc})" + measure.log_tail(self.log_path))
        left = sorted(measure.shm_loaderd_objects() - self.shm_before)
        ours = [n for n in left if f".{proc.pid}." in n]
        if ours:
            self.err("left in /dev/shm after a clean stop: " + ", ".join(ours))
        elif left:
            log("bench_cache: warning: new loaderd.* objects in /dev/shm, not named with our "
                "daemon's pid (another loaderd running?): " + ", ".join(left))
        self.info["shm_left"] = ours
        for p in (self.sock,):
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            os.rmdir(self.tmp)
        except OSError:
            pass


def steady(eps):
    """samples/s and MB/s over the epochs given: total samples (bytes) over total seconds."""
    n = sum(e["samples"] for e in eps)
    b = sum(e["bytes"] for e in eps)
    s = sum(e["seconds"] for e in eps)
    return {"samples_per_s": n / s if s > 0 else 0.0, "mb_per_s": b / s / MB if s > 0 else 0.0,
            "epochs": [e["epoch"] for e in eps], "samples": n, "bytes": b, "seconds": s}


def epoch_rates(eps, source):
    return [{"epoch": e["epoch"], "source": source, "samples": e["samples"], "seconds": e["seconds"],
             "samples_per_s": e["samples"] / e["seconds"] if e["seconds"] > 0 else 0.0,
             "mb_per_s": e["bytes"] / e["seconds"] / MB if e["seconds"] > 0 else 0.0} for e in eps]


def measure_dataset(d, name, batch, count, cached_epochs, files_epochs, args, raw):
    """For one dataset (two config entries: NAME_cached with a cache, NAME without):
    files_epochs epochs from the files, then epoch 0 of the cached dataset while its cache
    builds, then epochs 1..cached_epochs from the cache (a new stream). Returns the result
    dict, or None (the error recorded)."""
    out = {"dataset": name, "batch_size": batch, "samples_per_epoch": count}
    cname = name + "_cached"
    # The files, no cache, same workers: first, so that the daemon's peak RSS for it does
    # not include this dataset's cache mapping.
    rf = d.read(name, batch, files_epochs, 0, raw, f"{name}-files", args.read_timeout, count)
    if rf is None:
        return None
    out["files_epochs"] = epoch_rates(rf["epochs"], "files")
    out["files"] = {**steady(rf["epochs"][1:]), "peak_rss_mib": rf["peak_rss_mib"],
                    "first_batch_ms": rf["first_batch_ms"], "stream_first_epoch": out["files_epochs"][0]}

    # The daemon's first check of the cache (fingerprint of the source) runs in the
    # background at start; a stream opened before it ends does not start the build, so
    # wait for it to end.
    ci, waited, _ = d.wait_cache(cname, {"absent", "stale", "ready"}, args.build_timeout)
    if ci is None:
        d.err(f"{cname}: the cache check did not end within {args.build_timeout:.0f} s")
        return None
    out["state_before"] = ci.get("state")
    if ci.get("state") != "absent":
        d.err(f"{cname}: cache state {ci.get('state')!r} before the first stream, expected 'absent'")
    hits0 = ci.get("hits", 0)

    # Epoch 0: from the files, while the cache builds.
    t_open = time.time()
    r0 = d.read(cname, batch, 1, 0, raw, f"{name}-epoch0", args.read_timeout, count)
    if r0 is None:
        return None
    t_end = time.time()
    # The stream started the build; a state still 'absent' a few seconds after epoch 0
    # means it did not, and waiting the whole build time-out would only hide that.
    ci, _, seen = d.wait_cache(cname, {"building", "ready"}, 5.0)
    if ci is not None and ci.get("state") == "building":
        ci, _, more = d.wait_cache(cname, {"ready"}, args.build_timeout)
        seen += more
    if ci is None or ci.get("state") != "ready":
        d.err(f"{cname}: cache not ready {args.build_timeout:.0f} s after epoch 0 "
              f"(state {(ci or {}).get('state')}, error {(ci or {}).get('error')})")
        return None
    t_ready = time.time()
    f = ci.get("file") or {}
    build_start = parse_build_time(f.get("build_time"))
    out["epoch0"] = {**epoch_rates(r0["epochs"], "files (cache building)")[0],
                     "first_batch_ms": r0["first_batch_ms"], "peak_rss_mib": r0["peak_rss_mib"],
                     "cache_hits": ci.get("hits", 0) - hits0,
                     "build_state_after_epoch0": seen[0][1], "build_progress_after_epoch0": seen[0][2]}
    out["build"] = {
        # from the build's start (the header's build_time) to the first poll that saw it
        # ready; the poll runs every POLL_BUILD_S once epoch 0 has ended
        "seconds": (t_ready - build_start) if build_start else None,
        "seconds_from_stream_open": t_ready - t_open,
        "ready_after_epoch0_s": t_ready - t_end,
        "poll_s": POLL_BUILD_S,
        "file_size": f.get("file_size"), "data_bytes": f.get("data_bytes"),
        "count": f.get("count"), "path": ci.get("path"),
        "file_size_on_disk": os.path.getsize(ci["path"]) if ci.get("path") and os.path.exists(ci["path"]) else None,
    }
    if f.get("count") != count:
        d.err(f"{cname}: the cache holds {f.get('count')} samples, expected {count}")
    log(f"bench_cache: {name}: epoch 0 {out['epoch0']['samples_per_s']:,.0f} samples/s; cache built in "
        f"{fmt(out['build']['seconds'], '.2f')} s, {(f.get('file_size') or 0) / MIB:,.1f} MiB")

    # Epochs 1..N from the cache: a new stream, as a trainer's next run (or the same
    # trainer's next epochs, started at epoch 1) would read it.
    hits1 = ci.get("hits", 0)
    rc_ = d.read(cname, batch, cached_epochs, 1, raw, f"{name}-cached", args.read_timeout, count)
    if rc_ is None:
        return None
    ci = d.cache_info(cname)
    delivered = sum(e["samples"] for e in rc_["epochs"])
    out["cached_hits"] = ci.get("hits", 0) - hits1
    # A stream reads the files until a check of the cache that started after its open
    # has passed (README, "The single-file cache"), so the start of its first epoch may
    # come from the files; every later epoch (the steady state reported) must come from
    # the cache.
    first = rc_["epochs"][0]["samples"]
    out["cached_first_epoch_from_files"] = delivered - out["cached_hits"]
    if not delivered - first <= out["cached_hits"] <= delivered:
        d.err(f"{cname}: {delivered} samples read (the first epoch {first}) but the cache served "
              f"{out['cached_hits']}: the epochs after the stream's first did not all come from the cache")
    out["cached_epochs"] = epoch_rates(rc_["epochs"], "cache")
    # Steady state: the stream's epochs after its first, as for the files below.
    out["cached"] = {**steady(rc_["epochs"][1:]), "peak_rss_mib": rc_["peak_rss_mib"],
                     "first_batch_ms": rc_["first_batch_ms"],
                     "stream_first_epoch": out["cached_epochs"][0]}

    log(f"bench_cache: {name}: cached {out['cached']['samples_per_s']:,.0f} samples/s "
        f"({out['cached']['mb_per_s']:,.0f} MB/s), files {out['files']['samples_per_s']:,.0f} samples/s "
        f"({out['files']['mb_per_s']:,.0f} MB/s)")
    return out


def parse_build_time(s):
    """'2026-11-30T12:02:36.754208548Z' -> Unix seconds (float), or None."""
    if not s:
        return None
    try:
        base, _, frac = s.rstrip("Z").partition(".")
        t = datetime.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
        return t.timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        return None


def config_writer(rec_dir, rec_cache, large_dir, large_cache):
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar

    def write(path, sock):
        text = f"""# Written by bench/bench_cache.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {DAEMON_WORKERS}
  memory_budget: 1GiB
  log_level: info
datasets:
  records_cached:
    kind: files
    path: {q(rec_dir)}
    pattern: "*.bin"
    cache: {{path: {q(rec_cache)}, mode: auto}}
  records:
    kind: files
    path: {q(rec_dir)}
    pattern: "*.bin"
  large_cached:
    kind: files
    path: {q(large_dir)}
    pattern: "*.bin"
    cache: {{path: {q(large_cache)}, mode: auto}}
  large:
    kind: files
    path: {q(large_dir)}
    pattern: "*.bin"
"""
        with open(path, "w") as f:
            f.write(text)
    return write


def run_warm(args, bins, paths, raw, errors):
    d = Daemon(bins, os.path.join(raw, "cache.yaml"), os.path.join(raw, "loaderd.log"), errors)
    res = {"daemon": d.info}
    try:
        if not d.start(config_writer(*paths), args.startup_timeout):
            return res
        res["records"] = measure_dataset(d, "records", RECORDS_BATCH, args.files, args.cached_epochs,
                                         args.files_epochs, args, raw)
        res["large"] = measure_dataset(d, "large", LARGE_BATCH, args.large_files, args.large_epochs,
                                       args.large_epochs, args, raw)
    finally:
        d.stop()
    return res


def run_cold(args, bins, paths, raw, errors):
    """One epoch from the cache, then one from the files, each right after dropping the
    page cache. A fresh daemon (the warm one kept the cache mapped, which drop_caches
    cannot evict) is started first, its checks waited for, then the caches dropped."""
    why = drop_caches()
    if why:
        return {"measured": False, "reason": f"cannot drop caches here ({why})"}
    d = Daemon(bins, os.path.join(raw, "cache-cold.yaml"), os.path.join(raw, "loaderd-cold.log"), errors)
    res = {"measured": True, "daemon": d.info}
    try:
        if not d.start(config_writer(*paths), args.startup_timeout):
            return res
        ci, _, _ = d.wait_cache("records_cached", {"ready", "absent", "stale"}, args.build_timeout)
        if ci is None or ci.get("state") != "ready":
            d.err(f"cold: records_cached cache not ready at start (state {(ci or {}).get('state')})")
            return res
        hits = ci.get("hits", 0)
        for tag, ds in (("cache", "records_cached"), ("files", "records")):
            why = drop_caches()
            if why:
                d.err(f"cold: drop_caches failed the second time: {why}")
                return res
            r = d.read(ds, RECORDS_BATCH, 1, 0, raw, f"records-cold-{tag}", args.read_timeout, args.files)
            if r is None:
                return res
            res[tag] = {**epoch_rates(r["epochs"], tag + " (cold)")[0], "first_batch_ms": r["first_batch_ms"]}
            if tag == "cache":
                served = d.cache_info("records_cached").get("hits", 0) - hits
                res[tag]["cache_hits"] = served
                # A stream reads the files until the check of its open has passed (a
                # stat of every file: slow on a cold inode cache), so not every sample of
                # this epoch comes from the cache: reported, not hidden.
                if served > args.files or served < args.files // 2:
                    d.err(f"cold: the cached epoch served {served} samples from the cache, expected "
                          f"between {args.files // 2} and {args.files}")
                elif served != args.files:
                    log(f"bench_cache: cold cache: {served:,} of {args.files:,} samples from the cache; "
                        f"the rest from the files while the stream's open-time check ran")
            log(f"bench_cache: cold {tag}: {res[tag]['samples_per_s']:,.0f} samples/s "
                f"({res[tag]['seconds']:.2f} s)")
    finally:
        d.stop()
    return res


# ---------------------------------------------------------------------------------------
# PyTorch: the pickle recipe (child processes) and the memory bandwidth

def run_child(kind, spec, raw, tag, timeout_s):
    """This script as a child (its own process, so that its tree's memory is its own).
    Returns (parsed JSON, TreeMemory, pid) or (None, ...)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child-" + kind, json.dumps(spec)]
    out_p = os.path.join(raw, f"{tag}.json")
    err_p = os.path.join(raw, f"{tag}.err")
    code, pid, mem, wall = measure.run_monitored(cmd, out_p, err_p, timeout_s, measure.PSS_EVERY)
    if code != 0:
        log(f"bench_cache: {tag} exited {code}:\n{measure.tail(err_p)}")
        return None, mem, pid
    try:
        with open(out_p) as f:
            return json.loads(f.read().strip().splitlines()[-1]), mem, pid
    except (OSError, ValueError, IndexError) as e:
        log(f"bench_cache: {tag}: unreadable output ({e})")
        return None, mem, pid


def run_torch(args, rec_dir, pkl_path, raw, failures):
    out = {"files": [], "pickle": [], "pickle_build": None}
    dl_args = types.SimpleNamespace(timed_epochs=max(1, args.torch_epochs - 1), files=args.files)
    for w in args.torch_workers:
        r = bench.run_dataloader(dl_args, "records", rec_dir, RECORDS_BATCH, w, raw)
        if r is None:
            failures.append(f"DataLoader over the files, num_workers={w}, failed")
        else:
            out["files"].append(r)

    # The pickle recipe: build once (timed), then a process per worker count that loads it.
    try:
        os.unlink(pkl_path)
    except OSError:
        pass
    log("bench_cache: pickle recipe: reading every file into one pickle")
    res, mem, pid = run_child("pickle-build", {"root": rec_dir, "path": pkl_path}, raw, "pickle-build", 600)
    if res is None or res["samples"] != args.files:
        failures.append("pickle recipe: building the pickle failed")
        return out
    res["peak_rss_mib"] = max(mem.peak_rss_kib, res.get("hwm_kib") or 0) / 1024
    out["pickle_build"] = res
    log(f"bench_cache: pickle built: read {res['read_s']:.2f} s, dump {res['dump_s']:.2f} s, "
        f"{res['file_size'] / MIB:,.0f} MiB")
    for w in args.torch_workers:
        spec = {"path": pkl_path, "batch_size": RECORDS_BATCH, "workers": w, "seed": SEED,
                "epochs": args.torch_epochs, "max_samples": args.max_samples,
                "max_seconds": args.max_seconds}
        log(f"bench_cache: pickle recipe: DataLoader num_workers={w}")
        budget = 180 + args.torch_epochs * (args.max_seconds + 60)
        res, mem, pid = run_child("pickle-load", spec, raw, f"pickle-load-w{w}", budget)
        if res is None or res["samples_per_epoch"] != args.files:
            failures.append(f"pickle recipe, num_workers={w}, failed")
            continue
        eps = res["epochs"]
        st = eps[1:] if len(eps) > 1 else eps
        s = sum(e["seconds"] for e in st)
        row = {"workers": w, "load_s": res["load_s"],
               "samples_per_s": sum(e["samples"] for e in st) / s if s > 0 else 0.0,
               "mb_per_s": sum(e["bytes"] for e in st) / s / MB if s > 0 else 0.0,
               "epoch0_samples_per_s": eps[0]["samples_per_s"],
               "partial": any(e["partial"] for e in eps),
               "rss_after_load_mib": (res["rss_after_load_kib"] or 0) / 1024,
               "load_rss_mib": ((res["rss_after_load_kib"] or 0) - (res["rss_before_load_kib"] or 0)) / 1024,
               "peak_rss_mib": max(mem.peak_rss_kib, mem.hwm_kib.get(pid, 0)) / 1024,
               "peak_pss_mib": mem.peak_pss_kib / 1024, "max_processes": mem.max_procs,
               "child": res}
        out["pickle"].append(row)
        log(f"bench_cache: pickle w={w}: load {row['load_s']:.2f} s, {row['samples_per_s']:,.0f} samples/s, "
            f"peak RSS {row['peak_rss_mib']:,.0f} MiB")
    try:
        os.unlink(pkl_path)     # ~300 MB, rebuilt (and timed) on every run
    except OSError:
        pass
    return out


# ---------------------------------------------------------------------------------------
# Main

SHARED = ("quick", "files", "file_size", "classes", "build_dir", "data_dir", "results_dir")


def parser(defaults_only=False):
    p = argparse.ArgumentParser(
        description="loaderd's dataset cache against the files and PyTorch (see bench/README.md). "
                    "Record-dataset options also come from BENCH_ARGS (others there are ignored); "
                    "this script's own from BENCH_CACHE_ARGS.")
    p.add_argument("--quick", action="store_true", help="20,000 records, 500 large files")
    p.add_argument("--files", type=int, help="record files (default 100,000)")
    p.add_argument("--file-size", type=int, help="bytes per record file (default 3072)")
    p.add_argument("--classes", type=int, help="class folders (default 100)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    if defaults_only:
        return p
    p.add_argument("--large-files", type=int, help="large-sample files (default 2,000)")
    p.add_argument("--large-size", type=int, help="bytes per large file (default 1 MiB)")
    p.add_argument("--cached-epochs", type=int, default=16,
                   help="records: epochs read from the cache (stream 2; default 16)")
    p.add_argument("--files-epochs", type=int, default=8, help="records: epochs read from the files (default 8)")
    p.add_argument("--large-epochs", type=int, default=6,
                   help="large: epochs from the cache and from the files (default 6)")
    p.add_argument("--torch-workers", default="0,2", help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--torch-epochs", type=int, default=2, help="DataLoader epochs (steady: 1..; default 2)")
    p.add_argument("--max-samples", type=int, default=200_000)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--memcpy-mib", type=int, default=512)
    p.add_argument("--no-cold", action="store_true", help="skip the cold page cache measurement")
    p.add_argument("--skip-torch", action="store_true", help="loaderd only (development)")
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--build-timeout", type=float, default=300.0, help="seconds allowed for a cache build")
    p.add_argument("--read-timeout", type=float, default=300.0, help="seconds allowed for one loaderctl read")
    return p


def parse_args(argv):
    # Record-dataset options from BENCH_ARGS (bench.py's line); the rest of it is bench.py's.
    shared_argv = shlex.split(os.environ.get("BENCH_ARGS", ""))
    shared, ignored = parser(defaults_only=True).parse_known_args(shared_argv)
    p = parser()
    p.set_defaults(**{k: getattr(shared, k) for k in SHARED})
    a = p.parse_args(shlex.split(os.environ.get("BENCH_CACHE_ARGS", "")) + argv)
    a.ignored_bench_args = ignored
    base = bench.QUICK if a.quick else bench.FULL
    lbase = QUICK_LARGE if a.quick else FULL_LARGE
    for k in ("files", "file_size", "classes"):
        if getattr(a, k) is None:
            setattr(a, k, base[k])
    for k in ("large_files", "large_size"):
        if getattr(a, k) is None:
            setattr(a, k, lbase[k])
    if min(a.files, a.file_size, a.classes, a.large_files, a.large_size) < 1:
        p.error("dataset sizes must be >= 1")
    if a.cached_epochs < 2 or a.files_epochs < 2 or a.large_epochs < 2:
        p.error("--cached-epochs, --files-epochs, --large-epochs must be >= 2 (a stream's first epoch "
                "is not the steady state)")
    try:
        a.torch_workers = [int(w) for w in a.torch_workers.split(",") if w.strip()]
    except ValueError:
        p.error("--torch-workers: a comma-separated list of integers")
    if a.torch_epochs < 1 or a.max_samples < 1 or a.max_seconds <= 0 or a.memcpy_mib < 1:
        p.error("--torch-epochs, --max-samples, --max-seconds, --memcpy-mib must be positive")
    return a


def main():
    if len(sys.argv) == 3 and sys.argv[1].startswith("--child-"):
        kind, spec = sys.argv[1][len("--child-"):], json.loads(sys.argv[2])
        return {"pickle-build": child_pickle_build, "pickle-load": child_pickle_load,
                "memcpy": child_memcpy}[kind](spec)
    args = parse_args(sys.argv[1:])
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    measure.ensure_system_python(("numpy", "torch"), __file__)
    t_start = time.perf_counter()

    build = args.build_dir if os.path.isabs(args.build_dir) else os.path.join(REPO, args.build_dir)
    bins = {n: os.path.join(build, "bin", n) for n in ("loaderd", "loaderctl", "ld-gendata")}
    for n, path in bins.items():
        if not os.access(path, os.X_OK):
            fail(f"{path} not found: build first (make all)")
    data_dir = os.path.abspath(args.data_dir)
    results_dir = os.path.abspath(args.results_dir)
    raw = os.path.join(results_dir, "cache-raw")
    cache_dir = os.path.join(data_dir, "cache")
    for d in (data_dir, results_dir, raw, cache_dir):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(raw, "loaderd.log"), "w"), open(os.path.join(raw, "loaderd-cold.log"), "w"):
        pass                    # the Daemon appends; start each run with empty logs

    rec_name = f"records-{args.files}x{args.file_size}-c{args.classes}"
    large_name = f"large-{args.large_files}x{args.large_size}-c10"
    rec_dir = os.path.join(data_dir, rec_name)
    large_dir = os.path.join(data_dir, large_name)
    rec_cache = os.path.join(cache_dir, rec_name + ".ldc")
    large_cache = os.path.join(cache_dir, large_name + ".ldc")
    pkl_path = os.path.join(cache_dir, rec_name + ".pkl")
    paths = (rec_dir, rec_cache, large_dir, large_cache)

    rec_files = generate(bins["ld-gendata"], rec_dir, args.files, args.file_size, args.classes)
    large_files = generate(bins["ld-gendata"], large_dir, args.large_files, args.large_size, 10)
    removed = remove_cache_files(rec_cache) + remove_cache_files(large_cache)
    if removed:
        log("bench_cache: removed old cache files: " + ", ".join(removed))
    warmed = [warm(rec_dir, rec_files), warm(large_dir, large_files)]

    failures, res = [], {}
    errors = []
    try:
        res["warm"] = run_warm(args, bins, paths, raw, errors)
        log("bench_cache: memory bandwidth (numpy copy)")
        mc, _, _ = run_child("memcpy", {"mib": args.memcpy_mib, "repeat": 3}, raw, "memcpy", 120)
        if mc is None:
            failures.append("memory bandwidth measurement failed")
        res["memcpy"] = mc
        if not args.skip_torch:
            res["torch"] = run_torch(args, rec_dir, pkl_path, raw, failures)
        if args.no_cold:
            res["cold"] = {"measured": False, "reason": "skipped with --no-cold"}
        else:
            res["cold"] = run_cold(args, bins, paths, raw, errors)
            if not res["cold"]["measured"]:
                log(f"bench_cache: cold: not measured ({res['cold']['reason']})")
    finally:
        try:
            os.unlink(pkl_path)
        except OSError:
            pass
    failures[:0] = ["loaderd: " + e for e in errors]
    res["summary"] = summarize(res)

    meta = {
        "machine": measure.machine_info((res.get("torch") or {}).get("files", [])),
        "command": " ".join(
            [f"{k}={shlex.quote(os.environ[k])}" for k in ("BENCH_ARGS", "BENCH_CACHE_ARGS") if os.environ.get(k)]
            + ["/usr/bin/python3 bench/bench_cache.py"] + [shlex.quote(a) for a in sys.argv[1:]]),
        "params": {"quick": args.quick, "files": args.files, "file_size": args.file_size,
                   "classes": args.classes, "large_files": args.large_files, "large_size": args.large_size,
                   "records_batch": RECORDS_BATCH, "large_batch": LARGE_BATCH,
                   "daemon_workers": DAEMON_WORKERS, "poll_build_s": POLL_BUILD_S, "cached_epochs": args.cached_epochs,
                   "files_epochs": args.files_epochs, "large_epochs": args.large_epochs,
                   "torch_workers": args.torch_workers, "torch_epochs": args.torch_epochs,
                   "max_samples": args.max_samples, "max_seconds": args.max_seconds,
                   "memcpy_mib": args.memcpy_mib, "memcpy_repeat": 3, "seed": SEED,
                   "build_dir": args.build_dir, "cold": not args.no_cold,
                   "ignored_bench_args": args.ignored_bench_args},
        "page_cache_warm": warmed,
        "failures": failures,
        "wall_s": time.perf_counter() - t_start,
    }
    with open(os.path.join(results_dir, "cache.md"), "w") as f:
        f.write(render(res, meta))
    with open(os.path.join(results_dir, "cache.json"), "w") as f:
        json.dump({**meta, **res}, f, indent=2)
        f.write("\n")
    print()
    m = meta["machine"]
    print(f"cache bench: {m['date']}  {m['nproc']} CPUs ({m['cpu_model']}), {meta['wall_s']:.0f} s")
    print(console(res, meta["params"]))
    print(f"results: {os.path.join(results_dir, 'cache.md')}, cache.json", flush=True)
    if failures:
        log("bench_cache: FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
