"""A multilayer perceptron classifier (the digits reference model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .registry import ModelKind, register_model

__all__ = ["MLPConfig", "MLP", "build_mlp"]


@dataclass(kw_only=True, slots=True)
class MLPConfig:
    """Shape of the MLP."""

    in_features: int = 64
    """Input features (8 x 8 digits images flattened: 64)."""
    hidden: int = 128
    """Width of each hidden layer."""
    layers: int = 2
    """Number of hidden layers."""
    num_classes: int = 10
    """Output classes."""

    def __post_init__(self) -> None:
        for name in ("in_features", "hidden", "layers", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLPConfig.{name} must be >= 1, got {getattr(self, name)}")

    def model_kind(self) -> ModelKind:
        return ModelKind(kind="tabular", task="classify", dataset="digits",
                         in_features=self.in_features, num_classes=self.num_classes)

    def training_flops(self, batch_size: int, *, image_size: int | None = None, seq_len: int | None = None) -> int:
        """Analytic FLOPs of one training step: 6 x weights x batch (2 forward + 4 backward)."""
        dims = [self.in_features] + [self.hidden] * self.layers + [self.num_classes]
        return 6 * sum(a * b for a, b in zip(dims[:-1], dims[1:])) * batch_size


class MLP(nn.Module):
    """``in_features -> [Linear, ReLU] x layers -> Linear(num_classes)``; input ``(batch, in_features)``."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_features] + [cfg.hidden] * cfg.layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.ReLU()]
        blocks.append(nn.Linear(dims[-1], cfg.num_classes))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))

    def flops_per_sample(self) -> int:
        """Analytic training FLOPs per sample: 6 x weights (2 forward + 4 backward)."""
        weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6 * weights


@register_model("mlp", MLPConfig, flavours={"debug": {"hidden": 16, "layers": 1}, "large": {"hidden": 2048}})
def build_mlp(cfg: MLPConfig) -> MLP:
    return MLP(cfg)
