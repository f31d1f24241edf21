#!/usr/bin/python3
"""bench_peers — loaderd against the loaders a user would pick instead of it (issue 15,
item 6): tf.data (tensorflow-cpu), NVIDIA DALI's CPU pipeline and SPDL, next to PyTorch's
DataLoader, on make bench's data and on the same cores.

`make bench-peers` first makes a virtual environment under the build folder
(build/peers/venv, over Debian's python3 with --system-site-packages so that torch and
torchvision stay Debian's) and installs the peers from PyPI into it, pinned in
bench/peers-requirements.txt (once: a stamp file remembers what was installed, and pip's
cache lives in build/peers/pip-cache). Then, for three workloads:

- jpeg: bench_images' JPEGs (10,000; quick 1,000): decode, RandomResizedCrop 224 (scale
  0.08-1, ratio 3/4-4/3, antialiased bilinear), horizontal flip p=0.5, uint8 CHW, batch 64;
- files: bench.py's records (100,000 files of 3 KiB; quick 20,000), each file's bytes as
  uint8[3072] and its label, batch 64;
- tokens: bench.py's token file (100M uint16 tokens; quick 20M), window i = tokens
  [1024 i, 1024 i + 1025), batch 32;

each loader reads every sample of a shuffled epoch, the consumer copies every batch into
its own memory (numpy), epoch 0 is an untimed warm-up (graph building, worker start; cut
after 10 s) and epoch 1 is timed (cut after --max-seconds, then marked partial). Every loader runs in its own process pinned to the cores this script may use
(taskset), and its thread pools are sized to them: tf.data's private thread pool and TF's
intra/inter-op pools, DALI's num_threads, SPDL's concurrency, DataLoader's num_workers
(its best setting in make bench: 2 for JPEG, 0 for files and tokens); loaderd runs 2
workers. Reported: samples/s, CPU ms per 1,000 samples (the process tree's user +
system time over the timed epoch; loaderd: the daemon's and loaderctl's, over all its
epochs), and loaderd's ratio to the best peer and to DataLoader. A loader that cannot do
a workload (not installed, an error) is reported with the reason; the others go on.

Writes bench/results/peers.{md,json}. Options also from BENCH_PEERS_ARGS; --quick in
BENCH_ARGS is honoured.
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

REQUIREMENTS = os.path.join(HERE, "peers-requirements.txt")
SIZE, JPEG_BATCH, FILES_BATCH, TOKENS_BATCH, CONTEXT = 224, 64, 64, 32, 1024
FULL = {"images": 10_000, "files": 100_000, "tokens": 100_000_000}
QUICK = {"images": 1_000, "files": 20_000, "tokens": 20_000_000}
DATALOADER_WORKERS = {"jpeg": 2, "files": 0, "tokens": 0}   # the best of make bench on 2 cores
PEERS = ("tfdata", "dali", "spdl")
NOT_RUN = {("spdl", "tokens"): "SPDL loads media and files; it has no source of token windows"}
WARMUP_SECONDS = 10.0           # epoch 0 is a warm-up: graphs built, workers started, pools filled
WORKLOADS = ("jpeg", "files", "tokens")
NAMES = {"loaderd": "loaderd (loaderctl read --touch)", "dataloader": "PyTorch DataLoader", "tfdata": "tf.data",
         "dali": "DALI (CPU pipeline)", "spdl": "SPDL"}
log = measure.log


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_PEERS_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the quick data sets of make bench --quick")
    p.add_argument("--venv", default=None, help="the peers' virtual environment (default BUILD/peers/venv)")
    p.add_argument("--setup-only", action="store_true", help="make the virtual environment and stop")
    p.add_argument("--loaders", default="loaderd,dataloader," + ",".join(PEERS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--max-seconds", type=float, default=60.0, help="bound on one timed epoch")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.sizes = QUICK if a.quick else FULL
    a.loaders = [x for x in a.loaders.split(",") if x]
    a.workloads = [x for x in a.workloads.split(",") if x]
    if not os.path.isabs(a.build_dir):
        a.build_dir = os.path.join(measure.REPO, a.build_dir)
    a.venv = a.venv or os.path.join(a.build_dir, "peers", "venv")
    return a


# ---------------------------------------------------------------------------------------
# The virtual environment

def ensure_venv(venv):
    """Makes the venv and installs bench/peers-requirements.txt into it, unless a stamp
    says that this very file was installed already. Returns the venv's python."""
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "peers-installed.txt")
    with open(REQUIREMENTS) as f:
        want = f.read()
    try:
        with open(stamp) as f:
            if f.read() == want and os.access(py, os.X_OK):
                return py
    except OSError:
        pass
    if not os.access(py, os.X_OK):
        log(f"bench_peers: creating {venv} (over {measure.SYSTEM_PYTHON}, with its site packages)")
        subprocess.run([measure.SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv], check=True)
    cache = os.path.join(os.path.dirname(venv), "pip-cache")
    log(f"bench_peers: installing {REQUIREMENTS} into {venv} (pip cache: {cache}); this downloads ~1 GB once")
    r = subprocess.run([py, "-m", "pip", "install", "--cache-dir", cache, "-r", REQUIREMENTS])
    if r.returncode != 0:
        measure.fail(f"pip install -r {REQUIREMENTS} failed (exit {r.returncode}); see above")
    with open(stamp, "w") as f:
        f.write(want)
    return py


