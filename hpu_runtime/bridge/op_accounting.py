"""Op accounting: one dispatched aten call becomes an op record of the pending graph.

:meth:`OpAccounting.record` is the bridge's hot path (every aten op of the process goes
through it): it keys the op (:func:`~hpu_runtime.bridge.graph_key.op_signature`), prices it
once per (op, signature) with the roofline cost model, finds the device-resident storages it
reads and makes its outputs resident (NOTE [device residency and HBM] in
:mod:`hpu_runtime.device.residency`), and appends an
:class:`~hpu_runtime.device.lazy_graph.OpRecord` to the pending graph. Also here: ops that
fall back to the CPU, fused kernels (the ``hpex`` optimizers) and the casts an emulated
bf16 autocast region charges (NOTE [fp32 on the host, bf16 on the device] in
:mod:`hpu_runtime.bridge.autocast`).

NOTE [HBM before host]
An op's outputs are checked against the simulated HBM before the host allocates them
(:meth:`OpAccounting.check_outputs`, called by the bridge's hook before the op runs): an
output larger than the free HBM raises
:class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` without touching host memory, even
when its inputs are small (``ones(1).expand(30_000_000_000).contiguous()``, an outer product,
a broadcast). The output size comes from running the op once on ``meta`` tensors (no
storage) the first time an (op, signature) is seen, then from the op's entry (NOTE [an op's
entry, kept by the kernel] in :mod:`hpu_runtime.bridge.dispatch`): the steady-state cost is
one comparison per op. A pointwise op's output shape is its tensor inputs' broadcast
shape, so its memo key leaves float arguments out (Adam's bias corrections are new floats
every step and would otherwise cost a meta run per op per step). Ops without a meta kernel, or whose output shape depends on the
data (``nonzero``), are checked after they ran, when their outputs become resident.

NOTE [an op's storages, in the kernel library]
What an op record says of storages is worked out per call, since it depends on the tensors
and not on the signature: the serial and bytes of each device-resident tensor argument
(registering an hpu storage the bridge has not seen made), the serial, bytes and kept flag of
each device result (registering a new storage, which allocates it on the HBM), and the
arguments autograd keeps for the op's backward (:data:`AUTOGRAD_SAVES`, when an argument
requires grad and grad mode is on). That loop over the op's tensors was the op record's
largest part in Python (about 0.5x plain PyTorch on the digits MLP: a throwaway record without
it gave 2.07x against 2.63x in the same run), so it is ``storage_io`` in the hpu kernel
library (``csrc/hpu_device.cpp``), a builtin function the record calls for live and traced
ops alike (one implementation: fake tensors reach it as real ones do). It reads the residency's
Python dict (``id(t.untyped_storage())`` in :attr:`Residency.refs
<hpu_runtime.device.residency.Residency.refs>`) and registers a new storage in the same library
(``residency_register``: the HBM counters, the serial, the weak reference whose callback frees
it, all without entering Python: NOTE [the HBM counters, in the kernel library] in
:mod:`hpu_runtime.device.memory`).

NOTE [the op record, in the kernel]
Once an op's entry carries its record for the state it is called in (:attr:`OpEntry.fast`:
the graph-key entry and cost worked out in lazy or eager mode, inside or outside a compiled
region, in fp32, for an op the device runs), the hpu kernel
makes the record itself and the after hook is not called (``fast_record`` in
``csrc/hpu_device.cpp``). Under the device's lock it checks that the state still holds (the
accounting of the device :func:`~hpu_runtime.bridge.runtime.get_device` returns, published to
the kernel with its HBM counters, of the same generation, hence of the same mode; inside a
compiled region if and only if the record was made there; no fused kernel's body, no capture,
no bf16 emulation), that every Python number the op puts on the device is there already, and
that every number that is a constant of the record's graph-key entry is the one the record was
made with (its pins: eager mode's Scalar arguments such as ``add``'s ``alpha``, every number
inside a compiled region; the calls that share an entry may pass others, NOTE [an op's entry,
kept by the kernel] in :mod:`.dispatch`). Then it makes what :meth:`OpAccounting.record` makes:
a view's graph-key entry (lazy mode, outside compiled regions), or the storages (the code of
``storage_io``, reading the tensors from the kernel's own arguments and results by the rules
Python sees them by: a wrapped number is a number, one result's list counts, several results'
lists do not), an :class:`~hpu_runtime.device.lazy_graph.OpRecord`, and its place in the
pending graph (the library's ``launcher_append``, which
:meth:`~hpu_runtime.bridge.launcher.Launcher.append_op` calls as well; the record is kept there
as plain values and made when something reads it, NOTE [records made when read] in
:mod:`hpu_runtime.bridge.launcher`). In eager mode outside
regions the op is then launched at once, as ``append_op`` does: by the library itself
(``eager_launch``) when the launch touches nothing but the recipe cache's memory, its metric
and the compute stream (a recipe already compiled; no new scalar to copy, no lazy collective,
no event log, graph log or trace), a twin of
:meth:`~hpu_runtime.bridge.launcher.Launcher.launch` for that case, else by that method. The
hit itself is counted there too, by twins of :meth:`RecipeCache.memory_hit
<hpu_runtime.bridge.recipe_cache.RecipeCache.memory_hit>` and of
:func:`~hpu_runtime.api.metrics.record_recipe_cache` (each under its object's lock, taken without
waiting: while another thread holds it the launch goes to ``Launcher.launch``, or the metric to
its function, which wait). The two Python calls they replace were about 1.5 us of the 11-14 us an
eager op cost over plain PyTorch on a 2-core VM (``x.add_(y)`` on a 128 x 64 tensor). It
reads and writes the pending graph's, the card's and the accounting's state in their instance
dicts, having checked when the device was published that their classes define none of those
names (a property would be bypassed: such a device is refused with a TypeError). Anything else
(a new entry, a record made on the other side of a compiled region's boundary, other numbers
than its pins, as Adam's step size in ``addcdiv_`` each step, a capture, an error while reading
the storages) goes to the after hook, which records as it always did and leaves the entry's
record for the next call. A number new to the device at a scalar input (Adam's two bias
corrections each step, in lazy mode) joins the scalar cache in the kernel, a twin of
:meth:`OpAccounting._scalar_to_device` (the cache emptied at the same ``_MEMO_LIMIT``, which
the kernel reads when the device is published);
:func:`~hpu_runtime.bridge.runtime.python_hooks_only` sends every op there.
``tests/unit/test_bridge_in_kernel.py`` checks a training step's events, timeline and
parameters against the after hook's alone, in lazy, eager and compile mode.

Not thread-safe on its own: the facade (:class:`~hpu_runtime.bridge.sim_device.SimDevice`)
hands it its lock, which every method here takes around the parts it touches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..api import metrics
from ..device.card import Card
from ..device.cost_model import OpCost, host_op_time_ns, op_cost, op_time_ns, pcie_ns
from ..device.lazy_graph import OpRecord
from ..device.residency import Residency
from ..device.spec import DeviceSpec
from .fallback import FallbackPolicy
from .graph_key import SCALAR_INPUT, op_signature, output_signature
from .launcher import Launcher
from .unrecorded import unrecorded

__all__ = ["AUTOGRAD_SAVES", "FP32_AUTOCAST_OPS", "TRANSFER_OPS", "OpAccounting", "OpEntry", "OpFacts", "OpInfo",
           "op_facts"]

_Tensor = torch.Tensor
_aten = torch.ops.aten

FP32_AUTOCAST_OPS = frozenset({
    _aten._softmax, _aten._log_softmax, _aten._softmax_backward_data, _aten._log_softmax_backward_data,
    _aten.nll_loss_forward, _aten.nll_loss_backward, _aten.nll_loss2d_forward, _aten.nll_loss2d_backward,
    _aten.native_layer_norm, _aten.native_layer_norm_backward, _aten.mse_loss, _aten.exp, _aten.log,
    _aten.pow, _aten.rsqrt, _aten.reciprocal, _aten.sum, _aten.mean, _aten.cumsum, _aten.norm,
})
"""Ops an emulated bf16 autocast region still charges in fp32: softmax, losses, norms and
reductions, which Gaudi's and PyTorch's autocast keep in fp32 (their fp32 op lists)."""

_ALL = "all"
_NONE = ()
AUTOGRAD_SAVES: dict = {
    **{op: (_NONE, _NONE) for op in (
        _aten.add, _aten.sub, _aten.add_, _aten.sub_, _aten.neg, _aten._to_copy, _aten.clone, _aten.copy_,
        _aten.cat, _aten.sum, _aten.mean, _aten.zeros_like, _aten.ones_like, _aten.empty_like, _aten.fill_,
        _aten.bernoulli_, _aten.expand, _aten.repeat, _aten.stack)},
    **{op: (_NONE, (0,)) for op in (
        _aten.relu, _aten.relu_, _aten._softmax, _aten._log_softmax, _aten.tanh, _aten.sigmoid, _aten.exp,
        _aten.rsqrt, _aten.sqrt)},
    **{op: ((0,), _NONE) for op in (_aten.gelu, _aten.silu, _aten.pow, _aten.log, _aten.threshold_backward)},
    _aten.native_dropout: (_NONE, (1,)),
    _aten.native_layer_norm: ((0, 1), (1, 2)),
    _aten.native_batch_norm: ((0, 1, 3, 4), (1, 2)),
    _aten.max_pool2d_with_indices: ((0,), (1,)),
    _aten.mul: ("mul", _NONE),
    _aten.mul_: ("mul", _NONE),
    _aten.div: ("div", _NONE),
    _aten.div_: ("div", _NONE),
}
"""What autograd keeps for the backward of the common ops, from PyTorch's
``tools/autograd/derivatives.yaml``: ``(arguments, results)``, each a tuple of positions
(of the op's tensor arguments; of its tensor results), or ``"mul"`` / ``"div"`` (each factor
is kept if the other requires grad; a divisor if the dividend does). Ops not listed count
as keeping every argument and result (NOTE [fusion inside a graph, deterministic] in
:mod:`hpu_runtime.device.lazy_graph`)."""

_NOT_DEVICE_WORK = frozenset({"profiler", "prim", "c10d"})
"""Op namespaces that are bookkeeping, not device work (``record_function`` markers, the
``prim.device`` queries autograd makes on fake tensors), and ``c10d``: the collectives of a
C++ backend (a "gloo" group beside "hccl") reach the dispatcher as ``c10d`` ops, which are
no compute-stream work; "hccl" records its own collectives on the collective stream."""

_HOST_DECISIONS = frozenset({_aten._fused_sdp_choice})
"""Aten ops that only decide on the host and return a number, never device work:
``_fused_sdp_choice`` (which attention kernel ``scaled_dot_product_attention`` runs; called only
where no dispatch mode is on, as on a Gaudi)."""

TRANSFER_OPS = frozenset({_aten._to_copy.default, _aten.copy_.default, _aten.lift_fresh.default,
                          _aten._local_scalar_dense.default})
"""The ops that may copy between host and device (NOTE [the bridge over hpu tensors] in
:mod:`hpu_runtime.bridge.dispatch`): which they do depends on their tensors' devices."""


