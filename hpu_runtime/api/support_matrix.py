"""Intel Gaudi's PyTorch support matrix: a warning, once, when a script uses what it marks unsupported.

The emulator runs FSDP, tensor parallelism and DTensor over "hccl" in every mode (users test
ahead of releases), but Intel's "PyTorch Support Matrix" (Intel Gaudi documentation; the
release the emulated names follow) lists:

==============================  ==============================  ====================
row                             Eager + torch.compile           Lazy mode
==============================  ==============================  ====================
PyTorch FSDP                    Yes                             No
PyTorch Tensor Parallel         No                              No
PyTorch Dtensor                 No                              No
==============================  ==============================  ====================

So that nobody mistakes "ran in the emulator" for "runs on that Gaudi release", the first use
of such a feature in a mode the matrix marks "No" warns once per row and process
(:class:`GaudiSupportMatrixWarning`, naming the row and the mode). The entry points watched:
``torch.distributed.fsdp.fully_shard`` and ``FullyShardedDataParallel`` (FSDP),
``torch.distributed.tensor.parallel.parallelize_module`` (Tensor Parallel),
``torch.distributed.tensor.distribute_tensor`` and ``DTensor.from_local`` (Dtensor). They are
wrapped by :mod:`hpu_runtime.import_hooks`, right after their import or, for modules imported
before it, when ``hpu_runtime`` is imported (``patch_imported``), and only in a process that
runs the simulated Gaudi.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from types import ModuleType

from ..bridge.runtime import get_device

__all__ = ["GaudiSupportMatrixWarning", "ROWS", "patch_module", "warn_if_unsupported"]

ROWS = {"PyTorch FSDP": (True, False), "PyTorch Tensor Parallel": (False, False), "PyTorch Dtensor": (False, False)}
"""Row -> (supported in eager + torch.compile, supported in lazy mode), from the support matrix."""

_WATCHED = {
    "torch.distributed.fsdp": (("fully_shard", "PyTorch FSDP"), ("FullyShardedDataParallel.__init__", "PyTorch FSDP")),
    "torch.distributed.tensor.parallel": (("parallelize_module", "PyTorch Tensor Parallel"),),
    "torch.distributed.tensor": (("distribute_tensor", "PyTorch Dtensor"), ("DTensor.from_local", "PyTorch Dtensor")),
}
"""Module -> (attribute path, matrix row) of each entry point watched."""

_warned: set[str] = set()
_MARK = "_gaudi_support_matrix_row"


class GaudiSupportMatrixWarning(UserWarning):
    """A feature the Intel Gaudi support matrix marks unsupported in the mode in use."""


def warn_if_unsupported(row: str) -> bool:
    """Warn once per process if ``row`` is unsupported in this device's mode; whether it warned.

    Raises:
        KeyError: ``row`` is not in :data:`ROWS`.
    """
    lazy = get_device().lazy
    supported = ROWS[row][1 if lazy else 0]
    if supported or row in _warned:
        return False
    _warned.add(row)
    mode = "lazy mode (PT_HPU_LAZY_MODE=1)" if lazy else "eager + torch.compile (PT_HPU_LAZY_MODE=0)"
    warnings.warn(f"'{row}' is not supported in {mode} by the Intel Gaudi PyTorch support matrix (row "
                  f"'{row}'); it runs on the emulator, which does not mean it runs on that Gaudi release",
                  GaudiSupportMatrixWarning, stacklevel=3)
    return True


def _watch(fn, row: str):
    if getattr(fn, _MARK, None) == row:
        return fn

    @functools.wraps(fn)
    def watched(*args, **kwargs):
        warn_if_unsupported(row)
        return fn(*args, **kwargs)

    setattr(watched, _MARK, row)
    return watched


def patch_module(module: ModuleType) -> None:
    """Wrap the entry points of ``module`` listed in ``_WATCHED`` (idempotent)."""
    for path, row in _WATCHED.get(module.__name__, ()):
        owner, _, name = path.rpartition(".")
        target = getattr(module, owner) if owner else module
        fn = getattr(target, name, None)
        if fn is not None:
            static = isinstance(inspect.getattr_static(target, name), staticmethod)
            setattr(target, name, staticmethod(_watch(fn, row)) if static else _watch(fn, row))