# ---------------------------------------------------------------------------------------
# Data (make bench's, generated the same way)

def data_paths(args):
    s = args.sizes
    return {"jpeg": os.path.join(args.data_dir, f"images-{s['images']}"),
            "files": os.path.join(args.data_dir, f"records-{s['files']}x3072-c100"),
            "tokens": os.path.join(args.data_dir, f"tokens-{s['tokens']}.u16.bin")}


def generate(args, bins, paths):
    s = args.sizes
    run = lambda cmd: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # noqa: E731
    if "jpeg" in args.workloads:
        run([bins["ld-genimages"], paths["jpeg"], "--count", str(s["images"]), "--classes", "100",
             "--min", "256", "--max", "500", "--quality", "90"])
    if "files" in args.workloads:
        run([bins["ld-gendata"], "files", paths["files"], "--count", str(s["files"]), "--size", "3072",
             "--classes", "100"])
    if "tokens" in args.workloads:
        run([bins["ld-gendata"], "tokens", paths["tokens"], "--count", str(s["tokens"])])


def warm(path):
    """Reads every byte under path once: every loader reads from the page cache."""
    total = 0
    files = [path] if os.path.isfile(path) else [os.path.join(d, n) for d, _, ns in os.walk(path) for n in ns]
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
    return total


def list_samples(root, ext):
    """(sorted relative paths, labels: the index of the class folder)."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    paths, labels = [], []
    for k, c in enumerate(classes):
        for n in sorted(os.listdir(os.path.join(root, c))):
            if n.endswith(ext) and not n.startswith("."):
                paths.append(os.path.join(root, c, n))
                labels.append(k)
    return paths, labels


# ---------------------------------------------------------------------------------------
# The peers (child processes; each returns an iterator factory: epoch -> batches of numpy)

def tfdata_epochs(spec):
    import numpy as np
    import tensorflow as tf
    n = spec["threads"]
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = n
    opts.deterministic = False
    w = spec["workload"]
    if w == "jpeg":
        paths, labels = list_samples(spec["data"], ".jpg")

        def load(path, label):
            # The standard TF recipe for ImageNet: the crop drawn on the header's size,
            # only the crop window decoded, then resized and flipped.
            data = tf.io.read_file(path)
            shape = tf.io.extract_jpeg_shape(data)
            begin, size, _ = tf.image.sample_distorted_bounding_box(
                shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
                aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
                use_image_if_no_bounding_boxes=True)
            y, x, _ = tf.unstack(begin)
            h, wd, _ = tf.unstack(size)
            img = tf.io.decode_and_crop_jpeg(data, tf.stack([y, x, h, wd]), channels=3)
            img = tf.image.resize(img, (SIZE, SIZE), method="bilinear", antialias=True)
            img = tf.image.random_flip_left_right(tf.cast(tf.round(img), tf.uint8))
            return tf.transpose(img, (2, 0, 1)), label
        ds = tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), reshuffle_each_iteration=True)
        ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(JPEG_BATCH)
    elif w == "files":
        paths, labels = list_samples(spec["data"], ".bin")

        def load(path, label):
            return tf.io.decode_raw(tf.io.read_file(path), tf.uint8), label
        ds = tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), reshuffle_each_iteration=True)
        ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(FILES_BATCH)
    else:
        tokens = np.memmap(spec["data"], dtype=np.uint16, mode="r")
        count = (len(tokens) - 1) // CONTEXT
        flat = tf.constant(np.asarray(tokens[: count * CONTEXT + 1]).view(np.int16))   # tf has no uint16 gather on CPU
        offs = tf.range(CONTEXT + 1, dtype=tf.int64)[None, :]

        def windows(idx):          # batch first, then one gather per batch: the fast way in tf.data
            return tf.gather(flat, idx[:, None] * CONTEXT + offs)
        ds = tf.data.Dataset.range(count).shuffle(count, reshuffle_each_iteration=True).batch(TOKENS_BATCH)
        ds = ds.map(windows, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE).with_options(opts)

    def epoch(_):
        for b in ds:
            if isinstance(b, tuple):
                yield [np.array(t) for t in b]
            else:
                yield [np.array(b)]
    return epoch, {"tensorflow": tf.__version__}


def dali_epochs(spec):
    import numpy as np
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    n = spec["threads"]
    w = spec["workload"]
    batch = {"jpeg": JPEG_BATCH, "files": FILES_BATCH, "tokens": TOKENS_BATCH}[w]
    if w in ("jpeg", "files"):
        root = spec["data"]
        count = len(list_samples(root, ".jpg" if w == "jpeg" else ".bin")[0])

        @dali.pipeline_def(batch_size=batch, num_threads=n, device_id=None, seed=0, prefetch_queue_depth=2)
        def pipe():
            data, label = fn.readers.file(file_root=root, random_shuffle=True, name="reader",
                                          file_filters=["*.jpg"] if w == "jpeg" else ["*.bin"])
            if w == "jpeg":
                img = fn.decoders.image_random_crop(data, device="cpu", output_type=types.RGB,
                                                    random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
                img = fn.resize(img, resize_x=SIZE, resize_y=SIZE, antialias=True)
                img = fn.flip(img, horizontal=fn.random.coin_flip(probability=0.5))
                data = fn.transpose(img, perm=[2, 0, 1])
            return data, label
        p = pipe()
    else:
        tokens = np.memmap(spec["data"], dtype=np.uint16, mode="r")
        count = (len(tokens) - 1) // CONTEXT
        rng = np.random.default_rng(0)
        state = {"order": rng.permutation(count), "pos": 0}

        def source(_info):
            k = state["pos"]
            if k + batch > count:
                state["order"], k = rng.permutation(count), 0
            state["pos"] = k + batch
            return [np.array(tokens[i * CONTEXT: i * CONTEXT + CONTEXT + 1]) for i in state["order"][k:k + batch]]

        @dali.pipeline_def(batch_size=batch, num_threads=n, device_id=None, seed=0, prefetch_queue_depth=2)
        def pipe():
            return fn.external_source(source=source, batch=True, dtype=types.UINT16)
        p = pipe()
    p.build()

    def epoch(_):
        for _ in range(count // batch):       # whole batches: DALI's readers wrap an epoch's last one
            yield [np.array(o.as_array()) for o in p.run()]
    return epoch, {"nvidia-dali": dali.__version__}


def spdl_epochs(spec):
    import numpy as np
    import spdl.io
    from spdl.pipeline import PipelineBuilder
    n = spec["threads"]
    w = spec["workload"]
    rng = np.random.default_rng(0)
    paths, labels = list_samples(spec["data"], ".jpg" if w == "jpeg" else ".bin")

    if w == "jpeg":
        from PIL import Image
        import math
        import random

        def load(i):
            with Image.open(paths[i]) as im:           # the header only: the crop is drawn on its size
                W, H = im.size
            area = W * H
            for _ in range(10):                         # torchvision's RandomResizedCrop.get_params
                a = area * random.uniform(0.08, 1.0)
                r = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
                cw, ch = int(round(math.sqrt(a * r))), int(round(math.sqrt(a / r)))
                if 0 < cw <= W and 0 < ch <= H:
                    x, y = random.randint(0, W - cw), random.randint(0, H - ch)
                    break
            else:
                cw, ch, x, y = W, H, 0, 0
            flip = ",hflip" if random.random() < 0.5 else ""
            frames = spdl.io.load_image(paths[i], filter_desc=f"crop={cw}:{ch}:{x}:{y},scale={SIZE}:{SIZE}:"
                                        f"flags=bilinear{flip},format=rgb24")
            return np.ascontiguousarray(spdl.io.to_numpy(frames).transpose(2, 0, 1)), labels[i]
    else:
        def load(i):
            with open(paths[i], "rb") as f:
                return np.frombuffer(f.read(), np.uint8), labels[i]

    def collate(items):
        return [np.stack([a for a, _ in items]), np.array([b for _, b in items], np.int64)]

    batch = JPEG_BATCH if w == "jpeg" else FILES_BATCH

    load(0)  # a failure every sample would meet (a missing FFmpeg library) is raised here
    # with its message; inside the pipeline a failing stage only logs and drops the sample

    def epoch(_):
        order = rng.permutation(len(paths)).tolist()
        pipe = (PipelineBuilder().add_source(order).pipe(load, concurrency=n).aggregate(batch)
                .pipe(collate).add_sink(8).build(num_threads=n))
        with pipe.auto_stop():
            for b in pipe:
                yield b
    return epoch, {"spdl": getattr(spdl, "__version__", "?")}


def dataloader_epochs(spec):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
    w, workers = spec["workload"], spec["workers"]
    kw = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
    if w == "jpeg":
        from torchvision import transforms as T
        from torchvision.datasets import ImageFolder
        ds = ImageFolder(spec["data"], transform=T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(),
                                                            T.PILToTensor()]))
        batch = JPEG_BATCH
    elif w == "files":
        paths, labels = list_samples(spec["data"], ".bin")

        class Records(Dataset):
            def __len__(self):
                return len(paths)

            def __getitem__(self, i):
                with open(paths[i], "rb") as f:
                    return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8), labels[i]
        ds, batch = Records(), FILES_BATCH
    else:
        path = spec["data"]

        class Windows(Dataset):
            def __init__(self):
                self.t = None
                self.n = (os.path.getsize(path) // 2 - 1) // CONTEXT

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                if self.t is None:
                    self.t = np.memmap(path, dtype=np.int16, mode="r")
                return torch.from_numpy(np.array(self.t[i * CONTEXT: i * CONTEXT + CONTEXT + 1]))
        ds, batch = Windows(), TOKENS_BATCH
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, **kw)

    def epoch(_):
        for b in dl:
            yield [t.numpy().copy() for t in (b if isinstance(b, (list, tuple)) else [b])]
    return epoch, {"torch": torch.__version__}


def child_main(spec):
    """One loader on one workload: epoch 0 untimed (a warm-up, cut after WARMUP_SECONDS),
    epoch 1 timed (bounded by max_seconds); prints one JSON line."""
    make = {"tfdata": tfdata_epochs, "dali": dali_epochs, "spdl": spdl_epochs,
            "dataloader": dataloader_epochs}[spec["loader"]]
    epoch, versions = make(spec)
    me = os.getpid()
    out = {"versions": versions, "epochs": []}
    for e in range(2):
        c0, t0 = measure.tree_cpu([me]), time.perf_counter()
        samples = nbytes = 0
        partial = False
        for parts in epoch(e):
            samples += len(parts[0])
            nbytes += sum(p.nbytes for p in parts)
            if time.perf_counter() - t0 > (spec["max_seconds"] if e == 1 else WARMUP_SECONDS):
                partial = True
                break
        secs = time.perf_counter() - t0
        cpu = measure.cpu_delta(c0, measure.tree_cpu([me]))
        out["epochs"].append({"samples": samples, "bytes": nbytes, "seconds": secs, "cpu_s": cpu,
                              "partial": partial})
        if not samples:  # a pipeline that drops what fails (SPDL's) ends an epoch empty
            sys.exit(f"{spec['loader']} delivered no sample in epoch {e} ({secs:.1f} s): its "
                     f"pipeline dropped every one; the reason is in its log above")
    t = out["epochs"][1]
    out.update({"samples_per_s": t["samples"] / t["seconds"] if t["seconds"] > 0 else None,
                "cpu_ms_per_1000": t["cpu_s"] / t["samples"] * 1e6 if t["samples"] else None})
    print(json.dumps(out), flush=True)


def run_child(args, py, loader, workload, data, raw, cpus):
    spec = {"loader": loader, "workload": workload, "data": data, "threads": len(cpus),
            "workers": DATALOADER_WORKERS[workload], "max_seconds": args.max_seconds}
    tag = f"{loader}-{workload}"
    out_p, err_p = os.path.join(raw, tag + ".json"), os.path.join(raw, tag + ".err")
    cmd = ["taskset", "-c", ",".join(map(str, cpus)), py, os.path.abspath(__file__), "--child", json.dumps(spec)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    code, _, _, wall = measure.run_monitored(cmd, out_p, err_p, args.max_seconds * 4 + 300, 0, env=env)
    if code != 0:
        why = measure.tail(err_p, 3).strip().splitlines()
        return {"error": f"exit {code}: {why[-1] if why else '?'}"}
    with open(out_p) as f:
        lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": "no result line"}


# ---------------------------------------------------------------------------------------
# loaderd

def run_loaderd(args, bins, paths, raw, cpus):
    tmp = tempfile.mkdtemp(prefix="ld-peers-")
    sock, cfg = os.path.join(tmp, "s.sock"), os.path.join(raw, "peers.yaml")
    q = json.dumps
    with open(cfg, "w") as f:
        f.write(f"""# Written by bench/bench_peers.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {len(cpus)}
  memory_budget: 1GiB
  log_level: warn
