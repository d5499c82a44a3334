"""The pending lazy-mode graph as data: op records over storage serials, and its fused device time.

NOTE [op records and storage serials]
The bridge turns every charged aten op into an :class:`OpRecord`: its graph-key entry, its
roofline :class:`~hpu_runtime.device.cost_model.OpCost`, the device-resident storages it reads and
the storages it writes. Storages are named by *serials*, integers the device hands out once
per resident storage and never reuses (a Python ``id`` can be reused as soon as an object
dies, a serial cannot). Records hold no tensors, so the same records can be replayed on
another :class:`~hpu_runtime.bridge.sim_device.SimDevice` with different launch points: that
is how a traced training step (:mod:`hpu_runtime.tools.tracing`) is re-timed
(:mod:`hpu_runtime.tools.replay`) with DDP's buckets cutting the graph, through exactly the
code a live run uses.

NOTE [fusion inside a graph, deterministic]
A launched graph's device time comes from each op's roofline with only the HBM traffic
that survives fusion (:func:`graph_op_times`). Gaudi's graph compiler fuses chains of TPC
(vector) ops into one kernel; the MME reads its operands from and writes its results to
HBM. An in-place op makes a new *version* of its storage (as the bridge's graph does, which
functionalizes in-place ops). A version is an *intermediate*, never written to nor read
from HBM, when:

* a TPC op of the graph made it: allocated the storage, or updated in place a storage an
  earlier op of the same graph made;
* autograd does not keep it for backward: neither the op that made it nor an op that
  reads it saves it (which arguments and results each op's backward saves is PyTorch's
  ``derivatives.yaml``, tabled for the common ops in
  :data:`hpu_runtime.bridge.op_accounting.AUTOGRAD_SAVES`; other ops count as saving all);
* it is consumed later in the same graph, and only by TPC ops.

Every other read and write is HBM traffic, including a backward op's read of an
activation produced earlier in the same graph (it left the chip when it was written).

The rule looks only at the op sequence and ``requires_grad``, never at whether a Python
object is still alive when the graph is launched (that depends on garbage collection and
thread timing and made the simulated timeline drift between identical runs).

NOTE [MME and TPC run concurrently]
Gaudi's MME and TPC cluster are independent engines that run at the same time, and the
graph compiler pipelines a producer and its consumer by slicing their tensors (Intel Gaudi
documentation, "Gaudi Architecture": a heterogeneous compute architecture of MME and TPC;
Habana's answer on its forum: "TPC and MME are independent hardware cores, they operate
independently and compute in parallel"). :func:`graph_op_times` therefore schedules a
graph on two in-order engines: an op starts when its engine is free and its producers in
the graph have started (slices stream from producer to consumer), and ends no earlier than
its own time after its start nor before its producers end. The graph ends when both
engines are done. Each op's share of the graph's time is how far it moves the graph's
completion front (the latest end so far, in issue order), so the shares add up to the
graph's time and a running sum is when the ops issued so far are done.
"""

from __future__ import annotations

from typing import NamedTuple

from .cost_model import OpCost, fused_time_ns
from .spec import DeviceSpec

__all__ = ["OpRecord", "Write", "graph_op_times", "intermediates"]

Write = tuple[int, int, bool, bool]
"""One output of an op: ``(serial, nbytes, allocates, saved)``; serial -1 = not resident;
``saved``: autograd keeps it for backward (NOTE [fusion inside a graph, deterministic])."""


class OpRecord(NamedTuple):
    """One charged aten op of a lazy-mode graph (see NOTE [op records and storage serials]).

    A named tuple, not a frozen dataclass: one is built per op on the bridge's hot path, and a
    tuple is built in a third of the time.

    Attributes:
        key: the op's entry in the graph key (recipe-cache identity): ``(op, signature)``.
        cost: roofline cost of the op alone.
        reads: ``(serial, nbytes)`` of every device-resident tensor argument.
        writes: one :data:`Write` per output tensor.
        saves: serials of the arguments autograd keeps for this op's backward.
    """

    key: object
    cost: OpCost
    reads: tuple[tuple[int, int], ...] = ()
    writes: tuple[Write, ...] = ()
    saves: tuple[int, ...] = ()


