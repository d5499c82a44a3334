"""Simulated vs published Gaudi training figures, side by side: ``python -m models.bench_fidelity``.

Published figures live in ``models/published_figures.toml`` (each with its primary source:
MLCommons training results logs, Intel / Habana performance pages). The simulated side is
the planned DDP step (:func:`hccl.sim.ddp_plan.plan_ddp_step`) of a step traced without data
(:func:`hpu_runtime.tools.tracing.trace_step`), bf16 autocast and the bucket settings of Habana's
scripts (``bucket_cap_mb=256``, ``gradient_as_bucket_view``), on the card counts published.
Per-card throughput = batch per card / simulated step time.

Three tables: per-card throughput; scaling efficiency between card counts; the host time per
step of the seed "HPU Graphs for Training" MNIST ``Net`` (batch 200, Adadelta, first-gen
Gaudi) without HPU graphs, with ``make_graphed_callables`` and with capture/replay.

Simulated times are deterministic; the wall-clock the benchmark takes is printed last.
"""

from __future__ import annotations

import argparse
import time
import tomllib
from pathlib import Path

from tabulate import tabulate

__all__ = ["main", "load_figures"]

DATA = Path(__file__).with_name("published_figures.toml")

# (model, device, cards, batch per card, seq_len, software substring): the rows compared
CHECKS = [
    ("resnet50", "gaudi2", 8, 256, None, "PyTorch 2.0.1"),
    ("bert-large", "gaudi2", 8, 56, 512, "PyTorch 1.13.1"),
    ("bert-large", "gaudi2", 64, 48, 512, "PyTorch 1.13.1"),
    ("resnet50", "gaudi", 8, 256, None, "TensorFlow 2.5.1"),
    ("resnet50", "gaudi", 64, 128, None, "TensorFlow 2.5.1"),
    ("bert-large", "gaudi", 8, 56, 512, "TensorFlow 2.5.1"),
    ("bert-large", "gaudi", 64, 48, 512, "TensorFlow 2.5.1"),
    ("bert-large", "gaudi", 8, 64, 128, "PyTorch lazy"),
    ("bert-large", "gaudi", 32, 64, 128, "PyTorch lazy"),
    ("bert-large", "gaudi", 8, 16, 512, "PyTorch lazy"),
    ("bert-large", "gaudi", 32, 16, 512, "PyTorch lazy"),
]

SEED_HOST_MS = {"lazy": 4.8, "make_graphed_callables": 3.9, "capture/replay": 1.3}
"""Seed hpu-graphs-for-training: host time per step of its MNIST Net on first-gen Gaudi, ms."""


def load_figures(path: Path = DATA) -> list[dict]:
    """The published figures (one dict per ``[[figure]]`` table)."""
    with open(path, "rb") as f:
        return tomllib.load(f)["figure"]


def _published(figures, model, device, cards, batch, software) -> dict | None:
    for f in figures:
        if (f["model"], f["device"], f["cards"], f.get("batch_size_per_card")) == (model, device, cards, batch) \
                and software in f["software"]:
            return f
    return None


def _simulated_per_card(trace_cache: dict, model: str, device: str, cards: int, batch: int, seq_len) -> float:
    from hccl.sim.ddp_plan import plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    key = (model, device, batch, seq_len)
    if key not in trace_cache:
        kwargs = {"seq_len": seq_len} if seq_len else {}
        trace_cache[key] = trace_step(resolve_factory(model, **kwargs), batch, spec=get_device_spec(device),
                                      autocast=True)
    topology = {"gaudi": "hls1", "gaudi2": "hls2", "gaudi3": "hls3"}[device]
    plan = plan_ddp_step(trace_cache[key], world_size=cards, topology=topology, bucket_cap_mb=256,
                         gradient_as_bucket_view=True)
    return batch / (plan.times.step_ns * 1e-9)


