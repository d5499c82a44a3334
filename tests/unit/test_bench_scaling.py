"""models.bench_scaling plans each published series in its own mode (compile included)."""

from __future__ import annotations

from hccl.sim.variability import Variability
from models import bench_scaling


def test_compile_series_is_traced_with_ddps_graph_breaks():
    """A compile-mode series is traced as torch.compile(DDP) at the cap the planner uses, so the
    planner accepts it (a trace compiled as one graph would be refused), and per-card throughput
    falls from 8 to 64 cards, never rises."""
    s = bench_scaling.Series("test", "mlp", "gaudi2", "hls2", "-", ((8, 16), (64, 16)), mode="compile")
    traces = bench_scaling._traces(s)
    assert set(traces) == {16} and traces[16].mode == "compile"
    assert traces[16].ddp_split is not None
    lazy = bench_scaling._traces(bench_scaling.Series("test", "mlp", "gaudi2", "hls2", "-", ((8, 16),)))
    assert lazy[16].mode == "lazy"
    rate = bench_scaling._simulated(s, traces, steps=2, variability=Variability(seed=0))
    assert set(rate) == {8, 64} and 0 < rate[64] <= rate[8]
