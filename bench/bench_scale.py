#!/usr/bin/python3
"""bench_scale — does loaderd's cost stay flat as a dataset grows? (issue 15, item 5)

For each size of the curve it starts one loaderd serving one dataset and measures:

  open       seconds from the daemon's start to its socket answering, less the same
             for a daemon serving a one-file dataset (so: the dataset's scan and index),
             and the scan rate that makes (entries/s);
  index      the daemon's resident memory once up (VmRSS) less the one-file daemon's,
             per sample: what the index costs;
  first      open → first batch as a trainer sees it (`loaderctl read --json`'s
             first_batch_ms, batch 64, shuffled, rank 0 of 65,536 so that the read
             stops after a batch or two whatever the size), median of 3.

The datasets are generated once under build/scale-data/ and reused (a `.complete`
marker records what was made):

  files-100k, files-1m   `files` trees, class_CCC/IIIIIII.bin in 1,000 folders; every
                         file is empty but the first of each folder (64 bytes): a
                         million non-empty files would take 4 GB of disk blocks, and
                         the index does not depend on the bytes;
  manifest-1m,           `files` datasets with a CSV manifest (path,label) of that many
  manifest-5m            rows, naming the files of files-1m (the 5 M manifest names
                         each file five times): five million files take too long to
                         create on an ordinary disk.

Then a cache build: `loaderctl cache build` of a 256 MiB `files` tree (4,096 files of
64 KiB) read from a warm page cache into a cache file on /dev/shm (the build's own cost,
not the disk's), timed by the daemon's log, in GB/s (target ≥ 1 GB/s): the median of
three builds, each on a fresh daemon.

And the time to first batch of the two kinds of stream that issue 15 names: an image
stream (300 JPEGs of 320–400 px, RandomResizedCrop 224 + flip, uint8 CHW, batch 64) and
pre-decoded data (token windows of 1,025 uint16, batch 32): open → first batch with
`loaderctl read`, 2 workers, each read on a fresh stream, median and best of 7 (targets:
under 20 ms and under 5 ms).

Targets (issue 15): ≤ 64 bytes of index per sample, scan ≥ 200,000 entries/s. Prints a
table and writes bench/results/scale.md and scale.json. `make bench` runs it; the first
run spends a few minutes creating the files. `--sizes` picks the points
(default: files-100k,files-1m,manifest-1m,manifest-5m); `--quick` (or --quick in
BENCH_ARGS) measures files-100k and the cache build only.
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import measure as B  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)

CLASSES = 1000
NONEMPTY_BYTES = 64
POINTS = {  # name: (kind, samples)
    "files-100k": ("files", 100_000),
    "files-1m": ("files", 1_000_000),
    "manifest-1m": ("manifest", 1_000_000),
    "manifest-5m": ("manifest", 5_000_000),
}
CACHE_FILES, CACHE_SIZE = 4096, 65536
TARGET_BYTES_PER_SAMPLE = 64
TARGET_SCAN_RATE = 200_000
TARGET_CACHE_GBPS = 1.0
CACHE_PATH = "/dev/shm/ld-bench-scale-%d.ldcache" % os.getpid()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_SCALE_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="files-100k and the cache build only")
    p.add_argument("--sizes", default=None, help="comma-separated points (%s)" % ",".join(POINTS))
    p.add_argument("--runs", type=int, default=3, help="first-batch reads per point")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=None, help="default: BUILD/scale-data")
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    names = a.sizes.split(",") if a.sizes else (["files-100k"] if a.quick else list(POINTS))
    for n in names:
        if n not in POINTS:
            p.error(f"unknown size {n!r}; known: {', '.join(POINTS)}")
    a.points = names
    a.data_dir = a.data_dir or os.path.join(REPO, a.build_dir, "scale-data")
    return a


def rel_path(i):
    return "class_%03d/%07d.bin" % (i % CLASSES, i)


def make_tree(root, count):
    """count files under root (see the top of the file), once."""
    marker = os.path.join(root, ".complete")
    want = f"scale tree v1 {count} {CLASSES} {NONEMPTY_BYTES}\n"
    try:
        with open(marker) as f:
            if f.read() == want:
                return
    except OSError:
        pass
    log(f"bench_scale: creating {count:,} files under {root} (once; a few minutes for a million)")
    shutil.rmtree(root, ignore_errors=True)
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, "class_%03d" % c))
    payload = bytes(range(NONEMPTY_BYTES))
    t0 = time.perf_counter()
    for i in range(count):
        fd = os.open(os.path.join(root, rel_path(i)), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        if i < CLASSES:
            os.write(fd, payload)
        os.close(fd)
        if i and i % 200_000 == 0:
            log(f"bench_scale:   {i:,} files, {time.perf_counter() - t0:.0f} s")
    with open(marker, "w") as f:
        f.write(want)


def make_manifest(path, rows, files):
    """A CSV manifest of `rows` rows naming the first `files` files of a tree, in turn."""
    want = f"# scale manifest v1 {rows} {files}\n"
    try:
        with open(path) as f:
            if f.readline() == want:
                return
    except OSError:
        pass
    log(f"bench_scale: writing a manifest of {rows:,} rows")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("path,label\n")
        for i in range(rows):
            j = i % files
            f.write(f"{rel_path(j)},{j % CLASSES}\n")
    # The marker is a file of its own: a CSV comment is not part of the format.
    os.replace(tmp, path)
    with open(path + ".params", "w") as f:
        f.write(want)


def manifest_ready(path, rows, files):
    try:
        with open(path + ".params") as f:
            return f.readline() == f"# scale manifest v1 {rows} {files}\n"
    except OSError:
        return False


def warm(root):
    """Reads every directory (and the few non-empty files) so that the scan is measured
    from a warm dentry and page cache, as on a node that has served the data before."""
    for d, _, files in os.walk(root):
        for f in files:
            os.stat(os.path.join(d, f))


def write_config(path, sock, name, kind, root, manifest=None):
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    extra = ""
    if manifest:
        extra = f"""    manifest:
      path: {q(manifest)}
      columns:
        path: file
        label: label
