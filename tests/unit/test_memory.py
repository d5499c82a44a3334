"""Tests of hpu_runtime.device.memory (the HBM model)."""

import pickle
import threading

import pytest

from hpu_runtime.device.spec import get_device_spec
from hpu_runtime.device.memory import HBMModel, HPUOutOfMemoryError, nbytes_of

GIB = 1 << 30


def test_live_and_peak():
    """allocate/free move live bytes; peak keeps the high-water mark until reset."""
    hbm = HBMModel(capacity_bytes=1000)
    hbm.allocate(300)
    hbm.allocate(500)
    hbm.free(300)
    assert (hbm.live_bytes, hbm.peak_bytes, hbm.free_bytes) == (500, 800, 500)
    hbm.reset_peak()
    assert hbm.peak_bytes == 500
    hbm.allocate(100)
    assert hbm.peak_bytes == 600
    s = hbm.stats()
    assert (s.num_allocs, s.num_frees, s.max_alloc_bytes) == (3, 1, 500)
    assert s.as_dict()["InUse"] == 600 and s.as_dict()["MaxInUse"] == 600
    assert s.as_dict()["ActiveAllocs"] == 2


def test_exact_fit_then_oom():
    """Filling HBM exactly is fine; one more byte is an OOM and nothing changes."""
    hbm = HBMModel(capacity_bytes=1024)
    hbm.allocate(1024)
    with pytest.raises(HPUOutOfMemoryError):
        hbm.allocate(1)
    assert hbm.live_bytes == 1024 and hbm.stats().num_allocs == 1
    hbm.allocate(0)  # zero-sized tensors always fit


def test_oom_message_names_sizes_for_40gb_on_gaudi():
    """A 40 GiB request on a 32 GiB Gaudi fails in check_alloc with all sizes named."""
    hbm = HBMModel.from_spec(get_device_spec("gaudi"), device_index=3)
    hbm.allocate(GIB)
    with pytest.raises(HPUOutOfMemoryError) as info:
        hbm.check_alloc(40 * GIB)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.requested_bytes, err.live_bytes, err.capacity_bytes) == (40 * GIB, GIB, 32 * GIB)
    msg = str(err)
    for text in (str(40 * GIB), str(GIB), str(32 * GIB), "hpu:3", "out of memory"):
        assert text in msg
    assert hbm.live_bytes == GIB  # check_alloc accounts nothing


def test_check_alloc_does_not_account():
    """check_alloc only checks."""
    hbm = HBMModel(capacity_bytes=10)
    hbm.check_alloc(10)
    assert hbm.live_bytes == 0 and hbm.stats().num_allocs == 0


def test_reserved_bytes_and_mem_get_info():
    """Reserved bytes reduce the usable capacity; mem_get_info gives (free, total)."""
    hbm = HBMModel(capacity_bytes=100, reserved_bytes=10)
    assert hbm.capacity_bytes == 90
    hbm.allocate(40)
    assert hbm.mem_get_info() == (50, 100)
    with pytest.raises(HPUOutOfMemoryError):
        hbm.allocate(51)


def test_double_free_and_bad_sizes():
    """Freeing more than is live, or negative/non-int sizes, are ValueErrors."""
    hbm = HBMModel(capacity_bytes=100)
    hbm.allocate(10)
    with pytest.raises(ValueError, match="only 10"):
        hbm.free(11)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            hbm.allocate(bad)
    with pytest.raises(ValueError):
        HBMModel(capacity_bytes=0)
    with pytest.raises(ValueError):
        HBMModel(capacity_bytes=10, reserved_bytes=10)


def test_error_pickles():
    """The OOM error survives pickling (it crosses process boundaries in tests/launchers)."""
    err = HPUOutOfMemoryError(requested_bytes=5, live_bytes=3, capacity_bytes=6, device="hpu:1")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.requested_bytes == 5


def test_concurrent_allocations_never_overcommit():
    """Threads racing to allocate never push live bytes over capacity."""
    hbm = HBMModel(capacity_bytes=1000)
    ok = []

    def worker():
        for _ in range(100):
            try:
                hbm.allocate(7)
                ok.append(1)
            except HPUOutOfMemoryError:
                pass

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert hbm.live_bytes == 7 * len(ok) <= 1000
    assert len(ok) == 1000 // 7


@pytest.mark.parametrize("shape, itemsize, expected",
                         [((2, 3), 4, 24), ((), 2, 2), ((0, 5), 4, 0), ([10], 1, 10)])
def test_nbytes_of(shape, itemsize, expected):
    """nbytes_of multiplies the dims by the item size."""
    assert nbytes_of(shape, itemsize) == expected


def test_nbytes_of_rejects_bad_input():
    """Negative dims and itemsize <= 0 are ValueErrors."""
    with pytest.raises(ValueError):
        nbytes_of((2, -1), 4)
    with pytest.raises(ValueError):
        nbytes_of((2,), 0)
