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


def test_a_blocks_checkpoint_weighs_more_on_shorter_blocks():
    """A series whose published blocks end with a checkpoint (the MLPerf v3.0 Gaudi2 BERT run):
    each optimizer step carries its share of one host read per parameter, so the point with
    fewer steps per block loses more per card; the per-step times differ by exactly that share."""
    import dataclasses

    from hpu_runtime.device.spec import get_device_spec

    s = bench_scaling.Series("test", "mlp", "gaudi2", "hls2", "-", ((8, 16), (64, 16)), mode="compile")
    traces = bench_scaling._traces(s)
    plain = bench_scaling._simulated(s, traces, steps=2, variability=Variability(seed=0))
    ckpt = bench_scaling._simulated(dataclasses.replace(s, checkpoint_every=(300, 50)), traces, steps=2,
                                    variability=Variability(seed=0))
    spec = get_device_spec("gaudi2")
    one = sum(spec.host_read_ns + p.nbytes / spec.pcie_bytes_per_s * 1e9 for p in traces[16].params)
    for cards, every in ((8, 300), (64, 50)):
        extra_s = 16 / ckpt[cards] - 16 / plain[cards]
        assert abs(extra_s * 1e9 - one / every) < 1e-3 * one / every
    assert ckpt[64] / ckpt[8] < plain[64] / plain[8]


def test_the_table_names_the_rows_beyond_the_target(capsys):
    """Rows more than 3 points off (either sign) are named after the table; exactly 3 is within."""
    row = ["S", "8 -> 32", "16", "0.900", "0.930", "+3.0", "prediction"]
    far = ["T", "8 -> 128", "16", "0.827", "0.998", "+17.1", "prediction"]
    under = ["U", "16 -> 64", "128", "0.989", "0.950", "-3.9", "calibration"]
    bench_scaling.print_table([row])
    assert "every row within the 3-point target" in capsys.readouterr().out
    bench_scaling.print_table([row, far, under])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("beyond the 3-point target: T 8 -> 128 (+17.1); U 16 -> 64 (-3.9)")
    assert " S " not in last
