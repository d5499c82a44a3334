"""The lazy-mode bridge: sees every aten op of the process and charges it to the simulated Gaudi.

NOTE [the bridge over CPU tensors]
Tensors stay ordinary CPU tensors: numerics are real. Two thread-local modes, pushed once
by :func:`activate` on the thread that imports ``hpu_runtime`` (the training thread):

* :class:`HpuFunctionMode` (``TorchFunctionMode``) handles the few Python-level calls that
  cannot reach the dispatcher with an ``"hpu"`` device (``tensor.to("hpu")``,
  ``torch.tensor(..., device="hpu")``, ``model.to("hpu")``): it maps the device to the CPU
  and charges the host->device copy. It turns host reads of device tensors (``.item()``,
  ``.cpu()``, ``.tolist()``, ``.numpy()``, printing) into lazy-mode launch points plus a
  host wait and a device->host copy; printing itself is not device work. Every other call
  passes straight through (one dict lookup).
* :class:`HpuDispatchMode` (``TorchDispatchMode``) maps ``device=hpu`` of factory ops to the
  CPU after checking the size against the simulated HBM (so an oversized tensor raises
  :class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` before the host allocates anything),
  and hands every op to :meth:`SimDevice.record`. Factory ops with an explicit
  ``device="cpu"`` are host work and are not charged; an op with ``device=cpu`` whose input
  is on the device (the ``_to_copy`` autograd runs to cast a gradient back to fp32 after
  autocast) is a device op like any other.

The dispatch mode sets ``ignore_compile_internals``: ``torch.compile`` traces without it and
runs the compiled artifact under it (see :mod:`hpu_runtime.bridge.compile_backend`).

NOTE [the bridge's hot path]
Every aten op of the process pays, on top of its own kernel: the dispatch mode's trip from
C++ into Python and back (torch's, about 2 us here, out of our hands), and
:meth:`HpuDispatchMode._dispatch` with :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.record`
(graph-key entry, memoized cost, storages read and written, one op record). The dispatch
body runs with torch-function handling off: it reads tensor attributes (``shape``,
``dtype``, ``untyped_storage()``...) several times per op, and with :class:`HpuFunctionMode`
on the stack each read would be a ``__torch_function__`` call (about 2 us each, for reads
that otherwise cost 0.1 us). Nothing in the dispatch body is user-facing, so nothing there
needs the function mode. ``python -m
hpu_runtime.tools.bench_overhead`` measures the whole (wall-clock, against plain PyTorch).

The hccl transport runs its own tensor ops under :func:`bridge_disabled` so the bridge never
charges the emulator's data movement as device work; collectives are recorded by the
process group itself.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .dynamo_skip import skip_dynamo
from .runtime import get_device
from ..device.memory import HPUOutOfMemoryError

__all__ = ["HpuFunctionMode", "HpuDispatchMode", "activate", "deactivate", "is_active", "bridge_disabled"]

log = logging.getLogger(__name__)

_CPU = torch.device("cpu")
_T = torch.Tensor
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_aten = torch.ops.aten
_LOCAL_SCALAR = _aten._local_scalar_dense.default


def _is_hpu(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith("hpu")
    return isinstance(value, torch.device) and value.type == "hpu"


def _is_cpu(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith("cpu")
    return isinstance(value, torch.device) and value.type == "cpu"


def _read_back(args) -> None:
    """A host read of ``args[0]``: launch, wait and copy back if it lives on the device."""
    t = args[0] if args else None
    if isinstance(t, torch.Tensor):
        dev = get_device()
        try:
            resident = dev.is_resident(t)
        except NotImplementedError:  # a tensor without storage (vmap's batched tensors): no host read
            return
        if resident:
            dev.host_read(t.nbytes, t)


def _host_read(func, args, kwargs):
    _read_back(args)
    return func(*args, **kwargs)


def _format(func, args, kwargs):
    """Printing: a host read of the tensor, then formatting that is not device work."""
    _read_back(args)
    with bridge_disabled():
        return func(*args, **kwargs)


def _to(func, args, kwargs):
    target = kwargs.get("device")
    if target is None and len(args) > 1:
        a1 = args[1]
        if isinstance(a1, (str, torch.device)):
            target = a1
        elif isinstance(a1, torch.Tensor):
            target = None  # to(other): other is a CPU tensor, nothing to map
    if target is None:
        return func(*args, **kwargs)
    if _is_hpu(target):
        if "device" in kwargs:
            kwargs = dict(kwargs, device=_CPU)
        else:
            args = (args[0], _CPU, *args[2:])
        out = func(*args, **kwargs)
        get_device().to_device(out)
        return out
    if _is_cpu(target):
        return _host_read(func, args, kwargs)
    return func(*args, **kwargs)


def _new_data(func, args, kwargs):
    """``torch.tensor(data, device="hpu")`` and friends: build on the host, copy to the device."""
    if not _is_hpu(kwargs.get("device")):
        return func(*args, **kwargs)
    kwargs = dict(kwargs, device=_CPU)
    with bridge_disabled():
        out = func(*args, **kwargs)
    get_device().to_device(out)
    return out


_HANDLERS = {
    _T.item: _host_read, _T.cpu: _host_read, _T.tolist: _host_read, _T.numpy: _host_read,
    _T.__bool__: _host_read, _T.__int__: _host_read, _T.__float__: _host_read,
    _T.__index__: _host_read,
    _T.__repr__: _format, _T.__format__: _format, _T.__str__: _format,
    _T.to: _to,
    torch.tensor: _new_data, torch.as_tensor: _new_data, torch.asarray: _new_data,
    _T.new_tensor: _new_data,
}


class HpuFunctionMode(TorchFunctionMode):
    """Maps ``"hpu"`` for calls the dispatcher cannot take, and turns host reads into launches."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        handler = _HANDLERS.get(func)
        if handler is None:
            return func(*args, **kwargs)
        return handler(func, args, kwargs)


