"""Gaudi-style runtime metrics: graph compilations, CPU fallbacks, recipe cache, defragmentation.

Read as on Gaudi (``habana_frameworks.torch.hpu.metrics``)::

    gc = metric_global("graph_compilation")
    dict(gc.stats())          # {"TotalNumber": 3, "TotalTime": 450000, "AvgTime": 150000.0}
    with metric_localcontext("recipe_cache") as rc:
        ...                   # rc counts only what happens inside the block

The bridge records events with the small ``record_*`` functions below.

Stat names per metric (as on Gaudi):

* "graph_compilation": TotalNumber, TotalTime, AvgTime.
* "cpu_fallback": TotalNumber, FallbackOps (dict op name -> count).
* "recipe_cache": TotalHit, TotalMiss, RecipeHit, RecipeMiss (dicts recipe name -> count, of
  at most :data:`MAX_NAMED_RECIPES` recipes each: NOTE [named recipes, bounded]).
* "memory_defragmentation": TotalNumber, TotalSuccessful, AvgTime, MaxTime.

NOTE [metric time unit]: times are *simulated* compile/defragmentation durations reported in
microseconds (TotalTime and MaxTime as ints, AvgTime as a float). The unit is our choice;
Gaudi documents integer times but the emulator's own clock is integer nanoseconds, so divide
by 1000 once, here.

NOTE [named recipes, bounded]: RecipeHit and RecipeMiss name each recipe they count. A run that
makes a recipe per step (an eager op keyed by a Python number that changes every step, as a
learning rate scheduled per step reaches torch's Adam: NOTE [the recipe cache's LRU] in
:mod:`hpu_runtime.bridge.recipe_cache`) would add names for as long as it runs, so each dict
keeps the :data:`MAX_NAMED_RECIPES` most recently counted recipes and forgets the others' names
(TotalHit and TotalMiss still count every lookup). The bound is eager mode's recipe cache's
(:data:`~hpu_runtime.bridge.config.MAX_EAGER_RECIPES`), the larger of the two modes': every
recipe the cache can hold keeps its counts.

NOTE [unknown names]: on Gaudi ``metric_global`` of an unknown name returns None and
``metric_localcontext`` raises ``MetricNotFound``. Here both raise ``MetricNotFound``, a
``ValueError`` subclass whose message lists the valid names, so a typo is not silent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "MAX_NAMED_RECIPES",
    "METRIC_NAMES",
    "Metric",
    "MetricNotFound",
    "metric_global",
    "metric_localcontext",
    "record_compilation",
    "record_defragmentation",
    "record_fallback",
    "record_recipe_cache",
    "reset_all",
    "snapshot",
]

MAX_NAMED_RECIPES = 100_000
"""Recipes named in each of RecipeHit and RecipeMiss, the most recently counted kept (NOTE
[named recipes, bounded]): eager mode's recipe-cache bound (``MAX_EAGER_RECIPES`` in
:mod:`hpu_runtime.bridge.config`; this module imports nothing of the runtime)."""

METRIC_NAMES: tuple[str, ...] = (
    "graph_compilation", "cpu_fallback", "recipe_cache", "memory_defragmentation")

_LOCK = threading.RLock()


class MetricNotFound(ValueError):
    """An unknown metric name was asked for."""


def _check_name(name: str) -> None:
    if name not in METRIC_NAMES:
        raise MetricNotFound(
            f"unknown metric {name!r}; valid metrics: {', '.join(METRIC_NAMES)}")


class Metric:
    """Accumulated statistics of one metric (global or local to a context).

    Use ``stats()`` for the Gaudi list of ``(name, value)`` pairs, ``reset()`` to zero it.
    """

    __slots__ = ("_name", "_count", "_total_ns", "_max_ns", "_successful", "_by_name",
                 "_hits", "_misses", "_hit_by_name", "_miss_by_name")

    def __init__(self, name: str) -> None:
        _check_name(name)
        self._name = name
        self.reset()

    def name(self) -> str:
        """The metric name, e.g. "graph_compilation"."""
        return self._name

    def reset(self) -> None:
        """Zero every statistic."""
        with _LOCK:
            self._count = 0
            self._total_ns = 0
            self._max_ns = 0
            self._successful = 0
            self._by_name: dict[str, int] = {}
            self._hits = 0
            self._misses = 0
            self._hit_by_name: dict[str, int] = {}
            self._miss_by_name: dict[str, int] = {}

    def stats(self) -> list[tuple[str, Any]]:
        """The statistics as an ordered list of ``(name, value)`` pairs (see module doc)."""
        with _LOCK:
            if self._name == "graph_compilation":
                return [("TotalNumber", self._count),
                        ("TotalTime", self._total_ns // 1000),
                        ("AvgTime", self._avg_us())]
            if self._name == "cpu_fallback":
                return [("TotalNumber", self._count), ("FallbackOps", dict(self._by_name))]
            if self._name == "recipe_cache":
                return [("TotalHit", self._hits), ("TotalMiss", self._misses),
                        ("RecipeHit", dict(self._hit_by_name)),
                        ("RecipeMiss", dict(self._miss_by_name))]
            return [("TotalNumber", self._count), ("TotalSuccessful", self._successful),
                    ("AvgTime", self._avg_us()), ("MaxTime", self._max_ns // 1000)]

    def _avg_us(self) -> float:
        return self._total_ns / self._count / 1000.0 if self._count else 0.0

    def __repr__(self) -> str:
        return f"Metric({self._name!r}, {self.stats()!r})"

    # -- updates (called with _LOCK held) --------------------------------------------------
    def _add_timed(self, duration_ns: int, successful: bool = False) -> None:
        self._count += 1
        self._total_ns += duration_ns
        self._max_ns = max(self._max_ns, duration_ns)
        self._successful += 1 if successful else 0

    def _add_named(self, key: str) -> None:
        self._count += 1
        self._by_name[key] = self._by_name.get(key, 0) + 1

    def _add_lookup(self, hit: bool, recipe: str | None) -> None:
        if hit:
            self._hits += 1
            named = self._hit_by_name
        else:
            self._misses += 1
            named = self._miss_by_name
        if recipe is not None:  # NOTE [named recipes, bounded]: the last counted is the newest key
            named[recipe] = named.pop(recipe, 0) + 1
            if len(named) > MAX_NAMED_RECIPES:
                del named[next(iter(named))]


_GLOBAL: dict[str, Metric] = {name: Metric(name) for name in METRIC_NAMES}
_LOCAL: dict[str, list[Metric]] = {name: [] for name in METRIC_NAMES}


def _targets(name: str) -> list[Metric]:
    return [_GLOBAL[name], *_LOCAL[name]]


def metric_global(name: str) -> Metric:
    """The process-wide metric of this name (the same object on every call).

    Raises:
        MetricNotFound: (a ValueError) naming the valid metrics, for an unknown name.
    """
    _check_name(name)
    return _GLOBAL[name]


@contextmanager
def metric_localcontext(name: str) -> Iterator[Metric]:
    """A fresh metric that counts only events recorded while the block runs. Nests.

    Raises:
        MetricNotFound: for an unknown name.
    """
    local = Metric(name)
    with _LOCK:
        _LOCAL[name].append(local)
    try:
        yield local
    finally:
        with _LOCK:
            _LOCAL[name].remove(local)


def _check_ns(duration_ns: int) -> None:
    if not isinstance(duration_ns, int) or isinstance(duration_ns, bool) or duration_ns < 0:
        raise ValueError(f"duration_ns must be an int >= 0, got {duration_ns!r}")


def record_compilation(duration_ns: int) -> None:
    """Count one graph compilation that took ``duration_ns`` of simulated time."""
    _check_ns(duration_ns)
    with _LOCK:
        for m in _targets("graph_compilation"):
            m._add_timed(duration_ns)


def record_fallback(op_name: str) -> None:
    """Count one op executed on the CPU instead of the HPU (e.g. "aten::digamma")."""
    with _LOCK:
        for m in _targets("cpu_fallback"):
            m._add_named(str(op_name))


def record_recipe_cache(hit: bool, recipe: str | None = None) -> None:
    """Count one recipe-cache lookup; ``recipe`` names it in RecipeHit/RecipeMiss.

    The hpu kernel counts an eager op's hit itself, with the same updates of the same
    :class:`Metric` slots under ``_LOCK`` (``record_recipe_hit`` in
    ``hpu_runtime/bridge/csrc/hpu_device.cpp``): a change to this function or to
    :meth:`Metric._add_lookup` goes there too."""
    with _LOCK:
        for m in _targets("recipe_cache"):
            m._add_lookup(bool(hit), recipe)


def record_defragmentation(duration_ns: int, successful: bool = True) -> None:
    """Count one HBM defragmentation of ``duration_ns`` simulated time."""
    _check_ns(duration_ns)
    with _LOCK:
        for m in _targets("memory_defragmentation"):
            m._add_timed(duration_ns, successful)


def reset_all() -> None:
    """Zero every global metric (active local contexts are left alone)."""
    for m in _GLOBAL.values():
        m.reset()


def snapshot() -> dict[str, dict[str, Any]]:
    """All global metrics as ``{metric name: dict(stats)}`` (e.g. for a per-step report)."""
    return {name: dict(m.stats()) for name, m in _GLOBAL.items()}
