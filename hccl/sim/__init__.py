"""The time plane of the emulated HCCL: what a collective costs on Gaudi's RoCE network.

Owns the topology (boxes, scale-up links, scale-out ports; TOML files in ``topologies/``),
the scale-out fabric (:mod:`.fabric`: leaf/spine switches, ECMP placement of HCL's flows,
max-min link sharing), the link model, collective algorithms expressed as schedules of
transfers (HCL's pairwise box iterations among them), the planner that times a schedule, the
timing seam the live process group and the planned DDP step both call (:mod:`.timing`),
subgroup placement, the DDP step plan, and the cluster's condition (:mod:`.cluster`:
per-card, per-step variability from a seed, :mod:`.variability`; slow cards, degraded or
failed links and dead ranks, :mod:`.whatif`; DDP steps planned with them,
:mod:`.straggler_plan`). Everything here is pure and deterministic: integer simulated
nanoseconds from sizes, ranks, topology and seeds, never a wall clock.

Must not import: torch.distributed, the data plane (:mod:`hccl.transport`), the torch face
(:mod:`hccl.process_group`), ``launchers`` or ``models``. (:mod:`.ddp_plan` and :mod:`.straggler_plan` replay a traced
step through :mod:`hpu_runtime`'s device model, and take DDP's bucket assignment from
``torch.distributed`` itself, without opening a process group; ``tests/unit/test_hccl_layering.py``
checks these rules.)
"""
