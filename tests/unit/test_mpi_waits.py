"""NOTE [MPI waits] in hccl/transport/mpi.py: a waiting rank yields its core after a few polls,
and sleeps between polls once the spin budget is spent (a fake MPI: no MPI library needed)."""

from __future__ import annotations

import pytest

import hccl.transport.mpi as mpi_mod
from hccl.transport.mpi import MpiTransport
from hccl.transport.shm import HcclTimeoutError


class _Requests:
    """``Testall`` that completes at the ``done_at``-th call; records each call's order."""

    def __init__(self, done_at: int, log: list) -> None:
        self.done_at, self.calls, self.log = done_at, 0, log

    def Testall(self, reqs) -> bool:  # noqa: N802 - mpi4py's name
        self.calls += 1
        self.log.append("test")
        return self.calls >= self.done_at


def _transport(done_at: int, log: list, timeout_s: float = 30.0) -> MpiTransport:
    comm = type("Comm", (), {"Get_rank": lambda self: 0, "Get_size": lambda self: 2})()
    fake_mpi = type("MPI", (), {"Request": _Requests(done_at, log)})
    return MpiTransport(comm, timeout_s, fake_mpi)


def test_the_first_polls_do_not_yield_and_every_later_one_does(monkeypatch):
    log: list = []
    monkeypatch.setattr(mpi_mod.os, "sched_yield", lambda: log.append("yield"))
    monkeypatch.setattr(mpi_mod.time, "sleep", lambda s: log.append("sleep"))
    _transport(200, log)._wait([object()], "allreduce")
    tests = [i for i, e in enumerate(log) if e == "test"]
    assert len(tests) == 200 and "sleep" not in log
    # polls 1 (the check before the loop) .. 1 + _PURE_POLLS: back to back
    head = log[: tests[mpi_mod._PURE_POLLS + 1] + 1]
    assert "yield" not in head
    # every later poll follows a yield
    for a, b in zip(tests[mpi_mod._PURE_POLLS + 1:], tests[mpi_mod._PURE_POLLS + 2:]):
        assert log[a + 1:b] == ["yield"]


def test_past_the_spin_budget_the_waiter_sleeps_and_still_times_out(monkeypatch):
    clock = iter(float(i) for i in range(10**6))  # one wall second per reading
    monkeypatch.setattr(mpi_mod.time, "monotonic", lambda: next(clock))
    slept: list = []
    monkeypatch.setattr(mpi_mod.time, "sleep", slept.append)
    monkeypatch.setattr(mpi_mod.os, "sched_yield", lambda: None)
    with pytest.raises(HcclTimeoutError, match="timed out after 5.0 s in allreduce"):
        _transport(10**9, [], timeout_s=5.0)._wait([object()], "allreduce")
    assert slept and slept[0] == pytest.approx(2e-5) and max(slept) <= 1e-3
