"""Live "hccl" ranks against hand-computed timelines and numpy: simulated intervals and data.

Two ranks on one box of the tiny topology of tests/unit/test_timing.py (1 byte/ns, no
header, 100 ns latency, reduction 2 bytes/ns). Each rank records its simulated ready time
before every call; the test computes every record from those by hand (no planner), and
checks the data against numpy on non-integer random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks
from tests.unit.test_timing import TINY, UP_LAT, red, ser

N_AR, N_AG, N_P2P = 1000, 750, 250  # float32 elements


def _inputs(rank: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(1234 + rank)
    return {"ar": g.standard_normal(N_AR).astype(np.float32), "ag": g.standard_normal(N_AG).astype(np.float32),
            "p2p": g.standard_normal(N_P2P).astype(np.float32)}


def _rank(rank: int, world: int) -> dict:
    import os

    from hpu_runtime import get_device

    dev = get_device()
    x = _inputs(rank)
    ready = {}
    # the group froze its configuration at creation: none of this reaches it
    os.environ.update(HCCL_TOPOLOGY="hls1", HCCL_ALGO="ring", PT_HCCL_SLICE_SIZE_MB="0.0001")
    ready["ar"] = dev.collective_ready_ns()
    t = torch.from_numpy(x["ar"].copy())
    dist.all_reduce(t)
    ready["ag"] = dev.collective_ready_ns()
    out = torch.empty(world * N_AG)
    dist.all_gather_into_tensor(out, torch.from_numpy(x["ag"]))
    ready["p2p"] = dev.collective_ready_ns()
    if rank == 0:
        dist.send(torch.from_numpy(x["p2p"]), dst=1)
        got = None
    else:
        buf = torch.empty(N_P2P)
        dist.recv(buf, src=0)
        got = buf.numpy()
    hist = [(r.kind, r.start_ns, r.end_ns, r.algorithm) for r in dist.group.WORLD.history]
    return {"ready": ready, "hist": hist, "ar": t.numpy(), "ag": out.numpy(), "p2p": got}


@pytest.mark.timeout(180)
def test_live_two_ranks_by_hand(tmp_path):
    """allreduce, all_gather_into_tensor and send/recv: intervals by hand, data as numpy."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    env = {"HCCL_TOPOLOGY": str(path), "PT_HCCL_SLICE_SIZE_MB": "64"}
    res = run_ranks(_rank, 2, timeout=150, pg_timeout=60, env=env)
    x = [_inputs(r) for r in (0, 1)]

    # data: numpy references (float32 sums of two non-integer inputs)
    want_ar = x[0]["ar"] + x[1]["ar"]
    for r in (0, 1):
        np.testing.assert_allclose(res[r]["ar"], want_ar, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(res[r]["ag"], np.concatenate([x[0]["ag"], x[1]["ag"]]))
    np.testing.assert_array_equal(res[1]["p2p"], x[0]["p2p"])

    # time: direct all-reduce of 4000 B on one box of two (see test_timing)
    rd = [res[r]["ready"]["ar"] for r in (0, 1)]
    half = 4 * N_AR // 2
    rs_done = [rd[1 - r] + ser(half) + UP_LAT + red(half) for r in (0, 1)]
    tx = [max(rs_done[r], rd[r] + ser(half)) for r in (0, 1)]
    for r in (0, 1):
        end = max(tx[r] + ser(half), tx[1 - r] + ser(half) + UP_LAT)
        assert res[r]["hist"][0] == ("allreduce", min(max(rd), end), end, "direct"), r
    # all-gather: each input crosses the link once
    rd = [res[r]["ready"]["ag"] for r in (0, 1)]
    nb = 4 * N_AG
    for r in (0, 1):
        end = max(rd[r] + ser(nb), rd[1 - r] + ser(nb) + UP_LAT)
        assert res[r]["hist"][1] == ("allgather", min(max(rd), end), end, "direct"), r
    # send/recv: the message leaves at the sender's ready time
    rd = [res[r]["ready"]["p2p"] for r in (0, 1)]
    arrive = rd[0] + ser(4 * N_P2P) + UP_LAT
    assert res[0]["hist"][2] == ("send", rd[0], arrive, "p2p")
    assert res[1]["hist"][2] == ("recv", max(rd[1], rd[0]), max(arrive, rd[1]), "p2p")
