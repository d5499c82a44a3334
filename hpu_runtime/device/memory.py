"""HBM model: live and peak device bytes of one simulated Gaudi card.

Pure accounting (no host allocation). The bridge calls ``check_alloc`` before it lets the host
allocate the CPU tensor that backs an HPU tensor, so an allocation larger than the simulated
HBM fails with ``HPUOutOfMemoryError`` without touching host memory, then ``allocate``/``free``
as storages come and go.

NOTE [the HBM counters, in the kernel library]
The counters are an ``array('q')`` that Python reads and only the hpu kernel library writes
(its builtin ``hbm``: check, allocate, free, reset; and the residency's registrations and
frees; :func:`hpu_runtime.bridge.device_type.builtins`, handed to this plane by ``import
hpu_runtime``: :mod:`hpu_runtime.device.native`), each in one C call under the GIL, so every
update is atomic without a lock, whichever thread frees a storage. The residency registers
and frees storages in the same library (:mod:`hpu_runtime.device.residency`), and the hpu
kernel compares an op's output bytes with the current device's free bytes itself (NOTE [an
op's entry, kept by the kernel] in :mod:`hpu_runtime.bridge.dispatch`), both without entering
Python per op: on the digits MLP a storage's registration and free were about 2.1 and 0.8 us
of Python each, 35 of each per step.

NOTE [what the HBM model counts]: bytes of tensor storages placed on the device, exactly as
requested (no allocator rounding, no workspace, no fragmentation). Real Gaudi reserves part
of HBM for the runtime; pass ``reserved_bytes`` to model that. Simulated, not measured.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from . import native
from .spec import DeviceSpec

__all__ = ["HBMModel", "HBMStats", "HPUOutOfMemoryError", "nbytes_of"]

_GIB = float(1 << 30)


def _fmt(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / _GIB:.2f} GiB)"


class HPUOutOfMemoryError(RuntimeError):
    """An allocation would exceed the simulated HBM.

    Attributes:
        requested_bytes: size of the refused allocation.
        live_bytes: bytes already allocated on the device.
        capacity_bytes: usable HBM of the device.
        device: device string, e.g. "hpu:0".
    """

    def __init__(self, *, requested_bytes: int, live_bytes: int, capacity_bytes: int,
                 device: str) -> None:
        self.requested_bytes = requested_bytes
        self.live_bytes = live_bytes
        self.capacity_bytes = capacity_bytes
        self.device = device
        free = max(capacity_bytes - live_bytes, 0)
        super().__init__(
            f"HPU out of memory on {device}: tried to allocate {_fmt(requested_bytes)}; "
            f"live {_fmt(live_bytes)}, capacity {_fmt(capacity_bytes)}, "
            f"free {_fmt(free)} (simulated HBM; nothing was allocated on the host)")

    def __reduce__(self):  # keep it picklable across processes
        return (_rebuild_oom, (self.requested_bytes, self.live_bytes, self.capacity_bytes,
                               self.device))


def _rebuild_oom(requested: int, live: int, capacity: int, device: str) -> HPUOutOfMemoryError:
    return HPUOutOfMemoryError(requested_bytes=requested, live_bytes=live,
                               capacity_bytes=capacity, device=device)


def nbytes_of(shape: Iterable[int], itemsize: int) -> int:
    """Bytes of a dense tensor of ``shape`` with elements of ``itemsize`` bytes.

    Raises:
        ValueError: on a negative dimension or a non-positive itemsize.
    """
    if itemsize <= 0:
        raise ValueError(f"itemsize must be > 0, got {itemsize}")
    n = 1
    for dim in shape:
        if dim < 0:
            raise ValueError(f"negative dimension {dim} in shape {tuple(shape)}")
        n *= int(dim)
    return n * itemsize


@dataclass(frozen=True, kw_only=True, slots=True)
class HBMStats:
    """Snapshot of one device's HBM accounting (names follow ``hpu.memory_stats()``)."""

    limit_bytes: int
    """Usable capacity ("Limit")."""
    in_use_bytes: int
    """Live bytes ("InUse")."""
    max_in_use_bytes: int
    """Peak live bytes since the last reset ("MaxInUse")."""
    num_allocs: int
    """Allocations accounted ("NumAllocs")."""
    num_frees: int
    """Frees accounted ("NumFrees")."""
    active_allocs: int
    """Allocations live now ("ActiveAllocs"; unlike the two counts above, not cleared by
    :meth:`HBMModel.reset_accumulated`)."""
    max_alloc_bytes: int
    """Largest single allocation ("MaxAllocSize")."""

    def as_dict(self) -> dict[str, int]:
        """The Gaudi-style ``memory_stats()`` dictionary."""
        return {"Limit": self.limit_bytes, "InUse": self.in_use_bytes,
                "MaxInUse": self.max_in_use_bytes, "NumAllocs": self.num_allocs,
                "NumFrees": self.num_frees, "ActiveAllocs": self.active_allocs,
                "MaxAllocSize": self.max_alloc_bytes}


