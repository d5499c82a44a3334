"""A subgroup is timed on its members' cards: across boxes on scale-out, inside a box on scale-up.

Hand-computed figures (NOTE [RoCE v2 goodput], NOTE [timing rules]): a message of ``b``
payload bytes puts ``b + ceil(b / 4096) x 82`` bytes on the wire, serialized at the link's
rate (ceil to ns), then lands after the path latency (1000 ns card to card, 2 x 1000 +
600 ns card-leaf-card); a reducing receive then takes ``ceil(b / 820)`` ns. A 2-rank
all-reduce of S bytes is a reduce-scatter then an all-gather, each one message of S/2 to
the peer: ``2 x (ser(S/2) + latency) + reduce(S/2)``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks

S = 1 << 20  # bytes per allreduce: one slice (PT_HCCL_SLICE_SIZE_MB defaults to 16)
# 2 cards per box, 3 x 100 Gb/s per box peer, 1 x 100 Gb/s scale-out per card
BOXES_OF_TWO = """
name = "boxes_of_two"
cards_per_box = 2
ports_per_card = 4
scale_up_ports_per_peer = 3
scale_out_ports_per_card = 1
scale_up_line_rate_gbps = 100.0
scale_out_line_rate_gbps = 100.0
mtu_bytes = 4096
header_bytes = 82
nic_latency_ns = 1000
switch_latency_ns = 600
reduce_bytes_per_ns = 820.0
boxes_per_leaf = 4
"""


def _ser(nbytes: int, gbps: int) -> int:
    """Serialization of one message, ns: wire bits / rate (Gb/s = bit/ns), rounded up."""
    return math.ceil((nbytes + math.ceil(nbytes / 4096) * 82) * 8 / gbps)


UP_NS, OUT_NS = 1000, 2 * 1000 + 600  # latency in a box; card -> leaf switch -> card
RED_NS = math.ceil(S // 2 / 820)  # 640 ns to reduce S/2 received bytes
PAIR_UP = 2 * (_ser(S // 2, 300) + UP_NS) + RED_NS  # 2 x (14261 + 1000) + 640 = 31162
PAIR_OUT = 2 * (_ser(S // 2, 100) + OUT_NS) + RED_NS  # 2 x (42783 + 2600) + 640 = 91406
# the same pair across boxes of HLS-2 (3 x 100 Gb/s scale-out per card)
PAIR_OUT_HLS2 = 2 * (_ser(S // 2, 300) + OUT_NS) + RED_NS  # 34362
# 4 ranks on two boxes of two, HCL's pairwise box iterations (chunks of S/4, NOTE [HCL's pairwise
# box iterations]): in-box reduce-scatter of the own box's part, then of the other box's right
# behind it on the same link (each reduced: 7131 + 7131 + 1000 + 320), the scale-out exchange
# (reduced), the scale-out all-gather (beside the in-box all-gather of the own part), the in-box
# all-gather of the other box's part once it has arrived
WORLD4 = (3 * _ser(S // 4, 300) + 2 * UP_NS + 2 * (_ser(S // 4, 100) + OUT_NS)
          + 2 * math.ceil(S // 4 / 820))  # 3 x 7131 + 2 x 1000 + 2 x (21392 + 2600) + 2 x 320 = 72017


def _time_allreduce(group) -> tuple[int, str]:
    """Simulated duration and algorithm of an allreduce of S bytes in ``group``, from a fresh
    device timeline on every member (equal ready times: the pure collective)."""
    import hpu_runtime  # in the spawned rank only: it activates the bridge on import

    hpu_runtime.reset_device()
    t = torch.ones(S // 4)
    dist.all_reduce(t, group=group)
    rec = group.history[-1]
    assert rec.start_ns == 0 and t[0].item() == dist.get_world_size(group)  # the bytes moved too
    return rec.duration_ns, rec.algorithm


def _groups(rank: int, world: int, enumerate_too: bool) -> dict:
    out = {}
    cross = dist.new_group([0, 2])  # created first: a later same-size group must not inherit it
    inside = dist.new_group([0, 1])
    if rank in (0, 2):
        out["{0,2}"] = _time_allreduce(cross)
    if rank in (0, 1):
        out["{0,1}"] = _time_allreduce(inside)
    out["world"] = _time_allreduce(dist.group.WORLD)
    if enumerate_too:
        mine, _ = dist.new_subgroups(group_size=2)  # {0,1}, {2,3}
        out["new_subgroups"] = _time_allreduce(mine)
        mine, _ = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])
        out["by_enumeration"] = _time_allreduce(mine)
    return out


@pytest.mark.timeout(120)
def test_subgroups_on_their_cards(tmp_path):
    """Boxes of two cards (HCCL_TOPOLOGY): {0,2} crosses boxes, {0,1} stays in one; hand figures."""
    topo = tmp_path / "boxes_of_two.toml"
    topo.write_text(BOXES_OF_TWO)
    res = run_ranks(_groups, 4, True, env={"HCCL_TOPOLOGY": str(topo)}, timeout=100)
    assert (PAIR_UP, PAIR_OUT, WORLD4) == (31162, 91406, 72017)  # the arithmetic in the comments
    for rank in (0, 2):
        assert res[rank]["{0,2}"] == (PAIR_OUT, "pairwise")
    for rank in (0, 1):
        assert res[rank]["{0,1}"] == (PAIR_UP, "direct")
    for rank in range(4):
        assert res[rank]["world"] == (WORLD4, "pairwise")  # the default group as before
        assert res[rank]["new_subgroups"] == (PAIR_UP, "direct")  # {0,1} and {2,3}: one box each
        assert res[rank]["by_enumeration"] == (PAIR_OUT, "pairwise")  # {0,2} and {1,3}


@pytest.mark.timeout(120)
def test_subgroups_across_hosts():
    """Two emulated hosts of two ranks on HLS-2: hosts are boxes, for the job and its subgroups."""
    env = {"RANKS_PER_HOST": "2", "HCCL_HOST_ID": "host{host}", "HCCL_SHM_BUFFER_MB": "2"}
    res = run_ranks(_groups, 4, False, env=env, timeout=100)
    assert PAIR_OUT_HLS2 == 34362
    for rank in (0, 2):
        assert res[rank]["{0,2}"] == (PAIR_OUT_HLS2, "pairwise")
    for rank in (0, 1):
        assert res[rank]["{0,1}"] == (PAIR_UP, "direct")
