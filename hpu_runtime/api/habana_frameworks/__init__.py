"""``habana_frameworks``: the Gaudi software's Python names, answered by the emulator.

Found through :mod:`hpu_runtime.import_hooks` when no real ``habana_frameworks`` is
installed, so ``import habana_frameworks.torch.core as htcore`` works in an unmodified Gaudi
script. Every module under this package is a thin name map onto :mod:`hpu_runtime` and
:mod:`hccl`; which names exist, what they do here and what is missing is listed in
:mod:`hpu_runtime.api.habana_frameworks.torch` (the status table).
"""

EMULATED = True
"""Marker: this is the emulator's ``habana_frameworks``, not Intel's."""
