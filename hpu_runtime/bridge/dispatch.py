"""The lazy-mode bridge: sees every aten op of the process and charges it to the simulated Gaudi.

NOTE [the bridge over hpu tensors]
Tensors on the simulated card are tensors of torch's ``hpu`` device type over CPU storage
(NOTE [a device type for the simulated Gaudi] in :mod:`hpu_runtime.bridge.device_type`):
numerics are real. One thread-local mode, pushed once by :func:`activate` on the thread that
imports ``hpu_runtime`` (the training thread), and one wrapper:

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
* Printing an hpu tensor (``Tensor.__repr__``, which ``print``, ``str`` and ``format`` of a
  tensor with dimensions reach) is a host read, then formatting that is not device work:
  :func:`activate` wraps ``torch.Tensor.__repr__`` once per process, and the wrapper does
  that only on a thread where the bridge is active. ``.item()``, ``bool()``, ``int()``,
  ``float()`` and ``__index__`` need nothing of their own: each reaches the dispatcher as one
  ``_local_scalar_dense``, charged above as one host read.

There is no torch-function mode: one that passes every call on costs about 1.3 us per
Python-level torch call here (the digits MLP's step makes 122 of them: 0.155 ms, half the
plain step), and the bridge needed one only for the five host reads above, which the dispatch
mode already sees, and for printing, which the ``__repr__`` wrapper handles at no cost per
call.

The dispatch mode sets ``ignore_compile_internals``: ``torch.compile`` traces without it and
runs the compiled artifact under it (see :mod:`hpu_runtime.bridge.compile_backend`).

NOTE [the bridge's hot path]
Every aten op of the process pays, on top of its own kernel: the dispatch mode's trip from
C++ into Python and back (torch's, about 3.5 us here, out of our hands: a dispatch mode that
only passes each op on makes the digits MLP's step 2.1x plain PyTorch), and
:meth:`HpuDispatchMode._dispatch` with :meth:`~hpu_runtime.bridge.op_accounting.OpAccounting.record`
(graph-key entry, memoized cost, storages read and written, one op record). The dispatch
body runs with torch-function handling off: it reads tensor attributes (``shape``,
``dtype``, ``untyped_storage()``...) several times per op, and a tensor subclass's (or a
user's) ``__torch_function__`` would otherwise see each read (about 2 us each, for reads
that otherwise cost 0.1 us). ``python -m
hpu_runtime.tools.bench_overhead --breakdown`` measures the whole and its parts (wall-clock,
against plain PyTorch); the bridge's own work is about 5-10 us per op, and the same bridge
with that accounting switched off (its mode and this dispatch body alone, the breakdown's
"bridge, no accounting") is already 2.4-2.6x plain on the digits MLP, so a bridge within 2x
of plain PyTorch needs the per-op accounting in the C++ kernel, not in a Python mode. Of the
accounting, the HBM check before each op is the small part (the breakdown's "bridge, no HBM
check": 4.21x against the bridge's 4.43x, about 0.7 us per op) and the op record the large one
(1.55x of plain, about 4.6 us per op: storages read and written, their serials, the record).
The C++ device type alone (the same step on hpu tensors with the bridge off, the breakdown's "hpu
tensors, no bridge") is 1.16-1.34x plain on the digits MLP here, against 2.4-3.3x for a
no-op Python mode: that is the floor such a kernel would start from, leaving about 4 us per
op (the step dispatches 109 aten ops) for recording each op and for pricing the graph at
``mark_step``, which then could not be a Python loop over the ops on every launch (about 5-8
us per op today): it would have to reuse a recipe's accounting, as the real bridge reuses a
recipe.

The hccl transport runs its own tensor ops under :func:`bridge_disabled` so the bridge never
charges the emulator's data movement as device work; collectives are recorded by the
process group itself.

NOTE [the emulator's own work is not the user's profile]
On a Gaudi, ``torch.profiler`` records the aten ops the script dispatches (each once, at the
dispatcher) and, with ``with_stack=True``, the script's Python; the bridge and HCCL are C++
and record nothing of their own. Here the bridge is Python, and under a profiler each op it
is handed would be recorded again underneath the user's: the real CPU kernel it runs (a
second ``aten::add`` inside the first), the meta and fake-tensor ops of its accounting, the
transport's copies, each with its Python frames (a ResNet-50 step of Habana's
Model-References ``train.py``, which profiles ``with_stack=True``: 638,000 Python events and
158 MB of trace per rank, 97% of them the emulator's). So while a profiler is on,
:meth:`HpuDispatchMode.__torch_dispatch__`, the collectives' own tensor ops (hccl's
``_EmulatorOps``) and the device's ``uncharged()`` regions (an HPU graph's replay, a fused
optimizer's body) run with torch's
RecordFunction off on the thread (:class:`~hpu_runtime.bridge.unrecorded.unrecorded`: no
``cpu_op`` events, nothing in ``key_averages()``), and :mod:`hpu_runtime.api.profiler` drops
the emulator's Python frames, and the ``PythonDispatchMode`` event torch records on entering
the mode, from what the profiler hands the user. The user's op keeps its wall-clock duration, which includes the
bridge's host work for it, as the real bridge's host time is inside the op's event on a Gaudi.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .dynamo_skip import skip_dynamo
from .runtime import get_device
from .unrecorded import profiler_enabled, unrecorded
from ..device.memory import HPUOutOfMemoryError

__all__ = ["HpuDispatchMode", "activate", "deactivate", "is_active", "bridge_disabled"]

log = logging.getLogger(__name__)

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


_TENSOR_REPR = torch.Tensor.__repr__


def _repr(self, *args, **kwargs):
    """``torch.Tensor.__repr__`` on a thread where the bridge is active: a host read of the
    tensor, then formatting with the bridge off (its ops are not device work)."""
    if not is_active() or not torch._C._is_torch_function_enabled():  # off, or inside bridge_disabled()
        return _TENSOR_REPR(self, *args, **kwargs)
    _read_back(self)
    with bridge_disabled():
        return _TENSOR_REPR(self, *args, **kwargs)


_repr.__wrapped__ = _TENSOR_REPR
_repr.__doc__ = _TENSOR_REPR.__doc__ or _repr.__doc__


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
            if profiler_enabled():  # NOTE [the emulator's own work is not the user's profile]
                with unrecorded():
                    return self._dispatch(func, args, kwargs)
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
    if torch.Tensor.__repr__ is not _repr:  # once per process (NOTE [the bridge over hpu tensors])
        torch.Tensor.__repr__ = _repr
    dmode = HpuDispatchMode()
    dmode.__enter__()
    _state.multithreading = torch._C._is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)
    _state.modes = (dmode,)


def deactivate() -> None:
    """Stop charging ops on the calling thread (pops the mode :func:`activate` pushed)."""
    modes = getattr(_state, "modes", None)
    if not modes:
        return
    (dmode,) = modes
    dmode.__exit__(None, None, None)
    torch.autograd.set_multithreading_enabled(_state.multithreading)
    _state.modes = None


def is_active() -> bool:
    """Whether the bridge charges ops on the calling thread."""
    return bool(getattr(_state, "modes", None))


class bridge_disabled:  # noqa: N801 - used like a function: `with bridge_disabled():`
    """Context manager: run tensor ops the bridge must not see (the emulator's own data
    movement; host-side work such as data loading). A profiler still records them: host work
    is the script's (the emulator's own ops are hidden where they run, NOTE [the emulator's own
    work is not the user's profile])."""

    __slots__ = ("_guards",)

    def __enter__(self) -> None:
        self._guards = (torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction())
        for g in self._guards:
            g.__enter__()

    def __exit__(self, *exc) -> None:
        for g in reversed(self._guards):
            g.__exit__(*exc)
