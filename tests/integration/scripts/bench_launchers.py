"""Start-up and step wall time of the same job under torchrun, mpiexec and Ray (a script, not a test).

Run from the repository root::

    python tests/integration/scripts/bench_launchers.py --ranks 4

Start-up = wall seconds from starting the launcher command until the last rank returns from
``init_process_group`` (tiny_ddp.py, gloo). Step wall time = mean wall-clock milliseconds per
training step: of tiny_ddp.py (gloo, 200 steps) and of ``models.train`` (hccl, digits MLP,
``--max-steps``). All figures are wall-clock on this machine, not simulated Gaudi time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TINY = "tests/integration/scripts/tiny_ddp.py"


def _prefix(launcher: str, n: int) -> list[str]:
    py = sys.executable
    return {
        "torchrun": [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"],
        "mpiexec": ["mpiexec", "-n", str(n), py, "-m", "launchers.mpi"],
        "ray": [py, "-m", "launchers.ray", "--num-workers", str(n), "--cpus-per-worker", "0.5"],
    }[launcher]


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc, t0, time.time() - t0


def measure(launcher: str, n: int, train_steps: int) -> dict[str, float]:
    """One launcher: start-up, tiny step time, models.train step time (wall-clock)."""
    proc, t0, total = _run([*_prefix(launcher, n), TINY, "--steps", "200"])
    out = proc.stdout + proc.stderr
    inits = [float(x) for x in re.findall(r"init_unix_s=([\d.]+)", out)]
    steps = [float(x) for x in re.findall(r"step_wall_ms=([\d.]+)", out)]
    if len(inits) != n:
        raise RuntimeError(f"{launcher}: saw {len(inits)} of {n} ranks' lines:\n{out[-3000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "summary.json")
        job = ["-m", "models.train", "--epochs", "1", "--max-steps", str(train_steps)]
        if launcher == "ray":
            _run([*_prefix(launcher, n), "--summary", path, *job])
        else:
            _run([*_prefix(launcher, n), *job, "--summary", path])
        summary = json.loads(Path(path).read_text())
    epoch = summary["epochs"][0]
    return {
        "startup_s": max(inits) - t0,
        "command_s": total,
        "tiny_step_ms": sum(steps) / len(steps),
        "train_step_ms": 1e3 * epoch["wall_epoch_s"] / epoch["steps"],
        "sim_step_us": epoch["sim_step_ns_mean"] / 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--launchers", default="torchrun,mpiexec,ray")
    args = p.parse_args(argv)
    print(f"{args.ranks} ranks; wall-clock seconds/milliseconds on this machine (not simulated)")
    print("| launcher | start-up s | whole command s | tiny_ddp step ms | models.train step ms | simulated step us |")
    print("|---|---|---|---|---|---|")
    for launcher in args.launchers.split(","):
        r = measure(launcher, args.ranks, args.train_steps)
        print(f"| {launcher} | {r['startup_s']:.2f} | {r['command_s']:.2f} | {r['tiny_step_ms']:.2f} "
              f"| {r['train_step_ms']:.2f} | {r['sim_step_us']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
