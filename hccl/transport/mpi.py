"""MPI transport (``HCCL_TRANSPORT=mpi``): the collectives' bytes move through mpi4py.

For jobs started by ``mpiexec``/``mpirun`` (``pip install -e '.[mpi]'`` brings mpi4py and
MPICH). :class:`MpiCollectives` has the same methods as
:class:`~hccl.transport.shm_engine.ShmCollectives` and :class:`~hccl.transport.multihost.MultiHost`, so the
process group drives it the same way; only the data path differs. Simulated time still
comes from the timing model, whatever the real transport is.

NOTE [MPI wire format]
Only the buffer-based (uppercase) mpi4py calls are used: nothing is pickled. Tensors cross
as raw bytes (``MPI.BYTE``). Every collective starts with an ``Iallgather`` of fixed-width
int64 words per rank: the metadata words of ``hccl.transport.shm.META_FIELDS`` followed by
``2 x world_size`` words that only alltoall uses (its per-peer send and receive element
counts). Every rank checks every row, so a mismatch (sizes, dtypes, ops, roots, collective
order, alltoall splits) raises the same :class:`~hccl.transport.shm_engine.CollectiveMismatchError`
on every rank before any data moves.

NOTE [MPI numerics]
Reductions are never left to MPI: bfloat16 has no MPI type and MPI's reduction order is
unspecified. Each rank receives every rank's copy of the part it owns (``Ialltoallv``;
one ``Iallgather`` of the whole buffer for small messages), combines them in rank order
with the kernels of :mod:`hccl.transport.reduce_ops` and hands the result on (``Iallgatherv``, or
``Igatherv`` to the root for reduce). The elementwise operations, order and dtype are those
of the shared-memory engine, so both transports give the same bits on every rank.

NOTE [MPI timeouts and failures]
MPI has no timeouts. Every collective here is non-blocking (``I*``) and completed by
polling ``Test`` with a deadline of the group's timeout: a peer that never arrives raises
:class:`~hccl.transport.shm.HcclTimeoutError`. The request is then still pending and MPI
cannot cancel a collective, so the group is unusable and the job should end with
``MPI_Abort`` (``launchers.mpi`` aborts the job when its target raises). A peer process that
dies makes the MPI launcher (Hydra) kill the whole job, MPI's default; nothing here changes
that. :meth:`MpiArena.abort` only records the reason: every rank raises a mismatch by itself,
and aborting MPI from a library would take the user's ``except`` away.

Point-to-point send/recv is not offered over this transport (it raises
``NotImplementedError``); use the default shared-memory transport for it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from .reduce_ops import combine, combine_out, finish
from .shm_engine import (
    META_INDEX,
    CollectiveMismatchError,
    _raise_mismatch,
    chunk_bounds,
)
from .shm import ITEMSIZE, META_FIELDS, SMALL_BYTES, HcclTimeoutError

__all__ = ["INSTALL_HINT", "SLICE_BYTES", "MpiArena", "MpiCollectives", "MpiUnavailableError", "connect", "import_mpi"]

INSTALL_HINT = "pip install -e '.[mpi]'"
#: bytes of one slice of a large reduction (bounds the scratch memory to about this size).
SLICE_BYTES = 16 << 20
_N_META = len(META_FIELDS)
_READY = META_INDEX["ready_ns"]
_CHECKED = [i for i in range(_N_META) if i != _READY]  # metadata words that must agree
_SPIN_S = 0.1  # poll Test() without pausing for this long, then back off (max 1 ms)


class MpiUnavailableError(RuntimeError):
    """``HCCL_TRANSPORT=mpi`` was asked for, but mpi4py/MPI or an MPI job is missing."""


def import_mpi() -> Any:
    """Imports ``mpi4py.MPI`` (which initialises MPI).

    Raises:
        MpiUnavailableError: mpi4py is not installed or cannot load an MPI library.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise MpiUnavailableError(
            f"HCCL_TRANSPORT=mpi needs mpi4py and an MPI library ({exc}); install them with"
            f" {INSTALL_HINT} and start the job with mpiexec"
        ) from exc
    except (RuntimeError, OSError) as exc:
        raise MpiUnavailableError(
            f"HCCL_TRANSPORT=mpi: mpi4py could not load an MPI library ({exc}); {INSTALL_HINT}"
        ) from exc
    return MPI


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A uint8 numpy view of a flat contiguous tensor's bytes (shares memory)."""
    return t.view(torch.uint8).numpy()


