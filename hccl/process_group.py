"""``ProcessGroupHCCL``: the emulated "hccl" torch.distributed backend.

Each method validates its arguments, hands flat contiguous buffers to the shared-memory
engine (real bytes between processes), asks the timing model for the simulated duration
from every rank's ready time, records the collective on the simulated device's collective
stream and returns a completed :class:`~hccl.work.HcclWork`.

Errors: a bad argument (unsupported dtype or reduce op, wrong number of tensors, root out of
range) raises ``ValueError``/``TypeError`` on the calling rank before anything is sent; a
mismatch between ranks (different sizes, dtypes, ops, roots or collective order) raises
:class:`~hccl.shm_engine.CollectiveMismatchError` on every rank; a dead or failed peer
raises :class:`~hccl.transport.shm.PeerFailure` and a peer that never arrives raises
:class:`~hccl.transport.shm.HcclTimeoutError` after the group's timeout. After any of
these the group is unusable and says so.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from hpu_runtime import bridge_disabled, get_device

from . import p2p, timing
from . import shm_engine as eng
from .multihost import HostLayout, MultiHost
from .reduce_ops import check_dtype, check_reduction, reduce_op_code
from .timing import collective_times, p2p_times
from .transport.shm import ShmArena, ShmSegment
from .transport.tcp import TcpMesh
from .work import CollectiveRecord, HcclWork

__all__ = ["ProcessGroupHCCL", "HcclError"]


_DEFAULT_BUFFER_MB = 16


def _host_key() -> str:
    """Which host this process is on, for grouping ranks that can share memory.

    ``HCCL_HOST_ID`` wins; otherwise the host name, plus torchrun's node rank
    (``GROUP_RANK``) so that two torchrun nodes started on one machine act as two hosts.
    """
    explicit = os.environ.get("HCCL_HOST_ID")
    if explicit:
        return explicit
    key = socket.gethostname()
    if os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("GROUP_RANK"):
        key += f"/node{os.environ['GROUP_RANK']}"
    return key


class HcclError(RuntimeError):
    """The process group cannot be used (an earlier collective failed)."""


def _buffer_bytes() -> int:
    raw = os.environ.get("HCCL_SHM_BUFFER_MB", str(_DEFAULT_BUFFER_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"HCCL_SHM_BUFFER_MB={raw!r} is not a number") from None
    if not 0 < mb <= 4096:
        raise ValueError(f"HCCL_SHM_BUFFER_MB={raw!r} must be in (0, 4096]")
    return max(4096, int(mb * 1024 * 1024) // 64 * 64)


def _transport() -> str:
    """``HCCL_TRANSPORT``: ``shm`` (default: shared memory inside a host, TCP between) or ``mpi``."""
    raw = os.environ.get("HCCL_TRANSPORT", "")
    value = raw.strip().lower() or "shm"
    if value not in ("shm", "mpi"):
        raise ValueError(f"HCCL_TRANSPORT={raw!r} is not a transport; use 'shm' (the default) or 'mpi'")
    return value


def lazy_collectives_enabled() -> bool:
    """``PT_HPU_ENABLE_LAZY_COLLECTIVES`` (default false, as Intel's bridge): in lazy mode an
    allreduce joins the accumulated graph instead of launching it.

    Raises:
        ValueError: a value other than true/false/1/0.
    """
    raw = os.environ.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return get_device().lazy  # eager mode has no graph to join
    raise ValueError(f"PT_HPU_ENABLE_LAZY_COLLECTIVES={raw!r} must be true or false")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A flat contiguous view of ``t`` (or a contiguous copy, written back by the caller)."""
    return t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)


def _writeback(orig: torch.Tensor, flat: torch.Tensor) -> None:
    if orig.numel() and flat.data_ptr() != orig.data_ptr():
        orig.copy_(flat.view(orig.shape))


