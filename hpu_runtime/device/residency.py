"""Which tensor storages are on the simulated HBM, and the serials that name them.

NOTE [device residency and HBM]
The storages of the card's tensors (``hpu`` tensors, NOTE [a device type for the simulated
Gaudi] in :mod:`hpu_runtime.bridge.device_type`) are counted on the simulated HBM: the hpu
outputs of ops the bridge charges, tensors copied with ``.to("hpu")``, factories with
``device="hpu"``, and any other hpu storage at its first use by a charged op. Each is held
by a weak reference to its storage, so HBM is freed exactly when the storage dies (also when
autograd releases saved activations). Host tensors are not counted, and ops on host tensors
only (parameter initialisation before ``model.to("hpu")``, a CPU optimizer step counter) are
host work, not charged. ``.to("hpu")`` is a host->device PCIe copy; ``.cpu()``/``.item()``
of an hpu tensor is a host read (launch, wait, device->host copy).

Each resident storage gets a *serial*, an integer handed out once and never reused (a
Python ``id`` is reused as soon as an object dies): op records name storages by serial
(NOTE [op records and storage serials] in :mod:`hpu_runtime.device.lazy_graph`).

Registering a storage and freeing it are builtins of the hpu kernel library
(``residency_register`` and the weak references' callback ``residency_on_free`` makes:
:mod:`hpu_runtime.device.native`), which the op record's ``storage_io`` calls
without entering Python (NOTE [an op's storages, in the kernel library] in
:mod:`hpu_runtime.bridge.op_accounting`), each atomic under the GIL as the HBM counters they
update (NOTE [the HBM counters, in the kernel library] in :mod:`.memory`). The owner
(:class:`~hpu_runtime.bridge.sim_device.SimDevice`) still calls it under its lock. Storages are
duck-typed (``nbytes()``, weak-referenceable).
"""

from __future__ import annotations

import weakref

from . import native
from .memory import HBMModel

__all__ = ["StorageRef", "Residency"]


class StorageRef(weakref.ref):
    """Weak reference to a resident storage: its ``id`` (``key``), HBM bytes and serial."""

    __slots__ = ("key", "nbytes", "serial")


class Residency:
    """The resident storages of one card, by ``id`` of the storage, and their HBM bytes.

    Args:
        hbm: the card's HBM model; :meth:`register` allocates in it (and raises its
            out-of-memory error), a storage's death frees it.

    Attributes:
        refs: ``id(storage) -> StorageRef`` of every resident storage (read it directly on
            hot paths: ``refs.get(id(t.untyped_storage()))``).
        state: ``(refs, hbm.counters, StorageRef, on_free, hbm.oom)``, what the kernel
            library's builtins take (``storage_io``, ``residency_register``).
    """

    __slots__ = ("hbm", "refs", "state", "_register")

    def __init__(self, hbm: HBMModel) -> None:
        fn = native.functions()
        self.hbm = hbm
        self.refs: dict[int, StorageRef] = {}
        self.state = (self.refs, hbm.counters, StorageRef, fn["residency_on_free"](self.refs, hbm.counters), hbm.oom)
        self._register = fn["residency_register"]

    def register(self, storage) -> StorageRef:
        """Make ``storage`` resident (allocating its bytes on the HBM, taking the next serial)
        unless it is; its ref.

        Raises:
            HPUOutOfMemoryError: if it does not fit in the remaining HBM; nothing changes then.
        """
        return self._register(self.state, storage)

    def serial_of(self, t) -> int:
        """The serial of tensor ``t``'s resident storage, or -1 if it is not resident."""
        ref = self.refs.get(id(t.untyped_storage()))
        return -1 if ref is None else ref.serial
