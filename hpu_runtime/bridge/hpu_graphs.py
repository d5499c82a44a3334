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
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .dispatch import bridge_disabled
from .runtime import get_device

__all__ = ["HPUGraph", "graph", "make_graphed_callables", "ModuleCacher", "wrap_in_hpu_graph"]


class HPUGraph:
    """A captured sequence of ops (``capture_begin``/``capture_end``/``replay``)."""

    def __init__(self) -> None:
        self._ops: list = []
        self._recipe = None
        self._captured = False

    def capture_begin(self, *args, **kwargs) -> None:
        """Start recording the ops of this thread into this graph."""
        self._ops = []
        get_device().begin_capture(self._ops)

    def capture_end(self) -> None:
        """Stop recording; the captured ops become one recipe."""
        self._recipe = get_device().end_capture()
        self._captured = True

    @property
    def num_ops(self) -> int:
        """Ops captured (views excluded)."""
        return len(self._ops)

    def replay(self) -> None:
        """Re-run the captured ops (real numerics) and charge one graph replay.

        Raises:
            RuntimeError: if nothing was captured.
        """
        if not self._captured:
            raise RuntimeError("HPUGraph.replay() before capture_end()")
        with bridge_disabled(), torch._C._AutoDispatchBelowADInplaceOrView():
            for func, args, kwargs, out, allocates in self._ops:
                res = func(*args, **kwargs)
                if allocates:
                    if isinstance(out, torch.Tensor):
                        out.copy_(res)
                    elif isinstance(out, (list, tuple)):
                        for o, r in zip(out, res):
                            if isinstance(o, torch.Tensor):
                                o.copy_(r)
        get_device().replay(self._recipe)

    def reset(self) -> None:
        """Forget the captured ops."""
        self._ops, self._recipe, self._captured = [], None, False


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


def _flatten(out: object) -> tuple[list, object, tuple[torch.Tensor, ...]]:
    """``(leaves, spec, tensors)`` of an output pytree (a tensor, tuples, dicts, transformers'
    ``ModelOutput``...): the graph replays the tensor leaves, the others are constants."""
    leaves, spec = tree_flatten(out)
    tensors = tuple(x for x in leaves if isinstance(x, torch.Tensor))
    if not tensors:
        raise TypeError(f"HPU graphs need tensor outputs, got {type(out).__name__} without tensors")
    return leaves, spec, tensors


def _graphed(fn: Callable, sample_args: tuple, params: list[torch.nn.Parameter],
             warmup_iters: int = 1) -> Callable:
    """One callable with a forward graph and (if grads are needed) a backward graph."""
    if not all(isinstance(a, torch.Tensor) for a in sample_args):
        raise TypeError("make_graphed_callables: sample_args must all be tensors")
    static_in = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in sample_args)
    for _ in range(warmup_iters):
        fn(*static_in)
    fwd = HPUGraph()
    with graph(fwd):
        static_out_raw = fn(*static_in)
    out_leaves, out_spec, static_out = _flatten(static_out_raw)
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

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            with bridge_disabled():
                for s, x in zip(static_in, inputs[:n_in]):
                    if s.data_ptr() != x.data_ptr():
                        s.copy_(x)
            fwd.replay()
            return tuple(o.detach() for o in static_out)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            with bridge_disabled():
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
        if bwd is not None and torch.is_grad_enabled():
            outs = Graphed.apply(*args, *params)
        else:
            with torch.no_grad():
                outs = Graphed.forward(None, *args, *params)
        it = iter(outs)
        return tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in out_leaves], out_spec)

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
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    out = []
    for fn, args in zip(callables, sample_args):
        args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
        if isinstance(fn, torch.nn.Module):
            params = [p for p in fn.parameters() if p.requires_grad]
            fn.forward = _graphed(fn.forward, args, params, warmup_iters)
            out.append(fn)
        else:
            out.append(_graphed(fn, args, [], warmup_iters))
    return out[0] if single else tuple(out)


def _key_item(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, v.requires_grad)
    if isinstance(v, (list, tuple)):
        return tuple(_key_item(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _key_item(x)) for k, x in v.items()))
    return v


class ModuleCacher:
    """Caches one graphed forward/backward per input signature of a module (LRU, ``max_graphs``).

    Use as on Gaudi: ``ModuleCacher(max_graphs=10)(model=model, inplace=True)``. Tensors may
    be positional or keyword arguments, or inside lists and dicts (each is a graph input, copied
    in at replay); outputs may be any pytree of tensors (tuples, dicts, transformers'
    ``ModelOutput``). Non-tensor arguments are part of the cache key (with tensor shapes,
    dtypes, ``requires_grad``, grad mode and ``model.training``). A new key captures new
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
            key = (_key_item(args), _key_item(kwargs), torch.is_grad_enabled(), model.training)
            entry = cacher.cache.get(key)
            leaves, spec = tree_flatten((args, kwargs))  # tensors anywhere, keyword ones included
            if entry is None:
                positions = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]

                def fn(*tensors, _leaves=leaves, _spec=spec, _positions=positions):
                    full = list(_leaves)
                    for i, t in zip(_positions, tensors):
                        full[i] = t
                    call_args, call_kwargs = tree_unflatten(full, _spec)
                    return original(*call_args, **call_kwargs)

                params = [p for p in model.parameters() if p.requires_grad]
                entry = (_graphed(fn, tuple(leaves[i] for i in positions), params, warmup_iters=0), positions)
                cacher.cache[key] = entry
                cacher.captures += 1
                if len(cacher.cache) > cacher.max_graphs:
                    cacher.cache.popitem(last=False)
                    cacher.evictions += 1
            else:
                cacher.cache.move_to_end(key)
            run, positions = entry
            return run(*(leaves[i] for i in positions))

        model.forward = forward
        # Gaudi's cacher adds these for gradient accumulation and manual capture; here every
        # call replays or captures by its input signature, so they only record the request.
        model.set_iteration_count = self._set_iteration_count
        model.capture_start = lambda: None
        model.capture_end = lambda: None
        return model


def wrap_in_hpu_graph(module: torch.nn.Module, asynchronous: bool = False, disable_tensor_cache: bool = False,
                      dry_run: bool = False, max_graphs: int | None = None, **_kwargs) -> torch.nn.Module:
    """Gaudi's ``wrap_in_hpu_graph``: cache HPU graphs of ``module``'s forward per input signature."""
    return ModuleCacher(max_graphs=max_graphs or 1 << 30)(model=module, inplace=True)
