"""Run a DDP job on a Ray cluster: one actor = one simulated Gaudi.

Usage::

    python -m launchers.ray --num-workers 4 --summary run.json -m models.train --epochs 2
    python -m launchers.ray --num-workers 4 --address HOST:6379 path/to/script.py ...
    python -m launchers.ray --num-workers 4 --sweep bucket_cap_mb=1,4,25 \\
        --sweep-table sweep.md -m models.train --epochs 1

The driver starts an embedded local Ray (``--num-workers`` "HPU" resources) unless
``--address`` names a cluster, reserves one bundle ``{"CPU": c, "HPU": 1}`` per rank in a
placement group, starts one actor per bundle, and rendezvouses them: rank 0's actor picks
``MASTER_ADDR``/``MASTER_PORT`` (loopback when every actor is on one node) and the driver
hands them to all. Each actor then runs the target with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set: a known Python entry point (``-m models.train``
calls ``models.train.main(argv)``; ``--entry-point`` names others) has its returned dict
gathered; any other target runs as ``__main__`` via runpy. The driver prints the per-rank
results and writes ``--summary``: rank 0's summary dict plus a ``per_rank`` list.

A sweep (``--sweep KEY=V1,V2``, repeatable: the product is swept) runs one such job per
combination, appending ``--key V`` to the target's arguments, and writes one table.

NOTE [failure]
    The job fails when any rank raises, exits non-zero or its actor dies, or when
    ``--timeout`` passes. After the first failure the driver waits ``FAILURE_GRACE_S`` for
    others, then reports dead actors first (the usual root cause: a peer blocked in a
    collective fails only because of it), every failed rank by number, kills all actors,
    removes the placement group and (for the embedded Ray) shuts Ray down.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launchers.env import (
    LOOPBACK,
    configure_logging,
    find_free_port,
    local_ranks,
    one_thread_per_rank,
    rendezvous_host,
)
from launchers.sweep import format_table, parse_sweep, summary_columns, sweep_argv
from launchers.target import (
    Target,
    add_target_arguments,
    default_entry_point,
    exit_code,
    load_entry_point,
    target_from_args,
)

__all__ = [
    "FAILURE_GRACE_S",
    "LOG_DRAIN_S",
    "GaudiWorker",
    "JobFailedError",
    "LaunchError",
    "RayJobConfig",
    "JobResult",
    "build_parser",
    "check_address",
    "import_ray",
    "main",
    "run_job",
    "start_ray",
]

logger = logging.getLogger("launchers.ray")

INSTALL_HINT = "pip install -e '.[ray]'"
FAILURE_GRACE_S = 3.0
"""Seconds the driver keeps collecting after the first failure, to find the root cause."""
LOG_DRAIN_S = 0.5
"""Seconds left to Ray's log monitor before actors are killed.

