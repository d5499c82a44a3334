"""The simulated Gaudi of this process: host cursor, compute and collective streams, lazy graph.

NOTE [simulated timeline]
All times are integer *simulated* nanoseconds; nothing here reads a wall clock, so the same
script gives the same timeline on any machine. Three cursors advance:

* ``host_ns``: the host thread. In lazy mode each dispatched op costs ``host_op_ns`` of host
  time to accumulate; launching a graph costs ``graph_launch_ns``; a host read (``.item()``,
  ``.cpu()``) or :meth:`SimDevice.synchronize` makes the host wait for the device.
* the compute stream: a launched graph starts at ``max(host_ns, compute.free_ns)`` and runs
  for the sum of its ops' roofline times.
* the collective stream: a collective is ready at ``max(host_ns, compute.free_ns,
  collective.free_ns)`` once the graph producing its input has been launched (a collective
  is a lazy-mode launch point), and its duration comes from the network model. ``Work.wait()``
  makes the compute stream wait for the collective's end, as a stream wait on Gaudi does.

A *step* (``begin_step``/``end_step``) reports its length and how much of it the compute and
collective streams were busy; communication not hidden under compute is "exposed".
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from .cost_model import OpCost
from .device_spec import DeviceSpec, get_device_spec

__all__ = ["Stream", "StepTimes", "SimDevice", "get_device", "reset_device"]


@dataclass(slots=True)
class Stream:
    """A simulated device queue: when it is next free, and its busy intervals (ns)."""

    name: str
    free_ns: int = 0
    intervals: list[tuple[int, int, str]] = field(default_factory=list)

    def run(self, ready_ns: int, duration_ns: int, label: str) -> tuple[int, int]:
        """Enqueue work ready at ``ready_ns``; returns its (start, end) in simulated ns."""
        start = max(ready_ns, self.free_ns)
        end = start + duration_ns
        self.free_ns = end
        if duration_ns > 0:
            self.intervals.append((start, end, label))
        return start, end


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Simulated breakdown of one training step, all in ns.

    Attributes:
        step_ns: from the end of the previous step (or the device's start) to this step's end.
        compute_ns: time the compute stream was busy during the step.
        comm_ns: time the collective stream was busy during the step.
        exposed_comm_ns: collective busy time not overlapped by compute.
        host_ns: host time spent building/launching the step.
    """

    step_ns: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    host_ns: int


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _clip(intervals, lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for s, e, *_ in intervals:
        s2, e2 = max(s, lo), min(e, hi)
        if e2 > s2:
            out.append((s2, e2))
    return out


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of ``a`` minus ``b`` (both merged, sorted)."""
    total = 0
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


class SimDevice:
    """One simulated Gaudi card (one per process).

    Args:
        spec: device generation constants.
        lazy: lazy mode (``PT_HPU_LAZY_MODE=1``) accumulates ops into graphs; eager launches
            each op on its own.
        max_compound_ops: launch the pending graph once it holds this many ops
            (``PT_HPU_MAX_COMPOUND_OP_SIZE``; 0 = unlimited).
    """

    def __init__(self, spec: DeviceSpec, *, lazy: bool = True, max_compound_ops: int = 0) -> None:
        self.spec = spec
        self.lazy = lazy
        self.max_compound_ops = max_compound_ops
        self.host_ns = 0
        self.compute = Stream("compute")
        self.collective = Stream("collective")
        self.pending: list[OpCost] = []
        self._pending_ns = 0
        self.graphs_launched = 0
        self.ops_recorded = 0
        self._step_start_ns = 0
        self._step_host_start = 0
        self.lock = threading.RLock()

    # ---- ops and graphs -----------------------------------------------------------------
    def record_op(self, cost: OpCost) -> None:
        """Account one dispatched op: host accumulation cost, then maybe a launch."""
        with self.lock:
            self.ops_recorded += 1
            if not self.lazy:
                self.host_ns += self.spec.eager_op_launch_ns
                self.compute.run(self.host_ns, cost.device_ns, cost.name)
                return
            self.host_ns += self.spec.host_op_ns
            self.pending.append(cost)
            self._pending_ns += cost.device_ns
            if self.max_compound_ops and len(self.pending) >= self.max_compound_ops:
                self.launch("max_compound_op_size")

    def launch(self, reason: str = "mark_step") -> tuple[int, int] | None:
        """Launch the pending graph on the compute stream; returns its (start, end) or None."""
        with self.lock:
            if not self.pending:
                return None
            self.host_ns += self.spec.graph_launch_ns
            span = self.compute.run(self.host_ns, self._pending_ns, f"graph[{len(self.pending)} ops] ({reason})")
            self.graphs_launched += 1
            self.pending = []
            self._pending_ns = 0
            return span

    def host_read(self) -> None:
        """A host read of a device tensor: launch, then the host waits for the compute stream."""
        with self.lock:
            self.launch("host_read")
            self.host_ns = max(self.host_ns, self.compute.free_ns)

    def synchronize(self) -> None:
        """Launch pending work and make the host wait for every stream (``hpu.synchronize()``)."""
        with self.lock:
            self.launch("synchronize")
            self.host_ns = max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    # ---- collectives ----------------------------------------------------------------------
    def collective_ready_ns(self) -> int:
        """Launch the graph producing a collective's input; when the collective can start."""
        with self.lock:
            self.launch("collective")
            return max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    def record_collective(self, label: str, start_ns: int, end_ns: int) -> None:
        """Occupy the collective stream from ``start_ns`` to ``end_ns``."""
        with self.lock:
            self.collective.run(start_ns, end_ns - start_ns, label)
            self.collective.free_ns = max(self.collective.free_ns, end_ns)

    def stream_wait(self, until_ns: int) -> None:
        """The compute stream waits for an event at ``until_ns`` (e.g. a collective's end)."""
        with self.lock:
            self.compute.free_ns = max(self.compute.free_ns, until_ns)

    # ---- steps ----------------------------------------------------------------------------
    def now_ns(self) -> int:
        """The latest point any cursor has reached (simulated ns)."""
        return max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    def begin_step(self) -> None:
        """Start a step window at the device's current end (see :meth:`end_step`)."""
        with self.lock:
            self._step_start_ns = self.now_ns()
            self._step_host_start = self.host_ns
            self._trim(self._step_start_ns)

    def end_step(self) -> StepTimes:
        """Launch pending work, close the step window and return its breakdown.

        The window ends when every stream has drained; the host does not wait (the next
        step's host work may overlap this step's device work, as on Gaudi).
        """
        with self.lock:
            self.launch("mark_step")
            lo, hi = self._step_start_ns, max(self.compute.free_ns, self.collective.free_ns, self.host_ns)
            comp = _union(_clip(self.compute.intervals, lo, hi))
            comm = _union(_clip(self.collective.intervals, lo, hi))
            times = StepTimes(
                step_ns=hi - lo,
                compute_ns=_length(comp),
                comm_ns=_length(comm),
                exposed_comm_ns=_subtract(comm, comp),
                host_ns=self.host_ns - self._step_host_start,
            )
            self._step_start_ns = hi
            self._step_host_start = self.host_ns
            self._trim(hi)
            return times

    def _trim(self, before_ns: int) -> None:
        for s in (self.compute, self.collective):
            s.intervals = [iv for iv in s.intervals if iv[1] > before_ns]


_device: SimDevice | None = None
_device_lock = threading.Lock()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def get_device() -> SimDevice:
    """This process's simulated Gaudi, created on first use from the environment.

    Reads ``PT_HPU_LAZY_MODE`` (default 1), ``PT_HPU_MAX_COMPOUND_OP_SIZE`` (default 0 =
    unlimited) and ``HPU_DEVICE_SPEC`` (default ``gaudi2``).

    Raises:
        ValueError: a malformed environment variable, naming it.
    """
    global _device
    with _device_lock:
        if _device is None:
            lazy = _env_int("PT_HPU_LAZY_MODE", 1)
            if lazy not in (0, 1):
                raise ValueError(f"PT_HPU_LAZY_MODE={lazy} must be 0 or 1")
            max_ops = _env_int("PT_HPU_MAX_COMPOUND_OP_SIZE", 0)
            if max_ops < 0:
                raise ValueError(f"PT_HPU_MAX_COMPOUND_OP_SIZE={max_ops} must be >= 0")
            spec = get_device_spec(os.environ.get("HPU_DEVICE_SPEC", "gaudi2"))
            _device = SimDevice(spec, lazy=bool(lazy), max_compound_ops=max_ops)
        return _device


def reset_device(spec: DeviceSpec | str | None = None) -> SimDevice:
    """Start this process's simulated device afresh (empty timeline), optionally as ``spec``.

    The device object is re-initialised in place, so references held by the bridge and by
    process groups stay valid. ``spec`` (a DeviceSpec or a name) also becomes the
    ``HPU_DEVICE_SPEC`` of this process.

    Raises:
        ValueError: an unknown device name or a malformed environment variable.
    """
    if spec is not None:
        resolved = get_device_spec(spec) if isinstance(spec, str) else spec
        os.environ["HPU_DEVICE_SPEC"] = resolved.name
    dev = get_device()
    fresh_spec = get_device_spec(os.environ.get("HPU_DEVICE_SPEC", "gaudi2"))
    with dev.lock:
        dev.__init__(fresh_spec, lazy=dev.lazy, max_compound_ops=dev.max_compound_ops)
    return dev
