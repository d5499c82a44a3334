"""Gaudi's hpex.kernels, FusedRMSNorm and the torch.ops.hpu ops optimum-habana calls: each against
its unfused PyTorch reference (values and gradients, random non-integer inputs), each charged
as one op on the simulated device, and the names not emulated refuse clearly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hpu_runtime
from hpu_runtime import reset_device

import habana_frameworks.torch.hpex.experimental.transformer_engine as te  # noqa: E402
from habana_frameworks.torch.hpex.kernels import (  # noqa: E402
    CTCLoss,
    Fp8Ops,
    FusedSDPA,
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)
from habana_frameworks.torch.hpex.normalization import FusedRMSNorm  # noqa: E402


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, g, requires_grad=True, dtype=torch.float32):
    return (torch.randn(*shape, generator=g) * 0.7 + 0.1).to(dtype).requires_grad_(requires_grad)


def _check(got, want, inputs, rtol=1e-5, atol=1e-5, g=None) -> None:
    """Outputs equal, and gradients w.r.t. ``inputs`` under one random upstream gradient equal."""
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    up = torch.randn(got.shape, generator=g or _gen(9)).to(got.dtype)
    ga = torch.autograd.grad(got, inputs, up, retain_graph=True)
    gb = torch.autograd.grad(want, inputs, up)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_rotary_v2_is_transformers_apply_rotary_pos_emb_at_position_ids() -> None:
    g = _gen(1)
    b, h, s, d = 2, 3, 5, 8
    q = _randn(b, h, s, d, g=g)
    cos, sin = _randn(s, d, g=g, requires_grad=False), _randn(s, d, g=g, requires_grad=False)
    pos = torch.tensor([[4, 0, 2, 1, 3], [0, 1, 2, 3, 4]])
    got = RotaryPosEmbeddingHelperV2.apply(q, cos.unsqueeze(0).unsqueeze(0), sin.unsqueeze(0).unsqueeze(0), pos)
    c, sn = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)  # transformers' unsqueeze_dim=1 layout
    _check(got, q * c + _rotate_half(q) * sn, [q], g=g)


def test_rotary_v1_offset_and_pairwise_mode() -> None:
    g = _gen(2)
    b, h, s, d = 1, 2, 4, 6
    p = _randn(b, h, s, d, g=g)
    cos, sin = _randn(1, 1, s + 3, d, g=g, requires_grad=False), _randn(1, 1, s + 3, d, g=g, requires_grad=False)
    got = RotaryPosEmbeddingHelperV1.apply(p, cos, sin, 3)
    _check(got, p * cos[..., 3:, :] + _rotate_half(p) * sin[..., 3:, :], [p], g=g)
    # PAIRWISE (GPT-J): rotate every two
    c2, s2 = cos[..., :s, :], sin[..., :s, :]
    got = apply_rotary_pos_emb(p, c2, s2, None, 0, RotaryPosEmbeddingMode.PAIRWISE)
    rot = torch.stack((-p[..., 1::2], p[..., ::2]), dim=-1).flatten(-2)
    _check(got, p * c2 + rot * s2, [p], g=g)


def test_rotary_v3_is_chatglm_rope_cache() -> None:
    g = _gen(3)
    sq, b, heads, hd, rot_dim = 5, 2, 3, 8, 4
    x = _randn(sq, b, heads, hd, g=g)
    cache = _randn(sq + 2, 1, rot_dim // 2, 2, g=g, requires_grad=False)
    got = RotaryPosEmbeddingHelperV3.apply(x, cache)
    # ChatGLM's own formula (THUDM modeling_chatglm.apply_rotary_pos_emb)
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    xs = xr.reshape(sq, -1, heads, rot_dim // 2, 2)
    rc = cache[:sq].view(sq, -1, 1, xs.size(3), 2)
    out = torch.stack((xs[..., 0] * rc[..., 0] - xs[..., 1] * rc[..., 1],
                       xs[..., 1] * rc[..., 0] + xs[..., 0] * rc[..., 1]), -1).flatten(3)
    _check(got, torch.cat((out, xp), dim=-1), [x], g=g)
    assert torch.equal(apply_rotary_pos_emb(x, cache), got)


@pytest.mark.parametrize("case", ["plain", "causal", "float_mask", "bool_mask", "gqa", "scale"])
def test_fused_sdpa_is_scaled_dot_product_attention(case) -> None:
    g = _gen(4)
    q = _randn(2, 4, 5, 8, g=g)
    kv_heads = 2 if case == "gqa" else 4
    k, v = _randn(2, kv_heads, 6 if case != "causal" else 5, 8, g=g), _randn(2, kv_heads, 6 if case != "causal" else 5, 8, g=g)
    mask = None
    if case == "float_mask":
        mask = torch.randn(2, 1, 5, 6, generator=g)
    elif case == "bool_mask":
        mask = torch.rand(2, 1, 5, 6, generator=g) > 0.3
        mask[..., 0] = True
    scale = 0.37 if case == "scale" else None
    got = FusedSDPA.apply(q, k, v, mask, 0.0, case == "causal", scale)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case == "causal", scale=scale,
                                          enable_gqa=case == "gqa")
    _check(got, want, [q, k, v], g=g)


def test_fused_sdpa_dropout_mask_and_probs() -> None:
    """With dropout the returned mask reproduces the output; inference can return the probabilities."""
    g = _gen(5)
    q, k, v = (_randn(1, 2, 4, 8, g=g, requires_grad=False) for _ in range(3))
    torch.manual_seed(0)
    out, probs, dmask = FusedSDPA.apply(q, k, v, None, 0.25, False, None, "None", None, None, "left", True, True)
    ref_p = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, -1)
    torch.testing.assert_close(probs, ref_p)
    assert set(torch.unique(dmask).tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    torch.testing.assert_close(out, (ref_p * dmask) @ v)
    with pytest.raises(AssertionError, match="inference"):
        FusedSDPA.apply(q.requires_grad_(), k, v, None, 0.0, False, None, "None", None, None, "left", False, True)
    with pytest.raises(NotImplementedError, match="valid_seq_len"):
        FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", None, torch.tensor([3]))


def test_transformer_engine_fused_attention_is_fused_sdpa() -> None:
    g = _gen(6)
    q, k, v = (_randn(1, 2, 4, 8, g=g) for _ in range(3))
    att = te.FusedAttention(scale=0.5, attention_dropout=0.0).eval()
    _check(att(q, k, v, None, True), F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5), [q, k, v])
    assert te.distributed.activation_checkpointing()(lambda x: 2 * x)(3) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_is_rms_norm(dtype) -> None:
    g = _gen(7)
    x, w = _randn(3, 4, 16, g=g, dtype=dtype), _randn(16, g=g, dtype=dtype)
    want = F.rms_norm(x.float(), (16,), w.float(), 1e-6).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    _check(FusedRMSNorm.apply(x, w, 1e-6), want, [x, w], g=g, **tol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_is_ctc_loss(reduction) -> None:
    g = _gen(8)
    t, b, c, s = 12, 3, 6, 4
    logits = _randn(t, b, c, g=g)
    lp = logits.log_softmax(-1)
    targets = torch.randint(1, c, (b, s), generator=g)
    il, tl = torch.tensor([12, 10, 11]), torch.tensor([4, 3, 2])
    got = CTCLoss.apply(lp, targets, il, tl, 0, reduction, False)
    want = F.ctc_loss(lp, targets, il, tl, blank=0, reduction=reduction, zero_infinity=False)
    _check(got, want, [logits], g=g)


def test_softmax_fp8_and_mixture_of_experts_ops() -> None:
    g = _gen(10)
    x = _randn(2, 3, 5, g=g)
    inv = torch.tensor(0.35)
    _check(torch.ops.hpu.softmax_fp8(x, -1, None, None, inv), torch.softmax(x * 0.35, -1), [x], g=g)
    with pytest.raises(NotImplementedError, match="fp8"):
        torch.ops.hpu.softmax_fp8(x, -1, torch.tensor(1.0), None, None)
    tokens, hidden, inter, experts, top = 6, 8, 12, 4, 2
    hs = _randn(tokens, hidden, g=g, requires_grad=False)
    w1 = [_randn(inter, hidden, g=g, requires_grad=False) for _ in range(experts)]
    w2 = [_randn(inter, hidden, g=g, requires_grad=False) for _ in range(experts)]
    w3 = [_randn(hidden, inter, g=g, requires_grad=False) for _ in range(experts)]
    route = torch.stack([torch.randperm(experts, generator=g)[:top] for _ in range(tokens)])
    weights = torch.rand(tokens, top, generator=g)
    got = torch.ops.hpu.mixture_of_experts(hidden_states=hs, expert_routing_table=route, router_weights=weights,
                                           w1=w1, w2=w2, w3=w3, permuted_weights=True, activation="silu",
                                           experts_min=0, experts_max=experts - 1)
    want = torch.zeros_like(hs)
    for i in range(tokens):  # Mixtral's expert MLP per routed token: w3(silu(w1 x) * w2 x)
        for j in range(top):
            e = int(route[i, j])
            h = F.silu(hs[i] @ w1[e].t()) * (hs[i] @ w2[e].t())
            want[i] += weights[i, j] * (h @ w3[e].t())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp8_casts() -> None:
    g = _gen(11)
    x = _randn(4, 5, g=g, requires_grad=False)
    scale = torch.tensor(2.5)
    out, amax = Fp8Ops.cast_to_fp8_v2(x, scale, False, True, torch.float8_e4m3fn)
    assert out.dtype == torch.float8_e4m3fn and torch.equal(out, (x * scale).to(torch.float8_e4m3fn))
    assert amax.item() == x.abs().max().item()
    back = Fp8Ops.cast_from_fp8(out, 1 / scale, torch.float32)
    torch.testing.assert_close(back, out.float() / 2.5)
    with pytest.raises(NotImplementedError, match="stochastic"):
        Fp8Ops.cast_to_fp8_v2(x, None, True)


def test_names_not_emulated_say_so() -> None:
    import habana_frameworks.torch.hpex.kernels as kernels

    with pytest.raises(AttributeError, match="CustomNms is not emulated"):
        kernels.CustomNms  # noqa: B018
    with pytest.raises(NotImplementedError, match="fp8_gemm_v2 is not emulated"):
        torch.ops.hpu.fp8_gemm_v2(torch.ones(2, 2), False, torch.ones(2, 2), False, None, torch.bfloat16)
    with pytest.raises(AttributeError, match="not emulated"):
        torch.hpu.no_such_function  # noqa: B018


@pytest.mark.parametrize("name", ["rope", "sdpa", "rms", "softmax", "moe"])
def test_each_kernel_is_one_device_op_forward_and_one_backward(name) -> None:
    """On "hpu" tensors each call is one recorded op (its backward one more), priced by the cost
    model: attention and MoE on the MME (their FLOP formulas), the others on the TPC."""
    dev = reset_device("gaudi2")
    g = _gen(12)
    x = torch.randn(2, 2, 4, 8, generator=g).to("hpu").requires_grad_()
    hpu_runtime.mark_step()
    dev.log = []
    if name == "rope":
        out = RotaryPosEmbeddingHelperV1.apply(x, torch.ones(1, 1, 4, 8).to("hpu"), torch.zeros(1, 1, 4, 8).to("hpu"), 0)
    elif name == "sdpa":
        out = FusedSDPA.apply(x, x, x)
    elif name == "rms":
        out = FusedRMSNorm.apply(x, torch.ones(8).to("hpu"), 1e-6)
    elif name == "softmax":
        out = torch.ops.hpu.softmax_fp8(x, -1, None, None, None)
    else:
        hs = x.detach().reshape(-1, 8)
        out = torch.ops.hpu.mixture_of_experts(hs, torch.zeros(16, 1, dtype=torch.long).to("hpu"),
                                               torch.ones(16, 1).to("hpu"), [torch.ones(4, 8).to("hpu")],
                                               [torch.ones(4, 8).to("hpu")], [torch.ones(8, 4).to("hpu")],
                                               True, "silu", 0, 0)
    fwd = [e[1] for e in dev.log if e[0] == "op"]
    kernels = [r for r in fwd if str(r.key[0]).startswith("hpu.")]
    assert len(kernels) == 1, [r.key[0] for r in fwd]
    engine = "MME" if name in ("sdpa", "moe") else "TPC"
    assert kernels[0].cost.engine == engine and kernels[0].cost.flops > 0 and kernels[0].cost.bytes_in > 0
    if name != "moe":
        dev.log = []
        out.sum().backward()
        names = [str(e[1].key[0]) for e in dev.log if e[0] == "op"]
        backward_kernel = "aten._softmax_backward_data" if name == "softmax" else "hpu."
        assert sum(n.startswith(backward_kernel) for n in names) == 1, names
        assert not any(n.startswith("aten.softmax") or n.startswith("aten.bmm") for n in names)
