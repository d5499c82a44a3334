"""transformers' own ``Trainer`` on the simulated Gaudi, as Hugging Face's Gaudi guide runs it: no
code for the device (``TrainingArguments`` picks hpu), a tiny random Llama, bf16. ``transformers``
is imported before the emulator. Trains three times for ``--steps`` steps (the first compiles the
recipes; the third sleeps ``--host-sleep`` wall seconds at every step, host time the card never
sees) and prints one JSON line: each run's metrics and the parameters' device.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

import habana_frameworks.torch.core as htcore  # noqa: F401,E402 - after transformers, on purpose

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", required=True)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--host-sleep", type=float, default=0.05)
args = parser.parse_args()


class Tokens(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(3, 256, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class HostSleep(TrainerCallback):
    def on_step_end(self, *_args, **_kwargs) -> None:
        time.sleep(args.host_sleep)


torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
training = TrainingArguments(output_dir=args.output_dir, per_device_train_batch_size=4, max_steps=args.steps,
                             logging_steps=args.steps, report_to="none", bf16=True, save_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True)
runs = []
for callbacks in ([], [], [HostSleep()]):
    runs.append(Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=callbacks).train().metrics)
print(json.dumps({"device": str(training.device), "param_device": str(next(model.parameters()).device),
                  "runs": runs}))
