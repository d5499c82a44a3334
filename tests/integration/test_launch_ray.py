"""``python -m launchers.ray`` on Ray Train and Tune: same results as torchrun, a sweep as
Tune trials, failures name the rank, bad input; a Ray-native loop on ``gaudi_trainer``.

The jobs share one local Ray (started once, in this process) that the launcher joins with
``--address``; the embedded-Ray path runs in ``test_gaudi_scripts.py`` (the Gaudi MNIST script).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from launchers.ray_train import RayJobConfig
from launchers.sweep import format_table, parse_sweep, summary_columns, sweep_argv
from launchers.target import Target

from tests.integration.launch_helpers import TINY, assert_all_gone as _assert_all_gone
from tests.integration.launch_helpers import assert_no_new_shm as _assert_no_new_shm, rank_pids as _rank_pids
from tests.integration.launch_helpers import Background, run as _run, shm_names as _shm_names
from tests.integration.launch_helpers import free_port, torchrun_cmd as _torchrun_cmd


def _ray_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "launchers.ray", "--cpus-per-worker", "0.5", *args]


def _ray_env() -> dict[str, str]:
    # a driver joining by address uses token authentication only when told (Ray >= 2.5x)
    return {"RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]} if "RAY_AUTH_MODE" in os.environ else {}


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _run(_ray_cmd(*args), timeout, _ray_env())


@pytest.fixture(scope="module")
def ray_installed() -> None:
    pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray for this module's jobs; its GCS address. 4 "HPU" and 3 logical CPUs: two
    2-worker jobs at once (a sweep's two trials side by side, each 2 x 0.5 CPU for its workers
    and 0.05 for its trial driver)."""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]: pip install -e '.[ray]'")
    with pytest.MonkeyPatch.context() as mp:
        from launchers.ray_cluster import RAY_TRAIN_DEFAULTS, prestart_train_coordinator, worker_runtime_env

        for key, value in RAY_TRAIN_DEFAULTS.items():
            mp.setenv(key, value)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                               os.environ.get("PYTHONPATH")])))
        import ray

        ctx = ray.init(num_cpus=3, resources={"HPU": 4}, include_dashboard=False, log_to_driver=False,
                       runtime_env=worker_runtime_env())
        prestart_train_coordinator(ray)  # as launchers.ray's embedded Ray does
        try:
            yield ctx.address_info["gcs_address"]
        finally:
            ray.shutdown()


# --- pure parts: no Ray needed ---------------------------------------------------------


def test_sweep_specs_expand_to_the_product() -> None:
    """KEY=V1,V2 axes are swept as their product, in order."""
    assert parse_sweep(["bucket_cap_mb=1,4", "--static-graph=a"]) == [
        {"bucket_cap_mb": "1", "static-graph": "a"},
        {"bucket_cap_mb": "4", "static-graph": "a"},
    ]
    assert sweep_argv(("--epochs", "1"), {"bucket_cap_mb": "4"}) == (
        "--epochs", "1", "--bucket-cap-mb", "4")


@pytest.mark.parametrize("spec", ["bucket_cap_mb", "=1,2", "bucket_cap_mb=", "k=,"])
def test_bad_sweep_spec_is_rejected(spec: str) -> None:
    """A sweep without key or values is a ValueError quoting it."""
    with pytest.raises(ValueError, match="--sweep"):
        parse_sweep([spec])


def test_table_formats() -> None:
    """Markdown and CSV tables keep columns in first-seen order; missing cells are empty."""
    rows = [{"bucket_cap_mb": "1", "status": "ok", "t": 0.5}, {"bucket_cap_mb": "4", "status": "failed: x"}]
    assert format_table(rows, "csv") == "bucket_cap_mb,status,t\n1,ok,0.5\n4,failed: x,\n"
    assert format_table(rows, "markdown").splitlines()[:2] == [
        "| bucket_cap_mb | status | t |", "|---|---|---|"]


def test_summary_columns_default_to_numbers_and_final() -> None:
    """Default columns: top-level numbers and models.train's ``final`` numbers; or dotted paths."""
    summary = {"x": 1, "name": "n", "ok": True, "final": {"sim_total_ns": 7, "note": "a"},
               "epochs": [{"loss": 0.5}]}
    assert summary_columns(summary, None) == {"x": 1, "final.sim_total_ns": 7}
    assert summary_columns(summary, ["epochs.-1.loss", "final.missing"]) == {
        "epochs.-1.loss": 0.5, "final.missing": None}


@pytest.mark.parametrize(("field", "value"), [
    ("num_workers", 0), ("cpus_per_worker", 0.0), ("timeout_s", -1.0), ("placement_timeout_s", 0.0)])
def test_job_config_validates(field: str, value: float) -> None:
    """Zero workers, CPUs or timeouts are rejected with the flag's name."""
    kwargs = {"target": Target(name="x.py", is_module=False), "num_workers": 2, field: value}
    with pytest.raises(ValueError, match=field.split("_s")[0].replace("_", "-")):
        RayJobConfig(**kwargs)


