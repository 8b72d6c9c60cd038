"""A small CNN for scikit-learn's 8x8 handwritten digits, the bundled quickstart workload."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import MODELS, AtomModel, Normalize, conv_bn


@MODELS.register("digits_cnn")
def digits_cnn(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv16 | conv32 + pool | conv64 + pool + linear (8x8 -> 2x2)."""
    c, h, w = input_shape
    atoms: list[tuple[str, nn.Module]] = [
        ("norm", Normalize(mean, std)),
        ("conv1", nn.Sequential(*conv_bn(c, 16, pool=False))),
        ("conv2", nn.Sequential(*conv_bn(16, 32, pool=True))),
        ("conv3", nn.Sequential(*conv_bn(32, 64, pool=True), nn.Flatten(),
                                nn.Linear(64 * (h // 4) * (w // 4), num_classes))),
    ]
    return AtomModel(atoms, input_shape)
