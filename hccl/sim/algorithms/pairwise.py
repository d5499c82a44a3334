"""HCL's multi-box algorithm: pairwise box iterations, pipelined, slice by slice.

NOTE [HCL's pairwise box iterations]
    How HabanaAI/HCL (1.21, ``hcl/src/platform/gen2_arch_common/hcl_collective_routines.cpp``,
    ``hclCollectiveCall``) runs an all-reduce over ``B`` boxes of ``L`` cards: for every slice,
    a reduce-scatter then an all-gather, each as ``B`` box iterations; iteration ``k`` works on
    the part of the slice owned by box ``myBox + k`` (``nextBox``) and exchanges over the
    scale-out ports with the card of the same local index in box ``myBox + k`` (send) and
    ``myBox - k`` (receive). What is modelled, for rank ``(b, l)`` that owns chunk ``(b, l)``:

    - reduce-scatter, iteration ``k`` (0 .. B-1): a scale-up reduce-scatter inside the box of
      box ``b + k``'s part (card ``l`` ends with the box sum of chunk ``(b + k, l)``), then, for
      ``k >= 1``, a scale-out send of that chunk to ``(b + k, l)``, which reduces it into its
      own, while ``(b - k, l)``'s arrives here;
    - all-gather, iteration ``k``: the scale-out send of my reduced chunk to ``(b - k, l)``
      while chunk ``(b + k, l)`` arrives from ``(b + k, l)``; then a scale-up all-gather of
      that chunk inside the box;
    - the overlap HCL gets from running scale-up and scale-out on separate engines: the
      scale-up part of iteration ``k + 1`` runs in the same phase as the scale-out part of
      iteration ``k`` (reduce-scatter phase ``j`` = scale-up ``j`` + scale-out ``j - 1``;
      all-gather phase ``j`` = scale-up ``j`` + scale-out ``j + 1``), so a slice is
      ``2B + 1`` phases;
    - box iterations in flight at once. Each iteration is its own ``hclCollectiveCall``,
      queued on the scale-up and scale-out engines and ordered only by sync objects and
      credits (``calcRequiredCreditAmount``, ``hcl_collective_routines_utils.cpp``): a
      reduce-scatter's scale-out receives land in ``HCL_SCALEOUT_BUFFER_FACTOR`` = 8 buffers
      (:data:`SCALE_OUT_BUFFERS`; ``hcl_global_conf.cpp``, ``collective_states.cpp``) that are
      reduced into the card's chunk as they fill, so a card does not wait for iteration
      ``k``'s arrival before it sends iteration ``k + 1``. Modelled (NOTE [block
      dependencies] in :mod:`hccl.sim.planner`): a reduce-scatter's scale-out part waits for
      the in-box reduction that produced its chunk (phase ``j - 1``) and for the scale-out
      receive 8 iterations back (its buffer free again); its in-box parts stay within 8
      iterations of the scale-out receives (an ASSUMPTION standing for HCL's credits and its
      static intermediate buffers, whose exact bound is not modelled); an all-gather's in-box
      part waits for the scale-out arrival it spreads (phase ``j - 1``), its scale-out parts
      send the card's own reduced chunk, 8 arrivals in flight. Scale-out reductions run on
      their own engine (HCL's memcpy-with-reduction on the scale-out buffers) beside the
      in-box ones. The latency term is therefore about ``2 x (scale-out latency)`` per 8
      boxes per slice, where iterations that waited for each other paid it per box: a
      many-box all-reduce runs at its ports' pace (Intel's Network Configuration page: the
      multi-box peak of Allreduce is the box's scale-out bandwidth), and what slows it is the
      fabric, which the iterations in flight share as one window of flows (NOTE [box
      iterations in flight share the fabric] in :mod:`hccl.sim.fabric`);
    - slices of ``HCL_SLICE_SIZE`` (512 KB, ``hcl_global_conf.cpp``) per rank: a slice
      covers ``n x 512 KB`` of the buffer (``CommonState::calcMaxSliceCounts``: the count per
      rank is cut into ``optimalBufferCount`` pieces); slices are software pipelined as every
      algorithm's are (NOTE [slices] in :mod:`hccl.sim.schedule`);
    - the queue-pair set of slice ``s`` is ``s mod 4`` (``CommonState::calcSliceQpSet``:
      ``(collectiveCtr + sliceIter) mod maxScaleOutQpSetsNum``, 4 sets under 1,601 ranks on
      Gaudi2 and 2,049 on Gaudi3, else 1; ``hcl_dynamic_communicator.cpp``), which the fabric
      hashes onto uplinks (:mod:`hccl.sim.fabric`).

    Not modelled: HCL's credits and sync-object waits beyond the dependencies above, the
    reduction of the scale-out buffers in batches of 8 (each arrival is reduced as it lands),
    a bound on slices in flight, the collective counter's part in the queue-pair set (a step's
    buckets all start at set 0), the slice-size optimisation (``HCL_OPT_SLICE_SIZE``: near-equal slices; here the last
    slice is the short one), Gaudi-direct / host-NIC variants and the reduce and broadcast
    box logic (reduce and broadcast run the base compositions over these primitives).
"""

