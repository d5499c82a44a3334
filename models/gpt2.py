"""GPT-2 small (124 M), written in the nanoGPT manner (not transformers' GPT2LMHeadModel).

Full size is GPT-2 small's shape (OpenAI's GPT-2 release, also ``transformers.GPT2Config()``):
12 layers, hidden 768, 12 heads, vocab 50,257, 1,024 positions: 124,439,808 parameters, the
LM head tied to the token embedding (``lm_head.weight is wte.weight``). The tie is kept on
purpose: DDP sees one parameter, not two, which changes its bucket count and sizes. The
parameter layout matches transformers' (``nn.Linear`` where it has ``Conv1D``: same counts).

Why not transformers: in every training forward, ``GPT2Model`` builds its causal mask through
``masking_utils._preprocess_mask_arguments``, which reads the position ids on the host to
detect packed sequences (``find_packed_sequence_indices``: ``(mask[:, -1] == 0).all()``).
On Gaudi in lazy mode that host read launches the graph in the middle of the forward, and a
step traced without data (``hpu_runtime.tools.tracing``) cannot take the branch a value decides.
This model has no host reads: causal attention is ``scaled_dot_product_attention(...,
is_causal=True)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .registry import ModelKind, register_model

__all__ = ["GPT2Config", "GPT2", "build_gpt2", "param_count", "training_flops"]


@dataclass(kw_only=True, slots=True)
class GPT2Config:
    """Shape of the GPT-2 decoder."""

    vocab_size: int = 50257
    """BPE vocabulary rows (GPT-2: 50,257)."""
    hidden: int = 768
    """Embedding / residual width."""
    layers: int = 12
    """Transformer blocks."""
    heads: int = 12
    """Attention heads (hidden must divide by it)."""
    max_positions: int = 1024
    """Position-embedding rows: the longest context."""
    dropout: float = 0.1
    """Residual, embedding and attention dropout probability."""
    seq_len: int = 128
    """Default sequence length of a live run."""
    attn_implementation: str = "sdpa"
    """Attention: "sdpa" (``scaled_dot_product_attention``) or "eager" (matmul + softmax)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "layers", "heads", "max_positions", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPT2Config.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"GPT2Config.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPT2Config.dropout must be in [0, 1), got {self.dropout}")
        if self.seq_len > self.max_positions:
            raise ValueError(f"GPT2Config.seq_len ({self.seq_len}) exceeds max_positions ({self.max_positions})")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"GPT2Config.attn_implementation must be 'sdpa' or 'eager', got {self.attn_implementation!r}")

    def model_kind(self) -> ModelKind:
        return ModelKind(kind="text", task="causal-lm", dataset="text-lm", seq_len=self.seq_len,
                         vocab_size=self.vocab_size, max_positions=self.max_positions)

    def training_flops(self, batch_size: int, *, image_size: int | None = None, seq_len: int | None = None) -> int:
        """See :func:`training_flops` (``image_size`` is ignored: a text model)."""
        return training_flops(self, batch_size, seq_len or self.seq_len)


class _Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        h = cfg.hidden
        self.heads, self.dropout, self.eager = cfg.heads, cfg.dropout, cfg.attn_implementation == "eager"
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.attn_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.drop = nn.Dropout(cfg.dropout)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2)
                   for z in self.c_attn(x).split(h, dim=2))
        p = self.dropout if self.training else 0.0
        if self.eager:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = F.dropout(att.masked_fill(~causal, float("-inf")).softmax(-1), p, self.training)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.attn_proj(y.transpose(1, 2).reshape(b, t, h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.ln_1(x))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT2(nn.Module):
    """GPT-2 language model: ``(batch, seq)`` token ids -> ``(batch, seq, vocab)`` logits."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() > 1:
                nn.init.normal_(p, mean=0.0, std=0.02 / (math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 1))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_gpt2(cfg: GPT2Config) -> torch.nn.Module:
    """:class:`GPT2` (random init, tied head)."""
    return GPT2(cfg)


def param_count(cfg: GPT2Config) -> int:
    """Parameters of GPT-2 counted from the shape (LM head tied)."""
    h = cfg.hidden
    layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    return (cfg.vocab_size + cfg.max_positions) * h + cfg.layers * layer + 2 * h


def training_flops(cfg: GPT2Config, batch_size: int, seq_len: int) -> int:
    """Analytic FLOPs of one training step (nanoGPT's ``estimate_mfu``).

    Per token: 6 x matmul weights (``12 H^2`` per layer plus the ``V H`` LM head) plus
    attention ``12 L H T``; element-wise ops are left out.
    """
    h, t = cfg.hidden, seq_len
    per_token = 6 * (cfg.layers * 12 * h * h + cfg.vocab_size * h) + 12 * cfg.layers * h * t
    return per_token * t * batch_size


register_model(
    "gpt2",
    GPT2Config,
    flavours={"debug": {"vocab_size": 512, "hidden": 64, "layers": 2, "heads": 2, "max_positions": 128,
                        "seq_len": 32}},
)(build_gpt2)
