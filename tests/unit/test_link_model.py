"""RoCE v2 link model."""

import numpy as np
import pytest

from hccl.sim.link_model import LinkParams, goodput_gbps, message_ns, serialization_ns, wire_bytes
from hccl.sim.topology import load_topology


def test_wire_bytes_packets():
    """Each MTU-sized packet carries the header; a 0-byte message is one packet."""
    assert wire_bytes(0, 4096, 82) == 82
    assert wire_bytes(4096, 4096, 82) == 4096 + 82
    assert wire_bytes(4097, 4096, 82) == 4097 + 2 * 82
    assert list(wire_bytes(np.array([1, 8192]), 4096, 82)) == [83, 8192 + 164]


def test_serialization_integer_ceil():
    """Serialization = ceil(wire bits / rate) in integer ns."""
    assert serialization_ns(4096, 100.0, 4096, 82) == -(-(4178 * 8) // 100)
    assert serialization_ns(1 << 30, 300.0, 4096, 82) > (1 << 30) * 8 // 300
    with pytest.raises(ValueError):
        serialization_ns(1, 0.0, 4096, 82)


def test_goodput_large_message():
    """Large messages run at line rate x mtu / (mtu + header)."""
    g = goodput_gbps(100.0, 4096, 82)
    assert g == pytest.approx(100 * 4096 / 4178)
    n = 1 << 28
    assert n * 8 / serialization_ns(n, 100.0, 4096, 82) == pytest.approx(g, rel=1e-6)


def test_transfer_scale_up_vs_out_and_oversubscription():
    """Scale-up uses 3 ports per peer; scale-out crossing the spine is slowed by oversubscription."""
    t = load_topology("hls2", world_size=64, boxes_per_leaf=2, oversubscription=2.0, fabric=None)  # ideal
    lp = LinkParams(t)
    ser, lat, out = lp.transfer([0, 0, 0], [1, 8, 16], np.array([1 << 20] * 3))
    assert list(out) == [False, True, True]
    assert ser[0] == ser[1]  # 3 x 100G either way
    assert ser[2] == pytest.approx(2 * ser[1], rel=1e-3)
    assert lat[0] < lat[1] < lat[2]
    assert message_ns(t, 0, 1, 0) == lat[0] + serialization_ns(0, 300.0, 4096, 82)
