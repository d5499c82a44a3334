"""The simulated device timeline: lazy graphs, streams, step breakdown (pure, no processes)."""

from __future__ import annotations

import dataclasses

import pytest

from hpu_runtime.device.cost_model import OpCost
from hpu_runtime import SimDevice
from hpu_runtime.device.spec import get_device_spec


def _op(ns: int) -> OpCost:
    return OpCost(name="aten.test", engine="TPC", flops=0, bytes_in=0, bytes_out=0, low_precision=False, device_ns=ns)


def _dev(lazy: bool = True, max_ops: int = 0, compile_ns: int = 0, **spec_fields) -> SimDevice:
    """A gaudi2 device; compile time 0 unless asked, so timeline arithmetic stays simple."""
    spec = dataclasses.replace(get_device_spec("gaudi2"), compile_base_ns=compile_ns, compile_per_op_ns=0,
                               **spec_fields)
    return SimDevice(spec, lazy=lazy, max_compound_ops=max_ops)


def test_lazy_ops_accumulate_until_mark_step():
    """Lazy mode charges host time per op and runs nothing on the device before a launch."""
    d = _dev()
    for _ in range(3):
        d.record_op(_op(1000))
    assert d.compute.free_ns == 0 and len(d.pending) == 3
    assert d.host_ns == 3 * d.spec.host_op_ns
    start, end = d.launch()
    assert start == 3 * d.spec.host_op_ns + d.spec.graph_launch_ns
    assert end - start == 3000 and d.graphs_launched == 1 and not d.pending


def test_eager_mode_launches_each_op():
    d = _dev(lazy=False)
    d.record_op(_op(500))
    d.record_op(_op(500))
    assert not d.pending and d.compute.free_ns > 0 and d.host_ns == 2 * d.spec.eager_op_launch_ns


def test_max_compound_op_size_forces_launch():
    d = _dev(max_ops=2)
    for _ in range(5):
        d.record_op(_op(10))
    assert d.graphs_launched == 2 and len(d.pending) == 1


def test_host_read_waits_for_device():
    d = _dev()
    d.record_op(_op(1_000_000))
    d.host_read()
    assert d.host_ns == d.compute.free_ns


def test_step_breakdown_overlap_and_exposed_comm():
    """A collective overlapping a later graph is partly hidden; the rest is exposed."""
    d = _dev(host_op_ns=6_000, graph_launch_ns=20_000)  # host well ahead
    d.begin_step()
    d.record_op(_op(10_000))
    ready = d.collective_ready_ns()  # launches graph 1
    g1_end = d.compute.free_ns
    assert ready == g1_end
    d.record_collective("allreduce", ready, ready + 50_000)
    d.record_op(_op(30_000))  # graph 2 runs while the collective is in flight
    d.launch()
    g2_start = d.compute.intervals[-1][0]
    t = d.end_step()
    assert t.compute_ns == 40_000
    assert t.comm_ns == 50_000
    hidden = min(g2_start + 30_000, ready + 50_000) - max(g2_start, ready)
    assert hidden == 30_000  # graph 2 runs entirely inside the collective
    assert t.exposed_comm_ns == 50_000 - hidden
    assert t.step_ns == ready + 50_000


def test_work_wait_blocks_compute_stream():
    d = _dev()
    d.record_collective("allreduce", 0, 80_000)
    d.stream_wait(80_000)
    d.record_op(_op(1_000))
    start, _ = d.launch()
    assert start >= 80_000


@pytest.mark.parametrize("bad", ["gaudi9", "tpu"])
def test_unknown_device_spec_rejected(bad):
    with pytest.raises(ValueError, match=bad):
        get_device_spec(bad)


def test_lazy_collective_runs_inside_the_graph():
    """A lazy collective starts when the ops before it in the graph are done; an op of the
    same graph that reads its output waits for its end; nothing launches at the call."""
    from hpu_runtime.device.lazy_graph import OpRecord

    d = _dev()
    d.begin_step()
    out = 7  # storage serial the collective writes
    d.append_op(OpRecord(("a",), _op(10_000)))
    d.add_graph_collective("allreduce", lambda ready: (ready, ready + 50_000, "direct"), serials=(out,))
    d.append_op(OpRecord(("b",), _op(5_000)))                       # independent: overlaps
    d.append_op(OpRecord(("c",), _op(20_000), reads=((out, 4),)))   # reads the result: waits
    assert d.graphs_launched == 0 and d.collective.free_ns == 0
    start, end = d.launch()
    assert d.collective.intervals == [(start + 10_000, start + 60_000, "allreduce")]
    assert end == start + 60_000 + 20_000
    t = d.end_step()
    assert t.compute_ns == 10_000 + 5_000 + 20_000
    assert t.exposed_comm_ns == 50_000 - 5_000


