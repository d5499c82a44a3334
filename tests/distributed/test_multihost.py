"""A job spanning emulated hosts: shared memory inside a host, TCP (token-checked) between hosts."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks
from tests.distributed.test_collectives import _all_collectives

TWO_HOSTS = {"RANKS_PER_HOST": "2", "HCCL_HOST_ID": "host{host}", "HCCL_SHM_BUFFER_MB": "0.25"}


def _layout_and_collectives(rank: int, world: int) -> dict:
    pg = dist.group.WORLD
    return {
        "hosts": [list(h) for h in pg.layout.hosts],
        "tcp": pg._coll.mesh is not None,
        "failures": _all_collectives(rank, world),
    }


@pytest.mark.timeout(240)
def test_collectives_across_two_hosts_match_numpy():
    """4 ranks on 2 emulated hosts: every collective still matches numpy; leaders use TCP."""
    res = run_ranks(_layout_and_collectives, 4, timeout=220, env=TWO_HOSTS)
    assert res[0]["hosts"] == [[0, 1], [2, 3]]
    assert [r["tcp"] for r in res] == [True, False, True, False]
    failures = [f for r in res for f in r["failures"]]
    assert not failures, "\n".join(failures[:20])


def _intruder(rank: int, world: int) -> dict:
    pg = dist.group.WORLD
    out = {}
    if rank == 0:
        host, port = pg._coll.mesh.address.rsplit(":", 1)
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
    out["refused"] = pg._coll.mesh.refused if pg._coll.mesh is not None else 0
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
