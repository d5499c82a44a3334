"""The clocks of one simulated card: host cursor, compute and collective streams, steps.

NOTE [simulated timeline]
All times are integer *simulated* nanoseconds; nothing here reads a wall clock, so the same
script gives the same timeline on any machine. Three cursors advance:

* ``host_ns``: the host thread. In lazy mode each dispatched op costs ``host_op_ns`` of host
  time to accumulate; launching a graph costs ``graph_launch_ns`` plus, on a recipe-cache
  miss, the simulated compile time; a host read (``.item()``, ``.cpu()``) or a synchronize
  makes the host wait for the device (:meth:`Card.wait_host`). Host<->device copies
  (``.to("hpu")`` of a host tensor, ``.cpu()`` of a device tensor) cost PCIe time on the host.
* the compute stream: a launched graph starts at ``max(host_ns, compute.free_ns)`` and runs
  for the fused time of its ops (see NOTE [fusion inside a graph] in ``cost_model``).
* the collective stream: a collective is ready at ``max(host_ns, compute.free_ns,
  collective.free_ns)`` once the graph producing its input has been launched (a collective
  is a lazy-mode launch point), and its duration comes from the network model. ``Work.wait()``
  makes the compute stream wait for the collective's end, as a stream wait on Gaudi does.

A *step* (:meth:`Card.begin_step` / :meth:`Card.end_step`) reports its length and how much
of it the compute and collective streams were busy; communication not hidden under compute
is "exposed".

NOTE [a slower card, step by step]
A card may run slower than its spec in a step: :attr:`Card.step_slowdown` maps the index of
the step (the number of :meth:`Card.end_step` calls so far) to a factor in parts per million
(1,000,000 = nominal), which scales the host's work (op accumulation, launches, copies,
compiles; not its waits) and the compute stream's graphs, rounded down to whole ns. The
collective stream is not scaled: its durations come from the network model. The cluster's
variability model (:mod:`hccl.sim.variability`) supplies the factors, the same in a live run
and in the planner. A real card has one factor per step for both; the planner's stand-in for
many ranks gives its compute stream factors of its own (:attr:`Card.device_slowdown`: NOTE
[planning slower ranks] in :mod:`hccl.sim.straggler_plan`).

NOTE [collective dependencies]
A collective writes storages (named by serial, see :mod:`hpu_runtime.device.residency`):
until it ends, no graph that reads or writes them starts and no host read of them returns,
however the caller waits (``Work.wait()``, the future, or not at all).
:meth:`Card.record_collective` remembers the end per serial (``ready_after``); a graph's
ops are checked against it (:meth:`Card.dependency_ns`); once a graph starts after a
collective's end, that collective binds no later work and is forgotten.

NOTE [lazy collectives]
With ``PT_HPU_ENABLE_LAZY_COLLECTIVES=true`` (Intel's bridge then loads its lazy-collectives
process group) an allreduce does not launch the accumulated graph: it joins it
(:meth:`~hpu_runtime.bridge.sim_device.SimDevice.add_graph_collective`), and the graph is
launched when the work is waited on or at the next launch point. Inside the launched graph
(:meth:`Card.run_graph`) the collective becomes ready when the ops issued before it are
done; ops of the graph that use its output wait for its end. Its duration comes from the
network model with every rank ready at the same time (true of data-parallel ranks, which
run the same graph); the real bytes move when it is called.

NOTE [a long step window, folded]
A step's breakdown needs the streams' busy intervals since the step began, so every launch
adds one, and :meth:`Card.end_step` (and :meth:`Card.begin_step`) drop those before the new
window. A script that never closes a step (a user's own training loop, which calls
``mark_step`` but not the step accounting of ``models.train``) would keep every interval of the
run: about 8.5 MB per 1,000 steps of the README's digits MLP in eager mode (60 launches a step),
0.7 MB in lazy mode. So once a stream holds more than :data:`~hpu_runtime.device.timeline.FOLD_AT`
intervals, the card folds the settled part of the open window into running totals: no interval
can start before ``max(host_ns, min(compute.free_ns, collective.free_ns))`` (a graph starts
no earlier than the host launches it and its stream is free; a collective no earlier than the
host issues it and its stream is free), so the busy, collective and exposed times before that
point are final. Busy and exposed times add over consecutive parts of a window, so the step's
breakdown is the same with or without folding (tested against an unfolded card); the next fold
waits until the streams hold twice as many intervals as are left, so folding costs O(1) per
interval even when the device runs far behind the host.

Not thread-safe on its own: the owner (:class:`~hpu_runtime.bridge.sim_device.SimDevice`)
calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cost_model import pcie_ns, read_back_ns
from .lazy_graph import OpRecord
from .spec import DeviceSpec
from .timeline import FOLD_AT, Stream, StepTimes, TraceEvent, busy, step_breakdown

__all__ = ["Card", "GraphCollective", "latest_end"]

_PPM = 1_000_000

CollectiveTiming = Callable[[int], tuple[int, int, str]]
"""``timing(ready_ns) -> (start_ns, end_ns, algorithm)``, from the network model."""


@dataclass(slots=True)
class GraphCollective:
    """A lazy collective inside a graph, after the graph's first ``position`` ops."""

    position: int
    label: str
    timing: CollectiveTiming
    serials: tuple[int, ...]
    on_timed: Callable | None


