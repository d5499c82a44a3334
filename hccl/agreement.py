"""The settings every rank of a group must share, compared once when the group is created.

NOTE [settings agreement]
Some settings change what a rank sends or when it thinks a collective ends: the algorithm
(``HCCL_ALGO``: which messages go to whom), the slice (``PT_HCCL_SLICE_SIZE_MB``), the
shared-memory staging size (``HCCL_SHM_BUFFER_MB``), the transport, the topology's content
and the simulated device. Ranks that disagree on one of them would post messages the others
do not expect and wait for the group's timeout, or time collectives on different systems.
So every rank publishes :func:`settings_of` its configuration with its host key in the
group's rendezvous (one store value it writes anyway, read by every rank anyway: no extra
round trip, no cost per collective), and every rank runs :func:`check_agreement` over the
same table: a disagreement is the same :class:`SettingsMismatchError` on every rank, naming
the setting and every rank's value, as soon as the last rank has arrived.

The topology and the device are compared by content, not by name: two hosts whose
``topo.toml`` differ, or whose built-in files differ (two versions installed), disagree.
Settings that are meant to differ per host (``HCCL_SOCKET_ADDR``, ``HCCL_HOST_ID``) are not
compared.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

from .config import HcclConfig
from .sim.topology import load_topology

__all__ = ["SettingsMismatchError", "settings_of", "check_agreement"]


class SettingsMismatchError(ValueError):
    """Ranks of one group were configured differently (raised on every rank at creation)."""


def _digest(fields: Mapping) -> str:
    return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:12]


def _topology(name_or_path: str) -> list[str]:
    """The compared value (a digest of the topology's fields, whatever the file's path, name,
    comments or layout) and the text shown; a topology that does not load compares as its error."""
    try:
        topo = load_topology(name_or_path)
    except ValueError as exc:
        return [f"does not load: {exc}", f"{name_or_path} (does not load: {exc})"]
    fields = dataclasses.asdict(topo)
    for label in ("name", "source", "world_size") + (() if topo.fixed_boxes else ("num_boxes",)):
        fields.pop(label, None)
    digest = _digest(fields)
    return [digest, f"{name_or_path} (content {digest})"]


def settings_of(config: HcclConfig, device_spec, cluster=None) -> dict[str, list[str]]:
    """The settings of NOTE [settings agreement] each rank publishes: per variable, the value
    compared across ranks and the text an error shows.

    Args:
        config: the group's frozen configuration.
        device_spec: the process's simulated card (a ``DeviceSpec`` dataclass).
        cluster: the simulated cluster's condition (:class:`hccl.sim.cluster.Cluster`, read from
            the ``HCCL_SIM_*`` variables: variability and what-ifs), or None.
    """
    spec = _digest(dataclasses.asdict(device_spec))
    plain = {
        "HCCL_ALGO": config.algorithm or "(the selection rule)",
        "PT_HCCL_SLICE_SIZE_MB": f"{config.slice_size_mb:g}",
        "HCCL_SHM_BUFFER_MB": f"{config.shm_buffer_mb:g}",
        "HCCL_TRANSPORT": config.transport,
        "PT_HPU_ENABLE_LAZY_COLLECTIVES": str(config.lazy_collectives).lower(),
    }
    if cluster is not None:
        plain["HCCL_SIM_*"] = cluster.key()
    return {**{k: [v, v] for k, v in plain.items()}, "HCCL_TOPOLOGY": _topology(config.topology),
            "HPU_DEVICE_SPEC": [spec, f"{device_spec.name} (content {spec})"]}


def _ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            a, b = ranks[start], ranks[i - 1]
            out.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ", ".join(out)


def check_agreement(rows: Sequence[Mapping[str, Sequence[str]]], names: Sequence[int]) -> None:
    """Check that every rank published the same settings (NOTE [settings agreement]).

    Pure and deterministic: every rank, given the same table, raises the same error.

    Args:
        rows: each group rank's :func:`settings_of` (ranks agree when the compared values do).
        names: the global rank of each group rank (messages name global ranks).

    Raises:
        SettingsMismatchError: naming each setting that differs and every rank's value.
    """
    missing = ("", "(not published: another version of hccl)")
    problems = []
    for key in sorted({k for row in rows for k in row}):
        by_value: dict[str, dict[str, list[int]]] = {}  # compared value -> shown text -> ranks
        for r, row in enumerate(rows):
            value, shown = row.get(key, missing)
            by_value.setdefault(value, {}).setdefault(shown, []).append(names[r])
        if len(by_value) > 1:
            values = "; ".join(f"{shown} on rank(s) {_ranks(sorted(rs))}"
                               for texts in by_value.values() for shown, rs in texts.items())
            problems.append(f"{key}: {values}")
    if problems:
        raise SettingsMismatchError(
            "hccl: the ranks of this group disagree on settings that must be the same on every rank"
            " (set them alike on every host): " + " | ".join(problems)
        )
