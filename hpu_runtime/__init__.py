"""A simulated Intel Gaudi per process: lazy-mode bridge, device timeline, cost model.

Importing this package makes ``"hpu"`` device strings work on the calling thread and starts
charging every aten op to the simulated device (see :mod:`hpu_runtime.bridge.dispatch`). All
times it reports are simulated nanoseconds unless labelled wall-clock.

Three planes, each a folder whose ``__init__`` says what it owns and what it must not
import (checked by ``tests/unit/test_layering.py``), plus the tools above them:

* ``device/``: the device model (spec, cost model, streams and timeline, HBM, residency,
  lazy-graph records, the card's clocks); pure, deterministic;
* ``bridge/``: PyTorch ops in, graphs out (the kernel's hooks, :class:`SimDevice`, graph keys,
  recipe cache, CPU fallback, HPU graphs, compile backend, autocast, configuration);
* ``api/``: what scripts call (``torch.hpu``-like names, metrics, traces, ``hpex``, the
  ``habana_frameworks`` and ``habana_dataloader`` folders);
* ``tools/``: the traced training step and the benchmarks.

``import_hooks.py`` stays at the top: the wheel's ``.pth`` loads that one file by path at
interpreter start-up (see :mod:`hpu_runtime._packaging.build_backend`).

The habana_frameworks names live here: ``hpu_runtime.mark_step`` (``htcore.mark_step``),
the ``torch.hpu`` API (also ``hpu_runtime.api.hpu`` and ``torch.hpu`` itself), and
``hpu_runtime.api.metrics.metric_global`` / ``hpu_runtime.metric_global``.
"""

from __future__ import annotations

import torch

from . import import_hooks
from .api import hpu, metrics
from .api import hpu_ops as _hpu_ops
from .api import profiler as _profiler
from .api.hpu import (
    Event,
    Stream,
    current_device,
    device_count,
    get_device_name,
    is_available,
    mark_step,
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    memory_stats,
    reset_peak_memory_stats,
    set_device,
    stream,
    synchronize,
)
from .api.metrics import metric_global, metric_localcontext
from .bridge import autocast as _autocast
from .bridge import compile_backend as _compile_backend
from .bridge import device_type as _device_type
from .device import native as _native
from .bridge import serialization as _serialization
from .bridge import sync_batchnorm as _sync_batchnorm
from .bridge.dispatch import activate, bridge_disabled, deactivate, is_active
from .bridge.hpu_graphs import HPUGraph, ModuleCacher, graph, make_graphed_callables, wrap_in_hpu_graph
from .bridge.runtime import get_device, reset_device
from .bridge.sim_device import SimDevice
from .device.memory import HPUOutOfMemoryError
from .device.spec import DeviceSpec, get_device_spec
from .device.timeline import StepTimes

__all__ = [
    "activate",
    "deactivate",
    "is_active",
    "bridge_disabled",
    "SimDevice",
    "StepTimes",
    "get_device",
    "reset_device",
    "DeviceSpec",
    "get_device_spec",
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "mark_step",
    "get_device_name",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "mem_get_info",
    "memory_stats",
    "Stream",
    "Event",
    "stream",
    "HPUGraph",
    "graph",
    "make_graphed_callables",
    "ModuleCacher",
    "wrap_in_hpu_graph",
    "HPUOutOfMemoryError",
    "metrics",
    "metric_global",
    "metric_localcontext",
]



def _register() -> None:
    """Once per process: the ``hpu`` device type (NOTE [a device type for the simulated Gaudi] in
    :mod:`hpu_runtime.bridge.device_type`), ``torch.hpu``, ``torch.autocast("hpu")``, the ``"hpu_backend"``
    compile backend, the ``torch.ops.hpu`` custom ops, ``ProfilerActivity.HPU`` and the
    ``habana_frameworks`` import hook."""
    _device_type.install()
    _native.provide(_device_type.builtins())  # the device model's counters run on the library's builtins
    try:
        torch._register_device_module("hpu", hpu)
    except RuntimeError:  # already registered (e.g. by a previous import under another name)
        pass
    _autocast.install()
    _compile_backend.install()
    _hpu_ops.register()  # torch.ops.hpu.*: Gaudi's custom ops, as loading the bridge library defines them
    _profiler.install()  # torch.profiler with ProfilerActivity.HPU records the simulated device
    _serialization.install()  # torch.load(..., map_location="hpu") gives hpu tensors
    _sync_batchnorm.install()  # SyncBatchNorm's five CUDA-only ops, for hpu tensors
    import_hooks.patch_imported()  # modules imported before the emulator: support matrix, inductor, Trainer
    import_hooks.install()  # `import habana_frameworks` finds hpu_runtime/api/habana_frameworks
    import_hooks.warn_if_shadowed()


_register()
activate()
