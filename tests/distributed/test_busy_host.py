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


def _threads_inside_collectives(rank: int, world: int) -> dict:
    import hccl.transport.shm_engine as eng

    seen, fail = [], []
    combine, combine_out = eng.combine, eng.combine_out

    def spy(orig):
        def run(*args):
            seen.append(torch.get_num_threads())
            if fail:
                raise RuntimeError("injected failure in a reduction")
            return orig(*args)
        return run

    eng.combine, eng.combine_out = spy(combine), spy(combine_out)
    torch.set_num_threads(8)  # the user's own setting, more threads than the transport's share
    t = torch.from_numpy(_data(rank, 0, 300_000))
    dist.all_reduce(t)
    ref = np.sum([_data(r, 0, 300_000).astype(np.float64) for r in range(world)], axis=0)
    after_ok = torch.get_num_threads()
    fail.append(True)
    try:
        dist.all_reduce(torch.ones(300_000))
        raised = False
    except RuntimeError:
        raised = True
    return {"inside": sorted(set(seen)), "after_ok": after_ok, "after_error": torch.get_num_threads(),
            "raised": raised, "numerics": bool(np.allclose(t.numpy(), ref, rtol=1e-5, atol=1e-4))}


@pytest.mark.timeout(120)
def test_a_collective_runs_on_its_share_of_the_cores_and_restores_the_users_threads():
    """NOTE [the transport's threads]: 2 ranks on this host share the cores of their CPU affinity;
    the user's torch.set_num_threads(8) is back after the collective, and after one that raised."""
    import os

    share = min(8, max(1, len(os.sched_getaffinity(0)) // 2))
    res = run_ranks(_threads_inside_collectives, 2, timeout=100)
    for r in res:
        assert r["numerics"]
        assert r["inside"] == [share], r
        assert (r["after_ok"], r["after_error"], r["raised"]) == (8, 8, True), r
