"""Every algorithm x collective x world size x dtype against numpy (planner-with-data mode)."""

import numpy as np
import pytest

from hccl.sim import algorithms
from hccl.sim.algorithms import pairwise
from hccl.sim.planner import execute, simulate
from hccl.sim.schedule import Recv, Send, build_schedule
from hccl.sim.topology import load_topology

ALGOS = ["direct", "hierarchical", "pairwise", "ring", "recursive"]
COLLS = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all2all", "send_recv", "barrier"]
SIZES = [1, 2, 3, 4, 5, 8, 16]
DTYPES = ["float32", "bfloat16", "int32", "int64"]
HLS2 = load_topology("hls2")
SLICE = 64  # bytes: forces several pipelined slices


def _inputs(n, count, dtype, seed=0, low=-4, high=5):
    """Random inputs: standard normal for floating dtypes (integer values would hide a wrong
    reduction order or a chunk reduced twice), integers in [low, high) otherwise."""
    rng = np.random.default_rng(seed)
    np_dtype = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
    if np.issubdtype(np_dtype, np.floating):
        xs = [rng.standard_normal(count).astype(np_dtype) for _ in range(n)]
    else:
        xs = [rng.integers(low, high, count).astype(np_dtype) for _ in range(n)]
    if dtype == "bfloat16":  # bfloat16 emulated by float32 values rounded to 8 mantissa bits
        xs = [(x.view(np.uint32) & 0xFFFF0000).view(np.float32) for x in xs]
    return xs


def _reference(coll, xs, root, op="sum", cards_per_box=8):
    n = len(xs)
    red = {"sum": np.sum, "avg": np.sum, "min": np.min, "max": np.max, "prod": np.prod}[op](
        np.stack(xs), axis=0).astype(xs[0].dtype)
    if op == "avg":
        red = (red / n).astype(xs[0].dtype)
    if coll == "all_reduce":
        return [red] * n
    if coll == "reduce":
        return {root: red}
    if coll == "broadcast":
        return [xs[root]] * n
    if coll == "all_gather":
        return [np.concatenate(xs)] * n
    if coll == "reduce_scatter":
        return np.array_split(red, n)
    if coll == "all2all":
        parts = [np.array_split(x, n) for x in xs]
        return [np.concatenate([parts[i][j] for i in range(n)]) for j in range(n)]
    if coll == "send_recv":
        peer = algorithms._send_recv_peers(n, cards_per_box)
        return [xs[int(np.nonzero(peer == j)[0][0])] for j in range(n)]
    if coll == "barrier":
        return [np.zeros(0, xs[0].dtype)] * n
    raise AssertionError(coll)


