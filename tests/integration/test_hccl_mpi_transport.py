"""``HCCL_TRANSPORT=mpi``: every collective through mpi4py under ``mpiexec``, checked like shm.

The rank side of these tests is this file's ``__main__`` (run by ``mpiexec -n 3``); each
rank writes ``result_<rank>.json`` next to the init file, which the test reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCH_VARS and not k.startswith(("OMPI_", "PMI_", "TORCHELASTIC", "HCCL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _mpiexec(n: int, mode: str, tmp_path: Path, timeout: float = 90) -> dict[int, dict]:
    # 64 KiB pipelining slices: 70,000-element tensors take several slices of the schedule
    mpiexec = shutil.which("mpiexec")
    cmd = [mpiexec, "-n", str(n), sys.executable, __file__, mode, str(tmp_path / "init")]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(HCCL_TRANSPORT="mpi", PT_HCCL_SLICE_SIZE_MB="0.0625"), capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = {}
    for path in sorted(tmp_path.glob("result_*.json")):
        results[int(path.stem.removeprefix("result_"))] = json.loads(path.read_text())
    assert sorted(results) == list(range(n)), proc.stdout[-3000:]
    return results


def _needs_mpi() -> None:
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec: pip install -e '.[mpi]'")


@pytest.mark.timeout(100)
def test_every_collective_matches_numpy_over_mpi(tmp_path: Path) -> None:
    """3 ranks, HCCL_TRANSPORT=mpi: all collectives x dtypes vs numpy (multi-slice path too),
    allreduce bits equal to the rank-order reduction (what shm gives) and the same on every
    rank, a subgroup of ranks 1-2, and a size mismatch raising the same error on every rank."""
    _needs_mpi()
    results = _mpiexec(3, "collectives", tmp_path)
    failures = [f for r in results.values() for f in r["failures"]]
    assert not failures, "\n".join(failures[:20])
    assert all(r["driver"] == "ScheduleCollectives" for r in results.values())
    messages = {r["mismatch"] for r in results.values()}
    assert len(messages) == 1, messages
    msg = messages.pop()
    assert "CollectiveMismatchError" in msg and "tensor sizes differ across ranks" in msg
    assert "rank 1: 5 elements of float32" in msg


@pytest.mark.timeout(100)
def test_peer_that_never_arrives_times_out(tmp_path: Path) -> None:
    """MPI has no timeouts: the transport polls, so a missing peer raises within the group's timeout,
    in the world and in a subgroup (whose error names the global rank).

    The job's own limit leaves room for three ranks importing torch beside a full suite: 6 s idle
    on 2 cores, 21-30 s in full runs (one run of ``pytest -n auto`` hit the old 30 s limit)."""
    _needs_mpi()
    results = _mpiexec(3, "timeout", tmp_path, timeout=90)
    assert results[1]["error"] == "no error"
    for rank in (0, 2):
        assert results[rank]["error"] == (
            f"HcclTimeoutError: hccl: rank {rank} timed out after 2.0 s in barrier #0 waiting for its"
            " MPI peers (HCCL_TRANSPORT=mpi)"
        )
    # in the subgroup [1, 2] rank 2 is named by its global rank, not its group rank 1
    assert results[2]["sub_error"] == (
        "HcclTimeoutError: hccl: rank 2 timed out after 2.0 s in allreduce #0 waiting for its"
        " MPI peers (HCCL_TRANSPORT=mpi)"
    ), results[2]
    assert results[0]["sub_error"] == results[1]["sub_error"] == "no error"


@pytest.mark.timeout(30)
def test_bad_transport_value_is_refused() -> None:
    """An unknown HCCL_TRANSPORT fails group creation with a ValueError naming the variable."""
    code = ("import hccl, torch.distributed as dist, tempfile, os\n"
            "d = tempfile.mkdtemp()\n"
            "try:\n"
            "    dist.init_process_group('hccl', init_method='file://' + os.path.join(d, 'i'), rank=0, world_size=1)\n"
            "except ValueError as exc:\n"
            "    print('ERR', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(HCCL_TRANSPORT="infiniband"),
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERR HCCL_TRANSPORT='infiniband' is not a transport" in proc.stdout


def _two_ranks_without_mpiexec(rank: int, world: int) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("hccl", init_method=f"file://{os.environ['INIT_FILE']}", rank=rank, world_size=world)
    except Exception as exc:
        raise RuntimeError(f"{exc} [MPI initialised: {_mpi_initialised()}]") from exc
    finally:
        # a singleton MPI job's MPICH segment is unlinked by mpi4py's atexit Finalize, which
        # run_ranks' workers skip (they end by os._exit)
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()


def _mpi_initialised() -> bool:
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI is not None and bool(MPI.Is_initialized())


@pytest.mark.timeout(60)
def test_mpi_transport_outside_mpiexec_says_how_to_start(tmp_path: Path) -> None:
    """HCCL_TRANSPORT=mpi in ranks not started by mpiexec: a clear error on every rank, found
    before MPI is initialised (a singleton MPI job in each rank would make an MPICH file in
    /dev/shm, left behind when a rank is killed)."""
    pytest.importorskip("mpi4py")
    from tests.dist_utils import run_ranks
    from tests.integration.launch_helpers import assert_no_new_shm, shm_names

    before = shm_names()
    res = run_ranks(_two_ranks_without_mpiexec, 2, backend=None, timeout=50, expect_errors=True,
                    env={"HCCL_TRANSPORT": "mpi", "INIT_FILE": str(tmp_path / "init")})
    for status, text in res:
        assert status == "err", res
        assert "HCCL_TRANSPORT=mpi needs the job started by mpiexec" in text
        assert "no MPI launcher started this process" in text and "[MPI initialised: False]" in text, text
    assert_no_new_shm(before)


@pytest.mark.timeout(60)
def test_mpi_transport_in_separate_mpi_jobs_says_how_to_start(tmp_path: Path) -> None:
    """Ranks that are each an MPI job of their own (an MPI launcher's variables set, but no
    shared MPI world: here Open MPI's, which this MPICH ignores): MPI sees 1 process, and
    every rank says so."""
    pytest.importorskip("mpi4py")
    from tests.dist_utils import run_ranks
    from tests.integration.launch_helpers import assert_no_new_shm, shm_names

    before = shm_names()
    res = run_ranks(_two_ranks_without_mpiexec, 2, backend=None, timeout=50, expect_errors=True,
                    env={"HCCL_TRANSPORT": "mpi", "INIT_FILE": str(tmp_path / "init"),
                         "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"})
    for status, text in res:
        assert status == "err", res
        assert "MPI sees 1 process(es) but the process group has 2 ranks" in text, text
    assert_no_new_shm(before)


# ---- rank side (under mpiexec) ---------------------------------------------------------------
def _rank_main(mode: str, init_file: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import hpu_runtime
    from tests.distributed import test_collectives as tc

    hpu_runtime.deactivate()
    rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    result_file = Path(init_file).parent / f"result_{rank}.json"
    dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=2 if mode == "timeout" else 30))
    if mode == "timeout":  # rank 1 never joins the barrier, nor the subgroup's allreduce
        from tests.dist_utils import giving_up, stay_silent

        sub = dist.new_group([1, 2], timeout=timedelta(seconds=2))
        error = sub_error = "no error"
        if rank == 1:
            stay_silent()
        else:
            with giving_up():
                try:
                    dist.barrier()
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    error = f"{type(exc).__name__}: {exc}"
                if rank == 2:
                    try:
                        dist.all_reduce(torch.ones(4), group=sub)
                    except Exception as exc:  # noqa: BLE001 - reported to the test
                        sub_error = f"{type(exc).__name__}: {exc}"
        result_file.write_text(json.dumps({"error": error, "sub_error": sub_error}))
        return
    pg = dist.group.WORLD
    out: dict = {"driver": type(pg._coll).__name__}
    failures = tc._all_collectives(rank, world)

    # allreduce bits: the rank-order reduction in the tensor's dtype (the shm engine's order),
    # identical on every rank
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for numel in (9, 50_000):
            ins = [torch.randn(numel, generator=torch.Generator().manual_seed(r + numel)).to(dtype) for r in range(world)]
            t = ins[rank].clone()
            dist.all_reduce(t)
            ref = ins[0] + ins[1]
            for q in range(2, world):
                ref += ins[q]
            if not torch.equal(t, ref):
                failures.append(f"allreduce {dtype} n={numel}: not the rank-order sum")
            every = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(every, t)
            if not all(torch.equal(e, every[0]) for e in every):
                failures.append(f"allreduce {dtype} n={numel}: ranks hold different bits")

    # a subgroup that is not the MPI world (MPI_Comm_create_group; rank 0 is not a member)
    sub = dist.new_group([1, 2], backend="hccl")
    if rank in (1, 2):
        t = torch.full((100_000,), float(rank))
        dist.all_reduce(t, group=sub)
        if not torch.equal(t, torch.full((100_000,), 3.0)):
            failures.append("subgroup [1, 2] allreduce is wrong")
    dist.barrier()

    # sizes differ on rank 1: every rank raises the same mismatch error
    try:
        dist.all_reduce(torch.ones(4 + (rank == 1)))
        out["mismatch"] = "no error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    out["failures"] = failures
    result_file.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    try:
        _rank_main(sys.argv[1], sys.argv[2])
    except BaseException:  # noqa: BLE001 - one failing rank must not leave the others waiting
        import traceback

        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
