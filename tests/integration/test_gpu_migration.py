"""A DDP script written for NVIDIA GPUs (``tests/integration/scripts/cuda_ddp.py``: cuda
devices, ``.cuda()``, ``torch.cuda.*``, "nccl", autocast and GradScaler on "cuda"), run
unmodified with ``PT_HPU_GPU_MIGRATION=1`` under torchrun: it trains on the simulated Gaudi
over hccl and ends where the same script ends on the CPU over gloo (no CUDA here, so the
script takes its CPU branch). (Its ``--compile`` run, DDP under ``torch.compile`` with the
default backend, equals gloo too; kept out of the suite for time: the mapping of the default
backend is checked in tests/unit/test_gpu_migration.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.launch_helpers import run, torchrun_cmd

SCRIPT = "tests/integration/scripts/cuda_ddp.py"


def _train(tmp: Path, name: str, *args: str, **env: str) -> list[dict]:
    proc = run(torchrun_cmd(2, SCRIPT, str(tmp / name), *args), timeout=150, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((tmp / f"{name}.{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cuda_ddp_script_trains_on_the_simulated_gaudi_and_equals_gloo(tmp_path: Path) -> None:
    gloo = _train(tmp_path, "gloo")
    hpu = _train(tmp_path, "hpu", PT_HPU_GPU_MIGRATION="1", GPU_MIGRATION_LOG_LEVEL="1",
                 HABANA_LOGS=str(tmp_path / "logs"))
    assert gloo[0]["cuda"] is False and gloo[0]["backend"] == "gloo"
    first = hpu[0]
    assert first["cuda"] is True and first["backend"] == "nccl"  # as the GPU code expects it
    assert first["group_backend"] == "hccl"
    assert first["param_device"] == "hpu:0" and first["device_name"].startswith("GAUDI")
    assert first["max_memory_allocated"] > 0  # the simulated card's HBM
    assert hpu[0]["params"] == hpu[1]["params"]  # DDP kept the replicas equal
    assert first["params"] == gloo[0]["params"] and first["losses"] == gloo[0]["losses"]
    assert first["accuracy"] == gloo[0]["accuracy"] > 0.5
    # each rank's migration log names the conversion
    logs = list((tmp_path / "logs" / "gpu_migration_logs").glob("gpu_migration_*.log"))
    rank_logs = [p.read_text() for p in logs if "cuda_ddp.py" in p.read_text()]
    assert len(rank_logs) == 2
    assert all("[hpu_match]: backend=nccl --> backend=hccl" in text for text in rank_logs)
