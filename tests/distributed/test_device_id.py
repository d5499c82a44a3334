"""``init_process_group("hccl", device_id=torch.device("hpu", 0))``: the form torch >= 2.3 scripts
use for an eagerly initialised group. Gaudi's hccl backend registers for the hpu device type, so
torch finds it; here the group is its own backend (``ProcessGroupHCCL._get_backend``)."""

from __future__ import annotations

import socket

import pytest

from tests.dist_utils import run_ranks


def _init_with_device_id(rank, world, port):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("hpu", 0), timeout=timedelta(seconds=30))
    pg = dist.group.WORLD
    x = torch.full((3,), float(rank + 1), device="hpu")
    dist.all_reduce(x)
    sub = dist.new_group([0, 1])
    y = torch.ones(2, device="hpu")
    dist.all_reduce(y, group=sub)
    try:
        pg._get_backend(torch.device("cuda"))
        other = None
    except RuntimeError as e:
        other = str(e)
    try:  # torch reads the backend's supports_time_estimate first: declared off, not missing
        with dist.distributed_c10d._time_estimator(group=pg, device=torch.device("hpu", 0)):
            pass
        estimator = None
    except Exception as e:  # noqa: BLE001 - the type is the point
        estimator = type(e).__name__
    return x.tolist(), y.tolist(), pg._get_backend(torch.device("hpu", 0)) is pg, other, estimator


@pytest.mark.timeout(120)
def test_init_process_group_with_an_hpu_device_id():
    """It failed with 'No backend type associated with device type hpu'; now the group
    initialises, reduces (values as by hand), answers torch's backend query for cpu and hpu, and
    declares the optional backend features off (torch's time estimator says it is not supported)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for x, y, itself, other, estimator in run_ranks(_init_with_device_id, 2, port, backend=None):
        assert x == [3.0, 3.0, 3.0] and y == [2.0, 2.0] and itself
        assert other == "No backend type associated with device type cuda"
        assert estimator == "NotImplementedError"  # torch's "not supported", not an AttributeError

