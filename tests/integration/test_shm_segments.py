"""No shared-memory segment outlives a rank, whenever it dies (NOTE [anonymous segments])."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.integration.launch_helpers import REPO, assert_no_new_shm, clean_env, shm_names

# one rank of a group of WORLD ranks: rendezvous over the parent's TCPStore, then (if it
# gets that far) say so in the store and either hang in an allreduce or in a store wait
_RANK = """
import sys, torch, torch.distributed as dist
from datetime import timedelta
from hccl.process_group import ProcessGroupHCCL
port, rank, world, then = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
pg = ProcessGroupHCCL(store, rank, world, timeout=timedelta(seconds=60))
store.set(f"test/ready/{rank}", "1")
if then == "allreduce":
    try:
        pg.allreduce([torch.ones(4096)]).wait()
    except RuntimeError as exc:
        store.set(f"test/error/{rank}", str(exc))
        raise SystemExit(3)
else:
    store.get("test/never")
"""


def _env() -> dict[str, str]:
    return clean_env() | {"HCCL_HOST_ID": "the-host"}


def _silent_rank(store: dist.TCPStore, rank: int) -> None:
    """Publish what rank ``rank`` says in the rendezvous (its host and the settings every rank
    shares, NOTE [settings agreement]), as if it had arrived and then went silent."""
    from hccl.agreement import settings_of
    from hccl.config import HcclConfig
    from hccl.sim.cluster import from_env as cluster_from_env
    from hpu_runtime.bridge.config import RuntimeConfig

    env = _env()
    settings = settings_of(HcclConfig.from_env(env), RuntimeConfig.from_env(env).spec, cluster_from_env(env))
    row = {"host": "the-host", "settings": settings}
    store.set(f"hccl/host/{rank}", json.dumps(row))


def _start(port: int, rank: int, world: int, then: str) -> subprocess.Popen:
    env = _env()
    return subprocess.Popen([sys.executable, "-c", _RANK, str(port), str(rank), str(world), then],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_keys(store: dist.TCPStore, keys: list[str], procs: list[subprocess.Popen], limit_s: float = 150.0) -> None:
    """Block until every key is in the store (a rank reached that point); fail if one died."""
    deadline = time.monotonic() + limit_s
    while not store.check(keys):
        dead = [p.returncode for p in procs if p.poll() is not None]
        assert not dead, f"a rank exited early ({dead}): {[p.stderr.read() for p in procs if p.poll() is not None]}"
        assert time.monotonic() < deadline, f"ranks never reached {keys}"
        time.sleep(0.05)


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)
        if p.stderr:
            p.stderr.close()


@pytest.mark.timeout(240)
def test_rank_killed_inside_the_rendezvous_leaves_no_segment():
    """Rank 0 has created its segment and waits in the rendezvous for rank 1, which never
    comes; SIGKILL (what torchrun's teardown ends with) must leave nothing in /dev/shm."""
    before = shm_names()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    _silent_rank(store, 1)
    procs = [_start(store.port, 0, 2, "hang")]
    try:
        _wait_keys(store, ["hccl/seg/0"], procs)  # its segment exists: it is inside the rendezvous
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(30)
        assert_no_new_shm(before)
    finally:
        _reap(procs)


@pytest.mark.timeout(240)
def test_ranks_terminated_inside_the_rendezvous_leave_no_segment():
    """Three of four ranks are inside the rendezvous when they are terminated (SIGTERM)."""
    before = shm_names()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    _silent_rank(store, 3)
    procs = [_start(store.port, r, 4, "hang") for r in range(3)]
    try:
        _wait_keys(store, [f"hccl/seg/{r}" for r in range(3)], procs)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        assert_no_new_shm(before)
    finally:
        _reap(procs)


@pytest.mark.timeout(240)
def test_rank_killed_after_the_rendezvous_leaves_no_segment_and_peer_fails():
    """Rank 1 is killed after the rendezvous while rank 0 waits for it in an allreduce: rank 0
    raises naming rank 1, and no segment is left."""
    before = shm_names()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    procs = [_start(store.port, 0, 2, "allreduce"), _start(store.port, 1, 2, "hang")]
    try:
        _wait_keys(store, ["test/ready/0", "test/ready/1"], procs)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[0].wait(60) == 3
        assert "rank 1" in store.get("test/error/0").decode()
        assert_no_new_shm(before)
    finally:
        _reap(procs)


@pytest.mark.timeout(60)
def test_leak_check_counts_unheld_segments_only() -> None:
    """The leak check's reference: a segment another live process holds mapped (a job
    running side by side) is not a leak; the same kind of file that nobody holds is."""
    import os

    before = shm_names()
    token = f"{os.getpid()}_{time.monotonic_ns()}"
    held, orphan = f"/dev/shm/hccl_test_held_{token}", f"/dev/shm/hccl_test_orphan_{token}"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import mmap, os, sys, time\n"
         f"fd = os.open({held!r}, os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 4096)\n"
         "m = mmap.mmap(fd, 4096); os.close(fd); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert_no_new_shm(before, within_s=0.5)  # held by a live process: not a leak
        fd = os.open(orphan, os.O_CREAT | os.O_RDWR, 0o600)
        os.close(fd)
        with pytest.raises(AssertionError, match="hccl_test_orphan_") as err:
            assert_no_new_shm(before, within_s=0.5)
        assert "hccl_test_held_" not in str(err.value)
    finally:
        holder.kill()
        holder.wait(10)
        for path in (held, orphan):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
