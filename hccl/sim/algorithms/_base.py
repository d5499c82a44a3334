"""Shared pieces of the collective algorithms: chunk tables, block helpers, compositions.

A *chunk table* is a pair of (n,) int64 arrays ``(start, length)``: chunk ``k`` is
``[start[k], start[k] + length[k])`` of every rank's work buffer, and reduce-scatter
leaves chunk ``k`` fully reduced on rank ``k`` (all-gather is the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccl.sim.schedule import Block, Phase, _even_bounds, slice_elements
from hccl.sim.topology import Topology

__all__ = ["Ctx", "Algorithm", "WholeBoxes", "even_table", "dense_rows", "dense_grid", "MAX_BLOCK_ENTRIES"]

MAX_BLOCK_ENTRIES = 1 << 21
"""Largest K x M block built at once (bounds the planner's memory)."""


@dataclass(frozen=True, slots=True)
class Ctx:
    """What an algorithm needs to know about one call."""

    n: int
    topo: Topology
    root: int = 0
    slice_index: int = 0
    """Which slice of the call the phases are for (0 for unsliced calls)."""


def even_table(s0: int, s1: int, n: int, order: np.ndarray | None = None):
    """Chunk table splitting ``[s0, s1)`` into n near-equal chunks; chunk k at position order[k]."""
    b = _even_bounds(s1 - s0, n) + s0
    pos = np.arange(n) if order is None else np.asarray(order)
    return b[pos], b[pos + 1] - b[pos]


def _one(table_start, table_len) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(table_start, dtype=np.int64), np.asarray(table_len, dtype=np.int64)


def dense_rows(n: int, rows, *, reduce: bool) -> list[Block]:
    """Dense blocks (every rank a sender column) from ``rows`` = list of (dst, count, send_off, recv_off).

    Rows are grouped into blocks of at most :data:`MAX_BLOCK_ENTRIES` entries.
    """
    per = max(1, MAX_BLOCK_ENTRIES // max(n, 1))
    src = np.arange(n, dtype=np.int64)
    out = []
    for i in range(0, len(rows), per):
        part = rows[i:i + per]
        out.append(Block(src, np.stack([r[0] for r in part]),
                         np.stack([np.broadcast_to(r[1], (n,)) for r in part]),
                         np.stack([np.broadcast_to(r[2], (n,)) for r in part]),
                         np.stack([np.broadcast_to(r[3], (n,)) for r in part]),
                         reduce=reduce, dense=True))
    return out


def dense_grid(n: int, dst, count, send_off, recv_off, *, reduce: bool) -> list[Block]:
    """Dense blocks from (K, n) arrays (or arrays broadcastable to it), row k = one template.

    Same blocks as :func:`dense_rows` on the K rows, without building them one by one.
    """
    dst = np.asarray(dst, dtype=np.int64)
    K = dst.shape[0]
    per = max(1, MAX_BLOCK_ENTRIES // max(n, 1))
    src = np.arange(n, dtype=np.int64)
    arrs = [np.broadcast_to(np.asarray(a, dtype=np.int64), (K, n)) for a in (count, send_off, recv_off)]
    return [Block(src, dst[i:i + per], *(a[i:i + per] for a in arrs), reduce=reduce, dense=True)
            for i in range(0, K, per)]


def sparse_block(msgs, *, reduce: bool, copies=None) -> Block:
    """A block from a list of (src, dst, count, send_off, recv_off) messages."""
    by_src: dict[int, list] = {}
    for m in msgs:
        by_src.setdefault(m[0], []).append(m)
    srcs = sorted(by_src)
    k = max((len(v) for v in by_src.values()), default=0)
    shape = (k, len(srcs))
    dst = np.full(shape, -1, dtype=np.int64)
    cnt = np.zeros(shape, dtype=np.int64)
    so = np.zeros(shape, dtype=np.int64)
    ro = np.zeros(shape, dtype=np.int64)
    for j, s in enumerate(srcs):
        for i, (_, d, c, a, b) in enumerate(by_src[s]):
            dst[i, j], cnt[i, j], so[i, j], ro[i, j] = d, c, a, b
    if copies is not None:
        copies = tuple(np.asarray(x, dtype=np.int64) for x in copies)
    return Block(np.asarray(srcs, dtype=np.int64), dst, cnt, so, ro, reduce=reduce, copies=copies)


class Algorithm:
    """Base class: an algorithm provides reduce-scatter and all-gather over a chunk table;
    the other collectives are composed from them unless a subclass overrides.

    Every method returns a list of phases (callables returning blocks), built lazily.
    """

    name = "base"

    def check(self, ctx: Ctx) -> None:
        """Raise ValueError if this algorithm cannot run on ``ctx``'s topology."""

    def buffer_slice(self, ctx: Ctx, dtype_bytes: int, slice_bytes: int | None) -> int:
        """Elements of an all-reduce buffer per pipelined slice (collectives cut per rank use
        ``1 / n`` of it): ``slice_bytes``, default ``PT_HCCL_SLICE_SIZE_MB``."""
        return slice_elements(dtype_bytes, slice_bytes)

    # primitives -------------------------------------------------------------------
    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        raise NotImplementedError

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        raise NotImplementedError

    def all_reduce_table(self, ctx: Ctx, s0: int, s1: int):
        """Chunk table this algorithm uses for all-reduce of ``[s0, s1)``."""
        return even_table(s0, s1, ctx.n)

    # compositions -------------------------------------------------------------------
    def all_reduce(self, ctx: Ctx, s0: int, s1: int) -> list[Phase]:
        table = self.all_reduce_table(ctx, s0, s1)
        return self.reduce_scatter(ctx, table) + self.all_gather(ctx, table)

    def reduce(self, ctx: Ctx, s0: int, s1: int) -> list[Phase]:
        table = even_table(s0, s1, ctx.n)
        start, length = table
        root = ctx.root

        def gather() -> list[Block]:
            msgs = [(k, root, int(length[k]), int(start[k]), int(start[k])) for k in range(ctx.n) if k != root]
            return [sparse_block(msgs, reduce=False)] if msgs else []

        return self.reduce_scatter(ctx, table) + [gather]

    def broadcast(self, ctx: Ctx, s0: int, s1: int) -> list[Phase]:
        table = even_table(s0, s1, ctx.n)
        start, length = table
        root = ctx.root

        def scatter() -> list[Block]:
            msgs = [(root, k, int(length[k]), int(start[k]), int(start[k])) for k in range(ctx.n) if k != root]
            return [sparse_block(msgs, reduce=False)] if msgs else []

        return [scatter] + self.all_gather(ctx, table)

    def all2all(self, ctx: Ctx, send_off, recv_off, counts) -> list[Phase]:
        """Pairwise exchange: phase j sends to rank r + j and receives from r - j.

        ``send_off[i, j]``: offset in rank i's buffer of what i sends to j;
        ``recv_off[i, j]``: offset in rank j's buffer where it lands; ``counts[i, j]``.
        """
        n = ctx.n
        r = np.arange(n)
        phases: list[Phase] = [_self_copy(n, send_off, recv_off, counts)]
        for j in range(1, n):
            def ph(j=j) -> list[Block]:
                d = (r + j) % n
                return dense_rows(n, [(d, counts[r, d], send_off[r, d], recv_off[r, d])], reduce=False)
            phases.append(ph)
        return phases


def _self_copy(n, send_off, recv_off, counts) -> Phase:
    def ph() -> list[Block]:
        r = np.arange(n)
        empty = np.zeros((0, 0), dtype=np.int64)
        return [Block(np.zeros(0, dtype=np.int64), empty, empty, empty, empty, reduce=False,
                      copies=(r, send_off[r, r], recv_off[r, r], counts[r, r]))]
    return ph


def self_copy_phase(n, send_off, recv_off, counts) -> Phase:
    """Phase copying every rank's own all2all chunk from input to output."""
    return _self_copy(n, send_off, recv_off, counts)


class WholeBoxes(Algorithm):
    """An algorithm over whole boxes (or one box): the ranks are ``B`` boxes of ``L`` cards."""

    def check(self, ctx: Ctx) -> None:
        L = ctx.topo.cards_per_box
        if ctx.n > L and ctx.n % L:
            raise ValueError(f"algorithm {self.name!r} needs the world size ({ctx.n}) to be a multiple of "
                             f"cards_per_box ({L}) or at most one box")

    def _dims(self, ctx: Ctx) -> tuple[int, int]:
        """(L, B): cards per box (the group's size if it is smaller) and boxes."""
        L = min(ctx.topo.cards_per_box, ctx.n)
        return L, ctx.n // L

