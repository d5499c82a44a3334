"""Device work that reads a collective's output never starts before that collective ends."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks


def _quiet_device():
    """Gaudi2 with free compiles: a compile must not hide an ordering bug behind 150 ms of host time."""
    import dataclasses

    import hpu_runtime as hpu

    return hpu.reset_device(dataclasses.replace(hpu.get_device_spec("gaudi2"), compile_base_ns=0,
                                                compile_per_op_ns=0))


def _no_wait(rank, world):
    import torch
    import torch.distributed as dist

    import hpu_runtime as hpu

    dev = _quiet_device()
    t = torch.ones(1 << 22, device="hpu")  # 16 MB: the allreduce takes a while
    hpu.mark_step()
    dist.all_reduce(t, async_op=True)  # the Work is dropped: nobody waits
    end = dist.group.WORLD.last_collective.end_ns
    y = t * 2  # reads the allreduce's output
    start, _ = dev.launch()
    read_from = dev.host_ns
    z = (t + 1).sum().item()  # a host read of a graph over the output
    assert y[0].item() == 2 * world and z == (1 + world) * (1 << 22)
    return start, end, read_from, dev.host_ns


def _ddp_future(rank, world):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import hpu_runtime as hpu
    from hpu_runtime.tools.tracing import training_step

    dev = _quiet_device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to("hpu")
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 256), torch.randint(10, (32,)).to("hpu")  # labels on the card, a host batch
    out = []
    for _ in range(3):
        dev.graph_log = []
        training_step(ddp, (x,), lambda o: F.cross_entropy(o, y), opt)  # DDP waits on futures only
        last_end = max(r.end_ns for r in dist.group.WORLD.history[-2:])
        optimizer_graph = dev.graph_log[-1]
        out.append((optimizer_graph.start_ns, last_end))
        dev.end_step()
    return out


@pytest.mark.timeout(120)
def test_graph_reading_an_unwaited_collective_output_starts_after_it():
    for start, end, _, host_after in run_ranks(_no_wait, 2):
        assert start >= end
        assert host_after >= end


@pytest.mark.timeout(120)
def test_ddp_optimizer_graph_starts_after_the_last_bucket_allreduce():
    """DDP reads its buckets through ``get_future()``, not ``Work.wait()``."""
    for steps in run_ranks(_ddp_future, 2):
        for opt_start, last_end in steps:
            assert opt_start >= last_end
