"""`model.width`: the VGG and ResNet families narrowed, checked by parameter counts worked by hand."""

from __future__ import annotations

import itertools

import pytest
from support import QUICKSTART

from edgefl.errors import EdgeflError
from edgefl.models import build_model
from edgefl.models.base import scaled
from edgefl.profiling import profile_model
from edgefl.scenario import load_scenario

CIFAR = (3, 32, 32)


def params(name: str, width: float) -> int:
    model = build_model(name, 10, CIFAR, [0.5] * 3, [0.25] * 3, width)
    return sum(p.numel() for p in model.parameters())


def conv(cin: int, cout: int, k: int = 3) -> int:
    """A bias-free k x k conv and its BatchNorm (weight and bias)."""
    return k * k * cin * cout + 2 * cout


def linear(cin: int, cout: int) -> int:
    return cin * cout + cout


def test_vgg16_at_a_quarter_width_by_hand() -> None:
    # channels 16 16 | 32 32 | 64 64 64 | 128 128 128 | 128 128 128, five 2x2 pools: 32 -> 1
    chain = [3, 16, 16, 32, 32, 64, 64, 64, 128, 128, 128, 128, 128, 128]
    convs = sum(conv(a, b) for a, b in itertools.pairwise(chain))
    head = linear(128 * 1 * 1, 128) + linear(128, 128) + linear(128, 10)  # the hidden 512s at 128
    assert convs + head == 956_154
    assert params("vgg16", 0.25) == 956_154


def test_resnet18_at_a_quarter_width_by_hand() -> None:
    # stages 16 32 64 128, two basic blocks each; a stage's first block downsamples with a 1x1 conv
    stem = conv(3, 16)
    stage1 = 2 * (conv(16, 16) + conv(16, 16))
    later = sum(conv(cin, c) + conv(c, c) + conv(cin, c, k=1) + conv(c, c) + conv(c, c)
                for cin, c in [(16, 32), (32, 64), (64, 128)])
    assert stem + stage1 + later + linear(128, 10) == 701_466
    assert params("resnet18", 0.25) == 701_466


def test_width_one_is_the_paper_model_and_channels_round_half_up() -> None:
    chain = [3, 64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]  # VGG16-BN, by hand
    full = sum(conv(a, b) for a, b in itertools.pairwise(chain))
    full += linear(512 * 1 * 1, 512) + linear(512, 512) + linear(512, 10)  # flatten -> 512 -> 512 -> 10
    assert params("vgg16", 1.0) == full == 15_249_354
    assert [scaled(64, w) for w in (0.1, 0.125, 0.2, 0.25)] == [6, 8, 13, 16]  # 6.4, 8, 12.8, 16
    assert scaled(3, 0.1) == 1  # never a layer of no channels


def test_the_profile_and_the_partition_see_the_narrow_model() -> None:
    narrow = build_model("vgg16", 10, CIFAR, [0.5] * 3, [0.25] * 3, 0.25)
    profile = profile_model(narrow, "vgg16")
    assert sum(a.params for a in profile.atoms) == 956_154
    full = profile_model(build_model("vgg16", 10, CIFAR, [0.5] * 3, [0.25] * 3), "vgg16")
    # conv2's conv maps 64 (narrow: 16) channels to as many on 32x32: 9 x 64 x 64 x 1024 MACs, a sixteenth
    assert full.atoms[2].layers[0].macs == 9 * 64 * 64 * 32 * 32
    assert profile.atoms[2].layers[0].macs == 9 * 16 * 16 * 32 * 32


@pytest.mark.parametrize(("sets", "says"), [
    (["model.width=0.5"], "digits_cnn has no width multiplier"),
    (["model.name=vgg11", "data.dataset=cifar10", "model.width=0"], "must be positive"),
    (["model.name=vgg11", "data.dataset=cifar10", "model.width=20"], "at most 16"),
])
def test_a_width_the_model_cannot_take_is_one_error(sets: list[str], says: str) -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, sets)
    assert "model.width" in str(info.value) and says in str(info.value)
