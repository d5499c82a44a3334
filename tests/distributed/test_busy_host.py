"""Four ranks and a CPU-bound process on a machine with fewer cores: the waits that sleep in the
kernel (NOTE [futex doorbells] in hccl/transport/futex.py) still deliver every byte in order.
A correctness test; the speed under load is measured by ``python -m hccl.tools.bench_transport
--load 1``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks


def _data(rank: int, case: int, numel: int) -> np.ndarray:
    return np.random.default_rng(100 * case + rank).standard_normal(numel).astype(np.float32)


def _busy_collectives(rank: int, world: int) -> list[str]:
    failures = []
    for case, numel in enumerate([5, 3_000, 70_000, 300_000] * 2):  # one-round, p2p-sized, sliced paths
        t = torch.from_numpy(_data(rank, case, numel))
        dist.all_reduce(t)
        ref = np.sum([_data(r, case, numel).astype(np.float64) for r in range(world)], axis=0)
        if not np.allclose(t.numpy(), ref, rtol=1e-5, atol=1e-4):
            failures.append(f"allreduce n={numel} case {case}")
        outs = [torch.empty(numel) for _ in range(world)]
        dist.all_gather(outs, torch.from_numpy(_data(rank, case, numel)))
        if any(not np.array_equal(o.numpy(), _data(r, case, numel)) for r, o in enumerate(outs)):
            failures.append(f"all_gather n={numel} case {case}")
        t = torch.from_numpy(_data(rank, case, numel))
        dist.broadcast(t, src=case % world)
        if not np.array_equal(t.numpy(), _data(case % world, case, numel)):
            failures.append(f"broadcast n={numel} case {case}")
        got = torch.empty(numel)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.from_numpy(_data(rank, case, numel)), nxt),
                                         dist.P2POp(dist.irecv, got, prv)]):
            w.wait()
        if not np.array_equal(got.numpy(), _data(prv, case, numel)):
            failures.append(f"isend/irecv ring n={numel} case {case}")
    return failures


@pytest.mark.timeout(240)
def test_four_ranks_beside_a_busy_process_match_numpy():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        res = run_ranks(_busy_collectives, 4, timeout=220, env={"HCCL_SHM_BUFFER_MB": "0.25"})
    finally:
        busy.kill()
        busy.wait()
    failures = [f for r in res for f in r]
    assert not failures, failures[:10]
