"""ResNet-50 and ResNeXt-101 (32x4d) from torchvision's model definitions.

Both are torchvision's ``ResNet`` class with ``Bottleneck`` blocks, randomly initialised
(weights are never downloaded):

- ``resnet50``: ``torchvision.models.resnet50()``, blocks ``[3, 4, 6, 3]``, 25,557,032
  parameters at 1000 classes.
- ``resnext101``: ResNeXt-101 32x4d, blocks ``[3, 4, 23, 3]``, ``groups=32``,
  ``width_per_group=4`` (44.2 M parameters). This is the variant Habana trains:
  HabanaAI/Model-References ``PyTorch/computer_vision/classification/torchvision`` runs
  ``train.py --model resnext101_32x4d`` and its ``model/resnet.py`` defines
  ``resnext101_32x4d`` as ``ResNet(Bottleneck, [3, 4, 23, 3], groups=32,
  width_per_group=4)``. torchvision itself ships only 32x8d and 64x4d, so it is built
  here from torchvision's ``ResNet`` class with the same arguments.

The ``debug`` flavours are tiny networks from the same class, 10 classes, 32 x 32 inputs:
ResNet-50's has one ``BasicBlock`` per stage (4.9 M parameters), ResNeXt-101's one grouped
32x4d ``Bottleneck`` per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import ModelKind, register_model

__all__ = ["ResNetConfig", "build_resnet", "forward_macs", "training_flops"]


@dataclass(kw_only=True, slots=True)
class ResNetConfig:
    """Shape of a torchvision ``ResNet``."""

    block: str = "bottleneck"
    """Residual block: "bottleneck" (ResNet-50 and deeper) or "basic" (ResNet-18/34)."""
    layers: tuple[int, ...] = (3, 4, 6, 3)
    """Blocks per stage (four stages)."""
    groups: int = 1
    """Grouped-convolution cardinality of the 3x3 conv in each bottleneck (ResNeXt: 32)."""
    width_per_group: int = 64
    """Channels per group at the first stage (ResNet: 64, ResNeXt 32x4d: 4)."""
    num_classes: int = 1000
    """Output classes (ImageNet: 1000)."""
    image_size: int = 224
    """Default input side in pixels; the network itself accepts any size >= 32."""

    def __post_init__(self) -> None:
        if self.block not in ("bottleneck", "basic"):
            raise ValueError(f"ResNetConfig.block must be 'bottleneck' or 'basic', got {self.block!r}")
        self.layers = tuple(self.layers)
        if len(self.layers) != 4 or any(n < 1 for n in self.layers):
            raise ValueError(f"ResNetConfig.layers must be four counts >= 1, got {self.layers}")
        for name in ("groups", "width_per_group", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ResNetConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size < 32:
            raise ValueError(f"ResNetConfig.image_size must be >= 32 (five stride-2 stages), got {self.image_size}")
        if self.block == "basic" and (self.groups != 1 or self.width_per_group != 64):
            raise ValueError("ResNetConfig: the basic block supports only groups=1, width_per_group=64")

    def model_kind(self) -> ModelKind:
        return ModelKind(kind="image", task="classify", dataset="digits-images",
                         num_classes=self.num_classes, image_size=self.image_size)

    def training_flops(self, batch_size: int, *, image_size: int | None = None, seq_len: int | None = None) -> int:
        """See :func:`training_flops` (``seq_len`` is ignored: an image model)."""
        return training_flops(self, batch_size, image_size)


def build_resnet(cfg: ResNetConfig) -> torch.nn.Module:
    """torchvision ``ResNet`` for ``cfg`` (random init, nothing downloaded)."""
    from ._torchvision import import_torchvision

    resnet = import_torchvision().models.resnet
    block = resnet.Bottleneck if cfg.block == "bottleneck" else resnet.BasicBlock
    return resnet.ResNet(block, list(cfg.layers), num_classes=cfg.num_classes,
                         groups=cfg.groups, width_per_group=cfg.width_per_group)


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def forward_macs(cfg: ResNetConfig, image_size: int | None = None) -> int:
    """Multiply-accumulates of one forward pass of one image (convolutions and the fc).

    Walks the torchvision ``ResNet`` layout analytically (stem 7x7/2, max-pool 3x3/2, four
    stages, stride 2 on the first block of stages 2-4 in the 3x3 conv, 1x1/stride
    projection shortcuts); batch norm, ReLU and pooling are not counted. ResNet-50 at
    224 px: 4.09 G MACs.
    """
    s = image_size or cfg.image_size
    s = _out(s, 7, 2, 3)
    macs = s * s * 64 * 3 * 49
    s = _out(s, 3, 2, 1)
    inplanes = 64
    expansion = 4 if cfg.block == "bottleneck" else 1
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), cfg.layers)):
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            out_ch = planes * expansion
            s2 = _out(s, 3, stride, 1)
            if cfg.block == "bottleneck":
                width = int(planes * (cfg.width_per_group / 64.0)) * cfg.groups
                macs += s * s * inplanes * width
                macs += s2 * s2 * width * (width // cfg.groups) * 9
                macs += s2 * s2 * width * out_ch
            else:
                macs += s2 * s2 * inplanes * planes * 9 + s2 * s2 * planes * planes * 9
            if i == 0 and (stride != 1 or inplanes != out_ch):
                macs += s2 * s2 * inplanes * out_ch
            s, inplanes = s2, out_ch
    return macs + inplanes * cfg.num_classes


def training_flops(cfg: ResNetConfig, batch_size: int, image_size: int | None = None) -> int:
    """Analytic FLOPs of one training step: 2 per MAC forward, twice that backward (x 6)."""
    return 6 * forward_macs(cfg, image_size) * batch_size


_DEBUG = {"block": "basic", "layers": (1, 1, 1, 1), "num_classes": 10, "image_size": 32}

register_model("resnet50", ResNetConfig, flavours={"debug": _DEBUG})(build_resnet)
register_model(
    "resnext101",
    ResNetConfig,
    # debug keeps the grouped 32x4d bottleneck (what makes it ResNeXt), one block per stage
    flavours={"debug": {"layers": (1, 1, 1, 1), "num_classes": 10, "image_size": 32}},
    defaults={"layers": (3, 4, 23, 3), "groups": 32, "width_per_group": 4},
)(build_resnet)
