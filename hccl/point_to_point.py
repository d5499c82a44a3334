"""Point-to-point face of :class:`~hccl.process_group.ProcessGroupHCCL`: send, recv, recv
from any source, between ranks of one host.

A send is posted into the receiver's per-peer slot and returns at once; a receive is queued
and finished by its Work's ``wait()`` (NOTE [p2p outboxes] in :mod:`hccl.transport.p2p`).
Queued operations progress whenever the group touches the data plane; a collective first
drains them, which keeps per-peer order simple.
"""

from __future__ import annotations

import torch

from ._buffers import flat, writeback
from .collectives import real_views
from .transport import p2p
from .transport.reduce_ops import check_dtype
from .work import CollectiveRecord, HcclWork

__all__ = ["PointToPointMixin"]


class PointToPointMixin:
    """send, recv, recv_anysource and the queue of posted operations."""

    def _local_peer(self, peer: int, what: str) -> int:
        if not 0 <= peer < self._world_size:
            raise ValueError(f"hccl: {what} peer rank {peer} out of range for world size {self._world_size}")
        if peer == self._rank:
            raise ValueError(f"hccl: {what} to/from itself (rank {peer})")
        local = self.layout.local_ranks
        if peer not in local:
            raise NotImplementedError(
                f"hccl: {what} between hosts (rank {self._rank} -> rank {peer}) is not supported;"
                " point-to-point works between ranks of one host"
            )
        return local.index(peer)

    def _p2p_prologue(self, tensors, peer: int | None, kind: str):
        """Checks shared by send and recv; returns (tensor, dtype code, local peer, flat view, ready ns).

        ``peer`` None (a receive from any source) skips the peer checks; local peer is then None.
        """
        self._check_usable()
        tensors = real_views(kind, None, tensors)
        self._check(kind, tensors=tensors)
        if self._coll is None or self._coll.arena is None:
            raise NotImplementedError(
                "hccl: send/recv is not supported with HCCL_TRANSPORT=mpi; use the default"
                " shared-memory transport (HCCL_TRANSPORT=shm) for point-to-point"
            )
        t = tensors[0]
        local_peer = None if peer is None else self._local_peer(peer, kind)
        return t, check_dtype(t), local_peer, flat(t), self._device.collective_ready_ns()

    def send(self, tensors, dst, tag=0):
        """Send ``tensors[0]`` to rank ``dst``; returns at once (see NOTE [p2p outboxes])."""
        t, dcode, peer, buf, ready = self._p2p_prologue(tensors, dst, "send")
        what = f"send to rank {dst}"
        op = p2p.SendOp(self._coll.arena, peer, buf, tag, dcode, ready, what)
        self._guarded(what, op.progress)
        if not op.done:
            self._sends.append(op)
        nbytes = t.numel() * t.element_size()
        start, end, _ = self._p2p_times(nbytes, src=self._rank, dst=dst, src_ready_ns=ready, dst_ready_ns=0)
        return self._record(what, "send", -1, nbytes, start, end, "p2p", tensors,
                            pending=op, drain=self._wait_p2p)

    def recv(self, tensors, src, tag=0):
        """Post a receive into ``tensors[0]`` from rank ``src``; returns at once, the bytes are in
        by the Work's ``wait()`` (``dist.recv`` waits; see NOTE [p2p outboxes])."""
        t, dcode, peer, buf, ready = self._p2p_prologue(tensors, src, "recv")
        return self._post_recv(f"recv from rank {src}", t, buf, peer, tag, dcode, ready)

    def recv_anysource(self, tensors, tag=0):
        """Post a receive into ``tensors[0]`` of the first message with ``tag`` from any rank of
        this host (``dist.recv(t)`` without ``src``); the Work's ``_source_rank()`` names the sender."""
        if len(self.layout.hosts) > 1:
            raise NotImplementedError(
                "hccl: recv from any source works between ranks of one host; this group spans"
                f" {len(self.layout.hosts)} hosts"
            )
        t, dcode, _, buf, ready = self._p2p_prologue(tensors, None, "recv")
        return self._post_recv("recv from any source", t, buf, None, tag, dcode, ready)

    def _post_recv(self, what: str, t: torch.Tensor, buf: torch.Tensor, peer: int | None, tag: int, dcode: int,
                   ready: int) -> HcclWork:
        """Queue a :class:`p2p.RecvOp`; its Work finishes it (time, record, sender) on wait."""
        op = p2p.RecvOp(self._coll.arena, peer, buf, tag, dcode, what)
        self._recvs.append(op)
        self._guarded(what, self._progress_p2p)
        nbytes = t.numel() * t.element_size()
        work: HcclWork

        def finish(op) -> None:
            self._wait_p2p(op)
            writeback(t, buf)
            src = self.layout.local_ranks[op.src]
            _, end, _ = self._p2p_times(nbytes, src=src, dst=self._rank, src_ready_ns=op.sent_ns, dst_ready_ns=ready)
            start = max(ready, op.sent_ns)
            self._device.record_collective(what, start, end, [t])
            work.record = self._remember(CollectiveRecord(seq=-1, kind="recv", nbytes=nbytes, start_ns=start,
                                                          end_ns=end, algorithm="p2p"))
            work.set_source(src)

        work = HcclWork([t], CollectiveRecord(seq=-1, kind="recv", nbytes=nbytes, start_ns=ready, end_ns=ready,
                                              algorithm="p2p (pending)"), self._device, pending=op, drain=finish)
        return work

    def _progress_p2p(self) -> None:
        """Push queued sends and take arrived receives (never blocks).

        A receive waits while an earlier one may match the same message: one from the same
        peer, or one from any source that has not picked its peer yet (MPI's matching order).
        """
        if self._sends:
            self._sends = [op for op in self._sends if not op.progress()]
        if self._recvs:
            busy: set[int] = set()  # peers whose next message an earlier receive waits for
            open_any = False
            for op in self._recvs:
                if not open_any and (op.src is None or op.src not in busy):
                    op.progress(busy)
                if not op.done:
                    if op.src is None:
                        open_any = True
                    else:
                        busy.add(op.src)
            self._recvs = [op for op in self._recvs if not op.done]

    def _wait_p2p(self, op) -> None:
        """Block until ``op`` (a queued send or receive) is done, progressing every other one."""
        if op.done:
            return

        def finished() -> bool:
            self._progress_p2p()
            return op.done

        awaited = [op.dst] if isinstance(op, p2p.SendOp) else ([op.src] if op.src is not None else None)
        self._guarded(op.what, lambda: self._coll.arena.wait_until(finished, op.what, awaited))

    def _drain_p2p(self) -> None:
        """Finish queued receives and sends before a collective (keeps per-peer order simple)."""
        while self._recvs:
            self._wait_p2p(self._recvs[0])
        while self._sends:
            self._wait_p2p(self._sends[0])
