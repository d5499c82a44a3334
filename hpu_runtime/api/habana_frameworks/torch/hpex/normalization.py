"""``habana_frameworks.torch.hpex.normalization``: ``FusedClipNorm`` (see :mod:`hpu_runtime.api.hpex`)."""

from hpu_runtime.api.hpex import FusedClipNorm  # noqa: F401

__all__ = ["FusedClipNorm"]
