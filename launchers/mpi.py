"""Run a DDP job under ``mpirun``/``mpiexec``: one MPI rank = one simulated Gaudi.

Usage::

    mpiexec -n 4 python -m launchers.mpi -m models.train --model mlp --dataset digits
    mpiexec -n 4 python -m launchers.mpi path/to/script.py --epochs 2

In every rank this maps the MPI launcher's variables (Open MPI ``OMPI_COMM_WORLD_*``,
MPICH/Hydra ``PMI_*`` and ``MPI_LOCALRANKID``) to torch's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, agrees on ``MASTER_ADDR``/``MASTER_PORT`` through
MPI itself (rank 0 picks a free port and broadcasts it as raw bytes), then runs the target
as ``__main__``, exactly as ``torchrun`` would have. ``pip install -e '.[mpi]'`` brings
mpi4py and MPICH (with ``mpiexec``) from the package registry.

NOTE [MPICH shared memory]
    MPICH maps a ``/dev/shm/mpich_shm_*`` segment in ``MPI_Init`` and unlinks it only in
    ``MPI_Finalize``, so an aborted or killed job leaves it behind. Once the first
    collective proves that every rank finished ``MPI_Init`` (so all have mapped it), each
    rank unlinks the segments it maps: the mappings stay valid, and a crash leaves no file.

NOTE [naming the failed rank]
    A rank whose target raises (or exits non-zero) logs ``rank R failed`` and aborts the
    whole MPI job with that exit code, so the other ranks do not wait in a collective
    until their timeout. A rank killed by a signal cannot report itself: Hydra then prints
    the dead process's PID and kills the others; every rank logs ``rank R of N is pid P``
    at start-up so that PID can be mapped to its rank.

NOTE [last words before MPI_Abort]
    Hydra's proxy reads each rank's stderr through a pipe, and ``MPI_Abort`` makes it kill
    the job at once: a line still in the pipe is lost (CI lost "target did not finish" this
    way on a loaded machine). Before aborting, a rank flushes its log and waits until the
    pipe behind stderr is empty (``FIONREAD`` on a pipe counts the unread bytes), for at most
    :data:`_DRAIN_LIMIT_S` wall seconds.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import socket
import stat
import sys
import termios
import threading
import time
from dataclasses import dataclass
from typing import Any

from hccl.env import RankEnv, resolve_rank_env
from launchers.env import (
    LOOPBACK,
    configure_logging,
    export_rank_env,
    find_free_port,
    one_thread_per_rank,
    rendezvous_host,
)
from launchers.target import Target, add_target_arguments, exit_code, target_from_args

__all__ = [
    "MPIUnavailableError",
    "Rendezvous",
    "abort_job",
    "agree_rendezvous",
    "build_parser",
    "import_mpi",
    "main",
    "unlink_mpich_shm",
]

logger = logging.getLogger("launchers.mpi")

INSTALL_HINT = "pip install -e '.[mpi]'  (brings mpi4py and MPICH's mpiexec)"
_HOST_BYTES = 256  # fixed width of a host name/address on the wire (bytes, NUL padded)
_MPICH_SHM_PREFIX = "/dev/shm/mpich_shm_"
_DRAIN_LIMIT_S = 2.0  # longest wait (wall seconds) for Hydra to read our last stderr line


class MPIUnavailableError(RuntimeError):
    """mpi4py or an MPI library cannot be loaded."""


def import_mpi() -> Any:
    """Imports ``mpi4py.MPI`` (which initialises MPI).

    Raises:
        MPIUnavailableError: mpi4py is not installed or finds no MPI library; the message
            says what to install.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise MPIUnavailableError(
            f"launchers.mpi needs mpi4py and an MPI library ({exc}); install them with: "
            f"{INSTALL_HINT}"
        ) from exc
    except (RuntimeError, OSError) as exc:  # mpi4py present, libmpi missing or broken
        raise MPIUnavailableError(
            f"mpi4py could not load an MPI library ({exc}); install one with: {INSTALL_HINT}"
        ) from exc
    return MPI


