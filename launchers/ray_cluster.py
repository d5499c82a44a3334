"""Connecting a launcher to Ray: an embedded local cluster or a user's, and the job's settings.

Pure set-up, no training: :func:`import_ray` (with a message naming the extra to install),
:func:`check_address` (fail fast on an unreachable ``--address``), :func:`start_ray` (join,
or start a local Ray whose "HPU" resource counts the simulated Gaudis) and the settings
every Ray Train run of the launchers uses (:data:`RAY_TRAIN_DEFAULTS`).

NOTE [the "HPU" resource]
    Ray knows Gaudi as the accelerator resource "HPU" (``HPUAcceleratorManager``: it finds
    ``habana_frameworks``, which this project provides, and sets ``HABANA_VISIBLE_MODULES``
    per worker; each process still has one simulated card). Auto-detection counts
    ``habana_frameworks.torch.hpu.device_count()``, which answers as on a Gaudi server: 8
    cards, or those ``HABANA_VISIBLE_MODULES`` lists. So a cluster's nodes find their 8 "HPU"
    as Gaudi servers do; the embedded Ray declares ``resources={"HPU": num_workers}``, so a
    local run of N workers fits N whatever the count. Ray also adds
    ``accelerator_type:Intel-GAUDI2`` (the simulated card's name) to the node.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path
from typing import Any

__all__ = [
    "INSTALL_HINT",
    "RAY_TRAIN_DEFAULTS",
    "TRIAL_CPUS",
    "LaunchError",
    "check_address",
    "import_ray",
    "is_loopback",
    "prestart_train_coordinator",
    "quiet_worker_logs",
    "start_ray",
    "worker_runtime_env",
]

INSTALL_HINT = "pip install -e '.[ray]'"

TRIAL_CPUS = 0.05
"""Ray CPUs a Tune trial's driver function holds while its TorchTrainer runs (it only
waits; Tune refuses a trial with no resources at all)."""

RAY_TRAIN_DEFAULTS: dict[str, str] = {
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # else every print of a rank reaches the driver twice
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # default 2 s: finish and failure seen sooner
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # one actor fewer; jobs never restart here
    "RAY_TRAIN_METRICS_ENABLED": "0",  # Prometheus metrics need the dashboard, which is off
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0",
}
"""Ray Train settings (environment variables the driver passes on to the controller and
workers) the launchers use unless the user set them. Each removes work or noise on a small
machine; none changes what the ranks compute."""

_QUIET_LOGGERS = {
    # asks the state API (served by the dashboard) every second: see quiet_worker_logs
    "ray.train.v2._internal.execution.controller.placement_group_cleaner": logging.ERROR,
    # two INFO lines per rank per report ("Checkpoint successfully created", "Reporting ...");
    # the second logger is named by its file's path
    "ray.train.v2._internal.execution.storage": logging.WARNING,
    "{ray}/train/v2/_internal/execution/context.py": logging.WARNING,
}


class _AtLeast(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class LaunchError(RuntimeError):
    """The job could not be started (no Ray, unreachable cluster, too few resources)."""


def import_ray(*, loopback_only: bool = False) -> Any:
    """Imports Ray, or raises :class:`LaunchError` saying what to install.

    Also sets :data:`RAY_TRAIN_DEFAULTS` and ``RAY_DEDUP_LOGS=0`` (every rank's lines kept)
    where the user has not.

    Args:
        loopback_only: Make a Ray started by this process listen on 127.0.0.1 only.

    NOTE [embedded Ray on loopback]
        Ray binds its GCS, raylet and workers to the node's outbound address by default.
        An embedded single-machine Ray has no use for that, so ``loopback_only`` sets
        ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's switch for a local-only instance
        (every socket on 127.0.0.1). Both variables are read when Ray is imported.
    """
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    for key, value in RAY_TRAIN_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if loopback_only:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        import ray.train.torch  # noqa: F401 - ray[train]'s pandas/pyarrow missing fails here
    except ImportError as exc:
        raise LaunchError(
            f"launchers.ray needs Ray Train ({exc}); install it with: {INSTALL_HINT}"
        ) from exc
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


def is_loopback(address: str | None) -> bool:
    """True for no address (embedded Ray) and for a cluster on this machine's loopback."""
    if not address:
        return True
    host = address.split("://", 1)[-1].rpartition(":")[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def quiet_worker_logs() -> None:
    """Ray ``worker_process_setup_hook``: quiets Ray Train's per-report INFO lines and its
    placement-group cleaner.

    The cleaner asks the state API (served by the dashboard) every second whether the controller
    lives, and warns on every failed query; the embedded Ray has no dashboard (it costs
    start-up time on a small machine). The cleaner only matters when a driver dies
    without removing its placement group, which Ray also does when the job ends.
    """
    import ray

    root = os.path.dirname(ray.__file__)
    for name, level in _QUIET_LOGGERS.items():
        # a filter, not a level: Ray Train's dictConfig resets the levels of ray.train.*
        logging.getLogger(name.format(ray=root)).addFilter(_AtLeast(level))


def worker_runtime_env() -> dict[str, Any]:
    """The job's Ray runtime environment: workers import this checkout's packages.

    ``PYTHONPATH`` starts with the directory holding ``launchers/`` (then the driver's own
    ``PYTHONPATH``); on another node that path must hold the same checkout, or the package
    must be installed there (``pip install -e .``). The driver's :data:`RAY_TRAIN_DEFAULTS`
    go along, so a ``TorchTrainer`` started inside a Tune trial uses them too.
    """
    root = str(Path(__file__).resolve().parents[1])
    paths = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
    env_vars = {k: os.environ[k] for k in RAY_TRAIN_DEFAULTS if k in os.environ}  # Tune trials' trainers
    env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    return {
        "env_vars": env_vars,
        "worker_process_setup_hook": "launchers.ray_cluster.quiet_worker_logs",
    }


def start_ray(
    ray: Any, address: str | None, num_workers: int, cpus_per_worker: float, *, trials: int = 0
) -> bool:
    """Joins the cluster at ``address`` or starts an embedded local one.

    The embedded Ray gets ``num_workers`` "HPU" resources and enough (logical) CPUs for
    the workers plus ``trials`` Tune trial drivers of :data:`TRIAL_CPUS` each, and at least
    this machine's core count: Ray starts at most that many worker processes at once (the
    raylet's ``maximum_startup_concurrency`` is the node's logical CPUs, capped by the cores;
    ``ray/_private/services.py``), so with 2 workers of 0.5 CPU it started them one after the
    other (a 2-worker job on this 2-core machine: 45.8 s before, 39.5 s after, wall-clock).
    The "HPU" count still caps the job at ``num_workers`` ranks.

    Returns:
        True when this call started an embedded Ray (the caller shuts it down).

    Raises:
        LaunchError: ``address`` is unreachable or refuses this driver.
    """
    runtime_env = worker_runtime_env()
    if address:
        check_address(address)
        try:
            ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
        except (ConnectionError, RuntimeError) as exc:
            raise LaunchError(
                f"could not join the Ray cluster at {address}: {exc} (is this driver's Ray "
                "version the cluster's? A cluster with token authentication needs "
                "RAY_AUTH_MODE=token here and its token in RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            ) from None
        prestart_train_coordinator(ray)
        return False
    needed = math.ceil(num_workers * cpus_per_worker + trials * TRIAL_CPUS - 1e-9)
    num_cpus = max(os.cpu_count() or 1, needed)
    ray.init(
        num_cpus=num_cpus,
        resources={"HPU": num_workers},
        include_dashboard=False,
        log_to_driver=True,
        runtime_env=runtime_env,
    )
    prestart_train_coordinator(ray)
    return True


def prestart_train_coordinator(ray: Any) -> None:
    """Start Ray Train's resource coordinator now, so that a job's controller finds it running.

    Ray Train (v2) asks a detached ``AutoscalingCoordinator`` actor for the job's resources as
    its controller starts, and waits at most 5 s for the answer
    (``ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py``,
    ``AUTOSCALING_REQUESTS_GET_TIMEOUT_S``); the actor's process is only started then, and it
    imports ``ray.data`` (about 4 s here). On a fresh cluster the wait timed out: every
    launcher job on an embedded Ray lost 5 s and printed a traceback ("Failed to send resource
    request"). Created here (``get_if_exists``: one per cluster) as soon as Ray is up, it
    starts while the driver builds the trainer. A Ray without it (another version), or one this
    process has not joined (``ray.is_initialized()`` false: creating an actor would start one), is
    left as is.
    """
    if not getattr(ray, "is_initialized", lambda: False)():
        return
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    try:
        get_or_create_autoscaling_coordinator()
    except Exception as exc:  # noqa: BLE001 - Train creates it itself later; only the head start is lost
        logging.getLogger(__name__).debug("could not prestart Ray Train's AutoscalingCoordinator: %s", exc)
