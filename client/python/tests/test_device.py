"""The GPU path of the Python client, as a host without a GPU sees it: every device call
raises DeviceError saying why (torch without CUDA, a stream without a device, the daemon
or this process without a driver), and nothing is left open. No test pretends a GPU
exists; on a GPU host the tests that need its absence are skipped (scripts/gpu-check.sh
covers that host)."""
import os

import pytest

torch = pytest.importorskip("torch")

import loaderclient
from loaderclient import DeviceError, InvalidArgument
from loaderclient.torch import LoaderdDataLoader

no_gpu = pytest.mark.skipif(os.path.exists("/dev/nvidiactl") or torch.cuda.is_available(),
                            reason="a GPU is present: scripts/gpu-check.sh tests this host")


@no_gpu
def test_batch_torch_device_raises(client):
    with client.open("rec", 8, epochs=1) as s:
        assert s.device_index is None
        b = s.next()
        with pytest.raises(DeviceError, match=r"torch has no usable CUDA here"):
            b.torch("data", device="cuda")
        with pytest.raises(DeviceError, match=r"torch has no usable CUDA here"):
            b.torch("data", device="cuda:0")
        with pytest.raises(InvalidArgument, match=r"CUDA devices only"):
            b.torch("data", device="meta")
        # The host path is unchanged.
        assert b.torch("data").shape[0] == 8
        assert b.torch("data", device="cpu").shape[0] == 8
        b.release()


@no_gpu
def test_open_with_device_raises(client):
    with pytest.raises(DeviceError) as ei:
        client.open("rec", 8, device="cuda:0")
    assert ei.value.name == "device_error"
    assert "device: cuda:0: " in ei.value.message
    assert "no NVIDIA driver" in ei.value.message or "built without CUDA" in ei.value.message
    # transfer "client": the daemon serves the stream, this process has no GPU.
    with pytest.raises(DeviceError, match=r"device: cuda:0: (no NVIDIA driver in this process|.*built without CUDA)"):
        client.open("rec", 8, device="cuda:0", transfer="client")
    with pytest.raises(InvalidArgument, match=r"transfer must be 'ipc' or 'client'"):
        client.open("rec", 8, device="cuda:0", transfer="nvlink")
    with pytest.raises(InvalidArgument, match=r"field 'device'"):
        client.open("rec", 8, device="gpu0")
    # The connection still serves host streams.
    with client.open("rec", 8, epochs=1) as s:
        assert s.next().rows == 8


@no_gpu
def test_loader_device_cuda_raises(daemon):
    with pytest.raises(DeviceError, match=r"LoaderdDataLoader\(device='cuda'\): torch has no usable CUDA here"):
        LoaderdDataLoader("rec", 8, socket=daemon.socket, device="cuda")
    with pytest.raises(DeviceError, match=r"LoaderdDataLoader\(device='cuda:1'\)"):
        LoaderdDataLoader("rec", 8, socket=daemon.socket, device="cuda:1", transfer="client")
    ld = LoaderdDataLoader("rec", 8, socket=daemon.socket, device="cpu", timeout=10)
    data, label = next(iter(ld))
    assert data.device.type == "cpu"
    ld.close()


def test_device_error_is_in_the_table():
    assert loaderclient.errors.make_error(loaderclient.errors.EDEVICE, "x").__class__ is DeviceError
    assert loaderclient.error_name(loaderclient.errors.EDEVICE) == "device_error"
