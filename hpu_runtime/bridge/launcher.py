"""The pending lazy-mode graph of one card, and its launch through the recipe cache.

Ops accumulate as :class:`~hpu_runtime.device.lazy_graph.OpRecord` (lazy mode, compiled
regions, HPU-graph capture) or launch one by one (eager mode). A launch keys the graph
(NOTE [graph key] in :mod:`hpu_runtime.bridge.graph_key`) and looks it up in the recipe
cache: a miss charges the simulated compile on the host and counts in
``metric_global("graph_compilation")``; then the graph runs on the card's compute stream
(:meth:`~hpu_runtime.device.card.Card.run_graph` when lazy collectives joined it), no
earlier than the end of every collective whose output it touches. A captured HPU graph
(:class:`CapturedGraph`) keeps its ops' records; a replay charges one replay on the host
and runs those records as one graph, and the event log keeps them, so a traced step's
replays can be re-timed by the planner as its other graphs are.

NOTE [a capture split by mark_step]
A launch while a capture is recording (a ``mark_step`` inside the captured code, as
optimum-habana's Llama makes between decoder layers in lazy mode; a host read; the pending
graph's op limit) ends one *segment* of the capture: Intel's bridge then closes one
``SingleHPUGraph`` of the ``HPUGraph`` being captured and starts the next
(HabanaAI/gaudi-pytorch-bridge, ``HbLazyTensor::StepMarker`` -> ``CaptureGraphMarkStep`` ->
``HPUGraph::mark_step`` in ``backend/habana_device/HPUGraph.cpp``), and a replay runs every
segment in order. Here the segments' records are kept in order
(:attr:`CapturedGraph.segments` gives their lengths); a replay charges ``graph_replay_ns``
once (the input check and the first launch) and ``graph_launch_ns`` for each further segment,
and runs the segments one after another on the compute stream.

NOTE [records made when read]
The pending graph's records (``Launcher._ops``) are a ``PendingOps`` of the hpu kernel library:
a sequence (``len``, ``[i]``, ``[i:j]``, iteration, ``append``) into which the kernel puts a
record it makes itself (NOTE [the op record, in the kernel] in
:mod:`hpu_runtime.bridge.op_accounting`) as plain values, its graph-key entry, cost and
storages' serials and bytes; the ``OpRecord`` and its tuples are made the first time something
reads that position, and kept. A launch that hits the recipe cache with no lazy collective in the
graph reads none: the records of a training step's graphs are then never made, which was about
4% of the instructions of a digits-MLP step (their tuples, ints and the ``OpRecord``, made and
freed at each launch). A record is made at once, as before, when something reads it at append
time: the event log, or a collective's output that the op touches (``Card.dependency_ns``).

NOTE [a graph key's hash]
A launch looks its graph key up in the recipe cache's memory, whose dictionary hashes the key
(a tuple of the ops' graph-key entries, themselves nested tuples whose hashes CPython does not
keep) once to find it and again to make it the most recently used: two walks over every
signature of the graph, about 45% of a ``mark_step`` of the digits MLP in ``py-spy``. A
:class:`GraphKey` is that tuple with its hash worked out once, by the kernel library's
``tuple_hash``, which follows CPython's own tuple hash over hashes it keeps per entry object (an
entry is one object for every call of its signature): the same value as the plain tuple's, so a
``GraphKey`` and a plain tuple of the same entries find each other in the cache, as the kernel's
eager launches look recipes up with plain tuples.

Not thread-safe on its own: :class:`~hpu_runtime.bridge.sim_device.SimDevice` calls it
under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api import metrics
from ..device.card import Card, CollectiveTiming, GraphCollective
from ..device.cost_model import OpCost, compile_ns
from ..device.lazy_graph import OpRecord, graph_op_times
from ..device.spec import DeviceSpec
from .graph_key import SCALAR_BYTES, graph_digest, recipe_name
from .recipe_cache import Recipe, RecipeCache

__all__ = ["CapturedGraph", "GraphInfo", "GraphKey", "Launcher"]


@dataclass(frozen=True, slots=True)
class GraphInfo:
    """One launched graph: why it was launched, its ops, its start and device time (ns).

    ``reason`` is the launch point (``"mark_step"``, ``"collective"``...) or ``"replay"`` for
    an HPU graph replay. ``op_times_ns`` is each op's share of ``device_ns`` (NOTE [MME and
    TPC run concurrently] in :mod:`hpu_runtime.device.lazy_graph`), in issue order (for a
    recipe-cache hit the recipe's cached total is charged; the shares are recomputed).
    """

    reason: str
    ops: int
    start_ns: int
    device_ns: int
    op_times_ns: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CapturedGraph:
    """An HPU graph as the device replays it: its ops' records, in issue order.

    ``recipe`` is the recipe its capture compiled (None when the graph was rebuilt from a
    trace's event log, which holds the records only).
    """

    records: tuple[OpRecord, ...]
    recipe: Recipe | None = None
    segments: tuple[int, ...] | None = None
    """How many of ``records`` each segment holds, in order, when the capture was split by
    launches (NOTE [a capture split by mark_step]); None: one segment."""

    def split(self) -> list[tuple[OpRecord, ...]]:
        """The records of each segment, in replay order."""
        if not self.segments:
            return [self.records]
        out, at = [], 0
        for n in self.segments:
            out.append(self.records[at:at + n])
            at += n
        return out


_BUILTINS: dict | None = None


def _builtin(name: str):
    """The kernel library's builtin ``name`` (:func:`~hpu_runtime.bridge.device_type.builtins`,
    read once): ``launcher_append(launcher, op) -> 0 | 1 | 2`` (1: eager mode launches the op now;
    2: the graph reached ``max_compound_ops``), ``tuple_hash``, ``PendingOps``."""
    global _BUILTINS
    if _BUILTINS is None:
        from .device_type import builtins

        _BUILTINS = builtins()
    return _BUILTINS[name]


class GraphKey(tuple):
    """A graph key (a tuple of graph-key entries) that keeps its hash (NOTE [a graph key's
    hash]): equal to, and hashing as, the plain tuple of the same items."""

    def __new__(cls, items):
        key = super().__new__(cls, items)
        key._hash = _builtin("tuple_hash")(key)
        return key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuilt from its items: the kept hash is this process's (str hashes are salted per process)
        return (GraphKey, (tuple(self),))


class Launcher:
    """Accumulates ops into the pending graph and launches it on ``card``.

    Args:
        spec: the device (host costs, compile costs).
        card: the clocks the graphs run on.
        recipes: the recipe cache.
        lazy: lazy mode (``PT_HPU_LAZY_MODE=1``); eager launches each op on its own.
        max_compound_ops: launch once the pending graph holds this many ops (0 = unlimited).

    Attributes:
        pending: the roofline costs of the pending graph's ops, in issue order.
        log: when a list, the events that shape the timeline are appended to it (see
            :class:`~hpu_runtime.bridge.sim_device.SimDevice`).
        graph_log: when a list, a :class:`GraphInfo` per launched graph is appended to it.
        region: the compiled region or capture being recorded, or None.
        capture: the op list of the HPU graph being captured, or None.
        new_scalars: scalars the pending graph put on the device for the first time (NOTE
            [scalars as graph inputs] in :mod:`hpu_runtime.bridge.graph_key`): its launch
            copies them host->device in one batch.
    """

    def __init__(self, spec: DeviceSpec, card: Card, recipes: RecipeCache, *, lazy: bool,
                 max_compound_ops: int) -> None:
        self.spec = spec
        self.card = card
        self.recipes = recipes
        self.lazy = lazy
        self.max_compound_ops = max_compound_ops
        self.pending: list[OpCost] = []
        self.log: list | None = None
        self.graph_log: list[GraphInfo] | None = None
        self.region: str | None = None
        self.capture: list | None = None
        self._segments: list[tuple[OpRecord, ...]] = []  # the capture's launched segments
        self.last_recipe: Recipe | None = None
        self.graphs_launched = 0
        self.replays = 0
        self.ops_recorded = 0
        self.compilations = 0
        self.new_scalars = 0
        self._keys: list = []
        self._ops = _builtin("PendingOps")()  # a sequence of OpRecord (NOTE [records made when read])
        self._dep_ns = 0  # the pending graph touches a collective's output ready then
        self._colls: list[GraphCollective] = []  # lazy collectives in the pending graph
        self._host_start = 0
        self._op_host_ns = spec.host_op_ns
        self._eager_ns = spec.eager_op_launch_ns
        self._launch_ns = spec.graph_launch_ns

    def rescale(self) -> None:
        """Take the card's slowdown of this step into the cached host costs (NOTE [a slower
        card, step by step] in :mod:`hpu_runtime.device.card`)."""
        scaled, spec = self.card.scaled, self.spec
        self._op_host_ns = 0 if self.region is not None else scaled(spec.host_op_ns)
        self._eager_ns = scaled(spec.eager_op_launch_ns)
        self._launch_ns = scaled(spec.graph_launch_ns)

    # ---- accumulate ------------------------------------------------------------------------
    def append_op(self, op: OpRecord) -> None:
        """Add one op record to the pending graph (eager mode: launch it at once). The record
        joins the graph in the hpu kernel library (``launcher_append``: the dependency on a
        collective's output, the ``("op", record)`` log event, ``ops_recorded``, the host's
        time per op, the graph's lists), as the kernel's own op records do (NOTE [the op record,
        in the kernel] in :mod:`hpu_runtime.bridge.op_accounting`); the launches are here."""
        launch = _builtin("launcher_append")(self, op)
        if launch == 1:
            self.launch("eager", 0)
        elif launch == 2:
            self.launch("max_compound_op_size")

    def append_view(self, key: object) -> None:
        """A view op: free, but part of the pending graph's key in lazy mode and in an HPU-graph
        capture. Not in a compiled region: its views are fixed by its graph (and AOTAutograd's
        first run of a graph adds ``detach`` views that later runs do not make)."""
        if (self.lazy and self.region is None) or self.capture is not None:
            self._keys.append(key)
            if self.log is not None:
                self.log.append(("view", key))

    def add_collective(self, label: str, timing: CollectiveTiming, serials: tuple[int, ...],
                       on_timed) -> None:
        """A lazy collective joins the pending graph after the ops issued so far."""
        if not self.pending:
            self._host_start = self.card.host_ns
        self._colls.append(GraphCollective(len(self._ops), label, timing, serials, on_timed))

    def copy_h2d(self, nbytes: int) -> None:
        """One host->device copy of ``nbytes``: host time on the card, and an ``("h2d", nbytes)``
        event in the log."""
        self.card.copy_h2d(nbytes)
        if self.log is not None:
            self.log.append(("h2d", nbytes))

    # ---- launch ------------------------------------------------------------------------------
    def launch(self, reason: str, launch_host_ns: int | None = None) -> tuple[int, int] | None:
        """Launch the pending graph; its (start, end) on the compute stream, or None if empty.

        ``launch_host_ns`` is the host cost of the launch (default ``graph_launch_ns``; an
        eager op's launch is part of its ``eager_op_launch_ns``).
        """
        card = self.card
        if launch_host_ns is None:
            launch_host_ns = self._launch_ns
        if self.new_scalars:  # one copy of the graph's new scalars (NOTE [scalars as graph inputs])
            nbytes, self.new_scalars = SCALAR_BYTES * self.new_scalars, 0
            self.copy_h2d(nbytes)
        n = len(self.pending)
        if self.log is not None:  # logged even when empty: a replay may put ops before it (DDP's)
            self.log.append(("launch", reason))
        if n == 0:
            self._keys.clear()
            if self._colls:  # a graph of lazy collectives only
                card.host_ns += launch_host_ns
                colls, self._colls = self._colls, []
                return card.run_graph(max(card.host_ns, self._dep_ns), [], [], colls, reason)
            return None
        recipe, name, times = self._recipe(reason, n)
        if card.trace is not None and card.host_ns > self._host_start and reason != "eager":
            card.host_event(f"build graph[{n} ops]", card.host_ns - self._host_start, {}, start=self._host_start)
        card.host_ns += launch_host_ns
        ready = max(card.host_ns, self._dep_ns)
        label = f"{name} ({reason})"
        if self._colls:
            if times is None:
                times = graph_op_times(self.spec, self._ops)
            colls, self._colls = self._colls, []
            span = card.run_graph(ready, self._ops, times, colls, label)
        else:
            span = card.run_compute(ready, recipe.device_ns, label)
        if self.graph_log is not None:
            if times is None:
                times = graph_op_times(self.spec, self._ops)
            self.graph_log.append(GraphInfo(reason, n, span[0], recipe.device_ns, tuple(times)))
        self.graphs_launched += 1
        self.last_recipe = recipe
        if self.capture is not None:  # NOTE [a capture split by mark_step]
            self._segments.append(tuple(self._ops))
        self.pending = []
        self._keys = []
        self._ops.clear()
        self._dep_ns = 0
        card.forget_dependencies_before(span[0])
        return span

    def _recipe(self, reason: str, n: int) -> tuple[Recipe, str, list[int] | None]:
        """The pending graph's recipe (compiled and charged on a miss), its name, and the
        ops' fused times if they were computed."""
        key = GraphKey(self._keys)
        spec = self.spec
        digest: list[bytes] = []

        def get_digest() -> bytes:  # only on a memory miss with a disk level, or a compile
            if not digest:
                digest.append(graph_digest(spec.name, key))
            return digest[0]

        recipe = self.recipes.lookup(key, digest=get_digest)
        if recipe is not None:
            name = recipe.meta.get("name", "recipe")
            metrics.record_recipe_cache(True, name)
            return recipe, name, None
        cns = compile_ns(spec, n)
        name = recipe_name(get_digest(), n)
        times = graph_op_times(spec, self._ops)
        recipe = Recipe(n_ops=n, compile_ns=cns, device_ns=sum(times), meta={"name": name})
        self.recipes.insert(key, recipe, digest=get_digest)
        metrics.record_recipe_cache(False, name)
        metrics.record_compilation(cns)
        self.compilations += 1
        self.card.spend_host(f"compile {name}", cns, {"ops": n, "reason": reason})
        return recipe, name, times

    # ---- regions: torch.compile graphs and HPU graph capture/replay ------------------------
    def set_region(self, label: str | None) -> None:
        """Enter (``label``) or leave (None) a compiled region: ops accumulate with no host cost."""
        if self.log is not None:
            self.log.append(("region", label))
        self.region = label
        self._op_host_ns = 0 if label is not None else self.card.scaled(self.spec.host_op_ns)

    def begin_capture(self, ops: list) -> None:
        """Start recording ops into ``ops`` as one HPU graph (ops keep their host cost)."""
        if self.capture is not None:
            raise RuntimeError("hpu: an HPU graph capture is already in progress")
        self.launch("hpu_graph_capture")
        self.capture = ops
        self._segments = []
        self.region = "hpu_graph_capture"

    def end_capture(self) -> CapturedGraph | None:
        """Finish a capture: launch (compile) the captured graph's last segment; returns the
        graph, every segment of it (None if nothing was captured)."""
        self.last_recipe = None
        try:
            self.launch("hpu_graph_capture")
            segments = self._segments
        finally:
            self.capture = None
            self._segments = []
            self.region = None
        if not segments:
            return None
        records = tuple(op for seg in segments for op in seg)
        lengths = tuple(len(seg) for seg in segments) if len(segments) > 1 else None
        return CapturedGraph(records, self.last_recipe, lengths)

    def replay(self, graph: CapturedGraph | None, label: str) -> tuple[int, int]:
        """Replay a captured graph: ``graph_replay_ns`` of host time, then its ops on the
        compute stream (no earlier than the collectives writing what they touch end); a graph
        captured in segments runs them in order, each further one after a graph launch's host
        time (NOTE [a capture split by mark_step]). Returns the (start, end) of the whole."""
        self.launch("hpu_graph_replay")
        card = self.card
        records = graph.records if graph is not None else ()
        if self.log is not None:
            if graph is not None and graph.segments:
                self.log.append(("replay", records, label, graph.segments))
            else:
                self.log.append(("replay", records, label))
        card.host_ns += card.scaled(self.spec.graph_replay_ns)
        first = None
        for i, seg in enumerate(graph.split() if graph is not None else [()]):
            if i:
                card.host_ns += self._launch_ns
            dep = max((card.dependency_ns(op) for op in seg), default=0) if card.ready_after else 0
            times = graph_op_times(self.spec, list(seg))
            device_ns = sum(times)
            span = card.run_compute(max(card.host_ns, dep), device_ns, f"{label} replay")
            if self.graph_log is not None:
                self.graph_log.append(GraphInfo("replay", len(seg), span[0], device_ns, tuple(times)))
            first = span[0] if first is None else first
            card.forget_dependencies_before(span[0])
        self.replays += 1
        return first, span[1]
