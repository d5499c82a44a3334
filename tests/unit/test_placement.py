"""Subgroup placement: a group's members on the job's cards, timed on a topology of their own."""

import math

import pytest

from hccl.sim import timing
from hccl.sim.placement import place_group
from hccl.sim.planner import simulate
from hccl.sim.topology import load_topology

MB = 1 << 20
HLS2_64 = load_topology("hls2", world_size=64, boxes_per_leaf=4)  # 8 boxes, 4 per leaf


def _allreduce_2ranks_ns(gbps: int, latency_ns: int, nbytes: int = MB) -> int:
    """Hand figure: reduce-scatter + all-gather of one S/2 message each (see test_subgroups)."""
    half = nbytes // 2
    ser = math.ceil((half + math.ceil(half / 4096) * 82) * 8 / gbps)
    return 2 * (ser + latency_ns) + math.ceil(half / 820)


@pytest.mark.parametrize("cards,cpb,boxes", [
    ([0, 8, 16, 24], 1, 4),           # data-parallel group: one card per box
    (list(range(8)), 8, 1),           # one whole box
    ([0, 1, 8, 9], 2, 2),             # two cards in each of two boxes
    ([3, 5], 2, 1),                   # two cards of one box
    ([0, 1, 8], 2, 2),                # the last box partly used
])
def test_boxes_from_cards(cards, cpb, boxes):
    """Boxes of the group = job boxes holding members; cards per box = members per box."""
    p = place_group(HLS2_64, cards)
    assert (p.topology.cards_per_box, p.topology.num_boxes, p.topology.world_size) == (cpb, boxes, len(cards))
    res = simulate("all_reduce", MB, p.topology, world_size=len(cards))
    assert (res.scale_up_bytes == 0) == (cpb == 1)
    assert (res.scale_out_bytes == 0) == (boxes == 1)


def test_whole_job_is_the_job_topology():
    """The default group's placement is the job's own topology: its timing is unchanged."""
    p = place_group(HLS2_64, range(64))
    assert p.topology is HLS2_64 and p.identity


def test_pairs_against_hand_figures():
    """1 MiB allreduce of two cards: one box (scale-up), one leaf, or across the spine."""
    # 3 x 100 Gb/s both ways on HLS-2: only the path latency differs
    cases = {(3, 5): 1000, (0, 8): 2 * 1000 + 600, (0, 32): 4 * 1000 + 3 * 600}
    for cards, latency in cases.items():
        p = place_group(HLS2_64, cards)
        res = simulate("all_reduce", MB, p.topology, world_size=2)
        assert res.duration_ns == _allreduce_2ranks_ns(300, latency), cards
    assert place_group(HLS2_64, [0, 32]).topology.switch_hops(0, 1) == 3
    assert place_group(HLS2_64, [0, 8, 16, 24]).topology.switch_hops(0, 3) == 1


def test_short_box_goes_last():
    """{0, 8, 9}: box 0 holds one member, box 1 two: the short box becomes the last, partly used."""
    p = place_group(HLS2_64, [0, 8, 9])
    assert p.order == (2, 0, 1) and p.topology.cards_per_box == 2
    assert p.to_topology(["a", "b", "c"]) == ["b", "c", "a"]


def test_timing_uses_group_ranks():
    """collective_times with a placement takes ready times, rank and root in group ranks."""
    p = place_group(HLS2_64, [0, 8, 9])
    ready = [500, 0, 20]  # group ranks
    res = simulate("broadcast", MB, p.topology, world_size=3, ready_ns=[0, 20, 500], root=2)
    for rank in range(3):
        t = timing.collective_times("broadcast", MB, ready, rank=rank, root=0, placement=p)
        assert t.end_ns == res.end_ns[p.order[rank]]


def test_unequal_boxes_fall_back_to_one_card_per_box():
    """{0, 8, 9, 16}: boxes of 1, 2, 1 members cannot be one topology: every member alone."""
    p = place_group(HLS2_64, [0, 8, 9, 16])
    assert p.topology.cards_per_box == 1 and p.identity
    assert simulate("all_reduce", MB, p.topology, world_size=4).scale_up_bytes == 0


def test_bad_cards():
    with pytest.raises(ValueError, match="repeat"):
        place_group(HLS2_64, [1, 1])
    with pytest.raises(ValueError, match="outside"):
        place_group(HLS2_64, [0, 64])
