"""HCL's pairwise box iterations and the contended fabric, against timelines and loads by hand.

Tiny topology as in test_timing: boxes of 2 cards, 1 port per peer and 1 scale-out port, all at
8 Gb/s (1 byte/ns), MTU 1000 B with no header, NIC latency 100 ns, switch 50 ns, reduction
2 bytes/ns, one box per leaf (box to box crosses the spine: 550 ns).
"""

import dataclasses

import numpy as np
import pytest

from hccl.sim import fabric, timing
from hccl.sim.algorithms import pairwise
from hccl.sim.fabric import Fabric, message_slowdown
from hccl.sim.planner import simulate
from hccl.sim.topology import load_topology

from .test_timing import OUT_LAT, TINY, UP_LAT, red, ser


@pytest.fixture
def window(monkeypatch):
    """Set HCL's scale-out buffers for one test, with the planner's and timing's memos cleared."""
    from hccl.sim import planner

    def set_(w: int) -> None:
        monkeypatch.setattr(pairwise, "SCALE_OUT_BUFFERS", w)
        planner._simulate_cached.cache_clear()
        timing._memo.clear()

    yield set_
    planner._simulate_cached.cache_clear()
    timing._memo.clear()


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return lambda n: load_topology(str(path), world_size=n)


def _pairwise_allreduce_by_hand(B: int, c: int, W: int) -> list[int]:
    """Every rank's end of a pairwise all-reduce on B boxes of 2 cards, chunks of c bytes, from 0,
    with W scale-out buffers.

    Phases (NOTE [HCL's pairwise box iterations]): reduce-scatter j = 0..B: in-box part for
    box b + j (j < B), scale-out part of iteration j - 1 (j >= 2); all-gather j = 0..B-1:
    in-box part for box b + j, scale-out part of iteration j + 1 (j + 1 < B). What each part
    waits for before it sends (NOTE [block dependencies]): reduce-scatter in-box parts after the
    first, the scale-out receives of phase j - W (and their links); reduce-scatter scale-out part of phase j, the in-box receives of phase
    j - 1 and the scale-out receives of phase j - W; the all-gather's first phase, every
    receive of the reduce-scatter; its later in-box parts, the scale-out receive of the phase
    before; its later scale-out parts, the scale-out receives W phases before. A message leaves
    when its port is free; a scale-out message also waits for the receiver's ingress port; a
    reduction waits for the previous one on its engine (in-box and scale-out reductions have
    one engine each).
    """
    n = 2 * B
    clock, anchor = [0] * n, [0] * n
    up_free, eg_free, in_free, red_up, red_out, last = ([0] * n for _ in range(6))
    history: list[dict] = []  # per phase: tag -> each rank's start, raised to its receives' end

    def waited(after, r):
        t = anchor[r]
        for tag, back in after:
            if back <= len(history) and tag in history[-back]:
                t = max(t, history[-back][tag][r])
        return t

    def phase(up, shift, reduce, up_after, out_after):
        nonlocal clock, anchor
        new = list(clock)
        rec = {}
        starts = {}
        for tag, after in (("up", up_after), ("out", out_after)):
            starts[tag] = [clock[r] if after is None else waited(after, r) for r in range(n)]
        if up_after is None or (shift is not None and out_after is None):
            anchor = list(clock)
        if up:  # to the other card of the box
            start = starts["up"]
            got = list(start)
            for r in range(n):
                tx = max(start[r], up_free[r])
                up_free[r] = tx + ser(c)
                last[r] = max(last[r], up_free[r])
                d = r ^ 1
                arr = tx + UP_LAT + ser(c)
                done = max(arr, red_up[d]) + red(c) if reduce else arr
                if reduce:
                    red_up[d] = done
                got[d] = max(got[d], done)
                last[d] = max(last[d], done)
            rec["up"] = got
        if shift is not None:  # to the same card of box b + shift
            start = starts["out"]
            got = list(start)
            for r in range(n):
                tx = max(start[r], eg_free[r])
                eg_free[r] = tx + ser(c)
                last[r] = max(last[r], eg_free[r])
                d = ((r // 2 + shift) % B) * 2 + r % 2
                arr = max(tx + OUT_LAT, in_free[d]) + ser(c)
                in_free[d] = arr
                done = max(arr, red_out[d]) + red(c) if reduce else arr
                if reduce:
                    red_out[d] = done
                got[d] = max(got[d], done)
                last[d] = max(last[d], done)
            rec["out"] = got
        for got in rec.values():
            new = [max(a, b) for a, b in zip(new, got)]
        history.append(rec)
        clock = new

    for j in range(B + 1):
        phase(j < B, j - 1 if j >= 2 else None, True, None if j == 0 else (("out", W),), (("up", 1), ("out", W)))
    for j in range(B):
        phase(True, -(j + 1) if j + 1 < B else None, False, None if j == 0 else (("out", 1),),
              None if j == 0 else (("out", W),))
    return [max(clock[r], last[r]) for r in range(n)]


@pytest.mark.parametrize("W", [1, 8])
@pytest.mark.parametrize("B", [2, 3, 4, 12])
def test_pairwise_allreduce_by_hand(tiny, window, B, W):
    """Each rank's end equals the hand timeline; the slowest member starts everyone."""
    window(W)
    c = 1000
    n = 2 * B
    want = _pairwise_allreduce_by_hand(B, c, W)
    if B == 2:
        # on paper: RS in-box 1600 (0+100+1000+500) | 2600 (link free at 1000) ; RS scale-out
        # 4650 (2600+550+1000+500) ; AG 6200 (4650+550+1000) | 7300 (6200+100+1000): the in-box
        # part of the second iteration did not wait for a scale-out arrival
        assert want == [7300] * 4
    ready = [0] * n
    ready[-1] = 700  # the last rank is late: everyone starts at 700
    for r in range(n):
        t = timing.collective_times("allreduce", n * c, ready, rank=r, topology=tiny(n), algorithm="pairwise")
        assert (t.start_ns, t.end_ns, t.algorithm) == (700, 700 + want[r], "pairwise"), (r, t, want)


def test_scale_out_buffers_hide_the_latency_of_box_iterations(tiny, window):
    """With one scale-out buffer every box iteration pays a crossing; with HCL's 8, iterations
    overlap and a many-box all-reduce runs at its ports' pace."""
    B, c = 12, 1000
    times = {}
    for W in (1, 8):
        window(W)
        times[W] = simulate("all_reduce", 2 * B * c, tiny(2 * B), world_size=2 * B, algorithm="pairwise").duration_ns
    # per-iteration crossings of the scale-out latency are gone from the reduce-scatter and all-gather
    assert times[1] - times[8] >= (B - 2) * OUT_LAT
    # at least the bytes: 2 (B - 1) scale-out messages of c bytes through one port
    assert times[8] >= 2 * (B - 1) * ser(c)


def test_pairwise_step_count_and_latency_term(tiny, monkeypatch, window):
    """A slice is 2B + 1 phases; with W scale-out buffers its latency grows by two scale-out
    crossings per W added boxes, and not at all while the boxes fit in the buffers."""
    monkeypatch.setattr(pairwise, "HCL_SLICE_BYTES", 400)  # 100 floats per rank per slice
    window(8)
    for B in (2, 3, 5):
        n = 2 * B
        res = simulate("all_reduce", n * 400 * 3, tiny(n), world_size=n, algorithm="pairwise")
        assert res.phases == 3 * (2 * B + 1)
        assert res.scale_out_bytes == n * 3 * 2 * (B - 1) * 400  # per slice, 2(B-1) sends of 400 B
    small = {B: simulate("all_reduce", 8 * 2 * B, tiny(2 * B), world_size=2 * B, algorithm="pairwise").duration_ns
             for B in (2, 4, 8, 16, 32)}
    for B in (2, 4):  # up to 8 boxes: the iterations overlap, each adds a few ns of bytes
        assert small[2 * B] - small[B] < OUT_LAT
    for B in (8, 16):  # beyond: every 8 more boxes add a reduce-scatter and an all-gather crossing
        assert 2 * (B // 8) * OUT_LAT <= small[2 * B] - small[B] < 2 * (B // 8) * 2 * OUT_LAT


def test_hcl_slice_is_per_rank(tiny, monkeypatch):
    """HCL's slice is HCL_SLICE_SIZE per rank: a buffer of n x 512 KB is one slice, PT_HCCL_SLICE_SIZE_MB
    does not apply."""
    monkeypatch.setenv("PT_HCCL_SLICE_SIZE_MB", "0.001")
    one = simulate("all_reduce", 4 * 512 * 1024, tiny(4), world_size=4, algorithm="pairwise")
    two = simulate("all_reduce", 4 * 512 * 1024 + 4 * 4, tiny(4), world_size=4, algorithm="pairwise")
    assert (one.phases, two.phases) == (5, 10)


# -- fabric ------------------------------------------------------------------------------------

def _pods(tmp_path, uplinks: int, ecmp: bool = True):
    """1-card boxes, 1 scale-out port at 8 Gb/s, 2 boxes per leaf, ``uplinks`` 8 Gb/s uplinks."""
    path = tmp_path / "pods.toml"
    path.write_text(TINY.replace("cards_per_box = 2", "cards_per_box = 1").replace("ports_per_card = 2", "ports_per_card = 1")
                    .replace("scale_up_ports_per_peer = 1", "scale_up_ports_per_peer = 0")
                    .replace("boxes_per_leaf = 1", "boxes_per_leaf = 2")
                    + f"\n[fabric]\necmp = {str(ecmp).lower()}\nleaf_uplinks = {uplinks}\nuplink_gbps = 8.0\n"
                      "leaf_radix = 8\nleaf_port_gbps = 8.0\n")
    return load_topology(str(path), world_size=4)


def _splitmix(src, dst, port, qp):
    """The documented hash written out in Python integers."""
    m = (1 << 64) - 1
    x = (src * 0x9E3779B97F4A7C15 ^ dst * 0xBF58476D1CE4E5B9 ^ port * 0x94D049BB133111EB
         ^ (qp * 0x2545F4914F6CDD1D) % (1 << 64)) & m
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & m
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_two_flows_on_one_uplink_take_twice_as_long(tmp_path):
    """One uplink per leaf: two flows leaving the leaf share it, each at half its rate."""
    topo = _pods(tmp_path, uplinks=1)
    assert message_slowdown(topo, [0], [2]) == ([1], [1])
    num, den = message_slowdown(topo, [0, 1], [2, 3])
    assert list(num / den) == [2.0, 2.0]
    num, den = message_slowdown(topo, [0, 2], [1, 3])  # inside each leaf: no uplink
    assert list(num / den) == [1.0, 1.0]
    both = simulate("all_gather", 4000, topo, world_size=4, algorithm="direct")
    alone = simulate("all_gather", 4000, fabric.ideal(topo), world_size=4, algorithm="direct")
    assert both.duration_ns > alone.duration_ns


def test_ecmp_collision_and_its_absence(tmp_path):
    """Two uplinks: the flows 0->2 and 1->3 collide exactly when the hash puts them on one."""
    topo = _pods(tmp_path, uplinks=2)
    seen = set()
    for qp in range(8):
        same = _splitmix(0, 2, 0, qp) % 2 == _splitmix(1, 3, 0, qp) % 2
        num, den = message_slowdown(topo, [0, 1], [2, 3], qp_set=qp)
        assert list(num / den) == ([2.0, 2.0] if same else [1.0, 1.0]), qp
        seen.add(same)
    assert seen == {True, False}  # both cases occur among the queue-pair sets
    ideal = fabric.ideal(topo)
    assert [list(a) for a in message_slowdown(ideal, [0, 1], [2, 3])] == [[1, 1], [1, 1]]


def test_ideal_fabric_keeps_the_frictionless_timing():
    """``ecmp = false`` times exactly as a topology without a fabric; ECMP costs time across pods."""
    hls2 = load_topology("hls2")
    bare = dataclasses.replace(hls2, fabric=None)
    for n in (64, 256):
        ideal = simulate("all_reduce", 64 << 20, fabric.ideal(hls2), world_size=n)
        assert ideal == simulate("all_reduce", 64 << 20, bare, world_size=n)
    assert simulate("all_reduce", 64 << 20, hls2, world_size=256).duration_ns > ideal.duration_ns


def test_shared_host_nics_halve_scale_out(tmp_path):
    """DL1: two cards per host NIC; sending at once, each gets half of it."""
    dl1 = load_topology("dl1", world_size=16)
    num, den = message_slowdown(dl1, [0, 1], [8, 9])
    assert list(num / den) == [2.0, 2.0]
    num, den = message_slowdown(dl1, [0, 2], [8, 10])
    assert list(num / den) == [1.0, 1.0]


def test_fabric_table_errors(tmp_path):
    """A bad [fabric] table is refused with a message naming the field."""
    path = tmp_path / "t.toml"
    path.write_text("cards_per_box = 8\n[fabric]\nplanes = 2\n")
    with pytest.raises(ValueError, match="3 scale-out ports per card do not split over 2 planes"):
        load_topology(str(path))
    path.write_text("cards_per_box = 8\n[fabric]\nspines = 2\n")
    with pytest.raises(ValueError, match=r"unknown \[fabric\] field\(s\) spines"):
        load_topology(str(path))
    path.write_text("cards_per_box = 8\nboxes_per_leaf = 64\n[fabric]\nleaf_radix = 8\n")
    with pytest.raises(ValueError, match="more than 8 x 400 Gb/s ports"):
        load_topology(str(path))
    with pytest.raises(ValueError, match=r"tiers must be an integer in \[1, 2\]"):
        Fabric(tiers=3)
    for field, value in (("uplink_gbps", True), ("uplink_gbps", float("inf")), ("leaf_uplinks", 2.0),
                         ("host_latency_ns", -1)):  # `true` is not a rate, nor 2.0 a count
        with pytest.raises(ValueError, match=f"fabric: {field} must be"):
            Fabric(**{field: value})


def test_new_topologies():
    """hls1h: 4 cards whose peers meet at the leaf; dl1: 8 cards, 2 per host NIC."""
    h = load_topology("hls1h", world_size=8)
    assert h.cards_per_box == 4 and h.ports(0, 1) == h.scale_out_ports(0) and h.switch_hops(0, 1) == 1
    assert simulate("all_reduce", 1 << 20, h, world_size=8).scale_up_bytes == 0
    d = load_topology("dl1", world_size=16)
    assert d.fabric.nic_cards == 2 and not d.fabric.ecmp
    assert d.path_latency_ns(0, 8) == 4 * 1000 + 3 * 600 + d.fabric.host_latency_ns
    assert np.isclose(d.scale_out_card_gbps, 100.0)


# -- box iterations in flight share the fabric -----------------------------------------------

def test_in_flight_shifts_by_hand():
    """The window of iteration k: the iterations k-w+1 .. k of its direction, kept inside 1 .. B-1."""
    assert fabric.in_flight_shifts(10, 3, 8) == ((1, 2, 3, 4, 5, 6, 7, 8), 2)
    assert fabric.in_flight_shifts(10, 9, 8) == ((2, 3, 4, 5, 6, 7, 8, 9), 7)
    assert fabric.in_flight_shifts(20, 12, 8) == ((5, 6, 7, 8, 9, 10, 11, 12), 7)
    # an all-gather's iteration 3 sends to box b - 3: shifts -1 .. -8 taken modulo B
    assert fabric.in_flight_shifts(10, -3, 8) == ((9, 8, 7, 6, 5, 4, 3, 2), 2)
    assert fabric.in_flight_shifts(3, 2, 8) == ((1, 2), 1)  # at most B - 1 iterations
    for bad in (0, 10, -10, 13):
        with pytest.raises(ValueError, match="not an iteration of 10 boxes"):
            fabric.in_flight_shifts(10, bad, 8)


def test_iterations_in_flight_share_the_fabric_by_hand(tmp_path):
    """4 one-card boxes, 2 per leaf, one uplink per leaf at the port rate C.

    Alone, iteration 2 (0->2, 1->3, 2->0, 3->1) puts two flows on each uplink: each at C/2,
    every message 2x slower. With iteration 1 (0->1, 1->2, 2->3, 3->0) in flight beside it, each
    uplink carries three flows (leaf 0 up: 1->2, 0->2, 1->3), each capped at C/3. Card 1 sends
    two of them: its port runs at 2C/3 (1.5x slower); card 0 sends 0->1 inside the leaf at C
    beside 0->2, so its port stays at C. Receiving, card 2 gets 1->2 and 0->2 (2C/3), card 3
    gets 2->3 and 1->3 (C). A message is as slow as its sender's or its receiver's port:
    0->2 1.5 (receiver), 1->3 1.5 (sender), 2->0 1.5, 3->1 1.5; of iteration 1, 0->1 and
    2->3 at full rate, 1->2 and 3->0 1.5x slower."""
    topo = _pods(tmp_path, uplinks=1)
    alone = fabric.shift_slowdown(topo, 2)
    assert list(alone[0] / alone[1]) == [2.0] * 4
    num, den = fabric.shift_slowdown(topo, 2, in_flight=2)
    assert list(num / den) == [1.5] * 4
    num, den = fabric.shift_slowdown(topo, 1, in_flight=2)  # window (1, 2), the same for iteration 1
    assert list(num / den) == [1.0, 1.5, 1.0, 1.5]
    # the all-gather's iteration -1 (to box b - 1 = shift 3) shares with -2 (shift 2)
    num, den = fabric.shift_slowdown(topo, -1, in_flight=2)
    assert list(num / den) == [1.5, 1.0, 1.5, 1.0]  # 0->3 (3 receives 1->3 and 0->3, 2C/3), 1->0, 2->1, 3->2
    assert [list(a) for a in fabric.shift_slowdown(fabric.ideal(topo), 2, in_flight=2)] == [[1] * 4, [1] * 4]


@pytest.mark.parametrize("case", ["hls2", "dl1", "hls3-faults"])
def test_a_window_of_one_iteration_is_the_row_model(case):
    """The window's port arithmetic with one iteration gives the row model's per-flow charge
    (rounded up to 1/65,536): NIC ports shared by two cards (dl1), a degraded port. A down
    port's queue pairs move to another port of its card, where two flows of one message then
    share a port: there the window's port may run its uncapped flow faster (never slower)."""
    from hccl.sim.whatif import WhatIf, link_faults

    if case == "hls3-faults":
        topo = load_topology("hls3", world_size=1024)
        topo = link_faults(topo, WhatIf(degraded_links=(("out", 5, 1, 4.0),), failed_links=(("out", 300, 2, 0),)))
    else:
        topo = load_topology(case, world_size=512)
    n, L = topo.world_size, topo.cards_per_box
    r = np.arange(n)
    slowed = 0
    for k in (1, 5, 17, 40, n // L - 1):
        for qp in (0, 3):
            dst = ((r // L + k) % (n // L)) * L + r % L
            num, den = message_slowdown(topo, r, dst, qp)
            wn, wd = fabric._window_exact(topo, (k,), 0, qp, n)
            window, row = wn * 1.0 / wd, np.where(num > den, -(-num * 65536 // den) / 65536, 1.0)
            if case == "hls3-faults":  # the messages to and from the card with the down port
                moved = (r == 300) | (dst == 300)
                assert np.all((window <= row)[moved]) and np.all(window >= 1)
                window, row = window[~moved], row[~moved]
            assert np.array_equal(window, row), (k, qp)
            slowed += int((num > den).sum())
    assert slowed > 0  # the rows did collide


def test_sampled_windows_lie_among_the_far_shifts():
    """A sampled shift's window (NOTE [sampled contention at scale]) holds only shifts that are
    sampled themselves, keeps the shift's offset inside a pod, and is the same for every shift
    it stands for."""
    topo = load_topology("hls2", world_size=8 * 512)
    B, P = 512, topo.boxes_per_leaf
    H = -(-fabric.SAMPLE_SHIFTS // P) * P
    for shift in list(range(1, B)) + [-k for k in range(1, B)]:
        rep, sampled = fabric._sampling(topo, shift, 8)
        k = shift % B
        assert sampled == (H <= k <= B - H)
        if not sampled:
            assert rep == k
            continue
        assert rep % P == k % P
        window, at = fabric.in_flight_shifts(B, rep if shift > 0 else rep - B, 8)
        assert window[at] == rep and all(H <= w <= B - H for w in window), (shift, window)
    small = load_topology("hls2", world_size=8 * 63)  # under 4H boxes: every shift exact
    assert not any(fabric._sampling(small, s, 8)[1] for s in range(1, 63))


def test_iterations_in_flight_hide_collisions_behind_each_other(monkeypatch):
    """Gaudi 3, 64 boxes (4 pods), 256 MB: ECMP costs time over an ideal fabric, but less with the
    iterations in flight sharing it than with each iteration's collisions charged alone."""
    from hccl.sim import planner

    topo = load_topology("hls3", world_size=512)
    planner._simulate_cached.cache_clear()
    ideal = simulate("all_reduce", 256 << 20, fabric.ideal(topo), world_size=512).duration_ns
    shared = simulate("all_reduce", 256 << 20, topo, world_size=512).duration_ns
    real = fabric.shift_slowdown
    monkeypatch.setattr(fabric, "shift_slowdown", lambda *a, in_flight=1, **kw: real(*a, **kw))
    planner._simulate_cached.cache_clear()
    alone = simulate("all_reduce", 256 << 20, topo, world_size=512).duration_ns
    planner._simulate_cached.cache_clear()
    assert ideal < shared < alone
