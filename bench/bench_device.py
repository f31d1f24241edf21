#!/usr/bin/python3
"""bench_device — the device stage against PyTorch's DataLoader(pin_memory=True) +
.to(device, non_blocking=True) on the image pipeline (issue 11, "Benchmark").

Where torch sees a GPU (torch.cuda.is_available()), one synthetic trainer runs twice on
the same JPEGs (bench_images' data: decode + RandomResizedCrop 224 + flip, uint8 CHW,
batch 64), for --seconds each:

- loaderd: `LoaderdDataLoader("images", device="cuda")`: the daemon's device stage copies
  each batch into device memory (pinned ring, copy stream, CUDA IPC); the trainer gets
  CUDA tensors;
- DataLoader: torchvision's ImageFolder + the same transforms, num_workers = the usable
  cores, pin_memory=True, persistent workers, then `.to("cuda", non_blocking=True)`.

The trainer's step is a GPU kernel of fixed duration (torch.cuda._sleep, calibrated to
--step-ms) after a read of the batch (a sum on the GPU). Measured: the trainer's wait
fraction (time inside next() and the copy call ÷ wall time), batches/s, and H2D GB/s —
loaderd's from the stage's own counters (`loaderctl streams --json`: h2d_gbps), the
DataLoader's from CUDA events around each .to() (bytes ÷ copy time). Writes
bench/results/device.{md,json}.

Without a GPU (Debian's torch is built without CUDA; no driver; no device) it prints why
and that it skips, writes the same two files saying so, and exits 0. Options also from
BENCH_DEVICE_ARGS; `--quick` in BENCH_ARGS is honoured.
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

BATCH, SIZE, CLASSES = 64, 224, 100
IMAGES, QUICK_IMAGES = 10_000, 1_000
log = measure.log


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_DEVICE_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_IMAGES:,} images, 5 s per side")
    p.add_argument("--images", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per side (default 20; quick 5)")
    p.add_argument("--step-ms", type=float, default=20.0, help="the synthetic trainer's GPU time per batch")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.images = a.images or (QUICK_IMAGES if a.quick else IMAGES)
    a.seconds = a.seconds or (5.0 if a.quick else 20.0)
    return a


def gpu_absent():
    """Why there is no GPU to measure (a sentence), or None when there is one."""
    try:
        import torch
    except ImportError as e:
        return f"torch cannot be imported ({e})"
    if not torch.cuda.is_available():
        if getattr(torch.version, "cuda", None) is None:
            return f"torch {torch.__version__} is built without CUDA (torch.cuda.is_available() is False)"
        return "torch.cuda.is_available() is False (no driver or no device)"
    return None


def write_results(args, res, md):
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "device.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.results_dir, "device.md"), "w") as f:
        f.write(md)
    print(md)


# ---------------------------------------------------------------------------------------
# The synthetic trainer (both sides)

def calibrate_sleep(torch, step_ms):
    """Cycles of torch.cuda._sleep that take step_ms on this GPU."""
    cycles = 1_000_000
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        cycles = max(1000, int(cycles * step_ms / max(ms, 1e-3)))
    return cycles


WARMUP_BATCHES = 5


def train(torch, batches, seconds, cycles, to_device=None):
    """Runs the step over `batches` (an iterator of (images, labels)) for `seconds` after
    WARMUP_BATCHES untimed ones. to_device, when given, copies a host batch and returns
    (device tensor, bytes, (start event, end event)). Returns batches/s, the wait fraction
    (time in next() and the copy call ÷ wall time) and, with to_device, the copies' GB/s."""
    seen = n = 0
    waited = 0.0
    copies = []
    t_start = None
    acc = None
    for_copy = []
    while True:
        t0 = time.perf_counter()
        try:
            images, _labels = next(batches)
        except StopIteration:
            break
        if to_device is not None:
            images, nbytes, ev = to_device(images)
            for_copy.append((nbytes, ev))
        t1 = time.perf_counter()
        seen += 1
        if t_start is not None:
            waited += t1 - t0
            n += 1
        s = images.float().sum()                 # reads the batch on the GPU
        acc = s if acc is None else acc + s
        torch.cuda._sleep(cycles)
        if t_start is None and seen == WARMUP_BATCHES:
            torch.cuda.synchronize()
            t_start = time.perf_counter()
            for_copy.clear()
        elif t_start is not None and time.perf_counter() - t_start >= seconds:
            break
    torch.cuda.synchronize()
    wall = time.perf_counter() - t_start if t_start is not None else 0.0
    out = {"batches": n, "seconds": wall, "batches_per_s": n / wall if wall > 0 else None,
           "wait_fraction": waited / wall if wall > 0 else None, "checksum": float(acc) if acc is not None else None}
    for nbytes, (a, b) in for_copy:
        copies.append((nbytes, a.elapsed_time(b)))
    if copies:
        tot_b, tot_ms = sum(x for x, _ in copies), sum(y for _, y in copies)
        out["h2d_gbps"] = tot_b / (tot_ms * 1e6) if tot_ms > 0 else None
        out["copy_ms_per_batch"] = tot_ms / len(copies)
    return out


