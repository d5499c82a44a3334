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
    or two to build again, so the :data:`~hccl.sim.cluster.SETTLE_STEPS` steps after the
    barrier's are replayed but not kept either: kept, they would charge each point a start-up
    transient that depends on its buckets (NOTE [the steps after the barrier]). In those steps
    every card runs at its nominal speed, so the kept steps start from a sync (NOTE [the kept
    stretch starts at a sync]).
    Beyond, three ranks are replayed in lock step: rank 0 with its own factors and two
    stand-ins for all the others (:func:`stand_in_ppm`); every collective starts when the latest
    of the three is ready, as it would with every rank present, and rank 0's steps are reported,
    as up to :data:`LOCKSTEP_RANKS`. What the stand-ins must reproduce is when the latest of the
    other ranks is ready and when the last of them ends its step, and that depends on which of
    a rank's two clocks binds. One stands for the latest host: its host runs each step's work
    at the increase of the largest cumulative factor among the others, so at every step's end
    it is as far behind as the latest of their hosts (in lazy mode the host records ahead of its
    device and never waits for the other ranks, ``models.train`` reads no device value until
    the epoch ends, so the rank whose host is latest after several steps sets when the devices
    can go on, and a card slow in one step and fast in the next makes up its delay), and its
    compute stream runs at that latest rank's own factor. The other stands for the slowest
    card: its host is nominal and its compute stream runs each step as slow as the slowest of
    the others in that step (a step whose device work binds, HPU graphs, ``torch.compile``, a
    fused optimizer, waits at every allreduce for that step's slowest card, and a slow card's
    lead does not carry into the next step). The factors are every other rank's own draws (the
    same values a live rank draws), taken vectorized per step, 0.1 s for 65,536 ranks.
    Measured against replaying every rank (Gaudi2, hls2, the mean of 16 steps after the sync,
    rank 0's steps and the job's, NOTE [the job's step]): equal to 0.001% on ResNet-50 (batch
    256) in lazy mode at DDP's default and one 100 MB bucket (8 ranks, seeds 0-2; 32 ranks,
    seed 0), with HPU graphs and in eager mode (8 ranks, seeds 0-1; eager at ``slow_prob``
    0.02), with slow steps as frequent as at tens of thousands of ranks (32 ranks, ``slow_prob``
    0.05, seeds 0-1), and on BERT-Large (28 x 512, lazy, 8 ranks, seeds 0-1). One stand-in, the
    latest host with the slowest card's compute stream (how it was planned before), gave rank
    0's steps within 0.4% but the job's up to 0.24% long with one bucket (8 ranks, seed 2;
    0.23% on 32): its slowest stream ran all of backward after the latest host's cut, where the
    real latest rank's stream runs at its own factor. A stand-in slowest in every step on both
    clocks (how it was planned before that) was 2.2-6.0% slower than every rank in host-bound
    lazy steps on 8 ranks and 10-27% with the frequent slow steps (it never makes up a delay).

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
    answer. So :data:`~hccl.sim.cluster.SETTLE_STEPS` = 2 steps after the one holding the
    barrier's wait are replayed and dropped; a live run's summary keeps every step, and its
    steps from :data:`WARMUP` on are the planned samples.

