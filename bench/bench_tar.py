#!/usr/bin/python3
"""bench_tar — loaderd's `tar_shards` kind against `webdataset` with PyTorch's DataLoader,
on the same WebDataset shards and the same image pipeline.

1. Generates (once; deterministic) JPEGs with ld-genimages, as bench_images does: 2,000
   images (--quick: 500), quality 90, sides 256–500 px, 100 classes; packs them into 8
   shards in the WebDataset layout (KEY.jpg, KEY.cls), in a shuffled order; reads every
   shard once so that both loaders read from the page cache.
2. loaderd (server.workers = each of --workers), read by `loaderctl read images --epochs 2
   --batch-size 64 --touch --json` with RandomResizedCrop 224 + horizontal flip + uint8
   CHW: samples/s of epoch 1 and the CPU seconds of the daemon and loaderctl
   (bench_images.run_loaderd, the same measurement as the image benchmark).
3. webdataset (from PyPI, in a virtual environment under build/bench-venv that sees
   Debian's torch and torchvision; created on the first run) with DataLoader:
   WebDataset(shards, shardshuffle) → shuffle(1000) → decode("pil") → to_tuple("jpg",
   "cls") → RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor() → batches of
   64 collated by DataLoader with the same worker counts (persistent workers), the loop
   copying every batch; samples/s of epoch 1 and the CPU of the process tree.

Prints a table with the ratio loaderd / webdataset per worker count and writes
bench/results/tar.md and tar.json. `make bench` runs it (bench/run.py); options may also
come from BENCH_TAR_ARGS; `--quick` in BENCH_ARGS is honoured too. Where the virtual
environment cannot be made (no network for pip), the webdataset side is reported as
skipped, with the reason, and the run fails.
"""
import argparse
import datetime
import io
import json
import os
import random
import shlex
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import bench_images as BI  # noqa: E402  (the image data and the loaderd run)
import measure as B  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)
from bench_peers import warm  # noqa: E402  (every byte under a path read once)

SHARDS = 8
WDS_VERSION = "webdataset==1.0.2"


def log(msg):
    B.log(msg)


def make_shards(img_dir, files, shard_dir):
    """The JPEGs as WebDataset shards, in a fixed shuffled order; key = the file's index."""
    if os.path.isdir(shard_dir) and len([n for n in os.listdir(shard_dir) if n.endswith(".tar")]) == SHARDS:
        return sorted(os.path.join(shard_dir, n) for n in os.listdir(shard_dir) if n.endswith(".tar"))
    os.makedirs(shard_dir, exist_ok=True)
    classes = sorted({f.split("/")[0] for f in files})
    order = list(range(len(files)))
    random.Random(0).shuffle(order)
    per = (len(order) + SHARDS - 1) // SHARDS
    paths = []
    for s in range(SHARDS):
        path = os.path.join(shard_dir, "train-%03d.tar" % s)
        with tarfile.open(path + ".tmp", "w") as tf:
            for i in order[s * per:(s + 1) * per]:
                rel = files[i]
                for name, data in (("%07d.jpg" % i, open(os.path.join(img_dir, rel), "rb").read()),
                                   ("%07d.cls" % i, b"%d" % classes.index(rel.split("/")[0]))):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        os.rename(path + ".tmp", path)
        paths.append(path)
    return paths


def tar_config(path, sock, shard_dir, workers):
    q = json.dumps
    with open(path, "w") as f:
        f.write(f"""# Written by bench/bench_tar.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {workers}
  memory_budget: 1GiB
  log_level: warn
datasets:
  images:
    kind: tar_shards
    path: {q(shard_dir)}
    transforms:
      - random_resized_crop: {{size: {BI.SIZE}}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
""")


def venv_python(args):
    """build/bench-venv's python with webdataset, made on the first run; (path, None) or
    (None, why)."""
    venv = os.path.join(REPO, args.build_dir, "bench-venv")
    py = os.path.join(venv, "bin", "python")
    check = [py, "-c", "import webdataset, torch, torchvision"]
    if os.path.exists(py) and subprocess.run(check, capture_output=True).returncode == 0:
        return py, None
    log(f"bench_tar: making {venv} with {WDS_VERSION} (pip)")
    for cmd in ([B.SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv],
                [py, "-m", "pip", "install", "-q", WDS_VERSION]):
        r = subprocess.run(cmd, capture_output=True, timeout=600)
        if r.returncode != 0:
            return None, f"{shlex.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}"
    if subprocess.run(check, capture_output=True).returncode != 0:
        return None, "webdataset, torch or torchvision cannot be imported in " + venv
    return py, None


def child_main(spec):
    """webdataset + DataLoader, one configuration; one JSON line."""
    import gc

    import torch
    import webdataset as wds
    from torch.utils.data import DataLoader
    from torchvision import transforms as T

    torch.manual_seed(spec["seed"])
    tf = T.Compose([T.RandomResizedCrop(spec["size"]), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = (wds.WebDataset(spec["shards"], shardshuffle=len(spec["shards"]), empty_check=False)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, lambda c: c))
    loader = DataLoader(ds, batch_size=spec["batch_size"], num_workers=spec["workers"], persistent_workers=True,
                        prefetch_factor=BI.PREFETCH_FACTOR)
    me = os.getpid()
    epochs = []
    for epoch in range(spec["epochs"]):
        gc.collect()
        c0 = B.tree_cpu([me])
        t0 = time.perf_counter()
        samples = 0
        for images, labels in loader:
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, spec["size"], spec["size"]):
                raise SystemExit(f"unexpected batch {images.dtype} {tuple(images.shape)}")
            images.clone()
            labels.clone()
            samples += images.shape[0]
        secs = time.perf_counter() - t0
        cpu = B.cpu_delta(c0, B.tree_cpu([me]))
        epochs.append({"epoch": epoch, "samples": samples, "seconds": secs, "cpu_s": cpu,
                       "samples_per_s": samples / secs if secs > 0 else 0.0})
    print(json.dumps({"webdataset": getattr(wds, "__version__", "?"), "torch": torch.__version__,
                      "epochs": epochs}))
    return 0


