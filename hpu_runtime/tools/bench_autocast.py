"""Wall-clock of a bf16 autocast region computed faithfully vs in fp32 on the host.

``python -m hpu_runtime.tools.bench_autocast``: one BERT-Large encoder layer (transformers'
``BertLayer``: hidden 1024, 16 heads, intermediate 4096), batch 2 x 128 tokens, forward and
backward under ``torch.autocast("hpu", dtype=torch.bfloat16)``, side by side in one run:

* faithful: CPU autocast really computes in bf16 (real bf16 numerics, slow on CPUs without
  bf16 matmul units);
* ``PT_HPU_AUTOCAST_FP32_ON_HOST=1``: the region computes in fp32 on the host and is charged
  as bf16 on the simulated device (see NOTE [fp32 on the host, bf16 on the device] in
  :mod:`hpu_runtime.bridge.autocast`).

Prints the wall-clock per step (median of ``--repeats``, after one warm-up) and the simulated
device time of each, and the largest difference of the layer's output between the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..cli_args import count

__all__ = ["main"]


def _layer():
    from models._hf import import_transformers

    tf = import_transformers()
    cfg = tf.BertConfig(hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    return tf.models.bert.modeling_bert.BertLayer(cfg)


def _run(label: str, layer, x, repeats: int) -> tuple[float, int, torch.Tensor]:
    import hpu_runtime as hpu

    os.environ["PT_HPU_AUTOCAST_FP32_ON_HOST"] = "1" if label == "fp32-on-host" else "0"
    dev = hpu.reset_device("gaudi2")
    walls, sim, out = [], 0, None
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.autocast("hpu", dtype=torch.bfloat16):
            res = layer(x)
            out = res[0] if isinstance(res, tuple) else res
        out.float().sum().backward()
        hpu.mark_step()
        for p in layer.parameters():  # as a training step: gradients do not accumulate
            p.grad = None
        step = dev.end_step()
        if i:
            walls.append(time.perf_counter() - t0)
            sim = step.compute_ns
    return statistics.median(walls), sim, out.detach().float()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpu_runtime.tools.bench_autocast", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=count(1, 1000), default=3)
    args = p.parse_args(argv)
    import hpu_runtime as hpu

    torch.manual_seed(0)
    with hpu.bridge_disabled():
        layer = _layer()
        x = torch.randn(2, 128, 1024)
    layer.to("hpu")
    rows = {label: _run(label, layer, x, args.repeats) for label in ("faithful-bf16", "fp32-on-host")}
    (w_bf, s_bf, o_bf), (w_32, s_32, o_32) = rows["faithful-bf16"], rows["fp32-on-host"]
    print("BERT-Large encoder layer, batch 2 x 128, forward + backward under autocast('hpu', bf16)")
    print(f"  faithful bf16   : wall-clock {w_bf:.3f} s/step, simulated device {s_bf / 1e3:.1f} us")
    print(f"  fp32 on host    : wall-clock {w_32:.3f} s/step, simulated device {s_32 / 1e3:.1f} us")
    print(f"  wall-clock speed-up {w_bf / w_32:.1f}x; simulated device time ratio {s_32 / s_bf:.2f};"
          f" max |output difference| {(o_bf - o_32).abs().max().item():.3g}")
    os.environ.pop("PT_HPU_AUTOCAST_FP32_ON_HOST", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
