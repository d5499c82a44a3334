"""A plain ``accelerate`` training loop (no Gaudi names), as ``accelerate launch`` runs it on a
Gaudi server: ``python -m accelerate.commands.launch --num_processes 2 accelerate_ddp.py OUT_DIR``
(or under ``under_gloo.py``). Each rank writes what accelerate chose and its final parameters
to ``OUT_DIR/rank{R}.pt``."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator

out = Path(sys.argv[1])
acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g))
model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=8))
losses = []
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
out.mkdir(parents=True, exist_ok=True)
torch.save({"distributed_type": str(acc.distributed_type), "backend": torch.distributed.get_backend(),
            "num_processes": acc.num_processes, "device": str(acc.device), "losses": losses,
            "params": [p.detach().cpu() for p in acc.unwrap_model(model).parameters()]},
           out / f"rank{acc.process_index}.pt")
