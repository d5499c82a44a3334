"""The bridge: PyTorch ops in, lazy graphs and recipes out, charged to the device model.

Named after Intel's PyTorch bridge, which does the same on a real Gaudi. Owns:

* ``dispatch``: the hooks the hpu kernel calls around every aten op on hpu tensors (and the
  tracer's dispatch mode over fake tensors);
* ``sim_device``: :class:`SimDevice`, the facade of one simulated card as the bridge drives
  it, composed of ``op_accounting`` (an aten call -> an op record, CPU fallback, fused
  kernels, emulated autocast casts), ``launcher`` (the pending graph, its launch through
  the recipe cache, compiled regions, HPU-graph capture) and the device model's parts;
* ``runtime``: this process's device (``get_device``, ``reset_device``, ``using_device``),
  created from ``config`` (:class:`RuntimeConfig`, the environment read once);
* ``graph_key``, ``recipe``/``recipe_disk``/``recipe_cache``: what makes two graphs one
  recipe, and the recipe cache in memory and on disk;
* ``fallback``: which ops run on the CPU; ``hpu_graphs``: HPU graph capture and replay;
  ``compile_backend``: ``torch.compile(backend="hpu_backend")``; ``autocast``:
  ``torch.autocast("hpu")``.

May import ``hpu_runtime.device``. Must not import ``hpu_runtime.api`` or
``hpu_runtime.tools`` (the planes above it), with one exception: ``hpu_runtime.api.metrics``,
the Gaudi runtime counters the bridge records into (compilations, CPU fallbacks, recipe-cache
hits), a leaf module that imports nothing of ``hpu_runtime``. Must not import ``hccl``,
``launchers`` or ``models``: collectives reach the device through its public methods.
``tests/unit/test_layering.py`` checks these rules.
"""
