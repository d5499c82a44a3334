"""A job spanning emulated hosts: shared memory inside a host, TCP (token-checked) between hosts."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks
from tests.distributed.test_collectives import _all_collectives
from tests.distributed.test_ddp import _compare_backends, _timeline, check_ddp_matches_gloo

TWO_HOSTS = {"RANKS_PER_HOST": "2", "HCCL_HOST_ID": "host{host}", "HCCL_SHM_BUFFER_MB": "0.25"}


def _layout_and_collectives(rank: int, world: int) -> dict:
    pg = dist.group.WORLD
    return {
        "hosts": [list(h) for h in pg.layout.hosts],
        "tcp": pg._coll.transport.mesh is not None,
        "failures": _all_collectives(rank, world),
    }


@pytest.mark.timeout(240)
def test_collectives_across_two_hosts_match_numpy():
    """4 ranks on 2 emulated hosts: every collective still matches numpy; ranks use TCP between hosts."""
    res = run_ranks(_layout_and_collectives, 4, timeout=220, env=TWO_HOSTS)
    assert res[0]["hosts"] == [[0, 1], [2, 3]]
    assert [r["tcp"] for r in res] == [True, True, True, True]  # every rank reaches the other host
    failures = [f for r in res for f in r["failures"]]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(240)
def test_ddp_across_two_hosts_matches_gloo():
    """DDP on 4 ranks in 2 emulated hosts (every DDP mode) ends with gloo's parameters."""
    check_ddp_matches_gloo(run_ranks(_compare_backends, 4, timeout=220, env=TWO_HOSTS))


@pytest.mark.timeout(240)
def test_two_host_simulated_timeline_is_the_same_run_after_run():
    """4 ranks on 2 emulated hosts, twice: the same simulated steps and collective records on
    every rank (the TCP transport's wall-clock never reaches simulated time); DDP's buckets
    crossed the hosts (allreduces recorded, scale-out charged: some comm in every step)."""
    first = run_ranks(_timeline, 4, 256, 256, 0.1, timeout=200, env=TWO_HOSTS)  # a small MLP, small buckets
    second = run_ranks(_timeline, 4, 256, 256, 0.1, timeout=200, env=TWO_HOSTS)
    assert first == second
    steps, records = first[0]
    assert all(s[2] > 0 for s in steps)
    assert len([r for r in records if r[0] == "allreduce"]) >= 3


def _intruder(rank: int, world: int) -> dict:
    pg = dist.group.WORLD
    out = {}
    if rank == 0:
        host, port = pg._coll.transport.mesh.address.rsplit(":", 1)
        assert host == "127.0.0.1"  # loopback unless told otherwise
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"HCCLTCP1" + (1).to_bytes(8, "little") + b"not-the-token".ljust(48, b"\0"))
        s.settimeout(10)
        out["closed"] = s.recv(1) == b""
        s.close()
    dist.barrier()
    t = torch.full((1000,), float(rank))
    dist.all_reduce(t)
    out["sum"] = t[0].item()
    out["refused"] = pg._coll.transport.mesh.refused if pg._coll.transport.mesh is not None else 0
    return out


@pytest.mark.timeout(120)
def test_connection_without_token_is_refused_and_job_continues():
    res = run_ranks(_intruder, 2, env={"RANKS_PER_HOST": "1", "HCCL_HOST_ID": "host{host}"})
    assert res[0]["closed"] is True
    assert res[0]["refused"] == 1
    assert [r["sum"] for r in res] == [1.0, 1.0]


def _mismatch_across_hosts(rank: int, world: int) -> str:
    try:
        dist.all_reduce(torch.ones(10 + (rank >= 2)))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_size_mismatch_across_hosts_fails_on_every_rank():
    res = run_ranks(_mismatch_across_hosts, 4, pg_timeout=60, env=TWO_HOSTS)
    for msg in res:
        assert "tensor sizes differ" in msg or "differ" in msg, msg


def _mismatch_inside_one_host(rank: int, world: int) -> str:
    try:
        dist.all_reduce(torch.ones(10 + (rank == 1)))
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_size_mismatch_inside_one_host_reaches_the_other_host_with_global_ranks():
    """Rank 1 (host 0) passes 11 elements, everyone else 10: every rank of both hosts raises
    the same mismatch, naming global ranks and their sizes (not a closed connection)."""
    res = run_ranks(_mismatch_inside_one_host, 4, pg_timeout=60, env=TWO_HOSTS)
    assert len(set(res)) == 1, res
    msg = res[0]
    assert msg.startswith("CollectiveMismatchError"), msg
    for r, size in ((0, 10), (1, 11), (2, 10), (3, 10)):
        assert f"rank {r}: {size} elements of float32" in msg, msg


