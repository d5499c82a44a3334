"""Transport benchmark: allreduce over "hccl" (shared memory) vs "gloo", side by side.

``python -m hccl.bench_transport [--ranks 2] [--iters 20]`` spawns the ranks on this host,
creates both groups in every rank, and prints for each size the wall-clock latency (1 KB)
or bus bandwidth (larger sizes) of each backend and their ratio. These are *wall-clock*
figures of the emulator's data movement on this machine, not simulated Gaudi times.

Bus bandwidth follows hccl_demo/nccl-tests: ``busbw = algbw x 2(n-1)/n`` for allreduce,
``algbw = bytes / time``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["main"]

SIZES = [("1 KB", 1024), ("1 MB", 1 << 20), ("16 MB", 16 << 20), ("64 MB", 64 << 20)]


def _time_allreduce(t: torch.Tensor, group, iters: int) -> float:
    """Wall seconds per allreduce of ``t`` on ``group``, as nccl-tests and hccl_demo measure:
    ``iters`` back-to-back calls after a warm-up and a barrier, divided by ``iters``; the
    median of 3 such runs; the slowest rank's figure (a collective is as slow as its last rank).
    """
    for _ in range(5):
        dist.all_reduce(t, group=group)
    runs = []
    for _ in range(3):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        runs.append((time.perf_counter() - t0) / iters)
    worst = torch.tensor([statistics.median(runs)], dtype=torch.float32)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst.item())


def _worker(rank: int, world: int, init_file: str, iters: int, queue) -> None:
    import hpu_runtime

    hpu_runtime.deactivate()  # measure the transport, not the bridge
    dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    hccl = dist.group.WORLD
    rows = []
    for label, nbytes in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        n_iters = iters if nbytes <= (1 << 20) else max(3, iters // 4)
        if nbytes <= 1024:
            n_iters = iters * 50
        row = [label, nbytes]
        for group in (hccl, gloo):
            row.append(_time_allreduce(t, group, n_iters))
        rows.append(row)
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m hccl.bench_transport", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=600.0, help="wall seconds before giving up")
    args = p.parse_args(argv)
    if args.ranks < 2:
        raise SystemExit("--ranks must be >= 2")
    # one intra-op thread per rank, as torchrun sets: ranks spinning on shared memory must
    # not compete with OpenMP worker threads for the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_worker, args=(r, args.ranks, init_file, args.iters, queue)) for r in range(args.ranks)]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + args.timeout
        for pr in procs:
            pr.join(max(0.1, deadline - time.monotonic()))
        alive = [pr for pr in procs if pr.is_alive()]
        for pr in alive:
            pr.kill()
        if alive or any(pr.exitcode for pr in procs) or queue.empty():
            raise SystemExit(f"benchmark failed: exit codes {[pr.exitcode for pr in procs]}")
        rows = queue.get()
    n = args.ranks
    factor = 2 * (n - 1) / n
    out = []
    print(f"allreduce, {n} ranks on this host, wall-clock (not simulated) figures")
    print(f"{'size':>6} | {'hccl':>14} | {'gloo':>14} | hccl vs gloo")
    for label, nbytes, t_hccl, t_gloo in rows:
        if nbytes <= 1024:
            print(f"{label:>6} | {t_hccl * 1e6:10.1f} us | {t_gloo * 1e6:10.1f} us | latency {t_hccl / t_gloo:.3f}x")
            out.append({"size": label, "hccl_latency_us": t_hccl * 1e6, "gloo_latency_us": t_gloo * 1e6})
        else:
            bw_h = nbytes / t_hccl * factor / 1e9
            bw_g = nbytes / t_gloo * factor / 1e9
            print(f"{label:>6} | {bw_h:8.2f} GB/s | {bw_g:8.2f} GB/s | busbw {bw_h / bw_g:.2f}x")
            out.append({"size": label, "hccl_busbw_gbps": bw_h, "gloo_busbw_gbps": bw_g})
    sys.stdout.flush()
    return out


if __name__ == "__main__":
    main()
