"""The device model's op classes and graph schedule, against hand-computed rooflines."""

from __future__ import annotations

import dataclasses

import torch

from hpu_runtime.device.cost_model import OpCost, op_cost, recost
from hpu_runtime.device.lazy_graph import OpRecord, graph_op_times
from hpu_runtime.device.spec import get_device_spec

aten = torch.ops.aten
# Round numbers instead of the calibrated ones, so every expectation below is hand arithmetic.
SPEC = dataclasses.replace(get_device_spec("gaudi2"), mme_efficiency=1.0, mme_tile=128, hbm_efficiency=1.0,
                           hbm_bytes_per_s=1e12, mme_bf16_flops_per_s=400e12)


def _cost(func, *args, **kwargs) -> OpCost:
    return op_cost(SPEC, func, args, kwargs, func(*args, **kwargs))


def test_matmul_narrower_than_the_mme_tile_uses_a_fraction_of_it():
    a, b = torch.ones(4096, 4096, dtype=torch.bfloat16), torch.ones(4096, 64, dtype=torch.bfloat16)
    c = _cost(aten.mm.default, a, b)
    assert c.op_class == "matmul" and c.flops == 2 * 4096 * 4096 * 64
    # 64 output columns fill half of a 128-wide tile: 2.1475e9 FLOP / (400e12 x 0.5) = 10,737 ns
    assert c.compute_ns == 10_737
    assert recost(dataclasses.replace(SPEC, mme_tile=64), c).compute_ns == 5_368  # a tile it fills


def test_convolution_backward_splits_its_flops_between_input_and_weight_gradients():
    x = torch.ones(8, 32, 16, 16, dtype=torch.bfloat16)
    w = torch.ones(256, 32, 3, 3, dtype=torch.bfloat16)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    fwd = op_cost(SPEC, aten.convolution.default, args, {}, out)
    assert fwd.op_class == "convolution" and fwd.gemms == ((1.0, (256,)),)  # 256 output channels: full
    assert fwd.compute_ns == int(fwd.flops / 400e12 * 1e9)
    bargs = (torch.ones_like(out), x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    bwd = op_cost(SPEC, aten.convolution_backward.default, bargs, {}, aten.convolution_backward.default(*bargs))
    # input gradient: 32 channels (1/4 of the tile); weight gradient: 256 x 288 outputs (full)
    assert bwd.gemms == ((0.5, (32,)), (0.5, (256, 288)))
    assert bwd.compute_ns == int((bwd.flops / 2 / (400e12 / 4) + bwd.flops / 2 / 400e12) * 1e9)


def test_attention_flops_are_counted_on_the_mme():
    q = torch.ones(2, 4, 128, 64, dtype=torch.bfloat16)
    c = _cost(aten._scaled_dot_product_flash_attention_for_cpu.default, q, q, q)
    assert c.engine == "MME" and c.op_class == "attention"
    assert c.flops == 2 * (2 * 4 * 128 * 128 * 64) * 2  # scores and values, 2 FLOP per multiply-add


def test_normalization_reads_its_input_twice_and_factories_read_nothing():
    x = torch.ones(1 << 20)
    ln = _cost(aten.native_layer_norm.default, x.view(1024, 1024), [1024], None, None, 1e-5)
    assert ln.op_class == "normalization" and ln.bytes_in == 2 * 4 * (1 << 20)
    zeros = _cost(aten.zeros_like.default, x)
    empty = _cost(aten.empty_like.default, x)
    assert (zeros.bytes_in, zeros.bytes_out) == (0, 4 << 20) and (empty.bytes_in, empty.bytes_out) == (0, 0)


def _op(engine: str, ns: int, reads=(), writes=()) -> OpRecord:
    cost = OpCost(name=engine, engine=engine, flops=0, bytes_in=0, bytes_out=0, low_precision=True,
                  device_ns=ns, compute_ns=ns)
    return OpRecord((engine, ns), cost, tuple((s, 0) for s in reads), tuple((s, 0, True, True) for s in writes))


def test_mme_and_tpc_run_at_once_and_consumers_stream_behind_producers():
    """An MME op and an independent TPC op overlap; a TPC op reading the MME's output starts
    with it (sliced) and ends no earlier; the shares add up to the graph's time."""
    ops = [_op("MME", 10_000, writes=(1,)), _op("TPC", 4_000, writes=(2,)),  # independent: overlaps
           _op("TPC", 3_000, reads=(1,), writes=(3,)),                       # streams behind the MME op
           _op("TPC", 8_000, reads=(3,), writes=(4,))]
    shares = graph_op_times(SPEC, ops)
    # MME 0-10,000; TPC 0-4,000; consumer starts at 4,000 (TPC free), ends at max(7,000, 10,000);
    # the last starts at 10,000 and ends at 18,000
    assert shares == [10_000, 0, 0, 8_000] and sum(shares) == 18_000


def test_every_op_of_a_graph_takes_the_fixed_op_overhead_on_its_engine():
    """op_overhead_ns (first-gen Gaudi's calibrated per-node cost) lengthens each op on its
    engine: the same graph as above with 1,000 ns per op, scheduled by hand."""
    ops = [_op("MME", 10_000, writes=(1,)), _op("TPC", 4_000, writes=(2,)),
           _op("TPC", 3_000, reads=(1,), writes=(3,)),
           _op("TPC", 8_000, reads=(3,), writes=(4,))]
    shares = graph_op_times(dataclasses.replace(SPEC, op_overhead_ns=1_000), ops)
    # MME 0-11,000; TPC 0-5,000; the consumer starts at 5,000 and ends at max(9,000, 11,000);
    # the last starts at 11,000 and ends at 20,000
    assert shares == [11_000, 0, 0, 9_000] and sum(shares) == 20_000


def test_grouped_convolution_backward_counts_each_group_once():
    """The weight gradient of a grouped convolution is ``groups`` dense ones of ``1 / groups``
    the channels (NOTE [grouped convolution backward FLOPs]): its FLOPs equal ``groups`` times
    those of one group's dense convolution, counted by torch's flop counter (whose own count of
    the grouped op multiplies every input channel with every output channel)."""
    def bwd_flops(n, cin, cout, groups, hw=14, k=3, mask=(True, True, False)):
        x = torch.ones(n, cin, hw, hw, dtype=torch.bfloat16)
        w = torch.ones(cout, cin // groups, k, k, dtype=torch.bfloat16)
        out = aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], groups)
        args = (torch.ones_like(out), x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], groups, list(mask))
        return _cost(aten.convolution_backward.default, *args).flops

    for cin, cout, groups in ((64, 64, 64), (128, 128, 32), (96, 192, 3)):  # depthwise, ResNeXt, other
        one_group = bwd_flops(4, cin // groups, cout // groups, 1)
        assert bwd_flops(4, cin, cout, groups) == groups * one_group
        for mask in ((True, False, False), (False, True, False)):
            assert bwd_flops(4, cin, cout, groups, mask=mask) == groups * bwd_flops(4, cin // groups, cout // groups, 1,
                                                                                     mask=mask)
    # a dense convolution keeps the flop counter's own count: 2 x (2 N H W Cout Cin k^2)
    assert bwd_flops(4, 32, 64, 1) == 2 * 2 * 4 * 14 * 14 * 64 * 32 * 9
