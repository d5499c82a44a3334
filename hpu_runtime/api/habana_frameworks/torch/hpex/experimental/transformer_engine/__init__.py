"""``habana_frameworks.torch.hpex.experimental.transformer_engine`` (``te``): fp8 training, not emulated.

What is here, so scripts, optimum-habana and lightning-habana import and run: ``te.Linear`` (a
``torch.nn.Linear`` that takes Intel's ``params_dtype`` keyword), ``te.fp8_autocast`` (a
context manager that changes nothing), ``te.recipe`` (``Format``, ``DelayedScaling``) and
``te.FusedAttention`` (attention in the inputs' precision through ``FusedSDPA``),
``te.distributed.activation_checkpointing`` (a no-op context) and
``te.fp8.is_fp8_available()``, which answers ``(False, reason)``: code that asks first runs
in bf16/fp32, computed and charged as such. fp8 numerics and the fp8 MME rate are not modelled.
"""

from __future__ import annotations

import contextlib

import torch

from hpu_runtime.api.hpex_kernels import FusedSDPA

from . import distributed, fp8, recipe  # noqa: F401

__all__ = ["Linear", "FusedAttention", "fp8_autocast", "recipe", "fp8", "distributed"]


class Linear(torch.nn.Linear):
    """``te.Linear(in_features, out_features, bias=True, params_dtype=None, device=None)``: a plain linear layer."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, params_dtype=None, device=None,
                 **_kwargs) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=params_dtype)


@contextlib.contextmanager
def fp8_autocast(enabled: bool = False, fp8_recipe=None, **_kwargs):
    """Accepted; the region runs in the precision it would without it (fp8 is not emulated)."""
    yield


class FusedAttention(torch.nn.Module):
    """``te.FusedAttention(scale, attention_dropout=0.0, enable_recompute=False)``; its forward
    ``(q, k, v, attn_mask=None, is_causal=False, softmax_mode="None")`` is
    :class:`~hpu_runtime.api.hpex_kernels.FusedSDPA` in the inputs' dtype (no fp8)."""

    def __init__(self, scale: float | None = None, attention_dropout: float = 0.0, enable_recompute: bool = False,
                 **_kwargs) -> None:
        super().__init__()
        self.scale, self.attention_dropout, self.enable_recompute = scale, attention_dropout, enable_recompute

    def forward(self, q, k, v, attn_mask=None, is_causal: bool = False, softmax_mode: str = "None"):
        return FusedSDPA.apply(q, k, v, attn_mask, self.attention_dropout if self.training else 0.0, is_causal,
                               self.scale, softmax_mode, self.enable_recompute)
