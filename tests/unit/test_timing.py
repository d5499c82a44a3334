"""Timing seam: simulated collective intervals against timelines computed by hand.

The references below do not call the planner: they apply the link model's formulas
(NOTE [port serialization], NOTE [timing rules] in hccl.sim.planner) written out for a tiny
topology with round figures, so a change to a formula or to a schedule shows up here.

Tiny topology: boxes of 2 cards, 1 port per peer and 1 scale-out port, all at 8 Gb/s
(1 byte/ns), MTU 1000 B with no header (wire bytes = payload), NIC latency 100 ns, switch
latency 50 ns, reduction 2 bytes/ns, one box per leaf (so box to box crosses the spine:
latency 4 x 100 + 3 x 50 = 550 ns).
"""


import pytest

from hccl.sim import timing
from hccl.sim.planner import simulate
from hccl.sim.timing import AUTO
from hccl.sim.topology import load_topology

MB = 1 << 20
BIG_SLICE = 64 * MB  # one slice: no pipelining in the hand timelines

TINY = """
name = "tiny"
cards_per_box = 2
ports_per_card = 2
scale_up_ports_per_peer = 1
scale_out_ports_per_card = 1
scale_up_line_rate_gbps = 8.0
scale_out_line_rate_gbps = 8.0
mtu_bytes = 1000
header_bytes = 0
nic_latency_ns = 100
switch_latency_ns = 50
reduce_bytes_per_ns = 2.0
boxes_per_leaf = 1
"""
UP_LAT, OUT_LAT = 100, 4 * 100 + 3 * 50  # in a box; box to box across the spine


def ser(nbytes: int) -> int:
    """Serialization at 1 byte/ns (8 Gb/s, no header)."""
    return nbytes


