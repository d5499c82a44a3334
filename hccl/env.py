"""Map a launcher's environment (torchrun, Open MPI, MPICH/Hydra) to rank and world size.

This is the pure part of what ``habana_frameworks.torch.distributed.hccl`` does on import:
read whichever launcher started this process and express it in torch's variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), and default the
rendezvous address (``MASTER_ADDR``/``MASTER_PORT``). ``import hccl`` calls
:func:`apply_mpi_env`; the launchers in ``launchers/`` build on :func:`resolve_rank_env`.

NOTE [which launcher wins]
    Sources are tried in this order, first match wins:

    1. ``torchrun``: ``TORCHELASTIC_RUN_ID`` is set (the elastic agent sets it in every
       worker). torchrun's ``RANK``/``WORLD_SIZE`` win even when the agent itself was
       started by ``mpirun`` (one agent per node), whose ``OMPI_*``/``PMI_*`` variables the
       workers inherit and which then describe the agent, not the worker.
    2. ``openmpi``: ``OMPI_COMM_WORLD_RANK`` or ``OMPI_COMM_WORLD_SIZE`` is set.
    3. ``pmi``: ``PMI_RANK`` or ``PMI_SIZE`` is set (MPICH's Hydra, Intel MPI).
    4. ``env``: ``RANK`` or ``WORLD_SIZE`` is set by hand (or by ``launchers.ray``).
    5. ``default``: nothing is set; a single process, rank 0 of 1.

    Under an MPI source, a ``RANK`` exported in the user's shell is inherited by every
    rank and is therefore stale: the MPI variables override it.

This module has no dependency on torch or on the rest of ``hccl``; it must not import
``launchers``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MASTER_ADDR",
    "DEFAULT_MASTER_PORT",
    "MPI_LAUNCHER_VARS",
    "RankEnv",
    "apply_mpi_env",
    "resolve_rank_env",
    "started_by_mpi",
    "torch_env_vars",
]

logger = logging.getLogger(__name__)

DEFAULT_MASTER_ADDR = "127.0.0.1"
"""Rendezvous host when ``MASTER_ADDR`` is unset: loopback, never a public interface."""

DEFAULT_MASTER_PORT = 29500
"""Rendezvous port when ``MASTER_PORT`` is unset: torch's own default."""

