"""Intel's "Profiling with PyTorch" recipe on a small DDP job: CPU + HPU activity, a schedule,
and tensorboard_trace_handler writing one Kineto trace per rank into ``sys.argv[1]``."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import habana_frameworks.torch.core as htcore

dist.init_process_group("hccl")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).to("hpu"),
            bucket_cap_mb=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{dist.get_rank()}")) as prof:
    for step in range(4):
        x = torch.randn(32, 256).to("hpu")
        loss = model(x).square().mean()
        loss.backward()
        htcore.mark_step()
        opt.step()
        opt.zero_grad()
        htcore.mark_step()
        prof.step()
dist.destroy_process_group()
