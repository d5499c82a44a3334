"""``te.fp8``: asks whether fp8 can be used; on the emulator it cannot."""


def is_fp8_available() -> tuple[bool, str]:
    """``(False, reason)``: fp8 numerics are not emulated."""
    return False, "fp8 is not emulated by the simulated Gaudi (hpu_runtime); bf16 and fp32 are"
