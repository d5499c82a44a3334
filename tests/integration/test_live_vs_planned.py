"""A live torchrun DDP run's steady-state simulated step equals the planned step, to the ns.

The planned side never runs DDP: it traces one step without data and replays it with DDP's
buckets (hccl.sim.ddp_plan). The live side is models.train over "hccl" on 2 real processes,
in each execution mode (``--mode``; lazy when absent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = [  # model, batch, bucket_cap_mb, flags, PT_HPU_ENABLE_LAZY_COLLECTIVES
    ("resnet50:debug", 4, 0.05, [], False),
    ("bert-large:debug", 2, 0.01, ["--gradient-as-bucket-view", "--autocast"], False),
    ("gpt2:debug", 2, 0.01, [], True),
    # 1.2 MB of gradients: two buckets at 1 MiB (torch.compile under DDP needs a cap >= 1 MiB)
    ("mlp", 4, 1.0, ["--hidden", "512", "--mode", "eager"], False),
    ("mlp", 4, 1.0, ["--hidden", "512", "--mode", "compile"], False),
    ("resnet50:debug", 4, 0.05, ["--mode", "hpu_graphs"], False),
]


def _flag(flags: list[str], name: str, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model, batch, cap, flags, lazy_coll", CASES,
                         ids=[c[0].partition(":")[0] + ("-" + _flag(c[3], "--mode") if "--mode" in c[3] else "")
                              + ("-lazy-collectives" if c[4] else "") for c in CASES])
def test_live_steady_step_equals_planned(model, batch, cap, flags, lazy_coll, tmp_path):
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    name, _, flavour = model.partition(":")
    mode = _flag(flags, "--mode", "lazy")
    hidden = _flag(flags, "--hidden")
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "models.train", "--model", name, *(["--flavour", flavour] if flavour else []),
           "--batch-size", str(batch),
           "--bucket-cap-mb", str(cap), "--epochs", "1", "--max-steps", "6", "--eval-samples", "4",
           "--summary", str(summary), *flags]
    env = dict(os.environ, HCCL_TOPOLOGY="hls2", PT_HPU_ENABLE_LAZY_COLLECTIVES=str(lazy_coll).lower())
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads(summary.read_text())["epochs"][0]["sim_steps"]
    assert steps[-1] == steps[-2], "the live run has not reached its steady state"

    factory = resolve_factory(model, **({"hidden": int(hidden)} if hidden else {}))
    trace = trace_step(factory, batch, spec=get_device_spec("gaudi2"), mode=mode,
                       autocast="--autocast" in flags, lazy_collectives=lazy_coll,
                       ddp_bucket_cap_mb=cap if mode == "compile" else None)
    planned = plan_ddp_step(trace, world_size=2, topology="hls2", bucket_cap_mb=cap,
                            gradient_as_bucket_view="--gradient-as-bucket-view" in flags)
    live = steps[-1]
    t = planned.times
    assert (t.step_ns, t.compute_ns, t.comm_ns, t.exposed_comm_ns, t.host_ns) == (
        live["step_ns"], live["compute_ns"], live["comm_ns"], live["exposed_comm_ns"], live["host_ns"])
    assert len(planned.buckets) > 1
    if mode == "lazy":  # every bucket's allreduce cuts the backward graph; lazy collectives do not
        assert (planned.graph_launches > len(planned.buckets)) != lazy_coll
    elif mode == "hpu_graphs":  # forward and backward replay; the buckets follow the backward graph
        replays = [g for g in planned.graphs if g[0] == "replay"]
        assert len(replays) == 2 and planned.graphs[:3] == (replays[0], planned.graphs[1], replays[1])
    else:  # ops launch one by one (eager) or as compiled regions: the first allreduce overlaps backward
        assert planned.buckets[0].end_ns <= planned.buckets[1].ready_ns