@dataclass(frozen=True, slots=True)
class OpFacts:
    """What the bridge needs to know about one op overload, whatever its arguments."""

    func: object
    """The ``torch._ops.OpOverload``."""
    name: str
    """``"aten.addmm.default"``: the op's entry in graph keys (a string hashes in C; an
    OpOverload's ``__hash__`` is Python code)."""
    ignored: bool
    """Bookkeeping, not device work (:data:`_NOT_DEVICE_WORK`)."""
    view: bool
    allocates: bool
    """Its outputs are new storages (not a view, not in place, not ``out=``)."""
    dynamic: bool
    """Its output shape depends on the data (``nonzero``)."""
    pointwise: bool
    """Tagged pointwise: its output shape is its tensor inputs' broadcast shape, whatever its
    scalars (NOTE [HBM before host])."""
    keeps_fp32: bool
    """In :data:`FP32_AUTOCAST_OPS`."""
    saves: tuple
    """What autograd keeps for its backward: its :data:`AUTOGRAD_SAVES` entry."""
    scalar_inputs: tuple
    """``(position, name, unit_is_constant)`` of every argument where a Python number is a
    graph input, not a constant (NOTE [scalars as graph inputs]); empty for most ops."""
    wrapped_inputs: tuple
    """The entries of :attr:`scalar_inputs` that are wrapped numbers (a Python number where the
    op takes a tensor): the only ones the eager bridge makes device tensors (NOTE [scalars as
    graph inputs])."""
    transfer: bool
    """In :data:`TRANSFER_OPS`."""


