"""The order the suite's tests are dealt to pytest-xdist's workers: the long ones first.

``pytest -n auto`` runs with ``--dist worksteal`` (``pyproject.toml``): xdist cuts the
collected tests into one contiguous share per worker, in collection order, and a worker that
runs out takes half of the longest remaining queue from its back. In collection order the
suite's long end-to-end cases (the optimum-habana, Ray and launcher modules, about 20-100 s
each on 2 cores) came near the end of the first share, so one worker was still running them
50 s after the other had finished everything else (a full run, per-test start and end times).
:func:`deal_slow_modules_first` puts each module holding a test marked ``slow`` at the front
of one share, spread over the shares by how many slow tests each holds (the largest first, to
the share with the fewest so far); the quick tests fill the shares behind them, so the last
tests to run, stolen from the back of a queue, are short ones. Whole modules move, in their
own order, so a module-scoped fixture (a module's Ray cluster) is still set up once per share.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["SLOW", "deal_slow_modules_first", "share_sizes", "usable_cpus"]

SLOW = "slow"
"""The marker of an end-to-end case that takes 20 s or more on 2 cores."""


def usable_cpus(cgroup: str | os.PathLike = "/sys/fs/cgroup") -> int:
    """How many CPUs this process can keep busy: the CPUs it may run on (its affinity mask),
    capped by its cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, rounded up); at least 1. The worker count of ``pytest -n auto``
    (``tests/conftest.py``).

    xdist's own count is psutil's *physical* cores: on a VM whose 2 vCPUs are presented as the
    two threads of one core that is 1, and the suite ran on one worker, at over twice its wall
    time; and psutil reads neither the affinity mask nor a quota, so in a container it may
    count the whole host's cores.

    Args:
        cgroup: where the cgroup file system is mounted (a test passes a folder of its own).
    """
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    root = Path(cgroup)
    quota = period = None
    try:
        fields = (root / "cpu.max").read_text().split()
        if fields and fields[0] != "max":
            quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000
    except (OSError, ValueError):
        try:
            q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
            if q > 0:
                quota, period = q, int((root / "cpu" / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            pass
    if quota is not None and period:
        n = min(n, math.ceil(quota / period))
    return max(1, n)


class _Item(Protocol):
    nodeid: str

    def get_closest_marker(self, name: str) -> object | None: ...


def share_sizes(n: int, workers: int) -> list[int]:
    """How many of ``n`` tests each of ``workers`` shares holds, as worksteal cuts them: each
    idle worker in turn takes ``remaining // workers_left`` (xdist 3.x,
    ``WorkStealingScheduling.check_schedule``).

    Raises:
        ValueError: ``workers`` < 1 or ``n`` < 0.
    """
    if workers < 1 or n < 0:
        raise ValueError(f"share_sizes: need workers >= 1 and n >= 0, got workers={workers}, n={n}")
    sizes, left = [], n
    for i in range(workers):
        take = left // (workers - i)
        sizes.append(take)
        left -= take
    return sizes


def deal_slow_modules_first(items: Sequence[_Item], workers: int) -> list[_Item]:
    """``items`` reordered so that each worker's share starts with modules holding slow tests.

    Args:
        items: the collected tests, in collection order (anything with a ``nodeid`` and
            ``get_closest_marker``, as pytest's items have).
        workers: how many xdist workers share them (1: the order is kept).

    Returns:
        A permutation of ``items``: the shares :func:`share_sizes` cuts, each starting with the
        modules dealt to it (whole, in collection order), then the other tests in collection
        order. Unchanged when no test is marked :data:`SLOW` or there is one worker.
    """
    modules: dict[str, list[_Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    slow = {m: sum(1 for t in tests if t.get_closest_marker(SLOW) is not None) for m, tests in modules.items()}
    heavy = [m for m in modules if slow[m]]
    if workers <= 1 or not heavy:
        return list(items)
    shares: list[list[_Item]] = [[] for _ in range(workers)]
    weight = [0] * workers
    for m in sorted(heavy, key=lambda m: -slow[m]):  # stable: ties keep collection order
        i = min(range(workers), key=lambda k: (weight[k], k))
        shares[i].extend(modules[m])
        weight[i] += slow[m]
    quick = [t for m, tests in modules.items() if not slow[m] for t in tests]
    at = 0
    for share, size in zip(shares, share_sizes(len(items), workers)):
        take = max(0, size - len(share))
        share.extend(quick[at:at + take])
        at += take
    shares[-1].extend(quick[at:])
    return [t for share in shares for t in share]
