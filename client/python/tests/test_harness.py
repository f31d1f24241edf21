"""The test run's own safeguards: a deadlocked test fails (deadline.py) instead of hanging."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

STUCK = '''
import queue


def test_stuck():
    q = queue.Queue(maxsize=1)
    q.put(1)
    q.put(2)          # nobody takes it: blocks forever


def test_after():
    pass
'''


def test_a_deadlocked_test_fails_instead_of_hanging(scratch):
    (scratch / "test_stuck.py").write_text(STUCK)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LOADERCLIENT_TEST_TIMEOUT="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "deadline", "-p", "no:cacheprovider",
                        "--rootdir", str(scratch), str(scratch)], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(scratch))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "1 failed, 1 passed" in p.stdout, p.stdout
    assert "the test ran past its 1 s limit" in p.stdout, p.stdout
    assert "(most recent call first)" in p.stdout + p.stderr   # every thread's stack, for the post-mortem


# scripts/run-tests.sh with TEST_JOBS=2, on programs that speak cmocka's summary lines:
# itest_a and itest_b each wait for the other to have started (they pass only when run
# together), itest_sched passes only when nothing else runs (run-tests.sh runs it alone),
# itest_c fails. Each marks itself running while it runs.
FAKE = """#!/bin/sh
touch running.$NAME started.$NAME
%s
rm -f running.$NAME
"""
WAIT_FOR = """i=0
until [ -e started.%s ]; do
  i=$((i + 1)); [ $i -gt 600 ] && { echo "[  FAILED  ] 1 test(s)."; rm -f running.$NAME; exit 1; }
  sleep 0.05
done
echo "[  PASSED  ] 1 test(s)." """
ALONE = """others=$(ls running.* | grep -vx running.$NAME)
if [ -n "$others" ]; then echo "[  FAILED  ] 2 test(s)."; rm -f running.$NAME; exit 1; fi
echo "[  PASSED  ] 2 test(s)." """
RUNNER = os.path.join(HERE, "..", "..", "..", "scripts", "run-tests.sh")


def test_run_tests_runs_a_group_two_at_a_time_in_order(scratch):
    progs = {"itest_a": WAIT_FOR % "itest_b", "itest_b": WAIT_FOR % "itest_a",
             "itest_c": 'echo "[  FAILED  ] 1 test(s)."; rm -f running.$NAME; exit 1',
             "itest_sched": ALONE, "itest_z": ALONE.replace("2 test(s)", "3 test(s)")}
    (scratch / "b" / "test").mkdir(parents=True)
    for name, body in progs.items():
        p = scratch / "b" / "test" / name
        p.write_text((FAKE % body).replace("$NAME", name))
        p.chmod(0o755)
    env = dict(os.environ, TEST_JOBS="2")
    p = subprocess.run(["bash", RUNNER, "b", "integration"], env=env, capture_output=True, text=True,
                       timeout=120, cwd=str(scratch))
    assert p.returncode == 1, p.stdout + p.stderr
    out = p.stdout
    # Each program's output whole, in the group's order, with its time line.
    starts = [out.index("== b/test/%s\n" % n) for n in sorted(progs)]
    assert starts == sorted(starts), out
    for n in progs:
        assert "== b/test/%s: " % n in out and " s, CPU " in out.split("== b/test/%s: " % n)[1].split("\n")[0]
    assert "failed: b/test/itest_c (exit 1)" in out, out
    assert "\nb: 7 passed, 1 failed\n" in out, out
    assert "b integration: " in out and "(2 at a time)" in out, out
    fields = (scratch / "build" / "test-summary").read_text().split()
    assert fields[:3] == ["7", "1", "0"] and fields[5:] == ["b", "integration"], fields
    t = subprocess.run(["bash", RUNNER, "--total"], capture_output=True, text=True, timeout=30, cwd=str(scratch))
    assert t.returncode == 1 and t.stdout.splitlines()[-1] == "make test: 7 passed, 1 failed", t.stdout
    assert "time: b integration" in t.stdout, t.stdout
