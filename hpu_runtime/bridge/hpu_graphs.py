"""HPU graphs: capture a sequence of ops once, replay it without per-op host work.

NOTE [capture and replay over CPU tensors]
Capture runs the captured code once for real (so, unlike CUDA graphs, capture is also a
warm-up step) while the device records every non-view aten op with its arguments; the ops
become one recipe (compiled on a recipe-cache miss). Replay re-executes the recorded ops
on the *same* tensors, below autograd and outside the bridge, and copies each freshly
computed result into the tensor captured as that op's output, so static outputs, views of
them and tensors saved for backward all see the new values. In-place ops (an optimizer's
updates) re-apply to the same parameters. On the simulated timeline a replay costs
``graph_replay_ns`` of host time (input-shape check and launch) instead of per-op
accumulation, then the captured graph's device time.

As with CUDA/HPU graphs: inputs must be copied into the static input tensors; Python values
computed during capture (``tensor.item()``, a non-capturable optimizer's step count) are
frozen into the graph; random ops draw fresh numbers on each replay.

NOTE [static inputs and outputs of graphed callables]
:func:`make_graphed_callables` and :class:`ModuleCacher` keep one static tensor per tensor
the callable receives: every tensor anywhere in its positional and keyword arguments (any
pytree: lists, tuples, dicts), found by ``torch.utils._pytree``. Each call copies the new
values into them before the replay, so a replay never sees a previous call's values. The
non-tensor leaves and the argument structure are part of what was captured: for
:class:`ModuleCacher` they key the cache (a new value captures a new graph); a graphed
callable called with another structure, or with tensors of other shapes or dtypes, raises
``ValueError`` (it cannot replay them). Outputs may be any pytree of tensors and other
values (a dict, a Hugging Face ``ModelOutput``); its tensors are the graph's static
outputs, which the next replay overwrites, as on Gaudi and with CUDA graphs (``clone()`` a
result that must outlive the next call).

One module: Gaudi's five HPU-graph names (``HPUGraph``, ``graph``,
``make_graphed_callables``, ``ModuleCacher``, ``wrap_in_hpu_graph``) share the capture program
and the graphed-callable machinery; beside them, the helpers with which optimum-habana's
diffusers pipelines cache their own graphs (``input_hash``, ``copy_to``, ``CachedParams``: capture
once per input hash with ``HPUGraph.capture_begin/capture_end``, then copy new inputs into the
captured ones and replay), as Intel's ``hpu/graphs.py`` defines them.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from .runtime import get_device

__all__ = ["HPUGraph", "graph", "make_graphed_callables", "ModuleCacher", "wrap_in_hpu_graph", "CachedParams",
           "input_hash", "copy_to"]


class _Ref:
    """An argument of a captured op that an earlier op of the same graph produced."""

    __slots__ = ("op", "index")

    def __init__(self, op: int, index: int) -> None:
        self.op, self.index = op, index


def _outputs(out: object) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def _program(ops: list) -> tuple[list, list]:
    """The captured ``(func, args, kwargs, out, allocates)`` list as a program, emptying
    ``ops``: per op ``[func, argument leaves (a :class:`_Ref` for a tensor an earlier op
    produced), pytree spec, allocates, outputs, frees]``, and per output an op allocated,
    ``(op, index, tensor weakref, storage weakref, (dtype, device, offset, size, stride))``."""
    produced: dict[int, _Ref] = {}
    program, outputs = [], []
    for i, (func, args, kwargs, out, allocates) in enumerate(ops):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = [produced.get(id(x), x) if isinstance(x, torch.Tensor) else x for x in leaves]
        program.append([func, slots, spec, allocates, [], ()])
        if allocates:
            for k, o in enumerate(_outputs(out)):
                produced[id(o)] = _Ref(i, k)
                outputs.append((i, k, weakref.ref(o), weakref.ref(o.untyped_storage()),
                                (o.dtype, o.device, o.storage_offset(), o.shape, o.stride())))
    ops.clear()
    return program, outputs


def _persistent(program: list, outputs: list) -> None:
    """Keep the outputs someone else still holds (NOTE [what a captured graph keeps]);
    the others become temporaries of each replay, freed after their last use."""
    for i, k, tensor, storage, (dtype, device, offset, size, stride) in outputs:
        kept = tensor()
        if kept is None and storage() is not None:  # its tensor died, its storage is still read
            with get_device().uncharged():
                kept = torch.empty(0, dtype=dtype, device=device).set_(storage(), offset, size, stride)
        keep = program[i][4]
        keep.extend([None] * (k + 1 - len(keep)))
        keep[k] = kept
    last: dict[tuple[int, int], int] = {}
    for j, (_f, slots, *_rest) in enumerate(program):
        for x in slots:
            if isinstance(x, _Ref) and program[x.op][4][x.index] is None:
                last[x.op, x.index] = j
    frees: dict[int, list] = {}
    for key, j in last.items():
        frees.setdefault(j, []).append(key)
    for j, keys in frees.items():
        program[j][5] = tuple(keys)


class HPUGraph:
    """A captured sequence of ops (``capture_begin``/``capture_end``/``replay``).

    NOTE [what a captured graph keeps]
    Gaudi's graph compiler tells persistent tensors (the graph's inputs and outputs, and
    what lives on after it) from the graph's own intermediates, which live in its workspace
    only while the graph runs (Intel Gaudi documentation, "PyTorch Gaudi Theory of
    Operations": "identification of persistent, non-persistent ... tensors"). At
    ``capture_end`` an output of a captured op is persistent if anything but the capture
    still holds it or its storage (the code that called the ops, autograd's saved tensors,
    a view); every other output is dropped, so its simulated HBM (and host memory) is
    freed, and each replay recomputes it as a temporary that dies after its last use.
    """

    def __init__(self) -> None:
        self._ops: list = []
        self._program: list = []
        self._graph = None
        self._captured = False

    def capture_begin(self, *args, **kwargs) -> None:
        """Start recording the ops of this thread into this graph."""
        self._ops = []
        get_device().begin_capture(self._ops)

    def capture_end(self) -> None:
        """Stop recording; the captured ops become one recipe."""
        self._graph = get_device().end_capture()
        program, outputs = _program(self._ops)
        _persistent(program, outputs)
        self._program = program
        self._captured = True

    @property
    def num_ops(self) -> int:
        """Ops captured (views excluded)."""
        return len(self._program)

    def replay(self) -> None:
        """Re-run the captured ops (real numerics) and charge one graph replay.

        Raises:
            RuntimeError: if nothing was captured.
        """
        if not self._captured:
            raise RuntimeError("HPUGraph.replay() before capture_end()")
        env: dict[tuple[int, int], torch.Tensor] = {}
        with get_device().uncharged(), torch._C._AutoDispatchBelowADInplaceOrView():
            for j, (func, slots, spec, allocates, keep, frees) in enumerate(self._program):
                leaves = [env[x.op, x.index] if isinstance(x, _Ref) else x for x in slots]
                args, kwargs = pytree.tree_unflatten(leaves, spec)
                res = func(*args, **kwargs)
                if allocates:
                    for k, r in enumerate(_outputs(res)):
                        target = keep[k] if k < len(keep) else None
                        if target is not None:
                            target.copy_(r)
                            r = target
                        env[j, k] = r
                for key in frees:
                    del env[key]
        get_device().replay(self._graph)

    def reset(self) -> None:
        """Forget the captured ops."""
        self._ops, self._program, self._graph, self._captured = [], [], None, False


class graph:  # noqa: N801 - torch.hpu.graph, used as `with hpu.graph(g):`
    """Context manager capturing the enclosed ops into ``hpu_graph``."""

    def __init__(self, hpu_graph: HPUGraph, pool=None, stream=None, **_kwargs) -> None:
        self.hpu_graph = hpu_graph

    def __enter__(self) -> None:
        self.hpu_graph.capture_begin()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            get_device().end_capture()
            return
        self.hpu_graph.capture_end()


def _signature(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype


def _graphed(fn: Callable, sample_args: tuple, params: list[torch.nn.Parameter],
             warmup_iters: int = 1) -> Callable:
    """One callable with a forward graph and (if grads are needed) a backward graph.

    ``fn(*tensors)`` takes tensors only (the callers flatten their arguments); its output
    may be any pytree (NOTE [static inputs and outputs of graphed callables]).
    """
    if not all(isinstance(a, torch.Tensor) for a in sample_args):
        raise TypeError("make_graphed_callables: sample_args must all be tensors")
    static_in = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in sample_args)
    for _ in range(warmup_iters):
        fn(*static_in)
    fwd = HPUGraph()
    with graph(fwd):
        static_out_raw = fn(*static_in)
    leaves, out_spec = pytree.tree_flatten(static_out_raw)
    tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    static_out = tuple(leaves[i] for i in tensor_at)
    diff_in = [t for t in (*static_in, *params) if t.requires_grad]
    needs_bwd = torch.is_grad_enabled() and bool(diff_in) and any(o.requires_grad for o in static_out)
    bwd = None
    static_grad_out: list = []
    static_grads: tuple = ()
    if needs_bwd:
        outs_rg = [o for o in static_out if o.requires_grad]
        static_grad_out = [torch.zeros_like(o) for o in outs_rg]
        bwd = HPUGraph()
        with graph(bwd):
            static_grads = torch.autograd.grad(outs_rg, diff_in, grad_outputs=static_grad_out,
                                               allow_unused=True)
    n_in = len(static_in)
    expected = [_signature(t) for t in static_in]

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            with get_device().uncharged():
                for s, x in zip(static_in, inputs[:n_in]):
                    if s is not x:
                        s.copy_(x)
            fwd.replay()
            return tuple(o.detach() for o in static_out)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            with get_device().uncharged():
                k = 0
                for o, g in zip(static_out, grads):
                    if o.requires_grad:
                        if g is None:
                            static_grad_out[k].zero_()
                        else:
                            static_grad_out[k].copy_(g)
                        k += 1
            bwd.replay()
            result = []
            grads_iter = iter(static_grads)
            for t in (*static_in, *params):
                if t.requires_grad:
                    g = next(grads_iter)
                    result.append(None if g is None else g.detach())
                else:
                    result.append(None)
            return tuple(result)

    def run(*args):
        got = [_signature(a) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args]
        if got != expected:
            raise ValueError(f"a graphed callable was captured for tensors {expected} and cannot replay "
                             f"{got}: call it with tensors of the captured shapes and dtypes (or use "
                             "ModuleCacher, which captures a graph per signature)")
        if bwd is not None and torch.is_grad_enabled():
            outs = Graphed.apply(*args, *params)
        else:
            with torch.no_grad():
                outs = Graphed.forward(None, *args, *params)
        out_leaves = list(leaves)
        for i, o in zip(tensor_at, outs):
            out_leaves[i] = o
        return pytree.tree_unflatten(out_leaves, out_spec)

    run.forward_graph = fwd
    run.backward_graph = bwd
    return run


def make_graphed_callables(callables, sample_args, *, warmup_iters: int = 1,
                           allow_unused_input: bool = False, **_kwargs):
    """Wrap callables (functions or modules) so forward and backward each replay an HPU graph.

    Args:
        callables: a callable or ``nn.Module``, or a tuple of them.
        sample_args: a tuple of tensors (or, for a tuple of callables, a tuple of such tuples).
        warmup_iters: eager runs before capture.

    Returns:
        The graphed callable(s); a module gets its ``forward`` replaced and is returned.
        They take the tensors of ``sample_args``' shapes and dtypes, positionally (keyword
        and non-tensor arguments: use :class:`ModuleCacher`), and return what the callable
        returned, its tensors static (NOTE [static inputs and outputs of graphed callables]).

    Raises:
        TypeError: ``sample_args`` holds a non-tensor; later, a call with keyword arguments.
        ValueError: later, a call with tensors of other shapes or dtypes.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    out = []
    for fn, args in zip(callables, sample_args):
        args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
        if isinstance(fn, torch.nn.Module):
            params = [p for p in fn.parameters() if p.requires_grad]
            fn.forward = _positional_only(_graphed(fn.forward, args, params, warmup_iters))
            out.append(fn)
        else:
            out.append(_graphed(fn, args, [], warmup_iters))
    return out[0] if single else tuple(out)


