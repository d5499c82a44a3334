"""Collective algorithms as schedules, registered by name.

Adding an algorithm = one new module with an :class:`~hccl.sim.algorithms._base.Algorithm`
subclass + one line in :data:`REGISTRY`.

NOTE [selection rule]
    Unless ``algorithm=`` is given or ``HCCL_ALGO=<name>`` is set:

    - one rank: ``direct`` (no messages);
    - the group fits in one box: ``direct`` (all peers at once over the scale-up links);
    - two whole boxes, messages up to ``SMALL_BYTES`` (16 KiB) per rank: ``recursive``
      (log2(n) steps of latency beat the box iterations there);
    - whole boxes otherwise: ``pairwise`` (HCL's box iterations, NOTE [HCL's pairwise box
      iterations]) for all_reduce, reduce_scatter, all_gather and barrier, as HCL runs them;
      ``hierarchical`` (its older, frictionless shape, kept for comparison) for the others
      (reduce, broadcast, all2all);
    - the last box partly used: ``recursive`` up to ``SMALL_BYTES``, else ``ring``.

    ``send_recv`` has one pattern (hccl_demo's) whatever the algorithm.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import numpy as np

from hccl.sim.algorithms._base import Algorithm, Ctx, dense_rows, even_table, sparse_block
from hccl.sim.algorithms.direct import Direct
from hccl.sim.algorithms.hierarchical import Hierarchical
from hccl.sim.algorithms.pairwise import Pairwise
from hccl.sim.algorithms.recursive import Recursive
from hccl.sim.algorithms.ring import Ring
from hccl.sim.schedule import Phase, pipeline, split_matrix
from hccl.sim.topology import Topology

__all__ = ["REGISTRY", "SMALL_BYTES", "Algorithm", "register", "select", "get", "phases"]

logger = logging.getLogger(__name__)

REGISTRY: dict[str, Algorithm] = {
    "direct": Direct(),
    "hierarchical": Hierarchical(),
    "pairwise": Pairwise(),
    "ring": Ring(),
    "recursive": Recursive(),
}
"""Algorithm name -> instance."""

_PAIRWISE = ("all_reduce", "reduce_scatter", "all_gather", "barrier")
"""Collectives whose multi-box default is HCL's pairwise box iterations (a barrier is an
all-reduce of nothing)."""

SMALL_BYTES = 16 * 1024
"""Per-rank size at or below which multi-box collectives use recursive halving/doubling."""


def register(algo: Algorithm) -> None:
    """Add an algorithm to :data:`REGISTRY` under ``algo.name``."""
    REGISTRY[algo.name] = algo


def get(name: str) -> Algorithm:
    """The registered algorithm ``name``; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def select(collective: str, nbytes: int, topo: Topology, world_size: int, *, honour_env: bool = True) -> str:
    """Default algorithm name for a call (see NOTE [selection rule]); honours ``HCCL_ALGO``
    unless ``honour_env`` is false (a caller whose configuration already read it)."""
    env = os.environ.get("HCCL_ALGO") if honour_env else None
    if env:
        get(env)
        return env
    n, L = world_size, topo.cards_per_box
    if n <= L:
        return "direct"
    small = nbytes <= SMALL_BYTES and collective != "barrier"
    if n % L == 0:
        if small and n <= 2 * L:
            return "recursive"
        return "pairwise" if collective in _PAIRWISE else "hierarchical"
    return "recursive" if small or collective == "barrier" else "ring"


