"""Published Gaudi training runs as they executed, planned the same way (for the fidelity benchmark).

Published figures live in ``models/published_figures.toml`` (each with its primary source:
MLCommons training results logs, Intel / Habana performance pages). Each :class:`Row` of
:data:`ROWS` says how the published run executed -- PyTorch lazy mode, lazy mode with an HPU
graph, TensorFlow graph mode, ``torch.compile`` -- and with which micro-batch, sequence
packing, gradient accumulation, optimizer and gradient all-reduce, each from the run's own
launch script or README (the row's ``source``). :func:`simulate_row` plans the row in that
mode: one step traced without data (:func:`hpu_runtime.tools.tracing.trace_step`, bf16
autocast) and planned on the published card count with DDP's buckets
(:func:`hccl.sim.ddp_plan.plan_ddp_step`); with gradient accumulation, the first
``accumulation - 1`` micro-steps are forward and backward only (no all-reduce, no update).
:class:`RowResult` has the planned step per card and per optimizer step (simulated ns) and
the mechanisms behind it (ops, launches, replays, copies).
"""

from __future__ import annotations

import tomllib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA", "MLPERF_BERT_CHECKPOINT_STEPS", "ROWS", "Row", "RowResult", "checkpoint_ns", "load_figures",
           "plan_row", "published_figure", "simulate_row", "trace_row"]

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
    autocast_ops: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    """The run's own autocast op lists ``(bf16 ops, fp32 ops)``, traced with
    :func:`hpu_runtime.bridge.autocast.op_lists`; None: the default lists."""
    topology: str | None = None
    """The system it ran on (:mod:`hccl.sim.topologies`); None: the generation's 8-card box
    (``hls1``, ``hls2``, ``hls3``)."""
    checkpoint_every: int | None = None
    """Optimizer steps between the run's checkpoints, each a copy of the model's state dict
    to the host that the published block time includes (NOTE [a block's checkpoint]); None:
    the figure's time has none."""
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
        for name in ("cards", "batch", "micro_batch", "accumulation", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"Row {self.label}: {name} must be >= 1")
        if not self.samples_per_sequence >= 1.0:
            raise ValueError(f"Row {self.label}: samples_per_sequence must be >= 1")
        if self.topology is not None:
            from hccl.sim.topology import builtin_topologies

            if self.topology not in builtin_topologies():
                raise ValueError(f"Row {self.label}: unknown topology {self.topology!r}; known: "
                                 f"{', '.join(builtin_topologies())}")

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
_MLPERF_V11_SYSTEM = "hls1h"
"""Where Habana's MLPerf v1.1 (first-gen, TensorFlow) results ran: HLS-1H nodes, four cards
each with every RoCE port out to the switches (mlcommons/training_results_v1.1
Intel-HabanaLabs/systems/HLS-1H-N2 ... -N32.json), planned on that system, not on HLS-1's
8-card box."""
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
_BERT_PT_OPS = (("addmm", "bmm", "dropout", "gelu", "linear", "layer_norm", "matmul", "mm", "softmax"),
                 ("embedding", "nll_loss", "truediv", "log_softmax"))
"""The mixed-precision op lists Habana's PyTorch BERT scripts pass (``--hmp --hmp_bf16
ops_bf16_bert_pt.txt --hmp_fp32 ops_fp32_bert_pt.txt``; the files in HabanaAI/Model-References
PyTorch/nlp/bert/; the MLPerf v3.0 launch_bert_pytorch.sh passes files of the same names from its
PyTorch folder, ASSUMED to hold the same lists): softmax, layer_norm and dropout in bf16, where
torch's default lists keep softmax and layer_norm in fp32 (a BERT-Large layer at seq 512 then
keeps a fp32 copy of every attention-probability tensor for backward)."""
_MR_RN50_COMPILE = ("Intel Gaudi reference models page, 'ResNet50 LARS (torch.compile)'; Model-References "
                    "torchvision ResNet-50 (bucket_cap_mb=256, gradient_as_bucket_view)")


