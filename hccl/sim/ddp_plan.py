"""The planned DDP step: a traced step re-timed with DDP's buckets on N ranks of a topology.

NOTE [what DDP does to a lazy-mode step, replayed]
:func:`ddp_buckets` reproduces the bucket assignment DDP's reducer uses from the second
iteration on (torch 2.13, ``torch/nn/parallel/distributed.py`` and ``reducer.cpp``): the
parameters are re-bucketed in the order their gradients became ready in the first backward
(``Reducer::rebuild_buckets``), by torch's own ``dist._compute_bucket_assignment_by_size``
with the size limits ``[first_bucket_bytes_cap, bucket_bytes_cap]``. The first cap is
``dist._DEFAULT_FIRST_BUCKET_BYTES`` only when ``bucket_cap_mb`` is left at its default;
an explicit ``bucket_cap_mb`` also caps the first bucket (``_BucketCapacityConfig.create``).
Frozen parameters are not bucketed and a tied parameter counts once, as in
:func:`hpu_runtime.tools.tracing.ddp_parameters`.

:func:`plan_ddp_step` replays the traced step (:func:`hpu_runtime.tools.replay.replay`) and
inserts what the reducer does in a live run, through the same device code:

* when a gradient is produced, the reducer's autograd hook copies it, divided by the world
  size, into its bucket view (one ``aten.mul.out`` op, or ``copy_`` under a comm hook);
* when a bucket is complete and every earlier bucket has been launched, its allreduce is
  issued: in default lazy mode that launches the accumulated graph (a graph cut, as
  ``ProcessGroupHCCL::collective()`` runs a step marker first), then the allreduce runs on
  the collective stream, timed by :func:`hccl.sim.timing.collective_times` (the planner); with
  lazy collectives it joins the graph and runs when the graph does;
* at the end of backward, without ``gradient_as_bucket_view``, each gradient is copied back
  from its bucket (``copy_``), reading the allreduce's output; with it, the optimizer reads
  the bucket views directly. Either way no device work that reads a bucket starts before
  its allreduce ends.

Under ``torch.compile(DDP(model))`` (the ``compile`` mode) the trace is compiled as the live
run is, broken by DDPOptimizer at DDP's bucket sizes (``StepTrace.ddp_split``, which must be
this plan's): each piece's backward is a compiled region that ends before its gradients are
ready, so the reducer's copies (eager ops) and a full bucket's allreduce run between regions,
the allreduce overlapping the backward regions still to come.

Every rank of a data-parallel job runs the same ops, so on nominal cards every rank is ready
for a bucket's allreduce at the same simulated time; the planner is given that time for all
ranks. With variability or slow cards the ranks differ and are replayed in lock step
(:mod:`hccl.sim.straggler_plan`). The
result is the steady-state step (see :func:`hpu_runtime.tools.replay.run_replays`); it equals a
live ``torchrun`` run's steady-state step with the same model, batch, flags, world size
and topology (tested).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpu_runtime import SimDevice
from hpu_runtime.device.cost_model import op_cost
from hpu_runtime.device.lazy_graph import OpRecord
from hpu_runtime.device.timeline import StepTimes
from hpu_runtime.tools.replay import replay, replay_device, run_replays
from hpu_runtime.tools.tracing import StepTrace, ddp_graph_split

from .timing import collective_times
from .topology import Topology, load_topology
from .variability import Variability
from .whatif import WhatIf, link_faults

__all__ = ["DEFAULT_BUCKET_CAP_MB", "Bucket", "PlannedStep", "ddp_buckets", "grad_ready_order",
           "plan_ddp_step", "COMM_HOOKS"]

DEFAULT_BUCKET_CAP_MB = 25.0
"""DDP's default ``bucket_cap_mb`` (torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB)."""

COMM_HOOKS = ("none", "fp16", "bf16")
"""DDP communication hooks the planner knows: none (allreduce, the default), and torch's
``fp16_compress_hook`` / ``bf16_compress_hook`` (cast the bucket to 16 bits, allreduce,
cast back)."""

_MB = 1024 * 1024
_SERIAL_BASE = 1 << 40  # bucket buffers' serials, apart from the trace's storages


