"""The ``torch.hpu``-like API of the simulated Gaudi (also registered as ``torch.hpu``).

One simulated device per process: ``device_count()`` is 1 and ``current_device()`` is 0,
as in a Gaudi job where each rank is bound to one card.
"""

from __future__ import annotations

import torch

from .device import get_device

__all__ = [
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "mark_step",
    "get_device_name",
    "get_amp_supported_dtype",
]


def is_available() -> bool:
    """Always True: the simulated Gaudi needs no hardware."""
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    get_device()


def device_count() -> int:
    """Simulated cards visible to this process (one per rank)."""
    return 1


def current_device() -> int:
    return 0


def set_device(device: int | str | torch.device) -> None:
    """Accepted for compatibility; every rank owns exactly one simulated card."""


def get_device_name(device: object = None) -> str:
    """Device name as Gaudi software reports it, e.g. ``"GAUDI2"``."""
    return get_device().spec.name.upper()


def synchronize(device: object = None) -> None:
    """Launch pending work and make the host wait for every simulated stream."""
    get_device().synchronize()


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Launch the accumulated lazy-mode graph (``htcore.mark_step()``)."""
    dev = get_device()
    dev.launch("mark_step")
    if sync:
        dev.synchronize()


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]
