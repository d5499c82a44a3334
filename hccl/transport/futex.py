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

NOTE [a short scheduler slice for waiters]
On a machine with fewer free cores than runnable processes (ranks beside a busy process, 4
ranks on 2 cores), a rank woken by its doorbell must get a core before it can go on, and the
scheduler decides when. Linux's EEVDF scheduler (6.6 and later) lets a thread ask for a
shorter slice: ``sched_setattr`` with ``sched_runtime`` set, on an ordinary (``SCHED_OTHER``
or ``SCHED_BATCH``) thread, needs no privilege and is clamped to 0.1-100 ms (Linux commit
857b158dc5e8, "sched/eevdf: Use sched_attr::sched_runtime to set request/slice suggestion",
6.12); a thread with a shorter slice gets an earlier virtual deadline, so it runs sooner after
a wake-up and may preempt a longer-slice thread at once (commit 85e511df3cec, "sched/eevdf:
Allow shorter slices to wakeup-preempt", 6.12). A waiter's runtime between two waits is one
collective's host work (tens of microseconds for a small one), so the first time a thread
sleeps on a doorbell, :func:`request_short_slice` asks for the shortest slice, 0.1 ms
(:data:`WAITER_SLICE_NS`), for that thread only, keeping its policy and nice value; a
real-time or deadline thread, or a kernel that refuses (an older kernel ignores the field), is
left as it is. Its share of the CPU does not change (that is the nice value's), only how soon
it runs once woken; threads and processes it starts afterwards inherit the slice, as they
inherit every scheduling attribute. Measured on this 2-core machine (kernel 6.18, wall-clock, three runs
each, before and after, side by side): a 1 KB allreduce on 2 ranks beside one busy process
(``python -m hccl.tools.bench_transport --ranks 2 --load 1``) 136-150 us with the kernel's
default slice (1.4 ms here) and 119-131 us with this one; 4 ranks on 2 cores, with or without a
busy process, and the idle figures are unchanged within their run-to-run spread (about 10%), as
is the throughput of 4 compute-bound processes on 2 cores. Asking only while asleep (and
restoring the default on waking) was slower in both cases: two more system calls per sleep,
and a woken waiter with a short slice preempts a working rank with the default one.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading

__all__ = ["SPIN_S", "PURE_SPIN_S", "WAITER_SLICE_NS", "futex_wait", "futex_wake", "fence", "request_short_slice",
           "thread_slice_ns"]

SPIN_S = 50e-6
"""Wall seconds a waiter polls before it sleeps in the kernel: about one idle 2-rank 1 KB
allreduce round here, so ranks that run at once rarely sleep, while a waiter that shares its
core gives it up within 50 us."""

PURE_SPIN_S = 5e-6
"""The first part of :data:`SPIN_S`, polled without system calls (a peer on another core that
is about to publish); after it every poll also yields the core (``sched_yield``), so a peer
queued on this core runs at once instead of at the next scheduler tick."""

WAITER_SLICE_NS = 100_000
"""The scheduler slice a waiting thread asks for, in wall-clock nanoseconds (not simulated
time): the shortest Linux accepts (NOTE [a short scheduler slice for waiters])."""

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_SYS_SCHED_ATTR = {"x86_64": (314, 315), "amd64": (314, 315), "aarch64": (274, 275),
                   "arm64": (274, 275)}.get(platform.machine().lower())  # (sched_setattr, sched_getattr)
_FAIR_POLICIES = (0, 3)  # SCHED_OTHER, SCHED_BATCH: the policies whose slice EEVDF sets
_RESET_ON_FORK = 0x01  # SCHED_FLAG_RESET_ON_FORK (include/uapi/linux/sched.h)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_ALL = 0x7FFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (include/uapi/linux/sched/types.h), size 56 (SCHED_ATTR_SIZE_VER1)."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64), ("sched_util_min", ctypes.c_uint32),
                ("sched_util_max", ctypes.c_uint32)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_fence_lock = threading.Lock()
_slice_asked = threading.local()


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


def _sched_attr() -> _SchedAttr | None:
    """The calling thread's ``sched_attr``, or None where the kernel has no ``sched_getattr``."""
    if _SYS_SCHED_ATTR is None:  # pragma: no cover - only x86-64 and aarch64 Linux are supported
        return None
    attr = _SchedAttr()
    if _syscall(_SYS_SCHED_ATTR[1], 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) < 0:
        return None
    return attr


def thread_slice_ns() -> int | None:
    """The scheduler slice the calling thread has asked for (``sched_runtime``, wall ns; 0 or
    the kernel's default where it asked for none), or None where it cannot be read."""
    attr = _sched_attr()
    return None if attr is None else int(attr.sched_runtime)


def request_short_slice() -> bool:
    """Ask the scheduler for a :data:`WAITER_SLICE_NS` slice for the calling thread, once per
    thread (NOTE [a short scheduler slice for waiters]); its policy, nice value and other
    attributes are kept. Returns whether the thread now has it; never raises (a refusal leaves
    the thread as it was)."""
    done = getattr(_slice_asked, "result", None)
    if done is not None:
        return done
    ok = False
    attr = _sched_attr()
    if attr is not None and attr.sched_policy in _FAIR_POLICIES:
        if 0 < attr.sched_runtime <= WAITER_SLICE_NS:
            ok = True  # already as short (asked before, or by the user)
        else:
            ok = _set_slice(attr, WAITER_SLICE_NS) and thread_slice_ns() == WAITER_SLICE_NS
    _slice_asked.result = ok
    return ok


def _set_slice(attr: _SchedAttr, runtime_ns: int) -> bool:
    """Give the calling thread ``attr`` (its own, from :func:`_sched_attr`) with ``sched_runtime``
    set to ``runtime_ns`` (0: the kernel's default slice); whether the kernel took it."""
    attr.size = ctypes.sizeof(attr)
    attr.sched_flags &= _RESET_ON_FORK  # kept; the utilization clamps are not re-sent
    attr.sched_runtime = runtime_ns
    return _syscall(_SYS_SCHED_ATTR[0], 0, ctypes.byref(attr), 0) == 0
