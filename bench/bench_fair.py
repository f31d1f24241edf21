#!/usr/bin/python3
"""bench_fair — one daemon, two jobs: does a light job keep its speed while a heavy one
saturates the workers? (issue 13's fairness benchmark)

1. Generates (once; deterministic) a light dataset, 20,000 files of 3,072 bytes (`files`:
   a read and a copy per sample), and a heavy one, 300 JPEGs of 320–400 px decoded, cropped
   and resized to 224 (`image_folder`); reads every file once so that both come from the
   page cache.
2. Starts loaderd with `server.workers: 2` and both datasets.
3. Light alone: `loaderctl read light --epochs E --batch-size 256 --json`, --runs times:
   samples/s and the first batch's latency (open to first batch, as the trainer sees it).
4. Heavy alone: `loaderctl read heavy` (batch 32, prefetch 8, unbounded) in the
   background: its samples/s over a few seconds, from `loaderctl streams --json`.
5. Together: the same light reads while the heavy job runs: the light job's samples/s and
   first batch, the heavy job's samples/s meanwhile, and how the workers' CPU time was
   shared (`worker_cpu_s` of each stream).

Targets (issue 13): the light job keeps at least 80% of its solo throughput and a first
batch under 10 ms while the heavy job saturates the workers. Prints a table and writes
bench/results/fair.md and fair.json. Run with Debian's /usr/bin/python3; `make bench`
runs it after the others. Options may also come from BENCH_FAIR_ARGS; `--quick` in
BENCH_ARGS is honoured too.
"""

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import measure  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)

LIGHT_FILES, LIGHT_SIZE = 20_000, 3072
HEAVY_IMAGES, HEAVY_MIN, HEAVY_MAX = 300, 320, 400
LIGHT_BATCH, HEAVY_BATCH, HEAVY_PREFETCH = 256, 32, 8
WORKERS = 2


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_FAIR_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer epochs and runs")
    p.add_argument("--runs", type=int, default=None, help="light reads per scenario (default 5; quick 3)")
    p.add_argument("--epochs", type=int, default=None, help="light epochs per read (default 10; quick 3)")
    p.add_argument("--heavy-window", type=float, default=3.0, help="seconds the heavy job alone is measured")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.runs = a.runs or (3 if a.quick else 5)
    a.epochs = a.epochs or (3 if a.quick else 10)
    return a


def heavy_images(args, bins):
    """The heavy dataset's folder (bench_share.py reads it too), generated once."""
    heavy = os.path.join(args.data_dir, "fair-heavy")
    os.makedirs(args.data_dir, exist_ok=True)
    if not os.path.isdir(heavy) or sum(len(f) for _, _, f in os.walk(heavy)) < HEAVY_IMAGES:
        subprocess.run([bins["genimages"], heavy, "--count", str(HEAVY_IMAGES), "--classes", "10",
                        "--min", str(HEAVY_MIN), "--max", str(HEAVY_MAX)], check=True, stdout=subprocess.DEVNULL)
    return heavy


def warm(*roots):
    """Reads every file under roots once, so that the benchmark reads the page cache."""
    for root in roots:
        for d, _, files in os.walk(root):
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    fh.read()


def generate(args, bins):
    light = os.path.join(args.data_dir, "fair-light")
    os.makedirs(args.data_dir, exist_ok=True)
    subprocess.run([bins["gendata"], "files", light, "--count", str(LIGHT_FILES), "--size", str(LIGHT_SIZE),
                    "--classes", "10"], check=True, stdout=subprocess.DEVNULL)
    heavy = heavy_images(args, bins)
    warm(light, heavy)
    return light, heavy


