"""The lazy-mode bridge: sees every aten op of the process and charges it to the simulated Gaudi.

NOTE [the bridge over CPU tensors]
Tensors stay ordinary CPU tensors: numerics are real. Two thread-local modes, pushed once
by :func:`activate` on the thread that imports ``hpu_runtime`` (the training thread):

* :class:`HpuFunctionMode` (``TorchFunctionMode``) maps ``"hpu"`` device arguments to the
  CPU before torch's argument parsing (``tensor.to("hpu")``, ``torch.tensor(..., device=
  "hpu")``, ``model.to("hpu")``) and turns host reads (``.item()``, ``.cpu()``,
  ``.tolist()``, ``.numpy()``, printing) into lazy-mode launch points plus a host wait.
* :class:`HpuDispatchMode` (``TorchDispatchMode``) maps ``device=hpu`` of factory ops and
  records every non-view op's roofline cost in the pending graph of the process's
  :class:`~hpu_runtime.device.SimDevice`.

The hccl transport runs its own tensor ops under :func:`bridge_disabled` so the bridge never
charges the emulator's data movement as device work; collectives are recorded by the
process group itself.
"""

from __future__ import annotations

import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .cost_model import op_cost
from .device import get_device

__all__ = ["HpuFunctionMode", "HpuDispatchMode", "activate", "deactivate", "is_active", "bridge_disabled"]

_CPU = torch.device("cpu")
_T = torch.Tensor
_HOST_READS = frozenset(
    {_T.item, _T.cpu, _T.tolist, _T.numpy, _T.__repr__, _T.__format__, _T.__bool__, _T.__int__, _T.__float__}
)
_aten = torch.ops.aten
_LOCAL_SCALAR = _aten._local_scalar_dense.default


def _map_device(value: object) -> object:
    if isinstance(value, str):
        return _CPU if value.startswith("hpu") else value
    if isinstance(value, torch.device) and value.type == "hpu":
        return _CPU
    return value


class HpuFunctionMode(TorchFunctionMode):
    """Maps ``"hpu"`` device arguments to the CPU and turns host reads into launches."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        elif "device" in kwargs:
            kwargs["device"] = _map_device(kwargs["device"])
        if func in _HOST_READS:
            get_device().host_read()
        elif func is _T.to and len(args) > 1:
            args = tuple(_map_device(a) for a in args)
        return func(*args, **kwargs)


class HpuDispatchMode(TorchDispatchMode):
    """Records each non-view aten op's cost in the simulated device's pending graph."""

    def __init__(self) -> None:
        super().__init__()
        self.device = get_device()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None and dev.type == "hpu":
                kwargs = dict(kwargs)
                kwargs["device"] = _CPU
        else:
            kwargs = {}
        out = func(*args, **kwargs)
        if func is _LOCAL_SCALAR:
            self.device.host_read()
        elif not func.is_view:
            self.device.record_op(op_cost(self.device.spec, func, args, kwargs, out))
        return out


_state = threading.local()
_active_lock = threading.Lock()
_device_module_registered = False


def _register_device_module() -> None:
    global _device_module_registered
    if _device_module_registered:
        return
    from . import hpu as hpu_module

    try:
        torch._register_device_module("hpu", hpu_module)
    except RuntimeError:  # already registered (e.g. by a previous import under another name)
        pass
    _device_module_registered = True


def activate() -> None:
    """Make ``"hpu"`` usable and start charging ops, on the calling thread (idempotent)."""
    with _active_lock:
        _register_device_module()
    if getattr(_state, "modes", None):
        return
    fmode, dmode = HpuFunctionMode(), HpuDispatchMode()
    fmode.__enter__()
    dmode.__enter__()
    _state.modes = (fmode, dmode)


def deactivate() -> None:
    """Stop charging ops on the calling thread (pops the modes :func:`activate` pushed)."""
    modes = getattr(_state, "modes", None)
    if not modes:
        return
    fmode, dmode = modes
    dmode.__exit__(None, None, None)
    fmode.__exit__(None, None, None)
    _state.modes = None


def is_active() -> bool:
    """Whether the bridge charges ops on the calling thread."""
    return bool(getattr(_state, "modes", None))


class bridge_disabled:  # noqa: N801 - used like a function: `with bridge_disabled():`
    """Context manager: run tensor ops the bridge must not see (the emulator's own data movement)."""

    __slots__ = ("_guards",)

    def __enter__(self) -> None:
        self._guards = (torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction())
        for g in self._guards:
            g.__enter__()

    def __exit__(self, *exc) -> None:
        for g in reversed(self._guards):
            g.__exit__(*exc)
