"""``habana_frameworks.torch.hpu`` (``hthpu``): the device API of the simulated Gaudi.

Exactly the names of ``torch.hpu`` (:mod:`hpu_runtime.api.hpu`, which ``import hpu_runtime``
registers as ``torch.hpu``), plus Gaudi's ``memory``, ``random``, ``metrics`` and ``graphs``
submodules, which ``torch.hpu`` also reaches.
"""

from __future__ import annotations

from hpu_runtime.api.hpu import *  # noqa: F401,F403 - the same names as torch.hpu
from hpu_runtime.api.hpu import __all__  # noqa: F401

from . import graphs, memory, metrics, random  # noqa: F401,E402
