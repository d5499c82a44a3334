"""``torch.autocast("hpu", dtype=torch.bfloat16)`` on the simulated Gaudi.

NOTE [autocast on CPU tensors]
Autocast is a per-backend dispatch key: an "hpu" autocast region never touches CPU tensors,
so on its own it would change nothing here. :func:`install` makes an autocast whose
``device_type`` is ``"hpu"`` drive *CPU* autocast with the requested dtype instead (the
default dtype is bf16, as on Gaudi). Matmuls and linear layers then really run in bf16 on the
CPU (real numerics), and the cost model charges them at the bf16 MME rate because it sees
bf16 inputs. ``torch.is_autocast_enabled("hpu")`` stays False inside the region; use
``torch.is_autocast_enabled("cpu")``. Also reachable as ``torch.hpu.amp.autocast``.
"""

from __future__ import annotations

import torch
from torch.amp import autocast_mode

__all__ = ["autocast", "install"]

_installed = False


def install() -> None:
    """Redirect ``torch.autocast("hpu", ...)`` to CPU autocast (idempotent)."""
    global _installed
    if _installed:
        return
    cls = autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if isinstance(device_type, str) and device_type.startswith("hpu"):
            device_type = "cpu"
            if dtype is None:
                dtype = torch.bfloat16
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__
    _installed = True


class autocast(autocast_mode.autocast):  # noqa: N801 - torch.hpu.amp.autocast
    """``torch.hpu.amp.autocast(dtype=torch.bfloat16)``: autocast for the simulated Gaudi."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16,
                 cache_enabled: bool = True) -> None:
        install()
        super().__init__("hpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
