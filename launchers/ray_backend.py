"""The Ray Train backend of launcher jobs: torchrun's rendezvous, no process group.

Imported by Ray Train's controller and workers (and by :func:`launchers.ray_train.run_job`),
never at the launcher's import: it needs Ray Train and torch. See NOTE [who initialises the
process group] in :mod:`launchers.ray_train` for why the target, not Ray, creates the group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray
import ray.train
from ray.train.backend import Backend
from ray.train.torch import TorchConfig

from launchers.env import LOOPBACK, find_free_port, rendezvous_host

__all__ = ["TargetRendezvousBackend", "TargetRendezvousConfig"]


def _node_of_worker() -> tuple[str, str]:
    """(Ray node id, node IP) of the calling worker."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _export_torch_env(master_addr: str, master_port: int) -> None:
    """Writes torchrun's six variables for the calling worker, ranks from Ray Train's context."""
    ctx = ray.train.get_context()
    os.environ.update({
        "RANK": str(ctx.get_world_rank()), "WORLD_SIZE": str(ctx.get_world_size()),
        "LOCAL_RANK": str(ctx.get_local_rank()), "LOCAL_WORLD_SIZE": str(ctx.get_local_world_size()),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    })


def _destroy_leftover_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class TargetRendezvousBackend(Backend):
    """Publishes the rendezvous; the target calls ``init_process_group`` itself.

    ``MASTER_ADDR`` is loopback when every worker is on one node, else rank 0's node IP
    (:func:`launchers.env.rendezvous_host`); ``MASTER_PORT`` is a free port there.
    """

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        nodes = worker_group.execute(_node_of_worker)
        addr = rendezvous_host([node for node, _ in nodes], nodes[0][1])
        port = worker_group.execute_single(0, find_free_port, LOOPBACK if addr == LOOPBACK else "")
        worker_group.execute(_export_torch_env, addr, port)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        try:  # a target that returned without destroying its group; dead workers are fine
            ray.get(worker_group.execute_async(_destroy_leftover_group), timeout=10)
        except Exception:  # noqa: BLE001
            pass


@dataclass
class TargetRendezvousConfig(TorchConfig):
    """``TorchConfig`` whose backend leaves ``init_process_group`` to the target
    (``backend`` is informational: the backend the target is expected to use)."""

    @property
    def backend_cls(self) -> type:
        return TargetRendezvousBackend
