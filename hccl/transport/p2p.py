"""Point-to-point send/recv between ranks of one host, through per-peer shared-memory outboxes.

NOTE [p2p outboxes]
Each segment holds one outbox per local peer (``P2P_SLOT_BYTES``, a 64-byte header then
data). Rank s writes a message chunk into its outbox for d and bumps its ``sent[d]`` word;
rank d copies the chunk out and bumps its ``taken[s]`` word; s writes the next chunk only
when ``taken`` caught up with ``sent``. A send never blocks the caller: :class:`SendOp`
posts what fits and the rest is pushed whenever this rank waits (in a receive, in
``Work.wait()``, or before its next collective), so ``isend``/``irecv`` pairs in any order
make progress, as with MPI or NCCL. Every wait has the group's timeout. The header carries
the sender's simulated send time, the tag, dtype and size; a receive whose tensor does not
match raises an error naming both sizes. A receive never blocks either: :class:`RecvOp`
takes chunks as they arrive whenever this rank waits, so ``irecv`` may come before the
matching ``isend`` on both ranks. A receive from any source takes the first outbox whose
waiting message carries its tag.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .reduce_ops import CODE_DTYPES
from .shm import P2P_SENT_W, P2P_SLOT_BYTES, P2P_TAKEN_W, ShmArena

__all__ = ["SendOp", "RecvOp", "P2PMismatchError", "byte_view"]

_HDR_BYTES = 64
_CHUNK = P2P_SLOT_BYTES - _HDR_BYTES


class P2PMismatchError(RuntimeError):
    """A receive does not match the message sent (size, dtype or tag)."""


def byte_view(flat: torch.Tensor) -> torch.Tensor:
    """The flat ``uint8`` view of a flat contiguous tensor (no copy)."""
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


class SendOp:
    """One message from this rank to local index ``dst``, posted chunk by chunk.

    The data is copied out of ``flat`` as chunks are posted, so ``flat`` must not change
    until :attr:`done` (as with any isend).
    """

    def __init__(self, arena: ShmArena, dst: int, flat: torch.Tensor, tag: int, dtype_code: int, sim_send_ns: int, what: str) -> None:
        self.arena = arena
        self.dst = dst
        self.data = byte_view(flat)
        self.header = [tag, self.data.numel(), 0, 0, sim_send_ns, dtype_code, flat.numel(), 0]
        self.what = what
        self.off = 0
        self.done = False

    def progress(self) -> bool:
        """Post chunks while the outbox is free; returns :attr:`done` (never blocks)."""
        me, peer, dst = self.arena.me, self.arena.segments[self.dst], self.dst
        total = self.header[1]
        while not self.done:
            sent = int(me.ctrl[P2P_SENT_W + dst])
            if int(peer.ctrl[P2P_TAKEN_W + self.arena.rank]) < sent:
                return False  # the receiver has not taken the previous chunk yet
            chunk = min(_CHUNK, total - self.off)
            slot = me.p2p_slot[dst]
            self.header[2], self.header[3] = self.off, chunk
            slot[:_HDR_BYTES].view(torch.int64).copy_(torch.tensor(self.header, dtype=torch.int64))
            if chunk:
                slot[_HDR_BYTES : _HDR_BYTES + chunk].copy_(self.data[self.off : self.off + chunk])
            me.ctrl[P2P_SENT_W + dst] = sent + 1
            self.arena.note_progress(dst)
            self.off += chunk
            self.done = self.off >= total
        return True

    def wait(self, progress: Callable[[], None] | None = None) -> None:
        """Block until every chunk is posted (other queued sends progress meanwhile)."""
        while not self.progress():
            sent = int(self.arena.me.ctrl[P2P_SENT_W + self.dst])
            self.arena.wait_word(self.arena.segments[self.dst], P2P_TAKEN_W + self.arena.rank, sent, self.what, progress)


class RecvOp:
    """One message into ``flat`` from local index ``src`` (None: the first local peer whose next
    message carries ``tag``, as MPI_ANY_SOURCE), taken chunk by chunk as it arrives.

    :meth:`progress` never blocks, so a receive may be posted before the matching send
    (``irecv`` then ``isend`` on both ranks). ``flat`` holds the message once :attr:`done`;
    :attr:`src` then names the sender and :attr:`sent_ns` its simulated send time.
    """

    def __init__(self, arena: ShmArena, src: int | None, flat: torch.Tensor, tag: int, dtype_code: int, what: str) -> None:
        self.arena = arena
        self.src = src
        self.flat = flat
        self.data = byte_view(flat)
        self.tag = tag
        self.dtype_code = dtype_code
        self.what = what
        self.off = 0
        self.sent_ns = 0
        self.done = False

    def _choose(self, skip: set[int]) -> bool:
        """Any source: take the first peer (from the next local rank up, not in ``skip``) whose
        waiting message carries this tag; messages with another tag stay for later receives."""
        arena, me, n = self.arena, self.arena.me, self.arena.world_size
        for k in range(1, n):
            src = (arena.rank + k) % n
            if src in skip:
                continue
            seg = arena.segments[src]
            if int(seg.ctrl[P2P_SENT_W + arena.rank]) > int(me.ctrl[P2P_TAKEN_W + src]):
                if int(seg.p2p_slot[arena.rank][:_HDR_BYTES].view(torch.int64)[0]) == self.tag:
                    self.src = src
                    return True
        return False

    def progress(self, skip: set[int] = frozenset()) -> bool:
        """Copy out the chunks that have arrived; returns :attr:`done` (never blocks).

        ``skip``: local peers an any-source receive must not match (an earlier receive waits
        for their next message).

        Raises:
            P2PMismatchError: the message's size, dtype or tag differs from this receive's.
        """
        arena, me = self.arena, self.arena.me
        total = self.data.numel()
        while not self.done:
            if self.src is None and not self._choose(set(skip)):
                return False
            src, peer = self.src, self.arena.segments[self.src]
            taken = int(me.ctrl[P2P_TAKEN_W + src])
            if int(peer.ctrl[P2P_SENT_W + arena.rank]) <= taken:
                return False
            slot = peer.p2p_slot[arena.rank]
            h_tag, h_total, h_off, h_chunk, h_ns, h_dtype, h_numel, _ = slot[:_HDR_BYTES].view(torch.int64).tolist()
            if self.off == 0:
                self.sent_ns = h_ns
                problems = []
                if h_total != total or h_dtype != self.dtype_code:
                    dt = CODE_DTYPES.get(h_dtype)
                    sent = f"{h_numel} elements of {str(dt).removeprefix('torch.')}"
                    want = f"{self.flat.numel()} elements of {str(self.flat.dtype).removeprefix('torch.')}"
                    problems.append(f"rank {arena.names[src]} sent {sent}, the receive expects {want}")
                if h_tag != self.tag:
                    problems.append(f"tag {h_tag} sent, tag {self.tag} expected")
                if problems:
                    raise P2PMismatchError(f"hccl: {self.what}: " + "; ".join(problems))
            if h_chunk:
                self.data[h_off : h_off + h_chunk].copy_(slot[_HDR_BYTES : _HDR_BYTES + h_chunk])
            me.ctrl[P2P_TAKEN_W + src] = taken + 1
            arena.note_progress(src)
            self.off = h_off + h_chunk
            self.done = self.off >= total
        return True
