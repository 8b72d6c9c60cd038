"""VGG11/13/16 with BatchNorm in their CIFAR form (Simonyan & Zisserman; FedProphet §7.1).

Atoms as in the FedProphet release: the input normalisation is its own atom, then one atom per
conv layer with its BN, ReLU and pooling; the last conv atom also holds the classifier
(512 -> 512 -> 512 -> classes). `model.width` w makes every conv of C channels round(w C) wide and
the hidden 512s round(512 w) (so VGG16 at 0.25 has 16 ... 128 channels and ~1/16 of the MACs).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import AtomModel, Normalize, conv_bn, register_family, scaled, with_head

CONFIGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"],
}


def make_vgg(
    cfg: list[int | str], num_classes: int, input_shape: tuple[int, ...],
    mean: Sequence[float], std: Sequence[float], width: float = 1.0,
) -> AtomModel:
    """VGG `cfg` (channels, "M" for max-pooling); `width` scales every conv and the hidden 512s."""
    c, h, w = input_shape
    pools = cfg.count("M")
    if h % 2**pools or w % 2**pools:
        raise ValueError(f"VGG needs an input side divisible by {2**pools}, got {h}x{w}")
    atoms: list[tuple[str, nn.Module]] = [("norm", Normalize(mean, std))]
    cin = c
    for j, cout in enumerate(cfg):
        if isinstance(cout, int):
            pool = j + 1 < len(cfg) and cfg[j + 1] == "M"
            atoms.append((f"conv{len(atoms)}", nn.Sequential(*conv_bn(cin, scaled(cout, width), pool))))
            cin = scaled(cout, width)
    flat = cin * (h // 2**pools) * (w // 2**pools)
    hidden = scaled(512, width)
    head = [nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)]
    return with_head(atoms, head, input_shape)


register_family(CONFIGS, make_vgg, scalable=True)