NOTE [log drain]: actors' stdout reaches the driver through Ray's log monitor, which polls
the workers' log files about every 0.1 s; killing the actors and shutting Ray down right
after the last result loses the ranks' final lines (e.g. the last epoch's metrics)."""


class LaunchError(RuntimeError):
    """The job could not be started (no Ray, unreachable cluster, too few resources)."""


class JobFailedError(RuntimeError):
    """A rank failed, its actor died, or the job passed its timeout.

    Attributes:
        failed_ranks: Ranks named in the message, root causes first.
    """

    def __init__(self, message: str, failed_ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)


@dataclass(kw_only=True, slots=True)
class RayJobConfig:
    """One Ray job: how many simulated Gaudis, where, and what each runs."""

    target: Target
    """What every rank runs."""
    num_workers: int
    """Ranks (actors, simulated Gaudis); at least 1."""
    cpus_per_worker: float = 0.5
    """Ray CPUs reserved per actor (fractional is fine; this is scheduling, not a cap)."""
    entry_point: str | None = None
    """``module:function`` called as ``function(argv) -> dict`` instead of runpy."""
    timeout_s: float = 900.0
    """Wall seconds from actor start until every rank must have finished."""
    placement_timeout_s: float = 60.0
    """Wall seconds to wait for the placement group (the cluster's free HPU/CPU)."""

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num-workers must be at least 1, got {self.num_workers}")
        if not self.cpus_per_worker > 0:
            raise ValueError(f"--cpus-per-worker must be positive, got {self.cpus_per_worker}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be positive, got {self.timeout_s}")


class GaudiWorker:
    """The actor hosting one rank (one simulated Gaudi). Wrapped with ``ray.remote``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def host_info(self) -> dict[str, Any]:
        """Where this actor runs: Ray node id and address, host name, pid."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    def pick_port(self, host: str) -> int:
        """A free TCP port on this actor's node (bound to ``host``; ``""`` = any)."""
        return find_free_port(host)

    def run(
        self, target: Target, entry_point: str | None, env: dict[str, str]
    ) -> dict[str, Any]:
        """Runs the rank's target with ``env`` exported; returns this rank's record.

        Raises:
            RuntimeError: The target exited with a non-zero code.
            Exception: Whatever the target raised.
        """
        os.environ.update(env)
        one_thread_per_rank(int(env["LOCAL_WORLD_SIZE"]))
        start = time.perf_counter()
        result: Any = None
        try:
            if entry_point:
                result = load_entry_point(entry_point)(list(target.argv))
            else:
                target.run_main()
        except SystemExit as exc:  # would end the actor's process, hiding the cause
            if exit_code(exc) != 0:
                raise RuntimeError(
                    f"rank {self.rank}: {target.describe()} exited with code {exit_code(exc)}"
                ) from None
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "wall_s": time.perf_counter() - start,
            "result": result,
        }