def run_webdataset(args, py, shards, workers, failures):
    spec = {"shards": shards, "size": BI.SIZE, "batch_size": BI.BATCH, "workers": workers, "seed": BI.SEED,
            "epochs": 2}
    cmd = [py, os.path.abspath(__file__), "--child", json.dumps(spec)]
    log(f"bench_tar: webdataset + DataLoader num_workers={workers}")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.read_timeout)
    if r.returncode != 0:
        failures.append(f"webdataset w={workers} exited {r.returncode}: {r.stderr.decode(errors='replace')[-800:]}")
        return None
    res = json.loads(r.stdout.decode().strip().splitlines()[-1])
    e = res["epochs"][-1]
    if e["samples"] != args.images:
        failures.append(f"webdataset w={workers}: epoch 1 gave {e['samples']} samples, not {args.images}")
    row = {"loader": "webdataset+DataLoader", "workers": workers, "samples_per_s": e["samples_per_s"],
           "epoch0_samples_per_s": res["epochs"][0]["samples_per_s"],
           "cpu_s_per_1000": e["cpu_s"] / e["samples"] * 1000 if e["cpu_s"] is not None and e["samples"] else None,
           "epochs": res["epochs"], "webdataset": res["webdataset"]}
    log(f"bench_tar: webdataset w={workers}: {row['samples_per_s']:,.0f} samples/s")
    return row


def render(rows, meta):
    lines = [f"# tar shards: loaderd vs webdataset + DataLoader ({meta['date']})", "",
             f"{meta['images']} JPEGs (256–500 px, quality 90) in {SHARDS} WebDataset shards; "
             f"RandomResizedCrop {BI.SIZE} + flip + uint8 CHW, batch {BI.BATCH}; epoch 1 (steady) of 2; "
             f"{meta['machine']}.", "",
             "| loader | workers | samples/s | CPU s / 1,000 | ratio loaderd / webdataset |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['loader']} | {r['workers']} | {r['samples_per_s']:,.0f} | "
                     f"{B.fmt(r.get('cpu_s_per_1000'), '.3f')} | {B.fmt(r.get('ratio'), '.2f') + 'x' if r.get('ratio') else ''} |")
    if meta["failures"]:
        lines += ["", "Failures:", ""] + [f"- {f}" for f in meta["failures"]]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description="loaderd tar_shards vs webdataset + DataLoader")
    p.add_argument("--quick", action="store_true", help="500 images instead of 2,000")
    p.add_argument("--images", type=int)
    p.add_argument("--workers", default="2", help="worker counts for both loaders (default 2)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--read-timeout", type=float, default=300.0)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.images is None:
        a.images = 500 if a.quick else 2000
    a.workers = [int(w) for w in a.workers.split(",") if w.strip()]
    a.loaderd_epochs = 2
    return a


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] != "--child":
        argv = shlex.split(os.environ.get("BENCH_TAR_ARGS", "")) + argv
        if "--quick" in shlex.split(os.environ.get("BENCH_ARGS", "")) and "--quick" not in argv:
            argv.append("--quick")
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    os.makedirs(args.results_dir, exist_ok=True)
    bins = {n: os.path.join(REPO, args.build_dir, "bin", n) for n in ("loaderd", "loaderctl", "ld-genimages")}
    img_dir, files = BI.generate(args, bins["ld-genimages"])
    shard_dir = os.path.join(args.data_dir, f"shards-{args.images}")
    shards = make_shards(img_dir, files, shard_dir)
    log(f"bench_tar: {len(shards)} shards, {warm(shard_dir) / B.MIB:.0f} MiB read into the page cache")
    failures, rows = [], []
    BI.write_config = lambda path, sock, d, workers: tar_config(path, sock, d, workers)
    py, why = venv_python(args)
    if why:
        failures.append("webdataset skipped: " + why)
    largs = argparse.Namespace(**vars(args))
    largs.results_dir = os.path.join(args.results_dir, "tar-raw")     # not over bench_images' raw files
    os.makedirs(largs.results_dir, exist_ok=True)
    for w in args.workers:
        row = BI.run_loaderd(largs, bins, shard_dir, w, failures)
        if row:
            rows.append({k: row[k] for k in ("loader", "workers", "samples_per_s", "epoch0_samples_per_s",
                                             "cpu_s_per_1000")})
        if py:
            wrow = run_webdataset(args, py, shards, w, failures)
            if wrow:
                rows.append(wrow)
                if row:
                    rows[-2]["ratio"] = row["samples_per_s"] / wrow["samples_per_s"]
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "images": args.images,
            "machine": B.machine_line(B.machine_info()), "failures": failures}
    md = render(rows, meta)
    with open(os.path.join(args.results_dir, "tar.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.results_dir, "tar.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(md)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
