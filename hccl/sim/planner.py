"""Planner: simulate collectives on N ranks in one process, in simulated nanoseconds.

Runs the same phases (see :mod:`hccl.sim.schedule`) the live transport executes, over the
RoCE port model (:mod:`hccl.sim.link_model`), vectorized over ranks with numpy; no data is
moved. :func:`execute` is the planner-with-data mode: it applies the same steps to real
numpy buffers so schedules can be checked against numpy references.

NOTE [timing rules]
    - A rank starts the sends of a phase when it has finished the previous phase of the
      same slice (its receives of that phase arrived and were reduced); slice 0 phase 0
      starts at ``ready_ns[rank]``. A block may name narrower dependencies instead (NOTE
      [block dependencies]: HCL's pipelined box iterations).
    - Each message: ``tx_start = max(phase start, egress port free)``; ``arrival =
      max(tx_start + latency, ingress port free) + serialization`` (scale-up links are
      point-to-point, so their egress and ingress are the same resource).
    - A reducing receive then occupies the rank's reduction engine for
      ``bytes / reduce_bytes_per_ns`` (the receives of blocks tagged ``"out"``, a second one).
    - Local copies cost 0 ns. A rank's collective ends when its last send has left and
      its last receive is done.
    - A scale-out message's serialization is stretched by its slowest flow's share of the
      fabric's links (NOTE [max-min sharing, per row] in :mod:`hccl.sim.fabric`).
    - All times are integers; ties are broken by issue order, so results are
      deterministic.

Length: about 720 lines, over the project's 400, on purpose. The event engine (``_Engine``),
the rank-symmetry fold and the skip over repeated phases that make 65,536 ranks cheap, and the
public entry points share the timing rules above; split across files, the rules and the code
that applies them would drift.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hccl.sim import algorithms, fabric
from hccl.sim.link_model import LinkParams
from hccl.sim.schedule import Block, layout, validate_call
from hccl.sim.topology import Topology

__all__ = ["SimResult", "simulate", "simulate_sequence", "execute"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one simulated collective (simulated time, not measured).

    Attributes:
        collective: collective name.
        algorithm: algorithm that ran.
        nbytes: per-rank size in bytes (hccl_demo convention, see :func:`simulate`).
        world_size: ranks.
        start_ns: per rank, when its collective stream was ready (absolute, simulated ns).
        end_ns: per rank, when its collective finished (absolute, simulated ns).
        phases: number of phases issued (all slices).
        messages: messages sent by all ranks.
        scale_up_bytes: payload bytes sent over scale-up links by all ranks.
        scale_out_bytes: payload bytes sent over scale-out ports by all ranks.
    """

    collective: str
    algorithm: str
    nbytes: int
    world_size: int
    start_ns: tuple[int, ...]
    end_ns: tuple[int, ...]
    phases: int
    messages: int
    scale_up_bytes: int
    scale_out_bytes: int

    @property
    def duration_ns(self) -> int:
        """From the earliest start to the latest end, simulated ns."""
        return max(self.end_ns) - min(self.start_ns)


def _cumsum0(x):
    """Cumulative sum along axis 0 (row loop: much faster than numpy's axis-0 cumsum here)."""
    c = np.array(x, dtype=np.int64, copy=True)
    for k in range(1, c.shape[0]):
        np.add(c[k - 1], c[k], out=c[k])
    return c


def _chain(a, s, init):
    """Serial recurrence along axis 0: out_k = max(a_k, out_{k-1}) + s_k, out_{-1} = init."""
    c = _cumsum0(s)
    g = a - c
    g += s
    np.maximum(g[0], init, out=g[0])
    for k in range(1, g.shape[0]):
        np.maximum(g[k - 1], g[k], out=g[k])
    g += c
    return g


def _seg_chain(a, s, init, seg):
    """Like :func:`_chain` on a 1-D array split into consecutive segments ``seg`` (sorted ids)."""
    if a.size == 0:
        return a
    c = np.cumsum(s)
    starts = np.r_[True, seg[1:] != seg[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(a.size), 0))
    c = c - (c[first] - s[first])  # segmented inclusive cumsum
    g = np.maximum(a - c + s, init)
    rank = np.cumsum(starts) - 1
    span = int(g.max() - g.min()) + 1
    if rank[-1] * span < (1 << 62):
        h = np.maximum.accumulate(g - g.min() + rank * span) - rank * span + g.min()
    else:  # pragma: no cover - astronomically long simulated times
        h = g.copy()
        for i in range(1, a.size):
            if not starts[i]:
                h[i] = max(h[i], h[i - 1])
    return c + h


class _NoSymmetry(Exception):
    """A phase is not invariant under the engine's rank translation: simulate every rank."""


def _fold_unit(topo: Topology, n: int) -> int:
    """The rank translation the fold tries on ``n`` ranks (n: none): a leaf's worth of cards, or
    a box's when all boxes share one leaf. It is a symmetry when it also divides ``n``."""
    L, bpl = topo.cards_per_box, topo.boxes_per_leaf
    if n % L or topo.faults:  # a faulty link is on one card: no two periods look the same
        return n
    return L if n // L <= bpl else L * bpl


