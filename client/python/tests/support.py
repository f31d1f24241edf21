"""Test support: datasets whose every byte is known, and a loaderd child process.

The data rules are tools/gendata.c's (GENDATA_VERSION 1), also documented in
tests/integration/harness.h:
  splitmix64(x)   the usual 64-bit mixer, all arithmetic mod 2^64
  files           file i of n is DIR/class_CCC/IIIIIII.bin (CCC = i % classes), or
                  DIR/IIIIIII.bin without classes; its size is `size`, or with vary
                  size//2 + splitmix64(i ^ 0x5A5A5A5A5A5A5A5A) % (size + 1); byte j is
                  byte j % 8 (little-endian) of splitmix64(i * 1000003 + j // 8).
                  loaderd's label of file i is i % classes.
  tokens          token k is splitmix64(k) % vocab (uint16 or uint32, native order).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_M64 = (1 << 64) - 1


def splitmix64(x):
    """Vectorized splitmix64 of a uint64 array (wraps mod 2^64)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def splitmix64_int(x):
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def file_size(i, size, vary):
    if not vary:
        return size
    return size // 2 + splitmix64_int(i ^ 0x5A5A5A5A5A5A5A5A) % (size + 1)


def file_bytes(i, size, vary=False):
    """The content of file i (a uint8 array)."""
    n = file_size(i, size, vary)
    words = splitmix64(np.uint64((i * 1000003) & _M64) + np.arange((n + 7) // 8, dtype=np.uint64))
    return words.astype("<u8").view(np.uint8)[:n]


def file_word0(i):
    """The first 8 bytes of file i as an int: identifies the file."""
    return int(splitmix64_int((i * 1000003) & _M64))


def _width(v, minimum):
    return max(minimum, len(str(max(v - 1, 0))))


def gen_files(d, n, size, classes=10, vary=False):
    """Writes a files dataset as ld-gendata would (without its .complete marker)."""
    fw = _width(n, 7)
    cw = _width(classes, 3) if classes else 0
    for c in range(classes):
        os.makedirs(os.path.join(d, "class_%0*d" % (cw, c)), exist_ok=True)
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        sub = ("class_%0*d" % (cw, i % classes)) if classes else ""
        with open(os.path.join(d, sub, "%0*d.bin" % (fw, i)), "wb") as f:
            f.write(file_bytes(i, size, vary).tobytes())


def tokens(start, count, vocab=50257, dtype=np.uint16):
    return (splitmix64(np.arange(start, start + count, dtype=np.uint64)) % np.uint64(vocab)).astype(dtype)


def gen_tokens(path, n, vocab=50257, dtype=np.uint16):
    tokens(0, n, vocab, dtype).tofile(path)


def binaries():
    """(loaderd, ld-gendata): $LOADERD_BIN (relative to the cwd or the repository), else build/bin."""
    b = os.environ.get("LOADERD_BIN", "build/bin/loaderd")
    if not os.path.isabs(b) and not os.path.exists(b):
        b = os.path.join(REPO, b)
    b = os.path.abspath(b)
    return b, os.path.join(os.path.dirname(b), "ld-gendata")


def short_tmpdir(prefix="lc-py."):
    """A temporary directory short enough for a Unix socket path inside it (107 bytes)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    if len(base) > 60 or not os.path.isdir(base):
        base = "/tmp"
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def shm_left(pid):
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith("loaderd.%d." % pid))
    except FileNotFoundError:
        return []


class Daemon:
    """loaderd on a private socket, with a config written from `datasets` (YAML text,
    entries indented by two spaces; relative paths are taken from `directory`)."""

    def __init__(self, directory, datasets, server_extra="  workers: 2\n  memory_budget: 128MiB\n  prefetch: 4\n",
                 env=None):
        self.dir = directory
        self.env = env              # added to the environment the daemon starts with
        self.socket = os.path.join(directory, "s.sock")
        self.config = os.path.join(directory, "loaderd.yaml")
        self.log = os.path.join(directory, "loaderd.log")
        self.bin = binaries()[0]
        with open(self.config, "w") as f:
            f.write("server:\n  socket: %s\n  log_level: warn\n%sdatasets:\n%s" % (self.socket, server_extra, datasets))
        self.proc = None

    def start(self, timeout=10.0):
        if not os.path.exists(self.bin):
            raise RuntimeError("loaderd not found at %s: build it (make) or set LOADERD_BIN" % self.bin)
        logf = open(self.log, "wb")
        self.proc = subprocess.Popen([self.bin, "--config", self.config], stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, **(self.env or {})))
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("loaderd exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return self
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        self.kill()
        raise RuntimeError("loaderd did not listen on %s within %.0f s:\n%s" % (self.socket, timeout, self.log_text()))

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout=10.0):
        """SIGTERM; the exit status (0 for a clean stop)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -1

    def stop_clean(self):
        """SIGTERM, and asserts a clean stop: exit status 0 and nothing of the daemon
        left in /dev/shm (a daemon that did not stop is killed first)."""
        rc = self.stop()
        left = shm_left(self.pid)
        self.kill()
        assert rc == 0, "loaderd exited with %s:\n%s" % (rc, self.log_text())
        assert left == [], "loaderd left %s in /dev/shm" % left

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
            except OSError:
                pass
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            # A killed daemon cannot clean up: remove what it left (only its own names).
            for n in shm_left(self.proc.pid):
                try:
                    os.unlink(os.path.join("/dev/shm", n))
                except OSError:
                    pass


def rmtree(d):
    shutil.rmtree(d, ignore_errors=True)


def _python_env(env):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(REPO, "client", "python") + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    return e


def run_python(code, env=None, timeout=60):
    """Runs code in a fresh interpreter (the same one) with the package importable."""
    return subprocess.run([sys.executable, "-c", code], env=_python_env(env), capture_output=True, text=True,
                          timeout=timeout)


def start_python(code, *args, env=None):
    """Starts code in a fresh interpreter (sys.argv[1:] = args); stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-c", code] + [str(a) for a in args], env=_python_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
