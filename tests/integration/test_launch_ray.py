"""``python -m launchers.ray``: same results as torchrun, sweeps, failures name the rank, bad input."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.ray import RayJobConfig
from launchers.sweep import format_table, parse_sweep, summary_columns, sweep_argv
from launchers.target import Target

from tests.integration.launch_helpers import TINY, assert_all_gone as _assert_all_gone
from tests.integration.launch_helpers import assert_no_new_shm as _assert_no_new_shm, rank_pids as _rank_pids
from tests.integration.launch_helpers import run as _run, shm_names as _shm_names, torchrun as _torchrun


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "launchers.ray", "--cpus-per-worker", "0.5", *args], timeout)


@pytest.fixture(scope="module")
def ray_installed() -> None:
    pytest.importorskip("ray")


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


@pytest.mark.parametrize(
    ("field", "value"), [("num_workers", 0), ("cpus_per_worker", 0.0), ("timeout_s", -1.0)])
def test_job_config_validates(field: str, value: float) -> None:
    """Zero workers, CPUs or timeout are rejected with the flag's name."""
    kwargs = {"target": Target(name="x.py", is_module=False), "num_workers": 2, field: value}
    with pytest.raises(ValueError, match=field.split("_s")[0].replace("_", "-")):
        RayJobConfig(**kwargs)


# --- bad input on the command line (fast: fails before a cluster exists) ---------------


@pytest.mark.timeout(60)
def test_zero_workers_is_a_usage_error() -> None:
    """--num-workers 0 exits 2 with a message naming the flag."""
    proc = _ray("--num-workers", "0", TINY)
    assert proc.returncode == 2
    assert "--num-workers must be at least 1" in proc.stderr


@pytest.mark.timeout(60)
def test_unreachable_address_fails_fast(ray_installed: None) -> None:
    """An --address nobody listens on is reported at once, without starting anything."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens
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


# --- real jobs on an embedded Ray ------------------------------------------------------


@pytest.mark.timeout(180)
def test_ray_gives_torchruns_parameters(ray_installed: None, tmp_path: Path) -> None:
    """Same tiny job on 2 actors (runpy path) ends with bitwise torchrun's parameters."""
    ref = tmp_path / "torchrun.json"
    proc = _torchrun(2, TINY, "--out", str(ref))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, summary = tmp_path / "ray.json", tmp_path / "summary.json"
    proc = _ray("--num-workers", "2", "--summary", str(summary), TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["params"] == json.loads(ref.read_text())["params"]
    per_rank = json.loads(summary.read_text())["per_rank"]
    assert [(r["rank"], r["local_rank"]) for r in per_rank] == [(0, 0), (1, 1)]
    assert "tiny_ddp rank=1 world=2" in proc.stdout  # the actors' output reaches the driver
    _assert_all_gone(list(_rank_pids(proc.stderr).values()))


@pytest.mark.timeout(180)
def test_killed_actor_fails_the_job_naming_the_rank(ray_installed: None) -> None:
    """SIGKILL of rank 1's actor mid-run (hccl): exit 1, rank 1 named as dead, no actor
    process or shared-memory segment left."""
    shm_before = _shm_names()
    started = time.monotonic()
    proc = _ray("--num-workers", "2", "--timeout", "60", TINY, "--backend", "hccl",
                "--die-rank", "1", "--die-mode", "kill", "--steps", "50")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(r"job failed: rank 1 died", proc.stderr), proc.stderr[-3000:]
    assert time.monotonic() - started < 90
    pids = _rank_pids(proc.stderr)
    assert sorted(pids) == [0, 1]
    _assert_all_gone(list(pids.values()))
    _assert_no_new_shm(shm_before)


@pytest.mark.timeout(240)
def test_sweep_of_models_train_matches_torchrun(ray_installed: None, tmp_path: Path) -> None:
    """A bucket_cap_mb sweep of models.train writes one table; its default-bucket row has
    torchrun's loss, accuracy and simulated time."""
    pytest.importorskip("models.train")
    job = ["-m", "models.train", "--epochs", "1", "--max-steps", "3", "--backend", "hccl"]
    ref = tmp_path / "torchrun.json"
    proc = _torchrun(2, *job, "--summary", str(ref))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = tmp_path / "sweep.csv"
    proc = _ray("--num-workers", "2", "--sweep", "bucket_cap_mb=0.001,25",
                "--sweep-table", str(table), *job, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, *rows = [line.split(",") for line in table.read_text().splitlines()]
    records = [dict(zip(header, row, strict=True)) for row in rows]
    assert [r["bucket_cap_mb"] for r in records] == ["0.001", "25"]
    assert all(r["status"] == "ok" for r in records)
    final = json.loads(ref.read_text())["final"]
    default = records[1]
    assert int(default["final.sim_total_ns"]) == final["sim_total_ns"]
    assert float(default["final.train_loss"]) == pytest.approx(final["train_loss"], rel=1e-5)
    assert float(default["final.test_accuracy"]) == pytest.approx(final["test_accuracy"], rel=1e-5)
