"""``torch.compile(DDP(model))`` over "hccl" trains as over gloo, with DDPOptimizer's graph breaks.

Reference: the same script over gloo with dynamo's plain ``eager`` backend. Before the fix
(hccl/_opaque.py) the hccl run stopped at the second iteration with dynamo's
``UnsafeScriptObjectError`` on ``ProcessGroupHCCL._check`` (DDP's bucket rebuild broadcasts
from the C++ reducer, and dynamo tried to compile our Python ``broadcast``).
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks

STEPS = 3


def _train(rank, world, compile_backend, compiled_autograd=False):
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hpu_runtime as hpu

    os.environ["PT_HPU_LAZY_MODE"] = "0"  # compile mode: eager outside the compiled regions
    dev = hpu.reset_device("gaudi2")
    torch._dynamo.reset()
    if compiled_autograd:  # before DDP is built: it picks its Python reducer then
        from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd

        enable_compiled_autograd()

    class Net(nn.Module):  # dynamo traces a module of ours, not a bare nn.Sequential
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                      nn.Linear(512, 4))

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    model = Net().to("hpu")
    ddp = DDP(model, bucket_cap_mb=1)  # 1.07 MB of gradients: two buckets, two graph pieces
    step = torch.compile(ddp, backend=compile_backend)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i in range(STEPS):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * rank + i))
        dev.graph_log = []
        loss = step(x.to("hpu")).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        hpu.mark_step()
        opt.step()
        hpu.mark_step()
        losses.append(loss.item())
    out = {"params": [p.detach().tolist() for p in model.parameters()], "losses": losses}
    if dist.get_backend() == "hccl":
        graphs = [(g.reason, g.start_ns, g.start_ns + g.device_ns) for g in dev.graph_log]
        allreduces = [(c.start_ns, c.end_ns) for c in dist.group.WORLD.history if c.kind == "allreduce"]
        out["graphs"] = graphs
        out["last_allreduces"] = allreduces[-2:]
    return out


@pytest.fixture(scope="module")
def gloo_reference():
    return run_ranks(_train, 2, "eager", backend="gloo", timeout=200)


def _assert_same_training(ours, ref):
    import torch

    for mine, theirs in zip(ours, ref):
        assert mine["losses"] == pytest.approx(theirs["losses"], rel=1e-5)
        for p, q in zip(mine["params"], theirs["params"]):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q))


@pytest.mark.timeout(240)
def test_compiled_ddp_over_hccl_equals_gloo_with_bucket_breaks(gloo_reference):
    """Parameters after 3 SGD steps on 2 ranks equal gloo's with dynamo's ``eager`` backend;
    DDPOptimizer split the graph at the bucket boundary (two forward and two backward
    regions per step), and the first bucket's allreduce starts before the last backward
    region ends (it overlaps backward, as on Gaudi)."""
    ours = run_ranks(_train, 2, "hpu_backend", timeout=200)
    _assert_same_training(ours, gloo_reference)
    graphs = ours[0]["graphs"]
    forward = [g for g in graphs if g[0] == "torch.compile forward"]
    backward = [g for g in graphs if g[0] == "torch.compile backward"]
    assert len(forward) == len(backward) == 2
    first_bucket_start = min(s for s, _ in ours[0]["last_allreduces"])
    assert first_bucket_start < backward[-1][2]


@pytest.mark.timeout(240)
def test_compiled_autograd_ddp_over_hccl_equals_gloo(gloo_reference):
    """With Gaudi's ``enable_compiled_autograd()`` DDP runs its Python reducer: each gradient's
    allreduce is a functional collective inside the compiled backward (which it cuts, as a
    collective launches the graph producing its input). Same parameters as gloo's run."""
    ours = run_ranks(_train, 2, "hpu_backend", True, timeout=200)
    _assert_same_training(ours, gloo_reference)
    reasons = [g[0] for g in ours[0]["graphs"] if g[0] != "eager"]
    assert reasons[0] == "torch.compile forward" and reasons[-1] == "torch.compile backward"
    assert reasons.count("collective") == 6  # one allreduce per parameter (6), inside backward