def _send_recv_peers(n: int, L: int) -> np.ndarray:
    """hccl_demo's send_recv pattern: ring over boxes (same local index) or adjacent pairs in a box."""
    r = np.arange(n)
    if n > L and n % L == 0:
        B = n // L
        return ((r // L + 1) % B) * L + r % L
    peer = np.where(r % 2 == 1, r - 1, r + 1)
    if n % 2:
        peer[n - 1] = n - 1
    return peer


def phases(collective: str, count: int, topo: Topology, *, algorithm: str | None = None, root: int = 0,
           dtype_bytes: int = 4, splits=None, slice_bytes: int | None = None
           ) -> tuple[str, list[tuple[int, Phase]]]:
    """Issue-ordered phases of a (validated) call on ``topo.world_size`` ranks.

    ``algorithm``: a registered name, ``"auto"`` (the selection rule) or None (the selection
    rule or ``HCCL_ALGO``).

    Returns:
        (algorithm name, list of (slice index, phase)).
    """
    n = topo.world_size
    if algorithm is None or algorithm == "auto":
        name = select(collective, count * dtype_bytes, topo, n, honour_env=algorithm is None)
    else:
        name = algorithm
    algo = get(name)
    ctx = Ctx(n=n, topo=topo, root=root)
    algo.check(ctx)
    q_total = algo.buffer_slice(ctx, dtype_bytes, slice_bytes)
    per_slice: list[list[Phase]] = []

    if collective == "barrier":
        per_slice.append(algo.all_reduce(ctx, 0, 0))
    elif collective in ("all_reduce", "reduce", "broadcast"):
        nslices = max(1, math.ceil(count / q_total))
        for s in range(nslices):
            s0, s1 = s * q_total, min(count, (s + 1) * q_total)
            fn = {"all_reduce": algo.all_reduce, "reduce": algo.reduce, "broadcast": algo.broadcast}[collective]
            per_slice.append(fn(dataclasses.replace(ctx, slice_index=s), s0, s1))
    elif collective in ("all_gather", "reduce_scatter"):
        if collective == "all_gather":
            base, lens = np.arange(n, dtype=np.int64) * count, np.full(n, count, dtype=np.int64)
        else:
            base, lens = even_table(0, count, n)
        q = max(1, q_total // n)
        nslices = max(1, math.ceil(int(lens.max()) / q))
        for s in range(nslices):
            lo = np.minimum(lens, s * q)
            hi = np.minimum(lens, (s + 1) * q)
            table = (base + lo, hi - lo)
            fn = algo.all_gather if collective == "all_gather" else algo.reduce_scatter
            per_slice.append(fn(dataclasses.replace(ctx, slice_index=s), table))
    elif collective == "all2all":
        mat = split_matrix(count, n, splits)
        send_base = np.concatenate([np.zeros((n, 1), dtype=np.int64), np.cumsum(mat, axis=1)[:, :-1]], axis=1)
        recv_base = count + np.concatenate([np.zeros((1, n), dtype=np.int64), np.cumsum(mat, axis=0)[:-1]], axis=0)
        q = max(1, q_total // n)
        nslices = max(1, math.ceil(int(mat.max(initial=0)) / q))
        for s in range(nslices):
            lo = np.minimum(mat, s * q)
            hi = np.minimum(mat, (s + 1) * q)
            per_slice.append(algo.all2all(ctx, send_base + lo, recv_base + lo, hi - lo))
    elif collective == "send_recv":
        peer = _send_recv_peers(n, topo.cards_per_box)
        nslices = max(1, math.ceil(count / q_total))
        for s in range(nslices):
            s0, s1 = s * q_total, min(count, (s + 1) * q_total)
            per_slice.append([_send_recv_phase(n, peer, s0, s1, count)])
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return name, list(pipeline(per_slice))


def _send_recv_phase(n: int, peer: np.ndarray, s0: int, s1: int, count: int) -> Phase:
    def ph():
        r = np.arange(n)
        self_ = peer == r
        blocks = []
        if (~self_).any():
            if self_.any():
                msgs = [(int(i), int(peer[i]), s1 - s0, s0, count + s0) for i in np.nonzero(~self_)[0]]
                blocks.append(sparse_block(msgs, reduce=False))
            else:
                blocks += dense_rows(n, [(peer, s1 - s0, s0, count + s0)], reduce=False)
        if self_.any():
            idx = np.nonzero(self_)[0]
            empty = np.zeros((0, 0), dtype=np.int64)
            from hccl.sim.schedule import Block
            blocks.append(Block(np.zeros(0, dtype=np.int64), empty, empty, empty, empty, reduce=False,
                                copies=(idx, np.full(idx.size, s0), np.full(idx.size, count + s0),
                                        np.full(idx.size, s1 - s0))))
        return blocks
    return ph
