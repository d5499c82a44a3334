"""Topology model: Gaudi boxes joined by a leaf/spine RoCE v2 scale-out fabric.

A topology says who is linked to whom by which ports; it does not turn bytes into time
(that is :mod:`hccl.sim.link_model`) and does not know about collectives.

Built-in systems are TOML data files in ``hccl/sim/topologies/`` (``hls1``, ``hls2``,
``hls3``: boxes of 8 Gaudi, Gaudi2, Gaudi3 cards; ``hls1h``: first-gen nodes of 4 cards
whose 40 ports all go to the switches; ``dl1``: AWS DL1, 8 first-gen cards scaling out
through 4 host NICs). Each number there carries its unit in its name and its source beside
it; a ``[fabric]`` table describes the switches (:class:`~hccl.sim.fabric.Fabric`).

NOTE [rank placement]
    Rank ``r`` sits in box ``r // cards_per_box`` at local index ``r % cards_per_box``.
    The number of boxes follows from the world size (the last box may be partly used)
    unless a topology file fixes ``num_boxes``.

NOTE [scale-out fabric]
    Every card's scale-out ports go to a leaf switch; ``boxes_per_leaf`` boxes share a
    leaf. Traffic between boxes on the same leaf crosses 1 switch; traffic between leaves
    crosses leaf, spine, leaf (3 switches) and its rate is divided by
    ``oversubscription`` (leaf uplink oversubscription).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hccl.sim.fabric import Fabric

__all__ = ["Topology", "load_topology", "builtin_topologies", "GENERATION_BOX", "topology_generation",
           "device_and_topology"]

logger = logging.getLogger(__name__)

_BUILTIN = ("hls1", "hls2", "hls3", "hls1h", "dl1")


@dataclass(kw_only=True, slots=True, frozen=True)
class Topology:
    """A system of identical boxes of cards, all-to-all inside a box, switched between boxes.

    All rates are per port, in Gb/s (10^9 bit/s); latencies are simulated ns.
    """

    name: str
    """Name of the system (``hls2``) or the file it came from."""
    generation: str = "custom"
    """Gaudi generation (``gaudi``, ``gaudi2``, ``gaudi3``) or ``custom``."""
    world_size: int
    """Number of ranks placed on this topology (one rank per card)."""
    cards_per_box: int = 8
    """Cards in one box (scale-up domain)."""
    num_boxes: int = 0
    """Boxes in the system; 0 = as many as the world size needs."""
    fixed_boxes: bool = False
    """True when the topology file fixes ``num_boxes`` (world size may not exceed it)."""
    ports_per_card: int = 24
    """RoCE v2 ports on one card (scale-up + scale-out + unused)."""
    scale_up_ports_per_peer: int = 3
    """Ports linking one card to each other card of its box."""
    scale_out_ports_per_card: int = 3
    """Ports from one card to the scale-out fabric."""
    scale_up_line_rate_gbps: float = 100.0
    """Line rate of one scale-up port, Gb/s."""
    scale_out_line_rate_gbps: float = 100.0
    """Line rate of one scale-out port, Gb/s."""
    mtu_bytes: int = 4096
    """RoCE payload bytes per packet."""
    header_bytes: int = 82
    """Per-packet bytes on the wire besides payload (framing, IP, UDP, BTH, ICRC, gap)."""
    nic_latency_ns: int = 1000
    """Latency of one card-to-card (or card-to-switch) hop, simulated ns."""
    switch_latency_ns: int = 600
    """Latency added by each switch crossed, simulated ns."""
    reduce_bytes_per_ns: float = 820.0
    """Reduction throughput of one card, bytes per simulated ns (= GB/s)."""
    oversubscription: float = 1.0
    """Leaf-to-spine oversubscription factor (>= 1; 1 = non-blocking)."""
    boxes_per_leaf: int = 4
    """Boxes whose scale-out ports share one leaf switch."""
    nic_peer: tuple[tuple[int, ...], ...] = ()
    """Per local card, the peer of each NIC: a local card index or -1 (scale-out)."""
    fabric: Fabric | None = None
    """The scale-out switches (``[fabric]`` table); None: an ideal fabric."""
    faults: tuple[tuple[str, int, int, float], ...] = ()
    """Degraded or down links, ``(kind, a, b, slowdown)`` (0.0: down), from what-ifs
    (:func:`hccl.sim.whatif.link_faults`); not read from topology files."""
    source: str = ""
    """Where the numbers come from."""
    _up_ports: tuple[tuple[tuple[int, ...], ...], ...] = field(default=(), repr=False, compare=False)
    _out_ports: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"topology {self.name!r}: {msg}")

        for name, (kind, lo, hi, unit) in _RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:  # NaN fails too
                what = "an integer" if kind is _INT else "a number"
                bad(f"{name} must be {what} in [{lo:,}, {hi:,}] {unit}, got {value!r}")
        for name in ("name", "generation", "source"):
            if not isinstance(getattr(self, name), str):
                bad(f"{name} must be a string, got {getattr(self, name)!r}")
        needed = math.ceil(self.world_size / self.cards_per_box)
        if self.num_boxes == 0:
            object.__setattr__(self, "num_boxes", needed)
        elif self.num_boxes < needed:
            bad(f"world size {self.world_size} does not fit: {self.num_boxes} boxes x "
                f"{self.cards_per_box} cards hold at most {self.num_boxes * self.cards_per_box} ranks")
        peers = self.cards_per_box - 1
        if self.scale_up_ports_per_peer * peers + self.scale_out_ports_per_card > self.ports_per_card:
            bad(f"{self.scale_up_ports_per_peer} ports x {peers} peers + "
                f"{self.scale_out_ports_per_card} scale-out ports exceed {self.ports_per_card} ports per card")
        object.__setattr__(self, "nic_peer", self._check_nic_peer())
        up = tuple(
            tuple(tuple(n for n, p in enumerate(row) if p == dst) for dst in range(self.cards_per_box))
            for row in self.nic_peer
        )
        out = tuple(tuple(n for n, p in enumerate(row) if p == -1) for row in self.nic_peer)
        object.__setattr__(self, "_up_ports", up)
        object.__setattr__(self, "_out_ports", out)

    def _check_nic_peer(self) -> tuple[tuple[int, ...], ...]:
        cpb, k = self.cards_per_box, self.scale_up_ports_per_peer
        if not self.nic_peer:  # assumed numbering: peers in ascending order, then scale-out
            rows = []
            for c in range(cpb):
                row = [p for p in range(cpb) if p != c for _ in range(k)]
                row += [-1] * self.scale_out_ports_per_card
                row += [-2] * (self.ports_per_card - len(row))  # -2 = unused port
                rows.append(tuple(row))
            return tuple(rows)
        rows = tuple(tuple(int(p) for p in row) for row in self.nic_peer)
        if len(rows) != cpb:
            raise ValueError(f"topology {self.name!r}: nic_peer has {len(rows)} rows, expected {cpb}")
        for c, row in enumerate(rows):
            if len(row) != self.ports_per_card:
                raise ValueError(f"topology {self.name!r}: nic_peer row {c} has {len(row)} NICs, "
                                 f"expected ports_per_card={self.ports_per_card}")
            for p in range(cpb):
                if p != c and row.count(p) != k:
                    raise ValueError(f"topology {self.name!r}: card {c} has {row.count(p)} NICs to card {p}, "
                                     f"expected scale_up_ports_per_peer={k}")
            if row.count(-1) != self.scale_out_ports_per_card:
                raise ValueError(f"topology {self.name!r}: card {c} has {row.count(-1)} scale-out NICs, "
                                 f"expected {self.scale_out_ports_per_card}")
        return rows

    # -- placement -----------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")

    def box_of(self, rank: int) -> int:
        """Box index of ``rank``."""
        self._check_rank(rank)
        return rank // self.cards_per_box

    def local_rank_of(self, rank: int) -> int:
        """Index of ``rank``'s card inside its box."""
        self._check_rank(rank)
        return rank % self.cards_per_box

    def leaf_of(self, rank: int) -> int:
        """Leaf switch that ``rank``'s scale-out ports connect to."""
        return self.box_of(rank) // self.boxes_per_leaf

    def same_box(self, a: int, b: int) -> bool:
        """True if ranks ``a`` and ``b`` are linked by scale-up ports."""
        return self.box_of(a) == self.box_of(b)

    # -- ports -------------------------------------------------------------------------
    def ports(self, src: int, dst: int) -> tuple[int, ...]:
        """NIC indices on ``src``'s card that carry traffic from ``src`` to ``dst``.

        Scale-up ports for a peer in the same box, else the card's scale-out ports
        (a message to another box is striped over all of them).
        """
        if src == dst:
            raise ValueError(f"rank {src} has no port to itself")
        ls = self.local_rank_of(src)
        if self.same_box(src, dst) and self.scale_up_ports_per_peer:
            return self._up_ports[ls][self.local_rank_of(dst)]
        return self._out_ports[ls]

    def scale_out_ports(self, rank: int) -> tuple[int, ...]:
        """NIC indices of ``rank``'s scale-out ports."""
        return self._out_ports[self.local_rank_of(rank)]

    def switch_hops(self, src: int, dst: int) -> int:
        """Switches crossed from ``src`` to ``dst``: 0 in a box, 1 on one leaf, 3 via a spine."""
        if self.same_box(src, dst) and self.scale_up_ports_per_peer:
            return 0
        return 1 if self.leaf_of(src) == self.leaf_of(dst) else 3

    def path_latency_ns(self, src: int, dst: int) -> int:
        """One-way latency from ``src`` to ``dst``, simulated ns (hops x per-hop latency)."""
        s = self.switch_hops(src, dst)
        links = 1 if s == 0 else s + 1
        host = self.fabric.host_latency_ns if self.fabric is not None and s else 0
        return links * self.nic_latency_ns + s * self.switch_latency_ns + host

    @property
    def scale_up_peer_gbps(self) -> float:
        """Line rate from one card to one box peer, Gb/s (ports x line rate)."""
        return self.scale_up_ports_per_peer * self.scale_up_line_rate_gbps

    @property
    def scale_out_card_gbps(self) -> float:
        """Scale-out line rate of one card, Gb/s (ports x line rate)."""
        return self.scale_out_ports_per_card * self.scale_out_line_rate_gbps

    def with_world_size(self, world_size: int) -> "Topology":
        """The same system holding ``world_size`` ranks."""
        if world_size == self.world_size:
            return self
        nb = self.num_boxes if self.fixed_boxes else 0
        return dataclasses.replace(self, world_size=world_size, num_boxes=nb)


