"""CNN3: the small three-layer CNN that FedDF-AT / FedET-AT fall back to (FedProphet §7.2)."""

from __future__ import annotations

from collections.abc import Sequence

from edgefl.models.base import MODELS, AtomModel, plain_cnn


@MODELS.register("cnn3")
def cnn3(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv32 + pool | conv64 + pool | conv128 + pool + linear."""
    return plain_cnn([32, 64, 128], [True, True, True], num_classes, input_shape, mean, std)
