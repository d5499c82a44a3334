"""Tests of hpu_runtime.api.metrics (Gaudi-style metric_global / metric_localcontext)."""

import threading

import pytest

from hpu_runtime import metrics
from hpu_runtime.api.metrics import (
    METRIC_NAMES,
    MetricNotFound,
    metric_global,
    metric_localcontext,
    record_compilation,
    record_defragmentation,
    record_fallback,
    record_recipe_cache,
)


@pytest.fixture(autouse=True)
def _clean():
    metrics.reset_all()
    yield
    metrics.reset_all()


@pytest.mark.parametrize("name, keys", [
    ("graph_compilation", ["TotalNumber", "TotalTime", "AvgTime"]),
    ("cpu_fallback", ["TotalNumber", "FallbackOps"]),
    ("recipe_cache", ["TotalHit", "TotalMiss", "RecipeHit", "RecipeMiss"]),
    ("memory_defragmentation", ["TotalNumber", "TotalSuccessful", "AvgTime", "MaxTime"]),
])
def test_zero_at_start_with_gaudi_keys(name, keys):
    """Each metric starts at zero and lists the Gaudi stat names in order."""
    m = metric_global(name)
    assert m.name() == name
    stats = m.stats()
    assert isinstance(stats, list) and [k for k, _ in stats] == keys
    for _, v in stats:
        assert v == 0 or v == {}


def test_graph_compilation_counts_and_times():
    """TotalNumber counts compiles; TotalTime/AvgTime are simulated microseconds."""
    gc = metric_global("graph_compilation")
    record_compilation(150_000_000)
    record_compilation(50_000_000)
    assert dict(gc.stats()) == {"TotalNumber": 2, "TotalTime": 200_000, "AvgTime": 100_000.0}
    assert metric_global("graph_compilation") is gc


def test_cpu_fallback_counts_ops():
    """FallbackOps counts per op name; TotalNumber sums them."""
    for op in ("aten::digamma", "aten::digamma", "aten::lgamma"):
        record_fallback(op)
    s = dict(metric_global("cpu_fallback").stats())
    assert s == {"TotalNumber": 3, "FallbackOps": {"aten::digamma": 2, "aten::lgamma": 1}}


def test_recipe_cache_hits_and_misses():
    """TotalHit/TotalMiss count lookups; named recipes appear in RecipeHit/RecipeMiss."""
    record_recipe_cache(False, "graph_0")
    record_recipe_cache(True, "graph_0")
    record_recipe_cache(True, "graph_0")
    record_recipe_cache(True)
    s = dict(metric_global("recipe_cache").stats())
    assert (s["TotalHit"], s["TotalMiss"]) == (3, 1)
    assert s["RecipeHit"] == {"graph_0": 2} and s["RecipeMiss"] == {"graph_0": 1}


def test_named_recipes_keep_the_most_recently_counted(monkeypatch):
    """NOTE [named recipes, bounded]: past the bound, the name counted longest ago is forgotten
    (a recipe counted again is the newest), while the totals count every lookup."""
    from hpu_runtime.api import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "MAX_NAMED_RECIPES", 3)
    for name in ("a", "b", "a", "c", "d", "a", "e"):
        record_recipe_cache(False, name)
        record_recipe_cache(True, name)
    s = dict(metric_global("recipe_cache").stats())
    # by hand: after a b a c the order (oldest first) is b a c; d drops b; a moves last: c d a; e drops c
    assert s["RecipeMiss"] == {"d": 1, "a": 3, "e": 1} and s["RecipeHit"] == {"d": 1, "a": 3, "e": 1}
    assert (s["TotalHit"], s["TotalMiss"]) == (7, 7)


def test_every_recipe_the_cache_holds_keeps_its_name():
    """The bound is no smaller than either mode's recipe cache (NOTE [named recipes, bounded])."""
    from hpu_runtime.api.metrics import MAX_NAMED_RECIPES
    from hpu_runtime.bridge.config import MAX_EAGER_RECIPES, MAX_LAZY_RECIPES

    assert MAX_NAMED_RECIPES >= max(MAX_EAGER_RECIPES, MAX_LAZY_RECIPES)

def test_stats_returns_copies():
    """Mutating a returned dict does not change the metric."""
    record_fallback("aten::x")
    dict(metric_global("cpu_fallback").stats())["FallbackOps"]["aten::x"] = 99
    assert dict(metric_global("cpu_fallback").stats())["FallbackOps"] == {"aten::x": 1}


def test_defragmentation():
    """memory_defragmentation counts, successes, average and max time (us)."""
    record_defragmentation(2_000, successful=True)
    record_defragmentation(4_000, successful=False)
    assert dict(metric_global("memory_defragmentation").stats()) == {
        "TotalNumber": 2, "TotalSuccessful": 1, "AvgTime": 3.0, "MaxTime": 4}


def test_local_contexts_nest_and_see_only_their_events():
    """A local context counts only its block; nested contexts both count; global sees all."""
    record_compilation(1_000)
    with metric_localcontext("graph_compilation") as outer:
        with metric_localcontext("graph_compilation") as inner:
            record_compilation(1_000)
            record_compilation(1_000)
        assert dict(inner.stats())["TotalNumber"] == 2
        record_compilation(1_000)
    record_compilation(1_000)
    assert dict(outer.stats())["TotalNumber"] == 3
    assert dict(inner.stats())["TotalNumber"] == 2
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == 5


def test_reset():
    """reset() zeroes one metric; reset_all() zeroes all."""
    record_compilation(5)
    record_fallback("a")
    metric_global("graph_compilation").reset()
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == 0
    assert dict(metric_global("cpu_fallback").stats())["TotalNumber"] == 1
    metrics.reset_all()
    assert metrics.snapshot()["cpu_fallback"]["TotalNumber"] == 0


@pytest.mark.parametrize("bad", ["graph_compilations", "", "hits"])
def test_unknown_name_lists_valid(bad):
    """Unknown names raise MetricNotFound (a ValueError) listing all valid names."""
    with pytest.raises(ValueError) as info:
        metric_global(bad)
    assert isinstance(info.value, MetricNotFound)
    for name in METRIC_NAMES:
        assert name in str(info.value)
    with pytest.raises(MetricNotFound):
        with metric_localcontext(bad):
            pass


def test_bad_durations():
    """Negative or non-int durations are rejected."""
    with pytest.raises(ValueError):
        record_compilation(-1)
    with pytest.raises(ValueError):
        record_compilation(1.5)


def test_thread_safe_counting():
    """Concurrent recorders lose no events."""
    def work():
        for _ in range(500):
            record_recipe_cache(True, "g")
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert dict(metric_global("recipe_cache").stats())["TotalHit"] == 2000


def test_htdebug_fallback_op_count_is_the_cpu_fallback_metric():
    """Gaudi's ``htdebug._get_fallback_op_count()`` counts the ops a run sent to the CPU:
    ``digamma`` (on no Gaudi's kernel list) twice, ``lgamma`` never."""
    import torch

    import habana_frameworks.torch.utils.debug as htdebug
    from hpu_runtime import reset_device

    reset_device("gaudi2")
    assert htdebug._get_fallback_op_count() == {}
    x = torch.rand(4, device="hpu") + 1
    torch.digamma(x)
    torch.digamma(x)
    torch.lgamma(x)
    assert htdebug._get_fallback_op_count() == {"aten::digamma": 2}