def red(nbytes: int) -> int:
    """Reduction at 2 bytes/ns."""
    return -(-nbytes // 2)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return lambda n: timing.host_topology(str(path), n)


def _times(tiny, kind, nbytes, ready, rank, algorithm=AUTO):
    return timing.collective_times(kind, nbytes, ready, rank=rank, topology=tiny(len(ready)), algorithm=algorithm,
                                   slice_bytes=BIG_SLICE)


@pytest.mark.parametrize("nbytes", [400, 4000, 40_000])
@pytest.mark.parametrize("ready", [(0, 0), (0, 300), (5000, 0)])
def test_direct_allreduce_two_ranks_by_hand(tiny, nbytes, ready):
    """Direct all-reduce on one box of two: reduce-scatter half, reduce, all-gather half; both
    ranks start when the later one is ready."""
    half = nbytes // 2
    start = max(ready)
    # phase 1: each rank sends its peer's half at the start; the peer reduces it
    rs_done = [start + ser(half) + UP_LAT + red(half) for r in (0, 1)]
    up_free = [start + ser(half) for r in (0, 1)]
    # phase 2: each rank sends its reduced half once its receive is reduced and its port free
    tx = [max(rs_done[r], up_free[r]) for r in (0, 1)]
    for r in (0, 1):
        end = max(tx[r] + ser(half), tx[1 - r] + ser(half) + UP_LAT)
        t = _times(tiny, "allreduce", nbytes, list(ready), r)
        assert t == (start, end, "direct"), (r, t)


@pytest.mark.parametrize("ready", [(0, 0), (0, 2500)])
def test_direct_allgather_two_ranks_by_hand(tiny, ready):
    """All-gather: each rank's whole input crosses the link once, from the later ready time."""
    nbytes = 3000
    for r in (0, 1):
        end = max(ready) + ser(nbytes) + UP_LAT
        assert _times(tiny, "allgather", nbytes, list(ready), r).end_ns == end


def _ring_allreduce_by_hand(nbytes: int, ready: list[int]) -> list[int]:
    """Ring all-reduce on 4 ranks = 2 boxes of 2: 0->1 and 2->3 in a box, 1->2 and 3->0 across.

    Per step each rank sends one chunk (nbytes / 4) to r + 1 when its previous step is done
    and its port is free; a box-to-box message also waits for the receiver's ingress port.
    """
    n = 4
    chunk = nbytes // n
    start = list(ready)
    egress_free = [0] * n  # one port group per rank: it only ever sends to r + 1
    ingress_free = [0] * n  # scale-out ingress (ranks 0 and 2 receive from the other box)
    last_sent = [0] * n
    for step in range(2 * (n - 1)):
        reduce = step < n - 1
        tx = [max(start[r], egress_free[r]) for r in range(n)]
        done = list(start)
        for r in range(n):
            d = (r + 1) % n
            if r // 2 == d // 2:
                arrive = tx[r] + UP_LAT + ser(chunk)
            else:
                arrive = max(tx[r] + OUT_LAT, ingress_free[d]) + ser(chunk)
                ingress_free[d] = arrive
            egress_free[r] = last_sent[r] = tx[r] + ser(chunk)
            done[d] = max(done[d], arrive + (red(chunk) if reduce else 0))
        start = done
    return [max(start[r], last_sent[r]) for r in range(n)]


@pytest.mark.parametrize("ready", [[0, 0, 0, 0], [0, 700, 0, 2500], [9000, 0, 0, 0]])
def test_ring_allreduce_four_ranks_by_hand(tiny, ready):
    """Ring over two boxes: every rank's end equals the hand recurrence."""
    nbytes = 4000
    want = _ring_allreduce_by_hand(nbytes, [max(ready)] * 4)  # every rank starts with the last
    if ready == [0, 0, 0, 0]:
        assert want == [9450] * 4  # worked on paper: 3 reduce steps, 3 gather steps
    for r in range(4):
        t = _times(tiny, "allreduce", nbytes, ready, r, algorithm="ring")
        assert (t.end_ns, t.algorithm) == (want[r], "ring"), r


def _hierarchical_allreduce_by_hand(nbytes: int, ready: list[int]) -> list[int]:
    """Hierarchical all-reduce on 4 ranks = 2 boxes of 2 (rank r = box * 2 + local index).

    Card l owns the box's two chunks of local index l (nbytes / 2, contiguous):
    1. in-box reduce-scatter: send the peer the half it owns, which it reduces;
    2. scale-out reduce-scatter: send the card of the same index in the other box the
       quarter it owns, which it reduces;
    3. scale-out all-gather: send it my reduced quarter;
    4. in-box all-gather: send my local peer my reduced half.
    A rank sends in a step when its previous step is done and that port (scale-up or
    scale-out, separate ports) is free; a scale-out message also waits for the receiver's
    scale-out ingress.
    """
    n, half, quarter = 4, nbytes // 2, nbytes // 4
    up_free, out_free, ingress = [0] * n, [0] * n, [0] * n
    start = list(ready)

    def step(size, across, reduce):
        nonlocal start
        done = list(start)
        for r in range(n):
            d = r ^ 2 if across else r ^ 1
            free = out_free if across else up_free
            tx = max(start[r], free[r])
            free[r] = tx + ser(size)
            if across:
                arrive = max(tx + OUT_LAT, ingress[d]) + ser(size)
                ingress[d] = arrive
            else:
                arrive = tx + UP_LAT + ser(size)
            done[d] = max(done[d], arrive + (red(size) if reduce else 0))
        start = done

    step(half, across=False, reduce=True)
    step(quarter, across=True, reduce=True)
    step(quarter, across=True, reduce=False)
    step(half, across=False, reduce=False)
    return [max(start[r], up_free[r]) for r in range(n)]


@pytest.mark.parametrize("ready", [[0, 0, 0, 0], [0, 700, 0, 2500], [9000, 0, 0, 0]])
def test_hierarchical_allreduce_four_ranks_by_hand(tiny, ready):
    """In-box reduce-scatter, pairwise scale-out, in-box all-gather: each rank's end by hand."""
    nbytes = 4000
    want = _hierarchical_allreduce_by_hand(nbytes, [max(ready)] * 4)  # every rank starts with the last
    if ready == [0, 0, 0, 0]:
        # on paper: 2000+100+1000 | 1000+550+500 | 1000+550 | 2000+100 = 8800
        assert want == [8800] * 4
    for r in range(4):
        t = _times(tiny, "allreduce", nbytes, ready, r, algorithm="hierarchical")
        assert (t.end_ns, t.algorithm) == (want[r], "hierarchical"), (r, t, want)


def test_p2p_by_hand(tiny):
    """A message leaves when the sender is ready and lands serialization + latency later."""
    topo = tiny(4)
    t = timing.p2p_times(1000, src=0, dst=1, src_ready_ns=10, dst_ready_ns=0, topology=topo)
    assert t == (10, 10 + ser(1000) + UP_LAT, "p2p")
    across = timing.p2p_times(1000, src=1, dst=2, src_ready_ns=10, dst_ready_ns=0, topology=topo)
    assert across.end_ns == 10 + ser(1000) + OUT_LAT
    late = timing.p2p_times(1000, src=0, dst=1, src_ready_ns=10, dst_ready_ns=10**9, topology=topo)
    assert late.end_ns == 10**9


def test_explicit_configuration_ignores_environment(tiny, monkeypatch):
    """``algorithm=AUTO`` and an explicit slice are not overridden by HCCL_ALGO / PT_HCCL_SLICE_SIZE_MB."""
    before = _times(tiny, "allreduce", 4000, [0] * 4, 0)
    monkeypatch.setenv("HCCL_ALGO", "ring")
    monkeypatch.setenv("PT_HCCL_SLICE_SIZE_MB", "0.001")
    assert _times(tiny, "allreduce", 4000, [0] * 4, 0) == before
    assert before.algorithm != "ring"


def test_needs_a_topology():
    """No module-level topology: the caller must say what to time on."""
    with pytest.raises(TypeError, match="topology"):
        timing.collective_times("allreduce", 1024, [0, 0])
    with pytest.raises(TypeError, match="topology"):
        timing.p2p_times(1024, src=0, dst=1, src_ready_ns=0, dst_ready_ns=0)


def test_hosts_become_boxes():
    """Two hosts of 4 ranks on hls2 are two boxes of 4 cards (host_topology), not one box of 8."""
    assert timing.host_topology("hls2", 8).cards_per_box == 8
    topo = timing.host_topology("hls2", 8, ranks_per_host=4)
    assert topo.cards_per_box == 4 and topo.world_size == 8


def test_uneven_alltoall_size_convention():
    """The process group's alltoall size (its input) maps onto the planner's: even splits are the
    default split, uneven ones pass the matrix and are timed on the largest row."""
    topo = load_topology("hls2", world_size=4)
    even = timing.collective_times("alltoall", 4 * 1024 * 4, [0] * 4, topology=topo, splits=[[1024] * 4] * 4)
    assert even == timing.collective_times("alltoall", 4 * 1024 * 4, [0] * 4, topology=topo)
    splits = [[0, 4096, 0, 0], [0] * 4, [0] * 4, [0] * 4]
    t = timing.collective_times("alltoall", 4096 * 4, [0] * 4, rank=1, splits=splits, topology=topo)
    assert t.end_ns > even.end_ns


def test_odd_sizes_and_one_rank(tiny):
    """A size that is not a whole number of elements is timed in bytes; one rank takes no time."""
    t = _times(tiny, "allgather", 6, [0, 0], 0)
    assert t.end_ns == max(ser(6), ser(6) + UP_LAT)
    assert _times(tiny, "allreduce", 4096, [123], 0) == (123, 123, "direct")


def test_unknown_kind(tiny):
    """A collective the model does not know is named in the error."""
    with pytest.raises(ValueError, match="'gather'"):
        _times(tiny, "gather", 1024, [0, 0], 0)


def test_repeated_bucket_reuses_one_cached_schedule():
    """A DDP bucket's call at shifted ready times is one schedule simulated once, then shifted.

    What makes the per-bucket call cheap is the cache; its wall cost is a benchmark figure
    (``python -m hccl.tools.bench --planner_cost``), not a test threshold."""
    from hccl.sim import planner
    topo = load_topology("hls2", world_size=8)
    planner._simulate_cached.cache_clear()
    first = timing.collective_times("allreduce", 25 * MB, [0] * 8, rank=0, dtype_bytes=4, topology=topo)
    for i in range(1, 50):
        got = timing.collective_times("allreduce", 25 * MB, [i] * 8, rank=i % 8, dtype_bytes=4, topology=topo)
        assert got[0] == i and got[1] - got[0] == first[1] - first[0], (i, got, first)
    assert planner._simulate_cached.cache_info().misses == 1


def test_planner_agrees_on_a_large_system():
    """Beyond hand-sized cases the seam is the planner (same schedules, same link model)."""
    topo = load_topology("hls2", world_size=16)
    ready = [100 * (r % 3) for r in range(16)]
    res = simulate("all_reduce", 3 * MB, topo, world_size=16, ready_ns=[200] * 16, algorithm="hierarchical",
                   slice_bytes=BIG_SLICE)
    t = timing.collective_times("allreduce", 3 * MB, ready, rank=5, topology=topo, algorithm="hierarchical",
                                slice_bytes=BIG_SLICE)
    assert t.end_ns == res.end_ns[5]
