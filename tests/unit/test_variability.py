"""Variability and what-ifs: deterministic draws, the slowest of n, the card's slowdown, the flags."""

import dataclasses

import numpy as np
import pytest

from hccl.sim import cluster, variability
from hccl.sim.topology import load_topology
from hccl.sim.variability import PPM, Variability
from hccl.sim.whatif import WhatIf, link_faults


def test_same_seed_same_factors_other_seed_others():
    """Draws depend on (seed, rank, step) only: any order, any process; another seed differs."""
    v = Variability(seed=5)
    ranks = np.arange(300)
    a = v.factors_ppm(ranks, 7)
    assert list(a[::-1]) == [v.factor_ppm(int(r), 7) for r in ranks[::-1]]
    assert np.array_equal(a, Variability(seed=5).factors_ppm(ranks, 7))
    assert not np.array_equal(a, Variability(seed=6).factors_ppm(ranks, 7))
    assert not np.array_equal(a, v.factors_ppm(ranks, 8))


def test_a_stretch_is_a_later_part_of_the_same_run():
    """Stretch k draws step s as step s + k x 2**32 of the same seed (rank by rank and, beyond
    EXACT_RANKS, the slowest card's order statistic); stretches do not share draws; flags and
    the live job's environment carry the stretch; a bad stretch is named."""
    ranks = np.arange(500)
    v = Variability(seed=9)
    later = Variability(seed=9, stretch=3)
    assert np.array_equal(later.factors_ppm(ranks, 7), v.factors_ppm(ranks, 7 + 3 * (1 << 32)))
    assert (later.factors_ppm(ranks, 7) != v.factors_ppm(ranks, 7)).mean() > 0.9
    big = variability.EXACT_RANKS + 10
    assert later.slowest_ppm(big, 2) == v.slowest_ppm(big, 2 + 3 * (1 << 32))
    assert later.slowest_ppm(65536, 2) != v.slowest_ppm(65536, 2) or later.slowest_ppm(65536, 3) != \
        v.slowest_ppm(65536, 3)
    assert "(stretch 3)" in later.describe() and "stretch" not in v.describe()
    c = cluster.Cluster(variability.parse("seed=9,stretch=3"))
    assert c.variability == dataclasses.replace(variability.DEFAULT, seed=9, stretch=3)
    assert cluster.from_env(c.env()) == c and c.key() != cluster.Cluster(variability.parse("seed=9")).key()
    for bad in (-1, 1 << 31, True, 1.0):
        with pytest.raises(ValueError, match="stretch"):
            Variability(stretch=bad)


def test_distribution_body_and_tail():
    """The body stays within +-jitter; slow steps come at their rate and within their bounds."""
    v = Variability(seed=1, jitter=0.04, slow_prob=0.01, slow_min=0.08, slow_max=0.5)
    f = v.factors_ppm(np.arange(200_000), 0) / PPM
    body = f[f <= 1.04 + 1e-9]
    assert body.min() >= 0.96 - 1e-9 and abs(body.mean() - 1.0) < 1e-3
    slow = f[f > 1.04 + 1e-9]
    assert slow.size / f.size == pytest.approx(0.01, rel=0.1)
    assert slow.min() >= 1.04 * 1.08 - 1e-6 and slow.max() <= 1.04 * 1.5 + 1e-6
    assert (slow > 1.04 * 1.2).mean() == pytest.approx((0.08 / 0.2) ** 2, abs=0.03)  # Pareto, shape 2


def test_slowest_of_n_exact_then_order_statistic():
    """Up to EXACT_RANKS the slowest is the largest rank draw; beyond, the order statistic has the
    same distribution (mean of the slowest over many steps against explicit draws)."""
    v = Variability(seed=3, jitter=0.04, slow_prob=1e-3)
    n = 64
    assert v.slowest_ppm(n, 4) == int(v.factors_ppm(np.arange(n), 4).max())
    big = variability.EXACT_RANKS + 904
    steps = range(400)
    order = np.array([v.slowest_ppm(big, s) for s in steps]) / PPM
    explicit = np.array([v.factors_ppm(np.arange(big), s).max() for s in steps]) / PPM
    assert order.mean() == pytest.approx(explicit.mean(), abs=0.01)
    assert (order > 1.05).mean() == pytest.approx((explicit > 1.05).mean(), abs=0.08)


