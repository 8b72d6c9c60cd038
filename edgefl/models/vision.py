"""Any torchvision classification model, or timm's (Wightman, "PyTorch Image Models"; where timm is
installed: the `timm` extra), by the name `torchvision:NAME` or `timm:NAME`, built untrained with
the scenario's `model.kwargs` passed to its constructor.

In runs (`vision_model`) the network is cut into atoms (edgefl.models.cut) after the input
normalisation; `edgefl price` profiles it as it is, one atom (`whole_model`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from edgefl.errors import EdgeflError
from edgefl.models.base import AtomModel, Normalize
from edgefl.models.cut import cut

TORCHVISION = "torchvision:"
TIMM = "timm:"


def is_vision(name: str) -> bool:
    """Whether `name` names a torchvision or timm model."""
    return name.startswith((TORCHVISION, TIMM))


def torchvision_names() -> list[str]:
    """torchvision's classification models (its detection, segmentation and video ones aside)."""
    import torchvision.models as tv

    return list(tv.list_models(module=tv))


def network(name: str, num_classes: int, channels: int, kwargs: Mapping[str, Any], where: str) -> nn.Module:
    """The torchvision or timm network `name`, untrained, with `num_classes` outputs (a timm one with
    `channels` input channels unless `kwargs` says otherwise); one line where it does not exist, timm
    is missing or the constructor refuses `kwargs`."""
    given = dict(kwargs)
    try:
        if name.startswith(TORCHVISION):
            return _torchvision(name.removeprefix(TORCHVISION), num_classes, given, where)
        return _timm(name.removeprefix(TIMM), num_classes, {"in_chans": channels, **given}, where)
    except TypeError as e:
        raise EdgeflError(where, "model.kwargs", f"{name} does not take {given} ({e})") from None


def _torchvision(name: str, num_classes: int, kwargs: dict[str, Any], where: str) -> nn.Module:
    import torchvision.models as tv

    known = torchvision_names()
    if name not in known:
        raise EdgeflError(where, f"torchvision:{name}", f"no such torchvision classification model; known: "
                          f"{', '.join(known)}")
    return tv.get_model(name, weights=None, num_classes=num_classes, **kwargs)


def _timm(name: str, num_classes: int, kwargs: dict[str, Any], where: str) -> nn.Module:
    try:
        import timm
    except ImportError:
        raise EdgeflError(where, f"timm:{name}", "timm is not installed; pip install timm (or "
                          "edgefl[timm])") from None
    if name not in timm.list_models():
        raise EdgeflError(where, f"timm:{name}", "no such timm model; timm.list_models() lists them")
    return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)


def vision_model(name: str, num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float],
                 std: Sequence[float], kwargs: Mapping[str, Any], where: str) -> AtomModel:
    """`name` for runs: the input normalisation, then the network's atoms (edgefl.models.cut)."""
    net = network(name, num_classes, input_shape[0], kwargs, where)
    return AtomModel([("norm", Normalize(mean, std)), *cut(net, input_shape, name, where)], input_shape)


def whole_model(name: str, num_classes: int, input_shape: tuple[int, ...], where: str) -> AtomModel:
    """`name` as the single atom "model", profiled as it is (`edgefl price`)."""
    return AtomModel([("model", network(name, num_classes, input_shape[0], {}, where))], input_shape)
