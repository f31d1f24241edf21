"""The `sql` kind against a real PostgreSQL server that this module starts once
(scripts/pg-test-server.sh: initdb in a temporary directory, a Unix socket only, a role
with a password, run as nobody when the tests run as root; skipped, saying so, where
PostgreSQL is not installed). Rows served as samples (bytea bytes and labels equal to the
rows, exact cover per epoch, across ranks and from a resumed batch); with a cache, the
first pass reads the server and later epochs read the cache; the server stopped
mid-epoch: the stream fails with a clear error naming the dataset while another dataset
keeps serving, and once the server is back a new stream reads it again; the password is
in no log line and no loaderctl output; a wrong password refuses --check with the
server's message. A query of more rows than one block of the key scan's cursor: every
key in order, across the blocks' edges."""
import json
import os
import subprocess
import time

import pytest

import support
import loaderclient
from test_sources_sql import build_cache, check_batch, exact_cover, table_rows, train_rows

PASSWORD = "Pw-0f-the-test-9Z"
SCRIPT = os.path.join(support.REPO, "scripts", "pg-test-server.sh")
QUERY = "SELECT id, payload, diag FROM rec WHERE split = 'train'"
# More rows than the key scan reads per FETCH (10,000), and not a multiple of it.
MANY = 25003
MANY_QUERY = "SELECT g AS id, int4send(g * 3) AS payload, g %% 7 AS lab FROM generate_series(1, %d) AS g" % MANY


def pg_server(cmd, pgdir):
    p = subprocess.run([SCRIPT, cmd, pgdir] + ([PASSWORD] if cmd == "start" else []), capture_output=True,
                       text=True, timeout=120)
    if p.returncode == 2:
        pytest.skip(p.stderr.strip())
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def _fill(conninfo):
    psycopg2 = pytest.importorskip("psycopg2", reason="python3-psycopg2 writes the test table")
    con = psycopg2.connect(conninfo + " password=" + PASSWORD)
    with con, con.cursor() as cur:
        cur.execute("CREATE TABLE rec (id int PRIMARY KEY, payload bytea, diag text, split text)")
        cur.executemany("INSERT INTO rec VALUES (%s, %s, %s, %s)",
                        [(i, psycopg2.Binary(b), diag, split) for i, b, diag, split in table_rows()])
    con.close()


@pytest.fixture(scope="module")
def pg_daemon():
    d = support.short_tmpdir("lc-pg.")
    pgdir = support.short_tmpdir("lc-pgs.")   # its own: the server's user must reach it
    started = False
    dm = None
    try:
        conninfo = pg_server("start", pgdir)
        started = True
        _fill(conninfo)
        support.gen_files(os.path.join(d, "files"), 64, 128, classes=4)
        conn = "%s password=%s" % (conninfo, PASSWORD)
        entry = ("    kind: sql\n    connection: \"%s\"\n    query: \"%s\"\n    key: id\n"
                 "    columns: {payload: blob, diag: label}\n" % (conn, QUERY))
        many = ("  many:\n    kind: sql\n    connection: \"%s\"\n    query: \"%s\"\n    key: id\n"
                "    columns: {payload: blob, lab: label}\n" % (conn, MANY_QUERY))
        dm = support.Daemon(d, "  pg:\n" + entry + "  pgc:\n" + entry + "    cache: {path: pgc.ldc}\n"
                               "  other:\n    kind: files\n    path: files\n" + many)
        dm.start()
        yield dm, d, pgdir, train_rows(table_rows())
        dm.stop_clean()
    finally:
        if dm:
            dm.kill()
        if started:
            subprocess.run([SCRIPT, "stop", pgdir], capture_output=True, timeout=60)
        support.rmtree(d)
        support.rmtree(pgdir)


def test_rows_exact_cover(pg_daemon):
    dm, _, _, rows = pg_daemon
    with loaderclient.Client(dm.socket, timeout=10) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["pg"]["kind"] == "sql" and ds["pg"]["samples"] == len(rows)
        assert "user=loaderd" in ds["pg"]["source"] and "password=***" in ds["pg"]["source"]
        exact_cover(c, "pg", rows)