@pytest.mark.parametrize("lazy", [True, False])
def test_a_long_step_window_is_folded_to_the_same_breakdown(lazy, monkeypatch):
    """NOTE [a long step window, folded]: a window of 1,000 graphs and 334 collectives (some
    hidden under later graphs, some not) has the same breakdown, step by step, on a card that
    folds its intervals every 16 as on one that never folds (the reference); the folding card
    holds few intervals."""
    import random

    from hpu_runtime.device import card as card_mod
    from hpu_runtime.device import timeline

    def run(fold: bool):
        d = _dev(lazy=lazy, host_op_ns=3_000, graph_launch_ns=5_000)
        for s in (d.card.compute, d.card.collective):
            s.fold_at, s.on_full = (16, s.on_full) if fold else (16, None)
        rng = random.Random(7)
        times, most = [], 0
        for _ in range(3):
            d.begin_step()
            for i in range(1000):
                d.record_op(_op(rng.choice((1_000, 9_000, 40_000))))
                if i % 3 == 0:
                    ready = d.collective_ready_ns()
                    d.record_collective("allreduce", ready, ready + rng.choice((2_000, 60_000)))
                d.launch()
                most = max(most, len(d.card.compute.intervals), len(d.card.collective.intervals))
            times.append(d.end_step())
        return times, most

    monkeypatch.setattr(card_mod, "FOLD_AT", 16)
    folded, most = run(True)
    reference, held = run(False)
    assert folded == reference
    assert all(t.exposed_comm_ns > 0 and t.comm_ns > t.exposed_comm_ns for t in reference)
    assert held >= 1000 and most <= 40, (held, most)
    assert timeline.FOLD_AT >= 1000  # real windows fold only when long


def test_the_kernels_eager_launches_fold_a_step_that_never_ends(monkeypatch):
    """A script that never closes a step (no ``end_step``: a user's own loop) keeps few
    intervals when the kernel launches its eager ops (``eager_launch`` checks the stream's
    ``fold_at`` as ``Stream.run`` does), and the step closed at last is the one a card that
    never folds reports (the reference)."""
    import torch

    import hpu_runtime as hpu
    from hpu_runtime.device import card as card_mod

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    monkeypatch.setattr(card_mod, "FOLD_AT", 8)

    def run(fold: bool):
        dev = hpu.reset_device("gaudi2")
        dev.card.compute.fold_at = 8
        if not fold:
            dev.card.compute.on_full = None
        x = torch.ones(1 << 20, device="hpu")
        most = 0
        for _ in range(100):
            x = x * 1.5 + 1.0
            most = max(most, len(dev.card.compute.intervals))
        return dev.end_step(), most, dev.launcher.graphs_launched

    try:
        folded, most, launches = run(True)
        reference, held, _ = run(False)
    finally:
        monkeypatch.delenv("PT_HPU_LAZY_MODE")
        hpu.reset_device("gaudi2")
    assert folded == reference and reference.compute_ns > 0
    assert launches >= 200 and held >= 200 and most <= 20, (launches, held, most)


def test_the_busy_intervals_of_a_window_against_a_pointwise_count():
    """``busy``'s merge of a stream's intervals clipped to a window, in one pass when they come
    in start order (a stream's usual order) and by sorting when they do not: against a reference
    that marks each covered nanosecond of a small range and reads the runs of marks back. Both
    orders, intervals before, across and after the window, empty ones, touching ones."""
    import random

    from hpu_runtime.device.timeline import _clipped_union

    def by_points(intervals, lo, hi):
        covered = {t for s, e, _ in intervals for t in range(max(s, lo), min(e, hi))}
        runs, t = [], lo
        while t < hi:
            if t in covered:
                start = t
                while t < hi and t in covered:
                    t += 1
                runs.append((start, t))
            else:
                t += 1
        return runs

    rng = random.Random(3)
    orders = {"in order": 0, "out of order": 0}
    for _ in range(3000):
        n = rng.randint(0, 10)
        in_order = rng.random() < 0.6
        intervals, t = [], rng.randint(-8, 4)
        for _ in range(n):
            if in_order:
                t += rng.randint(0, 5)
                s = t
            else:
                s = rng.randint(-10, 30)
            intervals.append((s, s + rng.randint(0, 7), "op"))
        lo = rng.randint(-6, 20)
        hi = lo + rng.randint(0, 25)
        starts = [iv[0] for iv in intervals]
        orders["in order" if starts == sorted(starts) else "out of order"] += 1
        assert _clipped_union(intervals, lo, hi) == by_points(intervals, lo, hi), (intervals, lo, hi)
    assert min(orders.values()) > 500, orders
