"""The plain description of one rank's part of a collective that the data plane executes.

The time plane (:mod:`hccl.sim.schedule`) builds schedules; the torch face converts one into
a :class:`Plan` (see :mod:`hccl.plans`) and the data plane runs it
(:mod:`hccl.transport.executor`). These types are this package's own so that the data plane
never imports the time plane: a plan is data, not a reference to an algorithm.

NOTE [plan semantics] (the same as NOTE [phase semantics] of ``hccl.sim.schedule``)
Every step addresses one flat per-rank *work buffer* of elements. Steps carry a phase
number; within one phase a rank's sends read the buffer as it was at the start of the
phase, then copies run, then receives write (overwrite, or combine with the collective's
reduce op when ``reduce`` is set) in step order. Messages between one pair of ranks are
delivered in step order (FIFO per pair).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["SendStep", "RecvStep", "CopyStep", "PlanStep", "Plan", "PlanRequest", "Planner"]


@dataclass(frozen=True, slots=True)
class SendStep:
    """Send work-buffer elements ``[offset, offset + count)`` to group rank ``peer``."""

    peer: int
    offset: int
    count: int
    phase: int


@dataclass(frozen=True, slots=True)
class RecvStep:
    """Receive ``count`` elements from group rank ``peer`` into ``[offset, offset + count)``;
    ``reduce``: combine with the buffer by the collective's op instead of overwriting."""

    peer: int
    offset: int
    count: int
    reduce: bool
    phase: int


@dataclass(frozen=True, slots=True)
class CopyStep:
    """Local copy of ``count`` elements from ``src_offset`` to ``dst_offset``."""

    src_offset: int
    dst_offset: int
    count: int
    phase: int


PlanStep = SendStep | RecvStep | CopyStep


@dataclass(frozen=True, slots=True)
class Plan:
    """One rank's ordered steps for one collective call, and where its data sits.

    Attributes:
        algorithm: the schedule's algorithm name (for messages and tests).
        work: elements of the work buffer.
        input_offset, input_count: where this rank's input goes in the work buffer.
        output_offset, output_count: where its output is read from.
        steps: the steps, grouped by ascending phase.
    """

    algorithm: str
    work: int
    input_offset: int
    input_count: int
    output_offset: int
    output_count: int
    steps: tuple[PlanStep, ...]


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What the data plane asks the face to plan (hccl_demo's size convention).

    Attributes:
        collective: ``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``,
            ``reduce_scatter`` or ``all2all`` (the schedule names).
        count: elements of each rank's input (all2all: the largest rank's input).
        dtype_bytes: bytes per element.
        root: root group rank of reduce / broadcast.
        splits: all2all only: ``splits[p][q]`` elements group rank p sends to group rank q.
    """

    collective: str
    count: int
    dtype_bytes: int
    root: int = 0
    splits: tuple[tuple[int, ...], ...] | None = None


Planner = Callable[[PlanRequest], Plan]
"""Builds this rank's plan for a request (given to the executor by the face)."""


def phases(steps: Sequence[PlanStep]) -> list[list[PlanStep]]:
    """``steps`` cut into their phases (steps arrive grouped by ascending phase)."""
    out: list[list[PlanStep]] = []
    last = None
    for st in steps:
        if st.phase != last:
            out.append([])
            last = st.phase
        out[-1].append(st)
    return out
