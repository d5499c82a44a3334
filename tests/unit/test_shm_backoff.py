"""The shared-memory wait's back-off: spin, yield, then sleeps doubling to 1 ms, and back to
spinning whenever a point-to-point chunk moved (NOTE [back-off restarts on progress])."""

from __future__ import annotations

import types

from hccl.transport import shm
from hccl.transport.shm import ShmArena


def _waiter():
    """An object with what ``ShmArena._spin`` and ``note_progress`` use, and no peers."""
    w = types.SimpleNamespace(moved=0, timeout_s=3600.0, peer_ranks=[], group_ranks=[0], rank=0)
    w._check_peers = lambda late, what: None
    w.note_progress = lambda: ShmArena.note_progress(w)
    return w


def _record_sleeps(monkeypatch) -> list[float]:
    sleeps: list[float] = []
    monkeypatch.setattr(shm.time, "sleep", sleeps.append)  # counted, never slept
    return sleeps


def test_backoff_grows_to_one_millisecond_without_progress(monkeypatch):
    sleeps = _record_sleeps(monkeypatch)
    w = _waiter()
    polls = iter(range(10_000))
    ShmArena._spin(w, lambda: next(polls) >= 4_100, lambda: [], "test")
    assert sleeps[:3] == [2e-5, 4e-5, 8e-5]
    assert max(sleeps) == 1e-3 and sleeps[-1] == 1e-3


def test_a_chunk_moved_restarts_the_backoff(monkeypatch):
    """After a chunk moved, the wait spins (and yields) again before its next, shortest, sleep."""
    sleeps = _record_sleeps(monkeypatch)
    w = _waiter()
    n = 0

    def arrived() -> bool:
        nonlocal n
        n += 1
        if n == 4_050:  # deep in the sleeping phase
            w.note_progress()
        return n >= 8_200

    ShmArena._spin(w, arrived, lambda: [], "test")
    at_progress = 4_050 - 4_002  # sleeps recorded before the chunk moved (polls 4,002 to 4,049)
    assert sleeps[at_progress - 1] == 1e-3  # the back-off had reached its longest sleep
    after = sleeps[at_progress:]
    assert after[:3] == [2e-5, 4e-5, 8e-5], after[:5]
