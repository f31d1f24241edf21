#!/usr/bin/python3
"""bench_fair — one daemon, two jobs: does a light job keep its speed while a heavy one
saturates the workers? (issue 13's fairness benchmark)

1. Generates (once; deterministic) a light dataset, 20,000 files of 3,072 bytes (`files`:
   a read and a copy per sample), and a heavy one, 300 JPEGs of 320–400 px decoded, cropped
   and resized to 224 (`image_folder`); reads every file once so that both come from the
   page cache.
2. Starts loaderd with `server.workers: 2` and both datasets.
3. The heavy job: `loaderctl read heavy` (batch 32, prefetch 8, unbounded) in the
   background, its samples/s alone over a few seconds (`loaderctl streams --json`).
4. Two light jobs, each alone and then next to the heavy job, in the same run:
   - greedy: `loaderctl read light --json` of --epochs epochs, reading as fast as it
     can. Alone it keeps both workers busy; next to the heavy job the fair share gives
     it half of the workers' time, so it keeps about its share of the CPU time it used
     alone. Its samples/s, first batch, and its share of the workers' CPU time (the
     workers' threads' run time, /proc schedstat, less the heavy stream's worker_cpu_s).
   - paced: a trainer (the Python client, batch 256) whose step takes --light-step-ms
     per batch (sleeping, as a trainer whose step runs on a GPU does; by default 4 times
     the greedy reader's time per batch alone, measured just before, so that on any
     machine it asks for about a quarter of what the daemon gives it alone: half its
     fair share). It should keep nearly all of its speed. Its samples/s, first batch
     (open to first batch), and the fraction of its time spent waiting inside next.
   Each light run is repeated --runs times and the median taken; alone and together
   alternate, so that a change in the machine's load hits both.

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


log = measure.log


def parse_args(argv):
    env = shlex.split(os.environ.get("BENCH_FAIR_ARGS", ""))
    quick_env = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer epochs and runs")
    p.add_argument("--runs", type=int, default=None, help="light reads per scenario (default 5; quick 3)")
    p.add_argument("--epochs", type=int, default=None, help="light epochs per read (default 10; quick 3)")
    p.add_argument("--heavy-window", type=float, default=3.0, help="seconds the heavy job alone is measured")
    p.add_argument("--light-step-ms", type=float, default=None,
                   help="the paced trainer's step per batch of 256 (default: 4x the greedy reader's time per "
                        "batch alone)")
    p.add_argument("--light-batches", type=int, default=None,
                   help="batches the paced trainer reads per run (default 300; quick 150)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    a = p.parse_args(env + argv)
    a.quick = a.quick or quick_env
    a.runs = a.runs or (3 if a.quick else 5)
    a.epochs = a.epochs or (3 if a.quick else 10)
    a.light_batches = a.light_batches or (150 if a.quick else 300)
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


# ---- the paced trainer ------------------------------------------------------------------

def child(spec):
    """The paced light trainer (a process of its own): opens the light dataset, reads
    `batches` batches, sleeping `step_s` after each (its training step), and prints JSON:
    samples/s after the first batch, the first batch's latency from the open, the
    fraction of the time after the first batch spent waiting inside next, and its
    stream's worker CPU seconds."""
    s = json.loads(spec)
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import loaderclient
    c = loaderclient.Client(s["socket"], name="paced")
    t_open = time.perf_counter()
    stream = c.open("light", LIGHT_BATCH, epochs=0)
    b = stream.next()
    t0 = time.perf_counter()
    first_ms = 1000 * (t0 - t_open)
    samples, waited = 0, 0.0
    time.sleep(s["step_s"])
    for _ in range(s["batches"] - 1):
        w = time.perf_counter()
        b = stream.next()
        waited += time.perf_counter() - w
        samples += b.rows
        time.sleep(s["step_s"])
    t1 = time.perf_counter()
    st = next(x for x in c.streams() if x["id"] == stream.id)
    stream.close()
    c.close()
    print(json.dumps({"samples_per_s": samples / (t1 - t0), "first_batch_ms": first_ms,
                      "wait_fraction": waited / (t1 - t0), "worker_cpu_s": st["worker_cpu_s"],
                      "seconds": t1 - t0}), flush=True)


def paced_read(args, sock):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                        json.dumps({"socket": sock, "step_s": args.light_step_ms / 1000,
                                    "batches": args.light_batches})],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"the paced trainer exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def greedy_read(args, bins, sock):
    r = measure.loaderctl_json(bins["loaderctl"], sock, "read", "light", "--epochs", str(args.epochs),
                               "--batch-size", str(LIGHT_BATCH), "--json", timeout=600)
    return {"samples_per_s": r["samples_per_s"], "first_batch_ms": r["first_batch_ms"], "seconds": r["seconds"]}


# ---- the heavy job, paused and resumed -----------------------------------------------------

