"""A DDP training script written for NVIDIA GPUs, with nothing of Gaudi in it: ``cuda`` devices,
``.cuda()``, ``torch.cuda.*``, ``backend="nccl"``, bf16 autocast on "cuda", a GradScaler and a
pinned-memory DataLoader. Without CUDA it trains on the CPU over gloo (the reference); with
``PT_HPU_GPU_MIGRATION=1`` the GPU Migration Toolkit runs it on the simulated Gaudi over hccl.

Usage: torchrun --nproc-per-node 2 cuda_ddp.py OUT_PREFIX [--compile] (writes OUT_PREFIX.<rank>.json)
"""

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    model = model.cuda() if use_cuda else model
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None)
    net = torch.compile(ddp) if args.compile else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)

    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data[:512] / 16.0, dtype=torch.float32),
                         torch.tensor(digits.target[:512]))
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=32, sampler=sampler, pin_memory=use_cuda)
    losses = []
    for x, y in loader:
        x, y = (x.cuda(non_blocking=True), y.to(device, non_blocking=True)) if use_cuda else (x, y)
        with torch.autocast(device_type="cuda" if use_cuda else "cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x).float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    correct = torch.zeros(1, device=device)
    with torch.no_grad():
        for x, y in loader:
            correct += (net(x.to(device)).argmax(1) == y.to(device)).sum()
    dist.all_reduce(correct)
    if use_cuda:
        torch.cuda.synchronize()
    summary = {"backend": dist.get_backend(), "cuda": use_cuda,
               "group_backend": dist.distributed_c10d._get_default_group()._get_backend_name(),
               "param_device": str(next(model.parameters()).device),
               "losses": losses, "accuracy": correct.item() / len(data),
               "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
               "max_memory_allocated": torch.cuda.max_memory_allocated() if use_cuda else 0,
               "device_name": torch.cuda.get_device_name() if use_cuda else "cpu"}
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(summary, f)
    # DDP's reducer first, then the group (NOTE [the group outlives DDP] in models/train.py): the
    # gloo reference's group destroyed by the reducer with the GIL held can deadlock at exit
    del net, ddp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
