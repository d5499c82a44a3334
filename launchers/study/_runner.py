"""The runner every study shares: points -> planner -> rows -> CSV / JSON / PNG / summary.

A study module says what its points are, how one point is planned (a module-level function
of ``(trace, point)``, so it can run as a Ray task) and how its rows read as a plot and a
summary; this module traces the steps, runs the points (locally with a progress bar, or on
Ray) and writes the files.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

__all__ = ["DEFAULT_CAP_MB", "POINT_TIMEOUT_S", "trace_key", "trace_steps", "run_points", "write_files",
           "save_figure", "study_topology"]

DEFAULT_CAP_MB = 25.0
"""DDP's default ``bucket_cap_mb``."""


def trace_key(mode: str, device_spec: str, bucket_cap_mb: float | None, first_bucket_mb: float | None) -> tuple:
    """Which traced step a point is planned from: one per (mode, device); in compile mode one
    per DDP cap too, because DDPOptimizer breaks the compiled graph at DDP's bucket sizes
    (:func:`hpu_runtime.tools.tracing.trace_step`, ``ddp_bucket_cap_mb``)."""
    if mode == "compile":
        return mode, device_spec, DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb, first_bucket_mb
    return mode, device_spec


def trace_steps(model: str, keys: Sequence[tuple], *, seq_len: int | None = None,
                image_size: int | None = None, precision: str = "bf16", optimizer: str = "sgd",
                **config) -> dict:
    """One traced training step per key in ``keys`` (no data; each once): ``(batch, mode,
    device)``, or ``(batch, "compile", device, bucket_cap_mb, first_bucket_mb)`` for a step
    compiled as under DDP with that cap (DDPOptimizer breaks the graph at DDP's buckets:
    :func:`hpu_runtime.tools.tracing.trace_step`'s ``ddp_bucket_cap_mb``); ``optimizer``: one of
    :data:`hpu_runtime.tools.tracing.OPTIMIZERS`; ``config``: fields of
    the model's config (e.g. ``hidden``, ``layers``).

    Raises:
        ValueError: an unknown model, config field or device, or a cap DDPOptimizer refuses.
    """
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    kwargs = {k: v for k, v in (("seq_len", seq_len), ("image_size", image_size)) if v is not None} | config
    factory = resolve_factory(model, **kwargs)
    out = {}
    for key in keys:
        if key not in out:
            batch, mode, dev, *ddp = key
            out[key] = trace_step(factory, batch, spec=get_device_spec(dev), mode=mode, autocast=precision == "bf16",
                                  optimizer=optimizer, ddp_bucket_cap_mb=ddp[0] if ddp else None,
                                  ddp_first_bucket_mb=ddp[1] if ddp else None)
    return out


def study_topology(name: str, world_size: int, fabric: str = "topology"):
    """Topology ``name`` holding ``world_size`` ranks, on an ideal fabric if ``fabric == "ideal"``."""
    from hccl.sim.fabric import ideal
    from hccl.sim.topology import load_topology

    topo = load_topology(name, world_size=world_size)
    return ideal(topo) if fabric == "ideal" else topo


POINT_TIMEOUT_S = 600.0
"""Wall seconds a study waits for its next point to be planned (locally or on Ray) before it
gives up with TimeoutError."""


def run_points(points: Sequence, trace_of: Callable[[object], Hashable], traces: dict,
               plan: Callable[[object, object], dict], *, progress: bool = True, desc: str = "planning",
               use_ray: bool = False, ray_address: str | None = None, jobs: int = 1,
               cost: Callable[[object], float] | None = None) -> list[dict]:
    """``plan(traces[trace_of(point)], point)`` for every point, in order; the rows.

    Args:
        trace_of: a point's key in ``traces``.
        plan: a module-level function (it is pickled for Ray and for worker processes)
            returning one row.
        progress: a progress bar (tqdm) on stderr.
        use_ray: plan the points as Ray tasks, on ``ray_address`` or an embedded cluster.
        jobs: without Ray, plan in this many worker processes (spawned; each gets the traces
            once) when there is more than one point; 1 plans in this process. The rows are
            the same either way: the planner is deterministic.
        cost: a point's relative planning cost; the costliest points start first.

    Raises:
        TimeoutError: no point was planned for :data:`POINT_TIMEOUT_S` wall seconds.
    """
    from tqdm import tqdm

    if not use_ray:
        if jobs > 1 and len(points) > 1:
            return _run_in_processes(points, trace_of, traces, plan, jobs=jobs, cost=cost,
                                     bar=tqdm(total=len(points), desc=desc, unit="point", disable=not progress,
                                              file=sys.stderr))
        return [plan(traces[trace_of(p)], p)
                for p in tqdm(points, desc=desc, unit="point", disable=not progress, file=sys.stderr)]
    import ray

    from hpu_runtime.tools.tracing import portable

    started = not ray.is_initialized()
    if started:
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(_call)
        refs = {key: ray.put(portable(tr)) for key, tr in traces.items()}
        pending = [remote.remote(plan, refs[trace_of(p)], p) for p in points]
        order = {ref: i for i, ref in enumerate(pending)}
        rows: list = [None] * len(pending)
        with tqdm(total=len(pending), desc=f"{desc} on Ray", unit="point", disable=not progress,
                  file=sys.stderr) as bar:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POINT_TIMEOUT_S)
                if not done:
                    raise TimeoutError(f"Ray study tasks made no progress for {POINT_TIMEOUT_S:.0f} s")
                for ref in done:
                    rows[order[ref]] = ray.get(ref)
                    bar.update(1)
        return rows
    finally:
        if started:
            ray.shutdown()


