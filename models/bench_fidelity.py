"""Simulated vs published Gaudi training figures, side by side: ``python -m models.bench_fidelity``.

Published figures live in ``models/published_figures.toml`` (each with its primary source:
MLCommons training results logs, Intel / Habana performance pages). Each row of
:data:`ROWS` says how the published run executed -- PyTorch lazy mode, lazy mode with an HPU
graph, TensorFlow graph mode, ``torch.compile`` -- and with which micro-batch, sequence
packing, gradient accumulation, optimizer and gradient all-reduce, each from the run's own
launch script or README (the row's ``source``). The simulated side plans the row in that
mode: one step traced without data (:func:`hpu_runtime.tools.tracing.trace_step`, bf16
autocast) and planned on the published card count with DDP's buckets
(:func:`hccl.sim.ddp_plan.plan_ddp_step`). With gradient accumulation, the first
``accumulation - 1`` micro-steps are forward and backward only (no all-reduce, no update).

Tables (simulated times are per card, per optimizer step, simulated ms):

1. per-card throughput, published and simulated, with the step split into device-only
   time (the compute stream busy), host-only time (the host thread busy) and exposed
   communication, so a reader sees what bounds each row, and the micro-step's simulated HBM
   peak against the card's (every published run fits where it trained);
2. scaling efficiency between card counts;
3. the host time per step of the seed "HPU Graphs for Training" MNIST ``Net`` (batch 200,
   Adadelta, first-gen Gaudi) without HPU graphs, with ``make_graphed_callables`` and with
   capture/replay;
4. the calibrated constants (NOTE [calibration] in :mod:`hpu_runtime.device.spec`): each
   constant, the figure it was fitted on and its residual there; every other row of table
   1 is a prediction, and its ratio is the residual. ``--refit`` fits them again from
   scratch and prints the values beside the spec's.

Simulated times are deterministic; the wall-clock the benchmark takes is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

__all__ = ["CONSTANTS", "Calibrated", "ROWS", "Row", "RowResult", "fit_device_constants", "fit_host_constants",
           "load_figures", "main", "plan_row", "seed_host_ms", "simulate_row", "trace_row"]

DATA = Path(__file__).with_name("published_figures.toml")

_ONE_BUCKET_MB = 1e6
"""A ``bucket_cap_mb`` that holds every gradient: one all-reduce of the whole flat buffer
after backward (Habana's FastDDP, TensorFlow's and Model-References' post-accumulation
all-reduce)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """A published figure and how its run executed, to be planned the same way."""

    model: str
    """Registered model name."""
    device: str
    """``gaudi`` (first generation) or ``gaudi2``."""
    cards: int
    """Cards of the published run."""
    batch: int
    """The figure's ``batch_size_per_card`` (how the table finds it)."""
    software: str
    """A substring of the figure's ``software`` that names the run."""
    ran_in: str
    """How the published run executed, in words."""
    mode: str
    """The mode planned (:data:`hpu_runtime.tools.tracing.MODES`)."""
    micro_batch: int
    """Sequences (images) per card per micro-step, as traced."""
    seq_len: int | None = None
    """Tokens per sequence (text models)."""
    model_config: tuple[tuple[str, object], ...] = ()
    """Model config fields the published run's model differs in, as ``(field, value)`` pairs."""
    samples_per_sequence: float = 1.0
    """Samples per traced sequence: sequence packing puts several samples in one sequence
    and the published throughput counts samples."""
    accumulation: int = 1
    """Micro-steps per optimizer step (gradient accumulation)."""
    optimizer: str = "fused-lars"
    """Optimizer traced (:data:`hpu_runtime.tools.tracing.OPTIMIZERS`)."""
    bucket_cap_mb: float = _ONE_BUCKET_MB
    """Gradient all-reduce buckets, MiB."""
    comm_hook: str = "none"
    """All-reduce dtype: ``none`` (fp32), ``bf16`` or ``fp16`` (:data:`hccl.sim.ddp_plan.COMM_HOOKS`)."""
    source: str
    """Where the settings come from."""

    def __post_init__(self) -> None:
        from hccl.sim.ddp_plan import COMM_HOOKS
        from hpu_runtime.tools.tracing import MODES, OPTIMIZERS

        if self.mode not in MODES:
            raise ValueError(f"Row {self.label}: unknown mode {self.mode!r}; known: {', '.join(MODES)}")
        if self.optimizer not in OPTIMIZERS or self.optimizer == "none":
            raise ValueError(f"Row {self.label}: optimizer must be one of {', '.join(OPTIMIZERS[:-1])}")
        if self.comm_hook not in COMM_HOOKS:
            raise ValueError(f"Row {self.label}: unknown comm hook {self.comm_hook!r}")
        for name in ("cards", "batch", "micro_batch", "accumulation"):
            if getattr(self, name) < 1:
                raise ValueError(f"Row {self.label}: {name} must be >= 1")
        if not self.samples_per_sequence >= 1.0:
            raise ValueError(f"Row {self.label}: samples_per_sequence must be >= 1")

    @property
    def label(self) -> str:
        seq = f"@{self.seq_len}" if self.seq_len else ""
        return f"{self.model}{seq} {self.device} x{self.cards} b{self.batch} ({self.software})"

    @property
    def samples_per_step(self) -> float:
        """Samples per card per optimizer step."""
        return self.micro_batch * self.samples_per_sequence * self.accumulation


