"""Emulator overhead: wall-clock time per training step with the bridge on vs plain PyTorch.

Runs the digits MLP (hidden 128) and a larger MLP (hidden 2048) with the train job's step
(cross-entropy, Adam, ``mark_step`` after backward and after the optimizer step), single
process, one intra-op thread, batch 32 on 8 x 8 digits-shaped inputs. The two variants
alternate in rounds and the median per-step time of each is reported, so load from other
processes affects both alike. Times here are *wall-clock* on this machine, not simulated::

    python -m hpu_runtime.tools.bench_overhead [--steps 30] [--rounds 3] [--hidden 128 2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ..cli_args import count

__all__ = ["measure", "main"]


def _step_fn(hidden: int, *, bridge: bool, batch: int):
    import torch
    import torch.nn.functional as F

    import hpu_runtime as hpu
    from models.registry import build_model

    torch.manual_seed(0)
    device = "hpu" if bridge else "cpu"
    model = build_model("mlp", hidden=hidden).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with hpu.bridge_disabled():
        g = torch.Generator().manual_seed(0)
        data = [(torch.rand(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(8)]
    state = {"i": 0}

    def step() -> None:
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if bridge:
            hpu.mark_step()
        opt.step()
        if bridge:
            hpu.mark_step()

    return step


def _time(step, steps: int, *, bridge: bool) -> float:
    import hpu_runtime as hpu

    if bridge:
        hpu.activate()
    else:
        hpu.deactivate()
    try:
        for _ in range(3):
            step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps
    finally:
        hpu.activate()


def measure(hidden: int, *, steps: int = 30, rounds: int = 3, batch: int = 32) -> dict[str, float]:
    """Median wall seconds per step for plain PyTorch and with the bridge; and their ratio."""
    import hpu_runtime as hpu

    hpu.reset_device("gaudi2")
    hpu.deactivate()
    plain_step = _step_fn(hidden, bridge=False, batch=batch)
    hpu.activate()
    bridge_step = _step_fn(hidden, bridge=True, batch=batch)
    plain, bridged = [], []
    for _ in range(rounds):
        plain.append(_time(plain_step, steps, bridge=False))
        bridged.append(_time(bridge_step, steps, bridge=True))
    p, b = statistics.median(plain), statistics.median(bridged)
    return {"hidden": hidden, "plain_s": p, "bridge_s": b, "ratio": b / p}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=count(1, 10**6), default=30, help="timed steps per round")
    parser.add_argument("--rounds", type=count(1, 1000), default=3, help="alternating rounds (median reported)")
    parser.add_argument("--batch", type=count(1, 1 << 20), default=32)
    parser.add_argument("--hidden", type=count(1, 1 << 16), nargs="+", default=[128, 2048])
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    if root not in sys.path:
        sys.path.insert(0, root)
    print(f"{'model':<22}{'plain ms/step':>15}{'bridge ms/step':>16}{'ratio':>8}   (wall-clock, 1 thread)")
    for hidden in args.hidden:
        r = measure(hidden, steps=args.steps, rounds=args.rounds, batch=args.batch)
        name = "digits MLP" if hidden == 128 else f"MLP hidden {hidden}"
        print(f"{name:<22}{r['plain_s'] * 1e3:>15.3f}{r['bridge_s'] * 1e3:>16.3f}{r['ratio']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
