"""``habana_frameworks.torch.dynamo.compile_backend.experimental``: ``enable_compiled_autograd``."""

from __future__ import annotations

__all__ = ["enable_compiled_autograd", "compiled_autograd_requested"]

_requested: dict | None = None
_context = None


def enable_compiled_autograd(is_dynamic: bool = False, **kwargs) -> None:
    """Compile every later backward pass with ``hpu_backend``, as on Gaudi (call it before
    any ``torch.compile``).

    As Gaudi's helper: torch's compiled autograd traces each ``backward()`` (the autograd
    graph, gradient accumulation and hooks included) and hands it to
    ``torch.compile(graph, backend="hpu_backend", **kwargs)``, so a backward pass is one
    compiled region (:mod:`hpu_runtime.bridge.compile_backend`); dynamo's caches are reset and
    DDP under ``torch.compile`` switches to its Python reducer
    (``torch._dynamo.config.optimize_ddp = "python_reducer"``: each gradient's allreduce is a
    functional collective inside the compiled backward). Process-wide and permanent.

    Args:
        is_dynamic: compiled autograd treats sizes in the autograd graph as dynamic.
        **kwargs: passed on to ``torch.compile`` of each backward graph.
    """
    global _requested, _context
    import torch
    import torch._dynamo
    from torch._dynamo import compiled_autograd

    def compiler_fn(graph):
        return torch.compile(graph, backend="hpu_backend", **kwargs)

    if _context is not None:
        _context.__exit__(None, None, None)
    torch._dynamo.reset()  # (this also resets compiled autograd: enable it after)
    _context = compiled_autograd._enable(compiler_fn, dynamic=is_dynamic)
    _context.__enter__()
    torch._dynamo.config.optimize_ddp = "python_reducer"
    _requested = dict(kwargs, is_dynamic=is_dynamic)


def compiled_autograd_requested() -> dict | None:
    """The arguments of the last :func:`enable_compiled_autograd` call, or None."""
    return _requested
