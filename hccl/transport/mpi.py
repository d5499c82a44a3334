"""MPI transport (``HCCL_TRANSPORT=mpi``): the collectives' bytes move through mpi4py.

For jobs started by ``mpiexec``/``mpirun`` (``pip install -e '.[mpi]'`` brings mpi4py and
MPICH). :class:`MpiTransport` is a :class:`~hccl.transport.interface.Transport`: the schedule
executor (:class:`~hccl.transport.executor.ScheduleCollectives`) runs the time plane's
schedules over it, exactly as over the multi-host transport, so both give the same bits and
report errors the same way (NOTE [one error mechanism] in :mod:`.executor`). Simulated time
still comes from the timing model, whatever the real transport is.

NOTE [MPI wire format]
Only the buffer-based (uppercase) mpi4py calls are used: nothing is pickled. A phase's
messages are ``Isend``/``Irecv`` of raw bytes (``MPI.BYTE``) on one tag; MPI keeps messages
between a pair in order. Reductions are never left to MPI (bfloat16 has no MPI type and
MPI's reduction order is unspecified): the executor combines received bytes with the
kernels of :mod:`hccl.transport.reduce_ops`.

NOTE [MPI timeouts and failures]
MPI has no timeouts. Every transfer is non-blocking and completed by polling ``Testall``
with a deadline of the group's timeout: a peer that never arrives raises
:class:`~hccl.transport.shm.HcclTimeoutError`. The requests are then still pending and MPI
cannot cancel them, so the group is unusable and the job should end with ``MPI_Abort``
(``launchers.mpi`` aborts the job when its target raises). A peer process that dies makes
the MPI launcher (Hydra) kill the whole job, MPI's default; nothing here changes that.
:meth:`MpiTransport.abort` only records the reason: mismatches are found by every rank
itself, and aborting MPI from a library would take the user's ``except`` away.

NOTE [MPI waits]
A rank waiting on its MPI requests polls ``Testall`` (MPI's progress runs inside it): the
first :data:`_PURE_POLLS` polls back to back, every later one after ``sched_yield``, so a
peer queued on the same core runs at once instead of at the scheduler's next tick; after
:data:`_SPIN_S` the waiter sleeps between polls (20 us doubling to 1 ms). Polling without
yielding for the first 100 ms, as before, starved the peers whenever ranks outnumber cores:
``python -m hccl.tools.bench_transport --ranks 4`` on 2 cores measured the MPI column at
12.1 ms for 1 KB and 0.08 GB/s at 1 MB (gloo: 5.1 ms, 0.30 GB/s); with the yields, 0.50 ms
and 1.54 GB/s. Idle 2-rank figures are unchanged (85 us, 5.3 GB/s): ``sched_yield`` with
nothing else to run returns at once.

Point-to-point send/recv is not offered over this transport (the process group raises
``NotImplementedError``); use the default shared-memory transport for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from .shm import HcclTimeoutError

__all__ = ["INSTALL_HINT", "MpiTransport", "MpiUnavailableError", "connect", "import_mpi"]

INSTALL_HINT = "pip install -e '.[mpi]'"
_TAG = 0x4843  # the one MPI tag of collective traffic
_SPIN_S = 0.1  # NOTE [MPI waits]: poll Testall() for this long, then back off with sleeps (max 1 ms)
_PURE_POLLS = 16  # NOTE [MPI waits]: polls before each further one yields the core


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


class MpiTransport:
    """:class:`~hccl.transport.interface.Transport` over an MPI communicator whose rank q is
    group rank q.

    Args:
        comm: the communicator (owned: freed by :meth:`close`).
        timeout_s: wall seconds any single phase may take before raising.
        MPI: the ``mpi4py.MPI`` module.
        name: the global rank errors name this rank by (default: its group rank).
    """

    def __init__(self, comm: Any, timeout_s: float, MPI: Any, name: int | None = None) -> None:
        self.comm = comm
        self.MPI = MPI
        self.rank = comm.Get_rank()
        self.name = self.rank if name is None else name
        self.world_size = comm.Get_size()
        self.timeout_s = timeout_s
        self.abort_reason: str | None = None
        self._pending = False  # a request timed out: the communicator cannot be freed

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]],
                 tag: int, what: str) -> None:
        """Posts every receive and send of the phase, then polls them to completion."""
        if not sends and not recvs:
            return
        byte = self.MPI.BYTE
        reqs = [self.comm.Irecv([into.numpy(), byte], source=p, tag=_TAG) for p, into in recvs]
        reqs += [self.comm.Isend([data.numpy(), byte], dest=p, tag=_TAG) for p, data in sends]
        self._wait(reqs, what)

    def _wait(self, reqs: list, what: str) -> None:
        """Completes ``reqs`` by polling, within the group's timeout."""
        test = self.MPI.Request.Testall
        if test(reqs):
            return
        start = time.monotonic()
        spins, delay = 0, 0.0
        while not test(reqs):
            spins += 1
            if delay:
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
            elif spins > _PURE_POLLS:
                os.sched_yield()
            if spins % 64 == 0 or delay:
                now = time.monotonic() - start
                if now > self.timeout_s:
                    self._pending = True
                    raise HcclTimeoutError(
                        f"hccl: rank {self.name} timed out after {self.timeout_s:.1f} s in {what}"
                        " waiting for its MPI peers (HCCL_TRANSPORT=mpi)"
                    )
                if not delay and now > _SPIN_S:
                    delay = 2e-5

    def abort(self, reason: str) -> None:
        """Records why this rank failed (see ``NOTE [MPI timeouts and failures]``)."""
        self.abort_reason = reason

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


def connect(store: Any, rank: int, world_size: int, timeout_s: float,
            names: Sequence[int] | None = None, *, in_mpi_job: bool = True) -> MpiTransport:
    """Builds the MPI transport of a process group (every member calls it; see the PG's rendezvous).

    The members publish their ``MPI.COMM_WORLD`` rank in ``store``; a group that is the MPI
    world in rank order gets a duplicate of ``COMM_WORLD``, any other group a communicator
    made with ``MPI_Comm_create_group``, which only the group's members call (torch does not
    build the backend on non-members, so a ``Split`` of ``COMM_WORLD`` would wait for them).

    ``names``: the global rank of each group rank, which errors name (default: the group ranks).
    ``in_mpi_job``: whether an MPI launcher started this process (the caller reads its
    variables: :func:`hccl.env.started_by_mpi`); when not, a group of 2 or more ranks is refused
    before MPI is initialised (which would make this process an MPI job of its own).

    Raises:
        MpiUnavailableError: mpi4py/MPI is missing, or this process is not part of an MPI
            job that holds the group's ranks (e.g. started by torchrun, not mpiexec).
    """
    hint = f"HCCL_TRANSPORT=mpi needs the job started by mpiexec ({INSTALL_HINT})"
    if world_size > 1 and not in_mpi_job:  # before MPI_Init: no singleton MPI job (its /dev/shm file)
        raise MpiUnavailableError(
            f"{hint}: no MPI launcher started this process (no Open MPI, PMI or PMIx variable is set)"
            f" but the process group has {world_size} ranks"
        )
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    mpi_rank, mpi_size = world.Get_rank(), world.Get_size()
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
    return MpiTransport(comm, timeout_s, MPI, name=None if names is None else names[rank])
