"""Process accounting and reporting helpers shared by the bench scripts.

What every benchmark measures the same way lives here: CPU time of a process tree
(/proc/PID/stat and the threads' schedstat, getrusage for the running process), peak
memory of a tree (summed VmRSS and PSS, polled while a command runs), the machine and
the versions the figures depend on, and the small formatting helpers of the reports.
bench/README.md, "What is measured", says how each figure is read; the scripts import
this module from the directory they sit in.
"""

import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SYSTEM_PYTHON = "/usr/bin/python3"
PROG = os.path.splitext(os.path.basename(sys.argv[0] or "bench"))[0]

POLL_S = 0.05           # memory sampling period (VmRSS)
PSS_EVERY = 4           # PSS every 4th sample only: reading smaps_rollup costs ~1 ms for a
                        # process with torch loaded or the token file mapped, and takes its
                        # mmap lock, which the measured process's page faults also need
MB = 1e6                # MB/s is decimal megabytes, computed the same way for every row
MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fail(msg):
    """Stops the benchmark with an error, named after the script that runs."""
    log(f"{PROG}: error: " + msg)
    sys.exit(1)


def read_proc_kib(pid, field, fname="status"):
    """A `Field:   1234 kB` value of /proc/PID/{status,smaps_rollup} in KiB, or None."""
    try:
        with open(f"/proc/{pid}/{fname}", "rb") as f:
            for line in f:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_status(pid):
    """VmRSS and VmHWM of /proc/PID/status in KiB (0 when gone). VmHWM is the peak of this
    process image: a fresh count after exec, unlike wait4's ru_maxrss, which also holds
    the RSS of the process that spawned it (here, this Python)."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss, hwm


def tree_pids(root):
    """root and all its descendants, found through /proc/PID/task/TID/children."""
    out, i = [root], 0
    while i < len(out):
        pid = out[i]
        i += 1
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split() if int(c) not in out)
            except (OSError, ValueError):
                pass
    return out


class TreeMemory:
    """Peak over time of the summed VmRSS (and PSS) of some process trees.

    Summed VmRSS counts a page shared by several processes (library code, shared memory,
    pages a forked worker still shares with its parent) once per process: it is an upper
    bound, and the measure the task asks for. PSS divides each shared page among its
    sharers, so summed PSS is the tree's actual footprint; both are kept."""

    def __init__(self, roots, pss_every):
        self.roots = list(roots)
        self.pss_every = pss_every
        self.peak_rss_kib = 0
        self.peak_pss_kib = 0
        self.max_procs = 0
        self.samples = 0
        self.hwm_kib = {}           # pid -> largest VmHWM seen

    def sample(self):
        pids = []
        for r in self.roots:
            pids.extend(p for p in tree_pids(r) if p not in pids)
        rss = 0
        for p in pids:
            r, h = read_status(p)
            rss += r
            self.hwm_kib[p] = max(self.hwm_kib.get(p, 0), h)
        self.peak_rss_kib = max(self.peak_rss_kib, rss)
        if self.pss_every and self.samples % self.pss_every == 0:
            pss = sum(read_proc_kib(p, "Pss", "smaps_rollup") or 0 for p in pids)
            self.peak_pss_kib = max(self.peak_pss_kib, pss)
        self.max_procs = max(self.max_procs, len(pids))
        self.samples += 1


def run_monitored(cmd, out_path, err_path, timeout_s, pss_every, extra_roots=(), env=None):
    """Runs cmd in its own session, sampling the memory of its tree (and of extra_roots)
    every POLL_S. Returns (exit code, pid, TreeMemory, wall seconds); the TreeMemory's
    `rusage` is wait4's for the command.
    Past timeout_s the command's process group is killed and the code is -SIGKILL."""
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    mem = TreeMemory([proc.pid, *extra_roots], pss_every)
    status, killed = None, False
    try:
        while True:
            mem.sample()
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.perf_counter() - t0 > timeout_s and not killed:
                log(f"{PROG}: {os.path.basename(cmd[0])} ran past {timeout_s:.0f} s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            time.sleep(POLL_S)
    except BaseException:
        # Interrupted: take the child's process group (its workers) down with us.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
        except OSError:
            pass
        raise
    wall = time.perf_counter() - t0
    mem.rusage = ru                 # the command's own CPU (and its reaped children's)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, proc.pid, mem, wall


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def log_tail(path):
    t = tail(path).rstrip()
    return f"; {path} ends with:\n{t}" if t else ""


def shm_loaderd_objects():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("loaderd.")}
    except OSError:
        return set()


