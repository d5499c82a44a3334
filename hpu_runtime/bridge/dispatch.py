"""The lazy-mode bridge: sees every aten op on the simulated Gaudi and charges it.

NOTE [the bridge over hpu tensors]
Tensors on the simulated card are tensors of torch's ``hpu`` device type over CPU storage
(NOTE [a device type for the simulated Gaudi] in :mod:`hpu_runtime.bridge.device_type`):
numerics are real. The bridge is two hooks the hpu kernel calls around every aten op on hpu
tensors (NOTE [the bridge in the kernel]), on the thread where :func:`activate` switched them
on (the thread that imports ``hpu_runtime``: the training thread), and one wrapper:

* :func:`_before` checks the op's outputs against the simulated HBM (so an oversized tensor
  raises :class:`~hpu_runtime.device.memory.HPUOutOfMemoryError` before the host allocates
  anything; a factory with ``device="hpu"`` by its size) and :func:`_after` hands the op to
  :meth:`SimDevice.record`, which charges the ops that read or write hpu tensors.
  Copies between host and device are transfers, not device ops: ``.to("hpu")`` of a CPU
  tensor (``_to_copy``) and ``copy_`` into an hpu tensor from a CPU one are a host->device
  PCIe copy; ``.cpu()``, ``.to("cpu")``, ``.tolist()`` (``_to_copy`` to the CPU), ``copy_``
  from an hpu tensor into a CPU one and ``.item()`` (``_local_scalar_dense``) are host reads:
  a lazy-mode launch point, a host wait and a device->host copy.
  ``torch.tensor(data, device="hpu")`` and friends build the tensor unseen (torch excludes the
  Python dispatch key while it builds, and the hooks stay off there) and then ``lift_fresh``
  it: the lift is charged as a host->device copy.
* Printing an hpu tensor (``Tensor.__repr__``, which ``print``, ``str`` and ``format`` of a
  tensor with dimensions reach) is a host read, then formatting that is not device work:
  :func:`activate` wraps ``torch.Tensor.__repr__`` once per process, and the wrapper does
  that only on a thread where the bridge is active. ``.item()``, ``bool()``, ``int()``,
  ``float()`` and ``__index__`` need nothing of their own: each reaches the dispatcher as one
  ``_local_scalar_dense``, charged above as one host read.

There is no torch-function mode: one that passes every call on costs about 1.3 us per
Python-level torch call here (the digits MLP's step makes 122 of them: 0.155 ms, half the
plain step), and the bridge needed one only for the five host reads above, which the hooks
already see, and for printing, which the ``__repr__`` wrapper handles at no cost per call.

NOTE [the bridge in the kernel]
The bridge was a Python ``TorchDispatchMode`` until November 2026: every aten op of the
thread then made torch's trip from C++ into Python and back (the mode's dispatch-rule lookup,
the mode stack, the op's re-entry through ``OpOverload.__call__``), 2.1x plain PyTorch on the
digits MLP for a mode that does nothing. Now the hpu kernel (``bridge/csrc/hpu_device.cpp``)
calls the bridge itself, ``_before(func, args, kwargs, entry)`` before it runs the op's CPU
kernel (``entry``: NOTE [an op's entry, kept by the kernel]) and ``_after(func, args, kwargs,
out, token)`` after, with the op overload and the arguments
as a dispatch mode gets them (positional ones up to the last that differs from its default,
keyword-only ones by name, dtypes as ``torch.dtype``). What reaches the hooks:

* every aten op with an hpu tensor argument or ``device="hpu"``: the kernel is registered for
  each aten op with a CPU or composite-explicit kernel, so a composite op is one op, as a
  mode saw it; composite-implicit ops decompose above autograd, in both;
* ``.to("hpu")`` of a host tensor: the host tensor picks the host's ``_to_copy``, which the
  library wraps for ``device="hpu"``, one transfer (its ``empty`` and ``copy_`` unseen);
* Python kernels for hpu tensors (the ``torch.ops.hpu`` custom ops, SyncBatchNorm's kernels),
  through :func:`charged_as_one_op`: one op per call, their bodies unseen, as a mode saw them.

The hooks are off on other threads, inside themselves and inside the op they wrap (its
kernel's own ops), and wherever torch excludes the Python dispatch key (:func:`bridge_disabled`,
``torch.tensor(..., device="hpu")``). A view's output is passed as ``None``: its record
needs only its arguments, and a Python object made for it would break torch's
``Parameter(...)`` and ``as_subclass``, which detach or alias a tensor with dispatch modes
stashed and then give the result its first Python object. With no mode on, torch takes the
paths it takes on a Gaudi, where no mode is on either: ``reshape`` of a strided tensor that a
view can express is ``_reshape_alias`` (a mode made it ``view``), autograd adds gradients in place,
``scaled_dot_product_attention`` asks ``_fused_sdp_choice`` (host work, not charged). The
tracer runs its step on fake tensors, which no kernel sees: there the same hooks run from
:class:`HpuDispatchMode` (``activate(fake=True)``), and a planned step equals a live one to
the ns (``tests/integration/test_live_vs_planned.py``). ``torch.compile`` traces with fake
tensors too, so nothing is charged while it compiles, and its compiled graphs run through
the kernel like any op (NOTE [compiled regions] in :mod:`hpu_runtime.bridge.compile_backend`).

NOTE [the bridge's hot path]
In the steady state of a training step no Python runs per op in lazy mode, and in eager and
compile mode (``PT_HPU_LAZY_MODE=0``, with or without ``torch.compile(backend="hpu_backend")``)
none for most ops. For an op whose signature the kernel has seen (NOTE [an op's entry, kept by
the kernel]) the kernel itself compares its output bytes with the free HBM (the before hook
runs only when they do not fit, or for a transfer or a factory's size), and makes its op record
(NOTE [the op record, in the kernel] in :mod:`.op_accounting`) from its own values: no Python
object is made for the op's arguments or results, the storages are registered and freed in the
kernel library (NOTE [the HBM counters, in the kernel library] in
:mod:`hpu_runtime.device.memory`), the record joins the pending graph there, and in eager mode
the kernel launches the op when its recipe is compiled already (its lookup, its metric, the
compute stream). The Python hooks remain for a signature's first call, the copies between host
and device, the ops of HPU-graph captures, and in eager mode an op called with other numbers than
its record's where they are constants of the key (Adam's step size in ``addcdiv_``: five a step
on the digits MLP, each a new recipe). An eager ``mul_`` of two 16-float hpu tensors costs 5.0
us against 0.9 us plain (7.8-8.2 us with every eager op recorded and launched in Python; 3.99
us in lazy mode). Wall-clock per step on the digits MLP, alternated with the tree before each
change (``[PT_HPU_LAZY_MODE=0] python -m hpu_runtime.tools.bench_overhead --hidden 128 --rounds
5``): eager mode 3.25-3.83x plain with every eager record in Python, 3.19-3.21x with the
kernel's records and launches, 2.85-2.87x (against 3.10-3.13x in the same sitting) with
records that hold for their pinned numbers; eager mode with the model under ``torch.compile``
(the forward and backward ops in compiled regions) 1.9-2.3 ms per step -> 1.5-1.7 ms, against
0.55 ms for plain eager and 0.8 ms for ``torch.compile(backend="aot_eager")`` on the CPU. The kernel runs the hooks with
torch-function handling off (set in C++, at no cost; the Python context manager cost about
0.15x plain on the digits MLP): they read tensor attributes (``shape``, ``dtype``,
``untyped_storage()``...) several times per op, and a tensor subclass's (or a user's)
``__torch_function__`` would otherwise see each read (about 2 us each, for reads that
otherwise cost 0.1 us).

``python -m hpu_runtime.tools.bench_overhead --breakdown`` measures the whole and its parts
(wall-clock, against plain PyTorch, the digits MLP, whose step hooks 87 aten ops): the step on
hpu tensors with the bridge off is 1.17x, the whole bridge 1.95-1.99x; with the HBM check and
the op records in the Python hooks (the breakdown's "bridge, records in Python": the kernel
given no device, the storages and the entries still as below) 2.45x; the bridge before this
work went into the kernel was 2.75-2.8x, and as a Python dispatch mode it was
4.4-4.5x. The steps there, each measured alternately against the tree before it: the
residency and HBM counters in the kernel library and the kernel's own HBM comparison
(2.8x -> 2.6x: a storage's registration and free were about 2.1 and 0.8 us of Python, 35 of
each a step); the op record in the kernel (-> 2.55x: it still read the Python arguments);
numbers at scalar inputs sharing one entry (-> 2.25x: Adam's bias corrections had made ten new
entries a step, each a full signature, cost and meta run in Python); the record read from the
kernel's own values, with the op's Python arguments and results made only for a Python hook,
and the entry's slots read at their offsets (-> 2.05x); the state the record updates read in
the instance dicts (-> 1.95-1.99x). What is left, from throwaway variants of the kernel's
record at 2.25x (each returning early) and ``perf record`` of the step: the hook itself
(arguments' defaults, signature words and their lookup, the GIL, the entry's checks: the
record returning at once gave 1.6x, against 1.17x with the bridge off), the record's storages
(about 0.25x then: a Python storage object, a dict lookup and a tuple per tensor) and the
pending graph's bookkeeping (about 0.15x then, less since it reads the instance dicts). The
next steps, if they are ever needed: storages keyed by their ``StorageImpl`` in C++ rather than
by the Python storage's id, and the pending graph's lists and counters kept in C++ until
``mark_step`` reads them. Three later steps, each run alternately with the tree before them on a
2-core VM whose figures move by 10-20% from run to run (``[PT_HPU_LAZY_MODE=0] python -m
hpu_runtime.tools.bench_overhead --hidden 128 --rounds 7 --steps 60``, three runs each): the
library built with ``NDEBUG`` (``_CFLAGS`` in :mod:`.device_type`: pybind11 had asked whether the
thread holds the GIL at every reference count it changed, about 4% of a lazy op in ``perf``);
an eager op's recipe-cache hit and its metric counted in the kernel (NOTE [the op record, in the
kernel] in :mod:`.op_accounting`); a fold of a long step window in one pass over the stream's
intervals, 0.7 -> 0.2 us an interval (:func:`~hpu_runtime.device.timeline.busy`). Together: lazy
mode 2.34-2.73x -> 1.95-2.53x, eager mode 3.54-3.63x -> 3.13-3.27x on that VM (the plain step
there is about 1.0 ms, against 0.55 ms on the machine of the figures above). Those are ratios of
medians; the benchmark's ratio is now paired round by round
(:func:`~hpu_runtime.tools.bench_overhead.paired_ratio`), which gave 2.14-2.24x in lazy mode on
the same VM and tree. Six later cuts, on a 2-core VM slower again (the plain step 1.5-1.7 ms),
measured in wall-clock alternating with the tree before them and, since wall-clock there moves by
10-20% from run to run, in instructions per step as valgrind's callgrind counts them between
two marks of a running loop of steps (the same count on any load): the CPU kernel of a small
aten op run with the GIL kept (NOTE [the GIL around a small op]); the device's lock a
``DeviceLock`` of the kernel library, which the kernel takes in place (calling
``threading.RLock.acquire`` from C parsed its arguments each time: about 4% of a lazy
``x.add_(y)`` in ``perf``); the op record's tuples made at their final sizes (no list to convert,
the ``OpRecord`` filled in place); a new result's ``StorageRef`` made by the weak reference's
``__new__`` with its slots set in place and its bytes read from the C++ storage; a number new
to the device put in the scalar cache by the kernel (Adam's two bias corrections a step had sent
two ops a step to the after hook); and the transfer hooks' device types read from a cache
(``torch.device.type`` builds a new string at each read, about 0.8 us). Together: a step of the
digits MLP 4.85 M -> 4.57 M instructions (plain PyTorch: 2.98 M), lazy mode; ``bench_overhead
--hidden 128 --rounds 7 --steps 60``, seven runs of each tree alternated: lazy 1.90-2.46x (median
2.16x) -> 1.87-2.32x (median 2.09x), eager mode within the noise (2.89-3.42x -> 3.00-3.08x). A
cache of each op's last record (its tuples reused when the op ran again on the same storages)
was tried and dropped: a training step's ops almost always touch a storage new since their last
call (a result, a fresh gradient). In callgrind's counts the step's hpu kernels are about 36% of the
bridge's instructions, the op records 13% (the pending graph's bookkeeping in the instance dicts
3%, the storages' lookups 3%), the hook's own work about 9%; the extra instructions cost more
time than plain PyTorch's (1.53x the instructions for 1.9-2.3x the time: allocations, and
pointers followed through dicts and Python objects), so the next step is still the one named
above, the storages and the pending graph kept in C++. The pending graph's records are now kept
by the kernel as plain values and made only when read (NOTE [records made when read] in
:mod:`hpu_runtime.bridge.launcher`): a training step's launches hit the recipe cache and read
none, so their tuples, ints and ``OpRecord`` objects are never made or freed; with the
storages' bookkeeping in small inline vectors, a step is 4.54 M -> 4.39 M instructions (1.52x ->
1.47x plain; a throwaway variant that dropped the records altogether gave 4.35 M, the floor of
this step). What is left of the bridge's own cost, in callgrind's counts per step: the CPU
kernels' boxed path and the CPU views (the kernels themselves are plain PyTorch's), the
record's storages (a Python storage and its ``StorageRef`` per tensor: about 0.16 M), the
pending graph's counters and lists in the instance dicts (0.17 M with their ~18 dict reads an
op), the GIL taken for the hooks (0.18 M) and the signature's words and entry (0.1 M). A
launch's graph key now keeps its hash (NOTE [a graph key's hash] in
:mod:`hpu_runtime.bridge.launcher`): the digits MLP's ``mark_step`` 65-78 -> 46-61 us a call,
4.9% -> 3.7% of the bridge's step (wall-clock, the same VM), and the step 4.39 M -> 4.30 M
instructions (1.44x plain; eager mode 6.48 M -> 6.35 M over both changes). ``bench_overhead
--hidden 128 --rounds 7 --steps 60``, seven runs alternated with the tree before both changes:
lazy mode median 1.96x (1.77-2.14x) -> 1.85x (1.71-1.96x); eager mode within the noise.

NOTE [the GIL around a small op]
The hpu kernel holds the GIL for its hooks and its op record. Around the op's CPU kernel it
keeps it for an ``aten`` op whose tensor arguments hold at most 256 KiB (``keeps_gil`` in
``csrc/hpu_device.cpp``), and releases it otherwise. Releasing and taking back the GIL costs
about as much as such a small op's kernel, and while the GIL is released every tensor whose C++
reference count passes between one and two (the op's arguments, once the hook's copy of them and
the CPU views over them are dropped) takes the GIL again to change its Python object's count
(PyObject preservation in torch 2.13: ``incref_pyobject`` / ``decref_pyobject`` in
``c10/util/intrusive_ptr.h``); the hook's copy of the arguments is dropped before the GIL is, for
the same reason. A larger op, and any op outside the ``aten`` namespace (a c10d collective, a
user's custom op: either may wait for another thread), runs with the GIL released, as before, so
other Python threads run during it; they wait at most one small kernel's time otherwise.

NOTE [an op's entry, kept by the kernel]
Most of what the bridge needs about an op depends on the op and its signature only: the
signature itself (NOTE [graph key] in :mod:`hpu_runtime.bridge.graph_key`), the op's
:class:`~hpu_runtime.bridge.op_accounting.OpFacts`, the bytes its outputs allocate (NOTE [HBM
before host]), its graph-key entry and its cost. The bridge computes them once, into an
:class:`~hpu_runtime.bridge.op_accounting.OpEntry`, and the hpu kernel keeps that entry keyed by
the signature as words (``signature_words`` in ``csrc/hpu_device.cpp``: the op, then for each
argument Python gets its position and what the signature keeps of it: a tensor's dtype and
sizes, a number's type and value, a wrapped number's value, a string's bytes, a list's
elements). At the op's scalar inputs (where lazy mode makes a Python number a graph input, not
a constant of the graph key: NOTE [scalars as graph inputs] in :mod:`.graph_key`;
:attr:`~hpu_runtime.bridge.op_accounting.OpEntry.value_free`, which the kernel learns from the
op's first entry) the words keep a number's type and whether it is 1, not its value: Adam's
bias corrections, new numbers every step, share one entry per op instead of making two new
entries a step per parameter (:attr:`~hpu_runtime.bridge.op_accounting.OpEntry.varies`: the
record reads each call's numbers, and keeps a graph-key entry only where they are all graph
inputs; where some are constants of the key, as in eager mode, the kernel's record holds for
the calls that pass the same numbers there, its pins: NOTE [the op record, in the kernel] in
:mod:`.op_accounting`). On a later call whose words are equal, the before hook gets the entry and skips all
of that. When the entry has nothing left to check before the op runs (no transfer, no factory
size, no output bytes, as for a view or an in-place op: 48 of the 87 hooked ops per step of the
digits MLP, about 0.08x plain), the kernel skips the before hook and hands the entry to the
after hook; when all that is left is its output bytes against the free HBM
(:attr:`~hpu_runtime.bridge.op_accounting.OpEntry.kernel_nbytes`), the kernel compares them
with the HBM counters of the device :func:`~hpu_runtime.bridge.runtime.get_device` returns
(published to it by :mod:`hpu_runtime.bridge.runtime`, NOTE [the HBM counters, in the kernel
library] in :mod:`hpu_runtime.device.memory`) and calls the before hook only when they do not
fit (it then raises). Habana's eager bridge keys each op in C++ likewise
(``EagerExec::calculate_operator_key`` in HabanaAI/gaudi-pytorch-bridge
``habana_eager/eager_exec.cpp``). The words are compared in full,
not by hash alone, so two signatures that differ elsewhere never share an entry; a call whose arguments the words
cannot state exactly (a tensor subclass such as a fake tensor, symbolic sizes, a script
object) gets no entry and the bridge computes its signature itself, as the tracer's mode does
for every op. What depends on the call and not on its signature is never kept: the storages an
op reads and writes, whether autograd records it, and whether a copy moves data between host
and device (``copy_``, ``_to_copy``, ``lift_fresh``, ``_local_scalar_dense``: their signature
leaves the devices out, so their entries are never reused,
:attr:`~hpu_runtime.bridge.op_accounting.OpFacts.transfer`). The HBM check itself runs at every
call, against the entry's bytes. An entry's graph-key entry and cost are those of the device
that computed them (:attr:`~hpu_runtime.bridge.op_accounting.OpEntry.gen`), in its mode
(lazy or eager, inside a compiled region or not) and precision: after ``reset_device`` or a
change of either they are computed again. The kernel keeps at most 65,536 entries and starts
afresh beyond (new constants every step, a ``steps[i]``, must not pile up).

The hccl transport runs its own tensor ops under :func:`bridge_disabled` so the bridge never
charges the emulator's data movement as device work; collectives are recorded by the
process group itself.

NOTE [the emulator's own work is not the user's profile]
On a Gaudi, ``torch.profiler`` records the aten ops the script dispatches (each once, at the
dispatcher) and, with ``with_stack=True``, the script's Python; the bridge and HCCL are C++
and record nothing of their own. Here the bridge's accounting is Python, and under a profiler
each op would be recorded again underneath the user's: the real CPU kernel it runs (a second
``aten::add`` inside the first), the meta and fake-tensor ops of its accounting, the
transport's copies, each with its Python frames (a ResNet-50 step of Habana's
Model-References ``train.py``, which profiles ``with_stack=True``: 638,000 Python events and
158 MB of trace per rank, 97% of them the emulator's). So the hpu kernel runs the hooks and
the op's CPU kernel with torch's RecordFunction off, and while a profiler is on, the hooks and
the op as Python calls them (:func:`_hooked`: the tracer's mode, the bodies of
:func:`charged_as_one_op`), the collectives' own tensor ops (hccl's ``_EmulatorOps``) and the
device's ``uncharged()`` regions (an HPU graph's replay, a fused optimizer's body) run with it
off on the thread (:class:`~hpu_runtime.bridge.unrecorded.unrecorded`: no ``cpu_op`` events,
nothing in ``key_averages()``), and :mod:`hpu_runtime.api.profiler` drops the emulator's Python frames
from what the profiler hands the user. The user's op keeps its wall-clock duration, which
includes the bridge's host work for it, as the real bridge's host time is inside the op's
event on a Gaudi.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .dynamo_skip import skip_dynamo
from .runtime import get_device
from .unrecorded import unrecorded
from ..device.memory import HPUOutOfMemoryError
from .op_accounting import TRANSFER_OPS, OpEntry

__all__ = ["HpuDispatchMode", "activate", "deactivate", "is_active", "bridge_disabled", "charged_as_one_op"]

log = logging.getLogger(__name__)

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_aten = torch.ops.aten


_DEVICE_TYPES: dict = {}


def device_type(device: torch.device) -> str:
    """``device.type``, kept per device: ``torch.device.type`` makes a new string from the device
    type's name at every read (about 0.8 us on a 2-core VM, against 0.1 us for this lookup),
    and the transfer hooks read it several times a copy."""
    t = _DEVICE_TYPES.get(device)
    if t is None:
        t = device.type
        if len(_DEVICE_TYPES) < 256:
            _DEVICE_TYPES[device] = t
    return t


def _read_back(t, nbytes: int | None = None) -> None:
    """A host read of ``t`` (``nbytes`` of it, default all): launch, wait and copy back if it is
    on the device."""
    if isinstance(t, torch.Tensor) and device_type(t.device) == "hpu":
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


class _Token:
    """What the before hook tells the after hook beside an op's signature."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_DONE = _Token("nothing to record")  # a host read done before the op, or host work
