"""RoCE v2 port model: bytes to simulated nanoseconds.

Pure integer arithmetic, no state: the planner keeps the per-port "free at" times and
calls these functions. Numbers come from a :class:`~hccl.sim.topology.Topology`.

NOTE [RoCE v2 goodput]
    A message of ``n`` payload bytes is cut into ``ceil(n / mtu_bytes)`` packets (at
    least one, so a zero-byte message still costs one header). Every packet carries
    ``header_bytes`` more on the wire (framing, IPv4, UDP, BTH, ICRC, preamble and gap),
    so for large messages goodput = line rate x mtu / (mtu + header).

NOTE [port serialization]
    A message to a peer in the same box is striped over the ``scale_up_ports_per_peer``
    ports of that link; a message to another box over the card's scale-out ports, at a
    rate divided by the fabric oversubscription when it crosses the spine. A port group
    sends one message at a time (egress) and receives one at a time (ingress):

        tx_start = max(send_time, egress_free)
        arrival  = max(tx_start + latency, ingress_free) + serialization

    which is ``max(ready, port free) + bytes / goodput + latency`` when nothing queues.

NOTE [rates as integers]
    Every amount-to-time conversion (bits at a line rate, bytes at the reduction rate) is
    :func:`transfer_ns`: ``ceil(amount / rate)`` in integer arithmetic, with the rate
    floored to a whole number of micro-units per ns (:data:`RATE_SCALE`). Flooring the
    rate and rounding the time up are both monotone, so a slower link is never faster,
    and a rate that floors to zero (below 10^-6 units per ns, a thousand times under the
    1 Mb/s a topology file may state) is refused instead of dividing by zero.
"""

from __future__ import annotations

import math

import numpy as np

from hccl.sim.topology import Topology

__all__ = [
    "wire_bytes",
    "transfer_ns",
    "RATE_SCALE",
    "serialization_ns",
    "goodput_gbps",
    "message_ns",
    "LinkParams",
    "link_params",
]