_MLPERF_RN50_PT = ("MLPerf v3.0/v3.1 Intel-HabanaLabs HLS-Gaudi2-PT resnet: launch_resnet.sh (lazy mode, no "
                   "--use_torch_compile, no HPU graphs), PyTorch/train.py (FusedLars over "
                   "FusedResourceApplyMomentum, DDP bucket_cap_mb=200, gradient_as_bucket_view=True)")
_TF_GRAPH = ("TensorFlow graph mode: the whole step is one graph with no per-op host work (planned as "
             "compile: forward and backward as compiled regions); Horovod all-reduce, its default "
             "64 MB fusion buffer")
_MLPERF_BERT_PT = ("MLPerf v3.0 Intel-HabanaLabs bert: HLS-Gaudi2-PT/launch_bert_pytorch.sh (8 cards: 28 "
                   "packed sequences x 2 accumulation, 'effectively /2 due to packed dataset'; 64 cards: 24 x 2; "
                   "--distribution_strategy fastddp --allreduce_dtype bf16 --use_hpu_graph true), "
                   "PyTorch/run_pretraining.py (forward, loss and backward captured in one HPUGraph and "
                   "replayed; avg_seq_per_sample default {128: 1.2, 512: 2.0}), PyTorch/fastddp.py (one "
                   "bf16 all-reduce of every gradient after backward); FastLamb")
_MLPERF_BERT_TF = ("MLPerf v1.1 Intel-HabanaLabs bert HLS-1H-N2 / -N16 defaults.cfg: TRAIN_BATCH_SIZE=14 "
                   "(12 at 64 cards) packed sequences, NUM_ACCUMULATION_STEPS=4 (halved for packing, as "
                   "Habana's run_pretraining does), PACKED_DATA=True; TensorFlow graph mode, Horovod")
_MR_BERT = ("Model-References 1.17.0 PyTorch/nlp/bert: README (packed data, lazy mode, per chip batch 64 "
            "at 128 and 8 at 512; --allreduce_post_accumulation --allreduce_post_accumulation_fp16; "
            "--use_fused_lamb; accumulation 128 / 512 at 8 cards, 32 / 128 at 32), run_pretraining.py "
            "(accumulation divided by avg_seq_per_pack 1.2 / 2.0; --use-hpu-graphs off by default)")
