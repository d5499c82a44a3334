"""Collective schedules: per-rank ordered steps, and the vectorized blocks they come from.

An algorithm (see :mod:`hccl.sim.algorithms`) describes a collective as a sequence of
*phases*. In a phase every participating rank sends some messages and receives some;
a rank starts a phase's sends when it has finished the previous phase of the same
slice (all its receives in, reduced). A phase is made of :class:`Block` s: ``K``
templates over ``M`` sender columns, vectorized with numpy so the planner can time
thousands of ranks at once. :func:`build_schedule` cuts the same blocks into one rank's
ordered :class:`Send` / :class:`Recv` / :class:`Copy` steps for the live transport.

NOTE [work buffer]
    Every step addresses one flat per-rank *work buffer* of elements (see
    :func:`layout`): offsets and counts are in elements, not bytes.

NOTE [phase semantics]
    Within one phase, a rank's Sends read the buffer as it was at the start of the
    phase (snapshot), then Copies run, then Recvs write (overwrite, or reduce with the
    collective's op when ``reduce`` is set). Messages between one pair of ranks are
    delivered in step order (FIFO per pair).

NOTE [slices]
    A buffer larger than the slice size (``PT_HCCL_SLICE_SIZE_MB``, default 16 MB) is
    cut into slices; each slice runs the whole algorithm and slices are software
    pipelined (phase ``p`` of slice ``s`` is issued in wave ``s + p``, newest slice
    first), so scale-up and scale-out ports work on different slices at once.

    What the 16 MB default stands for: the pipelining the collective library itself does
    inside one collective, not Intel's PyTorch bridge. The bridge slices a collective into
    separate HCCL calls on first-generation Gaudi only: 128 MB for allreduce,
    reduce_scatter and broadcast, 16 MB for reduce and allgather, or
    ``PT_HCCL_SLICE_SIZE_MB`` when the user sets it or lazy collectives are on; on Gaudi 2
    and later it does not slice at all (HabanaAI/gaudi-pytorch-bridge, v1.19,
    ``habana_helpers::getHCCLSliceSize``). That bridge-level slicing is not modelled
    separately: setting ``PT_HCCL_SLICE_SIZE_MB`` here changes the pipelining slice. HCL's own
    multi-box algorithm (``pairwise``) slices by ``HCL_SLICE_SIZE`` per rank instead (NOTE
    [HCL's pairwise box iterations] in :mod:`hccl.sim.algorithms.pairwise`).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

__all__ = [
    "COLLECTIVES",
    "REDUCE_OPS",
    "Send",
    "Recv",
    "Copy",
    "Step",
    "Block",
    "Layout",
    "Schedule",
    "layout",
    "slice_elements",
    "SLICE_MB_RANGE",
    "check_slice_mb",
    "validate_call",
    "build_schedule",
]

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all2all",
               "send_recv", "barrier")
"""Collective names (hccl_demo's test names plus ``barrier``)."""
REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
"""Reduction ops; ``avg`` is ``sum`` followed by a division by the world size."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send elements ``[offset, offset + count)`` of the work buffer to ``peer`` on ``ports``."""

    peer: int
    offset: int
    count: int
    ports: tuple[int, ...]
    phase: int


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``count`` elements from ``peer`` into ``[offset, offset + count)``.

    ``reduce``: combine with the buffer using the collective's op instead of overwriting.
    """

    peer: int
    offset: int
    count: int
    ports: tuple[int, ...]
    reduce: bool
    phase: int


@dataclass(frozen=True, slots=True)
class Copy:
    """Local copy of ``count`` elements from ``src_offset`` to ``dst_offset``."""

    src_offset: int
    dst_offset: int
    count: int
    phase: int


Step = Send | Recv | Copy


class Block:
    """``K`` message templates over ``M`` senders, one part of a phase.

    Attributes:
        src: (M,) int64 sender ranks; each rank appears at most once.
        dst: (K, M) int64 receiver of template k from column m, -1 for none; in one row a
            receiver appears at most once.
        count: (K, M) int64 elements per message.
        send_off, recv_off: (K, M) int64 offsets in the sender's / receiver's work buffer.
        reduce: receivers reduce instead of overwrite.
        copies: None or (ranks, src_off, dst_off, count) int64 arrays of local copies.
        dense: True when ``src`` is ``arange(world_size)`` (lets the planner skip sorting).
        qp_set: the scale-out queue-pair set its messages use (the fabric hashes it with the
            ports, :mod:`hccl.sim.fabric`).
        shift: for a one-row block whose every card sends to the same card of box ``b + shift``
            (a pairwise box iteration), that shift (lets the fabric time it without the rows
            of every rank); None otherwise.
        in_flight: for a ``shift`` block, how many box iterations of its kind are on the wire
            together (HCL's scale-out buffers; the fabric shares its links among all of them,
            :func:`hccl.sim.fabric.shift_slowdown`); 1 otherwise.
        after: what a rank waits for before it sends this block's messages (NOTE [block
            dependencies] in :mod:`hccl.sim.planner`). None: every receive of the slice's
            previous phase (the default rule). Otherwise pairs ``(tag, back)``: the receives
            of the block tagged ``tag`` in the phase ``back`` phases earlier in the same
            slice (``back`` from 1 to 16; absent phases or tags are skipped), never earlier
            than the start of the slice's last phase with a default block.
        tag: a name under which this block's receives are remembered for later blocks'
            ``after`` (None: not remembered).
    """

    __slots__ = ("src", "dst", "count", "send_off", "recv_off", "reduce", "copies", "dense", "qp_set", "shift",
                 "in_flight", "after", "tag")

    def __init__(self, src, dst, count, send_off, recv_off, *, reduce: bool, copies=None, dense=False, qp_set=0,
                 shift=None, in_flight: int = 1, after: tuple[tuple[str, int], ...] | None = None,
                 tag: str | None = None):
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        shape = self.dst.shape

        def full(a):
            a = np.asarray(a, dtype=np.int64)
            return a if a.shape == shape else np.broadcast_to(a, shape)

        self.count, self.send_off, self.recv_off = full(count), full(send_off), full(recv_off)
        self.reduce = reduce
        self.copies = copies
        self.dense = dense
        self.qp_set = qp_set
        self.shift = shift
        self.in_flight = in_flight
        self.after = after
        self.tag = tag


Phase = Callable[[], Sequence[Block]]
"""A phase is built lazily: calling it returns its blocks. A phase may also have a method
``fold(T)`` returning the blocks of ranks ``0 .. T-1`` alone when it repeats every ``T``
ranks (else None), which the planner's rank-symmetry fold uses instead of building every rank."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a rank's input goes in its work buffer and where its output is read from.

    All values in elements.
    """

    work: int
    input_offset: int
    input_count: int
    output_offset: int
    output_count: int


def _even_bounds(total: int, parts: int) -> np.ndarray:
    """Bounds of ``parts`` near-equal contiguous parts of ``total`` (first parts larger)."""
    base, extra = divmod(total, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


def validate_call(collective: str, nbytes: int, world_size: int, *, root: int = 0, dtype_bytes: int = 4,
                  splits: Sequence[Sequence[int]] | None = None) -> int:
    """Check a collective call; return the element count per rank (``nbytes // dtype_bytes``).

    Raises:
        ValueError: unknown collective, negative or misaligned size, bad world size,
            root out of range, or all2all splits that are not world_size x world_size, have
            a row adding up to more than the element count, or none adding up to it (ragged
            all2all: rank i's input is its row's sum; ``nbytes`` is the largest rank's).
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    if not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world size must be an integer >= 1, got {world_size!r}")
    if dtype_bytes < 1:
        raise ValueError(f"dtype_bytes must be >= 1, got {dtype_bytes}")
    if nbytes < 0 or nbytes % dtype_bytes:
        raise ValueError(f"nbytes={nbytes} must be >= 0 and a multiple of dtype_bytes={dtype_bytes}")
    if not 0 <= root < world_size:
        raise ValueError(f"root {root} out of range for world size {world_size}")
    count = nbytes // dtype_bytes
    if splits is not None:
        if collective != "all2all":
            raise ValueError(f"splits are only valid for all2all, not {collective}")
        rows = [list(r) for r in splits]
        if len(rows) != world_size or any(len(r) != world_size for r in rows):
            raise ValueError(f"all2all splits must be a {world_size} x {world_size} matrix of element counts")
        for i, r in enumerate(rows):
            if any(c < 0 for c in r):
                raise ValueError(f"all2all splits of rank {i} contain a negative count: {r}")
            if sum(r) > count:
                raise ValueError(f"all2all splits of rank {i} add up to {sum(r)} elements, "
                                 f"more than {count} (nbytes={nbytes} / dtype_bytes={dtype_bytes})")
        sums = [sum(r) for r in rows]
        if world_size and max(sums) != count:
            i = sums.index(max(sums))
            raise ValueError(f"all2all splits of rank {i} add up to {sums[i]} elements, "
                             f"expected {count} (nbytes={nbytes} / dtype_bytes={dtype_bytes} is the "
                             "largest rank's input)")
    return count


def split_matrix(count: int, world_size: int, splits=None) -> np.ndarray:
    """(n, n) elements rank i sends to rank j in all2all (even split when ``splits`` is None)."""
    if splits is not None:
        return np.asarray(splits, dtype=np.int64).reshape(world_size, world_size)
    b = np.diff(_even_bounds(count, world_size))
    return np.broadcast_to(b, (world_size, world_size)).copy()


def layout(collective: str, count: int, world_size: int, rank: int, *, root: int = 0,
           splits=None) -> Layout:
    """Work-buffer layout of ``rank`` for a collective of ``count`` elements per rank.

    hccl_demo's size convention: ``count`` is the element count of each rank's input
    buffer for every collective (all_gather output is ``world_size x count``;
    reduce_scatter output is rank's near-equal share of ``count``; all2all sends
    ``count / world_size`` to each peer unless ``splits`` say otherwise; send_recv sends
    ``count`` and receives ``count``).
    """
    n = world_size
    if collective in ("all_reduce", "reduce", "broadcast"):
        return Layout(work=count, input_offset=0, input_count=count, output_offset=0, output_count=count)
    if collective == "all_gather":
        return Layout(work=n * count, input_offset=rank * count, input_count=count, output_offset=0,
                      output_count=n * count)
    if collective == "reduce_scatter":
        b = _even_bounds(count, n)
        return Layout(work=count, input_offset=0, input_count=count, output_offset=int(b[rank]),
                      output_count=int(b[rank + 1] - b[rank]))
    if collective == "all2all":
        out = int(split_matrix(count, n, splits)[:, rank].sum())
        return Layout(work=count + out, input_offset=0, input_count=count, output_offset=count, output_count=out)
    if collective == "send_recv":
        return Layout(work=2 * count, input_offset=0, input_count=count, output_offset=count, output_count=count)
    if collective == "barrier":
        return Layout(work=0, input_offset=0, input_count=0, output_offset=0, output_count=0)
    raise ValueError(f"unknown collective {collective!r}")


SLICE_MB_RANGE = (1 / 256, 65536.0)
"""Accepted ``PT_HCCL_SLICE_SIZE_MB``, MiB: 4 KiB (a page; HCL's own slice is 512 KB) to 64 GiB.
Below it a large collective becomes millions of slices (a 1 MB allreduce with 1-byte slices
took 48 s to run)."""


def check_slice_mb(mb, name: str = "PT_HCCL_SLICE_SIZE_MB") -> float:
    """``mb`` as a float if it is a slice size in :data:`SLICE_MB_RANGE`; else ValueError naming ``name``."""
    lo, hi = SLICE_MB_RANGE
    if isinstance(mb, bool) or not isinstance(mb, numbers.Real) or not lo <= mb <= hi:  # NaN fails too
        raise ValueError(f"{name}={mb!r} must be a number of MiB in [{lo:g}, {hi:g}] (4 KiB to 64 GiB)")
    return float(mb)


def slice_elements(dtype_bytes: int, slice_bytes: int | None = None) -> int:
    """Elements per slice: ``PT_HCCL_SLICE_SIZE_MB`` (default 16, MiB) unless ``slice_bytes`` given."""
    if slice_bytes is None:
        raw = os.environ.get("PT_HCCL_SLICE_SIZE_MB", "16")
        try:
            mb = float(raw)
        except ValueError:
            raise ValueError(f"PT_HCCL_SLICE_SIZE_MB must be a number of MB, got {raw!r}") from None
        slice_bytes = int(check_slice_mb(mb) * (1 << 20))
    return max(1, slice_bytes // dtype_bytes)


def pipeline(per_slice: Sequence[Sequence[Phase]]) -> Iterator[tuple[int, Phase]]:
    """Issue order of (slice, phase) pairs: wave ``w`` holds phase ``p`` of slice ``w - p``."""
    if not per_slice:
        return
    longest = max(len(p) for p in per_slice)
    n = len(per_slice)
    for w in range(n + longest - 1):
        for p in range(max(0, w - n + 1), min(w, longest - 1) + 1):  # slices 0 <= w - p < n
            s = w - p
            if p < len(per_slice[s]):
                yield s, per_slice[s][p]


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's ordered steps for one collective call."""

    collective: str
    algorithm: str
    rank: int
    world_size: int
    count: int
    dtype_bytes: int
    layout: Layout
    steps: tuple[Step, ...]


def build_schedule(collective: str, nbytes: int, rank: int, topology, *, world_size: int | None = None,
                   algorithm: str | None = None, root: int = 0, dtype_bytes: int = 4,
                   splits=None, slice_bytes: int | None = None) -> Schedule:
    """The ordered steps of ``rank`` for one collective (pure; same steps the planner times).

    Args:
        collective: one of :data:`COLLECTIVES`.
        nbytes: bytes of each rank's input buffer (hccl_demo's "size", see :func:`layout`).
        rank: the rank whose steps to return.
        topology: a :class:`~hccl.sim.topology.Topology`.
        world_size: ranks in the group (default: the topology's).
        algorithm: registered algorithm name; default chosen by :func:`hccl.sim.algorithms.select`.
        root: root rank of broadcast / reduce.
        dtype_bytes: bytes per element.
        splits: all2all only, (n, n) element counts rank i sends to rank j.
        slice_bytes: slice size in bytes (default ``PT_HCCL_SLICE_SIZE_MB``).

    Raises:
        ValueError: bad arguments (see :func:`validate_call`) or an algorithm that cannot
            run this collective on this topology.
    """
    from hccl.sim import algorithms  # local import: algorithms import this module

    n = world_size if world_size is not None else topology.world_size
    topo = topology.with_world_size(n)
    count = validate_call(collective, nbytes, n, root=root, dtype_bytes=dtype_bytes, splits=splits)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for world size {n}")
    name, phases = algorithms.phases(collective, count, topo, algorithm=algorithm, root=root,
                                     dtype_bytes=dtype_bytes, splits=splits, slice_bytes=slice_bytes)
    steps: list[Step] = []
    for ph_index, (_, phase) in enumerate(phases):
        sends: list[Step] = []
        recvs: list[Step] = []
        cps: list[Step] = []
        for blk in phase():
            dst = blk.dst
            col = np.nonzero(blk.src == rank)[0]
            if col.size:
                m = int(col[0])
                for k in np.nonzero(dst[:, m] >= 0)[0]:
                    d = int(dst[k, m])
                    sends.append(Send(d, int(blk.send_off[k, m]), int(blk.count[k, m]),
                                      topo.ports(rank, d), ph_index))
            ks, ms = np.nonzero(dst == rank)
            for k, m in zip(ks.tolist(), ms.tolist()):
                s = int(blk.src[m])
                recvs.append(Recv(s, int(blk.recv_off[k, m]), int(blk.count[k, m]), topo.ports(s, rank),
                                  blk.reduce, ph_index))
            if blk.copies is not None:
                r, so, do, c = blk.copies
                for i in np.nonzero(r == rank)[0]:
                    cps.append(Copy(int(so[i]), int(do[i]), int(c[i]), ph_index))
        # receives are listed in (row, column) order, the order the planner queues them
        steps.extend(sends)
        steps.extend(cps)
        steps.extend(recvs)
    return Schedule(collective=collective, algorithm=name, rank=rank, world_size=n, count=count,
                    dtype_bytes=dtype_bytes, layout=layout(collective, count, n, rank, root=root, splits=splits),
                    steps=tuple(steps))
