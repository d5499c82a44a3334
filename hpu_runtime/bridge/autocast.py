"""``torch.autocast("hpu", dtype=torch.bfloat16)`` on the simulated Gaudi.

NOTE [autocast on CPU tensors]
Autocast is a per-backend dispatch key: an "hpu" autocast region never touches CPU tensors,
so on its own it would change nothing here. :func:`install` makes an autocast whose
``device_type`` is ``"hpu"`` drive *CPU* autocast with the requested dtype instead (the
default dtype is bf16, as on Gaudi). Matmuls and linear layers then really run in bf16 on the
CPU (real numerics), and the cost model charges them at the bf16 MME rate because it sees
bf16 inputs. ``torch.is_autocast_enabled("hpu")`` stays False inside the region; use
``torch.is_autocast_enabled("cpu")``. Also reachable as ``torch.hpu.amp.autocast``.

NOTE [fp32 on the host, bf16 on the device]
A CPU without fast bf16 matmul runs a bf16 autocast region many times slower than fp32 (a
BERT-Large layer: 14x here). With ``PT_HPU_AUTOCAST_FP32_ON_HOST=1`` an ``"hpu"`` autocast
region computes in fp32 on the host (CPU autocast stays off) while the simulated device is
charged as if it ran in bf16: every fp32 op in the region, and in the backward that follows
it up to the next ``mark_step``, is charged at the bf16 rates with 2 bytes per element,
except the ops autocast keeps in fp32 (softmax, losses, norms, reductions:
``hpu_runtime.bridge.op_accounting.FP32_AUTOCAST_OPS``). The numerics trade-off: results are fp32 results,
more accurate than the bf16 run they stand for (no bf16 rounding, no overflow behaviour of
bf16), so losses and gradients differ from a faithful bf16 run in the low bits. The casts
a faithful region makes of each fp32 weight a matmul uses (to bf16 in forward, its gradient
back to fp32 in backward) are charged once per region at the weight's first use; the casts
of activations are not (an fp32 activation is charged as bf16 without its cast).
Use it for timing studies and long runs of big models; keep it off to test bf16 numerics.
"""

from __future__ import annotations

import threading

import torch
from torch.amp import autocast_mode

from .runtime import config, get_device

__all__ = ["autocast", "hpu_region", "install"]

_installed = False
_regions = threading.local()


def hpu_region() -> torch.dtype | None:
    """The dtype of the calling thread's innermost enabled ``torch.autocast("hpu")`` region, or
    None outside one (``torch.hpu.is_autocast_hpu_enabled`` / ``get_autocast_hpu_dtype``)."""
    stack = getattr(_regions, "stack", None)
    return stack[-1] if stack else None


def install() -> None:
    """Redirect ``torch.autocast("hpu", ...)`` to CPU autocast (idempotent)."""
    global _installed
    if _installed:
        return
    cls = autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self._hpu_emulated = False
        self._hpu_region = None
        if isinstance(device_type, str) and device_type.startswith("hpu"):
            device_type = "cpu"
            if dtype is None:
                dtype = torch.bfloat16
            if dtype == torch.float32:  # an fp32 "autocast" region (Lightning's precision "32")
                enabled = False         # is plain fp32, as on Gaudi; CPU autocast would warn
            if enabled:
                self._hpu_region = dtype
            if enabled and dtype in (torch.bfloat16, torch.float16) and config().autocast_fp32_on_host:
                self._hpu_emulated, enabled = True, False
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    enter, exit_ = cls.__enter__, cls.__exit__

    def __enter__(self):
        region = getattr(self, "_hpu_region", None)
        if region is not None:
            if not hasattr(_regions, "stack"):
                _regions.stack = []
            _regions.stack.append(region)
        if getattr(self, "_hpu_emulated", False):
            get_device().set_fp32_as_bf16(True)
        return enter(self)

    def __exit__(self, *exc):
        if getattr(self, "_hpu_region", None) is not None:
            _regions.stack.pop()
        if getattr(self, "_hpu_emulated", False):
            get_device().set_fp32_as_bf16(False)
        return exit_(self, *exc)

    for new, old in ((__init__, original), (__enter__, enter), (__exit__, exit_)):
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
    cls.__init__, cls.__enter__, cls.__exit__ = __init__, __enter__, __exit__
    _installed = True


class autocast(autocast_mode.autocast):  # noqa: N801 - torch.hpu.amp.autocast
    """``torch.hpu.amp.autocast(dtype=torch.bfloat16)``: autocast for the simulated Gaudi."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16,
                 cache_enabled: bool = True) -> None:
        install()
        super().__init__("hpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
