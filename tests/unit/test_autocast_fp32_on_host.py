"""PT_HPU_AUTOCAST_FP32_ON_HOST: autocast regions compute in fp32 and are charged as bf16."""

from __future__ import annotations

import pytest
import torch

import hpu_runtime as hpu


def _mm_costs(monkeypatch, flag: str):
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_ON_HOST", flag)
    dev = hpu.reset_device("gaudi2")
    lin = torch.nn.Linear(256, 256).to("hpu")
    x = torch.randn(128, 256, device="hpu", requires_grad=True)
    hpu.mark_step()
    with torch.autocast("hpu", dtype=torch.bfloat16):
        y = lin(x)
    fwd = [c for c in dev.pending if c.engine == "MME"]
    casts = [c.name for c in dev.pending if c.name.startswith("emulated autocast")]
    y.float().sum().backward()
    bwd = [c for c in dev.pending if c.engine == "MME"][len(fwd):]
    hpu.mark_step()
    after = lin.weight * 2  # after the mark_step: fp32 again
    tail = list(dev.pending)
    hpu.mark_step()
    return y, fwd, bwd, tail, casts


def test_region_runs_fp32_on_host_and_is_charged_bf16(monkeypatch):
    y, fwd, bwd, tail, casts = _mm_costs(monkeypatch, "1")
    assert y.dtype == torch.float32  # no real cast on the host
    # the faithful region's casts of the weight and the bias (to bf16, gradients back to fp32)
    assert sorted(casts) == sorted(["emulated autocast cast fp32->bf16", "emulated autocast grad cast bf16->fp32"] * 2)
    assert fwd and all(c.low_precision for c in fwd)
    assert bwd and all(c.low_precision for c in bwd)  # backward of the region: bf16 too
    assert tail and not any(c.low_precision for c in tail)
    # the forward addmm as a bf16 addmm on gaudi2, by hand: 2*128*256*256 FLOP; bias, input and
    # weight read at 2 bytes per element (512 + 65,536 + 131,072 B) and the output written
    # (65,536 B); memory-bound: int(262,656 B / (2.46e12 B/s x 0.85) x 1e9) = 125 ns, above the
    # MME's int(16,777,216 FLOP / (432e12 FLOP/s x 0.81 x 128/198) x 1e9) = 74 ns (128 output
    # rows fill 128/198 of gaudi2's fitted MME tile)
    assert (fwd[0].flops, fwd[0].bytes_in, fwd[0].bytes_out) == (2 * 128 * 256 * 256, 197_120, 65_536)
    assert fwd[0].device_ns == 125 and fwd[0].compute_ns == 74
    hpu.reset_device("gaudi2")


def test_faithful_autocast_when_off(monkeypatch):
    y, fwd, _, _, casts = _mm_costs(monkeypatch, "0")
    assert y.dtype == torch.bfloat16 and fwd[0].low_precision and not casts
    hpu.reset_device("gaudi2")


def test_bad_value_names_the_variable(monkeypatch):
    """The variable is read with the rest of the configuration, when the device is (re)made."""
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_ON_HOST", "maybe")
    with pytest.raises(ValueError, match="PT_HPU_AUTOCAST_FP32_ON_HOST"):
        hpu.reset_device("gaudi2")
    monkeypatch.delenv("PT_HPU_AUTOCAST_FP32_ON_HOST")
    hpu.reset_device("gaudi2")
