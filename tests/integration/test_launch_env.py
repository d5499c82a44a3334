"""Launcher environment mapping (torchrun, Open MPI, MPICH/Hydra) and launcher CLI parsing: pure, fast."""

from __future__ import annotations

import argparse
import logging

import pytest

from hccl.env import RankEnv, apply_mpi_env, resolve_rank_env, started_by_mpi, torch_env_vars
from launchers.env import find_free_port, local_ranks, rendezvous_host, setup_rank_env
from launchers.target import Target, add_target_arguments, exit_code, target_from_args

pytestmark = pytest.mark.timeout(30)

OMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}
HYDRA = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "1234",
}


def _tuple(env: RankEnv) -> tuple[int, int, int, int, str]:
    return env.rank, env.world_size, env.local_rank, env.local_world_size, env.source


def test_no_launcher_is_a_single_process() -> None:
    """Nothing set: rank 0 of 1, loopback rendezvous on torch's default port."""
    env = resolve_rank_env({})
    assert _tuple(env) == (0, 1, 0, 1, "default")
    assert (env.master_addr, env.master_port) == ("127.0.0.1", 29500)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (OMPI, (5, 8, 1, 4, "openmpi")),
        (HYDRA, (2, 4, 2, 4, "pmi")),
        (TORCHRUN, (3, 4, 1, 2, "torchrun")),
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2, 1, 2, "env")),
        ({"PMI_RANK": "3", "PMI_SIZE": "4"}, (3, 4, 3, 4, "pmi")),
        ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, (3, 4, 1, 2, "pmi")),
    ],
    ids=["openmpi", "hydra", "torchrun", "by-hand", "pmi-no-local", "pmi-size-only"],
)
def test_launcher_variables_map_to_rank_and_world(environ: dict, expected: tuple) -> None:
    """Each launcher's variables give the right rank, world, local rank and local world."""
    assert _tuple(resolve_rank_env(environ)) == expected


def test_torchrun_wins_over_inherited_mpi_variables() -> None:
    """torchrun agents started by mpirun: the worker's torchrun values are authoritative."""
    env = resolve_rank_env(TORCHRUN | OMPI)
    assert _tuple(env) == (3, 4, 1, 2, "torchrun")
    assert (env.master_addr, env.master_port) == ("10.1.2.3", 1234)


def test_mpi_overrides_a_stale_rank_from_the_shell(caplog: pytest.LogCaptureFixture) -> None:
    """A RANK exported in the shell is inherited by every MPI rank; the MPI values win."""
    environ = {"RANK": "0", "WORLD_SIZE": "1"} | HYDRA
    with caplog.at_level(logging.WARNING, logger="hccl.env"):
        env = apply_mpi_env(environ)
    assert _tuple(env) == (2, 4, 2, 4, "pmi")
    assert environ["RANK"] == "2" and environ["WORLD_SIZE"] == "4"
    assert environ["LOCAL_RANK"] == "2" and environ["LOCAL_WORLD_SIZE"] == "4"
    assert (environ["MASTER_ADDR"], environ["MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert "RANK=0 overridden" in caplog.text


def test_started_by_mpi_sees_each_mpi_launcher_and_nothing_else() -> None:
    """Open MPI's mpirun, Hydra's mpiexec and a PMIx launcher (srun --mpi=pmix) each count; a
    plain process, torchrun's variables or a RANK set by hand do not."""
    assert started_by_mpi(OMPI) and started_by_mpi(HYDRA) and started_by_mpi({"PMIX_RANK": "0"})
    assert not started_by_mpi({}) and not started_by_mpi({"RANK": "0", "WORLD_SIZE": "2"})
    assert not started_by_mpi(TORCHRUN)


def test_apply_mpi_env_leaves_torchrun_and_plain_processes_alone() -> None:
    """Without MPI variables, import-time mapping only defaults MASTER_ADDR/PORT."""
    plain: dict[str, str] = {}
    apply_mpi_env(plain)
    assert plain == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    torchrun = dict(TORCHRUN)
    apply_mpi_env(torchrun)
    assert torchrun == TORCHRUN


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
        ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "PMI_RANK"),
        ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE"),
        ({"PMI_RANK": "-1", "PMI_SIZE": "2"}, "PMI_RANK"),
        ({"PMI_RANK": "1"}, "PMI_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "3"}, "MPI_LOCALRANKID"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "3"}, "MPI_LOCALNRANKS"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ],
)
def test_bad_values_raise_naming_the_variable(environ: dict, variable: str) -> None:
    """A malformed or out-of-range launcher variable is a ValueError that names it."""
    with pytest.raises(ValueError, match=variable):
        resolve_rank_env(environ)


def test_apply_mpi_env_changes_nothing_on_error() -> None:
    """A bad variable leaves the environment as it was."""
    environ = {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK"):
        apply_mpi_env(environ)
    assert environ == {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "2"}


def test_setup_rank_env_exports_all_torch_variables() -> None:
    """The launchers export a complete env:// rendezvous, whatever the source."""
    environ = dict(OMPI)
    env = setup_rank_env(environ)
    assert {k: environ[k] for k in torch_env_vars(env)} == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }


def test_local_ranks_follow_hosts_in_rank_order() -> None:
    """Local rank = position among the same host's ranks; local world = that host's count."""
    assert local_ranks(["a", "b", "a", "b", "a"]) == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]
    assert local_ranks(["n"] * 4) == [(0, 4), (1, 4), (2, 4), (3, 4)]