_SCALARS_AS_INPUTS: dict[str, tuple[tuple[str, bool], ...]] = {
    **{name: (("alpha", True),) for name in ("add.Tensor", "add_.Tensor", "add.out")},
    "add_.Scalar": (("other", False),),
    **{name: (("value", True),) for name in ("addcdiv", "addcdiv_", "addcdiv.out", "addcmul", "addcmul_",
                                             "addcmul.out")},
    **{f"{name}.Scalar": (("other", False),) for name in ("div", "eq", "ne", "lt", "le", "gt", "ge")},
}
"""Scalar-typed arguments the lazy bridge turns into device tensors (NOTE [scalars as graph
inputs]): ``name -> ((argument, unit_is_constant), ...)``; ``unit_is_constant``: a value of 1
stays a constant (the bridge adds no tensor for it)."""

_NUMBERS = (int, float, bool)


def _scalar_inputs(func, wrapped_only: bool = False) -> tuple:
    """The :attr:`OpFacts.scalar_inputs` of an op overload, from its schema (``wrapped_only``:
    its :attr:`OpFacts.wrapped_inputs`)."""
    schema = func._schema
    name = schema.name.split("::", 1)[-1] + (f".{schema.overload_name}" if schema.overload_name else "")
    named = {} if wrapped_only else dict(_SCALARS_AS_INPUTS.get(name, ()))
    out = []
    for i, a in enumerate(schema.arguments):
        t = a.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if i > 0 and isinstance(t, torch.TensorType):  # a Python number here is a wrapped number
            out.append((i, a.name, False))
        elif a.name in named:
            out.append((i, a.name, named[a.name]))
    return tuple(out)


_FACTS: dict[int, OpFacts] = {}


def op_facts(func) -> OpFacts:
    """The :class:`OpFacts` of an op overload, computed once (looked up by ``id``: op
    overloads live as long as the process; a dead one's id is caught by the identity check)."""
    facts = _FACTS.get(id(func))
    if facts is None or facts.func is not func:
        view = bool(func.is_view) or func._overloadpacket is _aten._unsafe_view  # a view autograd does not track
        aliased = any(r.alias_info is not None for r in func._schema.returns)
        facts = _FACTS[id(func)] = OpFacts(
            func=func, name=str(func), view=view,
            ignored=func.namespace in _NOT_DEVICE_WORK or func._overloadpacket in _HOST_DECISIONS,
            allocates=not view and not aliased, dynamic=torch.Tag.dynamic_output_shape in func.tags,
            pointwise=torch.Tag.pointwise in func.tags, keeps_fp32=func._overloadpacket in FP32_AUTOCAST_OPS,
            saves=AUTOGRAD_SAVES.get(func._overloadpacket, (_ALL, _ALL)), scalar_inputs=_scalar_inputs(func),
            wrapped_inputs=_scalar_inputs(func, wrapped_only=True), transfer=func in TRANSFER_OPS)
    return facts