def test_key_scan_in_blocks(pg_daemon):
    dm, _, _, _ = pg_daemon
    with loaderclient.Client(dm.socket, timeout=30) as c:
        ds = {x["name"]: x for x in c.datasets()}
        assert ds["many"]["samples"] == MANY
        # Sample i is key i + 1: across the edges of the first and second blocks, and the end.
        for start_batch in (3, 6, 8):
            with c.open("many", 3000, shuffle=False, epochs=1, start_batch=start_batch, prefetch=1) as s:
                b = s.next()
                got = [(int.from_bytes(bytes(b["payload"][r]), "big"), int(b["label"][r])) for r in range(b.rows)]
                b.release()
            keys = range(start_batch * 3000 + 1, min((start_batch + 1) * 3000, MANY) + 1)
            assert got == [(3 * k, k % 7) for k in keys], (start_batch, got[:3])


def test_cache_serves_later_epochs(pg_daemon):
    dm, _, _, rows = pg_daemon
    keys = sorted(rows)
    with loaderclient.Client(dm.socket, timeout=10) as c:
        hits = build_cache(c, "pgc", len(rows), timeout=30)["hits"]
        deadline = time.monotonic() + 30
        while c.request({"op": "cache_info", "dataset": "pgc"})["hits"] == hits and time.monotonic() < deadline:
            with c.open("pgc", 32, seed=4, epochs=1) as s:
                assert sorted(i for b in s for i in check_batch(b, rows)) == keys
        assert c.request({"op": "cache_info", "dataset": "pgc"})["hits"] > hits


def test_server_down_mid_epoch(pg_daemon):
    dm, _, pgdir, rows = pg_daemon
    keys = sorted(rows)
    with loaderclient.Client(dm.socket, timeout=30) as c:
        got, err = [], None
        try:
            with c.open("pg", 8, seed=2, epochs=1, prefetch=1) as s:
                for n, b in enumerate(s):
                    got += check_batch(b, rows)
                    if n == 1:
                        pg_server("stop", pgdir)
        except loaderclient.LoaderdError as e:
            err = str(e)
        assert err is not None, "the epoch ended without the server (%d of %d samples)" % (len(got), len(keys))
        assert "dataset 'pg'" in err and ("could not connect again" in err or "cannot open the database" in err), err
        assert PASSWORD not in err
        # The daemon keeps serving the others meanwhile.
        with c.open("other", 16, seed=1, epochs=1) as s:
            assert sum(b.rows for b in s) == 64
    pg_server("up", pgdir)
    with loaderclient.Client(dm.socket, timeout=30) as c:
        with c.open("pg", 16, seed=3, epochs=1) as s:
            assert sorted(i for b in s for i in check_batch(b, rows)) == keys


def test_password_never_shown(pg_daemon):
    dm, _, _, _ = pg_daemon
    ctl = os.path.join(os.path.dirname(support.binaries()[0]), "loaderctl")
    for args in (["datasets"], ["datasets", "--json"], ["status"], ["status", "--json"], ["streams"]):
        p = subprocess.run([ctl, "--socket", dm.socket] + args, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert PASSWORD not in p.stdout + p.stderr
    p = subprocess.run([ctl, "--socket", dm.socket, "datasets", "--json"], capture_output=True, text=True, timeout=30)
    assert "password=***" in p.stdout
    assert json.loads(p.stdout)
    assert PASSWORD not in dm.log_text()


def test_wrong_password_refuses_the_check(pg_daemon):
    _, d, pgdir, _ = pg_daemon
    conn = "host=%s dbname=postgres user=loaderd password=not-%s" % (pgdir, PASSWORD)
    os.makedirs(os.path.join(d, "bad"), exist_ok=True)
    cfg = support.Daemon(os.path.join(d, "bad"), "  bad:\n    kind: sql\n    connection: \"%s\"\n    query: \"%s\"\n    key: id\n"
                            "    columns: {payload: blob, diag: label}\n" % (conn, QUERY))
    p = subprocess.run([cfg.bin, "--config", cfg.config, "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "dataset 'bad'" in p.stderr and 'password authentication failed for user "loaderd"' in p.stderr, p.stderr
    assert PASSWORD not in p.stderr + p.stdout
