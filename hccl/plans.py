"""The face's bridge between the planes: time-plane schedules as data-plane plans.

The data plane's executor (:mod:`hccl.transport.executor`) runs
:class:`~hccl.transport.plan.Plan` s and never imports ``hccl.sim``; the process group gives
it :func:`make_planner`'s function, which builds each plan with
:func:`hccl.sim.schedule.build_schedule` on the topology, algorithm and slice the timing model
uses for the same group, so the bytes move along the schedule the planner times
(``HCCL_ALGO=ring`` runs a ring).
"""

from __future__ import annotations

import functools

from .sim.schedule import Copy, Recv, Send, build_schedule
from .transport.plan import CopyStep, Plan, PlanRequest, Planner, RecvStep, SendStep

__all__ = ["make_planner", "to_plan"]


def to_plan(schedule) -> Plan:
    """A :class:`~hccl.sim.schedule.Schedule` as the data plane's :class:`Plan`."""
    steps = []
    for st in schedule.steps:
        if isinstance(st, Send):
            steps.append(SendStep(st.peer, st.offset, st.count, st.phase))
        elif isinstance(st, Recv):
            steps.append(RecvStep(st.peer, st.offset, st.count, st.reduce, st.phase))
        elif isinstance(st, Copy):
            steps.append(CopyStep(st.src_offset, st.dst_offset, st.count, st.phase))
    lay = schedule.layout
    return Plan(algorithm=schedule.algorithm, work=lay.work, input_offset=lay.input_offset,
                input_count=lay.input_count, output_offset=lay.output_offset, output_count=lay.output_count,
                steps=tuple(steps))


def make_planner(rank: int, world_size: int, placement, *, algorithm: str, slice_bytes: int | None) -> Planner:
    """This rank's planner: plans on ``placement.topology`` (the topology the group's
    collectives are timed on) with the group's frozen algorithm and slice, cached per request.

    A subgroup whose members sit on the job's cards in another order than their group ranks
    (``placement.identity`` false) runs the same algorithm over group ranks: the bytes are
    right, only which card pair a message crosses differs from the timed schedule.
    """
    topology = placement.topology

    @functools.lru_cache(maxsize=256)
    def plan(req: PlanRequest) -> Plan:
        return to_plan(build_schedule(req.collective, req.count * req.dtype_bytes, rank, topology,
                                      world_size=world_size, algorithm=algorithm, root=req.root,
                                      dtype_bytes=req.dtype_bytes, splits=req.splits, slice_bytes=slice_bytes))

    return plan
