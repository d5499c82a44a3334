"""``habana_frameworks.torch.hpex.optimizers``: fused optimizers (see :mod:`hpu_runtime.api.hpex`)."""

from hpu_runtime.api.hpex import FusedAdamW, FusedLamb, FusedLars, FusedResourceApplyMomentum, FusedSGD  # noqa: F401

__all__ = ["FusedSGD", "FusedLars", "FusedResourceApplyMomentum", "FusedLamb", "FusedAdamW"]
