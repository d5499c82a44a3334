"""``habana_frameworks.mediapipe``: Gaudi's media (image decode) pipeline, NOT emulated.

Import-only placeholders so that libraries importing it at module level (lightning-habana's
data module defines a ``MediaPipe`` subclass at import) load. Building a pipeline raises
:class:`NotImplementedError`; use a ``torch.utils.data.DataLoader``, as Gaudi scripts do
when the media pipeline is unavailable.
"""

from __future__ import annotations

from types import SimpleNamespace

NOT_EMULATED = ("habana_frameworks.mediapipe is not emulated (the simulated Gaudi has no media "
                "decoder); use torch.utils.data.DataLoader")


class _NotEmulated:
    """Base of the placeholder classes: subclassing works, constructing raises."""

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(NOT_EMULATED)


def _not_emulated(*args, **kwargs):
    raise NotImplementedError(NOT_EMULATED)


class _Fn(SimpleNamespace):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _not_emulated


fn = _Fn()
"""``mediapipe.fn``: every operator factory raises :class:`NotImplementedError`."""
