"""The C functions the device model's counters run on, provided by the plane that builds them.

The HBM counters and the residency (NOTE [the HBM counters, in the kernel library] in
:mod:`hpu_runtime.device.memory`) are updated by builtins of the hpu kernel library, which the
bridge builds and loads (:func:`hpu_runtime.bridge.device_type.builtins`); ``import
hpu_runtime`` hands them here (:func:`provide`) before anything can make a device, so this
plane needs no import of the bridge.
"""

from __future__ import annotations

__all__ = ["functions", "provide"]

_functions: dict | None = None


def provide(functions_by_name: dict) -> None:
    """Set the builtins by name (``hbm``,
    ``residency_register``, ``residency_on_free``, ...)."""
    global _functions
    _functions = functions_by_name


def functions() -> dict:
    """The builtins by name.

    Raises:
        RuntimeError: none provided yet (the kernel library is loaded by ``import hpu_runtime``).
    """
    if _functions is None:
        raise RuntimeError("hpu_runtime: the hpu kernel library's functions are not loaded yet"
                           " (import hpu_runtime loads them)")
    return _functions
