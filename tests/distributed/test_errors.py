"""Bad input and failing peers give clear errors on every rank, never a hang."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import giving_up, run_ranks, stay_silent


def _bad_arguments(rank: int, world: int) -> dict:
    out = {}
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND)
    except ValueError as exc:
        out["op"] = str(exc)
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.uint16))  # moved, never reduced
    except TypeError as exc:
        out["dtype"] = str(exc)
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG)
    except TypeError as exc:
        out["bool_avg"] = str(exc)
    try:
        dist.broadcast(torch.ones(2), src=world + 3)
    except (ValueError, RuntimeError) as exc:
        out["root"] = str(exc)
    # the group still works after rejected arguments (nothing was sent)
    t = torch.ones(3)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    # then ranks disagree on the size: every rank must get the same clear error
    numel = 100_000 + rank  # above the one-round path on rank 0, too
    try:
        dist.all_reduce(torch.ones(numel))
    except RuntimeError as exc:
        out["mismatch"] = str(exc)
    try:
        dist.all_reduce(torch.ones(2))
    except RuntimeError as exc:
        out["after_error"] = str(exc)
    return out


@pytest.mark.timeout(120)
def test_bad_arguments_and_size_mismatch():
    """BAND, a uint16 sum, root out of range: named; different sizes: same error on every rank, fast."""
    res = run_ranks(_bad_arguments, 3, pg_timeout=60)
    for rank, r in enumerate(res):
        assert "BAND" in r["op"]
        assert "AVG of a bool" in r["bool_avg"]  # refused before the exchange: the group goes on
        assert "uint16" in r["dtype"] and "cannot be reduced" in r["dtype"]
        assert "root" in r["root"] or "rank" in r["root"]
        assert r["after"] == [3.0, 3.0, 3.0]
        assert "tensor sizes differ" in r["mismatch"], r
        assert "rank 0: 100000 elements of float32" in r["mismatch"]
        assert "rank 2: 100002 elements of float32" in r["mismatch"]
        assert "timed out" not in r["mismatch"] and "timeout" not in r["mismatch"].lower(), r
        assert "unusable" in r["after_error"]


def _dead_peer(rank: int, world: int) -> str:
    if rank == 1:
        os._exit(3)  # dies without a word
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except RuntimeError as exc:
        return f"{time.monotonic() - t0:.1f}s dead_rank={getattr(exc, 'dead_rank', None)} {exc}"
    return "no error"


@pytest.mark.timeout(90)
def test_dead_peer_is_named():
    """A rank that dies makes the others raise PeerFailure naming it, well before the timeout."""
    res = run_ranks(_dead_peer, 2, pg_timeout=60, timeout=60, expect_errors=True)
    assert res[1] == ("missing", 3)
    status, msg = res[0]
    assert status == "ok", msg
    elapsed, _, text = msg.partition(" ")
    assert text.startswith("dead_rank=1 "), text  # what a launcher names (launchers.ray_train)
    assert "rank 1" in text and "died" in text, text
    assert "PeerFailure" in text or "timed out" not in text, text


def _subgroup_failures(rank: int, world: int) -> str:
    sizes, deaths = dist.new_group([1, 2]), dist.new_group([1, 2])
    if rank == 0:
        return "outside"
    try:
        dist.all_reduce(torch.ones(4 + (rank == 2)), group=sizes)
        mismatch = "no error"
    except RuntimeError as exc:
        mismatch = str(exc)
    if rank == 2:
        os._exit(3)
    try:
        dist.all_reduce(torch.ones(10), group=deaths)
    except RuntimeError as exc:
        return f"{mismatch}\ndead_rank={getattr(exc, 'dead_rank', None)} {exc}"
    return f"{mismatch}\nno error"


@pytest.mark.timeout(90)
def test_subgroup_errors_name_global_ranks():
    """In the subgroup [1, 2] of 3 ranks, a size mismatch and a death are named by the ranks'
    global numbers (2, not its group rank 1), as the TCP and MPI transports name them."""
    res = run_ranks(_subgroup_failures, 3, pg_timeout=60, timeout=60, expect_errors=True)
    assert res[0] == ("ok", "outside") and res[2] == ("missing", 3), res
    status, msg = res[1]
    assert status == "ok", msg
    mismatch, death = msg.split("\n")
    assert "rank 1: 4 elements of float32" in mismatch and "rank 2: 5 elements of float32" in mismatch, mismatch
    assert death.startswith("dead_rank=2 ") and "rank 2 (pid" in death and "died while rank 1 " in death, death


def _silent_peer(rank: int, world: int) -> str:
    if rank == 1:
        stay_silent()
        return "waited"
    t0 = time.monotonic()
    with giving_up():
        try:
            dist.all_reduce(torch.ones(10))
        except RuntimeError as exc:
            return f"{time.monotonic() - t0:.1f} {type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(90)
def test_silent_peer_times_out():
    """A live peer that never joins: HcclTimeoutError after the group's timeout, naming it."""
    res = run_ranks(_silent_peer, 2, pg_timeout=2)
    elapsed, _, msg = res[0].partition(" ")
    assert "HcclTimeoutError" in msg and "rank(s) 1" in msg, msg
    assert float(elapsed) >= 1.5, "the group's 2 s timeout must not fire early"


def _p2p_mismatch(rank: int, world: int) -> str:
    if rank == 0:
        dist.send(torch.ones(10), dst=1)
        return "sent"
    try:
        dist.recv(torch.empty(11), src=0)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(90)
def test_recv_of_wrong_size_names_both_sizes():
    res = run_ranks(_p2p_mismatch, 2)
    assert "rank 0 sent 10 elements of float32, the receive expects 11 elements of float32" in res[1], res[1]
