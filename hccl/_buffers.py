"""Flat views of tensors and the metadata words of a collective: the face's side of the
data plane's calling convention (buffers are flat, contiguous CPU tensors; every call
carries one row of :data:`~hccl.transport.shm.META_FIELDS`). A tensor on the simulated
Gaudi (``hpu``) is moved as a CPU view of its storage: no copy (NOTE [a device type for the
simulated Gaudi] in :mod:`hpu_runtime.bridge.device_type`)."""

from __future__ import annotations

import torch

from hpu_runtime.bridge.device_type import cpu_view

from .transport.shm_engine import KIND_CODES

__all__ = ["flat", "writeback", "meta_words"]


def flat(t: torch.Tensor) -> torch.Tensor:
    """A flat contiguous CPU view of ``t`` (or a contiguous copy, written back by :func:`writeback`)."""
    t = cpu_view(t)
    return t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)


def writeback(orig: torch.Tensor, flat_t: torch.Tensor) -> None:
    """Copy ``flat_t`` into ``orig`` when :func:`flat` had to copy (no-op for a view)."""
    if orig.numel() and flat_t.data_ptr() != orig.data_ptr():
        orig.copy_(flat_t.view(orig.shape))


def meta_words(seq: int, kind: str, dtype: int, numel: int, op: int = 0, root: int = 0, ready_ns: int = 0,
               x0: int = 0) -> list[int]:
    """One metadata row (``seq, kind, dtype, numel, op, root, ready_ns, x0, x1, x2, x3``) the
    engines compare across ranks; ``ready_ns`` is this rank's simulated ready time, which the
    engines exchange and return for every rank (the timing seam, see :mod:`hccl.sim.timing`)."""
    return [seq, KIND_CODES[kind], dtype, numel, op, root, ready_ns, x0, 0, 0, 0]
