"""The time plane of the emulated HCCL: what a collective costs on Gaudi's RoCE network.

Owns the topology (boxes, scale-up links, scale-out ports, leaf/spine switches; TOML files in
``topologies/``), the link model, collective algorithms expressed as schedules of transfers,
the planner that times a schedule, the timing seam the live process group and the planned
DDP step both call (:mod:`.timing`), subgroup placement and the DDP step plan. Everything
here is pure and deterministic: integer simulated nanoseconds from sizes, ranks and
topology, never a wall clock.

Must not import: torch.distributed, the data plane (:mod:`hccl.transport`), the torch face
(:mod:`hccl.process_group`), ``launchers`` or ``models``. (:mod:`.ddp_plan` replays a traced
step through :mod:`hpu_runtime`'s device model, and takes DDP's bucket assignment from
``torch.distributed`` itself, without opening a process group; ``tests/unit/test_hccl_layering.py``
checks these rules.)
"""