from __future__ import annotations

import numpy as np

from hccl.sim import fabric
from hccl.sim.algorithms._base import Ctx, WholeBoxes, even_table
from hccl.sim.schedule import Block, Phase

__all__ = ["Pairwise", "HCL_SLICE_BYTES", "SCALE_OUT_BUFFERS", "qp_sets"]

HCL_SLICE_BYTES = 512 * 1024
"""``HCL_SLICE_SIZE`` default, bytes per rank per slice (HabanaAI/HCL ``hcl/src/hcl_global_conf.cpp``)."""

SCALE_OUT_BUFFERS = 8
"""``HCL_SCALEOUT_BUFFER_FACTOR`` default (``hcl_global_conf.cpp``): scale-out receive buffers of
a reduce-scatter, so box iterations in flight at once (NOTE [HCL's pairwise box iterations])."""

_QP_SETS = 4
"""``HCL_GNIC_SCALE_OUT_QP_SETS`` default (``hcl_global_conf.cpp``)."""
_QP_SETS_THRESHOLD = {"gaudi3": 2049}
"""``HCL_GNIC_QP_SETS_COMM_SIZE_THRESHOLD``: 1,601 ranks (Gaudi2 and earlier), 2,049 on Gaudi3."""


def qp_sets(world_size: int, generation: str) -> int:
    """Scale-out queue-pair sets HCL opens per connection: 4 below the threshold, else 1."""
    return _QP_SETS if world_size < _QP_SETS_THRESHOLD.get(generation, 1601) else 1