def seed_host_ms(device: str = "gaudi", batch: int = 200, steps: int = 4) -> dict[str, float]:
    """Simulated host time per step (ms) of the seed's MNIST Net in its three variants."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hpu_runtime as hpu

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.dropout = nn.Linear(784, 128), nn.Linear(128, 10), nn.Dropout(0.5)

        def forward(self, x):
            x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    g = torch.Generator().manual_seed(0)
    with hpu.bridge_disabled():
        data = [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(steps + 3)]
    out = {}
    for variant in SEED_HOST_MS:
        dev = hpu.reset_device(device)
        torch.manual_seed(0)
        model = Net().to("hpu")
        opt = torch.optim.Adadelta(model.parameters(), lr=0.1)
        if variant == "capture/replay":
            si = torch.randn(batch, 1, 28, 28, device="hpu")
            st = torch.randint(0, 10, (batch,), device="hpu")
            opt.zero_grad(set_to_none=True)
            graph = hpu.HPUGraph()
            with hpu.graph(graph):
                F.nll_loss(model(si), st).backward()
                opt.step()

            def step(x, y):
                si.copy_(x.to("hpu"))
                st.copy_(y.to("hpu"))
                graph.replay()
        else:
            fwd = model if variant == "lazy" else hpu.make_graphed_callables(
                model, (torch.randn(batch, 1, 28, 28, device="hpu"),))

            def step(x, y):
                x, y = x.to("hpu"), y.to("hpu")
                opt.zero_grad(set_to_none=True)
                F.nll_loss(fwd(x), y).backward()
                hpu.mark_step()
                opt.step()
                hpu.mark_step()
        for x, y in data[:3]:
            step(x, y)
        dev.begin_step()
        hosts = []
        for x, y in data[3:]:
            step(x, y)
            hosts.append(dev.end_step().host_ns)
        if len(set(hosts[-2:])) != 1:
            raise RuntimeError(f"{variant}: no steady state in {steps} steps: host ns {hosts}")
        out[variant] = hosts[-1] / 1e6
    hpu.reset_device()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.bench_fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-host", action="store_true", help="leave out the seed host-time table")
    p.add_argument("--skip-scaling", action="store_true",
                   help="leave out the scaling table of published series (models.bench_scaling)")
    args = p.parse_args(argv)
    from hpu_runtime.device.memory import HPUOutOfMemoryError

    wall0 = time.perf_counter()
    figures = load_figures()
    traces: dict = {}
    rows, per_card = [], {}
    for model, device, cards, batch, seq_len, software in CHECKS:
        fig = _published(figures, model, device, cards, batch, software)
        if fig is None:
            continue
        pub = fig["throughput_samples_per_s"] / (1 if fig.get("per_card") else cards)
        try:
            sim = _simulated_per_card(traces, model, device, cards, batch, seq_len)
        except HPUOutOfMemoryError:  # the published run used gradient accumulation or packing
            rows.append([model, cards, device, batch, f"{pub:,.0f}", "HBM OOM", "-", fig["software"].split("/")[0].strip()])
            continue
        per_card[(model, device, cards, batch, seq_len)] = (pub, sim)
        rows.append([model, cards, device, batch, f"{pub:,.0f}", f"{sim:,.0f}", f"{sim / pub:.2f}",
                     fig["software"].split("/")[0].strip()])
    print("Per-card training throughput (samples/s per card; simulated: bf16, bucket_cap_mb=256,"
          " gradient_as_bucket_view)")
    print(tabulate(rows, headers=["model", "cards", "device", "batch", "published", "simulated", "ratio",
                                  "published with"], tablefmt="github"))
    eff = []
    for (model, device, cards, batch, seq_len), (pub, sim) in per_card.items():
        base = per_card.get((model, device, 8, batch if cards != 64 else None, seq_len))
        if cards == 64:  # the published 64-card runs use smaller batches than the 8-card ones
            base = next((v for k, v in per_card.items() if k[:3] == (model, device, 8) and k[4] == seq_len), None)
        if cards > 8 and base:
            eff.append([model, device, seq_len or "-", f"8 -> {cards}", f"{pub / base[0]:.3f}", f"{sim / base[1]:.3f}",
                        f"{(sim / base[1] - pub / base[0]) * 100:+.1f}"])
    print("\nScaling efficiency (per-card throughput at N cards / at 8 cards)")
    print(tabulate(sorted(eff, key=str), headers=["model", "device", "seq", "cards", "published", "simulated", "points"],
                   tablefmt="github"))
    if not args.skip_host:
        sim = seed_host_ms()
        print("\nHost time per step, seed MNIST Net (batch 200, Adadelta, first-gen Gaudi), ms")
        print(tabulate([[k, SEED_HOST_MS[k], f"{sim[k]:.2f}", f"{sim[k] / SEED_HOST_MS[k]:.2f}"] for k in SEED_HOST_MS],
                       headers=["variant", "published", "simulated", "ratio"], tablefmt="github"))
    if not args.skip_scaling:
        from .bench_scaling import print_table, scaling_rows

        print_table(scaling_rows())
    print(f"\n(wall-clock {time.perf_counter() - wall0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
