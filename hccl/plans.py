"""The face's bridge between the planes: time-plane schedules as data-plane plans.

The data plane's executor (:mod:`hccl.transport.executor`) runs
:class:`~hccl.transport.plan.Plan` s and never imports ``hccl.sim``; the process group gives
it :func:`make_planner`'s function, which builds each plan with
:func:`hccl.sim.schedule.build_schedule` on the topology the timing model uses for the same
group, so the bytes move along the schedule the planner times (``HCCL_ALGO`` included).
"""

from __future__ import annotations

import functools

from .sim import timing
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


def make_planner(rank: int, world_size: int) -> Planner:
    """This rank's planner for a group of ``world_size`` ranks (plans cached per request).

    The topology is :func:`hccl.sim.timing.get_topology` of the group's size (``HCCL_TOPOLOGY``
    with hosts mapped to boxes), looked up at each call so the hosts found at the rendezvous
    count; a subgroup's plan uses a topology of its own size (its timing uses its placement
    on the job's cards).
    """

    @functools.lru_cache(maxsize=256)
    def _plan(req: PlanRequest, topology) -> Plan:
        return to_plan(build_schedule(req.collective, req.count * req.dtype_bytes, rank, topology,
                                      world_size=world_size, root=req.root, dtype_bytes=req.dtype_bytes,
                                      splits=req.splits))

    def plan(req: PlanRequest) -> Plan:
        return _plan(req, timing.get_topology(world_size))

    return plan
