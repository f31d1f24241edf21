#!/usr/bin/python3
"""bench_images — loaderd's image pipeline against PyTorch's DataLoader with torchvision,
and against the decoder's own floor, in one run.

1. Generates (once; deterministic) an ImageFolder of JPEGs with ld-genimages: 10,000
   images (--quick: 1,000), quality 90, sides 256–500 px, 100 class folders; reads every
   file once so that all loaders read from the page cache.
2. The floor: ld-imgfloor (bench/ld-imgfloor.c) runs, on one thread over images held in
   memory, the daemon's own per-sample path (the crop region decoded at the scale the
   pipeline's planner chooses, full size by default, then resized, flipped, written CHW): the fastest known way to produce the same
   output; for context also the whole-image decode PIL does, with and without a resize.
3. loaderd, started twice (server.workers 1, then 2), each time read by `loaderctl read
   images --epochs 2 --batch-size 64 --touch --json` with RandomResizedCrop 224 +
   horizontal flip + uint8 CHW: samples/s (epoch 1 steady, and epoch 0) and the CPU
   seconds of the daemon and loaderctl per 1,000 samples.
4. PyTorch's DataLoader over torchvision's ImageFolder (PIL open + convert("RGB") →
   RandomResizedCrop(224) → RandomHorizontalFlip() → PILToTensor(), uint8 CHW), batch
   64, shuffle, num_workers 1 and 2 (persistent workers), each in its own process, the
   loop copying every batch: samples/s and the CPU seconds of the process tree (main +
   workers) per 1,000 samples.

Prints a table and writes bench/results/images.md and images.json. What is measured and
how: bench/README.md ("Images"). Run with Debian's /usr/bin/python3 (torch,
torchvision); `make bench` runs it after bench.py. Options may also come from the
BENCH_IMAGES_ARGS environment variable; `--quick` in BENCH_ARGS is honoured too.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SYSTEM_PYTHON = "/usr/bin/python3"
sys.path.insert(0, HERE)
import bench as B  # noqa: E402  (helpers shared with the main benchmark)
import measure  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)

FULL = {"images": 10_000}
QUICK = {"images": 1_000}
CLASSES = 100
MIN_PX, MAX_PX, QUALITY = 256, 500, 90
SIZE = 224
BATCH = 64
SEED = 0
FLOOR_MODE = "crop"              # ld-imgfloor's mode that is the floor (see bench/ld-imgfloor.c)
PREFETCH_FACTOR = 4              # DataLoader's prefetch_factor with workers (as bench.py)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    measure.log(msg)


def proc_cpu_s(pid, children=False):
    """utime + stime of /proc/PID/stat in seconds (with cutime + cstime: the reaped
    children's too), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3): utime is field 14, i.e. fields[11]
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def machine_busy_s():
    """CPU seconds the whole machine has spent busy (every CPU; /proc/stat's first line:
    user + nice + system + irq + softirq + steal)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK


class Phase:
    """Measures how much CPU the rest of the machine used during a phase: the machine's
    busy time minus the CPU of this process and of every process it started and reaped
    during the phase (getrusage RUSAGE_SELF + RUSAGE_CHILDREN; descendants count once
    reaped). Another benchmark or a build running meanwhile shows here, and the figures
    of that phase should not be trusted."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.busy0 = machine_busy_s()
        self.own0 = self._own()
        return self

    @staticmethod
    def _own():
        a = resource.getrusage(resource.RUSAGE_SELF)
        b = resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    def __exit__(self, *exc):
        self.wall_s = time.perf_counter() - self.t0
        busy1 = machine_busy_s()
        own = self._own() - self.own0
        self.other_cpu_s = (max(0.0, busy1 - self.busy0 - own)
                            if busy1 is not None and self.busy0 is not None else None)
        ncpu = os.cpu_count() or 1
        self.other_share = (self.other_cpu_s / (self.wall_s * ncpu)
                            if self.other_cpu_s is not None and self.wall_s > 0 else None)
        PHASES.append({"phase": self.name, "wall_s": self.wall_s, "own_cpu_s": own,
                       "other_cpu_s": self.other_cpu_s, "other_share": self.other_share})
        if self.other_share is not None and self.other_share > OTHER_LOAD_WARN:
            log(f"bench_images: warning: other processes used {self.other_cpu_s:.1f} CPU s "
                f"({self.other_share * 100:.0f}% of the machine) during {self.name}")
        return False


PHASES = []
OTHER_LOAD_WARN = 0.05


# ---------------------------------------------------------------------------------------
# Data

def generate(args, genimages):
    os.makedirs(args.data_dir, exist_ok=True)
    img_dir = os.path.join(args.data_dir, f"images-{args.images}")
    cmd = [genimages, img_dir, "--count", str(args.images), "--classes", str(CLASSES),
           "--min", str(MIN_PX), "--max", str(MAX_PX), "--quality", str(QUALITY)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        measure.fail(f"{shlex.join(cmd)} exited {r.returncode}:\n" + r.stdout.decode(errors="replace")[-2000:])
    log(f"bench_images: {r.stdout.decode(errors='replace').strip()} ({time.perf_counter() - t0:.1f} s)")
    files = B.list_files(img_dir, "*.jpg")
    if len(files) != args.images:
        measure.fail(f"{img_dir} holds {len(files)} *.jpg files, expected {args.images}")
    return img_dir, files


def warm_page_cache(img_dir, files):
    t0 = time.perf_counter()
    total = 0
    for rel in files:
        with open(os.path.join(img_dir, rel), "rb", buffering=0) as f:
            total += len(f.read())
    dt = time.perf_counter() - t0
    log(f"bench_images: page cache warmed: {len(files):,} files, {total / measure.MIB:.0f} MiB in {dt:.1f} s")
    return {"bytes": total, "seconds": dt, "mean_file_bytes": total / max(1, len(files))}


# ---------------------------------------------------------------------------------------
# The floor (ld-imgfloor)

def run_floor(args, imgfloor, img_dir, failures):
    cmd = [imgfloor, img_dir, "--pattern", "*.jpg", "--size", str(SIZE), "--json"]
    if args.floor_images:
        cmd += ["--limit", str(args.floor_images)]
    log(f"bench_images: floor: {shlex.join(cmd[1:])}")
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    except subprocess.TimeoutExpired:
        failures.append("ld-imgfloor ran past 600 s")
        return None
    if r.returncode != 0:
        failures.append(f"ld-imgfloor exited {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
        return None
    try:
        res = json.loads(r.stdout)
        res["modes"][FLOOR_MODE]["images_per_s"]
    except (ValueError, KeyError, TypeError) as e:
        failures.append(f"ld-imgfloor: unreadable output ({e})")
        return None
    for name, m in res["modes"].items():
        log(f"bench_images: floor {name}: {m['ms_per_image']:.3f} ms/image, "
            f"{m['images_per_s']:,.0f} images/s per core")
    return res


# ---------------------------------------------------------------------------------------
# loaderd

def write_config(path, sock, img_dir, workers):
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    text = f"""# Written by bench/bench_images.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {workers}
  memory_budget: 1GiB
  log_level: warn
datasets:
  images:
    kind: image_folder
    path: {q(img_dir)}
    pattern: "*.jpg"
    transforms:
      - random_resized_crop: {{size: {SIZE}}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
"""
    with open(path, "w") as f:
        f.write(text)


def run_loaderd(args, bins, img_dir, workers, failures):
    """One daemon run with `workers` worker threads: start, check the layout, read
    args.loaderd_epochs epochs, stop with SIGTERM. Returns a row or None."""
    loaderd, loaderctl = bins["loaderd"], bins["loaderctl"]
    rd = args.results_dir
    tmp = tempfile.mkdtemp(prefix="ld-bench-img-")
    sock = os.path.join(tmp, "loaderd.sock")
    cfg = os.path.join(rd, f"images-w{workers}.yaml")
    write_config(cfg, sock, img_dir, workers)
    daemon_log = os.path.join(rd, f"images-loaderd-w{workers}.log")
    out_p = os.path.join(rd, f"images-loaderctl-w{workers}.json")
    err_p = os.path.join(rd, f"images-loaderctl-w{workers}.err")
    shm_before = measure.shm_loaderd_objects()
    daemon, row, errors = None, None, []

    def err(msg):
        errors.append(msg)
        failures.append(f"loaderd workers={workers}: {msg}")
        log(f"bench_images: loaderd w={workers}: {msg}")

    try:
        with open(daemon_log, "wb") as lf:
            t0 = time.perf_counter()
            daemon = subprocess.Popen([loaderd, "--config", cfg], stdout=lf, stderr=lf,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        while True:
            if daemon.poll() is not None:
                err(f"exited {daemon.returncode} during start-up" + measure.log_tail(daemon_log))
                return None
            if os.path.exists(sock) and measure.socket_accepts(sock):
                break
            if time.perf_counter() - t0 > args.startup_timeout:
                err(f"socket {sock} not up after {args.startup_timeout:.0f} s")
                return None
            time.sleep(0.02)
        startup_s = time.perf_counter() - t0
        startup_cpu = proc_cpu_s(daemon.pid)
        try:
            dsets = measure.loaderctl_json(loaderctl, sock, "--json", "datasets")["datasets"]
            d = next(x for x in dsets if x["name"] == "images")
            img = next(f for f in d["fields"] if f["name"] == "image")
            if img["dtype"] != "uint8" or img["shape"] != [3, SIZE, SIZE] or d["samples"] != args.images:
                err(f"unexpected layout: {d['samples']} samples, image {img['dtype']}{img['shape']}")
                return None
        except (RuntimeError, ValueError, KeyError, StopIteration, subprocess.TimeoutExpired) as e:
            err(f"datasets: {e}")
            return None

        cmd = [loaderctl, "--socket", sock, "read", "images", "--epochs", str(args.loaderd_epochs),
               "--batch-size", str(BATCH), "--seed", str(SEED), "--touch", "--json"]
        log(f"bench_images: loaderd w={workers}: {shlex.join(cmd[1:])}")
        cpu0 = proc_cpu_s(daemon.pid)
        with open(out_p, "wb") as out, open(err_p, "wb") as errf:
            t1 = time.perf_counter()
            ctl = subprocess.Popen(cmd, stdout=out, stderr=errf, stdin=subprocess.DEVNULL)
        status, ru = wait_rusage(ctl, args.read_timeout)
        wall = time.perf_counter() - t1
        cpu1 = proc_cpu_s(daemon.pid)
        if ru is None:
            err(f"loaderctl read ran past {args.read_timeout:.0f} s")
            return None
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err(f"loaderctl read exited {code}: {measure.tail(err_p).strip()}")
            return None
        try:
            with open(out_p) as f:
                res = json.load(f)
            epochs = res["epochs"]
            if len(epochs) != args.loaderd_epochs:
                raise ValueError(f"{len(epochs)} epochs reported, asked for {args.loaderd_epochs}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            err(f"loaderctl read: unreadable output ({e}): {measure.tail(out_p, 3)}")
            return None
        short = [e["epoch"] for e in epochs if e["samples"] != args.images]
        if short:
            err(f"epochs {short} did not deliver {args.images} samples")
        try:
            status_after = measure.loaderctl_json(loaderctl, sock, "--json", "status")
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            status_after = None
            err(f"status: {e}")
        if status_after and (status_after.get("bad_samples") or status_after.get("replaced_samples")):
            err(f"bad samples {status_after.get('bad_samples')}, replaced {status_after.get('replaced_samples')}")
        steady = epochs[1:]
        s_samples = sum(e["samples"] for e in steady)
        s_secs = sum(e["seconds"] for e in steady)
        all_samples = sum(e["samples"] for e in epochs)
        e0 = epochs[0]
        daemon_cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
        ctl_cpu = ru.ru_utime + ru.ru_stime
        row = {
            "loader": "loaderd", "workers": workers,
            "samples_per_s": s_samples / s_secs if s_secs > 0 else 0.0,
            "epoch0_samples_per_s": e0["samples"] / e0["seconds"] if e0["seconds"] > 0 else 0.0,
            "steady_epochs": [e["epoch"] for e in steady],
            "epoch_seconds": [e["seconds"] for e in epochs],
            "samples_per_epoch": e0["samples"],
            "measured_samples": all_samples,
            "first_batch_ms": res.get("first_batch_ms"),
            "cpu_s": daemon_cpu + ctl_cpu if daemon_cpu is not None else None,
            "cpu_s_per_1000": (daemon_cpu + ctl_cpu) / all_samples * 1000 if daemon_cpu is not None else None,
            "daemon_cpu_s": daemon_cpu,
            "cpu_method": "daemon utime+stime (/proc/PID/stat) + loaderctl's (wait4) over the whole read, "
                          "all epochs",
            "client_cpu_s": ctl_cpu,
            "client_cpu_s_per_1000": ctl_cpu / all_samples * 1000,
            "startup_s": startup_s, "startup_cpu_s": startup_cpu,
            "wall_s": wall, "partial": False,
            "loaderctl": res, "status_after": status_after,
        }
        log(f"bench_images: loaderd w={workers}: {row['samples_per_s']:,.0f} samples/s "
            f"(epoch 0: {row['epoch0_samples_per_s']:,.0f}), "
            f"{measure.fmt(row['cpu_s_per_1000'], '.3f')} CPU s / 1,000 samples")
        return row
    finally:
        if daemon is not None:
            rc = daemon.poll()
            if rc is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    rc = daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait()
                    rc = None
                if rc != 0:
                    err(f"did not exit 0 on SIGTERM (exit {rc})" + measure.log_tail(daemon_log))
            left = sorted(measure.shm_loaderd_objects() - shm_before)
            ours = [n for n in left if f".{daemon.pid}." in n]
            if ours:
                err("left in /dev/shm after a clean stop: " + ", ".join(ours))
            if row is not None:
                row["exit_code"] = rc
                row["shm_left"] = ours
                row["errors"] = errors
        for p in (sock,):
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass


def wait_rusage(proc, timeout):
    """Waits for proc and returns (wait status, its rusage); past timeout kills it and
    returns (None, None)."""
    deadline = time.perf_counter() + timeout
    try:
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return status, ru
            if time.perf_counter() > deadline:
                return None, None
            time.sleep(0.02)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------
# PyTorch DataLoader (child process side)

def child_main(spec):
    """One DataLoader configuration; prints its measurements as one JSON line."""
    import gc

    import torch
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    torch.manual_seed(spec["seed"])
    # ImageFolder's default loader: open, PIL.Image.open, convert("RGB").
    ds = ImageFolder(spec["path"], transform=T.Compose([
        T.RandomResizedCrop(spec["size"]),          # scale (0.08, 1), ratio (3/4, 4/3), bilinear
        T.RandomHorizontalFlip(),
        T.PILToTensor(),                             # uint8 CHW
    ]))
    kw = ({"persistent_workers": True, "prefetch_factor": spec.get("prefetch_factor", PREFETCH_FACTOR)}
          if spec["workers"] > 0 else {})
    loader = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True, num_workers=spec["workers"], **kw)
    me = os.getpid()
    epochs = []
    for epoch in range(spec["epochs"]):
        samples = batches = 0
        gc.collect()
        c0 = measure.tree_cpu([me])
        t0 = time.perf_counter()
        it = iter(loader)
        first_ms = None
        partial = False
        for images, labels in it:
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1000
                if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, spec["size"], spec["size"]):
                    raise SystemExit(f"unexpected batch {images.dtype} {tuple(images.shape)}")
            images.clone()          # reads every byte, as loaderctl --touch does on loaderd's side
            labels.clone()
            samples += images.shape[0]
            batches += 1
            if batches < len(loader) and time.perf_counter() - t0 >= spec["max_seconds"]:
                partial = True
                break
        secs = time.perf_counter() - t0
        # The CPU of this process and of its (persistent) workers, all alive.
        del it
        gc.collect()
        cpu = measure.cpu_delta(c0, measure.tree_cpu([me]))
        epochs.append({"epoch": epoch, "samples": samples, "batches": batches, "seconds": secs,
                       "cpu_s": cpu, "first_batch_ms": first_ms, "partial": partial,
                       "samples_per_s": samples / secs if secs > 0 else 0.0})
    import PIL
    from PIL import features
    print(json.dumps({"samples_per_epoch": len(ds), "batches_per_epoch": len(loader),
                      "torch": torch.__version__, "torchvision": torchvision.__version__,
                      "pil": PIL.__version__,
                      "pil_libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
                      "torch_threads": torch.get_num_threads(), "epochs": epochs}))
    return 0


# ---------------------------------------------------------------------------------------
# PyTorch DataLoader (parent side)

def run_dataloader(args, img_dir, workers, failures):
    spec = {"path": img_dir, "size": SIZE, "batch_size": BATCH, "workers": workers, "seed": SEED,
            "prefetch_factor": PREFETCH_FACTOR,
            "epochs": args.torch_epochs, "max_seconds": args.max_seconds}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    out_p = os.path.join(args.results_dir, f"images-dataloader-w{workers}.json")
    err_p = os.path.join(args.results_dir, f"images-dataloader-w{workers}.err")
    log(f"bench_images: DataLoader num_workers={workers}")
    budget = 60 + args.torch_epochs * (args.max_seconds + 30)
    with open(out_p, "wb") as out, open(err_p, "wb") as errf:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=errf, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # the child's process group holds its workers: nothing may outlive this
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            if proc.returncode is None:
                proc.wait()
        wall = time.perf_counter() - t0
    if code != 0:
        why = f"ran past {budget:.0f} s" if code is None else f"exited {code}"
        failures.append(f"DataLoader num_workers={workers} {why}: {measure.tail(err_p).strip()}")
        log(f"bench_images: DataLoader w={workers} {why}")
        return None
    try:
        with open(out_p) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        failures.append(f"DataLoader num_workers={workers}: unreadable output ({e})")
        return None
    if res["samples_per_epoch"] != args.images:
        failures.append(f"DataLoader num_workers={workers}: {res['samples_per_epoch']} samples, "
                        f"expected {args.images}")
        return None
    epochs = res["epochs"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    s_samples = sum(e["samples"] for e in steady)
    s_secs = sum(e["seconds"] for e in steady)
    all_samples = sum(e["samples"] for e in epochs)
    cpu = sum(e["cpu_s"] for e in epochs)
    e0 = epochs[0]
    row = {
        "loader": "DataLoader", "workers": workers,
        "samples_per_s": s_samples / s_secs if s_secs > 0 else 0.0,
        "epoch0_samples_per_s": e0["samples_per_s"],
        "steady_epochs": [e["epoch"] for e in steady],
        "epoch_seconds": [e["seconds"] for e in epochs],
        "samples_per_epoch": res["samples_per_epoch"],
        "measured_samples": all_samples,
        "first_batch_ms": steady[0]["first_batch_ms"],
        "cpu_s": cpu,
        "cpu_s_per_1000": cpu / all_samples * 1000 if all_samples else None,
        "cpu_method": "main process (getrusage) + its persistent workers (/proc, measure.tree_cpu) at each "
                      "epoch's start and end, all measured epochs",
        "wall_s": wall,
        "partial": any(e["partial"] for e in epochs),
        "child": res,
    }
    log(f"bench_images: DataLoader w={workers}: {row['samples_per_s']:,.0f} samples/s "
        f"(epoch 0: {row['epoch0_samples_per_s']:,.0f}), {row['cpu_s_per_1000']:.3f} CPU s / 1,000 samples")
    return row


# ---------------------------------------------------------------------------------------
# Report

def summarize(rows, floor):
    """Adds ratios and floor efficiency to the rows; returns the summary dict."""
    fl = floor["modes"][FLOOR_MODE] if floor else None
    dl = {r["workers"]: r for r in rows if r["loader"] == "DataLoader"}
    summary = {"floor_mode": FLOOR_MODE, "by_workers": {}}
    for r in rows:
        if r["loader"] != "loaderd":
            continue
        w = r["workers"]
        per_worker = r["samples_per_s"] / w
        r["samples_per_s_per_worker"] = per_worker
        d = dl.get(w)
        r["ratio_vs_dataloader"] = (r["samples_per_s"] / d["samples_per_s"]
                                    if d and d["samples_per_s"] > 0 else None)
        r["cpu_ratio_dataloader_over_loaderd"] = (
            d["cpu_s_per_1000"] / r["cpu_s_per_1000"]
            if d and d.get("cpu_s_per_1000") and r.get("cpu_s_per_1000") else None)
        if fl:
            r["floor_efficiency"] = per_worker / fl["images_per_s"]
            # the same comparison on CPU time: floor CPU per image over daemon CPU per sample
            r["floor_cpu_efficiency"] = (fl["cpu_ms_per_image"] / r["cpu_s_per_1000"]
                                         if r.get("cpu_s_per_1000") else None)
        summary["by_workers"][str(w)] = {
            "loaderd_samples_per_s": r["samples_per_s"],
            "dataloader_samples_per_s": d["samples_per_s"] if d else None,
            "ratio": r["ratio_vs_dataloader"],
            "loaderd_cpu_s_per_1000": r.get("cpu_s_per_1000"),
            "dataloader_cpu_s_per_1000": d.get("cpu_s_per_1000") if d else None,
            "loaderd_per_worker_samples_per_s": per_worker,
            "floor_efficiency": r.get("floor_efficiency"),
            "floor_cpu_efficiency": r.get("floor_cpu_efficiency"),
        }
    return summary


def pct(v):
    return "—" if v is None else f"{v * 100:.0f}%"


def xfmt(v):
    return "—" if v is None else f"{v:.2f}×"


def render(rows, floor, summary, meta):
    m, p = meta["machine"], meta["params"]
    L = []
    L.append(f"# loaderd images vs PyTorch DataLoader + torchvision — {m['date']}")
    L.append("")
    L.append(f"Machine: {m['nproc']} CPUs usable ({m['cpu_model']}), {m['mem_total_mib']} MiB RAM, "
             f"Linux {m['kernel']}; Python {m['python']}, torch {m.get('torch') or '?'}, "
             f"torchvision {m.get('torchvision') or '?'}, Pillow {m.get('pil') or '?'}.")
    L.append(f"Data{' (--quick)' if p['quick'] else ''}: {p['images']:,} JPEGs (ld-genimages, quality "
             f"{QUALITY}, {MIN_PX}–{MAX_PX} px a side, {CLASSES} classes, "
             f"{meta['page_cache_warm']['mean_file_bytes'] / 1024:.1f} KiB on average), page cache warm. "
             f"Work per sample: decode, RandomResizedCrop {SIZE} (scale 0.08–1, ratio 3/4–4/3), "
             f"horizontal flip p=0.5, uint8 CHW; batch {BATCH}, shuffle on.")
    L.append("")
    L.append(f"samples/s: steady state (loaderd: epoch 1 of {p['loaderd_epochs']}; DataLoader: "
             f"epoch 1 of {p['torch_epochs']}, each epoch bounded to {p['max_seconds']:g} s). "
             "CPU s / 1,000 samples: over every epoch read (loaderd: the daemon + loaderctl; "
             "DataLoader: main process + workers).")
    L.append("")
    hdr = ["loader", "workers", "samples/s", "epoch 0 samples/s", "CPU s / 1,000 samples",
           "samples/s per worker", "% of floor per core", "vs DataLoader (same workers)"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|---|" + "---:|" * (len(hdr) - 1))
    for r in rows:
        ld = r["loader"] == "loaderd"
        L.append("| " + " | ".join([
            r["loader"] + (" (partial epochs)" if r["partial"] else ""),
            f"{r['workers']} thread{'s' if r['workers'] > 1 else ''}" if ld else str(r["workers"]),
            f"{r['samples_per_s']:,.0f}", f"{r['epoch0_samples_per_s']:,.0f}",
            measure.fmt(r.get("cpu_s_per_1000"), ".3f"),
            f"{r['samples_per_s'] / r['workers']:,.0f}",
            pct(r.get("floor_efficiency")) if ld else "—",
            f"**{xfmt(r.get('ratio_vs_dataloader'))}**" if ld else "1.00×"]) + " |")
    L.append("")
    if floor:
        L.append(f"Floor (`bench/ld-imgfloor.c`: one thread, {floor['images']:,} images held in memory, "
                 f"output {SIZE}×{SIZE}; decoded MP = mean megapixels decoded per image):")
        L.append("")
        L.append("| mode | ms / image | CPU ms / image | images/s per core | decoded MP | "
                 "decoded at 1/1 · 1/2 · 1/4 · 1/8 |")
        L.append("|---|---:|---:|---:|---:|---|")
        desc = {"decode": "whole image, full size (what PIL decodes)",
                "decode_resize": f"whole image, full size + resize to {SIZE}×{SIZE} (context)",
                "crop": "crop region only, at the scale the daemon plans + resize, flip, CHW (**the floor**)"}
        for name, fm in floor["modes"].items():
            sc = fm["scales"]
            L.append(f"| {desc.get(name, name)} | {fm['ms_per_image']:.3f} | {fm['cpu_ms_per_image']:.3f} | "
                     f"{fm['images_per_s']:,.0f} | {fm['mean_decoded_megapixels']:.3f} | "
                     f"{sc['1/1']} · {sc['1/2']} · {sc['1/4']} · {sc['1/8']} |")
        L.append("")
    L.append("Summary:")
    L.append("")
    for w, s in summary["by_workers"].items():
        L.append(f"- {w} worker{'s' if w != '1' else ''}: loaderd {s['loaderd_samples_per_s']:,.0f} vs "
                 f"DataLoader {measure.fmt(s['dataloader_samples_per_s'], ',.0f')} samples/s = "
                 f"{xfmt(s['ratio'])}; CPU per 1,000 samples {measure.fmt(s['loaderd_cpu_s_per_1000'], '.3f')} s vs "
                 f"{measure.fmt(s['dataloader_cpu_s_per_1000'], '.3f')} s; loaderd per worker "
                 f"{s['loaderd_per_worker_samples_per_s']:,.0f} samples/s = {pct(s['floor_efficiency'])} of the "
                 f"floor's images/s per core ({pct(s['floor_cpu_efficiency'])} on CPU time).")
    L.append("")
    L.append("The floor is the daemon's own per-sample path (transform_apply: the crop drawn on the "
             "header's size, only the rows and iMCU columns around it decoded, at the scale the pipeline's "
             "planner chooses (full size unless decode.dct_scaling is on; the bench's config leaves it off), "
             "then resized, flipped and written CHW) on one "
             "core, images in memory: the same output as loaderd and as torchvision, not the same steps "
             "as PIL, which decodes every pixel (compare the decoded MP). loaderd's workers add file "
             "reads, scheduling and the hand-off, so loaderd per worker stays below 100% of it; with "
             "as many workers as cores, the workers also share the cores with the daemon's event loop "
             "and loaderctl (and DataLoader's workers with its main process). CPU per 1,000 samples: "
             "loaderd = daemon + loaderctl; DataLoader = main process + workers.")
    busy = [ph for ph in meta["phases"] if ph["other_share"] is not None and ph["other_share"] > OTHER_LOAD_WARN]
    L.append("")
    if busy:
        L.append("**Warning: other processes were busy during " + ", ".join(
            f"{ph['phase']} ({ph['other_share'] * 100:.0f}% of the machine)" for ph in busy)
            + "; those figures are disturbed.**")
    else:
        L.append(f"Other processes used at most {max((ph['other_share'] or 0) for ph in meta['phases']) * 100:.1f}% "
                 "of the machine during any phase (machine busy time from /proc/stat minus the "
                 "benchmark's own processes)." if meta["phases"] else "")
    if meta["failures"]:
        L.append("")
        L.append("**FAILURES:**")
        for f in meta["failures"]:
            L.append(f"- {f}")
    L.append("")
    return "\n".join(L)


def console_table(rows, floor, summary):
    out = []
    hdr = ["loader", "workers", "samples/s", "epoch0 s/s", "CPU s/1k", "per worker", "% floor", "vs DL"]
    body = []
    for r in rows:
        ld = r["loader"] == "loaderd"
        body.append([r["loader"] + ("*" if r["partial"] else ""), str(r["workers"]),
                     f"{r['samples_per_s']:,.0f}", f"{r['epoch0_samples_per_s']:,.0f}",
                     measure.fmt(r.get("cpu_s_per_1000"), ".3f", "-"),
                     f"{r['samples_per_s'] / r['workers']:,.0f}",
                     pct(r.get("floor_efficiency")) if ld else "-",
                     xfmt(r.get("ratio_vs_dataloader")).replace("×", "x") if ld else "-"])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    out.append("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(hdr, widths))))
    for b in body:
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    if floor:
        out.append(f"floor (one core, {floor['images']:,} images):")
        for name, fm in floor["modes"].items():
            out.append(f"  {name:<22} {fm['ms_per_image']:7.3f} ms/image  {fm['images_per_s']:8,.0f} images/s"
                       + ("   <- floor" if name == FLOOR_MODE else ""))
    for w, s in summary["by_workers"].items():
        out.append(f"w={w}: loaderd {xfmt(s['ratio']).replace('×', 'x')} DataLoader "
                   f"at equal workers, {pct(s['floor_efficiency'])} of the floor per core")
    return "\n".join(out)


def machine_info(rows):
    model = measure.cpu_model()
    child = next((r["child"] for r in rows if "child" in r), {})
    return {
        "nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu_model": model,
        "mem_total_mib": measure.mem_total_kib() // 1024, "kernel": platform.release(),
        "python": platform.python_version(), "torch": child.get("torch"),
        "torchvision": child.get("torchvision"), "pil": child.get("pil"),
        "pil_libjpeg_turbo": child.get("pil_libjpeg_turbo"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


# ---------------------------------------------------------------------------------------
# Main

def parse_args(argv):
    p = argparse.ArgumentParser(description="loaderd's image pipeline vs PyTorch DataLoader + "
                                "torchvision, and vs the decode floor (see bench/README.md).")
    p.add_argument("--quick", action="store_true", help="1,000 images instead of 10,000")
    p.add_argument("--images", type=int, help="number of JPEGs (default 10,000; --quick 1,000)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"),
                   help="where bin/loaderd, loaderctl, ld-genimages, ld-imgfloor are (default build)")
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", default="1,2", help="worker counts for both loaders (default 1,2)")
    p.add_argument("--loaderd-epochs", type=int, default=2, help="epochs per loaderctl read (default 2)")
    p.add_argument("--torch-epochs", type=int, default=2, help="DataLoader epochs (default 2)")
    p.add_argument("--max-seconds", type=float, default=30.0,
                   help="bound on one DataLoader epoch in seconds (default 30)")
    p.add_argument("--floor-images", type=int, default=0,
                   help="images the floor decodes (default 0: all of them)")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--read-timeout", type=float, default=300.0)
    p.add_argument("--skip-loaderd", action="store_true")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--skip-floor", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.images is None:
        a.images = (QUICK if a.quick else FULL)["images"]
    try:
        a.workers = [int(w) for w in a.workers.split(",") if w.strip()]
    except ValueError:
        p.error("--workers: a comma-separated list of integers")
    if a.images < 1 or any(w < 1 for w in a.workers) or a.max_seconds <= 0 or a.torch_epochs < 1:
        p.error("--images, --workers, --max-seconds and --torch-epochs must be positive")
    if a.loaderd_epochs < 2:
        p.error("--loaderd-epochs must be at least 2 (epoch 0 is not the steady state)")
    return a


def main():
    argv = sys.argv[1:]
    if "--child" not in argv:
        extra = shlex.split(os.environ.get("BENCH_IMAGES_ARGS", ""))
        if "--quick" in shlex.split(os.environ.get("BENCH_ARGS", "")) and "--quick" not in extra:
            extra.append("--quick")
        argv = extra + argv
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    measure.ensure_system_python(("torch", "torchvision"), __file__)
    t_start = time.perf_counter()

    build = args.build_dir if os.path.isabs(args.build_dir) else os.path.join(REPO, args.build_dir)
    bins = {n: os.path.join(build, "bin", n) for n in ("loaderd", "loaderctl", "ld-genimages", "ld-imgfloor")}
    for n, path in bins.items():
        if not os.access(path, os.X_OK):
            measure.fail(f"{path} not found: build first (make all)")
    args.data_dir = os.path.abspath(args.data_dir)
    args.results_dir = os.path.abspath(args.results_dir)
    os.makedirs(args.results_dir, exist_ok=True)

    img_dir, files = generate(args, bins["ld-genimages"])
    warm = warm_page_cache(img_dir, files)

    failures, rows = [], []
    floor = None
    if not args.skip_floor:
        with Phase("floor") as ph:
            floor = run_floor(args, bins["ld-imgfloor"], img_dir, failures)
        if floor:
            floor["other_load_share"] = ph.other_share
    if not args.skip_loaderd:
        for w in args.workers:
            with Phase(f"loaderd w={w}") as ph:
                r = run_loaderd(args, bins, img_dir, w, failures)
            if r is not None:
                r["other_load_share"] = ph.other_share
                rows.append(r)
    if not args.skip_torch:
        for w in args.workers:
            with Phase(f"DataLoader w={w}") as ph:
                r = run_dataloader(args, img_dir, w, failures)
            if r is not None:
                r["other_load_share"] = ph.other_share
                rows.append(r)
    rows.sort(key=lambda r: (r["loader"] != "loaderd", r["workers"]))
    summary = summarize(rows, floor)
    meta = {
        "machine": machine_info(rows),
        "params": {"quick": args.quick, "images": args.images, "classes": CLASSES, "min_px": MIN_PX,
                   "max_px": MAX_PX, "quality": QUALITY, "size": SIZE, "batch_size": BATCH, "seed": SEED,
                   "workers": args.workers, "loaderd_epochs": args.loaderd_epochs,
                   "torch_epochs": args.torch_epochs, "max_seconds": args.max_seconds,
                   "floor_images": args.floor_images or args.images, "build_dir": args.build_dir},
        "page_cache_warm": warm,
        "phases": PHASES,
        "failures": failures,
    }
    meta["total_s"] = time.perf_counter() - t_start
    md = render(rows, floor, summary, meta)
    with open(os.path.join(args.results_dir, "images.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.results_dir, "images.json"), "w") as f:
        json.dump({**meta, "summary": summary, "floor": floor, "rows": rows}, f, indent=2)
        f.write("\n")
    print()
    m = meta["machine"]
    print(f"{m['date']}  {m['nproc']} CPUs ({m['cpu_model']}), torch {m.get('torch')}, "
          f"torchvision {m.get('torchvision')}; {args.images:,} JPEGs")
    print(console_table(rows, floor, summary))
    print(f"results: {os.path.join(args.results_dir, 'images.md')}, images.json "
          f"({meta['total_s']:.0f} s)", flush=True)
    if failures:
        log("bench_images: FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
