"""Intel's GPU Migration Toolkit on the simulated Gaudi (:mod:`hpu_runtime.api.gpu_migration`):
what maps to what, checked in fresh interpreters (enabling it changes torch for the process);
the 2-rank CUDA DDP script against gloo is in tests/integration/test_gpu_migration.py."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hpu_runtime.api.gpu_migration import _map_backend, to_hpu_device
from tests.integration.launch_helpers import free_port, run


def _py(code: str, script: Path | None = None, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (launch_helpers' clean environment plus ``env``; from
    the file ``script`` when given); its last stdout line, parsed as JSON."""
    code = textwrap.dedent(code)
    if script is not None:
        script.write_text(code)
    argv = [str(script)] if script is not None else ["-c", code]
    proc = run([sys.executable, *argv], timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cuda_devices_and_nccl_names_map_to_the_card_and_hccl() -> None:
    assert to_hpu_device("cuda") == "hpu" and to_hpu_device("cuda:3") == "hpu"
    assert to_hpu_device(torch.device("cuda", 1)) == "hpu"
    assert to_hpu_device("cpu") == "cpu" and to_hpu_device(torch.device("cpu")) == torch.device("cpu")
    assert to_hpu_device("cudax") == "cudax" and to_hpu_device(0) == 0
    assert _map_backend("nccl") == "hccl" and _map_backend("NCCL") == "hccl"
    assert _map_backend("cuda:nccl,cpu:gloo") == "hpu:hccl,cpu:gloo"
    assert _map_backend("gloo") == "gloo" and _map_backend(None) is None


_PROBE = """
    import json, torch
    out = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count()}
    x = torch.zeros(4, device="cuda")
    y = torch.ones(2, 3).cuda()
    z = torch.randn(3, device=torch.device("cuda", 1)).to("cuda:0")
    w = x.new_ones(2, device="cuda")
    m = torch.nn.Linear(3, 2).cuda()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        a = m(y)
    with torch.cuda.amp.autocast():
        b = m(y)
    legacy = torch.cuda.LongTensor([1, 2])
    with torch.cuda.nvtx.range("step"):
        torch.cuda.nvtx.range_push("x"); torch.cuda.nvtx.range_pop()
    torch.cuda.manual_seed_all(7); r1 = torch.rand(3)
    torch.manual_seed(7); r2 = torch.rand(3)
    torch.cuda.synchronize()
    scalers = [torch.amp.GradScaler("cuda"), torch.cuda.amp.GradScaler(),
               torch.cuda.amp.GradScaler(2.0, 2.0, 0.5, 10, True)]
    loss = m(y).sum()
    out.update(devices=sorted({t.device.type for t in (x, y, z, w, m.weight, legacy)}),
               autocast=[str(a.dtype), str(b.dtype)], legacy=[str(legacy.dtype), legacy.tolist()],
               seeded=r1.tolist() == r2.tolist(), allocated=torch.cuda.memory_allocated(),
               hpu_allocated=torch.hpu.memory_allocated(), scalers=[(s._device, s.is_enabled()) for s in scalers],
               unscaled=scalers[0].scale(loss) is loss, name=torch.cuda.get_device_name())
    peak = torch.cuda.max_memory_allocated()
    del x, w
    torch.cuda.reset_max_memory_allocated()
    out["peak_reset"] = torch.cuda.max_memory_allocated() < peak
    print(json.dumps(out))
"""


@pytest.mark.timeout(150)
def test_a_cuda_script_runs_on_the_card_with_the_variable_and_on_the_cpu_without() -> None:
    """``PT_HPU_GPU_MIGRATION=1`` in a script that never names Gaudi: CUDA tensors, modules,
    legacy ``torch.cuda.LongTensor``, seeding and memory queries land on the simulated card (the
    memory figures are the card's HBM, the device name Gaudi's); autocast on "cuda" keeps its
    float16 unless Intel's ``PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION=1`` makes it bfloat16;
    as Intel's toolkit does (its sample logs in Model-References), GradScalers are built
    disabled and NVTX ranges do nothing. Without the variable the same torch has no CUDA and
    nothing is mapped."""
    on = _py(_PROBE, PT_HPU_GPU_MIGRATION="1")
    assert on["available"] is True and on["count"] == 8
    assert on["devices"] == ["hpu"]
    assert on["autocast"] == ["torch.float16", "torch.float16"]  # CUDA's dtype, kept
    converted = _py(_PROBE, PT_HPU_GPU_MIGRATION="1", PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION="1")
    assert converted["autocast"] == ["torch.bfloat16", "torch.bfloat16"]
    assert on["seeded"] is True
    assert on["allocated"] == on["hpu_allocated"] > 0 and on["peak_reset"] is True
    assert on["scalers"] == [["hpu", False]] * 3 and on["unscaled"] is True
    assert on["legacy"] == ["torch.int64", [1, 2]]
    assert on["name"].startswith("GAUDI")
    off = _py('import json, torch; print(json.dumps([torch.cuda.is_available(), hasattr(torch, "hpu"), '
              'hasattr(torch.zeros, "__gpu_migration_wrapped__")]))', PT_HPU_GPU_MIGRATION="")  # "": unset
    assert off == [False, False, False]


@pytest.mark.timeout(150)
def test_import_enables_it_and_logs_each_conversion_with_its_call_site(tmp_path: Path) -> None:
    """``import habana_frameworks.torch.gpu_migration`` turns it on without the variable; with
    ``GPU_MIGRATION_LOG_LEVEL`` each conversion is logged once per call site, with the source
    line, in Intel's ``[context]`` / ``[hpu_match]`` form; ``get_backend`` answers "nccl" for the
    hccl group it made."""
    out = _py("""
        import json, torch
        import habana_frameworks.torch.gpu_migration
        import torch.distributed as dist
        dist.init_process_group("nccl", rank=0, world_size=1)
        pg = dist.distributed_c10d._get_default_group()
        t = torch.ones(3, device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        print(json.dumps({"backend": dist.get_backend(), "real": pg._get_backend_name(), "t": t.cpu().tolist(),
                          "nccl": dist.is_nccl_available()}))
        dist.destroy_process_group()
    """, tmp_path / "script.py", GPU_MIGRATION_LOG_LEVEL="1", HABANA_LOGS=str(tmp_path), MASTER_ADDR="127.0.0.1",
              MASTER_PORT=str(free_port()))
    assert out == {"backend": "nccl", "real": "hccl", "t": [1.0, 1.0, 1.0], "nccl": True}
    (log,) = (tmp_path / "gpu_migration_logs").glob("gpu_migration_*.log")
    text = log.read_text()
    assert f"{tmp_path / 'script.py'}:5" in text
    assert '[context]: dist.init_process_group("nccl", rank=0, world_size=1)' in text
    assert "[hpu_match]: backend=nccl --> backend=hccl" in text
    assert text.count("torch.ones(device=cuda) --> torch.ones(device=hpu)") == 1


@pytest.mark.timeout(150)
def test_torch_compile_with_inductor_runs_on_hpu_backend(tmp_path: Path) -> None:
    """``torch.compile(model)`` (inductor, torch's default) on the migrated card compiles with
    ``hpu_backend`` instead (inductor has no Gaudi code generator; the support matrix seed says
    the toolkit converts it): the compiled module gives the eager module's output on hpu."""
    out = _py("""
        import json, torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
        x = torch.randn(5, 8).cuda()
        compiled = torch.compile(m, mode="max-autotune")
        got, want = compiled(x), m(x)
        print(json.dumps({"device": str(got.device), "equal": torch.allclose(got, want, atol=1e-6)}))
    """, tmp_path / "script.py", PT_HPU_GPU_MIGRATION="1", PT_HPU_LAZY_MODE="0", GPU_MIGRATION_LOG_LEVEL="1",
              HABANA_LOGS=str(tmp_path))
    assert out == {"device": "hpu:0", "equal": True}
    (log,) = (tmp_path / "gpu_migration_logs").glob("gpu_migration_*.log")
    assert "[hpu_modified]: torch.compile(backend=inductor) --> torch.compile(backend=hpu_backend)" in log.read_text()