def _at_ppm(ns: int, ppm: int) -> int:
    """``ns`` scaled by ``ppm`` / 1e6, rounded down (NOTE [a slower card, step by step])."""
    return ns if ppm == _PPM else ns * ppm // _PPM


def latest_end(op: OpRecord, ends: dict[int, int]) -> int:
    """The latest end (ns) in ``ends`` of a storage ``op`` reads or writes; 0 if none."""
    latest = 0
    for serial, _ in op.reads:
        latest = max(latest, ends.get(serial, 0))
    for w in op.writes:
        latest = max(latest, ends.get(w[0], 0))
    return latest


class Card:
    """The host cursor and streams of one simulated card (see NOTE [simulated timeline]).

    Args:
        spec: the card's constants (copy costs).

    Attributes:
        host_ns: the host cursor, simulated ns.
        compute, collective: the card's two streams.
        ready_after: storage serial -> end (ns) of the collective that writes it
            (NOTE [collective dependencies]).
        trace: when a list, every host, compute and collective span from
            :meth:`enable_trace` on, as ``(stream, start_ns, dur_ns, label[, args])``.
    """

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.host_ns = 0
        self.compute = Stream("compute")
        self.collective = Stream("collective")
        self.ready_after: dict[int, int] = {}
        self.trace: list | None = None
        self.step_slowdown: Callable[[int], int] | None = None
        """Step index -> slowdown in ppm (NOTE [a slower card, step by step]); None: nominal."""
        self.slowdown_ppm = _PPM
        """This step's slowdown of the host's work, ppm."""
        self.device_slowdown: Callable[[int], int] | None = None
        """Step index -> slowdown of the compute stream's graphs in ppm, where it differs from
        the host's (a planner's stand-in: NOTE [a slower card, step by step]); None: the host's."""
        self.device_ppm = _PPM
        """This step's slowdown of the compute stream's graphs, ppm."""
        self.steps_done = 0
        """Steps closed by :meth:`end_step` so far (the index of the current step)."""
        self._step_start_ns = 0
        self._step_host_start = 0
        self._folded = (0, 0, 0)  # compute, collective, exposed ns of the open window up to _folded_to
        self._folded_to = 0
        self.compute.on_full = self.collective.on_full = self.fold_intervals

    def scaled(self, ns: int) -> int:
        """``ns`` of nominal host work at this step's speed (simulated ns)."""
        return _at_ppm(ns, self.slowdown_ppm)

    def scaled_device(self, ns: int) -> int:
        """``ns`` of nominal compute-stream work at this step's speed (simulated ns)."""
        return _at_ppm(ns, self.device_ppm)

    def set_step_slowdown(self, fn: Callable[[int], int] | None,
                          device_fn: Callable[[int], int] | None = None) -> None:
        """Install the per-step slowdown (NOTE [a slower card, step by step]) from this step on:
        ``fn`` for the host's work and, unless ``device_fn`` gives the compute stream its own,
        for the compute stream's graphs too."""
        self.step_slowdown = fn
        self.device_slowdown = device_fn
        self._read_slowdown()

    def _read_slowdown(self) -> None:
        fn, dfn, step = self.step_slowdown, self.device_slowdown, self.steps_done
        self.slowdown_ppm = _PPM if fn is None else int(fn(step))
        self.device_ppm = int(dfn(step)) if dfn is not None else self.slowdown_ppm

    # ---- host ------------------------------------------------------------------------------
    def host_event(self, label: str, dur_ns: int, args: dict, start: int | None = None) -> None:
        """Put a host span in the trace (if tracing); does not move the cursor."""
        if self.trace is not None and dur_ns > 0:
            self.trace.append(("host", self.host_ns if start is None else start, dur_ns, label, args))

    def spend_host(self, label: str, ns: int, args: dict) -> None:
        """The host works ``ns`` nominal simulated ns from now on ``label`` (a traced span)."""
        ns = self.scaled(ns)
        self.host_event(label, ns, args)
        self.host_ns += ns

    def wait_host(self, until_ns: int) -> None:
        """The host waits until ``until_ns`` (no-op if it is already later)."""
        if until_ns > self.host_ns:
            self.host_event("wait", until_ns - self.host_ns, {})
            self.host_ns = until_ns

    def run_compute(self, ready_ns: int, ns: int, label: str) -> tuple[int, int]:
        """Run ``ns`` nominal ns of device work on the compute stream; its (start, end)."""
        return self.compute.run(ready_ns, self.scaled_device(ns), label)

    def copy_h2d(self, nbytes: int) -> None:
        """Host time of one host->device copy of ``nbytes`` over PCIe."""
        self.spend_host("H2D copy", self.spec.h2d_copy_ns + pcie_ns(self.spec, nbytes), {"bytes": nbytes})

    def read_back(self, nbytes: int, serial: int = -1) -> None:
        """A host read of launched work: wait for the compute stream (and for the collective
        that writes ``serial``), then copy ``nbytes`` down over PCIe."""
        self.wait_host(max(self.compute.free_ns, self.ready_after.get(serial, 0)))
        if nbytes:
            self.spend_host("D2H copy", read_back_ns(self.spec, nbytes), {"bytes": nbytes})

    # ---- collectives (NOTE [collective dependencies]) ---------------------------------------
    def collective_ready_ns(self) -> int:
        """When a collective issued now can start (its input's graph must be launched first):
        :meth:`now_ns`."""
        return self.now_ns()

    def record_collective(self, label: str, start_ns: int, end_ns: int, serials: Sequence[int] = (),
                          args: dict | None = None) -> None:
        """Occupy the collective stream from ``start_ns`` to ``end_ns``; ``serials`` are the
        storages it writes; ``args`` (bytes, algorithm) go into its trace span."""
        self.collective.run(start_ns, end_ns - start_ns, label, args)
        self.collective.free_ns = max(self.collective.free_ns, end_ns)
        ready_after = self.ready_after
        for serial in serials:
            if end_ns > ready_after.get(serial, 0):
                ready_after[serial] = end_ns

    def dependency_ns(self, op: OpRecord) -> int:
        """The end of the latest collective writing a storage ``op`` touches; 0 if none."""
        return latest_end(op, self.ready_after) if self.ready_after else 0

    def forget_dependencies_before(self, start_ns: int) -> None:
        """A graph started at ``start_ns``: collectives that ended before bind no later work."""
        if self.ready_after:
            self.ready_after = {s: e for s, e in self.ready_after.items() if e > start_ns}

    def stream_wait(self, until_ns: int) -> None:
        """The compute stream waits for an event at ``until_ns`` (e.g. a collective's end)."""
        self.compute.free_ns = max(self.compute.free_ns, until_ns)

    # ---- graphs ----------------------------------------------------------------------------
    def run_graph(self, ready_ns: int, ops: Sequence[OpRecord], times: Sequence[int],
                  collectives: Sequence[GraphCollective], label: str) -> tuple[int, int]:
        """Run a graph with lazy collectives inside it (NOTE [lazy collectives]); its span.

        Each collective becomes ready when the ops issued before it are done and runs on the
        collective stream; an op that reads or writes its output waits for its end (the
        compute stream idles meanwhile).

        Args:
            ready_ns: when the graph may start (launched, its inputs' collectives ended).
            ops: the graph's ops in issue order; ``times``: their fused device times.
            collectives: in issue order, each after its ``position`` first ops.
            label: the graph's name on the compute stream.
        """
        start = max(ready_ns, self.compute.free_ns)
        t = seg = start
        done: dict[int, int] = {}
        ci = 0
        for k in range(len(ops) + 1):
            while ci < len(collectives) and collectives[ci].position <= k:
                c = collectives[ci]
                ci += 1
                cstart, cend, algo = c.timing(max(t, self.collective.free_ns))
                self.record_collective(c.label, cstart, cend, c.serials)
                for serial in c.serials:
                    done[serial] = cend
                if c.on_timed is not None:
                    c.on_timed(cstart, cend, algo)
            if k == len(ops):
                break
            if done:
                dep = latest_end(ops[k], done)
                if dep > t:
                    if t > seg:
                        self.compute.run(seg, t - seg, label)
                    seg = t = dep
            t += self.scaled_device(times[k])
        if t > seg:
            self.compute.run(seg, t - seg, label)
        self.compute.free_ns = max(self.compute.free_ns, t)
        return start, t

    # ---- steps ---------------------------------------------------------------------------
    def now_ns(self) -> int:
        """The latest point any cursor has reached (simulated ns)."""
        return max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    def begin_step(self) -> None:
        """Start a step window at the card's current end."""
        self._step_start_ns = self.now_ns()
        self._step_host_start = self.host_ns
        self._trim(self._step_start_ns)

    def fold_intervals(self) -> None:
        """Fold the open window's settled intervals into its running totals (NOTE [a long step
        window, folded]); the streams' ``on_full``."""
        lo = max(self._step_start_ns, self._folded_to)
        settled = max(self.host_ns, min(self.compute.free_ns, self.collective.free_ns))
        if settled > lo:
            comp, comm, exposed = busy(self.compute, self.collective, lo, settled)
            f = self._folded
            self._folded = (f[0] + comp, f[1] + comm, f[2] + exposed)
            self._folded_to = settled
            for st in (self.compute, self.collective):
                st.intervals = [iv if iv[0] >= settled else (settled, iv[1], iv[2])
                                for iv in st.intervals if iv[1] > settled]
        for st in (self.compute, self.collective):
            st.fold_at = max(FOLD_AT, 2 * len(st.intervals))

    def end_step(self) -> StepTimes:
        """Close the step window (pending work must be launched first) and return its breakdown.

        The window ends when every stream has drained; the host does not wait (the next
        step's host work may overlap this step's device work, as on Gaudi).
        """
        lo, hi = self._step_start_ns, self.now_ns()
        times = step_breakdown(self.compute, self.collective, max(lo, self._folded_to), hi,
                               self.host_ns - self._step_host_start)
        if self._folded_to > lo:  # NOTE [a long step window, folded]
            f = self._folded
            times = StepTimes(step_ns=hi - lo, compute_ns=times.compute_ns + f[0], comm_ns=times.comm_ns + f[1],
                              exposed_comm_ns=times.exposed_comm_ns + f[2], host_ns=times.host_ns)
        self._step_start_ns = hi
        self._step_host_start = self.host_ns
        self._trim(hi)
        self.steps_done += 1
        if self.step_slowdown is not None or self.device_slowdown is not None:
            self._read_slowdown()
        return times

    def _trim(self, before_ns: int) -> None:
        self._folded, self._folded_to = (0, 0, 0), before_ns
        for s in (self.compute, self.collective):
            s.intervals = [iv for iv in s.intervals if iv[1] > before_ns]
            s.fold_at = FOLD_AT

    # ---- trace ---------------------------------------------------------------------------
    def enable_trace(self) -> None:
        """Keep every host, compute and collective span from now on."""
        if self.trace is None:
            self.trace = []
            self.compute.trace = self.trace
            self.collective.trace = self.trace

    def disable_trace(self) -> None:
        """Stop keeping spans (the profiler turns tracing on for its window only)."""
        self.trace = self.compute.trace = self.collective.trace = None

    def trace_events(self, rank: int = 0) -> list[TraceEvent]:
        """The recorded spans as :class:`~hpu_runtime.device.timeline.TraceEvent` of ``rank``."""
        return [TraceEvent(rank=rank, stream=s[0], name=s[3], start_ns=s[1], dur_ns=s[2],
                           args=s[4] if len(s) > 4 else {}) for s in (self.trace or [])]
