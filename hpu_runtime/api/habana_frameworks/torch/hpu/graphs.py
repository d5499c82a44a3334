"""``habana_frameworks.torch.hpu.graphs`` (``htgraphs``): HPU graphs (see :mod:`hpu_runtime.bridge.hpu_graphs`)."""

from hpu_runtime.bridge.hpu_graphs import HPUGraph, ModuleCacher, graph, make_graphed_callables, wrap_in_hpu_graph  # noqa: F401

__all__ = ["HPUGraph", "graph", "make_graphed_callables", "ModuleCacher", "wrap_in_hpu_graph"]
