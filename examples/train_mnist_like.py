#!/usr/bin/python3
"""Train a tiny MLP on an MNIST-like dataset served by loaderd (and, with --dataloader, the
same from torch's DataLoader over the same files, for comparison).

The data: 28x28 = 784-byte grey "images" in 10 classes, one file per image in
DATA/class_C/NNNNNNN.bin (the layout of loaderd's `files` datasets: the label is the
class folder). Each class has its own pattern of bright strokes; an image is its class's
pattern, randomly shifted and scaled, over a fainter pattern of another class, plus
noise: learnable, but not trivially. Generated
once, deterministically, by this script (numpy only).

    # with a loaderd you run yourself, configured with
    #   datasets: {mnist_like: {kind: files, path: DATA, pattern: "*.bin"}}
    /usr/bin/python3 examples/train_mnist_like.py --socket /path/to/loaderd.sock
    # or let the script start (and stop) build/bin/loaderd on a temporary socket
    /usr/bin/python3 examples/train_mnist_like.py --spawn-daemon --dataloader

Per epoch it prints the time, the mean loss, the training accuracy and the time the loop
spent waiting for data (blocked in next()).
"""
import argparse
import os
import shutil
import signal
import socket as socketmod
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SIDE = 28
CLASSES = 10
FORMAT = "mnist_like v2"


# ---------------------------------------------------------------------------------------
# the data

