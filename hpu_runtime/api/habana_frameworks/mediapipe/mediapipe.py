"""``habana_frameworks.mediapipe.mediapipe``: ``MediaPipe`` (placeholder, see the package doc)."""

from . import _NotEmulated


class MediaPipe(_NotEmulated):
    """Not emulated: constructing one raises :class:`NotImplementedError`."""
