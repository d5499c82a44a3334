"""Import ``transformers`` for offline use (config objects only, never the hub).

``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` are set (unless the caller set them)
before the first import, so nothing can reach the network; models are built only from
config objects with random weights. transformers imports torchvision when it is installed,
so torchvision is imported first through :func:`models._torchvision.import_torchvision`.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["import_transformers"]


def import_transformers() -> ModuleType:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from ._torchvision import import_torchvision

        import_torchvision()
    except ImportError:
        pass  # no torchvision: transformers works without it
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers
