"""Network in Network (Lin, Chen & Yan, ICLR 2014) in its CIFAR-10 form, the CIFAR-10 model of SFAT
(Zhu et al., ICLR 2023, after Shah et al., 2021).

Three mlpconv blocks, every conv with bias and followed by a ReLU (the last 1x1 conv too, as in Lin et
al.'s CIFAR-10 network and its PyTorch ports):
  1. conv 5x5 192 | conv 1x1 160 | conv 1x1 96 | max-pool 3, stride 2 | dropout 0.5
  2. conv 5x5 192 | conv 1x1 192 | conv 1x1 192 | avg-pool 3, stride 2 | dropout 0.5
  3. conv 3x3 192 | conv 1x1 192 | conv 1x1 classes | global average pooling | flatten
The 5x5 and 3x3 convs are padded to keep the map size.

Atoms: "norm" (the input normalisation), then one atom per mlpconv block; the last one holds the
global pooling and the flatten (NIN has no fc layer: the last 1x1 conv gives one map per class).

Pooling: the two 3/2 pools have padding 1 (floor mode), which on 32x32 inputs gives the original
32 -> 16 -> 8 maps, and the global pooling is an adaptive average pool to 1x1 instead of the fixed 8x8
average pool, so the same network builds on 8x8 digits (8 -> 4 -> 2 -> 1) and any other input side.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import MODELS, AtomModel, Normalize

DROPOUT = 0.5


def mlpconv(cin: int, widths: Sequence[int], kernel: int) -> list[nn.Module]:
    """One mlpconv: a kernel x kernel conv (size-preserving padding), then 1x1 convs, each with a ReLU."""
    layers: list[nn.Module] = []
    for i, cout in enumerate(widths):
        k = kernel if i == 0 else 1
        layers += [nn.Conv2d(cin, cout, k, padding=k // 2), nn.ReLU(inplace=True)]
        cin = cout
    return layers


@MODELS.register("nin")
def nin(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | mlpconv 192-160-96 + max-pool | mlpconv 192-192-192 + avg-pool | mlpconv 192-192-classes
    + global avg-pool."""
    c = input_shape[0]
    block1 = [*mlpconv(c, (192, 160, 96), 5), nn.MaxPool2d(3, stride=2, padding=1), nn.Dropout(DROPOUT)]
    block2 = [*mlpconv(96, (192, 192, 192), 5), nn.AvgPool2d(3, stride=2, padding=1), nn.Dropout(DROPOUT)]
    block3 = [*mlpconv(192, (192, 192, num_classes), 3), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    atoms: list[tuple[str, nn.Module]] = [
        ("norm", Normalize(mean, std)),
        ("mlpconv1", nn.Sequential(*block1)),
        ("mlpconv2", nn.Sequential(*block2)),
        ("mlpconv3", nn.Sequential(*block3)),
    ]
    return AtomModel(atoms, input_shape)
