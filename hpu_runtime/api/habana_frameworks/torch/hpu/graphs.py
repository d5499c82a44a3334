"""``habana_frameworks.torch.hpu.graphs`` (``htgraphs``): HPU graphs (see :mod:`hpu_runtime.bridge.hpu_graphs`)."""

from hpu_runtime.bridge.hpu_graphs import (  # noqa: F401
    CachedParams,
    HPUGraph,
    ModuleCacher,
    copy_to,
    graph,
    input_hash,
    make_graphed_callables,
    wrap_in_hpu_graph,
)

__all__ = ["HPUGraph", "graph", "make_graphed_callables", "ModuleCacher", "wrap_in_hpu_graph", "CachedParams",
           "input_hash", "copy_to"]
