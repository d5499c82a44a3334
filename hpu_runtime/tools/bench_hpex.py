"""Simulated gain of Gaudi's fused optimizers over torch's, on real models at real size.

``python -m hpu_runtime.tools.bench_hpex [--flavour debug]``: traces one steady-state lazy-mode
training step per (model, optimizer) with :func:`hpu_runtime.tools.tracing.trace_step` (no data,
one simulated Gaudi2, bf16 autocast) and prints, side by side, the simulated host time per
step, the ops recorded, the optimizer's device time and the step time. ResNet-50 (batch
256) compares ``torch.optim.SGD`` with ``FusedSGD``; BERT-Large (64 x 128) compares
``torch.optim.AdamW`` with ``FusedAdamW`` and ``FusedLamb``. The gain comes from the
mechanism, not a constant: a torch optimizer records each per-parameter op through the
bridge (host time per op, ``DeviceSpec.host_op_ns``); a fused one records one kernel.
"""

from __future__ import annotations

import argparse

__all__ = ["main"]

CASES = (("resnet50", 256, None, ("sgd", "fused-sgd")),
         ("bert-large", 64, 128, ("adamw", "fused-adamw", "fused-lamb")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.bench_hpex", description=__doc__.split("\n\n")[0])
    p.add_argument("--flavour", default=None, help="model flavour, e.g. debug (default: full size)")
    args = p.parse_args(argv)
    from tabulate import tabulate

    from models.zoo import step_factory

    from ..device.spec import get_device_spec
    from .replay import summarize
    from .tracing import trace_step

    spec = get_device_spec("gaudi2")
    rows = []
    for model, batch, seq, optimizers in CASES:
        base = None
        for opt in optimizers:
            tr = trace_step(lambda b, m=model, s=seq: step_factory(m, args.flavour, batch_size=b, seq_len=s),
                            batch, spec=spec, optimizer=opt, autocast=True)
            s = summarize(tr)
            base = base or s.times.step_ns
            rows.append([model, opt, s.times.host_ns / 1e6, sum(g[1] for g in s.graphs), s.optimizer_ns / 1e6, s.times.step_ns / 1e6,
                         base / s.times.step_ns])
    print(tabulate(rows, headers=["model", "optimizer", "host ms", "ops", "optimizer ms (device)", "step ms",
                                  "speed-up"], floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