def class_patterns(seed=1234):
    """One 28x28 float pattern per class: a few strokes between class-specific points."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    pats = np.zeros((CLASSES, SIDE, SIDE), np.float32)
    for c in range(CLASSES):
        pts = rng.uniform(5, SIDE - 5, size=(4, 2))
        for (y0, x0), (y1, x1) in zip(pts[:-1], pts[1:]):
            for t in np.linspace(0, 1, 24):
                y, x = y0 + t * (y1 - y0), x0 + t * (x1 - x0)
                pats[c] += np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / 2.0)
        pats[c] = 255 * np.clip(pats[c] / pats[c].max() * 1.4, 0, 1)
    return pats


def generate(data_dir, count, seed=0):
    """Writes `count` images (image i is of class i % 10) unless they are already there."""
    marker = os.path.join(data_dir, ".complete")
    want = "%s count=%d seed=%d\n" % (FORMAT, count, seed)
    if os.path.exists(marker) and open(marker).read() == want:
        return False
    if os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    pats = class_patterns()
    rng = np.random.default_rng(seed)
    for c in range(CLASSES):
        os.makedirs(os.path.join(data_dir, "class_%d" % c))
    for i in range(count):
        c = i % CLASSES
        other = (c + rng.integers(1, CLASSES)) % CLASSES    # a fainter distractor of another class
        img = np.roll(pats[c], tuple(rng.integers(-3, 4, size=2)), axis=(0, 1)) * rng.uniform(0.4, 1.0)
        img += np.roll(pats[other], tuple(rng.integers(-3, 4, size=2)), axis=(0, 1)) * rng.uniform(0.0, 0.6)
        img = np.clip(img + rng.normal(0, 70, size=img.shape), 0, 255).astype(np.uint8)
        img.tofile(os.path.join(data_dir, "class_%d" % c, "%07d.bin" % i))
    with open(marker, "w") as f:
        f.write(want)
    return True


# ---------------------------------------------------------------------------------------
# the daemon (--spawn-daemon)

class SpawnedDaemon:
    def __init__(self, build_dir, data_dir):
        self.bin = os.path.join(build_dir, "bin", "loaderd")
        if not os.path.exists(self.bin):
            sys.exit("train_mnist_like: %s not found: run `make` first (or give --build-dir)" % self.bin)
        self.dir = tempfile.mkdtemp(prefix="ld-example.", dir="/tmp")
        self.socket = os.path.join(self.dir, "loaderd.sock")
        self.config = os.path.join(self.dir, "loaderd.yaml")
        with open(self.config, "w") as f:
            f.write("server:\n  socket: %s\n  workers: 2\n  memory_budget: 256MiB\n  log_level: warn\n"
                    "datasets:\n  mnist_like:\n    kind: files\n    path: %s\n    pattern: \"*.bin\"\n"
                    % (self.socket, os.path.abspath(data_dir)))
        self.proc = subprocess.Popen([self.bin, "--config", self.config])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit("train_mnist_like: loaderd exited with status %d" % self.proc.returncode)
            s = socketmod.socket(socketmod.AF_UNIX)
            try:
                s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.05)
            finally:
                s.close()
        self.stop()
        sys.exit("train_mnist_like: loaderd did not start listening within 60 s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


# ---------------------------------------------------------------------------------------
# training

def train(name, loader, epochs, set_epoch=None):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(SIDE * SIDE, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        if set_epoch:
            set_epoch(epoch)
        t_start = time.perf_counter()
        waited = loss_sum = 0.0
        correct = seen = steps = 0
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                waited += time.perf_counter() - t0
                break
            waited += time.perf_counter() - t0
            x = images.float().div_(255)          # uint8 -> float32 makes a new tensor; then in place
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            correct += int((out.argmax(1) == labels).sum())
            seen += labels.shape[0]
            steps += 1
        took = time.perf_counter() - t_start
        print("%-22s epoch %d: %6.2f s  loss %.4f  accuracy %5.1f%%  waited for data %.3f s (%.1f%%)"
              % (name, epoch + 1, took, loss_sum / max(steps, 1), 100.0 * correct / max(seen, 1), waited,
                 100.0 * waited / took), flush=True)


def torch_dataloader(data_dir, batch_size, workers):
    import torch
    files = []
    for c in range(CLASSES):
        sub = os.path.join(data_dir, "class_%d" % c)
        files += [(os.path.join(sub, f), c) for f in sorted(os.listdir(sub)) if f.endswith(".bin")]

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            path, label = files[i]
            return torch.from_numpy(np.fromfile(path, np.uint8)), label

    return torch.utils.data.DataLoader(Images(), batch_size=batch_size, shuffle=True, num_workers=workers)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.path.join(REPO, "build", "example-data", "mnist_like"),
                   help="where the images are (generated when missing; default build/example-data/mnist_like)")
    p.add_argument("--count", type=int, default=10000, help="images to generate (default 10000)")
    p.add_argument("--socket", help="loaderd's socket (default: the client's default socket)")
    p.add_argument("--dataset", default="mnist_like", help="the dataset's name in loaderd (default mnist_like)")
    p.add_argument("--spawn-daemon", action="store_true", help="start build/bin/loaderd for the run, stop it after")
    p.add_argument("--build-dir", default=os.path.join(REPO, os.environ.get("BUILD", "build")))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dataloader", action="store_true", help="also train from torch's DataLoader")
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers (default 0)")
    args = p.parse_args()

    lib = os.path.join(args.build_dir, "lib", "libloaderclient.so")
    if "LOADERCLIENT_LIB" not in os.environ and os.path.exists(lib):
        os.environ["LOADERCLIENT_LIB"] = lib
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import loaderclient
    from loaderclient.torch import LoaderdDataLoader

    if generate(args.data_dir, args.count):
        print("generated %d images in %s" % (args.count, args.data_dir))
    daemon = SpawnedDaemon(args.build_dir, args.data_dir) if args.spawn_daemon else None
    rc = 0
    try:
        sock = daemon.socket if daemon else args.socket
        try:
            loader = LoaderdDataLoader(args.dataset, args.batch_size, shuffle=True, seed=0, socket=sock)
            n = len(loader)
        except loaderclient.ConnectError as e:
            sys.exit("train_mnist_like: %s\n(start loaderd, pass --socket, or use --spawn-daemon)" % e.message)
        except loaderclient.DatasetNotFound:
            sys.exit("train_mnist_like: loaderd has no dataset %r; add to its config:\n"
                     "datasets:\n  %s:\n    kind: files\n    path: %s\n    pattern: \"*.bin\"%s"
                     % (args.dataset, args.dataset, os.path.abspath(args.data_dir),
                        "" if daemon else "\n(or use --spawn-daemon)"))
        print("loaderd: %d batches of %d per epoch" % (n, args.batch_size))
        with loader:
            train("loaderd", loader, args.epochs, loader.set_epoch)
        if args.dataloader:
            train("DataLoader(workers=%d)" % args.workers,
                  torch_dataloader(args.data_dir, args.batch_size, args.workers), args.epochs)
    finally:
        if daemon:
            rc = daemon.stop()
            if rc != 0:
                print("train_mnist_like: loaderd exited with status %s" % rc, file=sys.stderr)
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
