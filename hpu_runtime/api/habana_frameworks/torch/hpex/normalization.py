"""``habana_frameworks.torch.hpex.normalization``: ``FusedClipNorm`` (:mod:`hpu_runtime.api.hpex`) and
``FusedRMSNorm`` (:mod:`hpu_runtime.api.hpex_kernels`), one fused kernel each."""

from hpu_runtime.api.hpex import FusedClipNorm  # noqa: F401
from hpu_runtime.api.hpex_kernels import FusedRMSNorm  # noqa: F401

__all__ = ["FusedClipNorm", "FusedRMSNorm"]
