"""``habana_frameworks.torch.dynamo.compile_backend``: the ``"hpu_backend"`` of ``torch.compile`` and ``experimental``."""

from hpu_runtime.bridge.compile_backend import hpu_backend  # noqa: F401
