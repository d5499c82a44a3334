"""Simulated device streams and step breakdowns: pure interval arithmetic in simulated ns.

A :class:`Stream` is an in-order queue (compute, collective) that remembers its busy
intervals; :func:`step_breakdown` turns the intervals of one step window into a
:class:`StepTimes` (busy compute, busy communication, communication not hidden under
compute). Nothing here reads a clock: every number is simulated nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Stream", "StepTimes", "step_breakdown"]


@dataclass(slots=True)
class Stream:
    """A simulated device queue: when it is next free, and its busy intervals (ns).

    ``trace``, when a list, also receives every span as ``(stream, start, dur, label)``
    (kept for the whole run, unlike ``intervals`` which steps trim).
    """

    name: str
    free_ns: int = 0
    intervals: list[tuple[int, int, str]] = field(default_factory=list)
    trace: list | None = None

    def run(self, ready_ns: int, duration_ns: int, label: str) -> tuple[int, int]:
        """Enqueue work ready at ``ready_ns``; returns its (start, end) in simulated ns."""
        start = max(ready_ns, self.free_ns)
        end = start + duration_ns
        self.free_ns = end
        if duration_ns > 0:
            self.intervals.append((start, end, label))
            if self.trace is not None:
                self.trace.append((self.name, start, duration_ns, label))
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


def step_breakdown(compute: Stream, collective: Stream, lo: int, hi: int, host_ns: int) -> StepTimes:
    """The breakdown of the window ``[lo, hi)`` (simulated ns) from the streams' intervals."""
    comp = _union(_clip(compute.intervals, lo, hi))
    comm = _union(_clip(collective.intervals, lo, hi))
    return StepTimes(step_ns=hi - lo, compute_ns=_length(comp), comm_ns=_length(comm),
                     exposed_comm_ns=_subtract(comm, comp), host_ns=host_ns)
