"""Simulated vs published scaling of Gaudi training: ``python -m models.bench_scaling``.

For every published series (same software release, same system; the figures and their sources
are in ``models/published_figures.toml``), the per-card throughput at N cards over that at the
series' smallest N, published beside simulated. The simulated side is the scaling study's
planner (:mod:`launchers.study.scale`: the topology's fabric, the calibrated variability
:data:`hccl.sim.variability.DEFAULT`, HCL's pairwise algorithm), bf16, the bucket settings of
Habana's scripts. ``models.bench_fidelity`` prints this table after its own.

NOTE [calibration and predictions]
    Constants set on published scaling points are named here with those points
    (:data:`CALIBRATION`); every other row is a prediction. The variability's step jitter is
    the one constant fitted to a scaling series (first-gen ResNet-50, HLS-1H, 16 -> 128 cards:
    the published step grows by 2.0 ms) together with first-gen BERT-L phase 1 8 -> 32 cards
    (``--fit`` prints the error per candidate); its slow-step tail comes from Sinha et al.
    (SC22) and a rate chosen a priori, and the fabric and algorithm come from their sources,
    not from these figures. Each point is one stretch of ``--steps`` steps (one sample of the
    draws: NOTE [one stretch is one sample] in :mod:`launchers.study.scale`); with
    ``--stretches 8`` every row moves by at most 0.5 points (the calibration rows -0.7, -0.6,
    +0.3 and +0.5; the predictions +1.7, +1.3, +5.9, +5.8, +0.8, -0.5 and +17.1; 499 s against
    109 s on 2 cores) and ``--fit`` picks the same jitter (rms 0.55 points at 10%, 0.61 at 8%
    and 12%), so the table keeps one stretch.

NOTE [the rows it misses]
    Two series miss the issue's 3-point target, and no constant is tuned to them:

    - HLS-1 ResNet-50 SGD (TF, SynapseAI 1.0), +5.8 points at 16 and 32 cards. At 32 cards
      its per-card throughput (46,400 / 32 = 1,450 img/s) is that of the ~1.17 torch.compile
      series (46,508 / 32 = 1,453), which is predicted within 0.8 points; the two differ at 8
      cards (12,580 / 8 = 1,572 against 11,959 / 8 = 1,495). The planner gives 1,428, 1,411 and
      1,400 per card at 8, 16 and 32 cards for both. What the 1.0 rows lose is a fast single
      box, not a slow multi-box step, and nothing published says why that box was faster.
    - DL1 BERT-1.5B (DeepSpeed ZeRO-1), +17.1 points at 128 cards. The planned optimizer step
      is 24 micro-steps of about 561 ms (13.5 s); the last one's ZeRO-1 communication takes
      238 ms at 128 cards, 14 ms of it exposed with every card nominal (50 ms with the
      variability). AWS's 82.7% is 2.8 s more per step (13.5 s / 0.827 - 13.5 s), twelve times
      all of that communication. Intel's "Scale-out via Host NIC" page names the paths HCCL takes
      on such hosts (host NICs through host memory, or Gaudi Direct where supported) but not
      their throughput, and AWS gives no breakdown of the loss.

NOTE [what the series run]
    The planner plans one DDP step per optimizer step without gradient accumulation: MLPerf
    BERT (2 micro-steps per step) and the DL1 BERT-1.5B run (24, DeepSpeed ZeRO-1) are planned
    as one step of the per-card batch (MLPerf) or as 23 compute-only micro-steps plus one DDP
    step (DL1, its ZeRO-1 reduce-scatter + all-gather moving the bytes of an all-reduce).
    TensorFlow runs (graph mode) are planned as PyTorch DDP in compile mode, which like them has
    no per-op host cost; the MLPerf PyTorch BERT run is planned as it ran, in lazy mode with HPU
    graphs (``hpu_graphs``, as :mod:`models.published_runs` plans its throughput rows). Lazy mode
    without graphs would make those steps host-bound and their per-card throughput
    proportional to the batch. The MLPerf PyTorch BERT figures are samples per block over the
    block's time, and a block ends with a checkpoint of the model to the host (NOTE [a block's
    checkpoint] in :mod:`models.published_runs`): its share per step is added to the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

from tabulate import tabulate

from hpu_runtime.cli_args import count

from .published_runs import MLPERF_BERT_CHECKPOINT_STEPS, checkpoint_ns, load_figures

__all__ = ["SERIES", "CALIBRATION", "TARGET_POINTS", "Series", "scaling_rows", "collective_rows", "print_table",
           "fit", "main"]


@dataclass(frozen=True, slots=True)
class Series:
    """One published scaling series: (cards, per-card batch) points of one system and release."""

    name: str
    model: str
    device: str
    topology: str
    software: str
    """Substring of the figures' ``software`` field that picks the series' rows."""
    points: tuple[tuple[int, int], ...]
    """(cards, micro-batch per card); the published per-card batch is micro-batch x accumulation."""
    seq_len: int | None = None
    mode: str = "lazy"
    model_kwargs: tuple = ()
    accumulation: int = 1
    """Micro-steps per optimizer step (DL1: 24)."""
    figure_model: str | None = None
    """The figures' ``model`` name when it differs from the planner's."""
    pick: str = ""
    """Substring of the figures' ``source`` that picks the series' rows (several runs of one release)."""
    checkpoint_every: tuple[int, ...] = ()
    """Per point, optimizer steps between the checkpoints the published block time includes
    (NOTE [a block's checkpoint] in :mod:`models.published_runs`); empty: none."""


SERIES = (
    Series("HLS-1H MLPerf v1.1 ResNet-50 (TF)", "resnet50", "gaudi", "hls1h", "TensorFlow 2.5.1",
           ((16, 128), (32, 128), (64, 128), (128, 128)), mode="compile"),
    Series("HLS-Gaudi2 MLPerf v3.0 BERT-Large (PT)", "bert-large", "gaudi2", "hls2", "PyTorch 1.13.1",
           ((8, 28), (64, 24)), seq_len=512, accumulation=2, mode="hpu_graphs",
           checkpoint_every=(MLPERF_BERT_CHECKPOINT_STEPS[8], MLPERF_BERT_CHECKPOINT_STEPS[64])),
    Series("HLS-1H MLPerf v1.1 BERT-Large (TF)", "bert-large", "gaudi", "hls1h", "TensorFlow 2.5.1",
           ((8, 28), (64, 24)), seq_len=512, accumulation=2, mode="compile"),
    Series("HLS-1 ResNet-50 SGD (TF, SynapseAI 1.0)", "resnet50", "gaudi", "hls1", "TensorFlow 2.5.0",
           ((8, 256), (16, 256), (32, 256)), pick="Keras SGD", mode="compile"),
    Series("HLS-1 ResNet-50 (PT torch.compile, ~1.17)", "resnet50", "gaudi", "hls1", "torch.compile",
           ((8, 256), (32, 256)), mode="compile"),
    Series("HLS-1 BERT-L phase 1 (PT lazy, ~1.17)", "bert-large", "gaudi", "hls1", "PyTorch lazy",
           ((8, 64), (32, 64)), seq_len=128),
    Series("HLS-1 BERT-L phase 2 (PT lazy, ~1.17)", "bert-large", "gaudi", "hls1", "PyTorch lazy",
           ((8, 16), (32, 16)), seq_len=512),
    Series("DL1 BERT-1.5B DeepSpeed ZeRO-1 (PT)", "bert-large", "gaudi", "dl1", "DeepSpeed",
           ((8, 16), (128, 16)), seq_len=128, accumulation=24, figure_model="bert-1.5b",
           model_kwargs=(("hidden", 1600), ("layers", 48), ("heads", 25), ("intermediate", 6400))),
)
"""The published series (``models/published_figures.toml``)."""

CALIBRATION = {
    "HLS-1H MLPerf v1.1 ResNet-50 (TF)": "step jitter of hccl.sim.variability.DEFAULT (16 -> 32, 64, 128 cards)",
    "HLS-1 BERT-L phase 1 (PT lazy, ~1.17)": "step jitter of hccl.sim.variability.DEFAULT (8 -> 32 cards)",
}
"""Series whose points set a constant (NOTE [calibration and predictions]); the rest predict."""


def _published(figures: list[dict], s: Series) -> dict[int, float]:
    """Published per-card throughput per card count, or efficiencies for efficiency-only figures."""
    name = s.figure_model or s.model
    out: dict[int, float] = {}
    for cards, batch in s.points:
        for f in figures:
            if (f["model"], f["device"], f["cards"]) != (name, s.device, cards) or s.software not in f["software"] \
                    or s.pick not in f["source"]:
                continue
            if "scaling_efficiency" in f and f.get("base_cards") == s.points[0][0]:
                out[cards] = ("eff", f["scaling_efficiency"])
            elif f.get("batch_size_per_card") == batch * s.accumulation and "throughput_samples_per_s" in f \
                    and (s.seq_len is None or f.get("seq_len") in (None, s.seq_len)):
                out[cards] = ("tput", f["throughput_samples_per_s"] / (1 if f.get("per_card") else cards))
    return out


def _simulated(s: Series, traces: dict, steps: int, variability=None, stretches: int = 1) -> dict[int, float]:
    """Simulated per-card samples/s at each point (the scaling study's planner)."""
    from hccl.sim.cluster import Cluster
    from hccl.sim.ddp_plan import plan_ddp_step
    from hccl.sim.variability import DEFAULT
    from launchers.study.scale import ScaleConfig, plan_world_size

    out = {}
    for i, (cards, batch) in enumerate(s.points):
        cfg = ScaleConfig(model=s.model, batch_size=batch, seq_len=s.seq_len, world_sizes=(cards,),
                          topology=s.topology, mode=s.mode, device_spec=s.device, steps=steps, stretches=stretches,
                          condition=Cluster(variability or DEFAULT))
        step = plan_world_size(cfg, traces, cards)["step_mean_ns"]
        if s.accumulation > 1:  # the other micro-steps only compute (NOTE [what the series run])
            micro = plan_ddp_step(traces[batch], world_size=1, topology=s.topology, bucket_cap_mb=cfg.bucket_cap_mb,
                                  gradient_as_bucket_view=True).times.step_ns
            step += (s.accumulation - 1) * micro
        if s.checkpoint_every:  # the block's checkpoint, its share per optimizer step
            step += checkpoint_ns(traces[batch]) // s.checkpoint_every[i]
        out[cards] = batch * s.accumulation / (step * 1e-9)
    return out


_TRACES: dict = {}


def _traces(s: Series) -> dict:
    from launchers.study._runner import trace_key, trace_steps
    from launchers.study.scale import ScaleConfig

    key = (s.model, s.device, s.mode, s.seq_len, s.model_kwargs)
    batches = sorted({b for _, b in s.points})
    have = _TRACES.setdefault(key, {})
    missing = [b for b in batches if b not in have]
    if missing:
        cfg = ScaleConfig(model=s.model, batch_size=batches[0], world_sizes=(s.points[0][0],))  # the planned caps
        key = trace_key(s.mode, s.device, cfg.bucket_cap_mb, cfg.first_bucket_mb)
        have.update({k[0]: t for k, t in trace_steps(s.model, [(b, *key) for b in missing],
                                                     seq_len=s.seq_len, **dict(s.model_kwargs)).items()})
    return have


def scaling_rows(*, steps: int = 16, series=SERIES, progress: bool = False, variability=None,
                 stretches: int = 1) -> list[list]:
    """One table row per published point beyond each series' first: series, cards, published
    and simulated efficiency, their difference in points, the role (calibration/prediction)."""
    figures = load_figures()
    rows = []
    for s in series:
        pub = _published(figures, s)
        if len(pub) < 2 and not any(k == "eff" for k, _ in pub.values()):
            continue
        traces = _traces(s)
        if progress:
            print(f"  planning {s.name} ...", flush=True)
        sim = _simulated(s, traces, steps, variability, stretches)
        n0, b0 = s.points[0]
        for cards, batch in s.points[1:]:
            if cards not in pub:
                continue
            kind, value = pub[cards]
            pub_eff = value if kind == "eff" else value / pub[n0][1]
            sim_eff = sim[cards] / sim[n0]
            role = "calibration" if s.name in CALIBRATION else "prediction"
            acc = f" x{s.accumulation}" if s.accumulation > 1 else ""
            rows.append([s.name, f"{n0} -> {cards}", (f"{b0} -> {batch}" if batch != b0 else str(b0)) + acc,
                         f"{pub_eff:.3f}", f"{sim_eff:.3f}", f"{(sim_eff - pub_eff) * 100:+.1f}", role])
    return rows


TARGET_POINTS = 3.0
"""Issue 18's fidelity target: every published scaling point within 3 points of efficiency."""


def print_table(rows: list[list]) -> None:
    """The scaling fidelity table (rows as :func:`scaling_rows` gives them), the calibration notes,
    and the rows beyond :data:`TARGET_POINTS` (or a line saying there are none)."""
    print("\nScaling efficiency (per-card throughput at N cards / at the series' smallest N; simulated: the "
          "scaling study's planner with its fabric and calibrated variability)")
    print(tabulate(rows, headers=["series", "cards", "batch/card", "published", "simulated", "points", "role"],
                   tablefmt="github"))
    for name, what in CALIBRATION.items():
        print(f"calibrated on {name}: {what}")
    misses = [f"{r[0]} {r[1]} ({r[5]})" for r in rows if abs(float(r[5])) > TARGET_POINTS]  # r[5]: "+5.8"
    if misses:
        print(f"beyond the {TARGET_POINTS:g}-point target: {'; '.join(misses)} "
              "(NOTE [the rows it misses] in models/bench_scaling.py)")
    else:
        print(f"every row within the {TARGET_POINTS:g}-point target")


def collective_rows(boxes=(2, 4, 8, 16, 32, 64, 128), nbytes: int = 256 << 20) -> list[list]:
    """Gaudi 3: hccl_demo's all_reduce bus bandwidth on ``hls3`` as boxes (and, past a pod of
    16, spine switches) are added, and its drop from 2 boxes; Intel says "within 10%"
    (``published_figures.toml``, ``hccl-all-reduce``)."""
    from hccl.sim.planner import simulate
    from hccl.sim.topology import load_topology
    from hccl.tools.bench import bus_factor

    figures = load_figures()
    bound = next(f["max_drop"] for f in figures if f["model"] == "hccl-all-reduce")
    rows, base = [], None
    for b in boxes:
        n = 8 * b
        res = simulate("all_reduce", nbytes, load_topology("hls3", world_size=n), world_size=n)
        bw = nbytes / res.duration_ns * bus_factor("all_reduce", n)
        base = base or bw
        drop = 1 - bw / base
        rows.append([b, n, f"{bw:.1f}", f"{drop:.1%}", "yes" if drop <= bound else "no"])
    return rows


def fit(jitters, *, steps: int = 16, stretches: int = 1) -> list[tuple[float, float]]:
    """Root-mean-square error (points) of the :data:`CALIBRATION` series for each step jitter."""
    from hccl.sim.variability import DEFAULT

    cal = [s for s in SERIES if s.name in CALIBRATION]
    out = []
    for j in jitters:
        rows = scaling_rows(steps=steps, series=cal, variability=dataclasses.replace(DEFAULT, jitter=j),
                            stretches=stretches)
        err = [float(r[5]) for r in rows]
        out.append((j, (sum(e * e for e in err) / len(err)) ** 0.5))
        print(f"jitter {j:.3f}: calibration points off by {', '.join(r[5] for r in rows)} (rms {out[-1][1]:.2f})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.bench_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16, help="sampled steps per point and stretch")
    p.add_argument("--stretches", type=count(1, 1000, "stretches"), default=1,
                   help="stretches of --steps steps per point, averaged (NOTE [one stretch is one sample] in"
                   " launchers.study.scale)")
    p.add_argument("--fit", type=str, default=None, metavar="J1,J2,...",
                   help="instead of the table: the calibration series' error for each step jitter")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    if a.fit:
        fit([float(x) for x in a.fit.split(",")], steps=a.steps, stretches=a.stretches)
        return 0
    print_table(scaling_rows(steps=a.steps, progress=True, stretches=a.stretches))
    print("\nGaudi 3 (hls3): 256 MB all_reduce bus bandwidth (GB/s, simulated) as boxes and spines are added;"
          " Intel: a drop within 10% is possible")
    print(tabulate(collective_rows(), headers=["boxes", "cards", "nw_bw", "drop from 2 boxes", "within 10%"],
                   tablefmt="github"))
    print(f"\n(wall-clock {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