# NOTE [a block's checkpoint]
# The MLPerf v3.0 Gaudi2 PyTorch BERT figures are samples per block over the block's time
# (block_start -> block_stop in the result logs). In that run a block is training only:
# evaluation runs after training, on the checkpoints it saved (run_pretraining.py, its
# `if args.do_eval:` section, which logs eval_accuracy with the block's timestamp). What a
# block adds to its steps is the checkpoint at its end: the node's local rank 0 builds
# `{k: v.to('cpu') for k, v in model.state_dict().items()}` (async_checkpoint, the default;
# --checkpoint_filter model) and hands it to a saver process. Every
# SAVE_CHECKPOINTS_STEPS optimizer steps (launch_bert_pytorch.sh: 335 on 8 cards, 57 on 64),
# the same fixed cost whatever the cards, so it weighs 6x more on 64 cards' 8 s blocks than
# on 8 cards' 52 s ones. It is charged as the bridge charges that code: one host read per
# state-dict tensor (hpu_runtime.device.cost_model.state_dict_to_host_ns; the model's
# parameters, fp32). Not charged: the saver's torch.save (another process) and the queue's
# pickling into shared memory (the queue's feeder thread).
MLPERF_BERT_CHECKPOINT_STEPS = {8: 335, 64: 57}
"""SAVE_CHECKPOINTS_STEPS in launch_bert_pytorch.sh (MLPerf v3.0 Intel-HabanaLabs HLS-Gaudi2-PT)."""


def _mlperf_bert(device: str, cards: int, batch: int, micro: int) -> Row:
    """An MLPerf BERT row: Gaudi2, PyTorch with an HPU graph and FastDDP's one bf16 all-reduce;
    first-gen, TensorFlow graph mode, two micro-steps, Horovod."""
    if device == "gaudi2":
        return Row(model="bert-large", device=device, cards=cards, batch=batch, seq_len=512, software="PyTorch 1.13.1",
                   model_config=_BERT_ATTENTION, ran_in="PyTorch lazy + HPU graph, FastDDP", mode="hpu_graphs",
                   micro_batch=micro, samples_per_sequence=2.0, optimizer="fused-lamb", comm_hook="bf16",
                   autocast_ops=_BERT_PT_OPS, checkpoint_every=MLPERF_BERT_CHECKPOINT_STEPS[cards],
                   source=_MLPERF_BERT_PT)
    return Row(model="bert-large", device=device, cards=cards, batch=batch, seq_len=512, software="TensorFlow 2.5.1",
               model_config=_BERT_ATTENTION, ran_in="TensorFlow graph", mode="compile", micro_batch=micro,
               samples_per_sequence=2.0, accumulation=2, optimizer="fused-lamb", bucket_cap_mb=64,
               topology=_MLPERF_V11_SYSTEM, source=_MLPERF_BERT_TF)


def _mr_bert(cards: int, batch: int, seq: int, micro: int, packing: float, accumulation: int) -> Row:
    """A Model-References BERT pretraining row (first-gen, PyTorch lazy): ``micro`` packed
    sequences per micro-step, ``accumulation`` micro-steps, one fp16 all-reduce after them."""
    return Row(model="bert-large", device="gaudi", cards=cards, batch=batch, seq_len=seq, software="PyTorch lazy",
               model_config=_BERT_ATTENTION, ran_in="PyTorch lazy", mode="lazy", micro_batch=micro,
               samples_per_sequence=packing, accumulation=accumulation, optimizer="fused-lamb", comm_hook="fp16",
               autocast_ops=_BERT_PT_OPS, source=_MR_BERT)


