"""Rank/world mapping for the launchers: one place that turns a launcher into torch's variables.

Builds on the pure mapping in :mod:`hccl.env` (torchrun, Open MPI, MPICH/Hydra) and adds
what a launcher needs around it: writing the complete set of torch variables, choosing a
free rendezvous port on loopback, and deriving local ranks from the host of each rank
(used by ``launchers.mpi`` with MPI processor names and by ``launchers.ray`` with Ray
node ids).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hccl.env import RankEnv

# NOTE [lazy hccl import]: importing ``hccl.env`` runs ``hccl/__init__`` (torch, the
# backend). A Ray driver needs none of that, so the names below are loaded on first use.
_FROM_HCCL_ENV = ("DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "RankEnv", "resolve_rank_env")


def __getattr__(name: str) -> Any:
    if name in _FROM_HCCL_ENV:
        return getattr(importlib.import_module("hccl.env"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT_MASTER_ADDR",
    "DEFAULT_MASTER_PORT",
    "LOOPBACK",
    "RankEnv",
    "export_rank_env",
    "find_free_port",
    "configure_logging",
    "local_ranks",
    "one_thread_per_rank",
    "rendezvous_host",
    "resolve_rank_env",
    "setup_rank_env",
]

LOOPBACK = "127.0.0.1"
"""Address the launchers rendezvous on when every rank is on one host."""


def export_rank_env(rank_env: RankEnv, environ: MutableMapping[str, str] | None = None) -> None:
    """Writes ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` for ``rank_env`` into ``environ`` (default
    ``os.environ``), overwriting what was there."""
    from hccl.env import torch_env_vars

    environ = os.environ if environ is None else environ
    environ.update(torch_env_vars(rank_env))


def setup_rank_env(environ: MutableMapping[str, str] | None = None) -> RankEnv:
    """Resolves this process's launcher environment and exports the torch variables.

    Unlike :func:`hccl.env.apply_mpi_env`, always writes the full set of six variables,
    so the script started next sees a complete ``env://`` rendezvous.

    Args:
        environ: The environment to read and update; ``os.environ`` when ``None``.

    Returns:
        The resolved :class:`RankEnv`.

    Raises:
        ValueError: A launcher variable is malformed (the message names it).
    """
    from hccl.env import resolve_rank_env

    environ = os.environ if environ is None else environ
    rank_env = resolve_rank_env(environ)
    export_rank_env(rank_env, environ)
    return rank_env


def find_free_port(host: str = LOOPBACK) -> int:
    """Asks the OS for a free TCP port on ``host`` (loopback by default).

    The port is released before returning, so another process could take it in
    between; the rendezvous store binds it within milliseconds, as torchrun does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_ranks(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """Derives ``(local_rank, local_world_size)`` for each rank from the host of each rank.

    Args:
        hosts: ``hosts[r]`` identifies the machine (or Ray node) of rank ``r``.

    Returns:
        One ``(local_rank, local_world_size)`` per rank: the rank's position among the
        ranks of its host (in global-rank order) and the number of ranks on that host.

    Example:
        >>> local_ranks(["a", "b", "a", "b"])
        [(0, 2), (0, 2), (1, 2), (1, 2)]
    """
    counts: dict[str, int] = {}
    positions = []
    for host in hosts:
        positions.append(counts.get(host, 0))
        counts[host] = positions[-1] + 1
    return [(pos, counts[host]) for pos, host in zip(positions, hosts, strict=True)]


def rendezvous_host(hosts: Sequence[str], rank0_address: str) -> str:
    """Chooses ``MASTER_ADDR``: loopback when all ranks share a host, else rank 0's address.

    Args:
        hosts: Host identifier of every rank (see :func:`local_ranks`).
        rank0_address: A routable address of rank 0's host, used for a multi-host job.
    """
    return LOOPBACK if len(set(hosts)) <= 1 else rank0_address


def one_thread_per_rank(local_world_size: int) -> None:
    """torchrun's default: with several ranks on a host and ``OMP_NUM_THREADS`` unset, give
    each rank one intra-op thread (so 4 ranks on 2 cores do not run 8 busy threads)."""
    if local_world_size <= 1 or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def configure_logging(level: str = "INFO") -> None:
    """Sends the ``launchers`` loggers to stderr without touching the root logger, so the
    target's own ``logging.basicConfig`` (e.g. ``models.train --log-level``) still applies."""
    log = logging.getLogger("launchers")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