"""
    cache = ""
    level = "warn"
    if kind == "cache":
        # On tmpfs: the build's own cost, not the disk's fsync; its start and end are
        # read from the log's timestamps (info and debug lines).
        cache = f"""    cache:
      path: {q(CACHE_PATH)}
      mode: auto
"""
        level = "debug"
    with open(path, "w") as f:
        f.write(f"""# Written by bench/bench_scale.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: 2
  memory_budget: 1GiB
  log_level: {level}
datasets:
  {name}:
    kind: files
    path: {q(root)}
{extra}{cache}""")


class Daemon:
    def __init__(self, bins, tmp, name, kind, root, manifest=None, log_path=None):
        self.bins = bins
        self.sock = os.path.join(tmp, name + ".sock")
        self.cfg = os.path.join(tmp, name + ".yaml")
        write_config(self.cfg, self.sock, name, kind, root, manifest)
        self.log_path = log_path or os.path.join(tmp, name + ".log")
        self.proc = None

    def start(self, timeout=600):
        with open(self.log_path, "wb") as lf:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen([self.bins["loaderd"], "--config", self.cfg], stdout=lf, stderr=lf,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        while not (os.path.exists(self.sock) and B.socket_accepts(self.sock)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"loaderd exited {self.proc.returncode}" + B.log_tail(self.log_path))
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError("loaderd did not come up" + B.log_tail(self.log_path))
            time.sleep(0.002)
        self.up_s = time.perf_counter() - t0
        self.cpu_s = B.cpu_seconds(self.proc.pid) or 0.0
        self.rss_kib = B.read_proc_kib(self.proc.pid, "VmRSS")
        return self

    def ctl(self, *argv, timeout=600):
        return B.loaderctl_json(self.bins["loaderctl"], self.sock, *argv, timeout=timeout)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def first_batches(d, name, runs):
    out = []
    for k in range(runs):
        r = d.ctl("read", name, "--batch-size", "64", "--seed", str(k + 1), "--rank", "0",
                  "--world-size", "65536", "--json")
        out.append(r["first_batch_ms"])
    return out


def measure_point(args, bins, tmp, name, base):
    kind, n = POINTS[name]
    tree = os.path.join(args.data_dir, "files-100k" if n == 100_000 else "files-1m")
    manifest = None
    if kind == "manifest":
        manifest = os.path.join(args.data_dir, f"{name}.csv")
    warm(tree)
    d = Daemon(bins, tmp, name.replace("-", "_"), kind, tree, manifest).start()
    try:
        ds = next(x for x in d.ctl("--json", "datasets")["datasets"] if x["name"] == name.replace("-", "_"))
        count = int(ds["samples"])
        open_s = max(d.up_s - base.up_s, 1e-6)
        open_cpu_s = max(d.cpu_s - base.cpu_s, 0.01)
        index_b = (d.rss_kib - base.rss_kib) * 1024.0 / count
        fb = first_batches(d, name.replace("-", "_"), args.runs)
    finally:
        d.stop()
    row = {"point": name, "kind": "files" if kind == "files" else "files + manifest", "samples": count,
           "open_s": round(open_s, 3), "scan_per_s": round(count / open_s), "open_cpu_s": round(open_cpu_s, 2),
           "scan_per_cpu_s": round(count / open_cpu_s), "rss_kib": d.rss_kib,
           "index_bytes_per_sample": round(index_b, 1), "first_batch_ms": round(statistics.median(fb), 2),
           "first_batch_ms_all": [round(x, 2) for x in fb]}
    log(f"bench_scale: {name}: {count:,} samples, up in {open_s:.2f} s ({row['scan_per_s']:,}/s; "
        f"{open_cpu_s:.2f} CPU s, {row['scan_per_cpu_s']:,}/CPU s), "
        f"{index_b:.1f} B/sample, first batch {row['first_batch_ms']} ms")
    return row


CACHE_BUILDS = 3


def build_once(bins, tmp, root):
    """One `loaderctl cache build` on a fresh daemon; its seconds from the daemon's log."""
    d = Daemon(bins, tmp, "cache", "cache", root).start()
    try:
        d.ctl("cache", "build", "cache", "--json")
    finally:
        d.stop()
        try:
            os.unlink(CACHE_PATH)
        except OSError:
            pass
    stamps = {}
    with open(d.log_path, errors="replace") as f:
        for line in f:
            for key, what in (("start", "building the cache"), ("end", "': built ")):
                if what in line and key not in stamps:
                    stamps[key] = datetime.datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    if len(stamps) != 2:
        raise RuntimeError("the cache build's start and end are not in the daemon's log" + B.log_tail(d.log_path))
    return max((stamps["end"] - stamps["start"]).total_seconds(), 0.001)