def builtin_topologies() -> tuple[str, ...]:
    """Names accepted by :func:`load_topology` besides file paths."""
    return _BUILTIN


GENERATION_BOX = {"gaudi": "hls1", "gaudi2": "hls2", "gaudi3": "hls3"}
"""The server a Gaudi generation's cards come in, when only the generation is named: HLS-1,
HLS-Gaudi2 and HLS-3, eight cards of that generation each (the built-in topology files, whose
``generation`` and ``source`` fields say so and where from)."""


def topology_generation(name_or_path: str) -> str:
    """The Gaudi generation whose cards a topology's boxes hold: its ``generation`` field,
    ``gaudi``, ``gaudi2`` or ``gaudi3``, or ``custom`` (a file that names none: any card).

    Raises:
        ValueError: an unknown name, a missing or malformed file, or a ``generation`` that is
            not a string.
    """
    data, origin = _read(name_or_path)
    gen = data.get("generation", "custom")
    if not isinstance(gen, str):
        raise ValueError(f"{origin}: generation must be a string (gaudi, gaudi2, gaudi3 or custom), got {gen!r}")
    return gen


def device_and_topology(device: str | None, topology: str | None, *, device_from: str = "HPU_DEVICE_SPEC",
                        topology_from: str = "HCCL_TOPOLOGY") -> tuple[str, str]:
    """A card and a system that belong together, as on real hardware, where a box holds cards
    of one generation: the one not given follows the other (a device's box is
    :data:`GENERATION_BOX`'s; a topology's card is its :func:`topology_generation`, Gaudi 2
    for a ``custom`` file), and neither given is Gaudi 2 in an HLS-Gaudi2 box.

    Args:
        device: a device name (``gaudi2``, ``hls3``... as
            :func:`~hpu_runtime.device.spec.get_device_spec` takes), or None.
        topology: a built-in topology name or a topology file, or None.
        device_from, topology_from: where each came from, for the error message (a flag or
            an environment variable).

    Returns:
        ``(generation, topology)``: the device's canonical generation name and the topology.

    Raises:
        ValueError: an unknown device or topology, or a device of another generation than the
            topology's boxes hold, naming both.
    """
    from hpu_runtime.device.spec import get_device_spec

    if topology is None:
        gen = get_device_spec(device).name if device is not None else "gaudi2"
        return gen, GENERATION_BOX[gen]
    held = topology_generation(topology)
    if device is None:
        return (held if held in GENERATION_BOX else "gaudi2"), topology
    gen = get_device_spec(device).name
    if held in GENERATION_BOX and held != gen:
        raise ValueError(f"{device_from}={device!r} is a {gen} card, but {topology_from}={topology!r} is a box of "
                         f"{held} cards: give one of them (the other follows) or both of one generation")
    return gen, topology


