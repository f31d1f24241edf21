#!/usr/bin/python3
"""bench_python — loaderd's Python client (client/python) in a training loop, against
torch.utils.data.DataLoader over the same files.

Three measurements, on the records dataset (files of 3072 bytes in class folders; a
sample is uint8[3072] + an int64 label; batch 64):

1. data path alone: samples/s of iterating the loader and copying each batch (every byte
   read, as bench.py's trainer does on both sides). loaderd through LoaderdDataLoader
   (zero-copy tensors), the same stream read with bare C calls through ctypes (bytes not
   read: the per-batch floor of any Python client), and DataLoader at num_workers 0, 1, 2
   (persistent workers).
2. training: a tiny MLP (3072 -> 256 -> classes, on x.float() / 255, SGD) fed by each
   loader: samples/s and the fraction of the step time spent waiting for data (time
   blocked in next() over the loop's total).
3. Python overhead per batch: the time spent in this package's Python code for a batch,
   i.e. next() + building the views + giving the slot back, minus the time inside the two
   C calls that do the work (lc_stream_next, lc_batch_release). Measured on wall time
   (the C calls are timed from Python and subtracted) and on CPU time (the thread's CPU
   time against a loop of only the two C calls over the same stream).

Usable standalone (default, or --spawn: generates the data with ld-gendata if missing,
starts build/bin/loaderd on a temporary socket, stops it at the end and checks it exits 0
and leaves nothing in /dev/shm) or against a running daemon (--socket PATH, with a dataset
named 'records'; its files are found through the daemon's `datasets` reply unless
--records-dir is given). Writes bench/results/python.md and python.json.

Run with Debian's /usr/bin/python3 (numpy, torch).
"""
import argparse
import datetime
import json
import os
import platform
import signal
import socket as socketmod
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BATCH = 64
DAEMON_WORKERS = ["? (daemon)"]   # set from the daemon's status


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", help="a running loaderd with a 'records' dataset (default: spawn one)")
    p.add_argument("--spawn", action="store_true", help="generate data if needed and start loaderd (the default "
                   "without --socket)")
    p.add_argument("--records-dir", help="the records files (default: the daemon's source with --socket, else "
                   "bench/data/records or bench/data/records-20000x3072-c100, generated when missing)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD", "build"))
    p.add_argument("--files", type=int, default=20000, help="files to generate when none exist (default 20000)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--workers", default="0,1,2", help="DataLoader num_workers values")
    p.add_argument("--epochs", type=int, default=2, help="measured data-path epochs (after one warm-up)")
    p.add_argument("--train-steps", type=int, default=300, help="measured training steps per loader")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP (default 64)")
    p.add_argument("--overhead-batches", type=int, default=3000)
    p.add_argument("--max-seconds", type=float, default=15.0, help="bound on one measured DataLoader epoch")
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--quick", action="store_true", help="fewer epochs and steps (about a minute)")
    p.add_argument("--overhead-only", action="store_true", help="only the Python overhead per batch (no data "
                   "path, no training; the report's other sections are left out)")
    p.add_argument("--client-dir", help="the loaderclient package's parent folder to measure (default: "
                   "client/python of this tree; e.g. another checkout's, to compare two versions)")
    a = p.parse_args(argv)
    if a.quick:
        a.epochs, a.train_steps, a.overhead_batches, a.max_seconds = 1, 100, 1000, 5.0
    a.workers = [int(w) for w in a.workers.split(",") if w.strip()]
    return a


# ---------------------------------------------------------------------------------------
# data and daemon

def find_records_dir(args):
    if args.records_dir:
        return os.path.abspath(args.records_dir)
    for name in ["records", "records-%dx3072-c%d" % (args.files, args.classes)]:
        d = os.path.join(HERE, "data", name)
        if os.path.isdir(d):
            return d
    return os.path.join(HERE, "data", "records-%dx3072-c%d" % (args.files, args.classes))


def generate(args, records_dir):
    gendata = os.path.join(REPO, args.build_dir, "bin", "ld-gendata")
    if not os.path.exists(gendata):
        sys.exit("bench_python: %s not found: run make first" % gendata)
    log("== data: %s" % records_dir)
    subprocess.run([gendata, "files", records_dir, "--count", str(args.files), "--size", "3072", "--classes",
                    str(args.classes)], check=True)


