"""How launchers.ray_train names a failed job from Ray Train's error, and what an embedded Ray is
started with (no Ray cluster needed)."""

from __future__ import annotations

import threading
import time

import pytest

from launchers.ray_train import RayJobConfig, _fit, _job_failed, _NotReturned
from launchers.target import Target


class ControllerError(Exception):
    """Ray Train's controller failure: no per-worker failures attached."""


class RayActorError(Exception):
    """A worker whose process exited."""


class WorkerGroupError(Exception):
    def __init__(self, failures):
        super().__init__("workers failed")
        self.worker_failures = failures


def _config(n: int = 2) -> RayJobConfig:
    return RayJobConfig(target=Target(name="x.py", is_module=False), num_workers=n, timeout_s=20.0)


def test_a_controller_error_past_the_deadline_names_every_rank_as_timed_out():
    """The watchdogs fired before Ray Train had the workers up: every rank did not finish."""
    err = _job_failed(ControllerError("actor died unexpectedly"), _config(3), deadline_unix=time.time() - 5)
    assert str(err) == "ranks [0, 1, 2] did not finish within --timeout 20 s"


def test_a_controller_error_before_the_deadline_is_reported_as_it_is():
    err = _job_failed(ControllerError("placement failed"), _config(), deadline_unix=time.time() + 600)
    assert str(err) == "ControllerError: placement failed"


def test_dead_workers_before_the_deadline_are_named_as_dead():
    exc = WorkerGroupError({1: RayActorError("exited"), 0: ValueError("bad input")})
    err = _job_failed(exc, _config(), deadline_unix=time.time() + 600)
    assert str(err) == ("rank 1 died (its worker process exited): RayActorError: exited; "
                        "rank 0 failed: ValueError: bad input")


def test_a_death_only_a_peer_saw_is_named_first():
    """Ray Train ended the run on rank 0's PeerFailure before it saw rank 1's worker die: the
    failure (pickled, as Ray sends it to the driver) names rank 1 dead, root cause first."""
    import pickle

    from hccl.transport.shm import PeerFailure

    peer = pickle.loads(pickle.dumps(PeerFailure(
        "hccl: rank 1 (pid 42) died while rank 0 was in allreduce #7", dead_rank=1)))
    assert peer.dead_rank == 1
    err = _job_failed(WorkerGroupError({0: peer}), _config(), deadline_unix=time.time() + 600)
    assert str(err) == ("rank 1 died (rank 0 found its process gone); "
                        "rank 0 failed: PeerFailure: hccl: rank 1 (pid 42) died while rank 0 was in allreduce #7")
    assert err.failed_ranks == [1, 0]
    # reported by Ray Train itself as well: named once, as Ray saw it
    err = _job_failed(WorkerGroupError({0: peer, 1: RayActorError("exited")}), _config(),
                      deadline_unix=time.time() + 600)
    assert str(err).startswith("rank 1 died (its worker process exited): RayActorError: exited; rank 0 failed")
    assert err.failed_ranks == [1, 0]
    # an abort is not a death: no rank is added
    abort = PeerFailure("hccl: rank 1 aborted while rank 0 was in allreduce #7: boom")
    assert abort.dead_rank is None
    err = _job_failed(WorkerGroupError({0: abort}), _config(), deadline_unix=time.time() + 600)
    assert err.failed_ranks == [0] and str(err).startswith("rank 0 failed: PeerFailure")


class _RecordingRay:
    """Stands in for the ``ray`` module: records what ``init`` was asked for."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)


def test_an_embedded_ray_has_the_cores_to_start_its_workers_at_once(monkeypatch) -> None:
    """Ray starts at most ``min(cores, logical CPUs)`` worker processes at once
    (``ray/_private/services.py``, ``maximum_startup_concurrency``): the embedded Ray declares at
    least the machine's cores, and more where the workers and trial drivers need them; its "HPU"
    count is the job's ranks either way."""
    from launchers.ray_cluster import start_ray

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    ray = _RecordingRay()
    assert start_ray(ray, None, 2, 0.5) is True  # 1 CPU of work: 2, the cores
    assert start_ray(ray, None, 8, 1.0, trials=4) is True  # 8 + 4 trial drivers x 0.05 = 8.2: 9
    assert [(c["num_cpus"], c["resources"]) for c in ray.calls] == [(2, {"HPU": 2}), (9, {"HPU": 8})]
    # the coordinator prestart (prestart_train_coordinator) creates no actor, and so starts no
    # real Ray in this process, when the Ray it was given is not up
    real = pytest.importorskip("ray")
    assert not real.is_initialized()


def test_the_drivers_backstop_names_every_rank_as_timed_out():
    """Ray Train had not returned at the driver's limit (the workers were never started, so no
    watchdog fired): the verdict is still the job's --timeout, every rank named, and says why."""
    release = threading.Event()

    class NeverStarts:
        def fit(self):
            release.wait(30)

    try:
        with pytest.raises(_NotReturned) as info:
            _fit(NeverStarts(), limit_s=0.2)
    finally:
        release.set()
    err = _job_failed(info.value, _config(2), deadline_unix=time.time() - 90)
    assert str(err) == ("ranks [0, 1] did not finish within --timeout 20 s "
                        "(Ray Train had not returned 0.2 s after the start)")
    assert err.failed_ranks == [0, 1]
