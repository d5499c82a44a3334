"""``habana_frameworks.torch.hpex.kernels.Fp8Ops``: fp8 casts (one kernel each); fp8 matmuls are not emulated."""

from hpu_runtime.api.hpex_kernels import cast_from_fp8, cast_to_fp8_v2  # noqa: F401

__all__ = ["cast_to_fp8_v2", "cast_from_fp8"]


def __getattr__(name: str):
    raise AttributeError(f"habana_frameworks.torch.hpex.kernels.Fp8Ops.{name} is not emulated by the simulated "
                         "Gaudi (fp8 matmuls are not modelled; emulated: cast_to_fp8_v2, cast_from_fp8)")
