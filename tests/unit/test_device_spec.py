"""Tests of hpu_runtime.device.spec."""

import dataclasses

import pytest

from hpu_runtime.device.spec import DEVICE_SPECS, DeviceSpec, get_device_spec

GIB = 1 << 30


@pytest.mark.parametrize(
    "alias, canonical",
    [("gaudi", "gaudi"), ("GAUDI2", "gaudi2"), ("Gaudi3", "gaudi3"), ("hls1", "gaudi"),
     ("HLS2", "gaudi2"), ("hls3", "gaudi3"), (" gaudi2 ", "gaudi2")])
def test_aliases_resolve(alias, canonical):
    """Generation and server names, any case, resolve to the canonical spec."""
    assert get_device_spec(alias) is DEVICE_SPECS[canonical]
    assert get_device_spec(alias).name == canonical


@pytest.mark.parametrize("bad", ["gaudi4", "", "h100", "hls"])
def test_unknown_name_lists_valid_names(bad):
    """An unknown name is a ValueError naming the valid choices."""
    with pytest.raises(ValueError, match="gaudi, gaudi2, gaudi3"):
        get_device_spec(bad)


def test_published_numbers():
    """Capacities, bandwidths, peak bf16 and engine counts match DESIGN.md section 6."""
    g1, g2, g3 = (DEVICE_SPECS[n] for n in ("gaudi", "gaudi2", "gaudi3"))
    assert (g1.hbm_bytes, g2.hbm_bytes, g3.hbm_bytes) == (32 * GIB, 96 * GIB, 128 * GIB)
    assert g2.hbm_bytes_per_s == pytest.approx(2.46e12)
    assert g3.hbm_bytes_per_s == pytest.approx(3.67e12)
    assert g1.mme_bf16_flops_per_s == pytest.approx(60e12)
    assert g2.mme_bf16_flops_per_s == pytest.approx(432e12)
    assert g3.mme_bf16_flops_per_s == pytest.approx(1835e12)
    assert g3.tpc_bf16_flops_per_s == pytest.approx(28.7e12)
    assert [(s.num_tpc, s.num_mme) for s in (g1, g2, g3)] == [(8, 1), (24, 2), (64, 8)]


def test_generations_are_ordered():
    """Each generation is at least as capable as the previous one."""
    g1, g2, g3 = (DEVICE_SPECS[n] for n in ("gaudi", "gaudi2", "gaudi3"))
    for field in ("hbm_bytes", "hbm_bytes_per_s", "mme_bf16_flops_per_s",
                  "mme_fp32_flops_per_s", "tpc_bf16_flops_per_s", "tpc_fp32_flops_per_s",
                  "pcie_bytes_per_s"):
        assert getattr(g1, field) <= getattr(g2, field) <= getattr(g3, field), field


@pytest.mark.parametrize("name", ["gaudi", "gaudi2", "gaudi3"])
def test_spec_invariants(name):
    """fp32 is slower than bf16, MME faster than TPC, all times are ints."""
    s = DEVICE_SPECS[name]
    assert s.mme_fp32_flops_per_s < s.mme_bf16_flops_per_s
    assert s.tpc_fp32_flops_per_s < s.tpc_bf16_flops_per_s
    assert s.tpc_bf16_flops_per_s < s.mme_bf16_flops_per_s
    assert s.host_op_ns < s.eager_op_launch_ns
    for f in ("host_op_ns", "eager_op_launch_ns", "graph_launch_ns", "compile_base_ns",
              "compile_per_op_ns"):
        assert isinstance(getattr(s, f), int)


def test_frozen_and_mapping_read_only():
    """Specs cannot be mutated and the registry cannot be extended by accident."""
    s = get_device_spec("gaudi2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.hbm_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        DEVICE_SPECS["x"] = s  # type: ignore[index]


def test_replace_keeps_validation():
    """dataclasses.replace builds a valid variant and still validates."""
    s = dataclasses.replace(get_device_spec("gaudi"), hbm_bytes=1024)
    assert s.hbm_bytes == 1024
    with pytest.raises(ValueError, match="hbm_bytes"):
        dataclasses.replace(s, hbm_bytes=0)


@pytest.mark.parametrize(
    "field, value, match",
    [("name", "", "name"),
     ("hbm_bytes", -1, "hbm_bytes"),
     ("hbm_bytes", 1.5, "hbm_bytes"),
     ("hbm_bytes_per_s", 0.0, "hbm_bytes_per_s"),
     ("mme_bf16_flops_per_s", float("inf"), "mme_bf16"),
     ("mme_efficiency", 0.0, "mme_efficiency"),
     ("tpc_efficiency", 1.5, "tpc_efficiency"),
     ("hbm_efficiency", -0.1, "hbm_efficiency"),
     ("host_op_ns", -5, "host_op_ns"),
     ("op_overhead_ns", -1, "op_overhead_ns"),
     ("op_overhead_ns", 1.5, "op_overhead_ns"),
     ("num_tpc", 0, "num_tpc"),
     ("num_mme", True, "num_mme"),
     ("mme_fp32_flops_per_s", 1e18, "exceeds"),
     ("tpc_fp32_flops_per_s", 1e18, "exceeds")])
def test_invalid_fields_raise(field, value, match):
    """Each invalid field is a ValueError naming that field."""
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(get_device_spec("gaudi3"), **{field: value})


def test_kw_only():
    """DeviceSpec takes keyword arguments only."""
    with pytest.raises(TypeError):
        DeviceSpec("gaudi")  # type: ignore[misc]