@dataclass(frozen=True, slots=True)
class Bucket:
    """One DDP bucket in reduction order.

    Attributes:
        params: parameter indices (DDP order) in the bucket, in bucket order.
        nbytes: bytes of the bucket's gradients (the allreduce size without a comm hook).
        ready_ns: when its allreduce could start (simulated ns from the step's start).
        start_ns, end_ns: its allreduce on the collective stream (simulated ns from the step's start).
    """

    params: tuple[int, ...]
    nbytes: int
    ready_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """A planned steady-state DDP step on ``world_size`` ranks (simulated ns, per card).

    Attributes:
        times: the step breakdown (step, compute, comm, exposed comm, host).
        buckets: per bucket, in reduction order, with its allreduce interval.
        graph_launches: graphs launched in the step.
        graphs: ``(reason, ops, device_ns)`` per launched graph.
        algorithm: the allreduce algorithm the planner chose for the largest bucket.
        samples: with variability, every planned step's breakdown after the warm-up (``times``
            is then the median one), rank 0's, as a live run's rank 0 has them; empty for the
            steady state.
        job_steps: with variability, the job's step (simulated ns) at each of ``samples``: the
            increase of the latest step end among the ranks (NOTE [the job's step] in
            :mod:`hccl.sim.straggler_plan`); empty for the steady state.
    """

    times: StepTimes
    buckets: tuple[Bucket, ...]
    graph_launches: int
    graphs: tuple[tuple[str, int, int], ...]
    algorithm: str
    samples: tuple[StepTimes, ...] = ()
    job_steps: tuple[int, ...] = ()


def grad_ready_order(trace: StepTrace) -> list[int]:
    """Parameter indices in the order their gradients became ready in the traced backward;
    parameters whose gradient never became ready (unused) follow in reverse index order."""
    order = [ev[1][1] for ev in trace.events if ev[0] == "mark" and ev[1][0] == "grad_ready"]
    seen = set(order)
    return order + [i for i in reversed(range(len(trace.params))) if i not in seen]


def _caps(bucket_cap_mb: float | None, first_bucket_mb: float | None) -> tuple[int, int]:
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    if first_bucket_mb is not None and not first_bucket_mb > 0:
        raise ValueError(f"first_bucket_mb must be > 0, got {first_bucket_mb!r}")
    if bucket_cap_mb is None:  # DDP's default: 25 MB buckets after a small first bucket
        first = int(first_bucket_mb * _MB) if first_bucket_mb is not None else dist._DEFAULT_FIRST_BUCKET_BYTES
        return first, int(DEFAULT_BUCKET_CAP_MB * _MB)
    cap = int(bucket_cap_mb * _MB)
    return cap, cap


def ddp_buckets(trace: StepTrace, bucket_cap_mb: float | None = DEFAULT_BUCKET_CAP_MB, *,
                first_bucket_mb: float | None = None) -> list[Bucket]:
    """DDP's rebuilt buckets (reduction order) for the traced model.

    Args:
        trace: the traced step (parameters and their gradient-ready order).
        bucket_cap_mb: DDP's ``bucket_cap_mb`` in MiB; None = DDP's default (25 MiB with a
            first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES``).
        first_bucket_mb: the value of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` in MiB (as
            Habana's scripts set it); torch 2.13 uses it only when ``bucket_cap_mb`` is None.

    Raises:
        ValueError: a non-positive cap.
    """
    first, cap = _caps(bucket_cap_mb, first_bucket_mb)
    order = grad_ready_order(trace)
    if not order:
        return []
    tensors = [torch.empty(trace.params[i].numel, dtype=trace.params[i].torch_dtype, device="meta")
               for i in order]
    indices, _limits = dist._compute_bucket_assignment_by_size(tensors, [first, cap], [False] * len(order), order)
    return [Bucket(params=tuple(b), nbytes=sum(trace.params[i].nbytes for i in b)) for b in indices]


def _topology(topology: str | Topology, world_size: int) -> Topology:
    if isinstance(topology, Topology):
        return topology if topology.world_size == world_size else topology.with_world_size(world_size)
    try:
        return load_topology(topology, world_size=world_size)
    except ValueError as exc:
        raise ValueError(f"topology {topology!r}: {exc}") from None


