"""Ring: rank r sends to r + 1 and receives from r - 1, n - 1 steps per pass.

Reduce-scatter: at step k rank r sends chunk (r - 1 - k) mod n and reduces chunk
(r - 2 - k) mod n into its buffer; after n - 1 steps rank r holds chunk r reduced.
All-gather: at step k rank r forwards chunk (r - k) mod n. Works for any world size;
bandwidth-optimal but n - 1 latencies per pass.
"""

from __future__ import annotations

import numpy as np

from hccl.sim.algorithms._base import Algorithm, Ctx, dense_rows
from hccl.sim.schedule import Phase

__all__ = ["Ring"]


class Ring(Algorithm):
    name = "ring"

    def _pass(self, ctx: Ctx, table, first: int, reduce: bool) -> list[Phase]:
        n = ctx.n
        start, length = table
        phases: list[Phase] = []
        for k in range(n - 1):
            def ph(k=k):
                r = np.arange(n)
                c = (r + first - k) % n
                return dense_rows(n, [((r + 1) % n, length[c], start[c], start[c])], reduce=reduce)
            phases.append(ph)
        return phases

    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        return self._pass(ctx, table, -1, True)

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        return self._pass(ctx, table, 0, False)
