"""Blocking waits in the kernel for the shared-memory transport: a futex on a shared word.

NOTE [futex doorbells]
A rank that waits on its peers spins for a short while (:data:`SPIN_S`; after the first
:data:`PURE_SPIN_S` each poll yields the core), then sleeps in the kernel on a *doorbell*: a 32-bit word in its own control block, waited on with
``futex(FUTEX_WAIT)`` (the shared, not process-private, form: the word lives in an
anonymous shared mapping, so the kernel keys it by page and offset and every process that
maps the segment reaches the same wait queue). A rank that publishes something a peer may
wait for (a round, a point-to-point chunk, an abort) rings that peer's doorbell: it writes a
value the sleeper cannot have seen and calls ``futex(FUTEX_WAKE)``.

Ringing costs a system call (about 0.7 us here through ``ctypes``), so a publisher rings
only peers that raised their *sleeping* flag (another word of the sleeper's control
block). The flag and the published data form Dekker's pattern: the sleeper stores the flag
then reads the data; the publisher stores the data then reads the flag. x86's total store
order lets a load pass an earlier store, so each side puts a full fence between the two
(:func:`fence`); then at least one side sees the other's store: either the sleeper sees the
data and does not sleep, or the publisher sees the flag and rings. A ring that comes after
the sleeper read the doorbell but before it entered the kernel is not lost: the doorbell's
value changed, so ``FUTEX_WAIT`` returns at once. Doorbell values are
``(ringer + 1) << 24 | ringer's count``: distinct ringers write distinct values and one
ringer needs 2^24 rings to repeat one, so a sleeper can never mistake a new ring for the
value it read.

Why a futex and not the alternatives the issue lists (measured on this 2-core machine,
Python 3.11): an ``eventfd`` per rank is as cheap to ring (``os.eventfd_write`` 0.26 us, a
system call every time) but must be passed to every peer over a Unix socket
(``SCM_RIGHTS``: opening ``/proc/<pid>/fd/<n>`` of an eventfd fails with ``ENXIO``), and
sleeping needs a second call to drain it; a POSIX semaphore (``sem_post`` in glibc skips
the system call when no one sleeps) counts the rings no one waited for, so a rank that
rarely sleeps would, when it finally does, find thousands of stale posts and wake once for
each. The futex needs neither: the doorbell lives in the segment every peer already maps,
and waking is only paid when a peer sleeps.

Every sleep is bounded (the caller passes at most its next peer check, 50 ms), so a peer
that dies while others sleep is still found by the same pid check as before, and a wait
still has the group's timeout.

The fence is a lock acquire and release: on x86-64 each is a ``lock``-prefixed
read-modify-write (glibc's semaphore under CPython's lock), which orders every earlier
store before every later load; about 0.1 us. The shared-memory protocol already relies on
x86's ordering of stores (NOTE [shared-memory protocol] in :mod:`.shm`).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading

__all__ = ["SPIN_S", "PURE_SPIN_S", "futex_wait", "futex_wake", "fence"]

SPIN_S = 50e-6
"""Wall seconds a waiter polls before it sleeps in the kernel: about one idle 2-rank 1 KB
allreduce round here, so ranks that run at once rarely sleep, while a waiter that shares its
core gives it up within 50 us."""

PURE_SPIN_S = 5e-6
"""The first part of :data:`SPIN_S`, polled without system calls (a peer on another core that
is about to publish); after it every poll also yields the core (``sched_yield``), so a peer
queued on this core runs at once instead of at the next scheduler tick."""

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_ALL = 0x7FFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory fence (NOTE [futex doorbells]): stores before it are visible to other
    cores before any load after it is performed."""
    _fence_lock.acquire()
    _fence_lock.release()


def futex_wait(addr: int, expected: int, timeout_s: float) -> None:
    """Sleep until the 32-bit word at ``addr`` is woken, ``timeout_s`` wall seconds pass, or a
    signal arrives; returns at once if the word no longer holds ``expected``. The GIL is
    released while asleep. The caller re-checks its condition either way.

    Raises:
        OSError: the kernel refused the wait for another reason (a bad address).
    """
    if _SYS_FUTEX is None:  # pragma: no cover - only x86-64 and aarch64 Linux are supported
        raise OSError(errno.ENOSYS, f"hccl: no futex system call number for {platform.machine()}")
    ts = _Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9))
    if _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint(expected & 0xFFFFFFFF),
                ctypes.byref(ts), None, 0) < 0:
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(err, f"hccl: futex wait failed: {errno.errorcode.get(err, err)}")


def futex_wake(addr: int) -> None:
    """Wake every process sleeping on the 32-bit word at ``addr``."""
    _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, _ALL, None, None, 0)
