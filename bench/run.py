#!/usr/bin/python3
"""run — `make bench`: every benchmark in one run, and one result file that the figures
of README.md and bench/README.md are quoted from.

Runs, in this order, each as its own process with Debian's /usr/bin/python3:
bench/bench.py (loaderd vs DataLoader), bench/bench_cache.py (the single-file cache),
bench/bench_images.py (the image pipeline and its floor), bench/bench_python.py --spawn
(the Python client in a training loop), bench/bench_fair.py (a light job next to a heavy
one on the same workers), bench/bench_sql.py (the sql kind on PostgreSQL against Datasets
that query it), bench/bench_cold.py (small files from an empty page cache, against
DataLoader and fio), bench/bench_device.py (the device stage against
DataLoader(pin_memory=True); it says so and skips without a GPU), bench/bench_tar.py (tar
shards vs webdataset + DataLoader), bench/bench_share.py (four trainers on one shared
stream, four streams and four DataLoaders; a jittery trainer under fixed and adaptive
prefetch), bench/bench_scale.py (open time, index memory and first batch from 100,000 to
5 M samples; first batches of an image and a token stream), and the GPU section
(gpu_section: "no GPU: skipped" where there is none). Each writes its own files under
bench/results/ (latest.*, cache.*, images.*, python.*, fair.*, sql.*, cold.*, device.*,
tar.*, share.*, scale.*, raw outputs; none of them committed). Then this
script gathers them into

    bench/results/<date>-<host>.json   machine (CPU model, cores, RAM, kernel, versions of
                                       Python, torch, numpy, torchvision, Pillow,
                                       libjpeg-turbo, the loaderd commit), every command
                                       with its exit code and time, and every result
                                       (every run of every configuration)
    bench/results/<date>-<host>.md     the summary: the same machine line and each
                                       benchmark's tables

where <date> is the UTC date and <host> a neutral label of the machine's size (usable
CPUs and RAM, e.g. 2c-24g), never its hostname. These two files are small and are the
ones committed with a README update: the README's table names the file it comes from.

Options for the benchmarks come from the environment as before (BENCH_ARGS,
BENCH_CACHE_ARGS, BENCH_IMAGES_ARGS, BENCH_PYTHON_ARGS, BENCH_FAIR_ARGS, BENCH_SQL_ARGS,
BENCH_COLD_ARGS, BENCH_DEVICE_ARGS, BENCH_TAR_ARGS, BENCH_SHARE_ARGS, BENCH_SCALE_ARGS); `--quick`
in BENCH_ARGS makes all eleven small. Exits non-zero when any benchmark failed (the result files are written
anyway, with the failures in them).
"""
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import measure  # noqa: E402  (bench/measure.py: process accounting, reporting helpers)

PY = measure.SYSTEM_PYTHON if os.path.exists(measure.SYSTEM_PYTHON) else sys.executable


def steps():
    """(name, argv, extra-args variable, its result files) of each benchmark."""
    quick = "--quick" in shlex.split(os.environ.get("BENCH_ARGS", ""))
    py_args = shlex.split(os.environ.get("BENCH_PYTHON_ARGS", "")) + (["--quick"] if quick else [])
    return [
        ("bench", ["bench/bench.py"], "BENCH_ARGS", ("latest.json", "latest.md")),
        ("cache", ["bench/bench_cache.py"], "BENCH_CACHE_ARGS", ("cache.json", "cache.md")),
        ("images", ["bench/bench_images.py"], "BENCH_IMAGES_ARGS", ("images.json", "images.md")),
        ("python", ["bench/bench_python.py", "--spawn", *py_args], "BENCH_PYTHON_ARGS",
         ("python.json", "python.md")),
        ("fair", ["bench/bench_fair.py"], "BENCH_FAIR_ARGS", ("fair.json", "fair.md")),
        ("sql", ["bench/bench_sql.py", *(["--quick"] if quick else [])], "BENCH_SQL_ARGS", ("sql.json", "sql.md")),
        ("cold", ["bench/bench_cold.py"], "BENCH_COLD_ARGS", ("cold.json", "cold.md")),
        ("device", ["bench/bench_device.py"], "BENCH_DEVICE_ARGS", ("device.json", "device.md")),
        ("tar", ["bench/bench_tar.py"], "BENCH_TAR_ARGS", ("tar.json", "tar.md")),
        ("share", ["bench/bench_share.py"], "BENCH_SHARE_ARGS", ("share.json", "share.md")),
        ("scale", ["bench/bench_scale.py"], "BENCH_SCALE_ARGS", ("scale.json", "scale.md")),
    ]


def load(path, since, parse):
    """The file's contents when it was written by this run, else None."""
    try:
        if os.path.getmtime(path) < since:
            return None
        with open(path) as f:
            return parse(f)
    except (OSError, ValueError):
        return None


