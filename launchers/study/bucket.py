"""The bucket-size study: which ``bucket_cap_mb`` at which scale, for one model.

One traced step per (model, batch, mode, device) (:func:`hpu_runtime.tools.tracing.trace_step`,
no data; in compile mode one per DDP cap as well, :func:`trace_key`), then every study point (world size x topology x bucket cap x the other DDP and
Gaudi knobs) through :func:`hccl.sim.ddp_plan.plan_ddp_step` (the planner), locally with a
progress bar or as Ray tasks. ``--live`` also runs the points that fit this machine as
real DDP jobs (``models.train`` under torchrun or Ray) and puts their steady-state
simulated step beside the planned one.

The table also holds the settings users meet in the wild (``SETTINGS_IN_THE_WILD``).
Outputs (``write_outputs``): ``study.csv``, ``study.json`` (``rows`` and
``recommendation``), ``study.png`` and ``recommendation.md``.

Times are simulated ns per card; ``wall_*_s`` fields are wall-clock seconds.

Length: about 560 lines, over the project's 400: the study's configuration, validation, the
point sweep, the recommendation rule, the output files and its command line are one user-facing
command whose parts change together; the plot already comes from matplotlib and the printed
table from tabulate.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hccl.sim import cluster
from hccl.sim.cluster import Cluster
from hccl.sim.variability import DEFAULT as DEFAULT_VARIABILITY
from hpu_runtime.cli_args import count

from ._args import add_fabric_arg, add_model_args, boolean, env_mode, first_mb, list_of, mb, ranks
from ._runner import DEFAULT_CAP_MB, run_points, save_figure, study_topology, trace_key, trace_steps, write_files

__all__ = ["add_parser", "bucket_main", "print_result", "StudyConfig", "Point", "SETTINGS_IN_THE_WILD", "study_points", "trace_key", "run_study", "recommend",
           "write_outputs", "validate", "gain_text"]

_MB = 1024 * 1024

SETTINGS_IN_THE_WILD = {
    # label: (bucket_cap_mb or None for DDP's default, first_bucket_mb, models it applies to)
    "DDP default (25 MB, 1 MB first bucket)": (None, None, None),
    "Gaudi docs: ResNet-50 100 MB": (100.0, None, ("resnet50",)),
    "Gaudi docs: ResNeXt-101 200 MB": (200.0, None, ("resnext101",)),
    "Habana scripts: 256 MB, first bucket 230 MB": (256.0, 230.0, None),
}
"""Settings from the field: DDP's own default; the Gaudi documentation's general model
optimizations guide ("In ResNet50, bucket size of 100MB is optimal whereas ResNext101
requires bucket size of 200MB"); HabanaAI/Model-References torchvision classification
``train.py`` (``bucket_cap_mb=256`` and ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 230 MB).
"One bucket for all gradients" is added per model from its gradient bytes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyConfig:
    """What to sweep. Every list is an axis; the study is their product.

    Raises:
        ValueError: from :func:`validate`, naming the bad value.
    """

    model: str
    """Registered name (``name:flavour`` for a flavour) or ``package.module:factory``."""
    batch_size: int
    """Per-card batch."""
    seq_len: int | None = None
    """Tokens per sample (text models)."""
    image_size: int | None = None
    """Pixels per side (image models)."""
    world_sizes: tuple[int, ...] = (8,)
    """Data-parallel ranks, one card each."""
    bucket_caps_mb: tuple[float, ...] = (1, 2, 5, 10, 25, 50, 100)
    """``bucket_cap_mb`` values, MiB."""
    topologies: tuple[str, ...] = ("hls2",)
    """Built-in topology names or topology files."""
    first_bucket_mb: tuple[float | None, ...] = (None,)
    """``dist._DEFAULT_FIRST_BUCKET_BYTES`` in MiB (None: torch's 1 MiB)."""
    comm_hooks: tuple[str, ...] = ("none",)
    """``none``, ``fp16``, ``bf16``."""
    lazy_collectives: tuple[bool, ...] = (False,)
    """``PT_HPU_ENABLE_LAZY_COLLECTIVES``."""
    gradient_as_bucket_view: tuple[bool, ...] = (False,)
    static_graph: tuple[bool, ...] = (False,)
    modes: tuple[str, ...] = ("lazy",)
    """Execution modes (:data:`hpu_runtime.tools.tracing.MODES`); compile mode traces one step
    per DDP cap (:func:`trace_key`)."""
    device_specs: tuple[str, ...] = ("gaudi2",)
    """Devices; empty: each topology's own card (:func:`hccl.sim.topology.device_and_topology`).
    A point pairs a topology with each device its boxes can hold (:func:`topology_devices`)."""
    precision: str = "bf16"
    """``bf16`` (autocast, as Habana's recipes) or ``fp32``."""
    optimizer: str = "sgd"
    """:data:`hpu_runtime.tools.tracing.OPTIMIZERS` (not ``none``): torch's momentum SGD, or
    Gaudi's fused ones, which take the per-parameter update off the host."""
    in_the_wild: bool = True
    """Also place :data:`SETTINGS_IN_THE_WILD` and one bucket for all gradients."""
    condition: Cluster = Cluster(DEFAULT_VARIABILITY)
    """Variability and what-ifs of the cluster (:mod:`hccl.sim.cluster`); on by default."""
    fabric: str = "topology"
    """``topology``: the topology file's scale-out fabric (ECMP contention); ``ideal``: none."""
    steps: int = 8
    """Steps planned per point when the cluster varies (their mean is the row's step)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One study point (a row of the table before it is planned)."""

    setting: str
    world_size: int
    topology: str
    bucket_cap_mb: float | None
    first_bucket_mb: float | None
    comm_hook: str
    lazy_collectives: bool
    gradient_as_bucket_view: bool
    static_graph: bool
    mode: str
    device_spec: str


def validate(cfg: StudyConfig) -> None:
    """Check everything before any work starts.

    Raises:
        ValueError: unknown model, empty or non-positive caps or world sizes, an unknown
            topology or one that cannot place a world size, unknown modes, hooks or devices.
    """
    from hccl.sim.ddp_plan import COMM_HOOKS
    from hccl.sim.topology import load_topology
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import MODES, OPTIMIZERS, ddp_graph_split
    from models.zoo import resolve_factory

    resolve_factory(cfg.model, **_model_kwargs(cfg))
    if not cfg.bucket_caps_mb:
        raise ValueError("no bucket caps given (--bucket-cap-mb)")
    if not cfg.world_sizes:
        raise ValueError("no world sizes given (--world-sizes)")
    for c in cfg.bucket_caps_mb:
        if not c > 0:
            raise ValueError(f"bucket cap {c!r} MB must be > 0")
    for c in cfg.first_bucket_mb:
        if c is not None and not c > 0:
            raise ValueError(f"first bucket {c!r} MB must be > 0")
    for n in cfg.world_sizes:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"world size {n!r} must be a positive integer")
    if cfg.batch_size < 1:
        raise ValueError(f"batch size {cfg.batch_size} must be >= 1")
    for name in cfg.topologies:
        for n in cfg.world_sizes:
            try:
                load_topology(name, world_size=n)
            except ValueError as exc:
                raise ValueError(f"topology {name!r} cannot hold world size {n}: {exc}") from None
    for m in cfg.modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; known: {', '.join(MODES)}")
    if "compile" in cfg.modes:  # torch.compile(DDP(model)) refuses a cap below its first bucket
        for cap, first in itertools.product(cfg.bucket_caps_mb, cfg.first_bucket_mb):
            ddp_graph_split(cap, first)
    for h in cfg.comm_hooks:
        if h not in COMM_HOOKS:
            raise ValueError(f"unknown comm hook {h!r}; known: {', '.join(COMM_HOOKS)}")
    for d in cfg.device_specs:
        get_device_spec(d)
    topology_devices(cfg)
    if cfg.precision not in ("bf16", "fp32"):
        raise ValueError(f"precision {cfg.precision!r} must be bf16 or fp32")
    if cfg.optimizer not in OPTIMIZERS or cfg.optimizer == "none":
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; known: {', '.join(OPTIMIZERS[:-1])}")
    if cfg.fabric not in ("topology", "ideal"):
        raise ValueError(f"fabric {cfg.fabric!r} must be topology or ideal")
    if cfg.steps < 1:
        raise ValueError(f"steps {cfg.steps} must be >= 1")
    for n in cfg.world_sizes:
        cfg.condition.whatif.check(n)


