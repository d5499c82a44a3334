"""BERT-Large pretraining model (``transformers.BertForPreTraining``), built offline.

Full size is bert-large-uncased's shape: 24 layers, hidden 1024, 16 heads, intermediate
4096, vocab 30,522, 512 positions, 2 token types (336 M parameters with the MLM decoder
tied to the word embeddings, as transformers ties it).

Why ``BertForPreTraining`` (masked-LM + next-sentence heads) and not ``BertForMaskedLM``:
it is what BERT-Large *training* on Gaudi is -- Habana's Model-References
``PyTorch/nlp/bert`` runs BERT pretraining with both heads (phase 1 at sequence 128) --
and the pooler + NSP head are parameters DDP must reduce, so the bucket layout matches.

The model is built from a ``BertConfig`` only (random init, ``HF_HUB_OFFLINE=1``, nothing
downloaded). Attention uses transformers' ``"sdpa"`` path by default (one fused
``scaled_dot_product_attention`` per layer; runs on CPU and under ``FakeTensorMode``);
``attn_implementation="eager"`` gives the explicit matmul/softmax ops instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import ModelKind, register_model

__all__ = ["BertConfig", "build_bert", "param_count", "training_flops"]


@dataclass(kw_only=True, slots=True)
class BertConfig:
    """Shape of the BERT encoder and its pretraining heads."""

    vocab_size: int = 30522
    """Word-piece vocabulary rows (bert-large-uncased: 30,522)."""
    hidden: int = 1024
    """Hidden size H."""
    layers: int = 24
    """Transformer layers L."""
    heads: int = 16
    """Attention heads (H must divide by it)."""
    intermediate: int = 4096
    """Feed-forward inner size (4 H)."""
    max_positions: int = 512
    """Position-embedding rows: the longest sequence the model accepts."""
    type_vocab_size: int = 2
    """Segment (token-type) embedding rows: sentence A / B."""
    dropout: float = 0.1
    """Hidden (residual and embedding) dropout probability."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities. Off by default: then torch's SDPA runs a fused
    (flash) attention kernel that never stores the ``seq x seq`` scores, as Gaudi's FusedSDPA
    does; with it on, SDPA falls back to the math path, whose scores alone are 1 GiB per
    layer at batch 64 x 512 tokens, and BERT-Large does not fit the 96 GB of a Gaudi2."""
    seq_len: int = 128
    """Default sequence length of a live run (Habana's phase 1 uses 128)."""
    attn_implementation: str = "sdpa"
    """transformers attention path: "sdpa" (fused) or "eager" (matmul + softmax)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "layers", "heads", "intermediate", "max_positions",
                     "type_vocab_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"BertConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"BertConfig.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.seq_len > self.max_positions:
            raise ValueError(f"BertConfig.seq_len ({self.seq_len}) exceeds max_positions ({self.max_positions})")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"BertConfig.attn_implementation must be 'sdpa' or 'eager', got {self.attn_implementation!r}")

    def model_kind(self) -> ModelKind:
        return ModelKind(kind="text", task="mlm-nsp", dataset="text-mlm", seq_len=self.seq_len,
                         vocab_size=self.vocab_size, max_positions=self.max_positions)

    def training_flops(self, batch_size: int, *, image_size: int | None = None, seq_len: int | None = None) -> int:
        """See :func:`training_flops` (``image_size`` is ignored: a text model)."""
        return training_flops(self, batch_size, seq_len or self.seq_len)


def build_bert(cfg: BertConfig) -> torch.nn.Module:
    """``BertForPreTraining`` from a ``transformers.BertConfig`` (random init, offline)."""
    from ._hf import import_transformers

    tf = import_transformers()
    hf_cfg = tf.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_positions,
        type_vocab_size=cfg.type_vocab_size,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attention_dropout,
        pad_token_id=0,
        attn_implementation=cfg.attn_implementation,
    )
    return BertPretraining(tf.BertForPreTraining(hf_cfg))


class BertPretraining(torch.nn.Module):
    """``BertForPreTraining`` called as ``model(input_ids, token_type_ids)`` (both ``(batch, seq)``).

    The text corpus packs full-length sequences (no padding), so the attention mask would be
    all ones and is not passed: given a mask, transformers reads it on the host
    (``mask.all()``) in every forward to decide whether it can skip it, which in lazy mode is
    a host read that launches the graph mid-forward. Returns transformers' output
    (``prediction_logits``, ``seq_relationship_logits``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor):
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids)


def param_count(cfg: BertConfig) -> int:
    """Parameters of ``BertForPreTraining`` counted from the shape (decoder weight tied)."""
    h, i, v = cfg.hidden, cfg.intermediate, cfg.vocab_size
    embeddings = (v + cfg.max_positions + cfg.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h
    mlm_head = (h * h + h) + 2 * h + v  # transform dense + LayerNorm + decoder bias
    nsp_head = 2 * h + 2
    return embeddings + cfg.layers * layer + pooler + mlm_head + nsp_head


def training_flops(cfg: BertConfig, batch_size: int, seq_len: int) -> int:
    """Analytic FLOPs of one training step (nanoGPT's ``estimate_mfu`` accounting).

    Per token: 6 x the weights used in matmuls (per layer ``4 H^2 + 2 H I``; the MLM
    transform ``H^2`` and decoder ``V H``, applied at every position as transformers does)
    plus attention scores and values ``12 L H T``. Pooler and NSP head (once per sequence)
    and element-wise ops are left out.
    """
    h, t = cfg.hidden, seq_len
    matmul_weights = cfg.layers * (4 * h * h + 2 * h * cfg.intermediate) + h * h + cfg.vocab_size * h
    per_token = 6 * matmul_weights + 12 * cfg.layers * h * t
    return per_token * t * batch_size


register_model(
    "bert-large",
    BertConfig,
    flavours={"debug": {"vocab_size": 512, "hidden": 64, "layers": 2, "heads": 2, "intermediate": 128,
                        "max_positions": 128, "seq_len": 32}},
)(build_bert)
