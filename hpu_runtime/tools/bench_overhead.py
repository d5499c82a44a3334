"""Emulator overhead: wall-clock time per training step with the bridge on vs plain PyTorch.

Runs the digits MLP (hidden 128) and a larger MLP (hidden 2048) with the train job's step
(cross-entropy, Adam, ``mark_step`` after backward and after the optimizer step), single
process, one intra-op thread, batch 32 on 8 x 8 digits-shaped inputs. The two variants
alternate in rounds, plain first and last, and the median per-step time of each is reported;
the ratio is the median over the bridge's rounds of each one's time over the mean of the two
plain rounds either side of it (:func:`paired_ratio`), so a machine whose speed drifts within
the run (a shared VM) moves both sides of each ratio alike. Times here are *wall-clock* on this
machine, not simulated::

    python -m hpu_runtime.tools.bench_overhead [--steps 30] [--rounds 3] [--hidden 128 2048] [--breakdown]
    PT_HPU_LAZY_MODE=0 python -m hpu_runtime.tools.bench_overhead --compile [--hidden 128]

The bridge runs in the mode the environment says (``PT_HPU_LAZY_MODE``: lazy by default, 0 for
eager). ``--compile`` puts the model under ``torch.compile``: ``backend="hpu_backend"`` on the
bridge (with ``PT_HPU_LAZY_MODE=0``, as Gaudi runs it), and for plain PyTorch
``backend="aot_eager"`` on the CPU (the same AOTAutograd forward and backward graphs, run op by
op, with no code generation), so the ratio is the bridge's own cost over that structure.

``--breakdown`` says where the time goes: the step on ``hpu`` tensors with the bridge off
(the C++ device type alone: what a bridge with its accounting in C++ would start from), the
plain step under a dispatch mode that does nothing (torch's own cost of a Python mode, which
the bridge paid per aten op until the hpu kernel called it: NOTE [the bridge in the kernel]),
the bridge's step with its per-op accounting off (the device's ``uncharged()``: the kernel then
hands every op to the Python after hook, which records nothing), the bridge's step with its
HBM check and op records in the Python hooks (the kernel given no device: the bridge as it was
before they moved into the kernel), the bridge's step, and the part of it spent in
``mark_step`` (the launches); the rest is the bridge's per-op work (NOTE [the bridge's hot
path] in :mod:`hpu_runtime.bridge.dispatch`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ..cli_args import count

__all__ = ["breakdown", "measure", "main", "paired_ratio"]

_WARMUP_STEPS = 3
"""Untimed steps before each timed run (:func:`_time_steps`)."""


def _step_fn(hidden: int, *, bridge: bool, batch: int, device: str | None = None, compiled: bool = False):
    """The train job's step on ``device`` (default: ``hpu`` with the bridge, else ``cpu``);
    ``bridge``: it calls ``mark_step``; ``compiled``: the model under ``torch.compile``
    (``hpu_backend`` on hpu, ``aot_eager`` on the CPU). The returned function's ``model`` is the
    MLP it trains."""
    import torch
    import torch.nn.functional as F

    import hpu_runtime as hpu
    from models.registry import build_model

    torch.manual_seed(0)
    device = device or ("hpu" if bridge else "cpu")
    model = build_model("mlp", hidden=hidden).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if compiled:
        model = torch.compile(model, backend="hpu_backend" if device == "hpu" else "aot_eager")
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

    step.model = model
    return step


def _time_steps(step, steps: int) -> float:
    """Wall seconds per step of ``steps`` steps, after 3 untimed ones."""
    for _ in range(_WARMUP_STEPS):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def _time(step, steps: int, *, bridge: bool) -> float:
    import hpu_runtime as hpu

    if bridge:
        hpu.activate()
    else:
        hpu.deactivate()
    try:
        return _time_steps(step, steps)
    finally:
        hpu.activate()


def _steps(hidden: int, batch: int, compiled: bool = False):
    """A fresh device, and the plain and the bridged step of the MLP of width ``hidden``."""
    import hpu_runtime as hpu

    hpu.reset_device("gaudi2")
    hpu.deactivate()
    plain_step = _step_fn(hidden, bridge=False, batch=batch, compiled=compiled)
    hpu.activate()
    bridge_step = _step_fn(hidden, bridge=True, batch=batch, compiled=compiled)
    return plain_step, bridge_step


def paired_ratio(plain: list[float], bridged: list[float]) -> float:
    """The bridge's time over plain PyTorch's, round by round: the median over ``i`` of
    ``bridged[i] / ((plain[i] + plain[i + 1]) / 2)``, for rounds run plain, bridge, plain, ...,
    bridge, plain (any unit, the same for both).

    Raises:
        ValueError: ``plain`` not one round longer than a non-empty ``bridged``, or a time <= 0.
    """
    if not bridged or len(plain) != len(bridged) + 1:
        raise ValueError(f"paired_ratio: needs one more plain round than bridge rounds (at least one), got"
                         f" {len(plain)} and {len(bridged)}")
    if min(plain + bridged) <= 0:
        raise ValueError("paired_ratio: every round's time must be > 0")
    return statistics.median(b / ((plain[i] + plain[i + 1]) / 2) for i, b in enumerate(bridged))


def measure(hidden: int, *, steps: int = 30, rounds: int = 3, batch: int = 32,
            compiled: bool = False) -> dict[str, float]:
    """Median wall seconds per step for plain PyTorch and with the bridge over ``rounds``
    rounds each (plain runs once more: first and last), and the bridge's :func:`paired_ratio`
    (``compiled``: both under ``torch.compile``, module doc)."""
    plain_step, bridge_step = _steps(hidden, batch, compiled)
    plain, bridged = [_time(plain_step, steps, bridge=False)], []
    for _ in range(rounds):
        bridged.append(_time(bridge_step, steps, bridge=True))
        plain.append(_time(plain_step, steps, bridge=False))
    p, b = statistics.median(plain), statistics.median(bridged)
    return {"hidden": hidden, "plain_s": p, "bridge_s": b, "ratio": paired_ratio(plain, bridged)}


def _noop_dispatch_mode():
    """A dispatch mode that only passes every aten call on: torch's own cost of a Python mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoopDispatchMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # as the bridge's: no per-call dynamo wrapper

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return NoopDispatchMode


