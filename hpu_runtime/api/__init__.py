"""The API surface: the names scripts written for Gaudi call.

Owns:

* ``hpu``: the ``torch.hpu``-like module (also registered as ``torch.hpu``): devices,
  ``mark_step``, memory statistics, streams and events;
* ``metrics``: Gaudi's ``metric_global`` / ``metric_localcontext`` counters;
* ``trace``: Chrome-trace export of the simulated timeline (``python -m
  hpu_runtime.api.trace merge``);
* ``hpex``: Gaudi's fused optimizers (one fused kernel each); ``hpu_ops``: Gaudi's
  ``torch.ops.hpu`` custom ops and ``hpex_kernels``: the ``hpex.kernels`` classes over them;
* ``profiler``: ``torch.profiler`` with ``ProfilerActivity.HPU``; ``optimum_clock``:
  optimum-habana's throughput figures on the simulated clock; ``support_matrix``: warnings
  where Intel's support matrix says a feature is unsupported;
* ``habana_frameworks/`` and ``habana_dataloader/``: Intel's module names, found by
  :mod:`hpu_runtime.import_hooks` as top-level packages; each file is a thin name map onto
  the modules here and in the bridge.

May import ``hpu_runtime.bridge`` and ``hpu_runtime.device``. Must not import
``hpu_runtime.tools``, ``launchers`` or ``models``; ``hccl`` only from
``habana_frameworks/torch/distributed/hccl.py`` (Gaudi's ``torch.distributed.hccl`` name).
``metrics`` imports nothing of ``hpu_runtime`` (the bridge records into it).
``tests/unit/test_layering.py`` checks these rules.
"""
