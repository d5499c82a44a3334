"""NOTE [HBM before host] (hpu_runtime/bridge/op_accounting.py): an op whose output does not fit
the simulated HBM raises HPUOutOfMemoryError before the host allocates anything.

The outputs below are 4 TiB or more: a host allocation of that size fails on any machine with
the host allocator's own error, so getting HPUOutOfMemoryError shows the check came first."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hpu_runtime as hpu
from hpu_runtime import HPUOutOfMemoryError, get_device_spec

HUGE = 1 << 40  # elements


@pytest.fixture(autouse=True)
def _fresh_device():
    hpu.reset_device()
    yield
    hpu.reset_device()


@pytest.mark.parametrize("make", [
    lambda one: one.expand(HUGE).contiguous(),
    lambda one: one.expand(HUGE) + 1,
    lambda one: one.expand(HUGE).clone(),
    lambda one: torch.outer(one.expand(1 << 20), one.expand(1 << 20)),
    lambda one: one.repeat(HUGE),
    lambda one: one.new_zeros(HUGE),
    lambda one: torch.arange(HUGE, device="hpu"),
    lambda one: torch.zeros(HUGE, device="hpu"),
], ids=["expand-contiguous", "broadcast-add", "clone", "outer", "repeat", "new_zeros", "arange", "zeros"])
def test_an_output_larger_than_the_hbm_fails_before_the_host_allocates(make):
    one = torch.ones(1, device="hpu")
    live = hpu.get_device().hbm.live_bytes
    with pytest.raises(HPUOutOfMemoryError, match="tried to allocate"):
        make(one)
    assert hpu.get_device().hbm.live_bytes == live
    assert (one + 1).item() == 2.0  # the device goes on


def test_small_outputs_of_views_larger_than_the_hbm_still_work():
    """On a card with 1 MiB of HBM, a 4 MiB expanded view is fine, and so is its sum (one
    element): no false out-of-memory; materializing the view is refused."""
    hpu.reset_device(dataclasses.replace(get_device_spec("gaudi2"), hbm_bytes=1 << 20))
    view = torch.ones(1, device="hpu").expand(1 << 20)
    assert view.sum().item() == float(1 << 20)
    assert view[:3].contiguous().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(HPUOutOfMemoryError):
        view.contiguous()
