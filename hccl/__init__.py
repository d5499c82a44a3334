"""Emulated HCCL: the "hccl" torch.distributed backend over real bytes, with simulated timing.

Importing this package registers the backend (as ``habana_frameworks.torch.distributed.hccl``
does on Gaudi). The process-group classes load on first use: torch imports this package
from its backend entry point while torch itself (and maybe ``hpu_runtime``) is still
initialising, so the package body must stay light.
"""

from __future__ import annotations

import importlib

from .backend import BACKEND_NAME, register_backend

__all__ = [
    "BACKEND_NAME",
    "register_backend",
    "ProcessGroupHCCL",
    "HcclWork",
    "CollectiveRecord",
    "HcclError",
    "CollectiveMismatchError",
    "HcclTimeoutError",
    "PeerFailure",
]

_LAZY = {
    "ProcessGroupHCCL": ".process_group",
    "HcclError": ".process_group",
    "HcclWork": ".work",
    "CollectiveRecord": ".work",
    "CollectiveMismatchError": ".shm_engine",
    "HcclTimeoutError": ".transport.shm",
    "PeerFailure": ".transport.shm",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'hccl' has no attribute {name!r}")


register_backend()
