"""DDP steps planned one by one when cards are slower in some steps than others.

:func:`hccl.sim.ddp_plan.plan_ddp_step` hands over here when the cluster has variability
(:mod:`hccl.sim.variability`) or slow-card what-ifs: every step differs, so there is no steady
state to find; instead :data:`WARMUP` steps are replayed and then ``steps`` more are kept as
samples (their median is the representative step).

NOTE [planning slower ranks]
    Up to :data:`LOCKSTEP_RANKS` ranks, every rank is replayed, each on its own device with its
    own factors, in lock step: at each bucket's allreduce the ranks exchange their ready times
    and time the collective from the slowest (NOTE [the slowest member starts the collective]
    in :mod:`hccl.sim.timing`), exactly as a live job's ranks do (rank 0's steps are reported,
    as ``models.train`` does). A live job's first steps differ from a replay's (compiles, DDP's
    first buckets), and with every step different the difference would carry on: the host may
    be far ahead of one rank's device, and a rank's clock ahead of another's. So both align
    once: after :data:`~hccl.sim.cluster.ALIGN_STEP` steps every rank enters a barrier, which
    also makes its host wait for its streams (``models.train`` does it when the cluster has
    variability or what-ifs). The step after the barrier holds its wait; from the next one on,
    a live run with the same seed gives the same integers. The barrier also drains every
    rank's pipeline: a steady step starts with the host ahead of its device (the device still
    running the last step's graphs while the host records the next), and that lead takes a step
    or two to build again, so the :data:`SETTLE_STEPS` steps after the barrier's are replayed
    but not kept either: kept, they would charge each point a start-up transient that depends on
    its buckets (NOTE [the steps after the barrier]).
    Beyond, two ranks are replayed in lock step: rank 0 with its own factors, and a stand-in
    for all the others whose factor in each step is the largest of theirs (NOTE [the slowest
    of n, at scale] in :mod:`hccl.sim.variability`); every collective starts when the later of
    the two is ready, as it would with every rank present, and rank 0's steps are reported, as
    up to :data:`LOCKSTEP_RANKS`. The simplification: the stand-in is the slowest rank in every
    step, so its own slack (a rank that was fast in the previous step starts early) is not
    there; rank 0 waits for it at least as long as for the slowest real rank.

NOTE [the steps after the barrier]
    In a steady lazy-mode step the host is ahead of its device: it records the next step's
    forward while the device runs the last step's optimizer graph, and with variability a rank
    waits at each bucket's allreduce for ranks whose hosts lag. The alignment barrier drains all
    of it (every host waits for its streams), so the first steps after it are shorter or longer
    than a steady step by an amount that depends on how the step is cut into graphs, that is on
    the buckets. Measured on ResNet-50 (batch 256, lazy mode, torch's SGD, Gaudi2, hls2):
    with a constant slow card (``--slow-card 3:1.1``, 8 cards) and DDP's default buckets the
    step after the barrier's is 85.430 ms and every later one 93.699 ms, while with one bucket
    every step is 93.659 ms; with the calibrated variability on 64 cards (seeds 0-7), one bucket's
    step minus DDP's default's is 1.7-9.2 ms in that first step and up to 9.9 ms in the second,
    then within about 0.5 ms either way. Kept in a mean of 16 steps, that transient charged one
    bucket 0.2-0.9% more than DDP's default at 64 cards, enough to turn the bucket study's
    answer. So :data:`SETTLE_STEPS` = 2 steps after the one holding the barrier's wait are
    replayed and dropped; a live run's summary keeps every step, and its steps from
    :data:`WARMUP` on are the planned samples.
"""

from __future__ import annotations

import dataclasses
import threading

from hpu_runtime.tools.replay import replay_device

from .cluster import ALIGN_STEP
from .timing import collective_times
from .variability import OFF, rank_slowdown, slowest_ppm

__all__ = ["LOCKSTEP_RANKS", "SETTLE_STEPS", "WARMUP", "DEFAULT_STEPS", "plan_steps"]

