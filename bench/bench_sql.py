#!/usr/bin/python3
"""loaderd's `sql` kind on PostgreSQL, against PyTorch Datasets that query the database.

A PostgreSQL server of its own (scripts/pg-test-server.sh: a throwaway cluster in a
temporary directory, Unix socket only) holds a table of --rows rows (default 100,000), each
a bytea payload of 1.5 to 4.5 KiB (3 KiB on average, stored uncompressed) and an integer
label. In one run, each reading every byte it is given:

1. loaderd, epoch 1 from the database: a stream on a dataset without a cache (rows fetched
   by key in blocks, WHERE id = ANY($1), one statement per worker chunk).
2. loaderd, cached epochs: a dataset with `cache:`; the cache is built (from the database,
   timed) and a stream reads --epochs + 1 epochs once the daemon serves it: the median of
   all but its first (which reads the database until the cache is proven current).
3. PyTorch: a Dataset whose __getitem__ runs one query per sample (psycopg2, a connection
   per DataLoader worker), and one whose __getitem__ takes a batch of ids and runs one
   `= ANY(%s)` query per batch (a BatchSampler); DataLoader with --workers workers, over
   --dataset-samples samples of the shuffled epoch (a per-sample query epoch of 100,000
   rows takes minutes; the rate does not depend on how many).

Every reader uses batches of --batch-size, shuffled. Prints a table and writes
bench/results/sql.{md,json}. `make bench` runs it; --quick makes it small. Needs
python3-psycopg2 and python3-torch (scripts/deps.sh bench installs them).
"""
import argparse
import hashlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import bench  # noqa: E402  (log, machine_info, host_label)

sys.path.insert(0, os.path.join(REPO, "client", "python"))
SCRIPT = os.path.join(REPO, "scripts", "pg-test-server.sh")
SEED = 0


def payload(i):
    """Row i's payload, as the server builds it: md5(i) repeated 96 + i % 192 times."""
    return hashlib.md5(str(i).encode()).digest() * (96 + i % 192)


def fill(conninfo, rows):
    import psycopg2
    con = psycopg2.connect(conninfo)
    with con, con.cursor() as cur:
        cur.execute("CREATE TABLE rec (id int PRIMARY KEY, payload bytea, label int)")
        cur.execute("ALTER TABLE rec ALTER payload SET STORAGE EXTERNAL")  # as stored data is: no compression
        cur.execute("INSERT INTO rec SELECT i, decode(repeat(md5(i::text), 96 + i %% 192), 'hex'), i %% 100 "
                    "FROM generate_series(1, %s) AS i", (rows,))
        cur.execute("ANALYZE rec")
        cur.execute("SELECT pg_total_relation_size('rec')")
        size = cur.fetchone()[0]
    con.close()
    return size


def loaderd_epochs(sock, name, batch, epochs, seed, check=0):
    """Reads `epochs` epochs of `name`; (samples/s of each epoch, samples of each). With
    check (the row count), the first batch is compared with the rows."""
    import loaderclient
    import numpy as np
    rates, counts = [], []
    ids = {hashlib.md5(str(i).encode()).digest(): i for i in range(1, check + 1)} if check else {}
    with loaderclient.Client(sock, timeout=120) as c:
        with c.open(name, batch, seed=seed, epochs=epochs) as s:
            t0, n, epoch = time.perf_counter(), 0, None
            for b in s:
                if epoch is not None and b.epoch != epoch:
                    rates.append(n / (time.perf_counter() - t0))
                    counts.append(n)
                    t0, n = time.perf_counter(), 0
                epoch = b.epoch
                rf = b["payload"]
                np.array(rf.data, copy=True)            # every byte read, as a copy to the device would
                if check:                               # the first batch, byte for byte
                    check = None
                    for r in range(b.rows):
                        blob = bytes(rf[r])
                        i = ids[blob[:16]]
                        assert blob == payload(i) and int(b["label"][r]) == i % 100, "row %d differs" % i
                n += b.rows
            rates.append(n / (time.perf_counter() - t0))
            counts.append(n)
    return rates, counts


