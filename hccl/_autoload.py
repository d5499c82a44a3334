"""Entry point torch calls at import (group ``torch.backends``): registers "hccl" cheaply.

Kept free of heavy imports: it runs in every process that imports torch while this package
is installed (disable with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
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