# Variable names per source: (rank, world size, local rank, local world size).
_SOURCES: dict[str, tuple[str, str, str, str]] = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "openmpi": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "env": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RankEnv:
    """Where this process sits in the job, as read from its launcher's environment."""

    rank: int
    """Global rank, ``0 <= rank < world_size``."""
    world_size: int
    """Number of processes (simulated Gaudis) in the job, at least 1."""
    local_rank: int
    """Rank among the processes of this host, ``0 <= local_rank < local_world_size``."""
    local_world_size: int
    """Number of processes on this host (one Gaudi box holds up to 8)."""
    master_addr: str
    """Host of the rendezvous store (``MASTER_ADDR``, default loopback)."""
    master_port: int
    """TCP port of the rendezvous store (``MASTER_PORT``, default 29500)."""
    source: str
    """Which launcher the values came from: torchrun, openmpi, pmi, env or default."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside [0, {self.world_size})")
        if self.local_world_size < 1:
            raise ValueError(f"local world size must be at least 1, got {self.local_world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local rank {self.local_rank} is outside [0, {self.local_world_size})"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master port {self.master_port} is outside 1..65535")


def _int_var(environ: Mapping[str, str], name: str) -> int | None:
    """Reads an integer variable; ``None`` when unset, ``ValueError`` naming it when bad."""
    raw = environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


MPI_LAUNCHER_VARS = (*_SOURCES["openmpi"][:2], *_SOURCES["pmi"][:2], "PMIX_RANK")
"""Variables an MPI launcher sets in every process it starts: the rank and world-size variables
of the ``openmpi`` and ``pmi`` sources (Open MPI's ``mpirun``; MPICH's and Intel MPI's Hydra
``mpiexec``, Slurm's ``srun --mpi=pmi2``), and PMIx's ``PMIX_RANK`` (Open MPI 5,
``srun --mpi=pmix``)."""


def started_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher started this process (one of :data:`MPI_LAUNCHER_VARS` is set
    in ``environ``, default ``os.environ``). Without one, initialising MPI makes this process
    an MPI job of its own (a *singleton*: MPICH then creates a ``/dev/shm/mpich_shm_*`` file,
    left behind if the process is killed)."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in MPI_LAUNCHER_VARS)


def _detect_source(environ: Mapping[str, str]) -> str:
    if "TORCHELASTIC_RUN_ID" in environ:
        return "torchrun"
    for source in ("openmpi", "pmi", "env"):
        rank_var, size_var, _, _ = _SOURCES[source]
        if rank_var in environ or size_var in environ:
            return source
    return "default"


def resolve_rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """Maps a launcher's environment to rank, world size, local rank and rendezvous.

    Pure: reads ``environ`` (default ``os.environ``) and changes nothing. See
    ``NOTE [which launcher wins]`` in this module for the precedence of sources.

    When a source gives no local world size (for example ``PMI_RANK`` without Hydra's
    ``MPI_LOCALNRANKS``), all ranks are taken to be on this host; when it gives the size
    but no local rank, ranks are taken to be placed in blocks: local rank = rank mod size.

    Args:
        environ: The environment to read; ``os.environ`` when ``None``.

    Returns:
        The resolved :class:`RankEnv`.

    Raises:
        ValueError: A variable is not an integer, a rank is not below its world size, or
            only one of a source's rank/world-size pair is set; the message names the
            variable(s).
    """
    environ = os.environ if environ is None else environ
    source = _detect_source(environ)
    master_addr = environ.get("MASTER_ADDR", "").strip() or DEFAULT_MASTER_ADDR
    port = _int_var(environ, "MASTER_PORT")
    master_port = DEFAULT_MASTER_PORT if port is None else port
    if not 0 < master_port < 65536:
        raise ValueError(f"MASTER_PORT={environ['MASTER_PORT']!r} is not a port in 1..65535")
    if source == "default":
        return RankEnv(
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            master_addr=master_addr,
            master_port=master_port,
            source=source,
        )

    rank_var, size_var, local_rank_var, local_size_var = _SOURCES[source]
    rank = _int_var(environ, rank_var)
    world_size = _int_var(environ, size_var)
    if rank is None or world_size is None:
        missing = rank_var if rank is None else size_var
        present = size_var if rank is None else rank_var
        raise ValueError(f"{present} is set but {missing} is not ({source} launcher)")
    if world_size < 1:
        raise ValueError(f"{size_var}={world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"{rank_var}={rank} is not in [0, {size_var}={world_size})")

    local_rank = _int_var(environ, local_rank_var)
    local_world_size = _int_var(environ, local_size_var)
    # No per-host values: assume one host (local world = world); with only the per-host
    # size, assume ranks are placed in blocks of that size (mpirun's default --map-by).
    if local_world_size is None:
        local_world_size = world_size
    if local_rank is None:
        local_rank = rank % local_world_size if local_world_size > 0 else rank
    if local_world_size < 1 or local_world_size > world_size:
        raise ValueError(
            f"{local_size_var}={local_world_size} is not in [1, {size_var}={world_size}]"
        )
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"{local_rank_var}={local_rank} is not in [0, {local_size_var}={local_world_size})"
        )
    return RankEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=master_addr,
        master_port=master_port,
        source=source,
    )


def torch_env_vars(rank_env: RankEnv) -> dict[str, str]:
    """The torch variables (``RANK`` ... ``MASTER_PORT``) that describe ``rank_env``."""
    return {
        "RANK": str(rank_env.rank),
        "WORLD_SIZE": str(rank_env.world_size),
        "LOCAL_RANK": str(rank_env.local_rank),
        "LOCAL_WORLD_SIZE": str(rank_env.local_world_size),
        "MASTER_ADDR": rank_env.master_addr,
        "MASTER_PORT": str(rank_env.master_port),
    }


def apply_mpi_env(environ: MutableMapping[str, str] | None = None) -> RankEnv:
    """Gives ``habana_frameworks.torch.distributed.hccl``-style behaviour on import.

    Under an MPI launcher (Open MPI or MPICH/Hydra) writes ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` from the MPI variables (overriding stale
    values, with a warning). Under any launcher defaults ``MASTER_ADDR`` (loopback) and
    ``MASTER_PORT`` (29500) when unset. Under torchrun, by hand or with no launcher, the
    rank variables are left as they are.

    Args:
        environ: The environment to update; ``os.environ`` when ``None``.

    Returns:
        The resolved :class:`RankEnv`.

    Raises:
        ValueError: As :func:`resolve_rank_env`; ``environ`` is then left unchanged.
    """
    environ = os.environ if environ is None else environ
    rank_env = resolve_rank_env(environ)
    wanted = torch_env_vars(rank_env)
    if rank_env.source in ("openmpi", "pmi"):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            old = environ.get(name)
            if old is not None and old != wanted[name]:
                logger.warning(
                    "%s=%s overridden by the %s launcher's value %s",
                    name,
                    old,
                    rank_env.source,
                    wanted[name],
                )
            environ[name] = wanted[name]
    environ.setdefault("MASTER_ADDR", wanted["MASTER_ADDR"])
    environ.setdefault("MASTER_PORT", wanted["MASTER_PORT"])
    return rank_env
