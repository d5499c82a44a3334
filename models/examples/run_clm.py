"""Language-model training with optimum-habana's ``GaudiTrainer``, in the manner of its ``run_clm.py`` example.

A Gaudi user's script, unmodified for the emulator: it imports ``optimum.habana``,
``transformers`` and ``torch`` only (no ``hpu_runtime``), and runs the same on a Gaudi.
What differs from optimum-habana's example is only what an offline machine needs: the model
is built from a config with random weights (``--model_type gpt2`` causal LM, ``bert`` masked
LM; sizes by flag), the text is CPython's ``pydoc_data`` topics (shipped with Python), and
the tokenizer is byte level (a token is one UTF-8 byte). Every ``GaudiTrainingArguments``
flag works (``--use_lazy_mode``, ``--use_hpu_graphs_for_training``, ``--bf16``,
``--distribution_strategy fast_ddp``, ``--torch_compile``, ``--save_steps``,
``--resume_from_checkpoint``...); ``--use_fused_adam`` / ``--use_fused_clip_norm`` /
``--use_torch_autocast`` fill the ``GaudiConfig`` unless ``--gaudi_config_name`` names a
local ``gaudi_config.json``.

A script, not a module of the ``models`` package (this folder has no ``__init__``): it needs
the ``[optimum]`` extra (README, "Your Gaudi tools")::

    python models/examples/run_clm.py --model_type gpt2 --output_dir out --use_habana --use_lazy_mode \\
        --do_train --do_eval --max_steps 20 --per_device_train_batch_size 4 --report_to none
    torchrun --nproc-per-node 2 models/examples/run_clm.py ... --distribution_strategy fast_ddp

``--dump_params_dir DIR`` writes each rank's final parameters to ``DIR/params_rank{R}.pt``
(for comparing ranks and runs) and ``DIR/log_rank{R}.json`` (the trainer's log history, the backend, and
how many graphs dynamo compiled).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, HfArgumentParser

VOCAB = 256
"""Byte-level vocabulary: token id = byte value."""

MASK_ID, IGNORE = 0, -100


@dataclass
class ModelArguments:
    model_type: str = field(default="gpt2", metadata={"help": "gpt2 (causal LM) or bert (masked LM)"})
    n_layer: int = field(default=2, metadata={"help": "transformer layers"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    n_head: int = field(default=2, metadata={"help": "attention heads"})
    dropout: float = field(default=0.1, metadata={"help": "dropout probability (0: runs comparable bit for bit)"})
    use_fused_adam: bool = field(default=True, metadata={"help": "GaudiConfig.use_fused_adam"})
    use_fused_clip_norm: bool = field(default=True, metadata={"help": "GaudiConfig.use_fused_clip_norm"})
    use_torch_autocast: bool = field(default=False, metadata={"help": "GaudiConfig.use_torch_autocast"})


@dataclass
class DataArguments:
    block_size: int = field(default=32, metadata={"help": "tokens per example"})
    max_train_samples: int = field(default=256, metadata={"help": "training examples"})
    max_eval_samples: int = field(default=32, metadata={"help": "evaluation examples (after the training ones)"})
    dump_params_dir: str | None = field(default=None, metadata={"help": "write final parameters per rank here"})


def corpus_ids() -> torch.Tensor:
    """Byte ids of CPython's pydoc topics (shipped with Python: nothing is downloaded)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


class TextBlocks(torch.utils.data.Dataset):
    """Consecutive ``block_size`` windows of the corpus; causal LM labels = inputs (shifted by the
    model), masked LM: every 7th token (from a per-example phase) masked and predicted."""

    def __init__(self, ids: torch.Tensor, first: int, count: int, block_size: int, masked: bool) -> None:
        if (first + count) * block_size > ids.numel():
            raise ValueError(f"the corpus holds {ids.numel() // block_size} blocks of {block_size}, "
                             f"asked for {first + count}")
        self.ids, self.first, self.count, self.block, self.masked = ids, first, count, block_size, masked

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = (self.first + i) * self.block
        x = self.ids[start:start + self.block].clone()
        if not self.masked:
            return {"input_ids": x, "labels": x.clone()}
        chosen = (torch.arange(self.block) + i) % 7 == 0
        labels = torch.where(chosen, x, IGNORE)
        return {"input_ids": torch.where(chosen, MASK_ID, x), "labels": labels}


def build_model(args: ModelArguments, block_size: int) -> torch.nn.Module:
    if args.model_type == "gpt2":
        cfg = GPT2Config(vocab_size=VOCAB, n_positions=block_size, n_embd=args.n_embd, n_layer=args.n_layer,
                         n_head=args.n_head, use_cache=False, resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                         attn_pdrop=args.dropout)
        return GPT2LMHeadModel(cfg)
    if args.model_type == "bert":
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=args.n_embd, num_hidden_layers=args.n_layer,
                         num_attention_heads=args.n_head, intermediate_size=4 * args.n_embd,
                         max_position_embeddings=block_size, hidden_dropout_prob=args.dropout,
                         attention_probs_dropout_prob=args.dropout)
        return BertForMaskedLM(cfg)
    raise ValueError(f"--model_type must be gpt2 or bert, got {args.model_type!r}")


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((ModelArguments, DataArguments, GaudiTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if training_args.gaudi_config_name:  # a local gaudi_config.json or its folder (nothing is downloaded)
        gaudi_config = GaudiConfig.from_pretrained(training_args.gaudi_config_name)
    else:
        gaudi_config = GaudiConfig(use_fused_adam=model_args.use_fused_adam,
                                   use_fused_clip_norm=model_args.use_fused_clip_norm,
                                   use_torch_autocast=model_args.use_torch_autocast)
    torch.manual_seed(training_args.seed)
    model = build_model(model_args, data_args.block_size)  # after the arguments: optimum adapts the classes first
    ids = corpus_ids()
    masked = model_args.model_type == "bert"
    train = TextBlocks(ids, 0, data_args.max_train_samples, data_args.block_size, masked)
    evaluation = TextBlocks(ids, data_args.max_train_samples, data_args.max_eval_samples, data_args.block_size, masked)
    trainer = GaudiTrainer(model=model, gaudi_config=gaudi_config, args=training_args,
                           train_dataset=train if training_args.do_train else None,
                           eval_dataset=evaluation if training_args.do_eval else None)
    results: dict = {}
    if training_args.do_train:
        out = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.log_metrics("train", out.metrics)
        results["train"] = out.metrics
    if training_args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        results["eval"] = metrics
    if data_args.dump_params_dir:
        rank = training_args.process_index
        folder = Path(data_args.dump_params_dir)
        folder.mkdir(parents=True, exist_ok=True)
        params = {k: v.detach().to("cpu").clone() for k, v in trainer.model.state_dict().items()}
        torch.save(params, folder / f"params_rank{rank}.pt")
        (folder / f"log_rank{rank}.json").write_text(json.dumps(
            {"log_history": trainer.state.log_history, "results": results,
             "param_device": str(next(trainer.model.parameters()).device),
             "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
             # graphs dynamo compiled in this process (0 unless --torch_compile took effect)
             "dynamo_graphs": _dynamo_graphs()},
            default=str))
    return results


def _dynamo_graphs() -> int:
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return int(dynamo_utils.counters["stats"]["unique_graphs"]) if dynamo_utils is not None else 0


if __name__ == "__main__":
    main(sys.argv[1:])
