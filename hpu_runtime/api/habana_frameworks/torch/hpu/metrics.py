"""``habana_frameworks.torch.hpu.metrics``: ``metric_global``, ``metric_localcontext``, ``metrics_dump``."""

from __future__ import annotations

import json

from hpu_runtime.api.metrics import metric_global, metric_localcontext, snapshot
from hpu_runtime.files import atomic_write

__all__ = ["metric_global", "metric_localcontext", "metrics_dump"]


def metrics_dump(file_name: str, format: str = "json") -> None:  # noqa: A002 - Gaudi's argument name
    """Write every global metric to ``file_name`` (``format`` ``"json"`` or ``"text"``).

    Raises:
        ValueError: another format.
    """
    data = snapshot()
    if format == "json":
        text = json.dumps(data, indent=2, sort_keys=True, default=str)
    elif format == "text":
        text = "\n".join(f"{name}: {fields}" for name, fields in sorted(data.items()))
    else:
        raise ValueError(f"metrics_dump: format must be 'json' or 'text', got {format!r}")
    atomic_write(file_name, text + "\n")