def socket_accepts(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def reset_peak_rss(pid):
    """Resets /proc/PID/status VmHWM to the current RSS (clear_refs, Linux >= 4.0), so
    that each dataset's peak is its own. False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def loaderctl_json(loaderctl, sock, *argv, timeout=30):
    r = subprocess.run([loaderctl, "--socket", sock, *argv], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"loaderctl {' '.join(argv)} exited {r.returncode}: "
                           + r.stderr.decode(errors="replace").strip())
    return json.loads(r.stdout)


STAT_SLACK_S = 0.025    # two clock ticks and a margin: see pid_cpu_delta


def cpu_seconds(pid):
    """CPU time (user + system) a live process has used, all its threads together, those
    that have ended included, in seconds; None when it is gone. /proc/PID/stat's utime +
    stime: the kernel derives them from the threads' exact run times but reports them in
    clock ticks (10 ms)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def sched_seconds(pid):
    """The summed run times of a process's live threads (/proc/PID/task/*/schedstat, in
    ns), or None where the kernel does not keep them. Exact, but blind to threads that
    have ended."""
    return thread_cpu_seconds(pid, None)


def thread_cpu_seconds(pid, prefix):
    """The summed run times (schedstat) of the live threads of pid whose name starts with
    prefix (a daemon's worker threads; None: every thread), in seconds; None when the
    kernel keeps none."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            if prefix is not None:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if not f.read().startswith(prefix):
                        continue
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            continue            # a thread that ended between the listing and the read
        except (OSError, ValueError, IndexError):
            return None
    return total / 1e9


def self_cpu_seconds():
    """This process's CPU time, all threads (ended ones included), to the microsecond."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def tree_cpu(roots):
    """{pid: (stat seconds, schedstat seconds or None)} of every live process in the
    trees under roots; for this process getrusage's figure, twice."""
    out = {}
    me = os.getpid()
    for r in roots:
        for p in tree_pids(r):
            if p in out:
                continue
            if p == me:
                c = self_cpu_seconds()
                out[p] = (c, c)
                continue
            c = cpu_seconds(p)
            if c is not None:
                out[p] = (c, sched_seconds(p))
    return out


def pid_cpu_delta(before, after, pid):
    """CPU seconds process pid used between two tree_cpu() snapshots (all of it when it
    was not in the first). The threads' exact run times, unless threads ended in between
    with more CPU than the clock-tick figure's resolution (the two differ by more than
    STAT_SLACK_S): then the clock-tick figure, which counts them."""
    a = after.get(pid)
    if a is None:
        return 0.0
    b = before.get(pid, (0.0, 0.0))
    ds = a[0] - b[0]
    if a[1] is None or b[1] is None:
        return ds
    dn = a[1] - b[1]
    return ds if abs(ds - dn) > STAT_SLACK_S else dn


def cpu_delta(before, after):
    """CPU seconds all the processes of `after` used since `before`."""
    return sum(pid_cpu_delta(before, after, p) for p in after)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def mem_total_kib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cmd_out(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20, cwd=REPO)
        return r.stdout.decode(errors="replace").strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def host_label():
    """A neutral name for this kind of machine (not its hostname): usable CPUs and RAM,
    e.g. 2c-24g."""
    return f"{len(os.sched_getaffinity(0))}c-{round(mem_total_kib() / 1024 / 1024)}g"


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, or "unknown"."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model


def machine_info(rows=()):
    """CPU, memory, kernel and the versions of everything the figures depend on."""
    model = cpu_model()
    import importlib.metadata as md
    versions = {}
    for pkg in ("numpy", "torch", "torchvision", "Pillow"):
        try:
            versions[pkg.lower()] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg.lower()] = None
    # torch.__version__ as the trainer processes saw it, when they ran
    torch_ver = next((r["child"]["torch"] for r in rows if "child" in r), versions["torch"])
    commit = _cmd_out(["git", "rev-parse", "HEAD"])
    dirty = _cmd_out(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "host": host_label(),
        "nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
        "cpu_model": model, "mem_total_mib": mem_total_kib() // 1024,
        "kernel": platform.release(), "python": platform.python_version(),
        "numpy": versions["numpy"], "torch": torch_ver, "torchvision": versions["torchvision"],
        "pillow": versions["pillow"],
        "libjpeg_turbo": _cmd_out(["pkg-config", "--modversion", "libturbojpeg"]),
        "loaderd_commit": commit, "loaderd_tree_modified": bool(dirty) if commit else None,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def machine_line(m):
    commit = (m.get("loaderd_commit") or "unknown")[:12] + (" (modified)" if m.get("loaderd_tree_modified") else "")
    return (f"Machine `{m['host']}`: {m['nproc']} CPUs usable ({m['cpu_model']}), {m['mem_total_mib']:,} MiB RAM, "
            f"Linux {m['kernel']}; Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, "
            f"libjpeg-turbo {m.get('libjpeg_turbo') or '?'}; loaderd {commit}; {m['date']}.")


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def ensure_system_python(modules=("numpy", "torch"), script=None):
    """Re-runs `script` (default: the running script) under Debian's python3 when the running python
    lacks `modules` (a pyenv python first on PATH may). find_spec, not import: the parent
    stays small (its RSS is no part of any figure, and `import torch` costs ~230 MiB)."""
    import importlib.util
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(script or sys.argv[0]), *sys.argv[1:]])
    fail(f"{' and '.join(modules)} are needed: run with {SYSTEM_PYTHON} "
         f"(apt-get install {' '.join('python3-' + m for m in modules)})")


