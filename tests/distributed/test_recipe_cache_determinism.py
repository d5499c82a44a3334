"""A shared disk recipe cache never makes the simulated timeline depend on timing.

Each rank's compile charges come from the snapshot its disk cache took at open plus its own
compiles (see NOTE [disk recipe cache protocol]), so identical 2-rank DDP jobs give identical
step times under CPU load, whether a peer's recipe files land early or late.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist_utils import run_ranks

ENV = "PT_HPU_RECIPE_CACHE_CONFIG"


def _job(rank: int, world: int) -> dict:
    import hpu_runtime as hpu
    from models.registry import build_model

    dev = hpu.reset_device("gaudi2")
    torch.manual_seed(0)
    ddp = DDP(build_model("mlp", hidden=128).to("hpu"), bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    dev.begin_step()
    steps = []
    for _ in range(3):
        loss = ddp(torch.randn(32, 64, generator=g).to("hpu")).square().mean()
        loss.backward()
        hpu.mark_step()
        opt.step()
        opt.zero_grad()
        t = dev.end_step()
        steps.append((t.step_ns, t.compute_ns, t.comm_ns, t.exposed_comm_ns, t.host_ns,
                      dev.compilations))
    dist.barrier()
    stats = dev.recipes.stats()
    return {"steps": steps, "compilations": dev.compilations, "disk_hits": stats.disk_hits,
            "misses": stats.misses}


def _run(cache_config: str) -> list[dict]:
    return run_ranks(_job, 2, timeout=60, env={ENV: cache_config})


@pytest.mark.timeout(180)
def test_shared_disk_cache_timeline_is_deterministic_under_load(tmp_path):
    """Three jobs on a fresh shared cache (an empty dir; then the same dir, populated by the
    first job but cleared at start; then an empty dir not cleared) give the same per-step
    times on every rank under CPU load; a job on the populated cache compiles nothing."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        fresh = [_run(f"{tmp_path / 'a'},true,1024"),
                 _run(f"{tmp_path / 'a'},true,1024"),  # populated, cleared at start
                 _run(f"{tmp_path / 'b'},false,1024")]  # empty dir, not cleared
        again = _run(f"{tmp_path / 'b'},false,1024")  # populated by the job before
    finally:
        burner.kill()
        burner.wait(timeout=10)
    assert fresh[0] == fresh[1] == fresh[2]
    first = fresh[0]
    assert first[0]["compilations"] > 0 and first[0]["disk_hits"] == 0
    # same graphs on both ranks: same compile counts, step by step
    assert [s[5] for s in first[0]["steps"]] == [s[5] for s in first[1]["steps"]]
    assert all(s[1] > 0 for r in first for s in r["steps"]), "every step computes"
    for rank in again:
        assert rank["compilations"] == 0 and rank["misses"] == 0
        assert rank["disk_hits"] == first[0]["compilations"]
        assert all(s[1] > 0 for s in rank["steps"])
        # recipes from disk charge the device time the first job charged
        assert [s[1] for s in rank["steps"]] == [s[1] for s in first[0]["steps"]]
    # no compile charged: each step is no longer than in the fresh job
    assert all(s2[0] <= s1[0] for s1, s2 in zip(first[0]["steps"], again[0]["steps"]))