def _key_item(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, v.requires_grad)
    return v


def _positional_only(run: Callable) -> Callable:
    def forward(*args, **kwargs):
        if kwargs:
            raise TypeError(f"a module graphed by make_graphed_callables takes its tensors positionally; got "
                            f"keyword arguments {sorted(kwargs)} (use ModuleCacher / wrap_in_hpu_graph for those)")
        return run(*args)

    forward.forward_graph, forward.backward_graph = run.forward_graph, run.backward_graph
    return forward


class ModuleCacher:
    """Caches one graphed forward/backward per input signature of a module (LRU, ``max_graphs``).

    Use as on Gaudi: ``ModuleCacher(max_graphs=10)(model=model, inplace=True)``. Positional
    and keyword arguments may be any pytree; every tensor in them is a graph input, copied
    in at each call, and the rest (non-tensor values, the structure, tensor shapes, dtypes
    and ``requires_grad``, grad mode, ``model.training``) keys the cache (NOTE [static inputs
    and outputs of graphed callables]). A call with an unhashable non-tensor argument runs
    the module as it is, uncached (counted in ``uncached``), and so does a call inside
    another capture (a model wrapped twice: its ops join that graph). A new key captures new
    graphs; beyond ``max_graphs`` the least recently used entry is evicted. The wrapped model
    also gets Gaudi's ``set_iteration_count(n)``, ``capture_start()`` and ``capture_end()``,
    accepted and recorded only (capture is per signature here, never manual).
    """

    def __init__(self, max_graphs: int = 10) -> None:
        if not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"ModuleCacher: max_graphs must be an int >= 1, got {max_graphs!r}")
        self.max_graphs = max_graphs
        self.cache: collections.OrderedDict = collections.OrderedDict()
        self.captures = 0
        """Graphs captured (cache misses)."""
        self.evictions = 0
        """Entries dropped because more than ``max_graphs`` signatures were seen."""
        self.uncached = 0
        """Calls run without a graph (an unhashable non-tensor argument)."""
        self.iteration_count: int | None = None
        """What the wrapped model's ``set_iteration_count(n)`` last recorded (not used)."""

    def _set_iteration_count(self, count: int) -> None:
        self.iteration_count = int(count)

    def __call__(self, model: torch.nn.Module, inplace: bool = True, **_kwargs) -> torch.nn.Module:
        if not inplace:
            import copy

            model = copy.deepcopy(model)
        original = model.forward
        cacher = self

        def forward(*args, **kwargs):
            if get_device().launcher.capture is not None:  # called inside another capture (a model
                return original(*args, **kwargs)         # wrapped twice): its ops join that graph
            leaves, spec = pytree.tree_flatten((args, kwargs))
            key = (spec, tuple(_key_item(leaf) for leaf in leaves), torch.is_grad_enabled(), model.training)
            try:
                entry = cacher.cache.get(key)
            except TypeError:  # an unhashable non-tensor argument: nothing to key a graph by
                cacher.uncached += 1
                return original(*args, **kwargs)
            tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
            if entry is None:
                def fn(*tensors, _leaves=leaves, _spec=spec):
                    full = list(_leaves)
                    for i, t in zip(tensor_at, tensors):
                        full[i] = t
                    a, kw = pytree.tree_unflatten(full, _spec)
                    return original(*a, **kw)

                params = [p for p in model.parameters() if p.requires_grad]
                entry = _graphed(fn, tuple(leaves[i] for i in tensor_at), params, warmup_iters=0)
                cacher.cache[key] = entry
                cacher.captures += 1
                if len(cacher.cache) > cacher.max_graphs:
                    cacher.cache.popitem(last=False)
                    cacher.evictions += 1
            else:
                cacher.cache.move_to_end(key)
            return entry(*(leaves[i] for i in tensor_at))

        model.forward = forward
        # Gaudi's cacher adds these for gradient accumulation and manual capture; here every
        # call replays or captures by its input signature, so they only record the request.
        model.set_iteration_count = self._set_iteration_count
        model.capture_start = lambda: None
        model.capture_end = lambda: None
        # Gaudi's wrap_in_hpu_graph adds these (optimum-habana's generate calls them with
        # --limit_hpu_graphs): clear_cache drops every graph (the next call captures again);
        # clear_inputs releases, on Gaudi, the inputs a graph holds as outputs of its in-place
        # ops. Here each graph keeps its static inputs (the next replay copies into them), so
        # clear_inputs releases nothing: accepted, and the HBM stays counted.
        model.clear_cache = self.cache.clear
        model.clear_inputs = lambda: None
        return model


