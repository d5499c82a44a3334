"""Simulated duration of a collective: the seam between the live backend and the network model.

The live process group calls :func:`collective_times` once per collective with every rank's
simulated ready time (exchanged with the collective's metadata), so all ranks compute the
same, deterministic answer. The model here is the simple scale-up/scale-out formula of one
Gaudi2 box per 8 ranks; the topology/link/schedule model replaces it behind this function.

Hardware numbers (see ../shared/DESIGN.md section 6): Gaudi2 has 24 x 100 GbE RoCE v2 ports;
21 of them link the 8 cards of an HLS-Gaudi2 box, 3 per peer; 3 per card go to scale-out
(HabanaAI/HCL ``connectivity_autogen_HLS2.cpp``). RoCE v2 goodput at a 4096 B MTU is
4096 / (4096 + 82) of line rate (Ethernet + IP + UDP + BTH + ICRC + preamble/gap headers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SimpleBoxModel", "collective_times", "DEFAULT_MODEL"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SimpleBoxModel:
    """Analytic Gaudi2-box model used until the full network model is wired in."""

    cards_per_box: int = 8
    """Cards per box (HLS-Gaudi2: 8)."""
    port_line_rate_gbps: float = 100.0
    """RoCE v2 port line rate, Gb/s (Gaudi2: 100 GbE ports)."""
    scaleup_ports_per_peer: int = 3
    """Ports linking each pair of cards in a box (HLS-Gaudi2: 3)."""
    scaleout_ports: int = 3
    """Scale-out ports per card (HLS-Gaudi2: 3)."""
    mtu_bytes: int = 4096
    """RoCE payload per packet, bytes."""
    header_bytes: int = 82
    """Per-packet overhead on the wire, bytes (Eth 14+4 FCS, IPv4 20, UDP 8, BTH 12, ICRC 4, preamble+IFG 20)."""
    hop_latency_ns: int = 1_000
    """Per-message latency, simulated ns (modelling assumption: ~1 us NIC-to-NIC)."""

    @property
    def port_goodput_bytes_per_ns(self) -> float:
        """Payload bytes a port moves per simulated ns."""
        return self.port_line_rate_gbps / 8.0 * self.mtu_bytes / (self.mtu_bytes + self.header_bytes)

    def duration_ns(self, kind: str, nbytes: int, world_size: int) -> int:
        """Simulated duration of one collective, ns.

        Args:
            kind: allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, barrier.
            nbytes: bytes of the per-rank buffer (allgather: the per-rank input;
                reduce_scatter: the per-rank output times world size, i.e. the full input).
            world_size: ranks in the group.
        """
        n = world_size
        if n <= 1:
            return 0
        lat = self.hop_latency_ns
        gp = self.port_goodput_bytes_per_ns
        box = min(n, self.cards_per_box)
        boxes = -(-n // self.cards_per_box)
        up_bw = self.scaleup_ports_per_peer * gp  # bytes/ns to one peer

        def scale_up_phase(chunk: float) -> float:  # send `chunk` to every box peer at once
            return 0.0 if box == 1 else lat + chunk / up_bw

        def scale_out_phase(chunk: float) -> float:  # ring across boxes over the scale-out ports
            if boxes == 1:
                return 0.0
            return (boxes - 1) * lat + (boxes - 1) / boxes * chunk / (self.scaleout_ports * gp)

        if kind in ("allreduce", "reduce"):
            t = 2 * scale_up_phase(nbytes / box) + 2 * scale_out_phase(nbytes / box)
        elif kind == "reduce_scatter":
            t = scale_up_phase(nbytes / box) + scale_out_phase(nbytes / box)
        elif kind == "allgather":
            t = scale_up_phase(nbytes) + scale_out_phase(nbytes * box)
        elif kind == "broadcast":
            t = scale_up_phase(nbytes) + scale_out_phase(nbytes)
        elif kind == "alltoall":
            t = scale_up_phase(nbytes / n) + scale_out_phase(nbytes * (n - box) / n)
        elif kind == "barrier":
            t = 2 * (lat if box > 1 else 0) + 2 * (boxes - 1) * lat
        else:
            raise ValueError(f"hccl: no timing model for collective {kind!r}")
        return int(round(t))


DEFAULT_MODEL = SimpleBoxModel()


def collective_times(
    kind: str,
    nbytes: int,
    ready_ns: Sequence[int],
    *,
    rank: int = 0,
    root: int = 0,
    dtype_bytes: int = 4,
    splits: Sequence[Sequence[int]] | None = None,
    model: SimpleBoxModel = DEFAULT_MODEL,
) -> tuple[int, int]:
    """Start and end (simulated ns) on ``rank`` of a collective whose ranks are ready at ``ready_ns``.

    Args:
        kind: the process group's collective name (allreduce, reduce, broadcast, allgather,
            reduce_scatter, alltoall, barrier).
        nbytes: bytes of the per-rank input buffer (hccl_demo's "size").
        ready_ns: every rank's simulated ready time, indexed by group rank.
        rank: the rank asking.
        root: root of reduce/broadcast.
        dtype_bytes: bytes per element.
        splits: alltoall element counts, ``splits[i][j]`` from rank i to rank j (None: even).

    A collective starts when the last rank is ready and every rank finishes together.
    """
    del rank, root, dtype_bytes, splits  # the simple model is symmetric
    start = max(ready_ns) if len(ready_ns) else 0
    return start, start + model.duration_ns(kind, nbytes, len(ready_ns))
