"""``habana_frameworks.torch.utils.internal``: ``is_lazy`` and ``lazy_only``, which DeepSpeed's HPU
fused Adam (``deepspeed/ops/op_builder/hpu/fused_adam.py``) and Intel's own modules import.

As in Intel's module (HabanaAI/gaudi-pytorch-bridge,
``python_packages/habana_frameworks/torch/utils/internal.py``): :func:`is_lazy` says whether the
simulated card runs in lazy mode (``PT_HPU_LAZY_MODE`` != ``0``, the same answer as
``htcore.is_lazy()``); :func:`lazy_only` wraps a function so it runs in lazy mode and does
nothing (after one warning) in eager mode.
"""

from __future__ import annotations

import functools
import logging

from habana_frameworks.torch.core import is_lazy

__all__ = ["is_lazy", "lazy_only"]

log = logging.getLogger(__name__)


def lazy_only(func):
    """``func`` in lazy mode; in eager mode a function that does nothing (one warning, here)."""
    if is_lazy():
        @functools.wraps(func)
        def lazy_wrapper(*args, **kwargs):
            func(*args, **kwargs)
        return lazy_wrapper
    log.warning("Calling %s has no effect: it is lazy-mode only functionality", func.__name__)

    @functools.wraps(func)
    def non_lazy_wrapper(*args, **kwargs):
        return None
    return non_lazy_wrapper