_FIELDS = {f.name for f in dataclasses.fields(Topology) if not f.name.startswith("_")} - {"faults"}

_INT, _NUM = numbers.Integral, numbers.Real
_RANGES: dict[str, tuple] = {
    "world_size": (_INT, 1, 1 << 24, "ranks"),
    "cards_per_box": (_INT, 1, 1024, "cards"),
    "num_boxes": (_INT, 0, 1 << 24, "boxes (0: as many as the world size needs)"),
    "ports_per_card": (_INT, 1, 4096, "ports"),
    "scale_up_ports_per_peer": (_INT, 0, 4096, "ports (0: box peers reach each other through the leaf)"),
    "scale_out_ports_per_card": (_INT, 1, 4096, "ports"),
    "scale_up_line_rate_gbps": (_NUM, 0.001, 1e5, "Gb/s (1 Mb/s to 100 Tb/s)"),
    "scale_out_line_rate_gbps": (_NUM, 0.001, 1e5, "Gb/s (1 Mb/s to 100 Tb/s)"),
    "mtu_bytes": (_INT, 256, 65536, "bytes (RoCE path MTUs are 256 to 4096)"),
    "header_bytes": (_INT, 0, 4096, "bytes"),
    "nic_latency_ns": (_INT, 0, 10**9, "simulated ns (up to 1 s)"),
    "switch_latency_ns": (_INT, 0, 10**9, "simulated ns (up to 1 s)"),
    "reduce_bytes_per_ns": (_NUM, 0.001, 1e6, "bytes per ns (1 MB/s to 1 PB/s)"),
    "oversubscription": (_NUM, 1.0, 1000.0, "(1 = non-blocking)"),
    "boxes_per_leaf": (_INT, 1, 1 << 24, "boxes"),
}
"""Type, inclusive range and unit of every numeric field: a topology file that gives another
type (``true`` is not an MTU), a value out of range, ``inf`` or ``nan`` is refused by name."""


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    if name_or_path in _BUILTIN:
        text = resources.files("hccl.sim").joinpath("topologies", f"{name_or_path}.toml").read_bytes()
        origin = f"built-in topology {name_or_path!r}"
    else:
        path = Path(name_or_path)
        if not path.suffix and not path.exists():
            raise ValueError(f"unknown topology {name_or_path!r}: not one of {', '.join(_BUILTIN)} "
                             "and not a topology file")
        if not path.is_file():
            raise ValueError(f"topology file {name_or_path!r} does not exist")
        text = path.read_bytes()
        origin = f"topology file {name_or_path!r}"
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed {origin}: {exc}") from None
    return data, origin


