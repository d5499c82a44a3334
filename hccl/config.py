"""``HcclConfig``: every environment variable the "hccl" backend reads, read once and validated.

A process group takes ``HcclConfig.from_env()`` when it is created and keeps it: changing
``os.environ`` afterwards changes nothing for that group (a new group reads again). Errors
are ``ValueError`` naming the variable and its value.

Not here: the launcher's rank variables (``RANK``, ``OMPI_COMM_WORLD_RANK``...), which
:mod:`hccl.env` maps, and the group's timeout, which comes from ``init_process_group``.
"""

from __future__ import annotations

import numbers
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .sim.schedule import check_slice_mb

__all__ = ["HcclConfig", "DEFAULT_SLICE_SIZE_MB", "DEFAULT_SHM_BUFFER_MB", "SHM_BUFFER_MB_RANGE", "TRANSPORTS"]

DEFAULT_SLICE_SIZE_MB = 16.0
"""``PT_HCCL_SLICE_SIZE_MB`` default: the PyTorch bridge's slice (HCL's own is 512 KB)."""

DEFAULT_SHM_BUFFER_MB = 2.0
"""``HCCL_SHM_BUFFER_MB`` default: each rank's shared-memory staging region (NOTE [the staging
region's size])."""

SHM_BUFFER_MB_RANGE = (1 / 256, 4096.0)
"""Accepted ``HCCL_SHM_BUFFER_MB``, MiB: 4 KiB to 4 GiB per region."""

TRANSPORTS = ("shm", "mpi")
"""``HCCL_TRANSPORT`` values: ``shm`` (shared memory in a host, TCP between) or ``mpi``."""

# NOTE [the staging region's size]
# A large collective crosses shared memory one slice at a time, a slice being at most one
# staging region (``HCCL_SHM_BUFFER_MB``): each rank copies its slice in, then reads every
# rank's copy and writes the result (hccl/transport/shm_engine.py). At 2 MiB a slice's copies
# stay in the processor's caches between the copy and the reduction; at the former 16 MiB a
# slice's three buffers per rank (its copy, the peer's, the result: 48 MiB per rank on 2 ranks)
# overflowed the last-level cache (32 MiB on the 2-core VM measured here, 1 MiB L2 per core) and
# went out to DRAM and back. ``python -m hccl.tools.bench_transport`` on that VM (wall-clock
# allreduce bus bandwidth, 16 / 64 MB, 2 ranks): idle 2.6-3.5 GB/s with 16 MiB regions against
# 3.6-6.2 with 1-2 MiB; beside one busy process (``--load 1``) 1.5-2.0 against 2.2-3.1 (gloo
# 0.7-1.2). Regions of 0.5, 1 and 2 MiB measured alike with 2 ranks; with 4 ranks on the 2
# cores (two rounds per slice) 2 MiB did best (16 / 64 MB: 2.3-2.9 / 2.9-3.0 GB/s; 1 MiB
# 1.3-2.4 / 2.3-2.9; 16 MiB 2.1 / 2.2). Smaller slices also mean more rounds, and each round a
# rank may wait for a peer that lost its core.

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _box_of_card(device_spec: str | None) -> str:
    """The default ``HCCL_TOPOLOGY``: the box ``HPU_DEVICE_SPEC``'s cards come in (Gaudi 3 cards
    in an ``hls3``), else ``hls2``. A device name the runtime refuses is left to it to report."""
    if device_spec is None:
        return "hls2"
    from .sim.topology import device_and_topology

    try:
        return device_and_topology(device_spec, None)[1]
    except ValueError:
        return "hls2"


