"""``habana_frameworks.torch.core.quantization``: fp8 inference set-up, accepted as no-ops (not emulated)."""


def hpu_set_inference_env() -> None:
    """Accepted (fp8 inference is not emulated)."""


def hpu_teardown_inference_env() -> None:
    """Accepted (fp8 inference is not emulated)."""


def hpu_inference_initialize(model=None, mark_only_scales_as_const: bool = False) -> None:
    """Accepted (fp8 inference is not emulated)."""
