"""Collectives on tensors that require grad work as in gloo (Habana's reduce_tensor, parameter broadcast)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.dist_utils import run_ranks


def _grad_tensors(rank, world):
    import torch
    import torch.distributed as dist

    p = torch.nn.Parameter(torch.full((5,), float(rank + 1)))
    dist.broadcast(p, 1)  # scripts broadcast nn.Parameters
    loss = (p * torch.arange(5.0)).sum()
    reduced = loss.clone()  # Habana's reduce_tensor: all-reduce a clone of the loss
    dist.all_reduce(reduced)
    return p.detach().tolist(), reduced.item(), p.requires_grad, reduced.requires_grad


@pytest.mark.timeout(120)
def test_requires_grad_tensors_as_gloo():
    ours = run_ranks(_grad_tensors, 2)
    ref = run_ranks(_grad_tensors, 2, backend="gloo")
    assert ours == ref
    assert ours[0][0] == [2.0] * 5 and ours[0][1] == pytest.approx(2 * 2.0 * 10)


@pytest.mark.timeout(120)
def test_import_never_breaks_with_a_partial_rank_environment():
    """WORLD_SIZE without RANK (a test harness, a scheduler): ``import torch`` and ``import hccl`` work."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    env["WORLD_SIZE"] = "2"
    proc = subprocess.run([sys.executable, "-c", "import torch, hccl; print('ok')"], capture_output=True,
                          text=True, timeout=100, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