NOTE [the kept stretch starts at a sync]
    In a host-bound step the waiting for the slowest rank is set by the latest host, and after
    ``k`` steps from a host sync that is the largest over the ranks of their ``k``-step sums of
    factors (NOTE [planning slower ranks]): a maximum over a set of ranks, which can only grow
    as ranks are added. The kept steps are meant to be such a stretch (``--steps``, the stretch
    between a script's host syncs). They did not start at the sync: the step holding the
    barrier's wait and the settling steps drew factors too, and a slow step there gave its rank
    a head start, a lag on which rank 0 waited before the first kept step, leaving the kept
    steps only the lag added after it. So the kept mean was not monotone in the ranks: with the
    ranks' factors alone (the latest host's mean factor over 16 kept steps, all ranks), seed 0
    gave 1,024 ranks +2.3% and 4,096 ranks +1.6%, seed 1 4,096 +2.5% and 16,384 +1.4%; the
    BERT-Large scaling study (48 x 512, hls2, lazy) planned 4,096 cards faster than 8 (207.9 ms
    against 210.7 ms median), and seed 2 put 1,024 cards at an efficiency of 1.003. Now every
    card works at its nominal speed in :data:`~hccl.sim.cluster.QUIET_STEPS` (the step holding
    the barrier's wait and the settling steps; a slow-card what-if still applies), in the
    planner, in the stand-ins' factors and in a live run's cards (the process group gives
    :func:`~hccl.sim.variability.rank_slowdown` the ``quiet`` steps), so every rank starts the
    kept steps where the sync left it, its pipeline refilled alike, and the lag over them is the
    ``--steps``-step stretch's (the same measure, seed 0: +1.5%, +2.0%, +3.3%, +3.3%, +4.1% and
    +4.6% at 8, 64, 1,024, 4,096, 16,384 and 65,536 ranks). Keeping the compute streams' draws
    in the quiet steps (their lag does not carry from step to step) was tried: the device work
    still in flight when the kept steps start, as slow as that step's slowest card, then moved
    the start by up to tens of ms from one world size to the next, and the BERT-Large study was
    again not monotone (seed 2: 1.005 at 1,024 cards).

NOTE [the job's step]
    Rank 0's steps (``samples``, what a live run's rank 0 reports) do not show every wait: in a
    host-bound lazy step rank 0's host records on without waiting for the others, and a later
    host delays only rank 0's device, which has the rest of rank 0's step (the optimizer's host
    work after backward) to catch up in. How much that hides depends on the buckets: with one
    100 MB bucket the whole backward graph runs after the cut, so the device ends after the
    host and every lag shows; with DDP's default the device has finished all but the last
    bucket when the host does, and lags of several ms vanish. Measured on ResNet-50 (batch 256,
    lazy, Gaudi2, hls2, 8 cards, seed 0, 16 steps from the sync), rank 0's mean step was 85.5 ms
    at DDP's default and 86.3 ms with one bucket, where variability off gives 85.18 and 85.15:
    the bucket study's answer turned on what rank 0 happened not to see. A job's progress is
    set by its latest rank, and a host sync that reaches every rank (a barrier, an allreduced
    loss read on the host, the end of the job) waits for it. So the planner also reports the
    job's step (:func:`job_steps_ns`, ``PlannedStep.job_steps``): per kept step, the increase of
    the latest step end among the ranks (every rank when it replays them all, else rank 0 and
    the two stand-ins), and the studies plan from it; a live run's summary gives the same
    (``sim_job_steps``: every rank's step ends gathered at the epoch's end). The stretch's last
    step ends when its slowest card's device work does, so the job's steps also carry that
    step's device tail: the work still to run after the host's last cut, all of backward with
    one bucket, the last bucket's share with many: the cost a sync at the stretch's end pays.
    How much depends on that step's draws (ResNet-50 as above, seed 0, one 100 MB bucket
    against DDP's default, beyond their nominal difference: 0.00 ms per step on 8 and 512
    cards, 0.13 ms on 64).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import numpy as np

from hpu_runtime.tools.replay import replay_device

from .cluster import ALIGN_STEP, QUIET_STEPS, SETTLE_STEPS
from .timing import collective_times
from .variability import OFF, PPM, rank_slowdown, world_factors_ppm

__all__ = ["LOCKSTEP_RANKS", "SETTLE_STEPS", "WARMUP", "DEFAULT_STEPS", "plan_steps", "stand_in_ppm", "job_steps_ns"]

LOCKSTEP_RANKS = 8
"""Largest world size planned rank by rank (a live job on this machine has at most this many)."""
WARMUP = QUIET_STEPS.stop
"""Steps replayed before the samples: up to the alignment, then :data:`~hccl.sim.cluster.QUIET_STEPS`
(the step holding it and the settling steps). A live run's steps from this index on are the
planned samples."""
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