def _model_kwargs(cfg: StudyConfig) -> dict:
    return {k: v for k, v in (("seq_len", cfg.seq_len), ("image_size", cfg.image_size)) if v is not None}


def _model_name(spec: str) -> str:
    return spec.partition(":")[0]


def topology_devices(cfg: StudyConfig) -> list[tuple[str, str]]:
    """The (topology, device) pairs the study plans: each topology with every device of
    ``cfg.device_specs`` its boxes hold (a box holds cards of one generation), or with its own
    card when no device is given.

    Raises:
        ValueError: a topology none of the devices fits, or a device no topology holds, naming them.
    """
    from hccl.sim.topology import device_and_topology

    if not cfg.device_specs:
        return [(t, device_and_topology(None, t)[0]) for t in cfg.topologies]

    def fits(dev: str, topo: str) -> bool:
        try:
            device_and_topology(dev, topo)
        except ValueError:
            return False
        return True

    pairs = [(t, d) for t in cfg.topologies for d in cfg.device_specs if fits(d, t)]
    lonely = [f"--topology {t}" for t in cfg.topologies if all(pt != t for pt, _ in pairs)]
    lonely += [f"--device-spec {d}" for d in cfg.device_specs if all(pd != d for _, pd in pairs)]
    if lonely:
        raise ValueError(f"{', '.join(lonely)}: no box of the other setting holds that card (a box holds cards of one "
                         "generation: give the topologies alone and each brings its own card, or the devices alone)")
    return pairs