# ---------------------------------------------------------------------------------------
# The two sides

def run_loaderd(args, torch, bins, img_dir, cycles, raw):
    from loaderclient.torch import LoaderdDataLoader
    tmp = tempfile.mkdtemp(prefix="ld-device-")
    sock = os.path.join(tmp, "s.sock")
    cfg = os.path.join(raw, "device.yaml")
    workers = len(os.sched_getaffinity(0))
    with open(cfg, "w") as f:
        f.write(f"""# Written by bench/bench_device.py; regenerated on every run.
server:
  socket: {json.dumps(sock)}
  workers: {workers}
  memory_budget: 2GiB
  log_level: warn
datasets:
  images:
    kind: image_folder
    path: {json.dumps(img_dir)}
    pattern: "*.jpg"
    transforms:
      - random_resized_crop: {{size: {SIZE}}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
""")
    log_path = os.path.join(raw, "device-loaderd.log")
    with open(log_path, "wb") as lf:
        proc = subprocess.Popen([bins["loaderd"], "--config", cfg], stdout=lf, stderr=lf, start_new_session=True)
    try:
        t0 = time.perf_counter()
        while not (os.path.exists(sock) and measure.socket_accepts(sock)):
            if proc.poll() is not None or time.perf_counter() - t0 > 120:
                raise RuntimeError("loaderd did not start" + measure.log_tail(log_path))
            time.sleep(0.05)
        dl = LoaderdDataLoader("images", batch_size=BATCH, shuffle=True, socket=sock, device=args.device,
                               prefetch=8)

        def forever():
            while True:
                for b in dl:
                    yield b[0], b[1]
        it = forever()
        out = train(torch, it, args.seconds, cycles)
        streams = measure.loaderctl_json(bins["loaderctl"], sock, "--json", "streams").get("streams", [])
        st = next((s for s in streams if s.get("dataset") == "images"), {})
        dev = st.get("device") if isinstance(st.get("device"), dict) else st
        out["h2d_gbps"] = dev.get("h2d_gbps")
        out["copy_ms_per_batch"] = dev.get("copy_ms_per_batch")
        out["stream"] = st
        it.close()
        dl.close()
    finally:
        proc.terminate()
        out_rc = proc.wait(timeout=30)
        if os.path.exists(sock):
            os.unlink(sock)
        os.rmdir(tmp)
    out["daemon_exit"] = out_rc
    out["workers"] = workers
    return out


def run_dataloader(args, torch, img_dir, cycles):
    from torch.utils.data import DataLoader
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder
    workers = len(os.sched_getaffinity(0))
    ds = ImageFolder(img_dir, transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(),
                                                    T.PILToTensor()]))
    dl = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, pin_memory=True,
                    persistent_workers=True, prefetch_factor=4)
    dev = torch.device(args.device)

    def to_device(images):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x = images.to(dev, non_blocking=True)
        b.record()
        return x, images.numel() * images.element_size(), (a, b)

    def forever():
        while True:
            for images, labels in dl:
                yield images, labels
    it = forever()
    out = train(torch, it, args.seconds, cycles, to_device=to_device)
    it.close()
    out["workers"] = workers
    return out


