"""``habana_frameworks.torch.hpex.movingavrg``: ``FusedEMA``, a model's exponential moving
average as one fused kernel (:mod:`hpu_runtime.api.hpex`)."""

from hpu_runtime.api.hpex import FusedEMA  # noqa: F401

__all__ = ["FusedEMA"]