def study_points(cfg: StudyConfig, grad_mb: float) -> list[Point]:
    """The sweep's points plus the settings in the wild (``grad_mb``: the model's gradient MiB)."""
    caps: list[tuple[str, float | None, float | None]] = [("sweep", c, f) for c in cfg.bucket_caps_mb
                                                           for f in cfg.first_bucket_mb]
    model = _model_name(cfg.model)
    if cfg.in_the_wild:
        for label, (cap, first, models) in SETTINGS_IN_THE_WILD.items():
            if models is None or model in models:
                caps.append((label, cap, first))
        caps.append(("one bucket for all gradients", float(int(grad_mb) + 1), None))
    axes = itertools.product(cfg.world_sizes, topology_devices(cfg), cfg.comm_hooks, cfg.lazy_collectives,
                             cfg.gradient_as_bucket_view, cfg.static_graph, cfg.modes)
    return [Point(label, n, topo, cap, first, hook, lazy, gabv, static, mode, dev)
            for (n, (topo, dev), hook, lazy, gabv, static, mode), (label, cap, first) in itertools.product(axes, caps)]


def plan_point(trace, point: Point, model: str, batch_size: int, cfg: StudyConfig | None = None) -> dict:
    """Plan one point; the table row (see module docstring). With a varying cluster
    (``cfg.condition``) the row's times are the mean of ``cfg.steps`` planned steps."""
    from hccl.sim.ddp_plan import ddp_buckets, plan_ddp_step

    cfg = cfg or StudyConfig(model=model, batch_size=batch_size, condition=Cluster())
    plan = plan_ddp_step(trace, world_size=point.world_size,
                         topology=study_topology(point.topology, point.world_size, cfg.fabric),
                         bucket_cap_mb=point.bucket_cap_mb, first_bucket_mb=point.first_bucket_mb,
                         gradient_as_bucket_view=point.gradient_as_bucket_view, static_graph=point.static_graph,
                         comm_hook=point.comm_hook, lazy_collectives=point.lazy_collectives,
                         variability=cfg.condition.variability, whatif=cfg.condition.whatif, steps=cfg.steps)
    t = mean_times(plan)
    buckets = ddp_buckets(trace, point.bucket_cap_mb, first_bucket_mb=point.first_bucket_mb)
    cap = point.bucket_cap_mb
    return {
        "model": model, "batch_size": batch_size, "setting": point.setting,
        "world_size": point.world_size, "topology": point.topology, "mode": point.mode,
        "device_spec": point.device_spec,
        "bucket_cap_mb": DEFAULT_CAP_MB if cap is None else cap,
        "first_bucket_mb": (point.first_bucket_mb or 1.0) if cap is None else point.first_bucket_mb,
        "comm_hook": point.comm_hook, "lazy_collectives": point.lazy_collectives,
        "gradient_as_bucket_view": point.gradient_as_bucket_view, "static_graph": point.static_graph,
        "num_buckets": len(buckets), "bucket_sizes_bytes": [b.nbytes for b in buckets],
        "step_ns": t.step_ns, "compute_ns": t.compute_ns, "comm_ns": t.comm_ns,
        "exposed_comm_ns": t.exposed_comm_ns, "host_ns": t.host_ns, "graph_launches": plan.graph_launches,
        "samples_per_s_per_card": batch_size / (t.step_ns * 1e-9) if t.step_ns else 0.0,
        "algorithm": plan.algorithm, "steps_planned": max(1, len(plan.samples)),
    }


