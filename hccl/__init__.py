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

Importing this package registers the backend and maps MPI launcher variables to torch's
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; defaults ``MASTER_ADDR``/``MASTER_PORT``), as
``habana_frameworks.torch.distributed.hccl`` does on Gaudi. The process-group classes load on first use: torch imports this package
from its backend entry point while torch itself (and maybe ``hpu_runtime``) is still
initialising, so the package body must stay light.
"""

from __future__ import annotations

import importlib

from .backend import BACKEND_NAME, register_backend
from .env import apply_mpi_env

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
    "CollectiveMismatchError": ".transport.shm_engine",
    "HcclTimeoutError": ".transport.shm",
    "PeerFailure": ".transport.shm",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'hccl' has no attribute {name!r}")


try:
    apply_mpi_env()  # Open MPI / PMI variables -> RANK, WORLD_SIZE, LOCAL_RANK (as on Gaudi)
except ValueError as _exc:
    # torch imports us at `import torch`: an environment that is no launch (torch's own test
    # suite sets WORLD_SIZE without RANK) must never break it, nor warn (`python -W error`
    # would turn a warning into a failed `import torch`); init_process_group reports it.
    import logging

    logging.getLogger(__name__).debug("rank variables left as they are: %s", _exc)
register_backend()
