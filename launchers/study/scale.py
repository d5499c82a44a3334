"""The scaling study: how one model's per-card throughput holds up from a few cards to many.

``python -m launchers.study scale --model bert-large --batch-size 48 --seq-len 512
--world-sizes 8,16,32,64,128,256,512,1024,4096 --topology hls2 --out DIR``

One traced step (per per-card batch), then per world size the DDP step planned three ways
(:func:`hccl.sim.ddp_plan.plan_ddp_step`): as the cluster is (its fabric's contention, its
variability and what-ifs; ``--steps`` sampled steps, the job's, in each of ``--stretches``
stretches), on the same fabric with every card nominal, and on an ideal fabric with every card
nominal. The differences are the loss's causes.

NOTE [where the efficiency goes]
    With ``t(N)`` the mean step time per sample at ``N`` cards, efficiency is ``t(N0) / t(N)``
    for the smallest world size ``N0``, and ``1 - efficiency = (t(N) - t(N0)) / t(N)`` splits
    exactly into four terms, each in points of efficiency (``100 x term / t(N)``):

    - ``exposed communication``: the nominal step on an ideal fabric at ``N`` minus that at
      ``N0`` with the same per-card batch (more boxes, HCL's box iterations, larger groups);
    - ``per-card batch``: ``N0``'s nominal step at this batch minus at its own (only when the
      per-card batch changes with ``N``, ``--global-batch``);
    - ``congestion``: the fabric's contention (nominal step on the fabric minus on an ideal
      one), above ``N0``'s;
    - ``waiting for the slowest rank``: the mean sampled step minus the nominal one (the
      variability and slow cards), above ``N0``'s.

    A sampled step is the job's (NOTE [the job's step] in :mod:`hccl.sim.straggler_plan`): the
    increase of the latest rank's step end, not rank 0's, whose host runs on while a later
    host's lag hides in its device's slack. The waiting is the mean over ``--steps`` steps that
    follow a host sync (the planner's alignment barrier, after which every card runs nominal
    until the kept steps start: NOTE [the kept stretch starts at a sync]), so read ``--steps``
    as the stretch between host syncs in the user's script (a device read such as
    ``loss.item()`` makes each host wait for its device, and through the last allreduce for the
    slowest rank). Where the host binds (lazy mode without HPU graphs) a host runs ahead of its
    device and never waits for the others between syncs, a card slow in one step makes up its
    delay in the next, and the latest host's lead over the average grows about as the square
    root of the steps while the steps grow linearly: the waiting falls as the stretch grows.
    Measured (ResNet-50, 256 per card, Gaudi2 on hls2, 512 cards against 8, seeds 0-2): 2.0-2.2
    points at 16 steps, 0.9-1.5 at 64, 0.2-0.7 at 256. That lag is the largest of the ranks'
    sums from the sync, so it grows with the cards; the efficiency falls with them but for the
    two stand-ins' approximation (BERT-Large 48 x 512, seeds 0-2 from 8 to 65,536 cards: at
    most 0.2 points back up, seed 2 from 64 to 512 cards). Where the device binds, every
    allreduce waits for that step's slowest card and the figure does not depend on the stretch
    (the same with HPU graphs, seed 0: 4.4 points at 16 steps, 4.7 at 256).

NOTE [one stretch is one sample]
    A row's waiting is the mean over one stretch of ``--steps`` steps: one sample of the draws.
    Where the host binds it is the largest of the ranks' lags over that stretch, set by a few
    ranks and now and then by one slow step, so it moves from sample to sample, and a world
    size can come out level with a smaller one when the same rank lags most in both (the
    BERT-Large study above, one stretch: 0.978, 0.934 and 0.965 at 4,096 cards for seeds 0, 1
    and 2; seed 0 level at 0.978 from 512 to 4,096 cards). A long run is many such stretches
    between host syncs, each with fresh draws, and its throughput is their mean: ``--stretches
    K`` plans ``K`` stretches per world size (the variability's stretches, later steps of the
    same seed's run: :attr:`hccl.sim.variability.Variability.stretch`), and a row gives the
    mean over all ``K x --steps`` steps with the efficiency's range across the stretches
    (stretch ``k`` at ``N`` cards against stretch ``k`` at the smallest world size, whose ranks
    draw the same values as the ranks they share). With 8 stretches the same study gives 0.973,
    0.970 and 0.970 at 4,096 cards for seeds 0-2 (ranges 0.955-0.986, 0.934-0.988,
    0.950-0.992) and 0.980, 0.982 and 0.977 at 1,024, and falls at every step from 16 cards
    on for seed 0 (0.999, 0.994, 0.991, 0.988, 0.987, 0.984, 0.980, 0.973), in 93 s against
    24 s on 2 cores. The default stays one stretch (the studies' one-minute budget at 65,536
    cards); the summary says so. Stretch 0 is what a live run draws (``stretch=K`` in
    ``--variability`` or ``HCCL_SIM_VARIABILITY`` picks another, live or planned).

Outputs (the shared runner's): ``study.csv``, ``study.json`` (``rows``), ``study.png``
(efficiency against cards, log axis, the causes stacked) and ``summary.md``. Times are
simulated ns per card; wall-clock seconds are labelled ``wall``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from hccl.sim import cluster
from hccl.sim.cluster import Cluster
from hccl.sim.variability import DEFAULT as DEFAULT_VARIABILITY
from hccl.transport.reduce_ops import affinity_cores

from hpu_runtime.cli_args import count, real

from ._args import add_fabric_arg, add_model_args, env_mode, first_mb, list_of, mb, ranks
from ._runner import run_points, save_figure, study_topology, trace_key, trace_steps, write_files

__all__ = ["ScaleConfig", "add_parser", "scale_main", "run_scale", "plan_world_size", "print_result", "CAUSES"]

CAUSES = ("comm", "batch", "congestion", "waiting")
"""The loss's causes, in the order the plot stacks them (NOTE [where the efficiency goes])."""
_LABELS = {"comm": "exposed communication", "batch": "per-card batch", "congestion": "congestion (ECMP)",
           "waiting": "waiting for the slowest rank"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleConfig:
    """What to plan. Raises ValueError from :func:`validate`, naming the bad value."""

    model: str
    """Registered name (``name:flavour``) or ``package.module:factory``."""
    batch_size: int | None = None
    """Per-card batch at every world size (or give ``global_batch``)."""
    global_batch: int | None = None
    """Global batch: the per-card batch is ``global_batch / N`` (must divide)."""
    seq_len: int | None = None
    image_size: int | None = None
    world_sizes: tuple[int, ...] = (8, 64, 512)
    """Data-parallel ranks, one card each; the smallest is the efficiency baseline."""
    topology: str = "hls2"
    mode: str = "lazy"
    device_spec: str = "gaudi2"
    precision: str = "bf16"
    bucket_cap_mb: float | None = 256.0
    """DDP's ``bucket_cap_mb`` (Habana's scripts: 256 MB)."""
    first_bucket_mb: float | None = None
    gradient_as_bucket_view: bool = True
    condition: Cluster = Cluster(DEFAULT_VARIABILITY)
    """Variability and what-ifs (:mod:`hccl.sim.cluster`); variability on by default."""
    fabric: str = "topology"
    """``topology``: its scale-out fabric as the file says; ``ideal``: no contention."""
    steps: int = 16
    """Sampled steps per stretch and world size (the job's, after the warm-up)."""
    stretches: int = 1
    """Stretches of ``steps`` steps planned per world size, each with its own draws (the
    variability's stretches ``k .. k + stretches - 1``): the rows give their mean and the
    efficiency's range across them (NOTE [one stretch is one sample])."""
    pg_timeout_s: float = 1800.0
    """The process group's timeout (torch's default): how long a dead rank's peers wait."""
    restart_s: float = 30.0
    """ASSUMPTION: wall seconds for torchrun to restart the workers and rendezvous again."""
    recipe_cache: str = "cold"
    """After a restart: ``cold`` (every graph compiled again) or ``warm`` (read from
    ``PT_HPU_RECIPE_CACHE_CONFIG``; the read itself is not modelled)."""

    def batch_at(self, n: int) -> int:
        """The per-card batch at ``n`` cards."""
        return self.global_batch // n if self.global_batch else self.batch_size


def validate(cfg: ScaleConfig) -> None:
    """Check everything before any work starts.

    Raises:
        ValueError: no batch or both, a global batch that does not divide, a bad world size,
            topology, mode, device, precision, fabric or what-if, stretches without variability.
    """
    from hpu_runtime.tools.tracing import MODES
    from hccl.sim.topology import device_and_topology, load_topology
    from models.zoo import resolve_factory

    if (cfg.batch_size is None) == (cfg.global_batch is None):
        raise ValueError("give the per-card batch (--batch-size) or the global batch (--global-batch), one of them")
    if not cfg.world_sizes:
        raise ValueError("no world sizes given (--world-sizes)")
    if len(set(cfg.world_sizes)) != len(cfg.world_sizes):
        raise ValueError(f"world sizes {list(cfg.world_sizes)} repeat a value")
    for n in cfg.world_sizes:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"world size {n!r} must be a positive integer")
        if cfg.global_batch and (cfg.global_batch % n or cfg.global_batch < n):
            raise ValueError(f"global batch {cfg.global_batch} does not split evenly over {n} cards")
        try:
            load_topology(cfg.topology, world_size=n)
        except ValueError as exc:
            raise ValueError(f"topology {cfg.topology!r} cannot hold world size {n}: {exc}") from None
        cfg.condition.whatif.check(n)
    kwargs = {k: v for k, v in (("seq_len", cfg.seq_len), ("image_size", cfg.image_size)) if v is not None}
    resolve_factory(cfg.model, **kwargs)
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; known: {', '.join(MODES)}")
    # an unknown device, or one the topology's boxes do not hold, is refused here
    device_and_topology(cfg.device_spec, cfg.topology, device_from="--device-spec", topology_from="--topology")
    if cfg.precision not in ("bf16", "fp32"):
        raise ValueError(f"precision {cfg.precision!r} must be bf16 or fp32")
    if cfg.fabric not in ("topology", "ideal"):
        raise ValueError(f"fabric {cfg.fabric!r} must be topology or ideal")
    if cfg.recipe_cache not in ("cold", "warm"):
        raise ValueError(f"recipe cache {cfg.recipe_cache!r} must be cold or warm")
    if cfg.steps < 1:
        raise ValueError(f"steps {cfg.steps} must be >= 1")
    if not isinstance(cfg.stretches, int) or not 1 <= cfg.stretches <= 1000:
        raise ValueError(f"stretches {cfg.stretches!r} must be an integer from 1 to 1000")
    if cfg.stretches > 1 and not cfg.condition.variability.active:
        raise ValueError(f"--stretches {cfg.stretches} draws each stretch from the variability, which is off: every "
                         "stretch would be the same (leave out --stretches or turn --variability on)")
    if cfg.condition.variability.stretch + cfg.stretches > 1 << 31:
        raise ValueError(f"variability stretch {cfg.condition.variability.stretch} + {cfg.stretches} stretches "
                         "passes 2**31")


