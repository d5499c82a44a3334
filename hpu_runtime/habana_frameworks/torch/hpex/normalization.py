"""``habana_frameworks.torch.hpex.normalization``: ``FusedClipNorm`` (see :mod:`hpu_runtime.hpex`)."""

from hpu_runtime.hpex import FusedClipNorm  # noqa: F401

__all__ = ["FusedClipNorm"]
