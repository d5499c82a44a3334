"""The scale-out switch fabric: ECMP placement of HCL's flows and max-min sharing of links.

A topology file's ``[fabric]`` table (:class:`Fabric`) describes the switches between boxes:
leaf switches shared by ``boxes_per_leaf`` boxes (a pod), ``planes`` parallel leaf/spine
fabrics (scale-out port ``p`` of every card goes to plane ``p mod planes``: Intel's Gaudi2 and
Gaudi 3 pods put the three scale-out ports of a box on three leaf switches; MLPerf's HLS-1H
systems list "10x L3 Fat Tree"), ``leaf_uplinks`` uplinks per leaf and their rate, and
whether flows are placed on uplinks by an ECMP hash. Pure integer/float arithmetic on numpy
arrays; no state besides memos keyed by every input.

NOTE [flows and links]
    A scale-out message from card ``s`` to card ``d`` is striped over ``s``'s scale-out
    ports, one flow per port ``p`` (to ``d``'s port ``p``). A flow crosses: its card's NIC
    (egress; ``nic_cards`` cards share one NIC on hosts whose scale-out goes through host
    NICs), then, if ``d`` is on another leaf, the uplink of ``s``'s leaf that the ECMP hash of
    the flow picks, the spine's link down to ``d``'s leaf (the same index: symmetric wiring),
    and ``d``'s NIC (ingress). The hash is a 64-bit mix of (source card, destination card,
    port, queue-pair set): RoCE v2 derives the UDP source port from the queue pair, so
    switches see HCL's queue pairs as distinct 5-tuples, and a new queue-pair set (HCL
    rotates them per slice) lands elsewhere.

NOTE [max-min sharing, per row]
    The messages of one row of a block (one per sender, sent at about the same time: a
    pairwise box iteration, a ring step) are taken as concurrent flows. A link carrying ``k``
    of them at ``C`` Gb/s offers each ``C / k``; a flow is charged the least such share on its
    path (its max-min fair rate when that link is its bottleneck, which is always so for the
    flows of the most loaded links; a lower bound otherwise), and a message the rate of its
    slowest flow: its serialization is multiplied by ``port rate / least share``. Rates are not
    re-shared when a flow ends (equal-sized flows of a row end together on their bottleneck).
    The rest of the timing (port queues, which iteration waits for which receive) is the
    planner's, so a late pair delays only the ranks downstream of it. HCL's box iterations,
    several on the wire at once, share the fabric as a window instead (next NOTE).

NOTE [box iterations in flight share the fabric]
    HCL keeps up to ``HCL_SCALEOUT_BUFFER_FACTOR`` (8) box iterations of a slice in flight
    (NOTE [HCL's pairwise box iterations] in :mod:`hccl.sim.algorithms.pairwise`): a card's
    scale-out port carries the flows of all of them at once, each to a different box and
    hashed onto its own uplink. A flow held back by a crowded uplink leaves its port's spare
    capacity to the card's other flows, so what a card loses is the shortfall of its port as a
    whole, not the slowest flow's. Charging each iteration's collisions alone to a port that
    serializes the iterations (the row model above) would add up every iteration's worst
    flow: 17 / 33 / 37% off Gaudi 3's 256 MB all-reduce at 32 / 64 / 128 boxes, where Intel's
    "How to Pick Good Nodes in a Datacenter" page says a drop within 10% is possible. So an
    iteration with ``w`` = min(8, B-1) iterations in flight (itself and the ``w - 1`` before it,
    :func:`in_flight_shifts`) is charged as one window of flows:

    - every flow of the window counts as load on its uplink and downlink, and is capped at
      its equal share of each (``C / flows``) and at its NIC ports' rates;
    - a NIC port (each side, sending and receiving) runs at the lesser of its capacity and
      the sum of its flows' caps (max-min sharing of one link among flows with fixed caps),
      and the cards on it share that evenly (``w`` flows per card per port);
    - a card's message in the iteration is slowed by ``line rate / (its port's rate per card)``,
      the larger of its sending and its peer's receiving side, the slowest of its ports; as a
      fraction of 1/65,536, rounded up. The planner then serializes the card's iterations on
      its port at that pace, which is the window's pace.

    With ``w = 1`` this is the row model's charge (then the row model itself is used), except
    where two flows of one message share a port (a down port's queue pairs moved to another):
    the row model holds the message to its slower flow, the window lets the other use the rest.
    Like the row model it takes each uplink's equal share, a lower bound where a flow on it is
    held back elsewhere, and keeps the window's loads for the whole iteration. Sampled shifts
    (NOTE [sampled contention at scale]) take windows that lie wholly among the far shifts.

NOTE [sampled contention at scale]
    A pairwise box iteration with shift ``k`` on ``B`` boxes has ``n x ports`` flows; hashing
    thousands of iterations flow by flow would cost minutes at 65,536 ranks. Shifts whose
    flows partly stay inside a pod (``k < H`` or ``k > B - H``, ``H`` = :data:`SAMPLE_SHIFTS`
    rounded up to whole pods) are hashed exactly; a shift in between reuses the contention of
    shift ``H + (k - H) mod H``, which has the same offset inside a pod (same pod pairs per
    destination leaf) and a different hash. Deterministic; exact below ``3H`` boxes. Since a
    sampled shift stands for many, each of which collides on other cards, it is charged as a
    distribution, not as one hash: every card's message in it is slowed by the mean of the
    sample's per-card slowdowns. Pipelined box iterations (NOTE [HCL's pairwise box
    iterations]) see many shifts per card in turn, so a card's pace over them is about that
    mean; and the iterations of every card keep one pace, which lets the planner apply runs of
    them at once (NOTE [repeated phases] in :mod:`hccl.sim.planner`). With iterations in
    flight (NOTE [box iterations in flight share the fabric]) a sample's window of ``w`` shifts
    must lie among the shifts it stands for: shifts are sampled from ``4H`` boxes on (exact
    below), an all-gather's sample (window above it) is ``H + (k - H) mod H`` and a
    reduce-scatter's (window below it) ``2H + (k - H) mod H``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["Fabric", "SAMPLE_SHIFTS", "message_slowdown", "shift_slowdown", "sampled_shift", "in_flight_shifts",
           "ecmp_hash", "ideal"]

SAMPLE_SHIFTS = 16
"""Box shifts hashed exactly on each side of a pod boundary (NOTE [sampled contention at scale])."""

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


_RANGES: dict[str, tuple] = {
    "tiers": (numbers.Integral, 1, 2, "(1: one switch tier, 2: leaf/spine)"),
    "planes": (numbers.Integral, 1, 4096, "planes"),
    "leaf_uplinks": (numbers.Integral, 1, 1 << 16, "links"),
    "leaf_radix": (numbers.Integral, 1, 1 << 16, "ports"),
    "nic_cards": (numbers.Integral, 1, 1024, "cards"),
    "uplink_gbps": (numbers.Real, 0.001, 1e5, "Gb/s (1 Mb/s to 100 Tb/s)"),
    "leaf_port_gbps": (numbers.Real, 0.001, 1e5, "Gb/s (1 Mb/s to 100 Tb/s)"),
    "host_latency_ns": (numbers.Integral, 0, 10**9, "simulated ns (up to 1 s)"),
}
"""Type, inclusive range and unit of every numeric ``[fabric]`` field (as the topology's own
fields are checked): another type (``true`` is not a port count), ``inf``, ``nan`` or a value
out of range is refused by name."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Fabric:
    """Switches between boxes (a topology file's ``[fabric]`` table). Rates in Gb/s."""

    tiers: int = 2
    """1: every box on one switch tier (no uplinks); 2: leaf/spine."""
    ecmp: bool = True
    """Place flows on uplinks by an ECMP hash and share links max-min; False: an ideal fabric
    (no uplink contention, the topology's ``oversubscription`` divides cross-leaf rates as before)."""
    planes: int = 1
    """Parallel leaf/spine fabrics; scale-out port ``p`` of a card uses plane ``p mod planes``."""
    leaf_uplinks: int = 1
    """Uplinks of one leaf switch (per plane) to the spines."""
    uplink_gbps: float = 400.0
    """Line rate of one leaf-to-spine (and spine-to-leaf) link."""
    leaf_radix: int = 64
    """Ports of one leaf switch (checked: box-facing + uplinks fit)."""
    leaf_port_gbps: float = 400.0
    """Line rate of one leaf switch port (box-facing ports may be broken out to several NIC ports)."""
    nic_cards: int = 1
    """Cards sharing one scale-out NIC (host NICs: AWS DL1 has 4 for 8 cards)."""
    host_latency_ns: int = 0
    """Extra one-way latency of a scale-out message through the host (host NICs), simulated ns."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        for name, (kind, lo, hi, unit) in _RANGES.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, kind) or not lo <= v <= hi:  # NaN fails too
                what = "an integer" if kind is numbers.Integral else "a number"
                raise ValueError(f"fabric: {name} must be {what} in [{lo:,}, {hi:,}] {unit}, got {v!r}")
        if not isinstance(self.ecmp, bool):
            raise ValueError(f"fabric: ecmp must be true or false, got {self.ecmp!r}")
        if not isinstance(self.source, str):
            raise ValueError(f"fabric: source must be a string, got {self.source!r}")

    def check(self, topo) -> None:
        """Raise ValueError if the fabric cannot serve ``topo``'s boxes (ports or planes)."""
        S = topo.scale_out_ports_per_card
        if S % self.planes:
            raise ValueError(f"fabric: {S} scale-out ports per card do not split over {self.planes} planes")
        down = topo.boxes_per_leaf * -(-topo.cards_per_box // self.nic_cards) * (S // self.planes) \
            * topo.scale_out_line_rate_gbps
        up = self.leaf_uplinks * self.uplink_gbps if self.tiers == 2 else 0.0
        if down + up > self.leaf_radix * self.leaf_port_gbps * (1 + 1e-9):
            raise ValueError(f"fabric: a leaf needs {down:g} Gb/s to {topo.boxes_per_leaf} boxes + {up:g} Gb/s "
                             f"of uplinks, more than {self.leaf_radix} x {self.leaf_port_gbps:g} Gb/s ports")

    def oversubscription(self, topo) -> float:
        """Box-facing over uplink capacity of one leaf (1.0 = non-blocking); 1.0 with one tier."""
        if self.tiers == 1:
            return 1.0
        down = topo.boxes_per_leaf * -(-topo.cards_per_box // self.nic_cards) \
            * (topo.scale_out_ports_per_card // self.planes) * topo.scale_out_line_rate_gbps
        return down / (self.leaf_uplinks * self.uplink_gbps)


_NIC_ONLY = Fabric(ecmp=False)
"""The NICs alone (no switches modelled): what-if link faults on a topology without a fabric."""


def ideal(topo):
    """``topo`` on an ideal fabric: no ECMP placement nor uplink contention (NICs shared by
    several cards stay shared); the topology itself if it has no ECMP fabric."""
    fab = topo.fabric
    if fab is None or not fab.ecmp:
        return topo
    return dataclasses.replace(topo, fabric=dataclasses.replace(fab, ecmp=False))


def ecmp_hash(src, dst, port, qp_set) -> np.ndarray:
    """64-bit mix (splitmix64 finalizer) of a flow's identity; uint64 array of the broadcast shape."""
    with np.errstate(over="ignore"):
        x = (np.asarray(src, dtype=np.uint64) * _MIX[0]) ^ (np.asarray(dst, dtype=np.uint64) * _MIX[1]) \
            ^ (np.asarray(port, dtype=np.uint64) * _MIX[2]) ^ np.uint64(int(qp_set) * 0x2545F4914F6CDD1D % (1 << 64))
        x = x ^ (x >> np.uint64(30))
        x = x * _MIX[1]
        x = x ^ (x >> np.uint64(27))
        x = x * _MIX[2]
        return x ^ (x >> np.uint64(31))


def _milli(gbps: float) -> int:
    return int(round(gbps * 1000))


class _Flows:
    """The scale-out flows of messages ``src -> dst`` (NOTE [flows and links]): ``S``
    consecutive flows per message that leaves its box, one per scale-out port.

    Attributes (1-D arrays, one entry per flow unless said):
        idx: (M,) the indices of the messages that have flows, in order.
        ns, nd: the NIC port each flow leaves from / arrives at (ids in ``0 .. nics-1``).
        cap_s, cap_d: the capacity of those NIC ports, milli-Gb/s (a degraded port's is lower).
        fabric: ``(ids, cross)`` for the leaf uplink and the spine downlink of each flow (ids in
            ``0 .. width-1``, ``width`` set by the topology's leaves; ``cross``: the flow leaves
            its leaf), empty without ECMP on two tiers.
    """

    __slots__ = ("idx", "S", "ns", "nd", "cap_s", "cap_d", "nics", "fabric", "width", "up_m", "port_m")

    def __init__(self, topo, fab, src, dst, keep, qp_set):
        L, S = topo.cards_per_box, topo.scale_out_ports_per_card
        self.S = S
        self.idx = idx = np.nonzero(keep)[0]
        self.port_m = port_m = _milli(topo.scale_out_line_rate_gbps)
        fp = np.tile(np.arange(S, dtype=np.int64), idx.size)
        fs, fd = np.repeat(src[idx], S), np.repeat(dst[idx], S)
        hp = fp  # the port a flow's queue pair was opened on (hashed); fp: the port it leaves from
        slow_s = slow_d = None
        for kind, a, b, f in topo.faults:  # NOTE [HCL on a down port] in hccl.sim.whatif
            if kind != "out":
                continue
            if f:  # degraded: the port's capacity divided by f
                for cards, slow in ((fs, "s"), (fd, "d")):
                    hit = (cards == a) & (fp == b)
                    if hit.any():
                        if slow == "s":
                            slow_s = np.where(hit, f, 1.0) if slow_s is None else np.where(hit, f, slow_s)
                        else:
                            slow_d = np.where(hit, f, 1.0) if slow_d is None else np.where(hit, f, slow_d)
            else:  # down: its queue pairs migrate to the card's first other scale-out port
                to = 1 if b == 0 else 0
                fp = np.where(((fs == a) | (fd == a)) & (fp == b), to, fp)
        per_box = -(-L // fab.nic_cards)  # NICs of a box; card l uses NIC l // nic_cards

        def nic(card):
            return ((card // L) * per_box + (card % L) // fab.nic_cards) * S + fp

        self.ns, self.nd = nic(fs), nic(fd)
        self.nics = int(max(self.ns.max(), self.nd.max())) + 1
        self.cap_s, self.cap_d = (port_m if slow is None else np.rint(port_m / slow).astype(np.int64)
                                  for slow in (slow_s, slow_d))
        self.fabric, self.width, self.up_m = [], 0, 0
        if fab.ecmp and fab.tiers == 2:
            bpl = topo.boxes_per_leaf
            leaf_s, leaf_d = fs // L // bpl, fd // L // bpl
            cross = leaf_s != leaf_d
            U = fab.leaf_uplinks
            plane = fp % fab.planes
            u = (ecmp_hash(fs, fd, hp, qp_set) % np.uint64(U)).astype(np.int64)
            nleaf = -(-(topo.world_size // L) // bpl)  # the topology's leaves: the same ids for every call
            self.width = fab.planes * nleaf * U
            self.up_m = _milli(fab.uplink_gbps)
            self.fabric = [((plane * nleaf + leaf_s) * U + u, cross), ((plane * nleaf + leaf_d) * U + u, cross)]


def _scale_out(topo, src, dst):
    """The fabric (None: nothing to share) and which messages leave their box."""
    fab = topo.fabric if topo.fabric is not None else (_NIC_ONLY if topo.faults else None)
    if fab is None or src.size == 0:
        return None, None
    L = topo.cards_per_box
    keep = (src // L != dst // L) | ((topo.scale_up_ports_per_peer == 0) & (src != dst))
    return (fab, keep) if keep.any() else (None, None)


def message_slowdown(topo, src, dst, qp_set: int = 0, first: int | None = None):
    """Per message, the slowdown ``num / den`` (>= 1) of its slowest flow among concurrent
    messages ``src -> dst`` (NOTE [max-min sharing, per row]).

    Args:
        topo: the topology (its ``fabric`` None: every factor is 1).
        src, dst: 1-D int arrays of equal length, the messages' ranks; messages inside a box
            over scale-up links get factor 1.
        qp_set: the queue-pair set the messages use.
        first: return the factors of the first ``first`` messages only (all count as load).

    Returns:
        ``(num, den)``: int64 arrays; message ``i`` moves at ``den[i] / num[i]`` of its
        card's scale-out line rate.
    """
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    m = src.size if first is None else first
    num, den = np.ones(m, dtype=np.int64), np.ones(m, dtype=np.int64)
    fab, keep = _scale_out(topo, src, dst)
    if fab is None:
        return num, den
    fl = _Flows(topo, fab, src, dst, keep, qp_set)
    port_m, ns, nd, S, idx = fl.port_m, fl.ns, fl.nd, fl.S, fl.idx
    # (flows on the link, its capacity in milli-Gb/s) for each link a flow crosses
    links = [(np.bincount(ns, minlength=fl.nics)[ns], fl.cap_s), (np.bincount(nd, minlength=fl.nics)[nd], fl.cap_d)]
    for ids, cross in fl.fabric:
        load = np.bincount(ids[cross], minlength=fl.width)[ids]
        links.append((np.where(cross, load, 0), fl.up_m))
    # each flow's least share: the link with the largest load / capacity on its path
    f_num = np.zeros(ns.size, dtype=np.int64)
    f_den = np.ones(ns.size, dtype=np.int64)
    for load, cap in links:
        worse = load * port_m * f_den > f_num * cap
        f_num = np.where(worse, load * port_m, f_num)
        f_den = np.where(worse, cap, f_den)
    # a message is as slow as its slowest flow (its S flows are consecutive)
    worst = np.argmax((f_num / f_den).reshape(-1, S), axis=1) + np.arange(idx.size) * S
    sel = idx < m
    num[idx[sel]] = f_num[worst[sel]]
    den[idx[sel]] = f_den[worst[sel]]
    slower = num > den
    return np.where(slower, num, 1), np.where(slower, den, 1)


@functools.lru_cache(maxsize=4096)
def _shift_exact(topo, shift: int, qp_set: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    n, L = topo.world_size, topo.cards_per_box
    B = n // L
    r = np.arange(n, dtype=np.int64)
    num, den = message_slowdown(topo, r, ((r // L + shift) % B) * L + r % L, qp_set, first=cols)
    num.flags.writeable = den.flags.writeable = False
    return num, den


def _sampling(topo, shift: int, in_flight: int = 1) -> tuple[int, bool]:
    """The box shift whose contention stands for ``shift``, in ``0 .. B-1``, and whether that is
    a sample (NOTE [sampled contention at scale]): ``(shift mod B, False)`` when it is hashed
    exactly. With iterations in flight (``in_flight`` > 1; ``shift`` signed as
    :func:`in_flight_shifts` takes it) the sample's whole window lies between the exact shifts
    too: shifts are sampled from ``4H`` boxes on, and a positive shift's sample (whose window
    lies below it) is taken a whole ``H`` further on."""
    B = topo.world_size // topo.cards_per_box
    k = shift % B
    P = topo.boxes_per_leaf
    H = -(-SAMPLE_SHIFTS // P) * P
    if in_flight > 1:
        if H <= k <= B - H and B >= 4 * H:
            return (2 * H if shift > 0 else H) + (k - H) % H, True
        return k, False
    if H <= k <= B - H and B >= 3 * H:
        return H + (k - H) % H, True
    return k, False


def sampled_shift(topo, shift: int, in_flight: int = 1) -> int:
    """The box shift whose contention stands for ``shift`` (NOTE [sampled contention at scale]),
    in ``0 .. B-1``; ``shift mod B`` itself when it is hashed exactly. ``in_flight``: as
    :func:`shift_slowdown` takes it (then ``shift`` is signed)."""
    return _sampling(topo, shift, in_flight)[0]


def shift_slowdown(topo, shift: int, qp_set: int = 0, cols: int | None = None, in_flight: int = 1):
    """:func:`message_slowdown` of the box iteration "every card to the same card of box
    ``b + shift``" on ``topo`` (whole boxes), for ranks ``0 .. cols-1`` (default all), sampled
    for many boxes (NOTE [sampled contention at scale]). Returns read-only arrays.

    ``in_flight`` > 1: the iteration shares the fabric with the iterations in flight beside it
    (NOTE [box iterations in flight share the fabric]): ``shift`` is signed as the pairwise
    algorithm's blocks carry it (negative: an all-gather's iterations, sent to box ``b - k``),
    and the iterations in flight are those of the ``in_flight - 1`` shifts before it in its
    direction (:func:`in_flight_shifts`)."""
    return _shift_slowdown(topo, shift, qp_set, topo.world_size if cols is None else cols, in_flight)


@functools.lru_cache(maxsize=4096)
def _shift_slowdown(topo, shift: int, qp_set: int, cols: int, in_flight: int):
    n = topo.world_size
    k, sampled = _sampling(topo, shift, in_flight)
    if topo.fabric is None and not topo.faults or k == 0:
        one = np.ones(cols, dtype=np.int64)
        return one, one
    B = n // topo.cards_per_box
    if in_flight > 1 and B > 2:
        window, at = in_flight_shifts(B, k if shift > 0 else k - B, in_flight)  # the sample, signed as ``shift``
        num, den = _window_exact(topo, window, at, qp_set, cols)
        return _pooled(num, den) if sampled else (num, den)
    if sampled:
        return _pooled(*_shift_exact(topo, k, qp_set, cols))
    return _shift_exact(topo, k, qp_set, cols)


def in_flight_shifts(B: int, shift: int, in_flight: int) -> tuple[tuple[int, ...], int]:
    """The box shifts (each in ``1 .. B-1``) of the pairwise iterations in flight while the one
    of ``shift`` (signed: ``-k`` for an all-gather's iteration ``k``, sent to box ``b - k``) is
    on the wire, and the index of ``shift``'s own among them: the ``in_flight`` iterations
    ``k - in_flight + 1 .. k`` of its direction, moved to ``1 .. in_flight`` near the first
    iteration and capped at ``B - 1`` iterations (NOTE [box iterations in flight share the
    fabric]). Raises ValueError for a shift that is a multiple of ``B`` (no scale-out)."""
    m = abs(shift)
    if m % B == 0 or m >= B:
        raise ValueError(f"box shift {shift} is not an iteration of {B} boxes")
    w = min(in_flight, B - 1)
    start = min(max(1, m - w + 1), B - w)
    return tuple((x if shift > 0 else -x) % B for x in range(start, start + w)), m - start


class _ShiftFlows(NamedTuple):
    """The flows of one box iteration, as :func:`_window_exact` adds them up over a window."""

    ports: list
    """Per side (leaving, arriving): ``(nic, flows, capacity)``: each flow's NIC port, the flows
    per port, each port's least capacity (milli-Gb/s)."""
    g_cap: np.ndarray
    """Each flow's NIC ports' least capacity (milli-Gb/s, float)."""
    links: list
    """Per fabric link of a flow's path (uplink, downlink): ``(ids, load)``: each flow's link,
    one past the last for a flow that stays in its leaf; this iteration's flows per link."""
    up_m: int
    """An uplink's capacity, milli-Gb/s."""
    port_m: int
    """A scale-out port's line rate, milli-Gb/s."""
    S: int
    """Flows per message (scale-out ports per card)."""


@functools.lru_cache(maxsize=16)
def _shift_flows(topo, shift: int, qp_set: int) -> _ShiftFlows | None:
    """The flows of box iteration ``shift`` (every card to the same card of box ``b + shift``,
    ``shift`` in ``1 .. B-1``); None when no message leaves its box. Kept for a window's length
    of neighbouring shifts (a window slides by one shift per iteration)."""
    n, L = topo.world_size, topo.cards_per_box
    r = np.arange(n, dtype=np.int64)
    dst = ((r // L + shift) % (n // L)) * L + r % L
    fab, keep = _scale_out(topo, r, dst)
    if fab is None:
        return None
    fl = _Flows(topo, fab, r, dst, keep, qp_set)
    if fl.idx.size != n:  # a shift's messages all leave their box (checked, as the window relies on it)
        raise AssertionError(f"box shift {shift}: {n - fl.idx.size} messages stay in their box")
    g_cap = np.minimum(np.broadcast_to(fl.cap_s, fl.ns.shape), np.broadcast_to(fl.cap_d, fl.nd.shape)).astype(np.float64)
    links = [(np.where(cross, ids, fl.width).astype(np.int32), np.bincount(ids[cross], minlength=fl.width))
             for ids, cross in fl.fabric]
    # every card is a sender and a receiver, so the NIC ports are the same for every shift
    nics = fl.nics
    ports = []
    for nic, cap in ((fl.ns, fl.cap_s), (fl.nd, fl.cap_d)):
        capacity = np.full(nics, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(capacity, nic, np.broadcast_to(cap, nic.shape))
        ports.append((nic, np.bincount(nic, minlength=nics), capacity))
    return _ShiftFlows(ports, g_cap, links, fl.up_m, fl.port_m, fl.S)


@functools.lru_cache(maxsize=1024)
def _window_exact(topo, window: tuple[int, ...], at: int, qp_set: int, cols: int):
    """Per card ``0 .. cols-1``, the slowdown ``(num, den)`` of its message in the iteration
    ``window[at]`` while the iterations of every shift in ``window`` share the fabric
    (NOTE [box iterations in flight share the fabric])."""
    W = len(window)
    num, den = np.ones(cols, dtype=np.int64), np.ones(cols, dtype=np.int64)
    parts = [_shift_flows(topo, k, qp_set) for k in window]
    if parts[at] is not None:  # (the shifts of a window have flows alike: all or none)
        first = parts[0]
        # the window's flows per fabric link (every iteration's load added up) and each link's
        # equal share, with an unlimited one past the last link for flows that stay in a leaf
        shares = [np.append(first.up_m / np.maximum(sum(p.links[j][1] for p in parts), 1), np.inf)
                  for j in range(len(first.links))]
        # each flow's cap outside its NIC ports: its NIC ports' line rates, the fabric links'
        # equal shares; then per NIC port, the flows' caps added up and the flows counted
        rate = [0.0, 0.0]
        for p in parts:
            g = p.g_cap
            for (ids, _), share in zip(p.links, shares):
                g = np.minimum(g, share[ids])
            for side, (nic, _, cap) in enumerate(p.ports):
                rate[side] = rate[side] + np.bincount(nic, weights=g, minlength=cap.size)
        # a NIC port is shared max-min among its flows: it runs at its capacity unless their
        # caps elsewhere add up to less, and its cards share that rate evenly
        slow = None
        for side, (nic, _, _) in enumerate(parts[at].ports):
            flows = sum(p.ports[side][1] for p in parts)
            capacity = np.minimum.reduce([p.ports[side][2] for p in parts])
            per_card = np.minimum(capacity, rate[side])[nic] * W / flows[nic]
            slow = first.port_m / per_card if slow is None else np.maximum(slow, first.port_m / per_card)
        mine = slow.reshape(-1, first.S)[:cols].max(axis=1)
        # to a fraction of _POOL_UNIT, rounded up (below 1e-9 of a whole: float noise, not a share)
        q = np.ceil(mine * _POOL_UNIT - 1e-9).astype(np.int64)
        slower = q > _POOL_UNIT
        num, den = np.where(slower, q, 1), np.where(slower, _POOL_UNIT, 1)
    num.flags.writeable = den.flags.writeable = False
    return num, den


_POOL_UNIT = 1 << 16


def _pooled(num, den) -> tuple[np.ndarray, np.ndarray]:
    """A sampled shift's slowdown, the same for every card: the mean over the cards of the
    sample's per-card slowdowns, rounded up to 1/65,536 (NOTE [sampled contention at scale])."""
    q = -(-num * _POOL_UNIT // den)
    mean = -(-int(q.sum()) // q.size)
    a, b = np.full(q.size, mean, dtype=np.int64), np.full(q.size, _POOL_UNIT, dtype=np.int64)
    a.flags.writeable = b.flags.writeable = False
    return a, b
