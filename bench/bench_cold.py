#!/usr/bin/python3
"""bench_cold — many small files read from a cold page cache: loaderd against PyTorch's
DataLoader and against what the disk itself serves (issue 15, item 4).

1. Generates (once; deterministic) 20,000 files of 3,072 bytes in 100 class folders
   (`--quick`: 5,000) with ld-gendata, and a 512 MiB file for fio.
2. fio on the same file system: 4 KiB random reads, O_DIRECT, 32 blocking threads (psync)
   and one, 5 s each; and at queue depth 32 (io_uring), the figure the target compares
   with, once per run, interleaved with the readers below: IOPS, the disk's ceiling for
   small reads.
3. loaderd (`server.workers: 2`), two datasets over the same files: `cold` (read-ahead on,
   the default 32 I/O threads) and `cold_noahead` (`read_ahead: 0`). For each, --runs
   times: empty the page cache (`echo 3 > /proc/sys/vm/drop_caches`: data, dentries and
   inodes), then `loaderctl read DS --epochs 1 --touch --json` (every byte read). samples/s,
   CPU per sample (the daemon's utime + stime and loaderctl's own), the disk's reads
   during the epoch (/proc/diskstats: requests completed, IOPS) and the daemon's
   read-ahead counters.
4. DataLoader (bench.py's dataset: `open(path, 'rb').read()` per file, batch 64, shuffled,
   every batch copied) at num_workers 0, 2 and 8 (more workers, more reads in flight), each
   in a fresh process that lists the files, empties the page cache and times one epoch
   (workers start inside it, as they would at the start of a job); as many runs of each
   as loaderd's, interleaved with them (run 1 of every reader, then run 2, ...), and the
   median of each configuration's runs is compared (fio's at depth 32 as well: a virtual
   disk's speed changes from one minute to the next, by 15% here, and a single fio
   figure taken before the readers compares them with another minute's disk).

Without root, the page cache is emptied file by file (POSIX_FADV_DONTNEED after a
syncfs); dentries and inodes then stay cached, which the report says. Targets: cold
loaderd >= 4x DataLoader's best, and its files/s >= 80% of fio's IOPS at depth 32. Writes
bench/results/cold.{md,json}. Run with Debian's /usr/bin/python3 (numpy, torch). Options
also from BENCH_COLD_ARGS; `--quick` in BENCH_ARGS is honoured. Note: this empties the
page cache of the whole machine, several times.
"""

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import measure  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)

FILES, QUICK_FILES, FILE_SIZE, CLASSES = 20_000, 5_000, 3072, 100
BATCH = 64
FIO_SIZE = "512M"
log = measure.log


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_COLD_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_FILES:,} files, one run")
    p.add_argument("--files", type=int, default=None, help=f"files (default {FILES:,})")
    p.add_argument("--runs", type=int, default=None, help="cold epochs per loaderd dataset (default 3; quick 1)")
    p.add_argument("--workers", default="0,2,8", help="DataLoader num_workers values")
    p.add_argument("--fio-seconds", type=int, default=5)
    p.add_argument("--no-fio", action="store_true")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--child", help=argparse.SUPPRESS)   # internal: a DataLoader run (JSON spec)
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.files = a.files or (QUICK_FILES if a.quick else FILES)
    a.runs = a.runs or (1 if a.quick else 3)
    a.workers = [int(w) for w in a.workers.split(",") if w != ""]
    return a


# ---------------------------------------------------------------------------------------
# The page cache and the disk

def make_cold(root):
    """Empties the page cache. Returns how: "drop_caches" (everything: data, dentries,
    inodes) or "fadvise" (each file's pages under root; dentries and inodes stay)."""
    if measure.drop_caches() is None:
        return "drop_caches"
    fd = os.open(root, os.O_RDONLY)
    try:
        os.syncfs(fd) if hasattr(os, "syncfs") else os.sync()
    finally:
        os.close(fd)
    for dirpath, _, names in os.walk(root):
        for n in names:
            try:
                f = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(f)
    return "fadvise"