def wire_bytes(nbytes, mtu_bytes: int, header_bytes: int):
    """Bytes on the wire for a message of ``nbytes`` payload bytes (int or int64 array)."""
    packets = np.maximum(1, -(-np.asarray(nbytes, dtype=np.int64) // mtu_bytes))
    out = np.asarray(nbytes, dtype=np.int64) + packets * header_bytes
    return int(out) if np.ndim(out) == 0 else out


RATE_SCALE = 1_000_000
"""Rates are whole multiples of 1/RATE_SCALE unit per ns (NOTE [rates as integers])."""
_MAX_AMOUNT = np.iinfo(np.int64).max // RATE_SCALE  # 9.2e12: bits of a 1.1 TB message


def transfer_ns(amount, per_ns: float):
    """Simulated ns to move ``amount`` units (bits, bytes) at ``per_ns`` units per ns, rounded
    up (NOTE [rates as integers]): the one conversion from an amount to time.

    Accepts an int or an int64 array; returns the same shape.

    Raises:
        ValueError: a rate that is not finite or floors to zero, or an amount over 9.2e12.
    """
    if not math.isfinite(per_ns) or per_ns * RATE_SCALE < 1:
        raise ValueError(f"rate must be a finite number >= {1 / RATE_SCALE:g} per ns, got {per_ns!r}")
    rate = math.floor(per_ns * RATE_SCALE)
    amount = np.asarray(amount, dtype=np.int64)
    if amount.size and int(amount.max()) > _MAX_AMOUNT:
        raise ValueError(f"cannot time {int(amount.max())} units in one message: at most {_MAX_AMOUNT}")
    out = -(-amount * RATE_SCALE // rate)
    return int(out) if np.ndim(out) == 0 else out


def serialization_ns(nbytes, rate_gbps: float, mtu_bytes: int, header_bytes: int):
    """Time to put a message on the wire at ``rate_gbps`` (Gb/s = bit/ns), simulated ns, rounded up.

    Accepts an int or an int64 array of payload sizes (bytes).
    """
    return transfer_ns(wire_bytes(nbytes, mtu_bytes, header_bytes) * 8, rate_gbps)


def goodput_gbps(rate_gbps: float, mtu_bytes: int, header_bytes: int) -> float:
    """Payload rate of a port group for large messages, Gb/s."""
    return rate_gbps * mtu_bytes / (mtu_bytes + header_bytes)


class LinkParams:
    """Rates and latencies between every pair of ranks of a topology, vectorized.

    Attributes:
        up_gbps: line rate of one box-peer link (ports per peer x port rate), Gb/s.
        out_gbps: scale-out line rate of one card (ports x port rate), Gb/s, before
            oversubscription.
        up_latency_ns: one-way latency inside a box, simulated ns.
    """

    __slots__ = ("topo", "up_gbps", "out_gbps", "up_latency_ns", "leaf_latency_ns",
                 "spine_latency_ns", "mtu", "hdr", "reduce_bpns", "cpb", "bpl", "oversub", "no_up", "_box", "_leaf")

    def __init__(self, topo: Topology):
        self.topo = topo
        self.up_gbps = topo.scale_up_peer_gbps
        self.out_gbps = topo.scale_out_card_gbps
        self.up_latency_ns = topo.nic_latency_ns
        host = topo.fabric.host_latency_ns if topo.fabric is not None else 0
        self.leaf_latency_ns = 2 * topo.nic_latency_ns + topo.switch_latency_ns + host
        self.spine_latency_ns = 4 * topo.nic_latency_ns + 3 * topo.switch_latency_ns + host
        self.mtu = topo.mtu_bytes
        self.hdr = topo.header_bytes
        self.reduce_bpns = topo.reduce_bytes_per_ns
        self.cpb = topo.cards_per_box
        self.bpl = topo.boxes_per_leaf
        # an ECMP fabric charges contention on its links instead (hccl.sim.fabric)
        self.oversub = 1.0 if topo.fabric is not None and topo.fabric.ecmp else topo.oversubscription
        self.no_up = topo.scale_up_ports_per_peer == 0  # box peers through the leaf switch
        self._box = None
        self._leaf = None

    def transfer(self, src, dst, nbytes):
        """Serialization (ns), latency (ns) and scale-out flag for messages src -> dst.

        All arguments are int64 arrays of one shape; returns three arrays of that shape.
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        hi = int(max(src.max(initial=0), dst.max(initial=0))) + 1
        if self._box is None or self._box.size < hi:
            r = np.arange(max(hi, self.topo.world_size), dtype=np.int64)
            self._box = r // self.cpb
            self._leaf = self._box // self.bpl
        box_s, box_d = self._box[src], self._box[dst]
        out = src != dst if self.no_up else box_s != box_d
        cross = self._leaf[src] != self._leaf[dst]
        any_out = bool(out.any())
        all_out = any_out and bool(out.all())
        bits = wire_bytes(nbytes, self.mtu, self.hdr) * 8
        ser = None
        if not all_out:
            ser = transfer_ns(bits, self.up_gbps)
        if any_out:
            ser_out = transfer_ns(bits, self.out_gbps)
            if self.oversub != 1.0:
                ser_out = np.where(cross, transfer_ns(bits, self.out_gbps / self.oversub), ser_out)
            ser = ser_out if all_out else np.where(out, ser_out, ser)
        lat_out = np.where(cross, np.int64(self.spine_latency_ns), np.int64(self.leaf_latency_ns))
        lat = lat_out if all_out else np.where(out, lat_out, np.int64(self.up_latency_ns))
        return np.asarray(ser, dtype=np.int64), np.asarray(lat, dtype=np.int64), out

    def reduce_ns(self, nbytes):
        """Time to reduce ``nbytes`` received bytes into the buffer, simulated ns."""
        return transfer_ns(nbytes, self.reduce_bpns)


def link_params(topo: Topology) -> LinkParams:
    """Vectorized link parameters for ``topo``."""
    return LinkParams(topo)


def message_ns(topo: Topology, src: int, dst: int, nbytes: int) -> int:
    """Unloaded time of one message ``src -> dst``: serialization + path latency, simulated ns."""
    ser, lat, _ = LinkParams(topo).transfer([src], [dst], np.asarray([nbytes]))
    return int(ser[0] + lat[0])