def _check(coll, algo, n, dtype, topo=HLS2, count=23, op="sum"):
    xs = _inputs(n, count, dtype, seed=n)
    root = (n - 1) // 2
    outs = execute(coll, xs, topo, algorithm=algo, root=root, slice_bytes=SLICE, op=op)
    ref = _reference(coll, xs, root, op, topo.cards_per_box)
    items = ref.items() if isinstance(ref, dict) else enumerate(ref)
    for r, want in items:
        what = f"{coll}/{algo}/n={n}/{dtype} rank {r}"
        if np.issubdtype(np.asarray(want).dtype, np.floating):  # numpy reduces in another order
            np.testing.assert_allclose(outs[r], want, rtol=1e-5, atol=1e-5, err_msg=what)
        else:
            np.testing.assert_array_equal(outs[r], want, err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("algo", ALGOS)
def test_matches_numpy(algo, coll, n, dtype):
    """Output of every rank equals the numpy reference."""
    _check(coll, algo, n, dtype)


@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", [3, 8, 16])
def test_all_reduce_ops(algo, op, n):
    """all_reduce with each reduction op."""
    _check("all_reduce", algo, n, "float32", op=op)


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A topology of 2-card boxes, to run the hierarchical algorithm on many boxes."""
    f = tmp_path_factory.mktemp("topo") / "mini.toml"
    f.write_text("cards_per_box = 2\nscale_up_ports_per_peer = 2\nports_per_card = 6\nboxes_per_leaf = 2\n")
    return load_topology(str(f))


@pytest.mark.parametrize("n", [2, 4, 6, 8, 16])
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("algo", ["hierarchical", "pairwise"])
def test_multi_box_algorithms_many_boxes(mini, coll, n, algo, monkeypatch):
    """Hierarchical and pairwise with 1..8 boxes of 2 cards (pairwise: 8-byte HCL slices, so
    several slices are pipelined)."""
    monkeypatch.setattr(pairwise, "HCL_SLICE_BYTES", 8)
    _check(coll, algo, n, "float32", topo=mini, count=37)


def test_hierarchical_partial_box_rejected(mini):
    """Hierarchical refuses a world size that leaves a box partly used, naming the reason."""
    with pytest.raises(ValueError, match="multiple of cards_per_box"):
        execute("all_reduce", _inputs(5, 4, "float32"), mini, algorithm="hierarchical")


def test_all2all_uneven_splits():
    """all2all with explicit splits lands each chunk where numpy says."""
    n, count = 3, 6
    splits = [[1, 2, 3], [0, 6, 0], [2, 2, 2]]
    xs = _inputs(n, count, "int64")
    outs = execute("all2all", xs, HLS2, splits=splits, algorithm="direct")
    for j in range(n):
        want = np.concatenate([xs[i][sum(splits[i][:j]):sum(splits[i][:j + 1])] for i in range(n)])
        np.testing.assert_array_equal(outs[j], want)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("coll", COLLS)
def test_dense_rows_are_permutations(algo, coll):
    """In every dense block row each rank receives at most once (the planner relies on it)."""
    topo = HLS2.with_world_size(16)
    _, phases = algorithms.phases(coll, 100, topo, algorithm=algo, root=3, slice_bytes=64)
    for _, ph in phases:
        for blk in ph():
            if blk.dense:
                for row in blk.dst:
                    valid = row[row >= 0]
                    assert len(np.unique(valid)) == len(valid)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("coll", ["all_reduce", "all2all", "broadcast", "reduce_scatter"])
def test_per_rank_steps_match_planner(algo, coll):
    """Per-rank schedules pair up (FIFO per pair) and count the planner's messages."""
    n = 8
    scheds = [build_schedule(coll, 4096, r, HLS2, world_size=n, algorithm=algo, root=2, slice_bytes=1024)
              for r in range(n)]
    sends = {}
    recvs = {}
    for s in scheds:
        for st in s.steps:
            if isinstance(st, Send):
                sends.setdefault((s.rank, st.peer), []).append(st.count)
                assert st.ports == HLS2.ports(s.rank, st.peer)
            elif isinstance(st, Recv):
                recvs.setdefault((st.peer, s.rank), []).append(st.count)
    assert sends == recvs
    res = simulate(coll, 4096, HLS2, world_size=n, algorithm=algo, root=2, slice_bytes=1024)
    assert res.messages == sum(len(v) for v in sends.values())
    assert all(s.algorithm == res.algorithm for s in scheds)


def test_selection_rule(monkeypatch):
    """Default algorithms by size and topology, overridable with HCCL_ALGO."""
    t = HLS2
    monkeypatch.delenv("HCCL_ALGO", raising=False)
    assert algorithms.select("all_reduce", 1 << 20, t, 8) == "direct"
    assert algorithms.select("all_reduce", 1 << 20, t, 64) == "pairwise"
    assert algorithms.select("reduce_scatter", 1 << 20, t, 64) == "pairwise"
    assert algorithms.select("broadcast", 1 << 20, t, 64) == "hierarchical"
    assert algorithms.select("all_reduce", 1024, t, 16) == "recursive"
    assert algorithms.select("all_reduce", 1 << 20, t, 12) == "ring"
    monkeypatch.setenv("HCCL_ALGO", "ring")
    assert algorithms.select("all_reduce", 1 << 20, t, 64) == "ring"
    assert simulate("all_reduce", 1 << 20, t, world_size=8).algorithm == "ring"
    monkeypatch.setenv("HCCL_ALGO", "bogus")
    with pytest.raises(ValueError, match="unknown algorithm 'bogus'"):
        algorithms.select("all_reduce", 1, t, 8)
