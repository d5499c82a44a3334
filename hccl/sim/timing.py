"""Simulated duration of a collective: the seam between the live backend and the network model.

The live process group calls :func:`collective_times` once per collective with every rank's
simulated ready time (exchanged with the collective's metadata), so all ranks compute the
same, deterministic answer. The answer comes from the planner (:func:`hccl.sim.planner.simulate`):
the same schedules over the same topology and RoCE link model, so a live run and a planner
run of the same calls give identical integers (simulated time, not measured).

Pure and stateless: the caller passes what to time on. The process group owns its
topology (``HCCL_TOPOLOGY`` with its hosts mapped to boxes, :func:`host_topology`) and its
placement (:class:`~hccl.sim.placement.GroupPlacement`; a subgroup is timed on its members'
cards, NOTE [subgroup placement]), and its frozen ``HCCL_ALGO`` / ``PT_HCCL_SLICE_SIZE_MB``
as ``algorithm`` / ``slice_bytes``; the planner and the tools pass their own. Nothing here
keeps state between calls except a memo of answers keyed by every input; the environment
is read only by the planner's defaults, when ``algorithm`` or ``slice_bytes`` is None.

NOTE [ready times ride in the metadata]
    Every rank's ready time reaches the others inside the collective's metadata row (word
    ``ready_ns``, next to the size/dtype/op words the engines compare), and the engines
    return the list. That couples the data plane to the time plane. The seam wanted: the
    engines exchange an opaque per-rank stamp (``exchange(stamp: int) -> list[int]``) in
    their metadata round and know nothing of time. (Done: every driver's alltoall returns its
    element-count matrix with the ready list; no side channel on the driver.)

NOTE [the slowest member starts the collective]
    A collective starts on every rank when its last member is ready (``max(ready_ns)``): HCL's
    box iterations and in-box exchanges need every peer's buffer, so a rank that arrives early
    waits (which the studies report as "waiting for the slowest rank"). The planner then
    times the schedule from that common start. Lazy collectives are timed when their graph is
    launched with the rank's own ready time for all (NOTE [lazy collectives] in
    :mod:`hpu_runtime.device.card`): there no rank waits for a slower one.

NOTE [process group kinds]
    The process group names collectives as torch.distributed does; the planner uses
    hccl_demo's test names. Sizes follow the planner's convention, which is what the
    process group passes: the per-rank input buffer (reduce_scatter: the full input,
    world size x output; allgather: one rank's contribution; alltoall: one rank's input).
    An uneven alltoall passes the full ``splits`` matrix (elements rank i sends to rank j);
    its size for the planner is then the largest rank's input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from hccl.sim.link_model import message_ns
from hccl.sim.placement import GroupPlacement
from hccl.sim.planner import simulate
from hccl.sim.topology import Topology, load_topology

__all__ = ["AUTO", "KIND_TO_COLLECTIVE", "CollectiveTiming", "collective_times", "host_topology", "p2p_times"]

KIND_TO_COLLECTIVE = {
    "allreduce": "all_reduce",
    "reduce": "reduce",
    "broadcast": "broadcast",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all2all",
    "barrier": "barrier",
    "send_recv": "send_recv",
}
"""Process-group collective name -> planner collective name."""


class CollectiveTiming(NamedTuple):
    """One rank's simulated interval of a collective (simulated ns, not measured)."""

    start_ns: int
    """When every rank was ready (the collective cannot start before)."""
    end_ns: int
    """When this rank's part of the collective finished."""
    algorithm: str
    """Algorithm the planner ran."""


AUTO = "auto"
"""``algorithm`` for the selection rule, ignoring ``HCCL_ALGO`` (the caller's configuration
already said no algorithm is forced)."""


