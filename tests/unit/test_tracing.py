"""The traced step (no data) and DDP's buckets from it, against DDP itself and hand checks."""

from __future__ import annotations

import functools
import resource

import pytest
import torch
import torch.nn.functional as F

from hccl.sim.ddp_plan import ddp_buckets, plan_ddp_step
from hpu_runtime.device.spec import get_device_spec
from hpu_runtime.tools.replay import summarize
from hpu_runtime.tools.tracing import trace_step
from launchers import study
from models.zoo import resolve_factory, step_factory

GAUDI2 = get_device_spec("gaudi2")


def _big_factory(batch_size: int):
    """50,000 x 50,000 fp32 weights: 10 GB if anything were really allocated."""
    model = torch.nn.Sequential(torch.nn.Linear(50_000, 50_000), torch.nn.ReLU(), torch.nn.Linear(50_000, 10))
    x = torch.randn(batch_size, 50_000)
    y = torch.randint(10, (batch_size,))
    return model, (x,), lambda out: F.cross_entropy(out, y)


def test_traced_step_allocates_no_real_storage():
    """A 10 GB model traces with a host-memory growth far below its size (FakeTensorMode)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trace = trace_step(_big_factory, 64, spec=GAUDI2)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 1 << 30
    assert [p.nbytes for p in trace.params] == [50_000 * 50_000 * 4, 50_000 * 4, 10 * 50_000 * 4, 40]
    assert trace.peak_hbm_bytes > 2 * 50_000 * 50_000 * 4  # weights + grads + momentum on the simulated HBM


def test_user_factory_spec_traces():
    """``package.module:factory`` works wherever a registered name does."""
    trace = trace_step(resolve_factory("tests.unit.model_factory_helper:factory", width=6), 1 << 16, spec=GAUDI2)
    assert [(p.name, p.numel) for p in trace.params] == [("weight", 48), ("bias", 6)]
    s = summarize(trace)
    assert s.times.step_ns > 0 and s.forward_ns > 0 and s.backward_ns > 0 and s.optimizer_ns >= 0
    assert s.forward_ns + s.backward_ns + s.optimizer_ns == s.times.compute_ns
    assert [g[0] for g in s.graphs] == ["mark_step", "mark_step"]  # backward graph, optimizer graph


def _trunc_normal_factory(batch_size: int):
    """Initialised as torchvision's ViT, Swin and ConvNeXt initialise (nn.init.trunc_normal_,
    which torch 2.13 samples by rejection, reading the data each round)."""
    model = torch.nn.Linear(64, 10)
    torch.nn.init.trunc_normal_(model.weight, std=0.02)
    return model, (torch.randn(batch_size, 64),), lambda out: out.square().mean()


def _data_dependent_factory(batch_size: int, read: bool = True):
    """An architecture computed with torch ops (as torchvision's RegNet computes its widths), a
    tied weight and a buffer; ``read=False``: the same model from Python numbers."""
    width = int(torch.arange(4).sum()) if read else 6
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, width))
    model[2].weight = model[0].weight if width == 8 else model[2].weight
    y = torch.randint(width, (batch_size,))
    return model, (torch.randn(batch_size, 8),), lambda out: F.cross_entropy(out, y)


def test_trunc_normal_init_traces_and_is_untouched_outside_the_trace():
    """A model initialised with trunc_normal_ traces (it has no data to sample on fake tensors, as
    on meta ones), and real tensors still get torch's sampling, inside [a, b]."""
    trace = trace_step(_trunc_normal_factory, 8, spec=GAUDI2)
    assert [p.numel for p in trace.params] == [640, 10]
    w = torch.nn.init.trunc_normal_(torch.empty(10_000), std=1.0, a=-0.5, b=0.5)
    assert float(w.abs().max()) <= 0.5 and float(w.std()) > 0.2


def test_a_factory_that_reads_tensor_data_is_built_for_real_then_traced_the_same():
    """NOTE [a factory that reads tensor data]: built with real tensors (a warning says so), then
    traced on fake ones: the same step as the same model built from Python numbers."""
    with pytest.warns(UserWarning, match="_data_dependent_factory reads tensor data while it builds"):
        got = trace_step(_data_dependent_factory, 4, spec=GAUDI2)
    want = trace_step(functools.partial(_data_dependent_factory, read=False), 4, spec=GAUDI2)
    assert [(p.name, p.numel) for p in got.params] == [(p.name, p.numel) for p in want.params] == [
        ("0.weight", 48), ("0.bias", 6), ("1.weight", 6), ("1.bias", 6), ("2.weight", 36), ("2.bias", 6)]
    assert summarize(got).times == summarize(want).times and got.peak_hbm_bytes == want.peak_hbm_bytes


def _tied_data_dependent_factory(batch_size: int):
    width = int(torch.arange(4).sum()) + 2  # 8
    model = torch.nn.Sequential(torch.nn.Linear(8, width, bias=False), torch.nn.Linear(width, 8, bias=False))
    model[1].weight = model[0].weight  # tied: one parameter in two modules
    return model, (torch.randn(batch_size, 8),), lambda out: out.square().mean()


def test_tied_weights_stay_tied_when_built_for_real():
    with pytest.warns(UserWarning, match="built with real tensors"):
        trace = trace_step(_tied_data_dependent_factory, 2, spec=GAUDI2)
    assert [(p.name, p.numel) for p in trace.params] == [("0.weight", 64)]


def test_grad_ready_times_follow_backward_order():
    """Gradients of later layers are ready first; every time lies within the backward graph."""
    trace = trace_step(resolve_factory("mlp:debug"), 8, spec=GAUDI2)
    s = summarize(trace)
    ready = dict(zip((p.name for p in trace.params), s.grad_ready_ns))
    assert ready["net.2.weight"] < ready["net.0.weight"]
    assert 0 < max(s.grad_ready_ns) <= s.times.step_ns


@pytest.mark.parametrize("spec, message", [
    ("no-such-model", "registered: .*resnet50"),
    ("tests.unit.no_such_module:factory", "cannot import"),
    ("tests.unit.model_factory_helper:missing", "has no attribute .missing"),
    ("tests.unit.model_factory_helper:NOT_CALLABLE", "not a callable"),
])
def test_bad_model_specs_fail_with_a_message(spec, message, capsys):
    rc = study.main(["trace", "--model", spec, "--batch-size", "2"])
    assert rc == 2
    import re
    assert re.search(message, capsys.readouterr().err, re.I)


def test_bad_flags_fail_before_work(capsys):
    with pytest.raises(SystemExit):
        study.main(["trace", "--model", "mlp", "--batch-size", "0"])
    assert "argument --batch-size: 0 is not in [1, " in capsys.readouterr().err


class _TiedFrozen(torch.nn.Module):
    """An embedding tied to the output layer and a frozen layer in between."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(500, 64)
        self.frozen = torch.nn.Linear(64, 64)
        self.frozen.requires_grad_(False)
        self.mid = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 500, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        return self.out(torch.relu(self.mid(self.frozen(self.emb(ids)))))


def tied_frozen_factory(batch_size: int):
    model = _TiedFrozen()
    ids = torch.randint(500, (batch_size, 12))
    return model, (ids,), lambda out: F.cross_entropy(out.reshape(-1, 500), ids.reshape(-1))


def _named_factory(name: str, batch_size: int):
    return step_factory(name, "debug", batch_size=batch_size)


def _ddp_rank(rank: int, world: int, factory, batch: int, caps: tuple, autocast: bool) -> list[list[int]]:
    """In a fresh gloo rank: DDP itself for three iterations per cap; its rebuilt bucket sizes."""
    import hpu_runtime

    hpu_runtime.deactivate()  # DDP runs on plain CPU tensors here
    out = []
    for cap in caps:
        torch.manual_seed(0)
        model, inputs, loss_fn = factory(batch)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        for _ in range(3):  # buckets are rebuilt at the second forward, logged after it
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(ddp(*inputs))
            loss.backward()
        sizes = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        out.append([int(x) for x in str(sizes).replace(" ", "").split(",") if x])
        del ddp
    return out


def _ddp_rebuilt_sizes(factory, batch: int, caps: tuple, autocast: bool = False) -> list[list[int]]:
    """DDP's rebuilt bucket sizes in bytes at each cap, from one gloo rank in a child process
    (not in the test's process: gloo's threads and the test worker's interpreter have deadlocked
    there at teardown), with a timeout."""
    from tests.dist_utils import run_ranks

    return run_ranks(_ddp_rank, 1, factory, batch, caps, autocast, backend="gloo", timeout=180.0)[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["mlp", "resnet50", "resnext101", "bert-large", "gpt2", "tied-frozen"])
def test_bucket_assignment_equals_ddps_own(name):
    """Buckets from the traced step equal DDP's rebuilt buckets at three caps."""
    import hpu_runtime

    hpu_runtime.deactivate()  # DDP runs on plain CPU tensors here
    try:
        factory = tied_frozen_factory if name == "tied-frozen" else functools.partial(_named_factory, name)
        trace = trace_step(factory, 2, spec=GAUDI2)
        caps = (0.001, 0.05, 25.0)
        for cap, theirs in zip(caps, _ddp_rebuilt_sizes(factory, 2, caps), strict=True):
            assert [b.nbytes for b in ddp_buckets(trace, cap)] == theirs, (name, cap)
        if name == "tied-frozen":
            assert {p.name for p in trace.params} == {"emb.weight", "mid.weight", "mid.bias"}
            assert trace.frozen == ["frozen.weight", "frozen.bias"]
    finally:
        hpu_runtime.activate()


def _bert_tied_frozen(batch_size: int):
    """A BERT encoder of hidden 768 (bert-base's layer shapes), its decoder tied to the word
    embeddings and its position embeddings frozen."""
    model, inputs, loss_fn = step_factory("bert-large", batch_size=batch_size, vocab_size=4096, layers=2, hidden=768,
                                          heads=12, intermediate=3072, seq_len=64)
    for name, p in model.named_parameters():
        if "position_embeddings" in name:
            p.requires_grad_(False)
    return model, inputs, loss_fn


@pytest.mark.timeout(240)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_transformer_tied_frozen_buckets_equal_ddps_own(autocast):
    """DDP's rebuilt buckets follow the order its autograd hooks fired in the first backward;
    the traced buckets follow the order the tracer's hooks fired, gradients ready at the
    same simulated time included: equal at 1, 5 and 25 MB (several parameters per bucket)."""
    import hpu_runtime

    hpu_runtime.deactivate()  # DDP runs on plain CPU tensors here
    try:
        trace = trace_step(_bert_tied_frozen, 2, spec=GAUDI2, autocast=autocast)
        assert "model.bert.embeddings.position_embeddings.weight" in trace.frozen
        caps = (1.0, 5.0, 25.0)
        for cap, theirs in zip(caps, _ddp_rebuilt_sizes(_bert_tied_frozen, 2, caps, autocast), strict=True):
            ours = [b.nbytes for b in ddp_buckets(trace, cap)]
            assert ours == theirs, (cap, ours, theirs)
            assert cap == 25.0 or len(ours) > 2
    finally:
        hpu_runtime.activate()


def test_explicit_cap_also_caps_the_first_bucket():
    """torch 2.13: the small first bucket applies only with the default cap."""
    trace = trace_step(resolve_factory("mlp"), 4, spec=GAUDI2)
    total = sum(p.nbytes for p in trace.params)
    assert [b.nbytes for b in ddp_buckets(trace, 25.0)] == [total]
    first = ddp_buckets(trace, None, first_bucket_mb=0.01)
    assert len(first) > 1 and first[0].nbytes >= 0.01 * 2**20 and sum(b.nbytes for b in first) == total


def test_planned_step_bounds():
    """More ranks never make the step shorter; the allreduces run in bucket order."""
    trace = trace_step(resolve_factory("resnet50:debug"), 4, spec=GAUDI2)
    steps = [plan_ddp_step(trace, world_size=n, bucket_cap_mb=0.05) for n in (1, 8, 64)]
    assert steps[0].times.step_ns <= steps[1].times.step_ns <= steps[2].times.step_ns
    for n, p in zip((1, 8, 64), steps):
        ends = [b.end_ns for b in p.buckets]
        assert ends == sorted(ends)
        assert all(b.ready_ns <= b.start_ns <= b.end_ns for b in p.buckets)
        assert n == 1 or all(b.start_ns < b.end_ns for b in p.buckets)
        assert p.graph_launches >= len(p.buckets)  # every bucket cuts the backward graph
    with pytest.raises(ValueError, match="world_size"):
        plan_ddp_step(trace, world_size=0)
    with pytest.raises(ValueError, match="comm hook"):
        plan_ddp_step(trace, world_size=2, comm_hook="int8")


def test_compile_mode_traces_regions_without_per_op_host_cost():
    """mode="compile": the model's forward and backward are one compiled region each (no
    per-op host cost); the loss and the optimizer run op by op as in eager mode."""
    factory = resolve_factory("mlp:debug")
    eager = summarize(trace_step(factory, 8, spec=GAUDI2, mode="eager"))
    comp = summarize(trace_step(factory, 8, spec=GAUDI2, mode="compile"))
    reasons = [g[0] for g in comp.graphs]
    assert [r for r in reasons if r != "eager"] == ["torch.compile forward", "torch.compile backward"]
    assert reasons[0] == "torch.compile forward"  # the model first, then the loss, op by op
    assert comp.times.host_ns < eager.times.host_ns
    assert len(reasons) < len(eager.graphs)


def test_compile_mode_under_ddp_breaks_the_graph_at_bucket_boundaries():
    """With a DDP cap, the traced model is broken as DDPOptimizer breaks it live: one forward
    and one backward region per piece, gradients ready between the backward regions, and the
    planner refuses a trace made for another cap."""
    factory = resolve_factory("mlp", hidden=512)  # 1.2 MB of gradients: two pieces at 1 MiB
    trace = trace_step(factory, 4, spec=GAUDI2, mode="compile", ddp_bucket_cap_mb=1)
    regions = [ev[1] for ev in trace.events if ev[0] == "region" and ev[1] is not None]
    assert regions == ["torch.compile forward"] * 2 + ["torch.compile backward"] * 2
    kinds = [ev[1] if ev[0] == "region" else ev[1][0] for ev in trace.events
             if ev[0] == "region" and ev[1] or ev[0] == "mark" and ev[1][0] == "grad_ready"]
    first_bwd = kinds.index("torch.compile backward")
    assert "grad_ready" in kinds[first_bwd:kinds.index("torch.compile backward", first_bwd + 1)]
    planned = plan_ddp_step(trace, world_size=2, bucket_cap_mb=1)
    assert len(planned.buckets) == 2 and planned.buckets[0].start_ns < planned.buckets[1].ready_ns
    with pytest.raises(ValueError, match="ddp_bucket_cap_mb"):
        plan_ddp_step(trace, world_size=2, bucket_cap_mb=5)
    with pytest.raises(ValueError, match="DDPOptimizer"):
        trace_step(factory, 4, spec=GAUDI2, mode="compile", ddp_bucket_cap_mb=0.5)

    def bare(batch_size):  # live, DDP calls nn.Sequential.forward and dynamo skips torch's own modules
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        return model, (torch.randn(batch_size, 8),), lambda out: out.sum()

    with pytest.raises(ValueError, match="uncompiled"):
        trace_step(bare, 4, spec=GAUDI2, mode="compile", ddp_bucket_cap_mb=1)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown mode"):
        trace_step(resolve_factory("mlp:debug"), 2, spec=GAUDI2, mode="graph")
