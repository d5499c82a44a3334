"""``torch.load(..., map_location="hpu")`` gives tensors on the simulated card (NOTE [loading
onto the card] in hpu_runtime/bridge/serialization.py), and ``torch.hpu.device``."""

from __future__ import annotations

import io

import pytest
import torch

import hpu_runtime as hpu

COPY_NS = 573_000  # h2d_copy_ns of the gaudi2 spec (NOTE [host costs])
PCIE_4MIB_NS = 131_072  # 4 MiB at 32e9 bytes/s over PCIe


@pytest.fixture
def dev():
    d = hpu.reset_device("gaudi2")
    yield d
    hpu.reset_device("gaudi2")


def _checkpoint(**tensors) -> bytes:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


@pytest.mark.parametrize("location", ["hpu", "hpu:0", torch.device("hpu"), {"cpu": "hpu"}])
@pytest.mark.parametrize("weights_only", [True, False])
def test_map_location_hpu_gives_hpu_tensors_that_share_storage_as_saved(dev, location, weights_only):
    """Every tensor comes back on hpu:0 with its values; a view and its base still share one
    storage; the HBM counts that storage once, and the load is one host->device copy of it."""
    base = torch.randn(1024, 1024)  # 4 MiB
    data = _checkpoint(w=base, v=base[3:5], n=torch.arange(3))
    m0, h0 = hpu.memory_allocated(), dev.host_ns
    out = torch.load(io.BytesIO(data), map_location=location, weights_only=weights_only)
    assert {k: t.device for k, t in out.items()} == dict.fromkeys(("w", "v", "n"), torch.device("hpu", 0))
    host_ns = dev.host_ns - h0  # before any host read below
    assert hpu.memory_allocated() - m0 == (4 << 20) + 3 * 8
    assert out["v"].untyped_storage().data_ptr() == out["w"].untyped_storage().data_ptr()
    assert out["v"].storage_offset() == 3 * 1024
    assert host_ns == 2 * COPY_NS + PCIE_4MIB_NS  # two storages: 4 MiB, and the 24 bytes of n (under 1 ns)
    assert torch.equal(out["w"].cpu(), base) and torch.equal(out["v"].cpu(), base[3:5])
    assert (out["w"][:2, :2] + torch.ones(2, 2, device="hpu")).device.type == "hpu"  # usable with hpu tensors


def test_other_locations_and_saving_from_the_card_stay_on_the_host(dev):
    """``map_location`` "cpu", None or a callable are not intercepted; an hpu tensor's storage is
    host memory, saved with the ``cpu`` tag, so without ``map_location`` it loads on the CPU."""
    x = torch.randn(4, device="hpu")
    data = _checkpoint(x=x)
    for location in ("cpu", None, lambda storage, loc: storage):
        t = torch.load(io.BytesIO(data), map_location=location)["x"]
        assert t.device.type == "cpu" and torch.equal(t, x.cpu())


def test_an_index_the_process_does_not_have_is_torchs_error(dev):
    with pytest.raises(RuntimeError, match=r"map_location 'hpu:1': each process has one simulated card, hpu:0"):
        torch.load(io.BytesIO(_checkpoint(x=torch.ones(2))), map_location="hpu:1")


def test_torch_hpu_device_context_manager():
    """``torch.hpu.device`` / ``device_of`` (Gaudi's names, as ``torch.cuda.device``): one card per
    process, so index 0 (or None / -1) is accepted and changes nothing; others are refused."""
    for d in (0, None, -1, "hpu", "hpu:0", torch.device("hpu", 0)):
        with torch.hpu.device(d):
            pass
    with torch.hpu.device_of(torch.ones(1, device="hpu")), torch.hpu.device_of(torch.ones(1)):
        pass
    with pytest.raises(ValueError, match="hpu device 1: each process has one simulated card"):
        torch.hpu.device(1)
    with pytest.raises(ValueError, match="expects an hpu device"):
        torch.hpu.device("cpu")