def host_topology(name: str, world_size: int, ranks_per_host: int = 0) -> Topology:
    """Topology ``name`` holding ``world_size`` ranks, a host of ``ranks_per_host`` ranks per box.

    When a host holds fewer ranks than the topology's box has cards, each host becomes a
    box of ``ranks_per_host`` cards, so traffic between hosts is charged on the scale-out
    ports (a two-host run of 4 + 4 ranks is two boxes, not one box of 8). ``0``: ranks fill
    the topology's boxes.

    Raises:
        ValueError: unknown topology name, missing or malformed topology file, or a world
            size the topology cannot hold.
    """
    topo = load_topology(name, world_size=int(world_size))
    if ranks_per_host and ranks_per_host < topo.cards_per_box:
        # a host is a box populated with its first `per_host` cards; NICs to the absent
        # cards stay unused (-2)
        nics = tuple(tuple(p if p < ranks_per_host else -2 for p in row) for row in topo.nic_peer[:ranks_per_host])
        topo = load_topology(name, world_size=int(world_size), cards_per_box=ranks_per_host, nic_peer=nics)
    return topo


def _even(splits: Sequence[Sequence[int]]) -> bool:
    """True if every rank sends the same count to every rank (the planner's default split)."""
    first = splits[0][0] if splits and splits[0] else 0
    return all(c == first for row in splits for c in row)


def collective_times(
    kind: str,
    nbytes: int,
    ready_ns: Sequence[int],
    *,
    rank: int = 0,
    root: int = 0,
    dtype_bytes: int = 4,
    splits: Sequence[Sequence[int]] | None = None,
    topology: Topology | None = None,
    placement: GroupPlacement | None = None,
    algorithm: str | None = None,
    slice_bytes: int | None = None,
) -> CollectiveTiming:
    """Start, end (simulated ns) and algorithm on ``rank`` of a collective whose ranks are ready at ``ready_ns``.

    Args:
        kind: the process group's collective name (see :data:`KIND_TO_COLLECTIVE`).
        nbytes: bytes of this rank's input buffer (see NOTE [process group kinds]).
        ready_ns: every rank's simulated ready time, indexed by group rank.
        rank: the rank asking.
        root: root of reduce/broadcast.
        dtype_bytes: bytes per element (a size that is not a whole number of elements is
            timed at byte granularity).
        splits: alltoall element counts, ``splits[i][j]`` from rank i to rank j (None: even).
        topology: the topology to time on (its world size is replaced by ``len(ready_ns)``).
        placement: a group's placement (:func:`hccl.sim.placement.place_group`), instead of
            ``topology``: time on its topology, with ``ready_ns``, ``rank``, ``root`` and
            ``splits`` still in group ranks.
        algorithm: a registered algorithm, :data:`AUTO` (the selection rule) or None (the
            planner's default: the selection rule or ``HCCL_ALGO``).
        slice_bytes: pipelining slice in bytes (None: the planner's default).

    Returns:
        ``(start_ns, end_ns, algorithm)``: ``start_ns`` is when the last rank was ready (every
        rank starts then, NOTE [the slowest member starts the collective]), ``end_ns`` when
        this rank finished, per :func:`hccl.sim.planner.simulate`.

    Raises:
        ValueError: unknown kind or algorithm, a world size the topology cannot hold,
            bad root or splits.
        TypeError: neither ``topology`` nor ``placement`` given.
    """
    if placement is not None:
        order = placement.order
        if splits is not None and not placement.identity:
            moved = [[0] * len(splits) for _ in splits]
            for i, row in enumerate(splits):
                for j, c in enumerate(row):
                    moved[order[i]][order[j]] = c
            splits = moved
        return collective_times(kind, nbytes, placement.to_topology(ready_ns), rank=order[rank], root=order[root],
                                dtype_bytes=dtype_bytes, splits=splits, topology=placement.topology,
                                algorithm=algorithm, slice_bytes=slice_bytes)
    if topology is None:
        raise TypeError("collective_times needs a topology or a placement")
    n = len(ready_ns)
    # NOTE [the slowest member starts the collective]; the planner is shift-invariant, so the
    # answer relative to the start depends on the configuration only: a DDP step's calls hit
    base = max(ready_ns) if n else 0
    memo_key = (
        kind, nbytes, rank, root, dtype_bytes, n,
        None if splits is None else tuple(map(tuple, splits)), topology, algorithm, slice_bytes,
        # the planner's defaults read the environment (NOTE [selection rule])
        (_environ.get("HCCL_ALGO"), _environ.get("PT_HCCL_SLICE_SIZE_MB")) if None in (algorithm, slice_bytes) else None,
    )
    hit = _memo.get(memo_key)
    if hit is not None:
        return CollectiveTiming(base + hit[0], base + hit[1], hit[2])
    timing = _collective_times(kind, nbytes, ready_ns, rank, root, dtype_bytes, splits, topology, algorithm,
                               slice_bytes)
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[memo_key] = (timing.start_ns - base, timing.end_ns - base, timing.algorithm)
    return timing


