"""Entry point torch calls at import (group ``torch.backends``): registers "hccl" cheaply, and
loads the simulated Gaudi when ``PT_HPU_GPU_MIGRATION=1`` asks for Intel's GPU Migration Toolkit.

Kept free of heavy imports: it runs in every process that imports torch while this package
is installed (disable with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); without the variable it
imports nothing more.
"""

from __future__ import annotations


def register() -> None:
    """Register the "hccl" torch.distributed backend."""
    import sys

    partial = sys.modules.get("hccl.backend")
    if partial is not None and not hasattr(partial, "register_backend"):
        return  # `import hccl` is what imported torch: the package registers itself
    try:
        from .backend import register_backend

        register_backend()
    except Exception as exc:  # never break `import torch` for unrelated programs
        import logging  # not warnings: under `python -W error` a warning would raise here

        logging.getLogger("hccl").warning("hccl: could not register the backend at torch import: %s", exc)
    _gpu_migration()


def _gpu_migration() -> None:
    """``PT_HPU_GPU_MIGRATION=1``: load the simulated Gaudi, with Intel's GPU Migration Toolkit
    on, at ``import torch`` (a script written for GPUs never imports ``habana_frameworks``; on
    Gaudi the bridge is loaded at ``import torch`` in the same way)."""
    import os

    if os.environ.get("PT_HPU_GPU_MIGRATION", "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    import importlib

    importlib.import_module("habana_frameworks.torch")
