"""An offline English text corpus and a byte-level tokenizer for the text models.

NOTE [corpus and tokenizer]
    Corpus: real English prose that ships with installed software, read from disk, nothing
    downloaded: the dataset descriptions scikit-learn ships (``sklearn/datasets/descr/*.rst``,
    about 43 KB) followed by the Python language-reference topics CPython ships for
    ``help()`` (``pydoc_data.topics``, about 0.47 MB), each in sorted order: about 0.5 MB.

    Tokenizer: byte level, no vocabulary file and no training. A token is one UTF-8 byte;
    its id is ``byte + 4``, ids 0-3 being ``[PAD]``, ``[CLS]``, ``[SEP]``, ``[MASK]``. That
    needs a vocabulary of at least 260 rows (BERT's 30,522 and GPT-2's 50,257 are far
    larger; their other rows are simply never used). A smaller vocabulary (debug flavours)
    folds the bytes in: ``id = 4 + byte % (vocab_size - 4)``. Deterministic by construction.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import torch

__all__ = ["PAD", "CLS", "SEP", "MASK", "corpus_text", "encode", "lm_sequences", "mlm_examples"]

PAD, CLS, SEP, MASK = 0, 1, 2, 3
OFFSET = 4
"""Token id of byte 0; ids below are the special tokens."""


@functools.cache
def corpus_text() -> str:
    """The whole corpus as one string (sklearn dataset descriptions, then pydoc topics)."""
    # The package's folder found without importing it (scikit-learn's import costs about 1.5 s
    # of CPU, NOTE [digits split cache] in models.data); files read as importlib.resources would
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the text corpus needs scikit-learn's dataset descriptions: pip install scikit-learn")
    descr = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "descr"
    parts = [p.read_text(encoding="utf-8") for p in sorted(descr.iterdir(), key=lambda p: p.name)
             if p.name.endswith(".rst")]
    from pydoc_data.topics import topics

    parts += [topics[k] for k in sorted(topics)]
    return "\n\n".join(parts)


def encode(text: str, vocab_size: int) -> torch.Tensor:
    """Byte-level token ids of ``text`` (int64, one per UTF-8 byte), all below ``vocab_size``.

    Raises:
        ValueError: ``vocab_size`` below 5 (four special ids and at least one byte id).
    """
    if vocab_size < OFFSET + 1:
        raise ValueError(f"vocab_size must be >= {OFFSET + 1} for the byte tokenizer, got {vocab_size}")
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
    if vocab_size >= OFFSET + 256:
        return data + OFFSET
    return OFFSET + data % (vocab_size - OFFSET)


def lm_sequences(ids: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping next-token examples: ``(input_ids (N, T), labels (N, T))``, labels shifted by one."""
    n = (ids.numel() - 1) // seq_len
    if n < 1:
        raise ValueError(f"corpus of {ids.numel()} tokens is too short for seq_len {seq_len}")
    x = ids[: n * seq_len].view(n, seq_len)
    y = ids[1 : n * seq_len + 1].view(n, seq_len)
    return x, y


def mlm_examples(
    ids: torch.Tensor, seq_len: int, vocab_size: int, generator: torch.Generator, mask_prob: float = 0.15
) -> tuple[torch.Tensor, ...]:
    """BERT pretraining examples ``[CLS] A [SEP] B [SEP] [PAD]...`` from consecutive segments.

    Segments are disjoint runs of ``(seq_len - 3) // 2`` tokens. Pair ``k`` takes segment
    ``2k`` as A; B is segment ``2k + 1`` (NSP label 0, "is next") or, with probability 1/2,
    a random other segment (label 1), as transformers' ``next_sentence_label`` counts them.
    ``mask_prob`` of the A/B tokens are chosen for the MLM loss (label = original id, -100
    elsewhere): 80 % become ``[MASK]``, 10 % a random byte id, 10 % stay. A row with no
    chosen token gets its first A token chosen, so no batch has an empty MLM loss.

    Returns:
        ``(input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels)``, int64,
        each ``(N, seq_len)`` except ``nsp_labels (N,)``.

    Raises:
        ValueError: ``seq_len < 5`` or a corpus too short for four segments.
    """
    if seq_len < 5:
        raise ValueError(f"seq_len must be >= 5 for [CLS] A [SEP] B [SEP], got {seq_len}")
    seg = (seq_len - 3) // 2
    n_seg = ids.numel() // seg
    if n_seg < 4:
        raise ValueError(f"corpus of {ids.numel()} tokens is too short for seq_len {seq_len}")
    segments = ids[: n_seg * seg].view(n_seg, seg)
    a_idx = torch.arange(0, n_seg - 1, 2)
    n = a_idx.numel()
    is_random = torch.rand(n, generator=generator) < 0.5
    other = (a_idx + 2 + torch.randint(n_seg - 3, (n,), generator=generator)) % n_seg  # never A or its successor
    b_idx = torch.where(is_random, other, a_idx + 1)
    nsp = is_random.long()

    x = torch.full((n, seq_len), PAD, dtype=torch.long)
    types = torch.zeros((n, seq_len), dtype=torch.long)
    x[:, 0] = CLS
    x[:, 1 : 1 + seg] = segments[a_idx]
    x[:, 1 + seg] = SEP
    x[:, 2 + seg : 2 + 2 * seg] = segments[b_idx]
    x[:, 2 + 2 * seg] = SEP
    types[:, 2 + seg : 3 + 2 * seg] = 1
    attention = (torch.arange(seq_len) < 3 + 2 * seg).long().expand(n, seq_len).clone()

    content = x >= OFFSET
    chosen = (torch.rand((n, seq_len), generator=generator) < mask_prob) & content
    chosen[:, 1] |= ~chosen.any(dim=1)
    labels = torch.where(chosen, x, torch.full_like(x, -100))
    roll = torch.rand((n, seq_len), generator=generator)
    random_ids = torch.randint(OFFSET, vocab_size, (n, seq_len), generator=generator)
    x = torch.where(chosen & (roll < 0.8), torch.full_like(x, MASK), x)
    x = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, x)
    return x, types, attention, labels, nsp
