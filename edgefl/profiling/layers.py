"""What edgefl knows of each layer type, in one table: the kind profiling charges it as (the
kernels that run it, edgefl.devices.profile's KERNEL_KINDS), whether width methods can narrow it
(edgefl.methods.width), and whether grouped training can stack it (edgefl.training.grouped).

`kind` refines a convolution by its shape (`layer_kind`); a type not in the table is an
`elementwise` layer for profiling, passes width methods only if listed, and groups only where
edgefl.training.grouped has its grouped form (a layer that draws random numbers in training never
does: its draws would not be each client's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from edgefl.models.base import Normalize

Narrow = Literal["slice", "pass", ""]  # its tensors are sliced | its channels pass through | neither


@dataclass(frozen=True)
class LayerType:
    types: tuple[type[nn.Module], ...]
    kind: str  # profiling's kind (a convolution's refined by `layer_kind`)
    narrow: Narrow = ""  # what width methods do with it
    draws: bool = False  # draws random numbers in training: grouped training cannot stack it


ELEMENTWISE = "elementwise"  # any layer not in the table, and any functional operator
CLAMP = "clamp"  # an in-place ReLU6 or Hardtanh (layer_kind)
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
               nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softmax, nn.LogSoftmax)
LAYERS: tuple[LayerType, ...] = (
    LayerType((nn.Conv2d,), "conv", "slice"),
    LayerType((nn.Conv1d, nn.Conv3d), "conv"),
    LayerType((nn.Linear,), "linear", "slice"),
    LayerType((nn.BatchNorm2d,), "norm", "slice"),
    LayerType((nn.BatchNorm1d, nn.BatchNorm3d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d,
               nn.LocalResponseNorm), "norm"),
    LayerType((nn.ReLU,), "activation", "pass"),
    LayerType(ACTIVATIONS, "activation"),
    LayerType((nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d), "pool", "pass"),
    LayerType((nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool1d), "pool"),
    LayerType((nn.Flatten,), "reshape", "slice"),  # width: its features follow the channels it flattens
    LayerType((nn.Identity,), "reshape", "pass"),
    LayerType((nn.Dropout,), ELEMENTWISE, "pass", draws=True),
    LayerType((nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout), ELEMENTWISE, draws=True),
    LayerType((Normalize,), ELEMENTWISE, "pass"),
)
WEIGHTED_KINDS = ("conv", "conv3x3", "dwconv", "linear", "norm")  # kinds whose layers hold weights


def layer_type(module: nn.Module) -> LayerType | None:
    """The table's row for `module`'s type (the first whose types it is an instance of)."""
    return next((row for row in LAYERS if isinstance(module, row.types)), None)


def layer_kind(module: nn.Module) -> str:
    """The module's kind; a convolution's says which kernels run it: `dwconv` (depthwise or grouped,
    groups > 1), `conv3x3` (dense 3x3 at stride 1, which cuDNN and oneDNN may run by Winograd), or
    `conv` (any other dense one); an in-place ReLU6 or Hardtanh is a `clamp` (PyTorch clamps into a
    new tensor and copies it back, two passes where an in-place ReLU makes one)."""
    if isinstance(module, nn.Hardtanh) and module.inplace:
        return CLAMP
    row = layer_type(module)
    kind = row.kind if row else ELEMENTWISE
    if kind == "conv" and isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        if module.groups > 1:
            return "dwconv"
        if set(module.kernel_size) == {3} and set(module.stride) == {1}:
            return "conv3x3"
    return kind


def narrows(module: nn.Module) -> Narrow:
    """What width methods do with `module` ("" for a type they cannot narrow)."""
    row = layer_type(module)
    return row.narrow if row else ""


def narrowable_names() -> str:
    """The layer types width methods can narrow or pass, for messages."""
    return ", ".join(t.__name__ for row in LAYERS if row.narrow for t in row.types)


def why_not_grouped(model: nn.Module) -> str | None:
    """Why grouped training cannot stack `model` (its first layer that draws random numbers in
    training, or a BatchNorm that averages by its own batch counter), or None when it can."""
    for name, m in model.named_modules():
        row = layer_type(m)
        if row is not None and row.draws:
            return f"layer {name} ({type(m).__name__}) draws random numbers in training"
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.momentum is None:
            return f"layer {name} ({type(m).__name__}, momentum None) averages by its own batch counter"
    return None