class _BoxPhase:
    """One phase of pairwise iterations: scale-up parts for some target boxes, scale-out parts
    for some box shifts. Calling it builds the blocks for every rank; :meth:`fold` builds them
    for ranks ``0 .. T-1`` only, which the planner's rank-symmetry fold uses (NOTE [rank
    symmetry] in :mod:`hccl.sim.planner`): every part is invariant under a shift by one box."""

    __slots__ = ("n", "L", "table", "gather", "up_shift", "out_shift", "qp_set", "key", "up_after", "out_after",
                 "in_flight")

    def __init__(self, topo, n, L, table, *, gather: bool, up_shift: int | None, out_shift: int | None,
                 qp_set: int, up_after, out_after, gate: int, in_flight: int):
        self.n, self.L, self.table, self.gather = n, L, table, gather
        self.in_flight = in_flight
        self.up_shift, self.out_shift, self.qp_set = up_shift, out_shift, qp_set
        self.up_after, self.out_after = up_after, out_after
        self.key = (gate, _timing_key(topo, n // L, gather, up_shift, out_shift, qp_set, in_flight))
        """Phases with equal keys are timed alike on the folded ranks (NOTE [repeated phases]
        in :mod:`hccl.sim.planner`)."""

    def __call__(self) -> list[Block]:
        return self._blocks(self.n)

    def fold(self, T: int) -> list[Block] | None:
        """Blocks of ranks ``0 .. T-1`` standing for every rank (NOTE [uneven chunks, folded]);
        None when ``T`` is not a whole number of boxes dividing the ranks."""
        if self.n % T or T % self.L:
            return None
        return self._blocks(T, table=self.table.folded(T))

    def _blocks(self, cols: int, table=None) -> list[Block]:
        n, L = self.n, self.L
        B = n // L
        start, length = table if table is not None else (self.table.start, self.table.length)
        r = np.arange(cols)
        b, l = r // L, r % L
        dense = cols == n  # else: representative columns of an n-rank block
        out: list[Block] = []
        if self.up_shift is not None and L > 1:
            t = (b + self.up_shift) % B                         # the box whose part is worked on
            peer_l = (l[None, :] + np.arange(1, L)[:, None]) % L
            dst = b * L + peer_l
            chunk = t * L + (l if self.gather else peer_l)
            if chunk.shape != dst.shape:
                chunk = np.broadcast_to(chunk, dst.shape)
            off = start[chunk]
            out.append(Block(r, dst, length[chunk], off, off, reduce=not self.gather, dense=dense,
                             after=self.up_after, tag="up"))
        if self.out_shift is not None and B > 1:
            k = -self.out_shift if self.gather else self.out_shift
            dst = (((b + k) % B) * L + l)[None, :]
            chunk = r[None, :] if self.gather else dst
            off = start[chunk]
            out.append(Block(r, dst, length[chunk], off, off, reduce=not self.gather, dense=dense,
                             qp_set=self.qp_set, shift=k, in_flight=self.in_flight, after=self.out_after,
                             tag="out"))
        return out


def _timing_key(topo, B: int, gather: bool, up_shift, out_shift, qp_set: int, in_flight: int) -> tuple:
    """What the timing of a box-iteration phase depends on, on ranks folded by whole pods: the
    in-box part's target box modulo a pod, and the scale-out shift's contention sample (which
    keeps the shift modulo a pod) when every folded rank's peer is in another pod."""
    bpl = topo.boxes_per_leaf
    up = None if up_shift is None else up_shift % bpl
    if out_shift is None:
        return gather, up, None
    signed = -out_shift if gather else out_shift
    k = signed % B
    far = bpl <= k <= B - bpl
    return gather, up, ("far" if far else "near", fabric.sampled_shift(topo, signed, in_flight) if far else k, qp_set)


class _Table:
    """A chunk table (start, length per rank), and its folded form per period.

    NOTE [uneven chunks, folded]
        A buffer that does not divide evenly leaves some chunks one element longer than
        others, so no period of ranks repeats exactly. The folded table times every chunk of
        a period at the longest length its column has in any period (offsets are those of
        ranks ``0 .. T-1``): at most one element per message longer than rank by rank, and the
        same integers when the buffer divides evenly.
    """

    __slots__ = ("start", "length", "_folded")

    def __init__(self, table):
        self.start, self.length = (np.asarray(x, dtype=np.int64) for x in table)
        self._folded: dict[int, tuple] = {}

    def folded(self, T: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) with the lengths of every rank ``r`` replaced by the largest of
        ranks ``r mod T`` (indexable by every rank, as the blocks need)."""
        hit = self._folded.get(T)
        if hit is None:
            top = self.length.reshape(-1, T).max(axis=0)
            hit = self._folded[T] = (self.start, np.tile(top, self.length.size // T))
        return hit


class Pairwise(WholeBoxes):
    """HCL's all-reduce, reduce-scatter and all-gather across boxes (NOTE [HCL's pairwise box
    iterations]); whole boxes only (or one box, where it is the direct algorithm)."""

    name = "pairwise"

    def buffer_slice(self, ctx: Ctx, dtype_bytes: int, slice_bytes: int | None) -> int:
        """Elements of the buffer per slice: ``HCL_SLICE_SIZE`` per rank (``slice_bytes`` is the
        bridge's ``PT_HCCL_SLICE_SIZE_MB`` and does not apply to HCL's own slicing)."""
        return ctx.n * max(1, HCL_SLICE_BYTES // dtype_bytes)

    def reduce_scatter(self, ctx: Ctx, table) -> list[Phase]:
        L, B = self._dims(ctx)
        qp = ctx.slice_index % qp_sets(ctx.n, ctx.topo.generation)
        table = _Table(table)
        W = SCALE_OUT_BUFFERS
        # phase j: the in-box part of iteration j waits for its links and stays within W
        # iterations of the scale-out engine; the scale-out part of iteration j - 1 waits for the
        # in-box reduction of phase j - 1 and a free receive buffer
        return [_BoxPhase(ctx.topo, ctx.n, L, table, gather=False, up_shift=j if j < B else None,
                          out_shift=j - 1 if j >= 2 else None, qp_set=qp,
                          up_after=None if j == 0 else (("out", W),), out_after=(("up", 1), ("out", W)),
                          gate=0 if j == 0 else 1 if j < W + 2 else 2, in_flight=W)
                for j in range(B + 1 if B > 1 else 1)]

    def all_gather(self, ctx: Ctx, table) -> list[Phase]:
        L, B = self._dims(ctx)
        qp = ctx.slice_index % qp_sets(ctx.n, ctx.topo.generation)
        table = _Table(table)
        W = SCALE_OUT_BUFFERS
        # phase j: the in-box part spreads the chunk that arrived in phase j - 1; the scale-out
        # part of iteration j + 1 sends this card's reduced chunk, which is ready since phase 0
        return [_BoxPhase(ctx.topo, ctx.n, L, table, gather=True, up_shift=j, out_shift=j + 1 if j + 1 < B else None,
                          qp_set=qp, up_after=None if j == 0 else (("out", 1),),
                          out_after=None if j == 0 else (("out", W),), gate=0 if j == 0 else 2, in_flight=W)
                for j in range(B)]

    def all_reduce(self, ctx: Ctx, s0: int, s1: int) -> list[Phase]:
        table = even_table(s0, s1, ctx.n)
        return self.reduce_scatter(ctx, table) + self.all_gather(ctx, table)