_TO_DEVICE = _Token("copied to the device")  # .to("hpu") of a host tensor, lift_fresh
_H2D = _Token("copied into a device tensor")  # hpu.copy_(host tensor)
_TO_COPY, _COPY, _LIFT_FRESH = _aten._to_copy.default, _aten.copy_.default, _aten.lift_fresh.default


def _transfer(dev, func, args, kwargs):
    """The before hook of a copy between host and device (NOTE [the bridge over hpu tensors]):
    a token, or None when the op is device work (a copy or cast on the device)."""
    if func is _TO_COPY:
        target, src = kwargs.get("device"), args[0]
        if target is None:
            return None
        to = device_type(target)
        if to == device_type(src.device):
            return None
        if to == "hpu":
            dev.check_alloc(src.numel() * (kwargs.get("dtype") or src.dtype).itemsize)
            return _TO_DEVICE
        _read_back(src)
        return _DONE
    if func is _COPY:
        dst, src = args[0], args[1]
        into_device = device_type(dst.device) == "hpu"
        if into_device == (device_type(src.device) == "hpu"):
            return None
        if not into_device:
            _read_back(src)
            return _DONE
        return _H2D
    if func is _LIFT_FRESH:
        return _TO_DEVICE
    _read_back(args[0], args[0].element_size())  # _local_scalar_dense: .item() and friends
    return _DONE


