"""The torch.hpu-like API: HBM accounting and OOM, PCIe copies, CPU fallback, streams and events."""

from __future__ import annotations

import contextlib
import gc
import threading

import pytest
import torch

import hpu_runtime as hpu
from hpu_runtime.device.memory import HPUOutOfMemoryError


# Hand-computed from the gaudi2 spec (device/spec.py), not from the cost model's functions:
COPY_NS = 573_000  # h2d_copy_ns = host_read_ns: the seed fit, every generation (NOTE [host costs])
PCIE_4MIB_NS = 131_072  # 4 MiB = 4,194,304 bytes at 32e9 bytes/s over PCIe


@pytest.fixture
def dev():
    d = hpu.reset_device("gaudi2")
    yield d
    hpu.reset_device("gaudi2")


def test_torch_hpu_is_the_api():
    assert torch.hpu.memory_allocated is hpu.memory_allocated
    assert torch.hpu.HPUGraph is hpu.HPUGraph and torch.hpu.Event is hpu.Event


def test_memory_allocated_live_peak_and_reset(dev):
    base = hpu.memory_allocated()
    a = torch.empty(1024, 1024, device="hpu")  # 4 MiB
    assert hpu.memory_allocated() - base == 4 << 20
    b = a * 2
    assert hpu.memory_allocated() - base == 8 << 20
    del b
    gc.collect()
    assert hpu.memory_allocated() - base == 4 << 20
    assert hpu.max_memory_allocated() - base >= 8 << 20
    hpu.reset_peak_memory_stats()
    assert hpu.max_memory_allocated() == hpu.memory_allocated()
    free, total = hpu.mem_get_info()
    assert total == dev.spec.hbm_bytes and free == total - hpu.memory_allocated()
    assert hpu.memory_stats()["InUse"] == hpu.memory_allocated()
    del a


def test_saved_activations_stay_resident_until_backward(dev):
    """HBM follows storages, so activations kept only by autograd still count."""
    w = torch.randn(256, 256, device="hpu", requires_grad=True)
    x = torch.randn(256, 256, device="hpu")
    before = hpu.memory_allocated()
    loss = (x @ w).exp().sum()  # exp saves its output (256 KiB) for backward
    held = hpu.memory_allocated() - before
    assert held >= 256 * 256 * 4  # the exp result, kept only by autograd
    loss.backward()
    del loss
    gc.collect()
    assert hpu.memory_allocated() - before < held


def test_40gb_tensor_on_gaudi_fails_before_host_allocation():
    """On the 32 GB Gaudi spec a 40 GB tensor raises the HPU OOM, naming the sizes, allocating nothing."""
    hpu.reset_device("gaudi")
    try:
        with pytest.raises(HPUOutOfMemoryError, match=r"40\.00 GiB") as info:
            torch.empty(10 * 1024**3, dtype=torch.float32, device="hpu")  # 40 GiB
        assert info.value.requested_bytes == 40 * 1024**3
        assert hpu.memory_allocated() == 0
        with pytest.raises(HPUOutOfMemoryError):
            torch.zeros(20, 1024**3, device="hpu", dtype=torch.bfloat16)  # 40 GiB
    finally:
        hpu.reset_device("gaudi2")


def test_to_hpu_of_host_tensor_costs_pcie_once(dev):
    with hpu.bridge_disabled():
        x = torch.randn(1 << 20)  # 4 MiB on the host
    h0 = dev.host_ns
    y = x.to("hpu")
    assert x.nbytes == 4 << 20 and dev.host_ns - h0 == COPY_NS + PCIE_4MIB_NS
    assert hpu.memory_allocated() >= x.nbytes
    h1 = dev.host_ns
    y.to("hpu")  # already resident
    assert dev.host_ns == h1


def test_cpu_of_device_tensor_costs_d2h(dev):
    y = torch.ones(1 << 20, device="hpu")
    hpu.synchronize()
    h0 = dev.host_ns
    y.cpu()
    assert y.nbytes == 4 << 20 and dev.host_ns - h0 == COPY_NS + PCIE_4MIB_NS


def test_model_to_hpu_counts_parameters(dev):
    m = torch.nn.Linear(1000, 1000).to("hpu")
    assert hpu.memory_allocated() >= (1000 * 1000 + 1000) * 4
    assert m.weight.device == torch.device("hpu", 0)


def test_tensor_factory_with_hpu_device(dev):
    t = torch.tensor([1.0, 2.0], device="hpu")
    assert t.tolist() == [1.0, 2.0] and dev.is_resident(t)