def list_records(records_dir):
    """[(path, label)] in sorted path order, label = index of the class folder (as loaderd)."""
    classes = sorted(d for d in os.listdir(records_dir) if os.path.isdir(os.path.join(records_dir, d)))
    out = []
    for c, name in enumerate(classes):
        sub = os.path.join(records_dir, name)
        out += [(os.path.join(sub, f), c) for f in sorted(os.listdir(sub)) if f.endswith(".bin")]
    return sorted(out)


def warm(files):
    n = 0
    for path, _ in files:
        with open(path, "rb") as f:
            n += len(f.read())
    return n


class Daemon:
    def __init__(self, args, records_dir):
        self.bin = os.path.join(REPO, args.build_dir, "bin", "loaderd")
        if not os.path.exists(self.bin):
            sys.exit("bench_python: %s not found: run make first" % self.bin)
        self.dir = tempfile.mkdtemp(prefix="ld-pybench.", dir="/tmp")
        self.socket = os.path.join(self.dir, "s.sock")
        self.config = os.path.join(self.dir, "loaderd.yaml")
        self.log = os.path.join(args.results_dir, "python-loaderd.log")
        with open(self.config, "w") as f:
            f.write("server:\n  socket: %s\n  workers: 2\n  memory_budget: 1GiB\n  log_level: info\n"
                    "datasets:\n  records:\n    kind: files\n    path: %s\n    pattern: \"*.bin\"\n"
                    % (self.socket, records_dir))
        self.proc = None

    def start(self, timeout=180):
        logf = open(self.log, "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.bin, "--config", self.config], stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                sys.exit("bench_python: loaderd exited with %d (log: %s)" % (self.proc.returncode, self.log))
            s = socketmod.socket(socketmod.AF_UNIX)
            try:
                s.connect(self.socket)
                s.close()
                return time.monotonic() - t0
            except OSError:
                s.close()
                time.sleep(0.05)
        self.proc.kill()
        sys.exit("bench_python: loaderd did not listen within %d s" % timeout)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -1
        left = [n for n in os.listdir("/dev/shm") if n.startswith("loaderd.%d." % self.proc.pid)]
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)
        return rc, left


# ---------------------------------------------------------------------------------------
# loaders

