"""``habana_frameworks.torch.utils.debug`` (``htdebug``): the helpers Gaudi scripts call.

Gaudi's module holds private debugging helpers of the real bridge. The ones training scripts
call are here, with the values Intel's bridge gives (HabanaAI/gaudi-pytorch-bridge,
``python_packages/habana_frameworks/torch/utils/debug/__init__.py``):

* :func:`_is_enabled_synapse_layout_handling`: True, as there (the graph compiler handles
  tensor layouts: Model-References' GoogLeNet ``main.py`` asks it every step to choose
  between contiguous and channels-last input);
* :func:`_is_enabled_weight_permute_pass`: False, as there;
* :func:`_get_fallback_op_count`: the ops that ran on the CPU and how often, as the
  ``cpu_fallback`` metric counts them (:mod:`hpu_runtime.api.metrics`).

The others (recipe dumps, JIT cache control, memory reporters) are not emulated; for the
emulator's own diagnostics use ``hpu_runtime.api.metrics`` (CPU fallbacks, compilations) and
``hpu_runtime.api.trace`` (a Chrome trace of the simulated timeline).
"""

from __future__ import annotations

from hpu_runtime.api import metrics

__all__ = ["_get_fallback_op_count", "_is_enabled_synapse_layout_handling", "_is_enabled_weight_permute_pass"]


def _is_enabled_synapse_layout_handling() -> bool:
    """True: the graph compiler handles layouts (Intel's bridge returns True unconditionally)."""
    return True


def _is_enabled_weight_permute_pass() -> bool:
    """False: no weight permute pass (Intel's bridge returns False unconditionally)."""
    return False


def _get_fallback_op_count() -> dict[str, int]:
    """``{op name: count}`` of the ops that fell back to the CPU in this process (the global
    ``cpu_fallback`` metric's ``FallbackOps``); empty when none did."""
    return dict(dict(metrics.metric_global("cpu_fallback").stats())["FallbackOps"])