def stand_in_ppm(var, whatif, world_size: int, total: int) -> tuple[list[int], list[int], list[int]]:
    """The stand-ins' factors in each of ``total`` steps, ppm (NOTE [planning slower ranks]),
    from every factor of ranks ``1 .. world_size-1`` (slow-card what-ifs included):

    - the latest host's (host, compute stream): the host's is the step's increase of the
      largest cumulative factor, summed from step 0 and again from the alignment barrier (which
      follows step ``ALIGN_STEP - 1``), so at each step's end that stand-in's host is as far
      behind as the latest of those ranks' hosts; its compute stream's, the factor of the rank
      latest at the step's end (the lowest-numbered on a tie);
    - the slowest card's compute stream: the step's largest factor (its host is nominal).

    In :data:`~hccl.sim.cluster.QUIET_STEPS` the draws are nominal, as the ranks' own. Draws
    every rank (vectorized, O(``world_size``) memory and work per step: 0.1 s for 65,536 ranks
    and 22 steps on a 2-core machine)."""
    if world_size < 2:
        return [PPM] * total, [PPM] * total, [PPM] * total
    cum = np.zeros(world_size - 1, dtype=np.int64)
    host, own, slowest, latest = [], [], [], 0
    for s in range(total):
        if s == ALIGN_STEP:
            cum[:] = 0
            latest = 0
        f = world_factors_ppm(var, whatif, world_size, s, quiet=QUIET_STEPS)[1:]
        cum += f
        lead = int(cum.argmax())
        now = int(cum[lead])
        host.append(now - latest)
        own.append(int(f[lead]))
        slowest.append(int(f.max()))
        latest = now
    return host, own, slowest


def plan_steps(replayer, trace, *, world_size: int, variability, whatif, steps: int, lockstep: bool | None = None):
    """Plan ``steps`` DDP steps (after :data:`WARMUP`) with slower cards; a PlannedStep whose
    ``samples`` are the steps' breakdowns and ``times`` their median (NOTE [planning slower ranks]).
    ``lockstep``: every rank (default up to :data:`LOCKSTEP_RANKS`), or rank 0 and two stand-ins
    for the others (the latest host, the slowest card)."""
    var = variability if variability is not None else OFF
    total = WARMUP + (steps or DEFAULT_STEPS)
    spec, mode = trace.spec, trace.mode
    if lockstep if lockstep is not None else world_size <= LOCKSTEP_RANKS:
        ranks = world_size
        ex = _Exchange(ranks)
        reps = [replayer(r, lambda ready, r=r: ex.ready_all(r, ready)) for r in range(ranks)]
        slowdowns = [(rank_slowdown(var, whatif, r, quiet=QUIET_STEPS), None) for r in range(ranks)]
    else:  # rank 0, a stand-in for the latest host and one for the slowest card
        ranks = 3
        ex = _Exchange(ranks)
        rest = world_size - 2

        def spread(r: int):
            return lambda ready: (lambda v: [v[0]] + [v[1]] * rest + [v[2]])(ex.ready_all(r, ready))

        reps = [replayer(0, spread(0)), replayer(1, spread(1)), replayer(world_size - 1, spread(2))]
        host, own, slowest = stand_in_ppm(var, whatif, world_size, total)

        def at(f):
            return lambda s: f[s] if s < total else PPM
        slowdowns = [(rank_slowdown(var, whatif, 0, quiet=QUIET_STEPS), None), (at(host), at(own)),
                     (None, at(slowest))]
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
    ends = [list(itertools.accumulate(t.step_ns for t in res[0])) for res in results]  # every card starts at 0
    return dataclasses.replace(rep.planned(dev, history[-1], graphs, samples), times=median,
                               job_steps=tuple(job_steps_ns(ends)[WARMUP:]))


def job_steps_ns(ends: list[list[int]], starts: list[int] | None = None) -> list[int]:
    """The job's steps (simulated ns, NOTE [the job's step]): ``latest[s] - latest[s - 1]``,
    with ``latest[s]`` the largest of the ranks' ``ends[r][s]`` (when rank ``r``'s step ``s``
    window closed, on the ranks' shared simulated clock) and ``latest[-1]`` the largest of
    ``starts`` (each rank's first window opening; default 0, as in the planner's replays).

    Raises:
        ValueError: no rank, or ranks with different numbers of steps.
    """
    if not ends or len({len(e) for e in ends}) > 1:
        raise ValueError(f"job_steps_ns: need ranks with equal step counts, got {sorted({len(e) for e in ends})}")
    latest = [max(col) for col in zip(*ends)]
    return [b - a for a, b in zip([max(starts) if starts else 0] + latest, latest)]
