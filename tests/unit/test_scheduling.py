"""The suite's own test order under xdist (tests/scheduling.py), against hand-dealt orders."""

from __future__ import annotations

import pytest

from tests.scheduling import deal_slow_modules_first, share_sizes, usable_cpus


class _T:
    def __init__(self, nodeid: str, slow: bool = False) -> None:
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return object() if self.slow and name == "slow" else None

    def __repr__(self) -> str:
        return self.nodeid.rsplit("::", 1)[-1]


def _items() -> list[_T]:
    spec = [("a", "a1", False), ("a", "a2", True), ("b", "b1", False), ("b", "b2", False), ("b", "b3", False),
            ("c", "c1", True), ("c", "c2", True), ("d", "d1", False), ("e", "e1", True)]
    return [_T(f"tests/{m}.py::{name}", slow) for m, name, slow in spec]


def test_worksteal_shares_are_cut_as_xdist_cuts_them() -> None:
    assert share_sizes(9, 2) == [4, 5]
    assert share_sizes(10, 3) == [3, 3, 4]
    assert share_sizes(2, 4) == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="workers"):
        share_sizes(3, 0)


def test_each_share_starts_with_the_modules_dealt_to_it() -> None:
    """c (2 slow tests) goes to the first share, then a and e (1 each) to the second, which has
    fewer so far; the quick modules fill both shares behind them, in collection order."""
    got = [repr(t) for t in deal_slow_modules_first(_items(), 2)]
    assert got == ["c1", "c2", "b1", "b2", "a1", "a2", "e1", "b3", "d1"]
    assert got[:4] == ["c1", "c2", "b1", "b2"]  # the first share as xdist cuts it (share_sizes: 4)


def test_one_worker_or_no_slow_test_keeps_the_order() -> None:
    items = _items()
    assert deal_slow_modules_first(items, 1) == items
    quick = [_T(t.nodeid) for t in items]
    assert deal_slow_modules_first(quick, 2) == quick


@pytest.mark.parametrize("files, cap", [
    ({}, None),  # no cgroup files: the affinity mask alone
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs of quota: 2 workers
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
])
def test_usable_cpus_is_the_affinity_mask_capped_by_the_cgroup_quota(tmp_path, monkeypatch, files, cap):
    """``pytest -n auto``'s worker count: the CPUs the process may run on, capped by a CPU quota."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 5})
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert usable_cpus(tmp_path) == (4 if cap is None else min(4, cap))
