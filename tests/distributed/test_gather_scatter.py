"""dist.gather and dist.scatter over hccl equal gloo's (random non-integer data, world size 3)."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks


def _gather_scatter(rank, world):
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(5, generator=g)
    outs = [torch.zeros(5) for _ in range(world)] if rank == 2 else None
    dist.gather(x, outs, dst=2)
    src = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(world)] if rank == 1 else None
    y = torch.zeros(2, 3)
    dist.scatter(y, src, src=1)
    t = torch.ones(1)
    dist.all_reduce(t)  # the group goes on
    return ([o.tolist() for o in outs] if outs else None), y.tolist(), t.item()


@pytest.mark.timeout(120)
def test_gather_and_scatter_equal_gloo():
    ours = run_ranks(_gather_scatter, 3)
    ref = run_ranks(_gather_scatter, 3, backend="gloo")
    assert ours == ref
    assert ours[2][0] is not None and ours[0][0] is None and ours[0][2] == 3.0