def measure_cache(args, bins, tmp):
    root = os.path.join(args.data_dir, "cache-256m")
    subprocess.run([bins["gendata"], "files", root, "--count", str(CACHE_FILES), "--size", str(CACHE_SIZE),
                    "--classes", "16"], check=True, stdout=subprocess.DEVNULL)
    for dd, _, files in os.walk(root):  # page cache
        for f in files:
            with open(os.path.join(dd, f), "rb") as fh:
                fh.read()
    # A build of 256 MiB takes a few tenths of a second, at the mercy of a shared machine's
    # noise: the median of three, each on a fresh daemon, all three reported.
    runs = [build_once(bins, tmp, root) for _ in range(CACHE_BUILDS)]
    secs = statistics.median(runs)
    gbps = CACHE_FILES * CACHE_SIZE / secs / 1e9
    log(f"bench_scale: cache build of {CACHE_FILES * CACHE_SIZE >> 20} MiB: {secs:.3f} s (median of "
        f"{', '.join(f'{r:.3f}' for r in runs)}), {gbps:.2f} GB/s")
    return {"bytes": CACHE_FILES * CACHE_SIZE, "files": CACHE_FILES, "seconds": round(secs, 3),
            "seconds_all": [round(r, 3) for r in runs], "gb_per_s": round(gbps, 2)}


