"""CNN3 and CNN4: the small plain CNNs that FedDF-AT / FedET-AT fall back to (FedProphet §7.2).

CNN3 is the CIFAR fallback below VGG11; CNN4 is the Caltech-256 fallback below ResNet10.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgefl.models.base import MODELS, AtomModel, plain_cnn

CNN4_WIDTHS = (32, 64, 128, 256)
CNN4_POOLED_SIDE = 2  # the head sees a 2x2 map whatever the input size (32x32 inputs already give 2x2)


@MODELS.register("cnn3")
def cnn3(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv32 + pool | conv64 + pool | conv128 + pool + linear."""
    return plain_cnn([32, 64, 128], [True, True, True], num_classes, input_shape, mean, std)


@MODELS.register("cnn4")
def cnn4(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv32 + pool | conv64 + pool | conv128 + pool | conv256 + pool + avg-pool 2x2 + linear.

    The adaptive average pooling keeps the head at 256 x 2 x 2 -> classes for any input size, so on
    224x224 Caltech inputs CNN4 stays smaller than ResNet10 (plain_cnn's flatten would give a
    256 x 14 x 14 -> classes layer); on 32x32 inputs it is a no-op and CNN4 equals plain_cnn's.
    """
    _, h, w = input_shape
    shrink = 2 ** len(CNN4_WIDTHS)
    if h < shrink or w < shrink:
        raise ValueError(f"cnn4 pools {len(CNN4_WIDTHS)} times and needs a side >= {shrink}, got {h}x{w}")
    return plain_cnn(CNN4_WIDTHS, [True] * len(CNN4_WIDTHS), num_classes, input_shape, mean, std,
                     pooled=CNN4_POOLED_SIDE)
