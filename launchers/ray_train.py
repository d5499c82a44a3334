"""Jobs on Ray Train: a ``TorchTrainer`` whose every worker hosts one simulated Gaudi.

:func:`run_job` runs a launcher target (``-m models.train ...`` or a script) on
``ScalingConfig(num_workers=N, resources_per_worker={"HPU": 1, "CPU": c})``: Ray Train
places the workers (a placement group), starts them, assigns world/local/node ranks,
watches their health, tears the group down and stores what they report. Each worker runs
:func:`rank_main`, which runs the target as ``torchrun`` would and reports its record as a
checkpoint file (``rank<R>.json``) that the driver reads back. :func:`gaudi_trainer` is the
other way in: a Ray-native training loop, set up as Ray documents for Gaudi.

NOTE [who initialises the process group]
    ``TorchConfig(backend="hccl")`` makes Ray Train call ``init_process_group("hccl")``
    before the training loop starts; :func:`gaudi_trainer` uses it, for loops written for
    Ray (``ray.train.torch.get_device()`` is then ``hpu``, ``prepare_model`` wraps DDP).
    A launcher target is a torchrun-style program that creates its own group: with Ray's
    group already there, ``tiny_ddp.py`` and the Gaudi MNIST script
    (``init_process_group("hccl", rank=, world_size=)``) fail on every rank with "trying to
    initialize the default process group twice!" (measured); ``models.train``, which adopts
    an existing group, ran with torchrun's simulated time, but a target's own backend choice
    (``--backend gloo``) would be silently replaced. So :func:`run_job` uses
    ``launchers.ray_backend.TargetRendezvousConfig``: a ``TorchConfig`` whose backend only
    publishes torchrun's variables (``MASTER_ADDR``/``MASTER_PORT`` on rank 0's node;
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from Ray Train's context)
    and leaves ``init_process_group`` to the target, as torchrun does.

NOTE [the bridge on the training thread]
    The emulator's bridge (``"hpu"`` devices, op accounting) is active on the thread that
    first imports ``hpu_runtime`` (thread-local modes). Ray Train's workers import it on
    their main thread at start-up (Ray's HPU device manager imports ``habana_frameworks``)
    but run the training loop on another thread, where ``.to("hpu")`` then fails with
    "PyTorch is not linked with support for hpu devices". The loops of :func:`gaudi_trainer`
    activate it on the training thread first; :func:`rank_main` activates it at the target's
    first import of the emulator (:func:`bridge_on_first_import`), where torchrun's process
    would, so a CPU/gloo target does not pay the bridge's per-op cost (measured with
    ``tiny_ddp.py``: 13 ms instead of 1.8 ms per step with the bridge always on).

NOTE [failure]
    ``FailureConfig`` allows no retry (a launcher target does not resume from a Ray Train
    checkpoint; a placement that timed out is otherwise retried forever): a rank that
    raises, exits non-zero or dies ends the run, and so do workers not placed within
    ``--placement-timeout``. Ray Train reports every failed rank
    (``WorkerGroupError.worker_failures``); :class:`JobFailedError` names them, dead
    workers first (the usual root cause: a peer blocked in a collective fails only because
    of it). Ray Train may end the run on the peer's failure before it has seen the worker
    die (a race: a full test run under load once named only "rank 0 failed: PeerFailure"),
    so a failure that is an hccl ``PeerFailure`` with a ``dead_rank`` names that rank as
    dead too, from the pid check the peer made. ``--timeout`` is enforced in each worker (a
    rank still running its target at the deadline exits with code 124, which Ray Train sees
    as a dead worker) and, as a backstop, by the driver: a worker not yet started at the
    deadline has no watchdog, so on a loaded machine Ray Train may still be starting the
    workers long after it (a full test run on 2 cores once saw none started 110 s after a
    20 s deadline); the driver then ends the job itself, ``--timeout`` + ``--placement-timeout``
    + :data:`BACKSTOP_S` after the start, with the same verdict: every rank did not finish
    within ``--timeout``.

NOTE [not quite torchrun]
    The target runs on a thread of the worker process (Ray Train's), not its main thread
    (``signal.signal`` is unavailable there), and Ray Train has already configured the
    root logger (INFO, to the console), so a target's ``logging.basicConfig`` does nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from launchers.env import one_thread_per_rank
from launchers.ray_cluster import LaunchError
from launchers.target import Target, exit_code, load_entry_point

__all__ = [
    "BACKSTOP_S",
    "JobFailedError",
    "JobResult",
    "RayJobConfig",
    "activate_bridge",
    "bridge_on_first_import",
    "gaudi_scaling_config",
    "gaudi_trainer",
    "rank_main",
    "run_job",
]

BACKSTOP_S = 30.0
"""Wall seconds the driver waits for Ray Train after the job's deadline before giving up."""
_TIMEOUT_EXIT = 124
_DEAD = ("WorkerHealthCheckFailedError", "WorkerHealthCheckTimeoutError", "RayActorError",
         "ActorDiedError")
