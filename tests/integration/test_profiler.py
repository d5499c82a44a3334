"""torch.profiler with ProfilerActivity.HPU (Intel's "Profiling with PyTorch" recipe): the trace it
writes holds the simulated Gaudi's lanes beside the CPU activity, key_averages() reports device
time, and Holistic Trace Analysis loads a 2-rank trace and runs its overlap and idle-time analyses."""

from __future__ import annotations

import json
import sys
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import hpu_runtime
from hpu_runtime import reset_device
from tests.integration.launch_helpers import run

GRAD_BYTES = (256 * 256 + 256 + 256 * 16 + 16) * 4  # the DDP model of scripts/profile_ddp.py, fp32


def test_hpu_activity_records_device_time_and_lanes(tmp_path) -> None:
    reset_device("gaudi2")
    model = torch.nn.Linear(64, 32).to("hpu")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU]) as prof:
        for _ in range(2):
            model(torch.randn(8, 64).to("hpu")).sum().backward()
            hpu_runtime.mark_step()
    rows = [e for e in prof.key_averages() if e.key.startswith("recipe_")]
    assert rows and all(e.device_time_total > 0 for e in rows) and sum(e.count for e in rows) >= 2
    assert "Self HPU time total" in prof.key_averages().table(sort_by="device_time_total", row_limit=5)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"host (simulated)", "compute stream", "collective stream"} <= threads
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all(e["args"]["stream"] == 1 for e in kernels)
    assert any(e.get("cat") == "cpu_op" and e["name"].startswith("aten::") for e in events)  # CPU activity too


def test_two_rank_trace_has_device_lanes_collectives_and_loads_in_hta(tmp_path) -> None:
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "tests/integration/scripts/profile_ddp.py", str(tmp_path)], timeout=150)
    assert out.returncode == 0, out.stderr[-4000:]
    files = sorted(tmp_path.glob("rank*.pt.trace.json"))
    assert len(files) == 2
    for rank, f in enumerate(files):
        trace = json.loads(f.read_text())
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["backend"] == "hccl"
        events = trace["traceEvents"]
        procs = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert f"HPU {rank} (simulated Gaudi, simulated time)" in procs
        colls = [e for e in events if e.get("cat") == "kernel" and e["args"].get("stream") == 2]
        assert len(colls) == 2 and all(e["args"]["bytes"] == GRAD_BYTES and e["dur"] > 0 for e in colls)
        graphs = [e for e in events if e.get("cat") == "kernel" and e["args"].get("stream") == 1]
        assert graphs and all(e["name"].startswith("recipe_") for e in graphs)
        launches = {e["args"]["correlation"] for e in events if e.get("name") == "hpuLaunch"}
        assert launches == {e["args"]["correlation"] for e in colls + graphs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from hta.trace_analysis import TraceAnalysis

        analysis = TraceAnalysis(trace_dir=str(tmp_path))
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        idle = analysis.get_idle_time_breakdown(visualize=False)[0]
    assert sorted(overlap["rank"]) == [0, 1] and overlap["comp_comm_overlap_pctg"].between(0, 100).all()
    assert set(idle["stream"]) == {1, 2} and (idle["idle_time"] >= 0).all()
    from hpu_runtime.tools.trace_plot import device_lanes, plot

    _, lanes = device_lanes(json.loads(files[0].read_text()))
    assert len(lanes["collective"]) == 2 and lanes["compute"] and lanes["host"]
    assert plot(tmp_path / "lanes.png", files).stat().st_size > 10_000


def test_lightning_habana_hpu_profiler_writes_the_device_lanes(tmp_path) -> None:
    out = run([sys.executable, "tests/integration/scripts/lightning_hpu_profiler.py", str(tmp_path)], timeout=150)
    assert out.returncode == 0, out.stderr[-4000:]
    files = list(tmp_path.rglob("*.pt.trace.json"))
    assert files
    events = json.loads(files[0].read_text())["traceEvents"]
    assert "HPU 0 (simulated Gaudi, simulated time)" in {e["args"]["name"] for e in events
                                                          if e.get("name") == "process_name"}
    assert any(e.get("pid") == 1 << 20 and e.get("ph") == "X" for e in events)  # the simulated host lane


def _matmul_relu_sum(x, w):
    return (x @ w).relu().sum()


def _op_names(prof) -> list[str]:
    return sorted(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU
                  and not e.is_python_function and not e.name.startswith("ProfilerStep"))


def test_a_profile_holds_the_scripts_ops_and_frames_not_the_emulators(tmp_path) -> None:
    """On a Gaudi the profiler records the ops a script dispatches, not the bridge's C++ work:
    the same function on hpu tensors (then mark_step) records no op a run on CPU tensors with
    the bridge off does not (the reference: torch's own recording), no ``PythonDispatchMode``
    and, with ``with_stack=True``, no Python frame of the emulator, while the script's own
    frame stays (NOTE [the user's frames, not the emulator's] in hpu_runtime.api.profiler)."""
    from collections import Counter

    from hpu_runtime.bridge import dispatch

    reset_device("gaudi2")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    xh, wh = x.to("hpu"), w.to("hpu")
    dispatch.deactivate()
    try:
        with profile(activities=[ProfilerActivity.CPU]) as ref:
            _matmul_relu_sum(x, w)
    finally:
        dispatch.activate()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU], with_stack=True) as prof:
        out = _matmul_relu_sum(xh, wh)
        hpu_runtime.mark_step()
    assert out.item() == _matmul_relu_sum(x, w).item()
    names = _op_names(prof)
    assert "aten::mm" in names and "aten::sum" in names
    assert not Counter(names) - Counter(_op_names(ref)), (names, _op_names(ref))
    assert "PythonDispatchMode" not in {e.key for e in prof.key_averages()}
    ours = [e.name for e in prof.events() if e.is_python_function and "hpu_runtime/" in e.name]
    assert not ours, ours[:5]
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    frames = [e["name"] for e in events if e.get("cat") == "python_function"]
    assert any(f.endswith(": _matmul_relu_sum") for f in frames)
    ours = [f for f in frames if ("hpu_runtime/" in f and "habana_frameworks" not in f) or "hccl/" in f]
    assert not ours, ours[:5]
    ids = {e["args"]["Python id"] for e in events if e.get("cat") == "python_function"}
    assert all(e["args"]["Python parent id"] in ids | {None} for e in events if e.get("cat") == "python_function")
    assert any(e.get("cat") == "kernel" for e in events)  # the device lanes are still there


def test_unrecorded_nests_and_turns_recording_back_on() -> None:
    from hpu_runtime.bridge.unrecorded import unrecorded

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with unrecorded():
            torch.ones(3).add(1)
            with unrecorded():
                torch.ones(3).mul(2)
            torch.ones(3).sub(1)
        torch.ones(3).div(2)
    names = {e.name for e in prof.events()}
    assert "aten::div" in names and not {"aten::add", "aten::mul", "aten::sub"} & names


def test_host_work_under_bridge_disabled_is_recorded_the_collectives_own_ops_are_not() -> None:
    """``bridge_disabled`` wraps the script's host work (``models.train``'s data loading, tensor
    printing), which a Gaudi profile records; a collective's own copies and reductions
    (``_EmulatorOps``) are the emulator's and are not recorded."""
    from hccl.process_group import _EmulatorOps

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with hpu_runtime.bridge_disabled():
            torch.ones(3).add(1)
        with _EmulatorOps(1):
            torch.ones(3).mul(2)
    names = {e.name for e in prof.events()}
    assert "aten::add" in names and "aten::mul" not in names