def _before(func, args, kwargs, entry=None):
    """Before an op on hpu tensors runs (called as :func:`_hooked` says: NOTE [the bridge in the
    kernel]): the HBM check (NOTE [HBM before host] in :mod:`.op_accounting`) and host reads;
    returns the op's :class:`~hpu_runtime.bridge.op_accounting.OpEntry` or a token for
    :func:`_after`. ``entry``: the entry the kernel kept for this op and signature (NOTE [an
    op's entry, kept by the kernel]), or None.

    Raises:
        HPUOutOfMemoryError: the op's outputs would not fit; nothing was allocated.
    """
    dev = get_device()
    if entry is None or entry.facts.transfer:
        if func in TRANSFER_OPS:
            token = _transfer(dev, func, args, kwargs)
            if token is not None:
                return token
        nbytes = None
        if kwargs:
            device = kwargs.get("device")
            if device is not None:
                if device_type(device) != "hpu":
                    return _DONE  # a host tensor (device="cpu"): not device work
                nbytes = _factory_nbytes(args, kwargs)
        entry = dev.op_entry(func, args, kwargs, nbytes)
    return dev.check_outputs(func, args, kwargs, entry)


def _after(func, args, kwargs, out, token):
    """After an op on hpu tensors ran: its op record, or the copy a transfer made."""
    if token is _DONE:
        return
    dev = get_device()
    if token is _TO_DEVICE:
        if out is None:  # lift_fresh: a view of its argument (NOTE [the bridge in the kernel])
            out = args[0]
        if isinstance(out, torch.Tensor) and device_type(out.device) == "hpu":
            dev.to_device(out)
        return
    if token is _H2D:
        dev.make_resident(args[0])
        dev.charge_h2d(args[1].nbytes)
        return
    try:
        dev.record(func, args, kwargs, out, token)
    except HPUOutOfMemoryError:
        raise
    except Exception:  # noqa: BLE001 - accounting must never break the user's numerics
        log.warning("hpu_runtime: could not account %s", func, exc_info=True)


