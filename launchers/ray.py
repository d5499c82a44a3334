"""Run a DDP job on a Ray cluster with Ray Train: one worker = one simulated Gaudi.

Usage::

    python -m launchers.ray --num-workers 4 --summary run.json -m models.train --epochs 2
    python -m launchers.ray --num-workers 4 --address HOST:6379 path/to/script.py ...
    python -m launchers.ray --num-workers 4 --sweep bucket_cap_mb=1,4,25 \\
        --sweep-table sweep.md -m models.train --epochs 1

The driver starts an embedded local Ray (``--num-workers`` "HPU" resources, NOTE [the "HPU"
resource] in :mod:`launchers.ray_cluster`) unless ``--address`` names a cluster, then runs
the job as a Ray Train ``TorchTrainer`` with ``resources_per_worker={"HPU": 1, "CPU": c}``
(:mod:`launchers.ray_train`). Each worker gets torchrun's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and runs the target
in the driver's working directory: a known Python entry point (``-m models.train`` calls
``models.train.main(argv)``; ``--entry-point`` names others) has its returned dict
gathered; any other target runs as ``__main__`` via runpy and creates its own process
group, as under torchrun. The driver prints the per-rank results and writes ``--summary``:
rank 0's summary dict plus a ``per_rank`` list.

A sweep (``--sweep KEY=V1,V2``) is a Ray Tune run, one trial (one ``TorchTrainer``) per
combination, appending ``--key V`` to the target's arguments (:mod:`launchers.ray_tune`),
and writes one table. Exit status: 0 ok, 1 a job (or a sweep point) failed, 2 the job could
not start (usage, no Ray, unreachable cluster, no resources).

NOTE [start-up cost of Ray Train]
    Measured on this project's 2-core machine, same command (``--num-workers 2 tiny_ddp.py``),
    wall-clock, runs interleaved: the former hand-made launcher (one plain actor per rank)
    took 15-16 s in all (1 s from actors requested to targets running), Ray Train takes
    25-35 s (Ray ready 6.5-7.5 s, ``fit()`` to targets running 12-19 s) at a load average of
    4-8; with other jobs keeping it at 15-22, 30-45 s against 74-91 s. A run starts a
    controller, a placement-group cleaner, a synchronization actor, a dataset manager and an
    autoscaling coordinator beside the workers, each a Python process importing Ray Train,
    and each worker imports ``ray.train.torch`` (torch and ``habana_frameworks``) before the
    target runs; on two cores these queue. The cost is per job, not per step, so nothing of
    the hand-made orchestration was kept for it; for many tiny jobs on a small machine
    ``torchrun`` is the cheaper launcher (the same job: 5.5 s at a load average of 9).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from hpu_runtime.cli_args import count, real
from launchers.env import configure_logging
from launchers.ray_cluster import LaunchError, check_address, import_ray, is_loopback, start_ray
from launchers.ray_train import JobFailedError, JobResult, RayJobConfig, run_job
from launchers.sweep import format_table, parse_sweep, summary_columns
from launchers.target import add_target_arguments, default_entry_point, target_from_args

__all__ = [  # the job API lives in launchers.ray_train / ray_cluster; re-exported here
    "LOG_DRAIN_S",
    "JobFailedError",
    "JobResult",
    "LaunchError",
    "RayJobConfig",
    "build_parser",
    "check_address",
    "import_ray",
    "main",
    "run_job",
    "start_ray",
]

logger = logging.getLogger("launchers.ray")

LOG_DRAIN_S = 0.5
"""Wall seconds left to Ray's log monitor before an embedded Ray shuts down.

