"""DeepSpeed on the simulated Gaudi, as Gaudi users run it: its own launcher (``deepspeed
--num_gpus 2``), its HPU accelerator, its HPU ``FusedAdam`` (``torch.ops.hpu.optimizer_adamw``),
ZeRO-1 and ZeRO-3 over "hccl".

Reference: the same script over gloo (DeepSpeed's collectives moved by torch's own backend):
parameters and losses equal exactly; both ranks end with the same parameters.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.integration.launch_helpers import free_port, run

pytest.importorskip("deepspeed")
SCRIPT = "tests/integration/scripts/deepspeed_zero.py"


def _deepspeed(tmp_path, stage: int, backend: str) -> list[dict]:
    out = tmp_path / f"zero{stage}_{backend}"
    # DeepSpeed's launcher as a module: what its `deepspeed` console script calls, found wherever pip
    # put that script (a venv over system site packages has the module but not the script)
    proc = run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                str(free_port()), SCRIPT, str(out), str(stage), backend], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _max_diff(a: dict, b: dict) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a["params"], b["params"], strict=True))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", [3])  # ZeRO-1: tests/integration/test_optimum_habana.py, through GaudiTrainer
def test_zero_over_hccl_equals_gloo_with_the_hpu_fused_adam(tmp_path, stage: int) -> None:
    hccl = _deepspeed(tmp_path, stage, "hccl")
    gloo = _deepspeed(tmp_path, stage, "gloo")
    first = hccl[0]
    assert (first["accelerator"], first["device"], first["backend"]) == ("hpu", "hpu", "hccl"), first
    assert first["basic_optimizer"] == "FusedAdam"
    assert first["optimizer"] == ("DeepSpeedZeroOptimizer" if stage == 1 else "DeepSpeedZeroOptimizer_Stage3")
    assert first["fused_adamw_kernels"] == 4  # one fused kernel per optimizer step (8 micro-steps, 2 each)
    assert first["simulated_ns"] > 0
    assert _max_diff(hccl[0], hccl[1]) == 0.0
    assert _max_diff(hccl[0], gloo[0]) == 0.0 and hccl[0]["losses"] == gloo[0]["losses"]
    assert first["losses"][-1] < first["losses"][0]
