"""Graph keys: what makes two lazy-mode graphs "the same recipe".

NOTE [graph key]
A launched graph is keyed by the sequence of its ops, each as ``(op name, signature)`` (the
name, e.g. ``"aten.addmm.default"``: a string hashes faster than the op object) where the
signature holds, per argument, ``(shape, dtype)`` for a tensor and the value itself for
anything else (Python scalars, int lists, dtypes, devices, ``None``). So, as on Gaudi:

* the same iteration repeated gives the same key (a recipe-cache hit, no compile);
* a different batch shape (a ragged last batch) gives a new key (a recompile);
* a Python number that changes every iteration and reaches an op as a constant (an index,
  ``steps[i]``; a size; a ``Scalar`` the bridge keeps in the graph, such as ``lerp``'s weight
  or ``sub``'s ``alpha``) gives a new key each time (a recompile per iteration; the Gaudi
  optimization guide's "avoid constant variables in loops");
* a Python number the bridge makes a graph input is not part of the key (NOTE [scalars as
  graph inputs]): ``x * step``, Adam's bias corrections and its step size, a scheduled learning
  rate as ``add_``'s ``alpha``;
* tensor *values* never matter; a 0-dim tensor made with ``torch.tensor(i, device="hpu")``
  is data, not a constant (it is copied host->device).

NOTE [scalars as graph inputs]
Habana's lazy bridge turns some Python numbers into device tensors before an op joins the
graph, so a value that changes every step does not change the recipe (HabanaAI/gaudi-pytorch-bridge,
1.19.0): a number passed where the op takes a tensor (a "wrapped number": ``x * 0.5``,
``t / c``) in ``LazyOp::set_inputs`` (``habana_kernels/lazy_kernels.h``); ``add``'s ``alpha``
(when not 1) and ``add_``'s scalar ``other`` (``habana_kernels/lazy_kernels.cpp``);
``addcdiv`` / ``addcmul``'s ``value`` when not 1 (``hpu_ops/lazy/add_composite_gen.cpp``);
``div.Scalar`` (``hpu_ops/lazy/binaryscalar2tensor.cpp``) and the ``.Scalar`` comparisons
(``hpu_ops/lazy/compare_gen.cpp``). Each goes through ``get_tensor_for_scalar``, which keeps
one device tensor per (value, dtype): later uses of a value are free, and its first use joins
a list that the graph's lowering copies host->device in one batch (``append_to_batch_h2d_list``,
``synMemCopyAsyncMultiple``: ``PT_HPU_SCALAR_H2D_COPY_MULTIPLE``, default true in
``scripts/env_flags.yaml``), so a launch with new scalars pays one copy of
:data:`SCALAR_BYTES` each. Every other scalar stays in the graph's IR and is hashed with its value
(``ival_hash`` in ``habana_lazy/ir.h``: ints, bools, strings, scalars). So torch's Adam, whose
bias corrections reach ``div`` as wrapped numbers and ``addcdiv_`` as its ``value``, runs one
recipe every step after the first two, and its optimizer graph's launch copies two new scalars
per step. In the key such an argument is :data:`SCALAR_INPUT`, in lazy mode
(:class:`~hpu_runtime.bridge.op_accounting.OpAccounting`); the launcher charges the batch
(:class:`~hpu_runtime.bridge.launcher.Launcher`).

The eager bridge does the same for wrapped numbers only: before an eager op runs,
``convert_cpu_wrapped_numbers`` (``habana_eager/eager_exec.cpp``) swaps each CPU wrapped number
for the scalar cache's device tensor and copies the new ones to the device, while a
Scalar-typed argument (``add``'s ``alpha``, ``lerp_``'s ``weight``) is hashed with its value into
the op's recipe key (``EagerExec::calculate_operator_key``; the short list of ops whose
parameters are patched at launch instead, ``NodeParamAgnosticOpList`` in
``backend/jit_graph_cache.h``: ``fill_``, ``masked_fill_``, ``cat``, ``sort``, ``topk``,
``arange``, resizes, upsampling and strided views, has none of an optimizer's). So in eager
mode, outside compiled regions, torch's Adam divides by its bias correction (a wrapped number
reaching ``div``) with one recipe, each launch with a new value copying it, as the Theory of
Operations says of training ("the graph compilation is only required for the initial
iteration"); its step size reaches ``addcdiv_`` as the Scalar ``value`` and so compiles a
recipe per new value, as the eager bridge keys it. Inside a compiled region the FX graph's
constants are its own (dynamo recompiles the graph when one changes).

View ops are part of the key (``steps[i]`` is ``aten.select.int(steps, 0, i)``) but cost no
device time. Ops with a data-dependent output shape (``nonzero``, ``masked_select``) add
their output shapes. Keys are hashable tuples for the in-memory cache; :func:`graph_digest`
gives the stable bytes used to name recipes on disk across processes.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["SCALAR_BYTES", "SCALAR_INPUT", "op_signature", "output_signature", "graph_digest", "recipe_name"]

_Tensor = torch.Tensor
_Generator = torch.Generator
_ScriptObject = torch.ScriptObject
_Storage = torch.UntypedStorage


SCALAR_INPUT = "<scalar input>"
"""Stands in a graph key for a Python number that is a graph input (NOTE [scalars as graph inputs])."""
SCALAR_BYTES = 4
"""Bytes of one scalar the bridge copies to the device: 64-bit values are kept in 32 bits there
(``get_tensor_for_scalar`` and ``preProcessIfLongorDouble`` in HabanaAI/gaudi-pytorch-bridge
``habana_kernels/lazy_kernels.cpp``)."""

_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format})
"""Argument types that are their own signature, checked first: ``isinstance`` against
``torch.ScriptObject`` runs a Python metaclass hook (about a microsecond per argument)."""


def _item(a: object) -> object:
    if isinstance(a, _Tensor):
        return (a.shape, a.dtype)
    if type(a) in _PLAIN:
        return a
    if isinstance(a, (list, tuple)):
        return tuple((x.shape, x.dtype) if isinstance(x, _Tensor) else x for x in a)
    if isinstance(a, (_Generator, _ScriptObject)):
        return type(a).__name__  # identity objects must not make every graph new
    if isinstance(a, _Storage):  # set_(storage): its size, never its bytes (repr would read them)
        return ("storage", a.nbytes())
    return a


def op_signature(args: tuple, kwargs: dict) -> tuple:
    """Hashable signature of one op's arguments (see NOTE [graph key])."""
    sig = [(a.shape, a.dtype) if isinstance(a, _Tensor) else _item(a) for a in args]
    if kwargs:
        for k, v in kwargs.items():
            if v is not None:
                sig.append((k, _item(v)))
    return tuple(sig)


