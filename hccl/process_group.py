"""``ProcessGroupHCCL``: the emulated "hccl" torch.distributed backend.

The class is assembled from the face's parts: configuration (:mod:`hccl.config`, frozen at
creation), rendezvous and transport choice (:mod:`hccl.rendezvous`), the collectives
(:mod:`hccl.collectives`, arguments checked by :mod:`hccl.checks`), the collectives built
from them (:mod:`hccl.composite`) and point-to-point (:mod:`hccl.point_to_point`). This
module holds what they share: creation, :meth:`ProcessGroupHCCL._run` (move the bytes,
time the collective, record it, return a completed :class:`~hccl.work.HcclWork`), error
handling and the lifecycle.

Errors: a bad argument (unsupported dtype or reduce op, wrong number of tensors, root out of
range) raises ``ValueError``/``TypeError`` on the calling rank before anything is sent; a
mismatch between ranks (different sizes, dtypes, ops, roots or collective order) raises
:class:`~hccl.transport.shm_engine.CollectiveMismatchError` on every rank; a dead or failed peer
raises :class:`~hccl.transport.shm.PeerFailure` and a peer that never arrives raises
:class:`~hccl.transport.shm.HcclTimeoutError` after the group's timeout. After any of
these the group is unusable and says so.

NOTE [dynamo and a Python ProcessGroup]
torch's collectives and DDP's C++ reducer call the process group and its Work objects
through pybind trampolines, so every collective and ``wait`` of this backend is a Python
frame started from C++. Under ``torch.compile`` dynamo's frame hook sees each such frame as
a function to compile (gloo's, in C++, are invisible to it), and dynamo treats every
``dist.ProcessGroup`` as an opaque object with a few known members (``size``, ``rank``,
``group_name``...): compiling ``ProcessGroupHCCL.broadcast`` stopped at ``self._check`` with
``UnsafeScriptObjectError``, a hard error, at DDP's bucket rebuild (a broadcast from the
reducer) in the second iteration of ``torch.compile(DDP(model))``. A collective is no graph
to capture: :class:`ProcessGroupHCCL` and :class:`~hccl.work.HcclWork` are marked
:func:`~hpu_runtime.bridge.dynamo_skip.skip_dynamo`, so they run as a C++ backend would,
and a compiled region around a collective is cut there (see
:mod:`hpu_runtime.bridge.compile_backend`).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hpu_runtime import bridge_disabled, get_device
from hpu_runtime.bridge.dynamo_skip import skip_dynamo
from hpu_runtime.bridge.unrecorded import unrecorded

from ._buffers import meta_words
from .agreement import settings_of
from .collectives import CollectivesMixin
from .composite import CompositeMixin
from .config import HcclConfig
from .plans import make_planner
from .point_to_point import PointToPointMixin
from .rendezvous import rendezvous
from .sim.cluster import QUIET_STEPS, from_env as cluster_from_env
from .sim.placement import place_group
from .sim.variability import rank_slowdown
from .sim.whatif import link_faults
from .sim.timing import AUTO, collective_times, host_topology, p2p_times
from .sim.topology import GENERATION_BOX, Topology
from .transport.reduce_ops import capped_threads, transport_threads
from .transport.shm import HcclTimeoutError
from .transport.tcp import ConnectionLost
from .work import CollectiveRecord, HcclWork

__all__ = ["ProcessGroupHCCL", "HcclError"]


class HcclError(RuntimeError):
    """The process group cannot be used (an earlier collective failed)."""


class _EmulatorOps:
    """:meth:`ProcessGroupHCCL._emulator_ops`: :func:`~hpu_runtime.bridge_disabled`,
    :class:`~hccl.transport.reduce_ops.capped_threads` and
    :class:`~hpu_runtime.bridge.unrecorded.unrecorded` (a profiler records the user's
    collective, not the transport's copies and reductions inside it) in one object (one per
    collective)."""

    __slots__ = ("_threads", "_bridge", "_unrecorded")

    def __init__(self, threads: int) -> None:
        self._threads = capped_threads(threads)
        self._bridge = bridge_disabled()
        self._unrecorded = unrecorded()

    def __enter__(self) -> None:
        self._threads.__enter__()
        self._bridge.__enter__()
        self._unrecorded.__enter__()

    def __exit__(self, *exc) -> None:
        self._unrecorded.__exit__(*exc)
        self._bridge.__exit__(*exc)
        self._threads.__exit__(*exc)


@skip_dynamo  # NOTE [dynamo and a Python ProcessGroup]
class ProcessGroupHCCL(CollectivesMixin, CompositeMixin, PointToPointMixin, dist.ProcessGroup):
    """The emulated HCCL backend for one group of ranks (shared memory inside a host; the
    time plane's schedules over shared memory and TCP between hosts, or over MPI with
    ``HCCL_TRANSPORT=mpi``).

    Args:
        store: the c10d store of the group (small metadata only, never tensor data).
        rank: this process's rank in the group.
        world_size: ranks in the group.
        timeout: limit for any single wait on peers.
        group_id: a name unique to the group (keys in the store, segment names).
        global_ranks: a subgroup's members' ranks in the job (torch's
            ``global_ranks_in_group``); None or empty for the default group. Its
            collectives are timed on those ranks' cards (NOTE [subgroup placement]).
        job_world_size: ranks in the job (needed with ``global_ranks``).
        job_topology: the job's system a subgroup's members sit on (the default group's
            :attr:`topology`); None: ``HCCL_TOPOLOGY`` for ``job_world_size`` ranks.
        config: the backend's configuration; default ``HcclConfig.from_env()``, read now
            and kept: later changes to the environment do not reach this group.

    Raises:
        ValueError: a bad variable of :class:`~hccl.config.HcclConfig` (the message names
            it), or a world size the topology cannot hold.
        SettingsMismatchError: ranks disagree on a setting they must share (NOTE
            [settings agreement] in :mod:`hccl.agreement`), raised on every rank.
        HcclTimeoutError: peers did not rendezvous within ``timeout``.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout: timedelta = timedelta(minutes=5),
        group_id: str = "",
        global_ranks=None,
        job_world_size: int | None = None,
        config: HcclConfig | None = None,
        job_topology: Topology | None = None,
    ) -> None:
        super().__init__(rank, world_size)
        self.config = HcclConfig.from_env() if config is None else config
        self._rank = rank
        self._world_size = world_size
        self._timeout_s = timeout.total_seconds() if timeout.total_seconds() > 0 else 300.0
        self._seq = 0
        self._error: str | None = None
        self._coll = None
        self._sends: list = []  # p2p.SendOp still being posted
        self._recvs: list = []  # p2p.RecvOp still being taken, in posting order
        self._transport_threads = 1  # set from the host layout once the rendezvous found it
        self._group_name = group_id
        self.history: list[CollectiveRecord] = []
        self._history_limit = 100_000
        self._device = get_device()  # the simulated card of this process
        # eager mode has no graph to join
        self._lazy_collectives = self.config.lazy_collectives and self._device.lazy
        self._planner = None  # set with the placement, before any collective runs
        self.cluster = cluster_from_env()  # variability and what-ifs (hccl.sim.cluster)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt and attempt != "0":  # torchrun --max-restarts keeps the store: the last attempt's keys are stale
            store = dist.PrefixStore(f"hccl/attempt{attempt}/", store)
        self._store = store  # NOTE [the first failure names the cause]
        names = list(global_ranks) if global_ranks else list(range(world_size))  # errors name global ranks
        self._names = names
        found = rendezvous(store, rank, world_size, self._timeout_s, self.config, self._plan, names,
                           settings_of(self.config, self._device.spec, self.cluster))
        self.layout, self._coll = found.layout, found.coll
        transport = getattr(found.coll, "transport", None)
        if hasattr(transport, "on_failure"):  # the cause is posted before a connection drops
            transport.on_failure = self._first_failure
        self._transport_threads = transport_threads(len(self.layout.local_ranks))
        subgroup = bool(global_ranks) and list(global_ranks) != list(range(job_world_size or world_size))
        try:  # a bad HCCL_TOPOLOGY fails here, not mid-training
            if subgroup:
                job = job_topology or self._load_topology(job_world_size or max(global_ranks) + 1, 0)
                self._placement = place_group(job, global_ranks)
            else:
                sizes = {len(h) for h in self.layout.hosts}  # hosts of equal size become boxes
                per_host = sizes.pop() if len(self.layout.hosts) > 1 and len(sizes) == 1 else 0
                job = link_faults(self._load_topology(world_size, per_host), self.cluster.whatif)
                self._placement = place_group(job, range(world_size))
                # this process's card: its slowdown in each step (NOTE [a slower card, step by step])
                self._device.set_step_slowdown(rank_slowdown(self.cluster.variability, self.cluster.whatif, rank,
                                                             quiet=QUIET_STEPS))
        except BaseException:
            self.shutdown()
            raise
        self.topology: Topology = self._placement.topology
        """The system this group's collectives are timed on (its members' cards)."""
        self._planner = make_planner(rank, world_size, self._placement, algorithm=self.config.algorithm or AUTO,
                                     slice_bytes=self.config.slice_bytes)

    def _load_topology(self, world_size: int, ranks_per_host: int) -> Topology:
        """The job's system; its boxes must hold this process's card (every rank agreed on
        both settings at the rendezvous, so all raise alike)."""
        try:
            topo = host_topology(self.config.topology, world_size, ranks_per_host)
        except ValueError as exc:
            raise ValueError(f"hccl: HCCL_TOPOLOGY={self.config.topology!r}: {exc}") from None
        card, held = self._device.spec.name, topo.generation
        if card in GENERATION_BOX and held in GENERATION_BOX and card != held:  # a box holds one generation
            given = os.environ.get("HPU_DEVICE_SPEC", "").strip()
            raise ValueError(f"hccl: this process's card is a {card} (HPU_DEVICE_SPEC={given or 'unset'}), but "
                             f"HCCL_TOPOLOGY={self.config.topology!r} is a box of {held} cards: set "
                             f"HPU_DEVICE_SPEC={held}, or name a topology of {card} boxes")
        return topo

    # ---- the timing seam: this group's placement and frozen configuration ---------------------
    def _plan(self, req):
        """The schedule executor's plan for ``req``: the schedule the timing model times."""
        return self._planner(req)

    def _collective_times(self, kind, nbytes, ready_all, **kw):
        return collective_times(kind, nbytes, ready_all, rank=self._rank, placement=self._placement,
                                algorithm=self.config.algorithm or AUTO, slice_bytes=self.config.slice_bytes, **kw)

    def _p2p_times(self, nbytes, **kw):
        return p2p_times(nbytes, placement=self._placement, **kw)

    # ---- plumbing ---------------------------------------------------------------------
    def _meta(self, kind: str, dtype: int, numel: int, op: int = 0, root: int = 0, ready_ns: int = 0, x0: int = 0) -> list[int]:
        return meta_words(self._seq, kind, dtype, numel, op, root, ready_ns, x0)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise HcclError(f"hccl: process group is unusable after an earlier error: {self._error}")

    def _run(self, kind: str, nbytes: int, outputs: list[torch.Tensor], body, **timing_args) -> HcclWork:
        """Run ``body(ready_ns, what) -> every rank's ready ns`` with error handling and timing.

        ``timing_args`` (root, dtype_bytes, splits) is passed on to the timing model.
        """
        if self._error is not None:
            self._check_usable()
        if self._sends or self._recvs:
            self._drain_p2p()
        seq = self._seq
        what = f"{kind} #{seq}"
        if self._lazy_collectives and kind == "allreduce":
            return self._run_lazy(what, kind, seq, nbytes, outputs, body, timing_args)
        ready = self._device.collective_ready_ns()
        ready_all = self._guarded(what, lambda: body(ready, what))
        self._seq = seq + 1
        start, end, algorithm = self._collective_times(kind, nbytes, ready_all, **timing_args)
        return self._record(what, kind, seq, nbytes, start, end, algorithm, outputs)

    def _run_lazy(self, what, kind, seq, nbytes, outputs, body, timing_args) -> HcclWork:
        """``PT_HPU_ENABLE_LAZY_COLLECTIVES``: move the bytes now, time the allreduce inside the
        pending graph when it is launched (NOTE [lazy collectives] in hpu_runtime.device.card)."""
        self._guarded(what, lambda: body(0, what))
        self._seq = seq + 1
        n = self._world_size
        dev = self._device
        work = HcclWork(outputs, CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=0, end_ns=0,
                                                  algorithm="lazy (not launched yet)"), dev, lazy=True)

        def on_timed(start: int, end: int, algorithm: str) -> None:
            work.record = self._remember(CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=start,
                                                          end_ns=end, algorithm=algorithm))

        dev.add_graph_collective(
            what, lambda ready: self._collective_times(kind, nbytes, [ready] * n, **timing_args),
            serials=[dev.make_resident(t) for t in outputs], on_timed=on_timed)
        return work

    def _guarded(self, what: str, fn):
        """Run ``fn`` (the emulator's own tensor ops, unseen by the bridge); on any failure mark
        the group unusable and tell the peers at once (abort flag; TCP connections dropped)."""
        try:
            with self._emulator_ops(), torch.no_grad():  # as gloo: collectives are not autograd ops
                return fn()
        except BaseException as exc:
            cause = self._first_failure(exc)
            self._error = f"{what}: {cause or exc}"
            if self._coll is not None:
                self._coll.abort(self._error)
                self._coll.close()
            if cause is not None:
                raise type(exc)(cause) from exc
            raise

    def _emulator_ops(self) -> _EmulatorOps:
        """Context manager for the emulator's own tensor ops: unseen by the bridge, on at most
        the rank's share of the cores (NOTE [the transport's threads] in
        :mod:`hccl.transport.reduce_ops`)."""
        return _EmulatorOps(self._transport_threads)

    def _first_failure(self, exc: BaseException) -> str | None:
        """NOTE [the first failure names the cause]: the first rank of a group to fail posts
        why in the group's store (first writer wins) before it drops its connections. A rank
        that then loses a connection (a peer on another host "closed its connection" only
        because it passed the failure on) or times out reports that first failure instead.
        The transport between hosts calls this too, as its ``on_failure``, before it closes the
        connections of a failed phase: a peer that sees a connection close can always read why.
        Returns the message to raise instead of ``exc``'s, or None to keep ``exc``."""
        me = self._names[self._rank]
        try:
            first = self._store.compare_set("hccl/first_failure", "", f"{me}\n{type(exc).__name__}\n{exc}").decode()
        except Exception:  # noqa: BLE001 - the store may have gone with a dead rank 0: keep exc
            return None
        rank, kind, reason = first.split("\n", 2)
        # a timeout is no cause of another (each names the ranks it waited for)
        if rank == str(me) or not isinstance(exc, (ConnectionLost, HcclTimeoutError)) or kind == "HcclTimeoutError":
            return None
        return f"{reason} [reported by rank {rank}; rank {me} then saw: {exc}]"

    def _record(self, label: str, kind: str, seq: int, nbytes: int, start: int, end: int, algorithm: str, outputs,
                **work_args) -> HcclWork:
        """Occupy the simulated collective stream, keep the record, return the finished Work."""
        self._device.record_collective(label, start, end, outputs,
                                       args={"kind": kind, "bytes": nbytes, "algorithm": algorithm})
        rec = self._remember(CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=start, end_ns=end,
                                              algorithm=algorithm))
        return HcclWork(outputs, rec, self._device, **work_args)

    def _remember(self, rec: CollectiveRecord) -> CollectiveRecord:
        """Keep ``rec`` in :attr:`history` (up to its limit); returns it."""
        if len(self.history) < self._history_limit:
            self.history.append(rec)
        return rec

    # ---- identity ---------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "hccl"

    # What torch asks a backend before using its optional features (the properties of c10d's
    # Backend; this group is its own backend, see _get_backend): none of them is offered.
    supports_splitting = False  # dist.split_group (asked before an eager connect)
    supports_coalescing = False  # _start_coalescing / _end_coalescing
    supports_shrinking = False  # dist.shrink_group
    supports_tensor_alloc = False  # a backend memory allocator (symmetric memory)
    supports_time_estimate = False  # dist._time_estimator (NCCL's)

    def _get_backend(self, device):
        """The backend that serves ``device``: this group itself, for "cpu" and "hpu" (torch asks,
        e.g. ``init_process_group(..., device_id=torch.device("hpu", 0))``, as Gaudi's hccl backend
        registers for ``hpu``; a Python ProcessGroup has no per-device backends of torch's own).

        Raises:
            RuntimeError: another device type, in torch's words.
        """
        kind = torch.device(device).type
        if kind not in ("cpu", "hpu"):
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    @property
    def group_name(self) -> str:
        """The name torch registered this group under (set by the backend creator)."""
        return self._group_name

    @group_name.setter
    def group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def last_collective(self) -> CollectiveRecord | None:
        """The most recent collective's simulated record (None before the first)."""
        return self.history[-1] if self.history else None

    def __repr__(self) -> str:
        return f"ProcessGroupHCCL(rank={self._rank}, world_size={self._world_size})"

    # ---- lifecycle --------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release the shared-memory mappings and sockets (idempotent)."""
        coll = getattr(self, "_coll", None)
        if coll is not None:
            coll.close()
            if coll.arena is not None:
                coll.arena.close()
            self._coll = None
            if self._error is None:
                self._error = "the process group was shut down"

    def abort(self) -> None:
        self.shutdown()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.shutdown()
        except Exception:
            pass