_BERT_ATTENTION = (("attn_implementation", "eager"), ("attention_dropout", 0.1))
"""The published BERT runs' attention: NVIDIA's BERT modeling.py lineage (Model-References
PyTorch/nlp/bert/modeling.py: matmul, softmax, dropout, matmul) with bert_config.json's
attention_probs_dropout_prob 0.1, not a fused SDPA kernel."""
_MR_RN50_COMPILE = ("Intel Gaudi reference models page, 'ResNet50 LARS (torch.compile)'; Model-References "
                    "torchvision ResNet-50 (bucket_cap_mb=256, gradient_as_bucket_view)")


def _mlperf_bert(device: str, cards: int, batch: int, micro: int) -> Row:
    """An MLPerf BERT row: Gaudi2, PyTorch with an HPU graph and FastDDP's one bf16 all-reduce;
    first-gen, TensorFlow graph mode, two micro-steps, Horovod."""
    if device == "gaudi2":
        return Row(model="bert-large", device=device, cards=cards, batch=batch, seq_len=512, software="PyTorch 1.13.1",
                   model_config=_BERT_ATTENTION, ran_in="PyTorch lazy + HPU graph, FastDDP", mode="hpu_graphs",
                   micro_batch=micro, samples_per_sequence=2.0, optimizer="fused-lamb", comm_hook="bf16",
                   source=_MLPERF_BERT_PT)
    return Row(model="bert-large", device=device, cards=cards, batch=batch, seq_len=512, software="TensorFlow 2.5.1",
               model_config=_BERT_ATTENTION, ran_in="TensorFlow graph", mode="compile", micro_batch=micro,
               samples_per_sequence=2.0, accumulation=2, optimizer="fused-lamb", bucket_cap_mb=64,
               source=_MLPERF_BERT_TF)


def _mr_bert(cards: int, batch: int, seq: int, micro: int, packing: float, accumulation: int) -> Row:
    """A Model-References BERT pretraining row (first-gen, PyTorch lazy): ``micro`` packed
    sequences per micro-step, ``accumulation`` micro-steps, one fp16 all-reduce after them."""
    return Row(model="bert-large", device="gaudi", cards=cards, batch=batch, seq_len=seq, software="PyTorch lazy",
               model_config=_BERT_ATTENTION, ran_in="PyTorch lazy", mode="lazy", micro_batch=micro,
               samples_per_sequence=packing, accumulation=accumulation, optimizer="fused-lamb", comm_hook="fp16",
               source=_MR_BERT)