def test_off_and_slow_cards():
    """Off: every factor 1; a slow card multiplies its own factor and becomes the slowest."""
    assert variability.OFF.slowest_ppm(65536, 3) == PPM
    assert variability.rank_slowdown(variability.OFF, WhatIf(), 2) is None
    w = WhatIf.parse(slow_cards=["2:1.5"])
    f = variability.rank_slowdown(variability.OFF, w, 2)
    assert f(0) == f(9) == 1_500_000
    assert variability.slowest_ppm(variability.OFF, w, 8, 0) == 1_500_000
    v = Variability(seed=2)
    assert variability.slowest_ppm(v, w, 65536, 1) >= int(round(v.factor_ppm(2, 1) * 1.5))


def test_card_slowdown_scales_host_and_compute_not_collectives():
    """A step at 1.5x: host work and graphs take 1.5x as long; a collective's interval is kept."""
    from hpu_runtime.device.card import Card
    from hpu_runtime.device.spec import get_device_spec

    card = Card(get_device_spec("gaudi2"))
    card.set_step_slowdown(lambda step: 1_500_000 if step == 1 else PPM)
    card.spend_host("op", 1000, {})
    card.run_compute(0, 2000, "g")
    assert (card.host_ns, card.compute.free_ns) == (1000, 2000)
    card.end_step()
    card.spend_host("op", 1000, {})
    start, end = card.run_compute(card.host_ns, 2000, "g")
    assert (card.host_ns, end - start) == (2500, 3000)
    card.record_collective("c", 10_000, 11_000)
    card.wait_host(20_000)  # a wait is not work: not scaled
    assert card.host_ns == 20_000 and card.collective.free_ns == 11_000


def test_flags_env_round_trip_and_errors():
    """Flags become the environment a live job reads back; bad specs name the flag."""
    import argparse

    p = argparse.ArgumentParser()
    cluster.add_arguments(p, variability="on")
    args = p.parse_args(["--variability", "seed=4,jitter=0.02", "--slow-card", "3:2", "--degraded-link", "1/0:4",
                         "--failed-link", "2/1", "--dead-rank", "5@7"])
    c = cluster.from_args(args)
    assert c.variability == dataclasses.replace(variability.DEFAULT, seed=4, jitter=0.02)
    back = cluster.from_env(c.env())
    assert back == c and back.key() == c.key()
    for bad, match in ((["--slow-card", "3"], "RANK:FACTOR"), (["--slow-card", "3:0.5"], "slowdown"),
                       (["--degraded-link", "1:2"], "R/P:FACTOR"), (["--dead-rank", "5"], "RANK@STEP"),
                       (["--variability", "seed=x"], "not a number"), (["--variability", "sigma=1"], "fields")):
        with pytest.raises(ValueError, match=match):
            cluster.from_args(p.parse_args(bad))


def test_link_faults_follow_hcl():
    """A down scale-out port: Gaudi 3 migrates it, Gaudi2 cannot run; a down scale-up link never can."""
    hls3, hls2 = load_topology("hls3", world_size=16), load_topology("hls2", world_size=16)
    t = link_faults(hls3, WhatIf.parse(failed_links=["3/1"]))
    assert t.faults == (("out", 3, 1, 0.0),)
    with pytest.raises(ValueError, match="no port migration"):
        link_faults(hls2, WhatIf.parse(failed_links=["3/1"]))
    with pytest.raises(ValueError, match="no stand-in for a scale-up link"):
        link_faults(hls3, WhatIf.parse(failed_links=["3-4"]))
    with pytest.raises(ValueError, match="not two cards of one box"):
        link_faults(hls2, WhatIf.parse(degraded_links=["3-9:2"]))
    with pytest.raises(ValueError, match="outside the job"):
        link_faults(hls2, WhatIf.parse(degraded_links=["99/0:2"]))


