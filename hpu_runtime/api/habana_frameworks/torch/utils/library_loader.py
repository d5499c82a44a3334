"""``habana_frameworks.torch.utils.library_loader``: the emulated Gaudi needs no library to load."""

from __future__ import annotations

__all__ = ["load_habana_module", "is_habana_available"]


def load_habana_module() -> None:
    """Make the ``"hpu"`` device usable (on Gaudi: load the bridge's shared library)."""
    import hpu_runtime

    hpu_runtime.activate()


def is_habana_available() -> bool:
    """True: the simulated card is always present (Gaudi's checks ``hl-smi``)."""
    return True