ROWS: tuple[Row, ...] = (
    Row(model="resnet50", device="gaudi2", cards=8, batch=256, software="PyTorch 2.0.1", micro_batch=256,
        ran_in="PyTorch lazy, FusedLARS", mode="lazy", bucket_cap_mb=200, source=_MLPERF_RN50_PT),
    Row(model="resnet50", device="gaudi2", cards=8, batch=256, software="TensorFlow 2.13.0", micro_batch=256,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
    _mlperf_bert("gaudi2", 8, 56, 28),
    _mlperf_bert("gaudi2", 64, 48, 24),
    *(Row(model="resnet50", device="gaudi", cards=cards, batch=batch, software="TensorFlow 2.5.1", micro_batch=batch,
          ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, topology=_MLPERF_V11_SYSTEM, source=_TF_GRAPH)
      for cards, batch in ((8, 256), (64, 128), (256, 64))),
    _mlperf_bert("gaudi", 8, 56, 14),
    _mlperf_bert("gaudi", 64, 48, 12),
    *(_mr_bert(cards, batch, seq, micro, spp, accumulation) for cards, batch, seq, micro, spp, accumulation in (
        (8, 64, 128, 64, 1.2, 107), (32, 64, 128, 64, 1.2, 27), (8, 16, 512, 8, 2.0, 256), (32, 16, 512, 8, 2.0, 64))),
    Row(model="resnet50", device="gaudi", cards=8, batch=256, software="PyTorch (torch.compile)", micro_batch=256,
        ran_in="torch.compile", mode="compile", bucket_cap_mb=256, source=_MR_RN50_COMPILE),
    Row(model="resnet50", device="gaudi", cards=32, batch=256, software="PyTorch (torch.compile)", micro_batch=256,
        ran_in="torch.compile", mode="compile", bucket_cap_mb=256, source=_MR_RN50_COMPILE),
    # grouped convolutions (32 groups of 4-32 channels): the one row whose MME work is not dense
    Row(model="resnext101", device="gaudi", cards=8, batch=128, software="TensorFlow 2.5.0", micro_batch=128,
        ran_in="TensorFlow graph", mode="compile", bucket_cap_mb=64, source=_TF_GRAPH),
)
"""The rows compared, in table order."""


def load_figures(path: Path = DATA) -> list[dict]:
    """The published figures (one dict per ``[[figure]]`` table)."""
    with open(path, "rb") as f:
        return tomllib.load(f)["figure"]


def published_figure(figures: list[dict], row: Row) -> dict | None:
    """The figure of ``figures`` that ``row`` compares with, or None."""
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
        samples_per_s: simulated throughput per card (per optimizer step and its share of
            the checkpoints).
        step_ns, device_ns, host_ns, exposed_comm_ns: the optimizer step, the compute
            stream busy in it, the host thread busy in it, communication not under compute.
        checkpoint_ns: the run's checkpoint (NOTE [a block's checkpoint]) per optimizer step,
            amortized over ``Row.checkpoint_every`` steps; 0 without one.
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
    checkpoint_ns: int = 0


def checkpoint_ns(trace) -> int:
    """One checkpoint of a traced model (NOTE [a block's checkpoint]): its parameters copied to
    the host one by one on the trace's device spec, simulated ns."""
    from hpu_runtime.device.cost_model import state_dict_to_host_ns

    return state_dict_to_host_ns(trace.spec, (p.nbytes for p in trace.params))


def _trace(row: Row, spec, optimizer: str, flavour: str | None, ddp: bool):
    from hpu_runtime.bridge.autocast import op_lists
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    kwargs = {"seq_len": row.seq_len} if row.seq_len else {}
    kwargs.update(row.model_config)
    name = f"{row.model}:{flavour}" if flavour else row.model
    # compile mode under DDP: the model is compiled broken at the buckets (DDPOptimizer)
    cap = row.bucket_cap_mb if ddp and row.mode == "compile" else None
    lists = op_lists(*row.autocast_ops) if row.autocast_ops else nullcontext()
    with lists:
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
    traced on the device spec to plan with (see :func:`hpu_runtime.tools.replay.respec`)."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.tools.replay import summarize

    full, micro = traces
    topology = row.topology or {"gaudi": "hls1", "gaudi2": "hls2", "gaudi3": "hls3"}[row.device]
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
    ckpt = checkpoint_ns(full) // row.checkpoint_every if row.checkpoint_every else 0
    return RowResult(samples_per_s=row.samples_per_step / ((step + ckpt) * 1e-9), step_ns=step, device_ns=device,
                     host_ns=host, exposed_comm_ns=t.exposed_comm_ns, ops=ops, replayed_ops=replayed,
                     launches=launches, replays=replays, copies=copies, copied_bytes=copied,
                     buckets=len(plan.buckets), peak_hbm_bytes=full.peak_hbm_bytes, checkpoint_ns=ckpt)


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
    from hpu_runtime.tools.replay import respec

    cache = {} if cache is None else cache
    key = (row.model, row.device, row.micro_batch, row.seq_len, row.model_config, row.mode, row.optimizer,
           row.accumulation > 1, row.bucket_cap_mb if row.mode == "compile" else None, row.autocast_ops)
    if key not in cache:
        cache[key] = trace_row(row)
    traces = cache[key]
    if spec is not None:
        traces = tuple(None if t is None else respec(t, spec) for t in traces)
    return plan_row(row, traces)
