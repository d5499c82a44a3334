"""A simulated Intel Gaudi per process: lazy-mode bridge, device timeline, cost model.

Importing this package makes ``"hpu"`` device strings work on the calling thread and starts
charging every aten op to the simulated device (see :mod:`hpu_runtime.bridge`). All times
it reports are simulated nanoseconds unless labelled wall-clock.

The habana_frameworks names live here: ``hpu_runtime.mark_step`` (``htcore.mark_step``),
the ``torch.hpu`` API (also ``hpu_runtime.hpu`` and ``torch.hpu`` itself), and
``hpu_runtime.metrics.metric_global`` / ``hpu_runtime.metric_global``.
"""

from __future__ import annotations

from . import import_hooks, metrics
from .bridge import activate, bridge_disabled, deactivate, is_active
from .device import SimDevice, StepTimes, get_device, reset_device
from .device_spec import DeviceSpec, get_device_spec
from .graphs import HPUGraph, ModuleCacher, graph, make_graphed_callables, wrap_in_hpu_graph
from .hpu import (
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
from .memory import HPUOutOfMemoryError
from .metrics import metric_global, metric_localcontext

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

import_hooks.install()  # `import habana_frameworks` finds hpu_runtime.habana_frameworks
import_hooks.warn_if_shadowed()
activate()
