"""The bridge: "hpu" device strings on CPU tensors, op charging, host reads (single process)."""

from __future__ import annotations

import torch

import hpu_runtime as hpu


def test_hpu_device_strings_give_hpu_tensors():
    x = torch.randn(3, device="hpu")
    y = torch.tensor([1, 2], device=torch.device("hpu"))
    m = torch.nn.Linear(2, 2).to("hpu")
    z = torch.ones(2).to("hpu:0", torch.bfloat16)
    assert x.device == y.device == m.weight.device == z.device == torch.device("hpu", 0)
    assert z.dtype == torch.bfloat16 and x.cpu().device.type == "cpu"
    assert hpu.is_available() and hpu.current_device() == 0


def test_ops_are_charged_and_launched_at_mark_step():
    dev = hpu.reset_device("gaudi2")
    a = torch.randn(64, 64, device="hpu")
    b = a @ a
    assert any(c.engine == "MME" and c.flops == 2 * 64**3 for c in dev.pending)
    hpu.mark_step()
    assert not dev.pending and dev.graphs_launched == 1 and dev.compute.free_ns > 0
    _ = b.sum().item()  # a host read launches and waits
    assert dev.graphs_launched == 2 and dev.host_ns >= dev.compute.free_ns


def test_bridge_disabled_hides_ops():
    dev = hpu.reset_device()
    with hpu.bridge_disabled():
        torch.ones(4) + 1
    assert dev.ops_recorded == 0


def test_faster_device_gives_shorter_graph():
    """The same matmul costs less simulated time on Gaudi3 than on Gaudi."""
    times = {}
    for name in ("gaudi", "gaudi3"):
        dev = hpu.reset_device(name)
        a = torch.randn(512, 512, device="hpu")
        a @ a
        start, end = dev.launch()
        times[name] = end - start
    hpu.reset_device("gaudi2")
    assert times["gaudi3"] < times["gaudi"]


def test_fake_hpu_tensors_keep_the_strides_the_kernels_make():
    """The tracer's fake hpu tensors lay results out as the live card's (CPU) kernels do: an
    elementwise op on a transposed tensor stays transposed on both (NOTE [fake hpu tensors
    keep the CPU kernels' strides])."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 3, 4, device="hpu").transpose(1, 2)
    live = (x * 2).stride()
    with FakeTensorMode():
        fake = torch.empty_strided(x.shape, x.stride(), device="hpu")
        traced = (fake * 2).stride()
    assert traced == live == x.stride()


def _run_python(code: str):
    """``python -c code`` in a fresh process; its completed process (asserted successful)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_hpu_is_the_accelerator_even_when_asked_before_the_import():
    """A script that asks for the accelerator before importing the emulator (as
    ``dist.init_process_group("gloo")`` does) still runs backward of hpu tensors."""
    code = ("import torch\n"
            "assert torch.accelerator.current_accelerator() is None\n"
            "import hpu_runtime\n"
            "x = torch.randn(3, device='hpu', requires_grad=True)\n"
            "(x * 2).sum().backward()\n"
            "print(torch.accelerator.current_accelerator(), x.grad.device)\n")
    assert _run_python(code).stdout.split() == ["hpu", "hpu:0"]


def test_ddp_times_hpu_modules_without_a_warning():
    """DDP over hpu parameters has a timer for the device type (as Habana's hccl library
    registers one): its runtime stats are recorded, and torch does not warn that "Time stats
    are currently only collected for CPU and CUDA devices"."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import os, torch, torch.distributed as dist\n"
            "import hpu_runtime\n"
            f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{port}')\n"
            "dist.init_process_group('gloo', rank=0, world_size=1)\n"
            "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4).to('hpu'))\n"
            "for _ in range(3):\n"
            "    m(torch.randn(2, 8).to('hpu')).sum().backward()\n"
            "d = m._get_ddp_logging_data()\n"
            "print(d['avg_forward_compute_time'], d['avg_backward_compute_time'])\n"
            "dist.destroy_process_group()\n")
    out = _run_python(code)
    assert "Time stats are currently only collected" not in out.stderr
    forward, backward = (int(v) for v in out.stdout.split())
    assert forward > 0 and backward > 0
