"""Registration of the "hccl" backend with ``torch.distributed``."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["BACKEND_NAME", "register_backend", "create_process_group"]

BACKEND_NAME = "hccl"


def create_process_group(dist_backend_opts, backend_options=None):
    """Creator called by ``init_process_group``/``new_group`` (extended API)."""
    from .process_group import ProcessGroupHCCL

    # a subgroup (new_group, new_subgroups) gets its members' global ranks; the default group none
    global_ranks = list(getattr(dist_backend_opts, "global_ranks_in_group", None) or [])
    # a subgroup's members sit on the job's system, which the default group found (its hosts)
    world = dist.group.WORLD if global_ranks and dist.is_initialized() else None
    pg = ProcessGroupHCCL(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
        str(dist_backend_opts.group_id),
        global_ranks=global_ranks,
        job_world_size=dist.get_world_size() if global_ranks else dist_backend_opts.group_size,
        job_topology=getattr(world, "topology", None),
    )
    # torch returns a ProcessGroup subclass as is, before it would name it: name it here so
    # that destroy_process_group(subgroup) can unregister it
    pg.group_name = str(dist_backend_opts.group_id)
    return pg


def register_backend() -> None:
    """Register "hccl" for the cpu and hpu device types (idempotent)."""
    if hasattr(dist.Backend, BACKEND_NAME.upper()):
        return
    dist.Backend.register_backend(
        BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "hpu"]
    )
