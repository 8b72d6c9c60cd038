"""CNN3: the small three-layer CNN that FedDF-AT / FedET-AT fall back to (FedProphet §7.2)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import MODELS, AtomModel, Normalize, conv_bn


@MODELS.register("cnn3")
def cnn3(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv32 + pool | conv64 + pool | conv128 + pool + linear."""
    c, h, w = input_shape
    atoms: list[tuple[str, nn.Module]] = [
        ("norm", Normalize(mean, std)),
        ("conv1", nn.Sequential(*conv_bn(c, 32, pool=True))),
        ("conv2", nn.Sequential(*conv_bn(32, 64, pool=True))),
        ("conv3", nn.Sequential(*conv_bn(64, 128, pool=True), nn.Flatten(),
                                nn.Linear(128 * (h // 8) * (w // 8), num_classes))),
    ]
    return AtomModel(atoms, input_shape)
