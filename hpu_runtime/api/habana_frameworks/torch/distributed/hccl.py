"""``habana_frameworks.torch.distributed.hccl``: registers "hccl" and maps the launcher's variables.

Importing it, as on Gaudi, registers the emulated "hccl" torch.distributed backend and calls
:func:`initialize_distributed_hpu` once: Open MPI / MPICH (PMI) variables become torch's
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (see :mod:`hccl.env`), and ``MASTER_ADDR`` /
``MASTER_PORT`` get loopback defaults. Gaudi's own defaults are ``localhost:12345``; the
emulator keeps torch's port 29500 (:data:`hccl.env.DEFAULT_MASTER_PORT`).
"""

from __future__ import annotations

import os

import hccl as _hccl
from hccl.env import apply_mpi_env, resolve_rank_env

__all__ = ["initialize_distributed_hpu"]


def initialize_distributed_hpu(world_size: int | None = None, rank: int | None = None,
                               local_rank: int | None = None) -> tuple[int, int, int]:
    """Return ``(world_size, rank, local_rank)`` of this process, as Gaudi's helper does.

    With all three arguments given they are written to ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``.
    Otherwise the launcher's variables are read (torchrun, Open MPI, MPICH/PMI, or ``RANK`` /
    ``WORLD_SIZE`` by hand) and written as torch's. A process started by no launcher gets
    Gaudi's answer ``(1, -1, -1)``, which its scripts read as "not distributed".

    A partial environment (Lightning's launcher exports ``WORLD_SIZE`` and ``LOCAL_RANK``
    before it knows ``RANK``) is read as Gaudi's helper reads it, variable by variable with
    defaults ``1, -1, -1``, and nothing is written.

    Raises:
        ValueError: a variable that is not an integer, naming it.
    """
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local_rank))
    try:
        env = resolve_rank_env(os.environ)
    except ValueError:
        return tuple(_int_env(name, default) for name, default in (("WORLD_SIZE", 1), ("RANK", -1), ("LOCAL_RANK", -1)))
    if env.source == "default":
        return 1, -1, -1
    apply_mpi_env()
    return env.world_size, env.rank, env.local_rank


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


_hccl.register_backend()
initialize_distributed_hpu()