def plan_ddp_step(trace: StepTrace, *, world_size: int, topology: str | Topology = "hls2",
                  bucket_cap_mb: float | None = DEFAULT_BUCKET_CAP_MB, first_bucket_mb: float | None = None,
                  gradient_as_bucket_view: bool = False, static_graph: bool = False,
                  comm_hook: str = "none", lazy_collectives: bool | None = None,
                  variability: Variability | None = None, whatif: WhatIf | None = None,
                  steps: int = 0, lockstep: bool | None = None) -> PlannedStep:
    """The steady-state DDP step of ``trace`` on ``world_size`` ranks of ``topology``.

    Args:
        trace: a traced step (:func:`hpu_runtime.tools.tracing.trace_step`).
        world_size: data-parallel ranks (one card each).
        topology: a built-in name (``hls1``, ``hls2``, ``hls3``, ``hls1h``, ``dl1``), a topology
            file, or a :class:`~hccl.sim.topology.Topology`.
        bucket_cap_mb, first_bucket_mb: see :func:`ddp_buckets`.
        gradient_as_bucket_view: gradients are views of the buckets (no copy back).
        static_graph: DDP's ``static_graph``; after the first iteration it buckets and
            reduces exactly as without it (kept for the record).
        comm_hook: one of :data:`COMM_HOOKS`.
        lazy_collectives: ``PT_HPU_ENABLE_LAZY_COLLECTIVES`` (default: the trace's setting):
            in lazy mode each allreduce joins the graph instead of cutting it, and runs when
            the graph does (NOTE [lazy collectives] in :mod:`hpu_runtime.device.card`).
        variability, whatif: slower cards step by step (:mod:`hccl.sim.variability`), slow
            cards and links (:mod:`hccl.sim.whatif`); with either, ``steps`` steps are
            planned one by one (:mod:`hccl.sim.straggler_plan`) instead of the steady state.
        steps: steps to plan with variability (default 16 after the warm-up steps).
        lockstep: with variability, replay every rank (True: what a live run would give) or
            rank 0 and a stand-in for the others (False, cheaper: within 0.4% of every rank at 8
            ranks); default: every rank up to 8 ranks (NOTE [planning slower ranks] in
            :mod:`hccl.sim.straggler_plan`).

    Returns:
        The :class:`PlannedStep` (simulated ns per card).

    Raises:
        ValueError: ``world_size < 1``, a topology that cannot hold ``world_size`` ranks,
            an unknown comm hook, a bad cap, a what-if HCL cannot run with, or a compile-mode
            trace whose graph breaks are not DDPOptimizer's for this cap (see
            :func:`hpu_runtime.tools.tracing.trace_step`).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if comm_hook not in COMM_HOOKS:
        raise ValueError(f"unknown comm hook {comm_hook!r}; known: {', '.join(COMM_HOOKS)}")
    if trace.mode == "compile" and trace.ddp_split != ddp_graph_split(bucket_cap_mb, first_bucket_mb):
        # torch.compile(DDP(model)) breaks the graph at DDPOptimizer's buckets: other regions
        raise ValueError(f"this compile-mode trace was compiled {_split_text(trace.ddp_split)}, but DDP with"
                         f" bucket_cap_mb={bucket_cap_mb} (first bucket {first_bucket_mb or 'default'} MiB) breaks"
                         " the graph elsewhere: trace with trace_step(..., ddp_bucket_cap_mb=bucket_cap_mb,"
                         " ddp_first_bucket_mb=first_bucket_mb)")
    del static_graph  # same buckets and reductions as without it once the graph is known
    lazy_coll = (trace.lazy_collectives if lazy_collectives is None else lazy_collectives) and trace.mode == "lazy"
    topo = _topology(topology, world_size)
    if whatif is not None:
        topo = link_faults(topo, whatif)
    buckets = ddp_buckets(trace, bucket_cap_mb, first_bucket_mb=first_bucket_mb)

    def replayer(rank: int = 0, ready_all=None) -> _Replayer:
        return _Replayer(trace, topo, buckets, world_size, comm_hook, lazy_coll, gradient_as_bucket_view,
                         rank, ready_all)

    if (variability is not None and variability.active) or (whatif is not None and whatif.slow_cards):
        from .straggler_plan import plan_steps
        return plan_steps(replayer, trace, world_size=world_size, variability=variability, whatif=whatif,
                          steps=steps, lockstep=lockstep)
    rep = replayer()
    dev, history, graphs = run_replays(lambda: replay_device(trace.spec, trace.mode), rep.step)
    return rep.planned(dev, history[-1], graphs)


class _Replayer:
    """One rank's replayed DDP steps: the reducer's copies, graph cuts and bucket allreduces
    inserted into the traced step (NOTE [what DDP does to a lazy-mode step, replayed]).

    ``ready_all(ready_ns) -> every rank's ready ns`` gives the other ranks' ready times for a
    bucket's allreduce; default: every rank ready when this one is (they run the same ops)."""

    def __init__(self, trace, topo, buckets, world_size, comm_hook, lazy_coll, gradient_as_bucket_view, rank,
                 ready_all) -> None:
        self.trace, self.buckets = trace, buckets
        params = trace.params
        self.bucket_of = {i: b for b, bk in enumerate(buckets) for i in bk.params}
        bucket_of = self.bucket_of
        bserial = [_SERIAL_BASE + b for b in range(len(buckets))]
        self.bserial = bserial
        self.grad_to_bucket = {p.grad_serial: bserial[bucket_of[i]] for i, p in enumerate(params)
                               if p.grad_serial >= 0 and i in bucket_of}
        spec = trace.spec
        self.copy_in = [_reducer_copy_in(spec, p, bserial[bucket_of[i]], world_size, comm_hook)
                        for i, p in enumerate(params)]
        self.copy_out = [_copy_back(spec, p, bserial[bucket_of[i]]) for i, p in enumerate(params)]
        self.hook_ops = [_hook_ops(spec, bk, bserial[b], comm_hook, params) for b, bk in enumerate(buckets)]
        self.records: list[list] = []  # per replayed step: (ready, start, end) per bucket
        self.algorithms: list[str] = []
        self.topo, self.world_size, self.rank = topo, world_size, rank
        self.lazy_coll, self.as_view = lazy_coll, gradient_as_bucket_view
        self.ready_all = ready_all if ready_all is not None else (lambda ready: [ready] * world_size)

    def _allreduce(self, dev: SimDevice, b: int, rec: list) -> None:
        pre, post, nbytes, elt = self.hook_ops[b]
        for op in pre:
            dev.append_op(op)
        n, topo, rank = self.world_size, self.topo, self.rank

        def timing(ready: int, everyone: bool = True) -> tuple[int, int, str]:
            return collective_times("allreduce", nbytes, self.ready_all(ready) if everyone else [ready] * n,
                                    rank=rank, dtype_bytes=elt, topology=topo)

        if self.lazy_coll:  # joins the graph; timed when the graph runs (as ProcessGroupHCCL does)
            def on_timed(start: int, end: int, algo: str) -> None:
                rec[b] = (start, start, end)
                self.algorithms.append(algo)

            rec.append(None)
            dev.add_graph_collective(f"allreduce bucket {b}", lambda ready: timing(ready, everyone=False),
                                     serials=(self.bserial[b],), on_timed=on_timed)
        else:
            ready = dev.collective_ready_ns()
            start, end, algo = timing(ready)
            dev.record_collective(f"allreduce bucket {b}", start, end, serials=(self.bserial[b],))
            rec.append((ready, start, end))
            self.algorithms.append(algo)
        for op in post:
            dev.append_op(op)

    def step(self, dev: SimDevice) -> None:
        """Replay one DDP step on ``dev``."""
        buckets, bucket_of = self.buckets, self.bucket_of
        remaining = [len(bk.params) for bk in buckets]
        state = {"next": 0}
        rec: list = []
        self.records.append(rec)

        def on_grad_ready(i: int) -> None:
            if i not in bucket_of:
                return
            b = bucket_of[i]
            dev.append_op(self.copy_in[i])
            remaining[b] -= 1
            while state["next"] < len(buckets) and remaining[state["next"]] == 0:
                self._allreduce(dev, state["next"], rec)
                state["next"] += 1

        def on_backward_end() -> None:
            if not self.as_view:
                for bk in buckets:
                    for i in bk.params:
                        dev.append_op(self.copy_out[i])

        def rewrite(op: OpRecord, phase: str) -> OpRecord:
            if phase != "optimizer" or not self.as_view:
                return op
            return _remap(op, self.grad_to_bucket)

        replay(self.trace, dev, on_grad_ready=on_grad_ready, on_backward_end=on_backward_end, rewrite=rewrite)

    def planned(self, dev: SimDevice, times: StepTimes, graphs, samples: tuple = ()) -> PlannedStep:
        """The :class:`PlannedStep` of the last replayed step on ``dev`` (its breakdown ``times``)."""
        buckets = self.buckets
        step_start = dev.now_ns() - times.step_ns
        last = self.records[-1]
        planned = tuple(
            dataclasses.replace(bk, ready_ns=r - step_start, start_ns=s - step_start, end_ns=e - step_start)
            for bk, (r, s, e) in zip(buckets, last))
        largest = max(range(len(buckets)), key=lambda b: buckets[b].nbytes) if buckets else None
        return PlannedStep(times=times, buckets=planned, graph_launches=len(graphs),
                           graphs=tuple((g.reason, g.ops, g.device_ns) for g in graphs),
                           algorithm=self.algorithms[-len(buckets) + largest] if buckets else "none",
                           samples=tuple(samples))


