"""A group that spans hosts: which ranks share a host, and the transport between them.

NOTE [multi-host data path]
Collectives of a group that spans hosts run the time plane's schedules
(:class:`~hccl.transport.executor.ScheduleCollectives`) over :class:`HostsTransport`: a message
to a rank of the same host goes through that pair's shared-memory outbox (NOTE [p2p
outboxes] in :mod:`.p2p`), a message to a rank of another host over that pair's TCP
connection (every rank connects to every rank of the other hosts, token-checked, NOTE [TCP
wire format and trust] in :mod:`.tcp`). So the hierarchical algorithm's scale-out exchange
between same-local-rank cards of different boxes, or ``HCCL_ALGO=ring``'s ring, is what
really moves over the sockets. Simulated time still comes from the time plane.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .p2p import RecvOp, SendOp
from .reduce_ops import DTYPE_CODES
from .shm import ShmArena
from .tcp import TcpMesh, tensor_bytes_view

__all__ = ["HostLayout", "HostsTransport"]

_TAG = -0x48434C  # the outboxes' tag for collective traffic (user point-to-point tags are >= 0)
_BYTES = DTYPE_CODES[torch.uint8]  # the outboxes move raw bytes
_INLINE_BYTES = 16 << 10
"""NOTE [inline small phases]: a phase whose messages all cross TCP and whose sends to each
peer total at most this many bytes runs as blocking calls: every rank first sends (the
bytes fit in the kernel's socket buffers, at least 16 KiB on Linux, so ``sendall`` returns
without the peer reading), then receives. No rank waits before all its sends are out, so no
order of peers deadlocks, and a 1 KB allreduce between two hosts takes 139 us, against
about 200 us through :meth:`~.tcp.TcpMesh.pump`'s poll loop. Larger TCP-only phases go
through the pump (NOTE [one thread per phase] in :mod:`.tcp`)."""
_WIRE_TAG = b"COLL"
_TCP_NAP_S = 1e-4
"""The longest sleep on the doorbell while a phase's TCP messages are still moving (no peer
rings for bytes that arrive on a socket): NOTE [one thread per phase] in :mod:`.tcp`."""


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Which group ranks share a host.

    Attributes:
        hosts: group ranks per host, hosts ordered by their lowest rank, ranks ascending.
        rank: this process's group rank.
    """

    hosts: tuple[tuple[int, ...], ...]
    rank: int

    @staticmethod
    def from_keys(keys: list[str], rank: int) -> HostLayout:
        order: dict[str, list[int]] = {}
        for r, k in enumerate(keys):
            order.setdefault(k, []).append(r)
        return HostLayout(tuple(tuple(v) for v in order.values()), rank)

    @property
    def host(self) -> int:
        return next(i for i, h in enumerate(self.hosts) if self.rank in h)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        return self.hosts[self.host]

    @property
    def local_index(self) -> int:
        return self.local_ranks.index(self.rank)

    @property
    def world_size(self) -> int:
        return sum(len(h) for h in self.hosts)


class HostsTransport:
    """:class:`~hccl.transport.interface.Transport` over a host's :class:`ShmArena` and TCP.

    Args:
        layout: which group ranks share a host.
        arena: this host's arena (local index = position in ``layout.local_ranks``).
        mesh: connections to every rank of the other hosts (None for one host).

    Attributes:
        on_failure: called with the exception of a failed phase before this rank drops its TCP
            connections (the process group posts the first failure there, NOTE [the first failure
            names the cause] in :mod:`hccl.process_group`), so no peer on another host sees the
            connection close before the cause can be read. None: nothing is called.
    """

    on_failure: Callable[[BaseException], object] | None = None

    def __init__(self, layout: HostLayout, arena: ShmArena, mesh: TcpMesh | None) -> None:
        self.layout = layout
        self.arena = arena
        self.mesh = mesh
        self.rank = layout.rank
        self.world_size = layout.world_size
        self._local = {r: i for i, r in enumerate(layout.local_ranks)}

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
                 tag: int, what: str) -> None:
        """One phase's messages, in posting order per peer, all on the calling thread: small
        TCP-only phases inline (NOTE [inline small phases]); every other phase pumps its
        shared-memory outboxes and its TCP sockets in turn (NOTE [one thread per phase] in
        :mod:`.tcp`). Nothing blocks the pumping, so no order of peers deadlocks."""
        local_sends: dict[int, deque] = {}
        local_recvs: dict[int, deque] = {}
        remote_sends: dict[int, list[torch.Tensor]] = {}
        remote_recvs: dict[int, list[torch.Tensor]] = {}
        for peer, data in sends:
            i = self._local.get(peer)
            if i is None:
                remote_sends.setdefault(peer, []).append(data)
            else:
                local_sends.setdefault(i, deque()).append(SendOp(self.arena, i, data, _TAG, _BYTES, 0, what))
        for peer, into in recvs:
            i = self._local.get(peer)
            if i is None:
                remote_recvs.setdefault(peer, []).append(into)
            else:
                local_recvs.setdefault(i, deque()).append(RecvOp(self.arena, i, into, _TAG, _BYTES, what))
        mesh = self.mesh
        wire_sends = {p: [tensor_bytes_view(x) for x in xs] for p, xs in remote_sends.items()}
        wire_recvs = {p: [tensor_bytes_view(x) for x in xs] for p, xs in remote_recvs.items()}
        try:
            if not local_sends and not local_recvs:
                if all(sum(len(v) for v in vs) <= _INLINE_BYTES for vs in wire_sends.values()):
                    # NOTE [inline small phases]: every send, then every receive
                    for peer, views in wire_sends.items():
                        for v in views:
                            mesh.send(peer, _WIRE_TAG, tag, v)
                    for peer, views in wire_recvs.items():
                        for v in views:
                            mesh.recv(peer, _WIRE_TAG, tag, v)
                elif wire_sends or wire_recvs:  # NOTE [one thread per phase] in .tcp
                    mesh.pump(_WIRE_TAG, tag, wire_sends, wire_recvs)
                return
            # NOTE [one thread per phase] in .tcp: the TCP messages move between polls of the outboxes
            tcp = mesh.phase(_WIRE_TAG, tag, wire_sends, wire_recvs) if wire_sends or wire_recvs else None

            def done() -> bool:
                for queue in (local_sends, local_recvs):
                    for i in list(queue):
                        q = queue[i]
                        while q and q[0].progress():
                            q.popleft()
                        if not q:
                            del queue[i]
                if tcp is not None:
                    tcp.step(0.0)
                return not local_sends and not local_recvs

            awaited = sorted(set(local_sends) | set(local_recvs))
            self.arena.wait_until(done, what, awaited, max_sleep_s=None if tcp is None else _TCP_NAP_S)
            while tcp is not None and not tcp.step(mesh.timeout_s):
                pass
        except BaseException as exc:
            if mesh is not None:
                if self.on_failure is not None:  # the cause first, then the closed connections
                    self.on_failure(exc)
                mesh.close()  # the peers learn of the failure at once; no thread outlives it
            raise

    def abort(self, reason: str) -> None:
        """Raise this rank's abort flag for its host and drop its TCP connections."""
        self.arena.abort(reason)
        if self.mesh is not None:
            self.mesh.close()

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