_GENERATIONS = itertools.count()
"""Hands each :class:`OpAccounting` a number of its own, for :attr:`OpEntry.gen`."""


class OpEntry:
    """One op overload called with one signature: what the bridge computes for it once and
    reuses at every later call with the same signature (NOTE [an op's entry, kept by the
    kernel] in :mod:`hpu_runtime.bridge.dispatch`). Made by :meth:`OpAccounting.entry`.

    Attributes:
        facts: the op's :class:`OpFacts`.
        sig: the signature (:func:`~hpu_runtime.bridge.graph_key.op_signature`) of the call that
            made it; the calls that share it may differ from it in the Python numbers at
            ``value_free`` positions (then ``varies``).
        value_free: the argument positions where the kernel's words keep a Python number's type
            and whether it is 1, not its value: the op's scalar inputs (:attr:`OpFacts.scalar_inputs`,
            NOTE [scalars as graph inputs]), whose values lazy mode puts on the device as graph
            inputs rather than in the graph key.
        varies: the call that made it has a Python number at a ``value_free`` position that is
            not a unit's 1, so the calls sharing it may differ there (Adam's bias corrections: a
            new value every step, one entry): its graph-key entry is reused only where every such
            number is a graph input (lazy mode), and the numbers it puts on the device are read
            from each call.
        factory_nbytes: bytes a factory with ``device="hpu"`` allocates, checked against the
            HBM before it runs; None: not such a factory, or a size not known before.
        out_nbytes: bytes its outputs allocate, checked against the HBM before it runs (0: not
            checked before it runs, NOTE [HBM before host]); None until first needed.
        before: the before hook has something to do for it (False once ``out_nbytes`` is 0 for
            an entry with no ``factory_nbytes`` whose op is no transfer: a view, an in-place op;
            a transfer's entry is never reused, since whether it copies between host and device
            depends on its tensors' devices, which a signature leaves out); the kernel then
            hands the entry straight to the after hook.
        kernel_nbytes: ``out_nbytes`` when comparing them with the free HBM is all the before hook
            would do (no transfer, no factory size, some output bytes): the kernel compares them
            itself and calls the before hook only when they do not fit, which then raises; None
            otherwise.
        gen: the :class:`OpAccounting` (its number) that computed ``mk``, ``info`` and
            ``scalars`` for the scalar inputs ``inputs`` (an :class:`OpFacts` tuple) and the
            precision ``low``; -1: none yet.
        mk: its graph-key entry; info: its :class:`OpInfo`; scalars: the Python numbers it puts
            on the device (NOTE [scalars as graph inputs]).
        fast: what the hpu kernel needs to make its op record itself (NOTE [the op record, in the
            kernel]): ``(gen, view, allocates, mk, cost, saves_in, saves_out, scalar_at,
            in_region, pins)``, made with a graph-key entry in fp32, for an op the device runs
            (no CPU fallback, no data-dependent shape); None otherwise. The kernel uses it outside
            HPU-graph captures only. ``scalar_at``: the scalar inputs whose numbers the kernel reads at each
            call to check that they are on the device (the graph inputs, when ``varies``), else
            empty; ``in_region``: it was made inside a compiled region (the kernel uses it only
            on the same side); ``pins``: ``((position, number), ...)``, the numbers that are
            constants of the record's graph-key entry where the calls sharing the entry may
            pass others (eager mode's Scalar arguments, every number inside a region:
            :func:`_pinned`), which the kernel requires a call to pass for the record to hold.
        shared_fast: ``fast`` as made with ``mk`` (no pins), which ``fast`` returns to when a
            call made a record with pins and the next one shares ``mk`` again; remade for the
            other side of a compiled region's (or a capture's) boundary when ``mk`` is the same
            there (lazy mode; eager ops without wrapped numbers).
    """

    __slots__ = ("facts", "sig", "value_free", "varies", "factory_nbytes", "out_nbytes", "before", "kernel_nbytes",
                 "gen", "inputs", "low", "mk", "info", "scalars", "fast", "shared_fast")

    def __init__(self, facts: OpFacts, sig: tuple, factory_nbytes: int | None = None, varies: bool = False) -> None:
        self.facts = facts
        self.sig = sig
        self.value_free = tuple(i for i, _, _ in facts.scalar_inputs)
        self.varies = varies
        self.factory_nbytes = factory_nbytes
        self.out_nbytes: int | None = None
        self.before = True
        self.kernel_nbytes: int | None = None
        self.gen = -1
        self.inputs = self.low = self.mk = self.info = self.scalars = self.fast = self.shared_fast = None


_FLOAT = float  # stands for any float argument in a cost key
_MEMO_LIMIT = 1 << 16


