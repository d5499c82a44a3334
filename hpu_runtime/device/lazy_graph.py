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
A launched graph's device time is the sum over its ops of the roofline with only the HBM
traffic that survives fusion (:func:`graph_op_times`):

* a read of a storage produced earlier in the same graph stays on chip (not charged);
* an op's output is written to HBM unless it is an intermediate: allocated by the op,
  consumed later in the same graph, and not recorded by autograd. Outputs of ops autograd
  records (grad mode on, an input requires grad) are forward activations that autograd
  usually keeps for backward, so they are written; in-place and ``out=`` outputs are always
  written.

The rule looks only at the op sequence and ``requires_grad``, never at whether a Python
object is still alive when the graph is launched (that depends on garbage collection and
thread timing and made the simulated timeline drift between identical runs).
"""

from __future__ import annotations

from typing import NamedTuple

from .cost_model import OpCost, fused_time_ns
from .spec import DeviceSpec

__all__ = ["OpRecord", "Write", "graph_op_times"]

Write = tuple[int, int, bool, bool]
"""One output of an op: ``(serial, nbytes, allocates, autograd_records_it)``; serial -1 = not resident."""


class OpRecord(NamedTuple):
    """One charged aten op of a lazy-mode graph (see NOTE [op records and storage serials]).

    A named tuple, not a frozen dataclass: one is built per op on the bridge's hot path, and a
    tuple is built in a third of the time.

    Attributes:
        key: the op's entry in the graph key (recipe-cache identity): ``(op, signature)``.
        cost: roofline cost of the op alone.
        reads: ``(serial, nbytes)`` of every device-resident tensor argument.
        writes: one :data:`Write` per output tensor.
    """

    key: object
    cost: OpCost
    reads: tuple[tuple[int, int], ...] = ()
    writes: tuple[Write, ...] = ()


def graph_op_times(spec: DeviceSpec, ops: list[OpRecord]) -> list[int]:
    """Device time of each op of one launched graph after fusion, simulated ns.

    Args:
        spec: the device whose HBM bandwidth prices the surviving traffic.
        ops: the graph's ops in issue order.

    Returns:
        One duration per op (same order); their sum is the graph's device time. An op with
        no resident reads or writes (a pure cost, e.g. from ``SimDevice.record_op``) keeps
        its unfused ``cost.device_ns``.
    """
    produced: set[int] = set()
    consumed: set[int] = set()
    fused_in: list[int] = []
    for op in ops:
        fused = 0
        for serial, nbytes in op.reads:
            if serial in produced:
                fused += nbytes
                consumed.add(serial)
        fused_in.append(fused)
        for serial, _nbytes, allocates, _rg in op.writes:
            if allocates and serial >= 0:
                produced.add(serial)
    times = []
    for op, fused in zip(ops, fused_in):
        if not op.writes and not fused:
            times.append(op.cost.device_ns)
            continue
        written = 0
        for serial, nbytes, allocates, rg in op.writes:
            if not allocates or rg or serial not in consumed:
                written += nbytes
        times.append(fused_time_ns(spec, op.cost, op.cost.bytes_in - fused + written))
    return times