def output_signature(out: object) -> tuple:
    """Shapes and dtypes of an op's outputs (for data-dependent output shapes)."""
    if isinstance(out, _Tensor):
        return ((out.shape, out.dtype),)
    if isinstance(out, (list, tuple)):
        return tuple((o.shape, o.dtype) for o in out if isinstance(o, _Tensor))
    return ()


_ENTRY_TEXT: dict = {}
_ENTRY_TEXT_LIMIT = 1 << 16


def graph_digest(spec_name: str, key: tuple) -> bytes:
    """Stable SHA-256 of a graph key for ``spec_name`` (the same in every process): of the
    ``repr`` of each entry, one per line. Entries recur from graph to graph (a graph that
    recompiles every step for a new constant differs in a few), so their text is kept."""
    texts = _ENTRY_TEXT
    if len(texts) >= _ENTRY_TEXT_LIMIT:
        texts.clear()
    parts = [spec_name.encode()]
    for entry in key:
        text = texts.get(entry)
        if text is None:
            text = texts[entry] = repr(entry).encode()
        parts.append(text)
    return hashlib.sha256(b"\n".join(parts)).digest()


def recipe_name(digest: bytes, n_ops: int) -> str:
    """Readable recipe name used in metrics and traces, e.g. ``"recipe_3fa2c1d0_12ops"``."""
    return f"recipe_{digest[:4].hex()}_{n_ops}ops"
