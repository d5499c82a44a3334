"""FSDP2 and tensor parallelism over an "hpu" device mesh ("hccl", hpu tensors) equal the same
jobs on a CPU mesh over gloo, and warn once, naming the row, where Intel's support matrix marks
them unsupported (hpu_runtime.api.support_matrix)."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks


def _device() -> str:
    """The job's device: hpu over hccl, the CPU over gloo (the reference)."""
    import torch.distributed as dist

    return "hpu" if dist.get_backend() == "hccl" else "cpu"


def _fsdp2(rank, world):
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = _device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    mesh = init_device_mesh(device, (world,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = model.state_dict()
    devices = {str(v.device) for v in state.values()} | {str(v.to_local().device) for v in state.values()}
    devices |= {str(v.device) for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)}
    full = {k: v.full_tensor().detach().cpu().numpy() for k, v in state.items()}
    return losses, full, [str(w.message) for w in caught if "support matrix" in str(w.message)], devices


def _tensor_parallel(rank, world):
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device = _device()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).to(device)
    mesh = init_device_mesh(device, (world,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)  # the same batch on every rank, as tensor parallelism needs
    for _ in range(3):
        out = mlp(torch.randn(8, 16, generator=g).to(device))
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
    state = mlp.state_dict()
    devices = {str(v.device) for v in state.values()} | {str(v.to_local().device) for v in state.values()}
    devices |= {str(out.device)} | {str(p.device_mesh.device_type) for p in state.values()}
    full = {k: v.full_tensor().detach().cpu().numpy() for k, v in state.items()}
    return (out.detach().cpu().numpy(), full, [str(w.message) for w in caught if "support matrix" in str(w.message)],
            devices)


@pytest.mark.parametrize("job, rows", [(_fsdp2, ["PyTorch FSDP"]),
                                       (_tensor_parallel, ["PyTorch Tensor Parallel", "PyTorch Dtensor"])])
def test_equal_to_gloo_and_warns_the_matrix_row(job, rows) -> None:
    """Over "hccl" every parameter, its local shard, the optimizer state and the mesh are on hpu;
    the results equal gloo's on a CPU mesh. Tensor parallelism is built on DTensor: both of its
    rows are named, once each."""
    import numpy as np

    hccl = run_ranks(job, 2, timeout=120)
    gloo = run_ranks(job, 2, backend="gloo", timeout=120)
    assert all(r[3] <= {"hpu:0", "hpu"} for r in hccl) and all(r[3] <= {"cpu"} for r in gloo), (hccl[0][3], gloo[0][3])
    for (a0, pa, warned, _), (b0, pb, _, _) in zip(hccl, gloo):
        np.testing.assert_array_equal(np.asarray(a0), np.asarray(b0))
        for k in pa:
            np.testing.assert_array_equal(pa[k], pb[k])
        assert len(warned) == len(rows) and all(f"'{r}'" in w and "lazy mode" in w for r, w in zip(rows, warned))
    assert all(np.array_equal(hccl[0][1][k], hccl[1][1][k]) for k in hccl[0][1])
