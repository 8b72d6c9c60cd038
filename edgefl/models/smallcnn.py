"""SmallCNN, the MNIST model of TRADES (Zhang et al., "Theoretically Principled Trade-off between
Robustness and Accuracy", ICML 2019), which SFAT (Zhu et al., ICLR 2023) reuses for SVHN.

Four 3x3 convs (32, 32, 64, 64 channels, with bias), each followed by a ReLU, a 2x2 max-pool after the
2nd and the 4th, then fc 200 -> fc 200 -> fc classes with ReLUs. TRADES' code base puts a dropout
(p=0.5) in the classifier, but neither paper states it, so this version has no dropout.

Atoms: "norm" (the input normalisation), then one atom per conv with its ReLU (and its max-pool after
conv2 and conv4); the last conv atom also holds the flatten and the three fc layers.

On 1x28x28 MNIST the convs are unpadded, as in TRADES (28 -> 26 -> 24 -> 12 -> 10 -> 8 -> 4, a
64 x 4 x 4 flatten). When the input side is below 28 (the 8x8 digits) the convs get padding 1, so only
the pools shrink the map (8 -> 4 -> 2, a 64 x 2 x 2 flatten) and it does not vanish; 3x32x32 inputs keep
the unpadded convs (32 -> 30 -> 28 -> 14 -> 12 -> 10 -> 5).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from edgefl.models.base import MODELS, AtomModel, Normalize, with_head

WIDTHS = (32, 32, 64, 64)
POOLS = (False, True, False, True)
HIDDEN = 200
UNPADDED_MIN_SIDE = 28  # the MNIST side the unpadded TRADES convs are meant for


def conv_padding(side: int) -> int:
    """No padding at the MNIST size and above (as in TRADES), padding 1 on smaller inputs."""
    return 0 if side >= UNPADDED_MIN_SIDE else 1


def feature_side(side: int, padding: int) -> int:
    """The side of the map after the four 3x3 convs (with `padding`) and the two 2x2 max-pools."""
    for pool in POOLS:
        side = side - 2 + 2 * padding
        if pool:
            side //= 2
    return side


def conv_relu(cin: int, cout: int, padding: int, pool: bool) -> nn.Sequential:
    """3x3 conv (with bias), ReLU, optionally 2x2 max-pooling: the layers of one SmallCNN atom."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=padding), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def classifier(flat: int, num_classes: int) -> list[nn.Module]:
    """flatten | fc flat -> 200 | ReLU | fc 200 -> 200 | ReLU | fc 200 -> classes."""
    return [nn.Flatten(), nn.Linear(flat, HIDDEN), nn.ReLU(inplace=True),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(inplace=True), nn.Linear(HIDDEN, num_classes)]


@MODELS.register("smallcnn")
def smallcnn(
    num_classes: int, input_shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]
) -> AtomModel:
    """norm | conv32 | conv32 + pool | conv64 | conv64 + pool + fc200 + fc200 + fc classes."""
    c, h, w = input_shape
    padding = conv_padding(min(h, w))
    fh, fw = feature_side(h, padding), feature_side(w, padding)
    if fh < 1 or fw < 1:
        raise ValueError(f"smallcnn needs an input side >= 4, got {h}x{w}")
    atoms: list[tuple[str, nn.Module]] = [("norm", Normalize(mean, std))]
    cin = c
    for i, (cout, pool) in enumerate(zip(WIDTHS, POOLS, strict=True)):
        atoms.append((f"conv{i + 1}", conv_relu(cin, cout, padding, pool)))
        cin = cout
    return with_head(atoms, classifier(cin * fh * fw, num_classes), input_shape)
