"""bench_device.py without a GPU: it says why, skips, exits 0 and writes its result files
saying so (make bench's GPU part on a machine like the development one)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "bench_device.py")


def torch_has_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(torch_has_gpu(), reason="a GPU is present: the skip path does not run here")
def test_skips_without_gpu(tmp_path):
    env = dict(os.environ, BENCH_ARGS="", BENCH_DEVICE_ARGS="")
    r = subprocess.run([sys.executable, SCRIPT, "--results-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "no GPU" in r.stderr and "skipping" in r.stderr
    with open(tmp_path / "device.json") as f:
        res = json.load(f)
    assert res["skipped"]
    assert "torch" in res["skipped"] or "CUDA" in res["skipped"]
    md = (tmp_path / "device.md").read_text()
    assert md.startswith("# Device stage vs DataLoader(pin_memory=True)")
    assert "no GPU: skipped (" in md
    # Nothing of a measurement was attempted: no data generated, no daemon log.
    assert not (tmp_path / "device-raw").exists()