def block_device(path):
    """The /proc/diskstats name of the disk under path (a partition's parent is not
    needed: the partition's own counters are the reads of this file system)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if int(p[0]) == major and int(p[1]) == minor:
                    return p[2]
    except (OSError, ValueError, IndexError):
        pass
    return None


def disk_reads(dev):
    """(reads completed, sectors read) of dev, or None."""
    if not dev:
        return None
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == dev:
                return int(p[3]), int(p[5])
    return None


FIO_JOBS = (("io_uring_qd32", ["--ioengine=io_uring", "--iodepth=32"]),
            ("psync_32_threads", ["--ioengine=psync", "--numjobs=32"]),
            ("psync_qd1", ["--ioengine=psync", "--numjobs=1"]))


def run_fio(args, path, names):
    """IOPS of 4 KiB random reads with O_DIRECT, for each fio job of FIO_JOBS named in
    `names` (io_uring at depth 32, 32 threads of blocking reads, one thread). {name: {...}}
    or {"error": why}."""
    out = {}
    base = ["fio", "--name=randread", f"--filename={path}", f"--size={FIO_SIZE}", "--rw=randread", "--bs=4k",
            "--direct=1", f"--runtime={args.fio_seconds}", "--time_based", "--group_reporting",
            "--output-format=json"]
    for name, extra in FIO_JOBS:
        if name not in names:
            continue
        cmd = base + extra
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.fio_seconds + 120)
        except FileNotFoundError:
            return {"error": "fio is not installed (apt-get install fio; scripts/deps.sh bench installs it)"}
        except subprocess.TimeoutExpired:
            out[name] = {"error": "timed out"}
            continue
        if r.returncode != 0:
            out[name] = {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}
            continue
        try:
            j = json.loads(r.stdout[r.stdout.index("{"):])
            rd = j["jobs"][0]["read"]
            iops = float(rd["iops"])
            out[name] = {"iops": iops, "mb_per_s": rd["bw_bytes"] / measure.MB,
                         "lat_us_mean": rd.get("lat_ns", {}).get("mean", 0) / 1000, "command": " ".join(cmd)}
        except (ValueError, KeyError, IndexError, TypeError) as e:  # a run between readers must not lose them
            out[name] = {"error": f"unreadable fio output ({type(e).__name__}: {e}): {r.stdout.strip()[-200:]!r}"}
            continue
        if iops <= 0:
            out[name] = {"error": "fio measured 0 IOPS", "command": " ".join(cmd)}
            continue
        log(f"bench_cold: fio {name}: {iops:,.0f} IOPS")
    return out


def fio_qd32_row(runs):
    """fio at depth 32 over the runs as one row: the median IOPS, MB/s and latency, every
    measured run's IOPS under "runs", out of "tried"; {"error": why} when no run measured
    it."""
    ok = [r for r in runs if r and r.get("iops")]
    if not ok:
        why = next((r["error"] for r in runs if r and r.get("error")), "no run")
        return {"error": f"{why} ({len(runs)} runs)"}
    row = {"iops": measure.median([r["iops"] for r in ok]), "mb_per_s": measure.median([r["mb_per_s"] for r in ok]),
           "lat_us_mean": measure.median([r["lat_us_mean"] for r in ok]), "runs": [r["iops"] for r in ok],
           "tried": len(runs), "command": ok[-1]["command"]}
    if len(ok) < len(runs):
        row["error"] = "; ".join(r["error"] for r in runs if r and r.get("error")) or "a run measured nothing"
    return row


# ---------------------------------------------------------------------------------------
# loaderd

def write_config(path, sock, root):
    with open(path, "w") as f:
        f.write(f"""# Written by bench/bench_cold.py; regenerated on every run.
server:
  socket: "{sock}"
  workers: 2
  memory_budget: 1GiB
  log_level: warn
