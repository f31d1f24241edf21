#!/usr/bin/python3
"""bench_share — four trainers on one dataset and seed: one shared stream, four streams,
or four PyTorch DataLoaders (issue 13's sharing benchmark), and a trainer with a jittery
step time under a fixed and an adaptive prefetch depth (issue 13's autotuning benchmark).

1. Generates (once; deterministic, shared with bench_fair.py) 300 JPEGs of 320-400 px;
   the pipeline is random_resized_crop 224 + random_flip + uint8 CHW, and torchvision's
   RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor for the DataLoaders.
2. One loaderd with `server.workers: 2`. Each trainer is a process of its own (the
   Python client, or a DataLoader with 2 workers), opened first and started together,
   reading --epochs epochs of batch 32 and touching one byte per batch.
3. Sharing: for each configuration, the CPU time spent preparing data (loaderd's, or the
   DataLoader worker processes') per 1,000 samples each trainer received, and the peak
   of the summed PSS of loaderd and every trainer process (shared memory counted once).
   Target: 4 trainers on one shared stream cost at most 1.3x the CPU of one trainer
   alone (4 separate streams: about 4x).
4. Prefetch: one trainer whose step alternates bursts of fast steps and slow steps
   (mean 8 ms, deterministic), prefetch 8 against prefetch auto: the trainer's wait
   fraction (the daemon's `stall`) and the ring memory the stream holds.

Writes bench/results/share.md and share.json. Run with Debian's /usr/bin/python3;
`make bench` runs it. Options may also come from BENCH_SHARE_ARGS; `--quick` in
BENCH_ARGS is honoured too.
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
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import measure  # noqa: E402  (bench/measure.py: process accounting)
import bench_fair as F  # noqa: E402  (its heavy dataset, and starting and stopping loaderd)
from measure import log  # noqa: E402

BATCH, SEED, WORKERS, TRAINERS = 32, 3, 2, 4


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_SHARE_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer epochs")
    p.add_argument("--epochs", type=int, default=None, help="epochs per trainer (default 3; quick 1)")
    p.add_argument("--jitter-batches", type=int, default=None, help="batches of the prefetch run (default 240)")
    p.add_argument("--no-dataloader", action="store_true", help="skip the PyTorch DataLoader configuration")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.epochs = a.epochs or (1 if a.quick else 3)
    a.jitter_batches = a.jitter_batches or (120 if a.quick else 240)
    return a


# ---- the trainer processes ------------------------------------------------------------

def child(spec):
    """One trainer: opens its loader, says "ready", waits for "go", reads, prints JSON."""
    s = json.loads(spec)
    if s["kind"] == "loaderd":
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import loaderclient
        c = loaderclient.Client(s["socket"])
        stream = c.open("images", BATCH, seed=SEED, epochs=s["epochs"], share=s.get("share"),
                        prefetch=s.get("prefetch"), auto_release=True)
        batches = iter(stream)
    else:
        import torch
        import torchvision.datasets as tvd
        import torchvision.transforms as T
        ds = tvd.ImageFolder(s["path"], T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                   T.PILToTensor()]))
        g = torch.Generator()
        g.manual_seed(SEED)
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         persistent_workers=True, prefetch_factor=4, generator=g)

        def gen():
            for _ in range(s["epochs"]):
                yield from dl
        batches = gen()
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    samples = 0
    jitter = s.get("jitter")
    waited, i = 0.0, 0
    while True:
        w0 = time.perf_counter()
        try:
            b = next(batches)
        except StopIteration:
            break
        waited += time.perf_counter() - w0
        if s["kind"] == "loaderd":
            samples += b.rows
            b["image"][0, 0, 0, 0]
        else:
            samples += len(b[1])
            b[0][0, 0, 0, 0].item()
        if jitter:
            # Bursts: 16 fast steps, then 4 slow ones (jitter: their lengths in seconds).
            time.sleep(jitter[0] if (i % 20) < 16 else jitter[1])
        i += 1
        if jitter and i >= s["batches"]:
            break
    out = {"samples": samples, "seconds": time.perf_counter() - t0, "wait_fraction": waited / (time.perf_counter() - t0)}
    if s["kind"] == "loaderd" and jitter:
        st = next(x for x in c.streams() if x["id"] == stream.id)
        out["stream"] = {k: st.get(k) for k in ("stall", "prefetch", "prefetch_depth", "slots", "prefetch_max")}
    print(json.dumps(out), flush=True)


def start_trainers(args, specs):
    procs = []
    for sp in specs:
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(sp)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      start_new_session=True))
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a trainer did not start: {line!r}")
    return procs


def run_trainers(args, specs, daemon_pid):
    """Starts the trainers together; returns (per-trainer results, loading CPU s, peak PSS KiB)."""
    procs = start_trainers(args, specs)
    roots = [p.pid for p in procs] + ([daemon_pid] if daemon_pid else [])
    mem = measure.TreeMemory(roots, pss_every=1)
    cpu0 = {pid: measure.cpu_seconds(pid) for r in roots for pid in measure.tree_pids(r)}
    sched0 = measure.sched_seconds(daemon_pid) if daemon_pid else None
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results, cpu_last = [None] * len(procs), dict(cpu0)
    while any(r is None for r in results):
        mem.sample()
        for r in roots:
            for pid in measure.tree_pids(r):
                c = measure.cpu_seconds(pid)
                if c is not None:
                    cpu_last[pid] = c
        for i, p in enumerate(procs):
            if results[i] is None and p.poll() is not None:
                out = p.stdout.read().strip().splitlines()
                if p.returncode != 0 or not out:
                    raise RuntimeError(f"a trainer exited {p.returncode}")
                results[i] = json.loads(out[-1])
        time.sleep(0.05)
    # Loading CPU: loaderd's, or what the DataLoaders' worker processes used.
    sched1 = measure.sched_seconds(daemon_pid) if daemon_pid else None
    if daemon_pid and sched0 is not None and sched1 is not None:
        loading = sched1 - sched0  # exact: loaderd's threads live on
    elif daemon_pid:
        loading = cpu_last.get(daemon_pid, 0) - (cpu0.get(daemon_pid) or 0)
    else:
        mains = {p.pid for p in procs}
        loading = sum(v - (cpu0.get(pid) or 0) for pid, v in cpu_last.items() if pid not in mains)
    total = sum(v - (cpu0.get(pid) or 0) for pid, v in cpu_last.items())
    return results, loading, total, mem.peak_pss_kib


# ---- the benchmark ----------------------------------------------------------------------

def write_config(path, sock, images):
    q = json.dumps
    with open(path, "w") as f:
        f.write(f"""# Written by bench/bench_share.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {WORKERS}
  memory_budget: 2GiB
  log_level: warn
