"""A Gaudi MNIST training script in the manner of Habana's PyTorch hello-world example.

Written for this test suite (not copied): it uses the Gaudi names such scripts use, unchanged
(``habana_frameworks.torch.core``, ``library_loader``, ``distributed.hccl``,
``initialize_distributed_hpu``, ``--hpu --use_lazy_mode``, ``mark_step`` after backward and
after the optimizer step, DDP over "hccl"), and torchvision's ``datasets.MNIST`` with
``download=True``. The data is the MNIST-format digits set written by
``python -m models.data mnist DIR`` (torchvision finds the files and downloads nothing).

    torchrun --nproc-per-node 2 gaudi_mnist.py --hpu --use_lazy_mode --distributed --data-path DIR
    mpirun -n 2 python gaudi_mnist.py --hpu --use_lazy_mode --distributed --data-path DIR

Without ``--hpu`` the same script runs on the CPU over gloo (the test's reference).
``--summary PATH`` (ours) writes each rank's final figures to ``PATH.<rank>.json``.
"""

import argparse
import gc
import json
import os

import torch
import torchvision  # noqa: F401 - Gaudi scripts import it right after torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms

import habana_frameworks.torch.core as htcore


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, loader, optimizer, epoch, lazy):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        if lazy:
            htcore.mark_step()
        optimizer.step()
        if lazy:
            htcore.mark_step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.sampler)}]\tLoss: {loss.item():.6f}")


def test(model, device, loader, lazy, distributed):
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64)  # summed loss, correct
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss = F.nll_loss(output, target, reduction="sum")
            correct = output.argmax(dim=1).eq(target).sum()
            if lazy:
                htcore.mark_step()
            totals += torch.tensor([loss.item(), correct.item()], dtype=torch.float64)
    n = len(loader.sampler)
    if distributed:
        counts = torch.tensor([totals[0].item(), totals[1].item(), float(n)]).to(device)
        dist.all_reduce(counts)
        totals, n = counts[:2].cpu().double(), int(counts[2].item())
    print(f"Test set: Average loss: {totals[0].item() / n:.4f}, Accuracy: {int(totals[1].item())}/{n}")
    return totals[1].item() / n


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--hpu", action="store_true", default=False, help="use the hpu device")
    parser.add_argument("--use_lazy_mode", action="store_true", default=False, help="lazy mode on hpu")
    parser.add_argument("--data-path", type=str, default="../data")
    parser.add_argument("--distributed", action="store_true", default=False)
    parser.add_argument("--summary", type=str, default=None)
    args = parser.parse_args()

    os.environ["PT_HPU_LAZY_MODE"] = "1" if args.use_lazy_mode else "2"
    lazy = args.hpu and args.use_lazy_mode
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    if args.hpu:
        from habana_frameworks.torch.utils.library_loader import load_habana_module

        load_habana_module()
        device = torch.device("hpu")

    world_size, rank = 1, 0
    if args.distributed:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401 - maps the MPI environment
        from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

        world_size, rank, local_rank = initialize_distributed_hpu()
        dist.init_process_group("hccl" if args.hpu else "gloo", rank=rank, world_size=world_size)

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(args.data_path, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(args.data_path, train=False, transform=transform)
    train_sampler = test_sampler = None
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True, seed=args.seed)
        test_sampler = torch.utils.data.distributed.DistributedSampler(test_set, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                                               shuffle=train_sampler is None)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net().to(device)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=100, broadcast_buffers=False,
                                                          gradient_as_bucket_view=True)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        train(args, model, device, train_loader, optimizer, epoch, lazy)
        accuracy = test(model, device, test_loader, lazy, args.distributed)
        scheduler.step()

    if args.summary:
        params = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        out = {"rank": rank, "world_size": world_size, "accuracy": accuracy,
               "backend": dist.get_backend() if args.distributed else None,
               "params": params.tolist()[:64], "param_sum": float(params.double().sum()),
               "param_abs_sum": float(params.double().abs().sum())}
        if args.hpu:
            import habana_frameworks.torch.hpu as hthpu

            out["hbm_max_in_use"] = hthpu.memory.memory_stats()["MaxInUse"]
        with open(f"{args.summary}.{rank}.json", "w") as f:
            json.dump(out, f)
    if args.distributed:
        # DDP's reducer first, then the group (as models/train.py does, NOTE [the group outlives
        # DDP] there): gloo's group destroyed by the reducer with the GIL held can deadlock at exit
        del model
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
