"""The simulated Gaudi of this process: host cursor, compute and collective streams, lazy graph.

NOTE [simulated timeline]
All times are integer *simulated* nanoseconds; nothing here reads a wall clock, so the same
script gives the same timeline on any machine. Three cursors advance:

* ``host_ns``: the host thread. In lazy mode each dispatched op costs ``host_op_ns`` of host
  time to accumulate; launching a graph costs ``graph_launch_ns`` plus, on a recipe-cache
  miss, the simulated compile time; a host read (``.item()``, ``.cpu()``) or
  :meth:`SimDevice.synchronize` makes the host wait for the device. Host<->device copies
  (``.to("hpu")`` of a host tensor, ``.cpu()`` of a device tensor) cost PCIe time on the host.
* the compute stream: a launched graph starts at ``max(host_ns, compute.free_ns)`` and runs
  for the fused time of its ops (see NOTE [fusion inside a graph] in ``cost_model``).
* the collective stream: a collective is ready at ``max(host_ns, compute.free_ns,
  collective.free_ns)`` once the graph producing its input has been launched (a collective
  is a lazy-mode launch point), and its duration comes from the network model. ``Work.wait()``
  makes the compute stream wait for the collective's end, as a stream wait on Gaudi does.

A *step* (``begin_step``/``end_step``) reports its length and how much of it the compute and
collective streams were busy; communication not hidden under compute is "exposed".

NOTE [lazy collectives]
With ``PT_HPU_ENABLE_LAZY_COLLECTIVES=true`` (Intel's bridge then loads its lazy-collectives
process group) an allreduce does not launch the accumulated graph: it joins it
(:meth:`SimDevice.add_graph_collective`), and the graph is launched when the work is waited
on or at the next launch point. Inside the launched graph the collective becomes ready when
the ops issued before it are done; ops of the graph that use its output wait for its end.
Its duration comes from the network model with every rank ready at the same time (true of
data-parallel ranks, which run the same graph); the real bytes move when it is called.

NOTE [device residency and HBM]
Tensors are CPU tensors; the device tracks which *storages* are on the simulated HBM: the
outputs of ops the bridge charges, tensors moved with ``.to("hpu")`` and factories with
``device="hpu"``. Each is held by a weak reference to its storage, so HBM is freed exactly
when the storage dies (also when autograd releases saved activations). ``.to("hpu")`` of a
storage that is not resident is a host->device PCIe copy; ``.cpu()``/``.item()`` of a
resident one is a host read (launch, wait, device->host copy); of a host tensor it is free.
An in-place op on a host tensor (parameter initialisation before ``model.to("hpu")``, a
CPU-resident optimizer step counter) is host work and is not charged. Ops that create new
tensors are charged whatever their inputs, since a script written for Gaudi computes on
device tensors (a simplification: CPU-side compute on host tensors is charged too).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..api import metrics
from ..device.cost_model import OpCost, charged_nbytes, compile_ns, host_op_time_ns, op_cost, op_time_ns, pcie_ns
from ..device.lazy_graph import OpRecord, graph_op_times
from ..device.memory import HBMModel
from ..device.spec import DeviceSpec
from ..device.timeline import Stream, StepTimes, step_breakdown
from .fallback import FallbackPolicy
from .graph_key import graph_digest, op_signature, output_signature, recipe_name
from .recipe_cache import Recipe, RecipeCache

__all__ = ["Stream", "StepTimes", "GraphInfo", "SimDevice"]

_Tensor = torch.Tensor


@dataclass(frozen=True, slots=True)
class GraphInfo:
    """One launched graph: why it was launched, its ops, its start and device time (ns).

    ``op_times_ns`` is each op's share of ``device_ns`` after fusion, in issue order (for a
    recipe-cache hit the recipe's cached total is charged; the shares are recomputed).
    """

    reason: str
    ops: int
    start_ns: int
    device_ns: int
    op_times_ns: tuple[int, ...] = ()


@dataclass(slots=True)
class _GraphCollective:
    """A lazy collective inside the pending graph, after its first ``position`` ops."""

    position: int
    label: str
    timing: Callable[[int], tuple[int, int, str]]
    serials: tuple[int, ...]
    on_timed: Callable | None


def _latest_end(op: OpRecord, ends: dict[int, int]) -> int:
    """The latest end (ns) in ``ends`` of a storage ``op`` reads or writes; 0 if none."""
    latest = 0
    for serial, _ in op.reads:
        latest = max(latest, ends.get(serial, 0))
    for w in op.writes:
        latest = max(latest, ends.get(w[0], 0))
    return latest


class _StorageRef(weakref.ref):
    """Weak reference to a resident storage: its id, size (HBM bytes) and serial."""

    __slots__ = ("key", "nbytes", "serial")


@dataclass(slots=True)
class _OpInfo:
    """What the device needs to know about one (op, signature), computed once."""

    cost: OpCost
    view: bool
    allocates: bool
    fallback: bool
    dynamic: bool


_FUNC_FLAGS: dict = {}

_aten = torch.ops.aten
FP32_AUTOCAST_OPS = frozenset({
    _aten._softmax, _aten._log_softmax, _aten._softmax_backward_data, _aten._log_softmax_backward_data,
    _aten.nll_loss_forward, _aten.nll_loss_backward, _aten.nll_loss2d_forward, _aten.nll_loss2d_backward,
    _aten.native_layer_norm, _aten.native_layer_norm_backward, _aten.mse_loss, _aten.exp, _aten.log,
    _aten.pow, _aten.rsqrt, _aten.reciprocal, _aten.sum, _aten.mean, _aten.cumsum, _aten.norm,
})
"""Ops an emulated bf16 autocast region still charges in fp32: softmax, losses, norms and
reductions, which Gaudi's and PyTorch's autocast keep in fp32 (their fp32 op lists)."""


_NOT_DEVICE_WORK = frozenset({"profiler", "prim", "c10d"})
"""Op namespaces that are bookkeeping, not device work (``record_function`` markers, the
``prim.device`` queries autograd makes on fake tensors), and ``c10d``: the collectives of a
C++ backend (a "gloo" group beside "hccl") reach the dispatcher as ``c10d`` ops, which are
no compute-stream work; "hccl" records its own collectives on the collective stream."""


def _func_flags(func) -> tuple[bool, bool, bool, bool]:
    """(ignored, is_view, allocates_outputs, dynamic_output_shape) of an op overload, cached."""
    flags = _FUNC_FLAGS.get(func)
    if flags is None:
        ignored = func.namespace in _NOT_DEVICE_WORK
        view = bool(func.is_view)
        aliased = any(r.alias_info is not None for r in func._schema.returns)
        dynamic = torch.Tag.dynamic_output_shape in func.tags
        flags = _FUNC_FLAGS[func] = (ignored, view, not view and not aliased, dynamic)
    return flags


def _out_tensors(out: object) -> list:
    if isinstance(out, _Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, _Tensor)]
    return []


def _dtypes(args: tuple, kwargs: dict, out: object) -> set:
    found = set()
    for a in (*args, *kwargs.values()):
        if isinstance(a, _Tensor):
            found.add(a.dtype)
        elif isinstance(a, (list, tuple)):
            found.update(x.dtype for x in a if isinstance(x, _Tensor))
    found.update(o.dtype for o in _out_tensors(out))
    return found


class SimDevice:
    """One simulated Gaudi card (one per process).

    Args:
        spec: device generation constants.
        lazy: lazy mode (``PT_HPU_LAZY_MODE=1``) accumulates ops into graphs; eager launches
            each op on its own.
        max_compound_ops: launch the pending graph once it holds this many ops
            (``PT_HPU_MAX_COMPOUND_OP_SIZE``; 0 = unlimited).
        recipes: the recipe cache (default: memory only).
        fallback: CPU-fallback policy (default: none beyond the dtypes and ops Gaudi lacks).

    Attributes:
        log: when a list, every event that shapes the timeline is appended to it, in order:
            ``("op", OpRecord)``, ``("view", key)``, ``("launch", reason)``,
            ``("h2d", nbytes)``, ``("host_read", nbytes, serial)``, ``("mark", payload)``
            (see :mod:`hpu_runtime.tools.tracing`, which replays such logs).
    """

    def __init__(self, spec: DeviceSpec, *, lazy: bool = True, max_compound_ops: int = 0,
                 recipes: RecipeCache | None = None, fallback: FallbackPolicy | None = None) -> None:
        self.spec = spec
        self.lazy = lazy
        self.max_compound_ops = max_compound_ops
        self.recipes = recipes if recipes is not None else RecipeCache()
        self.fallback = fallback if fallback is not None else FallbackPolicy()
        self.hbm = HBMModel.from_spec(spec)
        self.host_ns = 0
        self.compute = Stream("compute")
        self.collective = Stream("collective")
        self.pending: list[OpCost] = []
        self._pending_keys: list = []
        self._pending_ops: list[OpRecord] = []
        self._pending_dep_ns = 0  # the pending graph reads a collective output ready then
        self._pending_colls: list[_GraphCollective] = []  # lazy collectives in the pending graph
        self._pending_host_start = 0
        self._resident: dict[int, _StorageRef] = {}
        self._next_serial = 0
        self._ready_after: dict[int, int] = {}  # serial -> end of the collective that writes it
        self._memo: dict = {}
        self._region: str | None = None
        self._capture: list | None = None
        self._op_host_ns = spec.host_op_ns
        self.last_recipe: Recipe | None = None
        self.graphs_launched = 0
        self.ops_recorded = 0
        self.compilations = 0
        self.fp32_as_bf16 = False  # see NOTE [fp32 on the host, bf16 on the device] in amp
        self._fp32_as_bf16_until_mark_step = False
        self._emulated_casts: set[int] = set()  # weights whose casts this region has charged
        self.trace: list | None = None
        self.log: list | None = None
        self.graph_log: list[GraphInfo] | None = None
        self._step_start_ns = 0
        self._step_host_start = 0
        self._in_kernel = 0  # > 0 inside fused_kernel(): the host ops are not charged one by one
        self.lock = threading.RLock()

    # ---- residency and HBM -----------------------------------------------------------------
    def _on_free(self, ref: _StorageRef) -> None:
        if self._resident.get(ref.key) is ref:
            del self._resident[ref.key]
            try:
                self.hbm.free(ref.nbytes)
            except ValueError:  # accounting restarted (reset_device) while the storage lived
                pass

    def _register(self, storage) -> _StorageRef:
        key = id(storage)
        ref = self._resident.get(key)
        if ref is None:
            nbytes = storage.nbytes()
            self.hbm.allocate(nbytes)
            ref = _StorageRef(storage, self._on_free)
            ref.key = key
            ref.nbytes = nbytes
            ref.serial = self._next_serial
            self._next_serial += 1
            self._resident[key] = ref
        return ref

    def is_resident(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage is on the simulated HBM."""
        return id(t.untyped_storage()) in self._resident

    def serial_of(self, t: torch.Tensor) -> int:
        """The serial of ``t``'s resident storage, or -1 if it is not on the simulated HBM."""
        ref = self._resident.get(id(t.untyped_storage()))
        return -1 if ref is None else ref.serial

    def make_resident(self, t: torch.Tensor) -> int:
        """Count ``t``'s storage as on the simulated HBM without charging a copy; its serial."""
        with self.lock:
            return self._register(t.untyped_storage()).serial

    def check_alloc(self, nbytes: int) -> None:
        """Raise :class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` if ``nbytes`` would not fit."""
        self.hbm.check_alloc(nbytes)

    def to_device(self, t: torch.Tensor) -> None:
        """``.to("hpu")`` of ``t``: a PCIe host->device copy unless it is already resident.

        Raises:
            HPUOutOfMemoryError: if the tensor does not fit in the remaining HBM.
        """
        st = t.untyped_storage()
        if id(st) in self._resident:
            return
        with self.lock:
            self._register(st)
            self.charge_h2d(st.nbytes())

    def charge_h2d(self, nbytes: int) -> None:
        """Host time of one host->device copy of ``nbytes`` over PCIe (simulated ns)."""
        with self.lock:
            ns = self.spec.h2d_copy_ns + pcie_ns(self.spec, nbytes)
            self._host_event("H2D copy", ns, {"bytes": nbytes})
            self.host_ns += ns
            if self.log is not None:
                self.log.append(("h2d", nbytes))

    # ---- ops and graphs -----------------------------------------------------------------
    def record(self, func, args: tuple, kwargs: dict, out: object) -> None:
        """Account one dispatched aten op ``func(*args, **kwargs) -> out`` (the bridge's hot path)."""
        if _func_flags(func)[0] or self._in_kernel:
            return
        sig = op_signature(args, kwargs)
        low = self.fp32_as_bf16 and func._overloadpacket not in FP32_AUTOCAST_OPS
        mk = (func, sig, "fp32-as-bf16") if low else (func, sig)
        info = self._memo.get(mk)
        if info is None:
            _, view, allocates, dynamic = _func_flags(func)
            info = _OpInfo(cost=op_cost(self.spec, func, args, kwargs, out, low), view=view,
                           allocates=allocates, dynamic=dynamic,
                           fallback=not view and self.fallback.falls_back(func, _dtypes(args, kwargs, out)))
            if not dynamic:
                self._memo[mk] = info
        if info.dynamic:
            mk = (func, sig, output_signature(out))
        with self.lock:
            if info.view:
                self.append_view(mk)
                return
            if info.fallback:
                self._cpu_fallback(func, args, kwargs, out, info.cost)
                return
            resident = self._resident
            if (not info.allocates and args and isinstance(args[0], _Tensor)
                    and id(args[0].untyped_storage()) not in resident):
                return  # in place on a host tensor (parameter init, a CPU step counter): host work
            if low and info.cost.engine == "MME":
                self._charge_weight_casts(args)
            reads = []
            rg = False  # autograd will record this op: its outputs are activations it may keep
            for a in (*args, *kwargs.values()):
                if isinstance(a, _Tensor):
                    rg = rg or a.requires_grad
                    ref = resident.get(id(a.untyped_storage()))
                    if ref is not None:
                        reads.append((ref.serial, charged_nbytes(a, low) if low else a.nbytes))
                elif isinstance(a, (list, tuple)):
                    for x in a:
                        if isinstance(x, _Tensor):
                            rg = rg or x.requires_grad
                            ref = resident.get(id(x.untyped_storage()))
                            if ref is not None:
                                reads.append((ref.serial, charged_nbytes(x, low) if low else x.nbytes))
            rg = rg and torch.is_grad_enabled()
            writes = []
            for o in _out_tensors(out):
                st = o.untyped_storage()
                ref = self._register(st) if info.allocates else resident.get(id(st))
                writes.append((-1 if ref is None else ref.serial, charged_nbytes(o, low) if low else o.nbytes,
                               info.allocates, rg))
            if self._capture is not None:
                self._capture.append((func, args, kwargs, out, info.allocates))
            self.append_op(OpRecord(mk, info.cost, tuple(reads), tuple(writes)))

    @contextmanager
    def fused_kernel(self, name: str, reads, writes, flops: int):
        """Run the body's tensor ops uncharged and charge them as one fused TPC kernel.

        This is how the ``hpex`` fused optimizers are modelled: the body computes the real
        numerics with torch ops on the host (``torch.optim`` math), and the device sees one op
        (one host-side op cost, one graph-key entry) that reads ``reads`` and writes
        ``writes`` once each, with ``flops`` vector-engine FLOPs (roofline, TPC peak).

        Args:
            name: kernel name in the graph key and trace, e.g. ``"hpex.FusedSGD"``.
            reads: tensors the kernel reads, e.g. params, grads, optimizer state (a callable
                returning them is called after the body, so state created there counts).
            writes: tensors it writes (same rules); new ones become device-resident.
            flops: vector FLOPs of the whole kernel.

        Nothing is charged when no read tensor is device-resident (a host-side optimizer).
        """
        with self.lock:
            self._in_kernel += 1
        try:
            yield
        finally:
            with self.lock:
                self._in_kernel -= 1
        reads = list(reads() if callable(reads) else reads)
        writes = list(writes() if callable(writes) else writes)
        with self.lock:
            resident = self._resident
            if not any(id(t.untyped_storage()) in resident for t in reads):
                return
            rd = tuple((self.serial_of(t), t.nbytes) for t in reads if id(t.untyped_storage()) in resident)
            wr = []
            for t in writes:
                new = id(t.untyped_storage()) not in resident
                wr.append((self._register(t.untyped_storage()).serial, t.nbytes, new, False))
            low = reads[0].dtype in (torch.bfloat16, torch.float16)
            b_in, b_out = sum(n for _, n in rd), sum(w[1] for w in wr)
            cost = OpCost(name=name, engine="TPC", flops=flops, bytes_in=b_in, bytes_out=b_out, low_precision=low,
                          device_ns=op_time_ns(self.spec, "TPC", flops, b_in + b_out, low), compute_ns=0)
            cost.compute_ns = op_time_ns(self.spec, "TPC", flops, 0, low)
            key = (name, tuple((tuple(t.shape), str(t.dtype)) for t in reads))
            self.append_op(OpRecord(key, cost, rd, tuple(wr)))

    def append_view(self, key: object) -> None:
        """A view op: free, but part of the pending graph's key (lazy mode and regions)."""
        if self.lazy or self._region is not None:
            self._pending_keys.append(key)
            if self.log is not None:
                self.log.append(("view", key))

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
            if self._ready_after:
                self._pending_dep_ns = max(self._pending_dep_ns, _latest_end(op, self._ready_after))
            if self.log is not None:
                self.log.append(("op", op))
            self.ops_recorded += 1
            accumulate = self.lazy or self._region is not None
            if not self.pending:
                self._pending_host_start = self.host_ns
            self.host_ns += self._op_host_ns if accumulate else self.spec.eager_op_launch_ns
            self.pending.append(op.cost)
            self._pending_keys.append(op.key)
            self._pending_ops.append(op)
            if not accumulate:
                self._launch("eager", 0)
            elif self.max_compound_ops and self._region is None and len(self.pending) >= self.max_compound_ops:
                self.launch("max_compound_op_size")

    def _cpu_fallback(self, func, args, kwargs, out, cost: OpCost) -> None:
        """The op ran "on the CPU": launch, wait, copy inputs down, run on host, copy back."""
        self.launch("cpu_fallback")
        self._wait_host(self.compute.free_ns)
        spec = self.spec
        ns = (pcie_ns(spec, cost.bytes_in) + host_op_time_ns(spec, cost.flops, cost.bytes_in + cost.bytes_out)
              + pcie_ns(spec, cost.bytes_out))
        name = func._schema.name
        self._host_event(f"CPU fallback {name}", ns, {"bytes_in": cost.bytes_in, "bytes_out": cost.bytes_out})
        self.host_ns += ns
        for o in _out_tensors(out):
            self._register(o.untyped_storage())
        metrics.record_fallback(name)
        self.fallback.emit(func, args, kwargs)

    def _launch(self, reason: str, launch_host_ns: int) -> tuple[int, int] | None:
        n = len(self.pending)
        if n == 0:
            self._pending_keys.clear()
            if self._pending_colls:  # a graph of lazy collectives only
                self.host_ns += launch_host_ns
                return self._run_with_collectives(max(self.host_ns, self._pending_dep_ns), [], reason)
            return None
        if self.log is not None:
            self.log.append(("launch", reason))
        if self._fp32_as_bf16_until_mark_step and reason == "mark_step":
            self._fp32_as_bf16_until_mark_step = self.fp32_as_bf16 = False
        key = tuple(self._pending_keys)
        spec_name = self.spec.name
        digest: list[bytes] = []

        def get_digest() -> bytes:
            if not digest:
                digest.append(graph_digest(spec_name, key))
            return digest[0]

        recipe = self.recipes.lookup(key, digest=get_digest)
        if recipe is None:
            cns = compile_ns(self.spec, n)
            name = recipe_name(get_digest(), n)
            times = graph_op_times(self.spec, self._pending_ops)
            recipe = Recipe(n_ops=n, compile_ns=cns, device_ns=sum(times), meta={"name": name})
            self.recipes.insert(key, recipe, digest=get_digest)
            metrics.record_recipe_cache(False, name)
            metrics.record_compilation(cns)
            self.compilations += 1
            self._host_event(f"compile {name}", cns, {"ops": n, "reason": reason})
            self.host_ns += cns
        else:
            name = recipe.meta.get("name", "recipe")
            metrics.record_recipe_cache(True, name)
            times = None
        if self.trace is not None and self.host_ns > self._pending_host_start and reason != "eager":
            self._host_event(f"build graph[{n} ops]", self.host_ns - self._pending_host_start, {},
                             start=self._pending_host_start)
        self.host_ns += launch_host_ns
        ready = max(self.host_ns, self._pending_dep_ns)
        if self._pending_colls:
            if times is None:
                times = graph_op_times(self.spec, self._pending_ops)
            span = self._run_with_collectives(ready, times, f"{name} ({reason})")
        else:
            span = self.compute.run(ready, recipe.device_ns, f"{name} ({reason})")
        if self.graph_log is not None:
            if times is None:
                times = graph_op_times(self.spec, self._pending_ops)
            self.graph_log.append(GraphInfo(reason, n, span[0], recipe.device_ns, tuple(times)))
        self.graphs_launched += 1
        self.last_recipe = recipe
        self.pending = []
        self._pending_keys = []
        self._pending_ops = []
        self._pending_dep_ns = 0
        if self._ready_after:  # a collective that ended before this graph started binds no later work
            start = span[0]
            self._ready_after = {s: e for s, e in self._ready_after.items() if e > start}
        return span

    def _run_with_collectives(self, ready: int, times: list[int], label: str) -> tuple[int, int]:
        """Run the pending graph with lazy collectives inside it (NOTE [lazy collectives]).

        Each collective becomes ready when the ops issued before it in the graph are done and
        runs on the collective stream; an op of the graph that reads or writes its output
        waits for its end (the compute stream idles meanwhile). Returns the graph's span.
        """
        colls, self._pending_colls = self._pending_colls, []
        start = max(ready, self.compute.free_ns)
        t = seg = start
        done: dict[int, int] = {}
        ops = self._pending_ops
        ci = 0
        for k in range(len(ops) + 1):
            while ci < len(colls) and colls[ci].position <= k:
                c = colls[ci]
                ci += 1
                cstart, cend, algo = c.timing(max(t, self.collective.free_ns))
                self.record_collective(c.label, cstart, cend, serials=c.serials)
                for serial in c.serials:
                    done[serial] = cend
                if c.on_timed is not None:
                    c.on_timed(cstart, cend, algo)
            if k == len(ops):
                break
            op = ops[k]
            if done:
                dep = _latest_end(op, done)
                if dep > t:
                    if t > seg:
                        self.compute.run(seg, t - seg, label)
                    seg = t = dep
            t += times[k]
        if t > seg:
            self.compute.run(seg, t - seg, label)
        self.compute.free_ns = max(self.compute.free_ns, t)
        return start, t

    def add_graph_collective(self, label: str, timing: Callable[[int], tuple[int, int, str]],
                             serials: tuple | list = (), on_timed: Callable | None = None) -> None:
        """A lazy collective (``PT_HPU_ENABLE_LAZY_COLLECTIVES=true``): it joins the pending
        graph instead of launching it; see NOTE [lazy collectives].

        Args:
            label: its name on the collective stream.
            timing: ``timing(ready_ns) -> (start_ns, end_ns, algorithm)`` from the network model.
            serials: storages it writes (later work reading them waits for its end).
            on_timed: called with ``(start_ns, end_ns, algorithm)`` once the graph has run.
        """
        with self.lock:
            if not self.pending:
                self._pending_host_start = self.host_ns
            self._pending_colls.append(_GraphCollective(len(self._pending_ops), label, timing,
                                                        tuple(serials), on_timed))

    def launch(self, reason: str = "mark_step") -> tuple[int, int] | None:
        """Launch the pending graph on the compute stream; returns its (start, end) or None.

        The graph is looked up in the recipe cache by its key; a miss charges a compile on
        the host and counts in ``metric_global("graph_compilation")``. It starts when the
        host has launched it, the compute stream is free and every collective whose output
        it reads has ended.
        """
        with self.lock:
            return self._launch(reason, self.spec.graph_launch_ns)

    def _wait_host(self, until_ns: int) -> None:
        if until_ns > self.host_ns:
            self._host_event("wait", until_ns - self.host_ns, {})
            self.host_ns = until_ns

    def host_read(self, nbytes: int = 0, tensor: torch.Tensor | None = None) -> None:
        """A host read of a device tensor: launch, wait for the compute stream (and for the
        collective that wrote ``tensor``, if any), copy ``nbytes`` down."""
        with self.lock:
            serial = -1 if tensor is None else self.serial_of(tensor)
            self.read_serial(nbytes, serial)

    def read_serial(self, nbytes: int, serial: int = -1) -> None:
        """:meth:`host_read` of the storage ``serial`` (-1: none in particular)."""
        with self.lock:
            if self.log is not None:
                self.log.append(("host_read", nbytes, serial))
            self.launch("host_read")
            self._wait_host(max(self.compute.free_ns, self._ready_after.get(serial, 0)))
            if nbytes:
                ns = self.spec.host_read_ns + pcie_ns(self.spec, nbytes)
                self._host_event("D2H copy", ns, {"bytes": nbytes})
                self.host_ns += ns

    def synchronize(self) -> None:
        """Launch pending work and make the host wait for every stream (``hpu.synchronize()``)."""
        with self.lock:
            self.launch("synchronize")
            self._wait_host(max(self.compute.free_ns, self.collective.free_ns))

    def _charge_weight_casts(self, args: tuple) -> None:
        """Emulated autocast: the casts a faithful region makes of each fp32 weight a matmul
        uses, once per region (autocast caches them): fp32 -> bf16 in forward and the
        gradient bf16 -> fp32 in backward, both charged here, at the first use."""
        for a in args:
            if (isinstance(a, _Tensor) and a.is_leaf and a.requires_grad and a.dtype == torch.float32):
                serial = self._register(a.untyped_storage()).serial
                if serial in self._emulated_casts:
                    continue
                self._emulated_casts.add(serial)
                n = a.numel()
                for name, nin, nout in (("cast fp32->bf16", 4 * n, 2 * n), ("grad cast bf16->fp32", 2 * n, 4 * n)):
                    ns = op_time_ns(self.spec, "TPC", n, nin + nout, True)
                    cost = OpCost(name=f"emulated autocast {name}", engine="TPC", flops=n, bytes_in=nin,
                                  bytes_out=nout, low_precision=True, device_ns=ns,
                                  compute_ns=op_time_ns(self.spec, "TPC", n, 0, True))
                    self.append_op(OpRecord(("emulated cast", name, n), cost))

    def set_fp32_as_bf16(self, entering: bool) -> None:
        """An emulated bf16 autocast region starts (True) or ends (False).

        From the start, fp32 ops are charged as bf16; at the end, charging in bf16 goes on
        through backward (whose ops run in the forward's dtypes) until the next
        ``mark_step`` launch. See NOTE [fp32 on the host, bf16 on the device] in :mod:`hpu_runtime.bridge.autocast`.
        """
        with self.lock:
            if self.log is not None:
                self.log.append(("fp32_as_bf16", entering))
            if entering:
                self.fp32_as_bf16, self._fp32_as_bf16_until_mark_step = True, False
                self._emulated_casts = set()
            elif self.fp32_as_bf16:
                self._fp32_as_bf16_until_mark_step = True

    def mark(self, payload: object) -> None:
        """Put ``payload`` in the event log (a tracer's marker; no simulated cost)."""
        if self.log is not None:
            self.log.append(("mark", payload))

    # ---- regions: torch.compile graphs and HPU graph capture/replay ---------------------------
    @contextmanager
    def compiled_region(self, label: str = "torch.compile"):
        """Ops inside form one recipe with no per-op host cost (a ``torch.compile`` FX graph)."""
        with self.lock:
            self.launch(label)
            prev = self._region
            self.set_region(label)
        try:
            yield
        finally:
            with self.lock:
                self.launch(label)
                self.set_region(prev)

    def set_region(self, label: str | None) -> None:
        """Enter (``label``) or leave (None) a compiled region: ops accumulate with no host cost."""
        with self.lock:
            if self.log is not None:
                self.log.append(("region", label))
            self._region = label
            self._op_host_ns = 0 if label is not None else self.spec.host_op_ns

    def begin_capture(self, ops: list) -> None:
        """Start recording ops into ``ops`` as one HPU graph (see :mod:`hpu_runtime.bridge.hpu_graphs`)."""
        with self.lock:
            if self._capture is not None:
                raise RuntimeError("hpu: an HPU graph capture is already in progress")
            self.launch("hpu_graph_capture")
            self._capture = ops
            self._region = "hpu_graph_capture"

    def end_capture(self) -> Recipe | None:
        """Finish a capture: launch (compile) the captured graph; returns its recipe."""
        with self.lock:
            self.last_recipe = None
            try:
                span = self.launch("hpu_graph_capture")
            finally:
                self._capture = None
                self._region = None
            return self.last_recipe if span is not None else None

    def replay(self, recipe: Recipe | None, label: str = "hpu_graph") -> tuple[int, int]:
        """Replay a captured graph: no per-op host cost, ``graph_replay_ns`` then its device time."""
        with self.lock:
            self.launch("hpu_graph_replay")
            self.host_ns += self.spec.graph_replay_ns
            return self.compute.run(self.host_ns, recipe.device_ns if recipe else 0,
                                    f"{label} replay")

    # ---- collectives ----------------------------------------------------------------------
    def collective_ready_ns(self) -> int:
        """Launch the graph producing a collective's input; when the collective can start."""
        with self.lock:
            self.launch("collective")
            return max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    def record_collective(self, label: str, start_ns: int, end_ns: int,
                          outputs: tuple | list = (), serials: tuple | list = ()) -> None:
        """Occupy the collective stream from ``start_ns`` to ``end_ns``.

        ``outputs`` (tensors, made resident) and ``serials`` (storage serials) are what the
        collective writes: no graph that reads or writes them starts, and no host read of
        them returns, before ``end_ns``, however the caller waits (``Work.wait()``, the
        future, or not at all).
        """
        with self.lock:
            self.collective.run(start_ns, end_ns - start_ns, label)
            self.collective.free_ns = max(self.collective.free_ns, end_ns)
            marks = [self._register(t.untyped_storage()).serial for t in outputs if isinstance(t, _Tensor)]
            for serial in (*marks, *serials):
                if end_ns > self._ready_after.get(serial, 0):
                    self._ready_after[serial] = end_ns

    def stream_wait(self, until_ns: int) -> None:
        """The compute stream waits for an event at ``until_ns`` (e.g. a collective's end)."""
        with self.lock:
            self.compute.free_ns = max(self.compute.free_ns, until_ns)

    # ---- trace ----------------------------------------------------------------------------
    def enable_trace(self) -> None:
        """Keep every host, compute and collective span from now on (for :meth:`trace_events`)."""
        with self.lock:
            if self.trace is None:
                self.trace = []
                self.compute.trace = self.trace
                self.collective.trace = self.trace

    def _host_event(self, label: str, dur_ns: int, args: dict, start: int | None = None) -> None:
        if self.trace is not None and dur_ns > 0:
            self.trace.append(("host", self.host_ns if start is None else start, dur_ns, label, args))

    def trace_events(self, rank: int = 0) -> list:
        """The recorded spans as :class:`~hpu_runtime.api.trace.TraceEvent` of ``rank``."""
        from ..api.trace import TraceEvent

        with self.lock:
            spans = list(self.trace or [])
        return [TraceEvent(rank=rank, stream=s[0], name=s[3], start_ns=s[1], dur_ns=s[2],
                           args=s[4] if len(s) > 4 else {}) for s in spans]

    # ---- steps ----------------------------------------------------------------------------
    def now_ns(self) -> int:
        """The latest point any cursor has reached (simulated ns)."""
        return max(self.host_ns, self.compute.free_ns, self.collective.free_ns)

    def begin_step(self) -> None:
        """Start a step window at the device's current end (see :meth:`end_step`)."""
        with self.lock:
            self._step_start_ns = self.now_ns()
            self._step_host_start = self.host_ns
            self._trim(self._step_start_ns)

    def end_step(self) -> StepTimes:
        """Launch pending work, close the step window and return its breakdown.

        The window ends when every stream has drained; the host does not wait (the next
        step's host work may overlap this step's device work, as on Gaudi).
        """
        with self.lock:
            self.launch("mark_step")
            lo, hi = self._step_start_ns, max(self.compute.free_ns, self.collective.free_ns, self.host_ns)
            times = step_breakdown(self.compute, self.collective, lo, hi, self.host_ns - self._step_host_start)
            self._step_start_ns = hi
            self._step_host_start = self.host_ns
            self._trim(hi)
            return times

    def _trim(self, before_ns: int) -> None:
        for s in (self.compute, self.collective):
            s.intervals = [iv for iv in s.intervals if iv[1] > before_ns]
