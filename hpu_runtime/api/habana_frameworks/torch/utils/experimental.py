"""``habana_frameworks.torch.utils.experimental`` (``htexp``): the card generation.

``synDeviceType`` values are those of Intel's SynapseAI ``synDeviceType`` enum
(HabanaAI/gaudi-pytorch-bridge, Python binding of ``synapse_common_types.h``): Gaudi 2,
Gaudi2 4, Gaudi3 5. The simulated generation is ``HPU_DEVICE_SPEC`` (default ``gaudi2``).
"""

from __future__ import annotations

import enum

import hpu_runtime.api.hpu as hpu  # noqa: F401 - Gaudi's module exposes it as htexp.hpu
from hpu_runtime import get_device

__all__ = ["synDeviceType", "_get_device_type", "_is_fp16_supported", "hpu"]


class synDeviceType(enum.IntEnum):  # noqa: N801 - Gaudi's name
    synDeviceGaudi = 2
    synDeviceGaudi2 = 4
    synDeviceGaudi3 = 5


_BY_SPEC = {"gaudi": synDeviceType.synDeviceGaudi, "gaudi2": synDeviceType.synDeviceGaudi2,
            "gaudi3": synDeviceType.synDeviceGaudi3}


def _get_device_type() -> synDeviceType:
    """The simulated card's generation."""
    name = get_device().spec.name.lower()
    if name not in _BY_SPEC:
        raise ValueError(f"_get_device_type: no synDeviceType for simulated device {name!r}")
    return _BY_SPEC[name]


def _is_fp16_supported() -> bool:
    """fp16 is supported from Gaudi2 on (first-gen Gaudi computes bf16 only)."""
    return _get_device_type() != synDeviceType.synDeviceGaudi
