"""ResNet10/18/34 with basic blocks (He et al., "Deep Residual Learning", CVPR 2016; FedProphet §7).

Atoms as in the FedProphet release: the input normalisation is its own atom, then the stem is one
atom, each basic block is one atom (its downsampling shortcut inside), and the last block also holds
the adaptive average pooling, the flatten and the fc layer.

The stem follows the input size: inputs of side >= 64 (Caltech-256 at 224x224) get the ImageNet stem
(7x7 conv stride 2, BN, ReLU, 3x3 max-pool stride 2); smaller ones (CIFAR 32x32, digits 8x8) get the
CIFAR stem (3x3 conv stride 1, BN, ReLU, no pooling). Convs carry no bias and every conv is followed by
BN, as in torchvision's BasicBlock. `model.width` w makes the stages round(w x 64/128/256/512) wide.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from edgefl.models.base import AtomModel, Normalize, register_family, scaled, with_head

WIDTHS = (64, 128, 256, 512)
LAYERS: dict[str, tuple[int, int, int, int]] = {
    "resnet10": (1, 1, 1, 1),
    "resnet18": (2, 2, 2, 2),
    "resnet34": (3, 4, 6, 3),
}
IMAGENET_STEM_MIN_SIDE = 64


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN pairs with an identity (or 1x1 conv + BN downsampling) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


def stem(cin: int, side: int, cout: int = WIDTHS[0]) -> nn.Sequential:
    """The ImageNet stem for inputs of side >= 64, the CIFAR stem below."""
    if side >= IMAGENET_STEM_MIN_SIDE:
        return nn.Sequential(nn.Conv2d(cin, cout, 7, stride=2, padding=3, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                             nn.MaxPool2d(3, stride=2, padding=1))
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def blocks(layers: Sequence[int], widths: Sequence[int] = WIDTHS) -> list[tuple[str, nn.Module]]:
    """One named atom per basic block: stage s, block b is `layer{s}_{b}` (1-based)."""
    atoms: list[tuple[str, nn.Module]] = []
    cin = widths[0]
    for s, (width, depth) in enumerate(zip(widths, layers, strict=True)):
        for b in range(depth):
            stride = 2 if s > 0 and b == 0 else 1
            atoms.append((f"layer{s + 1}_{b + 1}", BasicBlock(cin, width, stride)))
            cin = width
    return atoms


def make_resnet(
    layers: Sequence[int], num_classes: int, input_shape: tuple[int, ...],
    mean: Sequence[float], std: Sequence[float], width: float = 1.0,
) -> AtomModel:
    """norm | stem | one atom per basic block | the last block holds avg-pool, flatten and fc; `width`
    scales every stage's channels."""
    c, h, w = input_shape
    widths = [scaled(n, width) for n in WIDTHS]
    atoms: list[tuple[str, nn.Module]] = [("norm", Normalize(mean, std)),
                                          ("stem", stem(c, min(h, w), widths[0]))]
    atoms += blocks(layers, widths)
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], num_classes)]
    return with_head(atoms, head, input_shape)


register_family(LAYERS, make_resnet, scalable=True)
