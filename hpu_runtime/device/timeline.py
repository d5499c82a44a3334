"""Simulated device streams and step breakdowns: pure interval arithmetic in simulated ns.

A :class:`Stream` is an in-order queue (compute, collective) that remembers its busy
intervals; :func:`step_breakdown` turns the intervals of one step window into a
:class:`StepTimes` (busy compute, busy communication, communication not hidden under
compute); a :class:`TraceEvent` is one span of a rank's host, compute or collective row, as
:mod:`hpu_runtime.api.trace` exports them. Nothing here reads a clock: every number is
simulated nanoseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

__all__ = ["FOLD_AT", "STREAMS", "Stream", "StepTimes", "TraceEvent", "busy", "step_breakdown"]


FOLD_AT = 4096
"""Intervals a stream holds before its card folds the settled ones into the open step's totals
(NOTE [a long step window, folded] in :mod:`hpu_runtime.device.card`)."""


@dataclass(slots=True)
class Stream:
    """A simulated device queue: when it is next free, and its busy intervals (ns).

    ``trace``, when a list, also receives every span as ``(stream, start, dur, label)``
    (kept for the whole run, unlike ``intervals`` which steps trim). ``on_full``, when set, is
    called once ``intervals`` holds more than ``fold_at`` spans (the card folds them).
    """

    name: str
    free_ns: int = 0
    intervals: list[tuple[int, int, str]] = field(default_factory=list)
    trace: list | None = None
    fold_at: int = FOLD_AT
    on_full: Callable[[], None] | None = None

    def run(self, ready_ns: int, duration_ns: int, label: str, args: dict | None = None) -> tuple[int, int]:
        """Enqueue work ready at ``ready_ns``; returns its (start, end) in simulated ns.
        ``args`` (e.g. a collective's bytes) go into the trace span."""
        start = max(ready_ns, self.free_ns)
        end = start + duration_ns
        self.free_ns = end
        if duration_ns > 0:
            self.intervals.append((start, end, label))
            if self.on_full is not None and len(self.intervals) > self.fold_at:
                self.on_full()
            if self.trace is not None:
                self.trace.append((self.name, start, duration_ns, label) if args is None
                                  else (self.name, start, duration_ns, label, args))
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


def _clipped_union(intervals, lo: int, hi: int) -> list[tuple[int, int]]:
    """The busy spans of ``intervals`` (``(start, end, ...)``, ns) within ``[lo, hi)``: clipped
    to it, merged where they overlap or touch, in start order. One pass when the intervals come
    in start order, as a stream's do when it runs in order (a sort and separate passes were the
    cost of a fold: NOTE [a long step window, folded] in :mod:`hpu_runtime.device.card`); out of
    that order, the same pass over them sorted by start (intervals with equal starts merge alike
    in any order)."""
    merged: list[tuple[int, int]] = []
    if not intervals:
        return merged
    append = merged.append
    last = None  # the latest merged span's end
    prev = intervals[0][0]  # the latest start seen
    for iv in intervals:
        s = iv[0]
        if s < prev:
            return _clipped_union(sorted(intervals, key=itemgetter(0)), lo, hi)
        prev = s
        e = iv[1]
        if s < lo:
            s = lo
        if e > hi:
            e = hi
        if e > s:
            if last is not None and s <= last:
                if e > last:
                    merged[-1] = (merged[-1][0], e)
                    last = e
            else:
                append((s, e))
                last = e
    return merged


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


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


def busy(compute: Stream, collective: Stream, lo: int, hi: int) -> tuple[int, int, int]:
    """Within ``[lo, hi)`` (simulated ns): the time the compute stream was busy, the time the
    collective stream was busy, and the collective time not under compute (exposed)."""
    comp = _clipped_union(compute.intervals, lo, hi)
    comm = _clipped_union(collective.intervals, lo, hi)
    return _length(comp), _length(comm), _subtract(comm, comp)


def step_breakdown(compute: Stream, collective: Stream, lo: int, hi: int, host_ns: int) -> StepTimes:
    """The breakdown of the window ``[lo, hi)`` (simulated ns) from the streams' intervals."""
    comp, comm, exposed = busy(compute, collective, lo, hi)
    return StepTimes(step_ns=hi - lo, compute_ns=comp, comm_ns=comm, exposed_comm_ns=exposed, host_ns=host_ns)


STREAMS: tuple[str, ...] = ("host", "compute", "collective")
"""Stream names; the index is the thread id (tid) of the row."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceEvent:
    """One span of simulated time on one rank's stream."""

    rank: int
    """Global rank (>= 0); becomes the process row (pid)."""
    stream: str
    """"host", "compute" or "collective"; becomes the thread row (tid)."""
    name: str
    """Label, e.g. "graph_launch", "compile", "all_reduce"."""
    start_ns: int
    """Start, simulated ns since the rank's time origin (>= 0)."""
    dur_ns: int
    """Duration, simulated ns (>= 0)."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """JSON-serialisable details shown in the trace viewer (non-JSON values become str)."""

    def __post_init__(self) -> None:
        for name in ("rank", "start_ns", "dur_ns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TraceEvent.{name} must be an int >= 0, got {value!r}")
        if self.stream not in STREAMS:
            raise ValueError(
                f"TraceEvent.stream must be one of {', '.join(STREAMS)}, got {self.stream!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TraceEvent.name must be a non-empty string, got {self.name!r}")