class ProcessGroupHCCL(dist.ProcessGroup):
    """The emulated HCCL backend for one group of ranks (shared memory inside a host, TCP
    between hosts' leaders, or MPI with ``HCCL_TRANSPORT=mpi``).

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

    Raises:
        ValueError: a bad ``HCCL_TRANSPORT``, ``HCCL_TOPOLOGY``, ``HCCL_ALGO`` or
            ``PT_HCCL_SLICE_SIZE_MB``, or a world size the topology cannot hold.
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
    ) -> None:
        super().__init__(rank, world_size)
        self._rank = rank
        self._world_size = world_size
        self._timeout_s = timeout.total_seconds() if timeout.total_seconds() > 0 else 300.0
        self._seq = 0
        self._error: str | None = None
        self._sends: list = []  # p2p.SendOp still being posted
        self._group_name = group_id
        self.history: list[CollectiveRecord] = []
        self._history_limit = 100_000
        self._device = get_device()  # the simulated card of this process
        self._lazy_collectives = lazy_collectives_enabled()
        self._coll = self._rendezvous(store, group_id)
        subgroup = bool(global_ranks) and list(global_ranks) != list(range(job_world_size or world_size))
        self._placement = None
        sizes = {len(h) for h in self.layout.hosts}
        if not subgroup and len(self.layout.hosts) > 1 and len(sizes) == 1:
            timing.set_ranks_per_host(world_size, sizes.pop())  # the job's hosts: a subgroup's are not
        try:  # a bad HCCL_TOPOLOGY / HCCL_ALGO / PT_HCCL_SLICE_SIZE_MB fails here, not mid-training
            if subgroup:
                self._placement = timing.group_placement(global_ranks, job_world_size or max(global_ranks) + 1)
                self.topology = self._placement.topology
            else:
                self.topology = timing.get_topology(world_size)
        except BaseException:
            self.shutdown()
            raise

    # ---- set-up -----------------------------------------------------------------------
    def _rendezvous(self, store: dist.Store, group_id: str):
        """Map the host-local peers' segments; connect the hosts' leaders over TCP.

        Returns the collectives driver: :class:`ShmCollectives` (one host) or
        :class:`MultiHost` (several); with ``HCCL_TRANSPORT=mpi``,
        :class:`~hccl.transport.mpi.MpiCollectives` (all traffic through mpi4py).

        Raises:
            ValueError: ``HCCL_TRANSPORT`` is neither ``shm`` nor ``mpi``.
            MpiUnavailableError: ``HCCL_TRANSPORT=mpi`` without mpi4py or outside an MPI job.
        """
        transport = _transport()
        rank, n = self._rank, self._world_size
        store.set_timeout(timedelta(seconds=self._timeout_s))
        if rank == 0:
            store.set("hccl/token", secrets.token_hex(16))
        token = store.get("hccl/token").decode()
        store.set(f"hccl/host/{rank}", _host_key())
        layout = HostLayout.from_keys([store.get(f"hccl/host/{r}").decode() for r in range(n)], rank)
        self.layout = layout
        if transport == "mpi":
            from .transport.mpi import connect

            return connect(store, rank, n, self._timeout_s)
        local = layout.local_ranks
        capacity = _buffer_bytes()
        names = {r: f"hccl_{token[:16]}_{r}" for r in local}
        mine = ShmSegment(names[rank], capacity, create=True, p2p_slots=len(local))
        segments: list[ShmSegment] = []
        mesh = None
        try:
            store.set(f"hccl/seg/{rank}", names[rank])
            store.wait([f"hccl/seg/{r}" for r in local], timedelta(seconds=self._timeout_s))
            for r in local:
                segments.append(mine if r == rank else ShmSegment(names[r], capacity, create=False, p2p_slots=len(local)))
            arena = ShmArena(segments, layout.local_index, self._timeout_s, group_ranks=list(local))
            # everyone on this host has mapped everyone: the names are no longer needed
            eng.barrier(arena, self._meta("barrier", 0, 0), "hccl rendezvous")
            mine.unlink()
            if len(layout.hosts) == 1:
                return eng.ShmCollectives(arena)
            if layout.is_leader:
                peers = [r for r in layout.leaders if r != rank]
                mesh = TcpMesh(rank, peers, token, self._timeout_s)
                store.set(f"hccl/tcp/{rank}", mesh.address)
                addresses = {p: store.get(f"hccl/tcp/{p}").decode() for p in peers}
                mesh.connect(addresses)
            return MultiHost(layout, arena, mesh)
        except BaseException:
            if mesh is not None:
                mesh.close()
            for seg in segments or [mine]:
                seg.close()
            raise

    # ---- plumbing ---------------------------------------------------------------------
    def _meta(self, kind: str, dtype: int, numel: int, op: int = 0, root: int = 0, ready_ns: int = 0, x0: int = 0) -> list[int]:
        return [self._seq, eng.KIND_CODES[kind], dtype, numel, op, root, ready_ns, x0, 0, 0, 0]

    def _check_usable(self) -> None:
        if self._error is not None:
            raise HcclError(f"hccl: process group is unusable after an earlier error: {self._error}")

    def _root(self, opts) -> int:
        """The root rank of ``opts`` (0 without options), checked against the world size."""
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._world_size:
            raise ValueError(f"hccl: root rank {root} out of range for world size {self._world_size}")
        return root

    def _run(self, kind: str, nbytes: int, outputs: list[torch.Tensor], body, **timing) -> HcclWork:
        """Run ``body(ready_ns, what) -> every rank's ready ns`` with error handling and timing.

        ``timing`` (root, dtype_bytes, splits) is passed on to the timing model.
        """
        if self._error is not None:
            self._check_usable()
        if self._sends:
            self._drain_sends()
        seq = self._seq
        what = f"{kind} #{seq}"
        if self._lazy_collectives and kind == "allreduce":
            return self._run_lazy(what, kind, seq, nbytes, outputs, body, timing)
        ready = self._device.collective_ready_ns()
        ready_all = self._guarded(what, lambda: body(ready, what))
        self._seq = seq + 1
        start, end, algorithm = collective_times(kind, nbytes, ready_all, rank=self._rank, placement=self._placement, **timing)
        return self._record(what, kind, seq, nbytes, start, end, algorithm, outputs)

    def _run_lazy(self, what, kind, seq, nbytes, outputs, body, timing) -> HcclWork:
        """``PT_HPU_ENABLE_LAZY_COLLECTIVES``: move the bytes now, time the allreduce inside the
        pending graph when it is launched (NOTE [lazy collectives] in hpu_runtime.device.card)."""
        self._guarded(what, lambda: body(0, what))
        self._seq = seq + 1
        n, rank = self._world_size, self._rank
        dev = self._device
        work = HcclWork(outputs, CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=0, end_ns=0,
                                                  algorithm="lazy (not launched yet)"), dev, lazy=True)

        def on_timed(start: int, end: int, algorithm: str) -> None:
            work.record = self._remember(CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=start,
                                                          end_ns=end, algorithm=algorithm))

        dev.add_graph_collective(
            what, lambda ready: collective_times(kind, nbytes, [ready] * n, rank=rank, placement=self._placement, **timing),
            serials=[dev.make_resident(t) for t in outputs], on_timed=on_timed)
        return work

    def _guarded(self, what: str, fn):
        """Run ``fn`` (the emulator's own tensor ops, unseen by the bridge); on any failure mark
        the group unusable and tell the peers at once (abort flag; TCP connections dropped)."""
        try:
            with bridge_disabled(), torch.no_grad():  # as gloo: collectives are not autograd ops
                return fn()
        except BaseException as exc:
            self._error = f"{what}: {exc}"
            if self._coll is not None:
                self._coll.arena.abort(f"{what}: {exc}")
                self._coll.close()
            raise

    def _record(self, label: str, kind: str, seq: int, nbytes: int, start: int, end: int, algorithm: str, outputs) -> HcclWork:
        """Occupy the simulated collective stream, keep the record, return the finished Work."""
        self._device.record_collective(label, start, end, outputs)
        rec = self._remember(CollectiveRecord(seq=seq, kind=kind, nbytes=nbytes, start_ns=start, end_ns=end,
                                              algorithm=algorithm))
        return HcclWork(outputs, rec, self._device)

    def _remember(self, rec: CollectiveRecord) -> CollectiveRecord:
        """Keep ``rec`` in :attr:`history` (up to its limit); returns it."""
        if len(self.history) < self._history_limit:
            self.history.append(rec)
        return rec

    # ---- identity ---------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "hccl"

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

    # ---- collectives ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None, op=None, timeout=None):  # noqa: ARG002 - timeout: as the group's
        """In place on each tensor of ``tensors``: reduce across ranks (SUM/AVG/MIN/MAX/PRODUCT).

        Also takes pybind's convenience forms ``allreduce(tensor_or_list, op)``: DDP's join
        hook calls ``process_group.allreduce(tensor)`` directly.
        """
        tensors, opts = _allreduce_args(tensors, opts if op is None else op)
        op = reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        dcode = check_reduction(op, t, "allreduce tensor")
        flat = _flat(t)
        nbytes = t.numel() * t.element_size()

        def body(ready, what):
            ready_all = self._coll.allreduce(flat, op, self._meta("allreduce", dcode, flat.numel(), op, 0, ready), what)
            _writeback(t, flat)
            return ready_all

        return self._run("allreduce", nbytes, tensors, body, dtype_bytes=t.element_size())

    def allreduce_coalesced(self, tensors, opts=None):
        """Allreduce several tensors of one dtype fused into one buffer (one collective)."""
        op = reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not tensors:
            raise ValueError("hccl: allreduce_coalesced needs at least one tensor")
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise TypeError(f"hccl: allreduce_coalesced needs tensors of one dtype, got {sorted(map(str, dtypes))}")
        dcode = check_reduction(op, tensors[0], "allreduce tensor")
        with torch._C._DisableTorchDispatch():
            flat = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else _flat(tensors[0])

        def body(ready, what):
            ready_all = self._coll.allreduce(flat, op, self._meta("allreduce", dcode, flat.numel(), op, 0, ready), what)
            off = 0
            for t in tensors:
                n = t.numel()
                if flat.data_ptr() != t.data_ptr() or len(tensors) > 1:
                    t.copy_(flat[off : off + n].view(t.shape))
                off += n
            return ready_all

        return self._run("allreduce", flat.numel() * flat.element_size(), tensors, body, dtype_bytes=flat.element_size())

    def reduce(self, tensors, opts=None):
        """Reduce ``tensors[0]`` of every rank into root's ``tensors[0]``."""
        op = reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = self._root(opts)
        t = tensors[0]
        dcode = check_reduction(op, t, "reduce tensor")
        flat = _flat(t)

        def body(ready, what):
            ready_all = self._coll.reduce(flat, op, root, self._meta("reduce", dcode, flat.numel(), op, root, ready), what)
            if self._rank == root:
                _writeback(t, flat)
            return ready_all

        return self._run("reduce", t.numel() * t.element_size(), tensors, body, root=root, dtype_bytes=t.element_size())

    def broadcast(self, tensors, opts=None):
        """Every rank's ``tensors[i]`` becomes root's (``opts.rootRank``)."""
        root = self._root(opts)
        for t in tensors:
            check_dtype(t, "broadcast tensor")

        def body(ready, what):
            ready_all = None
            for i, t in enumerate(tensors):
                flat = _flat(t)
                meta = self._meta("broadcast", check_dtype(t), flat.numel(), 0, root, ready, i)
                ready_all = self._coll.broadcast(flat, root, meta, what)
                if self._rank != root:
                    _writeback(t, flat)
            return ready_all

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        return self._run("broadcast", nbytes, tensors, body, root=root, dtype_bytes=tensors[0].element_size())

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[i][r]`` receives rank r's ``input_tensors[i]``."""
        if len(output_tensors) != len(input_tensors):
            raise ValueError("hccl: allgather needs one output list per input tensor")
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self._world_size:
                raise ValueError(
                    f"hccl: allgather output list has {len(outs)} tensors, expected world size {self._world_size}"
                )
            check_dtype(inp, "allgather input")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise ValueError(
                        f"hccl: allgather output tensor ({o.numel()} x {o.dtype}) does not match the input"
                        f" ({inp.numel()} x {inp.dtype})"
                    )

        def body(ready, what):
            ready_all = None
            for i, (outs, inp) in enumerate(zip(output_tensors, input_tensors)):
                flats = [_flat(o) for o in outs]
                meta = self._meta("allgather", check_dtype(inp), inp.numel(), 0, 0, ready, i)
                ready_all = self._coll.allgather(flats, _flat(inp), meta, what)
                for o, f in zip(outs, flats):
                    _writeback(o, f)
            return ready_all

        nbytes = sum(t.numel() * t.element_size() for t in input_tensors)
        return self._run("allgather", nbytes, [o for outs in output_tensors for o in outs], body)

    def _allgather_base(self, output, input, opts=None):
        """``all_gather_into_tensor``: ``output`` (world_size x input) gets every rank's input."""
        check_dtype(input, "allgather input")
        if output.numel() != input.numel() * self._world_size or output.dtype != input.dtype:
            raise ValueError(
                f"hccl: all_gather_into_tensor output has {output.numel()} elements of {output.dtype},"
                f" expected {input.numel() * self._world_size} of {input.dtype}"
            )
        out_flat = _flat(output)
        m = input.numel()
        views = [out_flat[r * m : (r + 1) * m] for r in range(self._world_size)]

        def body(ready, what):
            meta = self._meta("allgather", check_dtype(input), m, 0, 0, ready)
            ready_all = self._coll.allgather(views, _flat(input), meta, what)
            _writeback(output, out_flat)
            return ready_all

        return self._run("allgather", m * input.element_size(), [output], body)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self._allgather_base(o, i, opts)
        return work

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[i]`` = op over ranks of their ``input_tensors[i][this rank]``."""
        op = reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if len(output_tensors) != len(input_tensors):
            raise ValueError("hccl: reduce_scatter needs one input list per output tensor")
        for out, ins in zip(output_tensors, input_tensors):
            check_reduction(op, out, "reduce_scatter output")
            if len(ins) != self._world_size:
                raise ValueError(
                    f"hccl: reduce_scatter input list has {len(ins)} tensors, expected world size {self._world_size}"
                )
            for t in ins:
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError(
                        f"hccl: reduce_scatter input tensor ({t.numel()} x {t.dtype}) does not match the output"
                        f" ({out.numel()} x {out.dtype})"
                    )

        def body(ready, what):
            ready_all = None
            for i, (out, ins) in enumerate(zip(output_tensors, input_tensors)):
                flat = _flat(out)
                meta = self._meta("reduce_scatter", check_dtype(out), out.numel(), op, 0, ready, i)
                ready_all = self._coll.reduce_scatter(flat, [_flat(t) for t in ins], op, meta, what)
                _writeback(out, flat)
            return ready_all

        nbytes = sum(o.numel() * o.element_size() * self._world_size for o in output_tensors)
        return self._run("reduce_scatter", nbytes, output_tensors, body)

    def _reduce_scatter_base(self, output, input, opts=None):
        """``reduce_scatter_tensor``: ``input`` holds world_size chunks of ``output``'s size."""
        op = reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        dcode = check_reduction(op, output, "reduce_scatter output")
        m = output.numel()
        if input.numel() != m * self._world_size or input.dtype != output.dtype:
            raise ValueError(
                f"hccl: reduce_scatter_tensor input has {input.numel()} elements of {input.dtype},"
                f" expected {m * self._world_size} of {output.dtype}"
            )
        in_flat = _flat(input)
        chunks = [in_flat[r * m : (r + 1) * m] for r in range(self._world_size)]
        flat = _flat(output)

        def body(ready, what):
            ready_all = self._coll.reduce_scatter(flat, chunks, op, self._meta("reduce_scatter", dcode, m, op, 0, ready), what)
            _writeback(output, flat)
            return ready_all

        return self._run("reduce_scatter", input.numel() * input.element_size(), [output], body)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self._reduce_scatter_base(o, i, opts)
        return work

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[q]`` receives rank q's ``input_tensors[this rank]``."""
        n = self._world_size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"hccl: alltoall needs {n} input and {n} output tensors")
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise TypeError(f"hccl: alltoall tensors must share one dtype, got {sorted(map(str, dtypes))}")
        dcode = check_dtype(output_tensors[0], "alltoall tensor")
        outs = [_flat(t) for t in output_tensors]
        ins = [_flat(t) for t in input_tensors]

        def body(ready, what):
            meta = self._meta("alltoall", dcode, 0, 0, 0, ready)
            ready_all = self._coll.alltoall(outs, ins, meta, what)
            splits[:] = getattr(self._coll, "alltoall_splits", None) or []  # (n x n) elements, for timing
            for t, f in zip(output_tensors, outs):
                _writeback(t, f)
            return ready_all

        nbytes = sum(t.numel() * t.element_size() for t in input_tensors)
        splits: list[list[int]] = []
        return self._run("alltoall", nbytes, list(output_tensors), body, splits=splits, dtype_bytes=outs[0].element_size())

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """``all_to_all_single``: split ``input`` along dim 0 by ``input_split_sizes`` (or evenly)."""
        n = self._world_size
        dcode = check_dtype(input, "all_to_all_single input")
        if output.dtype != input.dtype:
            raise TypeError("hccl: all_to_all_single input and output dtypes differ")
        in_rows = input.shape[0] if input.dim() else 0
        out_rows = output.shape[0] if output.dim() else 0
        in_splits = list(input_split_sizes) or _even_splits(in_rows, n, "input")
        out_splits = list(output_split_sizes) or _even_splits(out_rows, n, "output")
        for name, splits, rows in (("input", in_splits, in_rows), ("output", out_splits, out_rows)):
            if len(splits) != n:
                raise ValueError(f"hccl: all_to_all_single {name} split sizes {splits} need {n} entries")
            if sum(splits) != rows or any(s < 0 for s in splits):
                raise ValueError(
                    f"hccl: all_to_all_single {name} split sizes {splits} do not add up to dim 0 = {rows}"
                )
        row_in = input[0].numel() if in_rows else 0
        row_out = output[0].numel() if out_rows else 0
        in_flat, out_flat = _flat(input), _flat(output)
        ins, outs, o1, o2 = [], [], 0, 0
        for q in range(n):
            ins.append(in_flat[o1 : o1 + in_splits[q] * row_in])
            outs.append(out_flat[o2 : o2 + out_splits[q] * row_out])
            o1 += in_splits[q] * row_in
            o2 += out_splits[q] * row_out

        def body(ready, what):
            ready_all = self._coll.alltoall(outs, ins, self._meta("alltoall", dcode, 0, 0, 0, ready), what)
            splits[:] = getattr(self._coll, "alltoall_splits", None) or []  # (n x n) elements, for timing
            _writeback(output, out_flat)
            return ready_all

        splits: list[list[int]] = []
        return self._run("alltoall", input.numel() * input.element_size(), [output], body, splits=splits,
                         dtype_bytes=input.element_size())

    all_to_all_single = alltoall_base

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_into_tensor`` of several tensors fused into one buffer (one collective)."""
        return self._fused("allgather", outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_tensor`` of several tensors fused into one buffer (one collective)."""
        return self._fused("reduce_scatter", outputs, inputs, opts)

    def _fused(self, kind: str, outputs, inputs, opts):
        if len(outputs) != len(inputs) or not outputs:
            raise ValueError(f"hccl: coalesced {kind} needs matching, non-empty output and input lists")
        dtypes = {t.dtype for t in list(outputs) + list(inputs)}
        if len(dtypes) != 1:
            works = [
                (self._allgather_base if kind == "allgather" else self._reduce_scatter_base)(o, i, opts)
                for o, i in zip(outputs, inputs)
            ]
            return works[-1]
        n = self._world_size
        with bridge_disabled():
            if kind == "allgather":
                fused_in = torch.cat([i.reshape(-1) for i in inputs])
                fused_out = torch.empty(n * fused_in.numel(), dtype=fused_in.dtype)
            else:  # rank-major chunks of every input, concatenated per rank
                per = [o.numel() for o in outputs]
                fused_in = torch.cat(
                    [i.reshape(n, -1)[r] for r in range(n) for i, m in zip(inputs, per)]
                ) if sum(per) else torch.empty(0, dtype=outputs[0].dtype)
                fused_out = torch.empty(sum(per), dtype=outputs[0].dtype)
        if kind == "allgather":
            work = self._allgather_base(fused_out, fused_in, opts)
            with bridge_disabled():
                total = fused_in.numel()
                rows = fused_out.view(n, total) if total else fused_out.view(n, 0)
                off = 0
                for o, i in zip(outputs, inputs):
                    m = i.numel()
                    o.view(n, m).copy_(rows[:, off : off + m])
                    off += m
        else:
            work = self._reduce_scatter_base(fused_out, fused_in, opts)
            with bridge_disabled():
                off = 0
                for o in outputs:
                    o.view(-1).copy_(fused_out[off : off + o.numel()])
                    off += o.numel()
        work._outputs[:] = list(outputs)
        return work

    # ---- point to point -----------------------------------------------------------------
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

    def _p2p_prologue(self, tensors, peer: int, kind: str):
        """Checks shared by send and recv; returns (tensor, dtype code, local peer, flat view, ready ns)."""
        if self._error is not None:
            self._check_usable()
        t = tensors[0]
        dcode = check_dtype(t, f"{kind} tensor")
        local_peer = self._local_peer(peer, kind)
        return t, dcode, local_peer, _flat(t), self._device.collective_ready_ns()

    def send(self, tensors, dst, tag=0):
        """Send ``tensors[0]`` to rank ``dst``; returns at once (see NOTE [p2p outboxes])."""
        t, dcode, peer, flat, ready = self._p2p_prologue(tensors, dst, "send")
        what = f"send to rank {dst}"
        op = p2p.SendOp(self._coll.arena, peer, flat, tag, dcode, ready, what)
        self._guarded(what, op.progress)
        if not op.done:
            self._sends.append(op)
        nbytes = t.numel() * t.element_size()
        start, end, _ = p2p_times(nbytes, src=self._rank, dst=dst, src_ready_ns=ready, dst_ready_ns=0, world_size=self._world_size, placement=self._placement)
        work = self._record(what, "send", -1, nbytes, start, end, "p2p", tensors)
        work._pending = op
        work._drain = self._wait_send
        return work

    def recv(self, tensors, src, tag=0):
        """Receive into ``tensors[0]`` from rank ``src`` (blocks; queued sends progress meanwhile)."""
        t, dcode, peer, flat, ready = self._p2p_prologue(tensors, src, "recv")
        what = f"recv from rank {src}"

        def body():
            sent_ns = p2p.recv(self._coll.arena, peer, flat, tag, dcode, what, self._progress_sends)
            _writeback(t, flat)
            return sent_ns

        sent_ns = self._guarded(what, body)
        nbytes = t.numel() * t.element_size()
        _, end, _ = p2p_times(nbytes, src=src, dst=self._rank, src_ready_ns=sent_ns, dst_ready_ns=ready, world_size=self._world_size, placement=self._placement)
        return self._record(what, "recv", -1, nbytes, max(ready, sent_ns), end, "p2p", tensors)

    def _progress_sends(self) -> None:
        if self._sends:
            self._sends = [op for op in self._sends if not op.progress()]

    def _wait_send(self, op) -> None:
        if not op.done:
            self._guarded(op.what, lambda: op.wait(self._progress_sends))
            self._progress_sends()

    def _drain_sends(self) -> None:
        """Finish queued sends before a collective (keeps per-peer order simple)."""
        while self._sends:
            self._wait_send(self._sends[0])

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("hccl: recv from any source is not supported (HCCL has none either)")

    def gather(self, output_tensors, input_tensors, opts=None):
        """``dist.gather``: root's ``output_tensors[0][r]`` receives rank r's ``input_tensors[0]``.

        Moved (and timed) as an allgather whose non-root outputs are dropped: HCCL has no
        gather of its own, and the allgather's time bounds it from above.
        """
        root = self._root(opts)
        if len(input_tensors) != 1:
            raise ValueError("hccl: gather takes exactly one input tensor")
        inp = input_tensors[0]
        check_dtype(inp, "gather input")
        if self._rank == root:
            if len(output_tensors) != 1:
                raise ValueError("hccl: gather on the root needs one output list")
            outs = output_tensors[0]
        else:
            if output_tensors and any(output_tensors):
                raise ValueError(f"hccl: gather outputs are given on rank {self._rank}, which is not the root {root}")
            with bridge_disabled():
                outs = [torch.empty_like(inp) for _ in range(self._world_size)]
        return self.allgather([outs], [inp])

    def scatter(self, output_tensors, input_tensors, opts=None):
        """``dist.scatter``: rank r's ``output_tensors[0]`` receives root's ``input_tensors[0][r]``.

        Moved (and timed) as one broadcast of root's whole list, each rank keeping its chunk:
        HCCL has no scatter of its own.
        """
        root = self._root(opts)
        if len(output_tensors) != 1:
            raise ValueError("hccl: scatter takes exactly one output tensor")
        out = output_tensors[0]
        check_dtype(out, "scatter output")
        n, m = self._world_size, out.numel()
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != n:
                raise ValueError(f"hccl: scatter on the root needs one list of {n} tensors")
            for t in input_tensors[0]:
                if t.numel() != m or t.dtype != out.dtype:
                    raise ValueError(f"hccl: scatter input ({t.numel()} x {t.dtype}) does not match the output"
                                     f" ({m} x {out.dtype})")
            with bridge_disabled():
                buf = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        else:
            with bridge_disabled():
                buf = torch.empty(n * m, dtype=out.dtype)
        work = self.broadcast([buf], _broadcast_opts(root))
        with bridge_disabled(), torch.no_grad():
            out.copy_(buf[self._rank * m:(self._rank + 1) * m].view(out.shape))
        work._outputs[:] = [out]
        return work

    def barrier(self, opts=None):
        """Wait for every rank (simulated: a small synchronisation on the collective stream)."""

        def body(ready, what):
            return self._coll.barrier(self._meta("barrier", 0, 0, 0, 0, ready), what)

        work = self._run("barrier", 0, [], body)
        self._device.synchronize()
        return work

    # ---- lifecycle --------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release the shared-memory mappings and sockets (idempotent)."""
        coll = getattr(self, "_coll", None)
        if coll is not None:
            coll.close()
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


def _allreduce_args(tensors, opts):
    """``(tensor list, AllreduceOptions or None)`` from any of ProcessGroup.allreduce's overloads:
    a tensor or a list, with options or a bare ``ReduceOp``."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if opts is not None and not isinstance(opts, dist.AllreduceOptions):
        op, opts = opts, dist.AllreduceOptions()
        opts.reduceOp = op
    return tensors, opts


def _broadcast_opts(root: int) -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return opts


def _even_splits(rows: int, n: int, name: str) -> list[int]:
    if rows % n:
        raise ValueError(f"hccl: all_to_all_single {name} dim 0 = {rows} is not divisible by world size {n}")
    return [rows // n] * n
