"""CPU fallback policy: which ops Gaudi cannot run, and the Gaudi-style log line.

An op falls back to the CPU when one of its tensors has a dtype the HPU does not support
(float64, complex), when its name is listed in ``PT_HPU_PLACE_ON_CPU`` (comma separated,
``digamma`` or ``aten::digamma``), or when it is in :data:`UNSUPPORTED_OPS`. The device
then charges device->host copies of the inputs, the op on the host CPU and host->device
copies of the outputs (see :meth:`hpu_runtime.bridge.op_accounting.OpAccounting.record`), and counts it in
``metric_global("cpu_fallback")``.

With ``LOG_LEVEL_PT_FALLBACK=1`` and ``ENABLE_CONSOLE=true`` every fallback prints, as the
Gaudi bridge does::

    CPU fallback digamma : self=HPUBFloat16Type
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["FALLBACK_DTYPES", "UNSUPPORTED_OPS", "FallbackPolicy", "fallback_log_line"]

FALLBACK_DTYPES = frozenset({torch.float64, torch.complex64, torch.complex128, torch.complex32})
"""Dtypes without HPU kernels (Gaudi documents no float64/complex compute)."""

UNSUPPORTED_OPS = frozenset({"digamma", "polygamma"})
"""Ops treated as unregistered for the HPU. ``digamma`` is the Gaudi optimization guide's
fallback example; the list is a modelling assumption, extend it with PT_HPU_PLACE_ON_CPU."""

_SCALAR_NAMES = {
    torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half",
    torch.float64: "Double", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
    torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def _short_name(func: torch._ops.OpOverload) -> str:
    return func._schema.name.split("::", 1)[-1]


def fallback_log_line(func: torch._ops.OpOverload, args: tuple, kwargs: Mapping) -> str:
    """``"CPU fallback <op> : <arg>=HPU<Scalar>Type, ..."`` for the tensor arguments."""
    parts = []
    values = dict(zip((a.name for a in func._schema.arguments), args))
    values.update(kwargs)
    for arg in func._schema.arguments:
        v = values.get(arg.name)
        if isinstance(v, torch.Tensor):
            parts.append(f"{arg.name}=HPU{_SCALAR_NAMES.get(v.dtype, str(v.dtype))}Type")
    return f"CPU fallback {_short_name(func)} : {', '.join(parts)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class FallbackPolicy:
    """Which ops fall back to the CPU, and whether to print them (built from
    :class:`~hpu_runtime.bridge.config.RuntimeConfig`)."""

    place_on_cpu: frozenset[str] = frozenset()
    """Short op names from ``PT_HPU_PLACE_ON_CPU`` (``aten::`` prefix stripped)."""
    log: bool = False
    """Print a line per fallback (``LOG_LEVEL_PT_FALLBACK=1`` and ``ENABLE_CONSOLE=true``)."""

    def falls_back(self, func: torch._ops.OpOverload, dtypes: set[torch.dtype]) -> bool:
        """Whether ``func`` with tensors of ``dtypes`` runs on the CPU."""
        name = _short_name(func)
        return (name in self.place_on_cpu or name in UNSUPPORTED_OPS
                or not FALLBACK_DTYPES.isdisjoint(dtypes))

    def emit(self, func: torch._ops.OpOverload, args: tuple, kwargs: Mapping) -> None:
        """Print the fallback line to stdout if logging is on."""
        if self.log:
            print(fallback_log_line(func, args, kwargs), file=sys.stdout, flush=True)
