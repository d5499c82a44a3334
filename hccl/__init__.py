"""Emulated HCCL: the "hccl" torch.distributed backend over real bytes, with simulated timing.

Three planes, as folders:

- the torch face (this folder): registration (:mod:`.backend`, :mod:`._autoload`), the
  launcher environment (:mod:`.env`), the ProcessGroup (:mod:`.process_group`) and its
  Work objects (:mod:`.work`);
- the data plane, :mod:`hccl.transport`: transports and the engines that move real bytes;
- the time plane, :mod:`hccl.sim`: topology, link model, schedules, algorithms, planner and
  the timing seam, pure and shared by the live and planned drivers;

and :mod:`hccl.tools` for benchmarks. The face imports both planes; neither plane imports
the face or the other.

Importing this package registers the backend and does nothing else: it never changes
``os.environ`` (torch imports it at ``import torch``, through the ``torch.backends`` entry
point). Mapping an MPI launcher's variables to torch's (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``; defaults ``MASTER_ADDR``/``MASTER_PORT``) is explicit:
``import habana_frameworks.torch.distributed.hccl`` does it, as on Gaudi; ``python -m
launchers.mpi`` does it for its jobs; or call :func:`hccl.env.apply_mpi_env`.

The process-group classes load on first use: torch imports this package from its backend
entry point while torch itself (and maybe ``hpu_runtime``) is still initialising, so the
package body must stay light.
"""

from __future__ import annotations

import importlib

from .backend import BACKEND_NAME, register_backend
from .env import apply_mpi_env

__all__ = [
    "BACKEND_NAME",
    "register_backend",
    "apply_mpi_env",
    "ProcessGroupHCCL",
    "HcclWork",
    "CollectiveRecord",
    "HcclError",
    "CollectiveMismatchError",
    "HcclTimeoutError",
    "PeerFailure",
    "SettingsMismatchError",
]

_LAZY = {
    "ProcessGroupHCCL": ".process_group",
    "HcclError": ".process_group",
    "HcclWork": ".work",
    "CollectiveRecord": ".work",
    "CollectiveMismatchError": ".transport.shm_engine",
    "HcclTimeoutError": ".transport.shm",
    "PeerFailure": ".transport.shm",
    "SettingsMismatchError": ".agreement",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'hccl' has no attribute {name!r}")


register_backend()
