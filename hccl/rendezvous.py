"""A group's rendezvous: who is on which host, and which data-plane driver moves its bytes.

:func:`rendezvous` runs once per process group, at creation. Through the group's c10d store
(small strings only, never tensor data) the ranks agree on a job token, publish their host
keys (:meth:`~hccl.config.HcclConfig.host_key`) with the settings they must share (checked
on every rank: NOTE [settings agreement] in :mod:`hccl.agreement`), map the shared-memory segments of the ranks
on their host and, when the group spans hosts, connect every rank to every rank of the
other hosts over TCP. The result is the collectives driver the process group calls
(:class:`Rendezvous`): the one-host shared-memory engine, or the schedule executor over the
multi-host or the MPI transport.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from ._buffers import meta_words
from .agreement import check_agreement
from .config import HcclConfig
from .env import started_by_mpi
from .transport import shm_engine as eng
from .transport.executor import ScheduleCollectives
from .transport.interface import Collectives
from .transport.multihost import HostLayout, HostsTransport
from .transport.plan import Planner
from .transport.shm import PeerFailure, ShmArena, ShmSegment
from .transport.tcp import TcpMesh, listen_address

__all__ = ["Rendezvous", "rendezvous"]


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """What a group's rendezvous found."""

    layout: HostLayout
    """Which ranks share each host; this rank's place among them."""
    coll: Collectives
    """The collectives driver: ``ShmCollectives`` (one host), or ``ScheduleCollectives`` over
    ``HostsTransport`` (several hosts) or ``MpiTransport`` (``HCCL_TRANSPORT=mpi``)."""


def rendezvous(store: dist.Store, rank: int, world_size: int, timeout_s: float, config: HcclConfig,
               planner: Planner, names: list[int], settings: Mapping[str, list[str]]) -> Rendezvous:
    """Map the host-local peers' segments; connect to the other hosts' ranks over TCP.

    Args:
        store: the group's c10d store.
        rank, world_size: this rank and the group's size.
        timeout_s: limit for any single wait on peers, wall seconds.
        config: the group's frozen configuration (transport, buffer size, host id).
        planner: builds this rank's plans (the schedule executor's; called per collective).
        names: the global rank of each group rank (errors name global ranks).
        settings: this rank's :func:`~hccl.agreement.settings_of`, compared across ranks.

    Raises:
        SettingsMismatchError: ranks disagree on a setting (on every rank).
        MpiUnavailableError: ``HCCL_TRANSPORT=mpi`` without mpi4py or outside an MPI job.
        HcclTimeoutError: peers did not arrive within ``timeout_s``.
    """
    n = world_size
    store.set_timeout(timedelta(seconds=timeout_s))
    if rank == 0:
        store.set("hccl/token", secrets.token_hex(16))
    token = store.get("hccl/token").decode()
    store.set(f"hccl/host/{rank}", json.dumps({"host": config.host_key(), "settings": dict(settings)}))
    rows = [json.loads(store.get(f"hccl/host/{r}")) for r in range(n)]
    check_agreement([row["settings"] for row in rows], names)
    layout = HostLayout.from_keys([row["host"] for row in rows], rank)
    if config.transport == "mpi":
        from .transport.mpi import connect

        transport = connect(store, rank, n, timeout_s, names, in_mpi_job=started_by_mpi())
        return Rendezvous(layout, ScheduleCollectives(transport, planner, names))
    local = layout.local_ranks
    capacity = config.shm_buffer_bytes
    mine = ShmSegment(f"hccl_{token[:16]}_{rank}", capacity, create=True, p2p_slots=len(local))
    segments: list[ShmSegment] = []
    mesh = None
    try:  # NOTE [anonymous segments] in transport/shm.py: nothing named survives a death
        store.set(f"hccl/seg/{rank}", mine.path)
        paths = {r: store.get(f"hccl/seg/{r}").decode() for r in local}
        for r in local:
            segments.append(mine if r == rank else ShmSegment(paths[r], capacity, create=False, p2p_slots=len(local)))
        arena = ShmArena(segments, layout.local_index, timeout_s, names=[names[r] for r in local])
        # everyone on this host has mapped everyone: the descriptors are no longer needed
        eng.barrier(arena, meta_words(0, "barrier", 0, 0), "hccl rendezvous")
        mine.unlink()
        if len(layout.hosts) == 1:
            return Rendezvous(layout, eng.ShmCollectives(arena))
        peers = [r for r in range(n) if r not in local]
        origin = (f"HCCL_SOCKET_ADDR={config.socket_addr!r}" if config.socket_addr else
                  f"the address of HCCL_SOCKET_IFNAME={config.socket_ifname!r}" if config.socket_ifname else "")
        try:
            mesh = TcpMesh(rank, peers, token, timeout_s, origin=origin, names=names,
                           address=listen_address(config.socket_addr, config.socket_ifname))
        except ValueError as exc:  # every other rank learns why at once instead of at the timeout
            store.set(f"hccl/tcp/{rank}", f"!{exc}")
            raise
        store.set(f"hccl/tcp/{rank}", mesh.address)
        addresses = {p: store.get(f"hccl/tcp/{p}").decode() for p in range(n) if p != rank}
        failed = [f"rank {names[p]}: {a[1:]}" for p, a in addresses.items() if a.startswith("!")]
        if failed:
            raise PeerFailure("hccl: a rank of this group cannot listen for the other hosts: " + "; ".join(failed))
        mesh.connect({p: addresses[p] for p in peers})
        coll = ScheduleCollectives(HostsTransport(layout, arena, mesh), planner, names, arena=arena)
        return Rendezvous(layout, coll)
    except BaseException:
        if mesh is not None:
            mesh.close()
        for seg in segments or [mine]:
            seg.close()
        raise
