"""``torch.load(..., map_location="hpu")``: checkpoints load onto the simulated card.

NOTE [loading onto the card]
On Gaudi, ``torch.load(f, map_location="hpu")`` (or ``torch.device("hpu")``, ``"hpu:0"``, a
dict mapping a saved location to one of those) gives tensors on the card: torch's deserializer
for ``hpu`` locations copies each storage there (``torch.serialization._deserialize``, under
``torch.hpu.device``), and ``torch._utils._rebuild_tensor`` builds each tensor on its storage's
device. Gaudi code loads weights that way (earlier optimum-habana ``GaudiTrainer`` releases
resumed a checkpoint so; the Gaudi vLLM plugin's tests load their weights so). Here an hpu
tensor's storage is host memory (NOTE [a device type for the simulated Gaudi] in
:mod:`hpu_runtime.bridge.device_type`), so torch's own path would rebuild CPU tensors. Instead:

* a deserializer registered ahead of torch's (:func:`install`) takes ``hpu`` locations: it
  refuses an index other than 0 (only ``hpu:0`` exists per process, while ``device_count()``
  counts the server's cards, as on Gaudi) and keeps the loaded host storage, remembering it
  (weakly);
* ``torch._utils._rebuild_tensor`` is wrapped: a tensor over a remembered storage is rebuilt as
  an hpu tensor over that same storage (views of one storage still share it, as after a real
  load), and, where the bridge charges this thread, its storage becomes resident with one
  host->device copy, as ``.to("hpu")`` is charged.

Saving is unchanged: an hpu tensor's storage is tagged ``cpu``, so a checkpoint saved here loads
on the CPU unless ``map_location`` says ``hpu`` (on Gaudi it would come back on the card).
A ``map_location`` callable is the caller's own: it is not intercepted.
"""

from __future__ import annotations

import re
import weakref

import torch

__all__ = ["install"]

_HPU_LOCATION = re.compile(r"hpu(:\d+)?$")
_PRIORITY = 19
"""Place in torch's deserializer registry: before CUDA's (20) and torch's own ``hpu`` one (24)."""

_to_card: weakref.WeakSet = weakref.WeakSet()  # host storages loaded for an hpu location
_installed = False


def _restore(storage, location: str):
    """A deserializer (see :func:`torch.serialization.register_package`): keep ``storage`` in
    host memory for an ``hpu`` location, remembered so its tensors are rebuilt on the card;
    None for any other location (the next deserializer takes it).

    Raises:
        RuntimeError: an index other than 0: the process has one card, ``hpu:0``, although
            ``device_count()`` counts the server's (as on Gaudi).
    """
    match = _HPU_LOCATION.match(location) if isinstance(location, str) else None
    if match is None:
        return None
    if match.group(1) not in (None, ":0"):
        raise RuntimeError(f"torch.load: map_location {location!r}: each process has one simulated card, hpu:0")
    _to_card.add(storage)  # torch.load hands every deserializer the storage as read: host memory
    return storage


def _rebuild_on_card(rebuild):
    def _rebuild_tensor(storage, storage_offset, size, stride):
        untyped = storage._untyped_storage
        if untyped not in _to_card:
            return rebuild(storage, storage_offset, size, stride)
        from .dispatch import bridge_disabled, is_active
        from .runtime import get_device

        with bridge_disabled():  # building the tensor is not device work; its copy is charged below
            t = torch.empty((0,), dtype=storage.dtype, device="hpu").set_(untyped, storage_offset, size, stride)
        if is_active():
            get_device().to_device(t)  # one host->device copy per storage (NOTE [loading onto the card])
        return t

    _rebuild_tensor.__wrapped__ = rebuild
    return _rebuild_tensor


def install() -> None:
    """Register the ``hpu`` deserializer and wrap ``torch._utils._rebuild_tensor`` (once per
    process; see NOTE [loading onto the card])."""
    global _installed
    if _installed:
        return
    torch.serialization.register_package(_PRIORITY, lambda storage: None, _restore)
    torch._utils._rebuild_tensor = _rebuild_on_card(torch._utils._rebuild_tensor)
    _installed = True