def mean_times(plan):
    """A plan's step breakdown: the mean of its sampled steps (integer ns), the step being the
    job's (the latest rank's: NOTE [the job's step] in :mod:`hccl.sim.straggler_plan`) and the
    rest rank 0's; or its steady step."""
    if not plan.samples:
        return plan.times
    n = len(plan.samples)
    means = {f: sum(getattr(s, f) for s in plan.samples) // n for f in ("compute_ns", "comm_ns", "exposed_comm_ns",
                                                                         "host_ns")}
    return type(plan.times)(step_ns=sum(plan.job_steps) // len(plan.job_steps), **means)


def _runner_key(cfg: StudyConfig, p: Point) -> tuple:
    """``p``'s trace in :func:`._runner.trace_steps`' keys: ``(batch, *trace_key)``."""
    return (cfg.batch_size, *trace_key(p.mode, p.device_spec, p.bucket_cap_mb, p.first_bucket_mb))


def run_study(cfg: StudyConfig, *, ray_address: str | None = None, use_ray: bool = False,
              progress: bool = True) -> list[dict]:
    """Trace and plan every point; returns the table rows (planned only).

    Args:
        ray_address: with ``use_ray``, an existing cluster (``HOST:PORT``), or None for an
            embedded one.
        use_ray: spread the points over Ray tasks.
        progress: show a progress bar (tqdm) on stderr.
    """
    validate(cfg)
    trace_kw = dict(seq_len=cfg.seq_len, image_size=cfg.image_size, precision=cfg.precision, optimizer=cfg.optimizer)
    probe = (cfg.batch_size, *trace_key(cfg.modes[0], topology_devices(cfg)[0][1], cfg.bucket_caps_mb[0],
                                        cfg.first_bucket_mb[0]))
    traces = trace_steps(cfg.model, [probe], **trace_kw)
    grad_mb = sum(p.nbytes for p in traces[probe].params) / _MB
    points = study_points(cfg, grad_mb)
    traces |= trace_steps(cfg.model, [k for k in dict.fromkeys(_runner_key(cfg, p) for p in points)
                                      if k not in traces], **trace_kw)
    return run_points(points, functools.partial(_runner_key, cfg), traces, functools.partial(_plan, cfg),
                      progress=progress, use_ray=use_ray, ray_address=ray_address)


def _plan(cfg: StudyConfig, trace, point: Point) -> dict:
    return plan_point(trace, point, cfg.model, cfg.batch_size, cfg)


def _config_key(row: dict) -> tuple:
    return (row["world_size"], row["topology"], row["mode"], row["device_spec"], row["comm_hook"],
            row["lazy_collectives"], row["gradient_as_bucket_view"], row["static_graph"])


def recommend(rows: list[dict]) -> list[dict]:
    """Per world size (and per combination of the other axes): the best swept ``bucket_cap_mb``.

    The best cap has the shortest planned step (ties: the smaller cap, which needs less
    bucket memory); the gain is over DDP's default (the default-setting row, else a swept
    25 MB) in % of its step time, None when neither is in the table. The ``why`` sentence
    reads the mechanisms off the rows.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_config_key(r), []).append(r)
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1:]))):
        sweep = [r for r in rs if r["setting"] == "sweep"] or rs
        best = min(sweep, key=lambda r: (r["step_ns"], r["bucket_cap_mb"]))
        default = next((r for r in rs if r["setting"].startswith("DDP default")), None) or next(
            (r for r in sweep if r["bucket_cap_mb"] == DEFAULT_CAP_MB), None)
        base = default or best
        gain = (base["step_ns"] - best["step_ns"]) / base["step_ns"] * 100 if default and base["step_ns"] else None
        out.append({
            "world_size": key[0], "topology": key[1], "mode": key[2], "device_spec": key[3],
            "comm_hook": key[4], "lazy_collectives": key[5], "gradient_as_bucket_view": key[6],
            "static_graph": key[7], "best_bucket_cap_mb": best["bucket_cap_mb"],
            "best_step_ns": best["step_ns"], "default_step_ns": base["step_ns"],
            "gain_over_default_pct": None if gain is None else round(gain, 3),
            "why": _why(best, default, sweep),
        })
    return out


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _regime(r: dict) -> str:
    """What bounds the step, read off its host time against its device time and exposed
    allreduce, and what a bucket size can change."""
    times = (f"host {_ms(r['host_ns'])}, device {_ms(r['compute_ns'])}, allreduce {_ms(r['comm_ns'])}"
             f" of a {_ms(r['step_ns'])} step")
    if r["host_ns"] >= r["compute_ns"] + r["exposed_comm_ns"]:
        return f"The step is host-bound ({times}): a bucket size changes the launches the host makes"
    if r["mode"] == "hpu_graphs":
        return (f"The step is device-bound ({times}) and the backward is one replayed HPU graph, so no allreduce"
                " starts before it ends: bucket size only pipelines the allreduces behind DDP's copies")
    return f"The step is device-bound ({times}): bucket size decides how much of the allreduce hides behind backward"


def _why(best: dict, default: dict | None, sweep: list[dict]) -> str:
    smallest = min(sweep, key=lambda r: r["bucket_cap_mb"])
    largest = max(sweep, key=lambda r: r["bucket_cap_mb"])
    parts = [_regime(best), f"{best['bucket_cap_mb']:g} MB gives {best['num_buckets']} bucket(s) and "
             f"{best['graph_launches']} graph launches per step"]
    if default is not None:
        parts[1] += f" against {default['num_buckets']} and {default['graph_launches']} at DDP's default"
    if default is not None and best["mode"] == "lazy" and not best["lazy_collectives"]:
        parts.append("in lazy mode every bucket's allreduce cuts and launches the accumulated backward graph,"
                     f" so host time goes from {_ms(default['host_ns'])} to {_ms(best['host_ns'])}")
    parts.append(f"{smallest['bucket_cap_mb']:g} MB buckets pay per-collective latency and launches"
                 f" ({smallest['num_buckets']} allreduces, step {_ms(smallest['step_ns'])}), while one bucket"
                 f" of {largest['bucket_cap_mb']:g} MB leaves {_ms(largest['exposed_comm_ns'])} of"
                 f" communication exposed after backward")
    parts.append(f"exposed communication at the best cap: {_ms(best['exposed_comm_ns'])}")
    return "; ".join(parts) + "."


def live_step_ns(cfg: StudyConfig, row: dict, *, launcher: str = "torchrun", timeout_s: float = 900) -> int:
    """Run ``row``'s point as a real DDP job on this machine; its steady-state simulated step.

    A model factory (``package.module:factory``, ``torchvision.models:NAME``) runs as
    ``models.train --model SPEC``, on the factory's own batch, with this process's working
    directory on the job's ``PYTHONPATH`` (where its module was found).

    Raises:
        ValueError: a world size above this machine's cores, or ``--fabric ideal``.
        RuntimeError: the job failed (its stderr tail in the message).
    """
    name, _, flavour = cfg.model.partition(":")
    from models.registry import model_names

    registered = name in model_names()
    from hccl.sim.straggler_plan import WARMUP

    varies = row.get("steps_planned", 1) > 1  # the planner sampled steps: the same ones, live
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        steps = WARMUP + row["steps_planned"] if varies else 6
        train = ["-m", "models.train", "--model", name if registered else cfg.model, "--batch-size",
                 str(cfg.batch_size), "--bucket-cap-mb", str(row["bucket_cap_mb"]), "--epochs", "1", "--max-steps",
                 str(steps), "--eval-samples", "4", "--device-spec", row["device_spec"], "--topology",
                 row["topology"], "--mode", row["mode"], "--summary", summary]
        if flavour and registered:
            train += ["--flavour", flavour]
        if cfg.seq_len:
            train += ["--seq-len", str(cfg.seq_len)]
        if cfg.image_size:
            train += ["--image-size", str(cfg.image_size)]
        if cfg.precision == "bf16":
            train.append("--autocast")
        train += ["--optimizer", cfg.optimizer]
        if row["gradient_as_bucket_view"]:
            train.append("--gradient-as-bucket-view")
        if row["static_graph"]:
            train.append("--static-graph")
        n = str(row["world_size"])
        if launcher == "ray":
            cmd = [sys.executable, "-m", "launchers.ray", "--num-workers", n, *train]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, *train]
        env = dict(os.environ, PT_HPU_ENABLE_LAZY_COLLECTIVES=str(row["lazy_collectives"]).lower(),
                   **cfg.condition.env())
        if not registered:  # the factory's module imports in the job as it did here
            env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        if cfg.fabric == "ideal":
            raise ValueError("--live runs the topology's own fabric: leave out --fabric ideal")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=str(Path(__file__).resolve().parents[1]))
        if proc.returncode != 0:
            raise RuntimeError(f"live point {row['setting']} {row['bucket_cap_mb']} MB x{n} failed:\n"
                               f"{proc.stderr[-2000:]}")
        with open(summary) as f:
            epoch = json.load(f)["epochs"][0]
        # with variability the job's steps (NOTE [the job's step]), as the planned row's
        steps_ns = epoch["sim_job_steps"] if varies else [s["step_ns"] for s in epoch["sim_steps"]]
        if len(steps_ns) < steps:
            raise RuntimeError(f"live point {row['setting']} {row['bucket_cap_mb']} MB x{n} ran {len(steps_ns)} steps,"
                               f" fewer than the {steps} planned (too little data for the batch?)")
        return sum(steps_ns[WARMUP:]) // len(steps_ns[WARMUP:]) if varies else steps_ns[-1]


FIELDS = ["model", "batch_size", "setting", "world_size", "topology", "mode", "device_spec", "bucket_cap_mb",
          "first_bucket_mb", "comm_hook", "lazy_collectives", "gradient_as_bucket_view", "static_graph",
          "num_buckets", "bucket_sizes_bytes", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns",
          "host_ns", "graph_launches", "samples_per_s_per_card", "algorithm", "steps_planned", "live_step_ns"]


def write_outputs(out_dir: str | Path, cfg: StudyConfig, rows: list[dict], recs: list[dict]) -> dict[str, Path]:
    """``study.csv``, ``study.json``, ``study.png``, ``recommendation.md`` in ``out_dir``."""
    return write_files(out_dir, rows=rows, fields=FIELDS, config=dataclasses.asdict(cfg),
                       extra={"recommendation": recs}, plot=lambda path: _plot(path, cfg, rows),
                       summary=("recommendation.md", recommendation_text(cfg, recs)),
                       units={"*_ns": "simulated Gaudi ns per card (mean of the planned steps)", "*_bytes": "bytes",
                              "bucket_cap_mb": "MiB", "samples_per_s_per_card": "simulated"})


def recommendation_text(cfg: StudyConfig, recs: list[dict]) -> str:
    lines = [f"# Bucket-size recommendation: {cfg.model}, batch {cfg.batch_size} per card", "",
             f"Fabric: {cfg.fabric}; {cfg.condition.describe()}", ""]
    for r in recs:
        knobs = (f"{r['mode']} mode, {r['device_spec']}, {r['topology']}, comm hook {r['comm_hook']},"
                 f" lazy collectives {r['lazy_collectives']}, gradient_as_bucket_view {r['gradient_as_bucket_view']}")
        lines.append(f"- **{r['world_size']} cards** ({knobs}): best `bucket_cap_mb={r['best_bucket_cap_mb']:g}`,"
                     f" step {_ms(r['best_step_ns'])}, {gain_text(r)}. Why: {r['why']}")
    lines += ["", "Simulated Gaudi time (planner), per card; see study.csv for every point."]
    return "\n".join(lines) + "\n"


def gain_text(rec: dict) -> str:
    """The recommendation's gain over DDP's default, in words."""
    if rec["gain_over_default_pct"] is None:
        return "DDP's default (25 MB) is not in this table"
    return f"{rec['gain_over_default_pct']:+.2f}% of step time against DDP's default ({_ms(rec['default_step_ns'])})"


def _plot(path: Path, cfg: StudyConfig, rows: list[dict]) -> None:
    import matplotlib


    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["setting"] == "sweep":
            series.setdefault(_config_key(r), []).append(r)
    for key, rs in sorted(series.items(), key=lambda kv: (kv[0][0], str(kv[0][1:]))):
        rs = sorted(rs, key=lambda r: r["bucket_cap_mb"])
        caps = [r["bucket_cap_mb"] for r in rs]
        label = f"{key[0]} cards" + ("" if len(series) <= len(cfg.world_sizes) else f" {key[1:]}")
        ax1.plot(caps, [r["step_ns"] / 1e6 for r in rs], marker="o", label=label)
        ax2.plot(caps, [r["exposed_comm_ns"] / 1e6 for r in rs], marker="o", label=label)
    for ax, title in ((ax1, "simulated step time (ms)"), (ax2, "exposed communication (ms)")):
        ax.set_xscale("log")
        ax.axvline(DEFAULT_CAP_MB, color="grey", linestyle="--", linewidth=1)
        ax.text(DEFAULT_CAP_MB, ax.get_ylim()[1], " DDP default 25 MB", va="top", fontsize=8, color="grey")
        ax.set_xlabel("bucket_cap_mb (MiB, log scale)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"{cfg.model}, batch {cfg.batch_size}/card: bucket-size study (simulated Gaudi)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def add_parser(sub) -> None:
    """Add the ``bucket`` subcommand to ``sub`` (an argparse subparsers object)."""
    from hpu_runtime.device.spec import DEVICE_SPECS
    from hpu_runtime.tools.tracing import MODES, OPTIMIZERS

    b = sub.add_parser("bucket", help="which bucket_cap_mb at which scale: table, plot, recommendation")
    add_model_args(b)
    b.add_argument("--world-sizes", type=list_of(ranks, "--world-sizes"), default=(8,))
    b.add_argument("--bucket-cap-mb", type=list_of(mb, "--bucket-cap-mb"),
                   default=(1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0))
    b.add_argument("--topology", type=list_of(str, "--topology"), default=None,
                   help="hls1, hls2, hls3 or topology files, comma-separated (default: the boxes of the"
                        " --device-spec cards, else hls2)")
    b.add_argument("--first-bucket-mb", type=list_of(first_mb, "--first-bucket-mb"), default=(None,),
                   help="dist._DEFAULT_FIRST_BUCKET_BYTES in MB ('default' = 1 MB); torch 2.13 uses it"
                        " only with DDP's default cap")
    b.add_argument("--comm-hook", type=list_of(str, "--comm-hook"), default=("none",), help="none, fp16, bf16")
    b.add_argument("--lazy-collectives", type=list_of(boolean, "--lazy-collectives"), nargs="?",
                   const=(True,), default=(False,), help="PT_HPU_ENABLE_LAZY_COLLECTIVES: false,true")
    b.add_argument("--gradient-as-bucket-view", type=list_of(boolean, "--gradient-as-bucket-view"), nargs="?",
                   const=(True,), default=(False,))
    b.add_argument("--static-graph", type=list_of(boolean, "--static-graph"), nargs="?", const=(True,), default=(False,))
    b.add_argument("--mode", type=list_of(str, "--mode"), default=None,
                   help=f"{', '.join(MODES)} (default: PT_HPU_LAZY_MODE); compile traces one step per cap")
    b.add_argument("--device-spec", type=list_of(str, "--device-spec"), default=None,
                   help=f"{', '.join(sorted(DEVICE_SPECS))} (default: each topology's own card; a topology holds"
                        " only cards of its generation)")
    b.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    b.add_argument("--optimizer", default="sgd", choices=[o for o in OPTIMIZERS if o != "none"],
                   help="torch's momentum SGD (default) or Gaudi's fused hpex optimizers (one kernel per group)")
    b.add_argument("--out", required=True, metavar="DIR", help="study.csv, study.json, study.png, recommendation.md")
    b.add_argument("--live", action="store_true",
                   help="also run the points whose world size fits this machine as real DDP jobs")
    b.add_argument("--live-max-ranks", type=count(1, 4096, "ranks"), default=None,
                   help="largest world size run live (default: this machine's cores)")
    b.add_argument("--launcher", default="torchrun", choices=["torchrun", "ray"], help="for --live")
    b.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="plan the points as Ray tasks (an embedded cluster, or ADDRESS)")
    b.add_argument("--sweep-only", action="store_true",
                   help="leave out the settings in the wild (DDP default, Gaudi docs, Habana scripts, one bucket)")
    add_fabric_arg(b)
    b.add_argument("--steps", type=count(1, 10_000, "steps"), default=8, help="steps planned per point when the cluster varies")
    cluster.add_arguments(b, variability="on")
    b.add_argument("--no-progress", action="store_true")


def _boxes_of(devices: tuple[str, ...] | None) -> tuple[str, ...]:
    """The default ``--topology``: the box of each ``--device-spec`` card (HLS-Gaudi2 without one)."""
    from hccl.sim.topology import device_and_topology

    return tuple(dict.fromkeys(device_and_topology(d, None, device_from="--device-spec")[1]
                               for d in devices or ("gaudi2",)))


def bucket_main(args: argparse.Namespace) -> dict:
    """Run the ``bucket`` command; returns ``{"rows", "recommendation", "paths"}``.

    Raises:
        ValueError: bad input, before any work starts (:func:`run_study`
            validates first).
    """
    cfg = StudyConfig(
        model=args.model, batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size,
        world_sizes=args.world_sizes,
        bucket_caps_mb=args.bucket_cap_mb, topologies=args.topology or _boxes_of(args.device_spec),
        first_bucket_mb=args.first_bucket_mb,
        comm_hooks=args.comm_hook, lazy_collectives=args.lazy_collectives,
        gradient_as_bucket_view=args.gradient_as_bucket_view, static_graph=args.static_graph,
        modes=args.mode or (env_mode(),), device_specs=args.device_spec or (), precision=args.precision,
        optimizer=args.optimizer,
        in_the_wild=not args.sweep_only, condition=cluster.from_args(args), fabric=args.fabric, steps=args.steps)
    rows = run_study(cfg, use_ray=args.ray is not None, ray_address=args.ray or None,
                        progress=not args.no_progress)
    if args.live:
        limit = args.live_max_ranks or (os.cpu_count() or 1)
        for row in rows:
            if row["world_size"] <= limit:
                row["live_step_ns"] = live_step_ns(cfg, row, launcher=args.launcher)
    recs = recommend(rows)
    paths = write_outputs(args.out, cfg, rows, recs)
    return {"rows": rows, "recommendation": recs, "paths": paths}


def print_result(result: dict) -> None:
    """Print the study's table and recommendation."""
    rows = result["rows"]
    from tabulate import tabulate

    live = any("live_step_ns" in r for r in rows)
    table = [[r["world_size"], r["setting"] if r["setting"] != "sweep" else "", f"{r['bucket_cap_mb']:g}",
              r["num_buckets"], r["graph_launches"], f"{r['step_ns'] / 1e6:.3f}", f"{r['exposed_comm_ns'] / 1e6:.3f}",
              f"{r['samples_per_s_per_card']:,.0f}"] + ([f"{r['live_step_ns'] / 1e6:.3f}" if "live_step_ns" in r
                                                         else ""] if live else [])
             for r in rows]
    headers = ["cards", "setting", "cap MB", "buckets", "launches", "step ms", "exposed ms", "samples/s/card"]
    print(tabulate(table, headers=headers + (["live step ms"] if live else []), tablefmt="github"))
    print()
    for r in result["recommendation"]:
        print(f"{r['world_size']} cards ({r['mode']}, {r['topology']}): best bucket_cap_mb={r['best_bucket_cap_mb']:g},"
              f" {gain_text(r)}. {r['why']}")
    print("\nwritten: " + ", ".join(str(p) for p in result["paths"].values()))
