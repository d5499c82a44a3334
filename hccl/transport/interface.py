"""The declared interfaces of the data plane: what a transport offers the schedule executor,
and what a collectives driver offers the torch face.

A transport moves the messages of one phase between ranks (NOTE [plan semantics] in
:mod:`.plan`); the executor (:mod:`.executor`) does everything else: metadata agreement,
work buffers, reductions. Implementations: :class:`hccl.transport.multihost.HostsTransport`
(shared-memory outboxes inside a host, TCP between hosts) and
:class:`hccl.transport.mpi.MpiTransport` (mpi4py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .shm import ShmArena

__all__ = ["Transport", "Collectives"]


class Transport(Protocol):
    """Point-to-point messages among the ranks of one group (group ranks ``0..world_size-1``)."""

    rank: int
    world_size: int

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
                 tag: int, what: str) -> None:
        """Send every ``(peer, bytes)`` and receive every ``(peer, into)`` of one phase.

        Tensors are flat, contiguous ``uint8``. Returns once all sends have left ``sends``'
        tensors and all receives are in (never deadlocks, whatever the peers' order);
        messages between a pair of ranks arrive in posting order. ``tag`` (the collective's
        sequence number) is checked on arrival where the wire has room for it.

        Raises:
            PeerFailure: a peer died, aborted or closed its connection.
            HcclTimeoutError: a peer did not answer within the group's timeout.
            CollectiveMismatchError: a message has another size than its receive.
        """
        ...

    def abort(self, reason: str) -> None:
        """Tell the peers this rank failed (they raise instead of waiting), where the wire can."""
        ...

    def close(self) -> None:
        """Release connections (idempotent)."""
        ...


class Collectives(Protocol):
    """What the torch face drives: one collective per call, flat contiguous CPU tensors.

    Every method returns every rank's simulated ready time (ns, indexed by group rank);
    ``meta`` is the face's metadata words (``hccl.transport.shm.META_FIELDS``).
    """

    #: the host's shared-memory arena (point-to-point outboxes), or None (MPI: no send/recv).
    arena: ShmArena | None

    def allreduce(self, flat: torch.Tensor, op: int, meta: list[int], what: str) -> list[int]: ...

    def reduce(self, flat: torch.Tensor, op: int, root: int, meta: list[int], what: str) -> list[int]: ...

    def broadcast(self, flat: torch.Tensor, root: int, meta: list[int], what: str) -> list[int]: ...

    def allgather(self, outs: list[torch.Tensor], inp: torch.Tensor, meta: list[int], what: str) -> list[int]: ...

    def reduce_scatter(self, out: torch.Tensor, inputs: list[torch.Tensor], op: int, meta: list[int],
                       what: str) -> list[int]: ...

    def alltoall(self, outs: list[torch.Tensor], inputs: list[torch.Tensor], meta: list[int],
                 what: str) -> tuple[list[int], list[list[int]]]:
        """Also returns the (n x n) element counts group rank p sent to group rank q."""
        ...

    def barrier(self, meta: list[int], what: str) -> list[int]: ...

    def abort(self, reason: str) -> None:
        """This rank failed: tell the peers (they raise instead of waiting)."""
        ...

    def close(self) -> None: ...
