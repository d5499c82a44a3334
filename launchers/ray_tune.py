"""Sweeps on Ray Tune: a grid of a job's flags, one trial per setting, each trial a Ray Train run.

``launchers.ray --sweep KEY=V1,V2`` (repeatable: the product is swept) builds a ``Tuner``
over ``tune.grid_search`` of the settings. Each trial is :func:`sweep_trial`, a function
trainable that launches one ``TorchTrainer`` (:func:`launchers.ray_train.run_job`) with
``--key value`` appended to the target's arguments, as Ray documents for Train inside Tune,
and reports the job's table row. Trials run side by side where the cluster has the "HPU"
resources (``max_concurrent_trials``; Tune cannot see the workers' resources, as the
trainer asks for them after the trial starts).

The table (:func:`launchers.sweep.format_table`) has one row per setting, in sweep order:
the setting's values, ``status`` (``ok`` or ``failed: why``), ``startup_s`` and ``wall_s``
(wall-clock seconds, see :class:`launchers.ray_train.JobResult`) and the summary columns
(:func:`launchers.sweep.summary_columns`; ``models.train``'s ``final.sim_*_ns`` are
simulated Gaudi nanoseconds, not measured).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from launchers.ray_cluster import TRIAL_CPUS, LaunchError
from launchers.ray_train import JobFailedError, RayJobConfig, run_job
from launchers.sweep import summary_columns, sweep_argv

__all__ = ["run_sweep", "sweep_trial"]

_COLUMNS = "columns"


def sweep_trial(config: dict[str, Any], *, job: RayJobConfig, settings: Sequence[dict[str, str]],
                metrics: Sequence[str]) -> None:
    """Tune function trainable: runs the job of setting ``config["index"]``, reports its row.

    A failed job is a row with ``status="failed: ..."`` (the trial itself succeeds), so
    one bad setting does not hide the others' results.
    """
    from ray import tune

    setting = settings[config["index"]]
    target = dataclasses.replace(job.target, argv=sweep_argv(job.target.argv, setting))
    row: dict[str, Any] = {"status": "ok"}
    try:
        result = run_job(dataclasses.replace(job, target=target))
    except (JobFailedError, LaunchError) as exc:
        row["status"] = f"failed: {exc}"
    else:
        row.update(startup_s=result.startup_s, wall_s=result.wall_s)
        row.update(summary_columns(result.summary(), list(metrics)))
    tune.report({**row, _COLUMNS: ",".join(row)})  # a string: Tune's loggers take no lists


def run_sweep(ray: Any, job: RayJobConfig, settings: Sequence[dict[str, str]],
              metrics: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Runs one trial per setting on the connected cluster; returns the rows in sweep order.

    Raises:
        LaunchError: Ray Tune cannot be imported.
    """
    try:
        from ray import tune
    except ImportError as exc:
        raise LaunchError(f"--sweep needs Ray Tune ({exc}); install it with: pip install -e '.[ray]'") from exc
    hpus = int(ray.cluster_resources().get("HPU", 0))
    storage = job.storage_path or tempfile.mkdtemp(prefix="launchers-ray-sweep-")
    trainable = tune.with_resources(
        tune.with_parameters(sweep_trial, job=job, settings=list(settings), metrics=list(metrics)),
        {"CPU": TRIAL_CPUS},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"index": tune.grid_search(list(range(len(settings))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=max(1, hpus // job.num_workers)),
        run_config=tune.RunConfig(name="sweep", storage_path=storage, verbose=0),
    )
    try:
        grid = tuner.fit()
        rows: list[dict[str, Any]] = [dict(s) for s in settings]
        for result in grid:
            row = rows[result.config["index"]]
            if result.error is not None or not result.metrics:
                row["status"] = f"failed: {result.error}"
            else:
                row.update({k: result.metrics.get(k) for k in result.metrics[_COLUMNS].split(",")})
    finally:
        if job.storage_path is None:
            shutil.rmtree(storage, ignore_errors=True)
    return rows