def _nominal_plans(cfg: ScaleConfig, trace, n: int) -> dict:
    """The nominal plans of one world size, on its fabric and on an ideal one (NOTE [where the
    efficiency goes])."""
    from hccl.sim.ddp_plan import plan_ddp_step
    from hccl.sim.fabric import ideal

    topo = study_topology(cfg.topology, n, cfg.fabric)
    links = dataclasses.replace(cfg.condition.whatif, slow_cards=())  # links stay in the nominal plans
    return {"nominal": plan_ddp_step(trace, topology=topo, whatif=links, **_plan_kw(cfg, n)),
            "ideal": plan_ddp_step(trace, topology=ideal(topo), whatif=links, **_plan_kw(cfg, n))}


def _plan_kw(cfg: ScaleConfig, n: int) -> dict:
    return dict(world_size=n, bucket_cap_mb=cfg.bucket_cap_mb, first_bucket_mb=cfg.first_bucket_mb,
                gradient_as_bucket_view=cfg.gradient_as_bucket_view)


def _stretch_indices(cfg: ScaleConfig) -> range:
    """The stretches a world size is planned in: ``cfg.stretches`` with variability, else one
    (every stretch the same)."""
    return range(cfg.stretches if cfg.condition.variability.active else 1)


def _part(cfg: ScaleConfig, trace, n: int, k: int) -> dict:
    """One stretch of one world size (NOTE [one stretch is one sample]): its job's steps and its
    breakdowns' exposed communication; the first stretch also carries the nominal plans."""
    from hccl.sim.ddp_plan import plan_ddp_step

    cond = cfg.condition
    nominal = _nominal_plans(cfg, trace, n) if k == 0 else {}
    if cond.variability.active or cond.whatif.slow_cards:
        var = dataclasses.replace(cond.variability, stretch=cond.variability.stretch + k) \
            if cond.variability.active else cond.variability
        actual = plan_ddp_step(trace, topology=study_topology(cfg.topology, n, cfg.fabric), variability=var,
                               whatif=cond.whatif, steps=cfg.steps, lockstep=False, **_plan_kw(cfg, n))
    else:
        actual = nominal["nominal"]
    part = {"job_steps": list(actual.job_steps) or [actual.times.step_ns],
            "exposed_comm_ns": [s.exposed_comm_ns for s in actual.samples] or [actual.times.exposed_comm_ns]}
    if k == 0:
        part.update(comm_ns=actual.times.comm_ns, nominal_step_ns=nominal["nominal"].times.step_ns,
                    ideal_step_ns=nominal["ideal"].times.step_ns, algorithm=actual.algorithm,
                    num_buckets=len(actual.buckets), graphs=[g[1] for g in actual.graphs])
    return part