def _reduce_rows(op: int, acc: torch.Tensor, rows: list[torch.Tensor]) -> None:
    """``acc = rows[0] (op) rows[1] (op) ...`` in rank order, then AVG's division."""
    n = len(rows)
    if n == 1:
        acc.copy_(rows[0])
    else:
        combine_out(op, acc, rows[0], rows[1])
        for q in range(2, n):
            combine(op, acc, rows[q])
    finish(op, acc, n)


class MpiArena:
    """Stand-in for :class:`~hccl.transport.shm.ShmArena` under the MPI transport.

    The process group calls :meth:`abort` after a failed collective and :meth:`close` at
    shutdown. There are no shared-memory outboxes, so send/recv raise ``NotImplementedError``.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.abort_reason: str | None = None

    def abort(self, reason: str) -> None:
        """Records why this rank failed (see ``NOTE [MPI timeouts and failures]``)."""
        self.abort_reason = reason

    def close(self) -> None:
        pass

    @property
    def me(self):
        raise NotImplementedError(
            "hccl: send/recv is not supported with HCCL_TRANSPORT=mpi; use the default"
            " shared-memory transport (HCCL_TRANSPORT=shm) for point-to-point"
        )

    segments = me


class MpiCollectives:
    """The collectives of a group over an MPI communicator whose rank q is group rank q.

    Args:
        comm: the communicator (owned: freed by :meth:`close`).
        timeout_s: wall seconds any single collective may take before raising.
        MPI: the ``mpi4py.MPI`` module.
    """

    def __init__(self, comm: Any, timeout_s: float, MPI: Any) -> None:
        self.comm = comm
        self.MPI = MPI
        self.rank = comm.Get_rank()
        self.world_size = n = comm.Get_size()
        self.timeout_s = timeout_s
        self.arena = MpiArena(self.rank, n)
        self.alltoall_splits: list[list[int]] = []
        self._width = _N_META + 2 * n
        self._words = np.zeros(self._width, dtype=np.int64)
        self._rows = np.zeros((n, self._width), dtype=np.int64)
        self._scratch = torch.empty(0, dtype=torch.uint8)
        self._pending = False  # a request timed out: the communicator cannot be freed

    # ---- building blocks --------------------------------------------------------------
    def _wait(self, req: Any, what: str) -> None:
        """Completes ``req`` by polling, within the group's timeout."""
        if req.Test():
            return
        start = time.monotonic()
        spins, delay = 0, 0.0
        while not req.Test():
            spins += 1
            if delay:
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
            if spins % 256 == 0 or delay:
                now = time.monotonic() - start
                if now > self.timeout_s:
                    self._pending = True
                    raise HcclTimeoutError(
                        f"hccl: rank {self.rank} timed out after {self.timeout_s:.1f} s in {what}"
                        " waiting for its MPI peers (HCCL_TRANSPORT=mpi)"
                    )
                if not delay and now > _SPIN_S:
                    os.sched_yield()
                    delay = 2e-5

    def _scratch_bytes(self, nbytes: int) -> torch.Tensor:
        """A reusable uint8 buffer of at least ``nbytes`` (contents undefined)."""
        if self._scratch.numel() < nbytes:
            self._scratch = torch.empty(max(nbytes, 4096), dtype=torch.uint8)
        return self._scratch[:nbytes]

    def _exchange(self, meta: list[int], what: str, extra: list[int] | None = None) -> list[int]:
        """Allgathers every rank's words; checks the metadata; returns every rank's ready ns."""
        words, rows = self._words, self._rows
        words[:_N_META] = meta
        words[_N_META:] = 0
        if extra:
            words[_N_META : _N_META + len(extra)] = extra
        self._wait(self.comm.Iallgather(words, rows), what)
        checked = rows[:, _CHECKED]
        if (checked != checked[self.rank]).any():
            _raise_mismatch([[int(v) for v in row[:_N_META]] for row in rows], list(meta))
        return [int(v) for v in rows[:, _READY]]

    def _reduce_parts(self, part: torch.Tensor, op: int, acc_out: torch.Tensor | None, what: str) -> tuple[int, int, torch.Tensor]:
        """Reduce-scatter step of one slice: this rank's part ``[lo, hi)``, reduced in rank order.

        Returns ``(lo, hi, acc)``; ``acc`` is ``part[lo:hi]`` itself unless ``acc_out`` is given.
        """
        n, me = self.world_size, self.rank
        cnt, isz = part.numel(), part.element_size()
        bounds = [chunk_bounds(cnt, n, q) for q in range(n)]
        lo, hi = bounds[me]
        mine = hi - lo
        recv = self._scratch_bytes(n * mine * isz)
        send_spec = [_bytes(part), ([(b - a) * isz for a, b in bounds], [a * isz for a, _ in bounds]), self.MPI.BYTE]
        recv_spec = [_bytes(recv), ([mine * isz] * n, [q * mine * isz for q in range(n)]), self.MPI.BYTE]
        self._wait(self.comm.Ialltoallv(send_spec, recv_spec), what)
        rows = list(recv.view(part.dtype).view(n, mine)) if mine else []
        acc = part[lo:hi] if acc_out is None else acc_out[:mine]
        if mine:
            _reduce_rows(op, acc, rows)
        return lo, hi, acc

    def _slices(self, total: int, itemsize: int):
        step = max(self.world_size, SLICE_BYTES // itemsize)
        for s0 in range(0, total, step):
            yield s0, min(step, total - s0)

    # ---- collectives ------------------------------------------------------------------
    def allreduce(self, flat: torch.Tensor, op: int, meta: list[int], what: str) -> list[int]:
        """In place on ``flat``: reduce over all ranks with op code ``op``."""
        ready = self._exchange(meta, what)
        n, isz, total = self.world_size, flat.element_size(), flat.numel()
        if n == 1:
            finish(op, flat, 1)
            return ready
        if total * isz <= SMALL_BYTES:  # one round: everyone reduces every copy
            nbytes = total * isz
            recv = self._scratch_bytes(n * nbytes)
            self._wait(self.comm.Iallgather(_bytes(flat), _bytes(recv)), what)
            if total:
                _reduce_rows(op, flat, list(recv.view(flat.dtype).view(n, total)))
            return ready
        for s0, cnt in self._slices(total, isz):
            part = flat[s0 : s0 + cnt]
            self._reduce_parts(part, op, None, what)
            bounds = [chunk_bounds(cnt, n, q) for q in range(n)]
            spec = [_bytes(part), ([(b - a) * isz for a, b in bounds], [a * isz for a, _ in bounds]), self.MPI.BYTE]
            self._wait(self.comm.Iallgatherv(self.MPI.IN_PLACE, spec), what)
        return ready

    def reduce(self, flat: torch.Tensor, op: int, root: int, meta: list[int], what: str) -> list[int]:
        """Reduce over all ranks into ``flat`` on ``root`` (other ranks' tensors unchanged)."""
        ready = self._exchange(meta, what)
        n, isz, total = self.world_size, flat.element_size(), flat.numel()
        if n == 1:
            finish(op, flat, 1)
            return ready
        for s0, cnt in self._slices(total, isz):
            part = flat[s0 : s0 + cnt]
            acc_buf = torch.empty(cnt // n + 1, dtype=flat.dtype)
            lo, hi, acc = self._reduce_parts(part, op, acc_buf, what)
            bounds = [chunk_bounds(cnt, n, q) for q in range(n)]
            if self.rank == root:
                part[lo:hi].copy_(acc)
                spec = [_bytes(part), ([(b - a) * isz for a, b in bounds], [a * isz for a, _ in bounds]), self.MPI.BYTE]
                req = self.comm.Igatherv(self.MPI.IN_PLACE, spec, root)
            else:
                req = self.comm.Igatherv([_bytes(acc), (hi - lo) * isz, self.MPI.BYTE], None, root)
            self._wait(req, what)
        return ready

    def broadcast(self, flat: torch.Tensor, root: int, meta: list[int], what: str) -> list[int]:
        """In place: every rank's ``flat`` becomes ``root``'s."""
        ready = self._exchange(meta, what)
        if self.world_size > 1:
            for s0, cnt in self._slices(flat.numel(), flat.element_size()):
                self._wait(self.comm.Ibcast(_bytes(flat[s0 : s0 + cnt]), root), what)
        return ready

    def allgather(self, outs: list[torch.Tensor], inp: torch.Tensor, meta: list[int], what: str) -> list[int]:
        """``outs[q]`` (flat, ``inp.numel()`` elements each) receives rank ``q``'s ``inp``."""
        ready = self._exchange(meta, what)
        n, isz = self.world_size, inp.element_size()
        for s0, cnt in self._slices(inp.numel(), isz * n):
            src = inp[s0 : s0 + cnt]
            recv = self._scratch_bytes(n * cnt * isz)
            self._wait(self.comm.Iallgather(_bytes(src), _bytes(recv)), what)
            rows = recv.view(inp.dtype).view(n, cnt)
            for q in range(n):
                outs[q][s0 : s0 + cnt].copy_(rows[q])
        return ready

    def reduce_scatter(self, out: torch.Tensor, inputs: list[torch.Tensor], op: int, meta: list[int], what: str) -> list[int]:
        """``out`` (flat, m elements) = op over ranks of their ``inputs[this rank]``."""
        ready = self._exchange(meta, what)
        n, isz = self.world_size, out.element_size()
        for s0, cnt in self._slices(out.numel(), isz * n):
            buf = self._scratch_bytes(2 * n * cnt * isz)
            send = buf[: n * cnt * isz].view(out.dtype).view(n, cnt)
            for q in range(n):
                send[q].copy_(inputs[q][s0 : s0 + cnt])
            recv = buf[n * cnt * isz :]
            self._wait(self.comm.Ialltoall(_bytes(send.view(-1)), _bytes(recv)), what)
            _reduce_rows(op, out[s0 : s0 + cnt], list(recv.view(out.dtype).view(n, cnt)))
        return ready

    def alltoall(self, outs: list[torch.Tensor], inputs: list[torch.Tensor], meta: list[int], what: str) -> list[int]:
        """``outs[q]`` receives rank ``q``'s ``inputs[this rank]`` (flat tensors, any sizes).

        Also sets :attr:`alltoall_splits`: the (n x n) element counts rank p sent to rank q.
        Raises :class:`CollectiveMismatchError` on every rank if rank p's ``inputs[q]`` and
        rank q's ``outs[p]`` differ in size.
        """
        n = self.world_size
        send_n = [t.numel() for t in inputs]
        recv_n = [t.numel() for t in outs]
        ready = self._exchange(meta, what, send_n + recv_n)
        rows = self._rows
        splits = [[int(v) for v in rows[p, _N_META : _N_META + n]] for p in range(n)]
        expects = [[int(v) for v in rows[q, _N_META + n : _N_META + 2 * n]] for q in range(n)]
        for p in range(n):
            for q in range(n):
                if splits[p][q] != expects[q][p]:
                    raise CollectiveMismatchError(
                        f"hccl: {what}: rank {p} sends {splits[p][q]} elements to rank {q}, which"
                        f" expects {expects[q][p]} from it: the alltoall split sizes do not add up"
                    )
        self.alltoall_splits = splits
        dtype = outs[0].dtype if outs else torch.uint8
        isz = ITEMSIZE[dtype]
        s_tot, r_tot = sum(send_n), sum(recv_n)
        buf = self._scratch_bytes((s_tot + r_tot) * isz)
        send, recv = buf[: s_tot * isz], buf[s_tot * isz :]
        if s_tot:
            torch.cat(list(inputs), out=send.view(dtype))
        s_off = np.concatenate([[0], np.cumsum(send_n)[:-1]]).astype(np.int64) * isz
        r_off = np.concatenate([[0], np.cumsum(recv_n)[:-1]]).astype(np.int64) * isz
        send_spec = [_bytes(send), ([c * isz for c in send_n], [int(v) for v in s_off]), self.MPI.BYTE]
        recv_spec = [_bytes(recv), ([c * isz for c in recv_n], [int(v) for v in r_off]), self.MPI.BYTE]
        if n > 1:
            self._wait(self.comm.Ialltoallv(send_spec, recv_spec), what)
        else:
            recv.copy_(send)
        vals = recv.view(dtype)
        off = 0
        for q in range(n):
            outs[q].copy_(vals[off : off + recv_n[q]])
            off += recv_n[q]
        return ready

    def barrier(self, meta: list[int], what: str) -> list[int]:
        """Waits until every rank has arrived (the metadata exchange is the barrier)."""
        return self._exchange(meta, what)

    def close(self) -> None:
        """Frees the communicator (idempotent; skipped after a timeout or once MPI is finalized)."""
        comm, self.comm = self.comm, None
        if comm is None or self._pending:
            return
        try:
            if not self.MPI.Is_finalized():
                comm.Free()
        except Exception:  # noqa: BLE001, S110 - best effort at shutdown  # pragma: no cover
            pass


def connect(store: Any, rank: int, world_size: int, timeout_s: float) -> MpiCollectives:
    """Builds the MPI driver of a process group (every member calls it; see the PG's rendezvous).

    The members publish their ``MPI.COMM_WORLD`` rank in ``store``; a group that is the MPI
    world in rank order gets a duplicate of ``COMM_WORLD``, any other group a communicator
    made with ``MPI_Comm_create_group``, which only the group's members call (torch does not
    build the backend on non-members, so a ``Split`` of ``COMM_WORLD`` would wait for them).

    Raises:
        MpiUnavailableError: mpi4py/MPI is missing, or this process is not part of an MPI
            job that holds the group's ranks (e.g. started by torchrun, not mpiexec).
    """
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    mpi_rank, mpi_size = world.Get_rank(), world.Get_size()
    hint = f"HCCL_TRANSPORT=mpi needs the job started by mpiexec ({INSTALL_HINT})"
    if mpi_size < world_size:
        raise MpiUnavailableError(
            f"{hint}: MPI sees {mpi_size} process(es) but the process group has {world_size} ranks"
        )
    store.set(f"hccl/mpi/{rank}", f"{mpi_rank}/{mpi_size}")
    seen = [store.get(f"hccl/mpi/{r}").decode().split("/") for r in range(world_size)]
    ranks = [int(a) for a, _ in seen]
    sizes = {int(b) for _, b in seen}
    if len(sizes) != 1 or len(set(ranks)) != world_size:
        raise MpiUnavailableError(
            f"{hint}: the group's processes are not one MPI job (MPI rank/size of each group rank:"
            f" {', '.join(f'{r}: {a}/{b}' for r, (a, b) in enumerate(seen))})"
        )
    if world_size == mpi_size and ranks == list(range(mpi_size)):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.group.Incl(ranks))
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return MpiCollectives(comm, timeout_s, MPI)
