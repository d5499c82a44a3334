"""Hierarchical scale-out: a frictionless shape of HCL's multi-box all-reduce, kept for comparison.

HCL itself runs pairwise box iterations slice by slice (:mod:`.pairwise`, the
default for all-reduce, reduce-scatter, all-gather and barrier); this one exchanges with every
other box in one phase, so its latency hardly grows with the number of boxes. It is still
the default for reduce, broadcast and all2all across boxes (``HCCL_ALGO=hierarchical`` forces it).

With B boxes of L cards, rank r = b * L + l:

1. reduce-scatter inside the box (direct, all L - 1 peers at once): card l collects the
   box's partial sums of every chunk owned by a card with local index l;
2. pairwise exchange over the scale-out ports with the card of the same local index in
   each other box (reduce-scatter among the B cards with index l): rank r ends with
   chunk r fully reduced;
3. the reverse exchange over scale-out (all-gather among the B cards with index l);
4. all-gather inside the box.

For all-reduce, chunk positions are chosen so that what card l owns in the box (its B
chunks) is contiguous: one message per peer in steps 1 and 4. Needs a world size that
fills whole boxes (or fits in one box).
"""

from __future__ import annotations

import numpy as np

from hccl.sim.algorithms._base import Ctx, WholeBoxes, dense_grid, dense_rows, even_table
from hccl.sim.schedule import Phase

__all__ = ["Hierarchical"]


class Hierarchical(WholeBoxes):
    name = "hierarchical"

    def all_reduce_table(self, ctx: Ctx, s0: int, s1: int):
        L, B = self._dims(ctx)
        r = np.arange(ctx.n)
        return even_table(s0, s1, ctx.n, order=(r % L) * B + r // L)

    def _box_blocks(self, ctx: Ctx, table, *, gather: bool, reduce: bool):
        """In-box step: to local peer (l + j) send the chunks it owns (RS) or mine (AG)."""
        n = ctx.n
        L, B = self._dims(ctx)
        start, length = table
        r = np.arange(n)
        b, l = r // L, r % L
        sl = start.reshape(B, L)
        ln = length.reshape(B, L)
        # chunks of local index l across boxes are contiguous and in box order?
        contig = bool(np.all(sl[1:] == sl[:-1] + ln[:-1])) if B > 1 else True
        J = np.arange(1, L)[:, None]
        peer_l = (l[None, :] + J) % L          # (L - 1, n)
        d = b[None, :] * L + peer_l
        owner_l = np.broadcast_to(l, peer_l.shape) if gather else peer_l
        if contig:
            off = sl[0][owner_l]
            return dense_grid(n, d, ln.sum(axis=0)[owner_l], off, off, reduce=reduce)
        rows = []
        for j in range(L - 1):
            for bb in range(B):
                rows.append((d[j], ln[bb][owner_l[j]], sl[bb][owner_l[j]], sl[bb][owner_l[j]]))
        return dense_rows(n, rows, reduce=reduce)

    def _out_blocks(self, ctx: Ctx, table, *, gather: bool, reduce: bool):
        """Scale-out step: exchange with the card of the same local index in every other box."""
        n = ctx.n
        L, B = self._dims(ctx)
        start, length = table
        r = np.arange(n)
        b, l = r // L, r % L
        d = ((b[None, :] + np.arange(1, B)[:, None]) % B) * L + l[None, :]   # (B - 1, n)
        if gather:
            return dense_grid(n, d, length, start, start, reduce=reduce)
        off = start[d]
        return dense_grid(n, d, length[d], off, off, reduce=reduce)

    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        L, B = self._dims(ctx)
        phases: list[Phase] = []
        if L > 1:
            phases.append(lambda: self._box_blocks(ctx, table, gather=False, reduce=True))
        if B > 1:
            phases.append(lambda: self._out_blocks(ctx, table, gather=False, reduce=True))
        return phases

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        L, B = self._dims(ctx)
        phases: list[Phase] = []
        if B > 1:
            phases.append(lambda: self._out_blocks(ctx, table, gather=True, reduce=False))
        if L > 1:
            phases.append(lambda: self._box_blocks(ctx, table, gather=True, reduce=False))
        return phases