def wrap_in_hpu_graph(module: torch.nn.Module, asynchronous: bool = False, disable_tensor_cache: bool = False,
                      dry_run: bool = False, max_graphs: int | None = None, **_kwargs) -> torch.nn.Module:
    """Gaudi's ``wrap_in_hpu_graph``: cache HPU graphs of ``module``'s forward per input signature."""
    return ModuleCacher(max_graphs=max_graphs or 1 << 30)(model=module, inplace=True)


class CachedParams:
    """A graph a caller caches itself, with its inputs and outputs (Intel's ``graphs.CachedParams``,
    as optimum-habana's diffusers pipelines keep them per :func:`input_hash`)."""

    def __init__(self, graph_inputs, graph_outputs, graph: HPUGraph, out_tinfo_list=None,
                 asynchronous: bool = False) -> None:
        self.graph_inputs = graph_inputs
        self.graph_outputs = graph_outputs
        self.graph = graph
        self.out_tinfo_list = out_tinfo_list
        self.asynchronous = asynchronous


def input_hash(obj: object) -> int:
    """A hash of a graph's inputs by what a captured graph fixes: the structure (dicts, lists,
    tuples), each tensor's shape, strides, storage offset and dtype, each other value, and
    whether hpu autocast is on (Intel's ``graphs.input_hash``, whose view hash covers a
    tensor's layout; the dtype is added here, so a tensor of another dtype captures its own
    graph instead of replaying one through a casting copy).

    Raises:
        TypeError: a value that cannot be hashed (an unhashable non-tensor leaf).
    """
    autocast = torch.is_autocast_enabled("hpu")
    if isinstance(obj, dict):
        return input_hash(tuple(obj.items()))
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return hash((tuple(input_hash(x) for x in obj), autocast))
    if isinstance(obj, torch.Tensor):
        return hash((tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype, autocast))
    if isinstance(obj, collections.UserDict):
        return hash(tuple((k, tuple(v)) for k, v in obj.items()))
    return hash((obj, autocast))


def copy_to(dst: object, src: object) -> None:
    """Copy ``src``'s tensors into ``dst``'s, structure by structure (the captured inputs of a
    graph get a call's values before its replay; Intel's ``graphs.copy_to``).

    Raises:
        TypeError: ``dst`` and ``src`` differ in type, or two dicts in keys.
    """
    if type(dst) is not type(src):
        raise TypeError(f"copy_to: a captured {type(dst).__name__} cannot take a {type(src).__name__}")
    if isinstance(dst, dict):
        if list(dst) != list(src):
            raise TypeError(f"copy_to: captured keys {list(dst)} differ from {list(src)}")
        for k in dst:
            copy_to(dst[k], src[k])
    elif isinstance(dst, (list, tuple)) and not isinstance(dst, torch.Size):
        for d, s in zip(dst, src, strict=True):
            copy_to(d, s)
    elif isinstance(dst, torch.Tensor) and dst is not src:
        dst.copy_(src, non_blocking=True)