def _split_text(split: tuple[int, int] | None) -> str:
    if split is None:
        return "as one graph (no DDP)"
    return f"with DDPOptimizer breaks at {split[1] / _MB:g} MiB buckets (first {split[0] / _MB:g} MiB)"


def _remap(op: OpRecord, mapping: dict[int, int]) -> OpRecord:
    if not any(s in mapping for s, _ in op.reads) and not any(w[0] in mapping for w in op.writes):
        return op
    return op._replace(reads=tuple((mapping.get(s, s), n) for s, n in op.reads),
                       writes=tuple((mapping.get(w[0], w[0]), *w[1:]) for w in op.writes),
                       saves=tuple(mapping.get(s, s) for s in op.saves))


def _meta(p, numel: int | None = None, dtype=None) -> torch.Tensor:
    dt = dtype or p.torch_dtype
    return torch.empty(p.numel if numel is None else numel, dtype=dt, device="meta")


def _reducer_copy_in(spec, p, bucket_serial: int, world_size: int, comm_hook: str) -> OpRecord:
    """The reducer's hook for one ready gradient: ``mul_out(bucket_view, grad, 1/world)``
    (``bucket_view.copy_(grad)`` under a comm hook), as reducer.cpp's mark_variable_ready_dense."""
    grad, view = _meta(p), _meta(p)
    if comm_hook == "none":
        func = torch.ops.aten.mul.out
        args, kwargs = (grad, 1.0 / world_size), {"out": view}
    else:
        func = torch.ops.aten.copy_.default
        args, kwargs = (view, grad), {}
    cost = op_cost(spec, func, args, kwargs, view)
    return OpRecord(("ddp.reducer", func, p.numel, p.dtype), cost,
                    ((p.grad_serial, p.nbytes), (bucket_serial, p.nbytes)),
                    ((bucket_serial, p.nbytes, False, False),))