_NO_RESOURCES = ("WorkerGroupStartupTimeoutError", "InsufficientClusterResourcesError")
_EMULATOR_PACKAGES = ("hpu_runtime", "habana_frameworks")


class _NotReturned(TimeoutError):
    """The driver's backstop: Ray Train had not returned ``limit_s`` wall seconds after the start."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"Ray Train did not return within {limit_s:g} s (the job's --timeout, "
                         "--placement-timeout and a backstop)")
        self.limit_s = limit_s


class JobFailedError(RuntimeError):
    """A rank failed, its worker died, or the job passed its timeout.

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
    """Ranks (Ray Train workers, simulated Gaudis); at least 1."""
    cpus_per_worker: float = 0.5
    """Ray CPUs reserved per worker (fractional is fine; this is scheduling, not a cap)."""
    entry_point: str | None = None
    """``module:function`` called as ``function(argv) -> dict`` instead of runpy."""
    timeout_s: float = 900.0
    """Wall seconds from the start of the run until every rank must have finished."""
    placement_timeout_s: float = 60.0
    """Wall seconds Ray Train waits for the workers' resources (free HPU/CPU) and start."""
    storage_path: str | None = None
    """Where Ray Train keeps the run (the ranks' records): shared storage on a multi-node
    cluster; None = a temporary directory removed after the job."""
    cwd: str = field(default_factory=os.getcwd)
    """The ranks' working directory (the driver's), where it exists on their node."""

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num-workers must be at least 1, got {self.num_workers}")
        if not self.cpus_per_worker > 0:
            raise ValueError(f"--cpus-per-worker must be positive, got {self.cpus_per_worker}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be positive, got {self.timeout_s}")
        if not self.placement_timeout_s > 0:
            raise ValueError(f"--placement-timeout must be positive, got {self.placement_timeout_s}")


@dataclass(kw_only=True, slots=True)
class JobResult:
    """What the driver gathered from one successful job (all times wall-clock)."""

    per_rank: list[dict[str, Any]]
    """One record per rank (see :func:`rank_main`), in rank order."""
    startup_s: float
    """Wall seconds from ``TorchTrainer.fit()`` to the last rank starting its target
    (Ray Train's controller and workers started, placed and given their ranks)."""
    wall_s: float
    """Wall seconds of the whole run, from ``fit()`` to the records read back."""
    env: list[dict[str, str]] = field(default_factory=list)
    """The torch variables each rank ran with."""

    def summary(self) -> dict[str, Any]:
        """Rank 0's summary dict plus ``per_rank`` (torchrun rank 0's JSON layout)."""
        rank0 = self.per_rank[0].get("result")
        summary: dict[str, Any] = dict(rank0) if isinstance(rank0, dict) else {}
        summary["per_rank"] = self.per_rank
        return summary


def gaudi_scaling_config(num_workers: int, cpus_per_worker: float = 0.5) -> Any:
    """``ScalingConfig`` with one "HPU" (one simulated Gaudi) and ``cpus_per_worker`` per worker."""
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=num_workers, resources_per_worker={"HPU": 1, "CPU": cpus_per_worker})


def gaudi_trainer(train_loop: Callable[..., None], *, num_workers: int, cpus_per_worker: float = 0.5,
                  train_loop_config: dict | None = None, run_config: Any = None) -> Any:
    """A ``TorchTrainer`` for a Ray-native loop, as Ray documents for Gaudi: one "HPU" per
    worker and ``TorchConfig(backend="hccl")``, so Ray Train creates the hccl process
    group before ``train_loop`` runs (NOTE [who initialises the process group])."""
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(_OnTrainingThread(train_loop), train_loop_config=train_loop_config, run_config=run_config,
                        scaling_config=gaudi_scaling_config(num_workers, cpus_per_worker),
                        torch_config=TorchConfig(backend="hccl"))


# --- in each worker ----------------------------------------------------------------------


def activate_bridge() -> None:
    """Activates the emulator's bridge on the calling thread if this process already imported
    ``hpu_runtime`` (NOTE [the bridge on the training thread]); else the target's own import
    does it."""
    runtime = sys.modules.get("hpu_runtime")
    if runtime is not None:
        runtime.activate()


