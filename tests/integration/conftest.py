"""Integration tests start real jobs (torchrun, mpiexec, Ray).

MPICH keeps a shared-memory file per host (``/dev/shm/mpich_shm_*``) and unlinks it at the end of
its job; a job whose ranks are killed mid-way can leave it behind. Full runs of this suite left
one now and then, from a test that does not check for leaks itself (the ones that matter call
``assert_no_new_shm``). After every integration test, a new MPICH file that no live process holds
within a few seconds is removed, so a run leaves ``/dev/shm`` as it found it, and reported as a
warning naming the test (pytest's warnings summary, which xdist forwards from its workers), so
the job that leaks can be found. A warning, not a failure: a test beside it under ``-n`` may
have created the file.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest

from tests.integration.launch_helpers import _leaked, shm_names

_MPICH = ("mpich_shm_",)
_GRACE_S = 5.0


class MpichSegmentLeft(UserWarning):
    """An MPICH shared-memory file was left unheld after an integration test (and removed)."""


@pytest.fixture(autouse=True)
def _mpich_segments_left_behind():
    before = shm_names(_MPICH)
    yield
    left = _leaked(before, _MPICH)
    deadline = time.monotonic() + _GRACE_S
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leaked(before, _MPICH)
    for name in sorted(left):
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            continue
        warnings.warn(MpichSegmentLeft(f"/dev/shm/{name} was left unheld by an MPI job during this test; removed"))
