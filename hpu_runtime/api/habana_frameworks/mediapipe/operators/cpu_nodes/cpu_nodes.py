"""``mediapipe.operators.cpu_nodes.cpu_nodes``: ``media_function`` (placeholder, see the package doc)."""

from ... import _NotEmulated


class media_function(_NotEmulated):  # noqa: N801 - Gaudi's name
    """Not emulated: constructing one raises :class:`NotImplementedError`."""
