"""The simulated timeline as a Chrome trace, and the disk recipe cache seen from two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import hpu_runtime as hpu
from hpu_runtime import SimDevice
from hpu_runtime.device.spec import get_device_spec
from hpu_runtime.api.trace import merge_trace_files, rank_trace_path, write_rank_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_device_trace_has_host_compute_collective_rows_per_rank(tmp_path):
    for rank in range(2):
        d = SimDevice(get_device_spec("gaudi2"))
        d.enable_trace()
        from hpu_runtime.device.cost_model import OpCost

        d.record_op(OpCost(name="op", engine="TPC", flops=0, bytes_in=0, bytes_out=0,
                           low_precision=False, device_ns=5_000 * (rank + 1)))
        ready = d.collective_ready_ns()
        d.record_collective("allreduce #0", ready, ready + 10_000)
        d.synchronize()
        write_rank_trace(tmp_path, rank, d.trace_events(rank))
    out = merge_trace_files(tmp_path / "trace.json", [rank_trace_path(tmp_path, r) for r in range(2)])
    data = json.loads(out.read_text())
    procs = {e["pid"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {0, 1}
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    for rank in range(2):
        cats = {e["cat"] for e in spans if e["pid"] == rank}
        assert cats == {"host", "compute", "collective"}
    assert any(e["name"].startswith("compile") for e in spans)


def test_bridge_trace_events_from_real_ops():
    d = hpu.reset_device()
    try:
        d.enable_trace()
        x = torch.randn(64, 64, device="hpu")
        (x @ x).sum().item()
        events = d.trace_events(0)
        assert any(e.stream == "compute" and e.name.startswith("recipe_") for e in events)
        host = [e.name.split(" ")[0] for e in events if e.stream == "host"]
        assert {"compile", "build", "wait"} <= set(host)
    finally:
        hpu.reset_device()


_SCRIPT = r"""
import json, torch
import hpu_runtime as hpu
hpu.reset_device("gaudi2")
model = torch.nn.Linear(16, 4).to("hpu")
x = torch.randn(8, 16, device="hpu")
hpu.mark_step()
for _ in range(3):
    model(x).relu().sum().backward()
    hpu.mark_step()
dev = hpu.get_device()
dev.recipes.flush()
print(json.dumps({"compiles": dict(hpu.metric_global("graph_compilation").stats())["TotalNumber"],
                  "disk_hits": dev.recipes.stats().disk_hits}))
"""


def _run(env):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_disk_recipe_cache(tmp_path):
    """PT_HPU_RECIPE_CACHE_CONFIG: run 1 compiles, run 2 of the same script loads every recipe from disk."""
    env = dict(os.environ, PT_HPU_RECIPE_CACHE_CONFIG=f"{tmp_path / 'cache'},false,64",
               TORCH_DEVICE_BACKEND_AUTOLOAD="1", PYTHONPATH=ROOT)
    first = _run(env)
    assert first["compiles"] >= 2 and first["disk_hits"] == 0
    assert list((tmp_path / "cache").glob("*.recipe"))
    second = _run(env)
    assert second["compiles"] == 0 and second["disk_hits"] == first["compiles"]
    env["PT_HPU_RECIPE_CACHE_CONFIG"] = f"{tmp_path / 'cache'},true,64"  # clear_at_start
    assert _run(env)["compiles"] == first["compiles"]


def test_train_job_writes_trace(tmp_path):
    """``models.train --trace DIR`` writes the rank file and the merged trace."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1", MASTER_PORT="29731", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "models.train", "--epochs", "1", "--max-steps", "3",
           "--trace", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "trace.json").read_text())
    rows = {e["pid"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    assert rows == {0} and (tmp_path / "trace_rank0.json").exists()
    assert {e["cat"] for e in data["traceEvents"] if e["ph"] == "X"} >= {"host", "compute"}
