"""A small CNN for scikit-learn's 8x8 handwritten digits, the bundled quickstart workload."""

from __future__ import annotations

from collections.abc import Sequence

from edgefl.models.base import MODELS, AtomModel, plain_cnn


@MODELS.register("digits_cnn")
def digits_cnn(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv16 | conv32 + pool | conv64 + pool + linear (8x8 -> 2x2)."""
    return plain_cnn([16, 32, 64], [False, True, True], num_classes, input_shape, mean, std)
