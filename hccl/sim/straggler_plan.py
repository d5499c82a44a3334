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
    for all the others (:func:`stand_in_ppm`); every collective starts when the later of the
    two is ready, as it would with every rank present, and rank 0's steps are reported, as up
    to :data:`LOCKSTEP_RANKS`. What the stand-in must reproduce is when the latest of the other
    ranks is ready, and that depends on which of a rank's two clocks binds. Its compute stream
    runs each step as slow as the slowest of the others in that step: a step whose device
    work binds (HPU graphs, ``torch.compile``, a fused optimizer) waits at every allreduce for
    that step's slowest card, and a slow card's lead does not carry into the next step. Its
    host runs each step's work at the increase of the largest cumulative factor among the
    others, so at every step's end it is as far behind as the latest of their hosts: in lazy
    mode the host records ahead of its device and never waits for the other ranks
    (``models.train`` reads no device value until the epoch ends), so the rank whose host is
    latest after several steps sets when the devices can go on, and a card slow in one step
    and fast in the next makes up its delay. The factors are every other rank's own draws (the
    same values a live rank draws), taken vectorized per step, 0.1 s for 65,536 ranks.
    Measured against replaying every rank (Gaudi2, hls2, the mean of 16 steps): on 8 ranks
    with the calibrated variability (seeds 0-2; ResNet-50 batch 256, BERT-Large 28 x 512)
    within 0.4% in lazy, eager, HPU-graph and compile steps, slow-card what-ifs too; with slow
    steps far more frequent, as at tens of thousands of ranks (seeds 0-1, lazy mode: 32 ranks
    at ``slow_prob`` 0.02 and 0.05 for ResNet-50 and BERT-Large 48 x 512, 64 ranks at 0.05, up
    to 3.2 slow steps per step) within 0.95%. A stand-in slowest in every step on both clocks
    (how it was planned before) was 2.2-6.0% slower than every rank in those host-bound lazy
    steps on 8 ranks and 10-27% with the frequent slow steps (it never makes up a delay), and
    within 0.07% in a device-bound step.

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

import numpy as np

from hpu_runtime.tools.replay import replay_device

from .cluster import ALIGN_STEP
from .timing import collective_times
from .variability import OFF, PPM, rank_slowdown, world_factors_ppm

__all__ = ["LOCKSTEP_RANKS", "SETTLE_STEPS", "WARMUP", "DEFAULT_STEPS", "plan_steps", "stand_in_ppm"]

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


def stand_in_ppm(var, whatif, world_size: int, total: int) -> tuple[list[int], list[int]]:
    """The stand-in's factors in each of ``total`` steps, ppm, host's and compute stream's
    (NOTE [planning slower ranks]), from every factor of ranks ``1 .. world_size-1`` (slow-card
    what-ifs included): the compute stream's is the largest factor of the step; the host's is
    the step's increase of the largest cumulative factor, summed from step 0 and again from the
    alignment barrier (which follows step ``ALIGN_STEP - 1``), so at each step's end the
    stand-in's host is as far behind as the latest of those ranks' hosts.

    Draws every rank (vectorized, O(``world_size``) memory and work per step: 0.1 s for 65,536
    ranks and 22 steps on a 2-core machine)."""
    if world_size < 2:
        return [PPM] * total, [PPM] * total
    cum = np.zeros(world_size - 1, dtype=np.int64)
    host, device, latest = [], [], 0
    for s in range(total):
        if s == ALIGN_STEP:
            cum[:] = 0
            latest = 0
        f = world_factors_ppm(var, whatif, world_size, s)[1:]
        cum += f
        now = int(cum.max())
        host.append(now - latest)
        device.append(int(f.max()))
        latest = now
    return host, device


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
        slowdowns = [(rank_slowdown(var, whatif, r), None) for r in range(ranks)]
    else:  # rank 0 and a stand-in for the slowest of the others
        ranks = 2
        ex = _Exchange(ranks)
        rest = world_size - 1

        def spread(r: int):
            return lambda ready: (lambda v: [v[0]] + [v[1]] * rest)(ex.ready_all(r, ready))

        reps = [replayer(0, spread(0)), replayer(1, spread(1))]
        host, device = stand_in_ppm(var, whatif, world_size, total)
        slowdowns = [(rank_slowdown(var, whatif, 0), None),
                     (lambda s: host[s] if s < total else PPM, lambda s: device[s] if s < total else PPM)]
    devs = [replay_device(spec, mode) for _ in range(ranks)]
    for dev, (slow, device_slow) in zip(devs, slowdowns):
        dev.set_step_slowdown(slow, device_slow)
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
