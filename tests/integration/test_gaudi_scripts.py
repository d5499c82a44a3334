"""Gaudi users' scripts run unmodified: a hello-world-style MNIST script under torchrun,
mpirun and Ray Train (equal to the same script on CPU over gloo), and a Lightning job on
lightning-habana's HPU strategy (equal to plain large-batch SGD)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.launch_helpers import Background, assert_all_gone, rank_pids, run

MNIST = "tests/integration/scripts/gaudi_mnist.py"
LIGHTNING = "tests/integration/scripts/lightning_hpu.py"
MPIEXEC = shutil.which("mpiexec")


def _summaries(prefix: Path, n: int = 2) -> list[dict]:
    return [json.loads(Path(f"{prefix}.{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def mnist_data(tmp_path_factory) -> Path:
    from models.data import write_mnist

    root = tmp_path_factory.mktemp("mnist")
    write_mnist(str(root))
    return root


@pytest.fixture(scope="module")
def gloo_reference(mnist_data: Path, tmp_path_factory) -> list[dict]:
    """The same script without ``--hpu``: CPU tensors, DDP over gloo."""
    out = tmp_path_factory.mktemp("gloo") / "s"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", MNIST,
                "--distributed", "--data-path", str(mnist_data), "--summary", str(out)], timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return _summaries(out)


def _assert_same_training(got: list[dict], ref: list[dict]) -> None:
    for g, r in zip(got, ref):
        assert g["backend"] == "hccl" and r["backend"] == "gloo"
        np.testing.assert_allclose(g["params"], r["params"], rtol=1e-5, atol=1e-6)
        assert g["param_abs_sum"] == pytest.approx(r["param_abs_sum"], rel=1e-5)
        assert g["accuracy"] == pytest.approx(r["accuracy"])
    assert got[0]["params"] == got[1]["params"]  # DDP kept the replicas identical
    assert got[0]["accuracy"] > 0.2  # it learned (chance is 0.1)
    assert got[0]["hbm_max_in_use"] > 0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_mnist_script_under_torchrun_equals_gloo(mnist_data: Path, gloo_reference, tmp_path: Path) -> None:
    out = tmp_path / "s"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", MNIST,
                "--hpu", "--use_lazy_mode", "--distributed", "--data-path", str(mnist_data), "--summary", str(out)],
               timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Test set: Average loss" in proc.stdout
    _assert_same_training(_summaries(out), gloo_reference)


@pytest.mark.timeout(200)
@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec: pip install -e '.[mpi]'")
def test_mnist_script_under_mpirun_equals_gloo(mnist_data: Path, gloo_reference, tmp_path: Path) -> None:
    """Plain ``mpirun -n 2 python script``: importing habana_frameworks.torch.distributed.hccl
    maps the MPI variables, as on Gaudi."""
    out = tmp_path / "s"
    proc = run([MPIEXEC, "-n", "2", sys.executable, MNIST, "--hpu", "--use_lazy_mode", "--distributed",
                "--data-path", str(mnist_data), "--summary", str(out)], timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _assert_same_training(_summaries(out), gloo_reference)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mnist_script_under_ray_equals_gloo(mnist_data: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``python -m launchers.ray --num-workers 2 script`` on an embedded Ray: each Ray Train
    worker runs the script, whose own ``initialize_distributed_hpu()`` and
    ``init_process_group("hccl", rank=, world_size=)`` find the launcher's rendezvous; it ends
    where the script over gloo ends. Every rank saw torchrun's variables (the launcher's
    ``--summary``); the workers' output reaches the driver; no worker process outlives the job.
    (The Ray job starts first: where this process has no gloo reference yet, it is made
    while Ray starts. The launcher's other paths run on a shared Ray in ``test_launch_ray.py``.)"""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]: pip install -e '.[ray]'")
    out, launch_summary = tmp_path / "s", tmp_path / "launch.json"
    with Background([sys.executable, "-m", "launchers.ray", "--num-workers", "2", "--summary", str(launch_summary),
                     MNIST, "--hpu", "--use_lazy_mode", "--distributed", "--data-path", str(mnist_data),
                     "--summary", str(out)], timeout=200) as job:
        gloo_reference = request.getfixturevalue("gloo_reference")
        proc = job.result()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Test set: Average loss" in proc.stdout
    _assert_same_training(_summaries(out), gloo_reference)
    per_rank = json.loads(launch_summary.read_text())["per_rank"]
    assert [(r["rank"], r["local_rank"]) for r in per_rank] == [(0, 0), (1, 1)]
    envs = [r["env"] for r in per_rank]
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"]) for e in envs] == [
        ("0", "2", "2", "127.0.0.1"), ("1", "2", "2", "127.0.0.1")]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert re.search(r"job finished: start-up [\d.]+ s, wall [\d.]+ s", proc.stdout)
    pids = rank_pids(proc.stderr)
    assert sorted(pids) == [0, 1]
    assert_all_gone(list(pids.values()))


def _sgd_reference(lr: float = 0.2, per_rank: int = 32, epochs: int = 2) -> np.ndarray:
    """Plain torch, one process: 2-rank DDP over Lightning's shards equals SGD on their union.

    Lightning gives the train loader a ``DistributedSampler(shuffle=True, seed=0)`` whose
    epoch ``e`` permutation is ``randperm(n, generator seeded 0 + e)``; rank ``r`` takes every
    second index from ``r``. DDP averages the two ranks' mean gradients: the mean over both
    batches."""
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    d = load_digits()
    x = torch.tensor(d.data[:768] / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target[:768])
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for epoch in range(epochs):
        perm = torch.randperm(768, generator=torch.Generator().manual_seed(epoch))
        shards = perm[0::2], perm[1::2]
        for k in range(0, 384, per_rank):
            opt.zero_grad()
            losses = [torch.nn.functional.cross_entropy(net(x[s[k:k + per_rank]]), y[s[k:k + per_rank]])
                      for s in shards]
            (sum(losses) / 2).backward()
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_lightning_hpu_parallel_strategy_two_ranks(tmp_path: Path) -> None:
    pytest.importorskip("lightning_habana")
    out = tmp_path / "lt"
    proc = run([sys.executable, LIGHTNING, "2", str(out)], timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = _summaries(out)
    for r in ranks:
        assert (r["backend"], r["strategy"], r["accelerator"], r["world_size"]) == (
            "hccl", "HPUParallelStrategy", "HPUAccelerator", 2)
        assert r["steps"] == 24 and r["last_loss"] < r["first_loss"]
    assert ranks[0]["params"] == ranks[1]["params"]
    np.testing.assert_allclose(ranks[0]["params"], _sgd_reference(), rtol=1e-4, atol=1e-5)
