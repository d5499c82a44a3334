"""``mediapipe.plugins.iterator_pytorch``: ``HPUResnetPytorchIterator`` (placeholder, see the package doc)."""

from .. import _NotEmulated


class HPUResnetPytorchIterator(_NotEmulated):
    """Not emulated: constructing one raises :class:`NotImplementedError`."""