def load_topology(name_or_path: str, world_size: int | None = None, **overrides: Any) -> Topology:
    """Load a built-in topology by name or a TOML topology file.

    Args:
        name_or_path: ``hls1``, ``hls2``, ``hls3`` or a path to a TOML file with the
            fields of :class:`Topology` (units in the names).
        world_size: Ranks to place; default: the file's ``num_boxes`` x ``cards_per_box``
            if it fixes the boxes, else one box.
        **overrides: Field values replacing the file's (e.g. ``oversubscription=2.0``).

    Returns:
        The validated topology.

    Raises:
        ValueError: unknown name, missing or malformed file, unknown or invalid field,
            or a world size the topology cannot hold.
    """
    data, origin = _read(name_or_path)
    if not data:
        raise ValueError(f"{origin} is empty: give at least cards_per_box and the line rates "
                         f"(see the built-in {', '.join(_BUILTIN)} files)")
    unknown = sorted(set(data) - _FIELDS | set(overrides) - _FIELDS)
    if unknown:
        raise ValueError(f"{origin}: unknown field(s) {', '.join(unknown)}")
    data = {**data, **overrides}
    data.setdefault("name", Path(name_or_path).stem)
    try:
        fixed = int(data.get("num_boxes") or 0) > 0
    except (TypeError, ValueError):
        raise ValueError(f"{origin}: num_boxes must be an integer") from None
    data["fixed_boxes"] = fixed
    if world_size is None:
        world_size = data.get("world_size") or (
            int(data["num_boxes"]) * int(data.get("cards_per_box", 8)) if fixed else int(data.get("cards_per_box", 8)))
    data["world_size"] = world_size
    if data.get("fabric") is not None and not isinstance(data["fabric"], Fabric):
        if not isinstance(data["fabric"], dict):
            raise ValueError(f"{origin}: [fabric] must be a table")
        known = {f.name for f in dataclasses.fields(Fabric)}
        extra = sorted(set(data["fabric"]) - known)
        if extra:
            raise ValueError(f"{origin}: unknown [fabric] field(s) {', '.join(extra)}")
        try:
            data["fabric"] = Fabric(**data["fabric"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{origin}: {exc}") from None
    if "nic_peer" in data:
        try:
            data["nic_peer"] = tuple(tuple(int(p) for p in row) for row in data["nic_peer"])
        except (TypeError, ValueError):
            raise ValueError(f"{origin}: nic_peer must be a list of lists of integers") from None
    try:
        topo = Topology(**data)
    except TypeError as exc:
        raise ValueError(f"malformed {origin}: {exc}") from None
    if topo.fabric is not None:
        try:
            topo.fabric.check(topo)
        except ValueError as exc:
            raise ValueError(f"{origin}: {exc}") from None
    logger.debug("loaded %s: %d ranks on %d boxes", origin, topo.world_size, topo.num_boxes)
    return topo