def _row(n: int, batch: int, parts: list[dict]) -> dict:
    """One row from its stretches' parts (stretch 0 first)."""
    per = [p["job_steps"] for p in parts]
    samples = [x for p in per for x in p]
    ordered = sorted(samples)
    exposed = [x for p in parts for x in p["exposed_comm_ns"]]
    first = parts[0]
    return {
        "world_size": n, "batch_size": batch, "step_mean_ns": sum(samples) // len(samples),
        "step_median_ns": ordered[(len(ordered) - 1) // 2],
        "step_p99_ns": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "steps_sampled": len(samples), "stretch_means_ns": [sum(p) // len(p) for p in per],
        "exposed_comm_ns": sum(exposed) // len(exposed),
        **{k: first[k] for k in ("comm_ns", "nominal_step_ns", "ideal_step_ns", "algorithm", "num_buckets",
                                 "graphs")},
    }


def plan_world_size(cfg: ScaleConfig, traces: dict, n: int) -> dict:
    """One row's raw plans for ``n`` cards (the ``traces`` of every per-card batch), every
    stretch in this process. The sampled steps are every stretch's, stretch by stretch, the
    job's (NOTE [the job's step] in :mod:`hccl.sim.straggler_plan`); ``stretch_means_ns`` the
    mean of each stretch."""
    b = cfg.batch_at(n)
    return _row(n, b, [_part(cfg, traces[b], n, k) for k in _stretch_indices(cfg)])


def _plan(cfg: ScaleConfig, traces: dict, point: tuple[int, int]) -> dict:
    n, k = point
    return _part(cfg, traces[cfg.batch_at(n)], n, k)


PARALLEL_FROM_RANKS = 4096
"""``--jobs auto`` plans the points (a stretch of a world size each) in worker processes when
the largest world size times the stretches is at least this: below, the points together plan
in a few seconds here, about what a spawned worker takes to import torch (about 3 s)."""


def auto_jobs(world_sizes, stretches: int = 1) -> int:
    """``--jobs auto``: one worker per core when the largest world size times the stretches
    planned is at least :data:`PARALLEL_FROM_RANKS`, else 1 (plan in this process)."""
    return affinity_cores() if max(world_sizes) * stretches >= PARALLEL_FROM_RANKS else 1


def run_scale(cfg: ScaleConfig, *, progress: bool = True, jobs: int | None = None) -> list[dict]:
    """Validate, trace, plan every world size; the rows with efficiency and its causes.

    ``jobs``: worker processes planning the world sizes side by side (None: :func:`auto_jobs`);
    the rows do not depend on it."""
    validate(cfg)
    batches = sorted({cfg.batch_at(n) for n in cfg.world_sizes})
    # compile mode: the step compiled as under DDP with this cap (DDPOptimizer's graph breaks)
    keys = {b: (b, *trace_key(cfg.mode, cfg.device_spec, cfg.bucket_cap_mb, cfg.first_bucket_mb)) for b in batches}
    traces = trace_steps(cfg.model, list(keys.values()), seq_len=cfg.seq_len, image_size=cfg.image_size,
                         precision=cfg.precision)
    by_batch = {b: traces[keys[b]] for b in batches}
    sizes = sorted(cfg.world_sizes)
    ks = _stretch_indices(cfg)
    points = [(n, k) for n in sizes for k in ks]  # a stretch of a world size each, planned side by side
    parts = run_points(points, lambda p: "all", {"all": by_batch}, functools.partial(_plan, cfg), progress=progress,
                       desc="world sizes x stretches" if len(ks) > 1 else "world sizes",
                       jobs=auto_jobs(sizes, len(ks)) if jobs is None else jobs, cost=lambda p: p[0])
    rows = [_row(n, cfg.batch_at(n), parts[i * len(ks):(i + 1) * len(ks)]) for i, n in enumerate(sizes)]
    n0 = sizes[0]
    base = rows[0]
    base_at: dict[int, int] = {base["batch_size"]: base["ideal_step_ns"]}
    for b in batches:  # N0's ideal nominal step at every other batch (the batch cause)
        if b not in base_at:
            base_at[b] = _nominal_plans(cfg, by_batch[b], n0)["ideal"].times.step_ns
    _derive(rows, base_at)
    _restart_cost(cfg, rows, by_batch)
    return rows


def _derive(rows: list[dict], base_at: dict[int, int]) -> None:
    """Throughput, efficiency and the loss's causes in points (NOTE [where the efficiency goes])."""
    r0 = rows[0]
    b0 = r0["batch_size"]
    t0 = r0["step_mean_ns"] / b0
    g0 = (r0["nominal_step_ns"] - r0["ideal_step_ns"]) / b0
    w0 = (r0["step_mean_ns"] - r0["nominal_step_ns"]) / b0
    for r in rows:
        b = r["batch_size"]
        t = r["step_mean_ns"] / b
        r["samples_per_s_per_card"] = 1e9 / t
        r["efficiency"] = t0 / t
        terms = {"comm": (r["ideal_step_ns"] - base_at[b]) / b, "batch": base_at[b] / b - base_at[b0] / b0,
                 "congestion": (r["nominal_step_ns"] - r["ideal_step_ns"]) / b - g0,
                 "waiting": (r["step_mean_ns"] - r["nominal_step_ns"]) / b - w0}
        for k, v in terms.items():
            r[f"loss_{k}_pts"] = 100.0 * v / t
        # stretch k of N against stretch k of N0 (the same draws on the ranks both have)
        per = [(m0 / b0) / (m / b) for m0, m in zip(r0["stretch_means_ns"], r["stretch_means_ns"])]
        r["efficiency_min"], r["efficiency_max"] = min(per), max(per)


def _restart_cost(cfg: ScaleConfig, rows: list[dict], traces: dict) -> None:
    """With ``--dead-rank R@S``: each row's simulated cost of the rank dying (NOTE [a dead rank])."""
    dead = cfg.condition.whatif.dead_rank
    if not dead:
        return
    from hpu_runtime.device.cost_model import compile_ns
    from hccl.sim.whatif import restart_cost_ns

    spec = traces[rows[0]["batch_size"]].spec
    for r in rows:
        compile_total = sum(compile_ns(spec, ops) for ops in r["graphs"]) if cfg.recipe_cache == "cold" else 0
        r["dead_rank_cost_ns"] = restart_cost_ns(timeout_s=cfg.pg_timeout_s, steps_lost=dead[1],
                                                 step_ns=r["step_mean_ns"], rendezvous_s=cfg.restart_s,
                                                 first_steps_extra_ns=compile_total)


FIELDS = ["world_size", "batch_size", "samples_per_s_per_card", "efficiency", "efficiency_min", "efficiency_max",
          "step_mean_ns", "step_median_ns", "step_p99_ns", "steps_sampled", "exposed_comm_ns", "comm_ns", "nominal_step_ns", "ideal_step_ns",
          *(f"loss_{c}_pts" for c in CAUSES), "algorithm", "num_buckets", "dead_rank_cost_ns"]


def summary_text(cfg: ScaleConfig, rows: list[dict], wall_s: float | None = None) -> str:
    from tabulate import tabulate

    batch = f"global batch {cfg.global_batch}" if cfg.global_batch else f"batch {cfg.batch_size} per card"
    ranged = len(_stretch_indices(cfg)) > 1
    lines = [f"# Scaling study: {cfg.model}, {batch}, {cfg.device_spec} on {cfg.topology}", "",
             f"- fabric: {'ideal (no contention)' if cfg.fabric == 'ideal' else 'the topology file’s (ECMP contention)'}",
             *(f"- {line}" for line in cfg.condition.describe().splitlines()),
             *([f"- waiting for the slowest rank: the mean of {cfg.steps} steps after a host sync (in a host-bound "
                "step it falls as that stretch grows: NOTE [where the efficiency goes])"]
               if cfg.condition.variability.active or cfg.condition.whatif.slow_cards else []),
             *([f"- {cfg.stretches} stretches of {cfg.steps} steps, each with its own draws: the rows are their mean, "
                "the range is the efficiency's across them (NOTE [one stretch is one sample])"]
               if ranged else
               ["- one stretch of draws: one sample, which moves from seed to seed where the host binds; "
                "`--stretches 8` gives the mean of eight and their range (NOTE [one stretch is one sample])"]
               if cfg.condition.variability.active else []),
             f"- DDP: bucket_cap_mb={cfg.bucket_cap_mb}, gradient_as_bucket_view={cfg.gradient_as_bucket_view}, "
             f"{cfg.mode} mode, {cfg.precision}", ""]
    table = [[r["world_size"], r["batch_size"], f"{r['samples_per_s_per_card']:,.1f}", f"{r['efficiency']:.3f}",
              *([f"{r['efficiency_min']:.3f}-{r['efficiency_max']:.3f}"] if ranged else []),
              f"{r['step_median_ns'] / 1e6:.2f}", f"{r['step_p99_ns'] / 1e6:.2f}",
              *(f"{r[f'loss_{c}_pts']:+.2f}" for c in CAUSES)] for r in rows]
    lines.append(tabulate(table, headers=["cards", "batch", "samples/s/card", "efficiency",
                                          *(["range over stretches"] if ranged else []), "median ms", "p99 ms",
                                          *(f"{_LABELS[c]} (pts)" for c in CAUSES)], tablefmt="github"))
    if cfg.condition.whatif.dead_rank:
        r, s = cfg.condition.whatif.dead_rank
        lines += ["", f"Rank {r} dying at step {s} (torchrun --max-restarts, {cfg.recipe_cache} recipe cache, "
                      f"timeout {cfg.pg_timeout_s:g} s): "
                  + ", ".join(f"{x['world_size']} cards {x['dead_rank_cost_ns'] / 1e9:,.1f} s" for x in rows)]
    lines += ["", "Simulated Gaudi time (planner), per card; loss points add up to 100 x (1 - efficiency) "
                  "(NOTE [where the efficiency goes] in launchers/study/scale.py)."]
    if wall_s is not None:
        lines.append(f"Planned in {wall_s:.1f} s wall-clock on this machine.")
    return "\n".join(lines) + "\n"


def _plot(path: Path, cfg: ScaleConfig, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.6))
    cards = [r["world_size"] for r in rows]
    eff = [100 * r["efficiency"] for r in rows]
    bottom = list(eff)
    colors = {"comm": "tab:blue", "batch": "tab:gray", "congestion": "tab:red", "waiting": "tab:orange"}
    for c in CAUSES:
        vals = [max(0.0, r[f"loss_{c}_pts"]) for r in rows]
        if any(vals):
            ax.fill_between(cards, bottom, [b + v for b, v in zip(bottom, vals)], step=None, alpha=0.45,
                            color=colors[c], label=_LABELS[c])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(cards, eff, marker="o", color="black", label="efficiency")
    if len(_stretch_indices(cfg)) > 1:
        lo = [100 * (r["efficiency"] - r["efficiency_min"]) for r in rows]
        hi = [100 * (r["efficiency_max"] - r["efficiency"]) for r in rows]
        ax.errorbar(cards, eff, yerr=[[max(0.0, x) for x in lo], [max(0.0, x) for x in hi]], fmt="none",
                    ecolor="black", capsize=3, label=f"range over {cfg.stretches} stretches")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cards, [str(c) for c in cards])
    ax.set_xlabel("cards (log scale)")
    ax.set_ylabel(f"% of per-card throughput at {cards[0]} cards")
    ax.set_ylim(min(eff + [100 * r["efficiency_min"] for r in rows] + [90.0]) - 2,
                max(bottom + [100 * r["efficiency_max"] for r in rows] + [100.0]) + 2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"{cfg.model} on {cfg.topology} ({cfg.device_spec}): scaling efficiency and where it goes")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def add_parser(sub) -> None:
    """Add the ``scale`` subcommand to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser("scale", help="per-card throughput and efficiency from few cards to many, and where it goes")
    add_model_args(s, batch_required=False)
    s.add_argument("--global-batch", type=count(1, 1 << 30, "samples"), default=None,
                   help="keep the global batch instead: the per-card batch is GLOBAL / cards")
    s.add_argument("--world-sizes", type=list_of(ranks, "--world-sizes"), required=True)
    s.add_argument("--topology", default=None, help="hls1, hls2, hls3, hls1h, dl1 or a topology file (default:"
                   " the box of the --device-spec cards, else hls2)")
    s.add_argument("--device-spec", default=None, help="gaudi, gaudi2, gaudi3 (default: the --topology's card, else"
                   " gaudi2)")
    s.add_argument("--mode", default=None, help="lazy, hpu_graphs, eager or compile (default: PT_HPU_LAZY_MODE)")
    s.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    s.add_argument("--bucket-cap-mb", type=mb, default=256.0)
    s.add_argument("--first-bucket-mb", type=first_mb, default=None)
    add_fabric_arg(s)
    s.add_argument("--steps", type=count(1, 10_000, "steps"), default=16,
                   help="sampled steps per world size: the stretch between host syncs (a device read such as"
                   " loss.item()) over which the waiting for the slowest rank is averaged; in a host-bound step it"
                   " falls as the stretch grows (NOTE [where the efficiency goes])")
    s.add_argument("--stretches", type=count(1, 1000, "stretches"), default=1,
                   help="stretches of --steps steps per world size, each with its own draws; the rows give their"
                   " mean and the efficiency's range across them (a steadier answer, at K x the planning time;"
                   " NOTE [one stretch is one sample])")
    s.add_argument("--pg-timeout", type=real(0.0, 1e7, "wall seconds", lo_open=True), default=1800.0,
                   help="process-group timeout in seconds, for --dead-rank's cost")
    s.add_argument("--recipe-cache", default="cold", choices=["cold", "warm"], help="after a --dead-rank restart")
    cluster.add_arguments(s, variability="on")
    s.add_argument("--out", required=True, metavar="DIR", help="study.csv, study.json, study.png, summary.md")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--jobs", type=_jobs, default=None, metavar="N|auto",
                   help="worker processes planning world sizes side by side (default auto: one per core when a "
                        f"world size reaches {PARALLEL_FROM_RANKS:,}, else 1); the rows do not depend on it")


def _jobs(text: str) -> int | None:
    return None if text.strip().lower() == "auto" else count(1, 1024, "jobs")(text)


def scale_main(args: argparse.Namespace) -> dict:
    """Run the ``scale`` command; ``{"rows", "paths", "config"}``.

    Raises:
        ValueError: bad input, before any work starts.
    """
    import time

    from hccl.sim.topology import device_and_topology

    t0 = time.perf_counter()
    device, topology = device_and_topology(args.device_spec, args.topology, device_from="--device-spec",
                                           topology_from="--topology")  # a box holds cards of one generation
    cfg = ScaleConfig(model=args.model, batch_size=args.batch_size, global_batch=args.global_batch,
                      seq_len=args.seq_len, image_size=args.image_size, world_sizes=args.world_sizes,
                      topology=topology, mode=args.mode or env_mode(), device_spec=device,
                      precision=args.precision, bucket_cap_mb=args.bucket_cap_mb, first_bucket_mb=args.first_bucket_mb,
                      condition=cluster.from_args(args), fabric=args.fabric, steps=args.steps,
                      stretches=args.stretches,
                      pg_timeout_s=args.pg_timeout, recipe_cache=args.recipe_cache)
    rows = run_scale(cfg, progress=not args.no_progress, jobs=args.jobs)
    for r in rows:
        r.pop("graphs", None)
    wall = time.perf_counter() - t0
    paths = write_files(args.out, rows=rows, fields=FIELDS, config=dataclasses.asdict(cfg), extra={"wall_s": wall},
                        plot=lambda path: _plot(path, cfg, rows), summary=("summary.md", summary_text(cfg, rows, wall)),
                        units={"*_ns": "simulated Gaudi ns per card", "loss_*_pts": "points of efficiency",
                               "samples_per_s_per_card": "simulated", "wall_s": "wall-clock seconds"})
    return {"rows": rows, "paths": paths, "config": cfg}


def print_result(result: dict) -> None:
    """Print the summary (the table) and where the files are."""
    print(summary_text(result["config"], result["rows"]))
    print("written: " + ", ".join(str(p) for p in result["paths"].values()))