def start_daemon(loaderd, cfg, sock, log_path):
    """loaderd on cfg, once its socket answers (RuntimeError when it does not start)."""
    with open(log_path, "wb") as lf:
        daemon = subprocess.Popen([loaderd, "--config", cfg], stdout=lf, stderr=lf,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    t0 = time.perf_counter()
    while not (os.path.exists(sock) and measure.socket_accepts(sock)):
        if daemon.poll() is not None or time.perf_counter() - t0 > 30:
            raise RuntimeError("loaderd did not start" + measure.log_tail(log_path))
        time.sleep(0.02)
    return daemon


def stop_daemon(daemon, tmp):
    """SIGTERM to loaderd (if it runs), and the temporary directory removed."""
    if daemon and daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
    try:
        for n in os.listdir(tmp):
            os.unlink(os.path.join(tmp, n))
        os.rmdir(tmp)
    except OSError:
        pass


def write_config(path, sock, light, heavy):
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    with open(path, "w") as f:
        f.write(f"""# Written by bench/bench_fair.py; regenerated on every run.
server:
  socket: {q(sock)}
  workers: {WORKERS}
  memory_budget: 1GiB
  log_level: warn
datasets:
  light:
    kind: files
    path: {q(light)}
  heavy:
    kind: image_folder
    path: {q(heavy)}
    transforms:
      - random_resized_crop: {{size: 224}}
      - random_flip: {{p: 0.5}}
      - to_dtype: {{dtype: uint8, layout: CHW}}
""")


def streams(bins, sock):
    return measure.loaderctl_json(bins["loaderctl"], sock, "--json", "streams")["streams"]


def stream_of(bins, sock, dataset):
    return next((s for s in streams(bins, sock) if s["dataset"] == dataset), None)


def light_reads(args, bins, sock):
    rows = []
    for _ in range(args.runs):
        r = measure.loaderctl_json(bins["loaderctl"], sock, "read", "light", "--epochs", str(args.epochs),
                             "--batch-size", str(LIGHT_BATCH), "--json", timeout=600)
        rows.append({"samples_per_s": r["samples_per_s"], "first_batch_ms": r["first_batch_ms"],
                     "seconds": r["seconds"]})
    return rows


def summary(rows):
    return {"samples_per_s": statistics.median(r["samples_per_s"] for r in rows),
            "first_batch_ms": statistics.median(r["first_batch_ms"] for r in rows),
            "first_batch_ms_max": max(r["first_batch_ms"] for r in rows)}


def main(argv):
    args = parse_args(argv)
    bd = os.path.join(REPO, args.build_dir, "bin")
    bins = {n: os.path.join(bd, f) for n, f in (("loaderd", "loaderd"), ("loaderctl", "loaderctl"),
                                                ("gendata", "ld-gendata"), ("genimages", "ld-genimages"))}
    for n, pth in bins.items():
        if not os.access(pth, os.X_OK):
            log(f"bench_fair: {pth} is missing: run make first")
            return 1
    os.makedirs(args.results_dir, exist_ok=True)
    log("bench_fair: generating the datasets (once)")
    try:
        light, heavy = generate(args, bins)
    except (subprocess.CalledProcessError, OSError) as e:
        log(f"bench_fair: cannot generate the datasets: {e}")
        return 1
    tmp = tempfile.mkdtemp(prefix="ld-bench-fair-")
    sock = os.path.join(tmp, "loaderd.sock")
    cfg = os.path.join(tmp, "fair.yaml")
    write_config(cfg, sock, light, heavy)
    daemon_log = os.path.join(args.results_dir, "fair-loaderd.log")
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "workers": WORKERS, "light": {"dataset": f"files, {LIGHT_FILES} x {LIGHT_SIZE} B",
                                        "batch": LIGHT_BATCH, "epochs": args.epochs},
           "heavy": {"dataset": f"image_folder, {HEAVY_IMAGES} JPEGs {HEAVY_MIN}-{HEAVY_MAX} px -> 224",
                     "batch": HEAVY_BATCH, "prefetch": HEAVY_PREFETCH}, "runs": args.runs}
    daemon = heavy_proc = None
    rc = 0
    try:
        daemon = start_daemon(bins["loaderd"], cfg, sock, daemon_log)

        log("bench_fair: light alone")
        alone = light_reads(args, bins, sock)

        log("bench_fair: heavy alone")
        heavy_proc = subprocess.Popen([bins["loaderctl"], "--socket", sock, "read", "heavy", "--epochs", "1000000",
                                       "--batch-size", str(HEAVY_BATCH), "--prefetch", str(HEAVY_PREFETCH)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)  # warm: pipeline costs measured, prefetch full
        h0, t_h0 = stream_of(bins, sock, "heavy"), time.perf_counter()
        time.sleep(args.heavy_window)
        h1, t_h1 = stream_of(bins, sock, "heavy"), time.perf_counter()
        if not h0 or not h1:
            raise RuntimeError("the heavy stream is not open" + measure.log_tail(daemon_log))
        heavy_alone = (h1["samples_served"] - h0["samples_served"]) / (t_h1 - t_h0)

        log("bench_fair: light and heavy together")
        t_t0 = time.perf_counter()
        h0 = stream_of(bins, sock, "heavy")
        together = light_reads(args, bins, sock)
        h1, t_t1 = stream_of(bins, sock, "heavy"), time.perf_counter()
        heavy_together = (h1["samples_served"] - h0["samples_served"]) / (t_t1 - t_t0)
        heavy_cpu = h1["worker_cpu_s"] - h0["worker_cpu_s"]
        if heavy_proc.poll() is not None:
            raise RuntimeError(f"the heavy reader exited {heavy_proc.returncode}")
        # The light streams are closed by now; their CPU time is in loaderd's total:
        # workers' busy time against the heavy stream's share of it.
        st = measure.loaderctl_json(bins["loaderctl"], sock, "--json", "status")
        out["status"] = {k: st.get(k) for k in ("worker_busy_s", "samples_served", "uptime_s")}

        a, t = summary(alone), summary(together)
        out["light_alone"], out["light_together"] = alone, together
        out["summary"] = {
            "light_alone_samples_per_s": a["samples_per_s"], "light_together_samples_per_s": t["samples_per_s"],
            "light_kept": t["samples_per_s"] / a["samples_per_s"] if a["samples_per_s"] else None,
            "light_alone_first_batch_ms": a["first_batch_ms"], "light_together_first_batch_ms": t["first_batch_ms"],
            "light_together_first_batch_ms_max": t["first_batch_ms_max"],
            "heavy_alone_samples_per_s": heavy_alone, "heavy_together_samples_per_s": heavy_together,
            "heavy_worker_cpu_s_during_light": heavy_cpu, "together_seconds": t_t1 - t_t0,
        }
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        log(f"bench_fair: {e}")
        out["error"] = str(e)
        rc = 1
    finally:
        if heavy_proc and heavy_proc.poll() is None:
            heavy_proc.send_signal(signal.SIGINT)
            try:
                heavy_proc.wait(10)
            except subprocess.TimeoutExpired:
                heavy_proc.kill()
        stop_daemon(daemon, tmp)

    s = out.get("summary")
    md = ["## Fairness: a light job next to a heavy one (bench/bench_fair.py)", ""]
    if s:
        md += [f"loaderd with {WORKERS} workers. Light: {out['light']['dataset']}, batch {LIGHT_BATCH}, "
               f"`loaderctl read` of {args.epochs} epochs, median of {args.runs}. Heavy: {out['heavy']['dataset']}, "
               f"batch {HEAVY_BATCH}, prefetch {HEAVY_PREFETCH}, read without pause.", "",
               "| | light samples/s | light first batch | heavy samples/s |", "|---|---:|---:|---:|",
               f"| alone | {s['light_alone_samples_per_s']:,.0f} | {s['light_alone_first_batch_ms']:.1f} ms "
               f"| {s['heavy_alone_samples_per_s']:,.0f} |",
               f"| together | {s['light_together_samples_per_s']:,.0f} ({100 * s['light_kept']:.0f}% of alone) "
               f"| {s['light_together_first_batch_ms']:.1f} ms (max {s['light_together_first_batch_ms_max']:.1f}) "
               f"| {s['heavy_together_samples_per_s']:,.0f} |", "",
               "Targets (issue 13): the light job keeps at least 80% of its throughput alone and a first batch "
               "under 10 ms while the heavy job saturates the workers."]
    else:
        md += [f"No result: {out.get('error')}"]
    with open(os.path.join(args.results_dir, "fair.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.results_dir, "fair.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
