"""``habana_frameworks.torch.core`` (``htcore``): lazy-mode control of the simulated Gaudi.

``htcore.hpu`` is the device API (``torch.hpu``), as Gaudi's ``core`` exposes it
(optimum-habana calls ``htcore.hpu.set_device``). The step functions follow Intel's
``core/step_closure.py`` (HabanaAI/gaudi-pytorch-bridge): ``mark_step`` launches the lazy graph
and then runs the closures :func:`add_step_closure` queued; :func:`iter_mark_step` marks the end
of a training iteration (on Gaudi it resets the bridge's count of unique graphs; it launches
nothing) and runs them too. Both, like :func:`add_step_closure`, are lazy-mode only: in eager
mode they do nothing (one warning). The inference set-up calls come from :mod:`.quantization`.
"""

from __future__ import annotations

import logging

import hpu_runtime
from hpu_runtime.api import hpu
from hpu_runtime.api.hpu import _add_step_closure, _run_step_closures, mark_step

from . import quantization
from .quantization import (hpu_inference_initialize, hpu_initialize, hpu_reset_env, hpu_set_env,
                           hpu_set_inference_env, hpu_teardown_inference_env)

__all__ = ["mark_step", "is_lazy", "iter_mark_step", "add_step_closure", "step_closure", "hpu_set_env",
           "hpu_set_inference_env", "hpu_initialize", "hpu_inference_initialize", "hpu_reset_env",
           "hpu_teardown_inference_env", "quantization", "hpu"]

log = logging.getLogger(__name__)
_warned: set[str] = set()


def is_lazy() -> bool:
    """Whether the simulated device runs in lazy mode (``PT_HPU_LAZY_MODE=1``, Gaudi's default)."""
    return hpu_runtime.get_device().lazy


def _lazy_only(name: str) -> bool:
    """Whether a lazy-mode-only call may act; in eager mode, warn once per name (as Intel's
    ``lazy_only`` does) and say no."""
    if is_lazy():
        return True
    if name not in _warned:
        _warned.add(name)
        log.warning("Calling %s has no effect: it is lazy-mode only functionality (PT_HPU_LAZY_MODE=0)", name)
    return False


def iter_mark_step(device_str: str = "") -> None:
    """The end of a training iteration (lazy mode): runs the queued step closures; launches nothing.

    Raises:
        TypeError: ``device_str`` is not a string (this is not a wrapper of an iterable).
    """
    if not isinstance(device_str, str):
        raise TypeError(f"iter_mark_step(device_str='') takes a device string, got {type(device_str).__name__}")
    if _lazy_only("iter_mark_step"):
        _run_step_closures()


def add_step_closure(closure, args: tuple = ()) -> None:
    """Queue ``closure(*args)`` to run after the next :func:`mark_step` or :func:`iter_mark_step`
    (lazy mode; in eager mode nothing is queued, as on Gaudi).

    Raises:
        TypeError: ``closure`` is not callable, or ``args`` is not a tuple or list.
    """
    if _lazy_only("add_step_closure"):
        _add_step_closure(closure, args)


class step_closure:  # noqa: N801 - Gaudi's name
    """Gaudi's ``htcore.step_closure`` module's names: ``mark_step``, ``iter_mark_step``,
    ``add_step_closure`` and ``_mark_step_if_lazy()``."""

    mark_step = staticmethod(mark_step)
    iter_mark_step = staticmethod(iter_mark_step)
    add_step_closure = staticmethod(add_step_closure)

    @staticmethod
    def _mark_step_if_lazy() -> None:
        if is_lazy():
            mark_step()
