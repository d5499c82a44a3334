"""lightning-habana's HPUProfiler on a tiny SingleHPUStrategy job; traces go to ``sys.argv[1]``."""

import sys

import lightning_habana  # noqa: F401 - before Lightning, as HPUProfiler requires
import pytorch_lightning as pl
import torch
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.profiler import HPUProfiler
from lightning_habana.pytorch.strategies import SingleHPUStrategy


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    trainer = pl.Trainer(accelerator=HPUAccelerator(), strategy=SingleHPUStrategy(), max_steps=6,
                         profiler=HPUProfiler(dirpath=sys.argv[1], filename="prof"), logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