def test_kept_steps_start_once_the_pipeline_has_refilled(monkeypatch):
    """NOTE [the steps after the barrier]: with a constant slow card (rank 1 at 1.5x) every
    steady step is the same, yet the step right after the one holding the barrier's wait is
    not (the barrier drained the host's lead over its device). The planner keeps its samples
    from WARMUP on, and every kept step is then the steady one, at either bucket cap."""
    from hccl.sim import straggler_plan
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    assert straggler_plan.WARMUP == cluster.ALIGN_STEP + 1 + straggler_plan.SETTLE_STEPS
    trace = trace_step(resolve_factory("mlp"), 8, spec=get_device_spec("gaudi2"))
    slow = WhatIf.parse(slow_cards=["1:1.5"])
    for cap in (0.01, 100):
        kept = plan_ddp_step(trace, world_size=2, topology="hls2", bucket_cap_mb=cap, whatif=slow, steps=4)
        steps = {t.step_ns for t in kept.samples}
        assert len(kept.samples) == 4 and len(steps) == 1, (cap, steps)
        monkeypatch.setattr(straggler_plan, "WARMUP", cluster.ALIGN_STEP + 1)  # keep the settling steps too
        early = plan_ddp_step(trace, world_size=2, topology="hls2", bucket_cap_mb=cap, whatif=slow, steps=4)
        monkeypatch.undo()
        assert early.samples[0].step_ns not in steps  # the transient the settling steps leave out
        assert early.samples[-1].step_ns in steps


def test_card_compute_stream_may_have_factors_of_its_own():
    """The planner's stand-in (NOTE [planning slower ranks]): host work at the host's factor,
    graphs at the compute stream's; without one of its own the stream follows the host."""
    from hpu_runtime.device.card import Card
    from hpu_runtime.device.spec import get_device_spec

    card = Card(get_device_spec("gaudi2"))
    card.set_step_slowdown(lambda step: 1_500_000, lambda step: 2_000_000 if step == 0 else 1_250_000)
    card.spend_host("op", 1000, {})
    start, end = card.run_compute(card.host_ns, 2000, "g")
    assert (card.host_ns, end - start) == (1500, 4000)
    card.end_step()
    start, end = card.run_compute(card.host_ns, 2000, "g")
    assert end - start == 2500
    card.set_step_slowdown(lambda step: 1_500_000)
    start, end = card.run_compute(card.host_ns, 2000, "g")
    assert end - start == 3000


def test_stand_in_factors_follow_the_latest_host_and_the_slowest_device():
    """stand_in_ppm against the ranks' own factors, summed by hand: the latest host's stand-in
    takes the step's increase of the largest sum since step 0 or since the alignment barrier,
    and its compute stream the factor of the rank that is latest; the slowest card's compute
    stream takes the step's largest; the draws nominal in the quiet steps."""
    from hccl.sim.straggler_plan import stand_in_ppm

    v = Variability(seed=3)
    w = WhatIf.parse(slow_cards=["2:1.02"])
    n, total = 6, cluster.ALIGN_STEP + 7
    per_rank = [variability.rank_slowdown(v, w, r, quiet=cluster.QUIET_STEPS) for r in range(1, n)]
    for s in cluster.QUIET_STEPS:  # the draws left out there, the slow card still slow
        assert [fn(s) for fn in per_rank] == [1_000_000, 1_020_000, 1_000_000, 1_000_000, 1_000_000]
    sums = [0] * (n - 1)
    host, own, slowest, latest = [], [], [], 0
    for s in range(total):
        if s == cluster.ALIGN_STEP:
            sums, latest = [0] * (n - 1), 0
        f = [fn(s) for fn in per_rank]
        sums = [a + b for a, b in zip(sums, f)]
        host.append(max(sums) - latest)
        latest = max(sums)
        own.append(f[sums.index(latest)])
        slowest.append(max(f))
    assert stand_in_ppm(v, w, n, total) == (host, own, slowest)
    assert any(h != d for h, d in zip(host, slowest)) and any(o != d for o, d in zip(own, slowest))


def test_the_kept_stretch_waits_longer_on_more_ranks():
    """NOTE [the kept stretch starts at a sync]: the stand-in host's time over the kept steps is
    the largest of the ranks' sums from the host sync, so adding ranks never shortens it. With
    the draws of the quiet steps kept (the lag they build carried into the kept steps as a head
    start), seed 0 gave 1,024 ranks +2.3% and 4,096 ranks +1.6%."""
    from hccl.sim.straggler_plan import WARMUP, stand_in_ppm

    total = WARMUP + 16
    for seed in range(3):
        v = Variability(seed=seed)
        kept = [sum(stand_in_ppm(v, None, n, total)[0][WARMUP:]) for n in (8, 64, 1024, 4096, 16384)]
        assert kept == sorted(kept), (seed, kept)
        assert kept[-1] > kept[0]
        ranks = np.arange(1, 4096)  # by hand: the largest sum over the kept steps
        by_hand = sum(v.factors_ppm(ranks, s) for s in range(WARMUP, total)).max()
        assert kept[3] == by_hand, seed


