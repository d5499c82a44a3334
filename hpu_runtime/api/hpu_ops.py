"""Gaudi's custom ops (``torch.ops.hpu.*``): each one fused kernel, computed with plain torch ops.

On a Gaudi, ``import habana_frameworks.torch`` loads the bridge's library, which defines
custom ops in the ``hpu`` namespace that Intel's ``hpex.kernels`` classes and optimum-habana
call directly. Here each is a :func:`torch.library.custom_op` of the same name, whose hpu
kernel the bridge charges as **one** op per call
(:func:`~hpu_runtime.bridge.dispatch.charged_as_one_op`: one host-side op cost, one
graph-key entry, one roofline over the bytes it reads and writes; the ops with a FLOP formula
below run on the MME), and the implementation inside computes the unfused PyTorch reference on
the host, so numerics are those of the reference. Backward passes are their own single ops
(``*_backward``), with explicit gradient formulas. Under ``torch.compile`` and
``FakeTensorMode`` each op is one node (fake implementations give the shapes).

==================================  ===================================================================
op                                  reference (what it computes)
==================================  ===================================================================
``rotary_pos_embedding(p, sin,      rotary position embedding: ``p*cos + rot(p)*sin``, ``rot`` =
cos, position_ids, offset, mode)``  rotate-half (mode 0, BLOCKWISE) or rotate-every-two (mode 1,
                                    PAIRWISE); ``cos[position_ids]`` when given, else the rows from
                                    ``offset`` (formulas: Intel's ``apply_rotary_pos_emb`` docstring,
                                    HabanaAI/gaudi-pytorch-bridge ``hpex/kernels/RotaryPosEmbeddingHelper.py``)
``rotary_pos_embedding_backward``   its gradient w.r.t. ``p`` (the same arguments, the gradient first)
``fused_sdpa_fwd`` / ``_bwd``       ``torch.nn.functional.scaled_dot_product_attention`` (mask,
                                    causal, scale, dropout, grouped-query heads)
``fused_rms_norm`` / ``_backward``  ``torch.nn.functional.rms_norm`` over the last dimension
``softmax_fp8(x, dim, in_scale,     ``softmax(x * inv_attn_heads, dim)``; fp8 input/output scales are
out_scale, inv_attn_heads)``        not emulated (a clear error)
``mixture_of_experts(...)``         Mixtral's MoE: ``sum_k w_k * W3_e(act(W1_e x) * W2_e x)`` over the
                                    routed experts (forward only, as optimum-habana uses it)
``ctc_loss_custom`` / ``_backward`` ``aten._ctc_loss`` and its backward
``cast_to_fp8_v2`` / ``cast_from_fp8`` ``(x * scale).to(dtype)`` (+ ``max |x|``) / ``x.to(dtype) * scale``
``optimizer_adamw(grads, weights,   AdamW in place over lists, Intel's form (:func:`hpu_runtime.api.hpex.
exp_avg, exp_avg_sq, neg_step_t,    optimizer_adamw`); lazy mode's (float decay) and eager mode's
beta1, beta2, eps, wd[, has_wd])``  (tensor decay, flag) schemas are two overloads; fp8 moments refused
==================================  ===================================================================

Not emulated, raising :class:`NotImplementedError` that names them: ``cast_to_fp8_just_in_time``,
``fp8_gemm_v2``, ``convert_from_uint4`` (fp8 and int4 quantized matmuls; the transformer
engine's ``fp8.is_fp8_available()`` answers False, so scripts that ask first stay in bf16).
One module (a little over 430 lines) for the one ``hpu`` op library, as Intel's is one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

__all__ = ["NOT_EMULATED", "BLOCKWISE", "PAIRWISE", "register"]

BLOCKWISE, PAIRWISE = 0, 1
"""``mode`` values of the rotary ops (Intel's ``RotaryPosEmbeddingMode``)."""

NOT_EMULATED = ("cast_to_fp8_just_in_time", "fp8_gemm_v2", "convert_from_uint4")
"""``torch.ops.hpu`` names optimum-habana calls that the emulator defines only to refuse."""

_registered = False
_library = None


# ---- rotary position embedding -------------------------------------------------------------
def _rope_tables(p: Tensor, sin: Tensor, cos: Tensor, position_ids: Tensor | None, offset: int):
    if position_ids is not None:
        # [1, 1, seq, dim] or [seq, dim] -> [batch, 1, seq, dim] rows of the positions
        cos = cos.reshape(-1, cos.shape[-1])[position_ids].unsqueeze(1)
        sin = sin.reshape(-1, sin.shape[-1])[position_ids].unsqueeze(1)
    elif offset:
        n = p.shape[-2]
        cos, sin = cos[..., offset:offset + n, :], sin[..., offset:offset + n, :]
    return sin, cos


def _rot(x: Tensor, mode: int) -> Tensor:
    if mode == BLOCKWISE:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rot_transposed(y: Tensor, mode: int) -> Tensor:
    """The adjoint of :func:`_rot` (its gradient): ``<rot(x), y> = <x, rot_T(y)>``."""
    if mode == BLOCKWISE:
        y1, y2 = y.chunk(2, dim=-1)
        return torch.cat((y2, -y1), dim=-1)
    return torch.stack((y[..., 1::2], -y[..., 0::2]), dim=-1).flatten(-2)


def _check_mode(mode: int) -> None:
    if mode not in (BLOCKWISE, PAIRWISE):
        raise ValueError(f"torch.ops.hpu.rotary_pos_embedding: mode must be 0 (BLOCKWISE) or 1 (PAIRWISE), got {mode}")


def _rope(p, sin, cos, position_ids, offset, mode):
    _check_mode(mode)
    sin, cos = _rope_tables(p, sin, cos, position_ids, offset)
    return p * cos + _rot(p, mode) * sin


def _rope_backward(grad, sin, cos, position_ids, offset, mode):
    _check_mode(mode)
    sin, cos = _rope_tables(grad, sin, cos, position_ids, offset)
    return grad * cos + _rot_transposed(grad * sin, mode)


# ---- scaled dot-product attention ------------------------------------------------------------
def _expand_kv(q: Tensor, t: Tensor) -> Tensor:
    """Grouped-query attention: repeat k/v heads to q's head count."""
    if t.dim() == 4 and t.shape[1] != q.shape[1]:
        if q.shape[1] % t.shape[1]:
            raise ValueError(f"FusedSDPA: {q.shape[1]} query heads are not a multiple of {t.shape[1]} key/value heads")
        return t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)
    return t


