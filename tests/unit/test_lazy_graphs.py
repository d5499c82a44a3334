"""Lazy-mode graphs through the bridge: keying, recipe cache, compile metrics, fusion, eager mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hpu_runtime as hpu
from hpu_runtime import metrics
from hpu_runtime.device.cost_model import op_cost
from hpu_runtime import SimDevice
from hpu_runtime.device.spec import get_device_spec


def _compiles() -> int:
    return dict(hpu.metric_global("graph_compilation").stats())["TotalNumber"]


def _cache() -> dict:
    return dict(hpu.metric_global("recipe_cache").stats())


@pytest.fixture
def dev():
    d = hpu.reset_device("gaudi2")
    yield d
    hpu.reset_device("gaudi2")


def _train_steps(n: int, batches, counter: str | None = None) -> None:
    """``n`` SGD steps; ``counter``: how the loop counter ``i`` reaches the graph, if at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("hpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = torch.tensor([1.0 + k / n for k in range(n)], device="hpu") if counter == "index" else None
    hpu.mark_step()
    for i in range(n):
        x = batches[i].to("hpu")
        loss = model(x).square().mean()
        if counter == "index":  # the seed's V-Diffusion example: steps[i], an index constant
            loss = loss * weights[i]
        elif counter == "lerp":  # a Scalar the bridge keeps in the graph (lerp's weight)
            loss = loss.lerp(loss.detach(), 1.0 / (i + 2))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        hpu.mark_step()
        opt.step()
        hpu.mark_step()


def _copies(d) -> list[int]:
    """Bytes of each host->device copy in the device's event log, in order."""
    return [e[1] for e in d.log if e[0] == "h2d"]


def _data(sizes):
    with hpu.bridge_disabled():
        return [torch.randn(s, 16) for s in sizes]


def test_first_iteration_compiles_later_ones_hit(dev):
    """Identical iterations: the first compiles its two graphs, the rest only hit."""
    _train_steps(4, _data([8] * 4))
    gc = dict(hpu.metric_global("graph_compilation").stats())
    assert gc["TotalNumber"] == 2  # backward graph + optimizer graph
    assert gc["TotalTime"] > 0 and gc["AvgTime"] == pytest.approx(gc["TotalTime"] / 2, rel=1e-3)
    assert _cache()["TotalMiss"] == 2 and _cache()["TotalHit"] == 6


@pytest.mark.parametrize("counter", ["index", "lerp"])
def test_loop_counter_constant_recompiles_every_iteration(dev, counter):
    """A loop counter that reaches the graph as a constant (an index, a kept Scalar): one
    recompile per iteration."""
    _train_steps(4, _data([8] * 4), counter=counter)
    assert _compiles() == 4 + 1  # 4 distinct backward graphs + 1 optimizer graph


def test_a_number_the_bridge_makes_an_input_does_not_recompile(dev):
    """``x * (i + 10)``: a Python number where ``mul`` takes a tensor is a graph input (NOTE
    [scalars as graph inputs]): one recipe; each new value is one 4-byte host->device copy,
    a value seen before is found on the device."""
    x = torch.ones(4, device="hpu")
    hpu.mark_step()
    before = _compiles()
    dev.log = []
    for i in range(4):
        assert (x * (i + 10)).sum().item() == 4 * (i + 10)
    (x * 11).sum()
    hpu.mark_step()
    assert _compiles() - before == 1
    assert _copies(dev) == [4, 4, 4, 4]


def test_torch_adam_runs_one_recipe_after_its_first_steps(dev):
    """torch's Adam: its bias corrections are new floats every step, inputs of the graph; the
    optimizer graph compiles twice (the first step creates the state), then only hits."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to("hpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16).to("hpu")
    counts = []
    for _ in range(5):
        model(x).square().mean().backward()
        hpu.mark_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        hpu.mark_step()
        counts.append(_compiles())
    assert counts[2:] == [counts[1]] * 3 and counts[1] <= 4


def test_ragged_last_batch_recompiles(dev):
    """A smaller last batch changes the shapes: exactly one more compile."""
    _train_steps(4, _data([8, 8, 8, 5]))
    assert _compiles() == 3


def test_compile_time_charged_on_host_only_on_miss(dev):
    x = torch.randn(8, 8, device="hpu")
    hpu.mark_step()
    h0 = dev.host_ns
    (x * 2).sum()
    hpu.mark_step()
    first = dev.host_ns - h0
    h1 = dev.host_ns
    (x * 2).sum()
    hpu.mark_step()
    second = dev.host_ns - h1
    spec = dev.spec
    scalar_copy = spec.h2d_copy_ns + int(4 / spec.pcie_bytes_per_s * 1e9)  # the 2 of x * 2, first seen
    assert first - second == spec.compile_base_ns + 2 * spec.compile_per_op_ns + scalar_copy


def test_view_constants_are_part_of_the_key(dev):
    """``steps[i]`` (a select view) with a changing index gives a new graph each time."""
    steps = torch.arange(10, device="hpu", dtype=torch.float32)
    hpu.mark_step()
    base = _compiles()
    for i in range(3):
        (steps[i] * 2).sum()
        hpu.mark_step()
    assert _compiles() - base == 3
    for _ in range(3):
        (steps[0] * 2).sum()
        hpu.mark_step()
    assert _compiles() - base == 3  # index 0 was already compiled


def test_max_compound_op_size_splits_graphs(monkeypatch):
    monkeypatch.setenv("PT_HPU_MAX_COMPOUND_OP_SIZE", "2")
    d = hpu.reset_device()
    try:
        x = torch.ones(4, device="hpu")
        hpu.mark_step()
        launched = d.graphs_launched
        for _ in range(4):
            x = x + 1
        assert d.graphs_launched - launched == 2 and len(d.pending) == 0
    finally:
        monkeypatch.delenv("PT_HPU_MAX_COMPOUND_OP_SIZE")
        hpu.reset_device()


def test_eager_mode_launches_op_by_op(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    d = hpu.reset_device()
    try:
        assert not d.lazy
        x = torch.ones(4, device="hpu")
        y = x * 3 + 1
        assert not d.pending and d.graphs_launched == 3  # ones, mul, add
        assert y.tolist() == [4.0] * 4
    finally:
        monkeypatch.delenv("PT_HPU_LAZY_MODE")
        hpu.reset_device()


def test_eager_ops_take_wrapped_numbers_as_inputs_and_hash_scalar_arguments(monkeypatch):
    """Eager mode keys an op as Habana's eager bridge does (``habana_eager/eager_exec.cpp``): a
    Python number where the op takes a tensor (``x / c``: a wrapped number) becomes a device
    tensor, so five new values compile one recipe and each pays one 4-byte host->device copy;
    a Scalar-typed argument (``add``'s ``alpha``) is part of the key, so five values compile
    five recipes and copy nothing."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    d = hpu.reset_device("gaudi2")
    try:
        x = torch.ones(8, device="hpu")
        y = torch.ones(8, device="hpu")
        spec = d.spec
        copy = spec.h2d_copy_ns + int(4 / spec.pcie_bytes_per_s * 1e9)
        compiles, host = _compiles(), d.host_ns
        for k in range(5):
            z = x / 2.0 ** (k + 1)
        assert _compiles() - compiles == 1
        compile_one = spec.compile_base_ns + spec.compile_per_op_ns
        assert d.host_ns - host == compile_one + 5 * (copy + d.launcher._eager_ns)
        assert z.tolist() == [1 / 32] * 8
        compiles = _compiles()
        for k in range(5):
            z = torch.add(x, y, alpha=2.0 + k)
        assert _compiles() - compiles == 5
        assert z.tolist() == [7.0] * 8
    finally:
        monkeypatch.delenv("PT_HPU_LAZY_MODE")
        hpu.reset_device()


@pytest.mark.parametrize("read", ["item", "cpu", "tolist", "print"])
def test_host_reads_launch_and_wait(dev, read, capsys):
    x = torch.ones(4, device="hpu")
    y = (x * 2).sum()
    assert dev.pending
    {"item": y.item, "cpu": y.cpu, "tolist": y.tolist, "print": lambda: print(y)}[read]()
    assert not dev.pending and dev.host_ns >= dev.compute.free_ns


@pytest.mark.parametrize("read", ["item", "bool", "int", "float", "index", "format"])
def test_a_scalar_read_is_one_host_read(dev, read):
    """``.item()`` and the Python conversions that reach it read the scalar back once: one
    host read (``host_read_ns``) and a PCIe copy of its bytes, from the spec's own numbers."""
    y = (torch.ones(4, device="hpu") * 2).sum()
    k = torch.ones(4, device="hpu", dtype=torch.int64).sum()
    dev.synchronize()
    before, ops = dev.host_ns, dev.ops_recorded
    value = {"item": y.item, "bool": lambda: bool(y), "int": lambda: int(y), "float": lambda: float(y),
             "index": lambda: list(range(10))[k], "format": lambda: f"{y:.1f}"}[read]()
    assert value in (8.0, True, 8, 4, "8.0")
    nbytes = 8 if read == "index" else 4
    assert dev.host_ns - before == dev.spec.host_read_ns + int(nbytes / dev.spec.pcie_bytes_per_s * 1e9)
    assert dev.ops_recorded == ops


def test_printing_is_one_host_read_and_no_device_ops(dev, capsys):
    """``print`` of an hpu tensor reads it back once; the formatting's own tensor ops are
    host work, not device ops; a host tensor prints without any host read."""
    y = torch.arange(6, device="hpu", dtype=torch.float32).reshape(2, 3) * 2
    dev.synchronize()
    before, ops = dev.host_ns, dev.ops_recorded
    print(y)
    assert "device='hpu:0'" in capsys.readouterr().out
    assert dev.host_ns - before == dev.spec.host_read_ns + int(24 / dev.spec.pcie_bytes_per_s * 1e9)
    assert dev.ops_recorded == ops
    with hpu.bridge_disabled():
        z = torch.ones(3)
    before = dev.host_ns
    print(z, repr(y.cpu()))
    assert dev.ops_recorded == ops and dev.host_ns - before == dev.spec.host_read_ns + int(
        24 / dev.spec.pcie_bytes_per_s * 1e9)  # only y.cpu(): printing host tensors reads nothing


def test_host_read_of_host_tensor_is_free(dev):
    """``.item()`` of a CPU-resident tensor (e.g. a non-capturable optimizer's step) does not launch."""
    with hpu.bridge_disabled():
        step = torch.tensor(3.0)
    x = torch.ones(4, device="hpu") + 1
    assert step.item() == 3.0
    assert dev.pending, "reading a host tensor must not launch the pending graph"
    assert x.sum().item() == 8.0 and not dev.pending


# Hand-computed gaudi2 roofline of an elementwise fp32 op over 2**20 elements (4 MiB), from the
# spec's numbers (device/spec.py), not from the cost model's functions:
MEM_4MIB_NS = 2_005  # int(4,194,304 B / (2.46e12 B/s x 0.85) x 1e9)
MEM_8MIB_NS = 4_011  # int(8,388,608 B / (2.46e12 B/s x 0.85) x 1e9)
TPC_1M_NS = 278  # int(1,048,576 FLOP / (24 TPC x 28.7e12/64 / 2 FLOP/s x 0.70) x 1e9), fp32


def test_fusion_removes_intermediate_hbm_traffic():
    """A chain of elementwise ops costs less in one graph than op by op (intermediates stay on
    chip): only x is read from HBM and only y written; the middle ops are compute-bound."""
    spec = dataclasses.replace(get_device_spec("gaudi2"), compile_base_ns=0, compile_per_op_ns=0)
    d = hpu.reset_device(spec)
    try:
        x = torch.randn(1 << 20, device="hpu")
        hpu.mark_step()
        y = ((x * 2 + 1).relu() - 3).abs()
        assert [c.device_ns for c in d.pending] == [MEM_8MIB_NS] * 5  # alone: read 4 MiB, write 4 MiB
        start, end = d.launch()
        assert end - start == MEM_4MIB_NS + 3 * TPC_1M_NS + MEM_4MIB_NS
        del y
    finally:
        hpu.reset_device("gaudi2")


def test_intermediate_writes_follow_the_op_sequence_not_liveness():
    """An intermediate consumed in the graph is not written back whether or not Python still
    holds it (liveness depends on GC and threads); one autograd keeps for backward is written
    and read back. Checked against a hand-computed roofline."""
    spec = dataclasses.replace(get_device_spec("gaudi2"), compile_base_ns=0, compile_per_op_ns=0)
    times = {}
    for keep, op in ((True, "mul"), (False, "mul"), (False, "exp")):
        d = hpu.reset_device(spec)
        x = torch.randn(1 << 20, device="hpu", requires_grad=op == "exp")
        hpu.mark_step()
        t = x * 2 if op == "mul" else x.exp()  # exp's backward keeps its result
        out = t + 1
        kept = t if keep else None
        del t
        start, end = d.launch()
        times[keep, op] = end - start
        del kept, out
    hpu.reset_device("gaudi2")
    # x * 2: reads x (4 MiB), its output stays on chip; t + 1: the read is fused, the output written
    assert times[True, "mul"] == times[False, "mul"] == MEM_4MIB_NS + MEM_4MIB_NS
    # exp under grad: t is saved for backward, so it is written, and t + 1 reads it back
    assert times[False, "exp"] == MEM_8MIB_NS + MEM_8MIB_NS


def test_activation_kept_for_backward_is_read_back_in_the_same_graph():
    """Forward and backward in one lazy graph: the backward's read of a saved activation is
    HBM traffic, while an output nothing keeps fuses into its consumer (relu keeps its
    result, its input x * 3 is not kept: autograd's own save lists)."""
    spec = dataclasses.replace(get_device_spec("gaudi2"), compile_base_ns=0, compile_per_op_ns=0)
    d = hpu.reset_device(spec)
    try:
        w = torch.randn(1 << 20, device="hpu", requires_grad=True)
        hpu.mark_step()
        d.log = []
        (w * 3).relu().sum().backward()
        records = [ev[1] for ev in d.log if ev[0] == "op"]
        d.log = None
        from hpu_runtime.device.lazy_graph import intermediates

        names = [r.cost.name for r in records]
        mul, relu = names.index("aten.mul.Tensor"), names.index("aten.relu.default")
        on_chip = {serial for serial, _version in intermediates(records)}
        assert records[mul].writes[0][0] in on_chip  # fused into relu
        assert records[relu].writes[0][0] not in on_chip  # relu's result: written, read by its backward
        assert all(w[3] for w in records[relu].writes) and not records[mul].writes[0][3]
    finally:
        hpu.reset_device("gaudi2")


def test_in_place_updates_of_an_intermediate_fuse():
    """``y = x * 2; y.relu_(); y + 1``: the in-place relu makes a new version of y's storage,
    and both versions stay on chip (as the graph compiler sees the functional graph): the same
    traffic as the out-of-place chain, x read and the result written."""
    spec = dataclasses.replace(get_device_spec("gaudi2"), compile_base_ns=0, compile_per_op_ns=0)
    d = hpu.reset_device(spec)
    try:
        x = torch.randn(1 << 20, device="hpu")
        hpu.mark_step()
        y = x * 2
        y.relu_()
        out = y + 1
        start, end = d.launch()
        assert end - start == MEM_4MIB_NS + TPC_1M_NS + MEM_4MIB_NS  # the relu_ compute-bound in between
        del out
    finally:
        hpu.reset_device("gaudi2")


def test_autocast_hpu_changes_the_charged_rate(dev):
    """Under ``torch.autocast("hpu", bfloat16)`` the matmul runs in bf16 at the faster MME rate."""
    lin = torch.nn.Linear(512, 512).to("hpu")
    x = torch.randn(256, 512, device="hpu")
    hpu.mark_step()
    lin(x)
    fp32 = [c for c in dev.pending if c.engine == "MME"]
    hpu.mark_step()
    with torch.autocast("hpu", dtype=torch.bfloat16):
        y = lin(x)
    bf16 = [c for c in dev.pending if c.engine == "MME"]
    assert y.dtype == torch.bfloat16
    assert not fp32[0].low_precision and bf16[0].low_precision
    assert bf16[0].device_ns < fp32[0].device_ns
    assert fp32[0].flops == bf16[0].flops


def test_fp32_and_bf16_rates_differ_in_cost_model():
    spec = get_device_spec("gaudi2")
    a32 = torch.randn(256, 256)
    a16 = a32.to(torch.bfloat16)
    mm = torch.ops.aten.mm.default
    with hpu.bridge_disabled():
        c32 = op_cost(spec, mm, (a32, a32), {}, a32 @ a32)
        c16 = op_cost(spec, mm, (a16, a16), {}, a16 @ a16)
    assert c16.compute_ns * 7 < c32.compute_ns  # bf16 MME is 8x the fp32 rate in the spec


def test_recipe_cache_metric_counts_hits_and_misses_by_recipe(dev):
    x = torch.ones(4, device="hpu")
    hpu.mark_step()
    metrics.reset_all()
    for _ in range(3):
        (x + 1).sum()
        hpu.mark_step()
    rc = _cache()
    assert rc["TotalMiss"] == 1 and rc["TotalHit"] == 2
    (name,) = rc["RecipeMiss"]
    assert rc["RecipeHit"] == {name: 2}


def test_metric_names_on_package():
    assert hpu.metric_global is hpu.metrics.metric_global
    assert hpu.metric_global("cpu_fallback") is metrics.metric_global("cpu_fallback")


def test_pure_device_record_op_keys_by_cost():
    """The pure API: two different ops with the same name are different recipes."""
    from hpu_runtime.device.cost_model import OpCost

    d = SimDevice(get_device_spec("gaudi2"))
    for ns in (10, 20):
        d.record_op(OpCost(name="x", engine="TPC", flops=0, bytes_in=0, bytes_out=0,
                           low_precision=False, device_ns=ns))
        d.launch()
    assert d.compilations == 2


def test_a_number_in_a_host_op_is_not_put_on_the_device(dev):
    """A host tensor's op (a CPU step counter, ``step += 1``) is host work: its number is not
    copied to the device; the same number in a device op is, once."""
    with hpu.bridge_disabled():
        step = torch.zeros(())
    dev.log = []
    step += 7
    assert _copies(dev) == []
    x = torch.ones(2, device="hpu")
    (x + 7).sum()
    hpu.mark_step()
    assert _copies(dev) == [4]


def test_a_graphs_new_scalars_are_copied_in_one_batch_at_its_launch(dev):
    """Habana's bridge copies the new scalars of a graph together when it lowers the graph
    (PT_HPU_SCALAR_H2D_COPY_MULTIPLE, on by default): one copy of 4 bytes each, charged at the
    launch; a graph whose scalars are all on the device copies nothing."""
    x = torch.ones(4, device="hpu")
    hpu.mark_step()
    dev.log = []
    y = (x * 3 + 5) / 9  # three new scalars
    assert _copies(dev) == []  # nothing before the launch
    hpu.mark_step()
    assert _copies(dev) == [12]
    before = dev.host_ns
    dev.log = []
    y = (y * 3 + 5) / 9
    hpu.mark_step()
    assert _copies(dev) == []
    assert dev.host_ns - before == dev.spec.graph_launch_ns + 3 * dev.spec.host_op_ns