def test_cpu_fallback_counted_charged_and_logged(monkeypatch, capsys):
    monkeypatch.setenv("LOG_LEVEL_PT_FALLBACK", "1")
    monkeypatch.setenv("ENABLE_CONSOLE", "true")
    monkeypatch.setenv("PT_HPU_PLACE_ON_CPU", "aten::erf")
    d = hpu.reset_device()
    try:
        a = torch.rand(1024, device="hpu", dtype=torch.bfloat16) + 1
        h0 = d.host_ns
        launched = d.graphs_launched
        r = torch.digamma(a)
        assert d.graphs_launched == launched + 1, "a fallback launches the pending graph first"
        assert d.host_ns - h0 >= 2 * 64  # 2048 bytes down and back at 32e9 bytes/s: 64 ns each way
        torch.erf(a)  # listed in PT_HPU_PLACE_ON_CPU
        torch.ones(3, device="hpu", dtype=torch.float64).sum()  # float64: not on the HPU
        stats = dict(hpu.metric_global("cpu_fallback").stats())
        assert stats["TotalNumber"] == 4
        assert stats["FallbackOps"]["aten::digamma"] == 1 and stats["FallbackOps"]["aten::erf"] == 1
        assert "aten::sum" in stats["FallbackOps"]
        out = capsys.readouterr().out
        assert "CPU fallback digamma : self=HPUBFloat16Type" in out.splitlines()
        assert "CPU fallback sum : self=HPUDoubleType" in out
        assert r.dtype == torch.bfloat16
    finally:
        hpu.reset_device()


def test_fallback_not_logged_without_console(monkeypatch, capsys):
    monkeypatch.setenv("LOG_LEVEL_PT_FALLBACK", "1")
    monkeypatch.delenv("ENABLE_CONSOLE", raising=False)
    hpu.reset_device()
    torch.digamma(torch.rand(4, device="hpu") + 1)
    assert "CPU fallback" not in capsys.readouterr().out
    assert dict(hpu.metric_global("cpu_fallback").stats())["TotalNumber"] == 1
    hpu.reset_device()


def test_event_elapsed_time_is_simulated_ms(dev):
    a = torch.randn(2048, 2048, device="hpu")
    start, end = hpu.Event(enable_timing=True), hpu.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        a @ a
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    # 4 fp32 matmuls of 2 x 2048^3 FLOP at the gaudi2 fp32 MME rate: at least their compute time
    flop_ms = 4 * 2 * 2048**3 / (dev.spec.mme_fp32_flops_per_s * dev.spec.mme_efficiency) * 1e3
    assert ms >= flop_ms * 0.99 and ms > 0
    assert dev.host_ns >= end.time_ns and end.query()
    with pytest.raises(RuntimeError):
        hpu.Event().elapsed_time(end)


def test_streams_are_distinct_and_the_context_selects_one(dev):
    """``hpu.Stream()`` is a new stream, equal only to itself; ``with hpu.stream(s)`` makes it
    the calling thread's current stream, and only inside the block."""
    default = torch.hpu.default_stream()
    s, t = hpu.Stream(), hpu.Stream()
    assert torch.hpu.current_stream() == default and default.stream_id == 0
    assert s == s and s != t and s != default and s != object()
    assert len({default, s, t, s}) == 3
    with hpu.stream(s):
        assert torch.hpu.current_stream() == s and torch.hpu.current_stream() != default
        seen = []
        other = threading.Thread(target=lambda: seen.append(torch.hpu.current_stream()))
        other.start()
        other.join(timeout=30)
        assert seen == [default]  # the selection is per thread
        with hpu.stream(t):
            assert torch.hpu.current_stream() == t
        assert torch.hpu.current_stream() == s
    assert torch.hpu.current_stream() == default
    with hpu.stream(None):
        assert torch.hpu.current_stream() == default


def test_reset_accumulated_memory_stats_clears_the_counts_only(dev):
    """Gaudi's ``reset_accumulated_memory_stats`` clears NumAllocs and NumFrees; InUse, MaxInUse
    and ActiveAllocs (three tensors live, counted by hand here) stay."""
    keep = [torch.ones(256, device="hpu") for _ in range(3)]
    gone = [torch.ones(256, device="hpu") for _ in range(2)]
    del gone
    before = torch.hpu.memory_stats()
    assert before["NumAllocs"] - before["NumFrees"] == before["ActiveAllocs"] >= 3
    torch.hpu.reset_accumulated_memory_stats()
    after = torch.hpu.memory_stats()
    assert after["NumAllocs"] == after["NumFrees"] == 0
    assert {k: after[k] for k in ("InUse", "MaxInUse", "ActiveAllocs")} == \
        {k: before[k] for k in ("InUse", "MaxInUse", "ActiveAllocs")}
    extra = torch.ones(256, device="hpu")
    del keep
    now = torch.hpu.memory_stats()
    assert (now["NumAllocs"], now["NumFrees"], now["ActiveAllocs"]) == (1, 3, before["ActiveAllocs"] - 2)
    assert extra.device.type == "hpu"


def test_streams_are_torch_streams_that_record_stream_takes(dev):
    """As Gaudi's, an ``hpu.Stream`` is a ``torch.Stream`` of hpu:0, so ``tensor.record_stream``
    takes it (DeepSpeed's ZeRO-3 frees partitioned parameters that way); the default stream is
    the one torch.accelerator names."""
    import habana_frameworks.torch.utils.internal as internal

    s = hpu.Stream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("hpu", 0) and s.stream_id > 0
    assert torch.hpu.default_stream() == torch.accelerator.current_stream()
    t = torch.ones(4, device="hpu")
    for stream in (s, torch.hpu.current_stream(), torch.hpu.default_stream()):
        t.record_stream(stream)
    assert internal.is_lazy() is dev.lazy
    calls = []
    internal.lazy_only(calls.append)(1)
    assert calls == ([1] if dev.lazy else [])


