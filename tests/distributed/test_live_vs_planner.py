"""Live "hccl" ranks and the planner agree: each collective's simulated start/end, identical integers."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from hccl.sim.planner import simulate
from hccl.sim.topology import load_topology
from tests.dist_utils import run_ranks

SLICE_MB = 0.25
SIZES = [4096, (1 << 20) + 12]  # bytes per rank: one slice, and five uneven ones
# 8 ranks: two boxes of four cards on different leaves, so hierarchical crosses a spine
BOXES_OF_FOUR = """
name = "two_boxes_of_four"
cards_per_box = 4
ports_per_card = 12
scale_up_ports_per_peer = 3
scale_out_ports_per_card = 3
boxes_per_leaf = 1
"""
CONFIGS = {2: ("hls1", [None, "ring"]), 4: ("hls2", [None, "ring", "recursive"]),
           8: (None, [None, "ring", "hierarchical"])}


def _a2a_splits(n: int, unit: int, even: bool) -> list[list[int]]:
    """Rows rank p sends to rank q (ragged unless ``even``)."""
    if even:
        return [[unit] * n for _ in range(n)]
    return [[unit * ((p + 2 * q) % 3 + (p == 0)) for q in range(n)] for p in range(n)]


def _plan(n: int, algos) -> list[dict]:
    """The calls every rank makes, as planner arguments (float32: 4 bytes per element)."""
    calls = []
    for algo in algos:
        for size in SIZES:
            m = size // 4
            base = dict(algorithm=algo, dtype_bytes=4)
            calls += [
                dict(base, collective="all_reduce", nbytes=4 * m),
                dict(base, collective="reduce", nbytes=4 * m, root=1 % n),
                dict(base, collective="broadcast", nbytes=4 * m, root=n - 1),
                dict(base, collective="all_gather", nbytes=4 * m),
                dict(base, collective="reduce_scatter", nbytes=4 * n * (m // n)),
            ]
            for even in (True, False):
                sp = _a2a_splits(n, max(1, m // (2 * n)), even)
                calls.append(dict(base, collective="all2all", nbytes=4 * max(map(sum, sp)),
                                  splits=None if even else sp))
        calls.append(dict(algorithm=algo, dtype_bytes=4, collective="barrier", nbytes=0))
    return calls


def _rank(rank: int, world: int, algos) -> list[tuple]:
    g = torch.Generator().manual_seed(rank)
    for call in _plan(world, algos):
        if call["algorithm"]:
            os.environ["HCCL_ALGO"] = call["algorithm"]
        else:
            os.environ.pop("HCCL_ALGO", None)
        c, m = call["collective"], call["nbytes"] // 4
        x = torch.randn(m, generator=g)
        if c == "all_reduce":
            dist.all_reduce(x)
        elif c == "reduce":
            dist.reduce(x, dst=call["root"])
        elif c == "broadcast":
            dist.broadcast(x, src=call["root"])
        elif c == "all_gather":
            dist.all_gather_into_tensor(torch.empty(world * m), x)
        elif c == "reduce_scatter":
            dist.reduce_scatter_tensor(torch.empty(m // world), x)
        elif c == "all2all":
            sp = call["splits"]
            if sp is None:
                dist.all_to_all_single(torch.empty(m), x)
            else:
                out = torch.empty(sum(row[rank] for row in sp))
                dist.all_to_all_single(out, x[: sum(sp[rank])], [row[rank] for row in sp], sp[rank])
        else:
            dist.barrier()
    return [(r.kind, r.nbytes, r.start_ns, r.end_ns, r.algorithm) for r in dist.group.WORLD.history]


@pytest.mark.parametrize("world", sorted(CONFIGS))
def test_live_equals_planner(world, tmp_path):
    """Every record of every rank equals the planner's chained simulation of the same calls."""
    name, algos = CONFIGS[world]
    if name is None:
        path = tmp_path / "boxes_of_four.toml"
        path.write_text(BOXES_OF_FOUR)
        name = str(path)
    env = {"HCCL_TOPOLOGY": name, "PT_HCCL_SLICE_SIZE_MB": str(SLICE_MB), "HCCL_SHM_BUFFER_MB": "0.25"}
    records = run_ranks(_rank, world, algos, timeout=300, pg_timeout=60, env=env)
    topo = load_topology(name, world_size=world)
    plan = _plan(world, algos)
    assert all(len(r) == len(plan) for r in records)
    ready = [0] * world
    seen = set()
    for i, call in enumerate(plan):
        res = simulate(topology=topo, world_size=world, ready_ns=ready,
                       slice_bytes=int(SLICE_MB * (1 << 20)), **call)
        seen.add(res.algorithm)
        start = max(ready)
        for r in range(world):
            kind, _, s, e, algo = records[r][i]
            where = f"call {i} ({call['collective']} {call['nbytes']} B, {algo}) on rank {r}"
            assert (s, e) == (min(start, res.end_ns[r]), res.end_ns[r]), where
            assert algo == res.algorithm, where
            assert e - s == res.end_ns[r] - min(start, res.end_ns[r]), where
        if len(set(ready)) == 1:  # uniform start: the slowest rank's record is the planner's duration
            assert max(records[r][i][3] - records[r][i][2] for r in range(world)) == res.duration_ns
        ready = list(res.end_ns)
    assert len(seen) >= 2
