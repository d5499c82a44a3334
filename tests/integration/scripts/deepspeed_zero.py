"""A DeepSpeed ZeRO training script as Gaudi users write one: ``device="hpu"``, DeepSpeed's HPU
accelerator, its HPU ``FusedAdam`` (``torch.ops.hpu.optimizer_adamw``), gradient accumulation.

``deepspeed --num_gpus 2 deepspeed_zero.py OUT_DIR STAGE BACKEND``: ZeRO stage ``STAGE`` (0-3)
over ``BACKEND`` ("hccl", or "gloo" for the reference run); every rank writes its final
parameters (gathered under ZeRO-3) and losses to ``OUT_DIR/rank{R}.pt``.
"""

import argparse
from pathlib import Path

import habana_frameworks.torch.core as htcore  # noqa: F401 - a Gaudi script's first import
import torch

import deepspeed
from deepspeed.accelerator import get_accelerator
from hpu_runtime import get_device

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)  # DeepSpeed's launcher passes it
parser.add_argument("out", type=Path)
parser.add_argument("stage", type=int)
parser.add_argument("backend")
args = parser.parse_args()
out, stage, backend = args.out, args.stage, args.backend
deepspeed.init_distributed(dist_backend=backend)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "zero_optimization": {"stage": stage}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
g = torch.Generator().manual_seed(engine.global_rank)
device = get_device()
device.log = []  # the simulated device's event log: which kernels ran
losses = []
for _ in range(8):  # 4 optimizer steps of 2 micro-steps
    x = torch.randn(8, 32, generator=g).to(engine.device)
    y = torch.randint(0, 4, (8,), generator=g).to(engine.device)
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
    params = [p.detach().cpu().clone() for p in engine.module.parameters()]
out.mkdir(parents=True, exist_ok=True)
torch.save({"params": params, "losses": losses, "accelerator": get_accelerator().device_name(),
            "device": str(engine.device), "backend": torch.distributed.get_backend(),
            "optimizer": type(engine.optimizer).__name__, "basic_optimizer": type(engine.basic_optimizer).__name__,
            "fused_adamw_kernels": sum(1 for e in device.log if e[0] == "op" and e[1].key[0] == "hpu.optimizer_adamw"),
            "simulated_ns": device.host_ns},
           out / f"rank{engine.global_rank}.pt")