FB_IMAGES, FB_TOKENS, FB_RUNS = 300, 4_000_000, 7


def measure_first_batch(args, bins, tmp):
    img = os.path.join(args.data_dir, "fb-images")
    tok = os.path.join(args.data_dir, "fb-tokens.bin")
    if not os.path.isdir(img) or sum(len(f) for _, _, f in os.walk(img)) < FB_IMAGES:
        subprocess.run([bins["genimages"], img, "--count", str(FB_IMAGES), "--classes", "10", "--min", "320",
                        "--max", "400"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([bins["gendata"], "tokens", tok, "--count", str(FB_TOKENS)], check=True,
                   stdout=subprocess.DEVNULL)
    for dd, _, files in os.walk(img):
        for f in files:
            with open(os.path.join(dd, f), "rb") as fh:
                fh.read()
    with open(tok, "rb") as fh:
        while fh.read(1 << 20):
            pass
    q = json.dumps
    d = Daemon(bins, tmp, "fb", "files", img)
    sock = d.sock
    with open(d.cfg, "w") as f:  # the two streams' datasets instead of the files one
        f.write(f"""server:
  socket: {q(sock)}
  workers: 2
  memory_budget: 1GiB
  log_level: warn
datasets:
  images:
    kind: image_folder
    path: {q(img)}
    transforms:
      - random_resized_crop: {{size: 224}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
  tokens:
    kind: token_windows
    path: {q(tok)}
    context: 1024
""")
    d.start()
    out = {}
    try:
        for name, batch, target in (("images", 64, 20.0), ("tokens", 32, 5.0)):
            ms = []
            for k in range(FB_RUNS):
                r = d.ctl("read", name, "--batch-size", str(batch), "--seed", str(k + 1), "--world-size", "64",
                          "--json")
                ms.append(r["first_batch_ms"])
            out[name] = {"batch": batch, "median_ms": round(statistics.median(ms), 2), "best_ms": round(min(ms), 2),
                         "all_ms": [round(x, 2) for x in ms], "target_ms": target}
            log(f"bench_scale: first batch, {name}: median {out[name]['median_ms']} ms, best {out[name]['best_ms']} ms")
    finally:
        d.stop()
    return out


def render(out):
    lines = [f"# loaderd at scale ({out['date']})", "", B.machine_line(out["machine"]), "",
             "| dataset | samples | open (s) | scan (entries/s) | open, CPU s | scan (entries per CPU-second) | "
             "index (B/sample) | first batch (ms) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in out["points"]:
        lines.append(f"| {r['point']} ({r['kind']}) | {r['samples']:,} | {r['open_s']:.2f} | {r['scan_per_s']:,} | "
                     f"{r['open_cpu_s']:.2f} | {r['scan_per_cpu_s']:,} | {r['index_bytes_per_sample']:.1f} | "
                     f"{r['first_batch_ms']:.2f} |")
    c = out.get("cache")
    if c:
        runs = c.get("seconds_all")
        each = f" (median of {', '.join(f'{r:.3f}' for r in runs)} s)" if runs else ""
        lines += ["", f"Cache build from a warm page cache (into /dev/shm): {c['bytes'] >> 20} MiB ({c['files']:,} "
                  f"files) in {c['seconds']:.3f} s{each}: {c['gb_per_s']:.2f} GB/s (target ≥ {TARGET_CACHE_GBPS} GB/s)."]
    fb = out.get("first_batch")
    if fb:
        lines += ["", "| stream (2 workers) | batch | first batch, median (ms) | best (ms) | target (ms) |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, what in (("images", "JPEG 320–400 px → RandomResizedCrop 224 + flip, uint8"),
                           ("tokens", "token windows, 1,025 × uint16")):
            if name in fb:
                r = fb[name]
                lines.append(f"| {what} | {r['batch']} | {r['median_ms']:.1f} | {r['best_ms']:.1f} | "
                             f"< {r['target_ms']:.0f} |")
    lines += ["", f"Targets: ≤ {TARGET_BYTES_PER_SAMPLE} B of index per sample, scan ≥ {TARGET_SCAN_RATE:,} "
              "entries/s. Open is the daemon's start to its socket answering, less a one-file daemon's "
              "(wall time, and the daemon's CPU time: on a shared machine the CPU figure is the steadier); "
              "index is its resident memory less the one-file daemon's, per sample; first batch is "
              "`loaderctl read`'s open → first batch (batch 64, shuffled), median of "
              f"{out['runs']}.", ""]
    return "\n".join(lines)


def main(argv):
    args = parse_args(argv)
    bd = os.path.join(REPO, args.build_dir, "bin")
    bins = {n: os.path.join(bd, f) for n, f in (("loaderd", "loaderd"), ("loaderctl", "loaderctl"),
                                                ("gendata", "ld-gendata"), ("genimages", "ld-genimages"))}
    for pth in bins.values():
        if not os.access(pth, os.X_OK):
            log(f"bench_scale: {pth} is missing: run make first")
            return 1
    os.makedirs(args.results_dir, exist_ok=True)
    os.makedirs(args.data_dir, exist_ok=True)
    trees = {"files-100k"} | ({"files-1m"} if any(POINTS[p][1] >= 1_000_000 for p in args.points) else set())
    for t in sorted(trees):
        make_tree(os.path.join(args.data_dir, t), POINTS[t][1])
    for p in args.points:
        if POINTS[p][0] == "manifest":
            path = os.path.join(args.data_dir, f"{p}.csv")
            if not manifest_ready(path, POINTS[p][1], 1_000_000):
                make_manifest(path, POINTS[p][1], 1_000_000)
    one = os.path.join(args.data_dir, "one")
    if not os.path.exists(os.path.join(one, "a.bin")):
        os.makedirs(one, exist_ok=True)
        with open(os.path.join(one, "a.bin"), "wb") as f:
            f.write(b"x" * NONEMPTY_BYTES)

    tmp = tempfile.mkdtemp(prefix="ld-bench-scale-")
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "machine": B.machine_info(), "runs": args.runs, "points": []}
    rc = 0
    try:
        # The baseline: the same daemon with a one-file dataset (best of 3 starts).
        bases = []
        for _ in range(3):
            b = Daemon(bins, tmp, "one", "files", one).start()
            b.stop()
            bases.append(b)
        base = min(bases, key=lambda x: x.up_s)
        base.rss_kib = min(x.rss_kib for x in bases)
        base.cpu_s = min(x.cpu_s for x in bases)
        out["baseline"] = {"up_s": round(base.up_s, 4), "rss_kib": base.rss_kib}
        for p in args.points:
            out["points"].append(measure_point(args, bins, tmp, p, base))
        out["cache"] = measure_cache(args, bins, tmp)
        out["first_batch"] = measure_first_batch(args, bins, tmp)
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, ValueError) as e:
        log(f"bench_scale: {e}")
        out["error"] = str(e)
        rc = 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    md = render(out)
    with open(os.path.join(args.results_dir, "scale.json"), "w") as f:
        json.dump(out, f, indent=2)
    with open(os.path.join(args.results_dir, "scale.md"), "w") as f:
        f.write(md)
    print(md)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