def _port(text: str) -> int:
    """``--master-port``: 0 (pick one) or a TCP port."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port in [0, 65535] (0: pick a free one)")
    return int(text)


def _seconds(text: str) -> float:
    """``--timeout``: finite wall seconds, 0 for none (not :mod:`hpu_runtime.cli_args`: importing
    ``hpu_runtime`` here would start the simulated device in the target's process before it asks)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 1e7:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1e7] wall seconds (0: no limit)")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line (``[options] [-m] TARGET [ARGS...]``)."""
    parser = argparse.ArgumentParser(
        prog="python -m launchers.mpi",
        description="Run a torchrun-style DDP script in every rank of an MPI job.",
    )
    parser.add_argument(
        "--master-addr",
        help="rendezvous host (default: loopback when all ranks are on one host, "
        "else rank 0's address)",
    )
    parser.add_argument(
        "--master-port",
        type=_port,
        default=0,
        help="rendezvous port (default: a free port picked by rank 0)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=0.0,
        help="abort the whole job if this rank's target has not finished after this "
        "many seconds (default: no limit)",
    )
    parser.add_argument("--log-level", default="INFO", help="launcher log level")
    add_target_arguments(parser)
    return parser


def _bytes_buffer(text: str) -> Any:
    import numpy as np

    raw = text.encode()
    if len(raw) >= _HOST_BYTES:
        raise ValueError(f"host name {text!r} is longer than {_HOST_BYTES - 1} bytes")
    buf = np.zeros(_HOST_BYTES, dtype=np.uint8)
    buf[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return buf


def _buffer_text(buf: Any) -> str:
    return bytes(buf).split(b"\0", 1)[0].decode()


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendezvous:
    """What the ranks agreed on through MPI before the target starts."""

    master_addr: str
    """``MASTER_ADDR`` for every rank."""
    master_port: int
    """``MASTER_PORT`` for every rank."""
    hosts: tuple[str, ...]
    """Host name of each rank, by rank."""
    pids: tuple[int, ...]
    """Process id of each rank, by rank (to name a peer that died)."""


def agree_rendezvous(comm: Any, args: argparse.Namespace) -> Rendezvous:
    """Agrees on ``MASTER_ADDR``/``MASTER_PORT`` across the ranks; gathers hosts and pids.

    Collective: every rank must call it. Only raw fixed-size buffers cross MPI (no
    pickle): each rank's host name and pid (all-gather), then rank 0's address and port
    (broadcast).
    """
    import numpy as np

    size = comm.Get_size()
    names = np.zeros((size, _HOST_BYTES), dtype=np.uint8)
    comm.Allgather(_bytes_buffer(socket.gethostname()), names)
    hosts = tuple(_buffer_text(row) for row in names)
    pids = np.zeros(size, dtype=np.int64)
    comm.Allgather(np.array([os.getpid()], dtype=np.int64), pids)
    addr_buf = np.zeros(_HOST_BYTES, dtype=np.uint8)
    port_buf = np.zeros(1, dtype=np.int64)
    if comm.Get_rank() == 0:
        addr = args.master_addr or rendezvous_host(hosts, socket.gethostname())
        bind = LOOPBACK if addr == LOOPBACK else ""
        addr_buf[:] = _bytes_buffer(addr)
        port_buf[0] = args.master_port or find_free_port(bind)
    comm.Bcast(addr_buf, root=0)
    comm.Bcast(port_buf, root=0)
    return Rendezvous(
        master_addr=_buffer_text(addr_buf),
        master_port=int(port_buf[0]),
        hosts=hosts,
        pids=tuple(int(p) for p in pids),
    )


def unlink_mpich_shm() -> list[str]:
    """Unlinks the MPICH segments this process maps (see ``NOTE [MPICH shared memory]``).

    Call only after a collective over all ranks. Returns the paths unlinked.
    """
    done = []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if _MPICH_SHM_PREFIX in line}
    except OSError:
        return done
    for path in sorted(paths):
        if path.startswith(_MPICH_SHM_PREFIX):
            try:
                os.unlink(path)
                done.append(path)
            except OSError:  # another local rank was first
                pass
    return done


def _dead_peers(rdv: Rendezvous, rank: int) -> list[int]:
    """Ranks on this host, other than ``rank``, whose process no longer runs."""
    here = rdv.hosts[rank]
    return [
        r
        for r, (host, pid) in enumerate(zip(rdv.hosts, rdv.pids, strict=True))
        if r != rank and host == here and not _alive(pid)
    ]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _check_env(env: RankEnv, rank: int, size: int) -> None:
    """Refuses an environment that disagrees with MPI's own view of the job."""
    if env.source == "default":
        return  # started without mpiexec: a singleton MPI job
    if (env.rank, env.world_size) != (rank, size):
        raise ValueError(
            f"launcher variables ({env.source}) say rank {env.rank} of {env.world_size}, "
            f"MPI says rank {rank} of {size}"
        )


def _unread_bytes(fd: int) -> int:
    """Bytes written to the pipe behind ``fd`` and not yet read (0 if ``fd`` is no pipe)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder, signed=True)


def abort_job(comm: Any, code: int, limit_s: float = _DRAIN_LIMIT_S) -> None:
    """Flushes the log, lets Hydra read it, then ``MPI_Abort(code)`` (see NOTE [last words])."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (_unread_bytes(2) > 0 or _unread_bytes(1) > 0):
        time.sleep(0.01)
    comm.Abort(code)


def _abort_after(comm: Any, rank: int, seconds: float) -> threading.Timer:
    def fire() -> None:
        logger.error("rank %d: target did not finish within %.0f s; aborting the job", rank, seconds)
        abort_job(comm, 124)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def run(target: Target, args: argparse.Namespace, MPI: Any) -> int:
    """Sets up this rank's environment and runs ``target``; returns its exit code."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    env = resolve_rank_env()
    _check_env(env, rank, size)
    rdv = agree_rendezvous(comm, args)
    unlink_mpich_shm()
    if env.source == "default":
        local_rank, local_size = rank, size
    else:
        local_rank, local_size = env.local_rank, env.local_world_size
    env = RankEnv(
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        local_world_size=local_size,
        master_addr=rdv.master_addr,
        master_port=rdv.master_port,
        source=env.source,
    )
    export_rank_env(env)
    one_thread_per_rank(local_size)
    logger.info(
        "rank %d of %d is pid %d on %s (local rank %d of %d); rendezvous %s:%d",
        rank,
        size,
        os.getpid(),
        rdv.hosts[rank],
        local_rank,
        local_size,
        rdv.master_addr,
        rdv.master_port,
    )
    timer = _abort_after(comm, rank, args.timeout) if args.timeout > 0 else None
    try:
        target.run_main()
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:  # noqa: BLE001 - any failure must abort the whole job
        logger.exception("rank %d failed running %s", rank, target.describe())
        code = 1
    finally:
        if timer is not None:
            timer.cancel()
    if code != 0:
        dead = _dead_peers(rdv, rank)
        cause = f" after rank(s) {dead} died" if dead else ""
        logger.error("rank %d failed (exit code %d)%s; aborting the MPI job", rank, code, cause)
        abort_job(comm, code)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m launchers.mpi``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    target = target_from_args(args)
    try:
        MPI = import_mpi()
    except MPIUnavailableError as exc:
        logger.error("%s", exc)
        return 2
    try:
        return run(target, args, MPI)
    except ValueError as exc:
        logger.error("rank %d: %s", MPI.COMM_WORLD.Get_rank(), exc)
        abort_job(MPI.COMM_WORLD, 2)
        return 2


if __name__ == "__main__":
    sys.exit(main())