def breakdown(hidden: int, *, steps: int = 30, rounds: int = 3, batch: int = 32) -> dict[str, float]:
    """Median wall seconds per step: plain; the same step on ``hpu`` tensors with the bridge off
    (the C++ device type alone, backward on the calling thread as the bridge runs it: the floor
    of a bridge whose per-op accounting were in that C++ kernel); under a no-op dispatch mode
    (the floor of any bridge built on a Python mode); with the bridge but its per-op accounting
    off (the device's own ``uncharged()`` switch: the kernel's hooks, every op handed to the
    Python after hook, which records nothing); with the bridge's HBM check and op records in its
    Python hooks (:func:`~hpu_runtime.bridge.runtime.python_hooks_only`); with the bridge; and
    the bridge's
    ``mark_step`` calls alone (the launches: graph key, recipe cache, a compile's schedule on a
    miss)."""
    import torch

    import hpu_runtime as hpu
    from hpu_runtime.bridge.runtime import get_device, python_hooks_only

    plain_step, bridge_step = _steps(hidden, batch)
    hpu.deactivate()
    try:
        device_step = _step_fn(hidden, bridge=False, batch=batch, device="hpu")
    finally:
        hpu.activate()
    mode = _noop_dispatch_mode()
    times: dict[str, list[float]] = {"plain": [], "hpu tensors, no bridge": [], "no-op dispatch mode": [],
                                     "bridge, no accounting": [], "bridge, records in Python": [], "bridge": [],
                                     "bridge: mark_step": []}
    launch = hpu.mark_step
    spent = [0.0]

    def timed_mark_step(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return launch(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    for _ in range(rounds):
        hpu.deactivate()
        try:
            times["plain"].append(_time_steps(plain_step, steps))
            threads = torch._C._is_multithreading_enabled()
            torch.autograd.set_multithreading_enabled(False)  # as the bridge runs backward
            try:
                times["hpu tensors, no bridge"].append(_time_steps(device_step, steps))
            finally:
                torch.autograd.set_multithreading_enabled(threads)
            with mode():
                times["no-op dispatch mode"].append(_time_steps(plain_step, steps))
        finally:
            hpu.activate()
        with get_device().uncharged():  # no HBM check, no op record: the hooks and their calls remain
            times["bridge, no accounting"].append(_time(bridge_step, steps, bridge=True))
        with python_hooks_only():
            times["bridge, records in Python"].append(_time(bridge_step, steps, bridge=True))
        hpu.mark_step = timed_mark_step
        try:
            spent[0] = 0.0
            times["bridge"].append(_time(bridge_step, steps, bridge=True))
            times["bridge: mark_step"].append(spent[0] / (steps + _WARMUP_STEPS))  # the untimed ones launch too
        finally:
            hpu.mark_step = launch
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=count(1, 10**6), default=30, help="timed steps per round")
    parser.add_argument("--rounds", type=count(1, 1000), default=3, help="alternating rounds (median reported)")
    parser.add_argument("--batch", type=count(1, 1 << 20), default=32)
    parser.add_argument("--hidden", type=count(1, 1 << 16), nargs="+", default=[128, 2048])
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the step on hpu tensors with the bridge off (the C++ device type alone), the plain"
                        " step under a no-op dispatch mode (the floor of any Python-mode bridge), the bridge without"
                        " its accounting and without its HBM check, and the bridge's mark_step calls")
    parser.add_argument("--compile", action="store_true",
                        help="the model under torch.compile: hpu_backend on the bridge (run with PT_HPU_LAZY_MODE=0),"
                        " aot_eager for plain PyTorch")
    args = parser.parse_args(argv)
    if args.compile and args.breakdown:
        parser.error("--breakdown times the step without torch.compile; leave out --compile")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    if root not in sys.path:
        sys.path.insert(0, root)
    how = "torch.compile: hpu_backend vs aot_eager, " if args.compile else ""
    print(f"{'model':<22}{'plain ms/step':>15}{'bridge ms/step':>16}{'ratio':>8}   ({how}wall-clock, 1 thread)")
    for hidden in args.hidden:
        r = measure(hidden, steps=args.steps, rounds=args.rounds, batch=args.batch, compiled=args.compile)
        name = "digits MLP" if hidden == 128 else f"MLP hidden {hidden}"
        print(f"{name:<22}{r['plain_s'] * 1e3:>15.3f}{r['bridge_s'] * 1e3:>16.3f}{r['ratio']:>7.2f}x")
    if args.breakdown:
        for hidden in args.hidden:
            b = breakdown(hidden, steps=args.steps, rounds=args.rounds, batch=args.batch)
            print(f"\nwhere the time goes, MLP hidden {hidden} (wall-clock ms per step, x plain):")
            for name, sec in b.items():
                print(f"  {name:<26}{sec * 1e3:>9.3f}{sec / b['plain']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
