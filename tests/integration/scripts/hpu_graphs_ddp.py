"""A Gaudi DDP script with HPU graphs, as the seed "HPU Graphs for Training" recommends.

The model is wrapped with ``ModuleCacher`` before DDP (through the tracer's own
:func:`hpu_runtime.tools.tracing.prepare_model`), so its forward and backward replay as HPU
graphs while the loss, DDP's hooks and the optimizer stay in lazy mode; each step is the
tracer's :func:`~hpu_runtime.tools.tracing.training_step`. Rank 0 writes every step's
simulated breakdown (``StepTimes``, ns) and its parameters' checksum as JSON.

Run: ``torchrun --standalone --nproc-per-node 2 tests/integration/scripts/hpu_graphs_ddp.py
--model resnet50:debug --batch 4 --bucket-cap-mb 0.05 --out steps.json``
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hpu_runtime as hpu
from hpu_runtime.tools.tracing import prepare_model, training_step
from models.zoo import resolve_factory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--bucket-cap-mb", type=float, required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    device = hpu.reset_device("gaudi2")
    dist.init_process_group("hccl")
    torch.manual_seed(0)
    model, inputs, loss_fn = resolve_factory(args.model)(args.batch)
    model = prepare_model(model.to("hpu"), "hpu_graphs")
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb, broadcast_buffers=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)  # the tracer's "sgd"
    device.begin_step()
    steps = []
    for _ in range(args.steps):
        with hpu.bridge_disabled():  # a new host batch every step, as a data loader gives
            batch = [t.clone() for t in inputs]
        training_step(ddp, batch, loss_fn, opt, autocast=args.autocast)
        steps.append(dataclasses.asdict(device.end_step()))
    with hpu.bridge_disabled():
        checksum = float(sum(q.detach().double().sum() for q in model.parameters()))
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"steps": steps, "replays": device.replays, "checksum": checksum}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
