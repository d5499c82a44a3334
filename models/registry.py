"""Registry of reference models: a name -> (config dataclass, builder)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ModelEntry", "register_model", "get_model_entry", "build_model", "model_names"]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A registered model: its config class, builder and named flavours (e.g. "debug")."""

    name: str
    config_cls: type
    build: Callable[[Any], torch.nn.Module]
    flavours: dict[str, dict[str, Any]]


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, config_cls: type, flavours: dict[str, dict[str, Any]] | None = None):
    """Decorator registering ``build(config) -> nn.Module`` under ``name``."""

    def deco(build: Callable[[Any], torch.nn.Module]):
        _REGISTRY[name] = ModelEntry(name, config_cls, build, dict(flavours or {}))
        return build

    return deco


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def get_model_entry(name: str) -> ModelEntry:
    """Look up a registered model.

    Raises:
        ValueError: unknown model name (the message lists the known ones).
    """
    from . import mlp  # noqa: F401  (registers itself)

    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(model_names())}") from None


def build_model(name: str, flavour: str | None = None, **overrides: Any) -> torch.nn.Module:
    """Build model ``name`` from its config, a named flavour and keyword overrides."""
    entry = get_model_entry(name)
    fields: dict[str, Any] = {}
    if flavour is not None:
        if flavour not in entry.flavours:
            raise ValueError(f"model {name!r} has no flavour {flavour!r}; known: {sorted(entry.flavours)}")
        fields.update(entry.flavours[flavour])
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return entry.build(entry.config_cls(**fields))
