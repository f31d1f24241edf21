"""A time limit per test (setup, call and teardown each), so that a deadlock fails the
test instead of hanging the run: pytest-timeout is not assumed to be installed.

When a phase runs past the limit, SIGALRM raises pytest's Failed in the main thread (it
interrupts lock and queue waits, and the client's batch waits, which wake four times a
second). Should that not end it (a thread stuck in C holding what the main thread needs),
faulthandler prints every thread's stack and ends the process 30 s later.

The limit: $LOADERCLIENT_TEST_TIMEOUT seconds (default 120), or @pytest.mark.deadline(s).
Loaded by conftest.py (pytest_plugins); also usable alone with `-p deadline`.
"""
import contextlib
import faulthandler
import os
import signal
import sys

import pytest

DEFAULT_S = float(os.environ.get("LOADERCLIENT_TEST_TIMEOUT", "120"))
HARD_EXTRA_S = 30


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): time limit of each phase of this test")


def _limit(item):
    m = item.get_closest_marker("deadline")
    return float(m.args[0]) if m else DEFAULT_S


@contextlib.contextmanager
def _deadline(item, phase):
    limit = _limit(item)
    if limit <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum, frame):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pytest.fail("%s: %s ran past its %g s limit (a deadlock?); every thread's stack is on stderr"
                    % (item.nodeid, phase, limit), pytrace=True)

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + HARD_EXTRA_S, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _deadline(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _deadline(item, "the test"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _deadline(item, "teardown"):
        yield
