"""Scale-up "direct": every rank exchanges with all its peers at once, in one phase.

In an 8-card box every pair of cards is linked (3 ports per peer on Gaudi2/Gaudi3, 1 on
Gaudi), so reduce-scatter and all-gather move 1/n of the buffer to all n - 1 peers at the
same time, each over its own link.
"""

from __future__ import annotations

import numpy as np

from hccl.sim.algorithms._base import Algorithm, Ctx, dense_rows, self_copy_phase
from hccl.sim.schedule import Phase

__all__ = ["Direct"]


class Direct(Algorithm):
    name = "direct"

    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        n = ctx.n
        if n == 1:
            return []
        start, length = table

        def ph():
            r = np.arange(n)
            rows = []
            for j in range(1, n):
                d = (r + j) % n
                rows.append((d, length[d], start[d], start[d]))
            return dense_rows(n, rows, reduce=True)
        return [ph]

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        n = ctx.n
        if n == 1:
            return []
        start, length = table

        def ph():
            r = np.arange(n)
            return dense_rows(n, [((r + j) % n, length[r], start[r], start[r]) for j in range(1, n)],
                              reduce=False)
        return [ph]

    def all2all(self, ctx: Ctx, send_off, recv_off, counts) -> list[Phase]:
        n = ctx.n
        copy = self_copy_phase(n, send_off, recv_off, counts)

        def ph():
            r = np.arange(n)
            rows = []
            for j in range(1, n):
                d = (r + j) % n
                rows.append((d, counts[r, d], send_off[r, d], recv_off[r, d]))
            return list(copy()) + (dense_rows(n, rows, reduce=False) if rows else [])
        return [ph]