def _call(plan, trace, point) -> dict:
    """A Ray task: ``plan(trace, point)`` (``ray.remote`` wants a plain function)."""
    return plan(trace, point)


_worker_traces: dict = {}


def _set_traces(traces: dict) -> None:
    """A worker process's initializer: the traces every point of the study is planned from."""
    _worker_traces.clear()
    _worker_traces.update(traces)


def _plan_in_worker(plan, key, point) -> dict:
    return plan(_worker_traces[key], point)


def _portable(obj):
    """``obj`` ready to ship to a worker process: a traced step (also inside dicts) as
    :func:`hpu_runtime.tools.tracing.portable` makes it; anything else as it is."""
    from hpu_runtime.tools.tracing import StepTrace, portable

    if isinstance(obj, dict):
        return {k: _portable(v) for k, v in obj.items()}
    return portable(obj) if isinstance(obj, StepTrace) else obj


def _run_in_processes(points: Sequence, trace_of, traces: dict, plan, *, jobs: int, cost, bar) -> list[dict]:
    """:func:`run_points` on ``jobs`` spawned worker processes (spawned, not forked: the parent
    has run torch's thread pools while tracing)."""
    import concurrent.futures as cf
    import multiprocessing

    order = sorted(range(len(points)), key=lambda i: -cost(points[i])) if cost else list(range(len(points)))
    rows: list = [None] * len(points)
    shipped = _portable(traces)
    pool = cf.ProcessPoolExecutor(max_workers=min(jobs, len(points)), mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_set_traces, initargs=(shipped,))
    try:
        with bar:
            futures = {pool.submit(_plan_in_worker, plan, trace_of(points[i]), points[i]): i for i in order}
            pending = set(futures)
            while pending:
                done, pending = cf.wait(pending, timeout=POINT_TIMEOUT_S, return_when=cf.FIRST_COMPLETED)
                if not done:
                    raise TimeoutError(f"no study point was planned for {POINT_TIMEOUT_S:.0f} s")
                for f in done:
                    rows[futures[f]] = f.result()  # a worker's error is raised here
                    bar.update(1)
    except BaseException:
        # a stuck or failing point must not keep the study waiting on the others: end the workers
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return rows


def write_files(out_dir: str | Path, *, rows: list[dict], fields: Sequence[str], config: dict, extra: dict,
                plot: Callable[[Path], None], summary: tuple[str, str], units: dict) -> dict[str, Path]:
    """``study.csv`` (``fields``; lists space-separated), ``study.json`` (``config``, ``rows``,
    ``units`` and ``extra``'s keys), ``study.png`` (``plot(path)``) and the summary
    (``(file name, markdown)``) in ``out_dir``; returns the paths by kind."""
    from hpu_runtime.files import atomic_open, atomic_write

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "study.csv", "json": out / "study.json", "png": out / "study.png",
             "md": out / summary[0]}
    # NOTE [atomic files] (hpu_runtime/files.py): a kill leaves each output old or new, never torn
    with atomic_open(paths["csv"], newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else v for k, v in r.items()})
    with atomic_open(paths["json"]) as f:
        json.dump({"config": config, "rows": rows, **extra, "units": units}, f, indent=1, default=str)
    plot(paths["png"])
    atomic_write(paths["md"], summary[1])
    return paths


def save_figure(fig, path: Path) -> None:
    """Write a matplotlib figure as PNG, whole or not at all (NOTE [atomic files])."""
    from hpu_runtime.files import atomic_open

    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
