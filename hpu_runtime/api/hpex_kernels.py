"""Gaudi's ``hpex.kernels`` and ``hpex.normalization.FusedRMSNorm``, over the ``torch.ops.hpu`` ops.

The classes keep Intel's calling conventions (``FusedSDPA.apply(q, k, v, ...)``,
``RotaryPosEmbeddingHelperV2.apply(p, cos, sin, position_ids)``, ``FusedRMSNorm.apply(x,
weight, eps)``, ``CTCLoss.apply(...)``) as documented in Intel Gaudi's "Python Packages"
reference and used by optimum-habana; each call is one custom op of
:mod:`hpu_runtime.api.hpu_ops` (one fused kernel on the simulated device, with the unfused
PyTorch reference's numerics), and its backward is one more. ``apply`` is a static method
of a plain class: autograd is the custom op's.

What differs from a Gaudi: ``FusedSDPA``'s ``softmax_mode="fast"`` computes the exact
softmax (Gaudi's is an approximation), ``recompute_mode`` changes neither numerics nor the
charged cost (the backward is one kernel either way), and ``valid_seq_len``, ``window_size``
and ``sink`` raise :class:`NotImplementedError`.
"""

from __future__ import annotations

import contextlib
import enum
import math
import threading

import torch
from torch import Tensor

from .hpu_ops import BLOCKWISE, PAIRWISE

__all__ = [
    "CTCLoss",
    "FusedRMSNorm",
    "FusedSDPA",
    "RotaryPosEmbeddingHelperV1",
    "RotaryPosEmbeddingHelperV2",
    "RotaryPosEmbeddingHelperV3",
    "RotaryPosEmbeddingMode",
    "apply_rotary_pos_emb",
    "cast_from_fp8",
    "cast_to_fp8_v2",
    "recompute_sdp_enabled",
    "sdp_kernel",
]


class RotaryPosEmbeddingMode(enum.Enum):
    """How the rotary embedding pairs dimensions: halves (GPT-NeoX, LLaMA) or neighbours (GPT-J)."""

    BLOCKWISE = BLOCKWISE
    PAIRWISE = PAIRWISE


