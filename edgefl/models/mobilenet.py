"""MobileNetV2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018),
torchvision's blocks as atoms: depthwise convolutions and ReLU6, what the edge runs.

Atoms: the input normalisation, then each of torchvision's `features` (the stem conv, the 17
inverted-residual blocks, the last 1x1 conv); the last also holds the average pooling, the flatten
and the classifier (dropout 0.2, linear). Inputs of side below 64 (CIFAR, digits) get the usual
CIFAR change: the stem and the second stage at stride 1, so a 32x32 image ends at 4x4, not 1x1.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import MODELS, AtomModel, Normalize, with_head

SMALL_SIDE = 64
# (expansion t, channels c, blocks n, stride s) of the paper's Table 2
IMAGENET = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2],
            [6, 320, 1, 1]]
SMALL = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2],
         [6, 320, 1, 1]]


@MODELS.register("mobilenet_v2")
def make_mobilenet_v2(num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float],
                      std: Sequence[float]) -> AtomModel:
    from torchvision.models import MobileNetV2  # here: torchvision.models loads torch._dynamo, 1.9 s

    c, h, w = input_shape
    small = min(h, w) < SMALL_SIDE
    net = MobileNetV2(num_classes=num_classes, inverted_residual_setting=SMALL if small else IMAGENET)
    stem = net.features[0]
    if small:
        stem[0].stride = (1, 1)
    if c != 3:
        stem[0] = nn.Conv2d(c, stem[0].out_channels, 3, stem[0].stride, 1, bias=False)
    atoms = [("norm", Normalize(mean, std)), *((f"features{i}", f) for i, f in enumerate(net.features))]
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), *net.classifier]
    return with_head(atoms, head, input_shape)
