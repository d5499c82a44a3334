"""torchrun: two "hosts" on this machine form one job; a killed rank fails the job cleanly."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.launch_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "integration" / "scripts" / "tiny_ddp.py")




def _torchrun_args(nnodes: int, nproc: int, port: int) -> list[str]:
    if nnodes == 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}",
    ]


def _run_nodes(nnodes: int, nproc: int, target: list[str], timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Start ``nnodes`` torchrun agents (one per emulated host) and wait for all of them."""
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(_torchrun_args(nnodes, nproc, port) + target, cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(nnodes)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_node_torchrun_is_one_job(tmp_path):
    """2 nodes x 2 ranks = the 4-rank single-node job: same loss and accuracy (float tolerance);
    the simulated timeline charges cross-host traffic on scale-out. (That a timeline is the same
    run after run is tests/distributed/test_ddp.py's.)"""
    single, two = tmp_path / "single.json", tmp_path / "two_node.json"
    (res,) = _run_nodes(1, 4, ["-m", "models.train", "--epochs", "1", "--max-steps", "6", "--summary", str(single)])
    assert res.returncode == 0, res.stderr[-3000:]
    for r in _run_nodes(2, 2, ["-m", "models.train", "--epochs", "1", "--max-steps", "6", "--summary", str(two)]):
        assert r.returncode == 0, r.stderr[-3000:]
    one, both = json.loads(single.read_text()), json.loads(two.read_text())
    assert both["config"]["world_size"] == 4
    e1, e2 = one["epochs"][0], both["epochs"][0]
    assert e2["train_loss"] == pytest.approx(e1["train_loss"], rel=1e-5)
    assert e2["test_accuracy"] == pytest.approx(e1["test_accuracy"], abs=1e-6)
    # two hosts = two boxes: the allreduce crosses the scale-out ports and takes longer
    assert e2["sim_comm_ns_mean"] > e1["sim_comm_ns_mean"]


@pytest.mark.timeout(200)
def test_killed_rank_fails_torchrun_job_naming_it():
    """SIGKILL of rank 1 mid-training: the job exits non-zero naming rank 1, nothing is left behind."""
    before = set(glob.glob("/dev/shm/hccl_*"))
    (res,) = _run_nodes(
        1, 3, [TINY, "--backend", "hccl", "--steps", "50", "--die-rank", "1", "--die-mode", "kill", "--die-at-step", "2"],
        timeout=150,
    )
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "rank     : 1" in text or "rank: 1" in text, text[-3000:]
    assert "Signal 9" in text or "SIGKILL" in text or "exitcode  : -9" in text, text[-3000:]
    assert set(glob.glob("/dev/shm/hccl_*")) <= before, "shared-memory segments left behind"
    leftover = subprocess.run(["pgrep", "-f", "tiny_ddp.py --backend hccl --steps 50"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"processes left: {leftover.stdout}"
