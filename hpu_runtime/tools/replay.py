"""A traced step replayed on a device: the same events, other launch points (the planner's side).

:func:`replay` feeds a trace's events (:class:`~hpu_runtime.tools.tracing.StepTrace`) to a
device again, with callbacks where gradients become ready and where backward ends:
``hccl.sim.ddp_plan`` inserts DDP's reducer copies, graph launches and bucket allreduces there,
so a planned step runs the very code a live step does. :func:`run_replays` repeats a step
until it is steady; :func:`summarize` splits one card's steady step into phases;
:func:`respec` prices a trace's ops on another device spec without tracing again
(:func:`map_records` rewrites every op record of a trace).

Simulated times are integer ns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..bridge.fallback import FallbackPolicy
from ..bridge.launcher import CapturedGraph
from ..bridge.sim_device import SimDevice
from ..device.lazy_graph import OpRecord
from ..device.spec import DeviceSpec

if TYPE_CHECKING:
    from .tracing import StepTrace

__all__ = ["StepSummary", "map_records", "replay", "replay_device", "respec", "run_replays", "summarize"]


def map_records(trace: StepTrace, record: Callable[[OpRecord], OpRecord], view=None, **changes) -> StepTrace:
    """``trace`` with ``record`` applied to every op record (replayed HPU graphs' included),
    ``view`` to every view's key (if given), and ``changes`` to its fields (a new trace; the
    original is left as it is)."""
    events = []
    for ev in trace.events:
        if ev[0] == "op":
            events.append(("op", record(ev[1])))
        elif ev[0] == "replay":
            events.append(("replay", tuple(record(op) for op in ev[1]), *ev[2:]))
        elif ev[0] == "view" and view is not None:
            events.append(("view", view(ev[1])))
        else:
            events.append(ev)
    return dataclasses.replace(trace, events=events, **changes)


def respec(trace: StepTrace, spec: DeviceSpec) -> StepTrace:
    """``trace`` with every op priced on ``spec`` (the same ops, FLOPs and bytes): a what-if
    on the device's rates and efficiencies without tracing again.

    The host costs and HBM size are read from the spec when the trace is replayed, so they
    follow too; the HBM peak is the traced one (bytes do not change).
    """
    from ..device.cost_model import recost

    costs: dict = {}

    def priced(op: OpRecord) -> OpRecord:
        cost = costs.get(id(op.cost))
        if cost is None:
            cost = costs[id(op.cost)] = recost(spec, op.cost)
        return op._replace(cost=cost)

    return map_records(trace, priced, spec=spec)


def replay_device(spec: DeviceSpec, mode: str, *, fallback: FallbackPolicy | None = None) -> SimDevice:
    """A fresh device for a steady-state step: ``spec`` with free compiles (every graph of a
    steady-state step hits the recipe cache), lazy unless ``mode`` is eager or compile
    (``hpu_graphs`` is lazy mode with HPU graphs);
    ``fallback``: the CPU-fallback policy (default: Gaudi's dtypes and ops only)."""
    return SimDevice(dataclasses.replace(spec, compile_base_ns=0, compile_per_op_ns=0),
                     lazy=mode in ("lazy", "hpu_graphs"), fallback=fallback)


def replay(trace: StepTrace, dev: SimDevice, *, on_grad_ready: Callable[[int], None] | None = None,
           on_backward_end: Callable[[], None] | None = None,
           rewrite: Callable[[OpRecord, str], OpRecord] | None = None) -> None:
    """Feed one traced step's events to ``dev`` (simulated time advances on ``dev``).

    Launches the device makes by itself (eager ops, ``PT_HPU_MAX_COMPOUND_OP_SIZE``, host
    reads, collectives) happen again by themselves; a logged launch with nothing pending
    is a no-op.

    Args:
        trace: the step.
        dev: the device to charge (its mode and spec should be the trace's).
        on_grad_ready: called with the parameter index (DDP order) right after the op that
            produces that gradient, as DDP's autograd hook would run.
        on_backward_end: called when backward returns (where DDP finalizes its buckets).
        rewrite: maps each op record before it is charged, those of a replayed HPU graph
            too; also told the phase (``"forward"``, ``"backward"``, ``"optimizer"``).
    """
    phase = "forward"
    for ev in trace.events:
        kind = ev[0]
        if kind == "op":
            dev.append_op(ev[1] if rewrite is None else rewrite(ev[1], phase))
        elif kind == "launch":
            if ev[1] != "eager":
                dev.launch(ev[1])
        elif kind == "view":
            dev.append_view(ev[1])
        elif kind == "h2d":
            dev.charge_h2d(ev[1])
        elif kind == "host_read":
            dev.read_serial(ev[1], ev[2])
        elif kind == "region":
            dev.set_region(ev[1])
        elif kind == "replay":
            dev.replay(CapturedGraph(ev[1] if rewrite is None else tuple(rewrite(op, phase) for op in ev[1]),
                                     segments=ev[3] if len(ev) > 3 else None), ev[2])
        elif kind == "mark":
            payload = ev[1]
            if payload[0] == "grad_ready":
                if on_grad_ready is not None:
                    on_grad_ready(payload[1])
            elif payload == ("phase", "forward_end"):
                phase = "backward"
            elif payload == ("phase", "backward_end"):
                phase = "optimizer"
                if on_backward_end is not None:
                    on_backward_end()


def run_replays(make_device: Callable[[], SimDevice], step: Callable[[SimDevice], None],
                *, max_steps: int = 12) -> tuple[SimDevice, list, list]:
    """Run ``step`` on one device until the step time repeats; returns (device, step times,
    the last step's :class:`GraphInfo` list).

    A step's length depends on how far the host ran ahead in the previous one, so the
    steady state is reached after a few steps; it is declared when two consecutive steps
    have the same :class:`~hpu_runtime.device.timeline.StepTimes` (or after ``max_steps``).
    """
    dev = make_device()
    dev.begin_step()
    history: list = []
    graphs: list = []
    for _ in range(max_steps):
        graphs = dev.graph_log = []
        step(dev)
        history.append(dev.end_step())
        if len(history) >= 3 and history[-1] == history[-2]:
            break
    dev.graph_log = None
    return dev, history, graphs


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One card's steady-state step of a trace, without DDP (simulated ns).

    Attributes:
        times: step, compute, comm (0: no collectives), exposed comm, host.
        forward_ns, backward_ns, optimizer_ns: device time of each phase's ops after fusion.
        graphs: ``(reason, ops, device_ns)`` per launched graph, in order.
        grad_ready_ns: per parameter (DDP order), when the op producing its gradient ends,
            from the step's start (the graph it is in runs its ops in issue order).
    """

    times: object
    forward_ns: int
    backward_ns: int
    optimizer_ns: int
    graphs: tuple[tuple[str, int, int], ...]
    grad_ready_ns: tuple[int, ...]


def summarize(trace: StepTrace) -> StepSummary:
    """Replay ``trace`` on one card to its steady state and split it into phases (see :class:`StepSummary`)."""
    phases: list[str] = []
    grad_at: dict[int, tuple[int, int]] = {}

    def step(dev: SimDevice) -> None:
        phases.clear()
        grad_at.clear()

        def rewrite(op: OpRecord, phase: str) -> OpRecord:
            phases.append(phase)
            return op

        def on_grad_ready(i: int) -> None:
            grad_at[i] = (len(dev.graph_log), len(dev.pending) - 1)

        replay(trace, dev, on_grad_ready=on_grad_ready, rewrite=rewrite)

    dev, history, graphs = run_replays(lambda: replay_device(trace.spec, trace.mode), step)
    times = history[-1]
    start = dev.now_ns() - times.step_ns
    per_phase = {"forward": 0, "backward": 0, "optimizer": 0}
    k = 0
    for g in graphs:
        for phase, ns in zip(phases[k:k + g.ops], g.op_times_ns):
            per_phase[phase] += ns
        k += g.ops
    ready = []
    for i in range(len(trace.params)):
        if i not in grad_at:
            ready.append(0)
            continue
        gi, pos = grad_at[i]
        if pos < 0:  # produced by an earlier graph: ready when that graph ends
            g = graphs[gi - 1]
            ready.append(g.start_ns + g.device_ns - start)
        else:
            g = graphs[gi]
            ready.append(g.start_ns + sum(g.op_times_ns[:pos + 1]) - start)
    return StepSummary(times=times, forward_ns=per_phase["forward"], backward_ns=per_phase["backward"],
                       optimizer_ns=per_phase["optimizer"],
                       graphs=tuple((g.reason, g.ops, g.device_ns) for g in graphs),
                       grad_ready_ns=tuple(ready))