datasets:
  jpeg:
    kind: image_folder
    path: {q(paths['jpeg'])}
    pattern: "*.jpg"
    transforms:
      - random_resized_crop: {{size: {SIZE}}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
  files:
    kind: files
    path: {q(paths['files'])}
    pattern: "*.bin"
  tokens:
    kind: token_windows
    path: {q(paths['tokens'])}
    dtype: uint16
    context: {CONTEXT}
""")
    log_path = os.path.join(raw, "loaderd.log")
    with open(log_path, "wb") as lf:
        proc = subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus)), bins["loaderd"], "--config", cfg],
                                stdout=lf, stderr=lf, start_new_session=True)
    out = {}
    try:
        t0 = time.perf_counter()
        while not (os.path.exists(sock) and measure.socket_accepts(sock)):
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                return {w: {"error": "loaderd did not start" + measure.log_tail(log_path)} for w in args.workloads}
            time.sleep(0.05)
        for w in args.workloads:
            batch = {"jpeg": JPEG_BATCH, "files": FILES_BATCH, "tokens": TOKENS_BATCH}[w]
            d0 = measure.cpu_seconds(proc.pid)
            out_p, err_p = os.path.join(raw, f"loaderd-{w}.json"), os.path.join(raw, f"loaderd-{w}.err")
            cmd = ["taskset", "-c", ",".join(map(str, cpus)), bins["loaderctl"], "--socket", sock, "read", w,
                   "--epochs", "2", "--batch-size", str(batch), "--touch", "--json"]
            code, _, mem, _ = measure.run_monitored(cmd, out_p, err_p, args.max_seconds * 4 + 120, 0)
            d1 = measure.cpu_seconds(proc.pid)
            if code != 0:
                out[w] = {"error": f"loaderctl exit {code}: {measure.tail(err_p, 2).strip()}"}
                continue
            with open(out_p) as f:
                r = json.load(f)
            cpu = (d1 - d0) + mem.rusage.ru_utime + mem.rusage.ru_stime
            e1 = r["epochs"][1]
            out[w] = {"samples_per_s": e1["samples_per_s"], "epochs": r["epochs"],
                      "cpu_ms_per_1000": cpu / r["samples"] * 1e6, "cpu_includes_epoch0": True}
            log(f"bench_peers: loaderd {w}: {e1['samples_per_s']:,.0f} samples/s")
    finally:
        proc.terminate()
        out["_exit"] = proc.wait(timeout=30)
        if os.path.exists(sock):
            os.unlink(sock)
        os.rmdir(tmp)
    return out


# ---------------------------------------------------------------------------------------
# Report

def summarize(res):
    s = {}
    for w in res["workloads"]:
        rows = res["results"].get(w, {})
        ok = {k: v for k, v in rows.items() if isinstance(v, dict) and v.get("samples_per_s")}
        ld = ok.get("loaderd", {}).get("samples_per_s")
        peers = {k: v for k, v in ok.items() if k in PEERS}
        best = max(peers, key=lambda k: peers[k]["samples_per_s"], default=None)
        dl = ok.get("dataloader", {}).get("samples_per_s")
        s[w] = {"loaderd": ld, "best_peer": best, "best_peer_samples_per_s": best and peers[best]["samples_per_s"],
                "vs_best_peer": measure.ratio(ld, best and peers[best]["samples_per_s"]),
                "dataloader": dl, "vs_dataloader": measure.ratio(ld, dl)}
    return s


def render(res):
    fmt = measure.fmt
    L = ["# loaderd against its peers (make bench-peers)", "",
         f"Same data as make bench ({'quick' if res['quick'] else 'full'} sizes), every loader on the same "
         f"{len(res['cpus'])} cores (taskset {','.join(map(str, res['cpus']))}), thread pools sized to them; "
         "epoch 0 untimed, epoch 1 timed; every batch copied by the consumer. Versions: "
         + ", ".join(f"{k} {v}" for k, v in sorted(res["versions"].items())) + ".", ""]
    titles = {"jpeg": f"JPEG: decode + RandomResizedCrop {SIZE} + flip, uint8 CHW, batch {JPEG_BATCH}",
              "files": f"small files: 3 KiB each, bytes + label, batch {FILES_BATCH}",
              "tokens": f"token windows: {CONTEXT + 1} x uint16, batch {TOKENS_BATCH}"}
    for w in res["workloads"]:
        rows = res["results"].get(w, {})
        s = res["summary"][w]
        L += [f"## {titles[w]}", "", "| loader | samples/s | CPU ms / 1,000 samples | loaderd ÷ this |",
              "|---|---:|---:|---:|"]
        for k in ("loaderd", "dataloader", *PEERS):
            r = rows.get(k)
            if r is None:
                continue
            name = NAMES[k] + (f" (num_workers={DATALOADER_WORKERS[w]})" if k == "dataloader" else "")
            if "error" in r:
                L.append(f"| {name} | not run: {r['error']} | | |")
                continue
            cut = " (partial epoch)" if any(e.get("partial") for e in r.get("epochs", [])[1:]) else ""
            L.append(f"| {name} | {r['samples_per_s']:,.0f}{cut} | {fmt(r.get('cpu_ms_per_1000'), ',.0f')} | "
                     f"{fmt(measure.ratio(s['loaderd'], r['samples_per_s']), '.2f')}× |")
        L += ["", f"loaderd ÷ best peer ({NAMES.get(s['best_peer'], '—')}): {fmt(s['vs_best_peer'], '.2f')}×; "
              f"loaderd ÷ DataLoader: {fmt(s['vs_dataloader'], '.2f')}×.", ""]
    L += ["loaderd's CPU covers both of its epochs (the daemon's and loaderctl's); the others' covers the timed "
          "epoch of the loader's process tree."]
    return "\n".join(L) + "\n"


def main(argv):
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    py = ensure_venv(args.venv)
    if args.setup_only:
        return 0
    bins = {n: os.path.join(args.build_dir, "bin", n) for n in ("loaderd", "loaderctl", "ld-gendata", "ld-genimages")}
    for p in bins.values():
        if not os.access(p, os.X_OK):
            measure.fail(f"{p} not found: run make first")
    cpus = sorted(os.sched_getaffinity(0))
    os.makedirs(args.results_dir, exist_ok=True)
    raw = os.path.join(args.results_dir, "peers-raw")
    os.makedirs(raw, exist_ok=True)
    paths = data_paths(args)
    t0 = time.perf_counter()
    generate(args, bins, paths)
    for w in args.workloads:
        log(f"bench_peers: page cache warmed: {w}, {warm(paths[w]) / measure.MIB:,.0f} MiB")
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "machine": measure.machine_info(), "quick": args.quick, "cpus": cpus, "workloads": args.workloads,
           "command": " ".join(["bench/bench_peers.py", *argv]), "results": {w: {} for w in args.workloads},
           "versions": {}}
    if "loaderd" in args.loaders:
        ld = run_loaderd(args, bins, paths, raw, cpus)
        res["loaderd_exit"] = ld.pop("_exit", None)
        for w in args.workloads:
            res["results"][w]["loaderd"] = ld.get(w, {"error": "not measured"})
    for loader in [x for x in args.loaders if x != "loaderd"]:
        for w in args.workloads:
            if (loader, w) in NOT_RUN:
                res["results"][w][loader] = {"error": NOT_RUN[loader, w]}
                continue
            r = run_child(args, py if loader in PEERS else measure.SYSTEM_PYTHON, loader, w, paths[w], raw, cpus)
            res["results"][w][loader] = r
            res["versions"].update(r.get("versions", {}))
            log(f"bench_peers: {loader} {w}: " + (f"{r['samples_per_s']:,.0f} samples/s" if r.get("samples_per_s")
                                                  else r.get("error", "?")))
    res["summary"] = summarize(res)
    res["seconds"] = time.perf_counter() - t0
    md = render(res)
    dated = measure.write_results(args.results_dir, "peers", res, md)
    print(md)
    log(f"bench_peers: results: {args.results_dir}/peers.md (and {dated}.md, to commit)")
    bad = res.get("loaderd_exit") not in (0, None) or any(
        "error" in (res["results"][w].get("loaderd") or {}) for w in args.workloads)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