def import_ray(*, loopback_only: bool = False) -> Any:
    """Imports Ray, or raises :class:`LaunchError` saying what to install.

    Args:
        loopback_only: Make a Ray started by this process listen on 127.0.0.1 only.

    NOTE [embedded Ray on loopback]
        Ray binds its GCS, raylet and workers to the node's outbound address by default.
        An embedded single-machine Ray has no use for that, so ``loopback_only`` sets
        ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's switch for a local-only instance
        (every socket on 127.0.0.1). Both variables are read when Ray is imported.
    """
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # keep every rank's lines
    if loopback_only:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as exc:
        raise LaunchError(f"launchers.ray needs Ray ({exc}); install it with: {INSTALL_HINT}") from exc
    return ray


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Fails fast when a cluster address does not accept TCP connections.

    ``auto``/``local`` are left to Ray. Accepts ``HOST:PORT`` and ``ray://HOST:PORT``.

    Raises:
        LaunchError: The address is malformed or nothing listens there.
    """
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LaunchError(f"--address {address!r} is not of the form HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(f"cannot reach a Ray cluster at {address}: {exc}") from None


def _is_loopback(address: str | None) -> bool:
    """True for no address (embedded Ray) and for a cluster on this machine's loopback."""
    if not address:
        return True
    host = address.split("://", 1)[-1].rpartition(":")[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def start_ray(ray: Any, address: str | None, num_workers: int, cpus_per_worker: float) -> bool:
    """Joins the cluster at ``address`` or starts an embedded local one.

    The embedded Ray gets ``num_workers`` "HPU" resources and enough CPUs for the actors.

    Returns:
        True when this call started an embedded Ray (the caller shuts it down).
    """
    if address:
        check_address(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError) as exc:
            raise LaunchError(
                f"could not join the Ray cluster at {address}: {exc} (is this driver's Ray "
                "version and authentication token, RAY_AUTH_TOKEN or ~/.ray/auth_token, the "
                "cluster's?)"
            ) from None
        return False
    num_cpus = max(1, math.ceil(num_workers * cpus_per_worker))
    ray.init(
        num_cpus=num_cpus,
        resources={"HPU": num_workers},
        include_dashboard=False,
        log_to_driver=True,
    )
    return True


@dataclass(kw_only=True, slots=True)
class JobResult:
    """What the driver gathered from one successful job."""

    per_rank: list[dict[str, Any]]
    """One record per rank (see :meth:`GaudiWorker.run`), in rank order."""
    startup_s: float
    """Wall seconds from the start of the job to the start of the targets (actors placed,
    started and rendezvoused)."""
    wall_s: float
    """Wall seconds of the whole job, start-up included."""
    env: list[dict[str, str]] = field(default_factory=list)
    """The torch variables each rank ran with."""

    def summary(self) -> dict[str, Any]:
        """Rank 0's summary dict plus ``per_rank`` (torchrun rank 0's JSON layout)."""
        rank0 = self.per_rank[0].get("result")
        summary: dict[str, Any] = dict(rank0) if isinstance(rank0, dict) else {}
        summary["per_rank"] = self.per_rank
        return summary


def _describe_error(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # RayTaskError carries the original exception
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"


def _collect(ray: Any, refs: dict[Any, int], timeout_s: float) -> dict[int, dict[str, Any]]:
    """Waits for every rank; raises :class:`JobFailedError` on the first failure."""
    from ray.exceptions import RayActorError

    results: dict[int, dict[str, Any]] = {}
    died: dict[int, str] = {}
    failed: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    grace_end: float | None = None
    pending = dict(refs)
    while pending:
        now = time.monotonic()
        end = deadline if grace_end is None else min(deadline, grace_end)
        if now >= end:
            break
        done, _ = ray.wait(list(pending), num_returns=1, timeout=end - now)
        for ref in done:
            rank = pending.pop(ref)
            try:
                results[rank] = ray.get(ref)
            except RayActorError as exc:
                died[rank] = _describe_error(exc)
            except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the target's
                failed[rank] = _describe_error(exc)
                if len(failed) == 1:  # the remote traceback, once
                    logger.error("rank %d raised:\n%s", rank, exc)
            if (died or failed) and grace_end is None:
                grace_end = time.monotonic() + FAILURE_GRACE_S
    if not died and not failed and not pending:
        return results
    lines = [f"rank {r} died (its actor process exited): {m}" for r, m in sorted(died.items())]
    lines += [f"rank {r} failed: {m}" for r, m in sorted(failed.items())]
    if not died and not failed:
        lines.append(
            f"ranks {sorted(pending.values())} did not finish within --timeout {timeout_s:g} s"
        )
    ranks = [*sorted(died), *sorted(failed)] or sorted(pending.values())
    raise JobFailedError("; ".join(lines), ranks)


def run_job(ray: Any, config: RayJobConfig) -> JobResult:
    """Runs one job on the connected Ray cluster; always removes its actors.

    Raises:
        LaunchError: The placement group could not be reserved in time.
        JobFailedError: A rank failed, died or timed out (see ``NOTE [failure]``).
    """
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    t0 = time.perf_counter()
    n, cpus = config.num_workers, config.cpus_per_worker
    bundle = {"CPU": cpus, "HPU": 1}
    pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([pg.ready()], timeout=config.placement_timeout_s)
        if not ready:
            raise LaunchError(
                f"cannot place {n} workers of {bundle} within {config.placement_timeout_s:g} s; "
                f"the cluster has {ray.available_resources()} free (each node needs an "
                f'"HPU" resource, e.g. `ray start --resources \'{{"HPU": 8}}\'`)'
            )
        worker_cls = ray.remote(GaudiWorker)
        for rank in range(n):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=rank
            )
            actors.append(
                worker_cls.options(
                    num_cpus=cpus,
                    resources={"HPU": 1},
                    scheduling_strategy=strategy,
                    max_restarts=0,
                    name=None,
                ).remote(rank)
            )
        infos = _collect(ray, {a.host_info.remote(): r for r, a in enumerate(actors)}, 120.0)
        hosts = [infos[r]["node_id"] for r in range(n)]
        master_addr = rendezvous_host(hosts, infos[0]["node_ip"])
        master_port = ray.get(
            actors[0].pick_port.remote(LOOPBACK if master_addr == LOOPBACK else ""),
            timeout=60,
        )
        envs = []
        for rank, (local_rank, local_size) in enumerate(local_ranks(hosts)):
            envs.append(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(n),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(local_size),
                    "MASTER_ADDR": master_addr,
                    "MASTER_PORT": str(master_port),
                }
            )
            logger.info(
                "rank %d of %d is pid %d on node %s (%s), local rank %d of %d",
                rank,
                n,
                infos[rank]["pid"],
                hosts[rank][:12],
                infos[rank]["node_ip"],
                local_rank,
                local_size,
            )
        logger.info("rendezvous %s:%d; running %s", master_addr, master_port, config.target.describe())
        startup_s = time.perf_counter() - t0
        refs = {
            actor.run.remote(config.target, config.entry_point, envs[rank]): rank
            for rank, actor in enumerate(actors)
        }
        results = _collect(ray, refs, config.timeout_s)
        per_rank = []
        for rank in range(n):
            record = dict(results[rank])
            record["node_ip"] = infos[rank]["node_ip"]
            record["local_rank"] = int(envs[rank]["LOCAL_RANK"])
            per_rank.append(record)
        return JobResult(
            per_rank=per_rank,
            startup_s=startup_s,
            wall_s=time.perf_counter() - t0,
            env=envs,
        )
    finally:
        if actors:
            time.sleep(LOG_DRAIN_S)
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001
            pass


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line (``[options] [-m] TARGET [ARGS...]``)."""
    p = argparse.ArgumentParser(
        prog="python -m launchers.ray",
        description="Run a torchrun-style DDP job with one Ray actor per simulated Gaudi.",
    )
    p.add_argument("--num-workers", type=int, required=True, help="ranks (simulated Gaudis)")
    p.add_argument("--address", help="join this Ray cluster (default: embedded local Ray)")
    p.add_argument("--cpus-per-worker", type=float, default=0.5, help="Ray CPUs per actor")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole job")
    p.add_argument("--placement-timeout", type=float, default=60.0,
                   help="seconds to wait for free HPU/CPU resources")
    p.add_argument("--summary", help="write rank 0's summary plus per_rank here (JSON)")
    p.add_argument("--entry-point",
                   help="call MODULE:FUNCTION(argv) -> dict in each actor instead of "
                   "running the target as __main__ (default for -m models.train: "
                   "models.train:main; '' forces runpy)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="run one job per value, appending --KEY VALUE to the target's "
                   "arguments; repeat to sweep the product")
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
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")


def _run_sweep(ray: Any, base: RayJobConfig, args: argparse.Namespace) -> int:
    metrics = [m for m in (args.sweep_metrics or "").split(",") if m]
    rows, failures = [], 0
    for setting in parse_sweep(args.sweep):
        target = dataclasses.replace(base.target, argv=sweep_argv(base.target.argv, setting))
        config = dataclasses.replace(base, target=target)
        logger.info("sweep: %s", setting)
        row: dict[str, Any] = dict(setting)
        try:
            result = run_job(ray, config)
        except JobFailedError as exc:
            failures += 1
            row.update(status=f"failed: {exc}")
            logger.error("sweep %s failed: %s", setting, exc)
        else:
            row.update(status="ok", startup_s=result.startup_s, wall_s=result.wall_s)
            row.update(summary_columns(result.summary(), metrics))
        rows.append(row)
    table = format_table(rows, "markdown")
    print(table, end="")
    if args.sweep_table:
        fmt = "csv" if args.sweep_table.endswith(".csv") else "markdown"
        with open(args.sweep_table, "w") as f:
            f.write(format_table(rows, fmt))
        logger.info("wrote sweep table %s", args.sweep_table)
    if args.summary:
        _write_json(args.summary, {"sweep": rows})
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m launchers.ray``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    target = target_from_args(args)
    entry_point = args.entry_point if args.entry_point is not None else default_entry_point(target)
    try:
        config = RayJobConfig(
            target=target,
            num_workers=args.num_workers,
            cpus_per_worker=args.cpus_per_worker,
            entry_point=entry_point or None,
            timeout_s=args.timeout,
            placement_timeout_s=args.placement_timeout,
        )
        parse_sweep(args.sweep)  # validate before starting anything
    except ValueError as exc:
        parser.error(str(exc))
    try:
        ray = import_ray(loopback_only=_is_loopback(args.address))
        started = start_ray(ray, args.address, config.num_workers, config.cpus_per_worker)
    except LaunchError as exc:
        logger.error("%s", exc)
        return 2
    try:
        if args.sweep:
            return _run_sweep(ray, config, args)
        result = run_job(ray, config)
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
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
