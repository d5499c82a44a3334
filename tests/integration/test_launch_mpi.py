"""``mpiexec ... python -m launchers.mpi``: same results as torchrun, failures name the rank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec: pip install -e '.[mpi]'")

from tests.integration.launch_helpers import TINY, assert_all_gone as _assert_all_gone
from tests.integration.launch_helpers import assert_no_new_shm as _assert_no_new_shm, rank_pids as _rank_pids
from tests.integration.launch_helpers import run as _run, shm_names as _shm_names, torchrun as _torchrun


def _mpiexec(n: int, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return _run([MPIEXEC, "-n", str(n), sys.executable, "-m", "launchers.mpi", *args], timeout)


@pytest.fixture(scope="module")
def torchrun_params(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Final parameters of the tiny job under torchrun (2 ranks): the reference."""
    out = tmp_path_factory.mktemp("torchrun") / "params.json"
    proc = _torchrun(2, TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["params"]


@pytest.mark.timeout(120)
def test_mpiexec_gives_torchruns_parameters(torchrun_params: list[float], tmp_path: Path) -> None:
    """Same job under mpiexec (script path) ends with bitwise the same parameters."""
    out, summary = tmp_path / "params.json", tmp_path / "summary.json"
    proc = _mpiexec(2, TINY, "--out", str(out), "--summary", str(summary))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["params"] == torchrun_params
    rank0 = json.loads(summary.read_text())
    assert (rank0["rank"], rank0["world_size"], rank0["local_rank"], rank0["local_world_size"]) == (0, 2, 0, 2)
    assert sorted(_rank_pids(proc.stderr)) == [0, 1]


@pytest.mark.timeout(120)
def test_failing_rank_is_named_and_aborts_the_job() -> None:
    """A rank that raises (module target) is named; the job aborts with a non-zero code."""
    shm_before = _shm_names()
    proc = _mpiexec(2, "-m", "tests.integration.scripts.tiny_ddp", "--die-rank", "1", "--die-mode", "raise")
    assert proc.returncode != 0
    assert "rank 1 failed" in proc.stderr
    assert "injected failure on rank 1" in proc.stderr
    _assert_all_gone(list(_rank_pids(proc.stderr).values()))
    _assert_no_new_shm(shm_before)


@pytest.mark.timeout(120)
def test_killed_rank_fails_the_job_and_is_identifiable() -> None:
    """SIGKILL of rank 1 mid-run (hccl): non-zero exit, Hydra's PID maps to rank 1, no
    process or shared-memory segment left."""
    shm_before = _shm_names()
    proc = _mpiexec(2, TINY, "--backend", "hccl", "--die-rank", "1", "--die-mode", "kill", "--steps", "50")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    pids = _rank_pids(proc.stderr)
    # Hydra names the killed process by PID, unless rank 0 saw its peer die first and our
    # launcher aborted the job naming the dead rank (a race under load): either identifies it
    dead = re.search(r"PID (\d+) RUNNING AT", output)
    named = re.search(r"after rank\(s\) \[(\d+)\] died", output)
    assert dead is not None or named is not None, output[-3000:]
    if dead is not None:
        assert int(dead.group(1)) == pids[1]
    else:
        assert int(named.group(1)) == 1
    _assert_all_gone(list(pids.values()))
    _assert_no_new_shm(shm_before)


@pytest.mark.timeout(60)
def test_timeout_aborts_a_hung_job() -> None:
    """--timeout aborts the whole job and says which rank gave up."""
    proc = _mpiexec(2, "--timeout", "3", TINY, "--steps", "100", "--step-sleep", "0.5")
    assert proc.returncode != 0
    assert re.search(r"rank \d: target did not finish within 3 s", proc.stderr)


@pytest.mark.timeout(30)
def test_missing_mpi4py_says_what_to_install() -> None:
    """Without mpi4py the launcher exits 2 and names the extra to install."""
    code = ("import sys; sys.modules['mpi4py'] = None; from launchers.mpi import main; "
            f"sys.exit(main([{TINY!r}]))")
    proc = _run([sys.executable, "-c", code], timeout=30)
    assert proc.returncode == 2
    assert "pip install -e '.[mpi]'" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_models_train_same_summary_as_torchrun(tmp_path: Path) -> None:
    """models.train over hccl: mpiexec and torchrun agree on losses and simulated times."""
    pytest.importorskip("models.train")
    job = ["-m", "models.train", "--epochs", "1", "--max-steps", "4", "--backend", "hccl"]
    summaries = []
    for name, launch in (("torchrun", _torchrun), ("mpi", _mpiexec)):
        path = tmp_path / f"{name}.json"
        proc = launch(2, *job, "--summary", str(path))
        assert proc.returncode == 0, f"{name}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        summaries.append(_comparable(json.loads(path.read_text())))
    assert summaries[0] == summaries[1]


def _comparable(summary: dict) -> dict:
    """The summary without wall-clock figures and paths (which differ run to run)."""
    return {
        "epochs": [{k: v for k, v in e.items() if not k.startswith("wall")} for e in summary["epochs"]],
        "final": {k: v for k, v in summary["final"].items() if not k.startswith("wall")},
    }
