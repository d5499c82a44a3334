"""``habana_frameworks.torch.hpex.kernels``: Gaudi's fused kernels (see :mod:`hpu_runtime.api.hpex_kernels`).

Each is one kernel on the simulated device with the numerics of its unfused PyTorch
reference. Intel's other kernels here (``CustomNms``, ``RoiAlignFunction``,
``CustomSoftmax``, ``ScaledMaskedSoftmax``, ``fp8_fused_sdpa``, ``EmbeddingBag``...) are not
emulated: asking for one raises an :class:`AttributeError` that says so.
"""

from hpu_runtime.api.hpex_kernels import (  # noqa: F401
    CTCLoss,
    FusedSDPA,
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)

from . import Fp8Ops  # noqa: F401,E402

__all__ = ["CTCLoss", "FusedSDPA", "RotaryPosEmbeddingHelperV1", "RotaryPosEmbeddingHelperV2",
           "RotaryPosEmbeddingHelperV3", "RotaryPosEmbeddingMode", "apply_rotary_pos_emb", "Fp8Ops"]


def __getattr__(name: str):
    raise AttributeError(f"habana_frameworks.torch.hpex.kernels.{name} is not emulated by the simulated Gaudi "
                         f"(emulated: {', '.join(__all__)})")
