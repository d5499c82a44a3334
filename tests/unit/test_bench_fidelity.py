"""The fidelity benchmark's rows (models.published_runs) recomputed at debug size: their
mechanisms, not their figures.

Each row is planned in the published run's mode (lazy, lazy + HPU graphs, with gradient
accumulation); the host-only column must be exactly what its mechanism counts cost at the
seed-fitted host constants (accumulated ops, launches, replays, host->device copies), an HPU
graph's ops must cost no host time each, and an accumulating row must be its micro-steps
plus one full step.
"""

from __future__ import annotations

import dataclasses

import pytest

from hpu_runtime.device.cost_model import pcie_ns
from hpu_runtime.device.spec import get_device_spec
from models import published_runs as bf
from models.calibration import CONSTANTS


def _debug(index: int, **changes) -> bf.Row:
    row = bf.ROWS[index]
    seq = {"seq_len": 32} if row.seq_len else {}
    return dataclasses.replace(row, **seq, **changes)


def _host_from_counts(row: bf.Row, r: bf.RowResult, traces) -> int:
    """Host time per optimizer step from the counts alone, by hand (NOTE [host costs])."""
    spec = get_device_spec(row.device)
    full, micro = traces
    copies = [ev[1] for ev in full.events if ev[0] == "h2d"]
    if micro is not None:
        copies += [ev[1] for ev in micro.events if ev[0] == "h2d"] * (row.accumulation - 1)
    assert len(copies) == r.copies and sum(copies) == r.copied_bytes
    return ((r.ops - r.replayed_ops) * spec.host_op_ns + r.launches * spec.graph_launch_ns
            + r.replays * spec.graph_replay_ns + sum(spec.h2d_copy_ns + pcie_ns(spec, n) for n in copies))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index, changes", [
    (0, dict(micro_batch=4)),                   # ResNet-50, Gaudi2, PyTorch lazy, FusedLARS
    (2, dict(micro_batch=2)),                   # BERT-Large, Gaudi2, lazy + HPU graph, one bf16 all-reduce
    (11, dict(micro_batch=2, accumulation=3)),  # BERT-Large phase 2, first-gen, lazy, accumulation
], ids=["resnet50-lazy", "bert-hpu-graphs", "bert-lazy-accumulation"])
def test_row_mechanisms(index, changes):
    row = _debug(index, **changes)
    traces = bf.trace_row(row, flavour="debug")
    r = bf.plan_row(row, traces)
    assert r.host_ns == _host_from_counts(row, r, traces)
    spec = get_device_spec(row.device)
    if row.checkpoint_every:  # NOTE [a block's checkpoint]: one host read per parameter, shared by the block
        reads = sum(spec.host_read_ns + pcie_ns(spec, p.nbytes) for p in traces[0].params)
        assert len(traces[0].params) > 10 and r.checkpoint_ns == reads // row.checkpoint_every > 0
    else:
        assert r.checkpoint_ns == 0
    assert r.samples_per_s == pytest.approx(row.micro_batch * row.samples_per_sequence * row.accumulation
                                            / ((r.step_ns + r.checkpoint_ns) * 1e-9))
    assert r.buckets == 1  # every published row here reduces its gradients in one bucket at this size
    if row.mode == "hpu_graphs":
        assert r.replays == 2 and r.replayed_ops > r.ops - r.replayed_ops  # forward and backward graphs
    else:
        assert r.replays == r.replayed_ops == 0
    if row.accumulation > 1:  # (k - 1) forward+backward micro-steps, then one full step
        one = bf.plan_row(dataclasses.replace(row, accumulation=1), (traces[0], None))
        micro = bf.plan_row(dataclasses.replace(row, accumulation=2), traces)
        per_micro = micro.step_ns - one.step_ns
        assert per_micro > 0 and r.step_ns == one.step_ns + (row.accumulation - 1) * per_micro
        assert r.ops == one.ops + (row.accumulation - 1) * (micro.ops - one.ops)


def test_every_row_finds_its_published_figure():
    figures = bf.load_figures()
    for row in bf.ROWS:
        assert bf.published_figure(figures, row) is not None, row.label
    assert {bf.ROWS[c.row].mode for c in CONSTANTS} <= {"hpu_graphs", "compile"}  # fitted where the host is off


def test_row_validation():
    with pytest.raises(ValueError, match="unknown mode"):
        dataclasses.replace(bf.ROWS[0], mode="graph")
    with pytest.raises(ValueError, match="optimizer"):
        dataclasses.replace(bf.ROWS[0], optimizer="none")


@pytest.mark.timeout(300)
def test_gaudi2_mlperf_bert_fits_the_card_it_ran_on():
    """Habana trained MLPerf v3.0 BERT-Large (28 packed sequences of 512 per micro-step) on
    96 GB Gaudi2 cards: traced with its script's op lists (softmax and layer_norm in bf16) the
    micro-step fits; with torch's default lists (both in fp32) the attention probabilities alone
    would not."""
    import torch

    from hpu_runtime.bridge.autocast import op_lists

    row = next(r for r in bf.ROWS if r.device == "gaudi2" and r.model == "bert-large" and r.cards == 8)
    assert row.autocast_ops is not None and "softmax" in row.autocast_ops[0]
    full, _ = bf.trace_row(row)
    assert full.peak_hbm_bytes < get_device_spec("gaudi2").hbm_bytes
    # the lists are scoped to the trace: outside it, autocast keeps torch's default (softmax in fp32)
    with torch.autocast("hpu", dtype=torch.bfloat16):
        assert torch.softmax(torch.ones(2, 2, device="hpu"), -1).dtype == torch.float32
    with op_lists(*row.autocast_ops), torch.autocast("hpu", dtype=torch.bfloat16):
        assert torch.softmax(torch.ones(2, 2, device="hpu"), -1).dtype == torch.bfloat16


def test_rows_are_planned_on_the_system_they_ran_on():
    """A figure measured on HLS-1H nodes (four cards each, every port out to the switches; its
    source names the HLS-1H system files) is planned on ``hls1h``, not on HLS-1's 8-card box."""
    figures = bf.load_figures()
    for row in bf.ROWS:
        source = bf.published_figure(figures, row)["source"]
        assert (row.topology == "hls1h") == ("HLS-1H" in source), (row.label, source)
    with pytest.raises(ValueError, match="unknown topology 'hls9'"):
        dataclasses.replace(bf.ROWS[0], topology="hls9")