def test_rendezvous_is_loopback_on_one_host() -> None:
    """One host: loopback; several: rank 0's address."""
    assert rendezvous_host(["n1", "n1"], "192.0.2.7") == "127.0.0.1"
    assert rendezvous_host(["n1", "n2"], "192.0.2.7") == "192.0.2.7"


def test_find_free_port_is_bindable_on_loopback() -> None:
    """The port returned is a valid TCP port."""
    assert 0 < find_free_port() < 65536


def _parse_target(argv: list[str]) -> Target:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-workers", type=int)
    add_target_arguments(parser)
    return target_from_args(parser.parse_args(argv))


def test_target_arguments_follow_torchrun() -> None:
    """[-m] TARGET [ARGS...]: everything after the target goes to it, flags included."""
    module = _parse_target(["--num-workers", "2", "-m", "models.train", "--epochs", "1", "-m", "x"])
    assert module == Target(name="models.train", is_module=True, argv=("--epochs", "1", "-m", "x"))
    script = _parse_target(["train.py", "--num-workers", "3"])
    assert script == Target(name="train.py", is_module=False, argv=("--num-workers", "3"))
    assert module.describe() == "-m models.train --epochs 1 -m x"


@pytest.mark.parametrize(("code", "expected"), [(None, 0), (0, 0), (3, 3), ("boom", 1)])
def test_exit_code_matches_the_interpreter(code: object, expected: int) -> None:
    """sys.exit(None|int|str) maps to the exit status Python itself would use."""
    assert exit_code(SystemExit(code)) == expected


@pytest.mark.parametrize(
    "extra",
    [{"WORLD_SIZE": "2"}, {"WORLD_SIZE": "2", "RANK": "x"}, {"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_RANK": "1"}],
    ids=["world-size-no-rank", "bad-rank", "ompi-size-no-rank", "pmi-rank-no-size"],
)
def test_import_torch_and_hccl_never_break_on_an_odd_environment(extra) -> None:
    """torch's own test suite sets WORLD_SIZE without RANK: `import torch` (which loads our entry
    point) and `import hccl` still work and register "hccl", even with warnings as errors."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE") and not k.startswith(("OMPI_", "PMI_"))}
    env |= extra | {"PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")}
    code = "import torch, torch.distributed as dist; import hccl; print(dist.Backend.HCCL)"
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "hccl"


_MPI_VARS = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2"}
_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _environ_changes(statement: str) -> dict:
    """Variables that ``statement`` changes in a fresh interpreter started by Open MPI / PMI."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k not in _TORCH_VARS and not k.startswith(("OMPI_", "PMI_"))}
    env |= _MPI_VARS | {"PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")}
    code = ("import os, json; before = dict(os.environ)\n" + statement + "\n"
            "after = dict(os.environ)\n"
            "print(json.dumps({k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}))")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150)  # a fresh `import torch` under a loaded machine
@pytest.mark.parametrize("statement", [
    "import torch",
    "import hccl",
    "import torch.distributed as dist, hccl; assert 'hccl' in dist.Backend.backend_list",
])
def test_import_leaves_the_environment_alone(statement: str) -> None:
    """`import torch` (our entry point) and `import hccl` register the backend and change no
    variable, even in a process started by Open MPI / MPICH."""
    assert _environ_changes(statement) == {}


@pytest.mark.timeout(150)
def test_habana_import_maps_the_mpi_variables() -> None:
    """`import habana_frameworks.torch.distributed.hccl` maps them explicitly, as on Gaudi."""
    changes = _environ_changes("import habana_frameworks.torch.distributed.hccl")
    assert {k: changes.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