datasets:
  cold:
    kind: files
    path: "{root}"
    pattern: "*.bin"
  cold_noahead:
    kind: files
    path: "{root}"
    pattern: "*.bin"
    read_ahead: 0
""")


def start_daemon(bins, cfg, sock, log_path):
    with open(log_path, "wb") as lf:
        proc = subprocess.Popen([bins["loaderd"], "--config", cfg], stdout=lf, stderr=lf,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    t0 = time.perf_counter()
    while not (os.path.exists(sock) and measure.socket_accepts(sock)):
        if proc.poll() is not None:
            measure.fail(f"loaderd exited {proc.returncode} during start-up" + measure.log_tail(log_path))
        if time.perf_counter() - t0 > 120:
            proc.kill()
            measure.fail("loaderd's socket did not come up in 120 s")
        time.sleep(0.02)
    return proc


def read_ahead_of(bins, sock, name):
    for d in measure.loaderctl_json(bins["loaderctl"], sock, "--json", "datasets")["datasets"]:
        if d.get("name") == name:
            return d.get("read_ahead")
    return None


def loaderd_run(args, bins, sock, daemon, ds, root, dev, raw, tag):
    how = make_cold(root)
    before_ra = read_ahead_of(bins, sock, ds)
    d0, disk0 = measure.cpu_seconds(daemon.pid), disk_reads(dev)
    out_p, err_p = os.path.join(raw, tag + ".json"), os.path.join(raw, tag + ".err")
    cmd = [bins["loaderctl"], "--socket", sock, "read", ds, "--epochs", "1", "--batch-size", str(BATCH),
           "--touch", "--json"]
    code, _, mem, wall = measure.run_monitored(cmd, out_p, err_p, 600, 0)
    d1, disk1 = measure.cpu_seconds(daemon.pid), disk_reads(dev)
    if code != 0:
        log(f"bench_cold: {' '.join(cmd)} exited {code}: {measure.tail(err_p)}")
        return None
    with open(out_p) as f:
        r = json.load(f)
    after_ra = read_ahead_of(bins, sock, ds)
    ctl_cpu = mem.rusage.ru_utime + mem.rusage.ru_stime
    samples, secs = r["samples"], r["seconds"]
    row = {"loader": "loaderd", "dataset": ds, "read_ahead": ds == "cold", "cold_by": how,
           "samples": samples, "seconds": secs, "samples_per_s": r["samples_per_s"],
           "first_batch_ms": r.get("first_batch_ms"),
           "cpu_s_per_1000": ((d1 - d0) + ctl_cpu) / samples * 1000 if d0 is not None and d1 is not None else None,
           "cpu_split_s": {"daemon": d1 - d0 if d0 is not None and d1 is not None else None, "loaderctl": ctl_cpu}}
    if disk0 and disk1:
        row["disk_reads"] = disk1[0] - disk0[0]
        row["disk_mb"] = (disk1[1] - disk0[1]) * 512 / measure.MB
        row["disk_iops"] = row["disk_reads"] / wall if wall > 0 else None
    if before_ra and after_ra:
        row["read_ahead_samples"] = after_ra["samples"] - before_ra["samples"]
        row["read_ahead_misses"] = after_ra["misses"] - before_ra["misses"]
        row["read_ahead_failed"] = after_ra["failed"] - before_ra["failed"]
        if "read_once" in after_ra:  # the samples the workers copied from the read-ahead's buffers
            row["read_once"] = after_ra["read_once"] - before_ra.get("read_once", 0)
    if samples != args.files:
        row["error"] = f"{samples} samples delivered, {args.files} expected"
    log(f"bench_cold: loaderd {ds}: {row['samples_per_s']:,.0f} samples/s cold")
    return row


# ---------------------------------------------------------------------------------------
# DataLoader (child process)

def child_main(spec):
    import resource
    import torch
    from torch.utils.data import DataLoader, Dataset

    root = spec["root"]
    files = [os.path.join(root, p) for p in measure_list(root)]
    labels = [int(os.path.basename(os.path.dirname(p)).split("_")[1]) for p in files]

    class Records(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            with open(files[i], "rb") as f:
                b = f.read()
            return torch.frombuffer(bytearray(b), dtype=torch.uint8), labels[i]

    w = spec["workers"]
    dl = DataLoader(Records(), batch_size=BATCH, shuffle=True, num_workers=w,
                    **({"prefetch_factor": 4} if w > 0 else {}))
    how = make_cold(root)

    def cpu():
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    n = 0
    for data, label in dl:
        data.clone()
        label.clone()
        n += data.shape[0]
    secs = time.perf_counter() - t0
    del dl                          # workers (not persistent) have exited: their CPU is counted
    c1 = cpu()
    print(json.dumps({"samples": n, "seconds": secs, "samples_per_s": n / secs, "cold_by": how,
                      "cpu_s_per_1000": (c1 - c0) / n * 1000, "torch": torch.__version__}))


def measure_list(root):
    """Sorted relative paths of the *.bin files (what the DataLoader's Dataset lists)."""
    out = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        out.extend(os.path.join(rel, n) for n in sorted(names) if n.endswith(".bin"))
    return out


def dataloader_run(args, root, dev, workers, raw, run=1):
    tag = f"dataloader-w{workers}-run{run}"
    out_p, err_p = os.path.join(raw, tag + ".json"), os.path.join(raw, tag + ".err")
    spec = json.dumps({"root": root, "workers": workers})
    disk0 = disk_reads(dev)
    code, _, _, wall = measure.run_monitored([measure.SYSTEM_PYTHON, os.path.abspath(__file__), "--child", spec],
                                             out_p, err_p, 900, 0)
    disk1 = disk_reads(dev)
    if code != 0:
        log(f"bench_cold: DataLoader w{workers} exited {code}: {measure.tail(err_p)}")
        return None
    with open(out_p) as f:
        r = json.load(f)
    r.update({"loader": "DataLoader", "workers": workers})
    if disk0 and disk1:
        r["disk_reads"] = disk1[0] - disk0[0]
    if r["samples"] != args.files:
        r["error"] = f"{r['samples']} samples, {args.files} expected"
    log(f"bench_cold: DataLoader w{workers}: {r['samples_per_s']:,.0f} samples/s cold")
    return r


# ---------------------------------------------------------------------------------------
# Report

def median_row(rows):
    """One configuration's runs as one row: the median samples/s and CPU, every run's
    samples/s under "runs" (None when no run succeeded)."""
    ok = [r for r in rows if r]
    if not ok:
        return None
    out = dict(ok[-1])
    out["samples_per_s"] = measure.median([r["samples_per_s"] for r in ok])
    out["cpu_s_per_1000"] = measure.median([r["cpu_s_per_1000"] for r in ok])
    out["runs"] = [r["samples_per_s"] for r in ok]
    if any(r.get("error") for r in ok):
        out["error"] = "; ".join(r["error"] for r in ok if r.get("error"))
    return out


def best(rows, key="samples_per_s"):
    return max((r for r in rows if r and r.get(key)), key=lambda r: r[key], default=None)


def render(res):
    fmt = measure.fmt
    L = ["# Cold storage: small files from an empty page cache", "",
         f"{res['files']:,} files of {FILE_SIZE:,} bytes in {CLASSES} folders, batch {BATCH}, shuffled, every byte "
         f"read; one epoch per run, the page cache emptied before each ({res['cold_by']}). loaderd: 2 workers, "
         "`loaderctl read --touch`; DataLoader: `open().read()` per file, every batch copied.", ""]
    if res["cold_by"] == "fadvise":
        L += ["**Not root:** pages dropped file by file (POSIX_FADV_DONTNEED); dentries and inodes stayed "
              "cached, so these figures are warmer than a real cold start.", ""]
    fio = res.get("fio") or {}
    L += ["| reader | samples/s (median) | runs | CPU ms / 1,000 | disk reads | disk IOPS | read ahead |",
          "|---|---:|---|---:|---:|---:|---:|"]
    for name, rows in (("loaderd, read-ahead (32 I/O threads)", res["loaderd"]["cold"]),
                       ("loaderd, `read_ahead: 0`", res["loaderd"]["cold_noahead"])):
        ok = [r for r in rows if r]
        if not ok:
            L.append(f"| {name} | failed | | | | | |")
            continue
        med = measure.median([r["samples_per_s"] for r in ok])
        cpu = measure.median([r["cpu_s_per_1000"] for r in ok if r.get("cpu_s_per_1000") is not None])
        runs = ", ".join(format(r["samples_per_s"], ",.0f") for r in ok)
        L.append(f"| {name} | {med:,.0f} | {runs} | "
                 f"{fmt(cpu and cpu * 1000, ',.0f')} | {fmt(ok[-1].get('disk_reads'), ',')} | "
                 f"{fmt(ok[-1].get('disk_iops'), ',.0f')} | {fmt(ok[-1].get('read_ahead_samples'), ',')} |")
    for r in res["dataloader"]:
        if r:
            runs = ", ".join(format(x, ",.0f") for x in r.get("runs", [r["samples_per_s"]]))
            L.append(f"| DataLoader, num_workers={r['workers']} | {r['samples_per_s']:,.0f} | {runs} | "
                     f"{r['cpu_s_per_1000'] * 1000:,.0f} | {fmt(r.get('disk_reads'), ',')} | | |")
    L += ["", "| disk (fio, 4 KiB random reads, O_DIRECT, same file system) | IOPS | runs | MB/s | mean latency µs |",
          "|---|---:|---|---:|---:|"]
    if "error" in fio:
        L.append(f"| fio | {fio['error']} | | | |")
    for name, v in fio.items():
        if isinstance(v, dict):
            runs = ""
            if v.get("runs"):
                runs = "median of " + ", ".join(format(x, ",.0f") for x in v["runs"])
                if v["tried"] > len(v["runs"]):
                    runs += f" ({len(v['runs'])} of {v['tried']} runs measured: {v.get('error')})"
            L.append(f"| {name} | {fmt(v.get('iops'), ',.0f', v.get('error', '—'))} | {runs} | "
                     f"{fmt(v.get('mb_per_s'), ',.0f')} | {fmt(v.get('lat_us_mean'), ',.0f')} |")
    s = res["summary"]
    L += ["", f"**Ratios:** loaderd cold ÷ best DataLoader cold = {fmt(s.get('vs_dataloader'), '.2f')}× "
          f"(target ≥ 4×; best DataLoader: num_workers={s.get('best_dataloader_workers')}); "
          f"loaderd files/s ÷ fio IOPS at depth 32 = {fmt(s.get('vs_fio_qd32') and s['vs_fio_qd32'] * 100, '.0f')}% "
          f"(target ≥ 80%); read-ahead ÷ no read-ahead = {fmt(s.get('vs_noahead'), '.2f')}×.",
          "", "A small file costs more than one 4 KiB read (its directory block and inode, shared with its "
          "neighbours): the disk reads column is what the epoch asked of the disk."]
    return "\n".join(L) + "\n"


def main(argv):
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    measure.ensure_system_python(("numpy", "torch"))
    bd = os.path.join(measure.REPO, args.build_dir) if not os.path.isabs(args.build_dir) else args.build_dir
    bins = {n: os.path.join(bd, "bin", n) for n in ("loaderd", "loaderctl", "ld-gendata")}
    for n, p in bins.items():
        if not os.access(p, os.X_OK):
            measure.fail(f"{p} not found: run make first")
    os.makedirs(args.results_dir, exist_ok=True)
    raw = os.path.join(args.results_dir, "cold-raw")
    os.makedirs(raw, exist_ok=True)
    root = os.path.join(args.data_dir, f"cold-{args.files}x{FILE_SIZE}-c{CLASSES}")
    t0 = time.perf_counter()
    subprocess.run([bins["ld-gendata"], "files", root, "--count", str(args.files), "--size", str(FILE_SIZE),
                    "--classes", str(CLASSES)], check=True, stdout=subprocess.DEVNULL)
    dev = block_device(root)
    res = {"files": args.files, "file_size": FILE_SIZE, "batch": BATCH, "device": dev,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "machine": measure.machine_info(), "command": " ".join(["bench/bench_cold.py", *argv])}

    fio_file = os.path.join(args.data_dir, "fio-cold.dat")
    if not args.no_fio:
        res["fio"] = run_fio(args, fio_file, ("psync_32_threads", "psync_qd1"))
    fio_runs = []

    tmp = tempfile.mkdtemp(prefix="ld-cold-")
    sock, cfg = os.path.join(tmp, "s.sock"), os.path.join(raw, "cold.yaml")
    write_config(cfg, sock, root)
    daemon = start_daemon(bins, cfg, sock, os.path.join(raw, "loaderd.log"))
    res["loaderd"] = {"cold": [], "cold_noahead": []}
    # As many runs of each DataLoader configuration as of loaderd's, interleaved with them,
    # so that both sides' medians see the same moods of the disk (a virtual disk's speed
    # can change from one minute to the next).
    res["dataloader_runs"] = {w: [] for w in ([] if args.skip_torch else args.workers)}
    try:
        for i in range(args.runs):
            if not args.no_fio and "error" not in res["fio"]:
                got = run_fio(args, fio_file, ("io_uring_qd32",))
                fio_runs.append(got.get("io_uring_qd32") or {"error": got.get("error", "no result")})
            for ds in ("cold", "cold_noahead"):
                res["loaderd"][ds].append(loaderd_run(args, bins, sock, daemon, ds, root, dev, raw, f"{ds}-run{i + 1}"))
            for w, rows in res["dataloader_runs"].items():
                rows.append(dataloader_run(args, root, dev, w, raw, i + 1))
    finally:
        daemon.terminate()
        rc = daemon.wait(timeout=30)
        os.unlink(sock) if os.path.exists(sock) else None
        os.rmdir(tmp)
    res["loaderd_exit"] = rc
    if fio_runs:
        res["fio"] = {"io_uring_qd32": fio_qd32_row(fio_runs), **res["fio"]}
    res["dataloader"] = [median_row(rows) for rows in res["dataloader_runs"].values()]
    res["cold_by"] = next((r["cold_by"] for r in res["loaderd"]["cold"] if r), "?")

    med = lambda rows: measure.median([r["samples_per_s"] for r in rows if r]) if any(rows) else None  # noqa: E731
    ld, noahead = med(res["loaderd"]["cold"]), med(res["loaderd"]["cold_noahead"])
    bdl = best(res["dataloader"])
    fio_qd32 = ((res.get("fio") or {}).get("io_uring_qd32") or {}).get("iops")
    res["summary"] = {"loaderd_samples_per_s": ld, "noahead_samples_per_s": noahead,
                      "best_dataloader_samples_per_s": bdl and bdl["samples_per_s"],
                      "best_dataloader_workers": bdl and bdl["workers"],
                      "vs_dataloader": measure.ratio(ld, bdl and bdl["samples_per_s"]),
                      "vs_fio_qd32": measure.ratio(ld, fio_qd32), "vs_noahead": measure.ratio(ld, noahead)}
    res["seconds"] = time.perf_counter() - t0
    md = render(res)
    dated = measure.write_results(args.results_dir, "cold", res, md)
    print(md)
    log(f"bench_cold: results: {args.results_dir}/cold.md (and {dated}.md, to commit)")
    failed = rc != 0 or not ld or any(r and r.get("error") for r in res["loaderd"]["cold"] + res["dataloader"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
