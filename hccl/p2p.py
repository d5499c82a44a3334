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
match raises an error naming both sizes. A receive from any source (:func:`recv_any`) waits
for the first outbox holding a message with its tag, then receives that message as above.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .reduce_ops import CODE_DTYPES
from .transport.shm import P2P_SENT_W, P2P_SLOT_BYTES, P2P_TAKEN_W, ShmArena

__all__ = ["SendOp", "recv", "recv_any", "P2PMismatchError"]

_HDR_BYTES = 64
_CHUNK = P2P_SLOT_BYTES - _HDR_BYTES


class P2PMismatchError(RuntimeError):
    """A receive does not match the message sent (size, dtype or tag)."""


def _byte_view(flat: torch.Tensor) -> torch.Tensor:
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


class SendOp:
    """One message from this rank to local index ``dst``, posted chunk by chunk.

    The data is copied out of ``flat`` as chunks are posted, so ``flat`` must not change
    until :attr:`done` (as with any isend).
    """

    def __init__(self, arena: ShmArena, dst: int, flat: torch.Tensor, tag: int, dtype_code: int, sim_send_ns: int, what: str) -> None:
        self.arena = arena
        self.dst = dst
        self.data = _byte_view(flat)
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
            self.off += chunk
            self.done = self.off >= total
        return True

    def wait(self, progress: Callable[[], None] | None = None) -> None:
        """Block until every chunk is posted (other queued sends progress meanwhile)."""
        while not self.progress():
            sent = int(self.arena.me.ctrl[P2P_SENT_W + self.dst])
            self.arena.wait_word(self.arena.segments[self.dst], P2P_TAKEN_W + self.arena.rank, sent, self.what, progress)


def recv(
    arena: ShmArena,
    src: int,
    flat: torch.Tensor,
    tag: int,
    dtype_code: int,
    what: str,
    progress: Callable[[], None] | None = None,
) -> int:
    """Receive into ``flat`` from local index ``src``; returns the sender's simulated send time (ns).

    Raises:
        P2PMismatchError: the message's size, dtype or tag differs from this receive's.
    """
    me, peer = arena.me, arena.segments[src]
    data = _byte_view(flat)
    total = data.numel()
    off = 0
    sim_send_ns = 0
    while True:
        taken = int(me.ctrl[P2P_TAKEN_W + src])
        arena.wait_word(peer, P2P_SENT_W + arena.rank, taken + 1, what, progress)
        slot = peer.p2p_slot[arena.rank]
        h_tag, h_total, h_off, h_chunk, h_ns, h_dtype, h_numel, _ = slot[:_HDR_BYTES].view(torch.int64).tolist()
        if off == 0:
            sim_send_ns = h_ns
            problems = []
            if h_total != total or h_dtype != dtype_code:
                dt = CODE_DTYPES.get(h_dtype)
                sent = f"{h_numel} elements of {str(dt).removeprefix('torch.')}"
                want = f"{flat.numel()} elements of {str(flat.dtype).removeprefix('torch.')}"
                problems.append(f"rank {arena.group_ranks[src]} sent {sent}, the receive expects {want}")
            if h_tag != tag:
                problems.append(f"tag {h_tag} sent, tag {tag} expected")
            if problems:
                raise P2PMismatchError(f"hccl: {what}: " + "; ".join(problems))
        if h_chunk:
            data[h_off : h_off + h_chunk].copy_(slot[_HDR_BYTES : _HDR_BYTES + h_chunk])
        me.ctrl[P2P_TAKEN_W + src] = taken + 1
        off = h_off + h_chunk
        if off >= total:
            return sim_send_ns


def recv_any(
    arena: ShmArena,
    flat: torch.Tensor,
    tag: int,
    dtype_code: int,
    what: str,
    progress: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Receive into ``flat`` the first message with ``tag`` from any local peer (MPI_ANY_SOURCE).

    Messages with another tag stay queued for a later receive. Peers are scanned in order
    from the next local rank up (as with MPI_ANY_SOURCE, no fairness is promised).

    Returns:
        (local index of the sender, the sender's simulated send time in ns).

    Raises:
        P2PMismatchError: the chosen message's size or dtype differs from this receive's.
        HcclTimeoutError: no peer sent a message with ``tag`` within the group's timeout.
    """
    me, n = arena.me, arena.world_size
    order = [(arena.rank + k) % n for k in range(1, n)]
    found: list[int] = []

    def waiting() -> bool:
        if progress is not None:
            progress()
        for src in order:
            seg = arena.segments[src]
            if int(seg.ctrl[P2P_SENT_W + arena.rank]) > int(me.ctrl[P2P_TAKEN_W + src]):
                if int(seg.p2p_slot[arena.rank][:_HDR_BYTES].view(torch.int64)[0]) == tag:
                    found.append(src)
                    return True
        return False

    arena.wait_any(waiting, f"{what} (tag {tag})")
    src = found[0]
    return src, recv(arena, src, flat, tag, dtype_code, what, progress)