class Heavy:
    """`loaderctl read heavy` without end. pause() stops the reader (SIGSTOP): once its
    prefetch is full the workers have nothing of it to do, and a light run is "alone";
    resume() lets it read on, and the next light run is "together"."""

    def __init__(self, bins, sock):
        self.bins, self.sock = bins, sock
        self.proc = subprocess.Popen([bins["loaderctl"], "--socket", sock, "read", "heavy", "--epochs", "1000000",
                                      "--batch-size", str(HEAVY_BATCH), "--prefetch", str(HEAVY_PREFETCH)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stats(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"the heavy reader exited {self.proc.returncode}")
        h = stream_of(self.bins, self.sock, "heavy")
        if not h:
            raise RuntimeError("the heavy stream is not open")
        return h

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        # Waits on state: the stream's worker CPU stops growing once its ring is full.
        last = self.stats()["worker_cpu_s"]
        for _ in range(100):
            time.sleep(0.1)
            now = self.stats()["worker_cpu_s"]
            if now == last:
                return
            last = now
        raise RuntimeError("the heavy stream kept the workers busy with its reader stopped")

    def resume(self):
        served = self.stats()["samples_served"]
        self.proc.send_signal(signal.SIGCONT)
        # Waits on state: once the batches that were ready are taken, the workers are
        # busy with its next ones.
        for _ in range(200):
            if self.stats()["samples_served"] >= served + HEAVY_PREFETCH * HEAVY_BATCH:
                return
            time.sleep(0.02)
        raise RuntimeError("the heavy reader did not read on")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def worker_cpu_s(pid):
    """Run time of loaderd's worker threads (ld-worker-N), seconds."""
    return measure.thread_cpu_seconds(pid, "ld-worker-")


def light_runs(args, heavy, daemon_pid, read):
    """--runs pairs of light runs, alone (the heavy reader paused) then together. Each
    run also records the workers' CPU time it saw and, together, the heavy stream's part
    of it: the light job's share of the workers' time."""
    alone, together = [], []
    for _ in range(args.runs):
        for rows, paused in ((alone, True), (together, False)):
            heavy.pause() if paused else heavy.resume()
            h0, w0, t0 = heavy.stats()["worker_cpu_s"], worker_cpu_s(daemon_pid), time.perf_counter()
            r = read()
            h1, w1, t1 = heavy.stats()["worker_cpu_s"], worker_cpu_s(daemon_pid), time.perf_counter()
            if w0 is not None and w1 is not None:
                light_cpu = max(0.0, (w1 - w0) - (h1 - h0))
                r["light_worker_cpu_s"] = light_cpu
                r["light_cpu_share"] = light_cpu / (w1 - w0) if w1 > w0 else None
                r["light_workers_busy"] = light_cpu / (t1 - t0)  # in workers
            rows.append(r)
    return alone, together


def summary(rows):
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]
           if all(isinstance(r.get(k), (int, float)) for r in rows)}
    out["first_batch_ms_max"] = max(r["first_batch_ms"] for r in rows)
    return out


def scenario(alone, together):
    a, t = summary(alone), summary(together)
    return {"alone": a, "together": t, "runs_alone": alone, "runs_together": together,
            "kept": measure.ratio(t["samples_per_s"], a["samples_per_s"])}


def render(out, args):
    md = ["## Fairness: a light job next to a heavy one (bench/bench_fair.py)", ""]
    s = out.get("summary")
    if not s:
        return md + [f"No result: {out.get('error')}"]
    p, g = out["paced"], out["greedy"]
    md += [f"loaderd with {WORKERS} workers. Light: {out['light']['dataset']}, batch {LIGHT_BATCH}. Heavy: "
           f"{out['heavy']['dataset']}, batch {HEAVY_BATCH}, prefetch {HEAVY_PREFETCH}, read without pause: "
           f"{s['heavy_alone_samples_per_s']:,.0f} samples/s alone. Medians of {args.runs} runs; alone (the heavy "
           "reader paused) and together alternate.", "",
           "| light job | | samples/s | first batch | waiting in next | light's share of worker CPU |",
           "|---|---|---:|---:|---:|---:|"]
    for name, sc, what in (("greedy", g, f"`loaderctl read`, {args.epochs} epochs"),
                           ("paced", p, f"trainer, {args.light_step_ms:g} ms step, {args.light_batches} batches")):
        for label, row in (("alone", sc["alone"]), ("together", sc["together"])):
            kept = f" ({100 * sc['kept']:.0f}% of alone)" if label == "together" and sc["kept"] else ""
            wait = f"{100 * row['wait_fraction']:.1f}%" if "wait_fraction" in row else "—"
            share = (f"{100 * row['light_cpu_share']:.0f}% ({row['light_workers_busy']:.2f} workers)"
                     if "light_cpu_share" in row else "—")
            md.append(f"| {name}: {what} | {label} | {row['samples_per_s']:,.0f}{kept} | "
                      f"{row['first_batch_ms']:.1f} ms (max {row['first_batch_ms_max']:.1f}) | {wait} | {share} |")
    md += ["", "Targets (issue 13): the light job keeps at least 80% of its throughput alone and a first batch "
           "under 10 ms while the heavy job saturates the workers. The paced trainer needs less than its fair "
           "share and should keep nearly all of it; the greedy one keeps about its share of the workers' time "
           "(half of 2 workers) against what it used alone."]
    return md


