"""Registry of reference models: a name -> (config dataclass, builder, kind of input)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = [
    "ModelEntry",
    "ModelKind",
    "register_model",
    "get_model_entry",
    "build_config",
    "build_model",
    "model_kind",
    "model_names",
]

KINDS = ("tabular", "image", "text")
TASKS = ("classify", "mlm-nsp", "causal-lm")


@dataclass(frozen=True, slots=True)
class ModelKind:
    """What a model eats and how it is trained (read from its config; nothing is built)."""

    kind: str
    """"tabular" (flat features), "image" (``(B, 3, S, S)`` float) or "text" (token ids)."""
    task: str
    """Loss family: "classify" (cross entropy on labels), "mlm-nsp" (BERT pretraining:
    masked-LM + next-sentence), "causal-lm" (next-token cross entropy)."""
    dataset: str
    """The dataset ``models.train`` uses for this model when ``--dataset`` is not given."""
    in_features: int | None = None
    """Tabular models: features per sample."""
    num_classes: int | None = None
    """Classifiers: output classes."""
    image_size: int | None = None
    """Image models: default input side in pixels (224 at full size)."""
    seq_len: int | None = None
    """Text models: default sequence length for a live run (tokens)."""
    vocab_size: int | None = None
    """Text models: embedding rows (token ids must be below this)."""
    max_positions: int | None = None
    """Text models: the longest sequence the position embedding allows."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A registered model: its config class, builder, named flavours and base settings.

    A config class provides ``model_kind() -> ModelKind``; full size is the config class's
    defaults updated by ``defaults`` (so two entries can share one config class).
    """

    name: str
    config_cls: type
    build: Callable[[Any], torch.nn.Module]
    flavours: dict[str, dict[str, Any]]
    defaults: dict[str, Any]


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    config_cls: type,
    flavours: dict[str, dict[str, Any]] | None = None,
    *,
    defaults: dict[str, Any] | None = None,
):
    """Decorator registering ``build(config) -> nn.Module`` under ``name``."""

    def deco(build: Callable[[Any], torch.nn.Module]):
        _REGISTRY[name] = ModelEntry(name, config_cls, build, dict(flavours or {}), dict(defaults or {}))
        return build

    return deco


def _load_builtin() -> None:
    # Each module registers itself; none imports torchvision/transformers until a build.
    from . import bert, gpt2, mlp, resnet  # noqa: F401


def model_names() -> list[str]:
    """Sorted names of the registered models (the built-in ones included)."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_model_entry(name: str) -> ModelEntry:
    """Look up a registered model.

    Raises:
        ValueError: unknown model name (the message lists the known ones).
    """
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(model_names())}") from None


def build_config(name: str, flavour: str | None = None, **overrides: Any) -> Any:
    """The config of model ``name``: defaults, then flavour, then non-None ``overrides``.

    Raises:
        ValueError: unknown model, unknown flavour, or an override the config has no field for.
    """
    entry = get_model_entry(name)
    values: dict[str, Any] = dict(entry.defaults)
    if flavour is not None:
        if flavour not in entry.flavours:
            raise ValueError(f"model {name!r} has no flavour {flavour!r}; known: {sorted(entry.flavours)}")
        values.update(entry.flavours[flavour])
    known = {f.name for f in fields(entry.config_cls)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in known:
            raise ValueError(f"model {name!r} has no setting {key!r}; its settings: {', '.join(sorted(known))}")
        values[key] = value
    return entry.config_cls(**values)


def model_kind(name: str, flavour: str | None = None, **overrides: Any) -> ModelKind:
    """The :class:`ModelKind` of model ``name`` at ``flavour`` (builds the config only)."""
    return build_config(name, flavour, **overrides).model_kind()


def build_model(name: str, flavour: str | None = None, **overrides: Any) -> torch.nn.Module:
    """Build model ``name`` from its config, a named flavour and keyword overrides."""
    entry = get_model_entry(name)
    return entry.build(build_config(name, flavour, **overrides))
