"""One rank of ``python -m hccl.tools.bench --live`` (started by torchrun; not a public entry point).

Runs each (test, size) through the "hccl" backend on real tensors and reads the simulated
interval from the process group's history. Before every call the ranks agree, through the
job's store (not through a collective, which would itself take simulated time), on a common
simulated ready time, so each call starts from uniform ready times as the planner's does;
the simulated duration is then ``max(end) - start`` over ranks, the planner's
``duration_ns``. Wall time (measured, not simulated) is the slowest rank's.

Rank 0 writes one JSON object per (test, size) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import hccl  # noqa: F401 - registers the "hccl" backend
from hccl.sim.algorithms import _send_recv_peers

_DTYPES = {"float": torch.float32, "bfloat16": torch.bfloat16}
_ITEMSIZE = {"float": 4, "bfloat16": 2}
_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


class _Sync:
    """Small integer exchanges through the store (no simulated time, no history records)."""

    def __init__(self, rank: int, world: int) -> None:
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.world, self.n = rank, world, 0

    def gather(self, values: list[int]) -> list[list[int]]:
        key = f"hccl_bench/{self.n}"
        self.n += 1
        self.store.set(f"{key}/{self.rank}", json.dumps(values))
        return [json.loads(self.store.get(f"{key}/{r}")) for r in range(self.world)]


def _prepare(test: str, x: torch.Tensor, rank: int, world: int, op, root: int, peer: int, topology: str):
    """A no-argument callable issuing one ``test`` call; all tensors are allocated here, up front,
    so no host-side op runs between the ready-time alignment and the collective."""
    if test == "all_reduce":
        return lambda: dist.all_reduce(x, op=op)
    if test == "reduce":
        return lambda: dist.reduce(x, dst=root, op=op)
    if test == "broadcast":
        return lambda: dist.broadcast(x, src=root)
    if test == "all_gather":
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        return lambda: dist.all_gather_into_tensor(out, x)
    if test == "reduce_scatter":
        out = torch.empty(x.numel() // world, dtype=x.dtype)
        return lambda: dist.reduce_scatter_tensor(out, x, op=op)
    if test == "all2all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if test == "send_recv":
        src = [r for r in range(world) if peer_of(r, world, topology) == rank]
        ops = [dist.P2POp(dist.isend, x, peer)] + [dist.P2POp(dist.irecv, torch.empty_like(x), s) for s in src]

        def run():
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return run
    raise ValueError(f"unknown test {test!r}")


def peer_of(rank: int, world: int, topology: str) -> int:
    """hccl_demo's send_recv partner of ``rank`` (the planner's pattern) on ``topology``."""
    from hccl.sim.topology import load_topology

    L = load_topology(topology, world_size=world).cards_per_box
    return int(_send_recv_peers(world, L)[rank])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hccl.tools._bench_worker")
    p.add_argument("--tests", nargs="+", required=True)
    p.add_argument("--sizes", nargs="+", type=int, required=True)
    p.add_argument("--data_type", default="float", choices=sorted(_DTYPES))
    p.add_argument("--redop", default="sum", choices=sorted(_OPS))
    p.add_argument("--test_root", type=int, default=0)
    p.add_argument("--topology", default="hls2", help="the topology the parent also passes as HCCL_TOPOLOGY")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:  # a failure from the group's creation on is written for the parent to name
        dist.init_process_group("hccl")
        try:
            rows = _run(a, rank, dist.get_world_size())
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        with open(f"{a.out}.err{rank}", "w") as f:
            f.write(f"rank {rank}: {type(exc).__name__}: {exc}\n")
        raise
    if rank == 0:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


def _run(a, rank: int, world: int) -> list[dict]:
    pg = dist.group.WORLD
    dev = pg._device
    sync = _Sync(rank, world)
    dtype = _DTYPES[a.data_type]
    rows = []
    for test in a.tests:
        peer = peer_of(rank, world, a.topology) if test == "send_recv" else -1
        for size in a.sizes:
            x = torch.ones(size // _ITEMSIZE[a.data_type], dtype=dtype)
            call = _prepare(test, x, rank, world, _OPS[a.redop], a.test_root, peer, a.topology)
            sims, walls, algo, uniform = [], [], "", True
            for it in range(a.iters + 1):  # the first call is a warm-up
                # uniform simulated ready time on every rank, then a wall-clock barrier
                common = max(v[0] for v in sync.gather([dev.collective_ready_ns()]))
                dev.stream_wait(common)
                before = len(pg.history)
                sync.gather([0])
                t0 = time.perf_counter()
                call()
                wall_ns = int((time.perf_counter() - t0) * 1e9)
                recs = pg.history[before:]
                mine = [min(r.start_ns for r in recs), max(r.end_ns for r in recs), wall_ns]
                allv = sync.gather(mine)
                algo = recs[-1].algorithm
                start = min(v[0] for v in allv)
                uniform = uniform and start == common
                if it:
                    sims.append(max(v[1] for v in allv) - start)
                    walls.append(max(v[2] for v in allv))
            rows.append({"test": test, "size": size, "sim_ns": sims[-1], "sim_ns_all": sims,
                         "wall_ns": sum(walls) // len(walls), "algorithm": algo, "uniform_ready": uniform})
    return rows


if __name__ == "__main__":
    sys.exit(main())