def _emulator_module(name: str, globals_: dict | None, level: int) -> bool:
    package = name if level == 0 else (globals_ or {}).get("__package__") or ""
    return package.split(".", 1)[0] in _EMULATOR_PACKAGES


@contextlib.contextmanager
def bridge_on_first_import() -> Iterator[None]:
    """While the target runs: activates the bridge on this thread at the target's first
    import of the emulator (``hpu_runtime``, ``habana_frameworks``; ``hccl``'s process
    group imports ``hpu_runtime``), as that import would under torchrun, though Ray already
    imported it elsewhere. A target that never imports it (a CPU/gloo script) runs without
    the bridge's per-op cost."""
    if "hpu_runtime" not in sys.modules:
        yield  # the target's own import activates it on this thread
        return
    original, thread = builtins.__import__, threading.get_ident()

    def hooked(name: str, globals: dict | None = None, locals: Any = None, fromlist: Any = (),  # noqa: A002
               level: int = 0) -> Any:
        if threading.get_ident() == thread and _emulator_module(name, globals, level):
            if builtins.__import__ is hooked:
                builtins.__import__ = original
            activate_bridge()
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = hooked
    try:
        yield
    finally:
        if builtins.__import__ is hooked:
            builtins.__import__ = original


class _OnTrainingThread:
    """A training loop that first activates the bridge on Ray Train's training thread."""

    def __init__(self, loop: Callable[..., None]) -> None:
        self.__wrapped__ = loop  # Ray Train reads the loop's signature through this

    def __call__(self, *args: Any) -> None:
        activate_bridge()
        self.__wrapped__(*args)


def _expire(rank: int, timeout_s: float) -> None:
    print(f"launchers.ray: rank {rank} did not finish within --timeout {timeout_s:g} s; exiting",
          file=sys.stderr, flush=True)
    os._exit(_TIMEOUT_EXIT)


