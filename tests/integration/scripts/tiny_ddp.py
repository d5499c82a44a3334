"""A tiny, deterministic DDP job used to test the launchers (not the emulator's numerics).

Reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT like any torchrun script, trains a
two-layer MLP on synthetic data for a few steps, and (rank 0) writes the final parameters as
JSON so that runs under different launchers can be compared bit for bit.

Run: ``torchrun --standalone --nproc-per-node 2 tests/integration/scripts/tiny_ddp.py --out p.json``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["main"]

_T0 = time.time()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--out", help="rank 0 writes the final parameters (JSON) here")
    p.add_argument("--summary", help="rank 0 writes the run summary (JSON) here")
    p.add_argument("--die-rank", type=int, default=-1, help="this rank fails at --die-at-step")
    p.add_argument("--die-at-step", type=int, default=2)
    p.add_argument("--die-mode", choices=["kill", "exit", "raise"], default="kill")
    p.add_argument("--step-sleep", type=float, default=0.0, help="wall seconds per step")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Trains and returns the run summary (on every rank)."""
    args = _parse(argv)
    if args.backend == "hccl":
        import hccl  # noqa: F401  (registers the backend even without the entry point)
    t_start = time.time()
    dist.init_process_group(args.backend)
    t_init = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(args.seed + 1)
        per_rank = args.global_batch // world
        step_times = []
        for step in range(args.steps):
            x = torch.randn(args.global_batch, 32, generator=gen)
            y = torch.randint(0, 10, (args.global_batch,), generator=gen)
            xs, ys = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
            if rank == args.die_rank and step == args.die_at_step:
                if args.die_mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif args.die_mode == "exit":
                    os._exit(3)
                raise RuntimeError(f"tiny_ddp: injected failure on rank {rank} at step {step}")
            t = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xs), ys)
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        summary = {
            "script": "tiny_ddp",
            "rank": rank,
            "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "-1")),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "final_loss": float(loss.detach()),
            "param_checksum": float(params.double().sum()),
            "init_unix_s": t_init,
            "import_to_init_s": t_init - _T0,
            "init_s": t_init - t_start,
            "step_wall_s_mean": sum(step_times[1:]) / max(1, len(step_times) - 1),
        }
        if rank == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump({"params": params.tolist(), "world_size": world}, f)
        if rank == 0 and args.summary:
            with open(args.summary, "w") as f:
                json.dump(summary, f, indent=1)
        print(
            f"tiny_ddp rank={rank} world={world} init_unix_s={t_init:.3f} "
            f"step_wall_ms={summary['step_wall_s_mean'] * 1e3:.3f}",
            flush=True,
        )
        return summary
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
