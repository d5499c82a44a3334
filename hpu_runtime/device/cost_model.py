"""Per-op roofline cost on a simulated Gaudi.

``device time = max(flops / (peak x efficiency), bytes / (HBM bandwidth x efficiency))``,
where matmul-like ops (those ``torch.utils.flop_counter`` has a FLOP formula for: mm,
addmm, bmm, convolution, attention, ...) run on the MME and everything else on the TPC at
one FLOP per output element. Peak rates depend on the dtype (bf16/fp16 vs fp32). All
constants come from a :class:`~hpu_runtime.device.spec.DeviceSpec`; results are simulated
nanoseconds, not measured time.

NOTE [fusion inside a graph]
:func:`op_cost` gives an op's time as if it ran alone (every input read from HBM, every
output written to HBM). Inside a launched lazy-mode graph the graph compiler keeps
intermediates on chip: :func:`hpu_runtime.device.lazy_graph.graph_op_times` subtracts the
bytes of inputs produced earlier in the same graph and of intermediate outputs (NOTE [fusion
inside a graph, deterministic] there), and re-applies the roofline with :func:`fused_time_ns`.

Other costs here: host<->device copies over PCIe (:func:`pcie_ns`), a CPU-fallback op on
the host (:func:`host_op_time_ns`) and a graph compile (:func:`compile_ns`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from .spec import DeviceSpec

__all__ = [
    "OpCost",
    "charged_nbytes",
    "compile_ns",
    "fused_time_ns",
    "host_op_time_ns",
    "op_cost",
    "op_time_ns",
    "pcie_ns",
    "tensor_bytes",
]

_LOW_PRECISION = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(slots=True)
class OpCost:
    """What one aten op costs on the device.

    Attributes:
        name: aten op name, e.g. ``"aten.mm.default"``.
        engine: ``"MME"`` (matrix engine) or ``"TPC"`` (vector cores).
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


def _compute_ns(spec: DeviceSpec, engine: str, flops: int, low_precision: bool) -> int:
    if engine == "MME":
        peak = spec.mme_bf16_flops_per_s if low_precision else spec.mme_fp32_flops_per_s
        eff = spec.mme_efficiency
    else:
        peak = spec.tpc_bf16_flops_per_s if low_precision else spec.tpc_fp32_flops_per_s
        eff = spec.tpc_efficiency
    return int(flops / (peak * eff) * 1e9)


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
    formula = flop_registry.get(packet)
    if formula is not None:
        engine = "MME"
        flops = int(formula(*args, **kwargs, out_val=out))
    else:
        engine = "TPC"
        flops = out.numel() if isinstance(out, torch.Tensor) else 0
    compute = _compute_ns(spec, engine, flops, low)
    return OpCost(
        name=str(func),
        engine=engine,
        flops=flops,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        low_precision=low,
        device_ns=max(compute, _memory_ns(spec, bytes_in + bytes_out)),
        compute_ns=compute,
    )
