"""RuntimeConfig: hpu_runtime's environment read once, validated, naming the bad variable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import hpu_runtime as hpu
from hpu_runtime.bridge import runtime
from hpu_runtime.bridge.config import RecipeCacheConfig, RuntimeConfig


def test_defaults_when_nothing_is_set():
    """An empty environment is Gaudi's defaults: lazy, no op limit, gaudi2, memory-only cache."""
    cfg = RuntimeConfig.from_env({})
    assert cfg == RuntimeConfig()
    assert (cfg.lazy, cfg.max_compound_ops, cfg.spec.name, cfg.recipe_cache) == (True, 0, "gaudi2", None)
    assert not cfg.fallback.place_on_cpu and not cfg.fallback.log and not cfg.autocast_fp32_on_host


@pytest.mark.parametrize("value, lazy", [("1", True), ("0", False), ("2", False), (" 1 ", True), ("", True)])
def test_lazy_mode_values(value, lazy):
    """0 and 2 (SynapseAI 1.x scripts' eager) are eager, 1 is lazy."""
    assert RuntimeConfig.from_env({"PT_HPU_LAZY_MODE": value}).lazy is lazy


@pytest.mark.parametrize("name, env", [
    ("PT_HPU_LAZY_MODE", {"PT_HPU_LAZY_MODE": "3"}),
    ("PT_HPU_LAZY_MODE", {"PT_HPU_LAZY_MODE": "lazy"}),
    ("PT_HPU_MAX_COMPOUND_OP_SIZE", {"PT_HPU_MAX_COMPOUND_OP_SIZE": "-1"}),
    ("PT_HPU_MAX_COMPOUND_OP_SIZE", {"PT_HPU_MAX_COMPOUND_OP_SIZE": "ten"}),
    ("HPU_DEVICE_SPEC", {"HPU_DEVICE_SPEC": "gaudi9"}),
    ("PT_HPU_RECIPE_CACHE_CONFIG", {"PT_HPU_RECIPE_CACHE_CONFIG": "/tmp/x,maybe,10"}),
    ("LOG_LEVEL_PT_FALLBACK", {"LOG_LEVEL_PT_FALLBACK": "7"}),
    ("ENABLE_CONSOLE", {"LOG_LEVEL_PT_FALLBACK": "1", "ENABLE_CONSOLE": "sure"}),
    ("PT_HPU_AUTOCAST_FP32_ON_HOST", {"PT_HPU_AUTOCAST_FP32_ON_HOST": "2"}),
])
def test_malformed_value_names_the_variable(name, env):
    with pytest.raises(ValueError, match=name):
        RuntimeConfig.from_env(env)


def test_values_are_parsed():
    cfg = RuntimeConfig.from_env({
        "PT_HPU_MAX_COMPOUND_OP_SIZE": "64", "HPU_DEVICE_SPEC": "HLS-3",
        "PT_HPU_RECIPE_CACHE_CONFIG": "/tmp/rc,true,0.5", "PT_HPU_PLACE_ON_CPU": "aten::digamma, erf,,",
        "LOG_LEVEL_PT_FALLBACK": "1", "ENABLE_CONSOLE": "true", "PT_HPU_AUTOCAST_FP32_ON_HOST": "1"})
    assert cfg.max_compound_ops == 64 and cfg.spec.name == "gaudi3"
    assert cfg.recipe_cache == RecipeCacheConfig(path=Path("/tmp/rc"), clear_at_start=True, size_mb=0.5)
    assert cfg.place_on_cpu == {"digamma", "erf"} and cfg.fallback.place_on_cpu == {"digamma", "erf"}
    assert cfg.log_fallback and cfg.fallback.log and cfg.autocast_fp32_on_host
    quiet = RuntimeConfig.from_env({"LOG_LEVEL_PT_FALLBACK": "3", "ENABLE_CONSOLE": "true"})
    assert not quiet.log_fallback  # only levels 0 and 1 print fallbacks


def test_frozen_and_validated_when_built_directly():
    cfg = RuntimeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lazy = False
    with pytest.raises(ValueError, match="PT_HPU_MAX_COMPOUND_OP_SIZE"):
        RuntimeConfig(max_compound_ops=-2)
    with pytest.raises(ValueError, match="HPU_DEVICE_SPEC"):
        RuntimeConfig(device_spec="tpu")


def test_device_is_made_from_the_config_and_reset_reads_it_again(monkeypatch):
    """The environment is read when the device is (re)made, not when an op runs."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "2")
    monkeypatch.setenv("PT_HPU_MAX_COMPOUND_OP_SIZE", "5")
    try:
        dev = hpu.reset_device("gaudi")
        assert not dev.lazy and dev.max_compound_ops == 5 and dev.spec.name == "gaudi"
        assert runtime.config().device_spec == "gaudi" and not runtime.config().lazy
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
        assert not dev.lazy  # not re-read behind the device's back
    finally:
        monkeypatch.delenv("PT_HPU_LAZY_MODE")
        monkeypatch.delenv("PT_HPU_MAX_COMPOUND_OP_SIZE")
        dev = hpu.reset_device("gaudi2")
    assert dev.lazy and dev.max_compound_ops == 0 and runtime.config() == RuntimeConfig.from_env()
