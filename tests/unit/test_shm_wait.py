"""The shared-memory wait: a short spin, then a sleep in the kernel that the publishing rank ends
(NOTE [futex doorbells] in hccl/transport/futex.py), with the same dead-peer and timeout checks.

The ranks here are forked processes over two segments the test creates. Peer checks and the
waits' timeout are pushed to an hour away, so a waiter that slept through its ring would stay
asleep, and be killed at the test's 60 s limit (a failure), instead of being rescued by the next
periodic check."""

from __future__ import annotations

import multiprocessing as mp
import time
import types

import pytest

from hccl.transport import shm
from hccl.transport.shm import ShmArena, ShmSegment


@pytest.fixture()
def segments(monkeypatch):
    monkeypatch.setattr(shm, "SPIN_S", 0.0)  # every wait that is not over at once sleeps
    monkeypatch.setattr(shm, "CHECK_S", 3600.0)
    segs = [ShmSegment(f"hccl_test_wait_{i}", 4096, create=True, p2p_slots=2) for i in range(2)]
    yield segs
    for s in segs:
        s.close()


def _run(target, *args) -> list[int]:
    ctx = mp.get_context("fork")  # the children share the segments' mappings and the patches
    procs = [ctx.Process(target=target, args=(rank, *args)) for rank in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60.0
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def _woken(rank: int, segs) -> None:
    arena = ShmArena(segs, rank, timeout_s=3600.0)
    if rank == 1:
        arena.signal()
        arena.wait_all("test")  # sleeps: rank 0 has not signalled
        raise SystemExit(0)
    deadline = time.monotonic() + 20.0
    while not segs[1].ctrl[shm._SLEEP_W] and time.monotonic() < deadline:
        pass  # until rank 1 sleeps in the kernel
    asleep = bool(segs[1].ctrl[shm._SLEEP_W])
    arena.signal()  # rings rank 1's doorbell
    arena.wait_all("test")
    raise SystemExit(0 if asleep else 3)


def test_a_sleeping_waiter_is_woken_by_the_round_it_waits_for(segments):
    assert _run(_woken, segments) == [0, 0]


def _lockstep(rank: int, segs, rounds: int) -> None:
    arena = ShmArena(segs, rank, timeout_s=3600.0)
    for _ in range(rounds):
        arena.signal()
        arena.wait_all("test")
    raise SystemExit(0)


def test_lockstep_rounds_never_lose_a_wakeup(segments):
    """Thousands of rounds, each waiter sleeping whenever its peer is not there yet: a lost
    ring (the sleeper's flag and the publisher's round crossing) would leave one asleep."""
    assert _run(_lockstep, segments, 3000) == [0, 0]


def test_moving_chunks_keep_the_wait_spinning(monkeypatch):
    """NOTE [back-off restarts on progress]: while chunks move, the wait never sleeps; once they
    stop, it does."""
    monkeypatch.setattr(shm, "SPIN_S", 1e-3)
    moving = types.SimpleNamespace(until=time.monotonic() + 0.05, polls=0)
    sleeps = []  # per sleep: had the chunks stopped moving?
    monkeypatch.setattr(shm, "futex_wait", lambda addr, value, timeout_s: sleeps.append(time.monotonic() >= moving.until))
    seg = ShmSegment("hccl_test_wait_solo", 4096, create=True)
    try:
        arena = ShmArena([seg], 0, timeout_s=20.0)

        def arrived() -> bool:  # a chunk moves at every poll for 50 ms; then nothing, until 3 sleeps
            moving.polls += 1
            if time.monotonic() < moving.until:
                arena.note_progress(0)
                return False
            return len(sleeps) >= 3

        arena._spin(arrived, lambda: [], "test")
    finally:
        seg.close()
    assert moving.polls > 100 and sleeps == [True, True, True]
