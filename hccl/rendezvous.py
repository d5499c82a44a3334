"""A group's rendezvous: who is on which host, and which data-plane driver moves its bytes.

:func:`rendezvous` runs once per process group, at creation. Through the group's c10d store
(small strings only, never tensor data) the ranks agree on a job token, publish their host
keys (:meth:`~hccl.config.HcclConfig.host_key`), map the shared-memory segments of the ranks
on their host and, when the group spans hosts, connect the hosts' leaders over TCP. The
result is the collectives driver the process group calls (:class:`Rendezvous`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from ._buffers import meta_words
from .config import HcclConfig
from .transport import shm_engine as eng
from .transport.multihost import HostLayout, MultiHost
from .transport.shm import ShmArena, ShmSegment
from .transport.tcp import TcpMesh

__all__ = ["Rendezvous", "rendezvous"]


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """What a group's rendezvous found."""

    layout: HostLayout
    """Which ranks share each host; this rank's place among them."""
    coll: object
    """The collectives driver: ``ShmCollectives`` (one host), ``MultiHost`` (several) or
    ``MpiCollectives`` (``HCCL_TRANSPORT=mpi``). Each has the collectives, ``arena`` and
    ``close()``."""


def rendezvous(store: dist.Store, rank: int, world_size: int, timeout_s: float, config: HcclConfig) -> Rendezvous:
    """Map the host-local peers' segments; connect the hosts' leaders over TCP.

    Args:
        store: the group's c10d store.
        rank, world_size: this rank and the group's size.
        timeout_s: limit for any single wait on peers, wall seconds.
        config: the group's frozen configuration (transport, buffer size, host id).

    Raises:
        MpiUnavailableError: ``HCCL_TRANSPORT=mpi`` without mpi4py or outside an MPI job.
        HcclTimeoutError: peers did not arrive within ``timeout_s``.
    """
    n = world_size
    store.set_timeout(timedelta(seconds=timeout_s))
    if rank == 0:
        store.set("hccl/token", secrets.token_hex(16))
    token = store.get("hccl/token").decode()
    store.set(f"hccl/host/{rank}", config.host_key())
    layout = HostLayout.from_keys([store.get(f"hccl/host/{r}").decode() for r in range(n)], rank)
    if config.transport == "mpi":
        from .transport.mpi import connect

        return Rendezvous(layout, connect(store, rank, n, timeout_s))
    local = layout.local_ranks
    capacity = config.shm_buffer_bytes
    names = {r: f"hccl_{token[:16]}_{r}" for r in local}
    mine = ShmSegment(names[rank], capacity, create=True, p2p_slots=len(local))
    segments: list[ShmSegment] = []
    mesh = None
    try:
        store.set(f"hccl/seg/{rank}", names[rank])
        store.wait([f"hccl/seg/{r}" for r in local], timedelta(seconds=timeout_s))
        for r in local:
            segments.append(mine if r == rank else ShmSegment(names[r], capacity, create=False, p2p_slots=len(local)))
        arena = ShmArena(segments, layout.local_index, timeout_s, group_ranks=list(local))
        # everyone on this host has mapped everyone: the names are no longer needed
        eng.barrier(arena, meta_words(0, "barrier", 0, 0), "hccl rendezvous")
        mine.unlink()
        if len(layout.hosts) == 1:
            return Rendezvous(layout, eng.ShmCollectives(arena))
        if layout.is_leader:
            peers = [r for r in layout.leaders if r != rank]
            mesh = TcpMesh(rank, peers, token, timeout_s)
            store.set(f"hccl/tcp/{rank}", mesh.address)
            addresses = {p: store.get(f"hccl/tcp/{p}").decode() for p in peers}
            mesh.connect(addresses)
        return Rendezvous(layout, MultiHost(layout, arena, mesh))
    except BaseException:
        if mesh is not None:
            mesh.close()
        for seg in segments or [mine]:
            seg.close()
        raise
