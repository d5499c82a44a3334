"""Frames ``torch.compile`` must never compile: the bridge's hooks and mode, the hccl backend.

NOTE [keeping dynamo out, at no cost per call]
Dynamo's frame hook sees every Python frame started while a compiled function runs (and,
after a graph break, while the rest of it runs eagerly), including frames started from C++:
the bridge's hooks called by the hpu kernel, a dispatch mode's ``__torch_dispatch__``, a
Python ProcessGroup's collectives and Work
methods. These are the device and the network, not user code; compiling them is wrong (see
NOTE [dynamo and a Python ProcessGroup] in :mod:`hccl.process_group`) or wasted.

torch's own answer, ``torch._dynamo.disable``, wraps each call: ``TorchDispatchMode``
subclasses get it on ``__torch_dispatch__`` by default, which costs a dynamo import (about a
second) at the first op of every process and a few microseconds at every op after it, on
the bridge's hot path. :func:`skip_dynamo` gets the same effect once, at definition: it sets
dynamo's frame action ``SKIP`` for the code objects and for every frame below them (what
the disable wrapper's context does), through the C half of dynamo, which is always loaded.
"""

from __future__ import annotations

__all__ = ["skip_dynamo"]


def _functions(obj):
    """The functions of ``obj``: itself, or every function a class defines (methods, static and
    class methods, property accessors), bases from the same top-level package included."""
    if not isinstance(obj, type):
        yield obj
        return
    package = obj.__module__.partition(".")[0]
    for klass in obj.__mro__:
        if klass.__module__.partition(".")[0] != package:
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                yield from (f for f in (value.fget, value.fset, value.fdel) if f is not None)
            elif callable(value) and hasattr(value, "__code__"):
                yield value


def skip_dynamo(obj):
    """Dynamo never compiles ``obj`` (a function, or every method of a class and of its bases
    in the same package) nor anything it calls; returns ``obj`` (usable as a decorator).
    See NOTE [keeping dynamo out, at no cost per call]."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # a torch without dynamo: nothing would compile these frames
        return obj
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for fn in _functions(obj):
        set_code_exec_strategy(fn.__code__, skip)
    return obj
