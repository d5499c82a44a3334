"""Tools over the three planes: the traced training step, its replay, and the benchmarks.

Owns:

* ``tracing``: one training step traced without data (FakeTensorMode); it drives the
  bridge, the API and the device model together, so it sits above all three;
* ``replay``: a traced step re-timed on a device with other launch points (the planner,
  ``hccl.sim.ddp_plan``, inserts DDP's buckets there), to its steady state;
* ``bench_overhead``, ``bench_hpex``, ``bench_autocast``, ``bench_device_type``: ``python -m
  hpu_runtime.tools.bench_*`` command lines (wall-clock or simulated, as each says);
* ``trace_plot``: a picture of the simulated lanes of profiler traces;
  ``habana_names``: which Gaudi names an installed package uses and their status here.

May import every plane of ``hpu_runtime`` and ``models`` (the benchmarks' reference
models). Must not import ``hccl`` or ``launchers``: the planner and the study CLIs import
the tools, not the reverse. ``tests/unit/test_layering.py`` checks these rules.
"""