def test_bridge_starts_at_the_targets_first_emulator_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``hpu_runtime`` imported elsewhere (by Ray), the training thread gets the bridge at
    its first import of the emulator, not before (a gloo target never pays for it), once; the
    import machinery is restored."""
    import builtins
    import threading
    import types

    from launchers.ray_train import bridge_on_first_import

    calls: list[int] = []
    fake = types.ModuleType("hpu_runtime")
    fake.activate = lambda: calls.append(threading.get_ident())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hpu_runtime", fake)
    original = builtins.__import__
    with bridge_on_first_import():
        import collections.abc  # noqa: F401
        thread = threading.Thread(target=lambda: __import__("hpu_runtime"))
        thread.start()
        thread.join()
        assert calls == []  # not this thread's import
        import hpu_runtime  # noqa: F401
        import hpu_runtime  # noqa: F401,F811
        assert calls == [threading.get_ident()]
    assert builtins.__import__ is original


# --- bad input on the command line (fast: fails before a cluster exists) ---------------


@pytest.mark.timeout(60)
def test_zero_workers_is_a_usage_error() -> None:
    """--num-workers 0 exits 2 with a message naming the flag and the range."""
    proc = _ray("--num-workers", "0", TINY)
    assert proc.returncode == 2
    assert "argument --num-workers: 0 is not in [1, 65,536] ranks" in proc.stderr


@pytest.mark.timeout(60)
def test_unreachable_address_fails_fast(ray_installed: None) -> None:
    """An --address nobody listens on is reported at once, without starting anything."""
    port = free_port()  # closed again: nothing listens
    proc = _ray("--num-workers", "2", "--address", f"127.0.0.1:{port}", TINY, timeout=60)
    assert proc.returncode == 2
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in proc.stderr


@pytest.mark.timeout(60)
def test_missing_ray_says_what_to_install() -> None:
    """Without Ray the launcher exits 2 and names the extra to install."""
    code = ("import sys; sys.modules['ray'] = None; from launchers.ray import main; "
            f"sys.exit(main(['--num-workers', '2', {TINY!r}]))")
    proc = _run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 2
    assert "pip install -e '.[ray]'" in proc.stderr


# --- real jobs on the module's Ray ------------------------------------------------------


def _failed_lines(stderr: str) -> str:
    """The launcher's verdict lines (Ray's own log lines follow them and fill the tail)."""
    return "\n".join(line for line in stderr.splitlines() if "job failed" in line) or stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_failing_jobs_end_naming_the_rank_the_timeout_or_the_resource(ray_address: str) -> None:
    """Three failing jobs, side by side on the module's Ray (a job under Ray mostly waits on
    Ray's start-up, so they overlap; 2 + 2 of its 4 "HPU", the third can never be placed):

    - SIGKILL of rank 1's worker mid-run (hccl): exit 1, rank 1 named as dead, no worker process
      or shared-memory segment left (hccl's: the job starts no MPI, and an mpiexec test may run
      beside it);
    - a job still running at ``--timeout`` ends there (each rank's watchdog) with exit 1 and the
      ranks named (both, or the first Ray Train saw die), not after its 300 steps of 1 s; on a
      machine so loaded that its workers had not started by then (no watchdog runs), the
      driver's backstop ends it later with the same verdict (a CI run once saw exactly that);
    - 5 workers on a cluster with 4 "HPU" (and CPUs for 6 workers): exit 2 within the
      placement timeout, naming the resource to add. (The fifth worker can never be placed:
      any placement timeout ends the same way, so the shortest allowed keeps the test short.)

    The torchrun-equal success path runs on an embedded Ray in ``test_gaudi_scripts.py``."""
    shm_before = _shm_names(("hccl_",))
    kill = _ray_cmd("--address", ray_address, "--num-workers", "2", "--timeout", "240", TINY, "--backend", "hccl",
                    "--die-rank", "1", "--die-mode", "kill", "--steps", "50")
    overrun = _ray_cmd("--address", ray_address, "--num-workers", "2", "--timeout", "20", TINY, "--steps", "300",
                       "--step-sleep", "1")
    unplaceable = _ray_cmd("--address", ray_address, "--num-workers", "5", "--placement-timeout", "1", TINY)
    with Background(kill, timeout=280, env=_ray_env()) as killed, \
            Background(overrun, timeout=220, env=_ray_env()) as late, \
            Background(unplaceable, timeout=220, env=_ray_env()) as too_many:
        proc = killed.result()
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert re.search(r"job failed: rank 1 died", proc.stderr), _failed_lines(proc.stderr)
        pids = _rank_pids(proc.stderr)
        assert sorted(pids) == [0, 1]
        _assert_all_gone(list(pids.values()))

        proc = late.result()
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert re.search(r"job failed: ranks \[[01, ]+\] did not finish within --timeout 20 s", proc.stderr), \
            proc.stderr[-3000:]
        _assert_all_gone(list(_rank_pids(proc.stderr).values()))

        proc = too_many.result()
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "cannot start 5 workers" in proc.stderr and "within 1 s" in proc.stderr and '"HPU"' in proc.stderr
    _assert_no_new_shm(shm_before, prefixes=("hccl_",))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_of_models_train_matches_torchrun(ray_address: str, tmp_path: Path) -> None:
    """A bucket_cap_mb sweep (2 Tune trials, side by side on the module's 4 "HPU") writes one
    table in sweep order; its default-bucket row has torchrun's loss, accuracy and simulated
    time. (The torchrun reference runs while the sweep's driver, Tune and the trials start.)"""
    pytest.importorskip("ray.tune")
    job = ["-m", "models.train", "--epochs", "1", "--max-steps", "3", "--backend", "hccl"]
    ref = tmp_path / "torchrun.json"
    table = tmp_path / "sweep.csv"
    with Background(_torchrun_cmd(2, *job, "--summary", str(ref)), timeout=150) as reference:
        proc = _ray("--address", ray_address, "--num-workers", "2", "--sweep", "bucket_cap_mb=0.001,25",
                    "--sweep-table", str(table), *job, timeout=270)
        assert proc.returncode == 0, proc.stderr[-3000:]
        proc = reference.result()
        assert proc.returncode == 0, proc.stderr[-3000:]
    header, *rows = [line.split(",") for line in table.read_text().splitlines()]
    records = [dict(zip(header, row, strict=True)) for row in rows]
    assert header[:4] == ["bucket_cap_mb", "status", "startup_s", "wall_s"]
    assert [r["bucket_cap_mb"] for r in records] == ["0.001", "25"]
    assert all(r["status"] == "ok" for r in records)
    final = json.loads(ref.read_text())["final"]
    default = records[1]
    assert int(default["final.sim_total_ns"]) == final["sim_total_ns"]
    assert float(default["final.train_loss"]) == pytest.approx(final["train_loss"], rel=1e-5)
    assert float(default["final.test_accuracy"]) == pytest.approx(final["test_accuracy"], rel=1e-5)
    assert int(records[0]["final.ddp_buckets"]) > int(default["final.ddp_buckets"])


# --- a Ray-native loop: Ray Train creates the hccl group ----------------------------------

_STEPS, _LR, _PER_RANK = 4, 0.5, 16


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data[:2 * _PER_RANK * _STEPS] / 16.0, dtype=torch.float32), torch.tensor(
        d.target[:2 * _PER_RANK * _STEPS])


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _ray_native_loop(config: dict) -> None:
    """Ray's Gaudi recipe: get_device() and prepare_model(); no init_process_group here."""
    import tempfile

    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    import habana_frameworks.torch.core as htcore

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(_net())
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    x, y = _digits()
    for step in range(_STEPS):
        rows = slice((2 * step + rank) * _PER_RANK, (2 * step + rank + 1) * _PER_RANK)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rows].to(device)), y[rows].to(device)).backward()
        htcore.mark_step()
        opt.step()
        htcore.mark_step()
    params = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    record = {"device": str(device), "backend": dist.get_backend(), "world": world,
              "group": type(dist.distributed_c10d._get_default_group()).__name__, "params": params.tolist()}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(record))
        ray.train.report({"rank": rank}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gaudi_trainer_runs_rays_gaudi_recipe(ray_address: str, tmp_path: Path) -> None:
    """``gaudi_trainer`` (HPU per worker, ``TorchConfig(backend="hccl")``): the loop gets
    device ``hpu`` and Ray's hccl group, and 2-rank DDP equals one-process SGD on the union
    of the shards."""
    from ray.train import RunConfig

    from launchers.ray_train import gaudi_trainer

    trainer = gaudi_trainer(_ray_native_loop, num_workers=2, run_config=RunConfig(storage_path=str(tmp_path)))
    result = trainer.fit()
    with result.checkpoint.as_directory() as d:
        ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert (r["device"], r["backend"], r["group"], r["world"]) == ("hpu", "hccl", "ProcessGroupHCCL", 2)
    assert ranks[0]["params"] == ranks[1]["params"]
    net, (x, y) = _net(), _digits()
    opt = torch.optim.SGD(net.parameters(), lr=_LR)
    for step in range(_STEPS):
        opt.zero_grad()
        halves = [slice((2 * step + r) * _PER_RANK, (2 * step + r + 1) * _PER_RANK) for r in range(2)]
        (sum(torch.nn.functional.cross_entropy(net(x[s]), y[s]) for s in halves) / 2).backward()
        opt.step()
    ref = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    np.testing.assert_allclose(ranks[0]["params"], ref, rtol=1e-5, atol=1e-6)