def main(argv):
    args = parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    bd = os.path.join(REPO, args.build_dir, "bin")
    bins = {n: os.path.join(bd, f) for n, f in (("loaderd", "loaderd"), ("loaderctl", "loaderctl"),
                                                ("gendata", "ld-gendata"), ("genimages", "ld-genimages"))}
    for n, pth in bins.items():
        if not os.access(pth, os.X_OK):
            log(f"bench_fair: {pth} is missing: run make first")
            return 1
    os.environ.setdefault("LOADERCLIENT_LIB", os.path.join(REPO, args.build_dir, "lib", "libloaderclient.so"))
    os.makedirs(args.results_dir, exist_ok=True)
    log("bench_fair: generating the datasets (once)")
    try:
        light, heavy_dir = generate(args, bins)
    except (subprocess.CalledProcessError, OSError) as e:
        log(f"bench_fair: cannot generate the datasets: {e}")
        return 1
    tmp = tempfile.mkdtemp(prefix="ld-bench-fair-")
    sock = os.path.join(tmp, "loaderd.sock")
    cfg = os.path.join(tmp, "fair.yaml")
    write_config(cfg, sock, light, heavy_dir)
    daemon_log = os.path.join(args.results_dir, "fair-loaderd.log")
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "workers": WORKERS, "light": {"dataset": f"files, {LIGHT_FILES} x {LIGHT_SIZE} B",
                                        "batch": LIGHT_BATCH, "epochs": args.epochs,
                                        "paced_batches": args.light_batches},
           "heavy": {"dataset": f"image_folder, {HEAVY_IMAGES} JPEGs {HEAVY_MIN}-{HEAVY_MAX} px -> 224",
                     "batch": HEAVY_BATCH, "prefetch": HEAVY_PREFETCH}, "runs": args.runs}
    daemon = heavy = None
    rc = 0
    try:
        daemon = start_daemon(bins["loaderd"], cfg, sock, daemon_log)
        log("bench_fair: heavy alone")
        heavy = Heavy(bins, sock)
        time.sleep(2.0)  # warm: pipeline costs measured, prefetch full
        h0, t0 = heavy.stats(), time.perf_counter()
        time.sleep(args.heavy_window)
        h1, t1 = heavy.stats(), time.perf_counter()
        heavy_alone = (h1["samples_served"] - h0["samples_served"]) / (t1 - t0)

        log("bench_fair: greedy light reader, alone and together")
        out["greedy"] = scenario(*light_runs(args, heavy, daemon.pid, lambda: greedy_read(args, bins, sock)))
        if args.light_step_ms is None:
            args.light_step_ms = round(4 * 1000 * LIGHT_BATCH / out["greedy"]["alone"]["samples_per_s"], 2)
        out["light"]["step_ms"] = args.light_step_ms
        log(f"bench_fair: paced light trainer ({args.light_step_ms:g} ms step), alone and together")
        out["paced"] = scenario(*light_runs(args, heavy, daemon.pid, lambda: paced_read(args, sock)))
        st = measure.loaderctl_json(bins["loaderctl"], sock, "--json", "status")
        out["status"] = {k: st.get(k) for k in ("worker_busy_s", "samples_served", "uptime_s")}
        p, g = out["paced"], out["greedy"]
        out["summary"] = {
            "heavy_alone_samples_per_s": heavy_alone,
            "paced_kept": p["kept"], "paced_together_first_batch_ms": p["together"]["first_batch_ms"],
            "paced_wait_alone": p["alone"]["wait_fraction"], "paced_wait_together": p["together"]["wait_fraction"],
            "light_alone_samples_per_s": g["alone"]["samples_per_s"],
            "light_together_samples_per_s": g["together"]["samples_per_s"], "light_kept": g["kept"],
            "light_alone_first_batch_ms": g["alone"]["first_batch_ms"],
            "light_together_first_batch_ms": g["together"]["first_batch_ms"],
            "light_together_first_batch_ms_max": g["together"]["first_batch_ms_max"],
            "greedy_cpu_share_together": g["together"].get("light_cpu_share"),
        }
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError, KeyError, StopIteration) as e:
        log(f"bench_fair: {e}" + measure.log_tail(daemon_log))
        out["error"] = str(e)
        rc = 1
    finally:
        if heavy:
            heavy.stop()
        stop_daemon(daemon, tmp)
    measure.write_report(args.results_dir, "fair", out, render(out, args))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
