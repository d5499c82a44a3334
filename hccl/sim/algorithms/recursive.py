"""Recursive halving / doubling, for small messages: log2(n) steps instead of n - 1.

For a world size that is not a power of two, the ``n - p`` extra ranks (p the largest
power of two <= n) first fold their data into rank ``e - p``, the p ranks run the
power-of-two algorithm, and the result is unfolded back to the extra ranks.

- all-reduce: recursive doubling, exchanging and reducing the whole buffer with the
  partner ``v xor d`` for d = 1, 2, 4, ...
- reduce-scatter: recursive halving; at distance d a rank keeps one half of its current
  range of chunks and sends the other half to ``v xor d``; then each owner sends the
  chunks it does not own to their ranks.
- all-gather: the reverse (recursive doubling of the ranges).
"""

from __future__ import annotations

import numpy as np

from hccl.sim.algorithms._base import Algorithm, Ctx, dense_rows, sparse_block
from hccl.sim.schedule import Phase

__all__ = ["Recursive"]


def _p2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _plan(n: int, p: int):
    """Chunk ranges per virtual rank before each halving distance: {d: (lo, hi) arrays}."""
    lo = np.zeros(p, dtype=np.int64)
    hi = np.full(p, n, dtype=np.int64)
    v = np.arange(p)
    levels = []
    d = p // 2
    while d >= 1:
        mid = lo + (hi - lo) // 2
        upper = (v & d) != 0
        levels.append((d, lo.copy(), hi.copy(), mid.copy()))
        lo = np.where(upper, mid, lo)
        hi = np.where(upper, hi, mid)
        d //= 2
    return levels, lo, hi


def _range_msgs(table, src, dst, lo, hi):
    """Messages carrying chunks [lo, hi) from src to dst: one if contiguous, else per chunk."""
    start, length = table
    if hi <= lo:
        return []
    s, e = int(start[lo]), int(start[hi - 1] + length[hi - 1])
    if e - s == int(length[lo:hi].sum()) and np.all(start[lo + 1:hi] == start[lo:hi - 1] + length[lo:hi - 1]):
        return [(src, dst, e - s, s, s)]
    return [(src, dst, int(length[k]), int(start[k]), int(start[k])) for k in range(lo, hi)]


class Recursive(Algorithm):
    name = "recursive"

    def all_reduce(self, ctx: Ctx, s0: int, s1: int) -> list[Phase]:
        n = ctx.n
        p = _p2(n)
        cnt = s1 - s0
        phases: list[Phase] = []
        extras = list(range(p, n))
        if extras:
            phases.append(lambda: [sparse_block([(e, e - p, cnt, s0, s0) for e in extras], reduce=True)])
        d = 1
        while d < p:
            def ph(d=d):
                if p == n:
                    r = np.arange(n)
                    return dense_rows(n, [(r ^ d, cnt, s0, s0)], reduce=True)
                return [sparse_block([(v, v ^ d, cnt, s0, s0) for v in range(p)], reduce=True)]
            phases.append(ph)
            d *= 2
        if extras:
            phases.append(lambda: [sparse_block([(e - p, e, cnt, s0, s0) for e in extras], reduce=False)])
        return phases

    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        n = ctx.n
        if n == 1:
            return []
        p = _p2(n)
        levels, flo, fhi = _plan(n, p)
        phases: list[Phase] = []
        if n > p:
            phases.append(lambda: [sparse_block(
                [m for e in range(p, n) for m in _range_msgs(table, e, e - p, 0, n)], reduce=True)])
        for d, lo, hi, mid in levels:
            def ph(d=d, lo=lo, hi=hi, mid=mid):
                msgs = []
                for v in range(p):
                    if v & d:   # keep upper half, send lower
                        msgs += _range_msgs(table, v, v ^ d, int(lo[v]), int(mid[v]))
                    else:
                        msgs += _range_msgs(table, v, v ^ d, int(mid[v]), int(hi[v]))
                return [sparse_block(msgs, reduce=True)]
            phases.append(ph)

        def final():
            start, length = table
            msgs = [(v, k, int(length[k]), int(start[k]), int(start[k]))
                    for v in range(p) for k in range(int(flo[v]), int(fhi[v])) if k != v]
            return [sparse_block(msgs, reduce=False)] if msgs else []
        phases.append(final)
        return phases

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        n = ctx.n
        if n == 1:
            return []
        p = _p2(n)
        levels, flo, fhi = _plan(n, p)
        owner = np.empty(n, dtype=np.int64)
        for v in range(p):
            owner[int(flo[v]):int(fhi[v])] = v
        phases: list[Phase] = []

        def first():
            start, length = table
            msgs = [(k, int(owner[k]), int(length[k]), int(start[k]), int(start[k])) for k in range(n)
                    if owner[k] != k]
            return [sparse_block(msgs, reduce=False)] if msgs else []
        phases.append(first)
        # doubling: walk the halving levels backwards; after level d a rank holds its
        # range at that level, so it sends what it holds after halving by d
        nxt = [(flo, fhi)] + [(lo, hi) for _, lo, hi, _ in reversed(levels)]
        for i, (d, lo, hi, mid) in enumerate(reversed(levels)):
            cur_lo, cur_hi = nxt[i]
            def ph(d=d, cur_lo=cur_lo, cur_hi=cur_hi):
                msgs = []
                for v in range(p):
                    msgs += _range_msgs(table, v, v ^ d, int(cur_lo[v]), int(cur_hi[v]))
                return [sparse_block(msgs, reduce=False)]
            phases.append(ph)
        if n > p:
            phases.append(lambda: [sparse_block(
                [m for e in range(p, n) for m in _range_msgs(table, e - p, e, 0, n)], reduce=False)])
        return phases
