"""Building a model by its scenario name: a zoo model (the registry), or any torchvision or timm
model (edgefl.models.vision), the latter with its constructor's keywords."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgefl.errors import EdgeflError
from edgefl.models.base import MODELS, SCALABLE, AtomModel
from edgefl.models.vision import is_vision, vision_model


def build_model(
    name: str,
    num_classes: int,
    input_shape: tuple[int, ...],
    mean: Sequence[float],
    std: Sequence[float],
    width: float = 1.0,
    kwargs: Mapping[str, Any] | None = None,
    where: str = "edgefl",
) -> AtomModel:
    """The model `name` for these inputs; `width` multiplies its hidden channels (models in SCALABLE),
    `kwargs` go to a torchvision or timm model's constructor (`where`: the scenario, for its errors)."""
    if is_vision(name) and width == 1.0:
        return vision_model(name, num_classes, input_shape, mean, std, kwargs or {}, where)
    if kwargs:
        raise EdgeflError(where, "model.kwargs", f"{name} is a zoo model, built without keywords; "
                          "model.kwargs is for torchvision:NAME and timm:NAME models")
    if width == 1.0:
        return MODELS.get(name)(num_classes, input_shape, mean, std)
    if name not in SCALABLE:
        raise ValueError(f"{name} has no width multiplier; it works for {', '.join(sorted(SCALABLE))}")
    return MODELS.get(name)(num_classes, input_shape, mean, std, width=width)
