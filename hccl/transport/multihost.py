"""Collectives for a group that spans hosts: shared memory inside a host, TCP between hosts.

NOTE [hierarchical data path]
Ranks are grouped by host (the lowest rank of a host is its *leader*). A collective runs in
three stages, mirroring HCCL's scale-up/scale-out split:

1. inside each host, over the shared-memory arena (``hccl.transport.shm_engine``);
2. between the leaders, over the TCP mesh: every leader sends every other leader a fixed
   header (the collective's metadata words, checked for mismatches, plus its host's
   simulated ready times) and then the payload the collective needs;
3. inside each host again: the leader hands the result (and the job-wide ready times) to
   its local ranks.

Cross-host reductions combine the hosts' partial results in host order on every leader, so
every rank of the job ends with the same bits. A failure on a leader aborts its host's arena,
so its local ranks raise instead of waiting.

This is the numerics path only; simulated time comes from the network model, which charges
cross-host traffic on the scale-out ports whatever the real transport is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import shm_engine as eng
from .reduce_ops import combine, finish
from .shm_engine import META_INDEX, CollectiveMismatchError, _raise_mismatch
from .shm import ShmArena
from .tcp import TcpMesh, tensor_bytes_view

__all__ = ["HostLayout", "MultiHost"]

_READY = META_INDEX["ready_ns"]
_NMETA = len(eng.META_FIELDS)


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
    def leaders(self) -> tuple[int, ...]:
        return tuple(h[0] for h in self.hosts)

    @property
    def is_leader(self) -> bool:
        return self.local_index == 0

    @property
    def world_size(self) -> int:
        return sum(len(h) for h in self.hosts)

    def host_of(self, rank: int) -> int:
        return next(i for i, h in enumerate(self.hosts) if rank in h)


class MultiHost:
    """Hierarchical collectives over a local :class:`ShmArena` and a leaders' :class:`TcpMesh`."""

    def __init__(self, layout: HostLayout, arena: ShmArena, mesh: TcpMesh | None) -> None:
        self.layout = layout
        self.arena = arena
        self.mesh = mesh

    # ---- building blocks --------------------------------------------------------------
    def _leaders_exchange(self, meta: list[int], local_ready: list[int], what: str) -> list[int]:
        """Leaders swap metadata + ready times; returns the job-wide ready times (leaders only)."""
        lay = self.layout
        n = lay.world_size
        ready = [0] * n
        for r, t in zip(lay.local_ranks, local_ready):
            ready[r] = t
        if self.mesh is None or not self.mesh.peers:
            return ready
        mine = torch.tensor(meta + [len(local_ready)] + local_ready, dtype=torch.int64)
        recv = {}
        for h, ranks in enumerate(lay.hosts):
            p = ranks[0]
            if p != lay.rank:
                recv[p] = torch.empty(_NMETA + 1 + len(ranks), dtype=torch.int64)
        self.mesh.exchange(b"META", meta[0], tensor_bytes_view(mine), {p: tensor_bytes_view(t) for p, t in recv.items()})
        rows = {lay.rank: meta}
        for p, t in recv.items():
            vals = t.tolist()
            rows[p] = vals[:_NMETA]
            for r, v in zip(lay.hosts[lay.host_of(p)], vals[_NMETA + 1 :]):
                ready[r] = v
        for p, row in rows.items():
            if row[:_READY] != meta[:_READY] or row[_READY + 1 :] != meta[_READY + 1 :]:
                ordered = [rows[q] for q in sorted(rows)]
                _raise_mismatch(ordered, meta)
        return ready

    def _finish_local(self, meta: list[int], ready: list[int], what: str, payload: torch.Tensor | None) -> list[int]:
        """Stage 3: the leader hands ``payload`` (if any) and the job-wide ready times to its host."""
        bmeta = list(meta)
        bmeta[META_INDEX["kind"]] = eng.KIND_CODES["broadcast"]
        bmeta[META_INDEX["op"]] = 0
        bmeta[META_INDEX["root"]] = 0
        if payload is not None:
            bmeta[META_INDEX["numel"]] = payload.numel()
            eng.broadcast(self.arena, payload, 0, bmeta, what)
        rt = torch.tensor(ready, dtype=torch.int64)
        bmeta[META_INDEX["numel"]] = rt.numel()
        bmeta[META_INDEX["dtype"]] = 5
        eng.broadcast(self.arena, rt, 0, bmeta, what)
        return rt.tolist()

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except BaseException as exc:
            self.arena.abort(str(exc))
            raise

    # ---- collectives --------------------------------------------------------------------
    def allreduce(self, flat: torch.Tensor, op: int, meta: list[int], what: str) -> list[int]:
        """In place: reduce over every rank of every host."""
        lay = self.layout
        local_op = 1 if op == 2 else op  # AVG: sum now, divide by the job's size at the end
        lmeta = list(meta)
        lmeta[META_INDEX["op"]] = local_op
        local_ready = eng.allreduce(self.arena, flat, local_op, lmeta, what)
        ready = None
        if lay.is_leader:
            ready = self._guard(self._leader_allreduce, flat, op, meta, local_ready, what)
        return self._finish_local(meta, ready or [0] * lay.world_size, what, flat)

    def _leader_allreduce(self, flat, op, meta, local_ready, what):
        lay = self.layout
        ready = self._leaders_exchange(meta, local_ready, what)
        if self.mesh is not None and self.mesh.peers:
            parts = {p: torch.empty_like(flat) for p in self.mesh.peers}
            self.mesh.exchange(b"DATA", meta[0], tensor_bytes_view(flat), {p: tensor_bytes_view(t) for p, t in parts.items()})
            parts[lay.rank] = flat.clone()
            local_op = 1 if op == 2 else op
            flat.copy_(parts[lay.leaders[0]])
            for p in lay.leaders[1:]:
                combine(local_op, flat, parts[p])
        finish(op, flat, lay.world_size)
        return ready

    def broadcast(self, flat: torch.Tensor, root: int, meta: list[int], what: str) -> list[int]:
        """Every rank's ``flat`` becomes ``root``'s."""
        lay = self.layout
        root_host = lay.host_of(root)
        local_ready = None
        if lay.host == root_host:
            local_ready = eng.broadcast(self.arena, flat, lay.local_ranks.index(root), meta, what)
        else:
            local_ready = eng.barrier(self.arena, _as_barrier(meta), what)
        ready = None
        if lay.is_leader:
            ready = self._guard(self._leader_broadcast, flat, root_host, meta, local_ready, what)
        payload = flat if lay.host != root_host else None
        return self._finish_local(meta, ready or [0] * lay.world_size, what, payload)

    def _leader_broadcast(self, flat, root_host, meta, local_ready, what):
        lay = self.layout
        ready = self._leaders_exchange(meta, local_ready, what)
        src = lay.hosts[root_host][0]
        if self.mesh is not None and self.mesh.peers:
            if lay.rank == src:
                for p in self.mesh.peers:
                    self.mesh.send(p, b"BCST", meta[0], tensor_bytes_view(flat))
            else:
                self.mesh.recv(src, b"BCST", meta[0], tensor_bytes_view(flat))
        return ready

    def allgather(self, outs: list[torch.Tensor], inp: torch.Tensor, meta: list[int], what: str) -> list[int]:
        """``outs[r]`` (flat, ``inp.numel()`` each) receives rank r's ``inp``."""
        lay = self.layout
        local_outs = [outs[r] for r in lay.local_ranks]
        local_ready = eng.allgather(self.arena, local_outs, inp, meta, what)
        remote = [r for r in range(lay.world_size) if r not in lay.local_ranks]
        m = inp.numel()
        buf = torch.empty(len(remote) * m, dtype=inp.dtype)
        ready = None
        if lay.is_leader:
            ready = self._guard(self._leader_allgather, outs, buf, remote, m, meta, local_ready, what)
        ready = self._finish_local(meta, ready or [0] * lay.world_size, what, buf if remote else None)
        if not lay.is_leader:
            for i, r in enumerate(remote):
                outs[r].copy_(buf[i * m : (i + 1) * m])
        return ready

    def _leader_allgather(self, outs, buf, remote, m, meta, local_ready, what):
        lay = self.layout
        ready = self._leaders_exchange(meta, local_ready, what)
        if self.mesh is not None and self.mesh.peers:
            mine = torch.cat([outs[r] for r in lay.local_ranks]) if m else torch.empty(0, dtype=buf.dtype)
            blocks = {p: torch.empty(len(lay.hosts[lay.host_of(p)]) * m, dtype=buf.dtype) for p in self.mesh.peers}
            self.mesh.exchange(b"GATH", meta[0], tensor_bytes_view(mine), {p: tensor_bytes_view(t) for p, t in blocks.items()})
            for p, block in blocks.items():
                for i, r in enumerate(lay.hosts[lay.host_of(p)]):
                    outs[r].copy_(block[i * m : (i + 1) * m])
        for i, r in enumerate(remote):
            buf[i * m : (i + 1) * m].copy_(outs[r])
        return ready

    def reduce_scatter(self, out: torch.Tensor, inputs: list[torch.Tensor], op: int, meta: list[int], what: str) -> list[int]:
        """``out`` = op over ranks of their ``inputs[this rank]`` (via a job-wide allreduce)."""
        full = torch.cat(inputs) if inputs else torch.empty(0, dtype=out.dtype)
        ready = self.allreduce(full, op, meta, what)
        m = out.numel()
        out.copy_(full[self.layout.rank * m : (self.layout.rank + 1) * m])
        return ready

    def reduce(self, flat: torch.Tensor, op: int, root: int, meta: list[int], what: str) -> list[int]:
        """Reduce into root's ``flat``; other ranks' tensors are unchanged."""
        work = flat.clone()
        ready = self.allreduce(work, op, meta, what)
        if self.layout.rank == root:
            flat.copy_(work)
        return ready

    def alltoall(self, outs: list[torch.Tensor], inputs: list[torch.Tensor], meta: list[int], what: str) -> list[int]:
        """``outs[q]`` receives rank q's ``inputs[this rank]`` (via job-wide allgathers)."""
        lay = self.layout
        n = lay.world_size
        counts = torch.tensor([t.numel() for t in inputs], dtype=torch.int64)
        all_counts = [torch.empty(n, dtype=torch.int64) for _ in range(n)]
        cmeta = list(meta)
        cmeta[META_INDEX["dtype"]] = 5
        cmeta[META_INDEX["numel"]] = n
        self.allgather(all_counts, counts, cmeta, what)
        table = [c.tolist() for c in all_counts]
        width = max(sum(row) for row in table) if table else 0
        dtype = outs[0].dtype if outs else torch.uint8
        mine = torch.zeros(width, dtype=dtype)
        if inputs and width:
            flat_in = torch.cat(inputs)
            mine[: flat_in.numel()].copy_(flat_in)
        gathered = [torch.empty(width, dtype=dtype) for _ in range(n)]
        dmeta = list(meta)
        dmeta[META_INDEX["numel"]] = width
        ready = self.allgather(gathered, mine, dmeta, what)
        for p in range(n):
            off = sum(table[p][: lay.rank])
            cnt = table[p][lay.rank]
            if cnt != outs[p].numel():
                raise CollectiveMismatchError(
                    f"hccl: {what}: rank {p} sends {cnt} elements to rank {lay.rank}, which expects"
                    f" {outs[p].numel()}: the alltoall split sizes do not add up"
                )
            outs[p].copy_(gathered[p][off : off + cnt])
        return ready

    def barrier(self, meta: list[int], what: str) -> list[int]:
        """Wait for every rank of every host."""
        local_ready = eng.barrier(self.arena, meta, what)
        ready = None
        if self.layout.is_leader:
            ready = self._guard(self._leaders_exchange, meta, local_ready, what)
        return self._finish_local(meta, ready or [0] * self.layout.world_size, what, None)

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()


def _as_barrier(meta: list[int]) -> list[int]:
    m = list(meta)
    m[META_INDEX["kind"]] = eng.KIND_CODES["barrier"]
    m[META_INDEX["numel"]] = 0
    m[META_INDEX["dtype"]] = 0
    return m