def _cost_key(facts: OpFacts, sig: tuple, out: object, low: bool) -> tuple:
    """A key for an op's cost that leaves out float arguments (a learning rate, Adam's bias
    corrections: new values every step, same cost) but keeps the output shapes (an
    ``arange`` with float bounds)."""
    return (facts.name, low, output_signature(out), _without_floats(sig))


def _without_floats(sig: tuple) -> tuple:
    """``sig`` with every float argument (also inside a tuple argument) replaced by :data:`_FLOAT`."""
    return tuple(_FLOAT if type(x) is float else
                 tuple(_FLOAT if type(y) is float else y for y in x) if type(x) is tuple else x for x in sig)


def _pinned(scalar_inputs: tuple, inputs: tuple, args: tuple, kwargs: dict) -> tuple:
    """``((position, number), ...)``: the Python numbers a call passes at the scalar inputs that
    are not graph inputs in this state (``inputs``), so constants of its graph-key entry: an
    :attr:`OpEntry.fast` record made from it holds for the calls that pass the same numbers
    there (NOTE [the op record, in the kernel])."""
    n, out = len(args), []
    for at in scalar_inputs:
        if at in inputs:
            continue
        i, name, _ = at
        v = args[i] if i < n else kwargs.get(name) if kwargs else None
        if type(v) in _NUMBERS:
            out.append((i, v))
    return tuple(out)


_OUT_BYTES_LIMIT = 100_000
_META = torch.device("meta")


def _meta_output_bytes(func, args: tuple, kwargs: dict) -> int:
    """Bytes of storage ``func``'s outputs allocate, from a run on ``meta`` tensors (no data,
    no host memory); 0 when it cannot tell (no meta kernel, or one that needs the data)."""
    def meta(x):
        if isinstance(x, _Tensor):
            return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_META)
        if isinstance(x, (list, tuple)):
            return type(x)(meta(y) for y in x)
        return x

    try:
        out = func(*[meta(a) for a in args],
                   **{k: _META if k == "device" else meta(v) for k, v in kwargs.items()})
        return sum(o.untyped_storage().nbytes() for o in out_tensors(out))
    except Exception:  # noqa: BLE001 - checked after the op instead (NOTE [HBM before host])
        return 0


@dataclass(slots=True)
class OpInfo:
    """What the device needs to know about one (op, signature), computed once."""

    cost: OpCost
    view: bool
    allocates: bool
    fallback: bool
    dynamic: bool


def out_tensors(out: object) -> list:
    """The tensors among an op's outputs."""
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
    found.update(o.dtype for o in out_tensors(out))
    return found


_STORAGE_IO = None


def _storage_io():
    """The kernel library's ``storage_io`` (NOTE [an op's storages, in the kernel library]),
    loaded once: ``storage_io(state, args, kwargs, out, allocates, low, saves_in, saves_out) ->
    (reads, writes, saves)``, or None when the op reads and writes nothing on the device.
    ``state``: :attr:`Residency.state <hpu_runtime.device.residency.Residency.state>`; ``args``
    a tuple, ``kwargs`` a dict or None; ``allocates``: the results are new storages (registered
    with the residency); ``low``: fp32 counts 2 bytes an element; ``saves_in``/``saves_out``: the
    op's :data:`AUTOGRAD_SAVES` entry. ``reads``: ``(serial, bytes)`` per resident tensor argument
    (an hpu storage not resident yet is registered); ``writes``:
    :data:`~hpu_runtime.device.lazy_graph.Write` per device result; ``saves``: serials of the
    arguments autograd keeps.

    Raises (from the function):
        TypeError: ``args`` not a tuple, ``kwargs`` neither a dict nor None, a malformed state.
        NotImplementedError: a tensor without storage.
        HPUOutOfMemoryError: a new result does not fit in the HBM.
    """
    global _STORAGE_IO
    if _STORAGE_IO is None:
        from .device_type import builtins

        _STORAGE_IO = builtins()["storage_io"]
    return _STORAGE_IO