NOTE [log drain]: workers' stdout reaches the driver through Ray's log monitor, which polls
the workers' log files about every 0.1 s; shutting Ray down right after the last result
loses the ranks' final lines (e.g. the last epoch's metrics)."""


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line (``[options] [-m] TARGET [ARGS...]``)."""
    p = argparse.ArgumentParser(
        prog="python -m launchers.ray",
        description="Run a torchrun-style DDP job on Ray Train, one worker per simulated Gaudi.",
    )
    p.add_argument("--num-workers", type=count(1, 1 << 16, "ranks"), required=True, help="ranks (simulated Gaudis)")
    p.add_argument("--address", help="join this Ray cluster (default: embedded local Ray)")
    p.add_argument("--cpus-per-worker", type=real(0.0, 1024.0, "CPUs", lo_open=True), default=0.5,
                   help="Ray CPUs per worker")
    p.add_argument("--timeout", type=real(1.0, 1e7, "wall seconds"), default=900.0,
                   help="wall seconds for the whole job")
    p.add_argument("--placement-timeout", type=real(1.0, 1e7, "wall seconds"), default=60.0,
                   help="wall seconds to wait for free HPU/CPU resources")
    p.add_argument("--storage-path",
                   help="Ray Train/Tune storage (shared on a multi-node cluster; default: a "
                   "temporary directory, removed after the run)")
    p.add_argument("--summary", help="write rank 0's summary plus per_rank here (JSON)")
    p.add_argument("--entry-point",
                   help="call MODULE:FUNCTION(argv) -> dict in each worker instead of "
                   "running the target as __main__ (default for -m models.train: "
                   "models.train:main; '' forces runpy)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="run one job per value (a Ray Tune trial), appending --KEY VALUE to "
                   "the target's arguments; repeat to sweep the product")
    p.add_argument("--sweep-table", help="write the sweep table here (.csv, else markdown)")
    p.add_argument("--sweep-metrics",
                   help="comma-separated dotted paths into rank 0's summary to tabulate "
                   "(default: its top-level numbers)")
    p.add_argument("--log-level", default="INFO", help="launcher log level")
    add_target_arguments(p)
    return p


def _print_job(result: JobResult) -> None:
    print(f"launchers.ray: job finished: start-up {result.startup_s:.2f} s, "
          f"wall {result.wall_s:.2f} s (wall-clock, not simulated)")
    for record in result.per_rank:
        value = record.get("result")
        scalars = summary_columns(value, None) if isinstance(value, dict) else {}
        shown = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in list(scalars.items())[:8])
        print(f"  rank {record['rank']} pid {record['pid']} on {record['hostname']}: "
              f"{record['wall_s']:.2f} s{'; ' + shown if shown else ''}")


def _write_json(path: str, data: Any) -> None:
    from hpu_runtime.files import atomic_write

    atomic_write(path, json.dumps(data, indent=1, default=str) + "\n")  # NOTE [atomic files]


def _sweep(ray: Any, job: RayJobConfig, args: argparse.Namespace) -> int:
    from launchers.ray_tune import run_sweep

    metrics = [m for m in (args.sweep_metrics or "").split(",") if m]
    rows = run_sweep(ray, job, parse_sweep(args.sweep), metrics)
    for row in rows:
        if row.get("status") != "ok":
            logger.error("sweep point %s", row)
    print(format_table(rows, "markdown"), end="")
    if args.sweep_table:
        fmt = "csv" if args.sweep_table.endswith(".csv") else "markdown"
        from hpu_runtime.files import atomic_write

        atomic_write(args.sweep_table, format_table(rows, fmt))
        logger.info("wrote sweep table %s", args.sweep_table)
    if args.summary:
        _write_json(args.summary, {"sweep": rows})
    return 0 if all(row.get("status") == "ok" for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m launchers.ray``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    target = target_from_args(args)
    entry_point = args.entry_point if args.entry_point is not None else default_entry_point(target)
    try:
        job = RayJobConfig(
            target=target,
            num_workers=args.num_workers,
            cpus_per_worker=args.cpus_per_worker,
            entry_point=entry_point or None,
            timeout_s=args.timeout,
            placement_timeout_s=args.placement_timeout,
            storage_path=args.storage_path,
        )
        parse_sweep(args.sweep)  # validate before starting anything
    except ValueError as exc:
        parser.error(str(exc))
    t0 = time.perf_counter()
    try:
        ray = import_ray(loopback_only=is_loopback(args.address))
        started = start_ray(ray, args.address, job.num_workers, job.cpus_per_worker,
                            trials=1 if args.sweep else 0)
    except LaunchError as exc:
        logger.error("%s", exc)
        return 2
    logger.info("Ray ready in %.2f s (wall-clock); running %s on %d workers",
                time.perf_counter() - t0, target.describe(), job.num_workers)
    try:
        if args.sweep:
            return _sweep(ray, job, args)
        result = run_job(job)
        _print_job(result)
        if args.summary:
            _write_json(args.summary, result.summary())
            logger.info("wrote %s", args.summary)
        return 0
    except LaunchError as exc:
        logger.error("%s", exc)
        return 2
    except JobFailedError as exc:
        logger.error("job failed: %s", exc)
        return 1
    finally:
        if started:
            time.sleep(LOG_DRAIN_S)
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