def _one_stand_in(monkeypatch) -> None:
    """Plan with one stand-in, as before the two: the latest host with the slowest card's
    compute stream, the second stand-in nominal."""
    from hccl.sim import straggler_plan

    real = straggler_plan.stand_in_ppm
    monkeypatch.setattr(straggler_plan, "stand_in_ppm",
                        lambda *a: (lambda h, o, d: (h, d, [1_000_000] * len(d)))(*real(*a)))


def test_stand_ins_give_what_every_rank_gives_in_a_host_bound_step(monkeypatch):
    """NOTE [planning slower ranks]: in lazy mode the digits MLP's step is host-bound; planned
    with rank 0 and the two stand-ins it takes what replaying every rank gives (rank 0's steps
    and the job's, within 0.1%), for seeds 0-3. One stand-in, latest host and slowest card in
    one, is as close here: the step's device tail is too short to tell them apart (the slow
    test below tells them apart on ResNet-50)."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    trace = trace_step(resolve_factory("mlp"), 8, spec=get_device_spec("gaudi2"))

    def means(v, lockstep):
        p = plan_ddp_step(trace, world_size=4, topology="hls2", variability=v, steps=16, lockstep=lockstep)
        return sum(t.step_ns for t in p.samples) / len(p.samples), sum(p.job_steps) / len(p.job_steps)

    off = []
    for seed in range(4):
        v = Variability(seed=seed, jitter=0.3)
        every = means(v, True)
        assert all(abs(a / b - 1) < 0.001 for a, b in zip(means(v, False), every)), seed
        _one_stand_in(monkeypatch)
        off.append(means(v, False)[1] / every[1] - 1)
        monkeypatch.undo()
    assert max(off) < 0.001, off  # in so host-bound a step the device's tail is too short to tell


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_slowest_card_needs_a_stand_in_of_its_own(monkeypatch):
    """NOTE [planning slower ranks]: ResNet-50 (batch 256, lazy, one 100 MB bucket, Gaudi2, 8
    ranks, seed 2): the two stand-ins give the job's steps every rank's replay gives (within
    0.01%); one stand-in, the latest host with the slowest card's compute stream, gave the job
    0.24% more, as the whole backward graph runs after its host's cut at the slowest factor."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from launchers.study._runner import trace_key, trace_steps

    key = (256, *trace_key("lazy", "gaudi2", None, None))
    trace = trace_steps("resnet50", [key])[key]
    v = Variability(seed=2)

    def job(lockstep):
        p = plan_ddp_step(trace, world_size=8, topology="hls2", bucket_cap_mb=100, variability=v, steps=16,
                          lockstep=lockstep)
        return sum(p.job_steps) / len(p.job_steps)

    every = job(True)
    assert abs(job(False) / every - 1) < 1e-4
    _one_stand_in(monkeypatch)
    assert job(False) / every - 1 > 0.001


def test_job_steps_follow_the_latest_rank_by_hand():
    """NOTE [the job's step]: per step, the increase of the latest of the ranks' step ends."""
    from hccl.sim.straggler_plan import job_steps_ns

    ends = [[10, 25, 31], [12, 20, 40]]  # rank 0 leads in step 1, rank 1 in steps 0 and 2
    assert job_steps_ns(ends) == [12, 13, 15]
    assert job_steps_ns(ends, starts=[3, 5]) == [7, 13, 15]
    assert job_steps_ns([[10, 25, 31]]) == [10, 15, 6]
    with pytest.raises(ValueError, match="equal step counts"):
        job_steps_ns([[1, 2], [1]])


def test_the_job_step_shows_the_waits_rank_0_hides():
    """NOTE [the job's step]: in a host-bound lazy step with DDP's small buckets, rank 0's own
    steps hide a later host's lag in its device's slack; the job's steps, from every rank's step
    ends, show it: over the kept steps they add up to the latest rank's, which replaying the
    ranks one by one (every rank its own device) gives as well."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    trace = trace_step(resolve_factory("mlp"), 8, spec=get_device_spec("gaudi2"))
    v = Variability(seed=1, jitter=0.3)
    p = plan_ddp_step(trace, world_size=4, topology="hls2", variability=v, steps=16, lockstep=True)
    own = sum(t.step_ns for t in p.samples)
    assert len(p.job_steps) == len(p.samples) == 16
    assert sum(p.job_steps) > own  # a later rank's lag, hidden from rank 0
