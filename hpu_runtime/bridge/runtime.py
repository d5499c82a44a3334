"""This process's simulated Gaudi: created once from the environment, reset, or swapped.

One :class:`~hpu_runtime.bridge.sim_device.SimDevice` per process (one card per rank).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..api import metrics
from ..device.spec import DeviceSpec, get_device_spec
from .recipe_cache import ENV_VAR as RECIPE_CACHE_ENV, RecipeCache
from .sim_device import SimDevice

__all__ = ["get_device", "reset_device", "using_device"]

_device: SimDevice | None = None
_device_lock = threading.Lock()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_config() -> tuple[bool, int, DeviceSpec]:
    lazy = _env_int("PT_HPU_LAZY_MODE", 1)
    if lazy not in (0, 1, 2):
        raise ValueError(f"PT_HPU_LAZY_MODE={lazy} must be 0 or 1 (2: eager, as SynapseAI 1.x scripts set it)")
    lazy = 1 if lazy == 1 else 0
    max_ops = _env_int("PT_HPU_MAX_COMPOUND_OP_SIZE", 0)
    if max_ops < 0:
        raise ValueError(f"PT_HPU_MAX_COMPOUND_OP_SIZE={max_ops} must be >= 0")
    return bool(lazy), max_ops, get_device_spec(os.environ.get("HPU_DEVICE_SPEC", "gaudi2"))


_disk_config: tuple[str, object] | None = None  # (env value, DiskRecipeCache or None)


def _recipe_cache() -> RecipeCache:
    """A fresh in-memory cache over the (shared, long-lived) disk level of the environment.

    The disk level is opened once per config value, so its snapshot (what counts as a disk
    hit, see NOTE [disk recipe cache protocol]) survives ``reset_device``; this process's
    own compiles stay hits after a reset.
    """
    global _disk_config
    value = os.environ.get(RECIPE_CACHE_ENV, "").strip()
    if _disk_config is None or _disk_config[0] != value:
        if _disk_config is not None and _disk_config[1] is not None:
            _disk_config[1].close()
        _disk_config = (value, RecipeCache.from_env().disk)
    return RecipeCache(disk=_disk_config[1])


def get_device() -> SimDevice:
    """This process's simulated Gaudi, created on first use from the environment.

    Reads ``PT_HPU_LAZY_MODE`` (default 1), ``PT_HPU_MAX_COMPOUND_OP_SIZE`` (default 0 =
    unlimited), ``HPU_DEVICE_SPEC`` (default ``gaudi2``), ``PT_HPU_RECIPE_CACHE_CONFIG``
    and the CPU-fallback variables (see :mod:`hpu_runtime.bridge.fallback`).

    Raises:
        ValueError: a malformed environment variable, naming it.
    """
    global _device
    if _device is not None:
        return _device
    with _device_lock:
        if _device is None:
            lazy, max_ops, spec = _env_config()
            _device = SimDevice(spec, lazy=lazy, max_compound_ops=max_ops, recipes=_recipe_cache())
        return _device


def reset_device(spec: DeviceSpec | str | None = None) -> SimDevice:
    """Start this process's simulated device afresh, optionally as ``spec``.

    Empty timeline, empty in-memory recipe cache, HBM accounting from zero (tensors that are
    alive keep working but are no longer counted), metrics zeroed; the environment
    (``PT_HPU_LAZY_MODE``, ``PT_HPU_MAX_COMPOUND_OP_SIZE``, ``PT_HPU_RECIPE_CACHE_CONFIG``,
    fallback variables) is read again. The device object is re-initialised in place, so
    references held by the bridge and by process groups stay valid. ``spec`` (a DeviceSpec
    or a name) also becomes the ``HPU_DEVICE_SPEC`` of this process.

    Raises:
        ValueError: an unknown device name or a malformed environment variable.
    """
    if spec is not None:
        resolved = get_device_spec(spec) if isinstance(spec, str) else spec
        os.environ["HPU_DEVICE_SPEC"] = resolved.name
    else:
        resolved = None
    dev = get_device()
    lazy, max_ops, env_spec = _env_config()
    fresh_spec = resolved if resolved is not None else env_spec
    with dev.lock:
        dev.__init__(fresh_spec, lazy=lazy, max_compound_ops=max_ops, recipes=_recipe_cache())
    metrics.reset_all()
    return dev


@contextmanager
def using_device(dev: SimDevice) -> Iterator[SimDevice]:
    """Make ``dev`` this process's device inside the block (:func:`get_device` returns it).

    For a private device driven by the bridge, e.g. a traced step
    (:func:`hpu_runtime.tools.tracing.trace_step`); the previous device is restored on exit
    and is not otherwise touched. Not thread-aware: the swap is process-wide.
    """
    global _device
    with _device_lock:
        saved, _device = _device, dev
    try:
        yield dev
    finally:
        with _device_lock:
            _device = saved