def test_stream_work_runs_on_the_one_compute_queue(dev):
    """Work issued on a side stream is timed exactly as on the default stream (one queue)."""
    def run(side: bool) -> tuple[int, int]:
        d = hpu.reset_device("gaudi2")
        x = torch.ones(256, 256, device="hpu")
        hpu.mark_step()
        s = hpu.Stream()
        with hpu.stream(s) if side else contextlib.nullcontext():
            x @ x
        s.synchronize()
        assert s.query() and not d.pending and d.host_ns >= d.compute.free_ns
        return d.host_ns, d.compute.free_ns

    assert run(side=True) == run(side=False)


def test_torch_hpu_and_habana_frameworks_hpu_expose_the_same_names() -> None:
    """transformers' set_seed calls torch.hpu.manual_seed_all; Gaudi scripts call hthpu.*: one set of names."""
    import habana_frameworks.torch.hpu as hthpu
    import torch

    assert sorted(torch.hpu.__all__) == sorted(hthpu.__all__)
    for name in torch.hpu.__all__:
        assert getattr(torch.hpu, name) is getattr(hthpu, name), name
    torch.hpu.manual_seed_all(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(2))


def test_host_read_inside_vmap_is_not_a_device_read() -> None:
    """transformers builds attention masks under vmap with .to(device): a batched tensor has no
    storage to look up (it raised NotImplementedError inside the bridge)."""
    import torch

    x = torch.randn(3, 4).to("hpu")
    out = torch.vmap(lambda row: row.to("cpu") * 2)(x)
    assert out.device.type == "cpu" and torch.equal(out, (x * 2).cpu())


def test_checkpoint_to_host_is_charged_as_the_planner_plans(dev):
    """``{k: v.to("cpu") for k, v in model.state_dict().items()}`` after a step (the MLPerf
    BERT run's checkpoint): one host read per tensor, as the planner's
    ``state_dict_to_host_ns`` plans it from the tensors' sizes; checked against the hand sum."""
    from hpu_runtime.device.cost_model import state_dict_to_host_ns

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8)).to("hpu")
    model(torch.ones(4, 1024, device="hpu")).sum().backward()
    hpu.mark_step()
    state = model.state_dict()
    dev.synchronize()  # the step's work done: only the copies remain
    h0 = dev.host_ns
    on_host = {k: v.to("cpu") for k, v in state.items()}
    charged = dev.host_ns - h0
    sizes = [v.nbytes for v in state.values()]
    assert sizes == [4 << 20, 4096, 32768, 32]
    # by hand: 4 reads of COPY_NS each, plus PCIe at 32e9 bytes/s (int ns per read)
    assert charged == 4 * COPY_NS + PCIE_4MIB_NS + 128 + 1024 + 1
    assert state_dict_to_host_ns(dev.spec, sizes) == charged
    assert all(t.device.type == "cpu" for t in on_host.values())


def test_gaudi_device_queries_and_deprecated_names(dev):
    """The rest of Gaudi's ``torch.hpu`` queries: properties from the spec, reserved = the HBM
    limit (as Gaudi's allocator reports), the deprecated cached / deterministic names warn and
    answer as their replacements."""
    import habana_frameworks.torch.hpu as hthpu
    import habana_frameworks.torch.hpu.memory as hmem

    props = hthpu.get_device_properties()
    assert props == f"(name='GAUDI2', dramSize={dev.spec.hbm_bytes}, num_tpc={dev.spec.num_tpc}, num_mme={dev.spec.num_mme})"
    assert hthpu.get_arch_list() == ["GAUDI2"] and hthpu.get_gencode_flags() == ""
    limit = hpu.memory_stats()["Limit"]
    before = hthpu.memory_usage()
    a = torch.empty(1024, device="hpu")  # 4 KiB
    assert hthpu.memory_usage() - before == 4096
    assert hmem.memory_reserved() == hmem.max_memory_reserved() == limit
    with pytest.warns(FutureWarning, match="renamed to torch.hpu.memory_reserved"):
        assert hmem.memory_cached() == limit
    with pytest.warns(FutureWarning, match="renamed to torch.hpu.max_memory_reserved"):
        assert hmem.max_memory_cached() == limit
    was = torch.are_deterministic_algorithms_enabled()
    try:
        with pytest.warns(FutureWarning):
            hthpu.setDeterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
        with pytest.warns(FutureWarning):
            assert hthpu.getDeterministic() is True
    finally:
        torch.use_deterministic_algorithms(was)
    with pytest.raises(ValueError, match="one simulated card"):
        hthpu.get_device_properties(1)
    del a
