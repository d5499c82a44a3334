"""``habana_frameworks.torch.hpu`` (``hthpu``): the device API of the simulated Gaudi.

Re-exports :mod:`hpu_runtime.api.hpu` (also installed as ``torch.hpu``) plus Gaudi's
``memory``, ``random``, ``metrics`` and ``graphs`` submodules and the dynamic-shape switches.
"""

from __future__ import annotations

from hpu_runtime.api.hpu import (  # noqa: F401
    Event,
    Stream,
    current_device,
    current_stream,
    default_stream,
    device_count,
    get_amp_supported_dtype,
    get_device_name,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    set_stream,
    stream,
    synchronize,
)

from . import graphs, memory, metrics, random  # noqa: F401
from .graphs import HPUGraph, ModuleCacher, graph, make_graphed_callables, wrap_in_hpu_graph  # noqa: F401
from .memory import (  # noqa: F401
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)
from .random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

_dynamic_shapes = True


def enable_dynamic_shape() -> None:
    """Gaudi's dynamic-shape support on (recorded; see :func:`get_dynamic_shape_status`)."""
    global _dynamic_shapes
    _dynamic_shapes = True


def disable_dynamic_shape() -> None:
    """Gaudi's dynamic-shape support off (recorded only: here a new input shape is a new graph
    key and a recipe-cache miss whatever this flag says)."""
    global _dynamic_shapes
    _dynamic_shapes = False


def get_dynamic_shape_status() -> bool:
    """The last value set by :func:`enable_dynamic_shape` / :func:`disable_dynamic_shape`."""
    return _dynamic_shapes