def card_and_box(device: str | None = None, topology: str | None = None,
                 environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The card and the system of a command with ``--device-spec`` / ``--topology`` flags:
    each flag, else its variable (``HPU_DEVICE_SPEC``, ``HCCL_TOPOLOGY``), else it follows the
    other (:func:`hccl.sim.topology.device_and_topology`); ``(generation, topology)``.

    Raises:
        ValueError: an unknown device or topology, or two of different generations, naming
            each and where it came from.
    """
    from .sim.topology import device_and_topology

    env = os.environ if environ is None else environ
    env_device = env.get("HPU_DEVICE_SPEC", "").strip() or None
    env_topology = env.get("HCCL_TOPOLOGY", "").strip() or None
    return device_and_topology(device or env_device, topology or env_topology,
                               device_from="--device-spec" if device else "HPU_DEVICE_SPEC",
                               topology_from="--topology" if topology else "HCCL_TOPOLOGY")


@dataclass(frozen=True, kw_only=True, slots=True)
class HcclConfig:
    """The backend's configuration (see the README's environment table)."""

    topology: str = "hls2"
    """``HCCL_TOPOLOGY``: ``hls1``, ``hls2``, ``hls3`` or a TOML topology file (loaded, and
    checked against the world size and the card's generation, when a group is created); unset,
    the box of ``HPU_DEVICE_SPEC``'s cards, else ``hls2``."""
    algorithm: str | None = None
    """``HCCL_ALGO``: a registered algorithm forced on every collective; None: the selection rule."""
    slice_size_mb: float = DEFAULT_SLICE_SIZE_MB
    """``PT_HCCL_SLICE_SIZE_MB``: simulated pipelining slice, MiB, in
    :data:`~hccl.sim.schedule.SLICE_MB_RANGE` (4 KiB to 64 GiB)."""
    transport: str = "shm"
    """``HCCL_TRANSPORT``: one of :data:`TRANSPORTS`."""
    shm_buffer_mb: float = DEFAULT_SHM_BUFFER_MB
    """``HCCL_SHM_BUFFER_MB``: size of each rank's shared-memory staging region, MiB, in
    :data:`SHM_BUFFER_MB_RANGE` (4 KiB to 4 GiB)."""
    socket_addr: str | None = None
    """``HCCL_SOCKET_ADDR``: address the TCP transport listens on (default loopback)."""
    socket_ifname: str | None = None
    """``HCCL_SOCKET_IFNAME``: interface whose IPv4 address the TCP transport listens on."""
    host_id: str | None = None
    """``HCCL_HOST_ID``: which host a rank is on (ranks with equal ids share memory); None:
    the host name (plus torchrun's node rank, :attr:`torchrun_node`)."""
    torchrun_node: str | None = None
    """torchrun's ``GROUP_RANK`` (only under torchrun, ``TORCHELASTIC_RUN_ID`` set): two
    torchrun nodes started on one machine act as two hosts."""
    lazy_collectives: bool = False
    """``PT_HPU_ENABLE_LAZY_COLLECTIVES`` (default false, as Intel's bridge): in lazy mode an
    allreduce joins the accumulated graph instead of launching it."""
    comm_id: str | None = None
    """``HCCL_COMM_ID`` (``host:port``): Gaudi's HCCL rendezvous address. Accepted and
    checked for scripts that set it; the emulation rendezvouses through torch's store."""

    def __post_init__(self) -> None:
        if not self.topology:
            raise ValueError("HCCL_TOPOLOGY='' names no topology; use hls1, hls2, hls3 or a topology file")
        if self.algorithm is not None:
            from .sim import algorithms  # the time plane's registry

            try:
                algorithms.get(self.algorithm)
            except ValueError as exc:
                raise ValueError(f"HCCL_ALGO={self.algorithm!r}: {exc}") from None
        check_slice_mb(self.slice_size_mb)
        if self.transport not in TRANSPORTS:
            raise ValueError(f"HCCL_TRANSPORT={self.transport!r} is not a transport; use 'shm' (the default) or 'mpi'")
        lo, hi = SHM_BUFFER_MB_RANGE
        if isinstance(self.shm_buffer_mb, bool) or not isinstance(self.shm_buffer_mb, numbers.Real) \
                or not lo <= self.shm_buffer_mb <= hi:  # NaN fails too
            raise ValueError(f"HCCL_SHM_BUFFER_MB={self.shm_buffer_mb!r} must be a number of MiB in"
                             f" [{lo:g}, {hi:g}] (4 KiB to 4 GiB)")
        if self.comm_id is not None:
            host, sep, port = self.comm_id.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"HCCL_COMM_ID={self.comm_id!r} is not host:port")

    # ---- derived values -------------------------------------------------------------------
    @property
    def slice_bytes(self) -> int:
        """The pipelining slice in bytes."""
        return int(self.slice_size_mb * (1 << 20))

    @property
    def shm_buffer_bytes(self) -> int:
        """The staging region in bytes: a multiple of 64, at least 4 KiB."""
        return max(4096, int(self.shm_buffer_mb * 1024 * 1024) // 64 * 64)

    def host_key(self) -> str:
        """Which host this process is on, for grouping ranks that can share memory."""
        if self.host_id:
            return self.host_id
        key = socket.gethostname()
        return f"{key}/node{self.torchrun_node}" if self.torchrun_node else key

    # ---- reading ----------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HcclConfig:
        """Read and validate the variables from ``environ`` (default ``os.environ``).

        Raises:
            ValueError: a variable with a bad value; the message names it and the value.
        """
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            raw = env.get(name, "").strip()
            return raw or None

        def number(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None

        lazy = env.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "").strip().lower()
        if lazy not in _TRUE + _FALSE:
            raise ValueError(f"PT_HPU_ENABLE_LAZY_COLLECTIVES={lazy!r} must be true or false")
        return cls(
            topology=text("HCCL_TOPOLOGY") or _box_of_card(text("HPU_DEVICE_SPEC")),
            algorithm=text("HCCL_ALGO"),
            slice_size_mb=number("PT_HCCL_SLICE_SIZE_MB", DEFAULT_SLICE_SIZE_MB),
            transport=(text("HCCL_TRANSPORT") or "shm").lower(),
            shm_buffer_mb=number("HCCL_SHM_BUFFER_MB", DEFAULT_SHM_BUFFER_MB),
            socket_addr=text("HCCL_SOCKET_ADDR"),
            socket_ifname=text("HCCL_SOCKET_IFNAME"),
            host_id=text("HCCL_HOST_ID"),
            torchrun_node=text("GROUP_RANK") if env.get("TORCHELASTIC_RUN_ID") else None,
            lazy_collectives=lazy in _TRUE,
            comm_id=text("HCCL_COMM_ID"),
        )
