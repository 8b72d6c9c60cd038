"""AtomModel and the model registry."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch
from torch import nn

from edgefl.registry import Registry

C = TypeVar("C")


class Normalize(nn.Module):
    """Per-channel input normalisation, its own atom so attacks work in [0, 1] pixel space."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class AtomModel(nn.Sequential):
    """A model that is a sequence of named atoms; `atom_names` keeps their order."""

    def __init__(self, atoms: list[tuple[str, nn.Module]], input_shape: tuple[int, ...]) -> None:
        super().__init__()
        for name, atom in atoms:
            self.add_module(name, atom)
        self.input_shape = input_shape  # one sample, e.g. (3, 32, 32)

    @property
    def atom_names(self) -> list[str]:
        return [name for name, _ in self.named_children()]


ModelBuilder = Callable[..., AtomModel]  # (num_classes, input_shape, mean, std[, width]) -> model
MODELS: Registry[ModelBuilder] = Registry("model", "edgefl.models")
SCALABLE: set[str] = set()  # the models that take `model.width`


def scaled(channels: int, width: float) -> int:
    """`channels` x `width`, rounded half up, at least 1: the hidden channels of a narrowed model."""
    return max(1, math.floor(channels * width + 0.5))


def conv_bn(cin: int, cout: int, pool: bool) -> list[nn.Module]:
    """3x3 conv, BatchNorm, ReLU, optionally 2x2 max-pooling: the layers of one conv atom."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                               nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return layers


def with_head(atoms: list[tuple[str, nn.Module]], head: list[nn.Module],
              input_shape: tuple[int, ...]) -> AtomModel:
    """The AtomModel whose last atom also holds the classifier `head`."""
    name, last = atoms[-1]
    body = list(last.children()) if isinstance(last, nn.Sequential) else [last]
    return AtomModel([*atoms[:-1], (name, nn.Sequential(*body, *head))], input_shape)


def register_family(configs: Mapping[str, C], make: Callable[..., AtomModel], scalable: bool = False) -> None:
    """Register one builder per config: make(config, num_classes, input_shape, mean, std[, width]);
    a `scalable` family's `make` takes the keyword `width` (see `scaled`)."""
    for name, config in configs.items():
        MODELS.register(name)(functools.partial(make, config))
        if scalable:
            SCALABLE.add(name)


def plain_cnn(
    widths: Sequence[int], pools: Sequence[bool], num_classes: int, input_shape: tuple[int, ...],
    mean: Sequence[float], std: Sequence[float], pooled: int = 0,
) -> AtomModel:
    """norm | one conv atom per width (optionally max-pooled) | the last one holds a linear head,
    after adaptive average pooling to `pooled` x `pooled` when `pooled` > 0."""
    c, h, w = input_shape
    atoms: list[tuple[str, nn.Module]] = [("norm", Normalize(mean, std))]
    for i, (cout, pool) in enumerate(zip(widths, pools, strict=True)):
        atoms.append((f"conv{i + 1}", nn.Sequential(*conv_bn(c, cout, pool))))
        c = cout
    shrink = 2 ** sum(pools)
    if pooled:
        head = [nn.AdaptiveAvgPool2d(pooled), nn.Flatten(), nn.Linear(c * pooled**2, num_classes)]
    else:
        head = [nn.Flatten(), nn.Linear(c * (h // shrink) * (w // shrink), num_classes)]
    return with_head(atoms, head, input_shape)
