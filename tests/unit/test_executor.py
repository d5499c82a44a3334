"""The schedule executor over an in-process transport: every algorithm x collective vs numpy."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import torch

from hccl._buffers import meta_words
from hccl.plans import to_plan
from hccl.sim.schedule import build_schedule
from hccl.sim.topology import load_topology
from hccl.transport.executor import ScheduleCollectives, check_rows
from hccl.transport.shm_engine import CollectiveMismatchError

SLICE = 256  # bytes: several pipelined slices


class QueueTransport:
    """A :class:`~hccl.transport.interface.Transport` between threads: one FIFO per pair."""

    def __init__(self, rank: int, world_size: int, pipes: dict) -> None:
        self.rank, self.world_size, self.pipes = rank, world_size, pipes

    def exchange(self, sends, recvs, tag, what):
        for p, data in sends:
            self.pipes[self.rank, p].put(data.clone())
        for p, into in recvs:
            got = self.pipes[p, self.rank].get(timeout=60)
            assert got.numel() == into.numel(), (what, got.numel(), into.numel())
            into.copy_(got)

    def abort(self, reason):
        pass

    def close(self):
        pass


def _run(n, topo, algo, fn):
    """``fn(coll, rank)`` on n threads, each with its own executor; returns the results."""
    pipes = {(a, b): queue.Queue() for a in range(n) for b in range(n)}
    out, errors = [None] * n, []

    def planner_for(rank):
        def plan(req):
            return to_plan(build_schedule(req.collective, req.count * req.dtype_bytes, rank, topo, world_size=n,
                                          algorithm=algo, root=req.root, dtype_bytes=req.dtype_bytes,
                                          splits=req.splits, slice_bytes=SLICE))
        return plan

    def body(r):
        try:
            out[r] = fn(ScheduleCollectives(QueueTransport(r, n, pipes), planner_for(r)), r)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


def _meta(kind, numel, op=1, root=0):
    return meta_words(0, kind, 9, numel, op, root)


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """2-card boxes, so the hierarchical algorithm runs over several boxes."""
    f = tmp_path_factory.mktemp("topo") / "mini.toml"
    f.write_text("cards_per_box = 2\nscale_up_ports_per_peer = 2\nports_per_card = 6\nboxes_per_leaf = 2\n")
    return load_topology(str(f))


@pytest.mark.parametrize("algo, n", [("direct", 3), ("ring", 4), ("ring", 5), ("recursive", 4), ("hierarchical", 4),
                                     ("hierarchical", 6)])
def test_every_collective_matches_numpy(mini, algo, n):
    """Random float64 inputs: allreduce (SUM, AVG, MAX), reduce, broadcast, allgather,
    reduce_scatter and a ragged alltoall match numpy on every rank."""
    rng = np.random.default_rng(n)
    m = 41
    xs = [rng.standard_normal(n * m) for _ in range(n)]
    splits = rng.integers(0, 5, (n, n)).tolist()
    blocks = [[rng.standard_normal(splits[p][q]) for q in range(n)] for p in range(n)]

    def fn(c, r):
        res = {}
        for op, name in ((1, "sum"), (2, "avg"), (4, "max")):
            t = torch.from_numpy(xs[r].copy())
            c.allreduce(t, op, _meta("allreduce", t.numel(), op), "allreduce")
            res[name] = t.numpy()
        t = torch.from_numpy(xs[r].copy())
        c.reduce(t, 1, 1, _meta("reduce", t.numel(), 1, 1), "reduce")
        res["reduce"] = t.numpy()
        t = torch.from_numpy(xs[r].copy())
        c.broadcast(t, n - 1, _meta("broadcast", t.numel(), 0, n - 1), "broadcast")
        res["broadcast"] = t.numpy()
        outs = [torch.empty(m, dtype=torch.float64) for _ in range(n)]
        c.allgather(outs, torch.from_numpy(xs[r][:m].copy()), _meta("allgather", m, 0), "allgather")
        res["allgather"] = [o.numpy() for o in outs]
        out = torch.empty(m, dtype=torch.float64)
        c.reduce_scatter(out, list(torch.from_numpy(xs[r].copy()).split(m)), 1, _meta("reduce_scatter", m), "rs")
        res["reduce_scatter"] = out.numpy()
        outs = [torch.empty(splits[p][r], dtype=torch.float64) for p in range(n)]
        _, got = c.alltoall(outs, [torch.from_numpy(b) for b in blocks[r]], _meta("alltoall", 0, 0), "a2a")
        res["alltoall"] = [o.numpy() for o in outs]
        res["splits"] = got
        return res

    res = _run(n, mini.with_world_size(n) if algo == "hierarchical" else load_topology("hls2"), algo, fn)
    total = np.sum(xs, axis=0)
    for r, got in enumerate(res):
        np.testing.assert_allclose(got["sum"], total, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["avg"], total / n, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got["max"], np.max(xs, axis=0))
        if r == 1:
            np.testing.assert_allclose(got["reduce"], total, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_array_equal(got["reduce"], xs[r])
        np.testing.assert_array_equal(got["broadcast"], xs[n - 1])
        for q in range(n):
            np.testing.assert_array_equal(got["allgather"][q], xs[q][:m])
            np.testing.assert_array_equal(got["alltoall"][q], blocks[q][r])
        np.testing.assert_allclose(got["reduce_scatter"], total[r * m : (r + 1) * m], rtol=1e-12, atol=1e-12)
        assert got["splits"] == splits
        assert np.array_equal(got["sum"], res[0]["sum"]), "ranks hold different bits"


def test_direct_allreduce_sums_in_rank_order():
    """NOTE [rank-order reduction]: the direct algorithm's float32 sum has the bits of x0 + x1 + x2 + x3."""
    n = 4
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(1000, generator=gen) * 10 ** float(i) for i in range(n)]

    def fn(c, r):
        t = xs[r].clone()
        c.allreduce(t, 1, _meta("allreduce", t.numel()), "allreduce")
        return t

    ref = xs[0] + xs[1]
    for q in range(2, n):
        ref += xs[q]
    for t in _run(n, load_topology("hls2"), "direct", fn):
        assert torch.equal(t, ref)


def test_check_rows_names_global_ranks_and_splits():
    """One pure check for every transport: the message names the ranks given, sizes and dtypes."""
    rows = [_meta("allreduce", 10) + [0] * 4, _meta("allreduce", 11) + [0] * 4]
    with pytest.raises(CollectiveMismatchError, match="rank 4: 10 elements of float64, rank 6: 11 elements"):
        check_rows(rows, [4, 6], "allreduce #0")
    rows = [_meta("alltoall", 0) + [1, 2, 1, 1], _meta("alltoall", 0) + [1, 1, 1, 1]]
    with pytest.raises(CollectiveMismatchError, match="rank 4 sends 2 elements to rank 6, which expects 1"):
        check_rows(rows, [4, 6], "alltoall #0")
