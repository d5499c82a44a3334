"""NOTE [a short scheduler slice for waiters] (hccl/transport/futex.py): the first time a thread
sleeps on a doorbell it asks the scheduler for a 0.1 ms slice, for itself only, keeping its
policy and nice value. The reference is the kernel's own record of the thread
(``sched_getattr``; ``os.sched_getscheduler`` and ``os.getpriority`` for policy and nice).
Kernels before 6.12 have no per-thread slice: there the request must leave the thread as it was."""

from __future__ import annotations

import os
import platform
import re
import threading

import pytest

from hccl.transport import futex

_MAJOR_MINOR = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", platform.release()).groups())
SLICES = _MAJOR_MINOR >= (6, 12)  # Linux commit 857b158dc5e8 (6.12): sched_runtime sets a fair thread's slice

if futex._sched_attr() is None:
    pytest.skip("sched_getattr is not available here (a seccomp filter, or not Linux)", allow_module_level=True)


def _default_slice() -> None:
    """Give the calling thread the kernel's default slice (``sched_runtime`` 0): a new thread
    inherits its creator's, which an earlier test in this process may have shortened."""
    assert futex._set_slice(futex._sched_attr(), 0)


def _in_thread(fn):
    """Run ``fn`` in a new thread with the default slice and no slice asked; return its result."""
    out = {}

    def body():
        try:
            _default_slice()
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_the_slice_is_the_calling_threads_and_keeps_its_nice_value():
    before_main = futex.thread_slice_ns()

    def ask():
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 5)  # lowering one's own priority needs no privilege
        default = futex.thread_slice_ns()
        ok = futex.request_short_slice()
        return default, ok, futex.thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(0)

    default, ok, after, nice, policy = _in_thread(ask)
    assert nice == 5 and policy == os.SCHED_OTHER
    if SLICES:
        assert ok and after == futex.WAITER_SLICE_NS != default
    else:
        assert not ok and after == default
    assert futex.thread_slice_ns() == before_main  # another thread's request leaves this one alone


def test_an_idle_policy_thread_is_left_alone():
    def ask():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # allowed without privilege
        before = futex.thread_slice_ns()
        return futex.request_short_slice(), futex.thread_slice_ns(), before, os.sched_getscheduler(0)

    ok, after, before, policy = _in_thread(ask)
    assert not ok and after == before and policy == os.SCHED_IDLE


def test_a_thread_asks_once():
    def ask():
        first = futex.request_short_slice()
        calls = []
        real = futex._syscall
        futex._syscall = lambda *a: calls.append(a) or real(*a)
        try:
            second = futex.request_short_slice()
        finally:
            futex._syscall = real
        return first, second, calls

    first, second, calls = _in_thread(ask)
    assert first == second and calls == []


@pytest.mark.skipif(not SLICES, reason="per-thread slices need Linux 6.12 (commit 857b158dc5e8)")
def test_a_waiter_that_slept_has_the_short_slice():
    from hccl.transport import shm
    from hccl.transport.shm import ShmArena, ShmSegment

    seg = ShmSegment("hccl_test_slice_solo", 4096, create=True)
    try:
        def wait():
            arena = ShmArena([seg], 0, timeout_s=20.0)
            before = futex.thread_slice_ns()
            slept = []
            real_wait = shm.futex_wait

            def arrived() -> bool:
                return bool(slept)

            shm.futex_wait = lambda addr, value, timeout_s: slept.append(futex.thread_slice_ns())
            try:
                arena._spin(arrived, lambda: [], "test")
            finally:
                shm.futex_wait = real_wait
            return before, slept

        before, slept = _in_thread(wait)
    finally:
        seg.close()
    assert before != futex.WAITER_SLICE_NS and slept == [futex.WAITER_SLICE_NS]