def ratio(a, b):
    """a ÷ b, or None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def drop_caches():
    """Empties the page cache, dentries and inodes (root only). None when done, else why not.
    Pages that a running process has mapped stay: callers start the daemon first and
    drop afterwards only what it has not mapped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"{e.strerror or e} writing /proc/sys/vm/drop_caches"


def scrub(v, subs):
    """v with this machine's paths made neutral (the repository becomes ".", the temporary
    directory "$TMPDIR"), so that a committed result file names no path of the machine
    it ran on."""
    if isinstance(v, str):
        for old, new in subs:
            v = v.replace(old, new)
        return v
    if isinstance(v, list):
        return [scrub(x, subs) for x in v]
    if isinstance(v, dict):
        return {k: scrub(x, subs) for k, x in v.items()}
    return v


def path_subs():
    import tempfile
    subs = [(REPO + os.sep, ""), (REPO, "."), (tempfile.gettempdir() + os.sep, "$TMPDIR/")]
    home = os.path.expanduser("~")
    if home not in ("/", "~"):
        subs.append((home + os.sep, "~/"))
    return subs


def write_report(results_dir, stem, res, md_lines):
    """A bench step's result: stem.json (res) and stem.md (md_lines, a Markdown table and
    its notes) in results_dir, where bench/run.py gathers them, and the Markdown printed."""
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    text = "\n".join(md_lines) + "\n"
    with open(os.path.join(results_dir, stem + ".md"), "w") as f:
        f.write(text)
    print(text, end="", flush=True)


def write_results(results_dir, stem, res, md):
    """Writes stem.json and stem.md (this run's, not committed) and the same, with this
    machine's paths made neutral, as <date>-<host>-stem.{json,md}: the files a README
    update commits and quotes (.gitignore lets <date>-* files in)."""
    os.makedirs(results_dir, exist_ok=True)
    dated = f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}-{host_label()}-{stem}"
    subs = path_subs()
    for name, r, m in ((stem, res, md), (dated, scrub(res, subs), scrub(md, subs))):
        with open(os.path.join(results_dir, name + ".json"), "w") as f:
            json.dump(r, f, indent=1)
            f.write("\n")
        with open(os.path.join(results_dir, name + ".md"), "w") as f:
            f.write(m)
    return dated