def _factory_nbytes(args: tuple, kwargs: dict) -> int | None:
    """Bytes a factory op (``empty``, ``zeros``, ``randn``, ``full``...) will allocate, if known."""
    size = args[0] if args else kwargs.get("size")
    if not isinstance(size, (list, tuple)) or not all(isinstance(d, int) for d in size):
        return None
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    n = 1
    for d in size:
        n *= d
    return n * dtype.itemsize


class HpuDispatchMode(TorchDispatchMode):
    """Hands each aten op to the simulated device (host factories excepted)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # not torch's per-call disable wrapper: skip_dynamo below, once (NOTE [keeping dynamo
        # out, at no cost per call] in hpu_runtime.bridge.dynamo_skip)
        return False

    def __init__(self) -> None:
        super().__init__()
        self.device = get_device()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with _NO_TORCH_FUNCTION():  # NOTE [the bridge's hot path]
            return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None:
                if dev.type == "cpu" and not (args and isinstance(args[0], torch.Tensor)
                                              and self.device.is_resident(args[0])):
                    return func(*args, **kwargs)  # an explicit host tensor: not device work
                if dev.type == "hpu":
                    nbytes = _factory_nbytes(args, kwargs)
                    if nbytes is not None:
                        self.device.check_alloc(nbytes)
                    kwargs = dict(kwargs)
                    kwargs["device"] = _CPU
        else:
            kwargs = {}
        sig = self.device.check_outputs(func, args, kwargs)  # NOTE [HBM before host] in op_accounting
        out = func(*args, **kwargs)
        if func is _LOCAL_SCALAR:
            if self.device.is_resident(args[0]):
                self.device.host_read(args[0].element_size(), args[0])
            return out
        try:
            self.device.record(func, args, kwargs, out, sig)
        except HPUOutOfMemoryError:
            raise
        except Exception:  # noqa: BLE001 - accounting must never break the user's numerics
            log.warning("hpu_runtime: could not account %s", func, exc_info=True)
        return out

skip_dynamo(HpuDispatchMode.__torch_dispatch__)


_state = threading.local()


def activate() -> None:
    """Start charging ops on the calling thread (idempotent).

    ``"hpu"`` device strings, ``torch.hpu``, ``torch.autocast("hpu")`` and the compile
    backend are registered once per process by ``import hpu_runtime``, not here.
    """
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
