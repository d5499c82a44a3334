"""The simulated Gaudi of one process, as the bridge drives it: one facade over small parts.

:class:`SimDevice` is the object every caller holds (the dispatch modes, the ``torch.hpu``
API, the ``hccl`` process group, the tracer and the planner). It owns one lock and is
composed of:

==================  =====================================================================
part                owns
==================  =====================================================================
``residency``       resident storages and their serials, HBM allocation
                    (:mod:`hpu_runtime.device.residency`)
``card``            host cursor, compute and collective streams, collective dependencies,
                    steps, trace spans (:mod:`hpu_runtime.device.card`, NOTE [simulated
                    timeline], NOTE [lazy collectives])
``launcher``        the pending lazy graph and its launch through the recipe cache,
                    compiled regions, HPU-graph capture (:mod:`hpu_runtime.bridge.launcher`)
``ops``             aten call -> op record (the hot path), CPU fallback, fused kernels,
                    emulated autocast (:mod:`hpu_runtime.bridge.op_accounting`)
==================  =====================================================================

The lock is reentrant, as ``threading.RLock`` (its ``acquire``, ``release`` and ``with``), and is
a ``DeviceLock`` of the hpu kernel library, which the kernel takes in place, with no Python call,
around each op record it makes (NOTE [the bridge's hot path] in :mod:`.dispatch`). Every public
method takes the lock, so the parts need none of their own; the parts are
public for reading and for tests, but state changes go through the facade. All times are
simulated nanoseconds (see NOTE [simulated timeline] in :mod:`hpu_runtime.device.card`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..device.card import Card, CollectiveTiming
from ..device.cost_model import OpCost
from ..device.lazy_graph import OpRecord
from ..device import native
from ..device.memory import HBMModel
from ..device.residency import Residency
from ..device.spec import DeviceSpec
from ..device.timeline import StepTimes, Stream, TraceEvent
from .fallback import FallbackPolicy
from .launcher import CapturedGraph, GraphInfo, Launcher
from .op_accounting import OpAccounting, OpEntry
from .recipe_cache import RecipeCache, default_max_recipes

__all__ = ["GraphInfo", "SimDevice", "StepTimes", "Stream"]

_Tensor = torch.Tensor


def _delegate(path: str, doc: str, *, writable: bool = False) -> property:
    """A property reading ``self.<part>.<name>`` for ``path = "part.name"`` (and writing it,
    if ``writable``: only the event logs, which tools switch on and off)."""
    part, name = path.split(".")
    get = operator.attrgetter(path)
    if not writable:
        return property(get, doc=doc)

    def set_(self, value) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, set_, doc=doc)


class SimDevice:
    """One simulated Gaudi card (one per process).

    Args:
        spec: device generation constants.
        lazy: lazy mode (``PT_HPU_LAZY_MODE=1``) accumulates ops into graphs; eager launches
            each op on its own.
        max_compound_ops: launch the pending graph once it holds this many ops
            (``PT_HPU_MAX_COMPOUND_OP_SIZE``; 0 = unlimited).
        recipes: the recipe cache (default: memory only, holding the bridge's number of recipes
            for the mode: NOTE [the recipe cache's LRU] in :mod:`hpu_runtime.bridge.recipe_cache`).
        fallback: CPU-fallback policy (default: none beyond the dtypes and ops Gaudi lacks).

    Attributes:
        log: when a list, every event that shapes the timeline is appended to it, in order:
            ``("op", OpRecord)``, ``("view", key)``, ``("launch", reason)``,
            ``("h2d", nbytes)``, ``("host_read", nbytes, serial)``, ``("region", label)``,
            ``("replay", records, label[, segments])`` (an HPU graph replay, its ops' records and,
            for a capture split by launches, the length of each segment),
            ``("fp32_as_bf16", entering)``, ``("mark", payload)``
            (:mod:`hpu_runtime.tools.tracing` records such logs, :mod:`hpu_runtime.tools.replay`
            replays them).
        graph_log: when a list, a :class:`~hpu_runtime.bridge.launcher.GraphInfo` per launch.
    """

    host_ns = _delegate("card.host_ns", "The host cursor, simulated ns.")
    compute = _delegate("card.compute", "The compute stream.")
    collective = _delegate("card.collective", "The collective stream.")
    lazy = _delegate("launcher.lazy", "Lazy mode (else eager).")
    max_compound_ops = _delegate("launcher.max_compound_ops", "Ops per graph before a forced launch (0: no limit).")
    recipes = _delegate("launcher.recipes", "The recipe cache.")
    pending = _delegate("launcher.pending", "Costs of the pending graph's ops, in issue order.")
    log = _delegate("launcher.log", "The event log (see the class docstring), or None.", writable=True)
    graph_log = _delegate("launcher.graph_log", "Launched graphs (a list to fill), or None.", writable=True)
    graphs_launched = _delegate("launcher.graphs_launched", "Graphs launched so far.")
    replays = _delegate("launcher.replays", "HPU graph replays so far.")
    ops_recorded = _delegate("launcher.ops_recorded", "Ops recorded so far.")
    compilations = _delegate("launcher.compilations", "Recipe-cache misses (simulated compiles) so far.")

    def __init__(self, spec: DeviceSpec, *, lazy: bool = True, max_compound_ops: int = 0,
                 recipes: RecipeCache | None = None, fallback: FallbackPolicy | None = None) -> None:
        self.spec = spec
        # reentrant, as threading.RLock; the hpu kernel takes it without a Python call
        self.lock = native.functions()["DeviceLock"]()
        self.hbm = HBMModel.from_spec(spec)
        self.residency = Residency(self.hbm)
        self.card = Card(spec)
        self.launcher = Launcher(spec, self.card,
                                 recipes if recipes is not None else RecipeCache(max_recipes=default_max_recipes(lazy)),
                                 lazy=lazy, max_compound_ops=max_compound_ops)
        self.ops = OpAccounting(spec, self.residency, self.card, self.launcher,
                                fallback if fallback is not None else FallbackPolicy(), self.lock)
        # The bridge's hot path, bound on the instance so a dispatched op costs no extra call.
        self.op_entry = self.ops.entry
        self.check_outputs = self.ops.check_outputs
        self.record = self.ops.record

    # ---- residency and HBM -------------------------------------------------------------------
    def is_resident(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is on the simulated card (an ``hpu`` tensor: its storage is on the HBM)."""
        return t.device.type == "hpu"

    def serial_of(self, t: torch.Tensor) -> int:
        """The serial of ``t``'s resident storage, or -1 if it is not on the simulated HBM."""
        return self.residency.serial_of(t)

    def make_resident(self, t: torch.Tensor) -> int:
        """Count ``t``'s storage as on the simulated HBM without charging a copy; its serial."""
        with self.lock:
            return self.residency.register(t.untyped_storage()).serial

    def check_alloc(self, nbytes: int) -> None:
        """Raise :class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` if ``nbytes`` would not fit."""
        self.hbm.check_alloc(nbytes)

    def to_device(self, t: torch.Tensor) -> None:
        """``t`` was just copied from the host (``.to("hpu")``): a PCIe host->device copy of its
        bytes, unless its storage is already counted on the HBM.

        Raises:
            HPUOutOfMemoryError: if the tensor does not fit in the remaining HBM.
        """
        st = t.untyped_storage()
        if id(st) in self.residency.refs:
            return
        with self.lock:
            self.residency.register(st)
            self.charge_h2d(st.nbytes())

    def charge_h2d(self, nbytes: int) -> None:
        """Host time of one host->device copy of ``nbytes`` over PCIe (simulated ns)."""
        with self.lock:
            self.launcher.copy_h2d(nbytes)

    # ---- ops and graphs ----------------------------------------------------------------------
    def op_entry(self, func, args: tuple, kwargs: dict, factory_nbytes: int | None = None) -> OpEntry:  # shadowed
        """A new entry for ``func`` called with these arguments (see
        :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.entry`)."""
        return self.ops.entry(func, args, kwargs, factory_nbytes)

    def check_outputs(self, func, args: tuple, kwargs: dict, entry: OpEntry) -> OpEntry:  # shadowed in __init__
        """Raise ``HPUOutOfMemoryError`` before ``func`` runs if its outputs would not fit (see
        :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.check_outputs`); returns ``entry``."""
        return self.ops.check_outputs(func, args, kwargs, entry)

    def record(self, func, args: tuple, kwargs: dict, out: object, entry: OpEntry) -> None:  # shadowed
        """Account one dispatched aten op ``func(*args, **kwargs) -> out`` (the bridge's hot
        path; see :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.record`)."""
        self.ops.record(func, args, kwargs, out, entry)

    def uncharged(self):
        """Context manager: the body's tensor ops run (real numerics) and are not charged."""
        return self.ops.uncharged()

    def fused_kernel(self, name: str, reads, writes, flops: int):
        """Run the body's tensor ops uncharged and charge them as one fused TPC kernel (the
        ``hpex`` optimizers; see :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.fused_kernel`)."""
        return self.ops.fused_kernel(name, reads, writes, flops)

    def append_view(self, key: object) -> None:
        """A view op: free, but part of the pending graph's key (lazy mode, HPU-graph capture)."""
        with self.lock:
            self.launcher.append_view(key)

    def record_op(self, cost: OpCost, key: object = None) -> None:
        """Account one op given only its cost (pure use, e.g. tests and the planner).

        ``key`` identifies the op in the graph key (default: its name, FLOPs, bytes and time);
        it is never fused.
        """
        if key is None:
            key = (cost.flops, cost.bytes_in, cost.bytes_out, cost.device_ns)
        self.append_op(OpRecord((cost.name, key), cost))

    def append_op(self, op: OpRecord) -> None:
        """Add one op record to the pending graph (eager mode: launch it at once).

        The graph will not start on the compute stream before the end of any collective that
        writes a storage the op reads or writes (see :meth:`record_collective`).
        """
        with self.lock:
            self.launcher.append_op(op)

    def add_graph_collective(self, label: str, timing: CollectiveTiming, serials: tuple | list = (),
                             on_timed: Callable | None = None) -> None:
        """A lazy collective (``PT_HPU_ENABLE_LAZY_COLLECTIVES=true``): it joins the pending
        graph instead of launching it; see NOTE [lazy collectives] in :mod:`hpu_runtime.device.card`.

        Args:
            label: its name on the collective stream.
            timing: ``timing(ready_ns) -> (start_ns, end_ns, algorithm)`` from the network model.
            serials: storages it writes (later work reading them waits for its end).
            on_timed: called with ``(start_ns, end_ns, algorithm)`` once the graph has run.
        """
        with self.lock:
            self.launcher.add_collective(label, timing, tuple(serials), on_timed)

    def launch(self, reason: str = "mark_step") -> tuple[int, int] | None:
        """Launch the pending graph on the compute stream; returns its (start, end) or None.

        The graph is looked up in the recipe cache by its key; a miss charges a compile on
        the host and counts in ``metric_global("graph_compilation")``. It starts when the
        host has launched it, the compute stream is free and every collective whose output
        it reads has ended.
        """
        with self.lock:
            if reason == "mark_step" and self.launcher.pending:
                self.ops.mark_step_launched()
            return self.launcher.launch(reason)

    def host_read(self, nbytes: int = 0, tensor: torch.Tensor | None = None) -> None:
        """A host read of a device tensor: launch, wait for the compute stream (and for the
        collective that wrote ``tensor``, if any), copy ``nbytes`` down."""
        with self.lock:
            serial = -1 if tensor is None else self.serial_of(tensor)
            self.read_serial(nbytes, serial)

    def read_serial(self, nbytes: int, serial: int = -1) -> None:
        """:meth:`host_read` of the storage ``serial`` (-1: none in particular)."""
        with self.lock:
            if self.launcher.log is not None:
                self.launcher.log.append(("host_read", nbytes, serial))
            self.launch("host_read")
            self.card.read_back(nbytes, serial)

    def wait_host(self, until_ns: int) -> None:
        """The host waits until ``until_ns`` (an event, a stream's end); no launch."""
        with self.lock:
            self.card.wait_host(until_ns)

    def synchronize(self) -> None:
        """Launch pending work and make the host wait for every stream (``hpu.synchronize()``)."""
        with self.lock:
            self.launch("synchronize")
            card = self.card
            card.wait_host(max(card.compute.free_ns, card.collective.free_ns))

    def set_fp32_as_bf16(self, entering: bool) -> None:
        """An emulated bf16 autocast region starts (True) or ends (False); see NOTE [fp32 on
        the host, bf16 on the device] in :mod:`hpu_runtime.bridge.autocast`."""
        self.ops.set_fp32_as_bf16(entering)

    def mark(self, payload: object) -> None:
        """Put ``payload`` in the event log (a tracer's marker; no simulated cost)."""
        log = self.launcher.log
        if log is not None:
            log.append(("mark", payload))

    # ---- regions: torch.compile graphs and HPU graph capture/replay ---------------------------
    @contextmanager
    def compiled_region(self, label: str = "torch.compile") -> Iterator[None]:
        """Ops inside form one recipe with no per-op host cost (a ``torch.compile`` FX graph)."""
        with self.lock:
            self.launch(label)
            prev = self.launcher.region
            self.launcher.set_region(label)
        try:
            yield
        finally:
            with self.lock:
                self.launch(label)
                self.launcher.set_region(prev)

    def set_region(self, label: str | None) -> None:
        """Enter (``label``) or leave (None) a compiled region: ops accumulate with no host cost."""
        with self.lock:
            self.launcher.set_region(label)

    def begin_capture(self, ops: list) -> None:
        """Start recording ops into ``ops`` as one HPU graph (see :mod:`hpu_runtime.bridge.hpu_graphs`)."""
        with self.lock:
            self.launcher.begin_capture(ops)

    def end_capture(self) -> CapturedGraph | None:
        """Finish a capture: launch (compile) the captured graph; returns it."""
        with self.lock:
            return self.launcher.end_capture()

    def replay(self, graph: CapturedGraph | None, label: str = "hpu_graph") -> tuple[int, int]:
        """Replay a captured graph: no per-op host cost, ``graph_replay_ns`` then its device time."""
        with self.lock:
            return self.launcher.replay(graph, label)

    # ---- collectives (NOTE [collective dependencies] in hpu_runtime.device.card) ------------
    def collective_ready_ns(self) -> int:
        """Launch the graph producing a collective's input; when the collective can start."""
        with self.lock:
            self.launch("collective")
            return self.card.collective_ready_ns()

    def record_collective(self, label: str, start_ns: int, end_ns: int,
                          outputs: tuple | list = (), serials: tuple | list = (), args: dict | None = None) -> None:
        """Occupy the collective stream from ``start_ns`` to ``end_ns``; ``args`` (its bytes,
        algorithm) go into the trace span.

        ``outputs`` (tensors, made resident) and ``serials`` (storage serials) are what the
        collective writes: no graph that reads or writes them starts, and no host read of
        them returns, before ``end_ns``, however the caller waits (``Work.wait()``, the
        future, or not at all).
        """
        with self.lock:
            register = self.residency.register
            marks = [register(t.untyped_storage()).serial for t in outputs if isinstance(t, _Tensor)]
            self.card.record_collective(label, start_ns, end_ns, (*marks, *serials), args)

    def stream_wait(self, until_ns: int) -> None:
        """The compute stream waits for an event at ``until_ns`` (e.g. a collective's end)."""
        with self.lock:
            self.card.stream_wait(until_ns)

    # ---- trace and steps -------------------------------------------------------------------
    def enable_trace(self) -> None:
        """Keep every host, compute and collective span from now on (for :meth:`trace_events`)."""
        with self.lock:
            self.card.enable_trace()

    def disable_trace(self) -> None:
        """Stop keeping spans; those kept so far are dropped."""
        with self.lock:
            self.card.disable_trace()

    def trace_events(self, rank: int = 0) -> list[TraceEvent]:
        """The recorded spans as :class:`~hpu_runtime.device.timeline.TraceEvent` of ``rank``."""
        with self.lock:
            return self.card.trace_events(rank)

    def now_ns(self) -> int:
        """The latest point any cursor has reached (simulated ns)."""
        return self.card.now_ns()

    def begin_step(self) -> None:
        """Start a step window at the device's current end (see :meth:`end_step`)."""
        with self.lock:
            self.card.begin_step()

    def end_step(self) -> StepTimes:
        """Launch pending work, close the step window and return its breakdown.

        The window ends when every stream has drained; the host does not wait (the next
        step's host work may overlap this step's device work, as on Gaudi).
        """
        with self.lock:
            self.launch("mark_step")
            times = self.card.end_step()
            if self.card.step_slowdown is not None:
                self.launcher.rescale()
            return times

    def set_step_slowdown(self, fn: Callable[[int], int] | None,
                          device_fn: Callable[[int], int] | None = None) -> None:
        """Run each step ``s`` ``fn(s) / 1e6`` times slower than nominal, from this step on
        (None: nominal); ``device_fn``: the compute stream's own factors, where they differ from
        the host's; see NOTE [a slower card, step by step] in :mod:`hpu_runtime.device.card`."""
        with self.lock:
            self.card.set_step_slowdown(fn, device_fn)
            self.launcher.rescale()