def _fold_period(topo: Topology, n: int, ready: np.ndarray) -> int:
    """Smallest rank translation T under which topology and ready times look the same (n: none).

    Translating every rank by ``T`` (mod n) keeps the local index, same-box and same-leaf
    relations when ``T`` is a whole number of leaves' worth of cards (or of boxes when all
    boxes share one leaf) and divides ``n`` (:func:`_fold_unit`). See NOTE [rank symmetry].
    """
    T = _fold_unit(topo, n)
    if T >= n or n % T:
        return n
    if not bool((ready.reshape(n // T, T) == ready[:T]).all()):
        return n
    return T


def _periodic(blk: Block, n: int, T: int) -> bool:
    """True if ``blk`` is a dense block invariant under translating every rank by ``T``."""
    if not blk.dense or blk.src.size != n:
        return False
    dst, cnt = blk.dst, blk.count
    if not bool((dst[:, :T] >= 0).all()):
        return False
    a = dst[:, :-T] + T
    a[a >= n] -= n
    if not np.array_equal(a, dst[:, T:]):
        return False
    if cnt.strides[1] == 0:
        return True
    if cnt.strides[0] == 0:  # one row broadcast to every template
        cnt = cnt[:1]
    return np.array_equal(cnt[:, :-T], cnt[:, T:])


class _Engine:
    """Port state + per-slice clocks of one simulated collective.

    NOTE [rank symmetry]
        With ``fold=T < n`` the engine keeps the state of ranks ``0 .. T-1`` only: every
        block must be dense and map rank ``r + T`` the way it maps ``r`` (shifted by ``T``,
        same counts), the topology must look the same from ``r`` and ``r + T`` (see
        :func:`_fold_period`) and ready times must repeat every ``T`` ranks. Then, by
        induction over phases, every port, clock and reduction engine of rank ``r`` has the
        same value as rank ``r mod T``'s, so the message rank ``d < T`` receives in row k
        comes from representative column ``m`` with ``dst[k, m] = d (mod T)``, with that
        column's timing. Results are the same integers as the full simulation (``fold=n``);
        a block that breaks the symmetry raises :class:`_NoSymmetry` and the caller
        re-runs unfolded. Two exceptions, both samples rather than exact: on an ECMP fabric
        every period repeats the contention of ranks ``0 .. T-1``'s own messages (computed in
        the whole fabric, :mod:`hccl.sim.fabric`), and a pairwise phase over a buffer that does
        not divide evenly times each chunk at its period's longest (NOTE [uneven chunks,
        folded] in :mod:`hccl.sim.algorithms.pairwise`). A topology with link faults is
        never folded.
    """

    def __init__(self, lp: LinkParams, n: int, ready: np.ndarray, dtype_bytes: int, fold: int | None = None):
        self.lp, self.n, self.db = lp, n, dtype_bytes
        T = n if fold is None else fold
        self.T = T
        self.mult = n // T
        L = lp.cpb
        self.L = L
        self.up_free = np.zeros((T, L), dtype=np.int64)
        self.eg_free = np.zeros(T, dtype=np.int64)
        self.in_free = np.zeros(T, dtype=np.int64)
        self.red_free = np.zeros(T, dtype=np.int64)
        self.red_side = np.zeros(T, dtype=np.int64)  # NOTE [block dependencies]: scale-out reductions
        self.ready = ready[:T].copy()
        self.clocks: dict[int, np.ndarray] = {}
        self.anchor: dict[int, np.ndarray] = {}  # NOTE [block dependencies]
        self.history: dict[int, list[dict[str, np.ndarray]]] = {}
        self.last = self.ready.copy()
        self.messages = 0
        self.up_bytes = 0
        self.out_bytes = 0
        fab = lp.topo.fabric
        self.contend = bool(lp.topo.faults) or fab is not None and ((fab.ecmp and fab.tiers == 2) or fab.nic_cards > 1)
        self.slow_up = [(a, b, f) for k, a, b, f in lp.topo.faults if k == "up"]
        self._rows: dict = {}  # contention of rows met in this call (NOTE [max-min sharing, per row])
        self._transfers: dict = {}

    def _contention(self, blk: Block, ser, out, src=None, dst=None):
        """``ser`` with every scale-out message slowed to its slowest flow's share of the links
        (:func:`hccl.sim.fabric.message_slowdown`, per row of the block); ``src``/``dst``: a
        sparse block's flattened messages, taken as one row."""
        if self.slow_up:  # degraded scale-up links (what-ifs): these pairs' messages f times slower
            if src is None:
                src, dst_ = np.broadcast_to(np.arange(ser.shape[-1]), ser.shape), blk.dst[:, :ser.shape[-1]]
            else:
                dst_ = dst
            for a, b, f in self.slow_up:
                hit = ~out & (((src == a) & (dst_ == b)) | ((src == b) & (dst_ == a)))
                ser = np.where(hit, np.ceil(ser * f).astype(np.int64), ser)
            if dst is None:
                src = None
        if not self.contend or not out.any():
            return ser
        topo, n = self.lp.topo, self.n
        if src is not None:
            num, den = fabric.message_slowdown(topo, src, dst, blk.qp_set)
            return np.where(out, -(-ser * num // den), ser)
        K, T = ser.shape
        num = np.ones((K, T), dtype=np.int64)
        den = np.ones((K, T), dtype=np.int64)
        for k in range(K):
            if not out[k].any():
                continue
            if blk.shift is not None:
                num[k], den[k] = fabric.shift_slowdown(topo, blk.shift, blk.qp_set, cols=T,
                                                              in_flight=blk.in_flight)
                continue
            row = blk.dst[k, :T]
            key = (row.tobytes(), blk.qp_set)
            hit = self._rows.get(key)
            if hit is None:
                if T < n:  # representative columns: the row repeats every T ranks
                    row = ((row[None, :] + T * np.arange(n // T)[:, None]) % n).ravel()
                hit = self._rows[key] = fabric.message_slowdown(topo, np.arange(n), row, blk.qp_set, first=T)
            num[k], den[k] = hit
        return np.where(out, -(-ser * num // den), ser)

    def phase(self, s: int, ph) -> None:
        """Run phase ``ph`` (a :data:`~hccl.sim.schedule.Phase`) of slice ``s``.

        NOTE [block dependencies]
            By default a rank starts a block's sends when every receive of the slice's previous
            phase is in (and reduced). A block with ``after`` set waits only for what it names:
            the receives of the blocks tagged ``tag`` ``back`` phases earlier in the slice, and
            never starts before the slice's *anchor*, the start of its last phase that had a
            default block (the slice's start, at first). HCL's pairwise box iterations use it
            (NOTE [HCL's pairwise box iterations] in :mod:`hccl.sim.algorithms.pairwise`): a
            scale-out send waits for the in-box reduction that produced its chunk and for a free
            receive buffer, not for the previous iteration's arrival. The engine remembers the
            tagged receives of the last :data:`_HISTORY` phases of each slice; a phase's clock
            is the latest of its blocks' starts and receives, as before.
        """
        t0 = self.clocks.get(s)
        if t0 is None:
            t0 = self.ready
        new = t0.copy()
        blocks = None
        if self.T < self.n and hasattr(ph, "fold"):  # the phase builds ranks 0 .. T-1 itself
            blocks = ph.fold(self.T)
            if blocks is None:
                raise _NoSymmetry
            trusted = True
        else:
            blocks, trusted = ph(), False
        hist = self.history.setdefault(s, [])
        rec: dict[str, np.ndarray] = {}
        default_ran = gated_ran = False
        for blk in blocks:
            if blk.dst.size == 0:
                continue
            if blk.after is None:
                start, default_ran = t0, True
            else:
                start, gated_ran = self.anchor.get(s, self.ready).copy(), True
                for tag, back in blk.after:
                    if not 0 < back <= _HISTORY:
                        raise ValueError(f"a block waits for the phase {back} back; the engine remembers 1 .. "
                                         f"{_HISTORY} (NOTE [block dependencies])")
                    got = hist[-back].get(tag) if back <= len(hist) else None
                    if got is not None:
                        np.maximum(start, got, out=start)
            out = new if blk.after is None and blk.tag is None else start.copy()
            side = blk.tag == "out"  # scale-out receives reduce on their own engine
            if side:
                self.red_free, self.red_side = self.red_side, self.red_free
            if self.T < self.n:
                if not trusted and not _periodic(blk, self.n, self.T):
                    raise _NoSymmetry
                self._dense(blk, start, out)
            elif blk.dense and bool((blk.dst >= 0).all()):
                self._dense(blk, start, out)
            else:
                self._sparse(blk, start, out)
            if side:
                self.red_free, self.red_side = self.red_side, self.red_free
            if out is not new:
                np.maximum(new, out, out=new)
                if blk.tag is not None:
                    prev = rec.get(blk.tag)
                    rec[blk.tag] = out if prev is None else np.maximum(prev, out)
        if default_ran or not gated_ran:  # the slice's anchor moves here
            self.anchor[s] = t0
        if rec or hist:
            hist.append(rec)
            del hist[:-_HISTORY]
        self.clocks[s] = new

    def _account(self, nbytes, out) -> None:
        m = self.mult
        self.messages += int(nbytes.size) * m
        ob = int(nbytes[out].sum())
        self.out_bytes += ob * m
        self.up_bytes += (int(nbytes.sum()) - ob) * m

    def _transfer(self, dst, nbytes):
        """:meth:`LinkParams.transfer` from every simulated column, memoized for small blocks
        (the in-box part of every box iteration is the same block)."""
        key = None
        if dst.size <= 4096:
            key = (dst.shape, dst.tobytes(), nbytes.tobytes())
            hit = self._transfers.get(key)
            if hit is not None:
                return hit
        res = self.lp.transfer(np.broadcast_to(np.arange(dst.shape[1]), dst.shape), dst, nbytes)
        if key is not None:
            if len(self._transfers) > 256:
                self._transfers.clear()
            for a in res:
                a.flags.writeable = False
            self._transfers[key] = res
        return res

    def _dense(self, blk: Block, t0, new) -> None:
        n, L = self.T, self.L  # n: columns simulated (representatives when folded)
        dst = blk.dst if n == self.n else blk.dst[:, :n]
        K = dst.shape[0]
        nbytes = (blk.count if n == self.n else blk.count[:, :n]) * self.db
        ser, lat, out = self._transfer(dst, nbytes)
        ser = self._contention(blk, ser, out)
        self._account(nbytes, out)
        if n < self.n:
            dst = dst % n  # receiver d (mod T) <- representative column
        if bool(out.all()):
            self._dense_out(blk, t0, new, dst, nbytes, ser, lat)
            return
        ldst = dst % L
        if not out.any() and (K == 1 or bool((np.diff(np.sort(ldst, axis=0), axis=0) != 0).all())):
            # scale-up only, one message per link: no message waits for another of this block
            cols = np.arange(n)[None, :]
            tx = np.maximum(t0[None, :], self.up_free[cols, ldst])
            sent = tx + ser
            self.up_free[cols, ldst] = sent
            np.maximum(self.last, sent.max(axis=0), out=self.last)
            self._receive(blk, new, dst, nbytes, tx, ser, lat, out)
            return
        # egress: chain messages sharing a port group (one column = one sender)
        excl = np.zeros_like(ser)
        base = np.empty_like(ser)
        classes = [("out", out)] if out.any() else []
        up = ~out
        if up.any():
            present = np.unique(ldst[up]) if K > 1 else np.unique(ldst)
            classes += [(int(j), up & (ldst == j)) for j in present]
        for key, mask in classes:
            m_ser = np.where(mask, ser, 0)
            if K > 1:
                excl += np.where(mask, _cumsum0(m_ser) - m_ser, 0)
            free = self.eg_free if key == "out" else self.up_free[:, key]
            base = np.where(mask, np.maximum(t0, free)[None, :], base)
        tx = base + excl
        sent = tx + ser
        for key, mask in classes:
            last = np.where(mask, sent, -1).max(axis=0)
            if key == "out":
                np.maximum(self.eg_free, last, out=self.eg_free)
            else:
                np.maximum(self.up_free[:, key], last, out=self.up_free[:, key])
        np.maximum(self.last, sent.max(axis=0), out=self.last)
        self._receive(blk, new, dst, nbytes, tx, ser, lat, out)

    def _receive(self, blk: Block, new, dst, nbytes, tx, ser, lat, out) -> None:
        """Arrivals of a dense block's messages sent at ``tx``: scale-out ingress, reduction."""
        n = self.T
        K = dst.shape[0]
        # regroup by receiver: rows are permutations, invert each
        inv = np.empty_like(dst)
        inv[np.arange(K)[:, None], dst] = np.arange(n)[None, :]
        rows = np.arange(K)[:, None]
        a = (tx + lat)[rows, inv]
        s_ = ser[rows, inv]
        o = out[rows, inv]
        if o.any():
            arr_out = _chain(np.where(o, a, np.iinfo(np.int64).min // 4), np.where(o, s_, 0), self.in_free)
            arr = np.where(o, arr_out, a + s_)
            np.maximum(self.in_free, np.where(o, arr, -1).max(axis=0), out=self.in_free)
        else:
            arr = a + s_
        if blk.reduce:
            red = self.lp.reduce_ns(nbytes[rows, inv])
            done = _chain(arr, red, self.red_free)
            self.red_free = done[-1].copy()
        else:
            done = arr
        dmax = done.max(axis=0)
        np.maximum(new, dmax, out=new)
        np.maximum(self.last, dmax, out=self.last)

    def _dense_out(self, blk: Block, t0, new, dst, nbytes, ser, lat) -> None:
        """Dense block whose messages all leave the box: one port group per sender and receiver."""
        n = self.T
        K = dst.shape[0]
        cs = _cumsum0(ser)
        tx = cs - ser
        tx += np.maximum(t0, self.eg_free)[None, :]
        self.eg_free = tx[-1] + ser[-1]
        np.maximum(self.last, self.eg_free, out=self.last)
        inv = np.empty_like(dst)
        inv[np.arange(K)[:, None], dst] = np.arange(n)[None, :]
        flat = (inv + (np.arange(K) * n)[:, None]).ravel()
        tx += lat
        a = tx.ravel()[flat].reshape(K, n)
        s_ = ser.ravel()[flat].reshape(K, n)
        arr = _chain(a, s_, self.in_free)
        self.in_free = arr[-1].copy()
        if blk.reduce:
            red = self.lp.reduce_ns(nbytes.ravel()[flat].reshape(K, n))
            # the reduction engine keeps up when each reduction is shorter than the next arrival gap
            if K == 1 or (bool((red[:-1] <= s_[1:]).all()) and bool((self.red_free <= arr[0]).all())):
                done = arr + red
            else:
                done = _chain(arr, red, self.red_free)
            self.red_free = done[-1].copy()
        else:
            done = arr
        dmax = done[-1] if not blk.reduce else done.max(axis=0)
        np.maximum(new, dmax, out=new)
        np.maximum(self.last, dmax, out=self.last)

    def _sparse(self, blk: Block, t0, new) -> None:
        n, L = self.n, self.L
        K, M = blk.dst.shape
        valid = (blk.dst >= 0).ravel()
        idx = np.nonzero(valid)[0]
        if idx.size == 0:
            return
        src = np.broadcast_to(blk.src[None, :], (K, M)).ravel()[idx]
        dst = blk.dst.ravel()[idx]
        nbytes = blk.count.ravel()[idx] * self.db
        ser, lat, out = self.lp.transfer(src, dst, nbytes)
        ser = self._contention(blk, ser, out, src, dst)
        self._account(nbytes, out)
        res = np.where(out, n * L + src, src * L + dst % L)
        free_all = np.concatenate([self.up_free.ravel(), self.eg_free])
        o = np.argsort(res, kind="stable")
        rs = res[o]
        tx_s = _seg_chain(np.maximum(t0[src[o]], free_all[rs]), ser[o], np.zeros(idx.size, dtype=np.int64), rs)
        tx_s -= ser[o]  # _seg_chain returns completion; start = completion - ser
        tx = np.empty_like(tx_s)
        tx[o] = tx_s
        sent = tx + ser
        np.maximum.at(free_all, res, sent)
        self.up_free = free_all[: n * L].reshape(n, L).copy()
        self.eg_free = free_all[n * L:].copy()
        np.maximum.at(self.last, src, sent)
        # ingress (scale-out only) and reduction, grouped by receiver in issue order
        od = np.argsort(dst, kind="stable")
        d_s = dst[od]
        a = (tx + lat)[od]
        s_ = ser[od]
        out_s = out[od]
        arr = a + s_
        if out_s.any():
            sel = np.nonzero(out_s)[0]
            ch = _seg_chain(a[sel], s_[sel], self.in_free[d_s[sel]], d_s[sel])
            arr[sel] = ch
            np.maximum.at(self.in_free, d_s[sel], ch)
        if blk.reduce:
            red = self.lp.reduce_ns(nbytes[od])
            done = _seg_chain(arr, red, self.red_free[d_s], d_s)
            np.maximum.at(self.red_free, d_s, done)
        else:
            done = arr
        np.maximum.at(new, d_s, done)
        np.maximum.at(self.last, d_s, done)

    # -- NOTE [repeated phases] ---------------------------------------------------------------
    def snapshot(self) -> tuple:
        """The state (ports, clocks, anchors, remembered receives, counters) as copies, for
        :meth:`advance`; its third item names the arrays, in order."""
        arrays = [self.up_free.ravel(), self.eg_free, self.in_free, self.red_free, self.red_side, self.last]
        names: list = []
        for k in sorted(self.clocks):
            arrays.append(self.clocks[k])
            names.append(("clock", k))
        for k in sorted(self.anchor):
            arrays.append(self.anchor[k])
            names.append(("anchor", k))
        for k in sorted(self.history):
            for i, rec in enumerate(self.history[k]):
                for tag in sorted(rec):
                    arrays.append(rec[tag])
                    names.append(("history", k, i, tag))
            names.append(("history", k, len(self.history[k])))
        return np.concatenate(arrays), (self.messages, self.up_bytes, self.out_bytes), tuple(names)

    @staticmethod
    def period_step(a: tuple, b: tuple, c: tuple):
        """``(moved, d)`` if one period took the state from ``a`` to ``b`` and the next from ``b``
        to ``c`` by the same uniform step ``d`` (entries it did not change aside); else None."""
        if a[2] != b[2] or b[2] != c[2]:
            return None
        d1, d2 = b[0] - a[0], c[0] - b[0]
        if not np.array_equal(d1, d2):
            return None
        moved = d2 != 0
        if not moved.any():
            return None
        step = d2[moved]
        if not bool((step == step[0]).all()):
            return None
        return moved, int(step[0])

    def advance(self, b: tuple, c: tuple, moved, d: int, times: int) -> None:
        """Apply ``times`` more periods that each move the ``moved`` entries of state ``c`` by
        ``d`` (and the counters as from ``b`` to ``c``)."""
        x = c[0] + np.where(moved, d * times, 0)
        T, L = self.up_free.shape
        names = [nm for nm in c[2] if len(nm) != 3 or nm[0] != "history"]
        parts = np.split(x, np.cumsum([T * L, T, T, T, T, T] + [T] * (len(names) - 1)))
        self.up_free = parts[0].reshape(T, L).copy()
        self.eg_free, self.in_free, self.red_free, self.red_side, self.last = (p.copy() for p in parts[1:6])
        history: dict[int, list[dict[str, np.ndarray]]] = {
            nm[1]: [{} for _ in range(nm[2])] for nm in c[2] if nm[0] == "history" and len(nm) == 3}
        for nm, arr in zip(names, parts[6:]):
            if nm[0] == "clock":
                self.clocks[nm[1]] = arr.copy()
            elif nm[0] == "anchor":
                self.anchor[nm[1]] = arr.copy()
            else:
                history[nm[1]][nm[2]][nm[3]] = arr.copy()
        self.history = history
        self.messages, self.up_bytes, self.out_bytes = (
            z + (z - y) * times for y, z in zip(b[1], c[1]))

    def end(self) -> np.ndarray:
        e = self.last.copy()
        for c in self.clocks.values():
            np.maximum(e, c, out=e)
        return np.tile(e, self.mult) if self.mult > 1 else e


_FOLD = True
"""Use the rank-symmetry fast path (NOTE [rank symmetry]); tests turn it off to compare."""
_SKIP = True
"""Apply runs of repeated phases at once (NOTE [repeated phases]); tests turn it off to compare."""
_MAX_KEY_PERIOD = 64
"""Longest period of phase keys looked for (NOTE [repeated phases])."""
_MAX_MULTIPLE = 48
"""Most key periods one period of the state may span (NOTE [repeated phases])."""
_HISTORY = 16
"""Phases of each slice whose tagged receives the engine remembers (NOTE [block dependencies])."""


def _key_period(ids: np.ndarray, i: int) -> int:
    """The shortest ``p`` <= :data:`_MAX_KEY_PERIOD` with the keys of the two runs of ``p``
    phases before ``i`` equal; 0 if none."""
    for p in range(1, _MAX_KEY_PERIOD + 1):
        if i - 2 * p < 0:
            return 0
        if np.array_equal(ids[i - p:i], ids[i - 2 * p:i - p]):
            return p
    return 0


def _run_phases(eng: _Engine, phases) -> None:
    """Run ``phases`` on ``eng``, skipping ahead over runs of repeated phases.

    NOTE [repeated phases]
        Pairwise box iterations on thousands of boxes are thousands of phases that, once the
        folded ranks see every iteration cross the spine, repeat: phases with equal ``key`` (a
        phase attribute: its timing class, e.g. the box shift modulo the fold and the sampled
        contention) are timed alike. Each phase maps the state (port and reduction-engine free
        times, clocks, remembered receives) by maxima and sums, so shifting every entry by ``d``
        shifts the result by ``d``. When two consecutive periods of ``P`` phases with equal keys
        moved every entry they changed by the same ``d``, the next ``m`` periods move them by
        ``m x d``: they are applied at once, with the same integers as running them (tested
        against running every phase). Only used on the folded ranks with one slice in flight.

        The state's period is a multiple of the keys' period ``p`` but may be many of them: a
        max-plus map repeated is periodic only with its cyclicity. With HCL's pipelined box
        iterations (NOTE [block dependencies]) the latency-bound regime (many boxes, little data
        per box: a barrier, or 256 MB on thousands of boxes) is such a case: on hls2, keys
        repeat every 16 box shifts (the fold's boxes) while the state repeats only every 288
        phases (18 key periods; found on 16,384 ranks). So the candidates are ``c x p`` for
        ``c`` up to :data:`_MAX_MULTIPLE`, tried every ``p`` phases; the state is remembered at
        those phases only. On an ECMP fabric the pipelined box iterations of cards whose flows
        collide would keep a slower pace than the others', and no period would move every
        entry alike; the sampled shifts in the middle of a many-box collective are charged
        every card alike (NOTE [sampled contention at scale] in :mod:`hccl.sim.fabric`), so
        their runs are skipped as on an ideal fabric.
    """
    n = len(phases)
    skip = _SKIP and eng.T < eng.n and len({s for s, _ in phases}) == 1 and n > 4 * 8
    if not skip:
        for s, ph in phases:
            eng.phase(s, ph)
        return
    intern: dict = {}
    ids = np.array([-1 - i if (k := getattr(ph, "key", None)) is None else intern.setdefault(k, len(intern))
                    for i, (_, ph) in enumerate(phases)], dtype=np.int64)  # a None key equals none
    snaps: dict[int, tuple] = {}
    p = 0
    i = 0
    while i < n:
        s, ph = phases[i]
        eng.phase(s, ph)
        i += 1
        if ids[i - 1] < 0:
            snaps.clear()
            p = 0
            continue
        if p == 0 or not np.array_equal(ids[i - p:i], ids[i - 2 * p:i - p]):
            p = _key_period(ids, i)
            snaps.clear()
        if p == 0 or i % p:  # the state is remembered every p phases
            continue
        snaps[i] = eng.snapshot()
        snaps.pop(i - 2 * _MAX_MULTIPLE * p, None)
        for c in range(1, _MAX_MULTIPLE + 1):
            P = c * p
            if i - 2 * P not in snaps or i + P > n:
                break
            if not np.array_equal(ids[i - 2 * P:i], np.tile(ids[i - p:i], 2 * c)):
                break
            if not np.array_equal(ids[i:i + P], ids[i - P:i]):
                break
            found = eng.period_step(snaps[i - 2 * P], snaps[i - P], snaps[i])
            if found is None:
                continue
            m = 1
            while i + (m + 1) * P <= n and np.array_equal(ids[i + m * P:i + (m + 1) * P], ids[i - P:i]):
                m += 1
            eng.advance(snaps[i - P], snaps[i], *found, m)
            i += m * P
            snaps.clear()
            p = 0
            break


def _env_key() -> tuple:
    return os.environ.get("HCCL_ALGO"), os.environ.get("PT_HCCL_SLICE_SIZE_MB")


_UNFOLDED_WARN_RANKS = 4096
"""World sizes from which planning every rank one by one is slow enough (seconds to minutes on a
small machine: its cost grows with ranks x boxes) to say why."""


@functools.lru_cache(maxsize=64)
def _warn_unfolded(topo: Topology, n: int) -> None:
    """Once per (topology, world size): a large group the rank-symmetry fold cannot take (NOTE
    [rank symmetry]) is planned rank by rank; say so, and which world sizes fold."""
    unit = _fold_unit(topo, n)
    if n < _UNFOLDED_WARN_RANKS or unit >= n or n % unit == 0:  # no fold tried, or whole units
        return
    up = -(-n // unit) * unit
    logger.warning("%d ranks of %s do not fill whole leaves (%d boxes of %d cards each), so the planner "
                   "simulates every rank: seconds to minutes at this size; %d or %d ranks (whole leaves) "
                   "plan in about a second", n, topo.name, topo.boxes_per_leaf, topo.cards_per_box, up - unit, up)


@functools.lru_cache(maxsize=4096)
def _simulate_cached(collective, nbytes, topology, world_size, rel_ready, algorithm, root, dtype_bytes,
                     splits, slice_bytes, _env) -> SimResult:
    count = validate_call(collective, nbytes, world_size, root=root, dtype_bytes=dtype_bytes, splits=splits)
    topo = topology.with_world_size(world_size)
    name, phases = algorithms.phases(collective, count, topo, algorithm=algorithm, root=root,
                                     dtype_bytes=dtype_bytes, splits=splits, slice_bytes=slice_bytes)
    ready = np.asarray(rel_ready, dtype=np.int64)
    lp = LinkParams(topo)
    fold = _fold_period(topo, world_size, ready) if _FOLD else world_size
    if fold == world_size and _FOLD:
        _warn_unfolded(topo, world_size)
    while True:
        eng = _Engine(lp, world_size, ready, dtype_bytes, fold=fold)
        try:
            _run_phases(eng, phases)
            break
        except _NoSymmetry:
            logger.debug("%s on %d ranks: a phase breaks the rank symmetry, simulating every rank",
                         name, world_size)
            fold = world_size
    end = eng.end()
    return SimResult(collective=collective, algorithm=name, nbytes=nbytes, world_size=world_size,
                     start_ns=tuple(int(x) for x in ready), end_ns=tuple(int(x) for x in end),
                     phases=len(phases), messages=eng.messages, scale_up_bytes=eng.up_bytes,
                     scale_out_bytes=eng.out_bytes)


def simulate(collective: str, nbytes: int, topology: Topology, *, world_size: int,
             ready_ns: Sequence[int] | None = None, algorithm: str | None = None, root: int = 0,
             dtype_bytes: int = 4, splits: Sequence[Sequence[int]] | None = None,
             slice_bytes: int | None = None) -> SimResult:
    """Simulate one collective on ``world_size`` ranks placed on ``topology``.

    Size convention (hccl_demo's "size"): ``nbytes`` is the byte size of *each rank's
    input buffer*, ``count = nbytes // dtype_bytes`` elements:

    - all_reduce, reduce, broadcast: the buffer is ``count`` elements;
    - all_gather: each rank contributes ``count``; the output is ``world_size x count``;
    - reduce_scatter: each rank inputs ``count``; rank r keeps its near-equal share
      (``count / world_size`` when it divides);
    - all2all: each rank sends ``count / world_size`` to every rank (or ``splits[i][j]``
      elements from i to j; ragged: row i adds up to rank i's input, the largest row to
      ``count``);
    - send_recv: each rank sends ``count`` to one peer and receives ``count`` (hccl_demo
      pattern: ring over boxes with the same local index, or adjacent pairs in a box);
    - barrier: ``nbytes`` is ignored (0-byte messages).

    Args:
        collective: ``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``,
            ``reduce_scatter``, ``all2all``, ``send_recv`` or ``barrier``.
        nbytes: per-rank input size in bytes, see above.
        topology: the system; its world size is replaced by ``world_size``.
        world_size: ranks in the group (rank r on card r).
        ready_ns: per rank, simulated ns when its collective stream is ready (default 0).
        algorithm: registered algorithm name (default: selection rule / ``HCCL_ALGO``).
        root: root of reduce / broadcast.
        dtype_bytes: bytes per element.
        splits: all2all only, (n, n) element counts.
        slice_bytes: slice size (default ``PT_HCCL_SLICE_SIZE_MB``).

    Returns:
        A :class:`SimResult` with absolute per-rank start/end times. Deterministic:
        the same inputs give the same integers. Results are cached.

    Raises:
        ValueError: bad collective, size, world size, root, splits, ready_ns length,
            or an algorithm that cannot run on this topology.
    """
    if ready_ns is None:
        off = 0
        rel: tuple[int, ...] = (0,) * world_size
    else:
        if len(ready_ns) != world_size:
            raise ValueError(f"ready_ns has {len(ready_ns)} entries, expected world_size={world_size}")
        off = int(min(ready_ns))
        if off < 0:
            raise ValueError("ready_ns must be >= 0")
        rel = tuple(int(x) - off for x in ready_ns)
    sp = None if splits is None else tuple(tuple(int(c) for c in row) for row in splits)
    res = _simulate_cached(collective, int(nbytes), topology, int(world_size), rel, algorithm, int(root),
                           int(dtype_bytes), sp, slice_bytes, _env_key())
    if off == 0:
        return res
    return SimResult(collective=res.collective, algorithm=res.algorithm, nbytes=res.nbytes,
                     world_size=res.world_size, start_ns=tuple(x + off for x in res.start_ns),
                     end_ns=tuple(x + off for x in res.end_ns), phases=res.phases, messages=res.messages,
                     scale_up_bytes=res.scale_up_bytes, scale_out_bytes=res.scale_out_bytes)


def simulate_sequence(calls: Sequence[dict], topology: Topology, *, world_size: int,
                      ready_ns: Sequence[int] | None = None) -> list[SimResult]:
    """Simulate collectives issued one after another on the same stream.

    Each entry of ``calls`` holds :func:`simulate` keyword arguments (``collective``,
    ``nbytes``, ...); call i+1 starts on each rank when call i ended there.
    """
    out = []
    ready = ready_ns
    for call in calls:
        r = simulate(topology=topology, world_size=world_size, ready_ns=ready, **call)
        out.append(r)
        ready = r.end_ns
    return out


_OPS = {
    "sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply,
}


def execute(collective: str, inputs: Sequence[np.ndarray], topology: Topology, *, op: str = "sum",
            algorithm: str | None = None, root: int = 0, splits=None,
            slice_bytes: int | None = None) -> list[np.ndarray]:
    """Planner-with-data mode: run the schedule's steps on real numpy buffers.

    Args:
        collective: as in :func:`simulate`.
        inputs: one 1-D array per rank (same dtype and length; the dtype's itemsize is
            the element size).
        topology: the system (world size = ``len(inputs)``).
        op: ``sum``, ``avg``, ``min``, ``max`` or ``prod`` for reducing collectives.

    Returns:
        Per rank, its output (see :func:`hccl.sim.schedule.layout`); for ``reduce`` only the
        root's output is meaningful, for ``barrier`` empty arrays.
    """
    if op not in _OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(_OPS)}")
    n = len(inputs)
    dtype = inputs[0].dtype
    count = int(inputs[0].size)
    nbytes = count * dtype.itemsize
    validate_call(collective, nbytes, n, root=root, dtype_bytes=dtype.itemsize, splits=splits)
    topo = topology.with_world_size(n)
    lays = [layout(collective, count, n, r, root=root, splits=splits) for r in range(n)]
    bufs = []
    for r in range(n):
        lay = lays[r]
        b = np.zeros(lay.work, dtype=dtype)
        if collective != "broadcast" or r == root:
            b[lay.input_offset:lay.input_offset + lay.input_count] = inputs[r][:lay.input_count]
        bufs.append(b)
    _, phases = algorithms.phases(collective, count, topo, algorithm=algorithm, root=root,
                                  dtype_bytes=dtype.itemsize, splits=splits, slice_bytes=slice_bytes)
    fn = _OPS[op]
    for _, ph in phases:
        blocks = ph()
        pending = []
        for blk in blocks:
            K, M = blk.dst.shape
            for k in range(K):
                for m in range(M):
                    d = int(blk.dst[k, m])
                    if d < 0:
                        continue
                    s = int(blk.src[m])
                    so, c = int(blk.send_off[k, m]), int(blk.count[k, m])
                    pending.append((d, int(blk.recv_off[k, m]), bufs[s][so:so + c].copy(), blk.reduce))
        for blk in blocks:
            if blk.copies is not None:
                for r, so, do, c in zip(*(x.tolist() for x in blk.copies)):
                    bufs[r][do:do + c] = bufs[r][so:so + c].copy()
        for d, ro, payload, red in pending:
            view = bufs[d][ro:ro + payload.size]
            view[...] = fn(view, payload) if red else payload
    outs = []
    for r in range(n):
        lay = lays[r]
        o = bufs[r][lay.output_offset:lay.output_offset + lay.output_count].copy()
        if op == "avg" and collective in ("all_reduce", "reduce", "reduce_scatter"):
            o = (o / n).astype(dtype)
        outs.append(o)
    return outs
