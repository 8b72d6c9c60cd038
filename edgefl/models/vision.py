"""Any torchvision classification model, or timm's (where timm is installed: the `timm` extra), as
an AtomModel of one atom, profiled as it is (for `edgefl price`; the methods partition and train the
zoo's models, whose atoms are their blocks)."""

from __future__ import annotations

from edgefl.errors import EdgeflError
from edgefl.models.base import AtomModel


def torchvision_names() -> list[str]:
    """torchvision's classification models (its detection, segmentation and video ones aside)."""
    import torchvision.models as tv

    return list(tv.list_models(module=tv))


def torchvision_model(name: str, num_classes: int, input_shape: tuple[int, ...], where: str) -> AtomModel:
    """torchvision's `name`, untrained, with `num_classes` outputs, as the single atom "model"."""
    import torchvision.models as tv

    known = torchvision_names()
    if name not in known:
        raise EdgeflError(where, f"torchvision:{name}", f"no such torchvision classification model; known: "
                          f"{', '.join(known)}")
    return AtomModel([("model", tv.get_model(name, weights=None, num_classes=num_classes))], input_shape)


def timm_model(name: str, num_classes: int, input_shape: tuple[int, ...], where: str) -> AtomModel:
    """timm's `name` (Wightman, "PyTorch Image Models"), untrained, with `num_classes` outputs, as
    the single atom "model"; one line where timm is missing or has no such model."""
    try:
        import timm
    except ImportError:
        raise EdgeflError(where, f"timm:{name}", "timm is not installed; pip install timm (or "
                          "edgefl[timm])") from None
    if name not in timm.list_models():
        raise EdgeflError(where, f"timm:{name}", "no such timm model; timm.list_models() lists them")
    return AtomModel([("model", timm.create_model(name, pretrained=False, num_classes=num_classes))],
                     input_shape)
