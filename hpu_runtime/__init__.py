"""A simulated Intel Gaudi per process: lazy-mode bridge, device timeline, cost model.

Importing this package makes ``"hpu"`` device strings work on the calling thread and starts
charging every aten op to the simulated device (see :mod:`hpu_runtime.bridge`). All times
it reports are simulated nanoseconds unless labelled wall-clock.
"""

from __future__ import annotations

from .bridge import activate, bridge_disabled, deactivate, is_active
from .device import SimDevice, StepTimes, get_device, reset_device
from .device_spec import DeviceSpec, get_device_spec
from .hpu import (
    current_device,
    device_count,
    get_device_name,
    is_available,
    mark_step,
    set_device,
    synchronize,
)

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
]

activate()
