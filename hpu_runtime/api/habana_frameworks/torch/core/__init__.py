"""``habana_frameworks.torch.core`` (``htcore``): lazy-mode control of the simulated Gaudi.

``htcore.hpu`` is the device API (``torch.hpu``), as Gaudi's ``core`` exposes it
(optimum-habana calls ``htcore.hpu.set_device``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import hpu_runtime
from hpu_runtime.api import hpu
from hpu_runtime.api.hpu import mark_step

from . import quantization

__all__ = ["mark_step", "is_lazy", "iter_mark_step", "step_closure", "hpu_set_env", "hpu_initialize",
           "quantization", "hpu"]


def is_lazy() -> bool:
    """Whether the simulated device runs in lazy mode (``PT_HPU_LAZY_MODE=1``, Gaudi's default)."""
    return hpu_runtime.get_device().lazy


def iter_mark_step(iterable: Iterable) -> Iterator:
    """Yield from ``iterable``, calling :func:`mark_step` after each item in lazy mode."""
    for item in iterable:
        yield item
        if is_lazy():
            mark_step()


class step_closure:  # noqa: N801 - Gaudi's name
    """Gaudi's ``htcore.step_closure`` namespace: ``_mark_step_if_lazy()``."""

    @staticmethod
    def _mark_step_if_lazy() -> None:
        if is_lazy():
            mark_step()


def hpu_set_env(model=None) -> None:
    """Accepted: on Gaudi it prepares fp8 inference flags; nothing to set up here."""


def hpu_initialize(model=None, mark_only_scales_as_const: bool = False, optimizer=None, args=None) -> None:
    """Accepted: on Gaudi it marks inference constants; nothing to do here."""
    hpu_runtime.get_device()
