"""``te.distributed``: ``activation_checkpointing`` (fp8 amax bookkeeping under recompute; nothing to keep here)."""

from __future__ import annotations

import contextlib

__all__ = ["activation_checkpointing"]


class activation_checkpointing(contextlib.ContextDecorator):  # noqa: N801 - Intel's name
    """``te.distributed.activation_checkpointing()``: a context manager and decorator.

    On Gaudi it keeps fp8 scaling state consistent when a checkpointed region is recomputed;
    fp8 is not emulated, so the wrapped function runs unchanged.
    """

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False