def _ragged_alltoall_across_hosts(rank: int, world: int) -> str:
    # rank 3 expects 2 rows from rank 0, which sends it 1: the splits do not add up
    ins = [1, 1, 1, 1]
    outs = [2, 1, 1, 1] if rank == 3 else [1, 1, 1, 1]
    try:
        dist.all_to_all_single(torch.empty(sum(outs), 3), torch.randn(sum(ins), 3), outs, ins)
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_inconsistent_alltoall_splits_across_hosts_fail_on_every_rank():
    """No rank returns success while a peer fails: the same error on all four ranks, naming
    the sender and receiver by global rank."""
    res = run_ranks(_ragged_alltoall_across_hosts, 4, pg_timeout=60, env=TWO_HOSTS)
    assert len(set(res)) == 1, res
    assert res[0].startswith("CollectiveMismatchError"), res[0]
    assert "rank 0 sends 3 elements to rank 3, which expects 6" in res[0], res[0]


def _ring_collectives(rank: int, world: int) -> dict:
    import numpy as np

    pg = dist.group.WORLD
    peers: set[int] = set()
    exchange = pg._coll.transport.exchange

    def spy(sends, recvs, tag, what):
        if "#" in what and not what.startswith("barrier"):
            peers.update(p for p, data in sends if data.numel() > 4 * 8 * (11 + 2 * world))
        return exchange(sends, recvs, tag, what)

    pg._coll.transport.exchange = spy
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(100_003, generator=gen, dtype=torch.float64) for _ in range(world)]
    t = xs[rank].clone()
    dist.all_reduce(t)
    ref = np.sum(np.stack([x.numpy() for x in xs]), axis=0)
    got = [torch.empty(7, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(got, xs[rank][:7])
    return {"allreduce_err": float(np.abs(t.numpy() - ref).max()), "peers": sorted(peers),
            "gather_ok": all(torch.equal(g, x[:7]) for g, x in zip(got, xs))}


@pytest.mark.timeout(180)
def test_hccl_algo_ring_moves_bytes_around_a_ring_across_hosts():
    """HCCL_ALGO=ring: each rank sends data only to its ring successor, results match numpy."""
    res = run_ranks(_ring_collectives, 4, pg_timeout=60, env=TWO_HOSTS | {"HCCL_ALGO": "ring"})
    for r, out in enumerate(res):
        assert out["allreduce_err"] < 1e-9, out
        assert out["gather_ok"], out
        assert out["peers"] == [(r + 1) % 4], out


def _small_then_dead(rank: int, world: int):
    x = torch.randn(64, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    got = x.clone()
    dist.all_reduce(got)  # a pure-TCP phase of 512 B: NOTE [inline small phases]
    if rank == 1:
        os._exit(3)
    try:
        dist.all_reduce(torch.ones(16))
    except RuntimeError as exc:
        return got.tolist(), str(exc)
    return got.tolist(), "no error"


@pytest.mark.timeout(90)
def test_small_phases_between_hosts_run_inline_and_a_dead_peer_is_named():
    """One rank per host: a small allreduce (sent and received on the calling thread) equals
    numpy's; then rank 1 dies and rank 0's next collective names it instead of hanging."""
    res = run_ranks(_small_then_dead, 2, pg_timeout=60, timeout=80, expect_errors=True,
                    env={"RANKS_PER_HOST": "1", "HCCL_HOST_ID": "host{host}"})
    assert res[1] == ("missing", 3)
    status, (got, err) = res[0]
    assert status == "ok"
    xs = [torch.randn(64, generator=torch.Generator().manual_seed(r), dtype=torch.float64).numpy() for r in range(2)]
    np.testing.assert_array_equal(np.asarray(got), xs[0] + xs[1])
    assert "rank 1" in err and "timed out" not in err, err


def _dies_in_a_large_allreduce(rank: int, world: int) -> str:
    dist.barrier()
    if rank == 1:  # dies in the first data phase, after every rank agreed on the call
        transport = dist.group.WORLD._coll.transport
        exchange, calls = transport.exchange, []

        def dying(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                os._exit(3)
            return exchange(*args, **kwargs)

        transport.exchange = dying
    try:
        dist.all_reduce(torch.ones(2 << 20))  # 8 MB: TCP phases through TcpMesh.pump
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_a_dead_rank_is_named_on_the_other_host_too():
    """Hierarchical allreduce over 2 hosts of 2 ranks: rank 1 dies in the reduce-scatter inside
    host 0; rank 0 finds it through shared memory and drops its connections. Rank 2, whose only
    partner on the other host is rank 0, names rank 1 too (NOTE [the first failure names the
    cause]), not "rank 0 closed its connection"."""
    res = run_ranks(_dies_in_a_large_allreduce, 4, pg_timeout=60, timeout=100, expect_errors=True,
                    env=TWO_HOSTS | {"HCCL_ALGO": "hierarchical"})
    assert res[1] == ("missing", 3)
    for rank in (0, 2, 3):
        status, msg = res[rank]
        assert status == "ok", msg
        assert "rank 1" in msg and "timed out" not in msg, (rank, msg)
        cause = msg.split(" [")[0]
        assert not any(f"rank {r} closed its connection" in cause or f"rank {r} is unreachable" in cause
                       for r in (0, 2, 3)), msg


def _subgroup_across_hosts_fails(rank: int, world: int) -> str:
    sub = dist.new_group([1, 2])  # rank 1 on host 0, rank 2 on host 1: TCP between them
    if rank not in (1, 2):
        return "outside"
    if rank == 2:
        os._exit(3)
    try:
        dist.all_reduce(torch.ones(16), group=sub)
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_a_subgroup_across_hosts_names_global_ranks():
    """In the subgroup [1, 2] of 2 hosts x 2 ranks, rank 2 dies: rank 1's error names ranks 2
    and 1 (the global ranks), not the subgroup's 1 and 0."""
    res = run_ranks(_subgroup_across_hosts_fails, 4, pg_timeout=60, timeout=100, expect_errors=True,
                    env=TWO_HOSTS)
    assert res[0] == res[3] == ("ok", "outside") and res[2] == ("missing", 3), res
    status, msg = res[1]
    assert status == "ok", msg
    assert msg.startswith(("ConnectionLost", "PeerFailure")), msg
    assert "rank 2 " in msg and "rank 1" in msg and "rank 0" not in msg and "timed out" not in msg, msg


def _bad_socket_addr(rank: int, world: int) -> str:
    os.environ["HCCL_SOCKET_ADDR"] = "192.0.2.1" if rank == 0 else "127.0.0.1"  # TEST-NET-1: not ours
    try:
        dist.new_group(backend="hccl")
    except Exception as exc:  # noqa: BLE001 - the test reads the text
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_an_address_that_cannot_be_listened_on_names_hccl_socket_addr_on_every_rank():
    """Rank 0's HCCL_SOCKET_ADDR is not an address of this host: rank 0 names the variable and
    its value; every other rank names rank 0 and the same cause, at once (not at the timeout)."""
    res = run_ranks(_bad_socket_addr, 4, pg_timeout=60, timeout=100, env=TWO_HOSTS)
    assert res[0].startswith("ValueError: hccl: rank 0 cannot listen on '192.0.2.1' (HCCL_SOCKET_ADDR='192.0.2.1')"), res[0]
    for msg in res[1:]:
        assert msg.startswith("PeerFailure: hccl: a rank of this group cannot listen"), msg
        assert "rank 0: hccl: rank 0 cannot listen on '192.0.2.1' (HCCL_SOCKET_ADDR='192.0.2.1')" in msg, msg


def _mixed_phases_on_one_thread(rank: int, world: int) -> dict:
    import threading

    transport = dist.group.WORLD._coll.transport
    exchange, mixed = transport.exchange, []

    def counting(sends, recvs, tag, what):
        local = set(transport._local)
        peers = [p for p, _ in sends] + [p for p, _ in recvs]
        if any(p in local for p in peers) and any(p not in local for p in peers):
            mixed.append(1)
        return exchange(sends, recvs, tag, what)

    transport.exchange = counting
    starts, start = [], threading.Thread.start
    threading.Thread.start = lambda self: (starts.append(self.name), start(self))[1]
    try:
        out = []
        for case, numel in enumerate([300, 3 << 20]):  # 1.2 KB and 12 MB
            x = torch.randn(numel, generator=torch.Generator().manual_seed(10 * case + rank), dtype=torch.float64)
            dist.all_reduce(x)
            out.append(x.numpy())
    finally:
        threading.Thread.start = start
    return {"mixed": len(mixed), "threads": starts, "out": out}


@pytest.mark.timeout(120)
def test_phases_mixing_shared_memory_and_tcp_run_on_the_calling_thread():
    """NOTE [one thread per phase]: HCCL_ALGO=ring over 2 hosts of 2 ranks sends to a rank of
    one host while receiving from a rank of the other; those phases start no thread, and the
    sums equal numpy's."""
    res = run_ranks(_mixed_phases_on_one_thread, 4, timeout=100, env=TWO_HOSTS | {"HCCL_ALGO": "ring"})
    for case, numel in enumerate([300, 3 << 20]):
        ref = sum(torch.randn(numel, generator=torch.Generator().manual_seed(10 * case + r),
                              dtype=torch.float64).numpy() for r in range(4))
        for r in res:
            np.testing.assert_allclose(r["out"][case], ref, rtol=1e-12, atol=1e-12)
    assert all(r["mixed"] > 0 for r in res), [r["mixed"] for r in res]
    assert all(r["threads"] == [] for r in res), [r["threads"] for r in res]
