"""With variability and what-ifs on, a live torchrun's steps equal the planner's, step by step.

The live side is models.train on real processes, each rank drawing its own per-step slowdowns
from the seed; the planner replays the traced step on every rank in lock step
(hccl.sim.straggler_plan). After the alignment barrier (hccl.sim.cluster.ALIGN_STEP) every step
is the same integers; the planner keeps its samples from straggler_plan.WARMUP on. A dead
rank ends the job within the process group's timeout; torchrun's
--max-restarts then runs it again to the end.
"""

from __future__ import annotations

import json
import sys

import pytest

from hccl.sim.straggler_plan import WARMUP

from .launch_helpers import run

CASES = [  # ranks, flags (the same for the live run and the planner)
    (2, ["--variability", "seed=7,jitter=0.05,slow_prob=0.2,stretch=5", "--degraded-link", "0-1:3"]),
    (4, ["--variability", "seed=3,jitter=0.05,slow_prob=0.2", "--slow-card", "3:1.5"]),
]
STEPS = 10  # WARMUP (the alignment, the step holding it, the settling steps) and 4 kept


def _plan(n: int, flags: list[str]):
    import argparse

    from hccl.sim import cluster
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    p = argparse.ArgumentParser()
    cluster.add_arguments(p)
    cond = cluster.from_args(p.parse_args(flags))
    trace = trace_step(resolve_factory("mlp"), 8, spec=get_device_spec("gaudi2"))
    return plan_ddp_step(trace, world_size=n, topology="hls2", bucket_cap_mb=0.01, variability=cond.variability,
                         whatif=cond.whatif, steps=STEPS - WARMUP)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("n, flags", CASES, ids=["2-ranks-noise-stretch-degraded-link", "4-ranks-noise-slow-card"])
def test_live_steps_equal_planned(n, flags, tmp_path):
    summary = tmp_path / "summary.json"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                "-m", "models.train", "--model", "mlp", "--batch-size", "8", "--bucket-cap-mb", "0.01",
                "--epochs", "1", "--max-steps", str(STEPS), "--eval-samples", "4", "--summary", str(summary),
                *flags], timeout=180, env={"HCCL_TOPOLOGY": "hls2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    epoch = json.loads(summary.read_text())["epochs"][0]
    live = epoch["sim_steps"][WARMUP:]
    planned = _plan(n, flags)
    keys = ("step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "host_ns")
    assert [tuple(s[k] for k in keys) for s in live] == [tuple(getattr(t, k) for k in keys) for t in planned.samples]
    # the job's steps (every rank's step ends gathered, NOTE [the job's step]) as planned
    assert epoch["sim_job_steps"][WARMUP:] == list(planned.job_steps)
    assert len(set(s["step_ns"] for s in live)) > 1  # the steps differ: the variability is on
    nominal = _plan(n, [])
    assert planned.times.step_ns > nominal.times.step_ns  # slower cards and links cost time
    assert len(live) == STEPS - WARMUP == 4


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_dead_rank_ends_the_job_and_a_restart_finishes_it(tmp_path):
    """--dead-rank 1@2: rank 1 exits at step 2; rank 0's next collective gives up within the
    process group's timeout (5 s) and torchrun (--max-restarts 1) runs the job again, to the end."""
    summary = tmp_path / "summary.json"
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "--max-restarts=1", "-m", "models.train", "--model", "mlp", "--batch-size", "8", "--epochs", "1",
                "--max-steps", "4", "--eval-samples", "4", "--summary", str(summary), "--dead-rank", "1@2",
                "--pg-timeout", "5"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--dead-rank 1@2: exiting at step 2" in proc.stderr
    assert json.loads(summary.read_text())["epochs"][0]["steps"] == 4
