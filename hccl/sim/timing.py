"""Simulated duration of a collective: the seam between the live backend and the network model.

The live process group calls :func:`collective_times` once per collective with every rank's
simulated ready time (exchanged with the collective's metadata), so all ranks compute the
same, deterministic answer. The answer comes from the planner (:func:`hccl.sim.planner.simulate`):
the same schedules over the same topology and RoCE link model, so a live run and a planner
run of the same calls give identical integers (simulated time, not measured).

Configuration, read once per process (the first collective or :func:`get_topology`):

- ``HCCL_TOPOLOGY``: ``hls1``, ``hls2`` (default), ``hls3`` or a TOML topology file;
- ``HCCL_ALGO``: force an algorithm (``direct``, ``hierarchical``, ``ring``, ``recursive``);
- ``PT_HCCL_SLICE_SIZE_MB``: pipelining slice size (default 16).

A subgroup (``new_group``, ``new_subgroups``) is timed on its members' cards, not on cards
0 .. n-1: its process group passes a :class:`~hccl.sim.placement.GroupPlacement` (NOTE
[subgroup placement]); the default group passes none and is timed as before.

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
import threading
from collections.abc import Sequence
from typing import NamedTuple

from hccl.sim import algorithms
from hccl.sim.link_model import message_ns
from hccl.sim.placement import GroupPlacement, place_group
from hccl.sim.planner import simulate
from hccl.sim.schedule import slice_elements
from hccl.sim.topology import Topology, load_topology

__all__ = ["KIND_TO_COLLECTIVE", "CollectiveTiming", "collective_times", "get_topology", "group_placement",
           "p2p_times", "reset"]

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


_lock = threading.Lock()
_topologies: dict[tuple[str, int, int], Topology] = {}
_ranks_per_host: dict[int, int] = {}


def set_ranks_per_host(world_size: int, ranks_per_host: int) -> None:
    """Map hosts to boxes: a job of ``world_size`` ranks has ``ranks_per_host`` ranks per host.

    When a host holds fewer ranks than the topology's box has cards, each host becomes a
    box of ``ranks_per_host`` cards, so traffic between hosts is charged on the scale-out
    ports (a two-host run of 4 + 4 ranks is two boxes, not one box of 8).
    """
    with _lock:
        _ranks_per_host[int(world_size)] = int(ranks_per_host)


def get_topology(world_size: int) -> Topology:
    """The topology named by ``HCCL_TOPOLOGY`` (default ``hls2``) holding ``world_size`` ranks.

    Loaded once per process and world size; the process group may call this at creation
    so that a bad configuration fails there rather than at the first collective.

    Also checks ``HCCL_ALGO`` (a registered algorithm) and ``PT_HCCL_SLICE_SIZE_MB``.

    Raises:
        ValueError: unknown topology name, missing or malformed topology file (the message
            names ``HCCL_TOPOLOGY`` and the value), a world size the topology cannot hold,
            an unknown ``HCCL_ALGO`` or a bad ``PT_HCCL_SLICE_SIZE_MB``.
    """
    name = os.environ.get("HCCL_TOPOLOGY") or "hls2"
    per_host = _ranks_per_host.get(int(world_size), 0)
    key = (name, int(world_size), per_host)
    topo = _topologies.get(key)
    if topo is None:
        with _lock:
            topo = _topologies.get(key)
            if topo is None:
                try:
                    topo = load_topology(name, world_size=int(world_size))
                    if per_host and per_host < topo.cards_per_box:
                        # a host is a box populated with its first `per_host` cards; NICs to
                        # the absent cards stay unused (-2)
                        nics = tuple(tuple(p if p < per_host else -2 for p in row) for row in topo.nic_peer[:per_host])
                        topo = load_topology(
                            name, world_size=int(world_size), cards_per_box=per_host, nic_peer=nics
                        )
                except ValueError as exc:
                    raise ValueError(f"hccl: HCCL_TOPOLOGY={name!r}: {exc}") from None
                algo = os.environ.get("HCCL_ALGO")
                if algo:
                    try:
                        algorithms.get(algo)
                    except ValueError as exc:
                        raise ValueError(f"hccl: HCCL_ALGO={algo!r}: {exc}") from None
                slice_elements(1)
                _topologies[key] = topo
    return topo


def group_placement(global_ranks: Sequence[int], job_world_size: int) -> GroupPlacement:
    """A subgroup's members on the job's cards (NOTE [subgroup placement] in :mod:`hccl.sim.placement`).

    The job's system is :func:`get_topology` of ``job_world_size``: ``HCCL_TOPOLOGY`` with
    hosts mapped to boxes as the default "hccl" group found them in this process.

    Raises:
        ValueError: as :func:`get_topology`, or ranks repeated or outside the job.
    """
    return place_group(get_topology(job_world_size), global_ranks)


def reset() -> None:
    """Forget the loaded topologies (tests that change ``HCCL_TOPOLOGY`` in one process)."""
    with _lock:
        _topologies.clear()
        _ranks_per_host.clear()
        _memo.clear()


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
        topology: the topology to time on (default: :func:`get_topology` of the world size,
            i.e. ``HCCL_TOPOLOGY`` with hosts mapped to boxes).
        placement: a subgroup's placement (:func:`group_placement`): time on its topology,
            with ``ready_ns``, ``rank``, ``root`` and ``splits`` still in group ranks.

    Returns:
        ``(start_ns, end_ns, algorithm)``: ``start_ns`` is when the last rank was ready
        (or this rank's end, if it finished before a rank it never waits for was ready),
        ``end_ns`` when this rank finished, per :func:`hccl.sim.planner.simulate`.

    Raises:
        ValueError: unknown kind, bad ``HCCL_TOPOLOGY`` / ``HCCL_ALGO`` /
            ``PT_HCCL_SLICE_SIZE_MB``, a world size the topology cannot hold, bad root or splits.
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
                                dtype_bytes=dtype_bytes, splits=splits, topology=placement.topology)
    n = len(ready_ns)
    # memo: the answer only depends on ready times relative to the earliest (the planner is
    # shift-invariant) and on the configuration; a DDP step repeats the same calls
    base = min(ready_ns) if n else 0
    memo_key = (
        kind, nbytes, rank, root, dtype_bytes, tuple(r - base for r in ready_ns),
        None if splits is None else tuple(map(tuple, splits)),
        _environ.get("HCCL_TOPOLOGY") if topology is None else topology,
        _environ.get("HCCL_ALGO"), _environ.get("PT_HCCL_SLICE_SIZE_MB"),
        _ranks_per_host.get(n, 0),
    )
    hit = _memo.get(memo_key)
    if hit is not None:
        return CollectiveTiming(base + hit[0], base + hit[1], hit[2])
    timing = _collective_times(kind, nbytes, ready_ns, rank, root, dtype_bytes, splits, topology)
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[memo_key] = (timing.start_ns - base, timing.end_ns - base, timing.algorithm)
    return timing


_memo: dict[tuple, tuple[int, int, str]] = {}
_MEMO_LIMIT = 4096
_environ = os.environ


def _collective_times(kind, nbytes, ready_ns, rank, root, dtype_bytes, splits, topology) -> CollectiveTiming:
    n = len(ready_ns)
    try:
        collective = KIND_TO_COLLECTIVE[kind]
    except KeyError:
        raise ValueError(f"hccl: no timing model for collective {kind!r}; known: "
                         f"{', '.join(KIND_TO_COLLECTIVE)}") from None
    if n == 0:
        return CollectiveTiming(0, 0, "direct")
    topo = get_topology(n) if topology is None else topology
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
    res = simulate(collective, nbytes, topo, world_size=n, ready_ns=ready_ns, root=root,
                   dtype_bytes=dtype_bytes, splits=splits)
    end = res.end_ns[rank]
    return CollectiveTiming(min(max(res.start_ns), end), end, res.algorithm)


def p2p_times(nbytes: int, *, src: int, dst: int, src_ready_ns: int, dst_ready_ns: int,
              world_size: int, placement: GroupPlacement | None = None) -> CollectiveTiming:
    """Simulated interval of one point-to-point message ``src -> dst`` (send/recv).

    The message leaves when the sender is ready and lands ``message_ns`` later (serialization
    at the link's goodput plus path latency, :func:`hccl.sim.link_model.message_ns`); the receive
    ends at the later of its arrival and the receiver's ready time. Returns
    ``(src_ready_ns, end_ns, "p2p")``; ``end_ns`` is the same for sender and receiver.
    ``src`` and ``dst`` are group ranks, placed by ``placement`` when given.
    """
    if placement is not None:
        topo, src, dst = placement.topology, placement.order[src], placement.order[dst]
    else:
        topo = get_topology(world_size)
    if src == dst:
        return CollectiveTiming(src_ready_ns, max(src_ready_ns, dst_ready_ns), "p2p")
    arrive = src_ready_ns + message_ns(topo, src, dst, nbytes)
    return CollectiveTiming(src_ready_ns, max(arrive, dst_ready_ns), "p2p")