def wait_cache(sock, name, timeout):
    """Builds the cache of `name` and waits until it is ready; seconds it took."""
    import loaderclient
    with loaderclient.Client(sock, timeout=60) as c:
        deadline = time.monotonic() + timeout
        info = c.request({"op": "cache_info", "dataset": name})
        while info["state"] == "checking" and time.monotonic() < deadline:
            time.sleep(0.05)
            info = c.request({"op": "cache_info", "dataset": name})
        t0 = time.perf_counter()
        c.request({"op": "cache_build", "dataset": name})
        while info["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.05)
            info = c.request({"op": "cache_info", "dataset": name})
        if info["state"] != "ready":
            raise RuntimeError("the cache of %s is not ready after %.0f s: %s" % (name, timeout, info))
        return time.perf_counter() - t0, info


def cache_hits(sock, name):
    import loaderclient
    with loaderclient.Client(sock, timeout=60) as c:
        return c.request({"op": "cache_info", "dataset": name})["hits"]


def torch_rate(conninfo, rows, samples, batch, workers, per_batch):
    """samples/s of a DataLoader over a Dataset that queries the database per sample, or
    per batch of ids (BatchSampler)."""
    import psycopg2
    import torch
    from torch.utils.data import BatchSampler, DataLoader, Dataset, SubsetRandomSampler

    class Rows(Dataset):
        def __init__(self):
            self.con = None

        def __len__(self):
            return rows

        def _cur(self):
            if self.con is None:                         # one connection per worker process
                self.con = psycopg2.connect(conninfo)
                self.con.autocommit = True
            return self.con.cursor()

        def __getitem__(self, idx):
            with self._cur() as cur:
                if per_batch:
                    cur.execute("SELECT payload, label FROM rec WHERE id = ANY(%s)", ([i + 1 for i in idx],))
                    got = cur.fetchall()
                else:
                    cur.execute("SELECT payload, label FROM rec WHERE id = %s", (idx + 1,))
                    got = [cur.fetchone()]
            out = [(torch.frombuffer(bytearray(p), dtype=torch.uint8), lab) for p, lab in got]
            return out if per_batch else out[0]

    g = torch.Generator().manual_seed(SEED)
    subset = torch.randperm(rows, generator=g)[:samples].tolist()
    sampler = SubsetRandomSampler(subset, generator=g)
    if per_batch:
        loader = DataLoader(Rows(), sampler=BatchSampler(sampler, batch, drop_last=False), batch_size=None,
                            num_workers=workers, collate_fn=lambda x: x)
    else:
        loader = DataLoader(Rows(), sampler=sampler, batch_size=batch, num_workers=workers, collate_fn=lambda x: x)
    t0, n = time.perf_counter(), 0
    for b in loader:
        for t, _ in b:
            t.clone()
        n += len(b)
    return n / (time.perf_counter() - t0), n


def render(res):
    r = res["results"]
    base = r["dataset_per_sample"]["samples_per_s"]
    lines = ["# loaderd `sql` on PostgreSQL vs PyTorch Datasets that query it", "",
             bench.machine_line(res["machine"]), "",
             "%d rows, %.0f MB in the table (payload 1.5-4.5 KiB), batch %d, %d workers each side" % (
                 res["rows"], res["table_bytes"] / 1e6, res["batch_size"], res["workers"]), "",
             "| reader | samples/s | vs per-sample Dataset |", "| --- | ---: | ---: |"]
    for key, label in (("loaderd_epoch1", "loaderd, epoch 1 from the database"),
                       ("loaderd_cached", "loaderd, cached epochs (median)"),
                       ("dataset_per_batch", "Dataset, one query per batch (DataLoader)"),
                       ("dataset_per_sample", "Dataset, one query per sample (DataLoader)")):
        v = r[key]["samples_per_s"]
        lines.append("| %s | %s | %.1fx |" % (label, format(round(v), ","), v / base))
    lines += ["", "Cache build (from the database): %.1f s. Target: cached >= 50x the per-sample Dataset: %s." % (
        r["cache_build_s"], "met" if r["loaderd_cached"]["samples_per_s"] >= 50 * base else "NOT met")]
    return "\n".join(lines) + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dataset-samples", type=int, default=10_000, help="samples each Dataset reads")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="cached epochs timed")
    ap.add_argument("--quick", action="store_true", help="10,000 rows, 3,000 samples per Dataset")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.dataset_samples = 10_000, 3_000
    args.dataset_samples = min(args.dataset_samples, args.rows)
    loaderd = os.path.join(REPO, "build", "bin", "loaderd")
    os.makedirs(args.results, exist_ok=True)
    pgdir = tempfile.mkdtemp(prefix="ld-bsql-pg.")
    work = tempfile.mkdtemp(prefix="ld-bsql.")
    password = secrets.token_hex(12)
    proc, started, res = None, False, None
    try:
        env = dict(os.environ, PG_TEST_OPTIONS="-c shared_buffers=256MB")
        p = subprocess.run([SCRIPT, "start", pgdir, password], capture_output=True, text=True, timeout=300, env=env)
        if p.returncode != 0:
            raise RuntimeError("cannot start PostgreSQL: " + p.stderr.strip())
        started = True
        conninfo = p.stdout.strip() + " password=" + password
        t0 = time.perf_counter()
        size = fill(conninfo, args.rows)
        bench.log("bench_sql: %d rows, %.0f MB, filled in %.1f s" % (args.rows, size / 1e6, time.perf_counter() - t0))
        sock = os.path.join(work, "s.sock")
        entry = ("    kind: sql\n    connection: \"%s\"\n    query: SELECT id, payload, label FROM rec\n"
                 "    key: id\n    columns: {payload: blob, label: label}\n" % conninfo)
        with open(os.path.join(work, "loaderd.yaml"), "w") as f:
            f.write("server:\n  socket: %s\n  workers: %d\n  log_level: warn\n  memory_budget: 512MiB\n"
                    "datasets:\n  db:\n%s  dbc:\n%s    cache: {path: %s}\n"
                    % (sock, args.workers, entry, entry, os.path.join(work, "dbc.ldc")))
        with open(os.path.join(work, "loaderd.log"), "wb") as lf:
            proc = subprocess.Popen([loaderd, "--config", os.path.join(work, "loaderd.yaml")], stdout=lf,
                                    stderr=lf, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not os.path.exists(sock) or not bench.socket_accepts(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("loaderd did not start: " + bench.tail(os.path.join(work, "loaderd.log")))
            time.sleep(0.05)
        r = {}
        rates, counts = loaderd_epochs(sock, "db", args.batch_size, 1, SEED, args.rows)
        assert counts == [args.rows], counts
        r["loaderd_epoch1"] = {"samples_per_s": rates[0]}
        bench.log("bench_sql: loaderd epoch 1 from the database: %.0f samples/s" % rates[0])
        r["cache_build_s"], info = wait_cache(sock, "dbc", 600)
        hits, seed = cache_hits(sock, "dbc"), 1
        while cache_hits(sock, "dbc") == hits and seed < 20:     # until the daemon serves the cache
            loaderd_epochs(sock, "dbc", args.batch_size, 1, seed)
            seed += 1
        # A stream reads the source until the daemon has proven the cache current for it:
        # its first epoch is not timed.
        rates, counts = loaderd_epochs(sock, "dbc", args.batch_size, args.epochs + 1, seed)
        assert counts == [args.rows] * (args.epochs + 1), counts
        rates = rates[1:]
        r["loaderd_cached"] = {"samples_per_s": statistics.median(rates), "epochs": rates,
                               "cache_bytes": info.get("file", {}).get("data_bytes")}
        bench.log("bench_sql: loaderd cached epochs: %s samples/s" % ", ".join("%.0f" % x for x in rates))
        for key, per_batch in (("dataset_per_batch", True), ("dataset_per_sample", False)):
            rate, n = torch_rate(conninfo, args.rows, args.dataset_samples, args.batch_size, args.workers, per_batch)
            r[key] = {"samples_per_s": rate, "samples": n}
            bench.log("bench_sql: %s: %.0f samples/s over %d samples" % (key, rate, n))
        r["cached_vs_per_sample"] = r["loaderd_cached"]["samples_per_s"] / r["dataset_per_sample"]["samples_per_s"]
        res = {"rows": args.rows, "table_bytes": size, "batch_size": args.batch_size, "workers": args.workers,
               "machine": bench.machine_info(), "results": r}
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        if started:
            subprocess.run([SCRIPT, "stop", pgdir], capture_output=True, timeout=120)
        shutil.rmtree(pgdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(args.results, "sql.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = render(res)
    with open(os.path.join(args.results, "sql.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
