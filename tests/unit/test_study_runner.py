"""The studies' shared runner planning points in worker processes (launchers/study/_runner.py):
rows in the points' order whatever order they finish in, a point's error raised in the caller,
and a point that never finishes ended at the timeout with its worker, not waited for."""

from __future__ import annotations

import os
import time

import pytest

from launchers.study import _runner


def _plan(trace: dict, point: int) -> dict:
    """A stand-in planner: sleeps ``point`` tenths of a second (so the points finish out of
    order), fails on 13, hangs on 99."""
    if point == 13:
        raise ValueError("point 13 refused")
    time.sleep(600 if point == 99 else point / 10)
    return {"point": point, "scale": trace["scale"], "pid": os.getpid()}


def _run(points, **kw):
    return _runner.run_points(points, lambda p: "t", {"t": {"scale": 3}}, _plan, progress=False, jobs=2, **kw)


@pytest.mark.timeout(120)
def test_rows_come_back_in_the_points_order_from_two_workers() -> None:
    rows = _run([5, 1, 3], cost=lambda p: p)  # 5 starts first, 1 and 3 finish before it
    assert [r["point"] for r in rows] == [5, 1, 3] and all(r["scale"] == 3 for r in rows)
    assert len({r["pid"] for r in rows}) == 2 and os.getpid() not in {r["pid"] for r in rows}


@pytest.mark.timeout(120)
def test_a_failing_point_raises_and_a_stuck_one_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="point 13 refused"):
        _run([1, 13])
    monkeypatch.setattr(_runner, "POINT_TIMEOUT_S", 3.0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no study point was planned for 3 s"):
        _run([99, 99])
    assert time.monotonic() - t0 < 60  # the stuck workers were ended, not waited for (600 s)
