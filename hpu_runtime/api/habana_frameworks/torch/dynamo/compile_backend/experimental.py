"""``habana_frameworks.torch.dynamo.compile_backend.experimental``: ``enable_compiled_autograd``."""

from __future__ import annotations

__all__ = ["enable_compiled_autograd", "compiled_autograd_requested"]

_requested: dict | None = None


def enable_compiled_autograd(**kwargs) -> None:
    """Accepted and recorded; the backward pass stays in eager autograd here.

    On Gaudi this compiles the backward graph with ``hpu_backend`` and switches DDP under
    ``torch.compile`` to the Python reducer. The emulator keeps eager autograd (charged op by
    op, as in lazy mode) and torch's C++ reducer, whose bucketing and hooks it models; only
    host time would differ, and compiled autograd's host cost is not modelled.
    """
    global _requested
    _requested = dict(kwargs)


def compiled_autograd_requested() -> dict | None:
    """The keyword arguments of the last :func:`enable_compiled_autograd` call, or None."""
    return _requested