def gpu_section(build=os.path.join(REPO, "build")):
    """The GPU benchmark: ({results}, markdown). Where there is no GPU (or no CUDA build)
    it says so and skips. Where there is one, scripts/gpu-check.sh measures the stage's
    H2D GB/s against the pinned peak and the synthetic trainer's wait fraction, and its
    summary is quoted; the comparison with PyTorch's DataLoader(pin_memory=True) + .to()
    on the same pipeline is bench_device.py's (a step of its own)."""
    probe = os.path.join(build, "bin", "ld-gpu-check")
    if not os.path.exists(probe):
        why = "no ld-gpu-check in the build (built without CUDA)"
    else:
        r = subprocess.run([probe, "probe"], capture_output=True, text=True, timeout=60)
        why = r.stdout.strip().replace("no GPU present: ", "") if r.returncode == 2 else None
        if r.returncode not in (0, 2):
            why = "the probe failed: " + (r.stdout + r.stderr).strip()[-200:]
    if why is not None:
        return {"skipped": "no GPU: " + why}, "## GPU\n\nno GPU: skipped (%s)." % why
    env = dict(os.environ, GPU_CHECK_BUILD=build)
    r = subprocess.run([os.path.join(REPO, "scripts", "gpu-check.sh")], capture_output=True, text=True,
                       timeout=900, cwd=REPO, env=env)
    lines = r.stdout.strip().splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("loaderd GPU check")), default=0)
    summary = lines[start:]
    md = "## GPU\n\n```\n" + "\n".join(summary) + "\n```\n\nAgainst PyTorch's DataLoader(pin_memory=True) + " \
         ".to(device, non_blocking=True) on the image pipeline: the device section (bench_device.py)."
    return {"exit_code": r.returncode, "summary": summary}, md


def main():
    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    machine = measure.machine_info()
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    out = {"machine": machine, "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"), "steps": []}
    md_parts = []
    failed = []
    for name, argv, env_var, (json_name, md_name) in steps():
        env_prefix = [f"{v}={shlex.quote(os.environ[v])}" for v in ("BENCH_ARGS", env_var)
                      if os.environ.get(v)]
        cmd = [PY, *argv]
        shown = " ".join(dict.fromkeys(env_prefix)) + (" " if env_prefix else "") + " ".join(
            ["/usr/bin/python3"] + [shlex.quote(a) for a in argv])
        print(f"== {name}: {shown}", flush=True)
        since = time.time()
        t1 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=REPO)
        secs = time.perf_counter() - t1
        res = load(os.path.join(results_dir, json_name), since, json.load)
        md = load(os.path.join(results_dir, md_name), since, lambda f: f.read())
        out["steps"].append({"name": name, "command": shown, "exit_code": rc, "seconds": round(secs, 1),
                             "results": res})
        if rc != 0:
            failed.append(f"{name} (exit {rc})")
        if md:
            # each benchmark's own title becomes a section of the summary
            md_parts.append("\n".join(("#" + line) if line.startswith("#") else line
                                      for line in md.strip().splitlines()))
        else:
            md_parts.append(f"## {name}\n\nNo results (exit {rc}).")
    print("== gpu", flush=True)
    gpu, gpu_md = gpu_section()
    print(gpu_md, flush=True)
    out["gpu"] = gpu
    md_parts.append(gpu_md)
    if gpu.get("exit_code"):
        failed.append(f"gpu (exit {gpu['exit_code']})")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["failures"] = failed

    subs = measure.path_subs()
    out = measure.scrub(out, subs)
    md_parts = [measure.scrub(m, subs) for m in md_parts]
    stem = f"{started.strftime('%Y-%m-%d')}-{machine['host']}"
    json_path = os.path.join(results_dir, stem + ".json")
    md_path = os.path.join(results_dir, stem + ".md")
    with open(json_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    head = [f"# `make bench` — {out['started']}", "", measure.machine_line(machine), "",
            f"Everything measured is in `bench/results/{stem}.json` (every run, every command). "
            f"Total {out['seconds'] / 60:.1f} min.", "",
            "| benchmark | command | exit | seconds |", "|---|---|---:|---:|"]
    head += [f"| {s['name']} | `{s['command']}` | {s['exit_code']} | {s['seconds']:.0f} |" for s in out["steps"]]
    if failed:
        head += ["", "**FAILED: " + ", ".join(failed) + "**"]
    with open(md_path, "w") as f:
        f.write("\n".join(head) + "\n\n" + "\n\n".join(md_parts) + "\n")
    print(f"\nmake bench: {out['seconds'] / 60:.1f} min; results: bench/results/{stem}.md and .json"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