def _copy_back(spec, p, bucket_serial: int) -> OpRecord:
    """Finalize without gradient_as_bucket_view: ``grad.copy_(bucket_view)``."""
    grad, view = _meta(p), _meta(p)
    cost = op_cost(spec, torch.ops.aten.copy_.default, (grad, view), {}, grad)
    return OpRecord(("ddp.copy_back", p.numel, p.dtype), cost,
                    ((p.grad_serial, p.nbytes), (bucket_serial, p.nbytes)),
                    ((p.grad_serial, p.nbytes, False, False),))


def _hook_ops(spec, bk: Bucket, serial: int, comm_hook: str, params) -> tuple[list, list, int, int]:
    """(ops before the allreduce, ops after it, allreduce bytes, bytes per element)."""
    dtype = params[bk.params[0]].torch_dtype if bk.params else torch.float32
    numel = sum(params[i].numel for i in bk.params)
    elt = dtype.itemsize
    if comm_hook == "none":
        return [], [], bk.nbytes, elt
    half = torch.float16 if comm_hook == "fp16" else torch.bfloat16
    full, low = torch.empty(numel, dtype=dtype, device="meta"), torch.empty(numel, dtype=half, device="meta")
    low_serial = serial + (1 << 20)
    cast = op_cost(spec, torch.ops.aten._to_copy.default, (full,), {"dtype": half}, low)
    div = op_cost(spec, torch.ops.aten.div_.Scalar, (low, 2), {}, low)
    back = op_cost(spec, torch.ops.aten.copy_.default, (full, low), {}, full)
    pre = [OpRecord(("hook.cast", numel), cast, ((serial, bk.nbytes),), ((low_serial, numel * half.itemsize, True, False),)),
           OpRecord(("hook.div", numel), div, ((low_serial, numel * half.itemsize),),
                    ((low_serial, numel * half.itemsize, False, False),))]
    post = [OpRecord(("hook.decompress", numel), back, ((serial, bk.nbytes), (low_serial, numel * half.itemsize)),
                     ((serial, bk.nbytes, False, False),))]
    return pre, post, numel * half.itemsize, half.itemsize