LOCKSTEP_RANKS = 8
"""Largest world size planned rank by rank (a live job on this machine has at most this many)."""
SETTLE_STEPS = 2
"""Steps after the one holding the alignment barrier's wait that are replayed but not kept
(NOTE [the steps after the barrier])."""
WARMUP = ALIGN_STEP + 1 + SETTLE_STEPS
"""Steps replayed before the samples: up to the alignment, the step holding it, and
:data:`SETTLE_STEPS` more. A live run's steps from this index on are the planned samples."""
DEFAULT_STEPS = 16
"""Sampled steps when the caller does not say."""
_WAIT_S = 300.0


class _Exchange:
    """Every rank's ready time for its k-th collective, shared between the ranks' threads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.slots: dict[int, list] = {}
        self.calls = [0] * n
        self.error: BaseException | None = None

    def ready_all(self, rank: int, ready: int) -> list[int]:
        k = self.calls[rank]
        self.calls[rank] = k + 1
        with self.cond:
            slot = self.slots.setdefault(k, [None] * self.n)
            slot[rank] = ready
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.error is not None or None not in slot, timeout=_WAIT_S):
                raise TimeoutError(f"planner: rank {rank} waited {_WAIT_S:.0f} s for the others' collective {k}")
            if self.error is not None:
                raise RuntimeError("planner: another rank's replay failed") from self.error
            return list(slot)

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.error = exc
            self.cond.notify_all()


def _run(rep, dev, total: int) -> tuple[list, list]:
    dev.begin_step()
    history, graphs = [], []
    for s in range(total):
        graphs = dev.graph_log = []
        rep.step(dev)
        history.append(dev.end_step())
        if s + 1 == ALIGN_STEP:  # a barrier, as ProcessGroupHCCL.barrier runs it
            ready = dev.collective_ready_ns()
            start, end, _ = collective_times("barrier", 0, rep.ready_all(ready), rank=rep.rank, topology=rep.topo)
            dev.record_collective("barrier", start, end)
            dev.synchronize()
    dev.graph_log = None
    return history, graphs


def plan_steps(replayer, trace, *, world_size: int, variability, whatif, steps: int, lockstep: bool | None = None):
    """Plan ``steps`` DDP steps (after :data:`WARMUP`) with slower cards; a PlannedStep whose
    ``samples`` are the steps' breakdowns and ``times`` their median (NOTE [planning slower ranks]).
    ``lockstep``: every rank (default up to :data:`LOCKSTEP_RANKS`), or rank 0 and a stand-in for
    the slowest of the others."""
    var = variability if variability is not None else OFF
    total = WARMUP + (steps or DEFAULT_STEPS)
    spec, mode = trace.spec, trace.mode
    if lockstep if lockstep is not None else world_size <= LOCKSTEP_RANKS:
        ranks = world_size
        ex = _Exchange(ranks)
        reps = [replayer(r, lambda ready, r=r: ex.ready_all(r, ready)) for r in range(ranks)]
        slowdowns = [rank_slowdown(var, whatif, r) for r in range(ranks)]
    else:  # rank 0 and a stand-in for the slowest of the others
        ranks = 2
        ex = _Exchange(ranks)
        rest = world_size - 1

        def spread(r: int):
            return lambda ready: (lambda v: [v[0]] + [v[1]] * rest)(ex.ready_all(r, ready))

        reps = [replayer(0, spread(0)), replayer(1, spread(1))]
        slowdowns = [rank_slowdown(var, whatif, 0), lambda s: slowest_ppm(var, whatif, world_size, s, exclude=0)]
    devs = [replay_device(spec, mode) for _ in range(ranks)]
    for dev, slow in zip(devs, slowdowns):
        dev.set_step_slowdown(slow)
    results: list = [None] * ranks

    def work(r: int) -> None:
        try:
            results[r] = _run(reps[r], devs[r], total)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            results[r] = exc
            ex.fail(exc)

    threads = [threading.Thread(target=work, args=(r,), name=f"plan-rank-{r}") for r in range(1, ranks)]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join(_WAIT_S)
    for res in results:
        if isinstance(res, BaseException) or res is None:
            raise res if isinstance(res, BaseException) else TimeoutError("planner: a rank's replay did not end")
    rep, dev = reps[0], devs[0]
    history, graphs = results[0]
    samples = history[WARMUP:]
    median = sorted(samples, key=lambda t: t.step_ns)[(len(samples) - 1) // 2]
    return dataclasses.replace(rep.planned(dev, history[-1], graphs, samples), times=median)