class OpAccounting:
    """Turns dispatched aten calls into op records on one card.

    Args:
        spec: the device (roofline rates).
        residency: the card's resident storages.
        card: the card's clocks (CPU fallbacks charge host time).
        launcher: the pending graph the records join.
        fallback: which ops run on the CPU.
        lock: the facade's reentrant lock, a ``DeviceLock`` of the kernel library, which the
            kernel takes in place (publishing a device with another lock raises TypeError).

    Attributes:
        fp32_as_bf16: inside an emulated bf16 autocast region (or the backward after it),
            fp32 ops are charged as bf16.
    """

    def __init__(self, spec: DeviceSpec, residency: Residency, card: Card, launcher: Launcher,
                 fallback: FallbackPolicy, lock) -> None:
        self.spec = spec
        self._scalars: set = set()  # (type, value) of the scalars already on the device (NOTE [scalars as graph inputs])
        self.residency = residency
        self.card = card
        self.launcher = launcher
        self.fallback = fallback
        self.lock = lock
        self.fp32_as_bf16 = False  # see NOTE [fp32 on the host, bf16 on the device] in autocast
        self._fp32_as_bf16_until_mark_step = False
        self._emulated_casts: set[int] = set()  # weights whose casts this region has charged
        self._memo: dict = {}  # graph-key entry -> OpInfo
        self._costs: dict = {}  # cost key (float arguments left out) -> OpInfo
        self._out_bytes: dict = {}  # (op, signature) -> bytes its outputs allocate (NOTE [HBM before host])
        self._in_kernel = 0  # > 0 inside fused_kernel(): the host ops are not charged one by one
        self.gen = next(_GENERATIONS)  # this accounting's number (OpEntry.gen)

    def entry(self, func, args: tuple, kwargs: dict, factory_nbytes: int | None = None) -> OpEntry:
        """A new :class:`OpEntry` for ``func`` called with these arguments; ``factory_nbytes``:
        bytes it allocates if it is a factory with ``device="hpu"``."""
        facts = _FACTS.get(id(func))
        if facts is None or facts.func is not func:
            facts = op_facts(func)
        sig = op_signature(args, kwargs)
        varies = bool(facts.scalar_inputs) and bool(self._scalars_as_inputs(facts.scalar_inputs, sig, args, kwargs)[1])
        return OpEntry(facts, sig, factory_nbytes, varies)

    def check_outputs(self, func, args: tuple, kwargs: dict, entry: OpEntry) -> OpEntry:
        """Before ``func`` runs: raise if a factory's size or its outputs would not fit in the
        free HBM (NOTE [HBM before host]); returns ``entry`` (its :meth:`entry`) for :meth:`record`.

        Raises:
            HPUOutOfMemoryError: the outputs would not fit; nothing was allocated.
        """
        hbm = self.residency.hbm
        nbytes = entry.factory_nbytes
        if nbytes is not None and nbytes > hbm.free_bytes:
            hbm.check_alloc(nbytes)  # raises (under the HBM's lock)
        if self._in_kernel:
            return entry
        nbytes = entry.out_nbytes
        if nbytes is None:
            nbytes = entry.out_nbytes = self._output_bytes(entry, args, kwargs)
            checks_more = entry.facts.transfer or entry.factory_nbytes is not None
            entry.before = bool(nbytes) or checks_more
            entry.kernel_nbytes = nbytes if nbytes and not checks_more else None
        if nbytes > hbm.free_bytes:
            hbm.check_alloc(nbytes)  # raises (under the HBM's lock)
        return entry

    def _output_bytes(self, entry: OpEntry, args: tuple, kwargs: dict) -> int:
        """:attr:`OpEntry.out_nbytes`: from a run on meta tensors, memoized by (op, signature);
        0 for ops not checked before they run."""
        facts = entry.facts
        if facts.ignored or not facts.allocates or facts.dynamic:
            return 0
        sig = entry.sig
        # a pointwise op's output size depends on no scalar: Adam's new floats every step reuse it
        key = (facts.name, _without_floats(sig) if facts.pointwise else sig)
        nbytes = self._out_bytes.get(key)
        if nbytes is None:
            if len(self._out_bytes) >= _OUT_BYTES_LIMIT:
                self._out_bytes.clear()
            nbytes = self._out_bytes[key] = _meta_output_bytes(facts.func, args, kwargs)
        return nbytes

    def record(self, func, args: tuple, kwargs: dict, out: object, entry: OpEntry) -> None:
        """Account one dispatched aten op ``func(*args, **kwargs) -> out`` (the hot path; see
        NOTE [the bridge's hot path] in :mod:`hpu_runtime.bridge.dispatch`); ``entry``: its
        :meth:`entry`, as :meth:`check_outputs` returned it."""
        facts = entry.facts
        if facts.ignored or self._in_kernel:
            return
        launcher = self.launcher
        inputs = facts.scalar_inputs if launcher.lazy else facts.wrapped_inputs if launcher.region is None else ()
        low = self.fp32_as_bf16 and not facts.keeps_fp32
        if entry.gen == self.gen and entry.inputs is inputs and entry.low is low:
            mk, info, scalars = entry.mk, entry.info, entry.scalars
            fast = entry.shared_fast  # (a record with pins, or made on the other side of a boundary: not now)
            in_region = launcher.region is not None
            if fast is not None and fast[8] is not in_region:  # the same key on this side of the boundary
                fast = entry.shared_fast = self._kernel_record(entry, mk, info, inputs, in_region, ())
            if entry.fast is not fast:
                entry.fast = fast
            if entry.varies:  # this call's own numbers (its graph-key entry is theirs too)
                scalars = self._scalars_as_inputs(inputs, entry.sig, args, kwargs)[1]
        else:
            # every number at a value_free position a graph input: the graph-key entry is the
            # same for every call that shares the entry (NOTE [an op's entry, kept by the kernel])
            shared = not entry.varies or len(inputs) == len(facts.scalar_inputs)
            sig, scalars = entry.sig if shared else op_signature(args, kwargs), ()
            if inputs:  # NOTE [scalars as graph inputs]: lazy mode, and eager ops outside compiled regions
                sig, scalars = self._scalars_as_inputs(inputs, sig, args, kwargs)
            mk = (facts.name, sig, "fp32-as-bf16") if low else (facts.name, sig)
            info = self._memo.get(mk)
            if info is None:
                info = self._op_info(facts, mk, args, kwargs, out, low)
            if not facts.dynamic:  # (a dynamic op's cost depends on its outputs' shapes too)
                in_region = launcher.region is not None
                if shared:
                    entry.gen, entry.inputs, entry.low, entry.mk, entry.info, entry.scalars = (
                        self.gen, inputs, low, mk, info, scalars)
                    entry.fast = entry.shared_fast = (
                        self._kernel_record(entry, mk, info, inputs, in_region, ()) if not low else None)
                else:  # numbers that are constants of this key: it holds for calls with them
                    entry.fast = (self._kernel_record(entry, mk, info, inputs, in_region,
                                                      _pinned(facts.scalar_inputs, inputs, args, kwargs))
                                  if not low else None)
        if info.dynamic:
            mk = (*mk[:2], output_signature(out))
        with self.lock:
            first = args[0] if args else None
            on_host = isinstance(first, _Tensor) and first.is_cpu  # NOTE [device residency and HBM]
            if info.view:
                if not on_host:
                    self.launcher.append_view(mk)
                return
            if not info.allocates and on_host:
                return  # in place on a host tensor (parameter init, a CPU step counter): host work
            io = (_STORAGE_IO or _storage_io())(self.residency.state, args, kwargs or None, out, info.allocates, low,
                                                *facts.saves)
            if io is None:
                return  # host work: nothing on the device read or written
            reads, writes, saves = io
            for v in scalars:
                self._scalar_to_device(v)
            if info.fallback:
                self._cpu_fallback(func, args, kwargs, out, info.cost)
                return
            if low and info.cost.engine == "MME":
                self._charge_weight_casts(args)
            if launcher.capture is not None:
                launcher.capture.append((func, args, kwargs, out, info.allocates))
            launcher.append_op(OpRecord(mk, info.cost, reads, writes, saves))

    def _kernel_record(self, entry: OpEntry, mk: tuple, info: OpInfo, inputs: tuple, in_region: bool,
                       pins: tuple) -> tuple | None:
        """:attr:`OpEntry.fast` for the graph-key entry ``mk`` made now (NOTE [the op record, in
        the kernel]): None for an op the device does not run (a CPU fallback); the numbers the
        kernel checks on the device are the graph inputs of this state (those of a call whose
        numbers vary; ``pins`` holds the others). ``inputs``: the positions of the numbers that
        are graph inputs on this side of a compiled region's boundary. In an HPU-graph capture the
        kernel leaves every op to the after hook, and the record serves after it."""
        if info.fallback:
            return None
        return (self.gen, info.view, info.allocates, mk, info.cost, *entry.facts.saves,
                inputs if entry.varies else (), in_region, pins)

    def _scalars_as_inputs(self, inputs: tuple, sig: tuple, args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
        """``(sig, values)``: ``sig`` with each Python number that the lazy bridge makes a graph
        input replaced by :data:`~hpu_runtime.bridge.graph_key.SCALAR_INPUT` (NOTE [scalars as
        graph inputs] in :mod:`hpu_runtime.bridge.graph_key`), and those numbers (the caller
        puts them on the device if the op is device work: :meth:`_scalar_to_device`)."""
        out, values = None, []
        n = len(args)
        # a keyword argument's entry in sig: after the positional ones, among the non-None keywords
        at_kw = {k: n + j for j, k in enumerate(k for k, v in kwargs.items() if v is not None)} if kwargs else {}
        for i, name, unit in inputs:
            if i < n:
                v, at = args[i], i
            elif name in at_kw:
                v, at = kwargs[name], at_kw[name]
            else:
                continue
            if type(v) in _NUMBERS and not (unit and v == 1):
                out = list(sig) if out is None else out
                out[at] = SCALAR_INPUT if at < n else (name, SCALAR_INPUT)
                values.append(v)
        return (sig, ()) if out is None else (tuple(out), tuple(values))

    def _scalar_to_device(self, value) -> None:
        """The bridge's scalar cache: a value's first use joins the pending graph's batch of
        scalars, copied host->device at its launch (:attr:`Launcher.new_scalars`); later uses
        find it on the device. The hpu kernel has a twin (``scalars_to_device`` in
        ``csrc/hpu_device.cpp``) for the ops it records itself: change both together."""
        key = (type(value), value)
        if key not in self._scalars:
            if len(self._scalars) >= _MEMO_LIMIT:
                self._scalars.clear()
            self._scalars.add(key)
            self.launcher.new_scalars += 1

    def _op_info(self, facts: OpFacts, mk: tuple, args: tuple, kwargs: dict, out: object, low: bool) -> OpInfo:
        """The :class:`OpInfo` of a graph-key entry not seen yet (priced once per cost key)."""
        ck = _cost_key(facts, mk[1], out, low)
        info = self._costs.get(ck)
        if info is None:
            func = facts.func
            info = self._costs[ck] = OpInfo(
                cost=op_cost(self.spec, func, args, kwargs, out, low), view=facts.view,
                allocates=facts.allocates, dynamic=facts.dynamic,
                fallback=not facts.view and self.fallback.falls_back(func, _dtypes(args, kwargs, out)))
        if not facts.dynamic:
            if len(self._memo) >= _MEMO_LIMIT:  # new float constants every step (Adam) must not pile up
                self._memo.clear()
            self._memo[mk] = info
        return info

    def _cpu_fallback(self, func, args, kwargs, out, cost: OpCost) -> None:
        """The op ran "on the CPU": launch, wait, copy inputs down, run on host, copy back."""
        self.launcher.launch("cpu_fallback")
        card, spec = self.card, self.spec
        card.wait_host(card.compute.free_ns)
        ns = (pcie_ns(spec, cost.bytes_in) + host_op_time_ns(spec, cost.flops, cost.bytes_in + cost.bytes_out)
              + pcie_ns(spec, cost.bytes_out))
        name = func._schema.name
        card.spend_host(f"CPU fallback {name}", ns, {"bytes_in": cost.bytes_in, "bytes_out": cost.bytes_out})
        for o in out_tensors(out):
            self.residency.register(o.untyped_storage())
        metrics.record_fallback(name)
        self.fallback.emit(func, args, kwargs)

    @contextmanager
    def uncharged(self) -> Iterator[None]:
        """Run the body's tensor ops without charging them (numerics only), unrecorded by a
        profiler (NOTE [the emulator's own work is not the user's profile] in
        :mod:`hpu_runtime.bridge.dispatch`)."""
        with self.lock:
            self._in_kernel += 1
        try:
            with unrecorded():
                yield
        finally:
            with self.lock:
                self._in_kernel -= 1

    @contextmanager
    def fused_kernel(self, name: str, reads, writes, flops: int) -> Iterator[None]:
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
        with self.uncharged():
            yield
        reads = list(reads() if callable(reads) else reads)
        writes = list(writes() if callable(writes) else writes)
        with self.lock:
            residency = self.residency
            resident = residency.refs
            if not any(id(t.untyped_storage()) in resident for t in reads):
                return
            rd = tuple((residency.serial_of(t), t.nbytes) for t in reads if id(t.untyped_storage()) in resident)
            wr = []
            for t in writes:
                new = id(t.untyped_storage()) not in resident
                wr.append((residency.register(t.untyped_storage()).serial, t.nbytes, new, False))
            low = reads[0].dtype in (torch.bfloat16, torch.float16)
            b_in, b_out = sum(n for _, n in rd), sum(w[1] for w in wr)
            cost = OpCost(name=name, engine="TPC", flops=flops, bytes_in=b_in, bytes_out=b_out, low_precision=low,
                          device_ns=op_time_ns(self.spec, "TPC", flops, b_in + b_out, low),
                          compute_ns=op_time_ns(self.spec, "TPC", flops, 0, low), op_class="fused_optimizer")
            key = (name, tuple((tuple(t.shape), str(t.dtype)) for t in reads))
            self.launcher.append_op(OpRecord(key, cost, rd, tuple(wr)))

    # ---- emulated autocast (PT_HPU_AUTOCAST_FP32_ON_HOST) --------------------------------------
    def set_fp32_as_bf16(self, entering: bool) -> None:
        """An emulated bf16 autocast region starts (True) or ends (False).

        From the start, fp32 ops are charged as bf16; at the end, charging in bf16 goes on
        through backward (whose ops run in the forward's dtypes) until the next
        ``mark_step`` launch (:meth:`mark_step_launched`).
        """
        with self.lock:
            log = self.launcher.log
            if log is not None:
                log.append(("fp32_as_bf16", entering))
            if entering:
                self.fp32_as_bf16, self._fp32_as_bf16_until_mark_step = True, False
                self._emulated_casts = set()
            elif self.fp32_as_bf16:
                self._fp32_as_bf16_until_mark_step = True

    def mark_step_launched(self) -> None:
        """A non-empty graph was launched by ``mark_step``: a region's backward tail ends."""
        if self._fp32_as_bf16_until_mark_step:
            self._fp32_as_bf16_until_mark_step = self.fp32_as_bf16 = False

    def _charge_weight_casts(self, args: tuple) -> None:
        """Emulated autocast: the casts a faithful region makes of each fp32 weight a matmul
        uses, once per region (autocast caches them): fp32 -> bf16 in forward and the
        gradient bf16 -> fp32 in backward, both charged here, at the first use."""
        for a in args:
            if (isinstance(a, _Tensor) and a.is_leaf and a.requires_grad and a.dtype == torch.float32):
                serial = self.residency.register(a.untyped_storage()).serial
                if serial in self._emulated_casts:
                    continue
                self._emulated_casts.add(serial)
                n = a.numel()
                for name, nin, nout in (("cast fp32->bf16", 4 * n, 2 * n), ("grad cast bf16->fp32", 2 * n, 4 * n)):
                    ns = op_time_ns(self.spec, "TPC", n, nin + nout, True)
                    cost = OpCost(name=f"emulated autocast {name}", engine="TPC", flops=n, bytes_in=nin,
                                  bytes_out=nout, low_precision=True, device_ns=ns,
                                  compute_ns=op_time_ns(self.spec, "TPC", n, 0, True), op_class="elementwise")
                    self.launcher.append_op(OpRecord(("emulated cast", name, n), cost))
