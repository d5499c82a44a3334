"""The lazy-mode bridge: sees every aten op of the process and charges it to the simulated Gaudi.

NOTE [the bridge over hpu tensors]
Tensors on the simulated card are tensors of torch's ``hpu`` device type over CPU storage
(NOTE [a device type for the simulated Gaudi] in :mod:`hpu_runtime.bridge.device_type`):
numerics are real. Two thread-local modes, pushed once by :func:`activate` on the thread
that imports ``hpu_runtime`` (the training thread):

* :class:`HpuDispatchMode` (``TorchDispatchMode``) hands every aten op to
  :meth:`SimDevice.record`, which charges the ops that read or write hpu tensors and leaves
  host work (ops on CPU tensors only) alone. A factory with ``device="hpu"`` is checked
  against the simulated HBM first (so an oversized tensor raises
  :class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` before the host allocates anything).
  Copies between host and device are transfers, not device ops: ``.to("hpu")`` of a CPU
  tensor (``_to_copy``) and ``copy_`` into an hpu tensor from a CPU one are a host->device
  PCIe copy; ``.cpu()``, ``.to("cpu")``, ``.tolist()`` (``_to_copy`` to the CPU), ``copy_``
  from an hpu tensor into a CPU one and ``.item()`` (``_local_scalar_dense``) are host reads:
  a lazy-mode launch point, a host wait and a device->host copy.
  ``torch.tensor(data, device="hpu")`` and friends build the tensor with the Python key
  excluded and then ``lift_fresh`` it: the lift is charged as a host->device copy.
* :class:`HpuFunctionMode` (``TorchFunctionMode``) handles the Python-level host reads
  (``.item()``, ``bool()``, ``int()``...) and printing (a host read, then formatting that is
  not device work). Every other call passes straight through (one dict lookup).

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

_T = torch.Tensor
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_aten = torch.ops.aten


def _read_back(t, nbytes: int | None = None) -> None:
    """A host read of ``t`` (``nbytes`` of it, default all): launch, wait and copy back if it is
    on the device."""
    if isinstance(t, torch.Tensor) and t.device.type == "hpu":
        dev = get_device()
        try:
            serial = dev.serial_of(t)
        except NotImplementedError:  # a tensor without storage (vmap's batched tensors): no host read
            return
        dev.read_serial(t.nbytes if nbytes is None else nbytes, serial)


def _host_read(func, args, kwargs):
    _read_back(args[0] if args else None)
    return func(*args, **kwargs)


def _format(func, args, kwargs):
    """Printing: a host read of the tensor, then formatting that is not device work."""
    _read_back(args[0] if args else None)
    with bridge_disabled():
        return func(*args, **kwargs)


_HANDLERS = {
    _T.item: _host_read, _T.__bool__: _host_read, _T.__int__: _host_read, _T.__float__: _host_read,
    _T.__index__: _host_read,
    _T.__repr__: _format, _T.__format__: _format, _T.__str__: _format,
}


class HpuFunctionMode(TorchFunctionMode):
    """Turns Python-level host reads into launches; printing is not device work."""

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


_NOT_A_TRANSFER = object()


def _to_copy(dev, func, args, kwargs):
    """``.to(device)`` between host and device: a PCIe copy or a host read, not a device op."""
    target, src = kwargs.get("device"), args[0]
    if target is None or target.type == src.device.type:
        return _NOT_A_TRANSFER
    if target.type == "hpu":
        dev.check_alloc(src.numel() * (kwargs.get("dtype") or src.dtype).itemsize)
        out = func(*args, **kwargs)
        dev.to_device(out)
        return out
    _read_back(src)
    return func(*args, **kwargs)


def _copy(dev, func, args, kwargs):
    """``dst.copy_(src)`` between host and device: a PCIe copy or a host read."""
    dst, src = args[0], args[1]
    into_device = dst.device.type == "hpu"
    if into_device == (src.device.type == "hpu"):
        return _NOT_A_TRANSFER
    if not into_device:
        _read_back(src)
        return func(*args, **kwargs)
    out = func(*args, **kwargs)
    dev.make_resident(dst)
    dev.charge_h2d(src.nbytes)
    return out


def _lift_fresh(dev, func, args, kwargs):
    """``torch.tensor(data, device="hpu")`` and friends build the tensor unseen (the Python
    dispatch key excluded), then lift it: its host->device copy is charged here."""
    out = func(*args, **kwargs)
    if out.device.type == "hpu":
        dev.to_device(out)
    return out


def _local_scalar(dev, func, args, kwargs):
    """``.item()`` and friends reach the dispatcher as ``_local_scalar_dense``: a host read."""
    _read_back(args[0], args[0].element_size())
    return func(*args, **kwargs)


_TRANSFERS = {_aten._to_copy.default: _to_copy, _aten.copy_.default: _copy,
              _aten.lift_fresh.default: _lift_fresh, _aten._local_scalar_dense.default: _local_scalar}


class HpuDispatchMode(TorchDispatchMode):
    """Hands each aten op to the simulated device; transfers between host and device are charged here."""

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
        if kwargs is None:
            kwargs = {}
        transfer = _TRANSFERS.get(func)
        if transfer is not None:
            out = transfer(self.device, func, args, kwargs)
            if out is not _NOT_A_TRANSFER:
                return out
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None:
                if dev.type != "hpu":
                    return func(*args, **kwargs)  # a host tensor (device="cpu"): not device work
                nbytes = _factory_nbytes(args, kwargs)
                if nbytes is not None:
                    self.device.check_alloc(nbytes)
        sig = self.device.check_outputs(func, args, kwargs)  # NOTE [HBM before host] in op_accounting
        out = func(*args, **kwargs)
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

    The ``hpu`` device type, ``torch.hpu``, ``torch.autocast("hpu")`` and the compile
    backend are registered once per process by ``import hpu_runtime``, not here. Backward
    of hpu tensors runs on the calling thread, as it did on CPU tensors (autograd would
    otherwise give the device a thread of its own, see NOTE [a device type for the simulated
    Gaudi] in :mod:`hpu_runtime.bridge.device_type`).
    """
    if getattr(_state, "modes", None):
        return
    fmode, dmode = HpuFunctionMode(), HpuDispatchMode()
    fmode.__enter__()
    dmode.__enter__()
    _state.multithreading = torch._C._is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)
    _state.modes = (fmode, dmode)


def deactivate() -> None:
    """Stop charging ops on the calling thread (pops the modes :func:`activate` pushed)."""
    modes = getattr(_state, "modes", None)
    if not modes:
        return
    fmode, dmode = modes
    dmode.__exit__(None, None, None)
    fmode.__exit__(None, None, None)
    torch.autograd.set_multithreading_enabled(_state.multithreading)
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
