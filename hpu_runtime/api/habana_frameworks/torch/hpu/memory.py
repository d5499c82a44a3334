"""``habana_frameworks.torch.hpu.memory``: HBM statistics of the simulated card (bytes)."""

from __future__ import annotations

from hpu_runtime.api.hpu import max_memory_allocated, mem_get_info, memory_allocated, memory_stats, reset_peak_memory_stats

__all__ = ["memory_stats", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
           "mem_get_info", "memory_summary"]


def memory_summary(device: object = None) -> str:
    """The :func:`memory_stats` dictionary as a two-column text table (bytes)."""
    from tabulate import tabulate

    return tabulate(sorted(memory_stats(device).items()), headers=["statistic", "bytes"], intfmt=",")
