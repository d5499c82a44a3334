"""Per-op device cost on a simulated Gaudi, by op class.

Each aten op falls in one class (:data:`OP_CLASSES`), and its time alone is a roofline
``max(flops / (peak x efficiency), HBM bytes / (HBM bandwidth x efficiency))``:

==================  =========  ==================================================================
class               engine     work
==================  =========  ==================================================================
``matmul``          MME        mm, addmm, bmm, baddbmm... (``torch.utils.flop_counter``'s FLOPs)
``convolution``     MME        convolution and its backward (flop counter's FLOPs; the weight
                               gradient of a grouped convolution per group, NOTE [grouped
                               convolution backward FLOPs])
``attention``       MME        scaled-dot-product attention, fused (flash) forward and backward
                               (the flop counter's SDPA formulas; Gaudi runs it as FusedSDPA)
``normalization``   TPC        batch/layer norm forward and backward, softmax and log-softmax:
                               the input is read twice (a statistics pass, then the normalizing
                               pass; NOTE [normalization passes])
``elementwise``     TPC        everything else, one FLOP per output element: bandwidth-bound
``fused_optimizer`` TPC        the ``hpex`` fused optimizer kernels (one kernel over every
                               parameter, gradient and state tensor; priced by the bridge)
==================  =========  ==================================================================

Peak rates depend on the dtype (bf16/fp16 vs fp32). The MME's efficiency depends on the
shape through the roofline (a GEMM with a short reduction is bound by the bytes it moves)
and through the MME's tile (NOTE [MME shape efficiency]). All constants come from a
:class:`~hpu_runtime.device.spec.DeviceSpec` (NOTE [calibration] there says which were
fitted to which published figure); results are simulated nanoseconds, not measured time.

NOTE [MME shape efficiency]
The MME is a fixed array of multiply-accumulate units that computes an output tile of
``mme_tile x mme_tile`` elements at a time; a matrix product whose output is narrower than
the array in a dimension leaves the rest of the array idle. So a product's compute time is
divided by its utilization ``prod(min(1, d / mme_tile))`` over its output dimensions: for
``mm``/``bmm`` the output's rows and columns; for a convolution the output channels per
group (its rows, batch x height x width, are always many); for its backward, half the
FLOPs at the input channels (the input gradient) and half at output channels x input
channels x kernel taps (the weight gradient). Intel publishes no MME geometry; the tile
side is fitted per generation (NOTE [calibration] in :mod:`hpu_runtime.device.spec`).

NOTE [grouped convolution backward FLOPs]
torch 2.13's ``torch.utils.flop_counter`` counts the weight gradient of
``convolution_backward`` as one convolution of the transposed input with the transposed
output gradient (``conv_backward_flop`` in ``torch/utils/flop_counter.py``), which ignores
``groups``: every input channel is multiplied with every output channel's gradient, though a
grouped convolution's weight only joins the ``C_in / groups`` channels of its own group. For a
depthwise convolution (``groups = C_in``, EfficientNet, MobileNet, ConvNeXt) that is ``C_in``
times the real work (672x for EfficientNet-B0's widest depthwise layer; 32x for ResNeXt's
grouped 3x3 convolutions). :func:`op_cost` divides that term by ``groups``: the weight gradient
of a grouped convolution is ``groups`` independent dense ones, each ``1 / groups`` of
the count. The input-gradient term already counts per group (it uses the weight's shape).

NOTE [normalization passes]
A training-mode normalization needs statistics of its input before it can normalize it
(batch norm: mean and variance over N, H, W; layer norm: over the hidden size; softmax:
max and sum over the row). The input is larger than on-chip memory for any real batch, so
the kernel streams it twice from HBM: once for the statistics, once to normalize and
write. Backward likewise reduces ``dy`` and ``dy * x_hat`` before it writes ``dx``. Modelled
as one extra read of the op's first tensor input (modelling assumption).

NOTE [fusion inside a graph]
:func:`op_cost` gives an op's time as if it ran alone (every input read from HBM, every
output written to HBM). Inside a launched lazy-mode graph the graph compiler fuses chains
of TPC ops: :func:`hpu_runtime.device.lazy_graph.graph_op_times` drops the traffic of
intermediates (NOTE [fusion inside a graph, deterministic] there) and re-applies the roofline
with :func:`fused_time_ns`.

Other costs here: host<->device copies over PCIe (:func:`pcie_ns`), a CPU-fallback op on
the host (:func:`host_op_time_ns`) and a graph compile (:func:`compile_ns`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from .spec import DeviceSpec

__all__ = [
    "OP_CLASSES",
    "OpCost",
    "charged_nbytes",
    "compile_ns",
    "fused_time_ns",
    "host_op_time_ns",
    "op_cost",
    "op_time_ns",
    "pcie_ns",
    "read_back_ns",
    "recost",
    "state_dict_to_host_ns",
    "tensor_bytes",
]

_LOW_PRECISION = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)

OP_CLASSES = ("matmul", "convolution", "attention", "normalization", "elementwise", "fused_optimizer")
"""The op classes of the cost model (see the module docstring)."""

_aten = torch.ops.aten
_CONVOLUTION = frozenset({_aten.convolution, _aten.convolution_backward, _aten._convolution})
_NORMALIZATION = frozenset({
    _aten.native_batch_norm, _aten.native_batch_norm_backward, _aten._native_batch_norm_legit,
    _aten._native_batch_norm_legit_functional, _aten._native_batch_norm_legit_no_training,
    _aten.native_layer_norm, _aten.native_layer_norm_backward,
    _aten._softmax, _aten._log_softmax, _aten._softmax_backward_data, _aten._log_softmax_backward_data,
})


_WRITE_ONLY = frozenset({_aten.zeros_like, _aten.ones_like, _aten.full_like, _aten.rand_like, _aten.randn_like,
                         _aten.randint_like, _aten.bernoulli_, _aten.fill_, _aten.zero_, _aten.normal_,
                         _aten.uniform_})
"""Ops that write their output without reading their tensor argument's values (it only
gives the shape, or is the destination)."""
_NO_TRAFFIC = frozenset({_aten.empty_like, _aten.empty, _aten.empty_strided})
"""Allocations: no HBM traffic at all."""


def _conv_backward_flops(formula, args: tuple, kwargs: dict, out: object) -> int:
    """FLOPs of ``convolution_backward(*args)``: the flop counter's input-gradient term plus its
    weight-gradient term divided by ``groups`` (NOTE [grouped convolution backward FLOPs])."""
    names = ("groups", "output_mask")
    if len(args) < 11 or any(k in kwargs for k in names):  # not in the dispatcher's positional form
        return int(formula(*args, **kwargs, out_val=out))
    groups, mask = args[9], list(args[10])
    if not isinstance(groups, int) or groups <= 1:
        return int(formula(*args, **kwargs, out_val=out))
    grad_input = int(formula(*args[:10], [mask[0], False, False], out_val=out)) if mask[0] else 0
    grad_weight = int(formula(*args[:10], [False, mask[1], False], out_val=out)) // groups if mask[1] else 0
    return grad_input + grad_weight


def _sdpa_forward_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _sdpa_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


# torch's flop counter knows the CUDA attention kernels; on CPU (and under FakeTensorMode on
# CPU) SDPA dispatches to these, which Gaudi runs as its fused SDPA kernel on the MME.
_ATTENTION_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward_flops,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flops,
}


@dataclass(slots=True)
class OpCost:
    """What one aten op costs on the device.

    Attributes:
        name: aten op name, e.g. ``"aten.mm.default"``.
        engine: ``"MME"`` (matrix engine) or ``"TPC"`` (vector cores).
        op_class: one of :data:`OP_CLASSES` (``""`` for a cost given by hand).
        gemms: an MME op's matrix products as ``(share of its FLOPs, output tile dims)``
            (NOTE [MME shape efficiency]); empty for the TPC.
        flops: floating-point operations.
        bytes_in: bytes read from HBM by the op (all tensor inputs).
        bytes_out: bytes written to HBM (all tensor outputs).
        low_precision: the op computes in bf16/fp16/fp8 (faster peak rate).
        device_ns: roofline time, simulated ns (op alone, unfused).
        compute_ns: the compute-bound part alone, simulated ns (fusion cannot remove it).
    """

    name: str
    engine: str
    flops: int
    bytes_in: int
    bytes_out: int
    low_precision: bool
    device_ns: int
    compute_ns: int = 0
    op_class: str = ""
    gemms: tuple[tuple[float, tuple[int, ...]], ...] = ()


def charged_nbytes(t: torch.Tensor, fp32_as_bf16: bool = False) -> int:
    """Bytes of ``t`` as the device holds it: fp32 counts 2 bytes per element when
    ``fp32_as_bf16`` (see NOTE [fp32 on the host, bf16 on the device] in :mod:`hpu_runtime.bridge.autocast`)."""
    if fp32_as_bf16 and t.dtype == torch.float32:
        return t.numel() * 2
    return t.numel() * t.element_size()


def tensor_bytes(obj: object, fp32_as_bf16: bool = False) -> int:
    """Bytes of every tensor in ``obj`` (a tensor, or a flat list/tuple of them)."""
    if isinstance(obj, torch.Tensor):
        return charged_nbytes(obj, fp32_as_bf16)
    if isinstance(obj, (list, tuple)):
        total = 0
        for item in obj:
            if isinstance(item, torch.Tensor):
                total += charged_nbytes(item, fp32_as_bf16)
        return total
    return 0


def _first_dtype(args: tuple, out: object) -> torch.dtype | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.dtype
    if isinstance(out, torch.Tensor):
        return out.dtype
    return None


def _utilization(spec: DeviceSpec, dims: tuple[int, ...]) -> float:
    u = 1.0
    for d in dims:
        if d < spec.mme_tile:
            u *= max(d, 1) / spec.mme_tile
    return u


def _compute_ns(spec: DeviceSpec, engine: str, flops: int, low_precision: bool,
                gemms: tuple[tuple[float, tuple[int, ...]], ...] = ()) -> int:
    if engine == "MME":
        peak = spec.mme_bf16_flops_per_s if low_precision else spec.mme_fp32_flops_per_s
        eff = spec.mme_efficiency
        if gemms:  # NOTE [MME shape efficiency]
            return int(sum(share * flops / (peak * eff * _utilization(spec, dims)) for share, dims in gemms) * 1e9)
    else:
        peak = spec.tpc_bf16_flops_per_s if low_precision else spec.tpc_fp32_flops_per_s
        eff = spec.tpc_efficiency
    return int(flops / (peak * eff) * 1e9)


def _gemms(packet, args: tuple, out: object) -> tuple[tuple[float, tuple[int, ...]], ...]:
    """An MME op's matrix products: ``(share of its FLOPs, output tile dims)`` (NOTE [MME
    shape efficiency]); empty when the shapes are not a matmul's or a convolution's."""
    if packet in _CONVOLUTION:
        weight = args[1] if len(args) > 1 and packet is not _aten.convolution_backward else (
            args[2] if len(args) > 2 else None)
        if not isinstance(weight, torch.Tensor) or weight.dim() < 3:
            return ()
        cout, cin_group = weight.shape[0], weight.shape[1]
        groups = next((a for a in reversed(args) if isinstance(a, int) and not isinstance(a, bool)), 1) or 1
        taps = 1
        for k in weight.shape[2:]:
            taps *= k
        per_group = cout // max(groups, 1)
        if packet is not _aten.convolution_backward:  # out[n*h*w, cout]: rows are many
            return ((1.0, (per_group,)),)
        # grad input out[n*h*w, cin] and grad weight out[cout, cin*taps], half the FLOPs each
        return ((0.5, (cin_group,)), (0.5, (per_group, cin_group * taps)))
    if isinstance(out, torch.Tensor) and out.dim() >= 2:  # mm, addmm, bmm, baddbmm: out[..., m, n]
        return ((1.0, (out.shape[-2], out.shape[-1])),)
    return ()


def _memory_ns(spec: DeviceSpec, nbytes: int) -> int:
    return int(nbytes / (spec.hbm_bytes_per_s * spec.hbm_efficiency) * 1e9)


def op_time_ns(spec: DeviceSpec, engine: str, flops: int, nbytes: int, low_precision: bool) -> int:
    """Roofline time in simulated ns for the given work on ``spec``."""
    return max(_compute_ns(spec, engine, flops, low_precision), _memory_ns(spec, nbytes))


def fused_time_ns(spec: DeviceSpec, cost: OpCost, hbm_bytes: int) -> int:
    """Roofline time of ``cost`` inside a graph where only ``hbm_bytes`` touch HBM, ns."""
    return max(cost.compute_ns, _memory_ns(spec, max(hbm_bytes, 0)))


def pcie_ns(spec: DeviceSpec, nbytes: int) -> int:
    """One-direction host<->device copy of ``nbytes`` over PCIe, simulated ns."""
    return int(nbytes / spec.pcie_bytes_per_s * 1e9)


def read_back_ns(spec: DeviceSpec, nbytes: int) -> int:
    """Host time of one host read of ``nbytes`` once the device is done (``t.cpu()``,
    ``t.to("cpu")``, ``.item()``): ``host_read_ns`` plus the PCIe copy, simulated ns."""
    return spec.host_read_ns + pcie_ns(spec, nbytes)


def state_dict_to_host_ns(spec: DeviceSpec, nbytes: Iterable[int]) -> int:
    """Host time of copying tensors of ``nbytes`` bytes each to the host one by one, as a
    checkpoint does (``{k: v.to("cpu") for k, v in model.state_dict().items()}``): one host
    read per tensor (:func:`read_back_ns`), simulated ns."""
    return sum(read_back_ns(spec, n) for n in nbytes)


def host_op_time_ns(spec: DeviceSpec, flops: int, nbytes: int) -> int:
    """A CPU-fallback op on the host: roofline with the host rates of ``spec``, ns."""
    return int(max(flops / spec.host_flops_per_s, nbytes / spec.host_bytes_per_s) * 1e9)


def compile_ns(spec: DeviceSpec, n_ops: int) -> int:
    """Simulated graph-compile time of a graph of ``n_ops`` ops (``base + per_op x n``), ns."""
    return spec.compile_base_ns + spec.compile_per_op_ns * n_ops


def op_cost(spec: DeviceSpec, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object,
            fp32_as_bf16: bool = False) -> OpCost:
    """Cost of one dispatched aten op (``func(*args, **kwargs) -> out``) on ``spec``.

    ``fp32_as_bf16`` charges fp32 tensors as bf16 (2 bytes, bf16 peak rates): the op ran in
    fp32 on the host for an autocast region the device runs in bf16.
    """
    packet = func._overloadpacket
    bytes_in = (sum(tensor_bytes(a, fp32_as_bf16) for a in args)
                + sum(tensor_bytes(v, fp32_as_bf16) for v in kwargs.values()))
    bytes_out = tensor_bytes(out, fp32_as_bf16)
    dtype = _first_dtype(args, out)
    low = dtype in _LOW_PRECISION or (fp32_as_bf16 and dtype == torch.float32)
    formula = flop_registry.get(packet) or _ATTENTION_FLOPS.get(packet)
    gemms: tuple = ()
    if formula is not None:
        engine = "MME"
        flops = (_conv_backward_flops(formula, args, kwargs, out) if packet is _aten.convolution_backward
                 else int(formula(*args, **kwargs, out_val=out)))
        kind = ("convolution" if packet in _CONVOLUTION else
                "attention" if packet in _ATTENTION_FLOPS or "attention" in packet.__name__ else "matmul")
        if kind != "attention":
            gemms = _gemms(packet, args, out)
    else:
        engine = "TPC"
        flops = out.numel() if isinstance(out, torch.Tensor) else 0
        kind = "elementwise"
        if packet in _WRITE_ONLY or packet in _NO_TRAFFIC:
            bytes_in = 0
            if packet in _NO_TRAFFIC:
                bytes_out = flops = 0
        if packet in _NORMALIZATION:  # NOTE [normalization passes]: a statistics pass first
            kind = "normalization"
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                bytes_in += charged_nbytes(first, fp32_as_bf16)
    compute = _compute_ns(spec, engine, flops, low, gemms)
    return OpCost(
        name=str(func),
        engine=engine,
        flops=flops,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        low_precision=low,
        device_ns=max(compute, _memory_ns(spec, bytes_in + bytes_out)),
        compute_ns=compute,
        op_class=kind,
        gemms=gemms,
    )


def recost(spec: DeviceSpec, cost: OpCost) -> OpCost:
    """``cost`` (the same work: engine, FLOPs, bytes, precision) priced on ``spec``.

    A cost given by hand with no work counted (no FLOPs, no bytes) keeps its ``device_ns``.
    """
    if not cost.flops and not cost.bytes_in and not cost.bytes_out:
        return cost
    compute = _compute_ns(spec, cost.engine, cost.flops, cost.low_precision, cost.gemms)
    return dataclasses.replace(cost, compute_ns=compute,
                               device_ns=max(compute, _memory_ns(spec, cost.bytes_in + cost.bytes_out)))