datasets:
  images:
    kind: image_folder
    path: {q(images)}
    transforms:
      - random_resized_crop: {{size: 224}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
""")


def sharing(args, sock, daemon_pid, images):
    rows = []
    configs = [("1 trainer alone", 1, None, "loaderd"),
               ("4 trainers, one shared stream", TRAINERS, "bench", "loaderd"),
               ("4 trainers, 4 streams", TRAINERS, None, "loaderd")]
    if not args.no_dataloader:
        configs.append(("4 trainers, 4 PyTorch DataLoaders (2 workers each)", TRAINERS, None, "dataloader"))
    for name, n, share, kind in configs:
        log(f"bench_share: {name}")
        specs = [{"kind": kind, "socket": sock, "path": images, "epochs": args.epochs, "share": share}
                 for _ in range(n)]
        res, loading, total, pss = run_trainers(args, specs, daemon_pid if kind == "loaderd" else None)
        per_trainer = min(r["samples"] for r in res)
        rows.append({"config": name, "trainers": n, "samples_per_trainer": per_trainer,
                     "loading_cpu_s": loading, "total_cpu_s": total,
                     "loading_cpu_s_per_1k_per_trainer": loading / (per_trainer / 1000),
                     "peak_pss_mib": pss / 1024, "seconds": max(r["seconds"] for r in res)})
    base = rows[0]["loading_cpu_s_per_1k_per_trainer"]
    for r in rows:
        r["vs_alone"] = r["loading_cpu_s_per_1k_per_trainer"] / base if base else None
    return rows


def prefetch_runs(args, sock, batch_s):
    """batch_s: how long the daemon takes per batch for one trainer alone. The trainer's
    steps average 1.5 times that, in bursts: 16 steps of 0.45x, then 4 of 5.7x."""
    rows = []
    jitter = [0.45 * 1.5 * batch_s, 5.7 * 1.5 * batch_s]
    for name, pf in (("prefetch 8 (fixed)", 8), ("prefetch auto", None)):
        log(f"bench_share: jittery trainer, {name}")
        spec = {"kind": "loaderd", "socket": sock, "epochs": 1000, "prefetch": pf, "jitter": jitter,
                "batches": args.jitter_batches}
        res, _, _, _ = run_trainers(args, [spec], None)
        st = res[0]["stream"]
        rows.append({"config": name, "wait_fraction": res[0]["wait_fraction"], "daemon_stall": st["stall"],
                     "prefetch_now": st["prefetch"], "slots": st["slots"], "seconds": res[0]["seconds"],
                     "steps_s": jitter})
    return rows


def main(argv):
    args = parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    bd = os.path.join(REPO, args.build_dir, "bin")
    bins = {n: os.path.join(bd, f) for n, f in (("loaderd", "loaderd"), ("genimages", "ld-genimages"))}
    for pth in bins.values():
        if not os.access(pth, os.X_OK):
            log(f"bench_share: {pth} is missing: run make first")
            return 1
    os.environ.setdefault("LOADERCLIENT_LIB", os.path.join(REPO, args.build_dir, "lib", "libloaderclient.so"))
    images = F.heavy_images(args, bins)
    F.warm(images)
    os.makedirs(args.results_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ld-bench-share-")
    sock = os.path.join(tmp, "loaderd.sock")
    cfg = os.path.join(tmp, "share.yaml")
    write_config(cfg, sock, images)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "workers": WORKERS, "dataset": f"image_folder, {F.HEAVY_IMAGES} JPEGs {F.HEAVY_MIN}-{F.HEAVY_MAX} px -> 224",
           "batch": BATCH, "epochs": args.epochs}
    daemon = None
    rc = 0
    try:
        daemon = F.start_daemon(bins["loaderd"], cfg, sock, os.path.join(args.results_dir, "share-loaderd.log"))
        out["sharing"] = sharing(args, sock, daemon.pid, images)
        alone = out["sharing"][0]
        out["prefetch"] = prefetch_runs(args, sock, alone["seconds"] / (alone["samples_per_trainer"] / BATCH))
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError, KeyError, StopIteration) as e:
        log(f"bench_share: {e}")
        out["error"] = str(e)
        rc = 1
    finally:
        F.stop_daemon(daemon, tmp)

    md = ["## Sharing: four trainers on one dataset and seed (bench/bench_share.py)", ""]
    if out.get("sharing"):
        md += [f"loaderd with {WORKERS} workers; {out['dataset']}, batch {BATCH}, {args.epochs} epochs per trainer. "
               "Loading CPU: loaderd's (or the DataLoader worker processes'), per 1,000 samples each trainer "
               "received; memory: peak of the summed PSS of loaderd and every trainer process.", "",
               "| | loading CPU s / 1k samples / trainer | vs one trainer alone | all CPU s | peak PSS |",
               "|---|---:|---:|---:|---:|"]
        for r in out["sharing"]:
            md.append(f"| {r['config']} | {r['loading_cpu_s_per_1k_per_trainer']:.3f} | {r['vs_alone']:.2f}x "
                      f"| {r['total_cpu_s']:.1f} | {r['peak_pss_mib']:,.0f} MiB |")
        md += ["", "Target (issue 13): one shared stream for 4 trainers costs at most 1.3x the CPU of one trainer "
               "alone (4 separate streams: about 4x)."]
    if out.get("prefetch"):
        md += ["", "### Adaptive prefetch: a trainer with a jittery step time", "",
               "One trainer, its steps in bursts: 16 of %.1f ms, then 4 of %.1f ms (1.5x the daemon's time per "
               "batch on average), %d batches. Wait fraction: the trainer's time inside next() over its run."
               % (1000 * out["prefetch"][0]["steps_s"][0], 1000 * out["prefetch"][0]["steps_s"][1],
                  args.jitter_batches), "",
               "| | wait fraction | prefetch depth at the end | ring slots |", "|---|---:|---:|---:|"]
        for r in out["prefetch"]:
            md.append(f"| {r['config']} | {100 * r['wait_fraction']:.1f}% | {r['prefetch_now']} | {r['slots']} |")
    if out.get("error"):
        md += ["", f"Error: {out['error']}"]
    measure.write_report(args.results_dir, "share", out, md)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