def _match_dtypes(p: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """fp32 if any input is fp32, else the tables take ``p``'s dtype (Intel's rule)."""
    if torch.float32 in (p.dtype, cos.dtype, sin.dtype):
        return p.float(), cos.float(), sin.float()
    return p, cos.to(p.dtype), sin.to(p.dtype)


def apply_rotary_pos_emb(p: Tensor, *args) -> Tensor:
    """``apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode=BLOCKWISE)`` or
    ``apply_rotary_pos_emb(p, rope_cache)`` (ChatGLM's interleaved cache, see
    :class:`RotaryPosEmbeddingHelperV3`).

    Returns:
        ``p * cos + rot(p) * sin`` with ``rot`` rotate-half (BLOCKWISE) or rotate-every-two
        (PAIRWISE), ``cos``/``sin`` taken at ``position_ids`` or from row ``offset`` on.
    """
    if len(args) == 1:
        return RotaryPosEmbeddingHelperV3.apply(p, args[0])
    if len(args) < 2:
        raise TypeError("apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode=BLOCKWISE) "
                        "or apply_rotary_pos_emb(p, rope_cache)")
    cos, sin = args[0], args[1]
    position_ids = args[2] if len(args) > 2 else None
    offset = args[3] if len(args) > 3 else 0
    mode = args[4] if len(args) > 4 else RotaryPosEmbeddingMode.BLOCKWISE
    p, cos, sin = _match_dtypes(p, cos, sin)
    return torch.ops.hpu.rotary_pos_embedding(p, sin, cos, position_ids, offset, RotaryPosEmbeddingMode(mode).value)


class RotaryPosEmbeddingHelperV1:
    """``apply(p, cos, sin, offset)``: BLOCKWISE, tables from row ``offset`` (LLaMA in transformers <= 4.27)."""

    @staticmethod
    def apply(p: Tensor, cos: Tensor, sin: Tensor, offset: int = 0) -> Tensor:
        return apply_rotary_pos_emb(p, cos, sin, None, offset, RotaryPosEmbeddingMode.BLOCKWISE)


class RotaryPosEmbeddingHelperV2:
    """``apply(p, cos, sin, position_ids)``: BLOCKWISE at ``position_ids`` (transformers > 4.27;
    optimum-habana's ``FusedRoPE``). ``cos``/``sin`` are ``[1, 1, seq, dim]`` or ``[seq, dim]``."""

    @staticmethod
    def apply(p: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None) -> Tensor:
        return apply_rotary_pos_emb(p, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE)


class RotaryPosEmbeddingHelperV3:
    """``apply(p, rope_cache)``: ChatGLM's rotary embedding.

    ``p`` is ``[seq, batch, heads, head_dim]``; ``rope_cache`` is ``[>= seq, batch or 1,
    rot_dim // 2, 2]`` holding ``(cos, sin)`` pairs. The first ``rot_dim`` features of each
    head rotate PAIRWISE, the rest pass through.
    """

    @staticmethod
    def apply(p: Tensor, rope_cache: Tensor) -> Tensor:
        sq, heads = p.size(0), p.size(2)
        rot_dim = rope_cache.shape[-2] * 2
        rot, passed = p[..., :rot_dim], p[..., rot_dim:]
        cache = rope_cache[:sq].reshape(sq, -1, 1, rot_dim // 2, 2)
        cos = torch.repeat_interleave(cache[..., 0], 2, dim=-1).to(p.dtype)
        sin = torch.repeat_interleave(cache[..., 1], 2, dim=-1).to(p.dtype)
        out = torch.ops.hpu.rotary_pos_embedding(rot.reshape(sq, -1, heads, rot_dim), sin, cos, None, 0, PAIRWISE)
        return torch.cat((out, passed), dim=-1)


_sdp = threading.local()


def recompute_sdp_enabled() -> bool:
    """Whether the innermost :func:`sdp_kernel` asked for the recompute variant (default False)."""
    return getattr(_sdp, "recompute", False)


@contextlib.contextmanager
def sdp_kernel(enable_recompute: bool | None = None, enable_flash: bool = True, enable_math: bool = True,
               enable_mem_efficient: bool = True, **_kwargs):
    """``with torch.hpu.sdp_kernel(enable_recompute=True):``: which FusedSDPA variant to run.

    Recorded (:func:`recompute_sdp_enabled`); both variants compute the same values here and
    are charged as one kernel each way.
    """
    saved = recompute_sdp_enabled()
    if enable_recompute is not None:
        _sdp.recompute = bool(enable_recompute)
    try:
        yield
    finally:
        _sdp.recompute = saved


class FusedSDPA:
    """``FusedSDPA.apply(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    softmax_mode="None", recompute_mode=None, valid_seq_len=None, seq_padding_type="left",
    return_dropout_mask=False, return_attn_probs=False, window_size=(-1, -1), sink=None)``.

    ``torch.nn.functional.scaled_dot_product_attention`` as one kernel forward and one
    backward. ``q`` is ``[..., heads, seq_q, d]``; ``k``/``v`` may have fewer heads
    (grouped-query attention). A boolean mask keeps ``True`` positions; a float mask is added.

    Returns:
        the attention output like ``q`` (``d`` of ``v``); with ``return_attn_probs`` /
        ``return_dropout_mask`` (no gradient needed) also the probabilities and/or the mask.

    Raises:
        NotImplementedError: ``valid_seq_len``, ``window_size`` or ``sink`` (not emulated).
        AssertionError: ``return_attn_probs`` while a gradient is needed (as on Gaudi).
    """

    @staticmethod
    def apply(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, softmax_mode: str = "None",
              recompute_mode: bool | None = None, valid_seq_len: Tensor | None = None,
              seq_padding_type: str = "left", return_dropout_mask: bool = False, return_attn_probs: bool = False,
              window_size=(-1, -1), sink: Tensor | None = None):
        if valid_seq_len is not None or tuple(window_size or (-1, -1)) != (-1, -1) or sink is not None:
            raise NotImplementedError("FusedSDPA: valid_seq_len, window_size and sink are not emulated")
        if str(softmax_mode).lower() == "fp32" and q.dtype != torch.bfloat16:
            raise AssertionError("softmax_mode = fp32 is supported only when q/k/v inputs are BF16")
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if return_attn_probs and needs_grad:
            raise AssertionError("return_attn_probs is supported only for inference mode")
        if scale is None:
            scale = 1.0 / math.sqrt(q.size(-1))
        out, probs, dmask = torch.ops.hpu.fused_sdpa_fwd(q, k, v, attn_mask, float(dropout_p), float(scale),
                                                         bool(is_causal))
        extra = ([probs.to(q.dtype)] if return_attn_probs else []) + ([dmask] if return_dropout_mask else [])
        return (out, *extra) if extra else out


class FusedRMSNorm:
    """``FusedRMSNorm.apply(x, weight, eps)``: ``torch.nn.functional.rms_norm(x, (x.shape[-1],),
    weight, eps)`` computed in fp32 and returned in ``x``'s dtype, one kernel each way."""

    @staticmethod
    def apply(x: Tensor, weight: Tensor, eps: float = 1e-6, *_args) -> Tensor:
        return torch.ops.hpu.fused_rms_norm(x, weight, float(eps))


class CTCLoss:
    """``CTCLoss.apply(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
    zero_infinity=False)``: ``torch.nn.functional.ctc_loss``, its loss and gradient one kernel each.

    Raises:
        ValueError: a reduction other than ``"none"``, ``"mean"``, ``"sum"``.
    """

    @staticmethod
    def apply(log_probs: Tensor, targets: Tensor, input_lengths, target_lengths, blank: int = 0,
              reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"CTCLoss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        il = torch.as_tensor(input_lengths, dtype=torch.long)
        tl = torch.as_tensor(target_lengths, dtype=torch.long)
        nll, _alpha = torch.ops.hpu.ctc_loss_custom(log_probs, targets, il, tl, int(blank), bool(zero_infinity))
        if reduction == "none":
            return nll
        if reduction == "sum":
            return nll.sum()
        return (nll / tl.clamp(min=1).to(nll.dtype)).mean()


def cast_to_fp8_v2(input: Tensor, scale: Tensor | None = None, stochastic_rounding: bool = False,  # noqa: A002
                   is_amax: bool = False, dtype: torch.dtype = torch.float8_e4m3fn, scale_shape=None):
    """``Fp8Ops.cast_to_fp8_v2``: ``((input * scale).to(dtype), amax)``, one kernel.

    ``amax`` is ``max |input|`` as a 0-d float32 tensor when ``is_amax``, else an empty one.

    Raises:
        NotImplementedError: ``stochastic_rounding=True`` (not emulated).
    """
    if stochastic_rounding:
        raise NotImplementedError("Fp8Ops.cast_to_fp8_v2: stochastic rounding is not emulated")
    return torch.ops.hpu.cast_to_fp8_v2(input, scale, bool(is_amax), dtype)


def cast_from_fp8(input: Tensor, scale: Tensor | None, out_dtype: torch.dtype, scale_shape=None) -> Tensor:  # noqa: A002
    """``Fp8Ops.cast_from_fp8``: ``input.to(out_dtype) * scale`` (scale: the inverse of the cast's)."""
    return torch.ops.hpu.cast_from_fp8(input, scale, out_dtype)
