"""The overhead benchmark's command line (wall-clock figures are its output, not asserted)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_breakdown_names_where_the_time_goes():
    """``--breakdown`` prints the plain step, the step on hpu tensors without the bridge, the
    no-op dispatch mode, the bridge with its accounting off, the bridge with its records in the
    Python hooks, the bridge and the bridge's mark_step share, each with a positive time; the launches are
    part of the step."""
    cmd = [sys.executable, "-m", "hpu_runtime.tools.bench_overhead", "--steps", "2", "--rounds", "1",
           "--hidden", "16", "--breakdown"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and parts[2].endswith("x") and not line.startswith("digits"):
            rows[parts[0].strip()] = float(parts[1])
    assert set(rows) >= {"plain", "hpu tensors, no bridge", "no-op dispatch mode", "bridge, no accounting",
                         "bridge, records in Python", "bridge", "bridge: mark_step"}, out.stdout
    assert all(v > 0 for v in rows.values())
    assert rows["bridge: mark_step"] < rows["bridge"]


def test_the_device_type_alone_trains_on_hpu_tensors_and_charges_nothing():
    """The breakdown's "hpu tensors, no bridge" step: parameters and gradients are hpu tensors,
    the step trains them (Adam moves every parameter), and the simulated card records no op
    and spends no time (the bridge is off)."""
    import torch

    import hpu_runtime as hpu
    from hpu_runtime.tools.bench_overhead import _step_fn

    dev = hpu.reset_device("gaudi2")
    hpu.deactivate()
    try:
        step = _step_fn(16, bridge=False, batch=4, device="hpu")
        params = list(step.model.parameters())
        before = [p.detach().cpu().clone() for p in params]
        now, ops = dev.now_ns(), dev.ops_recorded
        step()
        assert params and all(p.device.type == "hpu" and p.grad.device.type == "hpu" for p in params)
        assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, params))
        assert (dev.now_ns(), dev.ops_recorded) == (now, ops)
    finally:
        hpu.activate()


def test_the_no_accounting_step_records_nothing_and_charging_resumes():
    """The breakdown's "bridge, no accounting" step (the bridge's step inside the device's
    ``uncharged()``): the bridge's mode still runs it (Adam moves the parameters) but no op is
    recorded and no graph launched; afterwards the same step launches its two graphs (after
    backward, after the optimizer step) again."""
    import torch

    import hpu_runtime as hpu
    from hpu_runtime.bridge.runtime import get_device
    from hpu_runtime.tools.bench_overhead import _step_fn

    hpu.reset_device("gaudi2")
    hpu.activate()
    step = _step_fn(16, bridge=True, batch=4)
    step()
    dev = get_device()
    with hpu.bridge_disabled():
        before = [p.detach().cpu().clone() for p in step.model.parameters()]
    ops, graphs = dev.ops_recorded, dev.graphs_launched
    with dev.uncharged():
        step()
    assert (dev.ops_recorded, dev.graphs_launched) == (ops, graphs)
    with hpu.bridge_disabled():
        assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, step.model.parameters()))
    step()
    assert dev.ops_recorded > ops and dev.graphs_launched == graphs + 2


def test_the_records_in_python_step_records_what_the_kernel_records():
    """The breakdown's "bridge, records in Python" step (python_hooks_only: the kernel given no
    device): the same step records as many ops, launches as many graphs and spends as much
    simulated host time as with the kernel's records, with the Python after hook called for
    every op (against a few per step otherwise); ``breakdown`` hands the device back to the
    kernel."""
    import hpu_runtime as hpu
    from hpu_runtime.bridge import dispatch
    from hpu_runtime.bridge.runtime import get_device, python_hooks_only
    from hpu_runtime.tools import bench_overhead
    from hpu_runtime.tools.bench_overhead import _step_fn

    hpu.reset_device("gaudi2")
    hpu.activate()
    lib = dispatch._kernel_hooks()
    calls = []

    def spy(*args):
        calls.append(args[0])
        return dispatch._after(*args)

    def measured():
        dev = get_device()
        ops, graphs, host, n = dev.ops_recorded, dev.graphs_launched, dev.host_ns, len(calls)
        step()
        return (dev.ops_recorded - ops, dev.graphs_launched - graphs, dev.host_ns - host), len(calls) - n

    lib.hpu_sim_set_hooks(dispatch._before, spy, dispatch.OpEntry)
    try:
        step = _step_fn(16, bridge=True, batch=4)
        step(), step()
        kernel, kernel_calls = measured()
        with python_hooks_only():
            python, python_calls = measured()
        assert kernel == python and kernel[0] > 20 and kernel[1] == 2
        assert python_calls >= kernel[0] and kernel_calls < kernel[0] // 4, (python_calls, kernel_calls)
        bench_overhead.breakdown(16, steps=1, rounds=1, batch=4)
        assert measured()[1] <= kernel_calls  # the kernel records again (not one after hook per op)
    finally:
        lib.hpu_sim_set_hooks(dispatch._before, dispatch._after, dispatch.OpEntry)


def test_the_compiled_step_runs_the_models_graphs_in_compiled_regions(monkeypatch):
    """``--compile``'s bridged step (eager mode, as Gaudi runs ``hpu_backend``): the model's
    forward and backward run as two compiled regions each step, and Adam moves every
    parameter; its plain step runs on the CPU under ``aot_eager``, where no op reaches the
    bridge; ``--compile`` with ``--breakdown`` is refused by name."""
    import torch

    import hpu_runtime as hpu
    from hpu_runtime.bridge.compile_backend import BACKWARD, FORWARD
    from hpu_runtime.tools.bench_overhead import _step_fn

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    dev = hpu.reset_device("gaudi2")
    try:
        torch._dynamo.reset()
        step = _step_fn(16, bridge=True, batch=4, compiled=True)
        step()
        with hpu.bridge_disabled():
            before = [p.detach().cpu().clone() for p in step.model.parameters()]
        dev.log = []
        step()
        regions = [e[1] for e in dev.log if e[0] == "region"]
        dev.log = None
        assert regions == [FORWARD, None, BACKWARD, None], regions
        with hpu.bridge_disabled():
            assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, step.model.parameters()))
        hpu.deactivate()
        try:
            plain = _step_fn(16, bridge=False, batch=4, compiled=True)
            ops = dev.ops_recorded
            plain()
            assert dev.ops_recorded == ops and all(p.device.type == "cpu" for p in plain.model.parameters())
        finally:
            hpu.activate()
    finally:
        monkeypatch.undo()
        hpu.reset_device("gaudi2")
    cmd = [sys.executable, "-m", "hpu_runtime.tools.bench_overhead", "--compile", "--breakdown"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--breakdown" in out.stderr and "--compile" in out.stderr, out.stderr


def test_the_ratio_pairs_each_bridge_round_with_the_plain_rounds_around_it():
    """``paired_ratio`` by hand: on a machine that halves its speed from round to round (plain
    1, 2, 4; bridge 3, 6: twice the plain time around each) the ratio is 2.0, where the medians'
    ratio would say 2.25; two rounds of ratios 2 and 1 give their median 1.5; rounds that do
    not pair, and a time of 0, are refused by name."""
    import pytest

    from hpu_runtime.tools.bench_overhead import paired_ratio

    assert paired_ratio([1.0, 2.0, 4.0], [3.0, 6.0]) == 2.0
    assert paired_ratio([1.0, 3.0, 1.0], [4.0, 2.0]) == 1.5
    assert paired_ratio([0.5, 0.5], [1.5]) == 3.0
    for plain, bridged in (([1.0, 1.0], [1.0, 1.0]), ([1.0], []), ([1.0, 1.0, 1.0], [1.0])):
        with pytest.raises(ValueError, match="one more plain round"):
            paired_ratio(plain, bridged)
    with pytest.raises(ValueError, match="> 0"):
        paired_ratio([1.0, 0.0], [1.0])