_COUNTERS = 8
_LIVE, _PEAK = 1, 2
"""Where :attr:`HBMModel.counters` keeps the live bytes and the peak (``Counter`` in
``hpu_runtime/bridge/csrc/hpu_device.cpp``)."""


class HBMModel:
    """HBM accounting of one simulated device. Thread-safe (NOTE [the HBM counters, in the
    kernel library]).

    Args:
        capacity_bytes: HBM size in bytes (> 0), e.g. ``DeviceSpec.hbm_bytes``.
        reserved_bytes: bytes held back for the runtime (>= 0, < capacity).
        device: name used in error messages, e.g. "hpu:0".

    Raises:
        ValueError: on a non-positive capacity or a reservation outside [0, capacity).
    """

    def __init__(self, *, capacity_bytes: int, reserved_bytes: int = 0,
                 device: str = "hpu:0") -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be an int > 0, got {capacity_bytes!r}")
        if not isinstance(reserved_bytes, int) or not 0 <= reserved_bytes < capacity_bytes:
            raise ValueError(
                f"reserved_bytes must be an int in [0, capacity_bytes={capacity_bytes}), "
                f"got {reserved_bytes!r}")
        self.device = device
        self.total_bytes = capacity_bytes
        """Physical HBM in bytes."""
        self.capacity_bytes = capacity_bytes - reserved_bytes
        """Usable HBM in bytes (total minus reserved)."""
        self.counters = array("q", [self.capacity_bytes] + [0] * (_COUNTERS - 1))
        """The counters (NOTE [the HBM counters, in the kernel library]): usable bytes, live
        bytes, peak, allocations, frees, live allocations, largest allocation, and the next
        serial of the residency over this HBM (:mod:`hpu_runtime.device.residency`)."""
        self._hbm = native.functions()["hbm"]

    @classmethod
    def from_spec(cls, spec: DeviceSpec, *, device_index: int = 0,
                  reserved_bytes: int = 0) -> HBMModel:
        """HBM model of a card described by ``spec`` (capacity ``spec.hbm_bytes``)."""
        return cls(capacity_bytes=spec.hbm_bytes, reserved_bytes=reserved_bytes,
                   device=f"hpu:{device_index}")

    @property
    def live_bytes(self) -> int:
        """Bytes currently allocated."""
        return self.counters[_LIVE]

    @property
    def peak_bytes(self) -> int:
        """Highest ``live_bytes`` since construction or ``reset_peak()``."""
        return self.counters[_PEAK]

    @property
    def free_bytes(self) -> int:
        """Usable bytes not allocated."""
        return self.capacity_bytes - self.counters[_LIVE]

    def mem_get_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` as ``hpu.mem_get_info()`` returns."""
        return self.capacity_bytes - self.counters[_LIVE], self.total_bytes

    @staticmethod
    def _validate(nbytes: int) -> None:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")

    def oom(self, nbytes: int) -> HPUOutOfMemoryError:
        """The error refusing ``nbytes`` more (what the counters' builtins raise)."""
        return HPUOutOfMemoryError(requested_bytes=nbytes, live_bytes=self.counters[_LIVE],
                                   capacity_bytes=self.capacity_bytes, device=self.device)

    def check_alloc(self, nbytes: int) -> None:
        """Raise if ``nbytes`` more would not fit; changes nothing.

        Raises:
            HPUOutOfMemoryError: naming requested, live and capacity bytes.
            ValueError: if nbytes is negative or not an int.
        """
        self._validate(nbytes)
        self._hbm(self.counters, "check", nbytes, self.oom)

    def allocate(self, nbytes: int) -> None:
        """Check and account an allocation of ``nbytes`` (atomic).

        Raises:
            HPUOutOfMemoryError: if it does not fit; nothing is accounted then.
            ValueError: if nbytes is negative or not an int.
        """
        self._validate(nbytes)
        self._hbm(self.counters, "allocate", nbytes, self.oom)

    def free(self, nbytes: int) -> None:
        """Account the release of ``nbytes``.

        Raises:
            ValueError: if that is more than is live (a double free in the caller), or nbytes
                is negative or not an int.
        """
        self._validate(nbytes)
        self._hbm(self.counters, "free", nbytes, self.device)

    def reset_peak(self) -> None:
        """Set the peak to the current live bytes (``reset_peak_memory_stats``)."""
        self._hbm(self.counters, "reset_peak", 0, None)

    def reset_accumulated(self) -> None:
        """Clear the allocation and free counts (``reset_accumulated_memory_stats``); live bytes,
        the peak and the live allocations stay."""
        self._hbm(self.counters, "reset_accumulated", 0, None)

    def stats(self) -> HBMStats:
        """Snapshot of the counters (one copy: consistent)."""
        _, live, peak, allocs, frees, active, max_alloc, _ = self.counters.tolist()
        return HBMStats(limit_bytes=self.capacity_bytes, in_use_bytes=live, max_in_use_bytes=peak,
                        num_allocs=allocs, num_frees=frees, active_allocs=active, max_alloc_bytes=max_alloc)