def rank_main(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: runs the target as one rank, reports its record.

    ``config``: ``{"job": RayJobConfig, "deadline_unix": float}`` (wall-clock Unix seconds).
    The record (``rank``, ``pid``, ``hostname``, ``node_ip``, ``local_rank``, ``start_unix``,
    ``wall_s`` of the target, its ``result`` and ``env``) is reported as ``rank<R>.json``
    in a checkpoint, so it reaches the driver through Ray Train's storage.

    Raises:
        RuntimeError: The target exited with a non-zero code.
        Exception: Whatever the target raised.
    """
    import ray.train
    from ray.train import Checkpoint

    job: RayJobConfig = config["job"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    local_rank, local_size = ctx.get_local_rank(), ctx.get_local_world_size()
    start_unix = time.time()
    node_ip = ray.util.get_node_ip_address()
    print(f"launchers.ray: rank {rank} of {world} is pid {os.getpid()} on node {node_ip} "
          f"({socket.gethostname()}), local rank {local_rank} of {local_size}", file=sys.stderr, flush=True)
    if os.path.isdir(job.cwd):
        os.chdir(job.cwd)
        if job.target.is_module and job.cwd not in sys.path:
            sys.path.insert(0, job.cwd)  # as `python -m` would
    one_thread_per_rank(local_size)
    watchdog = threading.Timer(max(0.0, config["deadline_unix"] - time.time()), _expire, (rank, job.timeout_s))
    watchdog.daemon = True
    watchdog.start()
    result: Any = None
    try:
        with bridge_on_first_import():
            if job.entry_point:
                result = load_entry_point(job.entry_point)(list(job.target.argv))
            else:
                job.target.run_main()
    except SystemExit as exc:
        if exit_code(exc) != 0:
            raise RuntimeError(f"rank {rank}: {job.target.describe()} exited with code {exit_code(exc)}") from None
    finally:
        watchdog.cancel()
    record = {"rank": rank, "pid": os.getpid(), "hostname": socket.gethostname(), "node_ip": node_ip,
              "local_rank": local_rank, "start_unix": start_unix, "wall_s": time.time() - start_unix,
              "result": result,
              "env": {k: os.environ.get(k, "") for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                        "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(record, f, default=str)
        ray.train.report({"rank": rank, "wall_s": record["wall_s"]}, checkpoint=Checkpoint.from_directory(tmp))


# --- in the driver -------------------------------------------------------------------------


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _job_failed(exc: Any, config: RayJobConfig, deadline_unix: float) -> JobFailedError:
    failures: dict[int, BaseException] = dict(getattr(exc, "worker_failures", None) or {})
    died = {r: e for r, e in failures.items() if type(e).__name__ in _DEAD}
    failed = {r: e for r, e in failures.items() if r not in died}
    expired = time.time() >= deadline_unix - 1.0  # the ranks' watchdogs (exit 124) have fired
    if expired and not failures:
        # a rank's watchdog fired before Ray Train had the worker group up (a loaded machine):
        # the controller fails with no per-worker failures; every rank was past the deadline
        died = dict.fromkeys(range(config.num_workers), exc)
    # a dead worker Ray Train had not reported yet when a peer's failure ended the run: the peer's
    # hccl PeerFailure names it (its ``dead_rank``), and it is the root cause
    seen_dead: dict[int, int] = {}
    for r, e in sorted(failed.items()):
        dead = getattr(e, "dead_rank", None)
        if isinstance(dead, int) and dead not in died and dead not in failed:
            seen_dead.setdefault(dead, r)
    if died and expired:
        lines = [f"ranks {sorted(died)} did not finish within --timeout {config.timeout_s:g} s"]
        if isinstance(exc, _NotReturned):
            # no rank's watchdog ended it: the workers were not all started by the deadline
            # (a loaded machine or cluster), so the driver's backstop did, later
            lines[0] += f" (Ray Train had not returned {exc.limit_s:g} s after the start)"
    else:
        lines = [f"rank {r} died (its worker process exited): {_error_text(e)}" for r, e in sorted(died.items())]
    lines += [f"rank {d} died (rank {r} found its process gone)" for d, r in sorted(seen_dead.items())]
    lines += [f"rank {r} failed: {_error_text(e)}" for r, e in sorted(failed.items())]
    return JobFailedError("; ".join(lines) or _error_text(exc), [*sorted(died), *sorted(seen_dead), *sorted(failed)])


def _fit(trainer: Any, limit_s: float) -> Any:
    """``trainer.fit()`` with a wall-clock limit; returns the Result or raises its error.

    Raises:
        _NotReturned: ``trainer.fit()`` had not returned after ``limit_s`` wall seconds.
    """
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="ray-train-fit", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise _NotReturned(limit_s)
    if "error" in out:
        raise out["error"]
    return out["result"]


def run_job(config: RayJobConfig) -> JobResult:
    """Runs one job on the connected Ray cluster as a Ray Train run.

    Raises:
        LaunchError: Ray Train V1 is selected, or the workers could not be placed and
            started within ``placement_timeout_s``.
        JobFailedError: A rank failed, died or timed out (see NOTE [failure]).
    """
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.constants import is_v2_enabled

    from launchers.ray_backend import TargetRendezvousConfig

    if not is_v2_enabled():
        raise LaunchError("launchers.ray needs Ray Train V2: unset RAY_TRAIN_V2_ENABLED=0")
    storage = config.storage_path or tempfile.mkdtemp(prefix="launchers-ray-")
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = f"{config.placement_timeout_s:g}"
    t0, t0_unix = time.perf_counter(), time.time()
    deadline_unix = t0_unix + config.timeout_s
    trainer = TorchTrainer(
        rank_main,
        train_loop_config={"job": config, "deadline_unix": deadline_unix},
        scaling_config=gaudi_scaling_config(config.num_workers, config.cpus_per_worker),
        torch_config=TargetRendezvousConfig(backend="hccl"),
        run_config=RunConfig(name=f"job-{uuid.uuid4().hex[:8]}", storage_path=storage,
                             failure_config=FailureConfig(max_failures=0, controller_failure_limit=0,
                                                            max_preemption_failures=0)),
    )
    try:
        try:
            result = _fit(trainer, config.timeout_s + config.placement_timeout_s + BACKSTOP_S)
        except Exception as exc:  # noqa: BLE001 - Ray Train's errors, mapped below
            if isinstance(exc, JobFailedError):
                raise
            cause = getattr(exc, "controller_failure", None)
            if cause is not None and type(cause).__name__ in _NO_RESOURCES:
                raise LaunchError(
                    f"cannot start {config.num_workers} workers of {{'HPU': 1, 'CPU': "
                    f"{config.cpus_per_worker:g}}} within {config.placement_timeout_s:g} s: {_error_text(cause)} "
                    "(each node needs an \"HPU\" resource, e.g. `ray start --resources '{\"HPU\": 8}'`)"
                ) from None
            raise _job_failed(exc, config, deadline_unix) from None
        with result.checkpoint.as_directory() as ckpt:
            per_rank = [json.loads(open(os.path.join(ckpt, f"rank{r}.json")).read())
                        for r in range(config.num_workers)]
    finally:
        if config.storage_path is None:
            shutil.rmtree(storage, ignore_errors=True)
    return JobResult(per_rank=per_rank, startup_s=max(r["start_unix"] for r in per_rank) - t0_unix,
                     wall_s=time.perf_counter() - t0, env=[r["env"] for r in per_rank])