def intermediates(ops: list[OpRecord]) -> set[tuple[int, int]]:
    """The ``(serial, version)`` of every storage version a graph of ``ops`` keeps on chip
    (NOTE [fusion inside a graph, deterministic]): a storage's first write in the graph makes
    version 0, each later write one more (-1 is its value from before the graph)."""
    return _versions(ops)[2]


def _versions(ops: list[OpRecord]) -> tuple[list, list, set]:
    """Per op, the versions it reads and the versions it writes, and the versions on chip."""
    version: dict[int, int] = {}  # serial -> its latest version in the graph
    candidates: set[tuple[int, int]] = set()
    consumed: set[tuple[int, int]] = set()
    spoiled: set[tuple[int, int]] = set()  # read by an MME op (the MME reads HBM) or kept for backward
    reads_at, writes_at = [], []
    for op in ops:
        mme = op.cost.engine == "MME"
        keys = []
        for serial, _nbytes in op.reads:
            key = (serial, version.get(serial, -1))  # -1: as it was before the graph
            keys.append(key)
            if key in candidates:
                consumed.add(key)
                if mme:
                    spoiled.add(key)
        reads_at.append(keys)
        for serial in op.saves:
            spoiled.add((serial, version.get(serial, -1)))
        keys = []
        for serial, _nbytes, allocates, saved in op.writes:
            if serial < 0:
                keys.append((serial, 0))
                continue
            made_here = allocates or (serial, version.get(serial, -1)) in candidates
            v = version[serial] = version[serial] + 1 if serial in version else 0
            key = (serial, v)
            keys.append(key)
            if not mme and made_here:
                candidates.add(key)
            if saved:
                spoiled.add(key)
        writes_at.append(keys)
    return reads_at, writes_at, consumed - spoiled


def graph_op_times(spec: DeviceSpec, ops: list[OpRecord]) -> list[int]:
    """Each op's share of one launched graph's device time, simulated ns.

    Fused roofline time per op (NOTE [fusion inside a graph, deterministic]) scheduled on
    the MME and the TPC at once (NOTE [MME and TPC run concurrently]).

    Args:
        spec: the device whose HBM bandwidth prices the surviving traffic.
        ops: the graph's ops in issue order.

    Returns:
        One share per op (same order, each >= 0): their sum is the graph's device time and
        the sum of the first ``k`` is when the first ``k`` ops are all done. An op that
        writes nothing and reads no intermediate (a pure cost, e.g. from
        ``SimDevice.record_op``) takes its unfused ``cost.device_ns`` on its engine. Every
        op also takes the spec's fixed ``op_overhead_ns`` on its engine.
    """
    reads_at, writes_at, on_chip = _versions(ops)
    overhead = spec.op_overhead_ns  # NOTE [calibration] in hpu_runtime.device.spec
    free = {"MME": 0, "TPC": 0}
    span: dict[int, tuple[int, int]] = {}  # serial -> (start, end) of the op that last wrote it
    front = 0
    shares = []
    for op, read_keys, write_keys in zip(ops, reads_at, writes_at):
        cost = op.cost
        engine = "MME" if cost.engine == "MME" else "TPC"
        fused_in = sum(nbytes for (_serial, nbytes), key in zip(op.reads, read_keys) if key in on_chip)
        if not op.writes and not fused_in:
            t = cost.device_ns + overhead
        else:
            written = sum(w[1] for w, key in zip(op.writes, write_keys) if key not in on_chip)
            t = fused_time_ns(spec, cost, cost.bytes_in - fused_in + written) + overhead
        start, end = free[engine], 0
        for serial, _nbytes in op.reads:
            produced = span.get(serial)
            if produced is not None:
                start = max(start, produced[0])
                end = max(end, produced[1])
        end = max(end, start + t)
        free[engine] = end
        for w in op.writes:
            span[w[0]] = (start, end)
        shares.append(max(end - front, 0))
        front = max(front, end)
    return shares
