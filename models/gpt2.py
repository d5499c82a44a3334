"""GPT-2 small (124 M) as ``transformers.GPT2LMHeadModel``, built offline.

Full size is ``GPT2Config()``'s shape: 12 layers, hidden 768, 12 heads, vocab 50,257,
1,024 positions: 124,439,808 parameters, the LM head tied to the token embedding
(``lm_head.weight is transformer.wte.weight``). The tie is kept on purpose: DDP sees one
parameter, not two, which changes its bucket count and sizes.

Built from a config object only (random init, ``HF_HUB_OFFLINE=1``), ``use_cache=False``
(training: no key/value cache), attention through ``"sdpa"`` by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import ModelKind, register_model

__all__ = ["GPT2Config", "build_gpt2", "param_count", "training_flops"]


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
    """transformers attention path: "sdpa" (fused) or "eager" (matmul + softmax)."""

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


def build_gpt2(cfg: GPT2Config) -> torch.nn.Module:
    """``GPT2LMHeadModel`` from a ``transformers.GPT2Config`` (random init, offline, tied head)."""
    from ._hf import import_transformers

    tf = import_transformers()
    hf_cfg = tf.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_embd=cfg.hidden,
        n_layer=cfg.layers,
        n_head=cfg.heads,
        n_positions=cfg.max_positions,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        use_cache=False,
        tie_word_embeddings=True,
        attn_implementation=cfg.attn_implementation,
    )
    return tf.GPT2LMHeadModel(hf_cfg)


def param_count(cfg: GPT2Config) -> int:
    """Parameters of ``GPT2LMHeadModel`` counted from the shape (LM head tied)."""
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