_memo: dict[tuple, tuple[int, int, str]] = {}
_MEMO_LIMIT = 4096
_environ = os.environ


def _collective_times(kind, nbytes, ready_ns, rank, root, dtype_bytes, splits, topo, algorithm,
                      slice_bytes) -> CollectiveTiming:
    n = len(ready_ns)
    try:
        collective = KIND_TO_COLLECTIVE[kind]
    except KeyError:
        raise ValueError(f"hccl: no timing model for collective {kind!r}; known: "
                         f"{', '.join(KIND_TO_COLLECTIVE)}") from None
    if n == 0:
        return CollectiveTiming(0, 0, "direct")
    if not splits or collective != "all2all":
        splits = None
    else:
        if len(splits) != n:
            raise ValueError(f"hccl: alltoall splits have {len(splits)} rows, expected world size {n}")
        if _even(splits):
            nbytes = sum(splits[0]) * dtype_bytes
            splits = None
        else:
            nbytes = max(sum(row) for row in splits) * dtype_bytes
    if dtype_bytes > 1 and nbytes % dtype_bytes:
        if splits is not None:
            splits = [[c * dtype_bytes for c in row] for row in splits]
        dtype_bytes = 1
    start = max(ready_ns)
    res = simulate(collective, nbytes, topo, world_size=n, ready_ns=[start] * n, root=root,
                   dtype_bytes=dtype_bytes, splits=splits, algorithm=algorithm, slice_bytes=slice_bytes)
    return CollectiveTiming(start, res.end_ns[rank], res.algorithm)


def p2p_times(nbytes: int, *, src: int, dst: int, src_ready_ns: int, dst_ready_ns: int,
              topology: Topology | None = None, placement: GroupPlacement | None = None) -> CollectiveTiming:
    """Simulated interval of one point-to-point message ``src -> dst`` (send/recv).

    The message leaves when the sender is ready and lands ``message_ns`` later (serialization
    at the link's goodput plus path latency, :func:`hccl.sim.link_model.message_ns`); the receive
    ends at the later of its arrival and the receiver's ready time. Returns
    ``(src_ready_ns, end_ns, "p2p")``; ``end_ns`` is the same for sender and receiver.
    ``src`` and ``dst`` are group ranks, placed by ``placement`` when given (else ranks of
    ``topology``).

    Raises:
        TypeError: neither ``topology`` nor ``placement`` given.
    """
    if placement is not None:
        topo, src, dst = placement.topology, placement.order[src], placement.order[dst]
    elif topology is None:
        raise TypeError("p2p_times needs a topology or a placement")
    else:
        topo = topology
    if src == dst:
        return CollectiveTiming(src_ready_ns, max(src_ready_ns, dst_ready_ns), "p2p")
    arrive = src_ready_ns + message_ns(topo, src, dst, nbytes)
    return CollectiveTiming(src_ready_ns, max(arrive, dst_ready_ns), "p2p")
