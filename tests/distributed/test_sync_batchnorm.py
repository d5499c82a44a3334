"""``torch.nn.SyncBatchNorm`` on hpu tensors (NOTE [SyncBatchNorm's kernels] in
hpu_runtime/bridge/sync_batchnorm.py): 2 ranks under DDP against BatchNorm of the whole batch in
one process (torch's CPU kernels), which is what synchronized statistics compute."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks


def _ddp_sync_bn(rank, world):
    import logging

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import habana_frameworks.torch.core as htcore

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("hpu_runtime").addHandler(handler)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    net[1].weight.data.uniform_(0.5, 1.5)
    net[1].bias.data.uniform_(-0.5, 0.5)
    ddp = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(net).to("hpu"))
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(2):  # two steps: the second normalises with running statistics updated once
        x = torch.randn(4 * world, 3, 6, 6, generator=g) * 2 + 1
        dy = torch.randn(4 * world, 4, 4, 4, generator=g)
        mine = slice(4 * rank, 4 * (rank + 1))
        xr = x[mine].to("hpu").requires_grad_()
        y = ddp(xr)
        (y * dy[mine].to("hpu")).sum().backward()
        htcore.mark_step()
        bn = ddp.module[1]
        got = {"y": y.detach(), "dx": xr.grad, "dw": bn.weight.grad, "db": bn.bias.grad,
               "conv_dw": ddp.module[0].weight.grad, "rm": bn.running_mean, "rv": bn.running_var}
        out.append({k: v.cpu().tolist() for k, v in got.items()})  # lists: tensors do not outlive the rank
        ddp.zero_grad()
    return out, warnings


def _reference(world):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    net[1].weight.data.uniform_(0.5, 1.5)
    net[1].bias.data.uniform_(-0.5, 0.5)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(2):
        x = torch.randn(4 * world, 3, 6, 6, generator=g) * 2 + 1
        dy = torch.randn(4 * world, 4, 4, 4, generator=g)
        x.requires_grad_()
        y = net(x)
        (y * dy).sum().backward()
        bn = net[1]
        # DDP averages the ranks' gradients: the whole batch's gradient / world
        out.append({"y": y.detach(), "dx": x.grad, "dw": bn.weight.grad / world, "db": bn.bias.grad / world,
                    "conv_dw": net[0].weight.grad / world, "rm": bn.running_mean.clone(),
                    "rv": bn.running_var.clone()})
        net.zero_grad()
    return out


@pytest.mark.timeout(120)
def test_sync_batchnorm_under_ddp_equals_batchnorm_of_the_whole_batch():
    """Forward output, running mean and variance, input gradient and the BatchNorm and conv
    weights' DDP-averaged gradients equal one process's BatchNorm over both ranks' batches, for
    two steps; the bridge charges the five ops without a warning."""
    import torch

    world = 2
    ref = _reference(world)
    for rank, (steps, warnings) in enumerate(run_ranks(_ddp_sync_bn, world)):
        assert not warnings, warnings
        for step, (mine, want) in enumerate(zip(steps, ref)):
            rows = slice(4 * rank, 4 * (rank + 1))
            for key in mine:
                expected = want[key][rows] if key in ("y", "dx") else want[key]
                torch.testing.assert_close(torch.tensor(mine[key]), expected, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, key=key, step=step: f"rank {rank} step {step} {key}: {m}")