def _hooked(func, args, kwargs, run):
    """``run()`` (the op) between the hooks, as the hpu kernel calls them (``hooked`` in
    ``csrc/hpu_device.cpp``) for the callers in Python, :class:`HpuDispatchMode` and
    :func:`charged_as_one_op`: torch-function handling off for the hooks (NOTE [the bridge's
    hot path]), and, under a profiler, RecordFunction off for the hooks and the op's own work
    (NOTE [the emulator's own work is not the user's profile])."""
    with unrecorded():
        with _NO_TORCH_FUNCTION():
            token = _before(func, args, kwargs)
        out = run()
        with _NO_TORCH_FUNCTION():
            _after(func, args, kwargs, out, token)
    return out


skip_dynamo(_before)
skip_dynamo(_after)


_state = threading.local()  # .active: True (the kernel's hooks), an HpuDispatchMode, or None
_hooks = None  # the kernel library's switches (ctypes), once per process


def _kernel_hooks():
    """The hpu kernel library's C switches (:func:`~hpu_runtime.bridge.device_type.library`),
    the hooks handed to it the first time."""
    global _hooks
    if _hooks is None:
        from .device_type import library

        lib = library()
        lib.hpu_sim_set_hooks(_before, _after, OpEntry)
        _hooks = lib
    return _hooks


