"""A virtual environment with numpy 2 from PyPI (the numpy most trainers have; Debian 12's
is 1.24), under build/, for test_numpy2.py: made the first time it is needed, or by
`scripts/deps.sh test` (`python3 client/python/tests/np2env.py`) so that the download is
not counted in the tests' time. Without a network the test says why it is skipped.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
VENV = os.path.join(REPO, "build", "np2venv")
READY = os.path.join(VENV, ".ready")        # written once numpy 2 is in (deps.sh looks for it)
NUMPY_SPEC = "numpy>=2,<3"


def python():
    return os.path.join(VENV, "bin", "python")


def _numpy_version():
    try:
        p = subprocess.run([python(), "-c", "import numpy, setuptools, wheel; print(numpy.__version__)"],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def ensure_installed():
    """The environment's python, installing numpy 2 (and setuptools and wheel, to build the
    package without build isolation) when missing; None, with the reason as second value, when it
    cannot be had here (no network, no venv module)."""
    if os.path.exists(READY) and os.path.exists(python()):
        return python(), None
    try:
        if not os.path.exists(python()):
            # Debian's python3, whose headers (python3-dev) the extension builds against;
            # no system site packages: numpy 1.24 must not be found.
            subprocess.run(["/usr/bin/python3", "-m", "venv", VENV], check=True, capture_output=True, timeout=120)
        p = subprocess.run([python(), "-m", "pip", "install", "-q", "--timeout", "15", "--retries", "1", NUMPY_SPEC,
                            "setuptools", "wheel"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            return None, "pip install %s failed: %s" % (NUMPY_SPEC, (p.stderr or p.stdout).strip()[-400:])
    except (OSError, subprocess.SubprocessError) as e:
        return None, "cannot make the virtual environment %s: %s" % (VENV, e)
    v = _numpy_version()
    if not v or int(v.split(".")[0]) < 2:
        return None, "numpy 2 missing from %s after pip install (found %r)" % (VENV, v)
    with open(READY, "w") as f:
        f.write(v + "\n")
    return python(), None


if __name__ == "__main__":
    py, why = ensure_installed()
    if why:
        print("np2env: " + why, file=sys.stderr)
        sys.exit(1)
    print(py)
