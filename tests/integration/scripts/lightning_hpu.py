"""A small PyTorch Lightning job on lightning-habana's HPU accelerator and strategies.

``python lightning_hpu.py N OUT``: ``N`` = 1 uses ``SingleHPUStrategy``; ``N`` > 1 uses
``HPUParallelStrategy`` (DDP over "hccl" with the bucket options Habana's
general-model-optimizations guide names), with Lightning launching the other ranks itself.
Each rank writes ``OUT.<rank>.json``: backend, strategy, accelerator, parameters.
"""

import json
import sys

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.strategies import HPUParallelStrategy, SingleHPUStrategy
from sklearn.datasets import load_digits


class LitDigits(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    model = LitDigits()  # before the Trainer, which may draw from the generator
    digits = load_digits()
    data = torch.utils.data.TensorDataset(torch.tensor(digits.data[:768] / 16.0, dtype=torch.float32),
                                          torch.tensor(digits.target[:768]))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    strategy = (HPUParallelStrategy(bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)
                if n > 1 else SingleHPUStrategy())
    trainer = pl.Trainer(accelerator=HPUAccelerator(), devices=n, strategy=strategy, max_epochs=2,
                         enable_progress_bar=False, logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(f"{out}.{trainer.global_rank}.json", "w") as f:
        json.dump({"rank": trainer.global_rank, "world_size": trainer.world_size,
                   "backend": dist.get_backend() if dist.is_initialized() else None,
                   "strategy": type(trainer.strategy).__name__, "accelerator": type(trainer.accelerator).__name__,
                   "first_loss": model.losses[0], "last_loss": model.losses[-1], "steps": len(model.losses),
                   "params": params.tolist()}, f)


if __name__ == "__main__":
    main()
