"""``habana_frameworks.mediapipe.media_types``: the enum namespaces lightning-habana imports (placeholders)."""


class _Meta(type):
    """Any attribute is its own name (the values are never used: pipelines cannot be built)."""

    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class decoderStage(metaclass=_Meta):  # noqa: N801 - Gaudi's names
    pass


class dtype(metaclass=_Meta):  # noqa: N801
    pass


class ftype(metaclass=_Meta):  # noqa: N801
    pass


class imgtype(metaclass=_Meta):  # noqa: N801
    pass


class randomCropType(metaclass=_Meta):  # noqa: N801
    pass
