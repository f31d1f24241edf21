"""A reload that narrows `access:` while a trainer reads, seen from Python.

The trainer runs as a second user (root passes every rule); the daemon's config lets it
read `records` and `open`, then a reload lets only root read `records`. The trainer's next
batch of `records` raises PermissionDenied naming the rule: at once, not after the
client's timeout, over the shared-memory hand-off (the default) and over the socket. Its
stream on `open` and root's stream on `records` read on; the stop is clean (nothing in
/dev/shm). Needs root (to create the user); skipped otherwise.
"""
import grp
import os
import pwd
import shutil
import subprocess
import sys
import time

import pytest

import support

USER, GROUP = "ldtest-trainer", "ldtest-svc"   # the integration tests' (tests/integration)

DATASETS = "  records:\n    kind: files\n    path: rec\n  open:\n    kind: files\n    path: rec\n"
HEAD = ("  workers: 1\n  memory_budget: 64MiB\n  socket_group: %s\n"
        "access:\n  operators: {users: [root]}\n  connect: {users: [%s]}\n" % (GROUP, USER))

# The trainer: reads a batch of each stream, says "ready", waits for a line, then asks for
# batches of `records` until one fails (the hand-off may hold a batch published before the
# reload), and one more of `open`.
TRAINER = r"""
import sys, time
import loaderclient
c = loaderclient.Client(sys.argv[1], timeout=20, name="py-narrowed")
rec = c.open("records", batch_size=10, handoff=sys.argv[2])
opn = c.open("open", batch_size=10, handoff=sys.argv[2])
rec.next(); opn.next()
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    for _ in range(64):
        rec.next()
    print("no error after 64 batches", flush=True)
except loaderclient.PermissionDenied as e:
    print("denied in %.1f s: %s" % (time.monotonic() - t0, e), flush=True)
except Exception as e:
    print("%s: %s" % (type(e).__name__, e), flush=True)
try:
    rec.next()
    print("asked again: a batch", flush=True)
except loaderclient.PermissionDenied as e:
    print("again denied", flush=True)
rec.close()
opn.next()
print("open reads on", flush=True)
c.close()
"""


def _test_user():
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    for _ in range(50):     # useradd and groupadd lock /etc/passwd: another test may hold it
        try:
            return pwd.getpwnam(USER).pw_uid, grp.getgrnam(GROUP).gr_gid
        except KeyError:
            pass
        try:
            grp.getgrnam(GROUP)
            subprocess.run(["/usr/sbin/useradd", "-r", "-M", "-N", "-g", GROUP, "-s", "/usr/sbin/nologin", USER],
                           capture_output=True)
        except KeyError:
            subprocess.run(["/usr/sbin/groupadd", "-r", GROUP], capture_output=True)
        time.sleep(0.1)
    pytest.fail("cannot create the test user %s in group %s" % (USER, GROUP))


def _package_copy(where):
    """The package and the library under test copied where the second user can read them
    (the checkout may lie in a directory only its owner enters); the environment that
    imports that copy."""
    import loaderclient
    from loaderclient import _lib
    pkg = os.path.join(where, "loaderclient")
    shutil.copytree(os.path.dirname(loaderclient.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = os.path.join(pkg, os.path.basename(_lib.find_library()[1]))
    shutil.copy(_lib.find_library()[1], lib)
    for top, dirs, files in os.walk(where):
        os.chmod(top, 0o755)
        for f in files:
            os.chmod(os.path.join(top, f), 0o644)
    env = dict(os.environ)
    env["PYTHONPATH"] = where
    env["LOADERCLIENT_LIB"] = lib
    return env


@pytest.fixture(scope="module")
def acl_daemon():
    uid, gid = _test_user()
    d = support.short_tmpdir("lc-acl.")
    os.chmod(d, 0o711)
    support.gen_files(os.path.join(d, "rec"), 200, 64, 4)
    dm = support.Daemon(d, DATASETS, server_extra=HEAD)
    dm.start()
    dm.trainer_env = _package_copy(os.path.join(d, "py"))
    yield dm, uid, gid
    dm.stop_clean()
    support.rmtree(d)


def _reload(dm, datasets_rule):
    """Rewrites the access rules (connect as at start, `datasets_rule` added) and reloads."""
    import loaderclient
    with open(dm.config) as f:
        text = f.read()
    start, end = text.index("access:\n"), text.index("\ndatasets:\n") + 1
    rules = "access:\n  operators: {users: [root]}\n  connect: {users: [%s]}\n%s" % (USER, datasets_rule)
    with open(dm.config, "w") as f:
        f.write(text[:start] + rules + text[end:])
    with loaderclient.Client(dm.socket, timeout=10) as c:
        return c.request({"op": "reload"})


@pytest.mark.parametrize("handoff", ["shm", "socket"])
def test_reload_narrows_a_dataset(acl_daemon, handoff):
    import loaderclient
    dm, uid, gid = acl_daemon
    root = loaderclient.Client(dm.socket, timeout=10, name="py-root")
    rs = root.open("records", batch_size=10, handoff=handoff)
    rs.next()
    p = subprocess.Popen([sys.executable, "-c", TRAINER, dm.socket, handoff], env=dm.trainer_env, user=uid,
                         group=gid,
                         extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        assert line == "ready\n", line + p.stderr.read()
        r = _reload(dm, "  datasets:\n    records: {users: [0]}\n")
        assert r["streams_denied"] == 1 and r["connections_denied"] == 0, r
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        r = _reload(dm, "")         # as at start, for the next run
    lines = out.splitlines()
    assert len(lines) == 3, out + err
    assert lines[0].startswith("denied in "), out + err
    assert "(%s), gid " % USER in lines[0], lines[0]
    assert "may no longer read dataset 'records': a reload narrowed access.datasets.records " \
           "(it allows users 0 (root)); the stream was closed" in lines[0], lines[0]
    assert lines[1:] == ["again denied", "open reads on"], out + err
    rs.next()                       # root reads on
    rs.close()
    root.close()