def charged_as_one_op(func, impl):
    """``impl`` (a Python kernel of ``func`` for hpu tensors: a custom op's body, a kernel
    registered for the ``HPU`` key) wrapped so the bridge charges one op per call, as Gaudi runs
    one kernel, and not the ops of its body (NOTE [the bridge in the kernel])."""

    def kernel(*args, **kwargs):
        lib = _hooks
        if lib is None or not lib.hpu_sim_hooks_on():
            return impl(*args, **kwargs)

        def body():
            lib.hpu_sim_inside(1)  # its ops: inside the op, as a kernel's own ops are
            try:
                return impl(*args, **kwargs)
            finally:
                lib.hpu_sim_inside(-1)

        return _hooked(func, args, kwargs, body)

    kernel.__wrapped__ = impl
    return skip_dynamo(kernel)


class HpuDispatchMode(TorchDispatchMode):
    """The bridge as a Python dispatch mode, for the tracer's fake tensors (NOTE [the bridge in
    the kernel]): the same hooks around every aten op the mode sees."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # not torch's per-call disable wrapper: skip_dynamo below, once (NOTE [keeping dynamo
        # out, at no cost per call] in hpu_runtime.bridge.dynamo_skip)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        return _hooked(func, args, kwargs, lambda: func(*args, **kwargs))


skip_dynamo(HpuDispatchMode.__torch_dispatch__)


def activate(*, fake: bool = False) -> None:
    """Start charging ops on the calling thread (idempotent).

    ``fake``: charge ops on fake tensors (the tracer's ``FakeTensorMode``, which no kernel
    sees) through a Python dispatch mode instead of the hpu kernel's hooks (NOTE [the bridge in
    the kernel]).

    The ``hpu`` device type, ``torch.hpu``, ``torch.autocast("hpu")`` and the compile
    backend are registered once per process by ``import hpu_runtime``, not here. Backward
    of hpu tensors runs on the calling thread, as it did on CPU tensors (autograd would
    otherwise give the device a thread of its own, see NOTE [a device type for the simulated
    Gaudi] in :mod:`hpu_runtime.bridge.device_type`).
    """
    if getattr(_state, "active", None) is not None:
        return
    if torch.Tensor.__repr__ is not _repr:  # once per process (NOTE [the bridge over hpu tensors])
        torch.Tensor.__repr__ = _repr
    if fake:
        mode = HpuDispatchMode()
        mode.__enter__()
        _state.active = mode
    else:
        _kernel_hooks().hpu_sim_set_active(1)
        _state.active = True
    _state.multithreading = torch._C._is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)


def deactivate() -> None:
    """Stop charging ops on the calling thread."""
    active = getattr(_state, "active", None)
    if active is None:
        return
    if active is True:
        _kernel_hooks().hpu_sim_set_active(0)
    else:
        active.__exit__(None, None, None)
    torch.autograd.set_multithreading_enabled(_state.multithreading)
    _state.active = None


def is_active() -> bool:
    """Whether the bridge charges ops on the calling thread."""
    return getattr(_state, "active", None) is not None


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
