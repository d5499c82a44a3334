"""``habana_frameworks.torch.hpu.memory``: HBM statistics of the simulated card (bytes)."""

from hpu_runtime.api.hpu import (  # noqa: F401
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)

__all__ = ["memory_stats", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
           "mem_get_info", "memory_summary", "memory_reserved", "max_memory_reserved", "memory_cached",
           "max_memory_cached", "reset_accumulated_memory_stats"]
