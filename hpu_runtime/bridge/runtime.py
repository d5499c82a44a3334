"""This process's simulated Gaudi: created once from the environment, reset, or swapped.

One :class:`~hpu_runtime.bridge.sim_device.SimDevice` per process (one card per rank), made
from the :class:`~hpu_runtime.bridge.config.RuntimeConfig` read when it is created
(:func:`get_device`) and read again by :func:`reset_device`; :func:`config` is that
configuration. :func:`using_device` lends the process's place to a private device (a
traced step).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..api import metrics
from ..device.spec import DeviceSpec, get_device_spec
from .config import RecipeCacheConfig, RuntimeConfig
from .recipe_cache import RecipeCache
from .recipe_disk import DiskRecipeCache
from .sim_device import SimDevice

__all__ = ["config", "get_device", "python_hooks_only", "reset_device", "using_device"]

_device: SimDevice | None = None
_config: RuntimeConfig | None = None
_device_lock = threading.Lock()
_disk: tuple[RecipeCacheConfig | None, DiskRecipeCache | None] | None = None


def _recipe_cache(cfg: RecipeCacheConfig | None, max_recipes: int) -> RecipeCache:
    """A fresh in-memory cache of ``max_recipes`` over the (shared, long-lived) disk level of ``cfg``.

    The disk level is opened once per configuration, so its snapshot (what counts as a disk
    hit, see NOTE [disk recipe cache protocol]) survives ``reset_device``; this process's
    own compiles stay hits after a reset.
    """
    global _disk
    if _disk is None or _disk[0] != cfg:
        if _disk is not None and _disk[1] is not None:
            _disk[1].close()
        _disk = (cfg, None if cfg is None else DiskRecipeCache(cfg))
    return RecipeCache(disk=_disk[1], max_recipes=max_recipes)


def _device_kwargs(cfg: RuntimeConfig) -> dict:
    return dict(lazy=cfg.lazy, max_compound_ops=cfg.max_compound_ops,
                recipes=_recipe_cache(cfg.recipe_cache, cfg.max_recipes), fallback=cfg.fallback)


def _publish(dev: SimDevice | None) -> None:
    """Hand the hpu kernel the device :func:`get_device` returns: its HBM counters, for the
    kernel's own check of an op's output bytes (NOTE [an op's entry, kept by the kernel] in
    :mod:`hpu_runtime.bridge.dispatch`), and its accounting, for the op records the kernel makes
    (NOTE [the op record, in the kernel] in :mod:`hpu_runtime.bridge.op_accounting`)."""
    from ..device.lazy_graph import OpRecord
    from .device_type import library

    if dev is None:
        library().hpu_sim_set_device(None, None, None)
    else:  # raises TypeError for an accounting the kernel cannot read (it keeps the previous one)
        library().hpu_sim_set_device(dev.hbm.counters, dev.ops, OpRecord)


def get_device() -> SimDevice:
    """This process's simulated Gaudi, created on first use from the environment.

    Reads :class:`~hpu_runtime.bridge.config.RuntimeConfig` (``PT_HPU_LAZY_MODE``,
    ``PT_HPU_MAX_COMPOUND_OP_SIZE``, ``HPU_DEVICE_SPEC``, ``PT_HPU_RECIPE_CACHE_CONFIG``,
    ``HABANA_PGM_LRU_MAX``, the CPU-fallback variables, ``PT_HPU_AUTOCAST_FP32_ON_HOST``) once.

    Raises:
        ValueError: a malformed environment variable, naming it.
    """
    global _device, _config
    if _device is not None:
        return _device
    with _device_lock:
        if _device is None:
            cfg = RuntimeConfig.from_env()
            _device = SimDevice(cfg.spec, **_device_kwargs(cfg))
            _config = cfg
            _publish(_device)
        return _device


def config() -> RuntimeConfig:
    """The configuration this process's device was created (or last reset) with."""
    get_device()
    return _config if _config is not None else RuntimeConfig.from_env()  # inside using_device() only


def reset_device(spec: DeviceSpec | str | None = None) -> SimDevice:
    """Start this process's simulated device afresh, optionally as ``spec``.

    Empty timeline, empty in-memory recipe cache, HBM accounting from zero (tensors that are
    alive keep working but are no longer counted), metrics zeroed; the environment is read
    again (:class:`~hpu_runtime.bridge.config.RuntimeConfig`). The device object is
    re-initialised in place, so references held by the bridge and by process groups stay
    valid. ``spec`` (a DeviceSpec or a name) also becomes the ``HPU_DEVICE_SPEC`` of this
    process.

    Raises:
        ValueError: an unknown device name or a malformed environment variable; the device
            is then left as it was.
    """
    global _config
    resolved = None
    if spec is not None:
        resolved = get_device_spec(spec) if isinstance(spec, str) else spec
        os.environ["HPU_DEVICE_SPEC"] = resolved.name
    dev = get_device()
    cfg = RuntimeConfig.from_env()
    with dev.lock:
        dev.__init__(resolved if resolved is not None else cfg.spec, **_device_kwargs(cfg))
        _config = cfg
    with _device_lock:
        if _device is dev:
            _publish(dev)
    metrics.reset_all()
    return dev


@contextmanager
def using_device(dev: SimDevice) -> Iterator[SimDevice]:
    """Make ``dev`` this process's device inside the block (:func:`get_device` returns it).

    For a private device driven by the bridge, e.g. a traced step
    (:func:`hpu_runtime.tools.tracing.trace_step`); the previous device is restored on exit
    and is not otherwise touched. The swap is process-wide, not per thread.
    """
    global _device
    with _device_lock:
        saved, _device = _device, dev
        _publish(dev)
    try:
        yield dev
    finally:
        with _device_lock:
            _device = saved
            _publish(saved)


@contextmanager
def python_hooks_only() -> Iterator[None]:
    """Inside the block the hpu kernel has no device: it neither compares a kept entry's output
    bytes with the HBM nor makes op records itself, and the bridge's Python hooks do both, as
    they did before that moved into the kernel (NOTE [the op record, in the kernel] in
    :mod:`hpu_runtime.bridge.op_accounting`): for the overhead benchmark and for tests that
    compare the two. The process's device is handed back to the kernel on exit."""
    _publish(None)
    try:
        yield
    finally:
        _publish(get_device())
