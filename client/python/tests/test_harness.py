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
