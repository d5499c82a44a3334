"""The schedule executor: runs a :class:`~hccl.transport.plan.Plan` over any
:class:`~hccl.transport.interface.Transport`, moving and reducing the real bytes.

:class:`ScheduleCollectives` is the collectives driver of every transport that is not the
one-host shared-memory engine: several hosts (shared-memory outboxes inside a host, TCP
between hosts, :mod:`.multihost`) and MPI (:mod:`.mpi`). It runs the very schedules the planner
times: the torch face hands it a :data:`~hccl.transport.plan.Planner` that builds them with
``hccl.sim`` (this package never imports the time plane), so ``HCCL_ALGO=ring`` moves the
bytes around a ring.

NOTE [one error mechanism]
Every collective starts with an agreement: every rank sends every other rank one row of
fixed-width int64 words (the face's metadata words, then ``2 x world_size`` words that only
alltoall fills: its per-peer send and receive element counts) and checks the whole table
with one pure function (:func:`check_rows`). A mismatch anywhere (sizes, dtypes, ops, roots,
collective order, alltoall splits) therefore raises the same
:class:`~hccl.transport.shm_engine.CollectiveMismatchError` on every rank, naming global ranks
with their sizes, dtypes and ops, before any data moves. A failure after the agreement (a
dead peer, a timeout) raises on the ranks that wait for the failed one, and the failed
rank's :meth:`ScheduleCollectives.abort` tells its peers at once (shared-memory abort flag,
TCP connections closed).

These functions are numerics only: simulated time is the time plane's business.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .interface import Transport
from .p2p import byte_view
from .plan import CopyStep, Plan, PlanRequest, Planner, RecvStep, SendStep, phases
from .reduce_ops import combine, combine_out, finish
from .shm import META_FIELDS, ShmArena
from .shm_engine import META_INDEX, CollectiveMismatchError, raise_mismatch

__all__ = ["ScheduleCollectives", "check_rows", "run_plan"]

_N_META = len(META_FIELDS)
_READY = META_INDEX["ready_ns"]


def check_rows(rows: list[list[int]], names: Sequence[int], what: str) -> list[list[int]]:
    """Check every rank's agreement row (NOTE [one error mechanism]); returns the alltoall
    split matrix ``splits[p][q]`` (elements group rank p sends to group rank q).

    Pure and deterministic: every rank, given the same table, raises the same error.

    Raises:
        CollectiveMismatchError: the metadata words differ (naming ``names[p]`` for group
            rank p), or rank p's send count to q differs from q's receive count from p.
    """
    n = len(rows)
    first = rows[0]
    if any(row[:_READY] != first[:_READY] or row[_READY + 1 : _N_META] != first[_READY + 1 : _N_META] for row in rows):
        raise_mismatch([row[:_N_META] for row in rows], first[:_N_META], names)
    sends = [row[_N_META : _N_META + n] for row in rows]
    expects = [row[_N_META + n : _N_META + 2 * n] for row in rows]
    bad = [
        f"rank {names[p]} sends {sends[p][q]} elements to rank {names[q]}, which expects {expects[q][p]}"
        for p in range(n) for q in range(n) if sends[p][q] != expects[q][p]
    ]
    if bad:
        raise CollectiveMismatchError(
            f"hccl: {what}: the alltoall split sizes do not add up: " + "; ".join(bad[:8])
            + (f"; and {len(bad) - 8} more" if len(bad) > 8 else "")
        )
    return sends


def run_plan(transport: Transport, plan: Plan, work: torch.Tensor, op: int, tag: int, what: str,
             scratch: list[torch.Tensor]) -> None:
    """Execute ``plan`` on the flat ``work`` buffer (NOTE [plan semantics] in :mod:`.plan`).

    Receives land in a scratch buffer (``scratch[0]``, grown as needed) and are applied after
    the phase's messages have moved: copies first, then receives in step order, overwriting
    or combined with reduce op ``op``.
    """
    for steps in phases(plan.steps):
        sends = [(s.peer, byte_view(work[s.offset : s.offset + s.count])) for s in steps if isinstance(s, SendStep)]
        recv_steps = [s for s in steps if isinstance(s, RecvStep)]
        total = sum(s.count for s in recv_steps)
        nbytes = total * work.element_size()
        if scratch[0].numel() < nbytes:
            scratch[0] = torch.empty(max(nbytes, 4096), dtype=torch.uint8)
        buf = scratch[0][:nbytes].view(work.dtype) if nbytes else work[:0]
        parts, off = [], 0
        for s in recv_steps:
            parts.append(buf[off : off + s.count])
            off += s.count
        transport.exchange(sends, [(s.peer, byte_view(p)) for s, p in zip(recv_steps, parts)], tag, what)
        for s in steps:
            if isinstance(s, CopyStep) and s.count:
                work[s.dst_offset : s.dst_offset + s.count].copy_(work[s.src_offset : s.src_offset + s.count].clone())
        _apply(recv_steps, parts, work, op, transport.rank)


def _apply(recv_steps: list[RecvStep], parts: list[torch.Tensor], work: torch.Tensor, op: int, me: int) -> None:
    """Write one phase's receives into ``work`` in step order.

    NOTE [rank-order reduction]: receives that reduce into the same elements in one phase
    (e.g. the direct algorithm's owner of a chunk receiving it from every peer) are combined
    with this rank's own elements in group-rank order, so a float sum has the bits of
    ``x0 + x1 + x2 + ...``, as the shared-memory engine gives (a single receive needs no
    care: IEEE addition and multiplication are commutative).
    """
    groups: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}
    for s, p in zip(recv_steps, parts):
        if s.reduce and s.count:
            groups.setdefault((s.offset, s.count), []).append((s.peer, p))
    done: set[tuple[int, int]] = set()
    for s, p in zip(recv_steps, parts):
        if not s.count:
            continue
        dst = work[s.offset : s.offset + s.count]
        if not s.reduce:
            dst.copy_(p)
            continue
        key = (s.offset, s.count)
        group = groups[key]
        if len(group) == 1:
            combine(op, dst, p)
        elif key not in done:
            done.add(key)
            vals = sorted(group + [(me, dst.clone())], key=lambda x: x[0])
            combine_out(op, dst, vals[0][1], vals[1][1])
            for _, v in vals[2:]:
                combine(op, dst, v)


class ScheduleCollectives:
    """Collectives that run the time plane's schedules over a :class:`Transport`.

    Args:
        transport: moves one phase's messages.
        planner: builds this rank's plan for a request (from the face, with ``hccl.sim``).
        names: the global rank of each group rank (error messages name global ranks).
        arena: the host's shared-memory arena (point-to-point), or None.
    """

    def __init__(self, transport: Transport, planner: Planner, names: Sequence[int] | None = None,
                 arena: ShmArena | None = None) -> None:
        self.transport = transport
        self.planner = planner
        self.rank = transport.rank
        self.world_size = n = transport.world_size
        self.names = list(names) if names is not None else list(range(n))
        self.arena = arena
        self._scratch = [torch.empty(0, dtype=torch.uint8)]

    # ---- building blocks --------------------------------------------------------------
    def _agree(self, meta: list[int], what: str, extra: list[int] | None = None) -> tuple[list[int], list[list[int]]]:
        """Every rank's row to every rank; returns (every rank's ready ns, alltoall splits)."""
        n, me = self.world_size, self.rank
        width = _N_META + 2 * n
        table = torch.zeros(n, width, dtype=torch.int64)
        table[me, :_N_META] = torch.tensor(meta, dtype=torch.int64)
        if extra:
            table[me, _N_META : _N_META + len(extra)] = torch.tensor(extra, dtype=torch.int64)
        peers = [p for p in range(n) if p != me]
        self.transport.exchange([(p, byte_view(table[me])) for p in peers], [(p, byte_view(table[p])) for p in peers],
                                meta[0], what)
        rows = table.tolist()
        splits = check_rows(rows, self.names, what)
        return [row[_READY] for row in rows], splits

    def _run(self, req: PlanRequest, work: torch.Tensor, op: int, meta: list[int], what: str) -> Plan:
        plan = self.planner(req)
        if plan.work != work.numel():
            raise RuntimeError(f"hccl: {what}: the {plan.algorithm} plan needs a work buffer of {plan.work}"
                               f" elements, got {work.numel()}")
        run_plan(self.transport, plan, work, op, meta[0], what, self._scratch)
        return plan

    # ---- collectives ------------------------------------------------------------------
    def allreduce(self, flat: torch.Tensor, op: int, meta: list[int], what: str) -> list[int]:
        """In place on ``flat``: reduce over all ranks with op code ``op``."""
        ready, _ = self._agree(meta, what)
        if self.world_size > 1 and flat.numel():
            self._run(PlanRequest("all_reduce", flat.numel(), flat.element_size()), flat, op, meta, what)
        finish(op, flat, self.world_size)
        return ready

    def reduce(self, flat: torch.Tensor, op: int, root: int, meta: list[int], what: str) -> list[int]:
        """Reduce over all ranks into ``flat`` on ``root`` (other ranks' tensors unchanged)."""
        ready, _ = self._agree(meta, what)
        work = flat.clone()
        if self.world_size > 1 and flat.numel():
            self._run(PlanRequest("reduce", flat.numel(), flat.element_size(), root=root), work, op, meta, what)
        if self.rank == root:
            flat.copy_(work)
            finish(op, flat, self.world_size)
        return ready

    def broadcast(self, flat: torch.Tensor, root: int, meta: list[int], what: str) -> list[int]:
        """In place: every rank's ``flat`` becomes ``root``'s."""
        ready, _ = self._agree(meta, what)
        if self.world_size > 1 and flat.numel():
            self._run(PlanRequest("broadcast", flat.numel(), flat.element_size(), root=root), flat, 0, meta, what)
        return ready

    def allgather(self, outs: list[torch.Tensor], inp: torch.Tensor, meta: list[int], what: str) -> list[int]:
        """``outs[q]`` (flat, ``inp.numel()`` elements each) receives rank ``q``'s ``inp``."""
        ready, _ = self._agree(meta, what)
        n, m = self.world_size, inp.numel()
        if m:
            work = torch.empty(n * m, dtype=inp.dtype)
            work[self.rank * m : (self.rank + 1) * m].copy_(inp)
            if n > 1:
                self._run(PlanRequest("all_gather", m, inp.element_size()), work, 0, meta, what)
            for q in range(n):
                outs[q].copy_(work[q * m : (q + 1) * m])
        return ready

    def reduce_scatter(self, out: torch.Tensor, inputs: list[torch.Tensor], op: int, meta: list[int],
                       what: str) -> list[int]:
        """``out`` (flat, m elements) = op over ranks of their ``inputs[this rank]``."""
        ready, _ = self._agree(meta, what)
        n, m = self.world_size, out.numel()
        if m:
            work = torch.cat(inputs)
            if n > 1:
                plan = self._run(PlanRequest("reduce_scatter", n * m, out.element_size()), work, op, meta, what)
                lo = plan.output_offset
            else:
                lo = 0
            out.copy_(work[lo : lo + m])
        finish(op, out, n)
        return ready

    def alltoall(self, outs: list[torch.Tensor], inputs: list[torch.Tensor], meta: list[int],
                 what: str) -> tuple[list[int], list[list[int]]]:
        """``outs[q]`` receives rank ``q``'s ``inputs[this rank]`` (flat tensors, any sizes).

        Returns every rank's ready ns and the (n x n) element counts rank p sent to rank q.
        Raises :class:`CollectiveMismatchError` on every rank if the splits do not add up.
        """
        n, me = self.world_size, self.rank
        ready, splits = self._agree(meta, what, [t.numel() for t in inputs] + [t.numel() for t in outs])
        count = max(sum(row) for row in splits)
        dtype = outs[0].dtype if outs else torch.uint8
        if count:
            isz = torch.empty((), dtype=dtype).element_size()
            req = PlanRequest("all2all", count, isz, splits=tuple(tuple(r) for r in splits))
            plan = self.planner(req)
            work = torch.zeros(plan.work, dtype=dtype)
            mine = sum(splits[me])
            if mine:
                torch.cat(list(inputs), out=work[plan.input_offset : plan.input_offset + mine])
            run_plan(self.transport, plan, work, 0, meta[0], what, self._scratch)
            off = plan.output_offset
            for p in range(n):
                c = splits[p][me]
                outs[p].copy_(work[off : off + c])
                off += c
        return ready, splits

    def barrier(self, meta: list[int], what: str) -> list[int]:
        """Wait until every rank has arrived (the agreement is the barrier)."""
        return self._agree(meta, what)[0]

    def abort(self, reason: str) -> None:
        self.transport.abort(reason)

    def close(self) -> None:
        self.transport.close()
