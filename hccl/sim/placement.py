"""Where a process group's ranks sit: a subgroup's members on the job's cards.

Pure: no torch, no processes. The process group builds a :class:`GroupPlacement` once, at
creation, and the timing seam (:func:`hccl.sim.timing.collective_times`) times every collective
of the group on ``placement.topology``.

NOTE [subgroup placement]
    Global rank ``g`` of a job sits on card ``g`` of the job's system (the topology of the
    default group: ``HCCL_TOPOLOGY`` with hosts mapped to boxes; NOTE [rank placement] in
    :mod:`hccl.sim.topology`). torch hands a subgroup's backend its members' global ranks
    (``global_ranks_in_group``, ascending). A collective of the group runs over those cards
    only, so the group is timed on a topology of its own:

    - its boxes are the job boxes holding members, in box order, each with as many cards
      as it holds members; each card keeps its scale-up links to the other members of its
      box (the NIC map restricted to them) and its own scale-out ports;
    - ``boxes_per_leaf`` is chosen so that two of its boxes share a leaf switch exactly when
      the job boxes do.

    So on HLS-2 a data-parallel group ``{0, 8, 16, 24}`` is four boxes of one card (every
    byte on the scale-out ports), ``{0, ..., 7}`` one box of eight, ``{0, 1, 8, 9}`` two
    boxes of two. Group rank ``i`` is rank ``order[i]`` of that topology (the identity for
    torch's ascending ranks, except when a short box is moved last, below).

    The topology model has equal boxes filled in rank order, so two cases are approximated:
    boxes holding different numbers of members (if exactly one box holds fewer, it becomes
    the partly used last box, exact; otherwise every member is timed as alone in its box:
    members sharing a box are charged scale-out rates between them, a pessimistic bound),
    and leaf memberships no single ``boxes_per_leaf`` reproduces (the smallest run of boxes
    sharing a leaf is used: some traffic is charged across the spine that a real fabric
    would keep under one leaf).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from hccl.sim.topology import Topology

__all__ = ["GroupPlacement", "place_group"]


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """A group's members on the job's cards, and the topology its collectives are timed on."""

    cards: tuple[int, ...]
    """Job card (global rank) of each group rank."""
    topology: Topology
    """The members' cards as a system of their own (world size = group size)."""
    order: tuple[int, ...]
    """``order[i]``: the rank of ``topology`` that group rank ``i`` is."""

    @property
    def identity(self) -> bool:
        """True when group rank i is rank i of :attr:`topology`."""
        return all(o == i for i, o in enumerate(self.order))

    def to_topology(self, per_rank: Sequence) -> list:
        """Values indexed by group rank, reindexed by :attr:`topology` rank."""
        out = [None] * len(per_rank)
        for i, v in enumerate(per_rank):
            out[self.order[i]] = v
        return out


def place_group(job: Topology, cards: Sequence[int]) -> GroupPlacement:
    """Place a group whose rank ``i`` runs on the job's card ``cards[i]`` (see NOTE [subgroup placement]).

    Args:
        job: the job's system (its world size covers every card).
        cards: distinct job cards (global ranks), one per group rank.

    Returns:
        The placement; for ``cards == 0 .. job.world_size - 1`` the job topology itself.

    Raises:
        ValueError: no cards, a repeated card, or a card outside the job.
    """
    cards = tuple(int(c) for c in cards)
    if not cards:
        raise ValueError("a group needs at least one rank")
    if len(set(cards)) != len(cards):
        raise ValueError(f"group ranks {list(cards)} repeat a rank")
    bad = [c for c in cards if not 0 <= c < job.world_size]
    if bad:
        raise ValueError(f"group ranks {bad} are outside the job's {job.world_size} ranks")
    n = len(cards)
    if cards == tuple(range(job.world_size)):
        return GroupPlacement(cards, job, tuple(range(n)))
    L, bpl = job.cards_per_box, job.boxes_per_leaf
    by_box: dict[int, list[int]] = {}
    for i, c in enumerate(cards):
        by_box.setdefault(c // L, []).append(i)
    boxes = sorted(by_box)
    counts = [len(by_box[b]) for b in boxes]
    k = max(counts)
    short = [b for b, c in zip(boxes, counts) if c < k]
    if len(short) > 1:  # unequal boxes the model cannot hold: every member alone in its box
        members = sorted(range(n), key=lambda i: cards[i])
        groups = [[i] for i in members]
        leaves = [cards[i] // L // bpl for i in members]
        k = 1
    else:
        boxes = [b for b in boxes if b not in short] + short  # a short box goes last
        groups = [sorted(by_box[b], key=lambda i: cards[i]) for b in boxes]
        leaves = [b // bpl for b in boxes]
    order = [0] * n
    for pos, i in enumerate(i for g in groups for i in g):
        order[i] = pos
    # the NIC map of a full box's cards, restricted to the members and relabelled 0 .. k-1
    first = next(g for g in groups if len(g) == k)
    local = [cards[i] % L for i in first]
    relabel = {p: j for j, p in enumerate(local)}
    nic_peer = tuple(tuple(relabel.get(p, -2) if p >= 0 else p for p in job.nic_peer[l]) for l in local)
    topo = dataclasses.replace(job, world_size=n, cards_per_box=k, num_boxes=0, fixed_boxes=False,
                               boxes_per_leaf=_boxes_per_leaf(leaves), nic_peer=nic_peer,
                               faults=_group_faults(job.faults, cards, order))
    return GroupPlacement(cards, topo, tuple(order))


def _group_faults(faults, cards, order) -> tuple:
    """The job's faulty links that join the group's members, in the group topology's ranks."""
    where = {c: order[i] for i, c in enumerate(cards)}
    out = []
    for kind, a, b, f in faults:
        if a in where and (kind == "out" or b in where):
            out.append((kind, where[a], b if kind == "out" else where[b], f))
    return tuple(sorted(out))


def _boxes_per_leaf(leaves: Sequence[int]) -> int:
    """A ``boxes_per_leaf`` under which box j's leaf is ``j // boxes_per_leaf`` as in ``leaves``
    (the smallest run of boxes sharing a leaf when none is exact)."""
    runs: list[int] = []
    for j, leaf in enumerate(leaves):
        if j and leaf == leaves[j - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    if len(runs) == 1:
        return max(1, runs[0])
    distinct = len(set(leaves)) == len(runs)  # no leaf comes back after another
    if distinct and all(r == runs[0] for r in runs[:-1]) and runs[-1] <= runs[0]:
        return runs[0]
    return min(runs)