def torch_loader(files, workers):
    import warnings
    import torch
    # torch.frombuffer over bytes (read-only) warns once; the default collate copies it
    warnings.filterwarnings("ignore", message="The given buffer is not writable")

    class Records(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            path, label = files[i]
            with open(path, "rb") as f:     # the idiom users write (fewer system calls than np.fromfile)
                return torch.frombuffer(f.read(), dtype=torch.uint8), label

    g = torch.Generator()
    g.manual_seed(0)
    kw = {"persistent_workers": True, "prefetch_factor": 4} if workers else {}
    return torch.utils.data.DataLoader(Records(), batch_size=BATCH, shuffle=True, num_workers=workers,
                                       generator=g, **kw)


def loaderd_loader(sock, **kw):
    from loaderclient.torch import LoaderdDataLoader
    return LoaderdDataLoader("records", BATCH, shuffle=True, seed=0, socket=sock, **kw)


def time_epoch(loader, max_seconds):
    """(samples, seconds, first batch seconds) of one epoch, stopped after max_seconds."""
    n = 0
    t0 = time.perf_counter()
    first = None
    for data, label in loader:
        if first is None:
            first = time.perf_counter() - t0
        data.clone()        # read every byte, as bench.py's trainer does on both sides
        label.clone()
        n += data.shape[0]
        if time.perf_counter() - t0 > max_seconds:
            break
    return n, time.perf_counter() - t0, first


def data_path(args, sock, files):
    import loaderclient
    rows = []
    # loaderd, through the torch integration (zero-copy tensors).
    ld = loaderd_loader(sock)
    time_epoch(ld, 1e9)   # warm-up: the daemon's first pass, our aliases
    per = [time_epoch(ld, 1e9) for _ in range(args.epochs)]
    ld.close()
    n, s = sum(p[0] for p in per), sum(p[1] for p in per)
    rows.append({"loader": "loaderd (LoaderdDataLoader)", "workers": DAEMON_WORKERS[0], "samples_per_s": n / s,
                 "epochs": [p[0] / p[1] for p in per]})
    # loaderd, the same stream with bare C calls (the floor of any Python client).
    from loaderclient._lib import lib
    import ctypes
    with loaderclient.Client(sock) as c:
        st = c.open("records", BATCH, seed=0)
        bp = ctypes.c_void_p()
        per = []
        for e in range(args.epochs + 1):
            t0 = time.perf_counter()
            n = 0
            for _ in range(st.batches_per_epoch):
                rc = lib.lc_stream_next(st._h, 0, ctypes.byref(bp))
                if rc < 0:
                    raise loaderclient.errors.make_error(rc, "raw next")
                n += lib.lc_batch_rows(bp)
                lib.lc_batch_release(bp)
            if e:
                per.append((n, time.perf_counter() - t0))
        st.close()
    n, s = sum(p[0] for p in per), sum(p[1] for p in per)
    rows.append({"loader": "loaderd (bare C calls via ctypes)", "workers": DAEMON_WORKERS[0], "samples_per_s": n / s,
                 "epochs": [p[0] / p[1] for p in per]})
    for w in args.workers:
        dl = torch_loader(files, w)
        time_epoch(dl, args.max_seconds)   # warm-up
        per = [time_epoch(dl, args.max_seconds) for _ in range(args.epochs)]
        n, s = sum(p[0] for p in per), sum(p[1] for p in per)
        rows.append({"loader": "torch DataLoader", "workers": w, "samples_per_s": n / s,
                     "epochs": [p[0] / p[1] for p in per], "partial": any(p[0] < len(files) for p in per)})
        log("   DataLoader workers=%d: %.0f samples/s" % (w, n / s))
    return rows


def train(loader, steps, classes, label, hidden):
    """Trains a tiny MLP for `steps` steps (after 10 warm-up steps); time, data wait, loss."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3072, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    done = wait = 0.0
    n = samples = 0
    losses = []
    total0 = None
    while n < steps + 10:
        it = iter(loader)
        while n < steps + 10:
            t0 = time.perf_counter()
            try:
                data, target = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            if n == 10:
                total0, wait, samples = t0, 0.0, 0
            wait += t1 - t0
            out = model(data.float().div_(255))
            loss = torch.nn.functional.cross_entropy(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            samples += data.shape[0]
            n += 1
    done = time.perf_counter() - total0
    log("   %s: %.0f samples/s, waiting %.1f%%" % (label, samples / done, 100 * wait / done))
    return {"loader": label, "steps": steps, "samples_per_s": samples / done, "step_ms": 1000 * done / steps,
            "wait_fraction": wait / done, "wait_ms_per_step": 1000 * wait / steps,
            "loss_first": statistics.mean(losses[:10]), "loss_last": statistics.mean(losses[-10:])}


def training(args, sock, files, classes):
    rows = []
    ld = loaderd_loader(sock)
    rows.append(dict(train(ld, args.train_steps, classes, "loaderd (LoaderdDataLoader)", args.hidden),
                     workers=DAEMON_WORKERS[0]))
    ld.close()
    for w in args.workers:
        rows.append(dict(train(torch_loader(files, w), args.train_steps, classes, "torch DataLoader", args.hidden),
                         workers=w))
    return rows


class _Shim:
    """bench/ld-clientshim.c between the package and the C library for the per-batch
    calls (lc_stream_next_info_sized, lc_stream_next, lc_batch_release): it times the
    library's function alone, or answers with batches already in hand (hold). The package
    reaches it as it reaches the library: through its binding (binding(): ctypes functions
    of the shim with the library's argument types) and, for an extension that calls the
    library from C, through set_library (install(); uninstall() puts the library back).
    Either way the call's own cost (ctypes' conversion, or the extension's) stays on the
    package's side of the figures."""

    def __init__(self, args):
        import ctypes
        from loaderclient import _lib
        P = ctypes.c_void_p
        self._lib, self._ctypes = _lib, ctypes
        self.so = so = ctypes.CDLL(os.path.join(REPO, args.build_dir, "lib", "ld-clientshim.so"))
        so.ld_shim_set.argtypes = [P, P, P, P]
        so.ld_shim_hold.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
        so.ld_shim_times.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2
        so.ld_shim_probe.argtypes = [ctypes.c_size_t] + [ctypes.POINTER(ctypes.c_double)] * 2
        real = _lib.lib
        addr = lambda f: ctypes.cast(f, P).value   # noqa: E731
        nxt = getattr(real, "lc_stream_next_info_sized", None)
        so.ld_shim_set(addr(nxt) if nxt is not None else None, addr(real.lc_batch_release),
                       addr(real.lc_batch_describe_sized) if nxt is not None else None, addr(real.lc_stream_next))
        self._addrs = (addr(so.ld_shim_next), addr(so.ld_shim_release))
        ext = getattr(_lib, "speedups", None)
        self._ext = ext if ext is not None and hasattr(ext, "set_library") else None

    def binding(self, real):
        """A stand-in for the package's binding `real`: its per-batch functions are the
        shim's, with the same argument types; every other name is the library's."""
        so = self.so

        class Binding:
            def __getattr__(b, name):
                v = getattr(real, name)
                setattr(b, name, v)
                return v

        b = Binding()
        for name, shim_fn in (("lc_stream_next_info_sized", "ld_shim_next"), ("lc_stream_next", "ld_shim_next_batch"),
                              ("lc_batch_release", "ld_shim_release")):
            f = getattr(real, name, None)
            if f is not None:
                g = getattr(so, shim_fn)
                g.argtypes, g.restype = f.argtypes, f.restype
                setattr(b, name, g)
        return b

    def install(self):
        """Counters to zero, and the extension (if it calls the library from C) onto the shim."""
        self.so.ld_shim_reset()
        if self._ext is not None:
            self._ext.set_library(*self._addrs)

    def uninstall(self):
        if self._ext is not None:
            self._ext.set_library(*self._lib.library_functions())

    def hold(self, bptrs):
        arr = (self._ctypes.c_void_p * max(1, len(bptrs)))(*bptrs)
        if self.so.ld_shim_hold(arr, len(bptrs)) != 0:
            raise ValueError("ld-clientshim holds at most 64 batches")

    def times(self):
        """(wall s, CPU s) inside the library's functions since install()."""
        w, c = self._ctypes.c_uint64(), self._ctypes.c_uint64()
        self.so.ld_shim_times(self._ctypes.byref(w), self._ctypes.byref(c))
        return w.value / 1e9, c.value / 1e9

    def probe(self, n):
        """The timing's own cost per call outside what it adds up: (wall s, CPU s)."""
        w, c = self._ctypes.c_double(), self._ctypes.c_double()
        self.so.ld_shim_probe(n, self._ctypes.byref(w), self._ctypes.byref(c))
        return w.value / 1e9, c.value / 1e9


def overhead(args, sock):
    """Time per batch spent in this package's code: the loop's time minus the time inside
    the library's lc_stream_next(_info) and lc_batch_release (timed by bench/ld-clientshim.c;
    calling them, through ctypes or from the extension, is the package's), on wall time
    and on this thread's CPU time, for a Stream with numpy views (guarded and not) and for
    LoaderdDataLoader. The cost of the timing itself (two clock pairs per call) is measured
    on an empty function and subtracted."""
    import loaderclient
    import loaderclient.client as lcc
    n = args.overhead_batches
    real = lcc.lib

    # The per-batch calls go to the library through the shim (bench/ld-clientshim.c),
    # which adds up the time inside the library's functions; the cost of its clock pairs
    # outside that sum (measured on a function that does nothing) is taken out of the
    # Python side, per call (two a batch).
    shim = _Shim(args)
    timing_wall, timing_cpu = shim.probe(20000)

    def measure(body, setup):
        st, state = setup()
        body(st, state, 50)
        try:
            lcc.lib = shim.binding(real)
            shim.install()
            c0, w0 = time.thread_time(), time.perf_counter()
            k = body(st, state, n)
            cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        finally:
            lcc.lib = real
            shim.uninstall()
        c_wall, c_cpu = shim.times()
        calls = 2 * k
        return {"wall_us": wall / k * 1e6, "cpu_us": cpu / k * 1e6,
                "c_wall_us": c_wall / k * 1e6, "c_cpu_us": c_cpu / k * 1e6,
                "python_wall_us": (wall - c_wall - calls * timing_wall) / k * 1e6,
                "python_cpu_us": (cpu - c_cpu - calls * timing_cpu) / k * 1e6}

    def stream_setup(safe):
        def setup():
            st = client.open("records", BATCH, seed=1, keep_views_safe=safe)
            return st, None
        return setup

    def stream_body(st, _, k):
        keep = [None]
        for _ in range(k):
            b = st.next()
            keep[0] = b["data"], b["label"]   # alive until the next batch, like a loop's variables
        return k

    def loader_setup():
        ld = loaderd_loader(sock)
        return ld, None

    def loader_body(ld, _, k):
        done = 0
        while done < k:
            for data, label in ld:
                done += 1
                if done >= k:
                    break
        return done

    variants = {"numpy_safe": (stream_body, stream_setup(True)),
                "numpy_unsafe": (stream_body, stream_setup(False)),
                "torch_loader": (loader_body, loader_setup)}
    reps = {k: [] for k in variants}
    with loaderclient.Client(sock) as client:
        for _ in range(5):
            for k, (body, setup) in variants.items():
                reps[k].append(measure(body, setup))
                client.streams()   # closes nothing; keeps the connection honest
    out = {"timing_cost_us": {"wall": timing_wall * 1e6, "cpu": timing_cpu * 1e6}}
    for k, rs in reps.items():
        out[k] = {f: statistics.median(r[f] for r in rs) for f in rs[0]}
    return out


def overhead_ready(args, sock, held=3):
    """The package alone over ready batches: next() + views + release, and next() +
    LoaderdDataLoader's tensors (data shared, label copied). `held` batches of different
    slots are taken from the daemon and handed out in turn by bench/ld-clientshim.c in
    place of the library (whose release then does nothing): a loop runs only the package,
    with hot caches (no socket, no daemon, no context switch), calling the shim as it calls
    the library; this thread's CPU time, best of 3 x 20000. Each batch includes the look-up
    of its slot's written pages in /proc/self/pagemap; that look-up alone is measured too:
    pagemap_us."""
    import loaderclient
    import loaderclient.client as lcc
    n = 20000
    real = lcc.lib
    out = {}
    with loaderclient.Client(sock) as c:
        st = c.open("records", BATCH, auto_release=False)
        bptrs = []
        for _ in range(held):
            b = st.next()
            st._held.pop(id(b._state))          # the loop below reuses these batches' slots
            b._state.given_back = True
            bptrs.append(b._state.bptr)
        del b
        plan = [(st._by_name["data"], False), (st._by_name["label"], True)]
        # As LoaderdDataLoader makes them: a package with Stream._next(ms, plan, convert)
        # makes the tensors in next() itself, without a Batch object; an older one through
        # the Batch (_torch_plan, with a TorchPlan or the plain list before it).
        in_next = False
        try:
            from loaderclient._batch import TorchPlan
            plan = TorchPlan(plan, st._ring)
            in_next = plan.spec is not None and "plan" in st._next.__code__.co_varnames
        except (ImportError, TypeError):
            pass
        import torch
        from_numpy, ms = torch.from_numpy, c._timeout_ms
        st.auto_release = True
        shim = None
        try:
            shim = _Shim(args)
            shim.hold(bptrs)
            lcc.lib = shim.binding(real)
            shim.install()
            for name in ("numpy", "torch"):
                best = None
                for _ in range(3):
                    t0 = time.thread_time()
                    if name == "numpy":
                        for _ in range(n):
                            b = st.next()
                            x, y = b["data"], b["label"]
                    elif in_next:
                        for _ in range(n):
                            (x, y), _, _ = st._next(ms, plan, from_numpy)
                    else:
                        for _ in range(n):
                            b = st.next()
                            x, y = b._torch_plan(plan)
                    t = (time.thread_time() - t0) / n * 1e6
                    best = t if best is None else min(best, t)
                out[name + "_us"] = best
            b = st.next()    # releases the plan path's last batch too
            b.release()
            del b, x, y
        finally:
            lcc.lib = real
            if shim is not None:
                shim.uninstall()
                shim.hold([])
        # The written-page look-up of one slot's mapping, alone.
        from loaderclient import _slots
        size = st._ring.alias_len
        addr = next((a for a in st._ring.alias if a is not None), None)
        if addr is not None:
            best = None
            for _ in range(3):
                t0 = time.thread_time()
                for _ in range(2000):
                    _slots._drop_written(addr, size)
                t = (time.thread_time() - t0) / 2000 * 1e6
                best = t if best is None else min(best, t)
            out["pagemap_us"] = best
            out["pagemap_pages"] = size // 4096
        for bptr in bptrs:
            real.lc_batch_release(bptr)
        st.close()
    return out


def client_path():
    """Which per-batch path the measured package runs: its C extension or pure Python."""
    import loaderclient
    path = getattr(loaderclient, "speedups_path", None)
    if path:
        return "the C extension (loaderclient._speedups, %s)" % os.path.basename(path)
    return "pure Python (%s)" % (getattr(loaderclient, "speedups_note", None) or "a package without the extension")


def _wait_ahead(client, stream_id, depth):
    """Waits (up to 30 s) until the daemon has `depth` batches of the stream ready or
    handed ahead (`prefetch_depth` in the `streams` reply, none of them still filling or
    being copied)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        row = next(r for r in client.streams() if r["id"] == stream_id)
        if row["filling"] == 0 and row["copying"] == 0 and row["prefetch_depth"] >= depth:
            return
        time.sleep(0.002)
    log("   stream %d: %d batches ahead not reached within 30 s" % (stream_id, depth))


def overhead_ahead(args, sock, rounds=40, depth=32):
    """This thread's CPU time per batch over batches the daemon has ready (handed `depth`
    ahead, waited for between rounds): the whole client, Python and the C library, with
    no wait in the measured loop. Stream with two numpy views, and LoaderdDataLoader's
    (data, label). Median over rounds."""
    import loaderclient
    clock = time.thread_time
    out = {"depth": depth, "rounds": rounds}
    with loaderclient.Client(sock) as c:
        st = c.open("records", BATCH, seed=3, prefetch=depth)
        keep = st.next()["data"]
        per = []
        for _ in range(rounds):
            _wait_ahead(c, st.id, depth)
            c0 = clock()
            for _ in range(depth):
                b = st.next()
                keep = b["data"], b["label"]   # alive until the next batch, like a loop's variables
            per.append((clock() - c0) / depth)
        del b, keep
        st.close()
        out["numpy_us"] = statistics.median(per) * 1e6
        ld = loaderd_loader(sock, prefetch=depth)
        it = iter(ld)
        keep = next(it)
        per = []
        for _ in range(rounds):
            _wait_ahead(c, ld.stream.id, depth)
            c0 = clock()
            n = 0
            while n < depth:
                try:
                    keep = next(it)
                except StopIteration:
                    it = iter(ld)
                    continue
                n += 1
            per.append((clock() - c0) / depth)
        del keep
        ld.close()
        out["torch_us"] = statistics.median(per) * 1e6
    return out


def overhead_c(args, sock, rounds=60, depth=32):
    """The C library's own CPU time per batch over ready batches: a stream opened with
    prefetch `depth` is left alone until the daemon has handed that many batches ahead
    (the `streams` reply: nothing filling, `depth` leased beyond the one held), then
    lc_stream_next_info + lc_batch_release are called for each, timed on this thread's CPU
    clock; less the same two calls answered at once (a NULL stream and batch: the same
    ctypes conversions), which is the cost of calling from Python. Median over rounds."""
    import ctypes
    import loaderclient
    from loaderclient import _lib
    lib = ctypes.CDLL(_lib.library_path)    # bound here: the package measured may predate the call
    P = ctypes.c_void_p
    lib.lc_stream_next_info_sized.argtypes = [P, ctypes.c_int, ctypes.POINTER(P), P, ctypes.c_size_t]
    lib.lc_stream_next_info_sized.restype = ctypes.c_int
    lib.lc_batch_release.argtypes = [P]
    lib.lc_batch_release.restype = ctypes.c_int
    info = (ctypes.c_uint8 * 64)()           # lc_batch_info and room beyond it
    bp = ctypes.c_void_p()
    ref_b, ref_i, size = ctypes.byref(bp), ctypes.byref(info), ctypes.sizeof(_lib.LcBatchInfo)
    nxt, rel, clock = lib.lc_stream_next_info_sized, lib.lc_batch_release, time.thread_time

    def empty(n):
        c0 = clock()
        for _ in range(n):
            nxt(None, 1000, ref_b, ref_i, size)
            rel(None)
        return (clock() - c0) / n

    per, calls = [], []
    with loaderclient.Client(sock) as c:
        st = c.open("records", BATCH, seed=2, prefetch=depth)
        h = st._h
        held = st.next()                     # the stream's first batch, kept: the ring stays busy
        for _ in range(rounds):
            _wait_ahead(c, st.id, depth)
            calls.append(empty(depth))
            c0 = clock()
            for _ in range(depth):
                rc = nxt(h, 1000, ref_b, ref_i, size)
                if rc < 0:
                    raise loaderclient.errors.make_error(rc, "lc_stream_next_info")
                rel(bp.value)
            per.append((clock() - c0) / depth)
        held.release()
        st.close()
    call = statistics.median(calls)
    return {"depth": depth, "rounds": rounds, "call_us": call * 1e6,
            "c_us": statistics.median(per) * 1e6 - call * 1e6, "with_calls_us": statistics.median(per) * 1e6}


# ---------------------------------------------------------------------------------------
# report

def machine():
    import numpy
    import torch
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": len(os.sched_getaffinity(0)), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "torch_threads": torch.get_num_threads(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def render(res):
    m = res["machine"]
    L = ["# loaderd Python client — benchmark", "",
         "`/usr/bin/python3 bench/bench_python.py%s` — %d CPUs (%s), kernel %s, Python %s, torch %s "
         "(%d threads), numpy %s, %s." % (" " + " ".join(res["argv"]) if res["argv"] else "", m["cpus"], m["cpu"],
                                          m["kernel"], m["python"], m["torch"], m["torch_threads"], m["numpy"],
                                          m["date"]),
         "", "Records: %d files of 3072 bytes, %d classes, batch %d, shuffled; page cache warm." %
         (res["files"], res["classes"], BATCH)]
    if "data_path" in res:
        L += ["", "## Data path alone (no training)", "",
              "| loader | workers | samples/s | vs best DataLoader |", "| --- | ---: | ---: | ---: |"]
        best = max((r["samples_per_s"] for r in res["data_path"] if r["loader"] == "torch DataLoader"),
                   default=None)
        for r in res["data_path"]:
            ratio = "%.2f×" % (r["samples_per_s"] / best) if best else "—"
            L.append("| %s%s | %s | %.0f | %s |" % (r["loader"], " (partial epochs)" if r.get("partial") else "",
                                                   r["workers"], r["samples_per_s"], ratio))
    if "training" in res:
        L += ["", "## Training a tiny MLP (3072→%d→%d, SGD) from each loader" % (res["hidden"], res["classes"]),
              "", "| loader | workers | samples/s | ms/step | waiting for data | wait ms/step | loss first→last |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in res["training"]:
            L.append("| %s | %s | %.0f | %.2f | %.1f%% | %.3f | %.2f→%.2f |" % (
                r["loader"], r["workers"], r["samples_per_s"], r["step_ms"], 100 * r["wait_fraction"],
                r["wait_ms_per_step"], r["loss_first"], r["loss_last"]))
    o = res["overhead"]
    L += ["", "## Python overhead per batch (median of 5 × %d batches)" % res["overhead_batches"], "",
          "Client path measured: %s." % res.get("client_path", "?"), "",
          "Per batch: the loop's time, the time inside the library's lc_stream_next + "
          "lc_batch_release (the request, the wait for the daemon, the release; timed by "
          "bench/ld-clientshim.c), and what remains: the package's side (next(), calling the "
          "library through ctypes or from the extension, the views, giving the slot back), less "
          "the timing's own cost. Wall time and this thread's CPU time.", "",
          "| loop | wall µs | in C, wall µs | **Python µs (wall)** | CPU µs | in C, CPU µs | **Python µs (CPU)** |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = {"numpy_safe": "Stream: next() + `b[\"data\"]`, `b[\"label\"]` (keep_views_safe=True)",
             "numpy_unsafe": "the same, keep_views_safe=False",
             "torch_loader": "LoaderdDataLoader: (data, label) tensors"}
    for k, name in names.items():
        r = o[k]
        L.append("| %s | %.1f | %.1f | **%.1f** | %.1f | %.1f | **%.1f** |" % (
            name, r["wall_us"], r["c_wall_us"], r["python_wall_us"], r["cpu_us"], r["c_cpu_us"], r["python_cpu_us"]))
    r = res["overhead_ready"]
    L += ["", "Over ready batches (the library's two functions replaced by bench/ld-clientshim.c answering "
          "with batches already in hand, three slots in turn: the package alone, hot caches, this "
          "thread's CPU time, best of 3 × 20000): next() + 2 numpy views + release **%.1f µs**; next() + "
          "LoaderdDataLoader's tensors (data shared, label copied) + release **%.1f µs**."
          % (r["numpy_us"], r["torch_us"])]
    if "pagemap_us" in r:
        L[-1] += (" Of that, the look-up of the slot's written pages in /proc/self/pagemap (every batch) "
                  "costs %.1f µs (%d pages)." % (r["pagemap_us"], r["pagemap_pages"]))
    r = res.get("overhead_ahead")
    if r:
        L += ["", "Over batches the daemon has ready (%d handed ahead, waited for between rounds; the real "
              "library, this thread's CPU time per batch, Python and C, median of %d rounds): next() + 2 numpy "
              "views + release **%.1f µs**; LoaderdDataLoader's (data, label) **%.1f µs**."
              % (r["depth"], r["rounds"], r["numpy_us"], r["torch_us"])]
    r = res.get("overhead_c")
    if r:
        L += ["", "The C library over ready batches (the daemon %d batches ahead; median of %d rounds, this "
              "thread's CPU time): lc_stream_next_info + lc_batch_release **%.2f µs** per batch, less %.2f µs "
              "for the two calls from Python (the same calls answered at once)."
              % (r["depth"], r["rounds"], r["c_us"], r["call_us"])]
    return "\n".join(L) + "\n"


def main(argv):
    args = parse_args(argv)
    build_lib = os.path.join(REPO, args.build_dir, "lib", "libloaderclient.so")
    os.environ.setdefault("LOADERCLIENT_LIB", build_lib)
    sys.path.insert(0, os.path.abspath(args.client_dir) if args.client_dir else os.path.join(REPO, "client", "python"))
    import loaderclient
    log("== loaderclient from %s, %s" % (os.path.dirname(loaderclient.__file__), loaderclient._lib.library_path))
    os.makedirs(args.results_dir, exist_ok=True)
    daemon = None
    sock = args.socket
    if sock and args.spawn:
        sys.exit("bench_python: --socket and --spawn exclude each other")
    if sock:
        with loaderclient.Client(sock) as c:
            src = {d["name"]: d for d in c.datasets()}.get("records")
            if src is None:
                sys.exit("bench_python: the daemon at %s has no dataset named 'records'" % sock)
        records_dir = os.path.abspath(args.records_dir) if args.records_dir else src["source"]
    else:
        records_dir = find_records_dir(args)
        if not os.path.isdir(records_dir) or not os.listdir(records_dir):
            generate(args, records_dir)
    files = list_records(records_dir)
    classes = len({label for _, label in files})
    log("== %d files in %s (%d classes); warming the page cache" % (len(files), records_dir, classes))
    warm(files)
    result = {"argv": argv, "records_dir": records_dir, "files": len(files), "classes": classes,
              "hidden": args.hidden}
    failed = []
    try:
        if not sock:
            daemon = Daemon(args, records_dir)
            result["loaderd_startup_s"] = daemon.start()
            sock = daemon.socket
        with loaderclient.Client(sock) as c:
            DAEMON_WORKERS[0] = "%d (daemon)" % c.status()["workers"]
        if not args.overhead_only:
            log("== data path")
            result["data_path"] = data_path(args, sock, files)
            log("== training")
            result["training"] = training(args, sock, files, classes)
        log("== Python overhead per batch")
        result["overhead"] = overhead(args, sock)
        result["overhead_ready"] = overhead_ready(args, sock)
        result["overhead_ahead"] = overhead_ahead(args, sock)
        result["overhead_c"] = overhead_c(args, sock)
        result["overhead_batches"] = args.overhead_batches
        result["client_path"] = client_path()
    finally:
        if daemon is not None:
            rc, left = daemon.stop()
            result["loaderd_exit"] = rc
            result["shm_left"] = left
            if rc != 0:
                failed.append("loaderd exited with %s" % rc)
            if left:
                failed.append("loaderd left %s in /dev/shm" % left)
    result["machine"] = machine()
    result["failures"] = failed
    md = render(result)
    # An overhead-only run keeps the full report of the last complete run.
    stem = "python-overhead" if args.overhead_only else "python"
    with open(os.path.join(args.results_dir, stem + ".md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.results_dir, stem + ".json"), "w") as f:
        json.dump(result, f, indent=2)
    print(md)
    if failed:
        log("bench_python: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
