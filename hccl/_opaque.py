"""Keep ``torch.compile`` out of the backend's Python code, as it is out of a C++ backend's.

NOTE [dynamo and a Python ProcessGroup]
torch's collectives and DDP's C++ reducer call the process group and its Work objects
through pybind trampolines, so every ``allreduce``/``broadcast``/``wait`` of this backend is
a Python frame started from C++. Under ``torch.compile`` dynamo's frame hook sees each such
frame as a fresh function to compile (gloo's, being C++, are invisible to it). Dynamo also
treats every ``dist.ProcessGroup`` as an opaque reference object with a handful of known
members (``size``, ``rank``, ``group_name``...), so compiling ``ProcessGroupHCCL.broadcast``
stops at its first own attribute (``self._check``) with ``UnsafeScriptObjectError``, a hard
error: this is what DDP's bucket rebuild (a broadcast from the reducer, at the second
iteration) hit under ``torch.compile(DDP(model))``.

A backend's collective is no graph to capture: it runs as it is, the simulated device
records it, and a compiled region around it is cut there (see
:mod:`hpu_runtime.bridge.compile_backend`). :func:`opaque_to_dynamo` tells dynamo's frame
hook to run every method of a class, and everything they call, without compiling
(``FrameAction.SKIP`` for the frame and for the frames below it: what
``torch._dynamo.disable`` does, set once on the code objects). It uses the C half of
dynamo only, so importing ``hccl`` does not import ``torch._dynamo`` (about a second).
"""

from __future__ import annotations

__all__ = ["opaque_to_dynamo"]


def _functions(cls: type):
    """Every function defined by ``cls`` and its hccl bases (methods, property accessors)."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("hccl"):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                yield from (f for f in (value.fget, value.fset, value.fdel) if f is not None)
            elif callable(value) and hasattr(value, "__code__"):
                yield value


def opaque_to_dynamo(cls: type) -> type:
    """Class decorator: dynamo never compiles the methods of ``cls`` (nor what they call);
    see NOTE [dynamo and a Python ProcessGroup]. Returns ``cls``."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # a torch without dynamo: nothing would compile these frames
        return cls
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for fn in _functions(cls):
        set_code_exec_strategy(fn.__code__, skip)
    return cls