def _fold_kv(grad: Tensor, like: Tensor) -> Tensor:
    """The adjoint of :func:`_expand_kv`: sum the gradients of repeated heads."""
    if grad.shape == like.shape:
        return grad
    g = like.shape[1]
    return grad.unflatten(1, (g, grad.shape[1] // g)).sum(2)


def _scores(q, k, mask, scale, is_causal):
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        n, m = s.shape[-2], s.shape[-1]
        causal = torch.ones(n, m, dtype=torch.bool, device=s.device).tril(m - n)
        s = s.masked_fill(~causal, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return s


def _sdpa_fwd(q, k, v, attn_mask, dropout_p, scale, is_causal):
    ke, ve = _expand_kv(q, k), _expand_kv(q, v)
    probs = torch.softmax(_scores(q.float(), ke.float(), attn_mask, scale, is_causal), dim=-1)
    if dropout_p > 0.0:
        keep = torch.rand_like(probs) >= dropout_p
        dmask = keep.to(probs.dtype) / (1.0 - dropout_p)
    else:
        dmask = probs.new_ones(())  # no dropout: a 0-d one
    out = torch.matmul(probs * dmask, ve.float()).to(q.dtype)
    return out, probs, dmask


def _sdpa_bwd(dout, q, k, v, probs, dmask, scale):
    ke, ve = _expand_kv(q, k).float(), _expand_kv(q, v).float()
    do = dout.float()
    pd = probs * dmask
    dv = torch.matmul(pd.transpose(-2, -1), do)
    dp = torch.matmul(do, ve.transpose(-2, -1)) * dmask
    ds = probs * (dp - (dp * probs).sum(-1, keepdim=True))
    dq = torch.matmul(ds, ke) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.float()) * scale
    return dq.to(q.dtype), _fold_kv(dk, k).to(k.dtype), _fold_kv(dv, v).to(v.dtype)


def _sdpa_flops(q_shape, k_shape, v_shape, *_args, out_shape=None, **_kwargs) -> int:
    b_h = math.prod(q_shape[:-2])
    n, d, m, dv = q_shape[-2], q_shape[-1], k_shape[-2], v_shape[-1]
    return 2 * b_h * n * m * (d + dv)


# ---- RMS norm ---------------------------------------------------------------------------------
def _rms_norm(x, weight, eps):
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r * weight.float()).to(x.dtype)


def _rms_norm_backward(grad, x, weight, eps):
    xf, g, w = x.float(), grad.float(), weight.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    gw = g * w
    dx = r * gw - xf * r.pow(3) * (gw * xf).mean(-1, keepdim=True)
    dw = (g * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


# ---- mixture of experts ----------------------------------------------------------------------
_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _moe(hidden_states, expert_routing_table, router_weights, w1, w2, w3, permuted_weights, activation,
         experts_min, experts_max):
    if activation not in _ACTIVATIONS:
        raise ValueError(f"torch.ops.hpu.mixture_of_experts: activation must be one of {sorted(_ACTIVATIONS)}, "
                         f"got {activation!r}")
    act = _ACTIVATIONS[activation]
    out = torch.zeros_like(hidden_states)
    for i in range(len(w1)):
        expert = experts_min + i
        hit = expert_routing_table == expert  # [tokens, k]
        if not bool(hit.any()):
            continue
        weight = (router_weights * hit).sum(-1, keepdim=True).to(hidden_states.dtype)
        a, b, c = (w if permuted_weights else w.t() for w in (w1[i], w2[i], w3[i]))
        h = act(hidden_states @ a.t()) * (hidden_states @ b.t())
        out = out + weight * (h @ c.t())
    return out


def _moe_flops(hs_shape, _table, _weights, w1, w2, w3, *_args, out_shape=None, **_kwargs) -> int:
    tokens, k = hs_shape[0], _table[-1]
    per_expert = sum(math.prod(s) for s in (w1[0], w2[0], w3[0])) if w1 else 0
    return 2 * tokens * k * per_expert


def _optimizer_adamw(g, w, m, v, neg_step_t, beta1, beta2, epsilon, weight_decay, exp_avg_scales=None,
                     exp_avg_sq_scales=None) -> None:
    """Lazy mode's schema: ``weight_decay`` a float multiplier."""
    from .hpex import optimizer_adamw  # hpex imports the device runtime: at first call

    optimizer_adamw(g, w, m, v, neg_step_t, beta1, beta2, epsilon, weight_decay, None, exp_avg_scales,
                    exp_avg_sq_scales)


def _optimizer_adamw_eager(g, w, m, v, neg_step_t, beta1, beta2, epsilon, weight_decay, has_weight_decay,
                           exp_avg_scales=None, exp_avg_sq_scales=None) -> None:
    """Eager mode's schema: ``weight_decay`` a tensor, applied when ``has_weight_decay``."""
    from .hpex import optimizer_adamw

    optimizer_adamw(g, w, m, v, neg_step_t, beta1, beta2, epsilon, weight_decay, has_weight_decay, exp_avg_scales,
                    exp_avg_sq_scales)


def _not_emulated(name: str):
    def refuse(*_args, **_kwargs):
        raise NotImplementedError(f"torch.ops.hpu.{name} is not emulated (fp8/int4 quantized compute is not modelled "
                                  "by the simulated Gaudi; transformer_engine.fp8.is_fp8_available() is False)")
    return refuse


def register() -> None:
    """Define the ``torch.ops.hpu`` ops (idempotent; ``import hpu_runtime`` calls it)."""
    global _registered
    if _registered:
        return
    _registered = True
    lib = "hpu"

    @torch.library.custom_op(f"{lib}::rotary_pos_embedding", mutates_args=())
    def rotary_pos_embedding(input: Tensor, sin: Tensor, cos: Tensor, position_ids: Tensor | None = None,
                             offset: int = 0, mode: int = 0) -> Tensor:
        return _rope(input, sin, cos, position_ids, offset, mode).contiguous()

    @torch.library.custom_op(f"{lib}::rotary_pos_embedding_backward", mutates_args=())
    def rotary_pos_embedding_backward(grad_in: Tensor, sin: Tensor, cos: Tensor, position_ids: Tensor | None = None,
                                      offset: int = 0, mode: int = 0) -> Tensor:
        return _rope_backward(grad_in, sin, cos, position_ids, offset, mode).contiguous()

    for op in (rotary_pos_embedding, rotary_pos_embedding_backward):
        op.register_fake(lambda t, *_a, **_k: torch.empty_like(t))

    def rope_setup(ctx, inputs, output):
        _, sin, cos, position_ids, offset, mode = inputs
        ctx.save_for_backward(sin, cos, position_ids)
        ctx.offset, ctx.mode = offset, mode

    def rope_grad(ctx, grad):
        sin, cos, position_ids = ctx.saved_tensors
        return torch.ops.hpu.rotary_pos_embedding_backward(grad, sin, cos, position_ids, ctx.offset, ctx.mode), \
            None, None, None, None, None

    rotary_pos_embedding.register_autograd(rope_grad, setup_context=rope_setup)

    @torch.library.custom_op(f"{lib}::fused_sdpa_fwd", mutates_args=())
    def fused_sdpa_fwd(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, scale: float,
                       is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
        return _sdpa_fwd(q, k, v, attn_mask, dropout_p, scale, is_causal)

    @fused_sdpa_fwd.register_fake
    def _(q, k, v, attn_mask, dropout_p, scale, is_causal):
        shape = (*q.shape[:-1], k.shape[-2])
        return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(shape, dtype=torch.float32),
                q.new_empty(shape if dropout_p > 0.0 else (), dtype=torch.float32))

    @torch.library.custom_op(f"{lib}::fused_sdpa_bwd", mutates_args=())
    def fused_sdpa_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, probs: Tensor, dmask: Tensor,
                       scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return _sdpa_bwd(dout, q, k, v, probs, dmask, scale)

    @fused_sdpa_bwd.register_fake
    def _(dout, q, k, v, probs, dmask, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def sdpa_setup(ctx, inputs, output):
        q, k, v, _mask, _p, scale, _causal = inputs
        _, probs, dmask = output
        ctx.save_for_backward(q, k, v, probs, dmask)
        ctx.scale = scale

    def sdpa_grad(ctx, dout, _dprobs, _ddmask):
        q, k, v, probs, dmask = ctx.saved_tensors
        dq, dk, dv = torch.ops.hpu.fused_sdpa_bwd(dout, q, k, v, probs, dmask, ctx.scale)
        return dq, dk, dv, None, None, None, None

    fused_sdpa_fwd.register_autograd(sdpa_grad, setup_context=sdpa_setup)
    register_flop_formula(torch.ops.hpu.fused_sdpa_fwd)(_sdpa_flops)
    register_flop_formula(torch.ops.hpu.fused_sdpa_bwd)(
        lambda dout, q, k, v, *a, out_shape=None, **kw: 2 * _sdpa_flops(q, k, v))

    @torch.library.custom_op(f"{lib}::fused_rms_norm", mutates_args=())
    def fused_rms_norm(input: Tensor, weight: Tensor, eps: float) -> Tensor:
        return _rms_norm(input, weight, eps)

    fused_rms_norm.register_fake(lambda x, w, eps: torch.empty_like(x))

    @torch.library.custom_op(f"{lib}::fused_rms_norm_backward", mutates_args=())
    def fused_rms_norm_backward(grad: Tensor, input: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return _rms_norm_backward(grad, input, weight, eps)

    fused_rms_norm_backward.register_fake(lambda g, x, w, eps: (torch.empty_like(x), torch.empty_like(w)))

    def rms_setup(ctx, inputs, output):
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def rms_grad(ctx, grad):
        x, w = ctx.saved_tensors
        dx, dw = torch.ops.hpu.fused_rms_norm_backward(grad, x, w, ctx.eps)
        return dx, dw, None

    fused_rms_norm.register_autograd(rms_grad, setup_context=rms_setup)

    @torch.library.custom_op(f"{lib}::softmax_fp8", mutates_args=())
    def softmax_fp8(input: Tensor, dim: int, input_scale: Tensor | None = None, output_scale: Tensor | None = None,
                    inv_attn_heads: Tensor | None = None) -> Tensor:
        if input_scale is not None or output_scale is not None:
            raise NotImplementedError("torch.ops.hpu.softmax_fp8 with fp8 input/output scales is not emulated; "
                                      "pass None for both (a softmax in the input's dtype)")
        x = input if inv_attn_heads is None else input * inv_attn_heads
        return torch.softmax(x, dim).to(input.dtype)

    softmax_fp8.register_fake(lambda x, dim, *a, **k: torch.empty_like(x))

    def softmax_setup(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[4])
        ctx.dim = inputs[1]

    def softmax_grad(ctx, grad):
        probs, inv = ctx.saved_tensors
        dx = torch._softmax_backward_data(grad, probs, ctx.dim, probs.dtype)
        return (dx if inv is None else dx * inv), None, None, None, None

    softmax_fp8.register_autograd(softmax_grad, setup_context=softmax_setup)

    @torch.library.custom_op(f"{lib}::mixture_of_experts", mutates_args=())
    def mixture_of_experts(hidden_states: Tensor, expert_routing_table: Tensor, router_weights: Tensor,
                           w1: list[Tensor], w2: list[Tensor], w3: list[Tensor], permuted_weights: bool = True,
                           activation: str = "silu", experts_min: int = 0, experts_max: int = 7) -> Tensor:
        return _moe(hidden_states, expert_routing_table, router_weights, w1, w2, w3, permuted_weights, activation,
                    experts_min, experts_max)

    mixture_of_experts.register_fake(lambda hs, *a, **k: torch.empty_like(hs))
    register_flop_formula(torch.ops.hpu.mixture_of_experts)(_moe_flops)

    @torch.library.custom_op(f"{lib}::ctc_loss_custom", mutates_args=())
    def ctc_loss_custom(log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor,
                        blank: int, zero_infinity: bool) -> tuple[Tensor, Tensor]:
        nll, alpha = torch.ops.aten._ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, blank,
                                                     zero_infinity)
        return nll, alpha

    @ctc_loss_custom.register_fake
    def _(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
        t, b = log_probs.shape[0], log_probs.shape[1]
        s = 2 * int(targets.shape[-1] if targets.dim() == 2 else targets.shape[0]) + 1
        return log_probs.new_empty((b,)), log_probs.new_empty((b, t, s))

    @torch.library.custom_op(f"{lib}::ctc_loss_custom_backward", mutates_args=())
    def ctc_loss_custom_backward(grad: Tensor, log_probs: Tensor, targets: Tensor, input_lengths: Tensor,
                                 target_lengths: Tensor, nll: Tensor, alpha: Tensor, blank: int,
                                 zero_infinity: bool) -> Tensor:
        return torch.ops.aten._ctc_loss_backward.Tensor(grad, log_probs, targets, input_lengths, target_lengths,
                                                        nll, alpha, blank, zero_infinity)

    ctc_loss_custom_backward.register_fake(lambda g, lp, *a: torch.empty_like(lp))

    def ctc_setup(ctx, inputs, output):
        log_probs, targets, il, tl, blank, zero_inf = inputs
        ctx.save_for_backward(log_probs, targets, il, tl, *output)
        ctx.blank, ctx.zero_infinity = blank, zero_inf

    def ctc_grad(ctx, grad, _dalpha):
        log_probs, targets, il, tl, nll, alpha = ctx.saved_tensors
        d = torch.ops.hpu.ctc_loss_custom_backward(grad, log_probs, targets, il, tl, nll, alpha, ctx.blank,
                                                   ctx.zero_infinity)
        return d, None, None, None, None, None

    ctc_loss_custom.register_autograd(ctc_grad, setup_context=ctc_setup)

    @torch.library.custom_op(f"{lib}::cast_to_fp8_v2", mutates_args=())
    def cast_to_fp8_v2(input: Tensor, scale: Tensor | None, is_amax: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        x = input if scale is None else input * scale
        amax = input.abs().amax().float() if is_amax else input.new_empty((0,), dtype=torch.float32)
        return x.to(dtype), amax

    cast_to_fp8_v2.register_fake(lambda x, s, is_amax, dtype: (
        x.new_empty(x.shape, dtype=dtype), x.new_empty(() if is_amax else (0,), dtype=torch.float32)))

    @torch.library.custom_op(f"{lib}::cast_from_fp8", mutates_args=())
    def cast_from_fp8(input: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        x = input.to(out_dtype)
        return x if scale is None else (x * scale).to(out_dtype)

    cast_from_fp8.register_fake(lambda x, s, out_dtype: x.new_empty(x.shape, dtype=out_dtype))

    from ..bridge.dispatch import charged_as_one_op

    for op in (rotary_pos_embedding, rotary_pos_embedding_backward, fused_sdpa_fwd, fused_sdpa_bwd, fused_rms_norm,
               fused_rms_norm_backward, softmax_fp8, mixture_of_experts, ctc_loss_custom, ctc_loss_custom_backward,
               cast_to_fp8_v2, cast_from_fp8):  # one kernel each on the device, its body unseen by the bridge
        op.register_kernel("hpu", charged_as_one_op(op._opoverload, op._init_fn))

    global _library
    fragment = _library = torch.library.Library(lib, "FRAGMENT")  # kept alive: the definitions live with it
    # Gaudi's fused AdamW (DeepSpeed's HPU FusedAdam calls it): lazy mode's schema (a float decay
    # multiplier) and eager mode's (a tensor and a flag) as two overloads, so either call resolves.
    # Composite: the body charges one fused kernel itself (hpex.optimizer_adamw).
    lists = ("Tensor[] gradient_vec, Tensor(a!)[] weight_vec, Tensor(b!)[] exp_avg_vec, "
             "Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, float epsilon, ")
    scales = "Tensor(d!)[]? exp_avg_scales=None, Tensor(e!)[]? exp_avg_sq_scales=None) -> ()"
    fragment.define("optimizer_adamw(" + lists + "float weight_decay, " + scales)
    fragment.define("optimizer_adamw.eager(" + lists + "Tensor weight_decay, bool has_weight_decay, " + scales)
    fragment.impl("optimizer_adamw", _optimizer_adamw, "CompositeImplicitAutograd")
    fragment.impl("optimizer_adamw.eager", _optimizer_adamw_eager, "CompositeImplicitAutograd")
    for name, schema in (("cast_to_fp8_just_in_time", "(Tensor input, int[] block_size, *, ScalarType out_dtype, "
                                                       "ScalarType scale_dtype) -> (Tensor, Tensor)"),
                         ("fp8_gemm_v2", "(Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, "
                                         "ScalarType out_dtype, Tensor? A_scale_inv=None, Tensor? B_scale_inv=None, "
                                         "Tensor? bias=None, bool accumulate=False, int[]? B_scale_shape=None) "
                                         "-> Tensor"),
                         ("convert_from_uint4", "(Tensor input, Tensor scale, Tensor zero_point, "
                                                "ScalarType out_dtype) -> Tensor")):
        fragment.define(name + schema)
        fragment.impl(name, _not_emulated(name), "CompositeExplicitAutograd")