ROWS: tuple[Row, ...] = (
    Row(model="resnet50", device="gaudi2", cards=8, batch=256, software="PyTorch 2.0.1", micro_batch=256,
        ran_in="PyTorch lazy, FusedLARS", mode="lazy", bucket_cap_mb=200, source=_MLPERF_RN50_PT),
    Row(model="resnet50", device="gaudi2", cards=8, batch=256, software="TensorFlow 2.13.0", micro_batch=256,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
    _mlperf_bert("gaudi2", 8, 56, 28),
    _mlperf_bert("gaudi2", 64, 48, 24),
    Row(model="resnet50", device="gaudi", cards=8, batch=256, software="TensorFlow 2.5.1", micro_batch=256,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
    Row(model="resnet50", device="gaudi", cards=64, batch=128, software="TensorFlow 2.5.1", micro_batch=128,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
    Row(model="resnet50", device="gaudi", cards=256, batch=64, software="TensorFlow 2.5.1", micro_batch=64,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
    _mlperf_bert("gaudi", 8, 56, 14),
    _mlperf_bert("gaudi", 64, 48, 12),
    *(_mr_bert(cards, batch, seq, micro, spp, accumulation) for cards, batch, seq, micro, spp, accumulation in (
        (8, 64, 128, 64, 1.2, 107), (32, 64, 128, 64, 1.2, 27), (8, 16, 512, 8, 2.0, 256), (32, 16, 512, 8, 2.0, 64))),
    Row(model="resnet50", device="gaudi", cards=8, batch=256, software="PyTorch (torch.compile)", micro_batch=256,
        ran_in="torch.compile", mode="compile", bucket_cap_mb=256, source=_MR_RN50_COMPILE),
    Row(model="resnet50", device="gaudi", cards=32, batch=256, software="PyTorch (torch.compile)", micro_batch=256,
        ran_in="torch.compile", mode="compile", bucket_cap_mb=256, source=_MR_RN50_COMPILE),
)
"""The rows compared, in table order."""


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A device constant fitted to one published figure (NOTE [calibration] in
    :mod:`hpu_runtime.device.spec`)."""

    field: str
    """The ``DeviceSpec`` field."""
    devices: tuple[str, ...]
    """The generations whose spec takes the fitted value."""
    row: int
    """Index in :data:`ROWS` of the figure it is fitted on."""
    bounds: tuple[float, float]
    """Where the fit searches."""
    rises: bool = True
    """Throughput rises with the constant (an efficiency); else it falls (a tile size)."""

    @property
    def name(self) -> str:
        return f"{self.field} ({', '.join(self.devices)})"


CONSTANTS: tuple[Calibrated, ...] = (
    Calibrated("mme_efficiency", ("gaudi2", "gaudi3"), 2, (0.05, 1.0)),
    Calibrated("mme_tile", ("gaudi2", "gaudi3"), 1, (1, 2048), rises=False),
    Calibrated("mme_efficiency", ("gaudi",), 7, (0.05, 1.0)),
    Calibrated("mme_tile", ("gaudi",), 4, (1, 2048), rises=False),
)
"""The calibrated device constants, each fitted on one figure; every other row is a prediction."""

SEED_HOST_MS = {"lazy": 4.8, "make_graphed_callables": 3.9, "capture/replay": 1.3}
"""Seed hpu-graphs-for-training: host time per step of its MNIST Net on first-gen Gaudi, ms."""


def load_figures(path: Path = DATA) -> list[dict]:
    """The published figures (one dict per ``[[figure]]`` table)."""
    with open(path, "rb") as f:
        return tomllib.load(f)["figure"]


def _published(figures: list[dict], row: Row) -> dict | None:
    for f in figures:
        if ((f["model"], f["device"], f["cards"], f.get("batch_size_per_card")) == (row.model, row.device, row.cards,
                                                                                     row.batch)
                and row.software in f["software"]):
            return f
    return None


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row planned: per card, per optimizer step (simulated ns), and its mechanisms.

    Attributes:
        samples_per_s: simulated throughput per card.
        step_ns, device_ns, host_ns, exposed_comm_ns: the optimizer step, the compute
            stream busy in it, the host thread busy in it, communication not under compute.
        ops: device ops run per optimizer step (replayed HPU-graph ops included).
        replayed_ops: of those, the ops HPU-graph replays ran (no host cost each).
        launches: graph launches per optimizer step (replays excluded).
        replays: HPU graph replays per optimizer step.
        copies, copied_bytes: host->device copies (the input batch) per optimizer step.
        buckets: gradient all-reduces per optimizer step.
        peak_hbm_bytes: simulated HBM high-water mark of a micro-step.
    """

    samples_per_s: float
    step_ns: int
    device_ns: int
    host_ns: int
    exposed_comm_ns: int
    ops: int
    replayed_ops: int
    launches: int
    replays: int
    copies: int
    copied_bytes: int
    buckets: int
    peak_hbm_bytes: int


def _trace(row: Row, spec, optimizer: str, flavour: str | None, ddp: bool):
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    kwargs = {"seq_len": row.seq_len} if row.seq_len else {}
    kwargs.update(row.model_config)
    name = f"{row.model}:{flavour}" if flavour else row.model
    # compile mode under DDP: the model is compiled broken at the buckets (DDPOptimizer)
    cap = row.bucket_cap_mb if ddp and row.mode == "compile" else None
    return trace_step(resolve_factory(name, **kwargs), row.micro_batch, spec=spec, mode=row.mode,
                      optimizer=optimizer, autocast=True, ddp_bucket_cap_mb=cap)


def _counts(graphs, trace) -> tuple[int, int, int, int, int, int]:
    """``(ops, replayed ops, launches, replays, copies, copied bytes)`` of one planned step."""
    replayed = [g[1] for g in graphs if g[0] == "replay"]
    copied = [ev[1] for ev in trace.events if ev[0] == "h2d"]
    return (sum(g[1] for g in graphs), sum(replayed), len(graphs) - len(replayed), len(replayed), len(copied),
            sum(copied))


def plan_row(row: Row, traces: tuple) -> RowResult:
    """Plan ``row`` from its traces: ``(full step, accumulation micro-step or None)``, both
    traced on the device spec to plan with (see :func:`hpu_runtime.tools.tracing.respec`)."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.tools.replay import summarize

    full, micro = traces
    topology = {"gaudi": "hls1", "gaudi2": "hls2", "gaudi3": "hls3"}[row.device]
    plan = plan_ddp_step(full, world_size=row.cards, topology=topology, bucket_cap_mb=row.bucket_cap_mb,
                         gradient_as_bucket_view=True, comm_hook=row.comm_hook)
    t = plan.times
    times = [t.step_ns, t.compute_ns, t.host_ns]
    counts = list(_counts(plan.graphs, full))
    if micro is not None:  # the other micro-steps: forward and backward only, no all-reduce
        k = row.accumulation - 1
        m = summarize(micro)
        times = [a + k * b for a, b in zip(times, (m.times.step_ns, m.times.compute_ns, m.times.host_ns))]
        counts = [a + k * b for a, b in zip(counts, _counts(m.graphs, micro))]
    step, device, host = times
    ops, replayed, launches, replays, copies, copied = counts
    return RowResult(samples_per_s=row.samples_per_step / (step * 1e-9), step_ns=step, device_ns=device,
                     host_ns=host, exposed_comm_ns=t.exposed_comm_ns, ops=ops, replayed_ops=replayed,
                     launches=launches, replays=replays, copies=copies, copied_bytes=copied,
                     buckets=len(plan.buckets), peak_hbm_bytes=full.peak_hbm_bytes)


def trace_row(row: Row, spec=None, flavour: str | None = None) -> tuple:
    """The traces :func:`plan_row` needs for ``row`` (on ``spec``, default the row's device).

    Raises:
        HPUOutOfMemoryError: the micro-step does not fit in the simulated HBM.
    """
    from hpu_runtime.device.spec import get_device_spec

    spec = spec or get_device_spec(row.device)
    full = _trace(row, spec, row.optimizer, flavour, ddp=True)
    micro = _trace(row, spec, "none", flavour, ddp=False) if row.accumulation > 1 else None
    return full, micro


def simulate_row(row: Row, cache: dict | None = None, spec=None) -> RowResult:
    """Trace (once per model, batch and mode in ``cache``) and plan ``row``."""
    from hpu_runtime.tools.tracing import respec

    cache = {} if cache is None else cache
    key = (row.model, row.device, row.micro_batch, row.seq_len, row.model_config, row.mode, row.optimizer,
           row.accumulation > 1, row.bucket_cap_mb if row.mode == "compile" else None)
    if key not in cache:
        cache[key] = trace_row(row)
    traces = cache[key]
    if spec is not None:
        traces = tuple(None if t is None else respec(t, spec) for t in traces)
    return plan_row(row, traces)


# ---- calibration ---------------------------------------------------------------------------------
def _spec(values: dict, device: str):
    """The device's spec with the calibrated constants in ``values`` (keyed like
    :data:`CONSTANTS`) that apply to it."""
    from hpu_runtime.device.spec import get_device_spec

    return dataclasses.replace(get_device_spec(device), **{c.field: values[c] for c in CONSTANTS
                                                          if device in c.devices and c in values})


def _ratio(row: Row, figures: list[dict], cache: dict, values: dict) -> float:
    fig = _published(figures, row)
    published = fig["throughput_samples_per_s"] / (1 if fig.get("per_card") else row.cards)
    return simulate_row(row, cache, _spec(values, row.device)).samples_per_s / published


def fit_device_constants(rounds: int = 3, cache: dict | None = None, log=print) -> dict:
    """Fit :data:`CONSTANTS` jointly: each by bisection on its own figure (simulated /
    published = 1), the others held, for ``rounds`` rounds. Returns ``{Calibrated: value}``."""
    from hpu_runtime.device.spec import get_device_spec

    figures = load_figures()
    cache = {} if cache is None else cache
    values = {c: getattr(get_device_spec(c.devices[0]), c.field) for c in CONSTANTS}
    for r in range(rounds):
        for c in CONSTANTS:
            row = ROWS[c.row]
            whole = isinstance(c.bounds[0], int)
            lo, hi = c.bounds
            for _ in range(20):
                mid = (lo + hi) // 2 if whole else (lo + hi) / 2
                if (_ratio(row, figures, cache, {**values, c: mid}) < 1.0) == c.rises:
                    lo = mid
                else:
                    hi = mid
                if whole and hi - lo <= 1:
                    break
            values[c] = (lo + hi) // 2 if whole else round((lo + hi) / 2, 4)
            log(f"  round {r + 1}: {c.name} = {values[c]} (on {row.label})")
    return values


def fit_host_constants(device: str = "gaudi") -> dict:
    """Solve the host costs from the seed's three host times (NOTE [host costs] in
    :mod:`hpu_runtime.device.spec`): per variant, the mechanism counts of one steady step
    (accumulated ops, launches + replays, host->device copies) times the unknowns equal the
    published time less the PCIe bytes' time. Returns ``host_op_ns``, ``graph_launch_ns``
    (= ``graph_replay_ns``) and ``h2d_copy_ns`` (= ``host_read_ns``)."""
    import numpy as np

    counts = seed_host_ms(device, counts=True)
    a = np.array([[c["ops"], c["launches"] + c["replays"], c["copies"]] for c in counts.values()], dtype=float)
    b = np.array([SEED_HOST_MS[k] * 1e6 - c["pcie_ns"] for k, c in counts.items()])
    op, launch, copy = np.linalg.solve(a, b)
    return {"host_op_ns": round(op), "graph_launch_ns": round(launch), "h2d_copy_ns": round(copy)}


# ---- the seed's MNIST net ------------------------------------------------------------------------
def seed_host_ms(device: str = "gaudi", batch: int = 200, steps: int = 4, counts: bool = False) -> dict:
    """Simulated host time per step (ms) of the seed's MNIST Net in its three variants; with
    ``counts``, each variant's mechanism counts per steady step instead (``ops``,
    ``launches``, ``replays``, ``copies``, ``pcie_ns``, ``host_ns``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hpu_runtime as hpu
    from hpu_runtime.device.cost_model import pcie_ns

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.dropout = nn.Linear(784, 128), nn.Linear(128, 10), nn.Dropout(0.5)

        def forward(self, x):
            x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    g = torch.Generator().manual_seed(0)
    with hpu.bridge_disabled():
        data = [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(steps + 3)]
    out = {}
    for variant in SEED_HOST_MS:
        dev = hpu.reset_device(device)
        torch.manual_seed(0)
        model = Net().to("hpu")
        opt = torch.optim.Adadelta(model.parameters(), lr=0.1)
        if variant == "capture/replay":
            si = torch.randn(batch, 1, 28, 28, device="hpu")
            st = torch.randint(0, 10, (batch,), device="hpu")
            opt.zero_grad(set_to_none=True)
            graph = hpu.HPUGraph()
            with hpu.graph(graph):
                F.nll_loss(model(si), st).backward()
                opt.step()

            def step(x, y):
                si.copy_(x.to("hpu"))
                st.copy_(y.to("hpu"))
                graph.replay()
        else:
            fwd = model if variant == "lazy" else hpu.make_graphed_callables(
                model, (torch.randn(batch, 1, 28, 28, device="hpu"),))

            def step(x, y):
                x, y = x.to("hpu"), y.to("hpu")
                opt.zero_grad(set_to_none=True)
                F.nll_loss(fwd(x), y).backward()
                hpu.mark_step()
                opt.step()
                hpu.mark_step()
        for x, y in data[:3]:
            step(x, y)
        dev.begin_step()
        hosts = []
        for x, y in data[3:]:
            before = (dev.ops_recorded, dev.graphs_launched, dev.replays)
            dev.log = []
            step(x, y)
            copies = [ev[1] for ev in dev.log if ev[0] == "h2d"]
            dev.log = None
            hosts.append(dev.end_step().host_ns)
            after = (dev.ops_recorded, dev.graphs_launched, dev.replays)
        if len(set(hosts[-2:])) != 1:
            raise RuntimeError(f"{variant}: no steady state in {steps} steps: host ns {hosts}")
        if counts:
            ops, launches, replays = (a - b for a, b in zip(after, before))
            out[variant] = {"ops": ops, "launches": launches, "replays": replays, "copies": len(copies),
                            "pcie_ns": sum(pcie_ns(dev.spec, n) for n in copies), "host_ns": hosts[-1]}
        else:
            out[variant] = hosts[-1] / 1e6
    hpu.reset_device()
    return out


# ---- the tables ------------------------------------------------------------------------------------
def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def throughput_table(figures: list[dict], cache: dict) -> tuple[list, dict]:
    """Table 1's rows and ``{row index: (published, RowResult)}``."""
    from hpu_runtime.device.memory import HPUOutOfMemoryError
    from hpu_runtime.device.spec import get_device_spec

    role = {c.row: f"fit: {c.field}" for c in CONSTANTS}
    rows, results = [], {}
    for i, row in enumerate(ROWS):
        fig = _published(figures, row)
        if fig is None:
            continue
        pub = fig["throughput_samples_per_s"] / (1 if fig.get("per_card") else row.cards)
        head = [row.model + (f"@{row.seq_len}" if row.seq_len else ""), row.device, row.cards, row.batch,
                row.ran_in, row.mode, _traced(row)]
        try:
            r = simulate_row(row, cache)
        except HPUOutOfMemoryError as exc:
            rows.append([*head, f"{pub:,.0f}", "HBM OOM", "-", "-", "-", "-", "-", "-", "-", role.get(i, "check")])
            print(f"  {row.label}: {exc}")
            continue
        results[i] = (pub, r)
        bound = "device" if r.device_ns >= max(r.host_ns, r.exposed_comm_ns) else (
            "host" if r.host_ns >= r.exposed_comm_ns else "comm")
        hbm = f"{r.peak_hbm_bytes / 2**30:.0f}/{get_device_spec(row.device).hbm_bytes / 2**30:.0f}"
        rows.append([*head, f"{pub:,.0f}", f"{r.samples_per_s:,.0f}", f"{r.samples_per_s / pub:.2f}", _ms(r.step_ns),
                     _ms(r.device_ns), _ms(r.host_ns), _ms(r.exposed_comm_ns), bound, hbm, role.get(i, "check")])
    return rows, results


def _traced(row: Row) -> str:
    out = f"{row.micro_batch}"
    if row.accumulation > 1:
        out += f" x{row.accumulation}"
    if row.samples_per_sequence != 1.0:
        out += f" (x{row.samples_per_sequence:g} packed)"
    return out


def _scaling(results: dict) -> list:
    eff = []
    for i, (pub, r) in results.items():
        row = ROWS[i]
        if row.cards == 8:
            continue
        base = next((j for j, (p, q) in results.items() if ROWS[j].cards == 8 and (ROWS[j].model, ROWS[j].device,
                     ROWS[j].seq_len, ROWS[j].software) == (row.model, row.device, row.seq_len, row.software)), None)
        if base is None:
            continue
        bp, br = results[base]
        eff.append([row.model, row.device, row.seq_len or "-", f"8 -> {row.cards}", f"{pub / bp:.3f}",
                    f"{r.samples_per_s / br.samples_per_s:.3f}",
                    f"{(r.samples_per_s / br.samples_per_s - pub / bp) * 100:+.1f}"])
    return sorted(eff, key=str)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.bench_fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-host", action="store_true", help="leave out the seed host-time table")
    p.add_argument("--refit", action="store_true",
                   help="fit the calibrated constants again from scratch and print them beside the spec's (minutes)")
    args = p.parse_args(argv)
    from hpu_runtime.device.spec import get_device_spec

    wall0 = time.perf_counter()
    figures = load_figures()
    cache: dict = {}
    rows, results = throughput_table(figures, cache)
    print("Per-card training throughput (samples/s per card; simulated: bf16, the published run's mode, micro-batch,"
          " packing, accumulation,\noptimizer and all-reduce; times per card per optimizer step, simulated ms; HBM:"
          " the micro-step's simulated peak / the card's, GiB)")
    print(tabulate(rows, headers=["model", "device", "cards", "batch", "published run", "planned", "traced",
                                  "published", "simulated", "ratio", "step", "device", "host", "exposed comm",
                                  "bound", "HBM", "role"], tablefmt="github"))
    print("\nScaling efficiency (per-card throughput at N cards / at 8 cards)")
    print(tabulate(_scaling(results), headers=["model", "device", "seq", "cards", "published", "simulated",
                                               "points"], tablefmt="github"))
    if not args.skip_host:
        sim = seed_host_ms()
        print("\nHost time per step, seed MNIST Net (batch 200, Adadelta, first-gen Gaudi), ms")
        print(tabulate([[k, SEED_HOST_MS[k], f"{sim[k]:.2f}", f"{sim[k] / SEED_HOST_MS[k]:.2f}"] for k in SEED_HOST_MS],
                       headers=["variant", "published", "simulated", "ratio"], tablefmt="github"))
    consts = [[c.name, getattr(get_device_spec(c.devices[0]), c.field), ROWS[c.row].label,
               f"{results[c.row][1].samples_per_s / results[c.row][0]:.3f}" if c.row in results else "-"]
              for c in CONSTANTS]
    gen1 = get_device_spec("gaudi")
    consts += [[f"{name} (every generation)", getattr(gen1, name), "seed host times (3 variants, exact)", "table 3"]
               for name in ("host_op_ns", "graph_launch_ns", "h2d_copy_ns")]
    fitted_rows = {c.row for c in CONSTANTS}
    checks = [r.samples_per_s / pub for i, (pub, r) in results.items() if i not in fitted_rows]
    print("\nCalibrated constants (NOTE [calibration] in hpu_runtime/device/spec.py)")
    print(tabulate(consts, headers=["constant", "value", "fitted on", "ratio there"], tablefmt="github"))
    if checks:
        print(f"Residuals on the {len(checks)} other rows (simulated / published): "
              f"{min(checks):.2f} .. {max(checks):.2f}")
    if args.refit:
        print("\nRefit from scratch (device constants jointly, by bisection; host constants exactly):")
        device = fit_device_constants(cache=cache)
        host = fit_host_constants()
        table = [[c.name, v, getattr(get_device_spec(c.devices[0]), c.field)] for c, v in device.items()]
        table += [[name, v, getattr(gen1, name)] for name, v in host.items()]
        print(tabulate(table, headers=["constant", "refit", "spec"], tablefmt="github"))
    print(f"\n(wall-clock {time.perf_counter() - wall0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