# ---------------------------------------------------------------------------------------

def render(res):
    fmt = measure.fmt
    if res.get("skipped"):
        return f"# Device stage vs DataLoader(pin_memory=True)\n\nno GPU: skipped ({res['skipped']}).\n"
    L = ["# Device stage vs DataLoader(pin_memory=True)", "",
         f"{res['images']:,} JPEGs, decode + RandomResizedCrop {SIZE} + flip, uint8 CHW, batch {BATCH}, on "
         f"{res['gpu']}; a trainer step of {res['step_ms']:.0f} ms of GPU time per batch (torch.cuda._sleep) "
         f"after a sum of the batch on the GPU; {res['seconds']:.0f} s measured per side after 5 batches.", "",
         "| loader | batches/s | trainer wait fraction | H2D GB/s | copy ms / batch |", "|---|---:|---:|---:|---:|"]
    for name, key in (("loaderd, device stage (CUDA IPC)", "loaderd"),
                      ("DataLoader(pin_memory=True) + .to(non_blocking=True)", "dataloader")):
        r = res.get(key) or {}
        if "error" in r:
            L.append(f"| {name} | failed: {r['error']} | | | |")
            continue
        L.append(f"| {name} | {fmt(r.get('batches_per_s'), '.1f')} | {fmt(r.get('wait_fraction'), '.3f')} | "
                 f"{fmt(r.get('h2d_gbps'), '.2f')} | {fmt(r.get('copy_ms_per_batch'), '.3f')} |")
    L += ["", "H2D GB/s: loaderd's from its stage's counters (bytes copied ÷ copy time on its copy stream); "
          "DataLoader's from CUDA events around each `.to()`. A wait fraction near 0 means the data kept up "
          "with the step."]
    return "\n".join(L) + "\n"


def main(argv):
    args = parse_args(argv)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "command": " ".join(["bench/bench_device.py", *argv])}
    why = gpu_absent()
    if why is not None:
        res["skipped"] = why
        log(f"bench_device: no GPU: {why}; skipping")
        write_results(args, res, render(res))
        return 0
    import torch
    bd = args.build_dir if os.path.isabs(args.build_dir) else os.path.join(measure.REPO, args.build_dir)
    bins = {n: os.path.join(bd, "bin", n) for n in ("loaderd", "loaderctl", "ld-genimages")}
    os.environ.setdefault("LOADERCLIENT_LIB", os.path.join(bd, "lib", "libloaderclient.so"))
    sys.path.insert(0, os.path.join(measure.REPO, "client", "python"))
    img_dir = os.path.join(args.data_dir, f"images-{args.images}")
    subprocess.run([bins["ld-genimages"], img_dir, "--count", str(args.images), "--classes", str(CLASSES),
                    "--min", "256", "--max", "500", "--quality", "90"], check=True, stdout=subprocess.DEVNULL)
    raw = os.path.join(args.results_dir, "device-raw")
    os.makedirs(raw, exist_ok=True)
    torch.cuda.set_device(torch.device(args.device))
    cycles = calibrate_sleep(torch, args.step_ms)
    res.update({"gpu": torch.cuda.get_device_name(), "images": args.images, "step_ms": args.step_ms,
                "sleep_cycles": cycles, "seconds": args.seconds, "torch": torch.__version__})
    failed = False
    for key, fn in (("loaderd", lambda: run_loaderd(args, torch, bins, img_dir, cycles, raw)),
                    ("dataloader", lambda: run_dataloader(args, torch, img_dir, cycles))):
        try:
            res[key] = fn()
            log(f"bench_device: {key}: {res[key].get('batches_per_s') or 0:.1f} batches/s, "
                f"wait {res[key].get('wait_fraction') or 0:.3f}, H2D {res[key].get('h2d_gbps') or 0:.2f} GB/s")
        except Exception as e:  # report and go on: the other side still says something
            res[key] = {"error": f"{type(e).__name__}: {e}"}
            failed = True
    write_results(args, res, render(res))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
